/* Checks a worker's rollout report before anything of it reaches the
 * scheduler: a report is taken whole or refused whole, so a bad rollout never
 * costs the buffer anything it already holds. */
#ifndef RLORCH_DAEMON_ROLLOUT_CHECK_H
#define RLORCH_DAEMON_ROLLOUT_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "rlorch/v1/worker.pb-c.h"

typedef enum {
  ROLLOUT_OK = 0,
  ROLLOUT_TOO_LARGE,      /* over max_rollout_bytes: RESOURCE_EXHAUSTED */
  ROLLOUT_TOKEN_COUNT,    /* tokens differs from completion_token_ids */
  ROLLOUT_LOGPROB_COUNT,  /* logprobs given, not one per completion token */
  ROLLOUT_NOT_FINITE,     /* a NaN or infinite logprob or reward, or a positive logprob */
  ROLLOUT_FINISH_REASON,  /* an unknown finish reason */
  ROLLOUT_MISMATCH,       /* well-formed, but not an answer to its request (found by
                             the runner and the scheduler): another group, a count
                             other than the group size, another prompt, a version
                             from the future, a duplicate id, an unknown request */
  ROLLOUT_REASONS         /* count */
} rollout_fault;

/* The metrics label of a fault ("too_large", "token_count", ...). */
const char *rollout_fault_name(rollout_fault f);

/* Checks every rollout of res against the limits; ROLLOUT_OK, or the first
 * fault with a message naming the field ("rollouts[2].completion_logprobs:
 * ..."). A rollout's size is its packed protobuf size. */
rollout_fault rollout_check(const Rlorch__V1__RolloutResult *res, uint64_t max_rollout_bytes,
                            char *err, size_t errlen);

/* What the scheduler counts for a rollout: completion_token_ids' length when
 * given, else the tokens field. */
uint32_t rollout_tokens(const Rlorch__V1__Rollout *r);

#endif
