/* The Worker API and the runner: the thin shell around the scheduler core.
 *
 * Workers register with the daemon, not with a run; the active run's scheduler
 * (one at a time) learns about every live worker. The shell turns scheduler
 * actions into commands on Attach streams, builds broadcast plans from the
 * trainer's manifest, stores step records, publishes WatchRun events and
 * updates metrics. All of it runs on the loop thread. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/common/log.h"
#include "orchestrator/daemon/orch.h"
#include "orchestrator/daemon/sched_pb.h"
#include "rlorch/v1/broadcast.pb-c.h"
#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_pb.h"

#define MAX_WORKERS 4096
#define TICK_MIN_MS 50

typedef struct orch_worker {
  struct orch_runner *runner;
  uint32_t id; /* scheduler id; API id is "w-<id>" */
  char api_id[24];
  Rlorch__V1__WorkerRole role;
  Rlorch__V1__WorkerState state;
  char name[SCHED_NAME_MAX];
  Rlorch__V1__Capabilities *caps;      /* owned copy */
  Rlorch__V1__WeightManifest *manifest; /* trainer: owned copy */
  char data_address[256];
  rpc_call *attach;                    /* open command stream, or NULL */
  uint64_t cmd_seq;
  uint64_t policy_version;
  int64_t last_seen_ms;
  int in_run;                          /* known to the active run's scheduler */
} orch_worker;

struct orch_runner {
  orch *o;
  orch_worker *workers[MAX_WORKERS];
  size_t nworkers;
  uint32_t next_id;
  Rlorch__V1__Run *run; /* the active run, or NULL */
  sched *sched;
  uv_timer_t timer;
  int timer_open;
  /* NCCL communicator hand-off: the id the trainer made and for whom. */
  uint8_t nccl_id[128];
  int has_nccl_id;
  uint32_t nccl_members[MAX_WORKERS];
  size_t n_nccl_members;
  int draining; /* inside drain(): re-entrant calls only queue */
  int64_t plan_ack_timeout_ms, broadcast_timeout_ms; /* the active run's scheduler settings */
};

static int64_t now_ms(void) { return orch_now_ms(); }

/* ---- worker table -------------------------------------------------------------- */

static orch_worker *worker_by_id(orch_runner *r, uint32_t id) {
  for (size_t i = 0; i < r->nworkers; i++)
    if (r->workers[i]->id == id) return r->workers[i];
  return NULL;
}

static orch_worker *worker_by_api_id(orch_runner *r, const char *api_id) {
  for (size_t i = 0; i < r->nworkers; i++)
    if (!strcmp(r->workers[i]->api_id, api_id)) return r->workers[i];
  return NULL;
}

static void worker_free(orch_worker *w) {
  if (w->caps) protobuf_c_message_free_unpacked(&w->caps->base, NULL);
  if (w->manifest) protobuf_c_message_free_unpacked(&w->manifest->base, NULL);
  free(w);
}

/* protobuf-c has no deep copy: pack and unpack. */
static ProtobufCMessage *pb_copy(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return NULL;
  protobuf_c_message_pack(m, buf);
  ProtobufCMessage *c = protobuf_c_message_unpack(m->descriptor, NULL, n, buf);
  free(buf);
  return c;
}

static const char *role_label(Rlorch__V1__WorkerRole r) {
  return r == RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER ? "trainer" : "inference";
}

static const char *state_label(Rlorch__V1__WorkerState s) {
  switch (s) {
  case RLORCH__V1__WORKER_STATE__WORKER_STATE_REGISTERED: return "registered";
  case RLORCH__V1__WORKER_STATE__WORKER_STATE_READY: return "ready";
  case RLORCH__V1__WORKER_STATE__WORKER_STATE_BUSY: return "busy";
  case RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST: return "lost";
  default: return "unknown";
  }
}

static void workers_gauge(orch_runner *r) {
  static const Rlorch__V1__WorkerState states[] = {
      RLORCH__V1__WORKER_STATE__WORKER_STATE_REGISTERED,
      RLORCH__V1__WORKER_STATE__WORKER_STATE_READY, RLORCH__V1__WORKER_STATE__WORKER_STATE_BUSY,
      RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST};
  static const Rlorch__V1__WorkerRole roles[] = {RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER,
                                                 RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE};
  for (size_t a = 0; a < 2; a++) {
    for (size_t b = 0; b < 4; b++) {
      double n = 0;
      for (size_t i = 0; i < r->nworkers; i++)
        if (r->workers[i]->role == roles[a] && r->workers[i]->state == states[b]) n++;
      const char *lv[] = {role_label(roles[a]), state_label(states[b])};
      metrics_gauge_set(r->o->m.workers, lv, n);
    }
  }
}

static void worker_info(orch_runner *r, const orch_worker *w, Rlorch__V1__WorkerInfo *info) {
  rlorch__v1__worker_info__init(info);
  info->id = (char *)w->api_id;
  info->role = w->role;
  info->state = w->state;
  info->name = (char *)w->name;
  info->capabilities = w->caps;
  info->run_id = (char *)(r->run && w->in_run ? r->run->id : "");
  info->policy_version = w->policy_version;
  info->last_heartbeat_unix_ms = w->last_seen_ms;
  info->data_address = (char *)w->data_address;
}

static void publish_worker(orch_runner *r, orch_worker *w) {
  workers_gauge(r);
  Rlorch__V1__WorkerInfo info;
  worker_info(r, w, &info);
  store_worker_put(r->o->db, &info);
  if (!r->run) return;
  Rlorch__V1__WorkerEvent we = RLORCH__V1__WORKER_EVENT__INIT;
  we.worker = &info;
  Rlorch__V1__RunEvent ev = RLORCH__V1__RUN_EVENT__INIT;
  ev.event_case = RLORCH__V1__RUN_EVENT__EVENT_WORKER;
  ev.worker = &we;
  orch_publish(r->o, r->run->id, &ev);
}

size_t orch_runner_workers(orch_runner *r, const char *run_id, Rlorch__V1__WorkerInfo ***out) {
  Rlorch__V1__WorkerInfo **v = calloc(r->nworkers ? r->nworkers : 1, sizeof *v);
  size_t n = 0;
  if (!v) {
    *out = NULL;
    return 0;
  }
  for (size_t i = 0; i < r->nworkers; i++) {
    orch_worker *w = r->workers[i];
    if (run_id && run_id[0] && !(r->run && w->in_run && !strcmp(r->run->id, run_id))) continue;
    Rlorch__V1__WorkerInfo tmp;
    worker_info(r, w, &tmp);
    v[n] = (Rlorch__V1__WorkerInfo *)pb_copy(&tmp.base);
    if (v[n]) n++;
  }
  *out = v;
  return n;
}

void orch_workers_free(Rlorch__V1__WorkerInfo **w, size_t n) {
  for (size_t i = 0; i < n; i++) protobuf_c_message_free_unpacked(&w[i]->base, NULL);
  free(w);
}

/* ---- commands to workers ----------------------------------------------------------- */

static int send_command(orch_runner *r, orch_worker *w, Rlorch__V1__Command *cmd) {
  if (!w->attach) return -1;
  cmd->seq = ++w->cmd_seq;
  cmd->run_id = r->run ? r->run->id : "";
  return rpc_call_send(w->attach, &cmd->base);
}

/* ---- the active run ------------------------------------------------------------------ */

static void drain(orch_runner *r);
static void arm_timer(orch_runner *r);

static Rlorch__V1__RunState run_state_pb(sched_run_state s) { return (Rlorch__V1__RunState)s; }

static void save_run(orch_runner *r) {
  r->run->updated_unix_ms = now_ms();
  if (store_run_update(r->o->db, r->run) != 0)
    log_error("store_failed", "run=%s error=\"%s\"", r->run->id, store_errmsg(r->o->db));
}

static void publish_run(orch_runner *r) {
  Rlorch__V1__RunEvent ev = RLORCH__V1__RUN_EVENT__INIT;
  ev.event_case = RLORCH__V1__RUN_EVENT__EVENT_RUN;
  ev.run = r->run;
  orch_publish(r->o, r->run->id, &ev);
}

static void set_run_message(Rlorch__V1__Run *run, const char *msg) {
  if (run->message && run->message != protobuf_c_empty_string) free(run->message);
  run->message = strdup(msg ? msg : "");
  if (!run->message) run->message = (char *)protobuf_c_empty_string;
}

static void publish_broadcast(orch_runner *r, const sched_action *a,
                              Rlorch__V1__BroadcastEvent__Phase phase, const char *reason) {
  Rlorch__V1__BroadcastEvent be = RLORCH__V1__BROADCAST_EVENT__INIT;
  be.plan_id = (char *)a->plan_id;
  be.step = a->step;
  be.phase = phase;
  be.mode = (Rlorch__V1__BroadcastMode)a->mode;
  be.reason = (char *)(reason ? reason : "");
  Rlorch__V1__RunEvent ev = RLORCH__V1__RUN_EVENT__INIT;
  ev.event_case = RLORCH__V1__RUN_EVENT__EVENT_BROADCAST;
  ev.broadcast = &be;
  orch_publish(r->o, r->run->id, &ev);
}

static uint64_t step_seed(const char *run_id, uint64_t step) {
  uint64_t h = 1469598103934665603ull;
  for (const char *p = run_id; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
  return h ^ (step * 0x9E3779B97F4A7C15ull);
}

static orch_worker *trainer(orch_runner *r) {
  for (size_t i = 0; i < r->nworkers; i++)
    if (r->workers[i]->role == RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER && r->workers[i]->in_run &&
        r->workers[i]->state != RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST)
      return r->workers[i];
  return NULL;
}

/* The NCCL id is tied to the set of ranks it was made for. */
static int nccl_members_match(orch_runner *r, const uint32_t *ids, size_t n) {
  if (!r->has_nccl_id || n != r->n_nccl_members) return 0;
  for (size_t i = 0; i < n; i++)
    if (r->nccl_members[i] != ids[i]) return 0;
  return 1;
}

static void live_members(orch_runner *r, uint32_t *ids, size_t *n) {
  *n = 0;
  orch_worker *t = trainer(r);
  if (t) ids[(*n)++] = t->id;
  for (size_t i = 0; i < r->nworkers; i++) {
    orch_worker *w = r->workers[i];
    if (w->role == RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE && w->in_run && w->attach &&
        w->state != RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST)
      ids[(*n)++] = w->id;
  }
}

static void act_dispatch(orch_runner *r, const sched_action *a) {
  orch_worker *w = worker_by_id(r, a->worker);
  Rlorch__V1__RolloutRequest rq = RLORCH__V1__ROLLOUT_REQUEST__INIT;
  rq.request_id = a->request_id;
  rq.count = a->count;
  Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
  cmd.kind_case = RLORCH__V1__COMMAND__KIND_ROLLOUT;
  cmd.rollout = &rq;
  if (!w || send_command(r, w, &cmd) != 0)
    sched_worker_lost(r->sched, now_ms(), a->worker, "command stream closed");
}

static void act_train(orch_runner *r, const sched_action *a) {
  orch_worker *w = worker_by_id(r, a->worker);
  Rlorch__V1__TrainStep ts = RLORCH__V1__TRAIN_STEP__INIT;
  ts.step = a->step;
  ts.rollout_ids = (uint64_t *)a->rollout_ids;
  ts.n_rollout_ids = a->nrollouts;
  ts.batch_tokens = a->batch_tokens;
  ts.seed = step_seed(r->run->id, a->step);
  uint32_t ids[MAX_WORKERS];
  size_t n;
  live_members(r, ids, &n);
  ts.want_nccl_id = !nccl_members_match(r, ids, n);
  if (ts.want_nccl_id) {
    memcpy(r->nccl_members, ids, n * sizeof ids[0]);
    r->n_nccl_members = n;
    r->has_nccl_id = 0;
  }
  Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
  cmd.kind_case = RLORCH__V1__COMMAND__KIND_TRAIN;
  cmd.train = &ts;
  if (!w || send_command(r, w, &cmd) != 0)
    sched_worker_lost(r->sched, now_ms(), a->worker, "command stream closed");
}

/* Builds the plan from the trainer's manifest and sends it to every participant. */
static int build_plan(orch_runner *r, const sched_action *a, uint64_t *hash, char *err,
                      size_t errlen) {
  orch_worker *t = worker_by_id(r, a->participants[0]);
  if (!t || !t->manifest) return snprintf(err, errlen, "no trainer manifest"), -1;
  bcast_tensor *tensors = NULL;
  size_t nt = 0;
  bcast_err be = {0};
  if (bcast_manifest_from_pb(t->manifest, &tensors, &nt, &be) != 0)
    return snprintf(err, errlen, "trainer manifest: %s", be.msg), -1;
  bcast_mode mode = (bcast_mode)a->mode;
  if (mode != BCAST_MODE_HOST && !nccl_members_match(r, a->participants, a->nparticipants)) {
    free(tensors);
    return snprintf(err, errlen,
                    "the trainer's NCCL id was made for another set of participants"),
           -1;
  }
  bcast_plan_opts po = {.id = a->plan_id,
                        .mode = mode,
                        .staging_budget = r->run->spec->staging_budget_bytes,
                        .world_size = (uint32_t)a->nparticipants,
                        .root_rank = 0,
                        .policy_version = a->policy_version,
                        /* Participants give up when the scheduler would. */
                        .deadline_unix_ms = now_ms() + r->plan_ack_timeout_ms +
                                            r->broadcast_timeout_ms,
                        .host_endpoint = t->data_address,
                        .checksum = BCAST_CHECKSUM_XXH3_64};
  bcast_plan *plan = NULL;
  int rc = bcast_plan_build(tensors, nt, &po, &plan, &be);
  free(tensors);
  if (rc != 0) return snprintf(err, errlen, "plan: %s", be.msg), -1;
  snprintf(plan->mode_reason, sizeof plan->mode_reason, "%s", a->text);
  if (mode != BCAST_MODE_HOST) {
    memcpy(plan->nccl_id, r->nccl_id, sizeof plan->nccl_id);
    plan->has_nccl_id = 1;
  }
  plan->hash = bcast_plan_hash(plan);
  Rlorch__V1__BroadcastPlan *pb = NULL;
  if (bcast_plan_to_pb(plan, &pb, &be) != 0) {
    bcast_plan_free(plan);
    return snprintf(err, errlen, "plan encoding: %s", be.msg), -1;
  }
  *hash = plan->hash;
  log_info("plan_built", "run=%s plan=%s mode=%s buckets=%zu wire_bytes=%" PRIu64
           " participants=%zu reason=\"%s\"", r->run->id, a->plan_id, bcast_mode_name(mode),
           plan->nbuckets, bcast_plan_wire_bytes(plan), a->nparticipants, a->text);
  for (size_t i = 0; i < a->nparticipants; i++) {
    orch_worker *w = worker_by_id(r, a->participants[i]);
    Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
    cmd.kind_case = RLORCH__V1__COMMAND__KIND_PLAN;
    cmd.plan = pb;
    cmd.rank = (uint32_t)i;
    if (!w || send_command(r, w, &cmd) != 0)
      sched_worker_lost(r->sched, now_ms(), a->participants[i], "command stream closed");
  }
  bcast_pb_free(&pb->base);
  bcast_plan_free(plan);
  return 0;
}

static void act_build_plan(orch_runner *r, const sched_action *a) {
  char err[768] = "";
  uint64_t hash = 0;
  if (build_plan(r, a, &hash, err, sizeof err) != 0) {
    log_error("plan_failed", "run=%s plan=%s error=\"%s\"", r->run->id, a->plan_id, err);
    sched_plan_built(r->sched, now_ms(), a->plan_id, 0, err);
    return;
  }
  publish_broadcast(r, a, RLORCH__V1__BROADCAST_EVENT__PHASE__PHASE_PLANNED, a->text);
  sched_plan_built(r->sched, now_ms(), a->plan_id, hash, NULL);
}

static void act_trigger(orch_runner *r, const sched_action *a) {
  publish_broadcast(r, a, RLORCH__V1__BROADCAST_EVENT__PHASE__PHASE_ACKED, NULL);
  for (size_t i = 0; i < a->nparticipants; i++) {
    orch_worker *w = worker_by_id(r, a->participants[i]);
    Rlorch__V1__TriggerBroadcast tb = RLORCH__V1__TRIGGER_BROADCAST__INIT;
    tb.plan_id = (char *)a->plan_id;
    tb.plan_hash = a->plan_hash;
    Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
    cmd.kind_case = RLORCH__V1__COMMAND__KIND_TRIGGER;
    cmd.trigger = &tb;
    cmd.rank = (uint32_t)i;
    if (!w || send_command(r, w, &cmd) != 0)
      sched_worker_lost(r->sched, now_ms(), a->participants[i], "command stream closed");
  }
}

static void act_abort(orch_runner *r, const sched_action *a) {
  log_warn("broadcast_aborted", "run=%s plan=%s reason=\"%s\"", r->run->id, a->plan_id, a->text);
  const char *lv[] = {"aborted"};
  metrics_counter_inc(r->o->m.broadcast_aborts, lv);
  publish_broadcast(r, a, RLORCH__V1__BROADCAST_EVENT__PHASE__PHASE_ABORTED, a->text);
  /* A broken communicator must not be reused. */
  r->has_nccl_id = 0;
  r->n_nccl_members = 0;
  for (size_t i = 0; i < a->nparticipants; i++) {
    orch_worker *w = worker_by_id(r, a->participants[i]);
    Rlorch__V1__AbortCommand ab = RLORCH__V1__ABORT_COMMAND__INIT;
    ab.plan_id = (char *)a->plan_id;
    ab.reason = (char *)a->text;
    Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
    cmd.kind_case = RLORCH__V1__COMMAND__KIND_ABORT;
    cmd.abort = &ab;
    if (w) send_command(r, w, &cmd);
  }
}

static void record_metrics(orch_runner *r, const sched_step_record *rec) {
  orch_metrics *m = &r->o->m;
  const char *mode[] = {sched_mode_name(rec->mode)};
  metrics_histogram_observe(m->step_duration, NULL, rec->step_seconds);
  metrics_histogram_observe(m->broadcast_duration, mode, rec->total_seconds);
  const char *h2d[] = {"h2d"}, *cast[] = {"cast"}, *exposed[] = {"exposed"};
  metrics_histogram_observe(m->staging_seconds, h2d, rec->h2d_seconds);
  metrics_histogram_observe(m->staging_seconds, cast, rec->cast_seconds);
  metrics_histogram_observe(m->staging_seconds, exposed, rec->exposed_staging_seconds);
  const char *pcie[] = {mode[0], "pcie"}, *wire[] = {mode[0], "wire"};
  metrics_counter_add(m->broadcast_bytes, pcie, (double)rec->pcie_bytes);
  metrics_counter_add(m->broadcast_bytes, wire, (double)rec->wire_bytes);
  metrics_gauge_set(m->broadcast_throughput, NULL, rec->gbps * 1e9);
  metrics_gauge_set(m->policy_version, NULL, (double)rec->policy_version);
  const char *used[] = {"used"}, *stale[] = {"dropped_stale"};
  metrics_counter_add(m->rollouts, used, rec->rollouts_used);
  metrics_counter_add(m->rollouts, stale, rec->rollouts_dropped);
  sched_counters c;
  sched_get_counters(r->sched, &c);
  metrics_gauge_set(m->async_level, NULL, (double)c.async_level);
}

static void act_commit(orch_runner *r, const sched_action *a) {
  const sched_step_record *rec = a->record;
  Rlorch__V1__StepRecord pb = RLORCH__V1__STEP_RECORD__INIT;
  sched_step_record_to_pb(rec, &pb);
  pb.finished_unix_ms = now_ms();
  if (store_step_put(r->o->db, &pb) != 0)
    log_error("store_failed", "run=%s step=%" PRIu64 " error=\"%s\"", r->run->id, rec->step,
              store_errmsg(r->o->db));
  r->run->steps_done = rec->step + 1;
  r->run->policy_version = rec->policy_version;
  save_run(r);
  record_metrics(r, rec);
  log_info("step", "run=%s step=%" PRIu64 " mode=%s transport=%s used=%u dropped=%u "
           "train_s=%.4f bcast_s=%.4f h2d_s=%.4f cast_s=%.4f wire_s=%.4f exposed_s=%.4f "
           "gbps=%.3f verified=%d",
           r->run->id, rec->step, sched_mode_name(rec->mode), rec->transport, rec->rollouts_used,
           rec->rollouts_dropped, rec->train_seconds, rec->total_seconds, rec->h2d_seconds,
           rec->cast_seconds, rec->wire_seconds, rec->exposed_staging_seconds, rec->gbps,
           rec->weights_verified);
  Rlorch__V1__RunEvent ev = RLORCH__V1__RUN_EVENT__INIT;
  ev.event_case = RLORCH__V1__RUN_EVENT__EVENT_STEP;
  ev.step = &pb;
  ev.unix_ms = pb.finished_unix_ms;
  orch_publish(r->o, r->run->id, &ev);
}

static void act_run_state(orch_runner *r, const sched_action *a) {
  r->run->state = run_state_pb(a->run_state);
  set_run_message(r->run, a->text);
  save_run(r);
  log_info("run_state", "run=%s state=%s message=\"%s\"", r->run->id,
           sched_run_state_name(a->run_state), a->text);
  publish_run(r);
}

static void act_worker_state(orch_runner *r, const sched_action *a) {
  orch_worker *w = worker_by_id(r, a->worker);
  if (!w) return;
  w->state = (Rlorch__V1__WorkerState)a->worker_state;
  if (a->worker_state == SCHED_WORKER_LOST) {
    log_warn("worker_lost", "worker=%s name=%s reason=\"%s\"", w->api_id, w->name, a->text);
    if (w->attach) {
      rpc_call_set_cancel_cb(w->attach, NULL, NULL);
      rpc_call_finish(w->attach, GRPC_STATUS_UNAVAILABLE, "worker declared lost");
      w->attach = NULL;
    }
  }
  publish_worker(r, w);
}

/* Ends the active run once it reached a final state. */
static void release_run(orch_runner *r) {
  if (!r->run) return;
  orch_watchers_end(r->o, r->run->id);
  for (size_t i = 0; i < r->nworkers; i++) r->workers[i]->in_run = 0;
  protobuf_c_message_free_unpacked(&r->run->base, NULL);
  r->run = NULL;
  sched_free(r->sched);
  r->sched = NULL;
  r->has_nccl_id = 0;
  r->n_nccl_members = 0;
  workers_gauge(r);
}

/* Executes every pending scheduler action; actions may cause events (a send
 * fails -> worker lost) which queue more actions, so loop until quiet. */
static void drain(orch_runner *r) {
  if (r->draining || !r->sched) return;
  r->draining = 1;
  for (int rounds = 0; r->sched && rounds < 1000; rounds++) {
    const sched_action *acts;
    size_t n = sched_actions(r->sched, &acts);
    if (n == 0) break;
    /* Copy: handling an action may feed the scheduler, which invalidates acts. */
    sched_action *copy = malloc(n * sizeof *copy);
    if (!copy) break;
    memcpy(copy, acts, n * sizeof *copy);
    /* Deep-copy the pointed-to arrays for the same reason. */
    uint32_t *parts = NULL;
    uint64_t *rolls = NULL;
    sched_step_record *recs = NULL;
    size_t np = 0, nr = 0, nrec = 0;
    for (size_t i = 0; i < n; i++) {
      np += copy[i].nparticipants;
      nr += copy[i].nrollouts;
      nrec += copy[i].record != NULL;
    }
    parts = malloc((np ? np : 1) * sizeof *parts);
    rolls = malloc((nr ? nr : 1) * sizeof *rolls);
    recs = malloc((nrec ? nrec : 1) * sizeof *recs);
    if (!parts || !rolls || !recs) {
      free(copy), free(parts), free(rolls), free(recs);
      break;
    }
    size_t ip = 0, ir = 0, irec = 0;
    for (size_t i = 0; i < n; i++) {
      if (copy[i].nparticipants) {
        memcpy(parts + ip, copy[i].participants, copy[i].nparticipants * sizeof *parts);
        copy[i].participants = parts + ip;
        ip += copy[i].nparticipants;
      }
      if (copy[i].nrollouts) {
        memcpy(rolls + ir, copy[i].rollout_ids, copy[i].nrollouts * sizeof *rolls);
        copy[i].rollout_ids = rolls + ir;
        ir += copy[i].nrollouts;
      }
      if (copy[i].record) {
        recs[irec] = *copy[i].record;
        copy[i].record = &recs[irec++];
      }
    }
    sched_actions_clear(r->sched);
    int final = 0;
    for (size_t i = 0; i < n && r->sched; i++) {
      const sched_action *a = &copy[i];
      switch (a->kind) {
      case SCHED_ACT_DISPATCH: act_dispatch(r, a); break;
      case SCHED_ACT_TRAIN: act_train(r, a); break;
      case SCHED_ACT_BUILD_PLAN: act_build_plan(r, a); break;
      case SCHED_ACT_TRIGGER: act_trigger(r, a); break;
      case SCHED_ACT_ABORT: act_abort(r, a); break;
      case SCHED_ACT_COMMIT: act_commit(r, a); break;
      case SCHED_ACT_RUN_STATE:
        act_run_state(r, a);
        if (a->run_state == SCHED_RUN_STOPPED || a->run_state == SCHED_RUN_SUCCEEDED ||
            a->run_state == SCHED_RUN_FAILED)
          final = 1;
        break;
      case SCHED_ACT_WORKER_STATE: act_worker_state(r, a); break;
      }
    }
    free(copy), free(parts), free(rolls), free(recs);
    if (final) release_run(r);
  }
  r->draining = 0;
  arm_timer(r);
}

static void on_timer(uv_timer_t *t) {
  orch_runner *r = t->data;
  int64_t now = now_ms();
  /* Heartbeat loss of workers outside a run is the shell's job. */
  for (size_t i = 0; i < r->nworkers; i++) {
    orch_worker *w = r->workers[i];
    if (w->in_run || w->state == RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST) continue;
    if (now - w->last_seen_ms > (int64_t)r->o->cfg->worker_timeout_ms) {
      w->state = RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST;
      log_warn("worker_lost", "worker=%s name=%s reason=\"no heartbeat\"", w->api_id, w->name);
      if (w->attach) {
        rpc_call_set_cancel_cb(w->attach, NULL, NULL);
        rpc_call_finish(w->attach, GRPC_STATUS_UNAVAILABLE, "worker declared lost");
        w->attach = NULL;
      }
      publish_worker(r, w);
    }
  }
  if (r->sched) {
    sched_tick(r->sched, now);
    drain(r);
  }
  arm_timer(r);
}

static void arm_timer(orch_runner *r) {
  if (!r->timer_open) return;
  int64_t due = 1000; /* the shell's own heartbeat sweep */
  if (r->sched) {
    int64_t d = sched_next_deadline(r->sched);
    if (d != SCHED_NEVER) {
      int64_t in = d - now_ms();
      if (in < due) due = in;
    }
  }
  if (due < TICK_MIN_MS) due = TICK_MIN_MS;
  uv_timer_start(&r->timer, on_timer, (uint64_t)due, 0);
}

static void offload_of(const Rlorch__V1__WeightManifest *m, sched_offload *off) {
  memset(off, 0, sizeof *off);
  if (!m) return;
  for (size_t i = 0; i < m->n_tensors; i++) {
    const Rlorch__V1__TensorSpec *t = m->tensors[i];
    uint64_t elems = 1;
    for (size_t d = 0; d < t->n_shape; d++) elems *= t->shape[d];
    uint64_t bytes = elems * (t->storage_dtype == RLORCH__V1__DTYPE__DTYPE_FP32 ? 4 : 2);
    switch (t->residency) {
    case RLORCH__V1__RESIDENCY__RESIDENCY_GPU: off->gpu_tensors++, off->gpu_bytes += bytes; break;
    case RLORCH__V1__RESIDENCY__RESIDENCY_HOST_PINNED:
      off->pinned_tensors++, off->pinned_bytes += bytes;
      break;
    default: off->pageable_tensors++, off->pageable_bytes += bytes; break;
    }
  }
}

static void caps_of(const orch_worker *w, sched_caps *c) {
  memset(c, 0, sizeof *c);
  if (!w->caps) return;
  c->cuda_devices = w->caps->cuda_devices;
  c->nccl = w->caps->nccl_version[0] != 0;
  c->pinned_limit_bytes = w->caps->pinned_limit_bytes;
}

/* Tells the active run's scheduler about a live worker. */
static void join_run(orch_runner *r, orch_worker *w) {
  if (!r->sched || w->in_run || w->state == RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST) return;
  sched_caps caps;
  sched_offload off;
  caps_of(w, &caps);
  offload_of(w->manifest, &off);
  sched_role role = w->role == RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER ? SCHED_ROLE_TRAINER
                                                                           : SCHED_ROLE_INFERENCE;
  int64_t now = now_ms();
  int rc = sched_worker_registered(r->sched, now, w->id, role, w->name, &caps,
                                   role == SCHED_ROLE_TRAINER ? &off : NULL);
  if (rc != 0) {
    log_warn("worker_not_joined", "worker=%s run=%s error=\"%s\"", w->api_id, r->run->id,
             sched_last_error(r->sched));
    return;
  }
  w->in_run = 1;
  if (w->attach) sched_worker_attached(r->sched, now, w->id);
  publish_worker(r, w);
}

int orch_runner_start(orch_runner *r, Rlorch__V1__Run *run, char *err, size_t errlen) {
  if (r->run) return snprintf(err, errlen, "run '%s' is active", r->run->id), -1;
  const config *cfg = r->o->cfg;
  sched_settings st;
  sched_settings_default(&st);
  snprintf(st.run_id, sizeof st.run_id, "%s", run->id);
  st.steps = run->spec->steps;
  st.rollouts_per_step = run->spec->rollouts_per_step;
  st.max_async_level = run->spec->max_async_level;
  st.policy = (sched_mode)run->policy;
  st.heartbeat_timeout_ms = cfg->worker_timeout_ms;
  r->plan_ack_timeout_ms = st.plan_ack_timeout_ms;
  r->broadcast_timeout_ms = st.broadcast_timeout_ms;
  if (sched_new(&st, &r->sched, err, errlen) != 0) {
    run->state = RLORCH__V1__RUN_STATE__RUN_STATE_FAILED;
    set_run_message(run, err);
    r->run = run;
    save_run(r);
    r->run = NULL;
    protobuf_c_message_free_unpacked(&run->base, NULL);
    return -1;
  }
  r->run = run;
  set_run_message(run, "waiting for 1 trainer and at least 1 inference worker");
  save_run(r);
  for (size_t i = 0; i < r->nworkers; i++) join_run(r, r->workers[i]);
  drain(r);
  return 0;
}

const Rlorch__V1__Run *orch_runner_active(const orch_runner *r) { return r->run; }

int orch_runner_stop(orch_runner *r, const char *run_id, const char *reason, char *err,
                     size_t errlen) {
  if (!r->run || strcmp(r->run->id, run_id) != 0)
    return snprintf(err, errlen, "run '%s' is not active", run_id), -1;
  sched_stop(r->sched, now_ms(), reason);
  drain(r);
  return 0;
}

int orch_runner_set_policy(orch_runner *r, const char *run_id, Rlorch__V1__BroadcastMode p,
                           char *err, size_t errlen) {
  if (!r->run || strcmp(r->run->id, run_id) != 0)
    return snprintf(err, errlen, "run '%s' is not active", run_id), -1;
  if (sched_set_policy(r->sched, now_ms(), (sched_mode)p) != 0)
    return snprintf(err, errlen, "%s", sched_last_error(r->sched)), -1;
  r->run->policy = p;
  save_run(r);
  log_info("policy_set", "run=%s policy=%s", run_id, sched_mode_name((sched_mode)p));
  drain(r);
  return 0;
}

/* ---- Worker API handlers ---------------------------------------------------------- */

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

static void h_register(rpc_call *call, const ProtobufCMessage *req, void *ud) {
  orch *o = ud;
  orch_runner *r = o->runner;
  const Rlorch__V1__RegisterRequest *q = (const void *)req;
  if (o->shutting_down) {
    rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "server shutting down");
    return;
  }
  if (q->role != RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER &&
      q->role != RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "role: want TRAINER or INFERENCE");
    return;
  }
  if (strlen(q->name) >= SCHED_NAME_MAX) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "name: longer than %d bytes",
                  SCHED_NAME_MAX - 1);
    return;
  }
  if (strlen(q->data_address) >= 256) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "data_address: too long");
    return;
  }
  if (q->role == RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER) {
    if (!q->manifest || q->manifest->n_tensors == 0) {
      rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "manifest: a trainer must send one");
      return;
    }
    bcast_tensor *t = NULL;
    size_t nt = 0;
    bcast_err be = {0};
    if (bcast_manifest_from_pb(q->manifest, &t, &nt, &be) != 0) {
      rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "manifest: %s", be.msg);
      return;
    }
    free(t);
  }
  if (r->nworkers >= MAX_WORKERS) {
    rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "too many workers (%d)", MAX_WORKERS);
    return;
  }
  orch_worker *w = calloc(1, sizeof *w);
  if (!w) {
    rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  w->runner = r;
  w->id = ++r->next_id;
  snprintf(w->api_id, sizeof w->api_id, "w-%u", w->id);
  w->role = q->role;
  w->state = RLORCH__V1__WORKER_STATE__WORKER_STATE_REGISTERED;
  snprintf(w->name, sizeof w->name, "%s", q->name[0] ? q->name : w->api_id);
  resolve_data_address(call, q->data_address, w->data_address, sizeof w->data_address);
  if (q->capabilities) w->caps = (Rlorch__V1__Capabilities *)pb_copy(&q->capabilities->base);
  if (q->manifest) w->manifest = (Rlorch__V1__WeightManifest *)pb_copy(&q->manifest->base);
  w->last_seen_ms = now_ms();
  r->workers[r->nworkers++] = w;
  log_info("worker_registered", "worker=%s name=%s role=%s cuda_devices=%u nccl=\"%s\"",
           w->api_id, w->name, role_label(w->role), w->caps ? w->caps->cuda_devices : 0,
           w->caps ? w->caps->nccl_version : "");
  Rlorch__V1__RegisterResponse resp = RLORCH__V1__REGISTER_RESPONSE__INIT;
  resp.worker_id = w->api_id;
  resp.heartbeat_interval_ms = o->cfg->heartbeat_interval_ms;
  /* Unique per worker (rollout ids are prefixed with it); the rank inside a
   * given plan is carried by each plan command. */
  resp.rank = w->role == RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER ? 0 : w->id;
  rpc_call_reply(call, &resp.base);
  publish_worker(r, w);
  join_run(r, w);
  drain(r);
}

/* The worker's command stream closed (process gone, network cut): it is lost
 * now, not after a heartbeat timeout. */
static void on_attach_cancel(rpc_call *call, void *ud) {
  orch_worker *w = ud;
  orch_runner *r = w->runner;
  w->attach = NULL;
  rpc_call_finish(call, GRPC_STATUS_CANCELLED, "stream closed");
  if (r->sched && w->in_run) {
    sched_worker_lost(r->sched, now_ms(), w->id, "command stream closed");
    drain(r);
  } else if (w->state != RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST) {
    w->state = RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST;
    log_warn("worker_lost", "worker=%s name=%s reason=\"command stream closed\"", w->api_id,
             w->name);
    publish_worker(r, w);
  }
}

static void h_attach(rpc_call *call, const ProtobufCMessage *req, void *ud) {
  orch *o = ud;
  orch_runner *r = o->runner;
  const Rlorch__V1__AttachRequest *q = (const void *)req;
  orch_worker *w = worker_by_api_id(r, q->worker_id);
  if (!w || w->state == RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST) {
    rpc_call_finish(call, GRPC_STATUS_NOT_FOUND, "worker not registered (register again)");
    return;
  }
  if (o->shutting_down) {
    rpc_call_finish(call, GRPC_STATUS_UNAVAILABLE, "server shutting down");
    return;
  }
  if (w->attach) {
    rpc_call_set_cancel_cb(w->attach, NULL, NULL);
    rpc_call_finish(w->attach, GRPC_STATUS_ABORTED, "replaced by a newer Attach");
  }
  w->attach = call;
  w->last_seen_ms = now_ms();
  rpc_call_set_cancel_cb(call, on_attach_cancel, w);
  w->state = RLORCH__V1__WORKER_STATE__WORKER_STATE_READY;
  log_info("worker_attached", "worker=%s name=%s", w->api_id, w->name);
  if (r->sched && w->in_run) sched_worker_attached(r->sched, now_ms(), w->id);
  publish_worker(r, w);
  join_run(r, w);
  drain(r);
}

static void to_bcast_report(const Rlorch__V1__BroadcastDone *d, sched_bcast_report *rep) {
  memset(rep, 0, sizeof *rep);
  rep->weights_checksum = d->weights_checksum;
  const Rlorch__V1__StepRecord *s = d->record;
  if (!s) return;
  snprintf(rep->transport, sizeof rep->transport, "%s", s->transport);
  rep->pcie_bytes = s->pcie_bytes;
  rep->wire_bytes = s->wire_bytes;
  rep->h2d_seconds = s->h2d_seconds;
  rep->cast_seconds = s->cast_seconds;
  rep->wire_seconds = s->wire_seconds;
  rep->total_seconds = s->total_seconds;
  rep->exposed_staging_seconds = s->exposed_staging_seconds;
  rep->exposed_measured = s->exposed_measured;
  rep->gbps = s->gbps;
  rep->buckets = s->buckets;
}

static int report_status(rpc_call *call, orch_runner *r, int rc) {
  if (rc == 0 || rc == SCHED_ESTALE) return 0;
  const char *msg = r->sched ? sched_last_error(r->sched) : "";
  grpc_status_code code = rc == SCHED_EINVAL   ? GRPC_STATUS_INVALID_ARGUMENT
                          : rc == SCHED_ENOENT ? GRPC_STATUS_NOT_FOUND
                                               : GRPC_STATUS_FAILED_PRECONDITION;
  rpc_call_fail(call, code, "%s", msg[0] ? msg : sched_strerror(rc));
  return -1;
}

static void h_report(rpc_call *call, const ProtobufCMessage *req, void *ud) {
  orch *o = ud;
  orch_runner *r = o->runner;
  const Rlorch__V1__ReportRequest *q = (const void *)req;
  Rlorch__V1__ReportResponse resp = RLORCH__V1__REPORT_RESPONSE__INIT;
  orch_worker *w = worker_by_api_id(r, q->worker_id);
  if (!w || w->state == RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST) {
    resp.known = 0;
    rpc_call_reply(call, &resp.base);
    return;
  }
  resp.known = 1;
  int64_t now = now_ms();
  w->last_seen_ms = now;
  int rc = 0;
  int in = r->sched && w->in_run;
  switch (q->kind_case) {
  case RLORCH__V1__REPORT_REQUEST__KIND_HEARTBEAT:
    w->policy_version = q->heartbeat->policy_version;
    if (in) rc = sched_worker_heartbeat(r->sched, now, w->id, q->heartbeat->policy_version);
    break;
  case RLORCH__V1__REPORT_REQUEST__KIND_ROLLOUTS: {
    const Rlorch__V1__RolloutResult *res = q->rollouts;
    sched_rollout *v = calloc(res->n_rollouts ? res->n_rollouts : 1, sizeof *v);
    if (!v) {
      rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      return;
    }
    for (size_t i = 0; i < res->n_rollouts; i++) {
      v[i].id = res->rollouts[i]->id;
      v[i].policy_version = res->rollouts[i]->policy_version;
      v[i].tokens = res->rollouts[i]->tokens;
    }
    if (in) rc = sched_rollouts_done(r->sched, now, w->id, res->request_id, v, res->n_rollouts);
    free(v);
    break;
  }
  case RLORCH__V1__REPORT_REQUEST__KIND_STEP_DONE: {
    const Rlorch__V1__StepDone *sd = q->step_done;
    sched_offload off;
    if (sd->manifest && sd->manifest->n_tensors) {
      Rlorch__V1__WeightManifest *m = (Rlorch__V1__WeightManifest *)pb_copy(&sd->manifest->base);
      if (m) {
        if (w->manifest) protobuf_c_message_free_unpacked(&w->manifest->base, NULL);
        w->manifest = m;
      }
    }
    if (sd->nccl_unique_id.len == sizeof r->nccl_id) {
      memcpy(r->nccl_id, sd->nccl_unique_id.data, sizeof r->nccl_id);
      r->has_nccl_id = 1;
    }
    offload_of(w->manifest, &off);
    w->policy_version = sd->step + 1;
    if (in) rc = sched_step_done(r->sched, now, w->id, sd->step, sd->train_seconds, &off);
    break;
  }
  case RLORCH__V1__REPORT_REQUEST__KIND_PLAN_ACK:
    if (in)
      rc = sched_plan_acked(r->sched, now, w->id, q->plan_ack->plan_id, q->plan_ack->plan_hash,
                            q->plan_ack->error);
    break;
  case RLORCH__V1__REPORT_REQUEST__KIND_BROADCAST_DONE: {
    sched_bcast_report rep;
    to_bcast_report(q->broadcast_done, &rep);
    if (in)
      rc = sched_broadcast_done(r->sched, now, w->id, q->broadcast_done->plan_id,
                                q->broadcast_done->error, &rep);
    break;
  }
  default:
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "kind: empty report");
    return;
  }
  if (report_status(call, r, rc) == 0) rpc_call_reply(call, &resp.base);
  drain(r);
}

#define M(name, kind, req, resp, fn) {"/rlorch.v1.Worker/" name, kind, &req, &resp, 1, fn, NULL}
const rpc_method orch_worker_methods[] = {
    M("Register", RPC_UNARY, rlorch__v1__register_request__descriptor,
      rlorch__v1__register_response__descriptor, h_register),
    M("Attach", RPC_SERVER_STREAM, rlorch__v1__attach_request__descriptor,
      rlorch__v1__command__descriptor, h_attach),
    M("Report", RPC_UNARY, rlorch__v1__report_request__descriptor,
      rlorch__v1__report_response__descriptor, h_report),
};
const size_t orch_worker_nmethods = sizeof orch_worker_methods / sizeof orch_worker_methods[0];
#undef M

/* ---- life cycle ------------------------------------------------------------------------ */

int orch_runner_new(orch *o, orch_runner **out) {
  orch_runner *r = calloc(1, sizeof *r);
  if (!r) return -1;
  r->o = o;
  uv_timer_init(o->loop, &r->timer);
  r->timer.data = r;
  r->timer_open = 1;
  arm_timer(r);
  workers_gauge(r);
  *out = r;
  return 0;
}

void orch_runner_shutdown(orch_runner *r) {
  if (r->run) {
    sched_stop(r->sched, now_ms(), "orchestrator shutting down");
    drain(r);
    if (r->run) {
      /* Not quiet yet: the daemon is going away regardless. */
      r->run->state = RLORCH__V1__RUN_STATE__RUN_STATE_STOPPED;
      set_run_message(r->run, "stopped: orchestrator shut down");
      save_run(r);
      publish_run(r);
      release_run(r);
    }
  }
  for (size_t i = 0; i < r->nworkers; i++) {
    orch_worker *w = r->workers[i];
    if (!w->attach) continue;
    Rlorch__V1__ShutdownCommand sc = RLORCH__V1__SHUTDOWN_COMMAND__INIT;
    sc.reason = "orchestrator shutting down";
    Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
    cmd.kind_case = RLORCH__V1__COMMAND__KIND_SHUTDOWN;
    cmd.shutdown = &sc;
    send_command(r, w, &cmd);
    rpc_call_set_cancel_cb(w->attach, NULL, NULL);
    rpc_call_finish(w->attach, GRPC_STATUS_UNAVAILABLE, "server shutting down");
    w->attach = NULL;
  }
  if (r->timer_open) {
    uv_timer_stop(&r->timer);
    uv_close((uv_handle_t *)&r->timer, NULL);
    r->timer_open = 0;
  }
}

void orch_runner_free(orch_runner *r) {
  if (!r) return;
  if (r->run) protobuf_c_message_free_unpacked(&r->run->base, NULL);
  sched_free(r->sched);
  for (size_t i = 0; i < r->nworkers; i++) worker_free(r->workers[i]);
  free(r);
}
