/* A receiver lost while its plan is triggered, in the orders the runner and the
 * agents produce: what the scheduler tells the survivors, and what it makes of
 * their late reports about the plan it gave up.
 *
 * The agents cancel their broadcast when the ABORT arrives (a receiver that
 * acked and died never connects, and the trainer would otherwise wait for it
 * until the engine's deadline), then report the cancelled plan as failed. Those
 * reports reach the scheduler after it re-planned: they must change nothing. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/sched/sched.h"
#include "sched_fixture.h"

#define TRAINER 1
#define SURVIVOR 2
#define VICTIM 3

static const sched_caps HOST = {0};
static const sched_offload PAGEABLE = {.pageable_tensors = 4, .pageable_bytes = 4096};

/* Trainer and two receivers; step 0 trained, its plan acked and triggered. */
static void triggered(fx *h) {
  memset(h, 0, sizeof *h);
  sched_settings c;
  sched_settings_default(&c);
  snprintf(c.run_id, sizeof c.run_id, "run-3");
  c.rollouts_per_step = 1;
  c.max_outstanding = 1;
  c.plan_ack_timeout_ms = 30000;
  c.broadcast_timeout_ms = 300000;
  c.heartbeat_timeout_ms = 5000;
  char err[256];
  cr_assert_eq(sched_new(&c, &h->s, err, sizeof err), SCHED_OK, "%s", err);
  h->now = 1000;
  const struct { uint32_t id; sched_role role; const char *name; } w[] = {
      {TRAINER, SCHED_ROLE_TRAINER, "trainer-0"},
      {SURVIVOR, SCHED_ROLE_INFERENCE, "inference-0"},
      {VICTIM, SCHED_ROLE_INFERENCE, "inference-1"}};
  for (size_t i = 0; i < 3; i++) {
    cr_assert_eq(sched_worker_registered(h->s, h->now, w[i].id, w[i].role, w[i].name, &HOST,
                                         &PAGEABLE, 0), SCHED_OK, "%s", sched_last_error(h->s));
    cr_assert_eq(sched_worker_attached(h->s, h->now, w[i].id), SCHED_OK);
  }
  fx_drain(h);
  cr_assert_geq(h->nreqs, 1);
  sched_rollout r = {.id = 1, .policy_version = 0, .tokens = 10, .group_id = h->reqs[0].group};
  cr_assert_eq(sched_rollouts_done(h->s, h->now, h->reqs[0].worker, h->reqs[0].id, &r, 1), SCHED_OK,
               "%s", sched_last_error(h->s));
  fx_drain(h);
  cr_assert_eq(sched_step_done(h->s, h->now, TRAINER, 0, 0.05, &PAGEABLE), SCHED_OK, "%s",
               sched_last_error(h->s));
  fx_drain(h);
  cr_assert_eq(h->nplan, 1);
  cr_assert_str_eq(h->plan_id, "run-3/step-0");
  cr_assert_eq(sched_plan_built(h->s, h->now, h->plan_id, 0x11, NULL), SCHED_OK);
  for (size_t i = 0; i < h->nparts; i++)
    cr_assert_eq(sched_plan_acked(h->s, h->now, h->parts[i], h->plan_id, 0x11, NULL), SCHED_OK);
  fx_drain(h);
  cr_assert_eq(h->ntrigger, 1);
}

static void commit_replan(fx *h) {
  cr_assert_eq(h->nplan, 2);
  cr_assert_str_eq(h->plan_id, "run-3/step-0-r2");
  uint32_t want[] = {TRAINER, SURVIVOR};
  cr_assert_eq(h->nparts, 2);
  cr_assert_arr_eq(h->parts, want, sizeof want);
  cr_assert_eq(sched_plan_built(h->s, h->now, h->plan_id, 0x22, NULL), SCHED_OK);
  for (size_t i = 0; i < h->nparts; i++)
    cr_assert_eq(sched_plan_acked(h->s, h->now, h->parts[i], h->plan_id, 0x22, NULL), SCHED_OK);
  fx_drain(h);
  cr_assert_eq(h->ntrigger, 2);
  sched_bcast_report tx = {.transport = "host-tcp", .wire_bytes = 100, .total_seconds = 0.1,
                           .weights_checksum = 9};
  sched_bcast_report rx = {.weights_checksum = 9};
  cr_assert_eq(sched_broadcast_done(h->s, h->now, TRAINER, h->plan_id, NULL, &tx), SCHED_OK);
  cr_assert_eq(sched_broadcast_done(h->s, h->now, SURVIVOR, h->plan_id, NULL, &rx), SCHED_OK);
  fx_drain(h);
  cr_assert_eq(h->ncommit, 1, "step 0 commits with the survivor: %s", h->run_msg);
  cr_assert_neq(h->run_state, SCHED_RUN_FAILED, "%s", h->run_msg);
}

/* The victim acked and died before connecting: nobody saw a broadcast error.
 * The abort goes to exactly the live participants, whose agents cancel. */
Test(sched_loss, lost_before_connecting_aborts_the_live_participants_and_replans) {
  fx h;
  triggered(&h);
  h.now += 20;
  cr_assert_eq(sched_worker_lost(h.s, h.now, VICTIM, "command stream closed"), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert_str_eq(h.abort_plan, "run-3/step-0");
  uint32_t live[] = {TRAINER, SURVIVOR};
  cr_assert_eq(h.nabort_parts, 2, "no abort is sent to the lost worker");
  cr_assert_arr_eq(h.abort_parts, live, sizeof live);
  /* The cancelled executions report afterwards: stale, harmless. */
  h.now += 5;
  cr_assert_eq(sched_broadcast_done(h.s, h.now, TRAINER, "run-3/step-0",
                                    "cancelled: plan 'run-3/step-0': cancelled with 1 of 2 "
                                    "receivers connected", NULL),
               SCHED_ESTALE);
  cr_assert_eq(sched_broadcast_done(h.s, h.now, SURVIVOR, "run-3/step-0",
                                    "peer failed: bucket 0 not received: connection closed", NULL),
               SCHED_ESTALE);
  fx_drain(&h);
  /* Past the grace a broadcast error would have had: nothing is failing. */
  h.now += 3500;
  cr_assert_eq(sched_tick(h.s, h.now), SCHED_OK);
  fx_drain(&h);
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED, "%s", h.run_msg);
  commit_replan(&h);
  sched_free(h.s);
}

/* The trainer's and the survivor's errors come first (the victim's socket
 * closed), the loss within the grace: the same re-plan, and the second error
 * of the given-up plan is stale. */
Test(sched_loss, errors_then_loss_within_the_grace_replans) {
  fx h;
  triggered(&h);
  h.now += 10;
  cr_assert_eq(sched_broadcast_done(h.s, h.now, TRAINER, "run-3/step-0",
                                    "receiver rank 2 closed the connection at bucket 0", NULL),
               SCHED_OK);
  fx_drain(&h);
  h.now += 2900;
  cr_assert_eq(sched_tick(h.s, h.now), SCHED_OK);
  fx_drain(&h);
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED, "%s", h.run_msg);
  cr_assert_eq(sched_worker_lost(h.s, h.now, VICTIM, "command stream closed"), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(sched_broadcast_done(h.s, h.now, SURVIVOR, "run-3/step-0", "connection closed",
                                    NULL),
               SCHED_ESTALE);
  commit_replan(&h);
  sched_free(h.s);
}

/* Without a loss the error stands: the run fails once the grace is over,
 * naming the plan, the worker and the error. */
Test(sched_loss, error_without_a_loss_fails_after_the_grace) {
  fx h;
  triggered(&h);
  cr_assert_eq(sched_broadcast_done(h.s, h.now, SURVIVOR, "run-3/step-0", "checksum mismatch",
                                    NULL),
               SCHED_OK);
  fx_drain(&h);
  /* Every participant is heard from after the error: none of them is dead. */
  int64_t t0 = h.now;
  for (uint32_t w = TRAINER; w <= VICTIM; w++)
    cr_assert_eq(sched_worker_heartbeat(h.s, t0 + 1000, w, 0), SCHED_OK);
  h.now = t0 + 2999;
  sched_tick(h.s, h.now);
  fx_drain(&h);
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED);
  h.now += 1;
  sched_tick(h.s, h.now);
  fx_drain(&h);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert_eq(h.abort_kind, SCHED_ABORT_ERROR);
  cr_assert(strstr(h.run_msg, "run-3/step-0") && strstr(h.run_msg, "inference-0") &&
                strstr(h.run_msg, "checksum mismatch"),
            "%s", h.run_msg);
  sched_free(h.s);
}

/* A participant that stopped (SIGSTOP: no heartbeat, no stream close): the
 * trainer's error about it comes long before its loss would be seen, but the
 * error is held while it stays silent, past the 3 s grace, until it is lost;
 * then the step is re-planned without it and the run goes on. */
Test(sched_loss, a_silent_participant_holds_the_error_until_it_is_lost) {
  fx h;
  triggered(&h);
  int64_t stopped = h.now; /* the victim's last sign of life */
  h.now += 500; /* the root hit its floor deadline for the bucket the victim stalled */
  cr_assert_eq(sched_broadcast_done(h.s, h.now, TRAINER, "run-3/step-0",
                                    "receiver rank 2 stalled at bucket 0 (layer 0): observed 0 GB/s",
                                    NULL),
               SCHED_OK);
  fx_drain(&h);
  for (int64_t t = h.now + 1000; t < stopped + 5000; t += 1000) {
    cr_assert_eq(sched_worker_heartbeat(h.s, t, TRAINER, 0), SCHED_OK);
    cr_assert_eq(sched_worker_heartbeat(h.s, t, SURVIVOR, 0), SCHED_OK);
    cr_assert_eq(sched_tick(h.s, t), SCHED_OK);
    fx_drain(&h);
    cr_assert_neq(h.run_state, SCHED_RUN_FAILED, "at +%lld ms: %s", (long long)(t - stopped), h.run_msg);
    cr_assert_eq(h.nabort, 0);
  }
  cr_assert_leq(sched_next_deadline(h.s), stopped + 5000, "the victim's loss is due");
  h.now = stopped + 5000;
  cr_assert_eq(sched_tick(h.s, h.now), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert_eq(h.abort_kind, SCHED_ABORT_PARTICIPANT_LOST);
  cr_assert(strstr(h.abort_reason, "inference-1 lost"), "%s", h.abort_reason);
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED, "%s", h.run_msg);
  commit_replan(&h);
  sched_counters k;
  sched_get_counters(h.s, &k);
  cr_assert_eq(k.aborts_by_reason[SCHED_ABORT_PARTICIPANT_LOST], 1);
  sched_free(h.s);
}

/* The error stands as soon as the last participant is heard from past the
 * grace (it is alive: the error is no echo of a death), at that report. */
Test(sched_loss, the_error_stands_when_the_last_participant_is_heard_from) {
  fx h;
  triggered(&h);
  cr_assert_eq(sched_broadcast_done(h.s, h.now, SURVIVOR, "run-3/step-0", "checksum mismatch", NULL),
               SCHED_OK);
  fx_drain(&h);
  int64_t t0 = h.now;
  cr_assert_eq(sched_worker_heartbeat(h.s, t0 + 1000, TRAINER, 0), SCHED_OK);
  cr_assert_eq(sched_worker_heartbeat(h.s, t0 + 1000, SURVIVOR, 0), SCHED_OK);
  cr_assert_eq(sched_tick(h.s, t0 + 3000), SCHED_OK);
  fx_drain(&h);
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED, "inference-1 has not been heard from");
  cr_assert_eq(sched_worker_heartbeat(h.s, t0 + 3500, VICTIM, 0), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "checksum mismatch"), "%s", h.run_msg);
  sched_free(h.s);
}
