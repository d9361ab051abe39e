/* An inference engine through rlorch.h alone: bf16 buffers of its own (the
 * "model"), which the library's broadcasts write straight into, and made-up
 * completions and rewards (sdk_model.h) for every generation request. A
 * read-write lock pauses generation around each broadcast, as an engine
 * would; after each successful one the program checks that its buffers hold
 * the trainer's weights of that version cast to bf16, element for element.
 *
 *   sdk_inference ORCHESTRATOR NAME [--bad-reports | --delay-ms N | --on-bind]
 *
 * --bad-reports: before answering the first request, tries reports that
 * must be refused (each code and message checked).
 * --delay-ms N: a slow engine: each request is answered N ms after it came,
 * unless an RLORCH_CMD_ABORT for it came first (then nothing is sent). A
 * request held across an orchestrator restart is refused by the library
 * when answered ("stale ..." is printed, not a failure).
 * --on-bind: the worker starts with no tensors; options.on_bind places each
 * plan's tensors (checked against the model's names, shapes and dtype) in
 * buffers allocated when the first plan comes.
 * --tp R/N (--tp-bind R/N: the same through on_bind): rank R of a
 * tensor-parallel engine of N (options.parts): the embedding's rows and the
 * mlp weight's columns sliced in N near-equal parts, the norm whole; each
 * buffer holds its part only, checked element for element against the
 * trainer's full tensor.
 * Prints one line per event, "FAIL ..." for anything wrong; exits 0 after
 * SIGTERM with nothing wrong. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sdk_model.h"

static volatile sig_atomic_t stop_asked;
static void on_term(int sig) { (void)sig, stop_asked = 1; }
static int failures;
static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;

#define FAIL(...)                                                                     \
  (pthread_mutex_lock(&out_mu), failures++, printf("FAIL " __VA_ARGS__), printf("\n"), \
   fflush(stdout), pthread_mutex_unlock(&out_mu))

static void on_log(void *ud, rlorch_log_level level, const char *event, const char *fields) {
  (void)ud;
  fprintf(stderr, "lib level=%d event=%s %s\n", (int)level, event, fields);
}

static uint16_t *buf[SDK_MODEL_N];
/* --tp: this rank's part of each tensor (WHOLE when not sliced). */
static rlorch_part parts[SDK_MODEL_N];
static size_t nparts;

/* Tensor k's part: indices [*start, *start + *count) along *dim (the whole
 * tensor along dim 0 when not sliced). */
static void part_of(size_t k, uint32_t *dim, uint64_t *start, uint64_t *count) {
  if (k < nparts && parts[k].kind == RLORCH_PART_SLICE) {
    *dim = parts[k].dim, *start = parts[k].start, *count = parts[k].count;
    return;
  }
  *dim = 0, *start = 0, *count = SDK_MODEL[k].shape[0];
}

/* Elements tensor k's buffer holds. */
static uint64_t held_elems(size_t k) {
  uint32_t dim;
  uint64_t start, count;
  part_of(k, &dim, &start, &count);
  return sdk_model_elems(k) / SDK_MODEL[k].shape[dim] * count;
}

/* The full tensor's element of the part's element i (row-major in the
 * part's shape: shape[dim] replaced by count). */
static uint64_t full_index(size_t k, uint64_t i) {
  uint32_t dim;
  uint64_t start, count;
  part_of(k, &dim, &start, &count);
  uint64_t inner = 1; /* elements of one index along dim */
  for (uint32_t d = dim + 1; d < SDK_MODEL[k].ndim; d++) inner *= SDK_MODEL[k].shape[d];
  uint64_t outer = i / (count * inner), along = i / inner % count, rest = i % inner;
  return (outer * SDK_MODEL[k].shape[dim] + start + along) * inner + rest;
}
/* Generation read-holds it; a broadcast write-holds it from before to after. */
static pthread_rwlock_t weights_lock = PTHREAD_RWLOCK_INITIALIZER;
static int torn;
static unsigned broadcasts_ok, broadcasts_failed;

/* The worker, once started: the callbacks ask it which plan they are about. */
static _Atomic(rlorch_worker *) worker;
static char before_id[128];

static void before(void *ud, uint64_t version) {
  (void)ud, (void)version;
  pthread_rwlock_wrlock(&weights_lock);
  rlorch_worker *w = atomic_load(&worker);
  if (w && !rlorch_broadcast_id(w, before_id, sizeof before_id))
    FAIL("before version %llu: rlorch_broadcast_id names no plan", (unsigned long long)version);
}

static void after(void *ud, int ok, uint64_t version) {
  (void)ud;
  rlorch_worker *w = atomic_load(&worker);
  char id[128], cut[4];
  if (w) {
    size_t n = rlorch_broadcast_id(w, id, sizeof id);
    if (!n || n != strlen(id) || (before_id[0] && strcmp(id, before_id)))
      FAIL("after version %llu: rlorch_broadcast_id says \"%s\" (%zu bytes), before said \"%s\"",
           (unsigned long long)version, id, n, before_id);
    if (rlorch_broadcast_id(w, cut, sizeof cut) != n || strlen(cut) != sizeof cut - 1 ||
        strncmp(cut, id, sizeof cut - 1))
      FAIL("rlorch_broadcast_id into %zu bytes: \"%s\", not the start of \"%s\"", sizeof cut, cut, id);
  }
  uint64_t bad = 0, n = 0;
  if (ok) {
    for (size_t k = 0; k < SDK_MODEL_N; k++)
      for (uint64_t i = 0; i < held_elems(k); i++, n++)
        bad += buf[k][i] != sdk_bf16(sdk_model_value(version, k, full_index(k, i)));
    broadcasts_ok++;
  } else {
    broadcasts_failed++;
  }
  torn = !ok;
  pthread_rwlock_unlock(&weights_lock);
  pthread_mutex_lock(&out_mu);
  printf("broadcast ok=%d version=%llu elements=%llu bad=%llu\n", ok, (unsigned long long)version,
         (unsigned long long)n, (unsigned long long)bad);
  if (bad) failures++, printf("FAIL version %llu: %llu of %llu bf16 elements differ from the "
                              "trainer's weights\n", (unsigned long long)version,
                              (unsigned long long)bad, (unsigned long long)n);
  fflush(stdout);
  pthread_mutex_unlock(&out_mu);
}

/* options.on_bind: the plan's tensors, by name, into the model's buffers. */
static unsigned binds;
static int place_tensors(void *ud, uint64_t version, rlorch_tensor *t, size_t n, char *msg, size_t len) {
  (void)ud;
  if (n != SDK_MODEL_N) {
    snprintf(msg, len, "the plan has %zu tensors, this model %zu", n, SDK_MODEL_N);
    FAIL("bind: %s", msg);
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    size_t k = 0;
    while (k < SDK_MODEL_N && strcmp(SDK_MODEL[k].name, t[i].name)) k++;
    if (k == SDK_MODEL_N || t[i].ndim != SDK_MODEL[k].ndim ||
        memcmp(t[i].shape, SDK_MODEL[k].shape, t[i].ndim * sizeof *t[i].shape) ||
        t[i].wire_dtype != RLORCH_DTYPE_BF16 || t[i].storage_dtype != RLORCH_DTYPE_BF16) {
      snprintf(msg, len, "tensor '%s' is not this model's", t[i].name);
      FAIL("bind: %s", msg);
      return -1;
    }
    if (!buf[k] && !(buf[k] = calloc(held_elems(k), sizeof(uint16_t)))) {
      snprintf(msg, len, "no memory for '%s'", t[i].name);
      return -1;
    }
    t[i].residency = RLORCH_RES_HOST_PAGEABLE;
    t[i].data = buf[k];
  }
  pthread_mutex_lock(&out_mu);
  binds++;
  printf("bind version=%llu tensors=%zu\n", (unsigned long long)version, n);
  fflush(stdout);
  pthread_mutex_unlock(&out_mu);
  return 0;
}

static void expect(rlorch_status got, rlorch_status want, const rlorch_error *err, const char *msg,
                   const char *what) {
  if (got == want && (int)err->code == (int)want && strstr(err->message, msg)) {
    printf("ok %s: %s: %s\n", what, rlorch_status_name(got), err->message);
  } else {
    FAIL("%s: got %s \"%s\", want %s with \"%s\"", what, rlorch_status_name(got), err->message,
         rlorch_status_name(want), msg);
  }
}

/* Reports the worker must refuse before sending anything. */
static void bad_reports(rlorch_worker *w, const rlorch_command *cmd, const rlorch_rollout *good,
                        size_t n) {
  rlorch_error err;
  rlorch_rollout r[64];
  uint32_t count = cmd->generate.count;
  memcpy(r, good, n * sizeof *r);
  expect(rlorch_report_rollouts(w, cmd, 0, r, n - 1, &err), RLORCH_E_INVALID, &err,
         "rollouts for request", "one rollout short");
  float lp[SDK_MODEL_MAX_TOKENS];
  memcpy(lp, r[0].logprobs, r[0].n_tokens * sizeof *lp);
  lp[1] = 0.5f;
  r[0].logprobs = lp;
  expect(rlorch_report_rollouts(w, cmd, 0, r, n, &err), RLORCH_E_INVALID, &err,
         "rollouts[0].logprobs[1]: 0.5 is not a log-probability", "a positive logprob");
  r[0] = good[0];
  double nan_reward[2] = {0.5, NAN};
  r[n - 1].rewards = nan_reward;
  expect(rlorch_report_rollouts(w, cmd, 0, r, n, &err), RLORCH_E_INVALID, &err,
         "].rewards[1]: nan is not finite", "a NaN reward");
  r[n - 1] = good[n - 1];
  r[0].n_rewards = 0;
  expect(rlorch_report_rollouts(w, cmd, 0, r, n, &err), RLORCH_E_INVALID, &err,
         "rollouts[0].rewards: 0 values, not 1..16", "no reward");
  r[0] = good[0];
  r[0].n_tokens = 0;
  expect(rlorch_report_rollouts(w, cmd, 0, r, n, &err), RLORCH_E_INVALID, &err,
         "rollouts[0].token_ids: a completion has at least one token", "an empty completion");
  r[0] = good[0];
  r[0].token_ids = NULL; /* a length only */
  expect(rlorch_report_rollouts(w, cmd, 0, r, n, &err), RLORCH_E_INVALID, &err,
         "rollouts[0].logprobs: set without token_ids", "log-probabilities of a length only");
  r[0] = good[0];
  expect(rlorch_report_rollouts(w, cmd, rlorch_policy_version(w) + 5, r, n, &err), RLORCH_E_INVALID,
         &err, "is newer than the", "a version the worker does not hold");
  expect(rlorch_report_step(w, cmd, 1.0, &err), RLORCH_E_STATE, &err,
         "an inference worker has no train step", "report_step on an inference worker");
  expect(rlorch_fetch_batch(w, cmd, &(rlorch_batch *){NULL}, &err), RLORCH_E_STATE, &err,
         "an inference worker has no train step", "fetch_batch on an inference worker");
  (void)count;
}

/* Makes the completions of one request into out[] (count <= 64). */
static size_t generate(const rlorch_command *cmd, const char *name, uint64_t version,
                       uint32_t tok[][SDK_MODEL_MAX_TOKENS], float lp[][SDK_MODEL_MAX_TOKENS],
                       double rw[][2], char meta[][96], rlorch_rollout *out) {
  uint64_t g = cmd->generate.group_id;
  uint32_t n = cmd->generate.count;
  for (uint32_t j = 0; j < n; j++) {
    size_t len = sdk_model_len(g, j);
    for (size_t t = 0; t < len; t++) {
      tok[j][t] = sdk_model_token(g, j, t);
      lp[j][t] = sdk_model_logprob(g, j, t);
    }
    rw[j][0] = sdk_model_reward(g, j);
    rw[j][1] = (double)version;
    int m = sdk_model_meta(meta[j], sizeof meta[j], g, j, name);
    out[j] = (rlorch_rollout){.token_ids = tok[j], .n_tokens = len, .logprobs = lp[j],
                              .rewards = rw[j], .n_rewards = 2,
                              .finish_reason = RLORCH_FINISH_STOP,
                              .metadata = (const uint8_t *)meta[j], .n_metadata = (size_t)m + 1,
                              .seconds = 0.001};
  }
  return n;
}

/* Requests held by --delay-ms, in arrival order. */
#define HELD_MAX 64
static rlorch_command *held[HELD_MAX];
static double held_due[HELD_MAX];
static size_t nheld;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* An abort drops the request it names, if it is still held; 1 when it was. */
static int drop_held(uint64_t request_id) {
  for (size_t i = 0; i < nheld; i++)
    if (held[i]->generate.request_id == request_id) {
      rlorch_command_free(held[i]);
      memmove(&held[i], &held[i + 1], (nheld - i - 1) * sizeof *held);
      memmove(&held_due[i], &held_due[i + 1], (nheld - i - 1) * sizeof *held_due);
      nheld--;
      return 1;
    }
  return 0;
}

/* Generates and reports one request from the weights held now. */
static unsigned serve(rlorch_worker *w, const rlorch_command *cmd, const char *name, int *want_bad) {
  static uint32_t tok[64][SDK_MODEL_MAX_TOKENS];
  static float lp[64][SDK_MODEL_MAX_TOKENS];
  static double rw[64][2];
  static char meta[64][96];
  rlorch_rollout r[64];
  rlorch_error err;
  rlorch_status rc;
  if (cmd->generate.count == 0 || cmd->generate.count > 64) {
    rlorch_report_error(w, cmd, "this engine makes 1..64 completions a request", &err);
    FAIL("request of count %u", cmd->generate.count);
    return 0;
  }
  pthread_rwlock_rdlock(&weights_lock);
  int ok = !torn;
  uint64_t version = rlorch_policy_version(w);
  size_t n = ok ? generate(cmd, name, version, tok, lp, rw, meta, r) : 0;
  pthread_rwlock_unlock(&weights_lock);
  if (!ok) {
    rc = rlorch_report_error(w, cmd, "the weights are torn by a failed broadcast", &err);
    n = 0;
  } else {
    if (*want_bad) bad_reports(w, cmd, r, n), *want_bad = 0;
    rc = rlorch_report_rollouts(w, cmd, version, r, n, &err);
  }
  if (rc == RLORCH_E_STOPPED && strstr(err.message, "came before the worker registered again")) {
    /* Held across an orchestrator restart: the request is gone, and the
     * library sent nothing. */
    printf("stale request_id=%llu: %s\n", (unsigned long long)cmd->generate.request_id, err.message);
    fflush(stdout);
    return 0;
  }
  if (rc) FAIL("report: %s: %s", rlorch_status_name(err.code), err.message);
  return rc ? 0 : (unsigned)n;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: sdk_inference ORCHESTRATOR NAME [--bad-reports | --delay-ms N | "
            "--on-bind | --tp R/N | --tp-bind R/N]\n");
    return 2;
  }
  int want_bad = argc > 3 && !strcmp(argv[3], "--bad-reports");
  int tp_bind = argc > 4 && !strcmp(argv[3], "--tp-bind");
  int on_bind = tp_bind || (argc > 3 && !strcmp(argv[3], "--on-bind"));
  if (tp_bind || (argc > 4 && !strcmp(argv[3], "--tp"))) {
    unsigned r, nr;
    if (sscanf(argv[4], "%u/%u", &r, &nr) != 2 || nr < 1 || r >= nr) {
      fprintf(stderr, "sdk_inference: --tp wants R/N with R < N, not \"%s\"\n", argv[4]);
      return 2;
    }
    /* Rows of the embedding (dim 0), columns of the mlp weight (dim 1):
     * the first shape % N parts one index longer. */
    const uint32_t dims[2] = {0, 1};
    for (size_t k = 0; k < 2; k++) {
      uint64_t len = SDK_MODEL[k].shape[dims[k]], base = len / nr, extra = len % nr;
      parts[k] = (rlorch_part){.name = SDK_MODEL[k].name, .kind = RLORCH_PART_SLICE, .dim = dims[k],
                               .start = r * base + (r < extra ? r : extra),
                               .count = base + (r < extra)};
    }
    parts[2] = (rlorch_part){.name = SDK_MODEL[2].name, .kind = RLORCH_PART_WHOLE};
    nparts = 3;
  }
  double delay_s = argc > 4 && !strcmp(argv[3], "--delay-ms") ? atof(argv[4]) / 1000.0 : 0;
  signal(SIGTERM, on_term);
  signal(SIGINT, on_term);
  rlorch_tensor t[SDK_MODEL_N];
  for (size_t k = 0; k < SDK_MODEL_N && !on_bind; k++) {
    buf[k] = calloc(held_elems(k), sizeof(uint16_t));
    if (!buf[k]) return 1;
    t[k] = (rlorch_tensor){.name = SDK_MODEL[k].name, .layer = SDK_MODEL[k].layer,
                           .storage_dtype = RLORCH_DTYPE_BF16, .wire_dtype = RLORCH_DTYPE_BF16,
                           .ndim = SDK_MODEL[k].ndim, .shape = SDK_MODEL[k].shape,
                           .residency = RLORCH_RES_HOST_PAGEABLE, .data = buf[k]};
  }
  rlorch_options o;
  rlorch_options_init(&o, sizeof o, RLORCH_ROLE_INFERENCE);
  o.orchestrator = argv[1];
  o.name = argv[2];
  o.tensors = on_bind ? NULL : t;
  o.ntensors = on_bind ? 0 : SDK_MODEL_N;
  if (on_bind) o.on_bind = place_tensors;
  o.parts = nparts ? parts : NULL;
  o.nparts = nparts;
  o.max_concurrent_requests = 4;
  o.log = on_log;
  o.log_level = RLORCH_LOG_WARN;
  o.on_broadcast_before = before;
  o.on_broadcast_after = after;
  rlorch_worker *w = sdk_model_start(&o);
  if (!w) return 1;
  atomic_store(&worker, w);
  char none[8] = "x";
  if (rlorch_broadcast_id(NULL, none, sizeof none) != 0 || none[0])
    FAIL("rlorch_broadcast_id of no worker: \"%s\"", none);
  rlorch_error err;
  unsigned requests = 0, rollouts = 0, aborts = 0, aborted_held = 0;
  while (!stop_asked) {
    while (nheld && held_due[0] <= now_s()) {
      rollouts += serve(w, held[0], argv[2], &want_bad);
      rlorch_command_free(held[0]);
      memmove(&held[0], &held[1], (nheld - 1) * sizeof *held);
      memmove(&held_due[0], &held_due[1], (nheld - 1) * sizeof *held_due);
      nheld--;
    }
    rlorch_command *cmd = NULL;
    rlorch_status rc = rlorch_next(w, nheld ? 0.01 : 0.2, &cmd, &err);
    if (rc == RLORCH_TIMEOUT) continue;
    if (rc == RLORCH_E_STOPPED) break;
    if (rc != RLORCH_OK) {
      FAIL("next: %s: %s", rlorch_status_name(err.code), err.message);
      break;
    }
    if (cmd->kind == RLORCH_CMD_GENERATE) {
      requests++;
      if (delay_s > 0 && nheld < HELD_MAX) {
        held[nheld] = cmd;
        held_due[nheld++] = now_s() + delay_s;
        printf("held request_id=%llu\n", (unsigned long long)cmd->generate.request_id);
        fflush(stdout);
        continue; /* freed once answered or aborted */
      }
      rollouts += serve(w, cmd, argv[2], &want_bad);
    } else if (cmd->kind == RLORCH_CMD_ABORT) {
      aborts++;
      int was = drop_held(cmd->abort.request_id);
      aborted_held += (unsigned)was;
      printf("abort request_id=%llu held=%d reason=\"%s\"\n",
             (unsigned long long)cmd->abort.request_id, was, cmd->abort.reason);
      fflush(stdout);
    } else if (cmd->kind == RLORCH_CMD_SHUTDOWN) {
      printf("shutdown reason=\"%s\"\n", cmd->shutdown_reason);
    } else {
      FAIL("an inference worker got command kind %d", (int)cmd->kind);
    }
    rlorch_command_free(cmd);
  }
  while (nheld) rlorch_command_free(held[--nheld]);
  rlorch_stop(w);
  atomic_store(&worker, NULL);
  rlorch_command *cmd = NULL;
  rlorch_status rc;
  while ((rc = rlorch_next(w, 5, &cmd, &err)) == RLORCH_OK) rlorch_command_free(cmd);
  if (rc != RLORCH_E_STOPPED) FAIL("after stop, next says %s", rlorch_status_name(rc));
  rc = rlorch_stop_status(w, &err);
  if (rc != RLORCH_OK) FAIL("stopped on purpose, but rlorch_stop_status says %s: %s", rlorch_status_name(rc), err.message);
  rlorch_free(w);
  for (size_t k = 0; k < SDK_MODEL_N; k++) free(buf[k]);
  printf("stopped requests=%u rollouts=%u aborts=%u aborted_held=%u binds=%u broadcasts_ok=%u "
         "broadcasts_failed=%u failures=%d\n", requests, rollouts, aborts, aborted_held, binds,
         broadcasts_ok, broadcasts_failed, failures);
  return failures ? 1 : 0;
}
