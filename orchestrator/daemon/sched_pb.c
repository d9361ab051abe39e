/* Conversions between the scheduler's plain types and the rlorch.v1 messages.
 * The scheduler itself knows nothing of protobuf. */
#include "orchestrator/daemon/sched_pb.h"

void sched_step_record_to_pb(const sched_step_record *r, Rlorch__V1__StepRecord *out) {
  /* protobuf-c wants char*, but never writes through it when packing. */
  out->run_id = (char *)r->run_id;
  out->step = r->step;
  out->mode = (Rlorch__V1__BroadcastMode)r->mode;
  out->mode_reason = (char *)r->mode_reason;
  out->transport = (char *)r->transport;
  out->pcie_bytes = r->pcie_bytes;
  out->wire_bytes = r->wire_bytes;
  out->h2d_seconds = r->h2d_seconds;
  out->cast_seconds = r->cast_seconds;
  out->wire_seconds = r->wire_seconds;
  out->total_seconds = r->total_seconds;
  out->exposed_staging_seconds = r->exposed_staging_seconds;
  out->exposed_measured = r->exposed_measured != 0;
  out->gbps = r->gbps;
  out->train_seconds = r->train_seconds;
  out->rollouts_used = r->rollouts_used;
  out->rollouts_dropped = r->rollouts_dropped;
  out->step_seconds = r->step_seconds;
  out->staging_share = r->staging_share;
  out->policy_version = r->policy_version;
  out->buckets = r->buckets;
  out->finished_unix_ms = r->finished_unix_ms;
  out->weights_verified = r->weights_verified != 0;
  out->receivers = r->receivers;
}
