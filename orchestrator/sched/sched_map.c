/* The scheduler's hash map (sched_map.h). */
#include "orchestrator/sched/sched_map.h"

#include <stdlib.h>
#include <string.h>

#include "orchestrator/sched/sched.h"

/* splitmix64's finaliser: ids that count up by one spread over the table. */
static size_t sched_map__hash(uint64_t k, size_t cap) {
  k ^= k >> 30;
  k *= 0xbf58476d1ce4e5b9ull;
  k ^= k >> 27;
  k *= 0x94d049bb133111ebull;
  k ^= k >> 31;
  return (size_t)k & (cap - 1);
}

void sched_map_init(sched_map *m) { memset(m, 0, sizeof *m); }

void sched_map_free(sched_map *m) {
  free(m->slots);
  sched_map_init(m);
}

/* The slot holding `key`, or the empty one where it would go. */
static size_t sched_map__find(const sched_map *m, uint64_t key) {
  size_t i = sched_map__hash(key, m->cap);
  while (m->slots[i].used && m->slots[i].key != key) i = (i + 1) & (m->cap - 1);
  return i;
}

int sched_map_reserve(sched_map *m, size_t n) {
  size_t cap = m->cap ? m->cap : 16;
  while (cap / 2 < n) {
    if (cap > SIZE_MAX / 2 / sizeof *m->slots) return SCHED_ENOMEM;
    cap *= 2;
  }
  if (cap == m->cap) return 0;
  sched_map_slot *slots = calloc(cap, sizeof *slots);
  if (!slots) return SCHED_ENOMEM;
  sched_map old = *m;
  m->slots = slots;
  m->cap = cap;
  for (size_t i = 0; i < old.cap; i++) {
    if (!old.slots[i].used) continue;
    m->slots[sched_map__find(m, old.slots[i].key)] = old.slots[i];
  }
  free(old.slots);
  return 0;
}

int sched_map_put(sched_map *m, uint64_t key, uint32_t val) {
  if (m->cap) {
    size_t i = sched_map__find(m, key);
    if (m->slots[i].used) {
      m->slots[i].val = val;
      return 0;
    }
  }
  if (sched_map_reserve(m, m->n + 1)) return SCHED_ENOMEM;
  size_t i = sched_map__find(m, key);
  m->slots[i] = (sched_map_slot){.key = key, .val = val, .used = 1};
  m->n++;
  return 0;
}

uint32_t *sched_map_get(const sched_map *m, uint64_t key) {
  if (!m->n) return NULL;
  size_t i = sched_map__find(m, key);
  return m->slots[i].used ? &m->slots[i].val : NULL;
}

int sched_map_del(sched_map *m, uint64_t key) {
  if (!m->n) return 0;
  size_t mask = m->cap - 1, i = sched_map__find(m, key);
  if (!m->slots[i].used) return 0;
  /* Backward shift: every key after the hole that may sit in it moves up,
   * so that no probe sequence crosses an empty slot before its key. */
  for (size_t j = (i + 1) & mask;; j = (j + 1) & mask) {
    if (!m->slots[j].used) break;
    size_t home = sched_map__hash(m->slots[j].key, m->cap);
    /* The key at j may fill the hole at i unless its home lies in (i, j]. */
    int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    m->slots[i] = m->slots[j];
    i = j;
  }
  m->slots[i].used = 0;
  m->n--;
  return 1;
}
