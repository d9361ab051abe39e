/* Conversions between the scheduler's plain types (orchestrator/sched) and the
 * rest of the daemon: the rlorch.v1 protobuf messages and the broadcast
 * engine's modes. The scheduler itself knows nothing of either; every value
 * crossing that line goes through here, never through a cast. */
#ifndef RLORCH_DAEMON_SCHED_PB_H
#define RLORCH_DAEMON_SCHED_PB_H

#include "orchestrator/sched/sched.h"
#include "rlorch/v1/broadcast.pb-c.h"
#include "rlorch/v1/control.pb-c.h"
#include "rlorch/v1/worker.pb-c.h"
#include "workers/bcast/bcast.h"

/* ---- enums: to protobuf is total (UNSPECIFIED for a value out of range);
 * from protobuf returns 0, or -1 for UNSPECIFIED and unknown values. ---- */
Rlorch__V1__BroadcastMode sched_pb_mode_to_pb(sched_mode m);
int sched_pb_mode_from_pb(Rlorch__V1__BroadcastMode m, sched_mode *out);
Rlorch__V1__RunState sched_pb_run_state_to_pb(sched_run_state s);
Rlorch__V1__WorkerState sched_pb_worker_state_to_pb(sched_worker_state s);
Rlorch__V1__WorkerRole sched_pb_role_to_pb(sched_role r);
int sched_pb_role_from_pb(Rlorch__V1__WorkerRole r, sched_role *out);
/* The engine's mode for a plan: 0, or -1 for AUTO (a plan is never auto). */
int sched_pb_bcast_mode(sched_mode m, bcast_mode *out);

/* ---- messages ---- */
/* Fills an initialised protobuf message from `r`. String fields point into `r`:
 * `r` must outlive `out`, and `out` must not be freed with the protobuf-c free. */
void sched_pb_step_record_to_pb(const sched_step_record *r, Rlorch__V1__StepRecord *out);
/* A worker's capabilities as the scheduler weighs them (NULL: none). */
void sched_pb_caps(const Rlorch__V1__Capabilities *c, sched_caps *out);
/* Where the manifest's tensors live, counted and summed (NULL: empty). */
void sched_pb_offload(const Rlorch__V1__WeightManifest *m, sched_offload *out);
/* A participant's BroadcastDone as the scheduler reads it. */
void sched_pb_bcast_report(const Rlorch__V1__BroadcastDone *d, sched_bcast_report *out);
/* The rollouts of a result, into `out` (room for r->n_rollouts). */
void sched_pb_rollouts(const Rlorch__V1__RolloutResult *r, sched_rollout *out);

#endif
