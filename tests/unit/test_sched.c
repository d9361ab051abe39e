/* The scheduler driven by event sequences: off-policy bound, dispatch, the plan
 * barrier, losses, stop, success with step records, bad input. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/sched/sched.h"

#define T_ID 1 /* trainer id in most tests */
#define MAXQ 256

/* What the harness has seen of the actions, drained after every event. */
typedef struct harness {
  sched *s;
  int64_t now;
  struct { uint32_t worker; uint64_t id; uint32_t count; } reqs[MAXQ]; /* in flight */
  size_t nreqs;
  size_t dispatch_log[MAXQ]; /* worker ids of every DISPATCH, in order */
  size_t ndispatch;
  int ntrain, nplan, ntrigger, nabort, ncommit;
  uint64_t train_step;
  uint64_t train_ids[64];
  size_t ntrain_ids;
  char plan_id[SCHED_PLAN_ID_MAX];
  sched_mode plan_mode;
  uint32_t parts[16];
  size_t nparts;
  char abort_reason[SCHED_TEXT_MAX];
  sched_step_record records[16];
  sched_run_state run_state;
  char run_msg[SCHED_TEXT_MAX];
  int lost[64];
} harness;

static void drain(harness *h) {
  const sched_action *a;
  size_t n = sched_actions(h->s, &a);
  for (size_t i = 0; i < n; i++) {
    switch (a[i].kind) {
    case SCHED_ACT_DISPATCH:
      cr_assert_lt(h->nreqs, MAXQ);
      h->reqs[h->nreqs].worker = a[i].worker;
      h->reqs[h->nreqs].id = a[i].request_id;
      h->reqs[h->nreqs++].count = a[i].count;
      h->dispatch_log[h->ndispatch++] = a[i].worker;
      break;
    case SCHED_ACT_TRAIN:
      h->ntrain++;
      h->train_step = a[i].step;
      h->ntrain_ids = a[i].nrollouts;
      memcpy(h->train_ids, a[i].rollout_ids, a[i].nrollouts * sizeof(uint64_t));
      break;
    case SCHED_ACT_BUILD_PLAN:
      h->nplan++;
      snprintf(h->plan_id, sizeof h->plan_id, "%s", a[i].plan_id);
      h->plan_mode = a[i].mode;
      h->nparts = a[i].nparticipants;
      memcpy(h->parts, a[i].participants, a[i].nparticipants * sizeof(uint32_t));
      break;
    case SCHED_ACT_TRIGGER: h->ntrigger++; break;
    case SCHED_ACT_ABORT:
      h->nabort++;
      snprintf(h->abort_reason, sizeof h->abort_reason, "%s", a[i].text);
      break;
    case SCHED_ACT_COMMIT: h->records[h->ncommit++] = *a[i].record; break;
    case SCHED_ACT_RUN_STATE:
      h->run_state = a[i].run_state;
      snprintf(h->run_msg, sizeof h->run_msg, "%s", a[i].text);
      break;
    case SCHED_ACT_WORKER_STATE:
      if (a[i].worker_state == SCHED_WORKER_LOST && a[i].worker < 64) h->lost[a[i].worker] = 1;
      break;
    }
  }
  sched_actions_clear(h->s);
}

static sched_settings settings(uint32_t per_step, uint32_t async, uint32_t k, uint32_t cap) {
  sched_settings c;
  sched_settings_default(&c);
  snprintf(c.run_id, sizeof c.run_id, "r1");
  c.rollouts_per_step = per_step;
  c.max_async_level = async;
  c.max_outstanding = k;
  c.max_buffered = cap;
  c.heartbeat_timeout_ms = 1000000;
  c.plan_ack_timeout_ms = 1000;
  c.broadcast_timeout_ms = 5000;
  return c;
}

static void start(harness *h, const sched_settings *c) {
  memset(h, 0, sizeof *h);
  char err[256];
  cr_assert_eq(sched_new(c, &h->s, err, sizeof err), SCHED_OK, "%s", err);
  h->now = 1000;
}

static const sched_caps GPU = {.cuda_devices = 1, .nccl = 1, .pinned_limit_bytes = 1 << 30};
static const sched_offload ALL_GPU = {.gpu_tensors = 10, .gpu_bytes = 1000};

static void add(harness *h, uint32_t id, sched_role role, const char *name, const sched_caps *c) {
  cr_assert_eq(sched_worker_registered(h->s, h->now, id, role, name, c, &ALL_GPU), SCHED_OK,
               "%s", sched_last_error(h->s));
  cr_assert_eq(sched_worker_attached(h->s, h->now, id), SCHED_OK);
  drain(h);
}

/* Answers the oldest request in flight of `worker` (0: any) with one rollout. */
static void answer(harness *h, uint32_t worker, uint64_t rid, uint64_t version) {
  for (size_t i = 0; i < h->nreqs; i++) {
    if (worker && h->reqs[i].worker != worker) continue;
    sched_rollout r = {.id = rid, .policy_version = version, .tokens = 10};
    uint32_t w = h->reqs[i].worker;
    uint64_t q = h->reqs[i].id;
    memmove(&h->reqs[i], &h->reqs[i + 1], (h->nreqs - i - 1) * sizeof h->reqs[0]);
    h->nreqs--;
    cr_assert_eq(sched_rollouts_done(h->s, h->now, w, q, &r, 1), SCHED_OK, "%s",
                 sched_last_error(h->s));
    drain(h);
    return;
  }
  cr_assert_fail("no request in flight for worker %" PRIu32, worker);
}

static void step_done(harness *h) {
  h->now += 100;
  cr_assert_eq(sched_step_done(h->s, h->now, T_ID, h->train_step, 0.1, NULL), SCHED_OK, "%s",
               sched_last_error(h->s));
  drain(h);
}

static void build_and_ack(harness *h) {
  cr_assert_eq(sched_plan_built(h->s, h->now, h->plan_id, 0xabc, NULL), SCHED_OK);
  for (size_t i = 0; i < h->nparts; i++)
    cr_assert_eq(sched_plan_acked(h->s, h->now, h->parts[i], h->plan_id, 0xabc, NULL), SCHED_OK);
  drain(h);
}

static void bcast_done(harness *h) {
  h->now += 50;
  sched_bcast_report rep = {.transport = "nccl", .pcie_bytes = 400, .wire_bytes = 2000,
                            .h2d_seconds = 0.01, .cast_seconds = 0.005, .wire_seconds = 0.02,
                            .total_seconds = 0.04, .exposed_staging_seconds = 0.01,
                            .buckets = 3, .weights_checksum = 77};
  sched_bcast_report rx = {.weights_checksum = 77};
  for (size_t i = 0; i < h->nparts; i++)
    cr_assert_eq(sched_broadcast_done(h->s, h->now, h->parts[i], h->plan_id, NULL,
                                      i == 0 ? &rep : &rx),
                 SCHED_OK, "%s", sched_last_error(h->s));
  drain(h);
}

static void finish_step(harness *h) {
  step_done(h);
  build_and_ack(h);
  bcast_done(h);
}

/* ---- off-policy bound -------------------------------------------------------------- */

/* Steps 0..2 with batch 2; six v0 rollouts (ids 1..6) arrive before step 0;
 * later rollouts are fresh (id 100+, current version) only when no batch forms. */
static void bounded_run(uint32_t async, uint64_t batches[3][2], uint64_t *dropped) {
  harness h;
  sched_settings c = settings(2, async, 8, 16);
  c.steps = 3;
  start(&h, &c);
  add(&h, T_ID, SCHED_ROLE_TRAINER, "trainer", &GPU);
  add(&h, 2, SCHED_ROLE_INFERENCE, "inference-1", &GPU);
  for (uint64_t id = 1; id <= 6; id++) answer(&h, 2, id, 0);
  uint64_t fresh = 100;
  for (int step = 0; step < 3; step++) {
    while (h.ntrain == step && fresh < 150) {
      sched_run_info ri;
      sched_get_run(h.s, &ri);
      answer(&h, 2, fresh++, ri.policy_version);
    }
    cr_assert_eq(h.ntrain, step + 1, "no batch formed for step %d", step);
    cr_assert_eq(h.train_step, (uint64_t)step);
    cr_assert_eq(h.ntrain_ids, 2);
    memcpy(batches[step], h.train_ids, sizeof batches[step]);
    finish_step(&h);
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
  harness h;
  sched_settings c = settings(2, 3, 8, 16);
  start(&h, &c);
  add(&h, T_ID, SCHED_ROLE_TRAINER, "trainer", &GPU);
  add(&h, 2, SCHED_ROLE_INFERENCE, "inference-1", &GPU);
  answer(&h, 2, 1, 0);
  answer(&h, 2, 2, 0);
  finish_step(&h); /* v1 */
  answer(&h, 2, 10, 1); /* newer first */
  cr_assert_eq(h.ntrain, 1);
  answer(&h, 2, 11, 0); /* older second: a late v0 rollout */
  cr_assert_eq(h.ntrain, 2);
  cr_assert_eq(h.train_ids[0], 11);
  cr_assert_eq(h.train_ids[1], 10);
  sched_counters k;
  sched_get_counters(h.s, &k);
  cr_assert_eq(k.async_level, 1);
  sched_free(h.s);
}

/* ---- dispatch ------------------------------------------------------------------------ */

Test(sched_dispatch, least_loaded_ties_lowest_id_at_most_k) {
  harness h;
  sched_settings c = settings(50, 1, 2, 100);
  start(&h, &c);
  add(&h, 5, SCHED_ROLE_INFERENCE, "inference-5", &GPU);
  add(&h, 3, SCHED_ROLE_INFERENCE, "inference-3", &GPU);
  add(&h, 9, SCHED_ROLE_INFERENCE, "inference-9", &GPU);
  cr_assert_eq(h.ndispatch, 0, "no dispatch before the run starts");
  add(&h, T_ID, SCHED_ROLE_TRAINER, "trainer", &GPU);
  size_t want[] = {3, 5, 9, 3, 5, 9};
  cr_assert_eq(h.ndispatch, 6);
  cr_assert_arr_eq(h.dispatch_log, want, sizeof want);
  /* Only 9 has room after its result: the next request goes to 9. */
  answer(&h, 9, 1, 0);
  cr_assert_eq(h.ndispatch, 7);
  cr_assert_eq(h.dispatch_log[6], 9);
  sched_worker_info w;
  for (uint32_t id = 3; id <= 9; id += 2) {
    if (sched_get_worker(h.s, id, &w) == SCHED_OK) cr_assert_leq(w.outstanding, 2);
  }
  sched_free(h.s);
}

Test(sched_dispatch, buffer_cap_limits_requests) {
  harness h;
  sched_settings c = settings(4, 0, 8, 4);
  start(&h, &c);
  add(&h, 2, SCHED_ROLE_INFERENCE, "a", &GPU);
  add(&h, 3, SCHED_ROLE_INFERENCE, "b", &GPU);
  add(&h, T_ID, SCHED_ROLE_TRAINER, "trainer", &GPU);
  cr_assert_eq(h.ndispatch, 4);
  size_t want[] = {2, 3, 2, 3};
  cr_assert_arr_eq(h.dispatch_log, want, sizeof want);
  sched_counters k;
  sched_get_counters(h.s, &k);
  cr_assert_eq(k.rollouts_requested, 4);
  sched_free(h.s);
}

/* ---- plan barrier ---------------------------------------------------------------------- */

/* Trainer 1, inference 2 and 3; step 0 trained; plan asked for. */
static void to_plan(harness *h) {
  sched_settings c = settings(1, 0, 1, 4);
  c.steps = 2;
  start(h, &c);
  add(h, T_ID, SCHED_ROLE_TRAINER, "trainer", &GPU);
  add(h, 2, SCHED_ROLE_INFERENCE, "inference-2", &GPU);
  add(h, 3, SCHED_ROLE_INFERENCE, "inference-3", &GPU);
  answer(h, 2, 1, 0);
  cr_assert_eq(h->ntrain, 1);
  step_done(h);
  cr_assert_eq(h->nplan, 1);
}

Test(sched_plan, no_trigger_until_last_ack) {
  harness h;
  to_plan(&h);
  cr_assert_str_eq(h.plan_id, "r1/step-0");
  uint32_t want[] = {T_ID, 2, 3};
  cr_assert_eq(h.nparts, 3);
  cr_assert_arr_eq(h.parts, want, sizeof want);
  cr_assert_eq(sched_plan_acked(h.s, h.now, 2, h.plan_id, 7, NULL), SCHED_ESTATE,
               "ack before the plan is built");
  cr_assert_eq(sched_plan_built(h.s, h.now, h.plan_id, 7, NULL), SCHED_OK);
  cr_assert_eq(sched_plan_acked(h.s, h.now, 3, h.plan_id, 7, NULL), SCHED_OK);
  cr_assert_eq(sched_plan_acked(h.s, h.now, T_ID, h.plan_id, 7, NULL), SCHED_OK);
  cr_assert_eq(sched_plan_acked(h.s, h.now, 3, h.plan_id, 7, NULL), SCHED_OK); /* repeat */
  cr_assert_eq(sched_plan_acked(h.s, h.now, 2, "r1/step-9", 7, NULL), SCHED_ESTALE);
  drain(&h);
  cr_assert_eq(h.ntrigger, 0);
  cr_assert_eq(sched_plan_acked(h.s, h.now, 2, h.plan_id, 7, NULL), SCHED_OK);
  drain(&h);
  cr_assert_eq(h.ntrigger, 1);
  sched_free(h.s);
}

Test(sched_plan, mismatched_hash_aborts_naming_the_worker) {
  harness h;
  to_plan(&h);
  sched_plan_built(h.s, h.now, h.plan_id, 7, NULL);
  sched_plan_acked(h.s, h.now, T_ID, h.plan_id, 7, NULL);
  cr_assert_eq(sched_plan_acked(h.s, h.now, 3, h.plan_id, 8, NULL), SCHED_OK);
  drain(&h);
  cr_assert_eq(h.ntrigger, 0);
  cr_assert_eq(h.nabort, 1);
  cr_assert(strstr(h.abort_reason, "inference-3"), "%s", h.abort_reason);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "hash"), "%s", h.run_msg);
  cr_assert_eq(sched_next_deadline(h.s), SCHED_NEVER);
  sched_free(h.s);
}

Test(sched_plan, ack_with_error_aborts) {
  harness h;
  to_plan(&h);
  sched_plan_built(h.s, h.now, h.plan_id, 7, NULL);
  sched_plan_acked(h.s, h.now, 2, h.plan_id, 7, "tensor layers.0.w missing");
  drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert(strstr(h.abort_reason, "inference-2 refused"), "%s", h.abort_reason);
  cr_assert(strstr(h.abort_reason, "layers.0.w"), "%s", h.abort_reason);
  sched_free(h.s);
}

Test(sched_plan, ack_timeout_aborts_naming_the_laggard) {
  harness h;
  to_plan(&h);
  sched_plan_built(h.s, h.now, h.plan_id, 7, NULL);
  sched_plan_acked(h.s, h.now, T_ID, h.plan_id, 7, NULL);
  sched_plan_acked(h.s, h.now, 2, h.plan_id, 7, NULL);
  int64_t d = sched_next_deadline(h.s);
  cr_assert_eq(d, h.now + 1000);
  sched_tick(h.s, d - 1);
  drain(&h);
  cr_assert_eq(h.nabort, 0);
  sched_tick(h.s, d);
  drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "inference-3"), "%s", h.run_msg);
  sched_counters k;
  sched_get_counters(h.s, &k);
  cr_assert_eq(k.aborts, 1);
  cr_assert_eq(k.steps, 0);
  sched_free(h.s);
}

Test(sched_plan, broadcast_timeout_and_error_fail_the_run) {
  harness h;
  to_plan(&h);
  build_and_ack(&h);
  cr_assert_eq(h.ntrigger, 1);
  cr_assert_eq(sched_next_deadline(h.s), h.now + 5000);
  sched_broadcast_done(h.s, h.now, 3, h.plan_id, "NCCL error 5: unhandled system error", NULL);
  drain(&h);
  /* A short grace first: the error may be the echo of a peer about to be lost. */
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED);
  cr_assert_eq(sched_next_deadline(h.s), h.now + 3000);
  sched_tick(h.s, h.now + 2999);
  drain(&h);
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED);
  sched_tick(h.s, h.now + 3000);
  drain(&h);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "inference-3"), "%s", h.run_msg);
  cr_assert(strstr(h.run_msg, "NCCL error 5"), "%s", h.run_msg);
  cr_assert_eq(h.ncommit, 0);
  sched_free(h.s);

  to_plan(&h);
  build_and_ack(&h);
  sched_tick(h.s, h.now + 5000);
  drain(&h);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "broadcast timed out"), "%s", h.run_msg);
  sched_free(h.s);
}

/* ---- losses ----------------------------------------------------------------------------- */

Test(sched_lost, inference_before_trigger_replans_without_it) {
  harness h;
  to_plan(&h);
  sched_plan_built(h.s, h.now, h.plan_id, 7, NULL);
  sched_plan_acked(h.s, h.now, T_ID, h.plan_id, 7, NULL);
  cr_assert_eq(sched_worker_lost(h.s, h.now, 3, "stream closed"), SCHED_OK);
  drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert(strstr(h.abort_reason, "inference-3"), "%s", h.abort_reason);
  cr_assert(h.lost[3]);
  cr_assert_eq(h.nplan, 2);
  cr_assert_str_eq(h.plan_id, "r1/step-0-r2");
  uint32_t want[] = {T_ID, 2};
  cr_assert_eq(h.nparts, 2);
  cr_assert_arr_eq(h.parts, want, sizeof want);
  cr_assert_eq(sched_plan_acked(h.s, h.now, 2, "r1/step-0", 7, NULL), SCHED_ESTALE);
  cr_assert_eq(sched_worker_lost(h.s, h.now, 3, NULL), SCHED_ESTALE);
  build_and_ack(&h);
  bcast_done(&h);
  cr_assert_eq(h.ncommit, 1);
  cr_assert_eq(h.records[0].receivers, 1);
  sched_free(h.s);
}

Test(sched_lost, inference_after_trigger_replans) {
  harness h;
  to_plan(&h);
  build_and_ack(&h);
  sched_broadcast_done(h.s, h.now, 2, h.plan_id, NULL, NULL);
  sched_worker_lost(h.s, h.now, 2, NULL);
  drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert(strstr(h.abort_reason, "inference-2 lost"), "%s", h.abort_reason);
  cr_assert_eq(h.nplan, 2);
  cr_assert_eq(h.nparts, 2);
  cr_assert_eq(h.parts[1], 3);
  cr_assert_eq(h.run_state, SCHED_RUN_RUNNING);
  sched_free(h.s);
}

Test(sched_lost, broadcast_error_then_peer_lost_replans) {
  harness h;
  to_plan(&h);
  build_and_ack(&h);
  cr_assert_eq(h.ntrigger, 1);
  /* The trainer sees the dead receiver's connection reset before the
   * orchestrator sees its stream close. */
  sched_broadcast_done(h.s, h.now, T_ID, h.plan_id, "receiver rank 2 closed the connection",
                       NULL);
  drain(&h);
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED);
  h.now += 5;
  cr_assert_eq(sched_worker_lost(h.s, h.now, h.parts[2], "command stream closed"), SCHED_OK);
  drain(&h);
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED, "%s", h.run_msg);
  cr_assert_eq(h.nplan, 2, "the step is planned again without the lost worker");
  build_and_ack(&h);
  h.now += 3000; /* past the old plan's grace */
  sched_tick(h.s, h.now);
  drain(&h);
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED, "the old plan's error does not fail the new one: %s",
                h.run_msg);
  bcast_done(&h);
  cr_assert_eq(h.ncommit, 1, "the step commits with the remaining workers");
  sched_free(h.s);
}

Test(sched_lost, last_inference_lost_waits_pending_then_resumes) {
  harness h;
  to_plan(&h);
  sched_worker_lost(h.s, h.now, 2, NULL);
  drain(&h);
  sched_worker_lost(h.s, h.now, 3, NULL);
  drain(&h);
  cr_assert_eq(h.run_state, SCHED_RUN_PENDING);
  int plans = h.nplan;
  add(&h, 4, SCHED_ROLE_INFERENCE, "inference-4", &GPU);
  cr_assert_eq(h.run_state, SCHED_RUN_RUNNING);
  cr_assert_eq(h.nplan, plans + 1);
  cr_assert_eq(h.nparts, 2);
  cr_assert_eq(h.parts[1], 4);
  sched_free(h.s);
}

Test(sched_lost, trainer_lost_goes_pending_and_redoes_the_step) {
  harness h;
  to_plan(&h);
  uint64_t first = h.train_ids[0];
  sched_plan_built(h.s, h.now, h.plan_id, 7, NULL);
  sched_worker_lost(h.s, h.now, T_ID, "no heartbeat");
  drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert(strstr(h.abort_reason, "trainer"), "%s", h.abort_reason);
  cr_assert_eq(h.run_state, SCHED_RUN_PENDING);
  answer(&h, 0, 2, 0);
  cr_assert_eq(h.ntrain, 1, "no step without a trainer");
  add(&h, T_ID, SCHED_ROLE_TRAINER, "trainer-b", &GPU); /* the same id may register again */
  cr_assert_eq(h.run_state, SCHED_RUN_RUNNING);
  cr_assert_eq(h.ntrain, 2);
  cr_assert_eq(h.train_step, 0);
  cr_assert_neq(h.train_ids[0], first, "a rollout is never used twice");
  sched_free(h.s);
}

Test(sched_lost, heartbeat_timeout_loses_the_worker) {
  harness h;
  sched_settings c = settings(1, 0, 1, 4);
  c.heartbeat_timeout_ms = 500;
  start(&h, &c);
  add(&h, T_ID, SCHED_ROLE_TRAINER, "trainer", &GPU);
  add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &GPU);
  cr_assert_eq(sched_next_deadline(h.s), h.now + 500);
  sched_worker_heartbeat(h.s, h.now + 400, T_ID, 0);
  cr_assert_eq(sched_next_deadline(h.s), h.now + 500);
  sched_tick(h.s, h.now + 500);
  drain(&h);
  cr_assert(h.lost[2]);
  cr_assert_not(h.lost[T_ID]);
  cr_assert_eq(h.run_state, SCHED_RUN_PENDING);
  sched_counters k;
  sched_get_counters(h.s, &k);
  cr_assert_eq(k.rollouts_requested, 0, "requests in flight on a lost worker are forgotten");
  cr_assert_eq(sched_rollouts_done(h.s, h.now, 2, 1, NULL, 0), SCHED_ESTALE);
  sched_free(h.s);
}

/* ---- stop --------------------------------------------------------------------------------- */

Test(sched_stop, mid_training_waits_for_step_done) {
  harness h;
  to_plan(&h);
  build_and_ack(&h);
  bcast_done(&h);
  answer(&h, 0, 2, 1);
  cr_assert_eq(h.ntrain, 2);
  cr_assert_eq(sched_stop(h.s, h.now, "operator"), SCHED_OK);
  drain(&h);
  cr_assert_eq(h.run_state, SCHED_RUN_STOPPING);
  cr_assert_eq(sched_stop(h.s, h.now, "again"), SCHED_ESTATE);
  int plans = h.nplan;
  step_done(&h);
  cr_assert_eq(h.run_state, SCHED_RUN_STOPPED);
  cr_assert_eq(h.nplan, plans, "no plan after a stop");
  cr_assert(strstr(h.run_msg, "operator"), "%s", h.run_msg);
  sched_free(h.s);
}

Test(sched_stop, mid_plan_aborts) {
  harness h;
  to_plan(&h);
  build_and_ack(&h);
  sched_stop(h.s, h.now, "maintenance");
  drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert(strstr(h.abort_reason, "maintenance"), "%s", h.abort_reason);
  cr_assert_eq(h.run_state, SCHED_RUN_STOPPED);
  cr_assert_eq(sched_broadcast_done(h.s, h.now, T_ID, h.plan_id, NULL, NULL), SCHED_ESTALE);
  cr_assert_eq(sched_next_deadline(h.s), SCHED_NEVER);
  sched_free(h.s);
}

/* ---- success and records --------------------------------------------------------------------- */

Test(sched_run, succeeds_with_records_that_add_up) {
  harness h;
  sched_settings c = settings(2, 1, 2, 8);
  c.steps = 3;
  start(&h, &c);
  add(&h, T_ID, SCHED_ROLE_TRAINER, "trainer", &GPU);
  add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &GPU);
  uint64_t id = 1;
  for (int step = 0; step < 3; step++) {
    int64_t t0 = 0;
    while (h.ntrain == step) {
      sched_run_info ri;
      sched_get_run(h.s, &ri);
      t0 = h.now;
      answer(&h, 2, id++, ri.policy_version);
    }
    finish_step(&h);
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

Test(sched_run, impossible_override_fails_naming_the_capability) {
  harness h;
  sched_settings c = settings(1, 0, 1, 4);
  start(&h, &c);
  sched_caps no_nccl = {.cuda_devices = 1, .nccl = 0};
  add(&h, T_ID, SCHED_ROLE_TRAINER, "trainer", &GPU);
  add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &no_nccl);
  cr_assert_eq(sched_set_policy(h.s, h.now, SCHED_MODE_STAGED), SCHED_OK);
  answer(&h, 2, 1, 0);
  step_done(&h);
  cr_assert_eq(h.nplan, 0);
  cr_assert_eq(h.nabort, 1);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "NCCL missing on inference-2"), "%s", h.run_msg);
  sched_free(h.s);
}

Test(sched_run, auto_falls_to_host_without_nccl_and_says_why) {
  harness h;
  sched_settings c = settings(1, 0, 1, 4);
  start(&h, &c);
  sched_caps no_nccl = {.cuda_devices = 1, .nccl = 0};
  add(&h, T_ID, SCHED_ROLE_TRAINER, "trainer", &GPU);
  add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &no_nccl);
  answer(&h, 2, 1, 0);
  step_done(&h);
  cr_assert_eq(h.plan_mode, SCHED_MODE_HOST);
  build_and_ack(&h);
  bcast_done(&h);
  cr_assert_str_eq(h.records[0].mode_reason, "NCCL missing on inference-2");
  sched_free(h.s);
}

/* ---- bad input ------------------------------------------------------------------------------------ */

Test(sched_input, rejected_reports_name_the_field) {
  harness h;
  sched_settings c = settings(4, 0, 1, 8);
  start(&h, &c);
  add(&h, T_ID, SCHED_ROLE_TRAINER, "trainer", &GPU);
  add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &GPU);
  add(&h, 3, SCHED_ROLE_INFERENCE, "inference-3", &GPU);
  cr_assert_eq(sched_worker_registered(h.s, h.now, 2, SCHED_ROLE_INFERENCE, "x", &GPU, NULL),
               SCHED_EEXIST);
  cr_assert_eq(sched_worker_registered(h.s, h.now, 7, SCHED_ROLE_TRAINER, "t2", &GPU, NULL),
               SCHED_EEXIST);
  cr_assert(strstr(sched_last_error(h.s), "trainer"));
  cr_assert_eq(sched_worker_registered(h.s, h.now, 8, (sched_role)9, "x", &GPU, NULL),
               SCHED_EINVAL);
  cr_assert_eq(sched_worker_attached(h.s, h.now, 2), SCHED_ESTATE);
  cr_assert_eq(sched_worker_attached(h.s, h.now, 42), SCHED_ENOENT);
  cr_assert_eq(sched_worker_heartbeat(h.s, h.now, 2, 5), SCHED_EINVAL);
  cr_assert(strstr(sched_last_error(h.s), "policy_version"));
  /* Requests: 2 has request 1, 3 has request 2 (K = 1). */
  sched_rollout future = {.id = 1, .policy_version = 3};
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
  cr_assert_eq(sched_step_done(h.s, h.now, T_ID, 0, 1, NULL), SCHED_ESTATE, "not training");
  cr_assert_eq(sched_plan_built(h.s, h.now, "r1/step-0", 1, NULL), SCHED_ESTALE);
  cr_assert_eq(sched_plan_built(h.s, h.now, NULL, 1, NULL), SCHED_EINVAL);
  cr_assert_eq(sched_set_policy(h.s, h.now, (sched_mode)0), SCHED_EINVAL);
  sched_run_info ri;
  sched_get_run(h.s, &ri);
  cr_assert_eq(ri.state, SCHED_RUN_RUNNING);
  sched_free(h.s);
}

Test(sched_input, duplicate_rollout_ids_are_refused) {
  harness h;
  sched_settings c = settings(4, 0, 2, 8);
  start(&h, &c);
  add(&h, T_ID, SCHED_ROLE_TRAINER, "trainer", &GPU);
  add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &GPU);
  answer(&h, 2, 1, 0);
  sched_rollout dup = {.id = 1};
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
  sched_free(NULL);
}

Test(sched_plan, build_failure_fails_the_run) {
  harness h;
  to_plan(&h);
  cr_assert_eq(sched_plan_built(h.s, h.now, h.plan_id, 0, "tensor layers.2.w: shape mismatch"),
               SCHED_OK);
  drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "layers.2.w"), "%s", h.run_msg);
  sched_free(h.s);
}
