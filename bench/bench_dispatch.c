/* `rlorch bench dispatch`: how much of what the inference workers generate is
 * wasted, and how busy they are, at off-policy bounds 0..3. A real `rlorch
 * serve` child drives in-process workers that model an engine: each
 * inference worker generates up to max_requests_per_worker requests at once
 * (one generator thread per slot, a fixed latency per rollout), the trainer
 * takes a fixed time per step. For every async level the stale drop rate is
 * printed beside the ideal (0), and the workers' utilisation beside the one
 * the batches allow (computed from the same run's measured step times), as a
 * ratio. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/bench_fake.h"
#include "orchestrator/cli/proc.h"
#include "orchestrator/common/opt.h"
#include "rlorch/v1/control.pb-c.h"
#include "rlorch/v1/worker.pb-c.h"
#include "rpc/rpc.h"

extern char **environ;

#define DISPATCH__LEVELS 4 /* async levels 0..3 */

typedef struct dispatch__cfg {
  uint32_t steps, rollouts_per_step, workers, slots, group_size;
  double latency_ms, train_ms;
  bool json;
} dispatch__cfg;

typedef struct dispatch__job {
  uint64_t request_id;
  uint32_t count;
  uint64_t group_id;
  struct dispatch__job *next;
} dispatch__job;

typedef struct dispatch__fake {
  const dispatch__cfg *cfg;
  rpc_client *client;
  rpc_oneway *reports; /* the step's reports that need no answer */
  int trainer;
  uint32_t index;
  char id[32];
  _Atomic uint64_t version; /* held: set when a broadcast is done */
  uint64_t pending_version;
  _Atomic uint64_t counter;
  pthread_t th;
  int th_started;
  /* Inference: the generator slots and their queue. */
  pthread_mutex_t mu;
  pthread_cond_t cond;
  dispatch__job *head, *tail;
  int quit;
  pthread_t *slot_th;
  uint32_t nslots;
  double busy_s;       /* generation time summed over slots, under mu */
  uint64_t generated;  /* under mu */
} dispatch__fake;

static void dispatch__sleep(double s) {
  if (s <= 0) return;
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static int dispatch__report(dispatch__fake *f, Rlorch__V1__ReportRequest *r) {
  return bench_fake_report(f->client, f->id, r);
}

/* One slot: generates a request's rollouts (its whole group) one after
 * another, each taking the configured latency, tagged with the version held
 * when it started and the request's group. */
static void dispatch__serve(dispatch__fake *f, const dispatch__job *j) {
  uint32_t n = j->count;
  Rlorch__V1__Rollout *ro = calloc(n ? n : 1, sizeof *ro);
  Rlorch__V1__Rollout **rp = calloc(n ? n : 1, sizeof *rp);
  uint64_t version = atomic_load(&f->version);
  double t0 = bench_now();
  uint32_t made = 0;
  for (; ro && rp && made < n; made++) {
    dispatch__sleep(f->cfg->latency_ms / 1000.0);
    rlorch__v1__rollout__init(&ro[made]);
    ro[made].id = ((uint64_t)(f->index + 1) << 40) | (atomic_fetch_add(&f->counter, 1) + 1);
    ro[made].policy_version = version;
    ro[made].tokens = 1;
    ro[made].group_id = j->group_id;
    ro[made].seconds = f->cfg->latency_ms / 1000.0;
    rp[made] = &ro[made];
  }
  double busy = bench_now() - t0;
  pthread_mutex_lock(&f->mu);
  f->busy_s += busy;
  f->generated += made;
  pthread_mutex_unlock(&f->mu);
  Rlorch__V1__RolloutResult res = RLORCH__V1__ROLLOUT_RESULT__INIT;
  res.request_id = j->request_id;
  res.rollouts = made ? rp : NULL;
  res.n_rollouts = made;
  Rlorch__V1__ReportRequest r = RLORCH__V1__REPORT_REQUEST__INIT;
  r.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_ROLLOUTS;
  r.rollouts = &res;
  dispatch__report(f, &r);
  free(ro);
  free(rp);
}

static void *dispatch__slot_main(void *arg) {
  dispatch__fake *f = arg;
  pthread_mutex_lock(&f->mu);
  for (;;) {
    while (!f->head && !f->quit) pthread_cond_wait(&f->cond, &f->mu);
    if (f->quit) break;
    dispatch__job *j = f->head;
    f->head = j->next;
    if (!f->head) f->tail = NULL;
    pthread_mutex_unlock(&f->mu);
    dispatch__serve(f, j);
    free(j);
    pthread_mutex_lock(&f->mu);
  }
  pthread_mutex_unlock(&f->mu);
  return NULL;
}

static int dispatch__on_command(ProtobufCMessage *m, void *ud) {
  dispatch__fake *f = ud;
  const Rlorch__V1__Command *c = (const Rlorch__V1__Command *)m;
  Rlorch__V1__ReportRequest r = RLORCH__V1__REPORT_REQUEST__INIT;
  switch (c->kind_case) {
  case RLORCH__V1__COMMAND__KIND_ROLLOUT: {
    /* Queued, not served here: the stream must stay free for plans. */
    dispatch__job *j = calloc(1, sizeof *j);
    if (!j) break;
    j->request_id = c->rollout->request_id;
    j->count = c->rollout->count;
    j->group_id = c->rollout->group_id;
    pthread_mutex_lock(&f->mu);
    if (f->tail) f->tail->next = j;
    else f->head = j;
    f->tail = j;
    pthread_cond_signal(&f->cond);
    pthread_mutex_unlock(&f->mu);
    break;
  }
  case RLORCH__V1__COMMAND__KIND_TRAIN: {
    dispatch__sleep(f->cfg->train_ms / 1000.0);
    Rlorch__V1__StepDone sd = RLORCH__V1__STEP_DONE__INIT;
    sd.step = c->train->step;
    sd.train_seconds = f->cfg->train_ms / 1000.0;
    r.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_STEP_DONE;
    r.step_done = &sd;
    dispatch__report(f, &r);
    break;
  }
  case RLORCH__V1__COMMAND__KIND_PLAN:
    f->pending_version = c->plan->policy_version;
    bench_fake_ack(f->client, f->reports, f->id, c->plan);
    break;
  case RLORCH__V1__COMMAND__KIND_TRIGGER:
    atomic_store(&f->version, f->pending_version);
    bench_fake_done(f->client, f->reports, f->id, c->trigger);
    break;
  default: break;
  }
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}

static void *dispatch__fake_main(void *arg) {
  dispatch__fake *f = arg;
  bench_fake_attach(f->client, f->id, dispatch__on_command, f);
  return NULL;
}

static int dispatch__register(dispatch__fake *f) {
  return bench_fake_register(f->client, f->trainer, f->index, f->id, sizeof f->id,
                             "rlorch bench dispatch");
}

typedef struct dispatch__round {
  uint32_t async;
  uint64_t steps, used, dropped, generated;
  double wall_s, busy_s, step_s; /* step_s: summed TRAIN -> broadcast done */
  int ok;
} dispatch__round;

typedef struct dispatch__watch {
  dispatch__round *r;
  int done;
} dispatch__watch;

static int dispatch__on_event(ProtobufCMessage *m, void *ud) {
  dispatch__watch *w = ud;
  const Rlorch__V1__RunEvent *e = (const Rlorch__V1__RunEvent *)m;
  if (e->event_case == RLORCH__V1__RUN_EVENT__EVENT_STEP) {
    w->r->steps++;
    w->r->used += e->step->rollouts_used;
    w->r->dropped += e->step->rollouts_dropped;
    w->r->step_s += e->step->step_seconds;
  } else if (e->event_case == RLORCH__V1__RUN_EVENT__EVENT_RUN &&
             (e->run->state == RLORCH__V1__RUN_STATE__RUN_STATE_SUCCEEDED ||
              e->run->state == RLORCH__V1__RUN_STATE__RUN_STATE_FAILED ||
              e->run->state == RLORCH__V1__RUN_STATE__RUN_STATE_STOPPED)) {
    w->done = 1;
    w->r->ok = e->run->state == RLORCH__V1__RUN_STATE__RUN_STATE_SUCCEEDED;
    if (!w->r->ok) fprintf(stderr, "rlorch bench dispatch: run ended: %s\n", e->run->message);
  }
  protobuf_c_message_free_unpacked(m, NULL);
  return w->done;
}

static void dispatch__stop_slots(dispatch__fake *f) {
  pthread_mutex_lock(&f->mu);
  f->quit = 1;
  pthread_cond_broadcast(&f->cond);
  pthread_mutex_unlock(&f->mu);
  for (uint32_t i = 0; i < f->nslots; i++) pthread_join(f->slot_th[i], NULL);
  while (f->head) {
    dispatch__job *j = f->head;
    f->head = j->next;
    free(j);
  }
  free(f->slot_th);
  pthread_cond_destroy(&f->cond);
  pthread_mutex_destroy(&f->mu);
}

static dispatch__round dispatch__run(const dispatch__cfg *cfg, const char *target, uint32_t async) {
  dispatch__round res = {.async = async};
  uint32_t n = cfg->workers + 1;
  dispatch__fake *fakes = calloc(n, sizeof *fakes);
  rpc_client *wc = NULL, *cc = NULL;
  rpc_client_opts o = {.target = target};
  char err[256];
  uint32_t ready = 0;
  if (!fakes || rpc_client_new(&o, &wc, err, sizeof err) || rpc_client_new(&o, &cc, err, sizeof err))
    goto out;
  for (; ready < n; ready++) {
    dispatch__fake *f = &fakes[ready];
    f->cfg = cfg;
    f->client = wc;
    f->trainer = ready == 0;
    f->index = ready;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cond, NULL);
    if (!f->trainer) {
      f->slot_th = calloc(cfg->slots, sizeof *f->slot_th);
      for (; f->slot_th && f->nslots < cfg->slots; f->nslots++)
        if (pthread_create(&f->slot_th[f->nslots], NULL, dispatch__slot_main, f) != 0) break;
    }
    if (dispatch__register(f) != 0 ||
        !(f->reports = bench_fake_report_stream(wc, "rlorch bench dispatch"))) {
      ready++; /* its slots are running: stop them too */
      goto stop;
    }
    f->th_started = pthread_create(&f->th, NULL, dispatch__fake_main, f) == 0;
  }
  Rlorch__V1__RunSpec spec = RLORCH__V1__RUN_SPEC__INIT;
  spec.name = "bench-dispatch";
  spec.steps = cfg->steps;
  spec.rollouts_per_step = cfg->rollouts_per_step;
  spec.async_bound_case = RLORCH__V1__RUN_SPEC__ASYNC_BOUND_MAX_ASYNC_LEVEL; /* 0 is a value */
  spec.max_async_level = async;
  spec.max_requests_per_worker = cfg->slots;
  spec.group_size = cfg->group_size;
  spec.policy = RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_HOST;
  ProtobufCMessage *resp = NULL;
  rpc_status st;
  double t0 = bench_now();
  if (rpc_client_call(cc, "/rlorch.v1.Control/StartRun", &spec.base, &rlorch__v1__run__descriptor,
                      10, &resp, &st) != GRPC_STATUS_OK) {
    fprintf(stderr, "rlorch bench dispatch: StartRun: %s\n", st.message);
    goto stop;
  }
  Rlorch__V1__WatchRunRequest wr = RLORCH__V1__WATCH_RUN_REQUEST__INIT;
  wr.run_id = ((Rlorch__V1__Run *)resp)->id;
  wr.from_step = -1;
  dispatch__watch w = {.r = &res};
  rpc_client_stream(cc, "/rlorch.v1.Control/WatchRun", &wr.base,
                    &rlorch__v1__run_event__descriptor, 300, dispatch__on_event, &w, &st);
  protobuf_c_message_free_unpacked(resp, NULL);
  res.wall_s = bench_now() - t0;
stop:
  rpc_client_cancel_streams(wc);
  for (uint32_t i = 0; i < ready; i++) {
    if (fakes[i].th_started) pthread_join(fakes[i].th, NULL);
    dispatch__stop_slots(&fakes[i]);
    rpc_oneway_free(fakes[i].reports, 0);
    res.busy_s += fakes[i].busy_s;
    res.generated += fakes[i].generated;
  }
out:
  if (wc) rpc_client_free(wc);
  if (cc) rpc_client_free(cc);
  free(fakes);
  return res;
}

/* The utilisation the batches allow, against the fastest run they permit
 * given the step time t measured in the same run (train and broadcast). A
 * batch is R rollouts in groups of G; a slot generates a group one
 * completion after another, L each, and there are C slots. On-policy (async
 * 0) every step waits for its own batch, g = ceil(R / (G C)) * G L:
 * steps * (g + t). With async >= 1 later batches are generated while a step
 * runs, so after the first batch a step takes the longer of t and the slot
 * time a batch needs, w = R L / C: g + (steps - 1) * max(w, t) + t. A ratio
 * under 1 then means the off-policy window, not the slots, held generation
 * back (few groups of long latency at a low async level). */
static double dispatch__ideal_util(const dispatch__cfg *cfg, const dispatch__round *r) {
  if (!r->steps) return 0;
  double slots = (double)cfg->workers * cfg->slots, lat = cfg->latency_ms / 1000.0;
  double gs = cfg->group_size;
  double g = ceil((double)cfg->rollouts_per_step / (gs * slots)) * gs * lat;
  double t = r->step_s / (double)r->steps, steps = (double)r->steps;
  double w = (double)cfg->rollouts_per_step * lat / slots;
  double wall = r->async == 0 ? steps * (g + t) : g + (steps - 1) * (w > t ? w : t) + t;
  return wall > 0 ? steps * cfg->rollouts_per_step * lat / (slots * wall) : 0;
}

static double dispatch__util(const dispatch__cfg *cfg, const dispatch__round *r) {
  double cap = (double)cfg->workers * cfg->slots * r->wall_s;
  return cap > 0 ? r->busy_s / cap : 0;
}

static double dispatch__drop_rate(const dispatch__round *r) {
  return r->generated ? (double)r->dropped / (double)r->generated : 0;
}

static pid_t dispatch__start_serve(const char *exe, const char *addr, const char *maddr,
                                   const char *dir) {
  char *argv[] = {(char *)exe, "serve", "--listen", (char *)addr, "--metrics-listen",
                  (char *)maddr, "--data-dir", (char *)dir, "--log-level", "error", NULL};
  /* Quiet: every round ends with its workers' streams closing, each a warning.
   * The fake workers send no heartbeats: a long window keeps them alive. */
  setenv("RLORCH_WORKER_TIMEOUT_MS", "120000", 1);
  setenv("RLORCH_HEARTBEAT_INTERVAL_MS", "10000", 1);
  pid_t pid;
  if (posix_spawn(&pid, exe, NULL, NULL, argv, environ) != 0) return -1;
  return pid;
}

#define BDO(m, ctype) OPT_OFF(dispatch__cfg, m, ctype)
static const opt_field dispatch__fields[] = {
    {.name = "steps", .flag = "--steps", .type = OPT_U32, .off = BDO(steps, uint32_t), .min = 1,
     .max = 100000, .metavar = "N", .help = "steps per run"},
    {.name = "rollouts_per_step", .flag = "--rollouts-per-step", .type = OPT_U32,
     .off = BDO(rollouts_per_step, uint32_t), .min = 1, .max = 65536, .metavar = "N",
     .help = "rollouts in a training batch"},
    {.name = "inference_workers", .flag = "--inference-workers", .type = OPT_U32,
     .off = BDO(workers, uint32_t), .min = 1, .max = 64, .metavar = "N",
     .help = "inference workers"},
    {.name = "max_requests_per_worker", .flag = "--max-requests-per-worker", .type = OPT_U32,
     .off = BDO(slots, uint32_t), .min = 1, .max = 1024, .metavar = "N",
     .help = "requests each worker generates at once"},
    {.name = "group_size", .flag = "--group-size", .type = OPT_U32,
     .off = BDO(group_size, uint32_t), .min = 1, .max = 4096, .metavar = "N",
     .help = "completions per prompt: one request (rollouts-per-step is a multiple)"},
    {.name = "latency_ms", .flag = "--latency-ms", .type = OPT_DOUBLE,
     .off = BDO(latency_ms, double), .min = 0, .max = 60000, .metavar = "MS",
     .help = "generation time of one rollout"},
    {.name = "train_ms", .flag = "--train-ms", .type = OPT_DOUBLE, .off = BDO(train_ms, double),
     .min = 0, .max = 60000, .metavar = "MS", .help = "trainer time per step"},
    {.name = "json", .flag = "--json", .type = OPT_SWITCH, .off = BDO(json, bool),
     .help = "one JSON object instead of a table"},
};

static const opt_cmd dispatch__cmd = {
    .name = "bench dispatch",
    .about = "Stale drops and inference utilisation at async levels 0..3: a real `rlorch serve`\n"
             "driven by in-process workers with a fixed rollout latency and train time.",
    .fields = dispatch__fields,
    .nfields = sizeof dispatch__fields / sizeof dispatch__fields[0],
};

int bench_dispatch(int argc, char **argv) {
  const dispatch__cfg defaults = {.steps = 20, .rollouts_per_step = 32, .workers = 2,
                                  .slots = 8, .group_size = 4, .latency_ms = 20, .train_ms = 40};
  dispatch__cfg cfg = defaults;
  opt_state st;
  int parsed = opt_parse_main(&dispatch__cmd, &cfg, &defaults, argc, argv, environ, &st);
  if (parsed >= 0) return parsed;
  char exe[PATH_MAX];
  if (proc_self_exe(exe, sizeof exe) != 0) return 1;
  const char *tmp = getenv("TMPDIR");
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/rlorch-dispatch-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    fprintf(stderr, "rlorch bench dispatch: cannot create %s: %s\n", dir, strerror(errno));
    return 1;
  }
  char addr[64], maddr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", proc_free_port());
  snprintf(maddr, sizeof maddr, "127.0.0.1:%d", proc_free_port());
  pid_t serve = dispatch__start_serve(exe, addr, maddr, dir);
  if (serve < 0) return 1;
  int rc = 0;
  dispatch__round r[DISPATCH__LEVELS];
  memset(r, 0, sizeof r);
  if (proc_wait_serving(addr, 20.0, NULL, NULL) != 0) {
    fprintf(stderr, "rlorch bench dispatch: orchestrator did not come up\n");
    rc = 1;
  }
  for (uint32_t a = 0; rc == 0 && a < DISPATCH__LEVELS; a++) {
    r[a] = dispatch__run(&cfg, addr, a);
    if (!r[a].ok) rc = 1;
  }
  kill(serve, SIGTERM);
  waitpid(serve, NULL, 0);
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "rlorch bench dispatch: could not remove %s\n", dir);
  if (rc) return rc;

  if (cfg.json) {
    printf("{\"rounds\":[");
    for (int a = 0; a < DISPATCH__LEVELS; a++) {
      double u = dispatch__util(&cfg, &r[a]), ui = dispatch__ideal_util(&cfg, &r[a]);
      printf("%s{\"max_async_level\":%u,\"steps\":%" PRIu64 ",\"generated\":%" PRIu64
             ",\"used\":%" PRIu64 ",\"dropped_stale\":%" PRIu64 ",\"drop_rate\":%.4f,"
             "\"utilisation\":%.3f,\"ideal_utilisation\":%.3f,\"ratio\":%.3f,\"wall_s\":%.3f}",
             a ? "," : "", r[a].async, r[a].steps, r[a].generated, r[a].used, r[a].dropped,
             dispatch__drop_rate(&r[a]), u, ui, ui > 0 ? u / ui : 0, r[a].wall_s);
    }
    printf("]}\n");
    return 0;
  }
  printf("dispatch: %u steps x %u rollouts in groups of %u, %u inference workers x %u requests\n"
         "at once, %.0f ms per rollout, %.0f ms training per step, loopback\n",
         cfg.steps, cfg.rollouts_per_step, cfg.group_size, cfg.workers, cfg.slots, cfg.latency_ms,
         cfg.train_ms);
  printf("ideal: 0 stale drops; utilisation the batches allow at the measured step time\n\n");
  printf("%5s %9s %6s %8s %7s %7s %8s %8s %7s %13s\n", "async", "generated", "used", "dropped",
         "drop%", "ideal%", "util", "ideal", "ratio", "wall_ms/step");
  for (int a = 0; a < DISPATCH__LEVELS; a++) {
    double u = dispatch__util(&cfg, &r[a]), ui = dispatch__ideal_util(&cfg, &r[a]);
    printf("%5u %9" PRIu64 " %6" PRIu64 " %8" PRIu64 " %7.2f %7.2f %8.3f %8.3f %7.2f %13.1f\n",
           r[a].async, r[a].generated, r[a].used, r[a].dropped, 100 * dispatch__drop_rate(&r[a]),
           0.0, u, ui, ui > 0 ? u / ui : 0,
           r[a].steps ? r[a].wall_s * 1e3 / (double)r[a].steps : 0);
  }
  printf("\ndrop%%: rollouts dropped as stale / generated; util: generation time / (slots x\n"
         "wall time); ideal: what the batches allow with generation overlapping the step in\n"
         "progress (async >= 1) or not (async 0); ratio: util / ideal; wall_ms/step: StartRun\n"
         "to the run's end, per step.\n");
  return 0;
}
