/* Conversions between the scheduler's plain types and the rlorch.v1 messages.
 * The scheduler's enums were given the protobuf values on purpose; the checks
 * below make a change on either side a compile error rather than a silent
 * mix-up, and they are what lets the enum conversions be range checks. */
#include "orchestrator/daemon/sched_pb.h"

#include "orchestrator/daemon/rollout_check.h"

#include <stdio.h>
#include <string.h>

#define SAME(a, b) _Static_assert((int)(a) == (int)(b), #a " != " #b)

SAME(SCHED_MODE_AUTO, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_AUTO);
SAME(SCHED_MODE_DIRECT, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_DIRECT);
SAME(SCHED_MODE_STAGED, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_STAGED);
SAME(SCHED_MODE_HOST, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_HOST);
SAME(SCHED_MODE_COLOCATED, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_COLOCATED);
SAME(SCHED_MODE_COUNT, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_COLOCATED + 1);
SAME(SCHED_MODE_DIRECT, BCAST_MODE_DIRECT);
SAME(SCHED_MODE_STAGED, BCAST_MODE_STAGED);
SAME(SCHED_MODE_HOST, BCAST_MODE_HOST);
SAME(SCHED_MODE_COLOCATED, BCAST_MODE_COLOCATED);

SAME(SCHED_RUN_PENDING, RLORCH__V1__RUN_STATE__RUN_STATE_PENDING);
SAME(SCHED_RUN_RUNNING, RLORCH__V1__RUN_STATE__RUN_STATE_RUNNING);
SAME(SCHED_RUN_STOPPING, RLORCH__V1__RUN_STATE__RUN_STATE_STOPPING);
SAME(SCHED_RUN_STOPPED, RLORCH__V1__RUN_STATE__RUN_STATE_STOPPED);
SAME(SCHED_RUN_SUCCEEDED, RLORCH__V1__RUN_STATE__RUN_STATE_SUCCEEDED);
SAME(SCHED_RUN_FAILED, RLORCH__V1__RUN_STATE__RUN_STATE_FAILED);

SAME(SCHED_ROLE_TRAINER, RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER);
SAME(SCHED_ROLE_INFERENCE, RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE);

SAME(SCHED_WORKER_REGISTERED, RLORCH__V1__WORKER_STATE__WORKER_STATE_REGISTERED);
SAME(SCHED_WORKER_READY, RLORCH__V1__WORKER_STATE__WORKER_STATE_READY);
SAME(SCHED_WORKER_BUSY, RLORCH__V1__WORKER_STATE__WORKER_STATE_BUSY);
SAME(SCHED_WORKER_LOST, RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST);

#undef SAME

/* ---- enums ------------------------------------------------------------------ */

Rlorch__V1__BroadcastMode sched_pb_mode_to_pb(sched_mode m) {
  return m >= SCHED_MODE_AUTO && m <= SCHED_MODE_COLOCATED
             ? (Rlorch__V1__BroadcastMode)m
             : RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_UNSPECIFIED;
}

int sched_pb_mode_from_pb(Rlorch__V1__BroadcastMode m, sched_mode *out) {
  if (m < RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_AUTO ||
      m > RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_COLOCATED)
    return -1;
  *out = (sched_mode)m;
  return 0;
}

Rlorch__V1__RunState sched_pb_run_state_to_pb(sched_run_state s) {
  return s >= SCHED_RUN_PENDING && s <= SCHED_RUN_FAILED
             ? (Rlorch__V1__RunState)s
             : RLORCH__V1__RUN_STATE__RUN_STATE_UNSPECIFIED;
}

Rlorch__V1__WorkerState sched_pb_worker_state_to_pb(sched_worker_state s) {
  return s >= SCHED_WORKER_REGISTERED && s <= SCHED_WORKER_LOST
             ? (Rlorch__V1__WorkerState)s
             : RLORCH__V1__WORKER_STATE__WORKER_STATE_UNSPECIFIED;
}

Rlorch__V1__WorkerRole sched_pb_role_to_pb(sched_role r) {
  return r == SCHED_ROLE_TRAINER || r == SCHED_ROLE_INFERENCE
             ? (Rlorch__V1__WorkerRole)r
             : RLORCH__V1__WORKER_ROLE__WORKER_ROLE_UNSPECIFIED;
}

int sched_pb_role_from_pb(Rlorch__V1__WorkerRole r, sched_role *out) {
  if (r != RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER &&
      r != RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE)
    return -1;
  *out = (sched_role)r;
  return 0;
}

int sched_pb_bcast_mode(sched_mode m, bcast_mode *out) {
  if (m < SCHED_MODE_DIRECT || m > SCHED_MODE_COLOCATED) return -1;
  *out = (bcast_mode)m;
  return 0;
}

/* ---- messages --------------------------------------------------------------- */

void sched_pb_step_record_to_pb(const sched_step_record *r, Rlorch__V1__StepRecord *out) {
  /* protobuf-c wants char*, but never writes through it when packing. */
  out->run_id = (char *)r->run_id;
  out->step = r->step;
  out->mode = sched_pb_mode_to_pb(r->mode);
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
  out->sources = r->sources;
}

void sched_pb_caps(const Rlorch__V1__Capabilities *c, sched_caps *out) {
  memset(out, 0, sizeof *out);
  if (!c) return;
  out->cuda_devices = c->cuda_devices;
  out->nccl = c->nccl_version && c->nccl_version[0] != 0;
  out->pinned_limit_bytes = c->pinned_limit_bytes;
  out->max_concurrent_requests = c->max_concurrent_requests;
  /* Cut, not refused: an over-long value only ever fails to match. */
  snprintf(out->gpu_uuid, sizeof out->gpu_uuid, "%s", c->gpu_uuid ? c->gpu_uuid : "");
  snprintf(out->host_id, sizeof out->host_id, "%s", c->host_id ? c->host_id : "");
  out->trainer_rank = c->trainer_rank;
  out->trainer_ranks = c->trainer_ranks;
}

void sched_pb_offload(const Rlorch__V1__WeightManifest *m, sched_offload *out) {
  memset(out, 0, sizeof *out);
  if (!m) return;
  for (size_t i = 0; i < m->n_tensors; i++) {
    const Rlorch__V1__TensorSpec *t = m->tensors[i];
    uint64_t elems = 1;
    for (size_t d = 0; d < t->n_shape; d++) elems *= t->shape[d];
    uint64_t bytes = elems * (t->storage_dtype == RLORCH__V1__DTYPE__DTYPE_FP32 ? 4 : 2);
    switch (t->residency) {
    case RLORCH__V1__RESIDENCY__RESIDENCY_GPU: out->gpu_tensors++, out->gpu_bytes += bytes; break;
    case RLORCH__V1__RESIDENCY__RESIDENCY_HOST_PINNED:
      out->pinned_tensors++, out->pinned_bytes += bytes;
      break;
    default: out->pageable_tensors++, out->pageable_bytes += bytes; break;
    }
  }
}

void sched_pb_bcast_report(const Rlorch__V1__BroadcastDone *d, sched_bcast_report *out) {
  memset(out, 0, sizeof *out);
  out->weights_checksum = d->weights_checksum;
  /* Pointers into the message: the report lives no longer than it. */
  out->source_checksums = d->source_checksums;
  out->nsource_checksums = d->n_source_checksums > UINT32_MAX ? UINT32_MAX
                                                                : (uint32_t)d->n_source_checksums;
  out->view_checksums = d->view_checksums;
  out->nview_checksums = d->n_view_checksums > UINT32_MAX ? UINT32_MAX
                                                            : (uint32_t)d->n_view_checksums;
  const Rlorch__V1__StepRecord *s = d->record;
  if (!s) return;
  snprintf(out->transport, sizeof out->transport, "%s", s->transport);
  out->pcie_bytes = s->pcie_bytes;
  out->wire_bytes = s->wire_bytes;
  out->h2d_seconds = s->h2d_seconds;
  out->cast_seconds = s->cast_seconds;
  out->wire_seconds = s->wire_seconds;
  out->total_seconds = s->total_seconds;
  out->exposed_staging_seconds = s->exposed_staging_seconds;
  out->exposed_measured = s->exposed_measured;
  out->gbps = s->gbps;
  out->buckets = s->buckets;
}

void sched_pb_rollouts(const Rlorch__V1__RolloutResult *r, sched_rollout *out) {
  for (size_t i = 0; i < r->n_rollouts; i++) {
    out[i].id = r->rollouts[i]->id;
    out[i].policy_version = r->rollouts[i]->policy_version;
    out[i].tokens = rollout_tokens(r->rollouts[i]);
    out[i].group_id = r->rollouts[i]->group_id;
  }
}
