/* The agents' rollout conversions: a request into the generator's terms, a
 * generated group into the result message. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "workers/agent/agent_pb.h"

Test(agent_pb, a_request_with_its_sampling) {
  uint32_t prompt[] = {4, 5};
  uint32_t stops[] = {2, 3};
  uint8_t meta[] = {1, 0, 2};
  Rlorch__V1__SamplingParams sp = RLORCH__V1__SAMPLING_PARAMS__INIT;
  sp.temperature = 0.5f;
  sp.top_p = 0.9f;
  sp.top_k = 40;
  sp.max_tokens = 64;
  sp.n_stop_token_ids = 2;
  sp.stop_token_ids = stops;
  sp.seed = 77;
  Rlorch__V1__RolloutRequest m = RLORCH__V1__ROLLOUT_REQUEST__INIT;
  m.request_id = 9;
  m.count = 8;
  m.group_id = 40;
  m.n_prompt_token_ids = 2;
  m.prompt_token_ids = prompt;
  m.sampling = &sp;
  m.prompt_metadata.data = meta;
  m.prompt_metadata.len = 3;
  agent_request rq;
  agent_pb_request(&m, &rq);
  cr_assert_eq(rq.request_id, 9u);
  cr_assert_eq(rq.group_id, 40u);
  cr_assert_eq(rq.count, 8u);
  cr_assert_eq(rq.prompt_token_ids, prompt);
  cr_assert_eq(rq.n_prompt, 2u);
  cr_assert_eq(rq.prompt_metadata, meta);
  cr_assert_eq(rq.n_metadata, 3u);
  cr_assert_float_eq(rq.sampling.temperature, 0.5, 1e-9);
  cr_assert_eq(rq.sampling.max_tokens, 64u);
  cr_assert_eq(rq.sampling.stop_token_ids, stops);
  cr_assert_eq(rq.sampling.nstop, 2u);
  cr_assert_eq(rq.sampling.seed, 77u);
  /* A request from an orchestrator that sends neither sampling nor group. */
  m.sampling = NULL;
  m.group_id = 0;
  agent_pb_request(&m, &rq);
  cr_assert_eq(rq.group_id, 9u, "the request is its own group");
  cr_assert_float_eq(rq.sampling.temperature, 1.0, 1e-9);
  cr_assert(rq.sampling.max_tokens == 0 && rq.sampling.nstop == 0 && rq.sampling.seed == 0);
}

Test(agent_pb, a_group_as_a_result) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  cfg.tokens_mean = 9000; /* above the shaped limit, mostly */
  cfg.tokens_std = 3000;
  agent_rollout_gen g;
  agent_rollout_gen_init(&g, &cfg, 1, NULL, NULL);
  agent_request rq;
  memset(&rq, 0, sizeof rq);
  rq.request_id = 3;
  rq.group_id = 30;
  rq.count = 40;
  agent_sampling_defaults(&rq.sampling);
  agent_group grp;
  char err[128];
  cr_assert_eq(agent_group_generate(&g, &rq, 2, 6, &grp, err, sizeof err), 0);
  cr_assert_eq(agent_group_reward(&g, &rq, &grp, err, sizeof err), 0);
  grp.c[0].seconds = 0.25;
  Rlorch__V1__RolloutResult *res = agent_pb_rollout_result(&grp);
  cr_assert_not_null(res);
  cr_assert_eq(res->request_id, 3u);
  cr_assert_eq(res->n_rollouts, 40u);
  int shaped = 0, counted = 0;
  for (size_t i = 0; i < res->n_rollouts; i++) {
    const Rlorch__V1__Rollout *m = res->rollouts[i];
    const agent_completion *c = &grp.c[i];
    cr_assert_eq(m->id, c->id);
    cr_assert_eq(m->policy_version, 6u);
    cr_assert_eq(m->group_id, 30u);
    cr_assert_eq(m->tokens, c->ntokens);
    cr_assert_eq(m->finish_reason, RLORCH__V1__FINISH_REASON__FINISH_REASON_STOP);
    cr_assert_eq(m->n_rewards, 1u);
    cr_assert_eq(m->rewards[0], c->rewards[0]);
    cr_assert_eq(m->n_prompt_token_ids, 0u);
    cr_assert_eq(m->metadata.len, 0u);
    if (c->ntokens <= AGENT_PB_SHAPED_TOKENS_MAX) {
      shaped++;
      cr_assert_eq(m->n_completion_token_ids, c->ntokens);
      cr_assert_eq(m->n_completion_logprobs, c->ntokens);
      cr_assert_eq(memcmp(m->completion_token_ids, c->token_ids, c->ntokens * 4), 0);
    } else {
      counted++;
      cr_assert_eq(m->n_completion_token_ids, 0u, "a long completion goes as its length");
      cr_assert_eq(m->n_completion_logprobs, 0u);
    }
  }
  cr_assert_eq(res->rollouts[0]->seconds, 0.25);
  cr_assert(shaped > 0 && counted > 0, "%d shaped, %d counted", shaped, counted);
  /* It packs (the pointers are sound) and fits one report. */
  size_t n = rlorch__v1__rollout_result__get_packed_size(res);
  uint8_t *buf = malloc(n);
  rlorch__v1__rollout_result__pack(res, buf);
  Rlorch__V1__RolloutResult *back = rlorch__v1__rollout_result__unpack(NULL, n, buf);
  cr_assert_not_null(back);
  cr_assert_eq(back->n_rollouts, 40u);
  rlorch__v1__rollout_result__free_unpacked(back, NULL);
  free(buf);
  agent_pb_rollout_result_free(res);
  agent_group_free(&grp);
  /* An empty group is a result without rollouts. */
  rq.count = 0;
  cr_assert_eq(agent_group_generate(&g, &rq, 2, 6, &grp, err, sizeof err), 0);
  res = agent_pb_rollout_result(&grp);
  cr_assert_eq(res->n_rollouts, 0u);
  cr_assert_null(res->rollouts);
  agent_pb_rollout_result_free(res);
}
