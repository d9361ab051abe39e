/* A trainer through rlorch.h alone: fp32 tensors of its own (host memory),
 * an "optimizer step" that sets them to the next version's values, and a
 * check of every step: the tensors held what the last step wrote (nothing
 * else wrote them), and the batch holds the rollouts the inference programs
 * made (token ids, logprobs, rewards, from sdk_model.h).
 *
 *   sdk_trainer ORCHESTRATOR NAME DATA_LISTEN
 *
 * Prints one line per event ("step ...", "batch ...", "broadcast ..."), and
 * "FAIL ..." for anything wrong. Exits 0 after SIGTERM with nothing wrong. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sdk_model.h"

static volatile sig_atomic_t stop_asked;
static void on_term(int sig) { (void)sig, stop_asked = 1; }
static int failures;

#define FAIL(...) (failures++, printf("FAIL " __VA_ARGS__), printf("\n"), fflush(stdout))

static void on_log(void *ud, rlorch_log_level level, const char *event, const char *fields) {
  (void)ud;
  fprintf(stderr, "lib level=%d event=%s %s\n", (int)level, event, fields);
}

static void before(void *ud, uint64_t version) {
  (void)ud;
  printf("broadcast before version=%llu\n", (unsigned long long)version);
  fflush(stdout);
}

static void after(void *ud, int ok, uint64_t version) {
  (void)ud;
  printf("broadcast after ok=%d version=%llu\n", ok, (unsigned long long)version);
  fflush(stdout);
}

static float *weights[SDK_MODEL_N];

static void set_version(uint64_t v) {
  for (size_t k = 0; k < SDK_MODEL_N; k++)
    for (uint64_t i = 0; i < sdk_model_elems(k); i++) weights[k][i] = sdk_model_value(v, k, i);
}

static uint64_t bad_elems(uint64_t v) {
  uint64_t bad = 0;
  for (size_t k = 0; k < SDK_MODEL_N; k++)
    for (uint64_t i = 0; i < sdk_model_elems(k); i++) bad += weights[k][i] != sdk_model_value(v, k, i);
  return bad;
}

/* Every rollout is the one its metadata names, as sdk_inference makes it. */
static void check_batch(const rlorch_batch *b, const rlorch_command *cmd) {
  size_t bad = 0;
  if (b->n_rollouts != cmd->train.n_rollouts)
    FAIL("batch step=%llu rollouts=%zu want=%zu", (unsigned long long)b->step, b->n_rollouts,
         cmd->train.n_rollouts);
  for (size_t r = 0; r < b->n_rollouts; r++) {
    const rlorch_batch_rollout *x = &b->rollouts[r];
    char meta[256] = "", by[128] = "";
    unsigned long long g = 0;
    unsigned j = 0;
    if (x->n_metadata < sizeof meta) memcpy(meta, x->metadata, x->n_metadata);
    if (sscanf(meta, "g=%llu j=%u by=%127s", &g, &j, by) != 3 || g != x->group_id) {
      FAIL("batch step=%llu rollout=%zu metadata=\"%s\" group=%llu", (unsigned long long)b->step, r,
           meta, (unsigned long long)x->group_id);
      bad++;
      continue;
    }
    size_t n = sdk_model_len(g, j);
    int ok = x->n_completion_token_ids == n && x->completion_logprobs && x->n_rewards == 2 &&
             x->rewards[0] == sdk_model_reward(g, j) &&
             x->rewards[1] == (double)x->policy_version && x->finish_reason == RLORCH_FINISH_STOP;
    for (size_t t = 0; ok && t < n; t++)
      ok = x->completion_token_ids[t] == sdk_model_token(g, j, t) &&
           x->completion_logprobs[t] == sdk_model_logprob(g, j, t);
    if (!ok) {
      FAIL("batch step=%llu rollout=%zu (%s) differs from what its inference worker made",
           (unsigned long long)b->step, r, meta);
      bad++;
    }
  }
  printf("batch step=%llu rollouts=%zu checked=%zu bad=%zu first=%s\n", (unsigned long long)b->step,
         b->n_rollouts, b->n_rollouts - bad, bad,
         b->n_rollouts ? (const char *)b->rollouts[0].metadata : "");
  fflush(stdout);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: sdk_trainer ORCHESTRATOR NAME DATA_LISTEN\n");
    return 2;
  }
  signal(SIGTERM, on_term);
  signal(SIGINT, on_term);
  const char *release = NULL;
  uint32_t api = rlorch_version(&release);
  printf("library api=%u release=%s\n", api, release);
  if (api < RLORCH_API_VERSION) FAIL("library api %u older than the header's %d", api, RLORCH_API_VERSION);

  rlorch_tensor t[SDK_MODEL_N];
  for (size_t k = 0; k < SDK_MODEL_N; k++) {
    weights[k] = malloc(sdk_model_elems(k) * sizeof(float));
    if (!weights[k]) return 1;
    t[k] = (rlorch_tensor){.name = SDK_MODEL[k].name, .layer = SDK_MODEL[k].layer,
                           .storage_dtype = RLORCH_DTYPE_FP32, .wire_dtype = RLORCH_DTYPE_BF16,
                           .ndim = SDK_MODEL[k].ndim, .shape = SDK_MODEL[k].shape,
                           .residency = RLORCH_RES_HOST_PAGEABLE, .data = weights[k]};
  }
  set_version(0);

  rlorch_options o;
  rlorch_options_init(&o, sizeof o, RLORCH_ROLE_TRAINER);
  o.orchestrator = argv[1];
  o.name = argv[2];
  o.data_listen = argv[3];
  o.tensors = t;
  o.ntensors = SDK_MODEL_N;
  o.log = on_log;
  o.log_level = RLORCH_LOG_WARN;
  o.on_broadcast_before = before;
  o.on_broadcast_after = after;
  rlorch_worker *w = sdk_model_start(&o);
  if (!w) return 1;
  rlorch_error err;
  uint64_t version = 0;
  while (!stop_asked) {
    rlorch_command *cmd = NULL;
    rlorch_status rc = rlorch_next(w, 0.2, &cmd, &err);
    if (rc == RLORCH_TIMEOUT) continue;
    if (rc == RLORCH_E_STOPPED) break;
    if (rc != RLORCH_OK) {
      FAIL("next: %s: %s", rlorch_status_name(err.code), err.message);
      break;
    }
    if (cmd->kind == RLORCH_CMD_TRAIN) {
      rlorch_batch *b = NULL;
      struct timespec t0, t1;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      rc = rlorch_fetch_batch(w, cmd, &b, &err);
      if (rc) {
        printf("step=%llu batch refused: %s: %s\n", (unsigned long long)cmd->train.step,
               rlorch_status_name(err.code), err.message);
        rlorch_report_error(w, cmd, err.message, &err);
      } else {
        check_batch(b, cmd);
        rlorch_batch_free(b);
        uint64_t bad = bad_elems(version);
        if (bad) FAIL("step=%llu: %llu elements changed behind the trainer's back",
                      (unsigned long long)cmd->train.step, (unsigned long long)bad);
        version = cmd->train.step + 1;
        set_version(version);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        rc = rlorch_report_step(w, cmd, s, &err);
        if (rc) FAIL("report_step: %s: %s", rlorch_status_name(err.code), err.message);
        else if (rlorch_policy_version(w) != version)
          FAIL("policy version %llu after step %llu", (unsigned long long)rlorch_policy_version(w),
               (unsigned long long)cmd->train.step);
        /* The step is reported: it cannot be reported again. */
        rc = rlorch_report_step(w, cmd, s, &err);
        if (rc != RLORCH_E_STATE || !strstr(err.message, "is not the train step in progress"))
          FAIL("a second report of a step: %s: %s", rlorch_status_name(rc), err.message);
        printf("step=%llu done version=%llu\n", (unsigned long long)cmd->train.step,
               (unsigned long long)version);
      }
    } else if (cmd->kind == RLORCH_CMD_SHUTDOWN) {
      printf("shutdown reason=\"%s\"\n", cmd->shutdown_reason);
    } else {
      FAIL("a trainer got command kind %d", (int)cmd->kind);
    }
    fflush(stdout);
    rlorch_command_free(cmd);
  }
  rlorch_stop(w);
  rlorch_command *cmd = NULL;
  rlorch_status rc;
  while ((rc = rlorch_next(w, 5, &cmd, &err)) == RLORCH_OK) rlorch_command_free(cmd);
  if (rc != RLORCH_E_STOPPED) FAIL("after stop, next says %s", rlorch_status_name(rc));
  rlorch_free(w);
  for (size_t k = 0; k < SDK_MODEL_N; k++) free(weights[k]);
  printf("stopped failures=%d\n", failures);
  return failures ? 1 : 0;
}
