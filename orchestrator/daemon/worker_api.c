/* The Worker API handlers: validate and decode the request, update the
 * worker table, hand the event to the runner, answer; FetchBatch streams a
 * trainer rank's share of the batch the runner holds. */
#include "orchestrator/daemon/worker_api.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/common/log.h"
#include "orchestrator/daemon/now.h"
#include "orchestrator/daemon/orch.h"
#include "orchestrator/daemon/parts.h"
#include "orchestrator/daemon/rollout_check.h"
#include "orchestrator/daemon/runner.h"
#include "orchestrator/daemon/sched_pb.h"
#include "orchestrator/daemon/workers.h"
#include "rlorch/v1/worker.pb-c.h"
#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_pb.h"

/* A trainer that listens on every interface ("0.0.0.0:7075", "[::]:7075")
 * advertises an address no peer can dial: use the address its Register call
 * came from, with the advertised port. */
static void resolve_data_address(rpc_call *call, const char *adv, char *out, size_t len) {
  snprintf(out, len, "%s", adv);
  const char *colon = strrchr(adv, ':');
  if (!colon) return;
  size_t hl = (size_t)(colon - adv);
  int unspecified = (hl == 7 && !strncmp(adv, "0.0.0.0", 7)) || (hl == 4 && !strncmp(adv, "[::]", 4)) ||
                    hl == 0;
  if (!unspecified) return;
  const char *peer = rpc_call_peer(call); /* "ipv4:10.1.2.3:5555" or "ipv6:[fd00::1]:5555" */
  if (!peer) return;
  const char *host = strchr(peer, ':');
  const char *pcolon = strrchr(peer, ':');
  if (!host || !pcolon || pcolon <= host + 1) return;
  host++;
  snprintf(out, len, "%.*s%s", (int)(pcolon - host), host, colon);
}

/* The manifest's rules with the configured limits, before anything keeps
 * it: a refusal answers INVALID_ARGUMENT naming the field, the tensor and
 * the rule. Returns 1 when it passed. */
static int manifest_ok(rpc_call *call, orch *o, const Rlorch__V1__WeightManifest *m,
                       const char *field) {
  bcast_manifest_limits lim = config_manifest_limits(o->cfg);
  bcast_err be = {0};
  if (bcast_manifest_check_pb(m, &lim, &be) == 0) return 1;
  rpc_call_fail(call, be.code == BCAST_ENOMEM ? GRPC_STATUS_RESOURCE_EXHAUSTED
                                              : GRPC_STATUS_INVALID_ARGUMENT,
                "%s: %s", field, be.msg);
  return 0;
}

/* A lone trainer sends whole tensors: a shard in its manifest would leave
 * receivers with part of a tensor. Returns 1 when none is. */
static int whole_tensors_ok(rpc_call *call, const Rlorch__V1__WeightManifest *m, uint32_t ranks,
                            const char *field) {
  for (size_t i = 0; i < m->n_tensors; i++) {
    const Rlorch__V1__TensorSpec *t = m->tensors[i];
    uint64_t e = 1;
    for (size_t d = 0; d < t->n_shape; d++) e *= t->shape[d];
    if (t->shard_offset == 0 && (t->shard_elems == 0 || t->shard_elems == e)) continue;
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                  "%s: tensor '%s' is a shard (elements [%" PRIu64 ", %" PRIu64 ") of %" PRIu64
                  "), but a trainer of %u rank sends whole tensors (set capabilities.trainer_ranks)",
                  field, t->name, t->shard_offset, t->shard_offset + t->shard_elems, e,
                  ranks ? ranks : 1);
    return 0;
  }
  return 1;
}

static uint64_t spec_elems(const Rlorch__V1__TensorSpec *t) {
  uint64_t e = 1;
  for (size_t d = 0; d < t->n_shape; d++) e *= t->shape[d];
  return e;
}

static void spec_shape(const Rlorch__V1__TensorSpec *t, char *out, size_t len) {
  size_t k = (size_t)snprintf(out, len, "[");
  for (size_t d = 0; d < t->n_shape && k < len; d++)
    k += (size_t)snprintf(out + k, len - k, "%s%" PRIu64, d ? ", " : "", t->shape[d]);
  if (k < len) snprintf(out + k, len - k, "]");
}

/* Whether manifest `now` lays out the same parts as `was`: the same tensors
 * in the same order, each of the same shape, dtypes and element range (a
 * whole tensor is [0, elements)). Residency and offload may differ: a
 * trainer may move its tensors between steps. 0 when the same, else 1 with
 * what changed, by tensor, in `out`. */
static int layout_diff(const Rlorch__V1__WeightManifest *was, const Rlorch__V1__WeightManifest *now,
                       char *out, size_t len) {
  if (was->n_tensors != now->n_tensors) {
    snprintf(out, len, "%zu tensors, registered with %zu", now->n_tensors, was->n_tensors);
    return 1;
  }
  for (size_t i = 0; i < now->n_tensors; i++) {
    const Rlorch__V1__TensorSpec *a = was->tensors[i], *b = now->tensors[i];
    char sa[160], sb[160];
    if (strcmp(a->name, b->name) != 0) {
      snprintf(out, len, "tensor #%zu is '%s', registered as '%s'", i, b->name, a->name);
      return 1;
    }
    spec_shape(a, sa, sizeof sa);
    spec_shape(b, sb, sizeof sb);
    if (strcmp(sa, sb) != 0) {
      snprintf(out, len, "tensor '%s': shape %s, registered %s", b->name, sb, sa);
      return 1;
    }
    if (a->storage_dtype != b->storage_dtype || a->wire_dtype != b->wire_dtype) {
      snprintf(out, len, "tensor '%s': storage_dtype %d and wire_dtype %d, registered %d and %d",
               b->name, (int)b->storage_dtype, (int)b->wire_dtype, (int)a->storage_dtype,
               (int)a->wire_dtype);
      return 1;
    }
    uint64_t e = spec_elems(a);
    uint64_t alo = a->shard_elems ? a->shard_offset : 0, ahi = a->shard_elems ? alo + a->shard_elems : e;
    uint64_t blo = b->shard_elems ? b->shard_offset : 0, bhi = b->shard_elems ? blo + b->shard_elems : e;
    if (alo != blo || ahi != bhi) {
      snprintf(out, len, "tensor '%s': elements [%" PRIu64 ", %" PRIu64 "), registered [%" PRIu64
               ", %" PRIu64 ")", b->name, blo, bhi, alo, ahi);
      return 1;
    }
  }
  return 0;
}

static uint32_t trainer_ranks_of(const workers_entry *w) {
  return w->caps && w->caps->trainer_ranks > 1 ? w->caps->trainer_ranks : 1;
}

static uint32_t trainer_rank_of(const workers_entry *w) {
  return w->caps && w->caps->trainer_ranks > 1 ? w->caps->trainer_rank : 0;
}

static int live_trainer(const workers_entry *w) {
  return w->role == RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER &&
         w->state != RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST;
}

/* A trainer's registration, as Register sees it against the live ones: the
 * one it replaces (its own earlier registration: a live trainer of its
 * name), and whether that one was a rank of a group whose layout it leaves
 * (another group size, rank or layout): that group is restarting, and its
 * other ranks are of the old layout, not this one's peers. */
typedef struct trainer_reg {
  workers_entry *old;
  uint32_t old_ranks; /* old's group size: its group is lost with it when `restart` */
  int restart;
} trainer_reg;

static trainer_reg trainer_reg_of(orch *o, const Rlorch__V1__RegisterRequest *q, uint32_t rank,
                                  uint32_t ranks) {
  trainer_reg tr = {0};
  for (size_t i = 0; q->name[0] && !tr.old && i < workers_count(o->workers); i++) {
    workers_entry *w = workers_at(o->workers, i);
    if (live_trainer(w) && !strcmp(w->name, q->name)) tr.old = w;
  }
  if (!tr.old) return tr;
  tr.old_ranks = trainer_ranks_of(tr.old);
  char why[512];
  tr.restart = tr.old_ranks > 1 &&
               (tr.old_ranks != (ranks ? ranks : 1) || trainer_rank_of(tr.old) != rank ||
                !tr.old->manifest || layout_diff(tr.old->manifest, q->manifest, why, sizeof why));
  return tr;
}

/* Whether w is one of the ranks a registration leaves behind: the one it
 * replaces, or a rank of the group that replacement restarts. */
static int left_behind(const trainer_reg *tr, const workers_entry *w) {
  return w == tr->old || (tr->restart && trainer_ranks_of(w) == tr->old_ranks);
}

/* A rank of a trainer group: its manifest against those of the ranks
 * registered so far (bcast_shards_check_partial: a shape, layer or dtype
 * they disagree on, an overlap), and once the group is complete, with this
 * rank, the tiling of every tensor (a gap shows only then). The group is the
 * live trainers of the same group size, less those this registration leaves
 * behind (left_behind: its own earlier registration, and the rest of a group
 * it restarts with another layout). Another live trainer that holds this
 * rank is refused ALREADY_EXISTS by name: a second group of the size, or a
 * rank started twice; the agent retries, so a restarted rank under a new
 * name takes its place once the old registration is lost. Returns 1 when it
 * passed. */
static int group_manifest_ok(rpc_call *call, orch *o, const Rlorch__V1__WeightManifest *m,
                             uint32_t rank, uint32_t ranks, const trainer_reg *tr) {
  bcast_tensor **lists = calloc(ranks, sizeof *lists);
  size_t *n = calloc(ranks, sizeof *n);
  bcast_err be = {0};
  int ok = 0, rc = 0, complete = 1;
  if (!lists || !n) {
    rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory checking the shards");
    goto out;
  }
  for (size_t i = 0; i < workers_count(o->workers); i++) {
    workers_entry *w = workers_at(o->workers, i);
    if (!live_trainer(w) || left_behind(tr, w) || trainer_ranks_of(w) != ranks ||
        trainer_rank_of(w) != rank)
      continue;
    log_warn("trainer_rank_taken", "rank=%u ranks=%u holder=%s name=%s", rank, ranks, w->api_id,
             w->name);
    rpc_call_fail(call, GRPC_STATUS_ALREADY_EXISTS,
                  "capabilities.trainer_rank: rank %u of %u is held by live trainer %s (%s); a "
                  "restarted rank registers under its old name to replace it, any other waits "
                  "until that one is lost", rank, ranks, w->name, w->api_id);
    goto out;
  }
  rc = bcast_manifest_from_pb(m, &lists[rank], &n[rank], &be);
  for (size_t i = 0; rc == 0 && i < workers_count(o->workers); i++) {
    workers_entry *w = workers_at(o->workers, i);
    if (!live_trainer(w) || left_behind(tr, w) || !w->manifest || trainer_ranks_of(w) != ranks ||
        trainer_rank_of(w) >= ranks || lists[trainer_rank_of(w)])
      continue;
    rc = bcast_manifest_from_pb(w->manifest, &lists[trainer_rank_of(w)], &n[trainer_rank_of(w)], &be);
  }
  if (rc != 0) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "manifest: %s", be.msg);
    goto out;
  }
  for (uint32_t r = 0; r < ranks; r++)
    if (!lists[r]) complete = 0;
  bcast_manifest_limits lim = config_manifest_limits(o->cfg);
  if (complete) {
    bcast_shard_map *map = NULL;
    rc = bcast_shards_check((const bcast_tensor *const *)lists, n, ranks, &lim, &map, &be);
    bcast_shard_map_free(map);
  } else {
    rc = bcast_shards_check_partial((const bcast_tensor *const *)lists, n, ranks, &lim, &be);
  }
  if (rc != 0) {
    log_warn("trainer_shards_refused", "rank=%u ranks=%u complete=%d error=\"%s\"", rank, ranks,
             complete, be.msg);
    rpc_call_fail(call, rc == BCAST_ENOMEM ? GRPC_STATUS_RESOURCE_EXHAUSTED
                                           : GRPC_STATUS_INVALID_ARGUMENT,
                  "manifest of trainer rank %u of %u: %s", rank, ranks, be.msg);
    goto out;
  }
  ok = 1;
out:
  for (uint32_t r = 0; lists && r < ranks; r++) free(lists[r]);
  free(lists);
  free(n);
  return ok;
}

/* An inference worker's parts (RegisterRequest.parts): well formed, and
 * fitting the manifest of the lone trainer registered now, if there is one
 * (a trainer that comes later, or a group, is checked when a plan is built).
 * Returns 1 when they passed. */
static int parts_ok(rpc_call *call, orch *o, const Rlorch__V1__RegisterRequest *q) {
  if (!q->n_parts) return 1;
  char err[600];
  if (q->role != RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                  "parts: only an inference worker holds part of the model (a trainer rank "
                  "describes its shard with TensorSpec.shard_offset and shard_elems)");
    return 0;
  }
  bcast_manifest_limits lim = config_manifest_limits(o->cfg);
  bcast_part_spec *specs = NULL;
  if (parts_from_pb(q->parts, q->n_parts, lim.max_manifest_tensors, &specs, err, sizeof err)) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "%s", err);
    return 0;
  }
  int ok = 1;
  for (size_t i = 0; ok && i < workers_count(o->workers); i++) {
    workers_entry *t = workers_at(o->workers, i);
    if (t->role != RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER ||
        t->state == RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST || !t->manifest ||
        (t->caps && t->caps->trainer_ranks > 1))
      continue;
    bcast_tensor *tensors = NULL;
    size_t nt = 0;
    bcast_err be = {0};
    if (bcast_manifest_from_pb(t->manifest, &tensors, &nt, &be) != 0) continue; /* checked at its Register */
    if (parts_fit(tensors, nt, specs, q->n_parts, err, sizeof err) != 0) {
      rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "%s (against the manifest of trainer %s)",
                    err, t->name);
      ok = 0;
    }
    free(tensors);
  }
  free(specs);
  return ok;
}

/* Once `w` is registered: what it leaves behind is lost now, so that the run
 * takes `w` in its place at once rather than after a heartbeat timeout, and
 * a restarting group's old ranks keep no rank from the new ones. */
static void replace_trainers(orch *o, const trainer_reg *tr, const workers_entry *w) {
  if (!tr->old) return;
  char why[400];
  uint32_t old_rank = trainer_rank_of(tr->old);
  snprintf(why, sizeof why, "registered again under its name, as %s", w->api_id);
  runner_worker_lost(o->runner, tr->old, why);
  if (!tr->restart) return;
  if (trainer_ranks_of(w) > 1)
    snprintf(why, sizeof why, "its trainer group of %u ranks restarts: rank %u (%s) registered "
             "again as %s, rank %u of %u with another layout", tr->old_ranks, old_rank, w->name,
             w->api_id, trainer_rank_of(w), trainer_ranks_of(w));
  else
    snprintf(why, sizeof why, "its trainer group of %u ranks restarts: rank %u (%s) registered "
             "again as %s, a lone trainer", tr->old_ranks, old_rank, w->name, w->api_id);
  for (size_t i = 0; i < workers_count(o->workers); i++) {
    workers_entry *e = workers_at(o->workers, i);
    if (e != w && live_trainer(e) && trainer_ranks_of(e) == tr->old_ranks)
      runner_worker_lost(o->runner, e, why);
  }
}

static void h_register(rpc_call *call, const ProtobufCMessage *req, void *ud) {
  orch *o = ud;
  /* Not const: the worker table takes the manifest out of it (rpc.h). */
  Rlorch__V1__RegisterRequest *q = (void *)req;
  if (o->shutting_down) {
    rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "server shutting down");
    return;
  }
  if (q->role != RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER &&
      q->role != RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "role: want TRAINER or INFERENCE");
    return;
  }
  if (strlen(q->name) >= WORKERS_NAME_MAX) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "name: longer than %d bytes",
                  WORKERS_NAME_MAX - 1);
    return;
  }
  if (strlen(q->data_address) >= WORKERS_ADDRESS_MAX) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "data_address: too long");
    return;
  }
  if (strlen(q->run_id) >= WORKERS_RUN_ID_MAX) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "run_id: longer than %d bytes",
                  WORKERS_RUN_ID_MAX - 1);
    return;
  }
  if (q->role == RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER &&
      (!q->manifest || q->manifest->n_tensors == 0)) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "manifest: a trainer must send one");
    return;
  }
  if (q->manifest && !manifest_ok(call, o, q->manifest, "manifest")) return;
  trainer_reg treg = {0};
  if (q->role == RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER) {
    uint32_t rank = q->capabilities ? q->capabilities->trainer_rank : 0;
    uint32_t ranks = q->capabilities ? q->capabilities->trainer_ranks : 0;
    if (ranks > SCHED_MAX_TRAINER_RANKS) {
      rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                    "capabilities.trainer_ranks: %u is over the limit of %d", ranks,
                    SCHED_MAX_TRAINER_RANKS);
      return;
    }
    if (rank >= (ranks ? ranks : 1)) {
      rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                    "capabilities.trainer_rank: %u is not below trainer_ranks %u%s", rank, ranks,
                    ranks ? "" : " (0 is a lone trainer, rank 0)");
      return;
    }
    treg = trainer_reg_of(o, q, rank, ranks);
    if (ranks <= 1 ? !whole_tensors_ok(call, q->manifest, ranks, "manifest")
                   : !group_manifest_ok(call, o, q->manifest, rank, ranks, &treg))
      return;
  }
  if (!parts_ok(call, o, q)) return;
  char addr[WORKERS_ADDRESS_MAX];
  resolve_data_address(call, q->data_address, addr, sizeof addr);
  workers_entry *w = NULL;
  Rlorch__V1__WeightManifest *manifest = q->manifest;
  q->manifest = NULL;
  int rc = workers_add(o->workers, q->role, q->name, addr, q->capabilities, manifest, &w);
  if (rc != 0) {
    /* A full table or no memory: try later; no id (the store failed): the
     * daemon's trouble, not the worker's. */
    log_warn("worker_refused", "name=%s role=%s error=\"%s\"", q->name,
             workers_role_label(q->role), workers_last_error(o->workers));
    rpc_call_fail(call, rc == -3 ? GRPC_STATUS_UNAVAILABLE : GRPC_STATUS_RESOURCE_EXHAUSTED, "%s",
                  workers_last_error(o->workers));
    return;
  }
  workers_take_parts(w, q);
  replace_trainers(o, &treg, w);
  /* What it kept across a restart or a gap: the run compares it with its own. */
  w->policy_version = q->policy_version;
  snprintf(w->version_run, sizeof w->version_run, "%s", q->run_id);
  log_info("worker_registered", "worker=%s name=%s role=%s cuda_devices=%u nccl=\"%s\" "
           "policy_version=%" PRIu64 " version_run=%s",
           w->api_id, w->name, workers_role_label(w->role), w->caps ? w->caps->cuda_devices : 0,
           w->caps ? w->caps->nccl_version : "", w->policy_version,
           w->version_run[0] ? w->version_run : "none");
  Rlorch__V1__RegisterResponse resp = RLORCH__V1__REGISTER_RESPONSE__INIT;
  resp.worker_id = w->api_id;
  resp.heartbeat_interval_ms = o->cfg->heartbeat_interval_ms;
  /* Unique per worker (rollout ids are prefixed with it); the rank inside a
   * given plan is carried by each plan command. */
  resp.rank = w->role == RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER
                  ? (w->caps ? w->caps->trainer_rank : 0)
                  : w->id;
  rpc_call_reply(call, &resp.base);
  runner_worker_registered(o->runner, w);
}

static void on_attach_cancel(rpc_call *call, void *ud) {
  orch *o = ud;
  /* A stream replaced or ended by the daemon has its callback cleared, so
   * this is some worker's current stream. */
  workers_entry *w = workers_by_stream(o->workers, call);
  if (w) workers_detach(w);
  rpc_call_finish(call, GRPC_STATUS_CANCELLED, "stream closed");
  if (w) runner_worker_stream_closed(o->runner, w);
}

static void h_attach(rpc_call *call, const ProtobufCMessage *req, void *ud) {
  orch *o = ud;
  const Rlorch__V1__AttachRequest *q = (const void *)req;
  workers_entry *w = workers_by_api_id(o->workers, q->worker_id);
  if (!w || w->state == RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST) {
    rpc_call_finish(call, GRPC_STATUS_NOT_FOUND, "worker not registered (register again)");
    return;
  }
  if (o->shutting_down) {
    rpc_call_finish(call, GRPC_STATUS_UNAVAILABLE, "server shutting down");
    return;
  }
  workers_attach(w, call);
  rpc_call_set_cancel_cb(call, on_attach_cancel, o);
  log_info("worker_attached", "worker=%s name=%s", w->api_id, w->name);
  runner_worker_attached(o->runner, w);
}

/* A trainer's manifest after a step, past the rules: a lone trainer's under
 * its Register's (whole tensors; they may change shape, the next plan is
 * built from them), a rank's the layout it registered with, since the
 * group's tiling was checked against that (residency and offload may
 * change). Returns 1 when it passed; a refusal keeps the step unreported. */
static int step_manifest_ok(rpc_call *call, const workers_entry *w,
                            const Rlorch__V1__WeightManifest *m) {
  if (w->role != RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER) return 1;
  if (trainer_ranks_of(w) <= 1) return whole_tensors_ok(call, m, 1, "step_done.manifest");
  char why[512];
  if (!w->manifest || !layout_diff(w->manifest, m, why, sizeof why)) return 1;
  log_warn("step_manifest_refused", "worker=%s name=%s rank=%u ranks=%u error=\"%s\"", w->api_id,
           w->name, trainer_rank_of(w), trainer_ranks_of(w), why);
  rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "step_done.manifest of trainer rank %u of %u (%s): %s; a rank keeps the layout it "
                "registered with (register again to change it)",
                trainer_rank_of(w), trainer_ranks_of(w), w->name, why);
  return 0;
}

/* Answers a report the runner refused; 0 when it was accepted (a stale one is
 * harmless and accepted too). */
static int report_status(rpc_call *call, orch *o, int rc) {
  if (rc == 0 || rc == SCHED_ESTALE) return 0;
  const char *msg = runner_last_error(o->runner);
  grpc_status_code code = rc == SCHED_EINVAL   ? GRPC_STATUS_INVALID_ARGUMENT
                          : rc == SCHED_ENOENT ? GRPC_STATUS_NOT_FOUND
                                               : GRPC_STATUS_FAILED_PRECONDITION;
  rpc_call_fail(call, code, "%s", msg[0] ? msg : sched_strerror(rc));
  return -1;
}

/* One report, from Report or from ReportStream (`oneway`): the same
 * handling, but a stream's report has no answer to say known=false in, so
 * an unknown worker is refused NOT_FOUND there. */
static void handle_report(rpc_call *call, orch *o, Rlorch__V1__ReportRequest *q, int oneway) {
  runner *r = o->runner;
  Rlorch__V1__ReportResponse resp = RLORCH__V1__REPORT_RESPONSE__INIT;
  workers_entry *w = workers_by_api_id(o->workers, q->worker_id);
  if (!w || w->state == RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST) {
    if (oneway) {
      rpc_call_fail(call, GRPC_STATUS_NOT_FOUND, "worker_id: %s is not registered (register again)",
                    q->worker_id);
      return;
    }
    resp.known = 0;
    rpc_call_reply(call, &resp.base);
    return;
  }
  resp.known = 1;
  workers_seen(w);
  int rc = 0;
  switch (q->kind_case) {
  case RLORCH__V1__REPORT_REQUEST__KIND_HEARTBEAT:
    if (strlen(q->heartbeat->run_id) >= sizeof w->version_run) {
      rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "heartbeat.run_id: longer than %zu bytes",
                    sizeof w->version_run - 1);
      return;
    }
    w->policy_version = q->heartbeat->policy_version;
    if (q->heartbeat->run_id[0])
      snprintf(w->version_run, sizeof w->version_run, "%s", q->heartbeat->run_id);
    if (q->heartbeat->stats) workers_set_stats(w, q->heartbeat->stats);
    rc = runner_heartbeat(r, w, q->heartbeat->policy_version, q->heartbeat->run_id);
    break;
  case RLORCH__V1__REPORT_REQUEST__KIND_ROLLOUTS: {
    const Rlorch__V1__RolloutResult *res = q->rollouts;
    char why[256];
    rollout_fault f = rollout_check(res, o->cfg->max_rollout_bytes, why, sizeof why);
    if (f != ROLLOUT_OK) {
      const char *lv[] = {rollout_fault_name(f)};
      metrics_counter_inc(o->m.rollouts_malformed, lv);
      log_warn("rollouts_refused", "worker=%s request=%" PRIu64 " reason=%s msg=\"%s\"",
               w->api_id, res->request_id, lv[0], why);
      rpc_call_fail(call,
                    f == ROLLOUT_TOO_LARGE ? GRPC_STATUS_RESOURCE_EXHAUSTED
                                           : GRPC_STATUS_INVALID_ARGUMENT,
                    "%s", why);
      /* The worker has answered: its request must not stay in flight. */
      runner_rollouts_refused(r, w, res->request_id);
      runner_drain(r);
      return;
    }
    rc = runner_rollouts_done(r, w, res);
    if (rc == SCHED_EINVAL || rc == SCHED_ENOENT) {
      const char *lv[] = {rollout_fault_name(ROLLOUT_MISMATCH)};
      metrics_counter_inc(o->m.rollouts_malformed, lv);
      log_warn("rollouts_refused", "worker=%s request=%" PRIu64 " reason=%s msg=\"%s\"",
               w->api_id, res->request_id, lv[0], runner_last_error(r));
    }
    if (rc == SCHED_ENOMEM) {
      rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory keeping the rollouts");
      return;
    }
    break;
  }
  case RLORCH__V1__REPORT_REQUEST__KIND_STEP_DONE: {
    Rlorch__V1__StepDone *sd = q->step_done;
    /* A manifest that breaks a rule refuses the whole report: nothing of it
     * is taken. One that passes replaces the worker's. */
    if (sd->manifest && sd->manifest->n_tensors) {
      if (!manifest_ok(call, o, sd->manifest, "step_done.manifest")) return;
      if (!step_manifest_ok(call, w, sd->manifest)) return;
      workers_set_manifest(w, sd->manifest);
      sd->manifest = NULL;
    }
    w->policy_version = sd->step + 1;
    rc = runner_step_done(r, w, sd->step, sd->train_seconds, sd->nccl_unique_id.data,
                          sd->nccl_unique_id.len);
    break;
  }
  case RLORCH__V1__REPORT_REQUEST__KIND_PLAN_ACK:
    rc = runner_plan_acked(r, w, q->plan_ack->plan_id, q->plan_ack->plan_hash,
                           q->plan_ack->error, q->plan_ack->colocated_export.data,
                           q->plan_ack->colocated_export.len);
    break;
  case RLORCH__V1__REPORT_REQUEST__KIND_BROADCAST_DONE: {
    sched_bcast_report rep;
    sched_pb_bcast_report(q->broadcast_done, &rep);
    rc = runner_broadcast_done(r, w, q->broadcast_done->plan_id, q->broadcast_done->error, &rep);
    break;
  }
  default:
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "kind: empty report");
    return;
  }
  if (report_status(call, o, rc) == 0) rpc_call_reply(call, &resp.base);
  runner_drain(r);
}

/* A step's manifest is taken out of the request (rpc.h): it is not const. */
static void h_report(rpc_call *call, const ProtobufCMessage *req, void *ud) {
  handle_report(call, ud, (Rlorch__V1__ReportRequest *)req, 0);
}

static void h_report_stream(rpc_call *call, const ProtobufCMessage *req, void *ud) {
  handle_report(call, ud, (Rlorch__V1__ReportRequest *)req, 1);
}

/* ---- FetchBatch ---------------------------------------------------------------------------- */

/* One FetchBatch stream: a trainer rank's share, sent a chunk at a time from
 * the writable callback, so that only the chunk being sent is ever encoded.
 * Owned by the stream; freed where the stream is ended (fetch_end) or
 * cancelled (on_fetch_cancel). */
typedef struct fetch_stream {
  orch *o;
  runner_share share;
  size_t next;                   /* the share's next rollout to send */
  const Rlorch__V1__Rollout **v; /* one chunk's rollouts (pointers into the store) */
  size_t cap;
  char worker[24];
  uint32_t rank, ranks;
  uint64_t messages;
  double t0;
  int busy;      /* inside rpc_call_send, which may run on_fetch_cancel */
  int cancelled; /* on_fetch_cancel ran while busy: the sender ends the stream */
} fetch_stream;

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  for (; v >= 0x80; v >>= 7) n++;
  return n;
}

static void fetch_end(rpc_call *call, fetch_stream *st, grpc_status_code code, const char *msg) {
  rpc_call_set_writable_cb(call, NULL, NULL);
  rpc_call_set_cancel_cb(call, NULL, NULL);
  rpc_call_finish(call, code, msg);
  if (code == GRPC_STATUS_OK)
    log_info("batch_fetched", "worker=%s step=%" PRIu64 " rank=%u ranks=%u rollouts=%zu groups=%u "
             "bytes=%" PRIu64 " messages=%" PRIu64 " seconds=%.3f", st->worker, st->share.step,
             st->rank, st->ranks, st->share.end - st->share.first, st->share.groups,
             st->share.bytes, st->messages, now_mono_ms() / 1e3 - st->t0);
  else
    log_warn("batch_fetch_failed", "worker=%s step=%" PRIu64 " rank=%u ranks=%u sent=%zu of %zu "
             "code=%s msg=\"%s\"", st->worker, st->share.step, st->rank, st->ranks,
             st->next - st->share.first, st->share.end - st->share.first, rpc_status_name(code),
             msg);
  free(st->v);
  free(st);
}

static void on_fetch_cancel(rpc_call *call, void *ud) {
  fetch_stream *st = ud;
  if (st->busy) { /* the sender still uses st: it ends the stream */
    st->cancelled = 1;
    return;
  }
  fetch_end(call, st, GRPC_STATUS_CANCELLED, "stream closed");
}

/* Sends the share's next chunk: whole rollouts, in batch order, as many as
 * fit batch_chunk_bytes (at least one: a rollout larger than that goes
 * alone); the first chunk carries the share's counts. After the last one the
 * status follows. A batch released meanwhile (the run stopped, the trainer
 * was lost) ends the stream ABORTED, saying why. */
static void fetch_send_next(rpc_call *call, fetch_stream *st) {
  runner *r = st->o->runner;
  size_t limit = st->o->cfg->batch_chunk_bytes, size = 0, k = 0;
  uint64_t bytes = 0;
  Rlorch__V1__BatchChunk ch = RLORCH__V1__BATCH_CHUNK__INIT;
  if (st->messages == 0) {
    ch.share_rollouts = (uint32_t)(st->share.end - st->share.first);
    ch.share_groups = st->share.groups;
    size = protobuf_c_message_get_packed_size(&ch.base);
  }
  char err[320];
  while (st->next < st->share.end) {
    const Rlorch__V1__Rollout *ro;
    size_t b;
    int rc = runner_batch_rollout(r, &st->share, st->next, &ro, &b, err, sizeof err);
    if (rc != 0) {
      fetch_end(call, st, rc == SCHED_ESTATE ? GRPC_STATUS_ABORTED : GRPC_STATUS_INTERNAL, err);
      return;
    }
    size_t framed = 1 + varint_len(b) + b; /* field 1's tag, length, message */
    if (k > 0 && size + framed > limit) break;
    if (k == st->cap) {
      size_t cap = st->cap ? st->cap * 2 : 64;
      const Rlorch__V1__Rollout **v = realloc(st->v, cap * sizeof *v);
      if (!v) {
        fetch_end(call, st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
      }
      st->v = v;
      st->cap = cap;
    }
    st->v[k++] = ro;
    size += framed;
    bytes += b;
    st->next++;
  }
  ch.rollouts = (Rlorch__V1__Rollout **)st->v;
  ch.n_rollouts = k;
  st->busy = 1;
  int rc = rpc_call_send(call, &ch.base); /* encoded now: the pointers may go stale after */
  st->busy = 0;
  if (rc != 0 || st->cancelled) {
    fetch_end(call, st, GRPC_STATUS_CANCELLED, "stream closed");
    return;
  }
  st->messages++;
  metrics_counter_add(st->o->m.batch_fetch_bytes, NULL, (double)bytes);
  if (st->next == st->share.end) fetch_end(call, st, GRPC_STATUS_OK, "");
}

static void on_fetch_writable(rpc_call *call, void *ud) { fetch_send_next(call, ud); }

static void h_fetch_batch(rpc_call *call, const ProtobufCMessage *req, void *ud) {
  orch *o = ud;
  const Rlorch__V1__FetchBatchRequest *q = (const void *)req;
  uint32_t ranks = q->ranks ? q->ranks : 1;
  if (q->rank >= ranks) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "rank: %u is not below ranks %u%s", q->rank,
                  ranks, q->ranks ? "" : " (ranks 0 is 1: the whole batch)");
    return;
  }
  workers_entry *w = workers_by_api_id(o->workers, q->worker_id);
  if (!w || w->state == RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST) {
    rpc_call_fail(call, GRPC_STATUS_NOT_FOUND, "worker_id: %s is not registered (register again)",
                  q->worker_id);
    return;
  }
  if (o->shutting_down) {
    rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "server shutting down");
    return;
  }
  workers_seen(w);
  runner_share share;
  char err[320];
  int rc = runner_batch_share(o->runner, w, q->step, q->rank, ranks, &share, err, sizeof err);
  if (rc != 0) {
    rpc_call_fail(call, rc == SCHED_EINVAL ? GRPC_STATUS_INVALID_ARGUMENT
                                           : GRPC_STATUS_FAILED_PRECONDITION,
                  "%s", err);
    return;
  }
  fetch_stream *st = calloc(1, sizeof *st);
  if (!st) {
    rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  *st = (fetch_stream){.o = o, .share = share, .next = share.first, .rank = q->rank,
                       .ranks = ranks, .t0 = now_mono_ms() / 1e3};
  snprintf(st->worker, sizeof st->worker, "%s", w->api_id);
  rpc_call_set_cancel_cb(call, on_fetch_cancel, st);
  rpc_call_set_writable_cb(call, on_fetch_writable, st);
  fetch_send_next(call, st);
}

/* ---- bounds checked before decoding ---------------------------------------------------------- */

/* A manifest's tensors are counted in the encoded request, before it is
 * decoded: one over max_manifest_tensors costs the daemon a read of its
 * bytes, not a decoded tree of every tensor (three allocations each) that
 * the handler would refuse. The message is the same as the handler's. */
static grpc_status_code manifest_precheck(const uint8_t *data, size_t len, void *ud,
                                          const uint32_t *path, size_t depth, const char *field,
                                          char *err, size_t errlen) {
  const orch *o = ud;
  uint64_t n = 0;
  if (rpc_wire_count(data, len, path, depth, &n) != 0) return GRPC_STATUS_OK; /* the decoder's */
  if (n <= o->cfg->max_manifest_tensors) return GRPC_STATUS_OK;
  snprintf(err, errlen, "%s: %" PRIu64 " tensors is over the limit of %u (max_manifest_tensors)",
           field, n, o->cfg->max_manifest_tensors);
  return GRPC_STATUS_INVALID_ARGUMENT;
}

/* The number of field `name` of message d, from the schema itself. */
static uint32_t field_id(const ProtobufCMessageDescriptor *d, const char *name) {
  const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, name);
  return f ? f->id : 0; /* 0 is no field: nothing is counted */
}

static grpc_status_code register_precheck(const uint8_t *data, size_t len, void *ud, char *err,
                                          size_t errlen) {
  const uint32_t path[] = {field_id(&rlorch__v1__register_request__descriptor, "manifest"),
                           field_id(&rlorch__v1__weight_manifest__descriptor, "tensors")};
  return manifest_precheck(data, len, ud, path, 2, "manifest", err, errlen);
}

static grpc_status_code report_precheck(const uint8_t *data, size_t len, void *ud, char *err,
                                        size_t errlen) {
  const uint32_t path[] = {field_id(&rlorch__v1__report_request__descriptor, "step_done"),
                           field_id(&rlorch__v1__step_done__descriptor, "manifest"),
                           field_id(&rlorch__v1__weight_manifest__descriptor, "tensors")};
  return manifest_precheck(data, len, ud, path, 3, "step_done.manifest", err, errlen);
}

#define M(name, kind, req, resp, fn, pre)                                                        \
  {"/rlorch.v1.Worker/" name, kind, &req, &resp, 1, fn, NULL, pre}
const rpc_method worker_api_methods[] = {
    M("Register", RPC_UNARY, rlorch__v1__register_request__descriptor,
      rlorch__v1__register_response__descriptor, h_register, register_precheck),
    M("Attach", RPC_SERVER_STREAM, rlorch__v1__attach_request__descriptor,
      rlorch__v1__command__descriptor, h_attach, NULL),
    M("Report", RPC_UNARY, rlorch__v1__report_request__descriptor,
      rlorch__v1__report_response__descriptor, h_report, report_precheck),
    M("ReportStream", RPC_ONEWAY_STREAM, rlorch__v1__report_request__descriptor,
      rlorch__v1__report_response__descriptor, h_report_stream, report_precheck),
    M("FetchBatch", RPC_SERVER_STREAM, rlorch__v1__fetch_batch_request__descriptor,
      rlorch__v1__batch_chunk__descriptor, h_fetch_batch, NULL),
};
const size_t worker_api_nmethods = sizeof worker_api_methods / sizeof worker_api_methods[0];
#undef M
