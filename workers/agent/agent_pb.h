/* agent_pb: the protobuf conversions the agents need (manifest out, plan in,
 * broadcast stats out). Messages built here are owned by the caller and
 * released with the matching *_free. Internal to the agents. */
#ifndef RLORCH_AGENT_PB_H
#define RLORCH_AGENT_PB_H

#include <stddef.h>

#include "rlorch/v1/worker.pb-c.h"
#include "workers/bcast/bcast.h"

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

#endif
