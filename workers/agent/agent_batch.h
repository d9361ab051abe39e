/* agent_batch: a trainer fetches the batch of its train step (FetchBatch),
 * checked against the step as it arrives, with the retries and the verdicts
 * of rlorch's own trainer. Shared by that trainer and the embedding SDK.
 * Internal to the agents. */
#ifndef RLORCH_AGENT_BATCH_H
#define RLORCH_AGENT_BATCH_H

#include <stddef.h>

#include "rlorch/v1/worker.pb-c.h"
#include "workers/agent/agent_core.h"

/* Where the rollouts go, optional. `begin` runs before every attempt (drop
 * what an earlier, failed one delivered); `rollout` gets each rollout of
 * the step in order (the message is freed after) and returns non-zero to
 * give up (out of memory: the fetch then fails fatally). */
typedef struct agent_batch_sink {
  void (*begin)(void *ud);
  int (*rollout)(void *ud, const Rlorch__V1__Rollout *r);
  void *ud;
} agent_batch_sink;

/* Fetches step ts's whole batch (rank 0 of 1) and checks that it holds the
 * train step's rollouts in its order. 0: fetched; 1: not, and the step is
 * skipped (the orchestrator no longer holds that batch, which it redoes or
 * drops itself, or the agent is stopping); -1: not, fatally (refused
 * credentials, or still failing after a few attempts: a trainer that exits
 * then is lost, and its step is redone with a fresh batch when a trainer
 * attaches). Every failure is logged with the status and its message; the
 * last one is also written to err. sink may be NULL. */
int agent_batch_fetch(agent *a, const Rlorch__V1__TrainStep *ts, const agent_batch_sink *sink,
                      char *err, size_t errlen);

#endif
