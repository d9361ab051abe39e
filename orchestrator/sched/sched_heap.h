/* An indexed binary min-heap: keys (worker or request ids) ordered by a
 * 64-bit priority, each key at most once, found by key in O(1) through a
 * sched_map of positions. The scheduler keeps its deadlines (a worker's last
 * proof of life, a request's dispatch time) and its dispatch candidates
 * (ordered by load, then id) in them, so that the earliest deadline and the
 * least loaded worker are read at the top instead of found by a scan.
 *
 * set and del are O(log n), min and least O(1). Not thread-safe. */
#ifndef RLORCH_SCHED_HEAP_H
#define RLORCH_SCHED_HEAP_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/sched/sched_map.h"

typedef struct sched_heap_entry {
  int64_t prio;
  uint64_t key;
} sched_heap_entry;

typedef struct sched_heap {
  sched_heap_entry *e; /* n of them in heap order, room for cap */
  size_t n, cap;
  sched_map pos;       /* key -> index in e */
} sched_heap;

void sched_heap_init(sched_heap *h);
void sched_heap_free(sched_heap *h);
/* Room for `n` keys in all, so that sets up to that many never allocate.
 * 0, or SCHED_ENOMEM (the heap unchanged). */
int sched_heap_reserve(sched_heap *h, size_t n);
/* Gives `key` priority `prio`, inserting it if absent. 0, or SCHED_ENOMEM
 * (the heap unchanged). */
int sched_heap_set(sched_heap *h, uint64_t key, int64_t prio);
/* 1 if `key` was there and is removed, 0 if it was absent. */
int sched_heap_del(sched_heap *h, uint64_t key);
/* Whether `key` is in the heap; its priority into *prio if so and prio != NULL. */
int sched_heap_get(const sched_heap *h, uint64_t key, int64_t *prio);
/* The entry of least priority, or NULL when empty. */
const sched_heap_entry *sched_heap_min(const sched_heap *h);
/* The two entries of least priority, least first, into out; how many (0..2).
 * With equal priorities, which of them comes first is unspecified. */
size_t sched_heap_least(const sched_heap *h, sched_heap_entry out[2]);
/* Removes the least entry into *out; 0 when the heap was empty. */
int sched_heap_pop(sched_heap *h, sched_heap_entry *out);
static inline size_t sched_heap_size(const sched_heap *h) { return h->n; }

#endif
