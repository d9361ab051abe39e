/* The scheduler's broadcast plan: the ack barrier, what fails a plan (hash
 * mismatch, refusal, timeouts, broadcast errors, build errors), and the mode
 * a plan is asked in. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/sched/sched.h"
#include "sched_fixture.h"

/* ---- plan barrier ---------------------------------------------------------------------- */

Test(sched_plan, no_trigger_until_last_ack) {
  fx h;
  fx_to_plan(&h);
  cr_assert_str_eq(h.plan_id, "r1/step-0");
  uint32_t want[] = {FX_TRAINER, 2, 3};
  cr_assert_eq(h.nparts, 3);
  cr_assert_arr_eq(h.parts, want, sizeof want);
  cr_assert_eq(sched_plan_acked(h.s, h.now, 2, h.plan_id, 7, NULL), SCHED_ESTATE,
               "ack before the plan is built");
  cr_assert_eq(sched_plan_built(h.s, h.now, h.plan_id, 7, NULL), SCHED_OK);
  cr_assert_eq(sched_plan_acked(h.s, h.now, 3, h.plan_id, 7, NULL), SCHED_OK);
  cr_assert_eq(sched_plan_acked(h.s, h.now, FX_TRAINER, h.plan_id, 7, NULL), SCHED_OK);
  cr_assert_eq(sched_plan_acked(h.s, h.now, 3, h.plan_id, 7, NULL), SCHED_OK); /* repeat */
  cr_assert_eq(sched_plan_acked(h.s, h.now, 2, "r1/step-9", 7, NULL), SCHED_ESTALE);
  fx_drain(&h);
  cr_assert_eq(h.ntrigger, 0);
  cr_assert_eq(sched_plan_acked(h.s, h.now, 2, h.plan_id, 7, NULL), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.ntrigger, 1);
  /* Sent again once the broadcast runs (a broken report stream): taken as
   * the first was, nothing triggered or aborted twice. */
  cr_assert_eq(sched_plan_acked(h.s, h.now, 2, h.plan_id, 7, NULL), SCHED_OK);
  cr_assert_eq(sched_plan_acked(h.s, h.now, FX_TRAINER, h.plan_id, 7, NULL), SCHED_OK);
  cr_assert_eq(sched_plan_acked(h.s, h.now, 2, "r1/step-9", 7, NULL), SCHED_ESTALE);
  cr_assert_eq(sched_plan_acked(h.s, h.now, 99, h.plan_id, 7, NULL) == SCHED_OK, 0,
               "a worker outside the plan is not taken for a repeat");
  fx_drain(&h);
  cr_assert_eq(h.ntrigger, 1);
  cr_assert_eq(h.nabort, 0);
  sched_free(h.s);
}

Test(sched_plan, mismatched_hash_aborts_naming_the_worker) {
  fx h;
  fx_to_plan(&h);
  sched_plan_built(h.s, h.now, h.plan_id, 7, NULL);
  sched_plan_acked(h.s, h.now, FX_TRAINER, h.plan_id, 7, NULL);
  cr_assert_eq(sched_plan_acked(h.s, h.now, 3, h.plan_id, 8, NULL), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.ntrigger, 0);
  cr_assert_eq(h.nabort, 1);
  cr_assert(strstr(h.abort_reason, "inference-3"), "%s", h.abort_reason);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "hash"), "%s", h.run_msg);
  cr_assert_eq(sched_next_deadline(h.s), SCHED_NEVER);
  sched_free(h.s);
}

Test(sched_plan, ack_with_error_aborts) {
  fx h;
  fx_to_plan(&h);
  sched_plan_built(h.s, h.now, h.plan_id, 7, NULL);
  sched_plan_acked(h.s, h.now, 2, h.plan_id, 7, "tensor layers.0.w missing");
  fx_drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert(strstr(h.abort_reason, "inference-2 refused"), "%s", h.abort_reason);
  cr_assert(strstr(h.abort_reason, "layers.0.w"), "%s", h.abort_reason);
  sched_free(h.s);
}

Test(sched_plan, ack_timeout_aborts_naming_the_laggard) {
  fx h;
  fx_to_plan(&h);
  sched_plan_built(h.s, h.now, h.plan_id, 7, NULL);
  sched_plan_acked(h.s, h.now, FX_TRAINER, h.plan_id, 7, NULL);
  sched_plan_acked(h.s, h.now, 2, h.plan_id, 7, NULL);
  int64_t d = sched_next_deadline(h.s);
  cr_assert_eq(d, h.now + 1000);
  sched_tick(h.s, d - 1);
  fx_drain(&h);
  cr_assert_eq(h.nabort, 0);
  sched_tick(h.s, d);
  fx_drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert_eq(h.abort_kind, SCHED_ABORT_ACK_TIMEOUT);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "inference-3"), "%s", h.run_msg);
  sched_counters k;
  sched_get_counters(h.s, &k);
  cr_assert_eq(k.aborts, 1);
  cr_assert_eq(k.aborts_by_reason[SCHED_ABORT_ACK_TIMEOUT], 1);
  cr_assert_eq(k.steps, 0);
  sched_free(h.s);
}

Test(sched_plan, broadcast_timeout_and_error_fail_the_run) {
  fx h;
  fx_to_plan(&h);
  fx_build_and_ack(&h);
  cr_assert_eq(h.ntrigger, 1);
  cr_assert_eq(sched_next_deadline(h.s), h.now + 5000);
  sched_broadcast_done(h.s, h.now, 3, h.plan_id, "NCCL error 5: unhandled system error", NULL);
  fx_drain(&h);
  /* A short grace first: the error may be the echo of a peer about to be
   * lost. Every participant is heard from meanwhile: none is. */
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED);
  cr_assert_eq(sched_next_deadline(h.s), h.now + 3000);
  for (size_t i = 0; i < h.nparts; i++)
    cr_assert_eq(sched_worker_heartbeat(h.s, h.now + 1000, h.parts[i], 0), SCHED_OK);
  sched_tick(h.s, h.now + 2999);
  fx_drain(&h);
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED);
  sched_tick(h.s, h.now + 3000);
  fx_drain(&h);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert_eq(h.abort_kind, SCHED_ABORT_ERROR);
  cr_assert(strstr(h.run_msg, "inference-3"), "%s", h.run_msg);
  cr_assert(strstr(h.run_msg, "NCCL error 5"), "%s", h.run_msg);
  cr_assert_eq(h.ncommit, 0);
  sched_free(h.s);

  fx_to_plan(&h);
  fx_build_and_ack(&h);
  sched_tick(h.s, h.now + 5000);
  fx_drain(&h);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert_eq(h.abort_kind, SCHED_ABORT_BROADCAST_TIMEOUT);
  cr_assert(strstr(h.run_msg, "broadcast timed out"), "%s", h.run_msg);
  sched_free(h.s);
}

/* The shell's cost model bounds each plan: its ack and broadcast deadlines,
 * and a timeout names what it observed against what the bound expected. */
Test(sched_plan, plan_limits_bound_the_plan_and_are_quoted_at_a_timeout) {
  fx h;
  fx_to_plan(&h);
  cr_assert_eq(sched_plan_limits(h.s, h.now, "other/step-0", 1, 1, NULL), SCHED_ESTALE);
  cr_assert_eq(sched_plan_limits(h.s, h.now, h.plan_id, 0, 1000, NULL), SCHED_EINVAL);
  cr_assert(strstr(sched_last_error(h.s), "must be > 0"), "%s", sched_last_error(h.s));
  cr_assert_eq(sched_plan_limits(h.s, h.now, h.plan_id, 7400, 10200,
                                 "400.0 MB to 2 receivers at >= 0.5 GB/s for host mode"),
               SCHED_OK);
  cr_assert_eq(sched_plan_built(h.s, h.now, h.plan_id, 7, NULL), SCHED_OK);
  cr_assert_eq(sched_plan_limits(h.s, h.now, h.plan_id, 1, 1, NULL), SCHED_ESTATE, "built already");
  cr_assert_eq(sched_next_deadline(h.s), h.now + 7400, "not the run's 1000 ms");
  for (size_t i = 0; i < h.nparts; i++)
    cr_assert_eq(sched_plan_acked(h.s, h.now, h.parts[i], h.plan_id, 7, NULL), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.ntrigger, 1);
  cr_assert_eq(sched_next_deadline(h.s), h.now + 10200, "not the run's 5000 ms");
  sched_tick(h.s, h.now + 10199);
  fx_drain(&h);
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED);
  sched_tick(h.s, h.now + 10200);
  fx_drain(&h);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert_eq(h.abort_kind, SCHED_ABORT_BROADCAST_TIMEOUT);
  cr_assert(strstr(h.run_msg, "observed no broadcast report from trainer") &&
                strstr(h.run_msg, "in 10.2 s, expected within 10.2 s (400.0 MB to 2 receivers at >= 0.5 GB/s "
                                  "for host mode)"),
            "%s", h.run_msg);
  sched_free(h.s);
}

Test(sched_plan, build_failure_fails_the_run) {
  fx h;
  fx_to_plan(&h);
  cr_assert_eq(sched_plan_built(h.s, h.now, h.plan_id, 0, "tensor layers.2.w: shape mismatch"),
               SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "layers.2.w"), "%s", h.run_msg);
  sched_free(h.s);
}

/* ---- mode ------------------------------------------------------------------------ */

Test(sched_run, impossible_override_fails_naming_the_capability) {
  fx h;
  sched_settings c = fx_settings(1, 0, 1, 4);
  fx_start(&h, &c);
  sched_caps no_nccl = {.cuda_devices = 1, .nccl = 0};
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &no_nccl);
  cr_assert_eq(sched_set_policy(h.s, h.now, SCHED_MODE_STAGED), SCHED_OK);
  fx_answer(&h, 2, 1, 0);
  fx_step_done(&h);
  cr_assert_eq(h.nplan, 0);
  cr_assert_eq(h.nabort, 1);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "NCCL missing on inference-2"), "%s", h.run_msg);
  sched_free(h.s);
}

Test(sched_run, auto_falls_to_host_without_nccl_and_says_why) {
  fx h;
  sched_settings c = fx_settings(1, 0, 1, 4);
  fx_start(&h, &c);
  sched_caps no_nccl = {.cuda_devices = 1, .nccl = 0};
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &no_nccl);
  fx_answer(&h, 2, 1, 0);
  fx_step_done(&h);
  cr_assert_eq(h.plan_mode, SCHED_MODE_HOST);
  fx_build_and_ack(&h);
  fx_bcast_done(&h);
  cr_assert_str_eq(h.records[0].mode_reason, "NCCL missing on inference-2");
  sched_free(h.s);
}
