/* The active run's buffered rollouts, whole: what the scheduler holds as plain
 * ids and versions, kept here as messages so a batch can be delivered to the
 * trainer with its tokens, logprobs and rewards. Owned by the runner; loop
 * thread only. Entries are sorted by id (a batch looks them up by id). */
#ifndef RLORCH_DAEMON_ROLLOUT_STORE_H
#define RLORCH_DAEMON_ROLLOUT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "rlorch/v1/worker.pb-c.h"

typedef struct rollout_store rollout_store;

int rollout_store_new(rollout_store **out); /* 0, or -1 out of memory */
void rollout_store_free(rollout_store *s);   /* NULL is fine */

/* Keeps a copy of every rollout of res (an id already held keeps its first
 * copy: a duplicate report, which the scheduler refuses, changes nothing).
 * 0, or -1 out of memory, and then nothing of res is kept. */
int rollout_store_put(rollout_store *s, const Rlorch__V1__RolloutResult *res);
/* The rollout with this id, or NULL. Valid until the next put or retain. */
const Rlorch__V1__Rollout *rollout_store_get(const rollout_store *s, uint64_t id);
/* Frees every rollout for which keep(id, ud) returns 0. */
void rollout_store_retain(rollout_store *s, int (*keep)(uint64_t id, void *ud), void *ud);

size_t rollout_store_count(const rollout_store *s);
uint64_t rollout_store_bytes(const rollout_store *s); /* packed sizes summed */

#endif
