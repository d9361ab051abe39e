/* A hash map from 64-bit keys to 32-bit values: the scheduler's indexes
 * (buffered rollout ids, a heap's positions) look keys up in O(1) instead of
 * scanning an array per event.
 *
 * Open addressing with linear probing, at most half full, deletion by
 * backward shift (no tombstones, so lookups stay short however many keys
 * come and go). Every key is valid, 0 included. Not thread-safe. */
#ifndef RLORCH_SCHED_MAP_H
#define RLORCH_SCHED_MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct sched_map_slot {
  uint64_t key;
  uint32_t val;
  uint32_t used;
} sched_map_slot;

typedef struct sched_map {
  sched_map_slot *slots; /* cap of them, cap a power of two (0: none yet) */
  size_t cap, n;
} sched_map;

void sched_map_init(sched_map *m);
void sched_map_free(sched_map *m);
/* Room for `n` keys in all, so that puts up to that many never allocate.
 * 0, or SCHED_ENOMEM (the map unchanged). */
int sched_map_reserve(sched_map *m, size_t n);
/* Sets `key` to `val`, inserting it if absent. 0, or SCHED_ENOMEM (the map
 * unchanged). */
int sched_map_put(sched_map *m, uint64_t key, uint32_t val);
/* The value of `key`, or NULL when absent; valid until the next put or del. */
uint32_t *sched_map_get(const sched_map *m, uint64_t key);
/* 1 if `key` was there and is removed, 0 if it was absent. */
int sched_map_del(sched_map *m, uint64_t key);
static inline size_t sched_map_size(const sched_map *m) { return m->n; }

#endif
