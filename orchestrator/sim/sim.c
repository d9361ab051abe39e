/* The cluster simulator (sim.h). */
#include "orchestrator/sim/sim.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "orchestrator/sim/evq.h"

enum { EV_ROLLOUT = 1, EV_STEP_DONE, EV_BUILT, EV_ACK, EV_BDONE, EV_HEARTBEAT };

typedef struct sim_ev {
  int type;
  uint32_t worker;
  uint64_t a;       /* request id; step */
  uint64_t group;   /* rollout: the request's group */
  uint64_t version; /* rollout: the version the worker held when asked */
  uint32_t count;
  uint32_t plan;    /* BUILT, ACK, BDONE: which plan (its generation) */
} sim_ev;

typedef struct sim {
  const sim_workload *w;
  const bcast_topo *t;
  sim_result *res;
  sched *s;
  evq q;
  int64_t now;
  uint64_t rng;
  uint32_t nworkers;
  uint64_t *held;           /* worker -> version it holds */
  uint64_t next_rollout;
  bcast_shard_map *map;
  bcast_plan *plan;         /* the plan in flight */
  uint32_t plan_gen;        /* bumped per plan: stale events are dropped */
  char plan_id[SCHED_PLAN_ID_MAX];
  uint64_t plan_step;
  uint64_t *src_sums;       /* the sources' checksums, one per rank */
  uint64_t *src_wire;       /* each source's wire bytes in the plan */
  double predicted_s;
  uint8_t *cancelled;       /* request id -> cancelled (grows) */
  size_t ncancelled;
  char *err;
  size_t errlen;
  int failed;
  int succeeded;            /* RUN_STATE succeeded was seen */
  sim_cpu_kind actions_kind; /* whom taking actions is charged to */
} sim;

static int fail(sim *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(sim *m, const char *fmt, ...) {
  if (m->failed) return -1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->err, m->errlen, fmt, ap);
  va_end(ap);
  m->failed = 1;
  return -1;
}

/* This thread's CPU time, to the nanosecond (getrusage counts microseconds,
 * longer than most scheduler calls take). */
static double cpu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Charges the interval since c0 less an empty one timed at once after it.
 * A timed interval holds the end of one clock read and the start of the
 * next, a system call's worth, more than many scheduler calls cost, and
 * that worth moves with the machine's load; an empty interval measured
 * beside each call takes it off under the same conditions. */
static void charge(sim *m, sim_cpu_kind k, double c0) {
  double c1 = cpu_now(), c2 = cpu_now();
  double s = (c1 - c0) - (c2 - c1);
  m->res->timer_s += c2 - c1; /* summed here, a mean at the end */
  m->res->timed_calls++;
  m->res->cpu_by[k] += s;
  if (k != SIM_CPU_REGISTER) m->res->sched_cpu_s += s;
}

/* A scheduler call, timed: the orchestrator's CPU and nothing else. */
#define SCHED_CALL(m, kind, expr)                   \
  ({                                                \
    double c0_ = cpu_now();                         \
    int rc_ = (expr);                               \
    charge((m), (kind), c0_);                       \
    rc_;                                            \
  })

const char *sim_cpu_kind_name(sim_cpu_kind k) {
  static const char *names[SIM_CPU_KINDS] = {"register", "heartbeat", "rollouts", "step", "plan",
                                             "broadcast", "tick", "deadline", "actions"};
  return k < SIM_CPU_KINDS ? names[k] : "unknown";
}

static uint64_t rnd(sim *m) {
  m->rng ^= m->rng << 13;
  m->rng ^= m->rng >> 7;
  m->rng ^= m->rng << 17;
  return m->rng;
}

/* mean x uniform(1 - spread, 1 + spread), in whole milliseconds, >= 1. */
static int64_t jitter_ms(sim *m, double mean, double spread) {
  double u = (double)(rnd(m) >> 11) / 9007199254740992.0;
  double v = mean * (1.0 - spread + 2.0 * spread * u);
  return v < 1 ? 1 : (int64_t)llround(v);
}

static int push(sim *m, int64_t at, sim_ev e) {
  if (evq_push(&m->q, at, &e)) return fail(m, "out of memory (event queue)");
  return 0;
}

void sim_workload_default(sim_workload *w) {
  *w = (sim_workload){.params = 8000000000ull, .layers = 32, .storage_dtype = BCAST_DTYPE_FP32,
                      .wire_dtype = BCAST_DTYPE_BF16, .residency = BCAST_RES_GPU,
                      .trainer_ranks = 1, .inference_workers = 1, .group_size = 8,
                      .max_async_level = 1, .max_outstanding = 2, .steps = 3, .rollout_ms = 2000,
                      .train_ms = 1000, .heartbeat_ms = 2000, .replica_gpus = 1, .seed = 1};
}

bcast_topo_place sim_place(const bcast_topo *t, uint32_t worker) {
  return (bcast_topo_place){worker / t->gpus_per_node, worker % t->gpus_per_node};
}

static int bad(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

int sim_workload_check(const sim_workload *w, const bcast_topo *t, char *err, size_t errlen) {
  bcast_err be = {0};
  if (bcast_topo_check(t, &be)) return bad(err, errlen, "%s", be.msg);
  if (w->layers < 1) return bad(err, errlen, "layers: must be >= 1");
  if (w->params < 4ull * w->layers)
    return bad(err, errlen, "params: %" PRIu64 " is fewer than 4 tensors x %u layers", w->params,
               w->layers);
  if (w->storage_dtype != BCAST_DTYPE_FP32 && w->storage_dtype != BCAST_DTYPE_BF16)
    return bad(err, errlen, "storage_dtype: fp32 or bf16");
  if (!bcast_cast_supported(w->storage_dtype, w->wire_dtype))
    return bad(err, errlen, "dtype: %s cannot be sent as %s", bcast_dtype_name(w->storage_dtype),
               bcast_dtype_name(w->wire_dtype));
  if (w->residency < BCAST_RES_GPU || w->residency > BCAST_RES_HOST_PAGEABLE)
    return bad(err, errlen, "residency: unknown");
  if (w->trainer_ranks < 1 || w->trainer_ranks > SCHED_MAX_TRAINER_RANKS)
    return bad(err, errlen, "trainer_ranks: %u is not in 1..%u", w->trainer_ranks,
               SCHED_MAX_TRAINER_RANKS);
  if (w->inference_workers < 1) return bad(err, errlen, "inference_workers: must be >= 1");
  if (w->group_size < 1) return bad(err, errlen, "group_size: must be >= 1");
  if (w->rollouts_per_step % w->group_size)
    return bad(err, errlen, "rollouts_per_step: %u is not a multiple of group_size %u",
               w->rollouts_per_step, w->group_size);
  if (w->max_outstanding < 1) return bad(err, errlen, "max_outstanding: must be >= 1");
  if (w->steps < 1) return bad(err, errlen, "steps: must be >= 1");
  if (!(w->rollout_ms > 0) || !isfinite(w->rollout_ms))
    return bad(err, errlen, "rollout_ms: %g must be > 0", w->rollout_ms);
  if (!(w->train_ms > 0) || !isfinite(w->train_ms))
    return bad(err, errlen, "train_ms: %g must be > 0", w->train_ms);
  if (!(w->heartbeat_ms > 0) || !isfinite(w->heartbeat_ms))
    return bad(err, errlen, "heartbeat_ms: %g must be > 0", w->heartbeat_ms);
  uint32_t k = w->replica_gpus ? w->replica_gpus : 1;
  if (w->inference_workers % k)
    return bad(err, errlen, "replica_gpus: %u does not divide the %u inference workers", k,
               w->inference_workers);
  uint64_t gpus = (uint64_t)t->nodes * t->gpus_per_node;
  uint64_t need = (uint64_t)w->trainer_ranks + w->inference_workers;
  if (need > gpus)
    return bad(err, errlen,
               "nodes: %u nodes of %u GPUs hold %" PRIu64 " workers; %u trainer ranks and %u "
               "inference workers need %" PRIu64 " nodes",
               t->nodes, t->gpus_per_node, gpus, w->trainer_ranks, w->inference_workers,
               (need + t->gpus_per_node - 1) / t->gpus_per_node);
  return 0;
}

/* The synthetic model: `layers` x 4 tensors of equal size, each split in
 * contiguous ranges over the trainer ranks (FSDP's flat shards). */
static int build_map(sim *m) {
  const sim_workload *w = m->w;
  uint32_t S = w->trainer_ranks;
  size_t nt = (size_t)w->layers * 4;
  uint64_t elems = w->params / nt;
  static const char *kinds[4] = {"attn.qkv", "attn.out", "mlp.up", "mlp.down"};
  bcast_tensor *all = calloc(nt * S, sizeof *all);
  const bcast_tensor **ranks = calloc(S, sizeof *ranks);
  size_t *n = calloc(S, sizeof *n);
  if (!all || !ranks || !n) {
    free(all), free(ranks), free(n);
    return fail(m, "out of memory (model)");
  }
  for (uint32_t r = 0; r < S; r++) {
    uint64_t lo = elems * r / S, hi = elems * (r + 1) / S;
    ranks[r] = all + (size_t)r * nt;
    for (size_t i = 0; i < nt; i++) {
      bcast_tensor *t = &all[(size_t)r * nt + i];
      snprintf(t->name, sizeof t->name, "layers.%zu.%s", i / 4, kinds[i % 4]);
      t->layer = (uint32_t)(i / 4);
      t->storage_dtype = w->storage_dtype;
      t->wire_dtype = w->wire_dtype;
      t->ndim = 1;
      t->shape[0] = elems;
      t->residency = w->residency;
      t->shard_offset = S > 1 ? lo : 0;
      t->shard_elems = S > 1 ? hi - lo : 0;
    }
    /* A rank whose range is empty (more ranks than elements) lists nothing. */
    n[r] = hi > lo ? nt : 0;
  }
  bcast_err be = {0};
  double c0 = cpu_now();
  int rc = bcast_shards_check(ranks, n, S, NULL, &m->map, &be);
  m->res->shard_cpu_s = cpu_now() - c0;
  free(all), free(ranks), free(n);
  if (rc) return fail(m, "shard map: %s", be.msg);
  return 0;
}

static void drop_plan(sim *m) {
  bcast_plan_free(m->plan);
  m->plan = NULL;
}

/* BUILD_PLAN: the real planner over the shard map, then the cost model on
 * where the participants run; both timed as the orchestrator's work. */
static int build_plan(sim *m, const sched_action *a) {
  static const uint8_t secret[BCAST_SECRET_BYTES];
  drop_plan(m);
  uint32_t world = (uint32_t)a->nparticipants, S = a->trainer_ranks ? a->trainer_ranks : 1;
  bcast_topo_place *place = malloc(world * sizeof *place);
  if (!place) return fail(m, "out of memory (placement)");
  for (uint32_t r = 0; r < world; r++) place[r] = sim_place(m->t, a->participants[r]);
  bcast_plan_opts o = {.id = a->plan_id, .mode = (bcast_mode)a->mode, .staging_budget = m->w->bucket_bytes,
                       .world_size = world, .policy_version = a->policy_version,
                       .host_endpoint = "127.0.0.1:1", .secret = secret};
  bcast_err be = {0};
  double c0 = cpu_now();
  int rc = bcast_plan_build_sharded(m->map, &o, &m->plan, &be);
  bcast_topo_opts eng = {.layout = BCAST_LAYOUT_ENGINE};
  bcast_topo_opts mr = {.layout = BCAST_LAYOUT_MULTIROOT, .replica_gpus = m->w->replica_gpus};
  if (!rc) rc = bcast_topo_predict(m->plan, place, world, m->t, &eng, &m->res->engine, &be);
  if (!rc) rc = bcast_topo_predict(m->plan, place, world, m->t, &mr, &m->res->multiroot, &be);
  double spent = cpu_now() - c0;
  m->res->plan_cpu_s += spent;
  free(place);
  if (rc) return fail(m, "plan %s: %s", a->plan_id, be.msg);
  if ((uint32_t)bcast_plan_sources(m->plan) != S)
    return fail(m, "plan %s: %u sources, the scheduler asked for %u", a->plan_id, m->plan->nsources, S);
  m->res->plans++;
  m->res->mode = a->mode;
  m->res->plan_buckets = m->plan->nbuckets;
  m->res->wire_bytes = bcast_plan_wire_bytes(m->plan);
  memset(m->src_wire, 0, S * sizeof *m->src_wire);
  for (size_t b = 0; b < m->plan->nbuckets; b++) m->src_wire[m->plan->buckets[b].source_rank] += m->plan->buckets[b].bytes;
  /* The broadcast takes what the better layout predicts: the plan the model
   * chooses (the engine runs only its own layout today; see the docs). */
  m->predicted_s = fmin(m->res->engine.total_s, m->res->multiroot.total_s);
  m->res->predicted_s = m->predicted_s;
  m->plan_gen++;
  snprintf(m->plan_id, sizeof m->plan_id, "%s", a->plan_id);
  m->plan_step = a->step;
  /* Built a fixed 10 ms later, not after the CPU time just measured, so
   * that a seed replays the same run; each participant acks a few
   * milliseconds after it arrives. */
  int64_t built = m->now + 10;
  sim_ev e = {.type = EV_BUILT, .plan = m->plan_gen};
  if (push(m, built, e)) return -1;
  for (uint32_t r = 0; r < world; r++) {
    sim_ev ack = {.type = EV_ACK, .worker = a->participants[r], .plan = m->plan_gen};
    if (push(m, built + jitter_ms(m, 5, 0.5), ack)) return -1;
  }
  return 0;
}

static int mark_cancelled(sim *m, uint64_t id) {
  if (id >= m->ncancelled) {
    size_t n = m->ncancelled ? m->ncancelled : 4096;
    while (n <= id) n *= 2;
    uint8_t *c = realloc(m->cancelled, n);
    if (!c) return fail(m, "out of memory (cancels)");
    memset(c + m->ncancelled, 0, n - m->ncancelled);
    m->cancelled = c;
    m->ncancelled = n;
  }
  m->cancelled[id] = 1;
  return 0;
}

/* The simulated workers answer what the scheduler asked. */
static int react(sim *m) {
  sched_action_batch b;
  double c0 = cpu_now();
  size_t n = sched_take_actions(m->s, &b);
  charge(m, m->actions_kind, c0);
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    const sched_action *a = &b.actions[i];
    switch (a->kind) {
    case SCHED_ACT_DISPATCH:
      m->res->dispatched++;
      m->res->in_flight++;
      rc = push(m, m->now + jitter_ms(m, m->w->rollout_ms, 0.5),
                (sim_ev){.type = EV_ROLLOUT, .worker = a->worker, .a = a->request_id,
                         .group = a->group_id, .count = a->count, .version = m->held[a->worker]});
      break;
    case SCHED_ACT_CANCEL:
      m->res->in_flight--;
      rc = mark_cancelled(m, a->request_id);
      break;
    case SCHED_ACT_TRAIN:
      rc = push(m, m->now + jitter_ms(m, m->w->train_ms, 0.1),
                (sim_ev){.type = EV_STEP_DONE, .worker = a->worker, .a = a->step});
      break;
    case SCHED_ACT_BUILD_PLAN: rc = build_plan(m, a); break;
    case SCHED_ACT_TRIGGER: {
      if (strcmp(a->plan_id, m->plan_id)) {
        rc = fail(m, "trigger of %s, the plan built is %s", a->plan_id, m->plan_id);
        break;
      }
      int64_t d = m->now + (int64_t)ceil(m->predicted_s * 1000.0);
      for (size_t k = 0; k < a->nparticipants && !rc; k++)
        rc = push(m, d, (sim_ev){.type = EV_BDONE, .worker = a->participants[k], .a = a->step,
                                 .plan = m->plan_gen});
      break;
    }
    case SCHED_ACT_ABORT: rc = fail(m, "plan %s aborted: %s", a->plan_id, a->text); break;
    case SCHED_ACT_COMMIT:
      m->res->steps++;
      m->res->sim_seconds = (double)m->now / 1000.0;
      m->res->record_total_s = a->record->total_seconds;
      m->res->record_step_s = a->record->step_seconds;
      m->res->record_verified = a->record->weights_verified;
      break;
    case SCHED_ACT_RUN_STATE:
      if (a->run_state == SCHED_RUN_FAILED) rc = fail(m, "run failed: %s", a->text);
      if (a->run_state == SCHED_RUN_SUCCEEDED) m->succeeded = 1;
      break;
    case SCHED_ACT_WORKER_STATE:
      if (a->worker_state == SCHED_WORKER_LOST) rc = fail(m, "worker %u lost: %s", a->worker, a->text);
      break;
    default: break;
    }
  }
  c0 = cpu_now();
  sched_action_batch_free(&b);
  charge(m, m->actions_kind, c0);
  return rc;
}

static int check(sim *m, int rc, const char *what) {
  if (rc == SCHED_OK) return 0;
  return fail(m, "%s: %s: %s", what, sched_strerror(rc), sched_last_error(m->s));
}

static int deliver(sim *m, const sim_ev *e) {
  int rc;
  switch (e->type) {
  case EV_ROLLOUT: {
    sched_rollout stack[64], *r = e->count <= 64 ? stack : malloc(e->count * sizeof *r);
    if (!r) return fail(m, "out of memory (rollouts)");
    for (uint32_t k = 0; k < e->count; k++)
      r[k] = (sched_rollout){.id = ++m->next_rollout, .policy_version = e->version, .tokens = 256,
                             .group_id = e->group};
    rc = SCHED_CALL(m, SIM_CPU_ROLLOUTS, sched_rollouts_done(m->s, m->now, e->worker, e->a, r, e->count));
    if (r != stack) free(r);
    if (e->a < m->ncancelled && m->cancelled[e->a]) {
      if (rc != SCHED_ESTALE) return fail(m, "a cancelled request's result was taken (%d)", rc);
      m->res->stale++;
      return 0;
    }
    m->res->answered++;
    m->res->in_flight--;
    return check(m, rc, "rollouts");
  }
  case EV_STEP_DONE: {
    sched_offload off = {.gpu_tensors = m->w->layers * 4, .gpu_bytes = m->w->params * 4};
    if (m->w->residency != BCAST_RES_GPU)
      off = (sched_offload){.pinned_tensors = m->w->layers * 4, .pinned_bytes = m->w->params * 4};
    rc = SCHED_CALL(m, SIM_CPU_STEP, sched_shard_step_done(m->s, m->now, e->worker, e->a, m->w->train_ms / 1000.0,
                                             &off, m->src_sums[e->worker]));
    return check(m, rc, "step done");
  }
  case EV_BUILT:
    if (e->plan != m->plan_gen) return 0;
    rc = SCHED_CALL(m, SIM_CPU_PLAN, sched_plan_built(m->s, m->now, m->plan_id, m->plan->hash, NULL));
    return check(m, rc, "plan built");
  case EV_ACK:
    if (e->plan != m->plan_gen) return 0;
    rc = SCHED_CALL(m, SIM_CPU_PLAN, sched_plan_acked(m->s, m->now, e->worker, m->plan_id, m->plan->hash, NULL));
    return check(m, rc, "plan acked");
  case EV_BDONE: {
    if (e->plan != m->plan_gen) return 0;
    uint32_t S = m->w->trainer_ranks;
    sched_bcast_report rep = {.total_seconds = m->predicted_s};
    snprintf(rep.transport, sizeof rep.transport, "%s",
             m->plan->mode == BCAST_MODE_HOST ? "host-tcp"
             : m->plan->mode == BCAST_MODE_COLOCATED ? "cuda-ipc" : "nccl");
    if (e->worker < S) {
      rep.wire_bytes = m->src_wire[e->worker];
      rep.wire_seconds = m->predicted_s;
      rep.buckets = (uint32_t)m->plan->nbuckets;
      rep.weights_checksum = m->src_sums[e->worker];
    } else {
      if (S == 1) { /* one source: its checksum is the receiver's whole one */
        rep.weights_checksum = m->src_sums[0];
      } else {
        rep.source_checksums = m->src_sums;
        rep.nsource_checksums = S;
      }
      m->held[e->worker] = e->a + 1;
    }
    rc = SCHED_CALL(m, SIM_CPU_BROADCAST, sched_broadcast_done(m->s, m->now, e->worker, m->plan_id, NULL, &rep));
    return check(m, rc, "broadcast done");
  }
  case EV_HEARTBEAT:
    rc = SCHED_CALL(m, SIM_CPU_HEARTBEAT, sched_worker_heartbeat(m->s, m->now, e->worker, m->held[e->worker]));
    if (check(m, rc, "heartbeat")) return -1;
    return push(m, m->now + (int64_t)m->w->heartbeat_ms, *e);
  }
  return fail(m, "unknown event %d", e->type);
}

static int setup(sim *m) {
  const sim_workload *w = m->w;
  uint32_t S = w->trainer_ranks;
  m->nworkers = S + w->inference_workers;
  m->held = calloc(m->nworkers, sizeof *m->held);
  m->src_sums = calloc(S, sizeof *m->src_sums);
  m->src_wire = calloc(S, sizeof *m->src_wire);
  if (!m->held || !m->src_sums || !m->src_wire) return fail(m, "out of memory (workers)");
  for (uint32_t r = 0; r < S; r++) m->src_sums[r] = 0x51u + r;
  if (build_map(m)) return -1;
  sched_settings c;
  sched_settings_default(&c);
  snprintf(c.run_id, sizeof c.run_id, "sim");
  c.steps = w->steps;
  c.group_size = w->group_size;
  c.rollouts_per_step = w->rollouts_per_step ? w->rollouts_per_step : w->group_size * w->inference_workers;
  c.max_async_level = w->max_async_level;
  c.max_outstanding = w->max_outstanding;
  /* Nothing is lost here: the bounds only need to exceed what the model
   * predicts; heartbeats keep every worker alive. */
  c.heartbeat_timeout_ms = (int64_t)(w->heartbeat_ms * 4 + 1000);
  c.plan_ack_timeout_ms = 600000;
  c.broadcast_timeout_ms = 3600000;
  char err[256];
  int rc = sched_new(&c, &m->s, err, sizeof err);
  if (rc) return fail(m, "scheduler: %s", err);
  for (uint32_t id = 0; id < m->nworkers; id++) {
    int trainer = id < S;
    char name[32];
    snprintf(name, sizeof name, trainer ? "trainer-%u" : "inference-%u", trainer ? id : id - S);
    bcast_topo_place pl = sim_place(m->t, id);
    sched_caps caps = {.cuda_devices = 1, .nccl = 1, .trainer_rank = trainer ? id : 0,
                       .trainer_ranks = trainer ? S : 0};
    snprintf(caps.host_id, sizeof caps.host_id, "node-%u", pl.node);
    snprintf(caps.gpu_uuid, sizeof caps.gpu_uuid, "GPU-%08u-%04u", pl.node, pl.gpu);
    sched_offload off = {.gpu_tensors = w->layers * 4, .gpu_bytes = w->params * 4};
    rc = SCHED_CALL(m, SIM_CPU_REGISTER, sched_worker_registered(m->s, m->now, id,
                                               trainer ? SCHED_ROLE_TRAINER : SCHED_ROLE_INFERENCE,
                                               name, &caps, trainer ? &off : NULL, 0));
    if (check(m, rc, "register")) return -1;
    rc = SCHED_CALL(m, SIM_CPU_REGISTER, sched_worker_attached(m->s, m->now, id));
    if (check(m, rc, "attach")) return -1;
    if (react(m)) return -1;
    if (push(m, m->now + 1 + (int64_t)(rnd(m) % (uint64_t)w->heartbeat_ms),
             (sim_ev){.type = EV_HEARTBEAT, .worker = id}))
      return -1;
  }
  uint32_t top = m->nworkers - 1;
  m->res->nodes_used = sim_place(m->t, top).node + 1;
  return 0;
}

int sim_run(const sim_workload *w, const bcast_topo *t, sim_result *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (sim_workload_check(w, t, err, errlen)) return -1;
  sim *m = calloc(1, sizeof *m);
  if (!m) return bad(err, errlen, "out of memory");
  m->w = w;
  m->t = t;
  m->res = out;
  m->err = err;
  m->errlen = errlen;
  m->rng = w->seed * 0x9e3779b97f4a7c15ull + 1;
  m->actions_kind = SIM_CPU_REGISTER;
  evq_init(&m->q, sizeof(sim_ev));
  int rc = setup(m);
  m->actions_kind = SIM_CPU_ACTIONS;
  while (!rc && !m->succeeded) {
    /* The daemon's runner re-arms its timer after every event. */
    double c0 = cpu_now();
    int64_t due = sched_next_deadline(m->s);
    charge(m, SIM_CPU_DEADLINE, c0);
    int64_t next = evq_next(&m->q);
    if (next == INT64_MAX && due == SCHED_NEVER) {
      sched_run_info ri;
      sched_get_run(m->s, &ri);
      rc = fail(m, "the simulation ran dry in state %s: %s", sched_run_state_name(ri.state), ri.message);
      break;
    }
    if (due <= next) {
      m->now = due > m->now ? due : m->now;
      rc = check(m, SCHED_CALL(m, SIM_CPU_TICK, sched_tick(m->s, m->now)), "tick");
    } else {
      sim_ev e;
      m->now = evq_pop(&m->q, &e);
      m->res->events++;
      rc = deliver(m, &e);
    }
    if (!rc) rc = react(m);
  }
  if (m->s) sched_get_counters(m->s, &out->counters);
  if (out->timed_calls) out->timer_s /= (double)out->timed_calls;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  out->peak_rss_kib = ru.ru_maxrss;
  drop_plan(m);
  sched_free(m->s);
  bcast_shard_map_free(m->map);
  evq_free(&m->q);
  free(m->held);
  free(m->src_sums);
  free(m->src_wire);
  free(m->cancelled);
  free(m);
  return rc ? -1 : 0;
}
