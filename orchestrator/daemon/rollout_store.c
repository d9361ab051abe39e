#include "orchestrator/daemon/rollout_store.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  uint64_t id;
  size_t bytes;
  Rlorch__V1__Rollout *msg; /* owned: unpacked copy */
} rollout_store__entry;

struct rollout_store {
  rollout_store__entry *v;
  size_t n, cap;
  uint64_t bytes;
};

int rollout_store_new(rollout_store **out) {
  *out = calloc(1, sizeof **out);
  return *out ? 0 : -1;
}

void rollout_store_free(rollout_store *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n; i++) rlorch__v1__rollout__free_unpacked(s->v[i].msg, NULL);
  free(s->v);
  free(s);
}

/* Index of the first entry with id >= `id`. */
static size_t rollout_store__lower(const rollout_store *s, uint64_t id) {
  size_t lo = 0, hi = s->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (s->v[mid].id < id) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* A deep copy through the wire format: the message owns all it points to. */
static Rlorch__V1__Rollout *rollout_store__copy(const Rlorch__V1__Rollout *r, size_t *bytes) {
  size_t n = rlorch__v1__rollout__get_packed_size(r);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return NULL;
  rlorch__v1__rollout__pack(r, buf);
  Rlorch__V1__Rollout *c = rlorch__v1__rollout__unpack(NULL, n, buf);
  free(buf);
  *bytes = n;
  return c;
}

int rollout_store_put(rollout_store *s, const Rlorch__V1__RolloutResult *res) {
  size_t k = res->n_rollouts;
  if (s->n + k > s->cap) {
    size_t cap = s->cap ? s->cap : 64;
    while (cap < s->n + k) cap *= 2;
    rollout_store__entry *v = realloc(s->v, cap * sizeof *v);
    if (!v) return -1;
    s->v = v;
    s->cap = cap;
  }
  Rlorch__V1__Rollout **copies = calloc(k ? k : 1, sizeof *copies);
  size_t *sizes = calloc(k ? k : 1, sizeof *sizes);
  int rc = copies && sizes ? 0 : -1;
  for (size_t i = 0; rc == 0 && i < k; i++)
    if (!(copies[i] = rollout_store__copy(res->rollouts[i], &sizes[i]))) rc = -1;
  for (size_t i = 0; rc == 0 && i < k; i++) {
    uint64_t id = copies[i]->id;
    size_t at = rollout_store__lower(s, id);
    if (at < s->n && s->v[at].id == id) continue; /* the first one stays; the copy is freed below */
    memmove(&s->v[at + 1], &s->v[at], (s->n - at) * sizeof *s->v);
    s->n++;
    s->v[at] = (rollout_store__entry){id, sizes[i], copies[i]};
    s->bytes += sizes[i];
    copies[i] = NULL;
  }
  for (size_t i = 0; copies && i < k; i++)
    if (copies[i]) rlorch__v1__rollout__free_unpacked(copies[i], NULL);
  free(copies);
  free(sizes);
  return rc;
}

const Rlorch__V1__Rollout *rollout_store_get(const rollout_store *s, uint64_t id) {
  size_t at = rollout_store__lower(s, id);
  return at < s->n && s->v[at].id == id ? s->v[at].msg : NULL;
}

void rollout_store_retain(rollout_store *s, int (*keep)(uint64_t id, void *ud), void *ud) {
  size_t out = 0;
  for (size_t i = 0; i < s->n; i++) {
    if (keep(s->v[i].id, ud)) {
      s->v[out++] = s->v[i];
    } else {
      s->bytes -= s->v[i].bytes;
      rlorch__v1__rollout__free_unpacked(s->v[i].msg, NULL);
    }
  }
  s->n = out;
}

size_t rollout_store_count(const rollout_store *s) { return s->n; }
uint64_t rollout_store_bytes(const rollout_store *s) { return s->bytes; }
