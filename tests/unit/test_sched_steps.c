/* The scheduler's step cycle: which rollouts a batch takes under the
 * off-policy bound, a run that succeeds with records that add up, and stop. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/sched/sched.h"
#include "sched_fixture.h"

/* ---- off-policy bound -------------------------------------------------------------- */

/* Steps 0..2 with batch 2. The first six answers (ids 1..6), to whatever
 * requests are in flight, carry version 0 even where the worker was believed
 * to hold a newer one (its heartbeat may lag); later answers are fresh (id
 * 100+, current version) and come only while no batch forms. */
static void bounded_run(uint32_t async, uint64_t batches[3][2], uint64_t *dropped) {
  fx h;
  sched_settings c = fx_settings(2, async, 8, 16);
  c.steps = 3;
  fx_start(&h, &c);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-1", &FX_GPU);
  uint64_t next = 1;
  for (int step = 0; step < 3; step++) {
    while (h.ntrain == step && next < 150) {
      sched_run_info ri;
      sched_get_run(h.s, &ri);
      uint64_t id = next++;
      if (next == 7) next = 100;
      fx_answer(&h, 2, id, id <= 6 ? 0 : ri.policy_version);
    }
    cr_assert_eq(h.ntrain, step + 1, "no batch formed for step %d", step);
    cr_assert_eq(h.train_step, (uint64_t)step);
    cr_assert_eq(h.ntrain_ids, 2);
    memcpy(batches[step], h.train_ids, sizeof batches[step]);
    fx_finish_step(&h);
  }
  cr_assert_eq(h.run_state, SCHED_RUN_SUCCEEDED);
  sched_counters k;
  sched_get_counters(h.s, &k);
  *dropped = k.rollouts_dropped_stale;
  uint64_t rec_dropped = 0;
  for (int i = 0; i < 3; i++) rec_dropped += h.records[i].rollouts_dropped;
  cr_assert_eq(rec_dropped, *dropped, "records and counter disagree on drops");
  sched_free(h.s);
}

Test(sched_bound, async0_drops_everything_older_than_the_step) {
  uint64_t b[3][2], dropped;
  bounded_run(0, b, &dropped);
  uint64_t want[3][2] = {{1, 2}, {100, 101}, {102, 103}};
  cr_assert_arr_eq(b, want, sizeof want);
  cr_assert_eq(dropped, 4); /* ids 3..6 (v0) at step 1 */
}

Test(sched_bound, async1_uses_one_version_back) {
  uint64_t b[3][2], dropped;
  bounded_run(1, b, &dropped);
  uint64_t want[3][2] = {{1, 2}, {3, 4}, {100, 101}};
  cr_assert_arr_eq(b, want, sizeof want);
  cr_assert_eq(dropped, 2); /* ids 5, 6 (v0) at step 2: bound 1 */
}

Test(sched_bound, async2_keeps_version0_through_step2) {
  /* Step 0 and 1 bounds are negative: signed arithmetic keeps v0 valid. */
  uint64_t b[3][2], dropped;
  bounded_run(2, b, &dropped);
  uint64_t want[3][2] = {{1, 2}, {3, 4}, {5, 6}};
  cr_assert_arr_eq(b, want, sizeof want);
  cr_assert_eq(dropped, 0);
}

Test(sched_bound, oldest_valid_first_not_arrival_order) {
  fx h;
  sched_settings c = fx_settings(2, 3, 8, 16);
  fx_start(&h, &c);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-1", &FX_GPU);
  fx_answer(&h, 2, 1, 0);
  fx_answer(&h, 2, 2, 0);
  fx_finish_step(&h); /* v1 */
  fx_answer(&h, 2, 10, 1); /* newer first */
  cr_assert_eq(h.ntrain, 1);
  fx_answer(&h, 2, 11, 0); /* older second: a late v0 rollout */
  cr_assert_eq(h.ntrain, 2);
  cr_assert_eq(h.train_ids[0], 11);
  cr_assert_eq(h.train_ids[1], 10);
  sched_counters k;
  sched_get_counters(h.s, &k);
  cr_assert_eq(k.async_level, 1);
  sched_free(h.s);
}

/* ---- success and records --------------------------------------------------------------------- */

Test(sched_run, succeeds_with_records_that_add_up) {
  fx h;
  sched_settings c = fx_settings(2, 1, 2, 8);
  c.steps = 3;
  fx_start(&h, &c);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU);
  uint64_t id = 1;
  for (int step = 0; step < 3; step++) {
    int64_t t0 = 0;
    while (h.ntrain == step) {
      sched_run_info ri;
      sched_get_run(h.s, &ri);
      t0 = h.now;
      fx_answer(&h, 2, id++, ri.policy_version);
    }
    fx_finish_step(&h);
    const sched_step_record *r = &h.records[step];
    cr_assert_eq(r->step, (uint64_t)step);
    cr_assert_eq(r->policy_version, (uint64_t)step + 1);
    cr_assert_eq(r->mode, SCHED_MODE_DIRECT);
    cr_assert_str_eq(r->transport, "nccl");
    cr_assert_float_eq(r->step_seconds, (double)(h.now - t0) / 1000.0, 1e-9);
    cr_assert_float_eq(r->gbps, 2000 / 0.04 / 1e9, 1e-12);
    cr_assert_float_eq(r->staging_share, 0.01 / r->step_seconds, 1e-12);
    cr_assert_float_eq(r->train_seconds, 0.1, 1e-12);
    cr_assert(r->weights_verified);
    cr_assert_eq(r->receivers, 1);
    cr_assert_str_eq(r->run_id, "r1");
  }
  cr_assert_eq(h.run_state, SCHED_RUN_SUCCEEDED);
  sched_counters k;
  sched_get_counters(h.s, &k);
  uint64_t used = 0;
  for (int i = 0; i < 3; i++) used += h.records[i].rollouts_used;
  cr_assert_eq(k.rollouts_used, used);
  cr_assert_eq(k.rollouts_used, 6);
  cr_assert_eq(k.steps, 3);
  cr_assert_eq(k.policy_version, 3);
  cr_assert_eq(k.broadcasts[SCHED_MODE_DIRECT], 3);
  cr_assert_eq(k.aborts, 0);
  sched_worker_info w;
  sched_get_worker(h.s, 2, &w);
  cr_assert_eq(w.policy_version, 3);
  sched_free(h.s);
}

/* ---- stop --------------------------------------------------------------------------------- */

Test(sched_stop, mid_training_waits_for_step_done) {
  fx h;
  fx_to_plan(&h);
  fx_build_and_ack(&h);
  fx_bcast_done(&h);
  fx_answer(&h, 0, 2, 1);
  cr_assert_eq(h.ntrain, 2);
  cr_assert_eq(sched_stop(h.s, h.now, "operator"), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.run_state, SCHED_RUN_STOPPING);
  cr_assert_eq(sched_stop(h.s, h.now, "again"), SCHED_ESTATE);
  int plans = h.nplan;
  fx_step_done(&h);
  cr_assert_eq(h.run_state, SCHED_RUN_STOPPED);
  cr_assert_eq(h.nplan, plans, "no plan after a stop");
  cr_assert(strstr(h.run_msg, "operator"), "%s", h.run_msg);
  sched_free(h.s);
}

Test(sched_stop, mid_ack_aborts) {
  fx h;
  fx_to_plan(&h);
  cr_assert_eq(sched_plan_built(h.s, h.now, h.plan_id, 0xabc, NULL), SCHED_OK);
  cr_assert_eq(sched_plan_acked(h.s, h.now, h.parts[0], h.plan_id, 0xabc, NULL), SCHED_OK);
  sched_stop(h.s, h.now, "maintenance");
  fx_drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert_eq(h.ntrigger, 0, "nobody entered the collective");
  cr_assert(strstr(h.abort_reason, "maintenance"), "%s", h.abort_reason);
  cr_assert_eq(h.run_state, SCHED_RUN_STOPPED);
  cr_assert_eq(sched_plan_acked(h.s, h.now, h.parts[1], h.plan_id, 0xabc, NULL), SCHED_ESTALE);
  cr_assert_eq(sched_next_deadline(h.s), SCHED_NEVER);
  sched_free(h.s);
}

/* A triggered broadcast is let finish and its step committed: aborting it would
 * cut every participant off mid-transfer and throw the trained step away. */
Test(sched_stop, mid_broadcast_commits_the_step_then_stops) {
  fx h;
  fx_to_plan(&h);
  fx_build_and_ack(&h);
  cr_assert_eq(h.ntrigger, 1);
  int commits = h.ncommit;
  sched_stop(h.s, h.now, "maintenance");
  fx_drain(&h);
  cr_assert_eq(h.nabort, 0, "the broadcast in flight is not aborted");
  cr_assert_eq(h.run_state, SCHED_RUN_STOPPING);
  cr_assert_neq(sched_next_deadline(h.s), SCHED_NEVER, "the broadcast keeps its deadline");
  fx_bcast_done(&h);
  cr_assert_eq(h.ncommit, commits + 1, "the step is committed");
  cr_assert_eq(h.run_state, SCHED_RUN_STOPPED);
  cr_assert(strstr(h.run_msg, "maintenance"), "%s", h.run_msg);
  cr_assert_eq(h.nplan, 1, "no plan after the stop");
  sched_free(h.s);
}

/* A broadcast that cannot finish while the run is stopping is given up at its
 * deadline; the run still ends STOPPED, not FAILED. */
Test(sched_stop, mid_broadcast_deadline_stops_without_failing) {
  fx h;
  fx_to_plan(&h);
  fx_build_and_ack(&h);
  sched_stop(h.s, h.now, "maintenance");
  fx_drain(&h);
  h.now = sched_next_deadline(h.s);
  cr_assert_eq(sched_tick(h.s, h.now), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert(strstr(h.abort_reason, "broadcast timed out"), "%s", h.abort_reason);
  cr_assert_eq(h.run_state, SCHED_RUN_STOPPED);
  cr_assert_eq(sched_next_deadline(h.s), SCHED_NEVER);
  sched_free(h.s);
}
