/* Dispatch without waste: the scheduler asks only for rollouts that a batch
 * within the off-policy bound will use, so on-time workers see nothing
 * dropped at any async level, and what is dropped went stale by arriving
 * late or old. Each test drives an event sequence and counts requests. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/sched/sched.h"
#include "sched_fixture.h"

#define R 4     /* rollouts per step */
#define STEPS 6

static uint64_t next_id = 1;

/* Answers request `i` in flight with `n` rollouts (its count) of its group
 * and `version`. */
static void answer_n(fx *h, size_t i, uint32_t n, uint64_t version) {
  cr_assert_lt(i, h->nreqs);
  sched_rollout r[16];
  cr_assert_leq(n, 16);
  for (uint32_t k = 0; k < n; k++)
    r[k] = (sched_rollout){.id = next_id++, .policy_version = version, .tokens = 10,
                           .group_id = h->reqs[i].group};
  uint32_t w = h->reqs[i].worker;
  uint64_t q = h->reqs[i].id;
  memmove(&h->reqs[i], &h->reqs[i + 1], (h->nreqs - i - 1) * sizeof h->reqs[0]);
  h->nreqs--;
  cr_assert_eq(sched_rollouts_done(h->s, h->now, w, q, r, n), SCHED_OK, "%s",
               sched_last_error(h->s));
  fx_drain(h);
}

/* An on-time worker: the oldest request answered in full with the version
 * it was dispatched at. */
static void answer_oldest(fx *h) {
  cr_assert_gt(h->nreqs, 0, "no request in flight: the run would stall");
  answer_n(h, 0, h->reqs[0].count, h->reqs[0].version);
}

static uint64_t in_use(const fx *h) {
  sched_counters k;
  sched_get_counters(h->s, &k);
  return (uint64_t)k.rollouts_requested + k.rollouts_buffered;
}

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

static void start(fx *h, uint32_t async, uint32_t k, uint64_t steps) {
  sched_settings c = fx_settings(R, async, k, 0);
  c.steps = steps;
  next_id = 1;
  fx_start(h, &c);
  fx_add(h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU);
  fx_add(h, 3, SCHED_ROLE_INFERENCE, "inference-3", &FX_GPU);
}

/* A run of STEPS steps with workers that answer on time: while a step trains
 * they generate what the next steps within the bound may use (R per step),
 * no more; every rollout asked for is used and none is dropped. */
static void on_time_run(uint32_t async) {
  fx h;
  start(&h, async, 8, STEPS);
  cr_assert_eq(in_use(&h), R * min_u64(async + 1, STEPS), "first dispatch, async %u", async);
  for (uint64_t step = 0; step < STEPS; step++) {
    while (h.ntrain == (int)step) {
      answer_oldest(&h);
      cr_assert_leq(in_use(&h), (uint64_t)R * (async + 1), "over the bound's need");
    }
    cr_assert_eq(h.train_step, step);
    /* While step n trains: R for each of steps n+1 .. n+async, within the run. */
    uint64_t ahead = R * min_u64(async, STEPS - 1 - step);
    cr_assert_eq(in_use(&h), ahead, "async %u, step %" PRIu64 ": prefetched", async, step);
    while (h.nreqs > 0) answer_oldest(&h); /* the workers finish during training */
    cr_assert_eq(in_use(&h), ahead, "nothing more asked while the step trains");
    fx_finish_step(&h);
  }
  cr_assert_eq(h.run_state, SCHED_RUN_SUCCEEDED);
  sched_counters k;
  sched_get_counters(h.s, &k);
  cr_assert_eq(k.requests_dispatched, STEPS * R, "async %u: requests", async);
  cr_assert_eq(k.rollouts_received, STEPS * R);
  cr_assert_eq(k.rollouts_used, STEPS * R);
  cr_assert_eq(k.rollouts_dropped_stale, 0, "async %u: dropped", async);
  for (int i = 0; i < STEPS; i++) cr_assert_eq(h.records[i].rollouts_dropped, 0);
  sched_free(h.s);
}

Test(sched_dispatch, on_time_async0) { on_time_run(0); }
Test(sched_dispatch, on_time_async1) { on_time_run(1); }
Test(sched_dispatch, on_time_async2) { on_time_run(2); }
Test(sched_dispatch, on_time_async3) { on_time_run(3); }

/* Async 0 is on-policy: nothing can be generated for step n+1 before its
 * weights are out, so the workers are idle while a step trains. */
Test(sched_dispatch, async0_asks_nothing_while_training) {
  fx h;
  start(&h, 0, 8, STEPS);
  cr_assert_eq(h.ndispatch, R);
  for (int i = 0; i < R; i++) answer_oldest(&h);
  cr_assert_eq(h.ntrain, 1);
  cr_assert_eq(h.nreqs, 0);
  fx_step_done(&h);
  fx_build_and_ack(&h);
  cr_assert_eq(h.ndispatch, R, "none during the plan either");
  fx_bcast_done(&h);
  cr_assert_eq(h.ndispatch, 2 * R, "step 1's batch asked for at version 1");
  for (size_t i = 0; i < h.nreqs; i++) cr_assert_eq(h.reqs[i].version, 1);
  sched_free(h.s);
}

/* Requests spread over the workers, at most K on each; the rest waits. */
Test(sched_dispatch, per_worker_limit) {
  fx h;
  start(&h, 3, 2, STEPS);
  cr_assert_eq(h.nreqs, 4, "2 workers x K 2, though 16 could be used");
  size_t on2 = 0;
  for (size_t i = 0; i < h.nreqs; i++) on2 += h.reqs[i].worker == 2;
  cr_assert_eq(on2, 2);
  answer_oldest(&h);
  cr_assert_eq(h.nreqs, 4, "a freed slot is asked again");
  sched_free(h.s);
}

/* A lost worker's groups are sent again, keeping their ids, before any new
 * group: each slot the survivor frees goes to the next of them. More
 * requests, still nothing dropped. */
Test(sched_dispatch, lost_worker_requests_are_asked_again) {
  fx h;
  start(&h, 1, R, 2);
  cr_assert_eq(h.nreqs, 2 * R);
  size_t on3 = 0;
  uint64_t lost_groups[2 * R];
  for (size_t i = 0; i < h.nreqs; i++)
    if (h.reqs[i].worker == 3) lost_groups[on3++] = h.reqs[i].group;
  cr_assert_eq(on3, R, "K %d on each worker", R);
  cr_assert_eq(sched_worker_lost(h.s, h.now, 3, "stream closed"), SCHED_OK);
  size_t j = 0;
  for (size_t i = 0; i < h.nreqs; i++)
    if (h.reqs[i].worker != 3) h.reqs[j++] = h.reqs[i];
  h.nreqs = j;
  fx_drain(&h);
  cr_assert_eq(h.ndispatch, 2 * R, "worker 2 is full: the lost groups wait");
  uint64_t open[4 * R];
  cr_assert_eq(sched_open_groups(h.s, open, 4 * R), 2 * R, "waiting groups are still open");
  for (size_t k = 0; k < on3; k++) {
    answer_oldest(&h);
    cr_assert_eq(h.ndispatch, 2 * R + k + 1);
    cr_assert_eq(h.dispatch_log[2 * R + k], 2);
    cr_assert_eq(h.dispatch_group[2 * R + k], lost_groups[k], "re-sent oldest first, same group");
  }
  for (int step = 0; step < 2; step++) {
    while (h.ntrain == step) answer_oldest(&h);
    fx_finish_step(&h);
  }
  cr_assert_eq(h.run_state, SCHED_RUN_SUCCEEDED);
  sched_counters k;
  sched_get_counters(h.s, &k);
  cr_assert_eq(k.rollouts_dropped_stale, 0);
  cr_assert_eq(k.groups_requeued, on3);
  cr_assert_eq(k.requests_dispatched, 2 * R + on3);
  sched_free(h.s);
}

/* A worker that reports an older version than it was believed to hold
 * (its weights lagged) hands in stale rollouts: exactly those are dropped,
 * and their slots are asked again. */
Test(sched_dispatch, old_rollouts_dropped_and_replaced) {
  fx h;
  start(&h, 1, 8, 3);
  int lagging = 2; /* the first two answers to version-1 requests carry 0 */
  for (uint64_t step = 0; step < 3; step++) {
    while (h.ntrain == (int)step || h.nreqs > 0) {
      cr_assert_gt(h.nreqs, 0, "no request in flight: the run would stall");
      uint64_t v = h.reqs[0].version;
      if (v == 1 && lagging > 0) {
        lagging--;
        v = 0; /* stale for step 2, whose bound is 1 */
      }
      answer_n(&h, 0, h.reqs[0].count, v);
    }
    fx_finish_step(&h);
  }
  cr_assert_eq(lagging, 0);
  cr_assert_eq(h.run_state, SCHED_RUN_SUCCEEDED);
  sched_counters k;
  sched_get_counters(h.s, &k);
  cr_assert_eq(k.rollouts_dropped_stale, 2);
  cr_assert_eq(k.requests_dispatched, 3 * R + 2, "the two stale slots asked again");
  cr_assert_eq(k.rollouts_used, 3 * R);
  sched_free(h.s);
}

/* A worker that attached after the last broadcast still holds version 0:
 * with async 0 nothing it makes could be used, so it is asked nothing until
 * a broadcast reaches it. */
Test(sched_dispatch, late_joiner_waits_for_weights) {
  fx h;
  start(&h, 0, 8, 3);
  while (h.ntrain == 0) answer_oldest(&h);
  fx_finish_step(&h);
  cr_assert_eq(h.nreqs, R);
  while (h.nreqs > 1) answer_oldest(&h); /* one short of step 1's batch */
  fx_add(&h, 4, SCHED_ROLE_INFERENCE, "inference-4", &FX_GPU);
  for (size_t i = 0; i < h.nreqs; i++) cr_assert_neq(h.reqs[i].worker, 4);
  answer_oldest(&h);
  cr_assert_eq(h.ntrain, 2);
  fx_finish_step(&h); /* worker 4 is a receiver of step 1's plan */
  size_t on4 = 0;
  for (size_t i = 0; i < h.nreqs; i++) on4 += h.reqs[i].worker == 4;
  cr_assert_gt(on4, 0, "with the weights it is asked too");
  sched_free(h.s);
}

/* max_buffered caps in whole groups: with room for one group of 4 only one
 * request goes out, though four steps could use more. */
Test(sched_dispatch, cap_counts_whole_groups) {
  fx h;
  sched_settings c = fx_settings(R, 3, 8, R + 3);
  c.group_size = 4;
  c.steps = STEPS;
  next_id = 1;
  fx_start(&h, &c);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU);
  cr_assert_eq(h.nreqs, 1, "room for 7 under the cap: one group of 4");
  cr_assert_eq(h.reqs[0].count, 4);
  cr_assert_eq(h.reqs[0].group, 1, "groups are numbered from 1");
  answer_oldest(&h);
  cr_assert_eq(h.ntrain, 1);
  cr_assert_eq(h.nreqs, 1, "the batch freed the cap: the next group");
  cr_assert_eq(h.reqs[0].group, 2);
  sched_free(h.s);
}

/* A heartbeat read before the broadcast landed and delivered after the
 * commit carries the old version: the worker still holds the new one, and
 * is still asked at it (async 0 would otherwise shut it out). */
Test(sched_dispatch, late_heartbeat_keeps_the_version) {
  fx h;
  sched_settings c = fx_settings(R, 0, 2, 0);
  c.steps = 3;
  next_id = 1;
  fx_start(&h, &c);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU);
  while (h.ntrain == 0) answer_oldest(&h);
  fx_finish_step(&h);
  cr_assert_eq(h.nreqs, 2, "K 2");
  cr_assert_eq(sched_worker_heartbeat(h.s, h.now, 2, 0), SCHED_OK);
  sched_worker_info w;
  cr_assert_eq(sched_get_worker(h.s, 2, &w), SCHED_OK);
  cr_assert_eq(w.policy_version, 1);
  answer_oldest(&h);
  cr_assert_eq(h.nreqs, 2, "the freed slot is asked again");
  cr_assert_eq(h.reqs[1].version, 1);
  sched_free(h.s);
}

/* A run without a step count asks for the whole window. */
Test(sched_dispatch, unbounded_run_asks_the_window) {
  fx h;
  start(&h, 2, 8, 0);
  cr_assert_eq(in_use(&h), 3 * R);
  sched_free(h.s);
}

/* A slow worker: its request, counted for step 1, is overtaken by newer
 * rollouts once step 1 forms without it, and then asked again of the
 * others; when it finally arrives it is stale, and it is the only drop. */
Test(sched_dispatch, slow_worker_is_the_only_drop) {
  fx h;
  start(&h, 1, 4, 4); /* K 4: worker 2 takes 4 of the first 8, worker 3 the rest */
  uint64_t slow = 0;
  for (size_t i = 0; i < h.nreqs && !slow; i++)
    if (h.reqs[i].worker == 3) slow = h.reqs[i].id;
  cr_assert_neq(slow, 0);
  for (int step = 0; step < 4; step++) {
    while (h.ntrain == step) {
      size_t i = 0;
      while (i < h.nreqs && h.reqs[i].id == slow) i++;
      cr_assert_lt(i, h.nreqs, "step %d waits for the slow worker alone", step);
      answer_n(&h, i, h.reqs[i].count, h.reqs[i].version);
    }
    if (step == 1) {
      size_t i = 0;
      while (i < h.nreqs && h.reqs[i].id != slow) i++;
      cr_assert_lt(i, h.nreqs, "the slow request is still in flight");
      answer_n(&h, i, h.reqs[i].count, h.reqs[i].version); /* version 0, too late */
      slow = 0;
    }
    fx_finish_step(&h);
  }
  cr_assert_eq(h.run_state, SCHED_RUN_SUCCEEDED);
  sched_counters k;
  sched_get_counters(h.s, &k);
  cr_assert_eq(k.rollouts_dropped_stale, 1);
  cr_assert_eq(k.requests_dispatched, 4 * R + 1, "its slot asked again once");
  cr_assert_eq(k.rollouts_used, 4 * R);
  sched_free(h.s);
}

/* A full buffer on the shell's side holds dispatch back; what is in flight
 * still arrives and counts, and dispatch resumes once there is room. */
Test(sched_dispatch, hold_stops_dispatch_and_keeps_what_arrives) {
  fx h;
  start(&h, 1, 8, STEPS);
  size_t asked = h.ndispatch;
  cr_assert_gt(asked, 0);
  cr_assert_eq(sched_hold_dispatch(h.s, h.now, 1), SCHED_OK);
  while (h.nreqs) answer_oldest(&h);
  cr_assert(sched_has_rollout(h.s, next_id - 1), "the answers are buffered, not dropped");
  cr_assert_not(sched_has_rollout(h.s, next_id + 100));
  cr_assert_eq(h.ntrain, 1, "the batch is built from what arrived");
  fx_finish_step(&h); /* new weights out: step 2 could use version-1 rollouts */
  cr_assert_eq(h.ndispatch, asked, "nothing new while held");
  cr_assert_eq(sched_hold_dispatch(h.s, h.now, 0), SCHED_OK);
  fx_drain(&h);
  cr_assert_gt(h.ndispatch, asked, "released: dispatch resumes");
  sched_free(h.s);
}

/* The shell frees its copies of what the scheduler no longer buffers by this
 * list: every buffered id, ascending. */
Test(sched_dispatch, buffered_ids_ascending) {
  fx h;
  start(&h, 1, 8, STEPS);
  cr_assert_eq(sched_buffered_ids(h.s, NULL, 0), 0u);
  answer_oldest(&h); /* step 0's batch */
  answer_oldest(&h); /* buffered for step 1 */
  sched_counters k;
  sched_get_counters(h.s, &k);
  uint64_t ids[64];
  size_t n = sched_buffered_ids(h.s, ids, 64);
  cr_assert_eq(n, k.rollouts_buffered);
  cr_assert_gt(n, 1u);
  for (size_t i = 0; i < n; i++) {
    cr_assert(sched_has_rollout(h.s, ids[i]));
    if (i) cr_assert_lt(ids[i - 1], ids[i]);
  }
  cr_assert_eq(sched_buffered_ids(h.s, ids, 1), n, "the count, though only one was written");
  sched_free(h.s);
}
