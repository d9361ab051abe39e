/* Versions, catch-up and resume: a resumed run carries on at its committed
 * step once its trainer proves it holds that version (or the next), every
 * inference worker is caught up before it makes rollouts, a trainer that
 * lost the weights fails the run, and nothing sent before the restart is
 * taken for something sent after. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/sched/sched.h"
#include "sched_fixture.h"

#define ID_BASE ((UINT64_C(1) << 40) + 1) /* first request and group id of resume 1 */

/* Run "r1" of 10 steps, batches of 2, on-policy, K 1, resumed (resume 1) at
 * step 4. */
static void start_resumed(fx *h, uint64_t steps_done) {
  sched_settings c = fx_settings(2, 0, 1, 8);
  c.steps = 10;
  c.steps_done = steps_done;
  c.resumes = 1;
  fx_start(h, &c);
}

static int dispatched_to(const fx *h, uint32_t worker) {
  for (size_t i = 0; i < h->ndispatch; i++)
    if (h->dispatch_log[i] == worker) return 1;
  return 0;
}

Test(sched_resume, settings_are_validated) {
  sched_settings c = fx_settings(2, 0, 1, 8);
  char err[256];
  sched *s = NULL;
  c.steps_done = 3;
  cr_assert_eq(sched_new(&c, &s, err, sizeof err), SCHED_EINVAL);
  cr_assert(strstr(err, "steps_done") && strstr(err, "resumes"), "%s", err);
  c.resumes = 1;
  c.steps = 3;
  cr_assert_eq(sched_new(&c, &s, err, sizeof err), SCHED_EINVAL);
  cr_assert(strstr(err, "none left"), "%s", err);
  c.steps = 4;
  cr_assert_eq(sched_new(&c, &s, err, sizeof err), SCHED_OK, "%s", err);
  sched_counters k;
  sched_get_counters(s, &k);
  cr_assert_eq(k.policy_version, 3, "it starts at the committed version");
  cr_assert_eq(k.steps, 3);
  sched_run_info ri;
  sched_get_run(s, &ri);
  cr_assert_eq(ri.steps_done, 3);
  cr_assert(strstr(ri.message, "resumed at step 3"), "%s", ri.message);
  sched_free(s);
}

/* The trainer kept the committed version: everyone is caught up first (on
 * the host transport), then the run carries on at the committed step with
 * versions going on from there. */
Test(sched_resume, committed_version_catches_everyone_up_then_carries_on) {
  fx h;
  start_resumed(&h, 4);
  fx_add_v(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU, 4);
  cr_assert_eq(h.nplan, 0, "no trainer yet");
  fx_add_v(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU, 4);
  cr_assert_eq(h.run_state, SCHED_RUN_RUNNING);
  cr_assert_eq(h.nplan, 1, "the first thing is a catch-up");
  cr_assert_str_eq(h.plan_id, "r1/step-4-resume1-catchup");
  cr_assert(h.plan_catchup);
  cr_assert_eq(h.plan_version, 4, "a catch-up publishes the committed version");
  cr_assert_eq(h.plan_mode, SCHED_MODE_HOST, "no NCCL communicator exists for it");
  cr_assert_eq(h.nparts, 2);
  cr_assert_eq(h.ntrain, 0);
  cr_assert_eq(h.ndispatch, 0, "not even a worker that says it holds version 4 is trusted");
  /* A worker with anything at all (another run's version) is only recorded. */
  fx_add_v(&h, 3, SCHED_ROLE_INFERENCE, "inference-3", &FX_GPU, 0);
  cr_assert_eq(sched_worker_heartbeat(h.s, h.now, 3, 27), SCHED_OK, "%s", sched_last_error(h.s));
  fx_build_and_ack(&h);
  fx_bcast_done(&h);
  cr_assert_eq(h.ncommit, 0, "a catch-up commits no step");
  cr_assert_eq(h.ncaughtup, 1);
  cr_assert_str_eq(h.caughtup_plan, "r1/step-4-resume1-catchup");
  cr_assert_eq(h.caughtup_version, 4);
  cr_assert_eq(h.ncaughtup_parts, 2);
  cr_assert(h.caughtup_verified, "every receiver reported the trainer's checksum");
  /* inference-2 serves now; inference-3 attached too late for that plan and
   * gets one of its own. */
  cr_assert(dispatched_to(&h, 2));
  cr_assert_not(dispatched_to(&h, 3));
  cr_assert_eq(h.reqs[0].id, ID_BASE, "request ids of resume 1 start at 2^40 + 1");
  cr_assert_eq(h.reqs[0].group, ID_BASE, "and group ids too");
  cr_assert_eq(h.reqs[0].version, 4);
  cr_assert_eq(h.nplan, 2);
  cr_assert_str_eq(h.plan_id, "r1/step-4-resume1-catchup-2");
  cr_assert_eq(h.nparts, 2);
  cr_assert_eq(h.parts[1], 3);
  fx_build_and_ack(&h);
  fx_bcast_done(&h);
  cr_assert_eq(h.ncaughtup, 2);
  cr_assert(dispatched_to(&h, 3));
  sched_worker_info w;
  cr_assert_eq(sched_get_worker(h.s, 3, &w), SCHED_OK);
  cr_assert(w.synced);
  cr_assert_eq(w.policy_version, 4);
  /* Step 4 is trained and committed once, publishing version 5. */
  fx_answer(&h, 2, 100, 4);
  fx_answer(&h, 3, 200, 4);
  cr_assert_eq(h.ntrain, 1);
  cr_assert_eq(h.train_step, 4);
  fx_step_done(&h);
  cr_assert_str_eq(h.plan_id, "r1/step-4-resume1", "its plans are not named as before the restart");
  cr_assert_not(h.plan_catchup);
  cr_assert_eq(h.plan_version, 5);
  fx_build_and_ack(&h);
  fx_bcast_done(&h);
  cr_assert_eq(h.ncommit, 1);
  cr_assert_eq(h.records[0].step, 4);
  cr_assert_eq(h.records[0].policy_version, 5);
  /* The next step has the plain name again: nothing before the restart used it. */
  fx_answer(&h, 2, 300, 5);
  fx_answer(&h, 3, 400, 5);
  fx_step_done(&h);
  cr_assert_str_eq(h.plan_id, "r1/step-5");
  sched_free(h.s);
}

/* The trainer trained step 4 and the orchestrator died before its broadcast
 * committed: the step's plan goes out first, and it catches everyone up. */
Test(sched_resume, trainer_one_version_ahead_has_its_step_planned_first) {
  fx h;
  start_resumed(&h, 4);
  fx_add_v(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU, 5); /* it got the weights */
  fx_add_v(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU, 5);
  cr_assert_eq(h.ntrain, 0, "step 4 is trained already");
  cr_assert_eq(h.nplan, 1);
  cr_assert_str_eq(h.plan_id, "r1/step-4-resume1");
  cr_assert_not(h.plan_catchup);
  cr_assert_eq(h.plan_version, 5);
  cr_assert_eq(h.ndispatch, 0);
  cr_assert_eq(sched_step_done(h.s, h.now, FX_TRAINER, 4, 1.0, NULL), SCHED_ESTALE,
               "its late report of the step changes nothing");
  fx_build_and_ack(&h);
  fx_bcast_done(&h);
  cr_assert_eq(h.ncommit, 1, "committed once");
  cr_assert_eq(h.records[0].step, 4);
  cr_assert_eq(h.records[0].policy_version, 5);
  cr_assert_eq(h.records[0].rollouts_used, 2, "the batch it trained had a step's rollouts");
  cr_assert(dispatched_to(&h, 2), "the plan caught it up");
  cr_assert_eq(h.reqs[0].version, 5);
  sched_free(h.s);
}

Test(sched_resume, a_trainer_without_the_weights_fails_the_run) {
  fx h;
  start_resumed(&h, 4);
  fx_add_v(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU, 4);
  fx_add_v(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer-0", &FX_GPU, 0);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "trainer-0 holds policy version 0, older than the committed 4") &&
                strstr(h.run_msg, "checkpoint"),
            "%s", h.run_msg);
  cr_assert_eq(h.nplan, 0);
  cr_assert_eq(h.ndispatch, 0);
  sched_free(h.s);

  start_resumed(&h, 4);
  fx_add_v(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer-0", &FX_GPU, 9);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "holds policy version 9, newer than the committed 4"), "%s",
            h.run_msg);
  sched_free(h.s);

  /* Not only after a resume: a trainer that replaces a lost one must hold
   * what the run committed. */
  fx_to_plan(&h);
  fx_build_and_ack(&h);
  fx_bcast_done(&h);
  cr_assert_eq(h.ncommit, 1);
  cr_assert_eq(sched_worker_lost(h.s, h.now, FX_TRAINER, "gone"), SCHED_OK);
  fx_drain(&h);
  fx_add_v(&h, 9, SCHED_ROLE_TRAINER, "trainer-new", &FX_GPU, 0);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "trainer-new holds policy version 0, older than the committed 1"),
            "%s", h.run_msg);
  sched_free(h.s);
}

/* In any run: a worker that joins holding another version waits for a
 * catch-up, while one holding the published version serves at once. */
Test(sched_resume, a_late_worker_is_caught_up_before_it_serves) {
  fx h;
  sched_settings c = fx_settings(1, 0, 1, 4);
  c.steps = 5;
  fx_start(&h, &c);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU);
  fx_answer(&h, 2, 1, 0);
  fx_finish_step(&h);
  cr_assert_eq(h.ncommit, 1);
  size_t before = h.ndispatch;
  fx_add_v(&h, 3, SCHED_ROLE_INFERENCE, "inference-3", &FX_GPU, 0);
  cr_assert_eq(h.nplan, 2, "a catch-up while no step can start");
  cr_assert_str_eq(h.plan_id, "r1/step-1-catchup");
  cr_assert(h.plan_catchup);
  cr_assert_eq(h.nparts, 2, "only the worker that needs it");
  cr_assert_eq(h.parts[1], 3);
  /* The synced worker keeps generating meanwhile; its batch waits for the
   * catch-up, which trains nothing. */
  fx_answer(&h, 2, 10, 1);
  cr_assert_eq(h.ntrain, 1, "no step starts under a pending catch-up");
  for (size_t i = before; i < h.ndispatch; i++) cr_assert_neq(h.dispatch_log[i], 3);
  fx_build_and_ack(&h);
  fx_bcast_done(&h);
  cr_assert_eq(h.ncaughtup, 1);
  cr_assert_eq(h.caughtup_version, 1);
  cr_assert_eq(h.ntrain, 2, "then the step starts");
  cr_assert_eq(h.train_step, 1);
  /* One that says it holds the published version is trusted at once. */
  fx_add_v(&h, 4, SCHED_ROLE_INFERENCE, "inference-4", &FX_GPU, 1);
  sched_worker_info w;
  cr_assert_eq(sched_get_worker(h.s, 4, &w), SCHED_OK);
  cr_assert(w.synced);
  cr_assert_eq(h.ncaughtup, 1);
  fx_step_done(&h);
  cr_assert_eq(h.nparts, 4, "the step's plan takes every attached worker");
  sched_free(h.s);
}

Test(sched_resume, a_lost_participant_sends_the_catchup_round_again) {
  fx h;
  start_resumed(&h, 4);
  cr_assert_eq(sched_worker_registered(h.s, h.now, 2, SCHED_ROLE_INFERENCE, "inference-2",
                                       &FX_GPU, NULL, 4), SCHED_OK);
  cr_assert_eq(sched_worker_attached(h.s, h.now, 2), SCHED_OK);
  cr_assert_eq(sched_worker_registered(h.s, h.now, 3, SCHED_ROLE_INFERENCE, "inference-3",
                                       &FX_GPU, NULL, 4), SCHED_OK);
  cr_assert_eq(sched_worker_attached(h.s, h.now, 3), SCHED_OK);
  fx_drain(&h);
  fx_add_v(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU, 4);
  cr_assert_str_eq(h.plan_id, "r1/step-4-resume1-catchup");
  cr_assert_eq(h.nparts, 3);
  cr_assert_eq(sched_plan_built(h.s, h.now, h.plan_id, 0xabc, NULL), SCHED_OK);
  cr_assert_eq(sched_worker_lost(h.s, h.now, 3, "stream closed"), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert_str_eq(h.abort_plan, "r1/step-4-resume1-catchup");
  cr_assert(strstr(h.abort_reason, "inference-3"), "%s", h.abort_reason);
  cr_assert_eq(h.run_state, SCHED_RUN_RUNNING, "the run goes on");
  cr_assert_str_eq(h.plan_id, "r1/step-4-resume1-catchup-2", "the rest are caught up");
  cr_assert_eq(h.nparts, 2);
  /* The trainer lost: the catch-up is dropped, the run waits for a trainer. */
  cr_assert_eq(sched_worker_lost(h.s, h.now, FX_TRAINER, "gone"), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.nabort, 2);
  cr_assert_eq(h.run_state, SCHED_RUN_PENDING);
  cr_assert_eq(h.nplan, 2);
  fx_add_v(&h, 9, SCHED_ROLE_TRAINER, "trainer-again", &FX_GPU, 4);
  cr_assert_eq(h.nplan, 3);
  cr_assert_str_eq(h.plan_id, "r1/step-4-resume1-catchup-3");
  fx_build_and_ack(&h);
  fx_bcast_done(&h);
  cr_assert_eq(h.ncaughtup, 1);
  cr_assert(dispatched_to(&h, 2));
  sched_free(h.s);
}

/* Reports that refer to what the scheduler before the restart sent. */
Test(sched_resume, what_was_sent_before_the_restart_is_stale) {
  fx h;
  start_resumed(&h, 4);
  fx_add_v(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU, 4);
  fx_add_v(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU, 4);
  sched_rollout old = {.id = 7, .policy_version = 3, .group_id = 3};
  cr_assert_eq(sched_rollouts_done(h.s, h.now, 2, 3, &old, 1), SCHED_ESTALE);
  cr_assert(strstr(sched_last_error(h.s), "before the orchestrator restarted"), "%s",
            sched_last_error(h.s));
  cr_assert_eq(sched_plan_acked(h.s, h.now, 2, "r1/step-4", 0x1, NULL), SCHED_ESTALE,
               "an ack of a plan from before the restart");
  cr_assert_eq(h.run_state, SCHED_RUN_RUNNING, "nothing of it fails the run");
  sched_free(h.s);
}

/* The trainer registered (its heartbeat noticed the restart) while it still
 * trained on a batch from before: its report of that step arrives during
 * the catch-up, which would send weights it is replacing. */
Test(sched_resume, a_step_trained_meanwhile_replaces_the_catchup) {
  fx h;
  start_resumed(&h, 4);
  fx_add_v(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU, 4);
  fx_add_v(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU, 4);
  cr_assert(h.plan_catchup);
  cr_assert_eq(sched_plan_built(h.s, h.now, h.plan_id, 0xabc, NULL), SCHED_OK);
  cr_assert_eq(sched_plan_acked(h.s, h.now, 2, h.plan_id, 0xabc, NULL), SCHED_OK);
  cr_assert_eq(sched_step_done(h.s, h.now, FX_TRAINER, 4, 2.5, NULL), SCHED_OK, "%s",
               sched_last_error(h.s));
  fx_drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert_str_eq(h.abort_plan, "r1/step-4-resume1-catchup");
  cr_assert(strstr(h.abort_reason, "trained step 4"), "%s", h.abort_reason);
  cr_assert_eq(h.nplan, 2);
  cr_assert_str_eq(h.plan_id, "r1/step-4-resume1");
  cr_assert_eq(h.plan_version, 5);
  fx_build_and_ack(&h);
  fx_bcast_done(&h);
  cr_assert_eq(h.ncommit, 1);
  cr_assert_eq(h.records[0].step, 4);
  cr_assert_float_eq(h.records[0].train_seconds, 2.5, 1e-12);
  sched_free(h.s);
}

/* A heartbeat is proof of life whatever its version: refusing it would have
 * the worker lost and registering again in a loop. */
Test(sched_resume, heartbeats_keep_workers_alive_whatever_their_version) {
  fx h;
  sched_settings c = fx_settings(2, 0, 1, 8);
  c.heartbeat_timeout_ms = 1000;
  fx_start(&h, &c);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU);
  for (int i = 0; i < 5; i++) {
    h.now += 600;
    cr_assert_eq(sched_worker_heartbeat(h.s, h.now, FX_TRAINER, 0), SCHED_OK);
    cr_assert_eq(sched_worker_heartbeat(h.s, h.now, 2, 27), SCHED_EINVAL,
                 "a synced worker's impossible version is refused");
    cr_assert(strstr(sched_last_error(h.s), "newer than the published 0"));
    cr_assert_eq(sched_tick(h.s, h.now), SCHED_OK);
    fx_drain(&h);
  }
  cr_assert_not(h.lost[2], "but it is not lost for it");
  sched_free(h.s);
}

Test(sched_resume, a_stop_during_the_catchup_ends_the_run_stopped) {
  fx h;
  start_resumed(&h, 4);
  fx_add_v(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU, 4);
  fx_add_v(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU, 4);
  cr_assert(h.plan_catchup);
  cr_assert_eq(sched_stop(h.s, h.now, "operator"), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert_eq(h.run_state, SCHED_RUN_STOPPED);
  sched_free(h.s);
}

/* An agent remembers the plans it was told to abort, by name: a step redone
 * (its trainer lost and back, with a fresh batch or the step it had trained)
 * never names a plan as an earlier attempt did. */
Test(sched_resume, a_step_redone_never_reuses_a_plan_name) {
  fx h;
  fx_to_plan(&h);
  cr_assert_str_eq(h.plan_id, "r1/step-0");
  cr_assert_eq(sched_worker_lost(h.s, h.now, FX_TRAINER, "gone"), SCHED_OK);
  fx_drain(&h);
  cr_assert_str_eq(h.abort_plan, "r1/step-0");
  fx_add_v(&h, 9, SCHED_ROLE_TRAINER, "trainer-again", &FX_GPU, 0);
  fx_answer(&h, 0, 50, 0);
  cr_assert_eq(h.ntrain, 2, "the step is trained again");
  cr_assert_eq(sched_step_done(h.s, h.now, 9, 0, 0.1, NULL), SCHED_OK);
  fx_drain(&h);
  cr_assert_str_eq(h.plan_id, "r1/step-0-r2");
  sched_free(h.s);

  start_resumed(&h, 4);
  fx_add_v(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU, 4);
  fx_add_v(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU, 5);
  cr_assert_str_eq(h.plan_id, "r1/step-4-resume1");
  cr_assert_eq(sched_worker_lost(h.s, h.now, FX_TRAINER, "stream closed"), SCHED_OK);
  fx_drain(&h);
  fx_add_v(&h, 9, SCHED_ROLE_TRAINER, "trainer", &FX_GPU, 5); /* the same process, again */
  cr_assert_eq(h.nplan, 2);
  cr_assert_str_eq(h.plan_id, "r1/step-4-resume1-r2");
  fx_build_and_ack(&h);
  fx_bcast_done(&h);
  cr_assert_eq(h.ncommit, 1);
  cr_assert_eq(h.records[0].step, 4);
  sched_free(h.s);
}
