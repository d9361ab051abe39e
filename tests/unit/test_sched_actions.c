/* The scheduler's contract with its caller: actions handed over in an owned
 * batch, and a clock that never goes back. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/sched/sched.h"
#include "sched_fixture.h"

static const sched_action *find(const sched_action_batch *b, sched_action_kind kind) {
  for (size_t i = 0; i < b->n; i++)
    if (b->actions[i].kind == kind) return &b->actions[i];
  return NULL;
}

/* ---- the action batch -------------------------------------------------------------------- */

Test(sched_actions, survive_later_events_until_freed) {
  fx h;
  /* Async 1, so that step 1's rollout is asked for while step 0 trains. */
  sched_settings c = fx_settings(1, 1, 1, 4);
  c.steps = 3;
  fx_start(&h, &c);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU);
  /* Rollout 41 makes the TRAIN of step 0; keep that batch while step 0 commits
   * and step 1 is trained from rollout 42: the scheduler produces new TRAIN,
   * plan and COMMIT actions in between, which must not touch the kept ones. */
  sched_rollout r = {.id = 41, .policy_version = 0, .tokens = 5, .group_id = h.reqs[0].group};
  cr_assert_eq(sched_rollouts_done(h.s, h.now, 2, h.reqs[0].id, &r, 1), SCHED_OK);
  h.nreqs = 0;
  sched_action_batch train0;
  cr_assert_gt(sched_take_actions(h.s, &train0), 0);
  const sched_action *t0 = find(&train0, SCHED_ACT_TRAIN);
  cr_assert_not_null(t0);
  cr_assert_eq(t0->nrollouts, 1);
  cr_assert_eq(t0->rollout_ids[0], 41);
  const sched_action *d0 = find(&train0, SCHED_ACT_DISPATCH);
  cr_assert_not_null(d0, "the freed slot is asked again");
  h.reqs[0].worker = d0->worker;
  h.reqs[0].id = d0->request_id;
  h.reqs[0].group = d0->group_id;
  h.nreqs = 1;
  h.train_step = t0->step;

  fx_step_done(&h);
  fx_build_and_ack(&h);
  /* Broadcast done by hand: keep the batch with the COMMIT of step 0. */
  h.now += 50;
  sched_bcast_report rep = {.transport = "nccl", .wire_bytes = 2000, .total_seconds = 0.04,
                            .weights_checksum = 77};
  sched_bcast_report rx = {.weights_checksum = 77};
  for (size_t i = 0; i < h.nparts; i++)
    cr_assert_eq(sched_broadcast_done(h.s, h.now, h.parts[i], h.plan_id, NULL,
                                      i == 0 ? &rep : &rx),
                 SCHED_OK);
  sched_action_batch commit0;
  cr_assert_gt(sched_take_actions(h.s, &commit0), 0);
  const sched_action *k0 = find(&commit0, SCHED_ACT_COMMIT);
  cr_assert_not_null(k0);

  fx_answer(&h, 2, 42, 1); /* TRAIN of step 1, through the fixture's own batches */
  cr_assert_eq(h.ntrain, 1);
  cr_assert_eq(h.train_ids[0], 42);
  fx_finish_step(&h);
  cr_assert_eq(h.ncommit, 1);
  cr_assert_eq(h.records[0].step, 1);

  cr_assert_eq(t0->kind, SCHED_ACT_TRAIN);
  cr_assert_eq(t0->step, 0);
  cr_assert_eq(t0->rollout_ids[0], 41, "the kept TRAIN still names its own batch");
  cr_assert_eq(k0->record->step, 0, "the kept record is still step 0's");
  cr_assert_eq(k0->record->policy_version, 1);
  cr_assert_str_eq(k0->record->transport, "nccl");
  cr_assert_eq(k0->record->finished_unix_ms, 0, "wall time is the caller's to stamp");
  sched_action_batch_free(&train0);
  sched_action_batch_free(&commit0);
  cr_assert_null(train0.actions);
  cr_assert_eq(train0.n, 0);
  sched_free(h.s);
}

Test(sched_actions, take_moves_them_out) {
  fx h;
  sched_settings c = fx_settings(1, 0, 1, 4);
  fx_start(&h, &c);
  cr_assert_eq(sched_worker_registered(h.s, h.now, 2, SCHED_ROLE_INFERENCE, "inference-2",
                                       &FX_GPU, NULL, 0),
               SCHED_OK);
  sched_action_batch b;
  cr_assert_eq(sched_take_actions(h.s, &b), 1);
  cr_assert_eq(b.n, 1);
  cr_assert_eq(b.actions[0].kind, SCHED_ACT_WORKER_STATE);
  cr_assert_eq(b.actions[0].worker, 2);
  cr_assert_str_eq(b.actions[0].text, "registered");
  sched_action_batch again;
  cr_assert_eq(sched_take_actions(h.s, &again), 0, "the scheduler keeps nothing it handed over");
  cr_assert_null(again.actions);
  /* The scheduler grows fresh storage for the next event. */
  cr_assert_eq(sched_worker_attached(h.s, h.now, 2), SCHED_OK);
  cr_assert_eq(sched_take_actions(h.s, &again), 1);
  cr_assert_eq(again.actions[0].worker_state, SCHED_WORKER_READY);
  cr_assert_eq(b.actions[0].worker_state, SCHED_WORKER_REGISTERED, "the first batch is intact");
  sched_action_batch_free(&again);
  sched_action_batch_free(&b);
  sched_free(h.s);
}

Test(sched_actions, empty_batches_free_cleanly) {
  fx h;
  sched_settings c = fx_settings(1, 0, 1, 4);
  fx_start(&h, &c);
  sched_action_batch b;
  memset(&b, 0xff, sizeof b); /* whatever was there is overwritten */
  cr_assert_eq(sched_take_actions(h.s, &b), 0);
  cr_assert_eq(b.n, 0);
  cr_assert_null(b.actions);
  sched_action_batch_free(&b);
  sched_action_batch_free(&b); /* twice */
  sched_action_batch zero = {0};
  sched_action_batch_free(&zero);
  sched_action_batch_free(NULL);
  sched_free(h.s);
}

/* ---- the clock ---------------------------------------------------------------------------- */

Test(sched_clock, time_going_back_is_refused_and_changes_nothing) {
  fx h;
  fx_to_plan(&h); /* now 1100, plan r1/step-0 pending */
  int64_t t = h.now;
  cr_assert_eq(sched_worker_lost(h.s, t - 1, 3, "stream closed"), SCHED_EINVAL);
  cr_assert(strstr(sched_last_error(h.s), "now_ms"), "%s", sched_last_error(h.s));
  cr_assert(strstr(sched_last_error(h.s), "monotonic"), "%s", sched_last_error(h.s));
  sched_worker_info w;
  cr_assert_eq(sched_get_worker(h.s, 3, &w), SCHED_OK);
  cr_assert_neq(w.state, SCHED_WORKER_LOST, "a refused event changes nothing");
  sched_action_batch b;
  cr_assert_eq(sched_take_actions(h.s, &b), 0);
  cr_assert_eq(sched_tick(h.s, t - 1000), SCHED_EINVAL);
  cr_assert_eq(sched_stop(h.s, INT64_MIN, "x"), SCHED_EINVAL);
  sched_run_info ri;
  sched_get_run(h.s, &ri);
  cr_assert_eq(ri.state, SCHED_RUN_RUNNING);
  /* The same instant again is fine: several events may share a clock reading. */
  cr_assert_eq(sched_plan_built(h.s, t, h.plan_id, 7, NULL), SCHED_OK);
  cr_assert_eq(sched_plan_acked(h.s, t, FX_TRAINER, h.plan_id, 7, NULL), SCHED_OK);
  sched_free(h.s);
}

Test(sched_clock, any_origin_works) {
  /* A monotonic clock's origin is arbitrary (boot, process start): deadlines
   * are relative to the readings, whatever their sign. */
  fx h;
  sched_settings c = fx_settings(1, 0, 1, 4);
  c.heartbeat_timeout_ms = 500;
  fx_start(&h, &c);
  h.now = -5000;
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU);
  cr_assert_eq(sched_next_deadline(h.s), -4500);
  cr_assert_eq(sched_worker_heartbeat(h.s, -4800, FX_TRAINER, 0), SCHED_OK);
  cr_assert_eq(sched_tick(h.s, -4501), SCHED_OK);
  fx_drain(&h);
  cr_assert_not(h.lost[2]);
  cr_assert_eq(sched_tick(h.s, -4500), SCHED_OK);
  fx_drain(&h);
  cr_assert(h.lost[2]);
  cr_assert_not(h.lost[FX_TRAINER]);
  sched_free(h.s);
}
