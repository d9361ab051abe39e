/* The scheduler test fixture (see sched_fixture.h). */
#include "sched_fixture.h"

#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

const sched_caps FX_GPU = {.cuda_devices = 1, .nccl = 1, .pinned_limit_bytes = 1 << 30};
const sched_offload FX_ALL_GPU = {.gpu_tensors = 10, .gpu_bytes = 1000};

void fx_drain(fx *h) {
  sched_action_batch b;
  size_t n = sched_take_actions(h->s, &b);
  cr_assert_eq(n, b.n);
  const sched_action *a = b.actions;
  for (size_t i = 0; i < n; i++) {
    switch (a[i].kind) {
    case SCHED_ACT_DISPATCH:
      cr_assert_lt(h->nreqs, FX_MAXQ);
      cr_assert_lt(h->ndispatch, FX_MAXQ);
      h->reqs[h->nreqs].worker = a[i].worker;
      h->reqs[h->nreqs].id = a[i].request_id;
      h->reqs[h->nreqs].version = a[i].policy_version;
      h->reqs[h->nreqs].group = a[i].group_id;
      h->reqs[h->nreqs++].count = a[i].count;
      h->dispatch_group[h->ndispatch] = a[i].group_id;
      h->dispatch_log[h->ndispatch++] = a[i].worker;
      break;
    case SCHED_ACT_CANCEL: {
      cr_assert_lt(h->ncancel, FX_MAXQ);
      h->cancels[h->ncancel].worker = a[i].worker;
      h->cancels[h->ncancel].id = a[i].request_id;
      h->cancels[h->ncancel].group = a[i].group_id;
      snprintf(h->cancels[h->ncancel].text, sizeof h->cancels[0].text, "%s", a[i].text);
      h->ncancel++;
      size_t k = fx_req(h, a[i].request_id);
      cr_assert_eq(h->reqs[k].worker, a[i].worker, "a CANCEL goes to the request's worker");
      cr_assert_eq(h->reqs[k].group, a[i].group_id, "a CANCEL names the request's group");
      memmove(&h->reqs[k], &h->reqs[k + 1], (h->nreqs - k - 1) * sizeof h->reqs[0]);
      h->nreqs--;
      break;
    }
    case SCHED_ACT_TRAIN:
      if (h->ntrain < 64) {
        h->trains[h->ntrain].worker = a[i].worker;
        h->trains[h->ntrain].rank = a[i].trainer_rank;
        h->trains[h->ntrain].ranks = a[i].trainer_ranks;
        h->trains[h->ntrain].step = a[i].step;
        h->trains[h->ntrain].first_id = a[i].nrollouts ? a[i].rollout_ids[0] : 0;
      }
      h->ntrain++;
      h->train_step = a[i].step;
      h->ntrain_ids = a[i].nrollouts;
      h->train_ngroups = a[i].ngroups;
      cr_assert_leq(a[i].nrollouts, 64);
      memcpy(h->train_ids, a[i].rollout_ids, a[i].nrollouts * sizeof(uint64_t));
      break;
    case SCHED_ACT_BUILD_PLAN:
      h->nplan++;
      snprintf(h->plan_id, sizeof h->plan_id, "%s", a[i].plan_id);
      h->plan_catchup = a[i].catchup;
      h->plan_version = a[i].policy_version;
      h->plan_mode = a[i].mode;
      h->plan_sources = a[i].trainer_ranks;
      snprintf(h->plan_reason, sizeof h->plan_reason, "%s", a[i].text);
      h->nparts = a[i].nparticipants;
      memcpy(h->parts, a[i].participants, a[i].nparticipants * sizeof(uint32_t));
      break;
    case SCHED_ACT_TRIGGER: h->ntrigger++; break;
    case SCHED_ACT_ABORT:
      h->nabort++;
      snprintf(h->abort_reason, sizeof h->abort_reason, "%s", a[i].text);
      h->abort_kind = a[i].abort_reason;
      h->abort_sources = a[i].trainer_ranks;
      snprintf(h->abort_plan, sizeof h->abort_plan, "%s", a[i].plan_id);
      h->nabort_parts = a[i].nparticipants < 16 ? a[i].nparticipants : 16;
      memcpy(h->abort_parts, a[i].participants, h->nabort_parts * sizeof(uint32_t));
      break;
    case SCHED_ACT_COMMIT: h->records[h->ncommit++] = *a[i].record; break;
    case SCHED_ACT_RUN_STATE:
      h->run_state = a[i].run_state;
      snprintf(h->run_msg, sizeof h->run_msg, "%s", a[i].text);
      break;
    case SCHED_ACT_CAUGHT_UP:
      h->ncaughtup++;
      snprintf(h->caughtup_plan, sizeof h->caughtup_plan, "%s", a[i].plan_id);
      h->caughtup_version = a[i].policy_version;
      h->ncaughtup_parts = a[i].nparticipants < 16 ? a[i].nparticipants : 16;
      memcpy(h->caughtup_parts, a[i].participants, h->ncaughtup_parts * sizeof(uint32_t));
      cr_assert_not_null(a[i].record, "CAUGHT_UP carries its figures");
      h->caughtup_verified = a[i].record->weights_verified;
      h->caughtup_record = *a[i].record;
      break;
    case SCHED_ACT_WORKER_STATE:
      if (a[i].worker_state == SCHED_WORKER_LOST && a[i].worker < 64) h->lost[a[i].worker] = 1;
      break;
    }
  }
  sched_action_batch_free(&b);
}

sched_settings fx_settings(uint32_t per_step, uint32_t async, uint32_t k, uint32_t cap) {
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

void fx_start(fx *h, const sched_settings *c) {
  memset(h, 0, sizeof *h);
  char err[256];
  cr_assert_eq(sched_new(c, &h->s, err, sizeof err), SCHED_OK, "%s", err);
  h->now = 1000;
}

void fx_add_v(fx *h, uint32_t id, sched_role role, const char *name, const sched_caps *c,
              uint64_t version) {
  cr_assert_eq(sched_worker_registered(h->s, h->now, id, role, name, c, &FX_ALL_GPU, version),
               SCHED_OK, "%s", sched_last_error(h->s));
  cr_assert_eq(sched_worker_attached(h->s, h->now, id), SCHED_OK);
  fx_drain(h);
}

void fx_add(fx *h, uint32_t id, sched_role role, const char *name, const sched_caps *c) {
  sched_counters k;
  sched_get_counters(h->s, &k);
  fx_add_v(h, id, role, name, c, k.policy_version);
}

size_t fx_req(const fx *h, uint64_t id) {
  for (size_t i = 0; i < h->nreqs; i++)
    if (h->reqs[i].id == id) return i;
  cr_assert_fail("request %" PRIu64 " is not in flight", id);
  return 0;
}

void fx_answer(fx *h, uint32_t worker, uint64_t rid, uint64_t version) {
  for (size_t i = 0; i < h->nreqs; i++) {
    if (worker && h->reqs[i].worker != worker) continue;
    sched_rollout r[64];
    uint32_t n = h->reqs[i].count;
    cr_assert_leq(n, 64);
    for (uint32_t k = 0; k < n; k++)
      r[k] = (sched_rollout){.id = rid + k, .policy_version = version, .tokens = 10,
                             .group_id = h->reqs[i].group};
    uint32_t w = h->reqs[i].worker;
    uint64_t q = h->reqs[i].id;
    memmove(&h->reqs[i], &h->reqs[i + 1], (h->nreqs - i - 1) * sizeof h->reqs[0]);
    h->nreqs--;
    cr_assert_eq(sched_rollouts_done(h->s, h->now, w, q, r, n), SCHED_OK, "%s",
                 sched_last_error(h->s));
    fx_drain(h);
    return;
  }
  cr_assert_fail("no request in flight for worker %" PRIu32, worker);
}

void fx_step_done(fx *h) {
  h->now += 100;
  cr_assert_eq(sched_step_done(h->s, h->now, FX_TRAINER, h->train_step, 0.1, NULL), SCHED_OK,
               "%s", sched_last_error(h->s));
  fx_drain(h);
}

void fx_build_and_ack(fx *h) {
  cr_assert_eq(sched_plan_built(h->s, h->now, h->plan_id, 0xabc, NULL), SCHED_OK);
  for (size_t i = 0; i < h->nparts; i++)
    cr_assert_eq(sched_plan_acked(h->s, h->now, h->parts[i], h->plan_id, 0xabc, NULL),
                 SCHED_OK);
  fx_drain(h);
}

void fx_bcast_done(fx *h) {
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
  fx_drain(h);
}

void fx_finish_step(fx *h) {
  fx_step_done(h);
  fx_build_and_ack(h);
  fx_bcast_done(h);
}

void fx_to_plan(fx *h) {
  sched_settings c = fx_settings(1, 0, 1, 4);
  c.steps = 2;
  fx_start(h, &c);
  fx_add(h, FX_TRAINER, SCHED_ROLE_TRAINER, "trainer", &FX_GPU);
  fx_add(h, 2, SCHED_ROLE_INFERENCE, "inference-2", &FX_GPU);
  fx_add(h, 3, SCHED_ROLE_INFERENCE, "inference-3", &FX_GPU);
  fx_answer(h, 2, 1, 0);
  cr_assert_eq(h->ntrain, 1);
  fx_step_done(h);
  cr_assert_eq(h->nplan, 1);
}
