/* Trainer groups (sched.h, "Trainer groups"): N trainer ranks register one
 * worker each, train every step together and are the sources of its plan.
 * Worker ids: rank r is worker 1 + r; the receivers are 100 and 101. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/sched/sched.h"
#include "sched_fixture.h"

#define INF_A 100
#define INF_B 101
#define HB_MS 5000 /* heartbeat timeout of the runs that need one */

static uint32_t rank_id(uint32_t r) { return 1 + r; }

static sched_caps rank_caps(uint32_t r, uint32_t n) {
  sched_caps c = FX_GPU;
  c.trainer_rank = r;
  c.trainer_ranks = n;
  return c;
}

static int rank_register(fx *h, uint32_t r, uint32_t n, uint64_t v) {
  char name[32];
  snprintf(name, sizeof name, "trainer-%" PRIu32, r);
  sched_caps c = rank_caps(r, n);
  return sched_worker_registered(h->s, h->now, rank_id(r), SCHED_ROLE_TRAINER, name, &c,
                                 &FX_ALL_GPU, v);
}

static void add_rank(fx *h, uint32_t r, uint32_t n, uint64_t v) {
  cr_assert_eq(rank_register(h, r, n, v), SCHED_OK, "%s", sched_last_error(h->s));
  cr_assert_eq(sched_worker_attached(h->s, h->now, rank_id(r)), SCHED_OK);
  fx_drain(h);
}

static sched_settings group_settings(uint64_t steps) {
  sched_settings c = fx_settings(1, 0, 1, 4);
  c.steps = steps;
  return c;
}

/* A run of `steps` steps (batch 1, on-policy) with `n` ranks and two
 * receivers, all holding version 0. */
static void group_run(fx *h, uint32_t n, uint64_t steps) {
  sched_settings c = group_settings(steps);
  fx_start(h, &c);
  for (uint32_t r = 0; r < n; r++) add_rank(h, r, n, 0);
  fx_add(h, INF_A, SCHED_ROLE_INFERENCE, "inference-a", &FX_GPU);
  fx_add(h, INF_B, SCHED_ROLE_INFERENCE, "inference-b", &FX_GPU);
}

static int rank_done(fx *h, uint32_t r, uint64_t step) {
  h->now += 10;
  int rc = sched_step_done(h->s, h->now, rank_id(r), step, 0.1 * (r + 1), NULL);
  fx_drain(h);
  return rc;
}

/* Every rank reports the step training done, in `order` (NULL: rank order);
 * rank r took 0.1 (r + 1) s. */
static void ranks_done(fx *h, uint32_t n, const uint32_t *order) {
  for (uint32_t k = 0; k < n; k++) {
    uint32_t r = order ? order[k] : k;
    cr_assert_eq(rank_done(h, r, h->train_step), SCHED_OK, "%s", sched_last_error(h->s));
  }
}

/* Source r: checksum 1000 + r, 100 (r + 1) wire bytes in 0.1 (r + 1) s.
 * Each receiver reports every source's checksum; with `bad` set INF_B's of
 * source 1 is off by one. */
static void bcast_group(fx *h, int bad) {
  h->now += 50;
  uint32_t ns = h->plan_sources;
  uint64_t sums[SCHED_MAX_TRAINER_RANKS];
  for (uint32_t r = 0; r < ns; r++) sums[r] = 1000 + r;
  for (size_t i = 0; i < h->nparts; i++) {
    sched_bcast_report rep = {.transport = "host-tcp"};
    if (i < ns) {
      rep.wire_bytes = 100 * (i + 1);
      rep.pcie_bytes = 10;
      rep.total_seconds = 0.1 * (double)(i + 1);
      rep.wire_seconds = 0.05 * (double)(i + 1);
      rep.buckets = 2;
      rep.exposed_measured = 1;
      rep.weights_checksum = sums[i];
    } else {
      uint64_t mine[SCHED_MAX_TRAINER_RANKS];
      memcpy(mine, sums, ns * sizeof *mine);
      if (bad && h->parts[i] == INF_B) mine[1]++;
      rep.source_checksums = mine;
      rep.nsource_checksums = ns;
      cr_assert_eq(sched_broadcast_done(h->s, h->now, h->parts[i], h->plan_id, NULL, &rep),
                   SCHED_OK, "%s", sched_last_error(h->s));
      continue;
    }
    cr_assert_eq(sched_broadcast_done(h->s, h->now, h->parts[i], h->plan_id, NULL, &rep),
                 SCHED_OK, "%s", sched_last_error(h->s));
  }
  fx_drain(h);
}

/* The participants of the last plan are ranks 0..n-1, then the receivers. */
static void assert_group_plan(const fx *h, uint32_t n, size_t receivers) {
  cr_assert_eq(h->plan_sources, n);
  cr_assert_eq(h->nparts, n + receivers);
  for (uint32_t r = 0; r < n; r++)
    cr_assert_eq(h->parts[r], rank_id(r), "plan rank %" PRIu32 " is trainer rank %" PRIu32, r, r);
  for (size_t i = n; i + 1 < h->nparts; i++) cr_assert_lt(h->parts[i], h->parts[i + 1]);
}

/* TRAIN k (0-based over the run) went to rank k % n. */
static void assert_train_per_rank(const fx *h, uint32_t n, uint64_t step, int first) {
  for (uint32_t r = 0; r < n; r++) {
    cr_assert_eq(h->trains[first + r].worker, rank_id(r));
    cr_assert_eq(h->trains[first + r].rank, r);
    cr_assert_eq(h->trains[first + r].ranks, n);
    cr_assert_eq(h->trains[first + r].step, step);
    cr_assert_eq(h->trains[first + r].first_id, h->trains[first].first_id,
                 "every rank is sent the same batch");
  }
}

static void group_trains_and_commits(uint32_t n) {
  fx h;
  group_run(&h, n, 2);
  for (uint64_t step = 0; step < 2; step++) {
    fx_answer(&h, 0, 10 * step + 1, step);
    cr_assert_eq(h.ntrain, (int)(n * (step + 1)), "one TRAIN per rank");
    assert_train_per_rank(&h, n, step, (int)(n * step));
    ranks_done(&h, n, NULL);
    cr_assert_eq(h.nplan, (int)step + 1);
    assert_group_plan(&h, n, 2);
    cr_assert_eq(h.plan_mode, SCHED_MODE_HOST);
    char want[64];
    snprintf(want, sizeof want, "%" PRIu32 " trainer ranks: several sources run on the host", n);
    cr_assert(strstr(h.plan_reason, want), "%s", h.plan_reason);
    fx_build_and_ack(&h);
    cr_assert_eq(h.ntrigger, (int)step + 1);
    bcast_group(&h, 0);
    cr_assert_eq(h.ncommit, (int)step + 1, "%s", h.run_msg);
    const sched_step_record *rec = &h.records[step];
    cr_assert_eq(rec->step, step);
    cr_assert_eq(rec->sources, n);
    cr_assert_eq(rec->receivers, 2);
    cr_assert_eq(rec->wire_bytes, 100ull * n * (n + 1) / 2, "bytes summed over the sources");
    cr_assert_eq(rec->pcie_bytes, 10ull * n);
    cr_assert_eq(rec->buckets, 2 * n);
    cr_assert_float_eq(rec->total_seconds, 0.1 * n, 1e-9, "the slowest source's time");
    cr_assert_float_eq(rec->wire_seconds, 0.05 * n, 1e-9);
    cr_assert_float_eq(rec->gbps, (double)rec->wire_bytes / rec->total_seconds / 1e9, 1e-12);
    cr_assert_float_eq(rec->train_seconds, 0.1 * n, 1e-9, "the slowest rank's");
    cr_assert_eq(rec->exposed_measured, 1);
    cr_assert_str_eq(rec->transport, "host-tcp");
    cr_assert_eq(rec->weights_verified, 1);
  }
  cr_assert_eq(h.run_state, SCHED_RUN_SUCCEEDED, "%s", h.run_msg);
  sched_free(h.s);
}

Test(sched_trainer_group, a_group_of_2_trains_and_commits) { group_trains_and_commits(2); }
Test(sched_trainer_group, a_group_of_4_trains_and_commits) { group_trains_and_commits(4); }

Test(sched_trainer_group, steps_done_in_any_order_wait_for_the_slowest_rank) {
  fx h;
  group_run(&h, 4, 1);
  fx_answer(&h, 0, 1, 0);
  cr_assert_eq(h.ntrain, 4);
  uint32_t order[] = {2, 0, 3};
  for (size_t k = 0; k < 3; k++) {
    cr_assert_eq(rank_done(&h, order[k], 0), SCHED_OK, "%s", sched_last_error(h.s));
    cr_assert_eq(h.nplan, 0, "no plan before every rank reported");
  }
  sched_worker_info wi;
  cr_assert_eq(sched_get_worker(h.s, rank_id(1), &wi), SCHED_OK);
  cr_assert_eq(wi.state, SCHED_WORKER_BUSY, "the slow rank still trains");
  cr_assert_eq(sched_get_worker(h.s, rank_id(2), &wi), SCHED_OK);
  cr_assert_eq(wi.state, SCHED_WORKER_READY);
  /* A repeat of a rank's report changes nothing. */
  cr_assert_eq(rank_done(&h, 2, 0), SCHED_ESTALE);
  cr_assert(strstr(sched_last_error(h.s), "rank 2"), "%s", sched_last_error(h.s));
  h.now += 5000; /* rank 1 is slow */
  cr_assert_eq(rank_done(&h, 1, 0), SCHED_OK, "%s", sched_last_error(h.s));
  cr_assert_eq(h.nplan, 1);
  fx_build_and_ack(&h);
  bcast_group(&h, 0);
  cr_assert_eq(h.ncommit, 1);
  cr_assert_float_eq(h.records[0].train_seconds, 0.4, 1e-9, "rank 3 took longest");
  cr_assert_gt(h.records[0].step_seconds, 5.0);
  sched_free(h.s);
}

Test(sched_trainer_group, a_rank_reporting_another_step_fails_the_run_naming_both) {
  fx h;
  group_run(&h, 2, 3);
  fx_answer(&h, 0, 1, 0);
  cr_assert_eq(rank_done(&h, 0, 0), SCHED_OK);
  cr_assert_eq(rank_done(&h, 1, 1), SCHED_OK);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "trainer rank 1 (trainer-1) reported step 1 done, but rank 0 "
                              "(trainer-0) reported step 0"), "%s", h.run_msg);
  cr_assert_eq(h.nplan, 0);
  sched_free(h.s);

  /* Before any rank reported: the other rank was sent the step training. */
  group_run(&h, 2, 3);
  fx_answer(&h, 0, 1, 0);
  cr_assert_eq(rank_done(&h, 0, 2), SCHED_OK);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "rank 0 (trainer-0) reported step 2 done, but rank 1 (trainer-1) "
                              "was sent step 0"), "%s", h.run_msg);
  sched_free(h.s);

  /* A lone trainer's report of that kind is refused, as always. */
  fx_to_plan(&h);
  fx_build_and_ack(&h);
  fx_bcast_done(&h);
  fx_answer(&h, 0, 5, 1);
  cr_assert_eq(sched_step_done(h.s, h.now, FX_TRAINER, 4, 0.1, NULL), SCHED_EINVAL);
  fx_drain(&h);
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED);
  sched_free(h.s);
}

Test(sched_trainer_group, registration_refusals_name_the_field_and_change_nothing) {
  fx h;
  sched_settings c = group_settings(1);
  fx_start(&h, &c);
  add_rank(&h, 0, 2, 0);
  size_t before = sched_worker_count(h.s);

  sched_caps big = rank_caps(0, SCHED_MAX_TRAINER_RANKS + 1);
  cr_assert_eq(sched_worker_registered(h.s, h.now, 9, SCHED_ROLE_TRAINER, "t9", &big, &FX_ALL_GPU,
                                       0), SCHED_EINVAL);
  cr_assert(strstr(sched_last_error(h.s), "trainer_ranks 1025 is over the limit of 1024"), "%s",
            sched_last_error(h.s));
  cr_assert_eq(rank_register(&h, 2, 2, 0), SCHED_EINVAL);
  cr_assert(strstr(sched_last_error(h.s), "trainer_rank 2 is not below trainer_ranks 2"), "%s",
            sched_last_error(h.s));
  cr_assert_eq(rank_register(&h, 1, 4, 0), SCHED_EINVAL);
  cr_assert(strstr(sched_last_error(h.s), "trainer_ranks 4, but the run's trainer group has 2 "
                                          "ranks"), "%s", sched_last_error(h.s));
  sched_caps again = rank_caps(0, 2);
  cr_assert_eq(sched_worker_registered(h.s, h.now, 9, SCHED_ROLE_TRAINER, "t9", &again,
                                       &FX_ALL_GPU, 0), SCHED_EEXIST);
  cr_assert(strstr(sched_last_error(h.s), "trainer rank 0 is held by trainer-0"), "%s",
            sched_last_error(h.s));
  cr_assert_eq(sched_worker_count(h.s), before, "a refused registration adds nobody");

  /* Rank 1 of the group's size is admitted; once rank 0 is lost, a group of
   * another size may form. */
  add_rank(&h, 1, 2, 0);
  cr_assert_eq(sched_worker_lost(h.s, h.now, rank_id(0), "gone"), SCHED_OK);
  cr_assert_eq(sched_worker_lost(h.s, h.now, rank_id(1), "gone"), SCHED_OK);
  fx_drain(&h);
  sched_caps lone = {0};
  cr_assert_eq(sched_worker_registered(h.s, h.now, 7, SCHED_ROLE_TRAINER, "lone", &lone,
                                       &FX_ALL_GPU, 0), SCHED_OK, "%s", sched_last_error(h.s));
  sched_worker_info wi;
  cr_assert_eq(sched_get_worker(h.s, 7, &wi), SCHED_OK);
  cr_assert_eq(wi.caps.trainer_ranks, 1, "0 ranks is a lone trainer");
  cr_assert_eq(sched_worker_registered(h.s, h.now, 8, SCHED_ROLE_TRAINER, "t8", &lone,
                                       &FX_ALL_GPU, 0), SCHED_EEXIST);
  cr_assert(strstr(sched_last_error(h.s), "the run already has trainer lone"), "%s",
            sched_last_error(h.s));
  sched_free(h.s);
}

Test(sched_trainer_group, an_incomplete_group_waits_saying_for_which_ranks) {
  fx h;
  sched_settings c = group_settings(1);
  fx_start(&h, &c);
  fx_add(&h, INF_A, SCHED_ROLE_INFERENCE, "inference-a", &FX_GPU);
  add_rank(&h, 0, 2, 0);
  sched_run_info ri;
  sched_get_run(h.s, &ri);
  cr_assert_eq(ri.state, SCHED_RUN_PENDING);
  cr_assert_str_eq(ri.message, "waiting for trainer ranks: 1 of 2 trainer ranks attached (rank 1 "
                               "missing)");
  cr_assert_eq(h.ntrain, 0);
  cr_assert_eq(h.ndispatch, 0, "nothing is generated for a run that cannot train");
  /* Registered is not attached. */
  cr_assert_eq(rank_register(&h, 1, 2, 0), SCHED_OK);
  fx_drain(&h);
  sched_get_run(h.s, &ri);
  cr_assert_eq(ri.state, SCHED_RUN_PENDING, "%s", ri.message);
  cr_assert(strstr(ri.message, "(rank 1 missing)"), "%s", ri.message);
  cr_assert_eq(sched_worker_attached(h.s, h.now, rank_id(1)), SCHED_OK);
  fx_drain(&h);
  sched_get_run(h.s, &ri);
  cr_assert_eq(ri.state, SCHED_RUN_RUNNING, "%s", ri.message);
  cr_assert_str_eq(ri.message, "2 trainer ranks and 1 inference workers attached");
  cr_assert_eq(ri.trainers, 2);
  sched_free(h.s);

  /* Several missing, named in rank order. */
  fx_start(&h, &c);
  add_rank(&h, 2, 4, 0);
  add_rank(&h, 0, 4, 0);
  sched_get_run(h.s, &ri);
  cr_assert_str_eq(ri.message, "waiting for trainer ranks: 2 of 4 trainer ranks attached (ranks "
                               "1, 3 missing)");
  sched_free(h.s);
}

/* A resumed run at step 3 whose ranks register holding v0 and v1. */
static void resumed(fx *h, uint32_t n, const uint64_t *versions) {
  sched_settings c = group_settings(10);
  c.resumes = 1;
  c.steps_done = 3;
  c.heartbeat_timeout_ms = HB_MS;
  fx_start(h, &c);
  for (uint32_t r = 0; r < n; r++) add_rank(h, r, n, versions[r]);
  fx_add_v(h, INF_A, SCHED_ROLE_INFERENCE, "inference-a", &FX_GPU, 0);
}

Test(sched_trainer_group, ranks_holding_different_versions_fail_naming_them) {
  fx h;
  const uint64_t v[] = {4, 3};
  resumed(&h, 2, v);
  cr_assert_eq(h.nplan, 0, "neither a step's plan nor a catch-up for ranks that disagree");
  cr_assert_eq(h.ntrain, 0);
  sched_run_info ri;
  sched_get_run(h.s, &ri);
  cr_assert(strstr(ri.message, "trainer ranks disagree: rank 0 (trainer-0) holds policy version "
                               "4, rank 1 (trainer-1) holds 3"), "%s", ri.message);
  int64_t due = sched_next_deadline(h.s);
  cr_assert_leq(due, h.now + HB_MS);
  /* Alive but silent about the step: the run fails once the bound passed. */
  h.now = due - 1;
  for (uint32_t id = 1; id <= 2; id++) cr_assert_eq(sched_worker_heartbeat(h.s, h.now, id, 0), SCHED_OK);
  cr_assert_eq(sched_worker_heartbeat(h.s, h.now, INF_A, 0), SCHED_OK);
  cr_assert_eq(sched_tick(h.s, h.now), SCHED_OK);
  fx_drain(&h);
  cr_assert_neq(h.run_state, SCHED_RUN_FAILED);
  h.now = due;
  cr_assert_eq(sched_tick(h.s, h.now), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "rank 0 (trainer-0) holds policy version 4, rank 1 (trainer-1) "
                              "holds 3"), "%s", h.run_msg);
  cr_assert(strstr(h.run_msg, "rank 1 did not report step 3"), "%s", h.run_msg);
  sched_free(h.s);

  /* A version no rank may hold fails at once, naming the rank. */
  sched_settings c = group_settings(10);
  c.resumes = 1;
  c.steps_done = 3;
  fx_start(&h, &c);
  add_rank(&h, 0, 2, 3);
  cr_assert_eq(rank_register(&h, 1, 2, 7), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "trainer rank 1 (trainer-1) holds policy version 7, newer than the "
                              "committed 3"), "%s", h.run_msg);
  sched_free(h.s);
}

Test(sched_trainer_group, resume_with_a_group_adopts_the_step_once_every_rank_holds_it) {
  fx h;
  /* Rank 0 finished step 3 before it registered, rank 1 reports it after. */
  const uint64_t v[] = {4, 3};
  resumed(&h, 2, v);
  cr_assert_eq(h.nplan, 0);
  h.now += 100;
  cr_assert_eq(sched_step_done(h.s, h.now, rank_id(1), 3, 0.7, NULL), SCHED_OK, "%s",
               sched_last_error(h.s));
  fx_drain(&h);
  cr_assert_eq(h.ntrain, 0, "the step is adopted, not trained again");
  cr_assert_eq(h.nplan, 1);
  cr_assert_str_eq(h.plan_id, "r1/step-3-resume1");
  cr_assert_eq(h.plan_catchup, 0);
  cr_assert_eq(h.plan_version, 4);
  assert_group_plan(&h, 2, 1);
  fx_build_and_ack(&h);
  bcast_group(&h, 0);
  cr_assert_eq(h.ncommit, 1);
  cr_assert_eq(h.records[0].step, 3);
  cr_assert_float_eq(h.records[0].train_seconds, 0.7, 1e-9);
  cr_assert_eq(h.records[0].weights_verified, 1);
  sched_free(h.s);

  /* Every rank holding the committed version: the receiver is caught up
   * first (the ranks are the catch-up's sources), then step 3 trains. */
  const uint64_t same[] = {3, 3};
  resumed(&h, 2, same);
  cr_assert_eq(h.nplan, 1);
  cr_assert_eq(h.plan_catchup, 1);
  cr_assert_str_eq(h.plan_id, "r1/step-3-resume1-catchup");
  assert_group_plan(&h, 2, 1);
  cr_assert_eq(h.plan_mode, SCHED_MODE_HOST);
  fx_build_and_ack(&h);
  bcast_group(&h, 0);
  cr_assert_eq(h.ncaughtup, 1);
  cr_assert_eq(h.caughtup_verified, 1);
  cr_assert_eq(h.caughtup_record.sources, 2);
  cr_assert_eq(h.caughtup_record.receivers, 1);
  fx_answer(&h, 0, 1, 3);
  cr_assert_eq(h.ntrain, 2);
  assert_train_per_rank(&h, 2, 3, 0);
  sched_free(h.s);

  /* Only part of the group back: nothing is sent. */
  sched_settings c = group_settings(10);
  c.resumes = 1;
  c.steps_done = 3;
  fx_start(&h, &c);
  add_rank(&h, 0, 2, 3);
  fx_add_v(&h, INF_A, SCHED_ROLE_INFERENCE, "inference-a", &FX_GPU, 0);
  cr_assert_eq(h.nplan, 0, "no catch-up without the whole group");
  sched_free(h.s);
}

Test(sched_trainer_group, a_late_receiver_is_synced_by_the_groups_next_plan) {
  fx h;
  sched_settings c = group_settings(2);
  fx_start(&h, &c);
  add_rank(&h, 0, 2, 0);
  add_rank(&h, 1, 2, 0);
  fx_add(&h, INF_A, SCHED_ROLE_INFERENCE, "inference-a", &FX_GPU);
  fx_answer(&h, 0, 1, 0);
  ranks_done(&h, 2, NULL);
  fx_build_and_ack(&h);
  bcast_group(&h, 0);
  cr_assert_eq(h.ncommit, 1);
  /* Step 1 trains; a receiver holding 0 joins and waits for a catch-up. */
  fx_answer(&h, 0, 2, 1);
  cr_assert_eq(h.ntrain, 4);
  fx_add_v(&h, INF_B, SCHED_ROLE_INFERENCE, "inference-b", &FX_GPU, 0);
  cr_assert_eq(h.nplan, 1, "no catch-up while the group trains");
  ranks_done(&h, 2, NULL);
  cr_assert_eq(h.nplan, 2);
  assert_group_plan(&h, 2, 2);
  cr_assert_eq(h.plan_catchup, 0, "the step's own plan includes the late receiver");
  fx_build_and_ack(&h);
  bcast_group(&h, 1);
  cr_assert_eq(h.ncommit, 2);
  cr_assert_eq(h.records[1].weights_verified, 0, "inference-b got source 1's shard wrong");
  sched_free(h.s);
}

Test(sched_trainer_group, a_catchup_is_aborted_when_a_rank_trained_meanwhile) {
  fx h;
  const uint64_t same[] = {3, 3};
  resumed(&h, 2, same);
  cr_assert_eq(h.plan_catchup, 1);
  h.now += 10;
  cr_assert_eq(sched_step_done(h.s, h.now, rank_id(0), 3, 0.2, NULL), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert(strstr(h.abort_reason, "trainer rank 0 (trainer-0) trained step 3 meanwhile"), "%s",
            h.abort_reason);
  cr_assert_eq(h.nplan, 1, "no catch-up of mixed versions");
  cr_assert_eq(sched_step_done(h.s, h.now, rank_id(1), 3, 0.3, NULL), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.nplan, 2);
  cr_assert_eq(h.plan_catchup, 0);
  cr_assert_eq(h.plan_version, 4);
  sched_free(h.s);
}

Test(sched_trainer_group, auto_picks_host_and_other_overrides_are_refused) {
  sched_participant p[3] = {{.name = "t0", .caps = rank_caps(0, 2)},
                            {.name = "t1", .caps = rank_caps(1, 2)},
                            {.name = "inf", .caps = FX_GPU}};
  sched_mode m;
  char why[SCHED_TEXT_MAX];
  cr_assert_eq(sched_choose_mode(SCHED_MODE_AUTO, p, 3, &FX_ALL_GPU, &m, why, sizeof why), SCHED_OK);
  cr_assert_eq(m, SCHED_MODE_HOST);
  cr_assert_str_eq(why, "2 trainer ranks: several sources run on the host transport");
  cr_assert_eq(sched_choose_mode(SCHED_MODE_HOST, p, 3, &FX_ALL_GPU, &m, why, sizeof why), SCHED_OK);
  cr_assert_eq(m, SCHED_MODE_HOST);
  const sched_mode refused[] = {SCHED_MODE_STAGED, SCHED_MODE_DIRECT, SCHED_MODE_COLOCATED};
  for (size_t i = 0; i < 3; i++) {
    cr_assert_eq(sched_choose_mode(refused[i], p, 3, &FX_ALL_GPU, &m, why, sizeof why),
                 SCHED_ENOTSUP);
    char want[96];
    snprintf(want, sizeof want, "operator override %s cannot run 2 trainer ranks",
             sched_mode_name(refused[i]));
    cr_assert(strstr(why, want), "%s", why);
  }
  cr_assert_eq(sched_choose_mode(SCHED_MODE_AUTO, p, 2, &FX_ALL_GPU, &m, why, sizeof why),
               SCHED_EINVAL, "no receiver");
  /* A lone trainer with the same participants is unchanged: direct. */
  p[0].caps = FX_GPU;
  p[1].caps = FX_GPU;
  cr_assert_eq(sched_choose_mode(SCHED_MODE_AUTO, p, 3, &FX_ALL_GPU, &m, why, sizeof why), SCHED_OK);
  cr_assert_eq(m, SCHED_MODE_DIRECT);

  /* In a run, an override the group cannot run fails it, naming mode and N. */
  fx h;
  group_run(&h, 2, 1);
  cr_assert_eq(sched_set_policy(h.s, h.now, SCHED_MODE_STAGED), SCHED_OK);
  fx_answer(&h, 0, 1, 0);
  ranks_done(&h, 2, NULL);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "broadcast of step 0 refused: operator override staged cannot run 2 "
                              "trainer ranks"), "%s", h.run_msg);
  sched_free(h.s);
}

Test(sched_trainer_group, verification_needs_every_sources_checksum_from_every_receiver) {
  fx h;
  group_run(&h, 2, 4);
  /* Step 0: one wrong checksum of source 1. */
  fx_answer(&h, 0, 1, 0);
  ranks_done(&h, 2, NULL);
  fx_build_and_ack(&h);
  bcast_group(&h, 1);
  cr_assert_eq(h.ncommit, 1);
  cr_assert_eq(h.records[0].weights_verified, 0);

  /* Step 1: a receiver's count that is not the plan's sources is refused
   * and changes nothing; its right report then counts. Another receiver
   * gives none: not verified. */
  fx_answer(&h, 0, 2, 1);
  ranks_done(&h, 2, NULL);
  fx_build_and_ack(&h);
  sched_bcast_report tx[2] = {{.transport = "host-tcp", .weights_checksum = 1000},
                              {.transport = "host-tcp", .weights_checksum = 1001}};
  uint64_t three[3] = {1000, 1001, 1002};
  sched_bcast_report rx = {.source_checksums = three, .nsource_checksums = 3};
  cr_assert_eq(sched_broadcast_done(h.s, h.now, INF_A, h.plan_id, NULL, &rx), SCHED_EINVAL);
  cr_assert(strstr(sched_last_error(h.s), "source_checksums: 3 given, plan r1/step-1 has 2 "
                                          "sources"), "%s", sched_last_error(h.s));
  rx.source_checksums = NULL;
  rx.nsource_checksums = 2;
  cr_assert_eq(sched_broadcast_done(h.s, h.now, INF_A, h.plan_id, NULL, &rx), SCHED_EINVAL);
  rx.source_checksums = three;
  cr_assert_eq(sched_broadcast_done(h.s, h.now, INF_A, h.plan_id, NULL, &rx), SCHED_OK);
  sched_bcast_report only_one = {.weights_checksum = 1000};
  cr_assert_eq(sched_broadcast_done(h.s, h.now, INF_B, h.plan_id, NULL, &only_one), SCHED_OK);
  cr_assert_eq(sched_broadcast_done(h.s, h.now, rank_id(0), h.plan_id, NULL, NULL), SCHED_EINVAL,
               "a source must report its figures");
  cr_assert_eq(sched_broadcast_done(h.s, h.now, rank_id(0), h.plan_id, NULL, &tx[0]), SCHED_OK);
  cr_assert_eq(sched_broadcast_done(h.s, h.now, rank_id(1), h.plan_id, NULL, &tx[1]), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.ncommit, 2);
  cr_assert_eq(h.records[1].weights_verified, 0, "inference-b gave one checksum for two sources");

  /* Step 2: the sources' checksums come with their step done only. */
  fx_answer(&h, 0, 3, 2);
  for (uint32_t r = 0; r < 2; r++)
    cr_assert_eq(sched_shard_step_done(h.s, h.now, rank_id(r), 2, 0.1, NULL, 1000 + r), SCHED_OK);
  fx_drain(&h);
  fx_build_and_ack(&h);
  uint64_t both[2] = {1000, 1001};
  sched_bcast_report rx2 = {.source_checksums = both, .nsource_checksums = 2};
  for (size_t i = 0; i < h.nparts; i++) {
    sched_bcast_report none = {.transport = "host-tcp"};
    cr_assert_eq(sched_broadcast_done(h.s, h.now, h.parts[i], h.plan_id, NULL,
                                      i < 2 ? &none : &rx2), SCHED_OK);
  }
  fx_drain(&h);
  cr_assert_eq(h.ncommit, 3);
  cr_assert_eq(h.records[2].weights_verified, 1, "the step done's checksums stand");

  /* Step 3: a source whose broadcast checksum differs from its step done's
   * sent other weights than it trained. */
  fx_answer(&h, 0, 4, 3);
  for (uint32_t r = 0; r < 2; r++)
    cr_assert_eq(sched_shard_step_done(h.s, h.now, rank_id(r), 3, 0.1, NULL, 1000 + r), SCHED_OK);
  fx_drain(&h);
  fx_build_and_ack(&h);
  for (size_t i = 0; i < h.nparts; i++) {
    sched_bcast_report src = {.transport = "host-tcp", .weights_checksum = i == 1 ? 5 : 1000};
    uint64_t seen[2] = {1000, 5};
    sched_bcast_report rcv = {.source_checksums = seen, .nsource_checksums = 2};
    cr_assert_eq(sched_broadcast_done(h.s, h.now, h.parts[i], h.plan_id, NULL,
                                      i < 2 ? &src : &rcv), SCHED_OK);
  }
  fx_drain(&h);
  cr_assert_eq(h.ncommit, 4);
  cr_assert_eq(h.records[3].weights_verified, 0);
  sched_free(h.s);
}

Test(sched_trainer_group, a_rank_lost_while_training_redoes_the_step_once_the_group_is_whole) {
  fx h;
  group_run(&h, 2, 1);
  fx_answer(&h, 0, 1, 0);
  cr_assert_eq(h.ntrain, 2);
  uint64_t first_batch = h.trains[0].first_id;
  cr_assert_eq(sched_worker_lost(h.s, h.now, rank_id(1), "command stream closed"), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.nabort, 0, "no plan was pending");
  cr_assert_eq(h.run_state, SCHED_RUN_PENDING);
  cr_assert(strstr(h.run_msg, "1 of 2 trainer ranks attached (rank 1 missing)"), "%s", h.run_msg);
  sched_worker_info wi;
  cr_assert_eq(sched_get_worker(h.s, rank_id(0), &wi), SCHED_OK);
  cr_assert_eq(wi.state, SCHED_WORKER_READY, "rank 0's part was given up");
  cr_assert_eq(h.nplan, 0);
  add_rank(&h, 1, 2, 0);
  fx_answer(&h, 0, 50, 0);
  cr_assert_eq(h.ntrain, 4, "step 0 is trained again, by both ranks");
  assert_train_per_rank(&h, 2, 0, 2);
  cr_assert_neq(h.trains[2].first_id, first_batch, "with a fresh batch");
  ranks_done(&h, 2, NULL);
  fx_build_and_ack(&h);
  bcast_group(&h, 0);
  cr_assert_eq(h.ncommit, 1);
  cr_assert_eq(h.records[0].step, 0);
  cr_assert_eq(h.run_state, SCHED_RUN_SUCCEEDED);
  sched_free(h.s);
}

Test(sched_trainer_group, a_rank_lost_mid_plan_aborts_and_replans_once_it_is_back) {
  fx h;
  group_run(&h, 2, 1);
  fx_answer(&h, 0, 1, 0);
  ranks_done(&h, 2, NULL);
  fx_build_and_ack(&h);
  cr_assert_eq(h.ntrigger, 1);
  cr_assert_eq(sched_worker_lost(h.s, h.now, rank_id(1), "no heartbeat"), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.nabort, 1);
  cr_assert_eq(h.abort_kind, SCHED_ABORT_PARTICIPANT_LOST);
  cr_assert(strstr(h.abort_reason, "trainer trainer-1 lost"), "%s", h.abort_reason);
  uint32_t live[] = {rank_id(0), INF_A, INF_B};
  cr_assert_eq(h.nabort_parts, 3);
  cr_assert_arr_eq(h.abort_parts, live, sizeof live);
  cr_assert_eq(h.abort_sources, 1, "one live source left in the aborted plan");
  cr_assert_eq(h.nplan, 1, "no plan without the whole group");
  /* Late reports of the given-up plan are stale. */
  sched_bcast_report rep = {.transport = "host-tcp", .weights_checksum = 1000};
  cr_assert_eq(sched_broadcast_done(h.s, h.now, rank_id(0), "r1/step-0", NULL, &rep), SCHED_ESTALE);
  /* Back holding what it trained: the step is planned again, not retrained. */
  add_rank(&h, 1, 2, 1);
  cr_assert_eq(h.ntrain, 2);
  cr_assert_eq(h.nplan, 2);
  cr_assert_str_eq(h.plan_id, "r1/step-0-r2");
  assert_group_plan(&h, 2, 2);
  fx_build_and_ack(&h);
  bcast_group(&h, 0);
  cr_assert_eq(h.ncommit, 1);
  cr_assert_eq(h.records[0].step, 0);
  cr_assert_eq(h.records[0].weights_verified, 1);
  cr_assert_eq(h.run_state, SCHED_RUN_SUCCEEDED);
  sched_free(h.s);
}

Test(sched_trainer_group, a_rank_back_without_the_trained_step_fails_the_run_naming_it) {
  fx h;
  sched_settings c = group_settings(2);
  c.heartbeat_timeout_ms = HB_MS;
  fx_start(&h, &c);
  add_rank(&h, 0, 2, 0);
  add_rank(&h, 1, 2, 0);
  fx_add(&h, INF_A, SCHED_ROLE_INFERENCE, "inference-a", &FX_GPU);
  fx_answer(&h, 0, 1, 0);
  ranks_done(&h, 2, NULL);
  cr_assert_eq(h.nplan, 1);
  cr_assert_eq(sched_worker_lost(h.s, h.now, rank_id(1), "restarted"), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.nabort, 1);
  add_rank(&h, 1, 2, 0); /* restarted from the checkpoint of version 0 */
  cr_assert_eq(h.nplan, 1);
  /* Rollouts for step 0 arrive, but rank 0 holds version 1: the step cannot
   * be redone, nor planned. */
  cr_assert_eq(h.nreqs, 1);
  fx_answer(&h, 0, 7, 0);
  cr_assert_eq(h.ntrain, 2, "no TRAIN for ranks that disagree");
  h.now += HB_MS;
  for (uint32_t id = 1; id <= 2; id++) sched_worker_heartbeat(h.s, h.now - 1, id, 0);
  sched_worker_heartbeat(h.s, h.now - 1, INF_A, 0);
  cr_assert_eq(sched_tick(h.s, h.now), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.run_state, SCHED_RUN_FAILED);
  cr_assert(strstr(h.run_msg, "rank 0 (trainer-0) holds policy version 1, rank 1 (trainer-1) "
                              "holds 0"), "%s", h.run_msg);
  cr_assert_eq(h.ncommit, 0);
  sched_free(h.s);
}

Test(sched_trainer_group, a_rank_lost_after_a_commit_holds_up_the_next_step_only) {
  fx h;
  group_run(&h, 2, 2);
  fx_answer(&h, 0, 1, 0);
  ranks_done(&h, 2, NULL);
  fx_build_and_ack(&h);
  bcast_group(&h, 0);
  cr_assert_eq(h.ncommit, 1);
  cr_assert_eq(sched_worker_lost(h.s, h.now, rank_id(0), "gone"), SCHED_OK);
  fx_drain(&h);
  cr_assert(strstr(h.run_msg, "(rank 0 missing)"), "%s", h.run_msg);
  int trains = h.ntrain;
  if (h.nreqs) fx_answer(&h, 0, 2, 1);
  cr_assert_eq(h.ntrain, trains, "no step without rank 0");
  add_rank(&h, 0, 2, 1);
  if (h.nreqs) fx_answer(&h, 0, 3, 1);
  cr_assert_eq(h.ntrain, trains + 2);
  assert_train_per_rank(&h, 2, 1, trains);
  ranks_done(&h, 2, NULL);
  fx_build_and_ack(&h);
  bcast_group(&h, 0);
  cr_assert_eq(h.ncommit, 2);
  cr_assert_eq(h.records[0].step, 0);
  cr_assert_eq(h.records[1].step, 1, "each step committed once");
  cr_assert_eq(h.run_state, SCHED_RUN_SUCCEEDED);
  sched_free(h.s);
}

Test(sched_trainer_group, a_lone_trainer_keeps_its_actions_and_record) {
  fx h;
  fx_to_plan(&h);
  cr_assert_eq(h.trains[0].rank, 0);
  cr_assert_eq(h.trains[0].ranks, 1);
  cr_assert_eq(h.plan_sources, 1);
  fx_build_and_ack(&h);
  fx_bcast_done(&h);
  cr_assert_eq(h.ncommit, 1);
  cr_assert_eq(h.records[0].sources, 1);
  cr_assert_eq(h.records[0].receivers, 2);
  cr_assert_eq(h.records[0].wire_bytes, 2000);
  cr_assert_eq(h.records[0].weights_verified, 1);
  sched_run_info ri;
  sched_get_run(h.s, &ri);
  cr_assert_str_eq(ri.message, "1 trainer and 2 inference workers attached");
  sched_free(h.s);
}

/* ---- receiver views (sched_plan_views) ---------------------------------------------------------- */

/* Every participant reports broadcast done: source r's whole checksum is
 * 1000 + r and its view v's 2000 + 10 v + r; a receiver of view v reports
 * the view's sums (a whole one the whole sums), each then shifted by
 * `skew[receiver index]`. Returns the step record's weights_verified. */
static int bcast_views(fx *h, const uint32_t *rank_view, uint32_t nviews, const int *skew) {
  h->now += 50;
  uint32_t ns = h->plan_sources ? h->plan_sources : 1;
  for (size_t i = 0; i < h->nparts; i++) {
    sched_bcast_report rep = {.transport = "host-tcp"};
    uint64_t sums[8];
    if (i < ns) {
      for (uint32_t v = 0; v < nviews; v++) sums[v] = 2000 + 10 * v + i;
      rep.wire_bytes = 100;
      rep.total_seconds = 0.1;
      rep.weights_checksum = 1000 + i;
      rep.view_checksums = sums;
      rep.nview_checksums = nviews;
    } else {
      uint32_t v = rank_view[i];
      for (uint32_t j = 0; j < ns; j++)
        sums[j] = (v == SCHED_VIEW_WHOLE ? 1000 + j : 2000 + 10 * v + j) + (uint64_t)skew[i - ns];
      rep.source_checksums = sums;
      rep.nsource_checksums = ns;
    }
    cr_assert_eq(sched_broadcast_done(h->s, h->now, h->parts[i], h->plan_id, NULL, &rep), SCHED_OK,
                 "%s", sched_last_error(h->s));
  }
  fx_drain(h);
  cr_assert_eq(h->ncommit, 1, "%s", h->run_msg);
  return h->records[0].weights_verified;
}

static void views_plan(fx *h, uint32_t n, const uint32_t *rank_view, uint32_t nviews) {
  group_run(h, n, 1);
  fx_answer(h, 0, 1, 0);
  ranks_done(h, n, NULL);
  cr_assert_eq(h->nplan, 1);
  cr_assert_eq(sched_plan_views(h->s, h->now, h->plan_id, rank_view, h->nparts, nviews), SCHED_OK,
               "%s", sched_last_error(h->s));
  fx_build_and_ack(h);
}

Test(sched_trainer_group, a_receiver_of_a_view_is_verified_against_its_view) {
  /* Two ranks; INF_A whole, INF_B holds view 1 of 2. */
  const uint32_t rv[] = {SCHED_VIEW_WHOLE, SCHED_VIEW_WHOLE, SCHED_VIEW_WHOLE, 1};
  const int exact[] = {0, 0}, off_b[] = {0, 1}, off_a[] = {3, 0};
  fx h;
  views_plan(&h, 2, rv, 2);
  cr_assert_eq(bcast_views(&h, rv, 2, exact), 1);
  sched_free(h.s);
  views_plan(&h, 2, rv, 2);
  cr_assert_eq(bcast_views(&h, rv, 2, off_b), 0, "a view's sum off by one");
  sched_free(h.s);
  views_plan(&h, 2, rv, 2);
  cr_assert_eq(bcast_views(&h, rv, 2, off_a), 0, "a whole receiver's sum off");
  sched_free(h.s);

  /* The view receiver reporting the whole sums is not verified: it was to
   * hold its part only, and the sums say otherwise. */
  const uint32_t whole[] = {SCHED_VIEW_WHOLE, SCHED_VIEW_WHOLE, SCHED_VIEW_WHOLE,
                            SCHED_VIEW_WHOLE};
  views_plan(&h, 2, rv, 2);
  cr_assert_eq(bcast_views(&h, whole, 2, exact), 0);
  sched_free(h.s);
}

Test(sched_trainer_group, a_lone_trainer_with_view_receivers) {
  fx h;
  fx_to_plan(&h);
  const uint32_t rv[] = {SCHED_VIEW_WHOLE, 0, SCHED_VIEW_WHOLE};
  cr_assert_eq(sched_plan_views(h.s, h.now, h.plan_id, rv, h.nparts, 1), SCHED_OK, "%s",
               sched_last_error(h.s));
  fx_build_and_ack(&h);
  const int exact[] = {0, 0};
  cr_assert_eq(bcast_views(&h, rv, 1, exact), 1);
  sched_free(h.s);
}

Test(sched_trainer_group, bad_views_and_view_sums_are_refused_by_name) {
  fx h;
  group_run(&h, 2, 1);
  fx_answer(&h, 0, 1, 0);
  ranks_done(&h, 2, NULL);
  const uint32_t src_view[] = {0, SCHED_VIEW_WHOLE, SCHED_VIEW_WHOLE, 0};
  cr_assert_eq(sched_plan_views(h.s, h.now, h.plan_id, src_view, h.nparts, 1), SCHED_EINVAL);
  cr_assert(strstr(sched_last_error(h.s), "source rank 0 has view 0"), "%s", sched_last_error(h.s));
  const uint32_t past[] = {SCHED_VIEW_WHOLE, SCHED_VIEW_WHOLE, 2, SCHED_VIEW_WHOLE};
  cr_assert_eq(sched_plan_views(h.s, h.now, h.plan_id, past, h.nparts, 2), SCHED_EINVAL);
  cr_assert(strstr(sched_last_error(h.s), "rank 2 has view 2 of 2"), "%s", sched_last_error(h.s));
  cr_assert_eq(sched_plan_views(h.s, h.now, h.plan_id, past, 3, 2), SCHED_EINVAL);
  cr_assert(strstr(sched_last_error(h.s), "3 rank views for 4 participants"), "%s",
            sched_last_error(h.s));
  cr_assert_eq(sched_plan_views(h.s, h.now, "other", past, h.nparts, 2), SCHED_ESTALE);
  const uint32_t ok[] = {SCHED_VIEW_WHOLE, SCHED_VIEW_WHOLE, 0, SCHED_VIEW_WHOLE};
  cr_assert_eq(sched_plan_views(h.s, h.now, h.plan_id, ok, h.nparts, 1), SCHED_OK);
  fx_build_and_ack(&h);
  cr_assert_eq(sched_plan_views(h.s, h.now, h.plan_id, ok, h.nparts, 1), SCHED_ESTATE,
               "views are set before the plan is built");
  /* A source giving the wrong number of view sums. */
  uint64_t sums[3] = {1, 2, 3};
  sched_bcast_report rep = {.transport = "host-tcp", .weights_checksum = 5,
                            .view_checksums = sums, .nview_checksums = 3};
  cr_assert_eq(sched_broadcast_done(h.s, h.now, h.parts[0], h.plan_id, NULL, &rep), SCHED_EINVAL);
  cr_assert(strstr(sched_last_error(h.s), "view_checksums: 3 given, plan"), "%s",
            sched_last_error(h.s));
  cr_assert(strstr(sched_last_error(h.s), "has 1 receiver view"), "%s", sched_last_error(h.s));
  sched_free(h.s);
}

Test(sched_trainer_group, a_plan_without_views_keeps_none_from_the_last) {
  /* Views are per plan: the next step's plan, given none, verifies every
   * receiver whole again. */
  fx h;
  const uint32_t rv[] = {SCHED_VIEW_WHOLE, SCHED_VIEW_WHOLE, 0, 0};
  group_run(&h, 2, 2);
  fx_answer(&h, 0, 1, 0);
  ranks_done(&h, 2, NULL);
  cr_assert_eq(sched_plan_views(h.s, h.now, h.plan_id, rv, h.nparts, 1), SCHED_OK);
  fx_build_and_ack(&h);
  const int exact[] = {0, 0};
  cr_assert_eq(bcast_views(&h, rv, 1, exact), 1);
  fx_answer(&h, 0, 11, 1);
  ranks_done(&h, 2, NULL);
  cr_assert_eq(h.nplan, 2);
  fx_build_and_ack(&h);
  bcast_group(&h, 0);
  cr_assert_eq(h.ncommit, 2, "%s", h.run_msg);
  cr_assert_eq(h.records[1].weights_verified, 1);
  sched_free(h.s);
}
