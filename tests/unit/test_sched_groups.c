/* Groups: one request asks for one whole group of one prompt; results must be
 * exactly that group; batches are whole groups, oldest group version first;
 * a group whose request is lost, refused or slow is sent again with its id,
 * the first whole answer wins and the other request is cancelled. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/sched/sched.h"
#include "sched_fixture.h"

#define G 4

/* Answers request `id` in flight (its worker) with rollouts ids first.. of
 * the given versions (one per rollout, n of them) and group `group` (0: the
 * request's own); returns the scheduler's code. The request leaves h->reqs
 * either way. */
static int answer_with(fx *h, uint64_t id, uint64_t first, const uint64_t *versions, size_t n,
                       uint64_t group) {
  size_t i = fx_req(h, id);
  uint32_t w = h->reqs[i].worker;
  if (!group) group = h->reqs[i].group;
  memmove(&h->reqs[i], &h->reqs[i + 1], (h->nreqs - i - 1) * sizeof h->reqs[0]);
  h->nreqs--;
  sched_rollout r[16];
  cr_assert_leq(n, 16);
  for (size_t k = 0; k < n; k++)
    r[k] = (sched_rollout){.id = first + k, .policy_version = versions[k], .tokens = 10,
                           .group_id = group};
  int rc = sched_rollouts_done(h->s, h->now, w, id, r, n);
  fx_drain(h);
  return rc;
}

/* Answers request `id` in full, all rollouts of `version`. */
static int answer_full(fx *h, uint64_t id, uint64_t first, uint64_t version) {
  size_t i = fx_req(h, id);
  uint64_t v[16];
  for (uint32_t k = 0; k < h->reqs[i].count; k++) v[k] = version;
  return answer_with(h, id, first, v, h->reqs[i].count, 0);
}

/* Forgets what was in flight on worker `id` (the scheduler lost it). */
static void drop_worker(fx *h, uint32_t id) {
  size_t j = 0;
  for (size_t i = 0; i < h->nreqs; i++)
    if (h->reqs[i].worker != id) h->reqs[j++] = h->reqs[i];
  h->nreqs = j;
}

static sched_counters counters(const fx *h) {
  sched_counters k;
  sched_get_counters(h->s, &k);
  return k;
}

static uint32_t outstanding(const fx *h, uint32_t id) {
  sched_worker_info w;
  cr_assert_eq(sched_get_worker(h->s, id, &w), SCHED_OK);
  return w.outstanding;
}

/* Trainer 1, inference 2 and 3 attached before the trainer, so dispatch
 * starts with both there; settings: `per_step`, groups of G, async, K. */
static void start(fx *h, uint32_t per_step, uint32_t async, uint32_t k, int64_t timeout_ms) {
  sched_settings c = fx_settings(per_step, async, k, 0);
  c.group_size = G;
  c.steps = 4;
  c.request_timeout_ms = timeout_ms;
  fx_start(h, &c);
  fx_add(h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU);
  fx_add(h, 3, SCHED_ROLE_INFERENCE, "inference-3", &FX_GPU);
  fx_add(h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
}

/* ---- what a request asks, what a result must be ------------------------------------------ */

Test(sched_groups, requests_ask_whole_numbered_groups) {
  fx h;
  start(&h, 2 * G, 1, 8, 0); /* two steps of two groups: four groups asked for */
  cr_assert_eq(h.ndispatch, 4);
  for (size_t i = 0; i < h.ndispatch; i++) {
    cr_assert_eq(h.reqs[i].count, G);
    cr_assert_eq(h.dispatch_group[i], i + 1, "new groups numbered from 1");
  }
  sched_counters k = counters(&h);
  cr_assert_eq(k.rollouts_requested, 4 * G);
  cr_assert_eq(k.requests_in_flight, 4);
  sched_free(h.s);
}

Test(sched_groups, short_report_is_refused_and_its_group_sent_again) {
  fx h;
  start(&h, G, 0, 1, 0); /* one group at a time */
  cr_assert_eq(h.nreqs, 1);
  uint64_t rid = h.reqs[0].id, group = h.reqs[0].group;
  uint32_t w = h.reqs[0].worker;
  uint64_t v[G] = {0};
  cr_assert_eq(answer_with(&h, rid, 10, v, G - 1, group), SCHED_EINVAL);
  char want[128];
  snprintf(want, sizeof want, "worker inference-%" PRIu32 ": request %" PRIu64
           " asked for %d rollouts, got %d", w, rid, G, G - 1);
  cr_assert_str_eq(sched_last_error(h.s), want);
  sched_counters k = counters(&h);
  cr_assert_eq(k.rollouts_buffered, 0, "a refused report keeps nothing");
  cr_assert_eq(k.rollouts_received, 0);
  cr_assert_eq(k.groups_requeued, 1);
  cr_assert_not(sched_has_rollout(h.s, 10));
  cr_assert_eq(h.nreqs, 1, "the group is asked again at once");
  cr_assert_eq(h.reqs[0].group, group, "with its id");
  cr_assert_neq(h.reqs[0].id, rid, "in a new request");
  cr_assert_neq(h.reqs[0].worker, w, "of the other worker, which has room");
  cr_assert_eq(answer_full(&h, h.reqs[0].id, 20, 0), SCHED_OK, "%s", sched_last_error(h.s));
  cr_assert_eq(h.ntrain, 1);
  cr_assert_eq(h.train_ids[0], 20);
  sched_free(h.s);
}

/* A report the caller refuses (its rollouts answer another prompt: only the
 * caller knows the prompts) closes the request like one the scheduler
 * refuses: nothing kept, the group asked again with its id. */
Test(sched_groups, report_refused_by_the_caller_sends_its_group_again) {
  fx h;
  start(&h, G, 0, 1, 0); /* one group at a time */
  cr_assert_eq(h.nreqs, 1);
  uint64_t rid = h.reqs[0].id, group = h.reqs[0].group;
  uint32_t w = h.reqs[0].worker, other = w == 2 ? 3 : 2;
  cr_assert_eq(sched_rollouts_refused(h.s, h.now, other, rid), SCHED_EINVAL,
               "only the worker the request went to answers it");
  cr_assert_eq(sched_rollouts_refused(h.s, h.now, w, rid + 100), SCHED_ENOENT);
  cr_assert_eq(counters(&h).groups_requeued, 0, "neither changed anything");
  h.nreqs = 0;
  cr_assert_eq(sched_rollouts_refused(h.s, h.now, w, rid), SCHED_OK, "%s", sched_last_error(h.s));
  fx_drain(&h);
  sched_counters k = counters(&h);
  cr_assert_eq(k.groups_requeued, 1);
  cr_assert_eq(k.rollouts_received, 0);
  cr_assert_eq(outstanding(&h, w), 0, "its slot is free");
  cr_assert_eq(h.nreqs, 1, "the group is asked again at once");
  cr_assert_eq(h.reqs[0].group, group, "with its id");
  cr_assert_neq(h.reqs[0].id, rid, "in a new request");
  cr_assert_eq(h.reqs[0].worker, other, "of the other worker, which has room");
  cr_assert_eq(sched_rollouts_done(h.s, h.now, w, rid,
                                   (sched_rollout[G]){{.id = 1, .group_id = group}}, G),
               SCHED_ENOENT, "the refused request is no longer in flight");
  cr_assert_eq(answer_full(&h, h.reqs[0].id, 20, 0), SCHED_OK, "%s", sched_last_error(h.s));
  cr_assert_eq(h.ntrain, 1);
  cr_assert_eq(h.train_ids[0], 20);
  sched_free(h.s);
}

Test(sched_groups, long_report_and_foreign_group_are_refused) {
  fx h;
  start(&h, 2 * G, 0, 1, 0); /* two groups, one on each worker */
  cr_assert_eq(h.nreqs, 2);
  uint64_t a = h.reqs[0].id, ga = h.reqs[0].group;
  uint64_t b = h.reqs[1].id, gb = h.reqs[1].group;
  uint64_t v[G + 1] = {0};
  cr_assert_eq(answer_with(&h, a, 10, v, G + 1, ga), SCHED_EINVAL);
  cr_assert(strstr(sched_last_error(h.s), "asked for 4 rollouts, got 5"), "%s",
            sched_last_error(h.s));
  /* Rollout 32 claims the other worker's group. */
  size_t i = fx_req(&h, b);
  uint32_t wb = h.reqs[i].worker;
  h.nreqs--;
  memmove(&h.reqs[i], &h.reqs[i + 1], (h.nreqs - i) * sizeof h.reqs[0]);
  sched_rollout r[G];
  for (int k = 0; k < G; k++)
    r[k] = (sched_rollout){.id = 30 + (uint64_t)k, .group_id = k == 2 ? ga : gb};
  cr_assert_eq(sched_rollouts_done(h.s, h.now, wb, b, r, G), SCHED_EINVAL);
  char want[160];
  snprintf(want, sizeof want, "rollout 32: group_id %" PRIu64 ", but request %" PRIu64
           " is for group %" PRIu64, ga, b, gb);
  cr_assert(strstr(sched_last_error(h.s), want), "%s", sched_last_error(h.s));
  fx_drain(&h);
  sched_counters k = counters(&h);
  cr_assert_eq(k.rollouts_buffered, 0);
  cr_assert_eq(k.groups_requeued, 2);
  cr_assert_eq(h.nreqs, 2, "both groups asked again");
  uint64_t open[4];
  cr_assert_eq(sched_open_groups(h.s, open, 4), 2);
  cr_assert_eq(open[0], ga);
  cr_assert_eq(open[1], gb);
  sched_free(h.s);
}

/* ---- batches ------------------------------------------------------------------------------ */

/* Three groups buffered while step 0's weights go out, a batch of two: the
 * two oldest by group version (the oldest of its rollouts), then arrival;
 * the third stays whole. */
Test(sched_groups, batch_takes_whole_groups_by_their_oldest_version) {
  fx h;
  sched_settings c = fx_settings(2 * 2, 3, 8, 0);
  c.group_size = 2;
  c.steps = 3;
  fx_start(&h, &c);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU);
  cr_assert_eq(h.nreqs, 6, "three steps of two groups of 2");
  cr_assert_eq(answer_full(&h, h.reqs[0].id, 1, 0), SCHED_OK);
  cr_assert_eq(answer_full(&h, h.reqs[0].id, 3, 0), SCHED_OK);
  cr_assert_eq(h.ntrain, 1);
  cr_assert_eq(h.train_ngroups, 2);
  fx_step_done(&h); /* version 1 is being broadcast: a worker may hold it */
  uint64_t a = h.reqs[0].id, b = h.reqs[1].id, cc = h.reqs[2].id;
  uint64_t va[] = {1, 1}, vb[] = {1, 0}, vc[] = {0, 0};
  cr_assert_eq(answer_with(&h, a, 10, va, 2, 0), SCHED_OK);
  cr_assert_eq(answer_with(&h, b, 20, vb, 2, 0), SCHED_OK, "%s", sched_last_error(h.s));
  cr_assert_eq(answer_with(&h, cc, 30, vc, 2, 0), SCHED_OK);
  fx_build_and_ack(&h);
  fx_bcast_done(&h);
  cr_assert_eq(h.ntrain, 2);
  uint64_t want[] = {20, 21, 30, 31}; /* b is version 0 by its second rollout, before c */
  cr_assert_eq(h.ntrain_ids, 4);
  cr_assert_arr_eq(h.train_ids, want, sizeof want);
  cr_assert_eq(h.train_ngroups, 2);
  uint64_t left[8];
  cr_assert_eq(sched_buffered_ids(h.s, left, 8), 2, "the third group stays, whole");
  cr_assert_eq(left[0], 10);
  cr_assert_eq(left[1], 11);
  cr_assert_eq(counters(&h).async_level, 1, "step 1 - group version 0");
  sched_free(h.s);
}

/* A group is stale by its oldest rollout, and dropped whole. */
Test(sched_groups, stale_group_is_dropped_whole) {
  fx h;
  sched_settings c = fx_settings(2, 0, 8, 0);
  c.group_size = 2;
  c.steps = 3;
  fx_start(&h, &c);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU);
  cr_assert_eq(answer_full(&h, h.reqs[0].id, 1, 0), SCHED_OK);
  fx_finish_step(&h);
  cr_assert_eq(h.nreqs, 1, "step 1's group, asked at version 1");
  uint64_t lagged[] = {1, 0}; /* one rollout made with the old weights */
  cr_assert_eq(answer_with(&h, h.reqs[0].id, 10, lagged, 2, 0), SCHED_OK);
  cr_assert_eq(h.ntrain, 1, "no batch of version 0 for step 1");
  sched_counters k = counters(&h);
  cr_assert_eq(k.rollouts_dropped_stale, 2, "both rollouts of the group");
  cr_assert_not(sched_has_rollout(h.s, 10));
  cr_assert_eq(h.nreqs, 1, "its place asked again");
  cr_assert_eq(answer_full(&h, h.reqs[0].id, 20, 1), SCHED_OK);
  cr_assert_eq(h.ntrain, 2);
  uint64_t want[] = {20, 21};
  cr_assert_arr_eq(h.train_ids, want, sizeof want);
  sched_free(h.s);
}

/* ---- slow requests: a second request, the first answer wins -------------------------------- */

/* One group in flight on worker 2; its timeout passes. */
static void slow_group(fx *h, uint64_t *first, uint64_t *group) {
  start(h, G, 0, 1, 500);
  cr_assert_eq(h->nreqs, 1);
  cr_assert_eq(h->reqs[0].worker, 2);
  *first = h->reqs[0].id;
  *group = h->reqs[0].group;
  int64_t sent = h->now;
  cr_assert_eq(sched_next_deadline(h->s), sent + 500, "the request timeout is the next deadline");
  h->now = sent + 499;
  cr_assert_eq(sched_tick(h->s, h->now), SCHED_OK);
  fx_drain(h);
  cr_assert_eq(h->ndispatch, 1, "not yet");
  h->now = sent + 500;
  cr_assert_eq(sched_tick(h->s, h->now), SCHED_OK);
  fx_drain(h);
  cr_assert_gt(sched_next_deadline(h->s), h->now, "a fired timeout is not due again");
}

Test(sched_groups, slow_request_goes_to_another_worker_first_answer_wins) {
  fx h;
  uint64_t first, group;
  slow_group(&h, &first, &group);
  cr_assert_eq(h.ndispatch, 2);
  cr_assert_eq(h.dispatch_log[1], 3, "another worker, not the slow one");
  cr_assert_eq(h.dispatch_group[1], group, "the same group");
  uint64_t second = h.reqs[1].id;
  cr_assert_neq(second, first);
  sched_counters k = counters(&h);
  cr_assert_eq(k.groups_resent, 1);
  cr_assert_eq(k.requests_in_flight, 2);
  uint64_t open[4];
  cr_assert_eq(sched_open_groups(h.s, open, 4), 1, "one group, two requests");
  cr_assert_eq(open[0], group);

  h.now += 10;
  cr_assert_eq(answer_full(&h, second, 100, 0), SCHED_OK, "%s", sched_last_error(h.s));
  cr_assert_eq(h.ncancel, 1);
  cr_assert_eq(h.cancels[0].worker, 2);
  cr_assert_eq(h.cancels[0].id, first);
  cr_assert_eq(h.cancels[0].group, group);
  cr_assert(strstr(h.cancels[0].text, "answered by request"), "%s", h.cancels[0].text);
  cr_assert_eq(outstanding(&h, 2), 0, "the cancelled request's slot is free at once");
  cr_assert_eq(h.ntrain, 1);
  uint64_t want[] = {100, 101, 102, 103};
  cr_assert_arr_eq(h.train_ids, want, sizeof want);
  k = counters(&h);
  cr_assert_eq(k.requests_cancelled, 1);
  cr_assert_eq(k.requests_in_flight, 0, "async 0: nothing more while step 0 trains");
  cr_assert_eq(sched_open_groups(h.s, open, 4), 0);

  /* The slow worker's result arrives anyway: stale, nothing changes. */
  sched_rollout r[G];
  for (int i = 0; i < G; i++) r[i] = (sched_rollout){.id = 200 + (uint64_t)i, .group_id = group};
  cr_assert_eq(sched_rollouts_done(h.s, h.now, 2, first, r, G), SCHED_ESTALE);
  cr_assert(strstr(sched_last_error(h.s), "cancelled"), "%s", sched_last_error(h.s));
  sched_counters after = counters(&h);
  cr_assert_eq(after.rollouts_received, k.rollouts_received);
  cr_assert_eq(after.rollouts_buffered, k.rollouts_buffered);
  cr_assert_not(sched_has_rollout(h.s, 200));
  sched_action_batch b;
  cr_assert_eq(sched_take_actions(h.s, &b), 0, "and no action");
  cr_assert_eq(sched_rollouts_done(h.s, h.now, 2, first, r, G), SCHED_ENOENT,
               "stale once: the cancelled request is forgotten with its result");
  sched_free(h.s);
}

Test(sched_groups, slow_request_answering_first_cancels_the_second) {
  fx h;
  uint64_t first, group;
  slow_group(&h, &first, &group);
  uint64_t second = h.reqs[1].id;
  cr_assert_eq(answer_full(&h, first, 100, 0), SCHED_OK);
  cr_assert_eq(h.ncancel, 1);
  cr_assert_eq(h.cancels[0].worker, 3);
  cr_assert_eq(h.cancels[0].id, second);
  cr_assert_eq(outstanding(&h, 3), 0);
  cr_assert_eq(h.ntrain, 1);
  cr_assert_eq(h.train_ids[0], 100);
  sched_free(h.s);
}

/* A refused answer from one of the two requests leaves the group to the
 * other: nothing is queued. That one is still slow and alone, so it gets a
 * second request again (here from the only other worker). */
Test(sched_groups, refused_second_answer_leaves_the_group_to_the_first) {
  fx h;
  uint64_t first, group;
  slow_group(&h, &first, &group);
  uint64_t second = h.reqs[1].id;
  uint64_t v[G] = {0};
  cr_assert_eq(answer_with(&h, second, 100, v, G - 1, 0), SCHED_EINVAL);
  sched_counters k = counters(&h);
  cr_assert_eq(k.groups_requeued, 0);
  cr_assert_eq(k.groups_resent, 2);
  cr_assert_eq(h.ndispatch, 3);
  cr_assert_eq(h.dispatch_group[2], group);
  cr_assert_eq(h.dispatch_log[2], 3);
  uint64_t third = h.reqs[1].id;
  cr_assert_eq(h.ncancel, 0);
  cr_assert_eq(answer_full(&h, first, 200, 0), SCHED_OK);
  cr_assert_eq(h.ncancel, 1);
  cr_assert_eq(h.cancels[0].id, third);
  cr_assert_eq(h.ntrain, 1);
  cr_assert_eq(h.train_ids[0], 200);
  sched_free(h.s);
}

/* The slow request's worker is lost while the second request runs: the
 * group is not queued again, the second request answers it. */
Test(sched_groups, lost_worker_of_a_resent_group_leaves_it_to_the_other) {
  fx h;
  uint64_t first, group;
  slow_group(&h, &first, &group);
  uint64_t second = h.reqs[1].id;
  cr_assert_eq(sched_worker_lost(h.s, h.now, 2, "stream closed"), SCHED_OK);
  drop_worker(&h, 2);
  fx_drain(&h);
  sched_counters k = counters(&h);
  cr_assert_eq(k.groups_requeued, 0);
  cr_assert_eq(k.requests_in_flight, 1);
  cr_assert_eq(h.ndispatch, 2, "nothing new: the group still has its second request");
  cr_assert_eq(answer_full(&h, second, 100, 0), SCHED_OK);
  cr_assert_eq(h.ncancel, 0);
  cr_assert_eq(h.ntrain, 1);
  sched_free(h.s);
}

/* With no other worker free the slow group waits; once one is free (here,
 * one attaches) it gets the second request at once, without a timer. */
Test(sched_groups, slow_request_waits_for_another_worker) {
  fx h;
  sched_settings c = fx_settings(G, 0, 1, 0);
  c.group_size = G;
  c.request_timeout_ms = 500;
  fx_start(&h, &c);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  cr_assert_eq(h.ndispatch, 1);
  h.now += 600;
  cr_assert_eq(sched_tick(h.s, h.now), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.ndispatch, 1, "never to the same worker");
  cr_assert_eq(counters(&h).groups_resent, 0);
  h.now += 1;
  fx_add(&h, 3, SCHED_ROLE_INFERENCE, "inference-3", &FX_GPU);
  cr_assert_eq(h.ndispatch, 2);
  cr_assert_eq(h.dispatch_log[1], 3);
  cr_assert_eq(h.dispatch_group[1], h.dispatch_group[0]);
  cr_assert_eq(counters(&h).groups_resent, 1);
  sched_free(h.s);
}

/* A second request counts like any under max_buffered: with room for one
 * group only, the slow group gets none. */
Test(sched_groups, second_request_respects_max_buffered) {
  fx h;
  sched_settings c = fx_settings(G, 0, 1, G);
  c.group_size = G;
  c.request_timeout_ms = 500;
  fx_start(&h, &c);
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU);
  fx_add(&h, 3, SCHED_ROLE_INFERENCE, "inference-3", &FX_GPU);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  cr_assert_eq(h.ndispatch, 1);
  h.now += 500;
  cr_assert_eq(sched_tick(h.s, h.now), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.ndispatch, 1, "worker 3 is free, but the cap is full");
  cr_assert_eq(counters(&h).groups_resent, 0);
  sched_free(h.s);
}

/* Both groups of a step re-sent: each of the four requests counts in the
 * window, so once one group is in and its other request cancelled, the
 * step is still exactly covered and nothing more is asked. */
Test(sched_groups, second_requests_are_counted) {
  fx h;
  start(&h, 2 * G, 0, 2, 500); /* one step of two groups, K 2 */
  cr_assert_eq(h.ndispatch, 2);
  uint64_t first = h.reqs[0].id, g1 = h.reqs[0].group;
  h.now += 500;
  cr_assert_eq(sched_tick(h.s, h.now), SCHED_OK);
  fx_drain(&h);
  cr_assert_eq(h.ndispatch, 4, "both groups re-sent to the other worker");
  cr_assert_neq(h.dispatch_log[2], h.dispatch_log[0]);
  cr_assert_neq(h.dispatch_log[3], h.dispatch_log[1]);
  sched_counters k = counters(&h);
  cr_assert_eq(k.rollouts_requested, 4 * G, "a second request counts too");
  cr_assert_eq(k.groups_resent, 2);
  uint64_t second = 0;
  for (size_t i = 0; i < h.nreqs; i++)
    if (h.reqs[i].group == g1 && h.reqs[i].id != first) second = h.reqs[i].id;
  cr_assert_neq(second, 0);
  cr_assert_eq(answer_full(&h, second, 100, 0), SCHED_OK);
  cr_assert_eq(h.ncancel, 1);
  cr_assert_eq(h.cancels[0].id, first);
  cr_assert_eq(h.ndispatch, 4, "nothing new: the step waits for the other group");
  k = counters(&h);
  cr_assert_eq(k.rollouts_requested, 2 * G);
  cr_assert_eq(k.rollouts_buffered, G);
  sched_free(h.s);
}

/* ---- workers ------------------------------------------------------------------------------ */

Test(sched_groups, max_concurrent_requests_caps_a_worker) {
  fx h;
  sched_settings c = fx_settings(32, 0, 8, 0); /* more wanted than the workers take */
  fx_start(&h, &c);
  sched_caps narrow = FX_GPU;
  narrow.max_concurrent_requests = 3;
  sched_caps wide = FX_GPU;
  wide.max_concurrent_requests = 50; /* above K: K applies */
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &narrow);
  fx_add(&h, 3, SCHED_ROLE_INFERENCE, "inference-3", &wide);
  fx_add(&h, 4, SCHED_ROLE_INFERENCE, "inference-4", &FX_GPU);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  cr_assert_eq(outstanding(&h, 2), 3, "its own limit");
  cr_assert_eq(outstanding(&h, 3), 8, "K");
  cr_assert_eq(outstanding(&h, 4), 8, "K");
  cr_assert_eq(h.ndispatch, 19);
  fx_answer(&h, 2, 1, 0);
  cr_assert_eq(h.ndispatch, 20, "its freed slot is used again");
  cr_assert_eq(h.dispatch_log[19], 2);
  cr_assert_eq(outstanding(&h, 2), 3);
  sched_free(h.s);
}

Test(sched_groups, max_concurrent_requests_is_the_whole_cap) {
  fx h;
  sched_settings c = fx_settings(8, 0, 8, 0);
  fx_start(&h, &c);
  sched_caps one = FX_GPU;
  one.max_concurrent_requests = 1;
  fx_add(&h, 2, SCHED_ROLE_INFERENCE, "inference-2", &one);
  fx_add(&h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  cr_assert_eq(h.ndispatch, 1, "8 wanted, 1 at a time");
  sched_free(h.s);
}

/* ---- open groups -------------------------------------------------------------------------- */

Test(sched_groups, open_groups_ascending_once_each) {
  fx h;
  start(&h, 2 * G, 1, 2, 0); /* 4 groups: two on each worker */
  cr_assert_eq(h.ndispatch, 4);
  uint64_t open[8];
  cr_assert_eq(sched_open_groups(h.s, NULL, 0), 4, "the count without a list");
  cr_assert_eq(sched_open_groups(h.s, open, 8), 4);
  for (int i = 0; i < 4; i++) cr_assert_eq(open[i], (uint64_t)i + 1);
  /* Answer group 1: no longer open, but buffered. */
  size_t i1 = 0;
  while (h.reqs[i1].group != 1) i1++;
  cr_assert_eq(answer_full(&h, h.reqs[i1].id, 10, 0), SCHED_OK);
  cr_assert_eq(sched_open_groups(h.s, open, 8), 3);
  cr_assert_eq(open[0], 2);
  cr_assert(sched_has_rollout(h.s, 10));
  /* Worker 3 is lost: its groups wait, still open, listed once. */
  uint32_t w3 = 0;
  for (size_t i = 0; i < h.nreqs; i++) w3 += h.reqs[i].worker == 3;
  cr_assert_gt(w3, 0);
  cr_assert_eq(sched_worker_lost(h.s, h.now, 3, "gone"), SCHED_OK);
  fx_drain(&h);
  size_t n = sched_open_groups(h.s, open, 8);
  cr_assert_eq(n, 3, "in flight or waiting: the same three groups");
  for (size_t i = 1; i < n; i++) cr_assert_lt(open[i - 1], open[i]);
  cr_assert_eq(sched_open_groups(h.s, open, 1), 3, "the count, though one was written");
  sched_free(h.s);
}
