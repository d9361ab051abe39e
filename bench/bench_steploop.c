/* `rlorch bench steploop`: what the orchestrator itself costs per step and per
 * rollout. A real `rlorch serve` child drives zero-cost workers (threads here:
 * no weights, no sleeps; every command is answered at once) through whole
 * steps: rollouts, batch, train, plan, ack barrier, trigger, commit. The
 * orchestrator's CPU time (from /proc) per step and per rollout is printed
 * beside a bare RPC round trip to the same server, measured in the same run. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/bench_fake.h"
#include "orchestrator/common/opt.h"
#include "grpc/health/v1/health.pb-c.h"
#include "orchestrator/cli/proc.h"
#include "orchestrator/cli/rtt.h"
#include "orchestrator/daemon/workers.h"
#include "rlorch/v1/control.pb-c.h"
#include "rlorch/v1/worker.pb-c.h"
#include "rpc/rpc.h"

extern char **environ;

#define BENCH_STEPLOOP_MAX_WORKERS 10000 /* fake threads, the trainer's aside */
/* A fake's thread only waits in gRPC and answers: a small stack keeps
 * 10,000 of them (2.5 GiB of address space instead of 80 at glibc's 8 MiB
 * default) within what one machine maps. */
#define BENCH_STEPLOOP_STACK_BYTES (256u << 10)
/* The child daemon holds every round at once (see bench_steploop). */
_Static_assert(1 + 8 + 64 + 256 + 1024 + BENCH_STEPLOOP_MAX_WORKERS + 6 <= WORKERS_MAX,
               "the steploop child's max_workers is within the daemon's cap");

typedef struct fake {
  rpc_client *client;
  rpc_oneway *reports; /* the step's reports that need no answer; NULL: Report calls */
  int trainer;
  uint32_t index;
  char id[32];
  uint64_t version, pending_version, counter;
  pthread_t th;
} fake;

/* utime + stime of a process, in seconds. */
static double cpu_seconds(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  if (!p) return 0;
  unsigned long ut = 0, st = 0;
  /* Fields after the command name: state is 3; utime 14, stime 15. */
  if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
    return 0;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int report(fake *f, Rlorch__V1__ReportRequest *r) {
  return bench_fake_report(f->client, f->id, r);
}

static int on_command(ProtobufCMessage *m, void *ud) {
  fake *f = ud;
  const Rlorch__V1__Command *c = (const Rlorch__V1__Command *)m;
  Rlorch__V1__ReportRequest r = RLORCH__V1__REPORT_REQUEST__INIT;
  switch (c->kind_case) {
  case RLORCH__V1__COMMAND__KIND_ROLLOUT: {
    Rlorch__V1__RolloutResult res = RLORCH__V1__ROLLOUT_RESULT__INIT;
    uint32_t n = c->rollout->count;
    Rlorch__V1__Rollout *ro = calloc(n ? n : 1, sizeof *ro);
    Rlorch__V1__Rollout **rp = calloc(n ? n : 1, sizeof *rp);
    for (uint32_t i = 0; i < n && ro && rp; i++) {
      rlorch__v1__rollout__init(&ro[i]);
      ro[i].id = ((uint64_t)(f->index + 1) << 40) | ++f->counter;
      ro[i].policy_version = f->version;
      ro[i].tokens = 1;
      ro[i].group_id = c->rollout->group_id; /* a result answers its request's group */
      rp[i] = &ro[i];
    }
    res.request_id = c->rollout->request_id;
    res.rollouts = rp;
    res.n_rollouts = ro && rp ? n : 0;
    r.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_ROLLOUTS;
    r.rollouts = &res;
    report(f, &r);
    free(ro);
    free(rp);
    break;
  }
  case RLORCH__V1__COMMAND__KIND_TRAIN: {
    Rlorch__V1__StepDone sd = RLORCH__V1__STEP_DONE__INIT;
    sd.step = c->train->step;
    r.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_STEP_DONE;
    r.step_done = &sd;
    report(f, &r);
    break;
  }
  case RLORCH__V1__COMMAND__KIND_PLAN:
    f->pending_version = c->plan->policy_version;
    bench_fake_ack(f->client, f->reports, f->id, c->plan);
    break;
  case RLORCH__V1__COMMAND__KIND_TRIGGER:
    f->version = f->pending_version;
    bench_fake_done(f->client, f->reports, f->id, c->trigger);
    break;
  default: break;
  }
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}

static void *fake_thread(void *arg) {
  fake *f = arg;
  bench_fake_attach(f->client, f->id, on_command, f);
  return NULL;
}

static int fake_register(fake *f) {
  return bench_fake_register(f->client, f->trainer, f->index, f->id, sizeof f->id,
                             "rlorch bench steploop");
}

typedef struct round_result {
  uint64_t steps, rollouts;
  double wall_s, cpu_s;
  uint32_t workers;
  int ok;
} round_result;

typedef struct watch_ctx {
  uint64_t steps, rollouts;
  int done, ok;
} watch_ctx;

static int on_event(ProtobufCMessage *m, void *ud) {
  watch_ctx *w = ud;
  const Rlorch__V1__RunEvent *e = (const Rlorch__V1__RunEvent *)m;
  if (e->event_case == RLORCH__V1__RUN_EVENT__EVENT_STEP) {
    w->steps++;
    w->rollouts += e->step->rollouts_used;
  } else if (e->event_case == RLORCH__V1__RUN_EVENT__EVENT_RUN &&
             (e->run->state == RLORCH__V1__RUN_STATE__RUN_STATE_SUCCEEDED ||
              e->run->state == RLORCH__V1__RUN_STATE__RUN_STATE_FAILED ||
              e->run->state == RLORCH__V1__RUN_STATE__RUN_STATE_STOPPED)) {
    w->done = 1;
    w->ok = e->run->state == RLORCH__V1__RUN_STATE__RUN_STATE_SUCCEEDED;
    if (!w->ok) fprintf(stderr, "bench steploop: run ended: %s\n", e->run->message);
  }
  protobuf_c_message_free_unpacked(m, NULL);
  return w->done;
}

static round_result run_round(const char *target, pid_t serve, uint32_t nworkers, uint32_t steps,
                              uint32_t per_step, int unary) {
  round_result res = {.workers = nworkers};
  fake *fakes = calloc(nworkers + 1, sizeof *fakes);
  rpc_client *wc = NULL, *cc = NULL;
  rpc_client_opts o = {.target = target};
  char err[256];
  pthread_attr_t attr;
  int attr_ok = 0;
  if (!fakes || rpc_client_new(&o, &wc, err, sizeof err) || rpc_client_new(&o, &cc, err, sizeof err))
    goto out;
  int prc = pthread_attr_init(&attr);
  if (prc == 0) {
    attr_ok = 1;
    prc = pthread_attr_setstacksize(&attr, BENCH_STEPLOOP_STACK_BYTES);
  }
  if (prc != 0) {
    fprintf(stderr, "bench steploop: cannot set a %u KiB thread stack: %s\n",
            BENCH_STEPLOOP_STACK_BYTES >> 10, strerror(prc));
    goto stop;
  }
  for (uint32_t i = 0; i <= nworkers; i++) {
    fakes[i].client = wc;
    fakes[i].trainer = i == 0;
    fakes[i].index = i;
    if (fake_register(&fakes[i]) != 0) goto stop;
    if (!unary && !(fakes[i].reports = bench_fake_report_stream(wc, "rlorch bench steploop")))
      goto stop;
    if ((prc = pthread_create(&fakes[i].th, &attr, fake_thread, &fakes[i])) != 0) {
      fprintf(stderr, "bench steploop: cannot start fake worker %u: %s\n", i, strerror(prc));
      fakes[i].th = 0;
      goto stop;
    }
  }
  Rlorch__V1__RunSpec spec = RLORCH__V1__RUN_SPEC__INIT;
  spec.name = "bench-steploop";
  spec.steps = steps;
  spec.rollouts_per_step = per_step;
  spec.async_bound_case = RLORCH__V1__RUN_SPEC__ASYNC_BOUND_MAX_ASYNC_LEVEL; /* 0 is a value */
  spec.max_async_level = 1;
  spec.policy = RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_HOST;
  ProtobufCMessage *resp = NULL;
  rpc_status st;
  double cpu0 = cpu_seconds(serve), t0 = bench_now();
  if (rpc_client_call(cc, "/rlorch.v1.Control/StartRun", &spec.base, &rlorch__v1__run__descriptor,
                      10, &resp, &st) != GRPC_STATUS_OK) {
    fprintf(stderr, "bench steploop: StartRun: %s\n", st.message);
    goto stop;
  }
  Rlorch__V1__WatchRunRequest wr = RLORCH__V1__WATCH_RUN_REQUEST__INIT;
  wr.run_id = ((Rlorch__V1__Run *)resp)->id;
  wr.from_step = -1;
  watch_ctx w = {0};
  rpc_client_stream(cc, "/rlorch.v1.Control/WatchRun", &wr.base,
                    &rlorch__v1__run_event__descriptor, 300, on_event, &w, &st);
  protobuf_c_message_free_unpacked(resp, NULL);
  res.wall_s = bench_now() - t0;
  res.cpu_s = cpu_seconds(serve) - cpu0;
  res.steps = w.steps;
  res.rollouts = w.rollouts;
  res.ok = w.ok;
stop:
  if (attr_ok) pthread_attr_destroy(&attr);
  rpc_client_cancel_streams(wc);
  for (uint32_t i = 0; i <= nworkers; i++) {
    if (fakes[i].th) pthread_join(fakes[i].th, NULL);
    rpc_oneway_free(fakes[i].reports, 0);
  }
out:
  if (wc) rpc_client_free(wc);
  if (cc) rpc_client_free(cc);
  free(fakes);
  return res;
}

/* Orchestrator CPU per step and per worker (the trainer included), in bare
 * round trips. */
static double per_worker(const round_result *r, double rtt) {
  if (!r->steps || rtt <= 0) return 0;
  return r->cpu_s / (double)r->steps / rtt / (double)(r->workers + 1);
}

static pid_t start_serve(const char *exe, const char *addr, const char *maddr, const char *dir,
                         uint32_t max_workers) {
  char *argv[] = {(char *)exe, "serve", "--listen", (char *)addr, "--metrics-listen",
                  (char *)maddr, "--data-dir", (char *)dir, "--log-level", "warn", NULL};
  /* Zero-cost workers answer at once; a long heartbeat window keeps a
   * thousand threads on 2 cores from being declared lost while they wait for
   * CPU. */
  setenv("RLORCH_WORKER_TIMEOUT_MS", "120000", 1);
  setenv("RLORCH_HEARTBEAT_INTERVAL_MS", "10000", 1);
  char mw[16];
  snprintf(mw, sizeof mw, "%u", max_workers);
  setenv("RLORCH_MAX_WORKERS", mw, 1);
  pid_t pid;
  if (posix_spawn(&pid, exe, NULL, NULL, argv, environ) != 0) return -1;
  return pid;
}

typedef struct bench_steploop_opts {
  uint32_t steps, rollouts_per_step, max_workers;
  bool json, unary_reports;
} bench_steploop_opts;

#define BSO(m, ctype) OPT_OFF(bench_steploop_opts, m, ctype)
static const opt_field bench_steploop__fields[] = {
    {.name = "steps", .flag = "--steps", .type = OPT_U32, .off = BSO(steps, uint32_t), .min = 1,
     .max = 1000000, .metavar = "N", .help = "steps per round"},
    {.name = "rollouts_per_step", .flag = "--rollouts-per-step", .type = OPT_U32,
     .off = BSO(rollouts_per_step, uint32_t), .min = 1, .max = 65536, .metavar = "N",
     .help = "rollouts in a training batch"},
    {.name = "max_workers", .flag = "--max-workers", .type = OPT_U32,
     .off = BSO(max_workers, uint32_t), .min = 1, .max = BENCH_STEPLOOP_MAX_WORKERS,
     .env = "RLORCH_BENCH_MAX_WORKERS", /* not the daemon's max_workers, which its child reads */
     .metavar = "N",
     .help = "inference workers of the last round (1..10000); those of 1, 8, 64, 256, 1024 "
             "below it first"},
    {.name = "unary_reports", .flag = "--unary-reports", .type = OPT_SWITCH,
     .off = BSO(unary_reports, bool),
     .help = "acks and broadcast reports as Report calls, not on each worker's ReportStream"},
    {.name = "json", .flag = "--json", .type = OPT_SWITCH, .off = BSO(json, bool),
     .help = "one JSON object instead of a table"},
};

static const opt_cmd bench_steploop__cmd = {
    .name = "bench steploop",
    .about = "Orchestration overhead per step and per rollout: a real `rlorch serve` driven by\n"
             "zero-cost in-process workers.",
    .fields = bench_steploop__fields,
    .nfields = sizeof bench_steploop__fields / sizeof bench_steploop__fields[0],
};

int bench_steploop(int argc, char **argv) {
  const bench_steploop_opts defaults = {.steps = 50, .rollouts_per_step = 16, .max_workers = 256};
  bench_steploop_opts o = defaults;
  opt_state st;
  int parsed = opt_parse_main(&bench_steploop__cmd, &o, &defaults, argc, argv, environ, &st);
  if (parsed >= 0) return parsed;
  uint32_t steps = o.steps, per_step = o.rollouts_per_step;
  int json = o.json;
  char exe[PATH_MAX];
  if (proc_self_exe(exe, sizeof exe) != 0) return 1;
  const char *tmp = getenv("TMPDIR");
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/rlorch-steploop-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    fprintf(stderr, "rlorch bench steploop: cannot create %s: %s\n", dir, strerror(errno));
    return 1;
  }
  char addr[64], maddr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", proc_free_port());
  snprintf(maddr, sizeof maddr, "127.0.0.1:%d", proc_free_port());
  /* Each round multiplies the workers, so that the cost per worker shows
   * its trend; the last is --max-workers. */
  static const uint32_t below[] = {1, 8, 64, 256, 1024};
  uint32_t counts[sizeof below / sizeof below[0] + 1];
  int nrounds = 0;
  for (size_t i = 0; i < sizeof below / sizeof below[0]; i++)
    if (below[i] < o.max_workers) counts[nrounds++] = below[i];
  counts[nrounds++] = o.max_workers;
  /* The child's max_workers holds every round's workers and trainer at once:
   * a round's fakes are lost when their streams close, but the daemon may
   * not have seen all of them close when the next round registers. At
   * --max-workers 10000 that is 11,359, under the daemon's cap of 16,384. */
  uint32_t child_max = 0;
  for (int i = 0; i < nrounds; i++) child_max += counts[i] + 1;
  pid_t serve = start_serve(exe, addr, maddr, dir, child_max);
  if (serve < 0) return 1;
  if (proc_wait_serving(addr, 20.0, NULL, NULL) != 0) {
    fprintf(stderr, "rlorch bench steploop: orchestrator did not come up\n");
    kill(serve, SIGTERM);
    waitpid(serve, NULL, 0);
    return 1;
  }
  double rtt = rtt_health_check(addr, 3000);
  round_result rr[sizeof counts / sizeof counts[0]];
  int rc = 0;
  for (int i = 0; i < nrounds; i++) {
    rr[i] = run_round(addr, serve, counts[i], steps, per_step, o.unary_reports);
    if (!rr[i].ok) rc = 1;
  }
  kill(serve, SIGTERM);
  int status = 0;
  waitpid(serve, &status, 0);
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "rlorch bench steploop: could not remove %s\n", dir);

  if (json) {
    printf("{\"bare_rpc_rtt_us\":%.1f,\"reports\":\"%s\",\"rounds\":[", rtt * 1e6,
           o.unary_reports ? "unary" : "stream");
    for (int i = 0; i < nrounds; i++)
      printf("%s{\"inference_workers\":%u,\"steps\":%" PRIu64 ",\"rollouts\":%" PRIu64
             ",\"cpu_us_per_step\":%.1f,\"x_rtt_per_worker\":%.3f,\"cpu_us_per_rollout\":%.2f,"
             "\"wall_ms_per_step\":%.3f,\"ok\":%s}",
             i ? "," : "", rr[i].workers, rr[i].steps, rr[i].rollouts,
             rr[i].steps ? rr[i].cpu_s * 1e6 / (double)rr[i].steps : 0, per_worker(&rr[i], rtt),
             rr[i].rollouts ? rr[i].cpu_s * 1e6 / (double)rr[i].rollouts : 0,
             rr[i].steps ? rr[i].wall_s * 1e3 / (double)rr[i].steps : 0, rr[i].ok ? "true" : "false");
    printf("]}\n");
    return rc;
  }
  printf("orchestration overhead: %u steps x %u rollouts per step, zero-cost workers, loopback;\n"
         "acks and broadcast reports %s\n",
         steps, per_step, o.unary_reports ? "as Report calls" : "on each worker's ReportStream");
  printf("baseline: bare RPC round trip (unary health Check, same server, least p50 of 3 x 1000): %.1f us\n\n",
         rtt * 1e6);
  printf("%9s %6s %9s %14s %10s %14s %17s %16s\n", "inference", "steps", "rollouts", "cpu_us/step",
         "x_rtt", "x_rtt/worker", "cpu_us/rollout", "wall_ms/step");
  for (int i = 0; i < nrounds; i++) {
    double ps = rr[i].steps ? rr[i].cpu_s * 1e6 / (double)rr[i].steps : 0;
    printf("%9u %6" PRIu64 " %9" PRIu64 " %14.1f %10.2f %14.3f %17.2f %16.3f%s\n", rr[i].workers,
           rr[i].steps, rr[i].rollouts, ps, rtt > 0 ? ps / (rtt * 1e6) : 0, per_worker(&rr[i], rtt),
           rr[i].rollouts ? rr[i].cpu_s * 1e6 / (double)rr[i].rollouts : 0,
           rr[i].steps ? rr[i].wall_s * 1e3 / (double)rr[i].steps : 0,
           rr[i].ok ? "" : "  (run did not succeed)");
  }
  printf("\ncpu_us: orchestrator process CPU time (user + system, from /proc, 10 ms ticks);\n"
         "x_rtt: orchestrator CPU per step in units of the bare RPC round trip;\n"
         "x_rtt/worker: the same per worker of the step (the inference workers and the trainer).\n");
  return rc;
}
