/* The scheduler's indexed min-heap (sched_heap.h). */
#include "orchestrator/sched/sched_heap.h"

#include <stdlib.h>
#include <string.h>

#include "orchestrator/sched/sched.h"

void sched_heap_init(sched_heap *h) {
  memset(h, 0, sizeof *h);
  sched_map_init(&h->pos);
}

void sched_heap_free(sched_heap *h) {
  free(h->e);
  sched_map_free(&h->pos);
  sched_heap_init(h);
}

int sched_heap_reserve(sched_heap *h, size_t n) {
  if (n > UINT32_MAX) return SCHED_ENOMEM; /* positions are 32-bit */
  if (n > h->cap) {
    size_t cap = h->cap ? h->cap : 16;
    while (cap < n) cap *= 2;
    sched_heap_entry *e = realloc(h->e, cap * sizeof *e);
    if (!e) return SCHED_ENOMEM;
    h->e = e;
    h->cap = cap;
  }
  return sched_map_reserve(&h->pos, n);
}

/* Puts entry `x` at index i and records where its key is (room reserved). */
static void sched_heap__place(sched_heap *h, size_t i, sched_heap_entry x) {
  h->e[i] = x;
  *sched_map_get(&h->pos, x.key) = (uint32_t)i;
}

/* The entry at i moves up or down to its place; `xpos` is where its own
 * position is recorded (looked up once: the map does not change meanwhile). */
static void sched_heap__up(sched_heap *h, size_t i, uint32_t *xpos) {
  sched_heap_entry x = h->e[i];
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (h->e[p].prio <= x.prio) break;
    sched_heap__place(h, i, h->e[p]);
    i = p;
  }
  h->e[i] = x;
  *xpos = (uint32_t)i;
}

static void sched_heap__down(sched_heap *h, size_t i, uint32_t *xpos) {
  sched_heap_entry x = h->e[i];
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= h->n) break;
    if (c + 1 < h->n && h->e[c + 1].prio < h->e[c].prio) c++;
    if (x.prio <= h->e[c].prio) break;
    sched_heap__place(h, i, h->e[c]);
    i = c;
  }
  h->e[i] = x;
  *xpos = (uint32_t)i;
}

int sched_heap_set(sched_heap *h, uint64_t key, int64_t prio) {
  uint32_t *at = sched_map_get(&h->pos, key);
  if (at) {
    size_t i = *at;
    int64_t was = h->e[i].prio;
    if (prio == was) return 0;
    h->e[i].prio = prio;
    if (prio < was) sched_heap__up(h, i, at);
    else sched_heap__down(h, i, at);
    return 0;
  }
  if (sched_heap_reserve(h, h->n + 1)) return SCHED_ENOMEM;
  if (sched_map_put(&h->pos, key, (uint32_t)h->n)) return SCHED_ENOMEM; /* room reserved */
  h->e[h->n++] = (sched_heap_entry){.prio = prio, .key = key};
  sched_heap__up(h, h->n - 1, sched_map_get(&h->pos, key));
  return 0;
}

/* Removes the entry at index i. */
static void sched_heap__remove_at(sched_heap *h, size_t i) {
  sched_map_del(&h->pos, h->e[i].key);
  h->n--;
  if (i == h->n) return;
  sched_heap_entry last = h->e[h->n];
  int64_t was = h->e[i].prio;
  uint32_t *lpos = sched_map_get(&h->pos, last.key);
  h->e[i] = last;
  if (last.prio < was) sched_heap__up(h, i, lpos);
  else sched_heap__down(h, i, lpos);
}

int sched_heap_del(sched_heap *h, uint64_t key) {
  uint32_t *at = sched_map_get(&h->pos, key);
  if (!at) return 0;
  sched_heap__remove_at(h, *at);
  return 1;
}

int sched_heap_get(const sched_heap *h, uint64_t key, int64_t *prio) {
  const uint32_t *at = sched_map_get(&h->pos, key);
  if (!at) return 0;
  if (prio) *prio = h->e[*at].prio;
  return 1;
}

const sched_heap_entry *sched_heap_min(const sched_heap *h) { return h->n ? &h->e[0] : NULL; }

size_t sched_heap_least(const sched_heap *h, sched_heap_entry out[2]) {
  if (!h->n) return 0;
  out[0] = h->e[0];
  if (h->n == 1) return 1;
  /* The second least is one of the root's children. */
  size_t c = h->n > 2 && h->e[2].prio < h->e[1].prio ? 2 : 1;
  out[1] = h->e[c];
  return 2;
}

int sched_heap_pop(sched_heap *h, sched_heap_entry *out) {
  if (!h->n) return 0;
  *out = h->e[0];
  sched_heap__remove_at(h, 0);
  return 1;
}
