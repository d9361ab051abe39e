/* The synthetic generator: one group per request, deterministic from its
 * inputs, lengths from the configured distribution, max_tokens and stop
 * tokens as an engine honours them, valid logprobs, ids, and the reward hook
 * with its failures. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/agent/agent_rollout.h"

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static const uint32_t PROMPT[] = {101, 7, 2024, 31999, 0, 5};

static agent_request request(uint32_t count) {
  agent_request rq;
  memset(&rq, 0, sizeof rq);
  rq.request_id = 11;
  rq.group_id = 7;
  rq.count = count;
  rq.prompt_token_ids = PROMPT;
  rq.n_prompt = sizeof PROMPT / sizeof PROMPT[0];
  agent_sampling_defaults(&rq.sampling);
  rq.sampling.seed = 1234;
  return rq;
}

static void gen_init(agent_rollout_gen *g, agent_rollout_cfg *cfg, uint64_t seed) {
  agent_rollout_gen_init(g, cfg, seed, NULL, NULL);
}

static void generate(agent_rollout_gen *g, const agent_request *rq, uint64_t version,
                     agent_group *out) {
  char err[256] = "";
  cr_assert_eq(agent_group_generate(g, rq, 3, version, out, err, sizeof err), 0, "%s", err);
  cr_assert_eq(out->n, rq->count, "exactly count completions");
}

static int same_completion(const agent_completion *a, const agent_completion *b) {
  return a->ntokens == b->ntokens && a->finish == b->finish && a->latency_s == b->latency_s &&
         !memcmp(a->token_ids, b->token_ids, a->ntokens * sizeof *a->token_ids) &&
         !memcmp(a->logprobs, b->logprobs, a->ntokens * sizeof *a->logprobs);
}

/* ---- the distribution -------------------------------------------------------------------------- */

static void check_stats(agent_dist dist) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  cfg.dist = dist;
  cfg.tokens_mean = 500;
  cfg.tokens_std = 100;
  cfg.latency_ms_mean = 20;
  cfg.latency_ms_std = 5;
  agent_rollout_gen g;
  gen_init(&g, &cfg, 1234);
  agent_request rq = request(20000);
  agent_group grp;
  generate(&g, &rq, 17, &grp);
  double st = 0, st2 = 0, sl = 0;
  for (uint32_t i = 0; i < grp.n; i++) {
    const agent_completion *c = &grp.c[i];
    cr_assert_geq(c->ntokens, 1u);
    cr_assert_geq(c->latency_s, 0.0);
    cr_assert_eq(c->finish, AGENT_FINISH_STOP, "no cap, no stop token: the drawn end");
    st += c->ntokens;
    st2 += (double)c->ntokens * c->ntokens;
    sl += c->latency_s;
  }
  double n = grp.n, mean = st / n, sd = sqrt(st2 / n - mean * mean);
  cr_assert_lt(fabs(mean - 500), 5, "token mean %g", mean);
  cr_assert_lt(fabs(sd - 100), 5, "token std %g", sd);
  cr_assert_lt(fabs(sl / n - 0.020), 0.0005, "latency mean %g s", sl / n);
  agent_group_free(&grp);
}

Test(agent_rollout, lognormal_statistics) { check_stats(AGENT_DIST_LOGNORMAL); }
Test(agent_rollout, normal_statistics) { check_stats(AGENT_DIST_NORMAL); }

Test(agent_rollout, normal_is_clipped_at_one_token) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  cfg.dist = AGENT_DIST_NORMAL;
  cfg.tokens_mean = 2;
  cfg.tokens_std = 50;
  cfg.latency_ms_mean = 0;
  cfg.latency_ms_std = 1;
  agent_rollout_gen g;
  gen_init(&g, &cfg, 5);
  agent_request rq = request(1000);
  agent_group grp;
  generate(&g, &rq, 0, &grp);
  int ones = 0;
  for (uint32_t i = 0; i < grp.n; i++) {
    cr_assert_geq(grp.c[i].ntokens, 1u);
    cr_assert_geq(grp.c[i].latency_s, 0.0);
    ones += grp.c[i].ntokens == 1;
  }
  cr_assert_gt(ones, 300, "about half the draws are clipped, saw %d", ones);
  agent_group_free(&grp);
}

/* ---- the group --------------------------------------------------------------------------------- */

Test(agent_rollout, a_group_carries_its_request_and_version) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  agent_rollout_gen g;
  gen_init(&g, &cfg, 77);
  agent_request rq = request(5);
  agent_group a, b;
  generate(&g, &rq, 3, &a);
  rq.request_id = 12;
  rq.group_id = 8;
  generate(&g, &rq, 4, &b);
  cr_assert_eq(a.request_id, 11u);
  cr_assert_eq(a.group_id, 7u);
  cr_assert_eq(a.policy_version, 3u);
  cr_assert_eq(b.request_id, 12u);
  cr_assert_eq(b.group_id, 8u);
  cr_assert_eq(b.policy_version, 4u);
  uint64_t ids[10];
  for (uint32_t i = 0; i < 5; i++) {
    cr_assert_eq(a.c[i].index, i);
    cr_assert_eq(a.c[i].id >> 40, 3u, "rank in the id");
    cr_assert_eq(a.c[i].seconds, 0.0, "nothing slept yet");
    cr_assert_eq(a.c[i].nrewards, 0u, "not scored yet");
    ids[i] = a.c[i].id;
    ids[5 + i] = b.c[i].id;
  }
  qsort(ids, 10, sizeof ids[0], cmp_u64);
  for (int i = 1; i < 10; i++) cr_assert_neq(ids[i], ids[i - 1], "duplicate id");
  /* Completions of one group differ from each other. */
  for (uint32_t i = 1; i < 5; i++) cr_assert_not(same_completion(&a.c[i], &a.c[0]));
  agent_group_free(&a);
  agent_group_free(&b);
  /* count 0 is an empty group, not an error. */
  rq.count = 0;
  generate(&g, &rq, 0, &a);
  cr_assert_null(a.c);
  agent_group_free(&a);
  agent_group_free(NULL);
}

typedef struct {
  agent_rollout_gen *g;
  uint64_t ids[4 * 50];
} par_arg;

static void *par_main(void *arg) {
  par_arg *p = arg;
  static int next;
  int k = __atomic_fetch_add(&next, 1, __ATOMIC_SEQ_CST);
  agent_request rq = request(50);
  agent_group grp;
  char err[128];
  cr_assert_eq(agent_group_generate(p->g, &rq, 1, 0, &grp, err, sizeof err), 0);
  for (uint32_t i = 0; i < grp.n; i++) p->ids[k * 50 + i] = grp.c[i].id;
  agent_group_free(&grp);
  return NULL;
}

Test(agent_rollout, ids_stay_unique_across_generator_threads) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  agent_rollout_gen g;
  gen_init(&g, &cfg, 1);
  par_arg p = {.g = &g};
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, par_main, &p);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  qsort(p.ids, 200, sizeof p.ids[0], cmp_u64);
  for (int i = 1; i < 200; i++) cr_assert_neq(p.ids[i], p.ids[i - 1], "duplicate id");
  cr_assert_eq(p.ids[199] & 0xffffffffffull, 200u, "ids counted from 1");
}

Test(agent_rollout, the_same_inputs_give_the_same_completions) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  agent_rollout_gen g, h;
  gen_init(&g, &cfg, 1);
  gen_init(&h, &cfg, 2); /* the generator's own seed does not matter with a sampling seed */
  agent_request rq = request(4);
  agent_group base, again, other;
  generate(&g, &rq, 9, &base);
  generate(&h, &rq, 9, &again);
  for (uint32_t i = 0; i < 4; i++) cr_assert(same_completion(&base.c[i], &again.c[i]), "%u", i);
  agent_group_free(&again);
  /* The request id does not count either: a request sent again to another
   * worker samples the same way. */
  rq.request_id = 99;
  generate(&g, &rq, 9, &again);
  for (uint32_t i = 0; i < 4; i++) cr_assert(same_completion(&base.c[i], &again.c[i]), "%u", i);
  agent_group_free(&again);
  /* Each of prompt, seed and version does. */
  agent_request v = request(4);
  v.sampling.seed = 1235;
  generate(&g, &v, 9, &other);
  for (uint32_t i = 0; i < 4; i++) cr_assert_not(same_completion(&base.c[i], &other.c[i]));
  agent_group_free(&other);
  v = request(4);
  generate(&g, &v, 10, &other);
  for (uint32_t i = 0; i < 4; i++) cr_assert_not(same_completion(&base.c[i], &other.c[i]));
  agent_group_free(&other);
  v = request(4);
  uint32_t changed[sizeof PROMPT / sizeof PROMPT[0]];
  memcpy(changed, PROMPT, sizeof PROMPT);
  changed[5] = 6;
  v.prompt_token_ids = changed;
  generate(&g, &v, 9, &other);
  for (uint32_t i = 0; i < 4; i++) cr_assert_not(same_completion(&base.c[i], &other.c[i]));
  agent_group_free(&other);
  agent_group_free(&base);
}

Test(agent_rollout, without_a_seed_the_generator_chooses) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  agent_rollout_gen g, h;
  gen_init(&g, &cfg, 1);
  gen_init(&h, &cfg, 2);
  agent_request rq = request(3);
  rq.sampling.seed = 0;
  agent_group a, b, c, d;
  generate(&g, &rq, 0, &a);
  generate(&g, &rq, 0, &b);
  generate(&h, &rq, 0, &c);
  rq.request_id++;
  generate(&g, &rq, 0, &d);
  for (uint32_t i = 0; i < 3; i++) {
    cr_assert(same_completion(&a.c[i], &b.c[i]), "same generator seed and request: the same");
    cr_assert_not(same_completion(&a.c[i], &c.c[i]), "another generator seed: other tokens");
    cr_assert_not(same_completion(&a.c[i], &d.c[i]), "another request: other tokens");
  }
  agent_group_free(&a);
  agent_group_free(&b);
  agent_group_free(&c);
  agent_group_free(&d);
}

Test(agent_rollout, an_empty_prompt_is_an_empty_context) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  agent_rollout_gen g;
  gen_init(&g, &cfg, 1);
  agent_request rq = request(2);
  rq.prompt_token_ids = NULL;
  rq.n_prompt = 0;
  agent_group e, z;
  generate(&g, &rq, 0, &e);
  static const uint32_t zero[] = {0};
  rq.prompt_token_ids = zero;
  rq.n_prompt = 1;
  generate(&g, &rq, 0, &z);
  for (uint32_t i = 0; i < 2; i++) {
    cr_assert_geq(e.c[i].ntokens, 1u);
    cr_assert_not(same_completion(&e.c[i], &z.c[i]), "[] and [0] are different prompts");
  }
  agent_group_free(&e);
  agent_group_free(&z);
}

/* ---- sampling ---------------------------------------------------------------------------------- */

Test(agent_rollout, max_tokens_caps_with_length_and_keeps_a_prefix) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg); /* 256 tokens on average: always above 10 */
  agent_rollout_gen g;
  gen_init(&g, &cfg, 1);
  agent_request rq = request(50);
  agent_group free_run, capped, loose;
  generate(&g, &rq, 2, &free_run);
  rq.sampling.max_tokens = 10;
  generate(&g, &rq, 2, &capped);
  rq.sampling.max_tokens = 100000;
  generate(&g, &rq, 2, &loose);
  for (uint32_t i = 0; i < 50; i++) {
    const agent_completion *f = &free_run.c[i], *c = &capped.c[i];
    cr_assert_gt(f->ntokens, 10u);
    cr_assert_eq(c->ntokens, 10u);
    cr_assert_eq(c->finish, AGENT_FINISH_LENGTH);
    cr_assert_eq(memcmp(c->token_ids, f->token_ids, 10 * sizeof *c->token_ids), 0,
                 "a capped completion is the start of the free one");
    cr_assert(same_completion(&loose.c[i], f), "a cap above the length changes nothing");
    cr_assert_eq(loose.c[i].finish, AGENT_FINISH_STOP);
  }
  agent_group_free(&free_run);
  agent_group_free(&capped);
  agent_group_free(&loose);
}

Test(agent_rollout, stop_tokens_end_a_completion_and_are_kept) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  cfg.vocab_size = 8; /* so a stop token comes soon */
  agent_rollout_gen g;
  gen_init(&g, &cfg, 1);
  agent_request rq = request(200);
  static const uint32_t stops[] = {6, 2, 99999};
  agent_group free_run, stopped;
  generate(&g, &rq, 0, &free_run);
  rq.sampling.stop_token_ids = stops;
  rq.sampling.nstop = 3;
  generate(&g, &rq, 0, &stopped);
  int early = 0;
  for (uint32_t i = 0; i < 200; i++) {
    const agent_completion *f = &free_run.c[i], *s = &stopped.c[i];
    cr_assert_eq(s->finish, AGENT_FINISH_STOP);
    cr_assert_leq(s->ntokens, f->ntokens);
    cr_assert_eq(memcmp(s->token_ids, f->token_ids, s->ntokens * sizeof *s->token_ids), 0);
    for (uint32_t k = 0; k + 1 < s->ntokens; k++)
      cr_assert(s->token_ids[k] != 2 && s->token_ids[k] != 6, "stop token %u at %u of %u",
                s->token_ids[k], k, s->ntokens);
    uint32_t last = s->token_ids[s->ntokens - 1];
    if (s->ntokens < f->ntokens) {
      early++;
      cr_assert(last == 2 || last == 6, "cut short, so by a stop token (the last is %u)", last);
    }
  }
  cr_assert_gt(early, 190, "with 2 stop ids of 8 nearly every completion stops early: %d", early);
  agent_group_free(&free_run);
  agent_group_free(&stopped);
  /* A cap shorter than the first stop token wins, and says LENGTH. */
  rq.sampling.max_tokens = 1;
  generate(&g, &rq, 0, &stopped);
  for (uint32_t i = 0; i < 200; i++) {
    const agent_completion *s = &stopped.c[i];
    int stop = s->token_ids[0] == 2 || s->token_ids[0] == 6;
    cr_assert_eq(s->ntokens, 1u);
    cr_assert_eq(s->finish, stop ? AGENT_FINISH_STOP : AGENT_FINISH_LENGTH,
                 "a stop token as the last allowed one still stops");
  }
  agent_group_free(&stopped);
}

Test(agent_rollout, ids_below_the_vocabulary_and_logprobs_valid) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  cfg.vocab_size = 1000;
  agent_rollout_gen g;
  gen_init(&g, &cfg, 1);
  agent_request rq = request(20);
  rq.sampling.temperature = 0.7;
  agent_group grp;
  generate(&g, &rq, 0, &grp);
  size_t below = 0, total = 0, zero = 0;
  for (uint32_t i = 0; i < grp.n; i++) {
    const agent_completion *c = &grp.c[i];
    for (uint32_t k = 0; k < c->ntokens; k++) {
      cr_assert_lt(c->token_ids[k], 1000u);
      cr_assert(isfinite(c->logprobs[k]) && c->logprobs[k] <= 0, "logprob %g", c->logprobs[k]);
      cr_assert_geq(c->logprobs[k], -4 * 0.7f - 1e-5f, "scaled by the temperature");
      below += c->token_ids[k] < 500;
      zero += c->logprobs[k] == 0;
      total++;
    }
  }
  cr_assert(below > total * 45 / 100 && below < total * 55 / 100, "%zu of %zu below 500", below,
            total);
  cr_assert_lt(zero, total / 100, "sampled tokens are not certain");
  agent_group_free(&grp);
  /* An absurd temperature still gives finite logprobs. */
  rq.sampling.temperature = 1e30;
  generate(&g, &rq, 0, &grp);
  for (uint32_t k = 0; k < grp.c[0].ntokens; k++) cr_assert(isfinite(grp.c[0].logprobs[k]));
  agent_group_free(&grp);
}

Test(agent_rollout, greedy_gives_one_completion_with_certain_tokens) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  agent_rollout_gen g;
  gen_init(&g, &cfg, 1);
  agent_request rq = request(4);
  rq.sampling.temperature = 0;
  agent_group grp;
  generate(&g, &rq, 0, &grp);
  for (uint32_t i = 0; i < grp.n; i++) {
    cr_assert(same_completion(&grp.c[i], &grp.c[0]), "greedy: every completion the same");
    for (uint32_t k = 0; k < grp.c[i].ntokens; k++) {
      cr_assert_eq(grp.c[i].logprobs[k], 0.0f);
      cr_assert_not(signbit(grp.c[i].logprobs[k]), "0, not -0");
    }
  }
  cr_assert_neq(grp.c[0].id, grp.c[1].id, "still distinct rollouts");
  agent_group_free(&grp);
}

/* ---- rewards ----------------------------------------------------------------------------------- */

Test(agent_rollout, the_default_reward_is_the_share_of_low_ids) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  cfg.vocab_size = 10;
  cfg.tokens_mean = 20;
  cfg.tokens_std = 10;
  agent_rollout_gen g;
  gen_init(&g, &cfg, 1);
  agent_request rq = request(30);
  agent_group grp;
  generate(&g, &rq, 0, &grp);
  char err[256] = "";
  cr_assert_eq(agent_group_reward(&g, &rq, &grp, err, sizeof err), 0, "%s", err);
  double lo = 1, hi = 0;
  for (uint32_t i = 0; i < grp.n; i++) {
    const agent_completion *c = &grp.c[i];
    uint32_t low = 0;
    for (uint32_t k = 0; k < c->ntokens; k++) low += c->token_ids[k] < 5;
    cr_assert_eq(c->nrewards, 1u);
    cr_assert_float_eq(c->rewards[0], (double)low / c->ntokens, 1e-12);
    lo = fmin(lo, c->rewards[0]);
    hi = fmax(hi, c->rewards[0]);
  }
  cr_assert(lo >= 0 && hi <= 1 && lo < hi, "rewards in [0, 1] that vary: %g..%g", lo, hi);
  agent_group_free(&grp);
}

typedef struct hook_state {
  int calls;
  int fail_at;        /* index that fails, -1: none */
  const char *msg;    /* its message, "" for none */
  size_t nrewards;    /* rewards returned */
  double value;       /* the first reward, when not the default formula */
  int use_value;
  agent_reward_input seen[8];
} hook_state;

static int hook(void *ud, const agent_reward_input *in, double *rewards, size_t cap, size_t *n,
                char *err, size_t errlen) {
  hook_state *h = ud;
  cr_assert_eq(cap, (size_t)AGENT_REWARDS_MAX);
  if (h->calls < 8) h->seen[h->calls] = *in;
  h->calls++;
  if ((int)in->index == h->fail_at) {
    snprintf(err, errlen, "%s", h->msg);
    return 1;
  }
  for (size_t k = 0; k < h->nrewards && k < cap; k++) rewards[k] = in->index * 10.0 + k;
  if (h->use_value) rewards[0] = h->value;
  *n = h->nrewards;
  return 0;
}

Test(agent_rollout, a_reward_hook_sees_each_completion) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  hook_state h = {.fail_at = -1, .nrewards = 3};
  agent_rollout_gen g;
  agent_rollout_gen_init(&g, &cfg, 1, hook, &h);
  agent_request rq = request(4);
  rq.sampling.max_tokens = 3;
  static const uint8_t meta[] = {'4', '2', 0, 'x'};
  rq.prompt_metadata = meta;
  rq.n_metadata = sizeof meta;
  agent_group grp;
  generate(&g, &rq, 5, &grp);
  char err[256] = "";
  cr_assert_eq(agent_group_reward(&g, &rq, &grp, err, sizeof err), 0, "%s", err);
  cr_assert_eq(h.calls, 4);
  for (uint32_t i = 0; i < 4; i++) {
    const agent_reward_input *in = &h.seen[i];
    cr_assert_eq(in->prompt_token_ids, PROMPT);
    cr_assert_eq(in->n_prompt, 6u);
    cr_assert_eq(in->completion_token_ids, grp.c[i].token_ids);
    cr_assert_eq(in->completion_logprobs, grp.c[i].logprobs);
    cr_assert_eq(in->n_completion, 3u);
    cr_assert_eq(in->prompt_metadata, meta);
    cr_assert_eq(in->n_metadata, 4u);
    cr_assert_eq(in->finish_reason, AGENT_FINISH_LENGTH);
    cr_assert_eq(in->request_id, 11u);
    cr_assert_eq(in->group_id, 7u);
    cr_assert_eq(in->index, i);
    cr_assert_eq(in->group_size, 4u);
    cr_assert_eq(in->policy_version, 5u);
    cr_assert_eq(in->vocab_size, 32000u);
    cr_assert_eq(grp.c[i].nrewards, 3u);
    for (size_t k = 0; k < 3; k++) cr_assert_eq(grp.c[i].rewards[k], i * 10.0 + k);
  }
  agent_group_free(&grp);
}

static void expect_hook_error(hook_state h, const char *want) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  agent_rollout_gen g;
  agent_rollout_gen_init(&g, &cfg, 1, hook, &h);
  agent_request rq = request(4);
  agent_group grp;
  generate(&g, &rq, 0, &grp);
  char err[256] = "";
  cr_assert_eq(agent_group_reward(&g, &rq, &grp, err, sizeof err), -1, "accepted");
  cr_assert_str_eq(err, want);
  agent_group_free(&grp);
}

Test(agent_rollout, a_failing_reward_hook_fails_the_group) {
  expect_hook_error((hook_state){.fail_at = 2, .msg = "verifier timed out", .nrewards = 1},
                    "reward hook: group 7 completion 2: verifier timed out");
  expect_hook_error((hook_state){.fail_at = 0, .msg = "", .nrewards = 1},
                    "reward hook: group 7 completion 0: failed without a message");
  expect_hook_error((hook_state){.fail_at = -1, .nrewards = 0},
                    "reward hook: group 7 completion 0: 0 rewards (want 1 to 16)");
  expect_hook_error((hook_state){.fail_at = -1, .nrewards = 17},
                    "reward hook: group 7 completion 0: 17 rewards (want 1 to 16)");
  expect_hook_error((hook_state){.fail_at = -1, .nrewards = 2, .use_value = 1, .value = NAN},
                    "reward hook: group 7 completion 0: rewards[0] is nan, not a finite number");
  expect_hook_error((hook_state){.fail_at = -1, .nrewards = 1, .use_value = 1, .value = -INFINITY},
                    "reward hook: group 7 completion 0: rewards[0] is -inf, not a finite number");
}

/* ---- settings ---------------------------------------------------------------------------------- */

Test(agent_rollout, config_checks_name_the_flag) {
  agent_rollout_cfg cfg;
  char err[256];
  agent_rollout_cfg_defaults(&cfg);
  cr_assert_eq(cfg.vocab_size, 32000u);
  cr_assert_eq(agent_rollout_cfg_check(&cfg, err, sizeof err), 0);
  cfg.tokens_mean = 0;
  cr_assert_eq(agent_rollout_cfg_check(&cfg, err, sizeof err), -1);
  cr_assert(strstr(err, "--tokens-mean"), "%s", err);
  agent_rollout_cfg_defaults(&cfg);
  cfg.tokens_mean = 2e6;
  cr_assert_eq(agent_rollout_cfg_check(&cfg, err, sizeof err), -1);
  cr_assert(strstr(err, "--tokens-mean"), "%s", err);
  agent_rollout_cfg_defaults(&cfg);
  cfg.latency_ms_std = -1;
  cr_assert_eq(agent_rollout_cfg_check(&cfg, err, sizeof err), -1);
  cr_assert(strstr(err, "--latency-ms-std"), "%s", err);
  agent_rollout_cfg_defaults(&cfg);
  cfg.latency_ms_mean = NAN;
  cr_assert_eq(agent_rollout_cfg_check(&cfg, err, sizeof err), -1);
  agent_rollout_cfg_defaults(&cfg);
  cfg.vocab_size = 1;
  cr_assert_eq(agent_rollout_cfg_check(&cfg, err, sizeof err), -1);
  cr_assert_str_eq(err, "--vocab-size: 1 out of range (at least 2)");
  agent_dist d;
  cr_assert_eq(agent_dist_parse("normal", &d), 0);
  cr_assert_eq(d, AGENT_DIST_NORMAL);
  cr_assert_eq(agent_dist_parse("gamma", &d), -1);
  agent_sampling s;
  agent_sampling_defaults(&s);
  cr_assert(s.temperature == 1.0 && s.max_tokens == 0 && s.nstop == 0 && s.seed == 0);
}
