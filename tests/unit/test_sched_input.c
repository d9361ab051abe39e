/* The scheduler refuses bad input, naming the field or the worker, and
 * changes nothing. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/sched/sched.h"
#include "sched_fixture.h"

/* ---- bad input ------------------------------------------------------------------------------------ */

Test(sched_input, rejected_reports_name_the_field) {
  fx h;
  sched_settings c = fx_settings(4, 0, 1, 8);
  fx_start(&h, &c);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU);
  fx_add(&h, 3, SCHED_ROLE_INFERENCE, "inference-3", &FX_GPU);
  cr_assert_eq(sched_worker_registered(h.s, h.now, 2, SCHED_ROLE_INFERENCE, "x", &FX_GPU, NULL, 0),
               SCHED_EEXIST);
  cr_assert_eq(sched_worker_registered(h.s, h.now, 7, SCHED_ROLE_TRAINER, "t2", &FX_GPU, NULL, 0),
               SCHED_EEXIST);
  cr_assert(strstr(sched_last_error(h.s), "trainer"));
  cr_assert_eq(sched_worker_registered(h.s, h.now, 8, (sched_role)9, "x", &FX_GPU, NULL, 0),
               SCHED_EINVAL);
  cr_assert_eq(sched_worker_attached(h.s, h.now, 2), SCHED_ESTATE);
  cr_assert_eq(sched_worker_attached(h.s, h.now, 42), SCHED_ENOENT);
  cr_assert_eq(sched_worker_heartbeat(h.s, h.now, 2, 5), SCHED_EINVAL);
  cr_assert(strstr(sched_last_error(h.s), "policy_version"));
  /* Requests: 2 has request 1, 3 has request 2 (K = 1). */
  sched_rollout future = {.id = 1, .policy_version = 3, .group_id = 1};
  cr_assert_eq(sched_rollouts_done(h.s, h.now, 2, 1, &future, 1), SCHED_EINVAL);
  cr_assert(strstr(sched_last_error(h.s), "policy_version"), "%s", sched_last_error(h.s));
  cr_assert_eq(sched_rollouts_done(h.s, h.now, 2, 1, &future, 1), SCHED_ENOENT,
               "a rejected report closes its request");
  sched_rollout two[2] = {{.id = 5}, {.id = 6}};
  cr_assert_eq(sched_rollouts_done(h.s, h.now, 2, 2, two, 1), SCHED_EINVAL, "not its request");
  cr_assert(strstr(sched_last_error(h.s), "inference-3"), "%s", sched_last_error(h.s));
  cr_assert_eq(sched_rollouts_done(h.s, h.now, 3, 2, two, 2), SCHED_EINVAL, "too many");
  cr_assert(strstr(sched_last_error(h.s), "asked for 1"), "%s", sched_last_error(h.s));
  cr_assert_eq(sched_step_done(h.s, h.now, 2, 0, 1, NULL), SCHED_EINVAL);
  cr_assert_eq(sched_step_done(h.s, h.now, FX_TRAINER, 5, 1, NULL), SCHED_ESTATE, "not training");
  cr_assert_eq(sched_plan_built(h.s, h.now, "r1/step-0", 1, NULL), SCHED_ESTALE);
  cr_assert_eq(sched_plan_built(h.s, h.now, NULL, 1, NULL), SCHED_EINVAL);
  cr_assert_eq(sched_set_policy(h.s, h.now, (sched_mode)0), SCHED_EINVAL);
  sched_run_info ri;
  sched_get_run(h.s, &ri);
  cr_assert_eq(ri.state, SCHED_RUN_RUNNING);
  sched_free(h.s);
}

Test(sched_input, duplicate_rollout_ids_are_refused) {
  fx h;
  sched_settings c = fx_settings(4, 0, 2, 8);
  fx_start(&h, &c);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU);
  fx_answer(&h, 2, 1, 0);
  sched_rollout dup = {.id = 1, .group_id = h.reqs[0].group};
  cr_assert_eq(sched_rollouts_done(h.s, h.now, 2, h.reqs[0].id, &dup, 1), SCHED_EINVAL);
  cr_assert(strstr(sched_last_error(h.s), "duplicate"));
  sched_counters k;
  sched_get_counters(h.s, &k);
  cr_assert_eq(k.rollouts_buffered, 1);
  sched_free(h.s);
}

Test(sched_input, settings_are_validated) {
  sched_settings c;
  char err[256];
  sched *s = NULL;
  sched_settings_default(&c);
  c.rollouts_per_step = 0;
  cr_assert_eq(sched_new(&c, &s, err, sizeof err), SCHED_EINVAL);
  cr_assert(strstr(err, "rollouts_per_step"));
  cr_assert_null(s);
  sched_settings_default(&c);
  c.run_id[0] = '\0';
  cr_assert_eq(sched_new(&c, &s, err, sizeof err), SCHED_EINVAL);
  cr_assert(strstr(err, "run_id"));
  sched_settings_default(&c);
  c.heartbeat_timeout_ms = 0;
  cr_assert_eq(sched_new(&c, &s, err, sizeof err), SCHED_EINVAL);
  cr_assert(strstr(err, "heartbeat_timeout_ms"));
  sched_settings_default(&c);
  c.max_buffered = 3;
  cr_assert_eq(sched_new(&c, &s, err, sizeof err), SCHED_EINVAL);
  cr_assert(strstr(err, "max_buffered"));
  sched_settings_default(&c);
  c.policy = (sched_mode)7;
  cr_assert_eq(sched_new(&c, &s, err, sizeof err), SCHED_EINVAL);
  cr_assert(strstr(err, "policy"));
  sched_settings_default(&c);
  c.group_size = 0;
  cr_assert_eq(sched_new(&c, &s, err, sizeof err), SCHED_EINVAL);
  cr_assert(strstr(err, "group_size"), "%s", err);
  sched_settings_default(&c);
  c.rollouts_per_step = 6;
  c.group_size = 4;
  cr_assert_eq(sched_new(&c, &s, err, sizeof err), SCHED_EINVAL);
  cr_assert_str_eq(err, "rollouts_per_step: 6 is not a multiple of group_size 4");
  c.rollouts_per_step = 8;
  cr_assert_eq(sched_new(&c, &s, err, sizeof err), SCHED_OK, "%s", err);
  sched_free(s);
  s = NULL;
  sched_settings_default(&c);
  c.request_timeout_ms = -1;
  cr_assert_eq(sched_new(&c, &s, err, sizeof err), SCHED_EINVAL);
  cr_assert(strstr(err, "request_timeout_ms"), "%s", err);
  cr_assert_null(s);
  sched_free(NULL);
}
