/* The scheduler and its workers: rollout dispatch over inference workers,
 * and what a lost worker (stream closed, heartbeat timeout) does to the run. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/sched/sched.h"
#include "sched_fixture.h"

/* ---- dispatch ------------------------------------------------------------------------ */

Test(sched_dispatch, least_loaded_ties_lowest_id_at_most_k) {
  fx h;
  sched_settings c = fx_settings(50, 1, 2, 100);
  fx_start(&h, &c);
  fx_add(&h, 5, SCHED_ROLE_INFERENCE, "inference-5", &FX_GPU);
  fx_add(&h, 3, SCHED_ROLE_INFERENCE, "inference-3", &FX_GPU);
  fx_add(&h, 9, SCHED_ROLE_INFERENCE, "inference-9", &FX_GPU);
  cr_assert_eq(h.ndispatch, 0, "no dispatch before the run starts");
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  size_t want[] = {3, 5, 9, 3, 5, 9};
  cr_assert_eq(h.ndispatch, 6);
  cr_assert_arr_eq(h.dispatch_log, want, sizeof want);
  /* Only 9 has room after its result: the next request goes to 9. */
  fx_answer(&h, 9, 1, 0);
  cr_assert_eq(h.ndispatch, 7);
  cr_assert_eq(h.dispatch_log[6], 9);
  sched_worker_info w;
  for (uint32_t id = 3; id <= 9; id += 2) {
    if (sched_get_worker(h.s, id, &w) == SCHED_OK) cr_assert_leq(w.outstanding, 2);
  }
  sched_free(h.s);
}

Test(sched_dispatch, buffer_cap_limits_requests) {
  fx h;
  sched_settings c = fx_settings(4, 0, 8, 4);
  fx_start(&h, &c);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "a", &FX_GPU);
  fx_add(&h, 3, SCHED_ROLE_INFERENCE, "b", &FX_GPU);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  cr_assert_eq(h.ndispatch, 4);
  size_t want[] = {2, 3, 2, 3};
  cr_assert_arr_eq(h.dispatch_log, want, sizeof want);
  sched_counters k;
  sched_get_counters(h.s, &k);
  cr_assert_eq(k.rollouts_requested, 4);
  sched_free(h.s);
}

/* ---- losses ----------------------------------------------------------------------------- */

Test(sched_lost, inference_before_trigger_replans_without_it) {
  fx h;
  fx_to_plan(&h);
  sched_plan_built(h.s, h.now, h.plan_id, 7, NULL);
  sched_plan_acked(h.s, h.now, FX_TRAINER, h.plan_id, 7, NULL);
  cr_assert_eq(sched_worker_lost(h.s, h.now, 3, "stream closed"), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert(strstr(h.abort_reason, "inference-3"), "%s", h.abort_reason);
  cr_assert(h.lost[3]);
  cr_assert_eq(h.nplan, 2);
  cr_assert_str_eq(h.plan_id, "r1/step-0-r2");
  uint32_t want[] = {FX_TRAINER, 2};
  cr_assert_eq(h.nparts, 2);
  cr_assert_arr_eq(h.parts, want, sizeof want);
  cr_assert_eq(sched_plan_acked(h.s, h.now, 2, "r1/step-0", 7, NULL), SCHED_ESTALE);
  cr_assert_eq(sched_worker_lost(h.s, h.now, 3, NULL), SCHED_ESTALE);
  fx_build_and_ack(&h);
  fx_bcast_done(&h);
  cr_assert_eq(h.ncommit, 1);
  cr_assert_eq(h.records[0].receivers, 1);
  sched_free(h.s);
}

Test(sched_lost, inference_after_trigger_replans) {
  fx h;
  fx_to_plan(&h);
  fx_build_and_ack(&h);
  sched_broadcast_done(h.s, h.now, 2, h.plan_id, NULL, NULL);
  sched_worker_lost(h.s, h.now, 2, NULL);
  fx_drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert(strstr(h.abort_reason, "inference-2 lost"), "%s", h.abort_reason);
  cr_assert_eq(h.nplan, 2);
  cr_assert_eq(h.nparts, 2);
  cr_assert_eq(h.parts[1], 3);
  cr_assert_eq(h.run_state, SCHED_RUN_RUNNING);
  sched_free(h.s);
}

Test(sched_lost, broadcast_error_then_peer_lost_replans) {
  fx h;
  fx_to_plan(&h);
  fx_build_and_ack(&h);
  cr_assert_eq(h.ntrigger, 1);
  /* The trainer sees the dead receiver's connection reset before the
   * orchestrator sees its stream close. */
  sched_broadcast_done(h.s, h.now, FX_TRAINER, h.plan_id, "receiver rank 2 closed the connection",
                       NULL);
  fx_drain(&h);
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED);
  h.now += 5;
  cr_assert_eq(sched_worker_lost(h.s, h.now, h.parts[2], "command stream closed"), SCHED_OK);
  fx_drain(&h);
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED, "%s", h.run_msg);
  cr_assert_eq(h.nplan, 2, "the step is planned again without the lost worker");
  fx_build_and_ack(&h);
  h.now += 3000; /* past the old plan's grace */
  sched_tick(h.s, h.now);
  fx_drain(&h);
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED, "the old plan's error does not fail the new one: %s",
                h.run_msg);
  fx_bcast_done(&h);
  cr_assert_eq(h.ncommit, 1, "the step commits with the remaining workers");
  sched_free(h.s);
}

Test(sched_lost, last_inference_lost_waits_pending_then_resumes) {
  fx h;
  fx_to_plan(&h);
  sched_worker_lost(h.s, h.now, 2, NULL);
  fx_drain(&h);
  sched_worker_lost(h.s, h.now, 3, NULL);
  fx_drain(&h);
  cr_assert_eq(h.run_state, SCHED_RUN_PENDING);
  int plans = h.nplan;
  fx_add(&h, 4, SCHED_ROLE_INFERENCE, "inference-4", &FX_GPU);
  cr_assert_eq(h.run_state, SCHED_RUN_RUNNING);
  cr_assert_eq(h.nplan, plans + 1);
  cr_assert_eq(h.nparts, 2);
  cr_assert_eq(h.parts[1], 4);
  sched_free(h.s);
}

Test(sched_lost, trainer_lost_goes_pending_and_redoes_the_step) {
  fx h;
  fx_to_plan(&h);
  uint64_t first = h.train_ids[0];
  sched_plan_built(h.s, h.now, h.plan_id, 7, NULL);
  sched_worker_lost(h.s, h.now, FX_TRAINER, "no heartbeat");
  fx_drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert(strstr(h.abort_reason, "trainer"), "%s", h.abort_reason);
  cr_assert_eq(h.run_state, SCHED_RUN_PENDING);
  cr_assert_eq(h.nreqs, 0, "nothing is asked for while no step could use it");
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer-b", &FX_GPU); /* the same id may register again */
  cr_assert_eq(h.run_state, SCHED_RUN_RUNNING);
  cr_assert_eq(h.ntrain, 1, "no step before its fresh batch");
  fx_answer(&h, 0, 2, 0);
  cr_assert_eq(h.ntrain, 2);
  cr_assert_eq(h.train_step, 0);
  cr_assert_neq(h.train_ids[0], first, "a rollout is never used twice");
  sched_free(h.s);
}

Test(sched_lost, heartbeat_timeout_loses_the_worker) {
  fx h;
  sched_settings c = fx_settings(1, 0, 1, 4);
  c.heartbeat_timeout_ms = 500;
  fx_start(&h, &c);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU);
  cr_assert_eq(sched_next_deadline(h.s), h.now + 500);
  sched_worker_heartbeat(h.s, h.now + 400, FX_TRAINER, 0);
  cr_assert_eq(sched_next_deadline(h.s), h.now + 500);
  sched_tick(h.s, h.now + 500);
  fx_drain(&h);
  cr_assert(h.lost[2]);
  cr_assert_not(h.lost[FX_TRAINER]);
  cr_assert_eq(h.run_state, SCHED_RUN_PENDING);
  sched_counters k;
  sched_get_counters(h.s, &k);
  cr_assert_eq(k.rollouts_requested, 0, "a lost worker's requests are no longer in flight");
  cr_assert_eq(k.requests_in_flight, 0);
  cr_assert_eq(k.groups_requeued, 1, "its group waits for another worker");
  uint64_t open[4];
  cr_assert_eq(sched_open_groups(h.s, open, 4), 1);
  cr_assert_eq(open[0], 1);
  cr_assert_eq(sched_rollouts_done(h.s, h.now + 500, 2, 1, NULL, 0), SCHED_ESTALE);
  sched_free(h.s);
}

/* The shell removes lost workers after a while; the scheduler forgets them
 * then, and only lost ones. */
Test(sched_lost, forgotten_workers_leave_the_list) {
  fx h;
  fx_to_plan(&h);
  cr_assert_eq(sched_worker_count(h.s), 3);
  cr_assert_eq(sched_worker_forget(h.s, h.now, 3), SCHED_ESTATE, "a live worker is kept");
  cr_assert_eq(sched_worker_forget(h.s, h.now, 77), SCHED_ENOENT);
  cr_assert_eq(sched_worker_lost(h.s, h.now, 3, "stream closed"), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(sched_worker_forget(h.s, h.now, 3), SCHED_OK, "%s", sched_last_error(h.s));
  cr_assert_eq(sched_worker_count(h.s), 2);
  sched_worker_info w;
  cr_assert_eq(sched_get_worker(h.s, 3, &w), SCHED_ENOENT);
  cr_assert_eq(sched_get_worker(h.s, 2, &w), SCHED_OK);
  /* The run goes on with the rest: the step is planned again without it. */
  cr_assert_str_eq(h.plan_id, "r1/step-0-r2");
  cr_assert_eq(h.nparts, 2);
  fx_build_and_ack(&h);
  fx_bcast_done(&h);
  cr_assert_eq(h.ncommit, 1);
  sched_free(h.s);
}
