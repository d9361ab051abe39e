/* agent_pb: the protobuf conversions the agents need (manifest out, plan in,
 * broadcast stats out, rollout requests in and their results out). Messages
 * built here are owned by the caller and released with the matching *_free.
 * Internal to the agents. */
#ifndef RLORCH_AGENT_PB_H
#define RLORCH_AGENT_PB_H

#include <stddef.h>

#include "rlorch/v1/worker.pb-c.h"
#include "workers/agent/agent_rollout.h"
#include "workers/bcast/bcast.h"

/* Completions longer than this go as their length only (Rollout.tokens, no
 * ids, logprobs): a report of very long synthetic completions then stays
 * within the orchestrator's max_rollout_bytes (about 7 bytes a token). */
#define AGENT_PB_SHAPED_TOKENS_MAX 8192

/* NULL when out of memory. offload: rlorch.v1.Offload value (0: unspecified). */
Rlorch__V1__WeightManifest *agent_pb_manifest(const bcast_tensor *t, size_t n, const char *preset,
                                              int offload);
void agent_pb_manifest_free(Rlorch__V1__WeightManifest *m);

/* A plan from its message (bcast_plan_from_pb: validated, hash checked);
 * BCAST_E* with the field named in err. */
int agent_pb_plan(const Rlorch__V1__BroadcastPlan *pb, bcast_plan **out, bcast_err *err);

/* A step record from the engine's stats (NULL stats: an empty record). */
Rlorch__V1__StepRecord *agent_pb_record(const bcast_stats *s, const bcast_plan *p);
void agent_pb_record_free(Rlorch__V1__StepRecord *r);

/* The request as the generator takes it; out points into msg (valid while msg
 * lives). Without SamplingParams: agent_sampling_defaults. group_id 0 (an
 * orchestrator that does not number groups) becomes the request id: one
 * request is one group. */
void agent_pb_request(const Rlorch__V1__RolloutRequest *msg, agent_request *out);
/* The result of a generated group: every completion, with the group id, the
 * policy version, ids, logprobs, rewards and finish reason. It points into g
 * (valid while g lives); NULL when out of memory. Rollout.prompt_token_ids and
 * metadata stay empty: the orchestrator holds the prompt it sent and fills
 * them in, so the prompt does not travel back count times. */
Rlorch__V1__RolloutResult *agent_pb_rollout_result(const agent_group *g);
void agent_pb_rollout_result_free(Rlorch__V1__RolloutResult *r);

#endif
