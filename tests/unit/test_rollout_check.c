/* A rollout report is checked whole before the scheduler sees it; each fault is
 * named by the field it is in. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/daemon/rollout_check.h"

typedef struct {
  Rlorch__V1__Rollout r[2];
  Rlorch__V1__Rollout *rp[2];
  Rlorch__V1__RolloutResult res;
  uint32_t prompt[3], completion[4];
  float logprobs[4];
  double rewards[2];
} report;

/* Two well-formed rollouts of one group. */
static void good(report *t) {
  memset(t, 0, sizeof *t);
  rlorch__v1__rollout_result__init(&t->res);
  for (int k = 0; k < 3; k++) t->prompt[k] = 100u + (uint32_t)k;
  for (int k = 0; k < 4; k++) {
    t->completion[k] = 7u + (uint32_t)k;
    t->logprobs[k] = -0.5f * (float)k;
  }
  t->rewards[0] = 1.0;
  t->rewards[1] = -0.25;
  for (int i = 0; i < 2; i++) {
    Rlorch__V1__Rollout *r = &t->r[i];
    rlorch__v1__rollout__init(r);
    r->id = (uint64_t)i + 1;
    r->n_prompt_token_ids = 3;
    r->prompt_token_ids = t->prompt;
    r->n_completion_token_ids = 4;
    r->completion_token_ids = t->completion;
    r->n_completion_logprobs = 4;
    r->completion_logprobs = t->logprobs;
    r->n_rewards = 2;
    r->rewards = t->rewards;
    r->group_id = 9;
    r->finish_reason = RLORCH__V1__FINISH_REASON__FINISH_REASON_STOP;
    t->rp[i] = r;
  }
  t->res.n_rollouts = 2;
  t->res.rollouts = t->rp;
}

static void expect(report *t, uint64_t max, rollout_fault want, const char *msg) {
  char err[256] = "";
  cr_assert_eq(rollout_check(&t->res, max, err, sizeof err), want, "%s", err);
  cr_assert_str_eq(err, msg);
}

Test(rollout_check, well_formed_reports_pass) {
  report t;
  good(&t);
  char err[256] = "";
  cr_assert_eq(rollout_check(&t.res, 1 << 20, err, sizeof err), ROLLOUT_OK, "%s", err);
  cr_assert_eq(rollout_tokens(&t.r[0]), 4u, "tokens come from completion_token_ids");
  t.r[1].n_completion_logprobs = 0; /* logprobs are optional */
  t.r[1].tokens = 4;                /* a matching count is fine */
  cr_assert_eq(rollout_check(&t.res, 1 << 20, err, sizeof err), ROLLOUT_OK, "%s", err);
  Rlorch__V1__Rollout bare = RLORCH__V1__ROLLOUT__INIT;
  bare.tokens = 12;
  cr_assert_eq(rollout_tokens(&bare), 12u, "without ids the count is taken as given");
}

Test(rollout_check, counts_that_differ_name_the_field) {
  report t;
  good(&t);
  t.r[1].n_completion_logprobs = 3;
  expect(&t, 1 << 20, ROLLOUT_LOGPROB_COUNT,
         "rollouts[1].completion_logprobs: 3 values for 4 completion tokens");
  good(&t);
  t.r[0].tokens = 5;
  expect(&t, 1 << 20, ROLLOUT_TOKEN_COUNT, "rollouts[0].tokens: 5 for 4 completion_token_ids");
}

Test(rollout_check, numbers_that_are_not_finite) {
  report t;
  good(&t);
  t.rewards[1] = NAN;
  expect(&t, 1 << 20, ROLLOUT_NOT_FINITE, "rollouts[0].rewards[1]: nan is not a finite number");
  good(&t);
  t.logprobs[2] = INFINITY;
  expect(&t, 1 << 20, ROLLOUT_NOT_FINITE,
         "rollouts[0].completion_logprobs[2]: inf is not a log-probability");
  good(&t);
  t.logprobs[1] = 0.5f; /* a probability above 1 */
  expect(&t, 1 << 20, ROLLOUT_NOT_FINITE,
         "rollouts[0].completion_logprobs[1]: 0.5 is not a log-probability");
}

Test(rollout_check, unknown_finish_reason) {
  report t;
  good(&t);
  t.r[1].finish_reason = (Rlorch__V1__FinishReason)42;
  expect(&t, 1 << 20, ROLLOUT_FINISH_REASON, "rollouts[1].finish_reason: unknown value 42");
}

Test(rollout_check, size_limit_names_the_limit) {
  report t;
  good(&t);
  size_t one = protobuf_c_message_get_packed_size(&t.r[0].base);
  char want[160];
  snprintf(want, sizeof want, "rollouts[0]: %zu bytes is over max_rollout_bytes (%zu)", one,
           one - 1);
  expect(&t, one - 1, ROLLOUT_TOO_LARGE, want);
  char err[256];
  cr_assert_eq(rollout_check(&t.res, one, err, sizeof err), ROLLOUT_OK, "the limit is inclusive");
}

Test(rollout_check, fault_names_are_metric_labels) {
  cr_assert_str_eq(rollout_fault_name(ROLLOUT_TOO_LARGE), "too_large");
  cr_assert_str_eq(rollout_fault_name(ROLLOUT_LOGPROB_COUNT), "logprob_count");
  cr_assert_str_eq(rollout_fault_name(ROLLOUT_NOT_FINITE), "not_finite");
  for (int f = ROLLOUT_OK; f < ROLLOUT_REASONS; f++)
    cr_assert(strspn(rollout_fault_name((rollout_fault)f), "abcdefghijklmnopqrstuvwxyz_") ==
              strlen(rollout_fault_name((rollout_fault)f)));
}
