/* The batch of a train step: FetchBatch, checked as it arrives, retried. */
#include "workers/agent/agent_batch.h"

#include <stdio.h>
#include <string.h>

#include "workers/agent/agent_log.h"

#define AGENT__FETCH_ATTEMPTS 3
/* A fetch's deadline: this much, plus the batch at the slowest rate worth
 * waiting for, so a large batch is not cut short and a stuck one is. */
#define AGENT__FETCH_BASE_S 30.0
#define AGENT__FETCH_MIN_BYTES_PER_S 10e6
/* An orchestrator that cannot be reached is waited for this long (it may be
 * restarting: then it answers that it does not know this worker, and the
 * step is skipped), before the fetch counts as failed. */
#define AGENT__FETCH_UNREACHABLE_S 120.0

/* What one fetch received, checked against the train step as it arrives. */
typedef struct agent__batch {
  const Rlorch__V1__TrainStep *ts;
  const agent_batch_sink *sink;
  /* This rank's share (TrainStep.trainer_rank of trainer_ranks): rollouts
   * [first, end) of the step's, in `groups` whole groups, cut as the
   * orchestrator cuts it. A lone trainer's is the whole batch. */
  size_t first, end;
  uint32_t groups;
  size_t got; /* rollouts received, each the one the step names next */
  uint64_t completion_tokens;
  uint64_t messages;
  int sink_failed;
  char err[256]; /* set when the stream was cancelled here: what was wrong */
} agent__batch;

static int agent__on_chunk(const Rlorch__V1__BatchChunk *c, void *ud) {
  agent__batch *b = ud;
  const Rlorch__V1__TrainStep *ts = b->ts;
  size_t want = b->end - b->first;
  if (b->messages++ == 0 && (c->share_rollouts != want || c->share_groups != b->groups)) {
    snprintf(b->err, sizeof b->err,
             "the batch holds %u rollouts in %u groups, the train step's share %zu in %u",
             c->share_rollouts, c->share_groups, want, b->groups);
    return 1;
  }
  for (size_t i = 0; i < c->n_rollouts; i++, b->got++) {
    if (b->got == want) {
      snprintf(b->err, sizeof b->err, "more rollouts than the train step's share of %zu", want);
      return 1;
    }
    if (c->rollouts[i]->id != ts->rollout_ids[b->first + b->got]) {
      snprintf(b->err, sizeof b->err, "rollout %zu of the batch is %llu, the train step says %llu",
               b->first + b->got, (unsigned long long)c->rollouts[i]->id,
               (unsigned long long)ts->rollout_ids[b->first + b->got]);
      return 1;
    }
    if (b->sink && b->sink->rollout && b->sink->rollout(b->sink->ud, c->rollouts[i])) {
      b->sink_failed = 1;
      snprintf(b->err, sizeof b->err, "no memory for rollout %zu of the batch", b->got);
      return 1;
    }
    b->completion_tokens += c->rollouts[i]->n_completion_token_ids;
  }
  return 0;
}

int agent_batch_fetch(agent *a, const Rlorch__V1__TrainStep *ts, const agent_batch_sink *sink,
                      char *err, size_t errlen) {
  double timeout = AGENT__FETCH_BASE_S + (double)ts->batch_bytes / AGENT__FETCH_MIN_BYTES_PER_S;
  double backoff = 0.2, unreachable_since = -1;
  if (errlen) err[0] = 0;
  for (int attempt = 1;; attempt++) {
    agent__batch b = {.ts = ts, .sink = sink};
    uint32_t ranks = ts->trainer_ranks ? ts->trainer_ranks : 1;
    uint32_t rank = ts->trainer_rank < ranks ? ts->trainer_rank : 0;
    uint64_t g0 = (uint64_t)rank * ts->groups / ranks, g1 = ((uint64_t)rank + 1) * ts->groups / ranks;
    b.first = ranks > 1 ? (size_t)(g0 * ts->group_size) : 0;
    b.end = ranks > 1 ? (size_t)(g1 * ts->group_size) : ts->n_rollout_ids;
    if (b.first > ts->n_rollout_ids) b.first = ts->n_rollout_ids;
    if (b.end > ts->n_rollout_ids) b.end = ts->n_rollout_ids;
    b.groups = ranks > 1 ? (uint32_t)(g1 - g0) : ts->groups;
    if (sink && sink->begin) sink->begin(sink->ud);
    rpc_status st = {0};
    double t0 = agent_now();
    grpc_status_code code = agent_fetch_batch(a, ts->step, rank, ranks, timeout, agent__on_chunk, &b, &st);
    if (agent_stopping(a)) {
      snprintf(err, errlen, "step %llu: the worker is stopping", (unsigned long long)ts->step);
      return 1;
    }
    if (code == GRPC_STATUS_OK && !b.err[0] && b.got != b.end - b.first)
      snprintf(b.err, sizeof b.err, "%zu of the train step's %zu rollouts arrived", b.got,
               b.end - b.first);
    if (code == GRPC_STATUS_OK && !b.err[0]) {
      agent_log_debug("batch", "step=%llu rollouts=%zu groups=%u completion_tokens=%llu bytes=%llu "
                      "messages=%llu fetch_s=%.4f", (unsigned long long)ts->step, b.got, ts->groups,
                      (unsigned long long)b.completion_tokens,
                      (unsigned long long)ts->batch_bytes, (unsigned long long)b.messages,
                      agent_now() - t0);
      return 0;
    }
    if (b.err[0]) { /* cancelled here: the batch is not the step's */
      code = GRPC_STATUS_DATA_LOSS;
      snprintf(st.message, sizeof st.message, "%s", b.err);
    }
    int refused = code == GRPC_STATUS_FAILED_PRECONDITION || code == GRPC_STATUS_NOT_FOUND ||
                code == GRPC_STATUS_ABORTED || code == GRPC_STATUS_INVALID_ARGUMENT;
    int unreachable = code == GRPC_STATUS_UNAVAILABLE;
    if (!unreachable) unreachable_since = -1;
    else if (unreachable_since < 0) unreachable_since = t0;
    int fatal = b.sink_failed || code == GRPC_STATUS_UNAUTHENTICATED ||
                code == GRPC_STATUS_PERMISSION_DENIED ||
                (unreachable ? agent_now() - unreachable_since > AGENT__FETCH_UNREACHABLE_S
                             : !refused && attempt >= AGENT__FETCH_ATTEMPTS);
    snprintf(err, errlen, "step %llu: FetchBatch: %s: %s", (unsigned long long)ts->step,
             rpc_status_name(code), st.message);
    agent_log_error("batch_fetch_failed", "step=%llu attempt=%d of %d code=%s msg=\"%s\" action=%s",
                    (unsigned long long)ts->step, attempt, AGENT__FETCH_ATTEMPTS,
                    rpc_status_name(code), st.message,
                    refused ? "skip_step" : fatal ? "exit" : "retry");
    if (refused) return 1;
    if (fatal) return -1;
    agent_sleep(a, backoff);
    backoff = backoff * 2 > 5.0 ? 5.0 : backoff * 2;
  }
}
