/* The runner: the thin shell around the scheduler core.
 *
 * Every entry point feeds the active run's scheduler one event and, except
 * for the reports (see runner.h), runs drain(): it takes the actions the
 * scheduler produced and executes them. Executing an action may feed the
 * scheduler again (a send fails -> worker lost), which queues more actions;
 * drain loops until quiet and is not re-entered. The scheduler runs on the
 * monotonic clock; wall-clock time only stamps records and plan deadlines. */
#include "orchestrator/daemon/runner.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/common/log.h"
#include "orchestrator/common/pbjson.h"
#include "orchestrator/daemon/group_table.h"
#include "orchestrator/daemon/now.h"
#include "orchestrator/daemon/parts.h"
#include "orchestrator/daemon/prompt_source.h"
#include "orchestrator/daemon/rollout_store.h"
#include "orchestrator/daemon/sched_pb.h"
#include "orchestrator/daemon/topology.h"
#include "orchestrator/daemon/watch.h"
#include "rlorch/v1/broadcast.pb-c.h"
#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_pb.h"
#include "workers/bcast/bcast_topo.h"

#define TICK_MIN_MS 50
#define SWEEP_MS 1000 /* the worker table's heartbeat sweep */

_Static_assert(WORKERS_NAME_MAX == SCHED_NAME_MAX, "worker names must fit the scheduler's");
_Static_assert(WORKERS_RUN_ID_MAX == SCHED_RUN_ID_MAX, "run ids must fit the scheduler's");

/* The batch of the step being trained, held for FetchBatch from its TRAIN
 * command until the trainer reports the step done, the step is trained again,
 * the trainer is lost or the run ends: the store keeps its rollouts (and
 * counts them against rollout_buffer_bytes) while it is held. */
typedef struct held_batch {
  int held;
  uint64_t gen;      /* bumped at every hold and release, across runs: a share
                        cut from another batch is stale */
  uint64_t step;
  uint32_t trainer;  /* scheduler id of the trainer the TRAIN command went to (rank 0's) */
  /* A trainer group: every rank fetches its share of the one batch, which is
   * held until every rank reported the step done. A lone trainer is rank 0
   * of 1. */
  uint32_t ranks;
  uint32_t members[SCHED_MAX_TRAINER_RANKS]; /* scheduler id of each rank's trainer */
  uint8_t reported[SCHED_MAX_TRAINER_RANKS]; /* the rank reported the step done */
  uint32_t nreported;
  uint64_t *ids;     /* batch order: whole groups one after the other */
  uint64_t *sorted;  /* the same ids ascending, for the sweep */
  size_t *sizes;     /* packed size of the rollout ids[i] */
  size_t n;
  uint32_t group_size, groups; /* the last group may be short (see hold_batch) */
  uint64_t bytes;    /* sizes summed: TrainStep.batch_bytes */
  uint64_t released_gen; /* gen right after the last release, and why it happened */
  char released_why[96];
} held_batch;

/* The cost model's prediction of the plan in flight (one at a time: the
 * scheduler plans one broadcast after the other), from its build to its
 * commit, where it goes into the step record beside what was measured. */
typedef struct plan_prediction {
  char plan_id[SCHED_PLAN_ID_MAX];
  int ok;                     /* pred is valid; else note says why there is none */
  bcast_topo_pred pred;
  uint32_t nodes;
  char layout[32];
  char bottleneck[BCAST_TOPO_WHERE_MAX + 32];
  char choice[256];
  char note[TOPOLOGY_NOTE_MAX + 256]; /* why none, or what was assumed */
} plan_prediction;

struct runner {
  orch *o;
  workers_table *workers;
  Rlorch__V1__Run *run; /* the active run, or NULL */
  sched *sched;
  rollout_store *rollouts; /* the active run's buffered rollouts, whole */
  int dispatch_held;       /* the store is over rollout_buffer_bytes */
  uv_timer_t timer;
  int timer_open;
  /* NCCL communicator hand-off: the id the trainer made and for whom. */
  uint8_t nccl_id[128];
  int has_nccl_id;
  /* The ranks it was made for: owned, sized by the step's workers (not by
   * WORKERS_MAX, which would be 64 KiB whatever registered). */
  uint32_t *nccl_members;
  size_t n_nccl_members;
  int draining; /* inside drain(): re-entrant calls only queue */
  double measured_gbps[SCHED_MODE_COUNT]; /* the active run's last committed broadcast per
                                             mode, in the cost model's sense (summed over
                                             receivers in host mode); 0: none yet */
  held_batch batch; /* the batch of the step the trainer executes */
  prompt_source *prompts; /* the active run's */
  group_table *groups;    /* its open groups: prompt and first dispatch */
  sched_counters seen;    /* the counters already added to the metrics */
  plan_prediction pred;   /* of the last plan built */
  char err[512];          /* the last report refused by the runner itself */
  int err_set;            /* err, not the scheduler's, explains the last refusal */
};

static void drain(runner *r);
static void arm_timer(runner *r);
static void release_run(runner *r);

static int64_t mono(void) { return now_mono_ms(); }

/* ---- the run's record ------------------------------------------------------------- */

static void save_run(runner *r) {
  r->run->updated_unix_ms = now_unix_ms();
  if (store_run_update(r->o->db, r->run) != 0)
    log_error("store_failed", "run=%s error=\"%s\"", r->run->id, store_errmsg(r->o->db));
}

static void publish_run(runner *r) {
  Rlorch__V1__RunEvent ev = RLORCH__V1__RUN_EVENT__INIT;
  ev.event_case = RLORCH__V1__RUN_EVENT__EVENT_RUN;
  ev.run = r->run;
  watch_publish(r->o->watch, r->run->id, &ev);
}

static void set_run_message(Rlorch__V1__Run *run, const char *msg) {
  if (run->message && run->message != protobuf_c_empty_string) free(run->message);
  run->message = strdup(msg ? msg : "");
  if (!run->message) run->message = (char *)protobuf_c_empty_string;
}

static void publish_broadcast(runner *r, const sched_action *a,
                              Rlorch__V1__BroadcastEvent__Phase phase, const char *reason) {
  Rlorch__V1__BroadcastEvent be = RLORCH__V1__BROADCAST_EVENT__INIT;
  be.plan_id = (char *)a->plan_id;
  be.step = a->step;
  be.phase = phase;
  be.mode = sched_pb_mode_to_pb(a->mode);
  be.reason = (char *)(reason ? reason : "");
  Rlorch__V1__RunEvent ev = RLORCH__V1__RUN_EVENT__INIT;
  ev.event_case = RLORCH__V1__RUN_EVENT__EVENT_BROADCAST;
  ev.broadcast = &be;
  watch_publish(r->o->watch, r->run->id, &ev);
}

/* ---- participants -------------------------------------------------------------------- */

static uint64_t step_seed(const char *run_id, uint64_t step) {
  uint64_t h = 1469598103934665603ull;
  for (const char *p = run_id; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
  return h ^ (step * 0x9E3779B97F4A7C15ull);
}

static workers_entry *trainer(runner *r) {
  for (size_t i = 0; i < workers_count(r->workers); i++) {
    workers_entry *w = workers_at(r->workers, i);
    if (w->role == RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER && w->in_run &&
        w->state != RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST)
      return w;
  }
  return NULL;
}

/* The NCCL id is tied to the set of ranks it was made for. */
static int nccl_members_match(runner *r, const uint32_t *ids, size_t n) {
  if (!r->has_nccl_id || n != r->n_nccl_members) return 0;
  for (size_t i = 0; i < n; i++)
    if (r->nccl_members[i] != ids[i]) return 0;
  return 1;
}

/* Forgets the communicator: a new one is needed before an NCCL broadcast. */
static void nccl_forget(runner *r) {
  r->has_nccl_id = 0;
  free(r->nccl_members);
  r->nccl_members = NULL;
  r->n_nccl_members = 0;
}

/* The ranks a communicator made now would hold: the trainer, then the run's
 * attached inference workers. An array of *n ids for the caller to free
 * (heap: at the cap it would be 64 KiB, too much for the loop's stack), or
 * NULL out of memory. */
static uint32_t *live_members(runner *r, size_t *n) {
  *n = 0;
  /* Every member is an entry of the table, the trainer included. */
  uint32_t *ids = malloc((workers_count(r->workers) + 1) * sizeof *ids);
  if (!ids) return NULL;
  workers_entry *t = trainer(r);
  if (t) ids[(*n)++] = t->id;
  for (size_t i = 0; i < workers_count(r->workers); i++) {
    workers_entry *w = workers_at(r->workers, i);
    if (w->role == RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE && w->in_run && w->attach &&
        w->state != RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST)
      ids[(*n)++] = w->id;
  }
  return ids;
}

/* Sends `cmd` to scheduler worker `id`; a worker that cannot be reached is lost. */
static void send_or_lose(runner *r, uint32_t id, Rlorch__V1__Command *cmd) {
  workers_entry *w = workers_by_id(r->workers, id);
  if (!w || workers_send(r->workers, w, cmd) != 0)
    sched_worker_lost(r->sched, mono(), id, "command stream closed");
}

/* ---- actions ------------------------------------------------------------------------------ */

/* The group's entry; a group dispatched for the first time draws the next
 * prompt. NULL when the run cannot go on (then it is failed, by name). */
static group_entry *dispatch_group(runner *r, uint64_t group_id) {
  group_entry *g = group_table_get(r->groups, group_id);
  if (g) return g; /* re-sent: the same prompt */
  char err[600], msg[700];
  prompt p = {0};
  if (prompt_source_next(r->prompts, &p, err, sizeof err) != 0) {
    snprintf(msg, sizeof msg, "prompts: %s", err);
  } else if (group_table_add(r->groups, group_id, &p, mono()) != 0) {
    prompt_free(&p);
    snprintf(msg, sizeof msg, "out of memory keeping the prompt of group %" PRIu64, group_id);
  } else {
    return group_table_get(r->groups, group_id);
  }
  log_error("run_failed", "run=%s error=\"%s\"", r->run->id, msg);
  sched_fail(r->sched, mono(), msg);
  return NULL;
}

/* A re-sent request must sample as the first did, so a seed given to the run
 * becomes one per group (splitmix64 of both); 0 leaves it to the engine. */
static uint64_t group_seed(uint64_t seed, uint64_t group_id) {
  if (!seed) return 0;
  uint64_t z = seed + group_id * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z ? z : 1;
}

static void act_dispatch(runner *r, const sched_action *a) {
  group_entry *g = dispatch_group(r, a->group_id);
  if (!g) return;
  Rlorch__V1__RolloutRequest rq = RLORCH__V1__ROLLOUT_REQUEST__INIT;
  rq.request_id = a->request_id;
  rq.count = a->count;
  rq.group_id = a->group_id;
  rq.prompt_token_ids = g->prompt.token_ids;
  rq.n_prompt_token_ids = g->prompt.ntokens;
  rq.prompt_metadata.data = g->prompt.metadata;
  rq.prompt_metadata.len = g->prompt.nmetadata;
  Rlorch__V1__SamplingParams sp;
  if (r->run->spec->sampling) {
    sp = *r->run->spec->sampling;
    sp.seed = group_seed(sp.seed, a->group_id);
    rq.sampling = &sp;
  }
  Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
  cmd.kind_case = RLORCH__V1__COMMAND__KIND_ROLLOUT;
  cmd.rollout = &rq;
  send_or_lose(r, a->worker, &cmd);
}

/* The request's group was answered by another worker. Not send_or_lose: a
 * worker that cannot be reached has nothing left to cancel. */
static void act_cancel(runner *r, const sched_action *a) {
  Rlorch__V1__AbortCommand ab = RLORCH__V1__ABORT_COMMAND__INIT;
  ab.request_id = a->request_id;
  ab.reason = (char *)a->text;
  Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
  cmd.kind_case = RLORCH__V1__COMMAND__KIND_ABORT;
  cmd.abort = &ab;
  workers_entry *w = workers_by_id(r->workers, a->worker);
  if (w) workers_send(r->workers, w, &cmd);
}

typedef struct {
  const uint64_t *ids; /* ascending */
  size_t n;
} id_set;

static int id_set_has(const id_set *b, uint64_t id) {
  size_t lo = 0, hi = b->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (b->ids[mid] < id) lo = mid + 1;
    else hi = mid;
  }
  return lo < b->n && b->ids[lo] == id;
}

typedef struct {
  id_set buffered, held;
} keep_sets;

static int keep_wanted(uint64_t id, void *ud) {
  const keep_sets *k = ud;
  return id_set_has(&k->buffered, id) || id_set_has(&k->held, id);
}

static void rollouts_budget(runner *r);
/* Frees what neither the scheduler buffers (batched, dropped or refused) nor
 * the held batch uses: sorted lists of both, so a sweep costs n log n, not
 * store x pool. */
static void rollouts_sweep(runner *r) {
  size_t n = sched_buffered_ids(r->sched, NULL, 0);
  uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
  if (ids) { /* out of memory: keep everything until the next sweep */
    keep_sets k = {{ids, sched_buffered_ids(r->sched, ids, n)},
                   {r->batch.sorted, r->batch.held ? r->batch.n : 0}};
    rollout_store_retain(r->rollouts, keep_wanted, &k);
    free(ids);
  }
  rollouts_budget(r);
}

/* Holds dispatch back while the store is over its byte budget, and lets it go
 * again below. Called after every change of the store. */
static void rollouts_budget(runner *r) {
  uint64_t bytes = rollout_store_bytes(r->rollouts);
  metrics_gauge_set(r->o->m.rollout_buffer_bytes, NULL, (double)bytes);
  int hold = bytes >= r->o->cfg->rollout_buffer_bytes;
  if (hold != r->dispatch_held) {
    r->dispatch_held = hold;
    log_info(hold ? "dispatch_held" : "dispatch_resumed", "run=%s buffer_bytes=%" PRIu64
             " budget=%" PRIu64, r->run->id, bytes, r->o->cfg->rollout_buffer_bytes);
    sched_hold_dispatch(r->sched, mono(), hold);
  }
}

/* DATA_DIR/rollouts/RUN/step-N.jsonl: one JSON object per rollout of the
 * batch, for inspection and replay. A failure is logged and costs the run
 * nothing. Written on the loop thread: a batch is small beside a step. */
static void log_batch(runner *r, uint64_t step, Rlorch__V1__Rollout *const *batch, size_t n) {
  const config *cfg = r->o->cfg;
  if (!cfg->rollout_log) return;
  /* Private like the database (0700 directories, 0600 files): prompts and
   * completions are the run's data. */
  char dir[1024], path[1100];
  snprintf(dir, sizeof dir, "%s/rollouts", cfg->data_dir);
  mkdir(dir, 0700);
  snprintf(dir, sizeof dir, "%s/rollouts/%s", cfg->data_dir, r->run->id);
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
    log_warn("rollout_log_failed", "dir=\"%s\" error=\"%s\"", dir, strerror(errno));
    return;
  }
  snprintf(path, sizeof path, "%s/step-%" PRIu64 ".jsonl", dir, step);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f) {
    log_warn("rollout_log_failed", "path=\"%s\" error=\"%s\"", path, strerror(errno));
    if (fd >= 0) close(fd);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    pbjson_write(f, &batch[i]->base);
    fputc('\n', f);
  }
  if (fclose(f) != 0) log_warn("rollout_log_failed", "path=\"%s\" error=\"%s\"", path, strerror(errno));
}

/* ---- the held batch ------------------------------------------------------------------------- */

static void release_batch(runner *r, const char *why) {
  held_batch *b = &r->batch;
  if (!b->held) return;
  log_debug("batch_released", "run=%s step=%" PRIu64 " reason=\"%s\"", r->run ? r->run->id : "",
            b->step, why);
  free(b->ids);
  free(b->sorted);
  free(b->sizes);
  b->ids = b->sorted = NULL;
  b->sizes = NULL;
  b->n = 0;
  b->held = 0;
  b->released_gen = ++b->gen;
  snprintf(b->released_why, sizeof b->released_why, "%s", why);
}

static int cmp_u64(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

/* Holds the batch of a TRAIN action (rollouts[i] is the stored rollout of
 * a->rollout_ids[i], NULL when missing: it then has size 0 and FetchBatch
 * fails when it reaches it). Groups are consecutive runs of the run's
 * group_size; should the batch not divide into them, the last group is
 * short and a warning says so. 0, or -1 out of memory (nothing held). */
static int hold_batch(runner *r, const sched_action *a, Rlorch__V1__Rollout *const *rollouts) {
  held_batch *b = &r->batch;
  char why[96];
  if (b->held && b->step == a->step) snprintf(why, sizeof why, "the step is trained again");
  else snprintf(why, sizeof why, "step %" PRIu64 " was sent for training", a->step);
  release_batch(r, why);
  size_t n = a->nrollouts;
  uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
  uint64_t *sorted = malloc((n ? n : 1) * sizeof *sorted);
  size_t *sizes = malloc((n ? n : 1) * sizeof *sizes);
  if (!ids || !sorted || !sizes) {
    free(ids);
    free(sorted);
    free(sizes);
    return -1;
  }
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; i++) {
    ids[i] = sorted[i] = a->rollout_ids[i];
    sizes[i] = rollouts[i] ? protobuf_c_message_get_packed_size(&rollouts[i]->base) : 0;
    bytes += sizes[i];
  }
  if (n > 1) qsort(sorted, n, sizeof *sorted, cmp_u64);
  uint32_t gs = r->run->spec->group_size ? r->run->spec->group_size : 1;
  b->held = 1;
  b->gen++;
  b->step = a->step;
  b->trainer = a->worker;
  b->ranks = a->trainer_ranks > 1 ? a->trainer_ranks : 1;
  memset(b->members, 0, sizeof b->members);
  memset(b->reported, 0, sizeof b->reported);
  b->nreported = 0;
  b->members[0] = a->worker;
  b->ids = ids;
  b->sorted = sorted;
  b->sizes = sizes;
  b->n = n;
  b->group_size = gs;
  b->groups = (uint32_t)((n + gs - 1) / gs);
  b->bytes = bytes;
  if (n % gs)
    log_warn("batch_groups_partial", "run=%s step=%" PRIu64 " rollouts=%zu group_size=%u "
             "msg=\"the batch is not whole groups: its last group is short\"", r->run->id,
             a->step, n, gs);
  return 0;
}

/* The rank of held-batch member `id`, or -1 when it is none of them.
 * Scheduler ids start at 1: a member 0 is a rank whose TRAIN did not come. */
static int batch_rank(const held_batch *b, uint32_t id) {
  for (uint32_t i = 0; id != 0 && b->held && i < b->ranks; i++)
    if (b->members[i] == id) return (int)i;
  return -1;
}

/* A trainer group's rank r > 0: the batch rank 0's TRAIN (the same step,
 * just before, in rank order) holds is its batch too. */
static void act_train_rank(runner *r, const sched_action *a, Rlorch__V1__TrainStep *ts) {
  held_batch *b = &r->batch;
  if (b->held && b->step == a->step && a->trainer_rank < b->ranks) b->members[a->trainer_rank] = a->worker;
  else
    log_error("batch_not_held", "run=%s step=%" PRIu64 " rank=%u error=\"rank 0's batch is not "
              "held\"", r->run->id, a->step, a->trainer_rank);
  ts->groups = b->held ? b->groups : 0;
  ts->group_size = b->held ? b->group_size : 0;
  ts->batch_bytes = b->held ? b->bytes : 0;
  Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
  cmd.kind_case = RLORCH__V1__COMMAND__KIND_TRAIN;
  cmd.train = ts;
  send_or_lose(r, a->worker, &cmd);
}

static void act_train(runner *r, const sched_action *a) {
  Rlorch__V1__TrainStep ts = RLORCH__V1__TRAIN_STEP__INIT;
  ts.step = a->step;
  ts.rollout_ids = (uint64_t *)a->rollout_ids;
  ts.n_rollout_ids = a->nrollouts;
  ts.batch_tokens = a->batch_tokens;
  ts.seed = step_seed(r->run->id, a->step);
  ts.trainer_rank = a->trainer_rank;
  ts.trainer_ranks = a->trainer_ranks > 1 ? a->trainer_ranks : 0;
  if (a->trainer_rank > 0) {
    act_train_rank(r, a, &ts);
    return;
  }
  size_t n;
  uint32_t *ids = live_members(r, &n);
  if (!ids) {
    /* No member list to tie a communicator to: the trainer makes a new id
     * anyway, which no NCCL plan matches (it is refused by name) until a
     * later step records its members. */
    log_error("nccl_members_failed", "run=%s step=%" PRIu64 " error=\"out of memory\"",
              r->run->id, a->step);
    nccl_forget(r);
    ts.want_nccl_id = 1;
  } else if (nccl_members_match(r, ids, n)) {
    free(ids);
  } else {
    nccl_forget(r);
    r->nccl_members = ids; /* taken */
    r->n_nccl_members = n;
    ts.want_nccl_id = 1;
  }
  /* The trainer fetches the batch with FetchBatch: it is held, and the sweep
   * below keeps its rollouts, until the step is done. */
  Rlorch__V1__Rollout **batch = calloc(a->nrollouts ? a->nrollouts : 1, sizeof *batch);
  size_t missing = 0;
  for (size_t i = 0; batch && i < a->nrollouts; i++) {
    batch[i] = (Rlorch__V1__Rollout *)rollout_store_get(r->rollouts, a->rollout_ids[i]);
    if (!batch[i]) missing++;
  }
  if (batch && !missing) {
    log_batch(r, a->step, batch, a->nrollouts);
  } else {
    log_error("batch_incomplete", "run=%s step=%" PRIu64 " missing=%zu of %zu", r->run->id,
              a->step, batch ? missing : a->nrollouts, a->nrollouts);
  }
  if (!batch || hold_batch(r, a, batch) != 0)
    log_error("batch_not_held", "run=%s step=%" PRIu64 " error=\"out of memory\"", r->run->id,
              a->step);
  ts.groups = r->batch.held ? r->batch.groups : 0;
  ts.group_size = r->batch.held ? r->batch.group_size : 0;
  ts.batch_bytes = r->batch.held ? r->batch.bytes : 0;
  Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
  cmd.kind_case = RLORCH__V1__COMMAND__KIND_TRAIN;
  cmd.train = &ts;
  send_or_lose(r, a->worker, &cmd);
  free(batch);
  rollouts_sweep(r);
}

/* A plan's bounds, from the cost model (bcast_cost_estimate). */
typedef struct plan_bounds {
  int64_t ack_ms, broadcast_ms;
  double min_gbps;
  char expected[SCHED_TEXT_MAX / 2]; /* what they were made of, for a timeout's message */
} plan_bounds;

/* Relays where they may pay, on the host transport with one source and
 * whole receivers: the engine's one-relay-per-node layout
 * (bcast_relay_layout) over the topology's nodes, a relay being a receiver
 * that listens for data (its data address). from[] and eps[] get
 * world_size entries; 1 when some node got a relay. */
static int relay_layout(runner *r, const sched_action *a, const bcast_plan *plan,
                        const topology *t, uint32_t *from, const char **eps) {
  uint32_t n = plan->world_size;
  if (plan->mode != BCAST_MODE_HOST || plan->nsources > 1 || plan->nviews || n != t->nplace)
    return 0;
  const char **node = calloc(n, sizeof *node);
  int *can = calloc(n, sizeof *can);
  uint32_t relays = 0;
  if (node && can) {
    for (uint32_t i = 0; i < n; i++) {
      workers_entry *w = workers_by_id(r->workers, a->participants[i]);
      node[i] = topology_node_name(t, t->place[i].node);
      can[i] = w && w->data_address[0];
      eps[i] = "";
    }
    relays = bcast_relay_layout(n, plan->root_rank, node, can, from);
    /* A relay listens where it registered (can[] holds only those that did). */
    for (uint32_t i = 0; relays && i < n; i++)
      if (i != plan->root_rank && from[i] != plan->root_rank)
        eps[from[i]] = workers_by_id(r->workers, a->participants[from[i]])->data_address;
  }
  free(node);
  free(can);
  return relays > 0;
}

/* The cost model's prediction of `plan` on its participants' topology
 * (topology.h, bcast_topo.h), into r->pred; and the layout it chooses: a
 * host plan gets relays (relay_layout) when the model predicts them at
 * least 10% faster than the direct fan-out (a relay forwards over loopback
 * and costs a node's host some CPU, so a tie keeps the simpler plan). A plan
 * the model cannot predict goes on as built, without a prediction, and its
 * record says why. */
static void predict_plan(runner *r, const sched_action *a, bcast_plan *plan) {
  plan_prediction *p = &r->pred;
  memset(p, 0, sizeof *p);
  snprintf(p->plan_id, sizeof p->plan_id, "%s", a->plan_id);
  size_t n = a->nparticipants;
  const Rlorch__V1__Capabilities **caps = calloc(n ? n : 1, sizeof *caps);
  uint32_t *from = calloc(n ? n : 1, sizeof *from);
  const char **eps = calloc(n ? n : 1, sizeof *eps);
  topology t = {0};
  if (!caps || !from || !eps) {
    snprintf(p->note, sizeof p->note, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    workers_entry *w = workers_by_id(r->workers, a->participants[i]);
    caps[i] = w ? w->caps : NULL;
  }
  char err[TOPOLOGY_NOTE_MAX];
  bcast_err be = {0};
  bcast_topo_opts o = {.layout = BCAST_LAYOUT_ENGINE};
  if (topology_build(caps, n, &r->o->cfg->topology, &t, err, sizeof err) != 0) {
    snprintf(p->note, sizeof p->note, "topology: %s", err);
    goto out;
  }
  if (bcast_topo_predict(plan, t.place, t.nplace, &t.topo, &o, &p->pred, &be) != 0) {
    snprintf(p->note, sizeof p->note, "cost model: %s", be.msg);
    goto out;
  }
  p->ok = 1;
  p->nodes = t.topo.nodes;
  snprintf(p->layout, sizeof p->layout, "%s", bcast_mode_name(plan->mode));
  snprintf(p->choice, sizeof p->choice, "%s: %.4g s", p->layout, p->pred.total_s);
  snprintf(p->note, sizeof p->note, "%s", t.note);
  bcast_topo_pred rp;
  o.relay_from = from;
  if (relay_layout(r, a, plan, &t, from, eps)) {
    if (bcast_topo_predict(plan, t.place, t.nplace, &t.topo, &o, &rp, &be) != 0) {
      snprintf(p->choice, sizeof p->choice, "%s: %.4g s; relays not predicted: %.160s",
               p->layout, p->pred.total_s, be.msg);
    } else if (rp.total_s < 0.9 * p->pred.total_s) {
      if (bcast_plan_set_relays(plan, from, eps, &be) != 0) {
        snprintf(p->choice, sizeof p->choice, "%s: %.4g s; relays refused: %.160s", p->layout,
                 p->pred.total_s, be.msg);
      } else {
        snprintf(p->choice, sizeof p->choice, "%s+relays: %.4g s; direct fan-out: %.4g s",
                 p->layout, rp.total_s, p->pred.total_s);
        snprintf(p->layout, sizeof p->layout, "%s+relays", bcast_mode_name(plan->mode));
        p->pred = rp;
      }
    } else {
      snprintf(p->choice, sizeof p->choice, "%s: %.4g s; with relays: %.4g s", p->layout,
               p->pred.total_s, rp.total_s);
    }
  }
  const bcast_topo_stage *slow = bcast_topo_pred_bottleneck(&p->pred);
  if (slow) snprintf(p->bottleneck, sizeof p->bottleneck, "%s at %s", slow->name, slow->where);
out:
  topology_free(&t);
  free(caps);
  free(from);
  free(eps);
}

static int plan_bounds_of(runner *r, bcast_mode mode, uint64_t wire_bytes, uint32_t receivers,
                          plan_bounds *out, char *err, size_t errlen) {
  const config *cfg = r->o->cfg;
  bcast_cost_model m;
  bcast_cost_model_default(&m);
  m.gbps[BCAST_MODE_HOST] = cfg->broadcast_gbps_host;
  m.gbps[BCAST_MODE_STAGED] = cfg->broadcast_gbps_staged;
  m.gbps[BCAST_MODE_DIRECT] = cfg->broadcast_gbps_direct;
  m.gbps[BCAST_MODE_COLOCATED] = cfg->broadcast_gbps_staged; /* the same host-to-device bound */
  m.safety = cfg->broadcast_safety;
  m.slack_s = cfg->broadcast_slack_ms / 1000.0;
  m.detect_s = cfg->worker_timeout_ms / 1000.0; /* a hung participant is lost before any bound */
  bcast_cost c;
  bcast_err be = {0};
  double measured = (int)mode < SCHED_MODE_COUNT ? r->measured_gbps[mode] : 0;
  if (bcast_cost_estimate(&m, mode, wire_bytes, receivers, measured, &c, &be) != 0)
    return snprintf(err, errlen, "cost model: %s", be.msg), -1;
  out->ack_ms = (int64_t)ceil(c.ack_s * 1000.0);
  out->broadcast_ms = (int64_t)ceil(c.broadcast_s * 1000.0);
  out->min_gbps = c.min_gbps;
  snprintf(out->expected, sizeof out->expected,
           "%.1f MB to %u receiver%s at %.3g GB/s for %s mode (%s), x%g + %.1f s",
           (double)wire_bytes / 1e6, receivers, receivers == 1 ? "" : "s", c.rate_gbps,
           bcast_mode_name(mode), c.measured ? "measured" : "configured", m.safety,
           m.slack_s + m.detect_s);
  /* Where the topology says the plan takes longer than the configured rate
   * allows (a slow link, many receivers behind one NIC), the prediction
   * bounds it, with the same safety factor: a healthy transfer on a slow
   * network is never cut off as hung. The model never shortens a bound. */
  const plan_prediction *p = &r->pred;
  double model_s = p->ok ? m.safety * p->pred.total_s + m.slack_s + m.detect_s : 0;
  if (p->ok && p->pred.total_s > 0 && model_s > c.broadcast_s) {
    out->broadcast_ms = (int64_t)ceil(model_s * 1000.0);
    double fanout = mode == BCAST_MODE_HOST && receivers > 1 ? (double)receivers : 1.0;
    double floor_gbps = (double)wire_bytes * fanout / p->pred.total_s / 1e9 / m.safety;
    if (floor_gbps < out->min_gbps) out->min_gbps = floor_gbps;
    snprintf(out->expected, sizeof out->expected,
             "%.1f MB to %u receiver%s in %.3g s on the topology (%.24s), x%g + %.1f s",
             (double)wire_bytes / 1e6, receivers, receivers == 1 ? "" : "s", p->pred.total_s,
             p->bottleneck, m.safety, m.slack_s + m.detect_s);
  }
  return 0;
}

/* Builds the plan from the trainer's manifest and sends it to every participant. */
/* A trainer group's plan: the ranks' manifests (each checked at Register;
 * checked again, now together) tiled into one shard map, each rank the
 * source of its own pieces and listening at its own data address. */
static int build_sharded(runner *r, const sched_action *a, bcast_plan_opts *po, bcast_plan **plan,
                         char *err, size_t errlen) {
  uint32_t ns = a->trainer_ranks;
  if (ns > a->nparticipants)
    return snprintf(err, errlen, "%u sources but %zu participants", ns, a->nparticipants), -1;
  bcast_tensor **lists = calloc(ns, sizeof *lists);
  size_t *n = calloc(ns, sizeof *n);
  const char **eps = calloc(ns, sizeof *eps);
  bcast_err be = {0};
  int rc = 0;
  if (!lists || !n || !eps) {
    rc = (snprintf(err, errlen, "out of memory"), -1);
    goto out;
  }
  for (uint32_t i = 0; i < ns && rc == 0; i++) {
    workers_entry *t = workers_by_id(r->workers, a->participants[i]);
    if (!t || !t->manifest) {
      rc = (snprintf(err, errlen, "no manifest of trainer rank %u", i), -1);
      break;
    }
    if (bcast_manifest_from_pb(t->manifest, &lists[i], &n[i], &be) != 0)
      rc = (snprintf(err, errlen, "manifest of trainer rank %u (%s): %s", i, t->name, be.msg), -1);
    eps[i] = t->data_address;
  }
  bcast_shard_map *map = NULL;
  if (rc == 0 &&
      bcast_shards_check((const bcast_tensor *const *)lists, n, ns, po->limits, &map, &be) != 0)
    rc = (snprintf(err, errlen, "trainer shards: %s", be.msg), -1);
  po->source_endpoints = eps;
  if (rc == 0 && bcast_plan_build_sharded(map, po, plan, &be) != 0)
    rc = (snprintf(err, errlen, "plan: %s", be.msg), -1);
  po->source_endpoints = NULL;
  bcast_shard_map_free(map);
out:
  for (uint32_t i = 0; lists && i < ns; i++) free(lists[i]);
  free(lists);
  free(n);
  free(eps);
  return rc;
}

static void receiver_views_free(bcast_receiver_view *v, size_t n) {
  for (size_t i = 0; v && i < n; i++) free((void *)v[i].parts);
  free(v);
}

/* The receivers' parts (RegisterRequest.parts), as the planner takes them:
 * one view per rank, the sources' empty. The specs point into the worker
 * entries, which outlive the plan's build. 0, or -1 with err. */
static int receiver_views(runner *r, const sched_action *a, uint32_t sources,
                          bcast_receiver_view **out, char *err, size_t errlen) {
  *out = NULL;
  size_t with = 0;
  for (size_t i = sources; i < a->nparticipants; i++) {
    workers_entry *w = workers_by_id(r->workers, a->participants[i]);
    if (w && w->nparts) with++;
  }
  if (!with) return 0;
  bcast_receiver_view *v = calloc(a->nparticipants, sizeof *v);
  if (!v) return snprintf(err, errlen, "out of memory"), -1;
  for (size_t i = sources; i < a->nparticipants; i++) {
    workers_entry *w = workers_by_id(r->workers, a->participants[i]);
    if (!w || !w->nparts) continue;
    bcast_part_spec *specs = NULL;
    char why[512];
    if (parts_from_pb(w->parts, w->nparts, 0, &specs, why, sizeof why) != 0) {
      snprintf(err, errlen, "inference worker %s: %s", w->name, why);
      receiver_views_free(v, a->nparticipants);
      return -1;
    }
    v[i] = (bcast_receiver_view){.parts = specs, .nparts = w->nparts};
  }
  *out = v;
  return 0;
}

static int build_plan(runner *r, const sched_action *a, uint64_t *hash, plan_bounds *bounds,
                      uint32_t **rank_view, uint32_t *nviews, char *err, size_t errlen) {
  workers_entry *t = workers_by_id(r->workers, a->participants[0]);
  if (!t || !t->manifest) return snprintf(err, errlen, "no trainer manifest"), -1;
  bcast_mode mode;
  if (sched_pb_bcast_mode(a->mode, &mode) != 0)
    return snprintf(err, errlen, "mode %s: not a broadcast mode", sched_mode_name(a->mode)), -1;
  uint32_t sources = a->trainer_ranks > 1 ? a->trainer_ranks : 1;
  bcast_tensor *tensors = NULL;
  size_t nt = 0;
  bcast_err be = {0};
  if (sources == 1 && bcast_manifest_from_pb(t->manifest, &tensors, &nt, &be) != 0)
    return snprintf(err, errlen, "trainer manifest: %s", be.msg), -1;
  /* Only NCCL modes use the communicator; colocated mode writes through CUDA IPC. */
  int nccl = mode == BCAST_MODE_DIRECT || mode == BCAST_MODE_STAGED;
  if (nccl && !nccl_members_match(r, a->participants, a->nparticipants)) {
    free(tensors);
    return snprintf(err, errlen,
                    "the trainer's NCCL id was made for another set of participants"),
           -1;
  }
  /* The rules Register applied: a manifest kept is one that passed them. */
  bcast_manifest_limits lim = config_manifest_limits(r->o->cfg);
  bcast_plan_opts po = {.id = a->plan_id,
                        .mode = mode,
                        .staging_budget = r->run->spec->staging_budget_bytes,
                        .world_size = (uint32_t)a->nparticipants,
                        .root_rank = 0,
                        .policy_version = a->policy_version,
                        .host_endpoint = t->data_address,
                        .checksum = BCAST_CHECKSUM_XXH3_64,
                        .tls = mode == BCAST_MODE_HOST && r->o->cfg->data_channel_tls,
                        .limits = &lim};
  bcast_plan *plan = NULL;
  bcast_receiver_view *views = NULL;
  if (receiver_views(r, a, sources, &views, err, errlen) != 0) {
    free(tensors);
    return -1;
  }
  po.receiver_views = views;
  int brc = 0;
  if (sources > 1) {
    brc = build_sharded(r, a, &po, &plan, err, errlen);
  } else if ((brc = bcast_plan_build(tensors, nt, &po, &plan, &be)) != 0) {
    snprintf(err, errlen, "plan: %s", be.msg);
    /* The planner names a rank; with a lone trainer's manifest at hand, the
     * receiver whose parts do not fit is named by its worker. */
    for (size_t i = sources; views && i < a->nparticipants; i++) {
      workers_entry *w = workers_by_id(r->workers, a->participants[i]);
      char why[600];
      if (views[i].nparts && parts_fit(tensors, nt, views[i].parts, views[i].nparts, why, sizeof why)) {
        snprintf(err, errlen, "inference worker %s: %s", w ? w->name : "?", why);
        break;
      }
    }
  }
  free(tensors);
  receiver_views_free(views, a->nparticipants);
  if (brc != 0) return -1;
  predict_plan(r, a, plan);
  /* Each source sends its own bytes to every receiver, at once: the
   * slowest source carries about its share, so the whole plan's bytes over
   * one link bound it from above. */
  if (plan_bounds_of(r, mode, bcast_plan_wire_bytes(plan), (uint32_t)(a->nparticipants - sources),
                     bounds, err, errlen) != 0) {
    bcast_plan_free(plan);
    return -1;
  }
  /* Participants give up when the scheduler would; they compare with their
   * own clocks, so this one is wall time. Neither field is hashed. */
  plan->deadline_unix_ms = now_unix_ms() + bounds->ack_ms + bounds->broadcast_ms;
  plan->min_gbps = bounds->min_gbps;
  snprintf(plan->mode_reason, sizeof plan->mode_reason, "%s", a->text);
  if (nccl) {
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
  *nviews = plan->nviews;
  if (plan->nviews && (*rank_view = malloc(plan->world_size * sizeof **rank_view)) != NULL)
    memcpy(*rank_view, plan->rank_view, plan->world_size * sizeof **rank_view);
  log_info("plan_built", "run=%s plan=%s mode=%s buckets=%zu wire_bytes=%" PRIu64
           " participants=%zu sources=%u ack_ms=%" PRId64 " broadcast_ms=%" PRId64 " min_gbps=%.3g"
           " bounds=\"%s\" reason=\"%s\"", r->run->id, a->plan_id, bcast_mode_name(mode),
           plan->nbuckets, bcast_plan_wire_bytes(plan), a->nparticipants, sources, bounds->ack_ms,
           bounds->broadcast_ms, bounds->min_gbps, bounds->expected, a->text);
  for (size_t i = 0; i < a->nparticipants; i++) {
    Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
    cmd.kind_case = RLORCH__V1__COMMAND__KIND_PLAN;
    cmd.plan = pb;
    cmd.rank = (uint32_t)i;
    send_or_lose(r, a->participants[i], &cmd);
  }
  bcast_pb_free(&pb->base);
  bcast_plan_free(plan);
  return 0;
}

static void act_build_plan(runner *r, const sched_action *a) {
  char err[768] = "";
  uint64_t hash = 0;
  if (a->catchup)
    log_info("catchup_planned", "run=%s plan=%s policy_version=%" PRIu64 " receivers=%zu", r->run->id,
             a->plan_id, a->policy_version, a->nparticipants ? a->nparticipants - 1 : 0);
  plan_bounds b = {0};
  uint32_t *rank_view = NULL, nviews = 0;
  if (build_plan(r, a, &hash, &b, &rank_view, &nviews, err, sizeof err) != 0) {
    log_error("plan_failed", "run=%s plan=%s error=\"%s\"", r->run->id, a->plan_id, err);
    sched_plan_built(r->sched, mono(), a->plan_id, 0, err);
    return;
  }
  if (sched_plan_limits(r->sched, mono(), a->plan_id, b.ack_ms, b.broadcast_ms, b.expected) != 0)
    log_error("plan_limits_refused", "run=%s plan=%s error=\"%s\"", r->run->id, a->plan_id,
              sched_last_error(r->sched));
  /* Receivers that hold part of the model are verified against their view. */
  if (nviews && (!rank_view || sched_plan_views(r->sched, mono(), a->plan_id, rank_view,
                                                a->nparticipants, nviews) != 0))
    log_error("plan_views_refused", "run=%s plan=%s error=\"%s\"", r->run->id, a->plan_id,
              rank_view ? sched_last_error(r->sched) : "out of memory");
  free(rank_view);
  publish_broadcast(r, a, RLORCH__V1__BROADCAST_EVENT__PHASE__PHASE_PLANNED, a->text);
  sched_plan_built(r->sched, mono(), a->plan_id, hash, NULL);
}

static void act_trigger(runner *r, const sched_action *a) {
  publish_broadcast(r, a, RLORCH__V1__BROADCAST_EVENT__PHASE__PHASE_ACKED, NULL);
  /* Colocated plans: the receivers' exports from their acks, for the
   * sources alone (rank 0, or every rank of a trainer group: each writes its
   * own slices). Every participant acked the same hash by now, so the
   * trainer maps and writes only after the barrier. */
  size_t ns = a->trainer_ranks > 1 ? a->trainer_ranks : 1;
  Rlorch__V1__ColocatedExport *ex = calloc(a->nparticipants ? a->nparticipants : 1, sizeof *ex);
  Rlorch__V1__ColocatedExport **exp = calloc(a->nparticipants ? a->nparticipants : 1, sizeof *exp);
  size_t nex = 0;
  for (size_t i = ns; ex && exp && i < a->nparticipants; i++) {
    workers_entry *w = workers_by_id(r->workers, a->participants[i]);
    if (!w || !w->coloc_export || strcmp(w->coloc_plan, a->plan_id) != 0) continue;
    rlorch__v1__colocated_export__init(&ex[nex]);
    ex[nex].rank = (uint32_t)i;
    ex[nex].export_bytes.data = w->coloc_export;
    ex[nex].export_bytes.len = w->coloc_export_len;
    exp[nex] = &ex[nex];
    nex++;
  }
  if (!ex || !exp)
    log_error("coloc_exports_dropped", "run=%s plan=%s error=\"out of memory\"", r->run->id,
              a->plan_id);
  for (size_t i = 0; i < a->nparticipants; i++) {
    Rlorch__V1__TriggerBroadcast tb = RLORCH__V1__TRIGGER_BROADCAST__INIT;
    tb.plan_id = (char *)a->plan_id;
    tb.plan_hash = a->plan_hash;
    if (i < ns) {
      tb.colocated = exp;
      tb.n_colocated = nex;
    }
    Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
    cmd.kind_case = RLORCH__V1__COMMAND__KIND_TRIGGER;
    cmd.trigger = &tb;
    cmd.rank = (uint32_t)i;
    send_or_lose(r, a->participants[i], &cmd);
  }
  free(ex);
  free(exp);
}

static void act_abort(runner *r, const sched_action *a) {
  const char *kind = sched_abort_reason_name(a->abort_reason);
  log_warn("broadcast_aborted", "run=%s plan=%s kind=%s reason=\"%s\"", r->run->id, a->plan_id,
           kind, a->text);
  const char *lv[] = {kind};
  metrics_counter_inc(r->o->m.broadcast_aborts, lv);
  publish_broadcast(r, a, RLORCH__V1__BROADCAST_EVENT__PHASE__PHASE_ABORTED, a->text);
  /* A broken communicator must not be reused. */
  nccl_forget(r);
  for (size_t i = 0; i < a->nparticipants; i++) {
    workers_entry *w = workers_by_id(r->workers, a->participants[i]);
    Rlorch__V1__AbortCommand ab = RLORCH__V1__ABORT_COMMAND__INIT;
    ab.plan_id = (char *)a->plan_id;
    ab.reason = (char *)a->text;
    Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
    cmd.kind_case = RLORCH__V1__COMMAND__KIND_ABORT;
    cmd.abort = &ab;
    /* Not send_or_lose: the abort is already the answer to a failure. */
    if (w) workers_send(r->workers, w, &cmd);
  }
}

/* A broadcast's figures: a step's or a catch-up's. */
static void broadcast_metrics(runner *r, const sched_step_record *rec) {
  orch_metrics *m = &r->o->m;
  const char *mode[] = {sched_mode_name(rec->mode)};
  metrics_histogram_observe(m->broadcast_duration, mode, rec->total_seconds);
  const char *h2d[] = {"h2d"}, *cast[] = {"cast"}, *exposed[] = {"exposed"};
  metrics_histogram_observe(m->staging_seconds, h2d, rec->h2d_seconds);
  metrics_histogram_observe(m->staging_seconds, cast, rec->cast_seconds);
  metrics_histogram_observe(m->staging_seconds, exposed, rec->exposed_staging_seconds);
  const char *pcie[] = {mode[0], "pcie"}, *wire[] = {mode[0], "wire"};
  metrics_counter_add(m->broadcast_bytes, pcie, (double)rec->pcie_bytes);
  metrics_counter_add(m->broadcast_bytes, wire, (double)rec->wire_bytes);
  metrics_gauge_set(m->broadcast_throughput, NULL, rec->gbps * 1e9);
  metrics_gauge_set(m->last_broadcast_time, NULL, (double)now_unix_ms() / 1000.0);
}

static void record_metrics(runner *r, const sched_step_record *rec) {
  orch_metrics *m = &r->o->m;
  metrics_histogram_observe(m->step_duration, NULL, rec->step_seconds);
  broadcast_metrics(r, rec);
  metrics_gauge_set(m->policy_version, NULL, (double)rec->policy_version);
  metrics_gauge_set(m->run_steps_done, NULL, (double)(rec->step + 1));
  const char *used[] = {"used"}, *stale[] = {"dropped_stale"};
  metrics_counter_add(m->rollouts, used, rec->rollouts_used);
  metrics_counter_add(m->rollouts, stale, rec->rollouts_dropped);
  sched_counters c;
  sched_get_counters(r->sched, &c);
  metrics_gauge_set(m->async_level, NULL, (double)c.async_level);
}

/* The prediction of the plan behind a record, for the record. Points into
 * r->pred, which outlives the packing of `out`. */
typedef struct prediction_pb {
  Rlorch__V1__CostPrediction msg;
  Rlorch__V1__StageCost stage[BCAST_TOPO_MAX_STAGES];
  Rlorch__V1__StageCost *stages[BCAST_TOPO_MAX_STAGES];
} prediction_pb;

static void prediction_attach(runner *r, const sched_step_record *rec, prediction_pb *pp,
                              Rlorch__V1__StepRecord *out) {
  plan_prediction *p = &r->pred;
  if (!p->plan_id[0]) return;
  if (!p->ok) {
    out->prediction_note = p->note;
    return;
  }
  Rlorch__V1__CostPrediction *m = &pp->msg;
  rlorch__v1__cost_prediction__init(m);
  m->layout = p->layout;
  m->total_seconds = p->pred.total_s;
  m->bottleneck = p->bottleneck;
  m->choice = p->choice;
  m->nodes = p->nodes;
  m->measured_over_predicted = p->pred.total_s > 0 ? rec->total_seconds / p->pred.total_s : 0;
  for (size_t i = 0; i < p->pred.nstages; i++) {
    const bcast_topo_stage *st = &p->pred.stages[i];
    Rlorch__V1__StageCost *c = &pp->stage[i];
    rlorch__v1__stage_cost__init(c);
    c->name = (char *)st->name;
    c->seconds = st->seconds;
    c->bytes = st->bytes;
    c->gbps = st->gbps;
    c->where = (char *)st->where;
    pp->stages[i] = c;
  }
  m->n_stages = p->pred.nstages;
  m->stages = pp->stages;
  out->prediction = m;
  if (p->note[0]) out->prediction_note = p->note;
}

static void act_commit(runner *r, const sched_action *a) {
  const sched_step_record *rec = a->record;
  if (!rec) { /* sched.h: every COMMIT carries its record */
    log_error("commit_without_record", "step=%" PRIu64, a->step);
    return;
  }
  Rlorch__V1__StepRecord pb = RLORCH__V1__STEP_RECORD__INIT;
  sched_pb_step_record_to_pb(rec, &pb);
  pb.finished_unix_ms = now_unix_ms(); /* the scheduler's clock is not wall time */
  prediction_pb pp;
  prediction_attach(r, rec, &pp, &pb);
  /* The record and the run's new position in one transaction: a crash keeps
   * both or neither, so a resume starts exactly after the last recorded step. */
  uint64_t steps_done = r->run->steps_done, version = r->run->policy_version;
  uint64_t drawn = r->run->prompts_drawn;
  r->run->steps_done = rec->step + 1;
  r->run->policy_version = rec->policy_version;
  r->run->prompts_drawn = prompt_source_drawn(r->prompts);
  r->run->updated_unix_ms = now_unix_ms();
  if (store_step_commit(r->o->db, &pb, r->run) != 0) {
    /* Not stored, not committed: a run whose steps cannot be kept must not
     * go on as if they were (nor write one twice). */
    char msg[1400];
    snprintf(msg, sizeof msg, "step %" PRIu64 " could not be recorded: %s", rec->step,
             store_errmsg(r->o->db));
    log_error("store_failed", "run=%s step=%" PRIu64 " error=\"%s\"", r->run->id, rec->step,
              store_errmsg(r->o->db));
    r->run->steps_done = steps_done;
    r->run->policy_version = version;
    r->run->prompts_drawn = drawn;
    sched_fail(r->sched, mono(), msg);
    return;
  }
  record_metrics(r, rec);
  if (pb.prediction) {
    metrics_gauge_set(r->o->m.broadcast_predicted, NULL, pb.prediction->total_seconds);
    metrics_gauge_set(r->o->m.broadcast_model_ratio, NULL,
                      pb.prediction->measured_over_predicted);
  }
  /* What this mode achieved bounds the next plans in it (only ever longer
   * than the configured rate allows: see bcast_cost_estimate). Host mode's
   * rate is per receiver; the model's is the root's, summed. */
  if ((int)rec->mode < SCHED_MODE_COUNT && rec->gbps > 0)
    r->measured_gbps[rec->mode] =
        rec->gbps * (rec->mode == SCHED_MODE_HOST && rec->receivers > 1 ? rec->receivers : 1);
  log_info("step", "run=%s step=%" PRIu64 " mode=%s transport=%s used=%u dropped=%u "
           "train_s=%.4f bcast_s=%.4f h2d_s=%.4f cast_s=%.4f wire_s=%.4f exposed_s=%.4f "
           "gbps=%.3f verified=%d sources=%u predicted_s=%.4f bottleneck=\"%s\"",
           r->run->id, rec->step, sched_mode_name(rec->mode), rec->transport, rec->rollouts_used,
           rec->rollouts_dropped, rec->train_seconds, rec->total_seconds, rec->h2d_seconds,
           rec->cast_seconds, rec->wire_seconds, rec->exposed_staging_seconds, rec->gbps,
           rec->weights_verified, rec->sources ? rec->sources : 1,
           pb.prediction ? pb.prediction->total_seconds : 0,
           pb.prediction ? pb.prediction->bottleneck : pb.prediction_note);
  Rlorch__V1__RunEvent ev = RLORCH__V1__RUN_EVENT__INIT;
  ev.event_case = RLORCH__V1__RUN_EVENT__EVENT_STEP;
  ev.step = &pb;
  ev.unix_ms = pb.finished_unix_ms;
  watch_publish(r->o->watch, r->run->id, &ev);
}

/* A catch-up finished: its receivers hold the published weights again. No
 * step moved; the broadcast counts in the broadcast metrics. */
static void act_caught_up(runner *r, const sched_action *a) {
  const sched_step_record *rec = a->record;
  if (rec) broadcast_metrics(r, rec);
  log_info("caught_up", "run=%s plan=%s policy_version=%" PRIu64 " receivers=%zu verified=%d "
           "bcast_s=%.4f", r->run->id, a->plan_id, a->policy_version,
           a->nparticipants ? a->nparticipants - 1 : 0, rec ? rec->weights_verified : 0,
           rec ? rec->total_seconds : 0.0);
  if (rec && !rec->weights_verified)
    log_warn("catchup_unverified", "run=%s plan=%s msg=\"a receiver's checksum differs from the "
             "trainer's, or was not reported\"", r->run->id, a->plan_id);
  publish_broadcast(r, a, RLORCH__V1__BROADCAST_EVENT__PHASE__PHASE_DONE, "caught up");
}

static void act_run_state(runner *r, const sched_action *a) {
  r->run->state = sched_pb_run_state_to_pb(a->run_state);
  set_run_message(r->run, a->text);
  save_run(r);
  log_info("run_state", "run=%s state=%s message=\"%s\"", r->run->id,
           sched_run_state_name(a->run_state), a->text);
  publish_run(r);
}

static void act_worker_state(runner *r, const sched_action *a) {
  workers_entry *w = workers_by_id(r->workers, a->worker);
  if (!w) return;
  if (a->worker_state == SCHED_WORKER_LOST) {
    workers_mark_lost(r->workers, w, a->text);
    /* The step is redone with a fresh batch, or planned if the trainer that
     * attaches trained it (sched.h, "Resume"). */
    if (batch_rank(&r->batch, a->worker) >= 0) {
      release_batch(r, "the trainer was lost");
      rollouts_sweep(r);
    }
    return;
  }
  w->state = sched_pb_worker_state_to_pb(a->worker_state);
  workers_publish(r->workers, w);
}

static int run_state_final(sched_run_state s) {
  return s == SCHED_RUN_STOPPED || s == SCHED_RUN_SUCCEEDED || s == SCHED_RUN_FAILED;
}

/* Ends the active run once it reached a final state. */
static void release_run(runner *r) {
  if (!r->run) return;
  watch_end(r->o->watch, r->run->id);
  workers_set_run(r->workers, NULL);
  release_batch(r, "the run ended");
  protobuf_c_message_free_unpacked(&r->run->base, NULL);
  r->run = NULL;
  sched_free(r->sched);
  r->sched = NULL;
  rollout_store_free(r->rollouts);
  r->rollouts = NULL;
  prompt_source_close(r->prompts);
  r->prompts = NULL;
  group_table_free(r->groups);
  r->groups = NULL;
  memset(&r->seen, 0, sizeof r->seen);
  metrics_gauge_set(r->o->m.rollouts_in_flight, NULL, 0);
  r->dispatch_held = 0;
  metrics_gauge_set(r->o->m.rollout_buffer_bytes, NULL, 0);
  nccl_forget(r);
  workers_gauge(r->workers);
}

/* Adds what the scheduler counted since the last call to the process-wide
 * counters (the scheduler's start again with every run). */
static void sync_counters(runner *r) {
  sched_counters c;
  sched_get_counters(r->sched, &c);
  orch_metrics *m = &r->o->m;
  const char *disp[] = {"dispatched"}, *resent[] = {"resent"}, *requeued[] = {"requeued"},
             *cancelled[] = {"cancelled"};
  metrics_counter_add(m->requests, disp, (double)(c.requests_dispatched - r->seen.requests_dispatched));
  metrics_counter_add(m->requests, resent, (double)(c.groups_resent - r->seen.groups_resent));
  metrics_counter_add(m->requests, requeued, (double)(c.groups_requeued - r->seen.groups_requeued));
  metrics_counter_add(m->requests, cancelled,
                      (double)(c.requests_cancelled - r->seen.requests_cancelled));
  metrics_gauge_set(m->rollouts_in_flight, NULL, (double)c.rollouts_requested);
  r->seen = c;
}

/* Forgets the prompts of groups the scheduler no longer has open. */
static void groups_sweep(runner *r) {
  size_t n = sched_open_groups(r->sched, NULL, 0);
  uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
  if (!ids) return; /* out of memory: keep them until the next sweep */
  group_table_retain(r->groups, ids, sched_open_groups(r->sched, ids, n));
  free(ids);
}

static void drain(runner *r) {
  if (r->draining || !r->sched) return;
  r->draining = 1;
  for (int rounds = 0; r->sched && rounds < 1000; rounds++) {
    /* The batch owns its actions: executing one may feed the scheduler (and
     * queue more for the next round) without invalidating the rest. */
    sched_action_batch b;
    if (sched_take_actions(r->sched, &b) == 0) break;
    int final = 0;
    for (size_t i = 0; i < b.n && r->sched; i++) {
      const sched_action *a = &b.actions[i];
      switch (a->kind) {
      case SCHED_ACT_DISPATCH: act_dispatch(r, a); break;
      case SCHED_ACT_TRAIN: act_train(r, a); break;
      case SCHED_ACT_BUILD_PLAN: act_build_plan(r, a); break;
      case SCHED_ACT_TRIGGER: act_trigger(r, a); break;
      case SCHED_ACT_ABORT: act_abort(r, a); break;
      case SCHED_ACT_COMMIT: act_commit(r, a); break;
      case SCHED_ACT_RUN_STATE:
        act_run_state(r, a);
        if (run_state_final(a->run_state)) final = 1;
        break;
      case SCHED_ACT_WORKER_STATE: act_worker_state(r, a); break;
      case SCHED_ACT_CANCEL: act_cancel(r, a); break;
      case SCHED_ACT_CAUGHT_UP: act_caught_up(r, a); break;
      }
    }
    sched_action_batch_free(&b);
    if (r->sched) {
      sync_counters(r);
      groups_sweep(r);
    }
    if (final) release_run(r);
  }
  r->draining = 0;
  arm_timer(r);
}

void runner_drain(runner *r) { drain(r); }


/* ---- time ------------------------------------------------------------------------------- */

static void on_timer(uv_timer_t *t) {
  runner *r = t->data;
  int64_t now = mono();
  workers_sweep(r->workers, now, (int64_t)r->o->cfg->worker_timeout_ms);
  if (r->sched) {
    sched_tick(r->sched, now);
    drain(r);
  }
  arm_timer(r);
}

static void arm_timer(runner *r) {
  if (!r->timer_open) return;
  int64_t due = SWEEP_MS;
  if (r->sched) {
    int64_t d = sched_next_deadline(r->sched);
    if (d != SCHED_NEVER) {
      int64_t in = d - mono();
      if (in < due) due = in;
    }
  }
  if (due < TICK_MIN_MS) due = TICK_MIN_MS;
  uv_timer_start(&r->timer, on_timer, (uint64_t)due, 0);
}

/* ---- workers joining the run ---------------------------------------------------------------- */

/* Tells the active run's scheduler about a live worker. */
int runner_admits(const Rlorch__V1__RunSpec *spec, const workers_entry *w, char *err,
                  size_t errlen) {
  if (w->role != RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER) return 0;
  const Rlorch__V1__WeightManifest *m = w->manifest;
  const char *held = m && m->preset ? m->preset : "";
  if (spec->preset && spec->preset[0] && strcmp(spec->preset, held) != 0)
    return snprintf(err, errlen,
                    "preset: the run asks for %s, trainer %s holds %s (start it with --preset %s)",
                    spec->preset, w->name, held[0] ? held : "no preset", spec->preset),
           -1;
  Rlorch__V1__Offload off = m ? m->offload : RLORCH__V1__OFFLOAD__OFFLOAD_UNSPECIFIED;
  if (spec->offload != RLORCH__V1__OFFLOAD__OFFLOAD_UNSPECIFIED && spec->offload != off) {
    char want[48], has[48];
    pbjson_enum_short(&rlorch__v1__offload__descriptor, spec->offload, want, sizeof want);
    pbjson_enum_short(&rlorch__v1__offload__descriptor, off, has, sizeof has);
    return snprintf(err, errlen,
                    "offload: the run asks for %s, trainer %s runs with %s (start it with "
                    "--offload %s)",
                    want, w->name, has, want),
           -1;
  }
  return 0;
}

/* A spec that left preset or offload to the trainer records what it got. */
static void adopt_trainer_settings(runner *r, const workers_entry *w) {
  Rlorch__V1__RunSpec *spec = r->run->spec;
  const Rlorch__V1__WeightManifest *m = w->manifest;
  if (!spec || !m) return;
  int changed = 0;
  if ((!spec->preset || !spec->preset[0]) && m->preset && m->preset[0]) {
    char *p = strdup(m->preset);
    if (p) {
      if (spec->preset != protobuf_c_empty_string) free(spec->preset);
      spec->preset = p;
      changed = 1;
    }
  }
  if (spec->offload == RLORCH__V1__OFFLOAD__OFFLOAD_UNSPECIFIED &&
      m->offload != RLORCH__V1__OFFLOAD__OFFLOAD_UNSPECIFIED) {
    spec->offload = m->offload;
    changed = 1;
  }
  if (changed) save_run(r);
}

/* The version of the active run that w says it holds; one of another run
 * (or none said) is 0 of this one: the weights it held when the run began. */
static uint64_t claimed_version(const runner *r, const workers_entry *w) {
  return w->version_run[0] && !strcmp(w->version_run, r->run->id) ? w->policy_version : 0;
}

static void join_run(runner *r, workers_entry *w) {
  if (!r->sched || w->in_run || w->state == RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST) return;
  char why[320];
  if (runner_admits(r->run->spec, w, why, sizeof why) != 0) {
    /* Not admitted: the run keeps waiting and says for what. */
    log_warn("worker_not_admitted", "worker=%s run=%s reason=\"%s\"", w->api_id, r->run->id,
             why);
    char msg[400];
    snprintf(msg, sizeof msg, "waiting for a trainer that fits the run; %s", why);
    set_run_message(r->run, msg);
    save_run(r);
    publish_run(r);
    return;
  }
  sched_role role;
  if (sched_pb_role_from_pb(w->role, &role) != 0) return; /* the Worker API admits none */
  sched_caps caps;
  sched_offload off;
  sched_pb_caps(w->caps, &caps);
  caps.holds_part = w->nparts > 0;
  sched_pb_offload(w->manifest, &off);
  int64_t now = mono();
  int rc = sched_worker_registered(r->sched, now, w->id, role, w->name, &caps,
                                   role == SCHED_ROLE_TRAINER ? &off : NULL,
                                   claimed_version(r, w));
  if (rc != 0) {
    log_warn("worker_not_joined", "worker=%s run=%s error=\"%s\"", w->api_id, r->run->id,
             sched_last_error(r->sched));
    return;
  }
  w->in_run = 1;
  if (role == SCHED_ROLE_TRAINER) adopt_trainer_settings(r, w);
  if (w->attach) sched_worker_attached(r->sched, now, w->id);
  workers_publish(r->workers, w);
}

void runner_worker_registered(runner *r, workers_entry *w) {
  workers_publish(r->workers, w);
  join_run(r, w);
  drain(r);
}

void runner_worker_attached(runner *r, workers_entry *w) {
  if (r->sched && w->in_run) sched_worker_attached(r->sched, mono(), w->id);
  workers_publish(r->workers, w);
  join_run(r, w);
  drain(r);
}

void runner_worker_stream_closed(runner *r, workers_entry *w) {
  runner_worker_lost(r, w, "command stream closed");
}

void runner_worker_lost(runner *r, workers_entry *w, const char *reason) {
  if (r->sched && w->in_run) {
    sched_worker_lost(r->sched, mono(), w->id, reason);
    drain(r);
  } else if (w->state != RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST) {
    workers_mark_lost(r->workers, w, reason);
  }
}

/* ---- reports -------------------------------------------------------------------------------- */

static int in_run(const runner *r, const workers_entry *w) { return r->sched && w->in_run; }

int runner_heartbeat(runner *r, workers_entry *w, uint64_t policy_version, const char *run_id) {
  r->err_set = 0;
  if (!in_run(r, w)) return 0;
  /* Another run's version says nothing of this run's: as good as none. */
  if (run_id && run_id[0] && strcmp(run_id, r->run->id) != 0) policy_version = 0;
  return sched_worker_heartbeat(r->sched, mono(), w->id, policy_version);
}

/* Engines may leave a rollout's prompt out (the orchestrator sent it); the
 * trainer gets it filled in from the group. One given must be the group's.
 * Writes shallow copies into `out` (n of them) and the result `filled`
 * pointing to them. 0, or SCHED_EINVAL with the message in err. */
static int fill_prompts(runner *r, const Rlorch__V1__RolloutResult *res,
                        Rlorch__V1__Rollout *out, Rlorch__V1__Rollout **ptrs,
                        Rlorch__V1__RolloutResult *filled, char *err, size_t errlen) {
  *filled = *res;
  filled->rollouts = ptrs;
  for (size_t i = 0; i < res->n_rollouts; i++) {
    out[i] = *res->rollouts[i];
    ptrs[i] = &out[i];
    /* An unknown group is the scheduler's to refuse, with the request. */
    const group_entry *g = group_table_get(r->groups, out[i].group_id);
    if (!g) continue;
    if (!out[i].n_prompt_token_ids) {
      out[i].prompt_token_ids = g->prompt.token_ids;
      out[i].n_prompt_token_ids = g->prompt.ntokens;
    } else if (out[i].n_prompt_token_ids != g->prompt.ntokens ||
               memcmp(out[i].prompt_token_ids, g->prompt.token_ids,
                      g->prompt.ntokens * sizeof *g->prompt.token_ids) != 0) {
      snprintf(err, errlen,
               "rollouts[%zu].prompt_token_ids: not the prompt of group %" PRIu64
               " (%zu tokens); leave it empty or send the request's",
               i, out[i].group_id, g->prompt.ntokens);
      return SCHED_EINVAL;
    }
  }
  return 0;
}

/* What an accepted report adds to the metrics: its group's latency from the
 * first dispatch, and the completion tokens. */
static void count_rollouts(runner *r, const Rlorch__V1__RolloutResult *res) {
  uint64_t tokens = 0;
  for (size_t i = 0; i < res->n_rollouts; i++) {
    const Rlorch__V1__Rollout *o = res->rollouts[i];
    tokens += o->n_completion_token_ids ? o->n_completion_token_ids : o->tokens;
  }
  metrics_counter_add(r->o->m.generated_tokens, NULL, (double)tokens);
  const group_entry *g = res->n_rollouts ? group_table_get(r->groups, res->rollouts[0]->group_id)
                                         : NULL;
  if (g)
    metrics_histogram_observe(r->o->m.request_duration, NULL,
                              (double)(mono() - g->dispatched_ms) / 1000.0);
}

int runner_rollouts_done(runner *r, workers_entry *w, const Rlorch__V1__RolloutResult *res) {
  r->err_set = 0;
  if (!in_run(r, w)) return 0;
  size_t k = res->n_rollouts ? res->n_rollouts : 1;
  Rlorch__V1__Rollout *copies = malloc(k * sizeof *copies);
  Rlorch__V1__Rollout **ptrs = malloc(k * sizeof *ptrs);
  Rlorch__V1__RolloutResult filled;
  int rc = copies && ptrs ? 0 : SCHED_ENOMEM;
  if (rc == 0) rc = fill_prompts(r, res, copies, ptrs, &filled, r->err, sizeof r->err);
  /* Kept first, so a batch the scheduler builds from them finds them all. */
  if (rc == 0 && rollout_store_put(r->rollouts, &filled) != 0) rc = SCHED_ENOMEM;
  free(copies);
  free(ptrs);
  if (rc != 0) {
    r->err_set = rc == SCHED_EINVAL;
    /* The scheduler never saw this report: tell it the request is answered
     * and refused, or it would wait for the group on that worker forever
     * (or until request_timeout_ms) instead of sending it again. */
    if (rc == SCHED_EINVAL) sched_rollouts_refused(r->sched, mono(), w->id, res->request_id);
    return rc;
  }
  sched_rollout *v = calloc(res->n_rollouts ? res->n_rollouts : 1, sizeof *v);
  if (!v) {
    rollouts_sweep(r);
    return SCHED_ENOMEM;
  }
  sched_pb_rollouts(res, v);
  rc = sched_rollouts_done(r->sched, mono(), w->id, res->request_id, v, res->n_rollouts);
  free(v);
  if (rc == SCHED_OK) count_rollouts(r, res);
  else if (rc == SCHED_ESTALE) { /* an answer to a request cancelled: its group was served */
    const char *late[] = {"late"};
    metrics_counter_inc(r->o->m.requests, late);
  }
  /* A refused report built no batch, so a sweep frees its copies; an accepted
   * one may have: its TRAIN action still needs them, and act_train sweeps. */
  if (rc != SCHED_OK) rollouts_sweep(r);
  else rollouts_budget(r);
  return rc;
}

void runner_rollouts_refused(runner *r, workers_entry *w, uint64_t request_id) {
  r->err_set = 0;
  if (in_run(r, w)) sched_rollouts_refused(r->sched, mono(), w->id, request_id);
}

int runner_step_done(runner *r, workers_entry *w, uint64_t step, double train_seconds,
                     const uint8_t *nccl_id, size_t nccl_len) {
  r->err_set = 0;
  if (nccl_id && nccl_len == sizeof r->nccl_id) {
    memcpy(r->nccl_id, nccl_id, sizeof r->nccl_id);
    r->has_nccl_id = 1;
  }
  if (!in_run(r, w)) return 0;
  snprintf(w->version_run, sizeof w->version_run, "%s", r->run->id);
  sched_offload off;
  sched_pb_offload(w->manifest, &off);
  /* A group's rank: StepDone.weights_checksum covers its tensors, not its
   * part of the plan, so it does not stand for its broadcast's (0). */
  int rc = sched_shard_step_done(r->sched, mono(), w->id, step, train_seconds, &off, 0);
  if (rc == SCHED_OK)
    metrics_gauge_set(r->o->m.last_step_time, NULL, (double)now_unix_ms() / 1000.0);
  /* Whatever the scheduler made of the report, the rank is done with the
   * batch; once every rank is, its rollouts can go. */
  held_batch *b = &r->batch;
  int k = b->held && b->step == step ? batch_rank(b, w->id) : -1;
  if (k >= 0 && !b->reported[k]) {
    b->reported[k] = 1;
    b->nreported++;
  }
  if (k >= 0 && b->nreported == b->ranks) {
    release_batch(r, b->ranks > 1 ? "every trainer rank reported the step done"
                                  : "the trainer reported the step done");
    rollouts_sweep(r);
  }
  return rc;
}

/* ---- the held batch, for FetchBatch ----------------------------------------------------------- */

int runner_batch_share(runner *r, const workers_entry *w, uint64_t step, uint32_t rank,
                       uint32_t ranks, runner_share *out, char *err, size_t errlen) {
  const held_batch *b = &r->batch;
  if (!r->run) return snprintf(err, errlen, "no active run"), SCHED_ESTATE;
  if (w->role != RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER || !w->in_run)
    return snprintf(err, errlen, "worker %s (%s) is not the trainer of the active run %s",
                    w->api_id, w->name, r->run->id),
           SCHED_ESTATE;
  if (batch_rank(b, w->id) < 0)
    return snprintf(err, errlen, "step %" PRIu64 "'s batch is not held (no step is being trained)",
                    step),
           SCHED_ESTATE;
  if (b->step != step)
    return snprintf(err, errlen,
                    "step %" PRIu64 "'s batch is not held (the trainer is executing step %" PRIu64
                    ")",
                    step, b->step),
           SCHED_ESTATE;
  if (ranks == 0) ranks = 1;
  if (rank >= ranks)
    return snprintf(err, errlen, "rank: %u is not below ranks %u", rank, ranks), SCHED_EINVAL;
  /* Groups [rank G / ranks, (rank + 1) G / ranks): as even as whole groups allow. */
  uint64_t g0 = (uint64_t)rank * b->groups / ranks, g1 = ((uint64_t)rank + 1) * b->groups / ranks;
  size_t first = (size_t)(g0 * b->group_size), end = (size_t)(g1 * b->group_size);
  if (first > b->n) first = b->n;
  if (end > b->n) end = b->n;
  uint64_t bytes = 0;
  for (size_t i = first; i < end; i++) bytes += b->sizes[i];
  *out = (runner_share){.gen = b->gen,
                        .step = step,
                        .first = first,
                        .end = end,
                        .groups = (uint32_t)(g1 - g0),
                        .bytes = bytes};
  return 0;
}

int runner_batch_rollout(runner *r, const runner_share *s, size_t i, const Rlorch__V1__Rollout **out,
                         size_t *bytes, char *err, size_t errlen) {
  const held_batch *b = &r->batch;
  *out = NULL;
  *bytes = 0;
  if (!b->held || b->gen != s->gen)
    return snprintf(err, errlen, "step %" PRIu64 "'s batch is no longer held (%s)", s->step,
                    b->released_gen == s->gen + 1 ? b->released_why : "another batch replaced it"),
           SCHED_ESTATE;
  if (i < s->first || i >= s->end)
    return snprintf(err, errlen, "rollout %zu is outside the share [%zu, %zu)", i, s->first,
                    s->end),
           SCHED_EINVAL;
  *out = rollout_store_get(r->rollouts, b->ids[i]);
  if (!*out)
    return snprintf(err, errlen, "rollout %" PRIu64 " of step %" PRIu64 "'s batch is missing",
                    b->ids[i], s->step),
           SCHED_ENOENT;
  *bytes = b->sizes[i];
  return 0;
}

int runner_plan_acked(runner *r, workers_entry *w, const char *plan_id, uint64_t hash,
                      const char *error, const uint8_t *coloc, size_t coloc_len) {
  r->err_set = 0;
  /* Kept before the scheduler hears of the ack: the last ack triggers, and
   * the trigger carries every export to the trainer. */
  if (in_run(r, w) && workers_set_coloc_export(w, plan_id, error && error[0] ? NULL : coloc,
                                               coloc_len) != 0)
    log_error("coloc_export_dropped", "run=%s worker=%s plan=%s error=\"out of memory\"", r->run->id,
              w->api_id, plan_id ? plan_id : "");
  return in_run(r, w) ? sched_plan_acked(r->sched, mono(), w->id, plan_id, hash, error) : 0;
}

int runner_broadcast_done(runner *r, workers_entry *w, const char *plan_id, const char *error,
                          const sched_bcast_report *report) {
  r->err_set = 0;
  return in_run(r, w) ? sched_broadcast_done(r->sched, mono(), w->id, plan_id, error, report)
                      : 0;
}

const char *runner_last_error(const runner *r) {
  if (r->err_set) return r->err;
  return r->sched ? sched_last_error(r->sched) : "";
}

/* ---- the Control API's side ------------------------------------------------------------------ */

/* A run that cannot start is stored FAILED with the reason, then freed. */
static int refuse_run(runner *r, Rlorch__V1__Run *run, const char *err) {
  run->state = RLORCH__V1__RUN_STATE__RUN_STATE_FAILED;
  set_run_message(run, err);
  r->run = run;
  save_run(r);
  r->run = NULL;
  protobuf_c_message_free_unpacked(&run->base, NULL);
  return -1;
}

/* Makes `run` the active one (owned from here): its scheduler, prompt
 * source, rollout store and group table. A resumed run passes the steps it
 * committed, which resume this is and the prompts its steps had drawn; a new
 * one zeros. 0; or -1 with err, the run stored FAILED and freed. */
static int begin_run(runner *r, Rlorch__V1__Run *run, uint64_t steps_done, uint32_t resumes,
                     uint64_t skip_prompts, char *err, size_t errlen) {
  const config *cfg = r->o->cfg;
  sched_settings st;
  sched_settings_default(&st);
  snprintf(st.run_id, sizeof st.run_id, "%s", run->id);
  st.steps = run->spec->steps;
  st.rollouts_per_step = run->spec->rollouts_per_step;
  st.max_async_level = run->spec->max_async_level;
  st.group_size = run->spec->group_size ? run->spec->group_size : 1;
  st.request_timeout_ms = run->spec->request_timeout_ms;
  st.steps_done = steps_done;
  st.resumes = resumes;
  /* 0 only in a spec that bypassed the Control API's defaults: keep the scheduler's. */
  if (run->spec->max_requests_per_worker) st.max_outstanding = run->spec->max_requests_per_worker;
  if (sched_pb_mode_from_pb(run->policy, &st.policy) != 0) {
    snprintf(err, errlen, "policy: unknown value %d", (int)run->policy);
    return refuse_run(r, run, err);
  }
  st.heartbeat_timeout_ms = cfg->worker_timeout_ms;
  /* st.plan_ack_timeout_ms and broadcast_timeout_ms stay the scheduler's
   * defaults: every plan gets its own from the cost model (build_plan). */
  memset(r->measured_gbps, 0, sizeof r->measured_gbps);
  if (sched_new(&st, &r->sched, err, errlen) != 0) return refuse_run(r, run, err);
  if (prompt_source_open(run->spec->prompts, cfg->max_prompt_tokens, &r->prompts, err,
                         errlen) != 0 ||
      prompt_source_skip(r->prompts, skip_prompts, err, errlen) != 0) {
    prompt_source_close(r->prompts);
    r->prompts = NULL;
    sched_free(r->sched);
    r->sched = NULL;
    return refuse_run(r, run, err);
  }
  if (rollout_store_new(&r->rollouts) != 0 || !(r->groups = group_table_new())) {
    rollout_store_free(r->rollouts);
    r->rollouts = NULL;
    prompt_source_close(r->prompts);
    r->prompts = NULL;
    sched_free(r->sched);
    r->sched = NULL;
    snprintf(err, errlen, "out of memory");
    return refuse_run(r, run, err);
  }
  log_info("run_prompts", "run=%s source=\"%s\" group_size=%u skipped=%" PRIu64, run->id,
           prompt_source_describe(r->prompts), st.group_size, skip_prompts);
  r->run = run;
  run->state = RLORCH__V1__RUN_STATE__RUN_STATE_PENDING; /* the scheduler's first state */
  metrics_gauge_set(r->o->m.run_steps_done, NULL, (double)steps_done);
  metrics_gauge_set(r->o->m.policy_version, NULL, (double)steps_done);
  metrics_gauge_set(r->o->m.last_step_time, NULL, 0); /* per run: alerts judge this one */
  metrics_gauge_set(r->o->m.last_broadcast_time, NULL, 0);
  metrics_gauge_set(r->o->m.run_steps_target, NULL, (double)run->spec->steps);
  workers_set_run(r->workers, run->id);
  return 0;
}

int runner_start(runner *r, Rlorch__V1__Run *run, char *err, size_t errlen) {
  if (r->run) return snprintf(err, errlen, "run '%s' is active", r->run->id), -1;
  if (begin_run(r, run, 0, 0, 0, err, errlen) != 0) return -1;
  set_run_message(run, "waiting for 1 trainer and at least 1 inference worker");
  save_run(r);
  for (size_t i = 0; i < workers_count(r->workers); i++) join_run(r, workers_at(r->workers, i));
  drain(r);
  return 0;
}

/* Ends a run left active by the previous daemon in a final state, saying why. */
static void end_left_run(runner *r, Rlorch__V1__Run *run, Rlorch__V1__RunState state,
                         const char *msg) {
  run->state = state;
  set_run_message(run, msg);
  run->updated_unix_ms = now_unix_ms();
  if (store_run_update(r->o->db, run) != 0)
    log_error("store_failed", "run=%s error=\"%s\"", run->id, store_errmsg(r->o->db));
  log_warn("run_not_resumed", "run=%s state=%s message=\"%s\"", run->id,
           state == RLORCH__V1__RUN_STATE__RUN_STATE_SUCCEEDED ? "succeeded"
           : state == RLORCH__V1__RUN_STATE__RUN_STATE_STOPPED ? "stopped" : "failed", msg);
}

/* Resumes one run the previous daemon left active (see runner.h). */
static void resume_run(runner *r, Rlorch__V1__Run *run) {
  char msg[700], err[600];
  if (run->state == RLORCH__V1__RUN_STATE__RUN_STATE_STOPPING) {
    /* The stop was asked for; what it waited on is gone with that daemon. */
    snprintf(msg, sizeof msg, "%s; the orchestrator restarted while it stopped",
             run->message && run->message[0] ? run->message : "stop requested");
    end_left_run(r, run, RLORCH__V1__RUN_STATE__RUN_STATE_STOPPED, msg);
    protobuf_c_message_free_unpacked(&run->base, NULL);
    return;
  }
  /* The step records are the commits: the run carries on after the last. */
  uint64_t recorded = 0;
  int64_t last = -1;
  if (store_steps_count(r->o->db, run->id, &recorded, &last) != 0) {
    snprintf(msg, sizeof msg, "cannot resume: %s", store_errmsg(r->o->db));
    end_left_run(r, run, RLORCH__V1__RUN_STATE__RUN_STATE_FAILED, msg);
    protobuf_c_message_free_unpacked(&run->base, NULL);
    return;
  }
  uint64_t steps_done = (uint64_t)(last + 1);
  if (recorded != steps_done) {
    snprintf(msg, sizeof msg,
             "cannot resume: %" PRIu64 " step records up to step %" PRId64 ", some are missing",
             recorded, last);
    end_left_run(r, run, RLORCH__V1__RUN_STATE__RUN_STATE_FAILED, msg);
    protobuf_c_message_free_unpacked(&run->base, NULL);
    return;
  }
  if (steps_done != run->steps_done)
    log_warn("run_steps_mismatch", "run=%s steps_done=%" PRIu64 " recorded=%" PRIu64
             " msg=\"the step records win: a step is committed once recorded\"", run->id,
             run->steps_done, steps_done);
  run->steps_done = steps_done;
  run->policy_version = steps_done;
  if (run->spec->steps && steps_done >= run->spec->steps) {
    snprintf(msg, sizeof msg, "%" PRIu64 " steps done", steps_done);
    end_left_run(r, run, RLORCH__V1__RUN_STATE__RUN_STATE_SUCCEEDED, msg);
    protobuf_c_message_free_unpacked(&run->base, NULL);
    return;
  }
  run->resumes++;
  if (begin_run(r, run, steps_done, run->resumes, run->prompts_drawn, err, sizeof err) != 0) {
    log_error("run_not_resumed", "run=%s error=\"%s\"", run->id, err);
    return;
  }
  snprintf(msg, sizeof msg,
           "resumed at step %" PRIu64 " after an orchestrator restart: waiting for its trainer "
           "(holding policy version %" PRIu64 ") and an inference worker",
           steps_done, steps_done);
  set_run_message(run, msg);
  save_run(r);
  publish_run(r);
  log_info("run_resumed", "run=%s step=%" PRIu64 " policy_version=%" PRIu64 " resumes=%u "
           "prompts_skipped=%" PRIu64, run->id, steps_done, steps_done, run->resumes,
           run->prompts_drawn);
}

void runner_resume(runner *r) {
  Rlorch__V1__Run **runs = NULL;
  size_t n = 0;
  if (store_run_list(r->o->db, 0, UINT32_MAX, &runs, &n) != 0) {
    log_error("store_failed", "error=\"%s\" msg=\"cannot list the runs to resume\"",
              store_errmsg(r->o->db));
    return;
  }
  /* Newest first. One run is active at a time, so one is left at most; any
   * older one is from an older rlorch that failed to end it. */
  for (size_t i = 0; i < n; i++) {
    Rlorch__V1__Run *run = runs[i];
    if (run->state == RLORCH__V1__RUN_STATE__RUN_STATE_STOPPED ||
        run->state == RLORCH__V1__RUN_STATE__RUN_STATE_SUCCEEDED ||
        run->state == RLORCH__V1__RUN_STATE__RUN_STATE_FAILED)
      continue;
    if (r->run) {
      end_left_run(r, run, RLORCH__V1__RUN_STATE__RUN_STATE_FAILED,
                   "interrupted by an orchestrator restart (a newer run was resumed)");
      continue;
    }
    runs[i] = NULL; /* the runner owns it now */
    resume_run(r, run);
  }
  size_t kept = 0; /* the one given away is not freed here */
  for (size_t i = 0; i < n; i++)
    if (runs[i]) runs[kept++] = runs[i];
  store_runs_free(runs, kept);
}

const Rlorch__V1__Run *runner_active(const runner *r) { return r->run; }

int runner_stop(runner *r, const char *run_id, const char *reason, char *err, size_t errlen) {
  if (!r->run || strcmp(r->run->id, run_id) != 0)
    return snprintf(err, errlen, "run '%s' is not active", run_id), -1;
  sched_stop(r->sched, mono(), reason);
  drain(r);
  return 0;
}

int runner_set_policy(runner *r, const char *run_id, Rlorch__V1__BroadcastMode p, char *err,
                      size_t errlen) {
  if (!r->run || strcmp(r->run->id, run_id) != 0)
    return snprintf(err, errlen, "run '%s' is not active", run_id), -1;
  sched_mode mode;
  if (sched_pb_mode_from_pb(p, &mode) != 0)
    return snprintf(err, errlen, "policy: unknown value %d", (int)p), -1;
  if (sched_set_policy(r->sched, mono(), mode) != 0)
    return snprintf(err, errlen, "%s", sched_last_error(r->sched)), -1;
  r->run->policy = p;
  save_run(r);
  log_info("policy_set", "run=%s policy=%s", run_id, sched_mode_name(mode));
  drain(r);
  return 0;
}

/* ---- life cycle -------------------------------------------------------------------------------- */

/* The table removes a lost worker: the run's scheduler forgets it too, so
 * that neither keeps what a stream of short-lived workers leaves behind. */
static void on_worker_removed(workers_entry *w, void *ud) {
  runner *r = ud;
  if (r->sched && w->in_run) sched_worker_forget(r->sched, mono(), w->id);
}

int runner_new(orch *o, runner **out) {
  runner *r = calloc(1, sizeof *r);
  if (!r) return -1;
  r->o = o;
  r->workers = o->workers;
  workers_on_remove(r->workers, on_worker_removed, r);
  uv_timer_init(o->loop, &r->timer);
  r->timer.data = r;
  r->timer_open = 1;
  arm_timer(r);
  workers_gauge(r->workers);
  *out = r;
  return 0;
}

void runner_shutdown(runner *r) {
  if (r->run) {
    /* The run outlives this daemon: the next one on the data_dir resumes it
     * (runner_resume), and its trainer keeps the weights meanwhile. So
     * nothing of it is ended here, in the store or on the workers; its
     * record only says why it pauses. */
    char msg[200];
    snprintf(msg, sizeof msg,
             "the orchestrator shut down at step %" PRIu64 ": the run resumes when it starts again",
             r->run->steps_done);
    set_run_message(r->run, msg);
    save_run(r);
    publish_run(r);
    char state[48];
    pbjson_enum_short(&rlorch__v1__run_state__descriptor, r->run->state, state, sizeof state);
    log_info("run_paused", "run=%s state=%s step=%" PRIu64, r->run->id, state, r->run->steps_done);
    release_run(r);
  }
  workers_disconnect(r->workers, "orchestrator shutting down: register again when it is back");
  if (r->timer_open) {
    uv_timer_stop(&r->timer);
    uv_close((uv_handle_t *)&r->timer, NULL);
    r->timer_open = 0;
  }
}

void runner_free(runner *r) {
  if (!r) return;
  release_batch(r, "the orchestrator shut down");
  if (r->run) protobuf_c_message_free_unpacked(&r->run->base, NULL);
  sched_free(r->sched);
  free(r->nccl_members);
  free(r);
}
