#include "orchestrator/daemon/rollout_check.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>

const char *rollout_fault_name(rollout_fault f) {
  switch (f) {
  case ROLLOUT_OK: return "ok";
  case ROLLOUT_TOO_LARGE: return "too_large";
  case ROLLOUT_TOKEN_COUNT: return "token_count";
  case ROLLOUT_LOGPROB_COUNT: return "logprob_count";
  case ROLLOUT_NOT_FINITE: return "not_finite";
  case ROLLOUT_FINISH_REASON: return "finish_reason";
  case ROLLOUT_MISMATCH: return "mismatch";
  case ROLLOUT_REASONS: break;
  }
  return "unknown";
}

uint32_t rollout_tokens(const Rlorch__V1__Rollout *r) {
  return r->n_completion_token_ids ? (uint32_t)r->n_completion_token_ids : r->tokens;
}

static rollout_fault rollout__one(const Rlorch__V1__Rollout *r, size_t i, uint64_t max_bytes,
                                  char *err, size_t errlen) {
  size_t bytes = protobuf_c_message_get_packed_size(&r->base);
  if (bytes > max_bytes) {
    snprintf(err, errlen, "rollouts[%zu]: %zu bytes is over max_rollout_bytes (%" PRIu64 ")", i,
             bytes, max_bytes);
    return ROLLOUT_TOO_LARGE;
  }
  size_t n = r->n_completion_token_ids;
  if (n && r->tokens && r->tokens != n) {
    snprintf(err, errlen, "rollouts[%zu].tokens: %" PRIu32 " for %zu completion_token_ids", i,
             r->tokens, n);
    return ROLLOUT_TOKEN_COUNT;
  }
  if (r->n_completion_logprobs && r->n_completion_logprobs != n) {
    snprintf(err, errlen,
             "rollouts[%zu].completion_logprobs: %zu values for %zu completion tokens", i,
             r->n_completion_logprobs, n);
    return ROLLOUT_LOGPROB_COUNT;
  }
  for (size_t k = 0; k < r->n_completion_logprobs; k++) {
    float lp = r->completion_logprobs[k];
    if (!isfinite(lp) || lp > 0) {
      snprintf(err, errlen, "rollouts[%zu].completion_logprobs[%zu]: %g is not a log-probability",
               i, k, (double)lp);
      return ROLLOUT_NOT_FINITE;
    }
  }
  for (size_t k = 0; k < r->n_rewards; k++) {
    if (!isfinite(r->rewards[k])) {
      snprintf(err, errlen, "rollouts[%zu].rewards[%zu]: %g is not a finite number", i, k,
               r->rewards[k]);
      return ROLLOUT_NOT_FINITE;
    }
  }
  if (!protobuf_c_enum_descriptor_get_value(&rlorch__v1__finish_reason__descriptor,
                                            (int)r->finish_reason)) {
    snprintf(err, errlen, "rollouts[%zu].finish_reason: unknown value %d", i,
             (int)r->finish_reason);
    return ROLLOUT_FINISH_REASON;
  }
  return ROLLOUT_OK;
}

rollout_fault rollout_check(const Rlorch__V1__RolloutResult *res, uint64_t max_rollout_bytes,
                            char *err, size_t errlen) {
  for (size_t i = 0; i < res->n_rollouts; i++) {
    rollout_fault f = rollout__one(res->rollouts[i], i, max_rollout_bytes, err, errlen);
    if (f != ROLLOUT_OK) return f;
  }
  return ROLLOUT_OK;
}
