/* `rlorch run`: the whole loop on one machine. Starts `rlorch serve`, one
 * trainer and N inference workers as child processes on loopback, starts a
 * run, prints one line per step from WatchRun, ends with a summary, and stops
 * every process cleanly (also on Ctrl-C). */
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/ctl_format.h"
#include "orchestrator/cli/proc.h"
#include "orchestrator/common/log.h"
#include "orchestrator/common/opt.h"
#include "orchestrator/common/pbjson.h"
#include "rlorch/v1/control.pb-c.h"
#include "rpc/rpc.h"
#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_preset.h"

extern char **environ;

#define MAX_CHILDREN 66
#define MAX_INFERENCE 64

typedef struct child {
  pid_t pid;
  char name[32];
  int exited, status;
} child;

typedef struct run_opts {
  uint32_t steps, inference, max_async, rollouts_per_step, max_requests, layers, group_size;
  char *preset, *listen, *metrics_listen, *data_dir, *prompts; /* owned: opt_free */
  int offload, bf16_shadow, policy, log_level;
  bool json;
} run_opts;

static const opt_name run__offloads[] = {
    {"none", RLORCH__V1__OFFLOAD__OFFLOAD_NONE},
    {"params", RLORCH__V1__OFFLOAD__OFFLOAD_PARAMS},
    {"params+optimizer", RLORCH__V1__OFFLOAD__OFFLOAD_PARAMS_AND_OPTIMIZER},
    {NULL, 0}};
static const opt_name run__on_off[] = {{"on", 1}, {"off", 0}, {NULL, 0}};
static const opt_name run__modes[] = {
    {"auto", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_AUTO},
    {"direct", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_DIRECT},
    {"staged", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_STAGED},
    {"host", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_HOST},
    {"colocated", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_COLOCATED},
    {NULL, 0}};

#define RO(m, ctype) OPT_OFF(run_opts, m, ctype)
/* Names shared with serve, the agents and ctl start-run where the meaning is
 * the same; the children never see them (see child_env). */
static const opt_field run__fields[] = {
    {.name = "steps", .flag = "--steps", .type = OPT_U32, .off = RO(steps, uint32_t), .min = 1,
     .max = 1000000, .metavar = "N", .help = "steps of the run"},
    {.name = "preset", .flag = "--preset", .type = OPT_STR, .off = RO(preset, char *),
     .metavar = "P", .help = "model preset: 100m, 1b, 4b, 8b"},
    {.name = "inference_workers", .flag = "--inference-workers", .type = OPT_U32,
     .off = RO(inference, uint32_t), .min = 1, .max = MAX_INFERENCE, .metavar = "N",
     .help = "inference workers to start",
     .dflt = "2, or one per spare GPU when there are 2 or more GPUs"},
    {.name = "offload", .flag = "--offload", .type = OPT_ENUM, .off = RO(offload, int),
     .names = run__offloads, .metavar = "O", .help = "what the trainer keeps in host memory"},
    {.name = "bf16_shadow", .flag = "--bf16-shadow", .type = OPT_ENUM, .off = RO(bf16_shadow, int),
     .names = run__on_off, .metavar = "S",
     .help = "with --offload params+optimizer: the trainer sends a bf16 copy its CPU optimizer "
             "writes in its update pass"},
    {.name = "max_async_level", .flag = "--max-async-level", .type = OPT_U32,
     .off = RO(max_async, uint32_t), .min = 0, .max = 64, .metavar = "N",
     .help = "off-policy bound"},
    {.name = "policy", .flag = "--policy", .type = OPT_ENUM, .off = RO(policy, int),
     .names = run__modes, .metavar = "MODE", .help = "broadcast mode"},
    {.name = "rollouts_per_step", .flag = "--rollouts-per-step", .type = OPT_U32,
     .off = RO(rollouts_per_step, uint32_t), .min = 0, .max = 65536, .metavar = "N",
     .help = "rollouts in a training batch"},
    {.name = "max_requests_per_worker", .flag = "--max-requests-per-worker", .type = OPT_U32,
     .off = RO(max_requests, uint32_t), .min = 1, .max = 1024, .metavar = "N",
     .help = "rollout requests in flight on one inference worker"},
    {.name = "group_size", .flag = "--group-size", .type = OPT_U32, .off = RO(group_size, uint32_t),
     .min = 1, .max = 4096, .metavar = "N",
     .help = "completions per prompt (rollouts-per-step is a multiple)"},
    {.name = "prompts", .flag = "--prompts", .type = OPT_PATH, .off = RO(prompts, char *),
     .metavar = "FILE", .help = "JSONL prompts: {\"prompt_token_ids\": [...]} per line",
     .dflt = "synthetic prompts"},
    {.name = "listen", .flag = "--listen", .type = OPT_ADDR, .off = RO(listen, char *),
     .metavar = "ADDR", .help = "orchestrator's gRPC address; port 0 picks a free one"},
    {.name = "metrics_listen", .flag = "--metrics-listen", .type = OPT_ADDR,
     .off = RO(metrics_listen, char *), .metavar = "ADDR",
     .help = "orchestrator's HTTP address; port 0 picks a free one"},
    {.name = "data_dir", .flag = "--data-dir", .type = OPT_STR, .off = RO(data_dir, char *),
     .metavar = "DIR", .help = "SQLite database and the children's logs (DIR/logs)"},
    {.name = "layers", .flag = "--layers", .type = OPT_U32, .off = RO(layers, uint32_t), .min = 0,
     .max = 1024, .metavar = "N", .help = "keep only the first N decoder layers (quick runs)",
     .dflt = "0: all"},
    {.name = "log_level", .flag = "--log-level", .type = OPT_ENUM, .off = RO(log_level, int),
     .names = opt_log_level_names, .metavar = "LEVEL", .help = "log threshold of the children"},
    {.name = "json", .flag = "--json", .type = OPT_SWITCH, .off = RO(json, bool),
     .help = "print every run event as one JSON object per line"},
};

static const opt_cmd run__cmd = {
    .name = "run",
    .about = "Starts the orchestrator, 1 trainer and N inference workers on this machine,\n"
             "runs N steps and prints one line per step, then a summary.",
    .fields = run__fields,
    .nfields = sizeof run__fields / sizeof run__fields[0],
    .footer = "The children (serve, trainer, inference) get every setting as a flag and an\n"
              "environment without RLORCH_* variables, so a variable meant for one of them\n"
              "cannot change another. Their logs are in DIR/logs.\n",
};

typedef struct run_ctx {
  run_opts o;
  char **child_env; /* environ without RLORCH_* (pointers into environ) */
  char exe[PATH_MAX];
  char grpc_addr[128], metrics_addr[128], log_dir[PATH_MAX];
  child kids[MAX_CHILDREN];
  size_t nkids;
  pthread_mutex_t mu;
  int interrupted;   /* Ctrl-C or SIGTERM */
  char child_failed[160];
  rpc_client *client;
  char run_id[64];
  int ndevices; /* CUDA devices usable with NCCL here */
  int colocate; /* fewer of those than processes, but a GPU: every worker on GPU 0 */
  int inference_set;
  Rlorch__V1__StepRecord **steps;
  size_t nsteps, capsteps;
  Rlorch__V1__RunState final_state;
  char final_message[256];
  int header_done;
} run_ctx;

static void run__defaults(run_opts *o) {
  *o = (run_opts){.steps = 5, .inference = 2, .max_async = 1, .rollouts_per_step = 8,
                  .max_requests = 8, .group_size = 4,
                  .preset = "100m", .offload = RLORCH__V1__OFFLOAD__OFFLOAD_PARAMS,
                  .bf16_shadow = 1,
                  .policy = RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_AUTO,
                  .listen = "127.0.0.1:0", .metrics_listen = "127.0.0.1:0",
                  .data_dir = "rlorch-run", .log_level = LOG_INFO};
}

/* The children's environment: ours without any RLORCH_* variable. run reads
 * those for itself and hands each child its settings as flags; a variable
 * left in place would reach every child, and one meant for a single role
 * (RLORCH_TOKEN_FILE for a client, RLORCH_DEVICE for one agent) would
 * silently reconfigure the others. */
static char **child_env(void) {
  size_t n = 0;
  while (environ && environ[n]) n++;
  char **env = calloc(n + 1, sizeof *env);
  if (!env) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "RLORCH_", 7) != 0) env[k++] = environ[i];
  env[k] = NULL;
  return env;
}

static int resolve_addr(opt_state *st, const char *name, const char *in, char *out, size_t len) {
  char host[64];
  int port;
  if (opt_parse_addr(in, host, sizeof host, &port) != 0)
    return opt_fail(st, opt_origin(st, name), "invalid address \"%s\" (want HOST:PORT)", in);
  if (port == 0 && (port = proc_free_port()) < 0)
    return opt_fail(st, opt_origin(st, name), "no free port: %s", strerror(errno));
  snprintf(out, len, "%s:%d", host[0] ? host : "127.0.0.1", port);
  return 0;
}

static int mkdirs(const char *path) {
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* Children get their own process group, so a terminal Ctrl-C reaches only this
 * process, which then stops them in order: run first, workers, orchestrator. */
static int spawn(run_ctx *c, const char *name, char *const argv[]) {
  char logpath[PATH_MAX + 64];
  snprintf(logpath, sizeof logpath, "%s/%s.log", c->log_dir, name);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, logpath, O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_init(&at);
  sigset_t none, dfl;
  sigemptyset(&none);
  sigemptyset(&dfl);
  sigaddset(&dfl, SIGINT);
  sigaddset(&dfl, SIGTERM);
  sigaddset(&dfl, SIGCHLD);
  sigaddset(&dfl, SIGPIPE);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setsigdefault(&at, &dfl);
  posix_spawnattr_setpgroup(&at, 0);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                    POSIX_SPAWN_SETPGROUP);
  pid_t pid;
  int rc = posix_spawn(&pid, c->exe, &fa, &at, argv, c->child_env);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (rc != 0) {
    fprintf(stderr, "rlorch run: cannot start %s: %s\n", name, strerror(rc));
    return -1;
  }
  pthread_mutex_lock(&c->mu);
  child *k = &c->kids[c->nkids++];
  k->pid = pid;
  snprintf(k->name, sizeof k->name, "%s", name);
  k->exited = 0;
  pthread_mutex_unlock(&c->mu);
  return 0;
}

/* Reaps exited children; an exit before we asked for it is a failure of the run. */
static void reap(run_ctx *c, int expected) {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->nkids; i++) {
      if (c->kids[i].pid != pid) continue;
      c->kids[i].exited = 1;
      c->kids[i].status = status;
      if (!expected && !c->child_failed[0])
        snprintf(c->child_failed, sizeof c->child_failed, "%s exited unexpectedly (%s %d)",
                 c->kids[i].name, WIFEXITED(status) ? "status" : "signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    }
    pthread_mutex_unlock(&c->mu);
  }
}

static void *signal_thread(void *arg) {
  run_ctx *c = arg;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGUSR1);
  for (;;) {
    int sig;
    if (sigwait(&set, &sig) != 0) continue;
    if (sig == SIGUSR1) return NULL; /* main thread is done */
    if (sig == SIGCHLD) {
      pthread_mutex_lock(&c->mu);
      int quiet = c->interrupted;
      pthread_mutex_unlock(&c->mu);
      reap(c, quiet);
      pthread_mutex_lock(&c->mu);
      int failed = c->child_failed[0] != 0;
      pthread_mutex_unlock(&c->mu);
      if (failed && c->client) rpc_client_cancel_streams(c->client);
      continue;
    }
    pthread_mutex_lock(&c->mu);
    int again = c->interrupted++;
    pthread_mutex_unlock(&c->mu);
    fprintf(stderr, "\nrlorch run: %s, stopping%s\n", sig == SIGINT ? "interrupted" : "terminated",
            again ? " (again: stopping harder)" : "");
    if (c->client) rpc_client_cancel_streams(c->client);
  }
}

static int should_stop(void *arg) {
  run_ctx *c = arg;
  pthread_mutex_lock(&c->mu);
  int stop = c->interrupted || c->child_failed[0];
  pthread_mutex_unlock(&c->mu);
  return stop;
}

static int wait_serving(run_ctx *c) {
  if (proc_wait_serving(c->grpc_addr, 20.0, should_stop, c) == 0) return 0;
  pthread_mutex_lock(&c->mu);
  if (!c->interrupted && !c->child_failed[0])
    snprintf(c->child_failed, sizeof c->child_failed, "orchestrator not serving after 20 s");
  pthread_mutex_unlock(&c->mu);
  return -1;
}

static int on_event(ProtobufCMessage *m, void *ud) {
  run_ctx *c = ud;
  const Rlorch__V1__RunEvent *e = (const Rlorch__V1__RunEvent *)m;
  if (c->o.json) {
    pbjson_write(stdout, m);
    fputc('\n', stdout);
  }
  if (e->event_case == RLORCH__V1__RUN_EVENT__EVENT_STEP) {
    if (!c->o.json) ctl_print_event(stdout, e, &c->header_done);
    if (c->nsteps == c->capsteps) {
      size_t cap = c->capsteps ? 2 * c->capsteps : 64;
      void *p = realloc(c->steps, cap * sizeof *c->steps);
      if (!p) return 1;
      c->steps = p;
      c->capsteps = cap;
    }
    c->steps[c->nsteps++] = e->step;
    ((Rlorch__V1__RunEvent *)e)->step = NULL;
    ((Rlorch__V1__RunEvent *)e)->event_case = RLORCH__V1__RUN_EVENT__EVENT__NOT_SET;
  } else if (e->event_case == RLORCH__V1__RUN_EVENT__EVENT_RUN) {
    c->final_state = e->run->state;
    snprintf(c->final_message, sizeof c->final_message, "%s", e->run->message);
    if (!c->o.json && e->run->state != RLORCH__V1__RUN_STATE__RUN_STATE_RUNNING &&
        e->run->state != RLORCH__V1__RUN_STATE__RUN_STATE_PENDING)
      ctl_print_event(stdout, e, &c->header_done);
  } else if (e->event_case == RLORCH__V1__RUN_EVENT__EVENT_BROADCAST && !c->o.json &&
             e->broadcast->phase == RLORCH__V1__BROADCAST_EVENT__PHASE__PHASE_ABORTED) {
    ctl_print_event(stdout, e, &c->header_done);
  } else if (e->event_case == RLORCH__V1__RUN_EVENT__EVENT_WORKER && !c->o.json && e->worker->worker &&
             e->worker->worker->state == RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST) {
    ctl_print_event(stdout, e, &c->header_done);
  }
  fflush(stdout);
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void summary(run_ctx *c) {
  size_t n = c->nsteps;
  char st[32], mode[32], b[32];
  printf("\nsummary: run %s %s%s%s\n", c->run_id,
         ctl_enum(&rlorch__v1__run_state__descriptor, c->final_state, st, sizeof st),
         c->final_message[0] ? ": " : "", c->final_message);
  if (n == 0) {
    printf("  no step completed\n");
    return;
  }
  double train = 0, bcast = 0, exposed = 0, wire = 0, h2d = 0, cast = 0, stepw = 0, gbps = 0;
  uint64_t used = 0, dropped = 0, bytes = 0, pcie = 0;
  size_t verified = 0;
  double *tot = malloc(n * sizeof *tot);
  for (size_t i = 0; i < n; i++) {
    const Rlorch__V1__StepRecord *s = c->steps[i];
    train += s->train_seconds, bcast += s->total_seconds, exposed += s->exposed_staging_seconds;
    wire += s->wire_seconds, h2d += s->h2d_seconds, cast += s->cast_seconds;
    stepw += s->step_seconds, gbps += s->gbps;
    used += s->rollouts_used, dropped += s->rollouts_dropped;
    bytes += s->wire_bytes, pcie += s->pcie_bytes;
    verified += s->weights_verified != 0;
    if (tot) tot[i] = s->total_seconds;
  }
  double p50 = 0, mx = 0;
  if (tot) {
    qsort(tot, n, sizeof *tot, cmp_double);
    p50 = tot[n / 2];
    mx = tot[n - 1];
    free(tot);
  }
  const Rlorch__V1__StepRecord *last = c->steps[n - 1];
  printf("  %-28s %zu\n", "steps", n);
  printf("  %-28s %s via %s (%s)\n", "broadcast mode",
         ctl_enum(&rlorch__v1__broadcast_mode__descriptor, last->mode, mode, sizeof mode),
         last->transport, last->mode_reason);
  printf("  %-28s %" PRIu64 " used, %" PRIu64 " dropped as stale\n", "rollouts", used, dropped);
  printf("  %-28s %.4f s\n", "train step (mean)", train / (double)n);
  printf("  %-28s mean %.4f s, p50 %.4f s, max %.4f s\n", "broadcast", bcast / (double)n, p50,
         mx);
  printf("  %-28s h2d %.4f s, cast %.4f s, wire %.4f s\n", "stages (mean)", h2d / (double)n,
         cast / (double)n, wire / (double)n);
  printf("  %-28s %.4f s (%.1f%% of the step)\n", "exposed staging (mean)", exposed / (double)n,
         stepw > 0 ? 100.0 * exposed / stepw : 0.0);
  printf("  %-28s %s on the wire, %s over PCIe per step\n", "bytes",
         ctl_bytes(bytes / n, b, sizeof b), ctl_bytes(pcie / n, st, sizeof st));
  printf("  %-28s %.2f GB/s\n", "throughput (mean)", gbps / (double)n);
  printf("  %-28s %zu of %zu steps\n", "receivers verified", verified, n);
  printf("  %-28s %" PRIu64 "\n", "policy version", last->policy_version);
}

static void stop_children(run_ctx *c) {
  pthread_mutex_lock(&c->mu);
  c->interrupted++;
  pthread_mutex_unlock(&c->mu);
  /* Workers first (index 1..), then the orchestrator (index 0). */
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < c->nkids; i++) {
      int is_serve = i == 0;
      if ((pass == 0) == is_serve || c->kids[i].exited) continue;
      kill(c->kids[i].pid, SIGTERM);
    }
    for (int t = 0; t < 100; t++) {
      int left = 0;
      reap(c, 1);
      pthread_mutex_lock(&c->mu);
      for (size_t i = 0; i < c->nkids; i++)
        if (((pass == 0) != (i == 0)) && !c->kids[i].exited) left++;
      pthread_mutex_unlock(&c->mu);
      if (!left) break;
      struct timespec ts = {0, 100 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    for (size_t i = 0; i < c->nkids; i++) {
      if (((pass == 0) != (i == 0)) && !c->kids[i].exited) {
        fprintf(stderr, "rlorch run: %s did not stop in 10 s, killing it\n", c->kids[i].name);
        kill(c->kids[i].pid, SIGKILL);
        waitpid(c->kids[i].pid, &c->kids[i].status, 0);
        c->kids[i].exited = 1;
      }
    }
  }
  for (size_t i = 0; i < c->nkids; i++) {
    int s = c->kids[i].status;
    if (WIFEXITED(s) && WEXITSTATUS(s) == 0) continue;
    fprintf(stderr, "rlorch run: %s ended with %s %d (log: %s/%s.log)\n", c->kids[i].name,
            WIFEXITED(s) ? "status" : "signal", WIFEXITED(s) ? WEXITSTATUS(s) : WTERMSIG(s),
            c->log_dir, c->kids[i].name);
  }
}

/* One GPU per process when there are enough: NCCL refuses two ranks on one
 * device. The trainer takes device 0, inference worker i takes device 1 + i.
 * With fewer GPUs than processes (one GPU, typically) every process shares
 * GPU 0 and the broadcast runs colocated over CUDA IPC; without a GPU all run
 * on the host (and the broadcast mode says so). */
static int device_for(const run_ctx *c, int index) {
  if (c->colocate) return 0;
  return index < c->ndevices ? index : -1;
}

static int start_processes(run_ctx *c) {
  const run_opts *o = &c->o;
  char dev[16];
  char *level = (char *)opt_enum_name(opt_log_level_names, o->log_level);
  char *offload = (char *)opt_enum_name(run__offloads, o->offload);
  char *shadow = (char *)opt_enum_name(run__on_off, o->bf16_shadow);
  char *serve_argv[] = {c->exe, "serve", "--listen", c->grpc_addr, "--metrics-listen",
                        c->metrics_addr, "--data-dir", o->data_dir, "--log-level", level, NULL};
  if (spawn(c, "serve", serve_argv) != 0) return -1;
  if (wait_serving(c) != 0) return -1;
  char layers[16];
  snprintf(layers, sizeof layers, "%u", o->layers);
  snprintf(dev, sizeof dev, "%d", device_for(c, 0));
  char *tr_argv[] = {c->exe, "trainer", "--orchestrator", c->grpc_addr, "--preset", o->preset,
                     "--offload", offload, "--bf16-shadow", shadow, "--name", "trainer-0",
                     "--device", dev, "--log-level", level, "--layers", layers, NULL};
  if (spawn(c, "trainer-0", tr_argv) != 0) return -1;
  char conc[16]; /* each worker generates as many at once as it may be asked */
  snprintf(conc, sizeof conc, "%u", o->max_requests);
  for (uint32_t i = 0; i < o->inference; i++) {
    char name[32];
    snprintf(name, sizeof name, "inference-%u", i);
    snprintf(dev, sizeof dev, "%d", device_for(c, 1 + (int)i));
    char *in_argv[] = {c->exe, "inference", "--orchestrator", c->grpc_addr, "--name", name,
                       "--device", dev, "--log-level", level, "--concurrency", conc, NULL};
    if (spawn(c, name, in_argv) != 0) return -1;
  }
  return 0;
}

static int start_and_watch(run_ctx *c) {
  Rlorch__V1__RunSpec spec = RLORCH__V1__RUN_SPEC__INIT;
  spec.name = "rlorch-run";
  spec.preset = c->o.preset;
  spec.steps = c->o.steps;
  spec.async_bound_case = RLORCH__V1__RUN_SPEC__ASYNC_BOUND_MAX_ASYNC_LEVEL;
  spec.max_async_level = c->o.max_async;
  spec.rollouts_per_step = c->o.rollouts_per_step;
  spec.max_requests_per_worker = c->o.max_requests;
  spec.policy = (Rlorch__V1__BroadcastMode)c->o.policy;
  spec.offload = (Rlorch__V1__Offload)c->o.offload;
  spec.group_size = c->o.group_size;
  Rlorch__V1__PromptSource ps = RLORCH__V1__PROMPT_SOURCE__INIT;
  char prompts[PATH_MAX];
  if (c->o.prompts) {
    /* The orchestrator opens it: the same file whatever its working directory. */
    if (!realpath(c->o.prompts, prompts)) {
      fprintf(stderr, "rlorch run: --prompts: cannot read \"%s\": %s\n", c->o.prompts,
              strerror(errno));
      return -1;
    }
    ps.source_case = RLORCH__V1__PROMPT_SOURCE__SOURCE_JSONL_PATH;
    ps.jsonl_path = prompts;
    spec.prompts = &ps;
  }
  ProtobufCMessage *resp = NULL;
  rpc_status st;
  if (rpc_client_call(c->client, "/rlorch.v1.Control/StartRun", &spec.base,
                      &rlorch__v1__run__descriptor, 10.0, &resp, &st) != GRPC_STATUS_OK) {
    fprintf(stderr, "rlorch run: StartRun: %s: %s\n", rpc_status_name(st.code), st.message);
    return -1;
  }
  snprintf(c->run_id, sizeof c->run_id, "%s", ((Rlorch__V1__Run *)resp)->id);
  protobuf_c_message_free_unpacked(resp, NULL);
  Rlorch__V1__WatchRunRequest wr = RLORCH__V1__WATCH_RUN_REQUEST__INIT;
  wr.run_id = c->run_id;
  wr.from_step = -1;
  grpc_status_code code = rpc_client_stream(c->client, "/rlorch.v1.Control/WatchRun", &wr.base,
                                            &rlorch__v1__run_event__descriptor, 0, on_event, c,
                                            &st);
  if (code != GRPC_STATUS_OK && code != GRPC_STATUS_CANCELLED)
    fprintf(stderr, "rlorch run: WatchRun: %s: %s\n", rpc_status_name(st.code), st.message);
  return 0;
}

static void stop_run(run_ctx *c) {
  if (!c->run_id[0] || c->final_state == RLORCH__V1__RUN_STATE__RUN_STATE_SUCCEEDED ||
      c->final_state == RLORCH__V1__RUN_STATE__RUN_STATE_FAILED ||
      c->final_state == RLORCH__V1__RUN_STATE__RUN_STATE_STOPPED)
    return;
  Rlorch__V1__StopRunRequest req = RLORCH__V1__STOP_RUN_REQUEST__INIT;
  req.run_id = c->run_id;
  req.reason = c->child_failed[0] ? c->child_failed : "interrupted";
  ProtobufCMessage *resp = NULL;
  rpc_status st;
  if (rpc_client_call(c->client, "/rlorch.v1.Control/StopRun", &req.base,
                      &rlorch__v1__run__descriptor, 5.0, &resp, &st) != GRPC_STATUS_OK)
    return;
  protobuf_c_message_free_unpacked(resp, NULL);
  /* STOPPING until the step in flight ends: wait for the final state (15 s). */
  Rlorch__V1__GetRunRequest get = RLORCH__V1__GET_RUN_REQUEST__INIT;
  get.run_id = c->run_id;
  for (int i = 0; i < 150; i++) {
    if (rpc_client_call(c->client, "/rlorch.v1.Control/GetRun", &get.base,
                        &rlorch__v1__run__descriptor, 2.0, &resp, &st) != GRPC_STATUS_OK)
      return;
    Rlorch__V1__Run *r = (Rlorch__V1__Run *)resp;
    c->final_state = r->state;
    snprintf(c->final_message, sizeof c->final_message, "%s", r->message);
    protobuf_c_message_free_unpacked(resp, NULL);
    if (c->final_state != RLORCH__V1__RUN_STATE__RUN_STATE_STOPPING &&
        c->final_state != RLORCH__V1__RUN_STATE__RUN_STATE_RUNNING)
      return;
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

int cmd_run(int argc, char **argv) {
  run_ctx *c = calloc(1, sizeof *c);
  opt_state *st = malloc(sizeof *st);
  int rc = 2;
  if (!c || !st) {
    free(c);
    free(st);
    return 1;
  }
  run__defaults(&c->o);
  if (opt_own(&run__cmd, &c->o) != 0) {
    fprintf(stderr, "rlorch run: out of memory\n");
    rc = 1;
    goto out;
  }
  if (opt_parse(&run__cmd, &c->o, argc, argv, environ, st) != 0) {
    fprintf(stderr, "%s\n", st->err);
    goto out;
  }
  if (st->help) {
    run_opts d;
    run__defaults(&d);
    opt_usage(&run__cmd, &d, stdout);
    rc = 0;
    goto out;
  }
  c->inference_set = opt_is_set(st, "inference_workers");
  if (!bcast_preset_find(c->o.preset)) {
    opt_fail(st, opt_origin(st, "preset"), "unknown preset \"%s\" (want 100m, 1b, 4b, 8b)",
             c->o.preset);
    fprintf(stderr, "%s\n", st->err);
    goto out;
  }
  if (resolve_addr(st, "listen", c->o.listen, c->grpc_addr, sizeof c->grpc_addr) ||
      resolve_addr(st, "metrics_listen", c->o.metrics_listen, c->metrics_addr,
                   sizeof c->metrics_addr)) {
    fprintf(stderr, "%s\n", st->err);
    goto out;
  }
  snprintf(c->log_dir, sizeof c->log_dir, "%s/logs", c->o.data_dir);
  if (mkdirs(c->log_dir) != 0) {
    opt_fail(st, opt_origin(st, "data_dir"), "cannot create %s: %s", c->log_dir, strerror(errno));
    fprintf(stderr, "%s\n", st->err);
    goto out;
  }
  if (!(c->child_env = child_env())) {
    fprintf(stderr, "rlorch run: out of memory\n");
    rc = 1;
    goto out;
  }
  if (proc_self_exe(c->exe, sizeof c->exe) != 0) {
    fprintf(stderr, "rlorch run: cannot find my own executable: %s\n", strerror(errno));
    rc = 1;
    goto out;
  }
  rc = 1;
  pthread_mutex_init(&c->mu, NULL);

  /* Signals go to one thread only; block them everywhere before threads exist. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  pthread_t sig_thr;
  pthread_create(&sig_thr, NULL, signal_thread, c);

  rpc_client_opts co = {.target = c->grpc_addr};
  char err[256];
  if (rpc_client_new(&co, &c->client, err, sizeof err) != 0) {
    fprintf(stderr, "rlorch run: %s\n", err);
    goto stop_thread;
  }
  bcast_caps caps;
  bcast_caps_probe(&caps);
  c->ndevices = caps.nccl_version[0] ? caps.cuda_devices : 0;
  /* By default every inference worker gets a GPU of its own when there are
   * GPUs: NCCL needs one device per rank. */
  if (!c->inference_set && c->ndevices >= 2)
    c->o.inference = (uint32_t)(c->ndevices - 1 < MAX_INFERENCE ? c->ndevices - 1 : MAX_INFERENCE);
  /* Colocated mode needs CUDA only, not NCCL. */
  c->colocate = caps.cuda_devices >= 1 && c->ndevices < (int)c->o.inference + 1;
  const bcast_preset *pr = bcast_preset_find(c->o.preset);
  bcast_preset_opts po = {.max_layers = c->o.layers};
  if (!c->o.json) {
    printf("rlorch run: preset %s (%.0fM parameters), 1 trainer + %u inference workers, "
           "offload %s%s, policy %s, %u steps\n",
           c->o.preset, (double)bcast_preset_params(pr, &po) / 1e6, c->o.inference,
           opt_enum_name(run__offloads, c->o.offload),
           c->o.offload != RLORCH__V1__OFFLOAD__OFFLOAD_PARAMS_AND_OPTIMIZER ? ""
           : c->o.bf16_shadow ? " (bf16 shadow)" : " (no bf16 shadow)",
           opt_enum_name(run__modes, c->o.policy), c->o.steps);
    if (c->colocate)
      printf("transport:  CUDA IPC - the trainer and %u inference worker%s colocated on GPU 0 "
             "(%s, %s)\n",
             c->o.inference, c->o.inference == 1 ? "" : "s", caps.gpu_name, caps.gpu_uuid);
    else if (c->ndevices > 0)
      printf("transport:  CUDA (%d device%s, %s) and NCCL %s\n", caps.cuda_devices,
             caps.cuda_devices > 1 ? "s" : "", caps.gpu_name, caps.nccl_version);
    else
      printf("transport:  HOST TCP ONLY - %s\n", caps.note[0] ? caps.note : "no GPU");
    printf("grpc:       %s\nmetrics:    http://%s/metrics\nlogs:       %s/\n\n", c->grpc_addr,
           c->metrics_addr, c->log_dir);
    fflush(stdout);
  }
  if (start_processes(c) == 0) start_and_watch(c);
  stop_run(c);
  if (!c->o.json) summary(c);
  if (c->child_failed[0]) fprintf(stderr, "rlorch run: %s\n", c->child_failed);
  pthread_mutex_lock(&c->mu);
  int user_stop = c->interrupted > 0;
  pthread_mutex_unlock(&c->mu);
  stop_children(c);
  if (c->final_state == RLORCH__V1__RUN_STATE__RUN_STATE_SUCCEEDED && !c->child_failed[0])
    rc = 0;
  else if (user_stop)
    rc = 130;
  rpc_client_free(c->client);
stop_thread:
  pthread_kill(sig_thr, SIGUSR1);
  pthread_join(sig_thr, NULL);
  pthread_sigmask(SIG_UNBLOCK, &set, NULL);
  pthread_mutex_destroy(&c->mu);
out:
  for (size_t i = 0; i < c->nsteps; i++) protobuf_c_message_free_unpacked(&c->steps[i]->base, NULL);
  free(c->steps);
  free(c->child_env);
  opt_free(&run__cmd, &c->o);
  free(st);
  free(c);
  return rc;
}
