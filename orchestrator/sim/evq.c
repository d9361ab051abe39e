/* The event queue of the simulator (evq.h). */
#include "orchestrator/sim/evq.h"

#include <stdlib.h>
#include <string.h>

typedef struct evq_key {
  int64_t t;
  uint64_t seq;
} evq_key;

/* A slot: the key, then the record, rounded up to the key's alignment. */
static size_t slot_bytes(const evq *q) {
  size_t a = _Alignof(evq_key);
  return sizeof(evq_key) + (q->elem + a - 1) / a * a;
}
static unsigned char *slot(const evq *q, size_t i) { return q->slots + i * slot_bytes(q); }

static int before(const unsigned char *a, const unsigned char *b) {
  const evq_key *x = (const evq_key *)a, *y = (const evq_key *)b;
  return x->t < y->t || (x->t == y->t && x->seq < y->seq);
}

void evq_init(evq *q, size_t elem) { *q = (evq){.elem = elem}; }

void evq_free(evq *q) {
  free(q->slots);
  q->slots = NULL;
  q->n = q->cap = 0;
}

int evq_push(evq *q, int64_t t, const void *ev) {
  size_t sb = slot_bytes(q);
  if (q->n == q->cap) {
    size_t cap = q->cap ? q->cap * 2 : 1024;
    /* One spare slot past the end, where a new event is built. */
    unsigned char *s = realloc(q->slots, (cap + 1) * sb);
    if (!s) return -1;
    q->slots = s;
    q->cap = cap;
  }
  unsigned char *tmp = slot(q, q->cap);
  evq_key k = {t, q->seq++};
  memcpy(tmp, &k, sizeof k);
  memcpy(tmp + sizeof k, ev, q->elem);
  size_t i = q->n++;
  while (i > 0 && before(tmp, slot(q, (i - 1) / 2))) {
    memcpy(slot(q, i), slot(q, (i - 1) / 2), sb);
    i = (i - 1) / 2;
  }
  memcpy(slot(q, i), tmp, sb);
  return 0;
}

int64_t evq_next(const evq *q) { return q->n ? ((const evq_key *)q->slots)->t : INT64_MAX; }

int64_t evq_pop(evq *q, void *ev) {
  if (!q->n) return -1;
  size_t sb = slot_bytes(q);
  int64_t t = ((evq_key *)q->slots)->t;
  memcpy(ev, q->slots + sizeof(evq_key), q->elem);
  q->n--;
  if (!q->n) return t;
  unsigned char *last = slot(q, q->n);
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= q->n) break;
    if (c + 1 < q->n && before(slot(q, c + 1), slot(q, c))) c++;
    if (!before(slot(q, c), last)) break;
    memcpy(slot(q, i), slot(q, c), sb);
    i = c;
  }
  memmove(slot(q, i), last, sb);
  return t;
}
