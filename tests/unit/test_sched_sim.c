/* Simulation: 1 trainer and many inference workers with random latencies,
 * driven through many steps in one process, time advanced by the test. A few
 * workers fall silent on the way. Invariants are checked after every event.
 * Two worlds: single rollouts and no request timeout (1000 workers); groups of
 * 4 with a heavy latency tail, a request timeout and workers that serve
 * fewer requests at once than the run allows, so groups are re-sent, lost
 * groups re-queued and duplicate requests cancelled. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/sched/sched.h"
#include "orchestrator/sim/evq.h"

#define MAXW 1000
#define TRAINER 0
#define PER_STEP 64
#define ASYNC 2
#define K 2
#define MAX_ROLLOUTS 400000
#define MAX_REQUESTS 200000
#define NDEAD 5

enum { EV_ROLLOUT, EV_STEP_DONE, EV_BUILT, EV_ACK, EV_BDONE, EV_HEARTBEAT };

typedef struct world {
  uint32_t ninf, steps, group;
  int64_t request_timeout_ms;
  uint32_t slow_percent;  /* requests that take 3..8 s instead of 20..400 ms */
  uint32_t narrow_every;  /* every n-th worker serves 1 request at once; 0: none */
} world;

typedef struct ev {
  int64_t t;         /* when it is due (the queue's key too) */
  int type;
  uint32_t worker;
  uint64_t a;        /* request id, step */
  uint64_t group;    /* rollout: the request's group */
  uint32_t count;    /* rollout: the request's count */
  uint64_t version;  /* rollout version */
  char plan[SCHED_PLAN_ID_MAX];
} ev;

typedef struct sim {
  const world *w;
  sched *s;
  int64_t now;
  uint64_t rng;
  evq q;
  uint64_t held[MAXW + 1];     /* version each worker holds */
  uint32_t outstanding[MAXW + 1];
  uint32_t cap[MAXW + 1];      /* requests it serves at once */
  int dead[MAXW + 1];
  int64_t dies_at[MAXW + 1];
  uint64_t next_rollout;
  uint64_t *version_of;        /* rollout id -> version */
  uint64_t *group_of;          /* rollout id -> group */
  uint8_t *used;               /* rollout id -> used in a batch */
  uint8_t *cancelled;          /* request id -> cancelled */
  uint8_t *accepted;           /* group id -> a whole answer was accepted */
  uint8_t *batched;            /* group id -> in a batch */
  uint64_t late_cancelled;     /* results of cancelled requests delivered anyway */
  uint64_t last_version, commits, events;
  uint64_t plan_parts[MAXW + 1];
  size_t nplan_parts;
  char plan_id[SCHED_PLAN_ID_MAX];
  uint64_t plan_step;
} sim;

static uint64_t rnd(sim *m, uint64_t lo, uint64_t hi) {
  m->rng ^= m->rng << 13;
  m->rng ^= m->rng >> 7;
  m->rng ^= m->rng << 17;
  return lo + m->rng % (hi - lo + 1);
}

/* The simulator's event queue: by time, then in the order pushed. */
static void push(sim *m, ev e) { cr_assert_eq(evq_push(&m->q, e.t, &e), 0, "out of memory"); }

static ev pop(sim *m) {
  ev top;
  cr_assert_geq(evq_pop(&m->q, &top), 0);
  return top;
}

/* A batch is whole groups, each once in the run, oldest group version first. */
static void check_batch(sim *m, const sched_action *a) {
  uint32_t g = m->w->group;
  int64_t bound = (int64_t)a->step - ASYNC;
  cr_assert_eq(a->nrollouts, PER_STEP);
  cr_assert_eq(a->ngroups, PER_STEP / g);
  uint64_t prev_gv = 0;
  for (size_t k = 0; k < a->nrollouts; k += g) {
    uint64_t gid = m->group_of[a->rollout_ids[k]];
    uint64_t gv = UINT64_MAX;
    for (size_t j = k; j < k + g; j++) {
      uint64_t id = a->rollout_ids[j];
      cr_assert_lt(id, m->next_rollout);
      cr_assert_not(m->used[id], "rollout %" PRIu64 " used twice", id);
      m->used[id] = 1;
      cr_assert_eq(m->group_of[id], gid, "step %" PRIu64 ": group %" PRIu64 " split", a->step, gid);
      if (m->version_of[id] < gv) gv = m->version_of[id];
    }
    cr_assert_not(m->batched[gid], "group %" PRIu64 " batched twice", gid);
    m->batched[gid] = 1;
    cr_assert_geq((int64_t)gv, bound, "group %" PRIu64 " beyond the bound", gid);
    if (k) cr_assert_geq(gv, prev_gv, "groups oldest version first");
    prev_gv = gv;
  }
}

/* The simulated agents react to what the scheduler asks. */
static void react(sim *m) {
  sched_action_batch b;
  size_t n = sched_take_actions(m->s, &b);
  const sched_action *a = b.actions;
  for (size_t i = 0; i < n; i++) {
    ev e = {0};
    switch (a[i].kind) {
    case SCHED_ACT_DISPATCH: {
      uint32_t w = a[i].worker;
      cr_assert_eq(a[i].count, m->w->group);
      cr_assert_neq(a[i].group_id, 0);
      cr_assert_not(m->accepted[a[i].group_id], "group %" PRIu64 " asked again once answered",
                    a[i].group_id);
      cr_assert_lt(a[i].request_id, MAX_REQUESTS);
      m->outstanding[w]++;
      cr_assert_leq(m->outstanding[w], m->cap[w], "worker %" PRIu32 " over its cap", w);
      int slow = rnd(m, 1, 100) <= m->w->slow_percent;
      int64_t lat = slow ? (int64_t)rnd(m, 3000, 8000) : (int64_t)rnd(m, 20, 400);
      e = (ev){.t = m->now + lat, .type = EV_ROLLOUT, .worker = w, .a = a[i].request_id,
               .group = a[i].group_id, .count = a[i].count, .version = m->held[w]};
      push(m, e);
      break;
    }
    case SCHED_ACT_CANCEL:
      cr_assert_gt(m->w->request_timeout_ms, 0, "a cancel without re-sends");
      cr_assert(m->accepted[a[i].group_id], "cancelled before its group was answered");
      cr_assert_not(m->cancelled[a[i].request_id]);
      m->cancelled[a[i].request_id] = 1;
      cr_assert_gt(m->outstanding[a[i].worker], 0);
      m->outstanding[a[i].worker]--;
      break;
    case SCHED_ACT_TRAIN:
      check_batch(m, &a[i]);
      e = (ev){.t = m->now + (int64_t)rnd(m, 150, 350), .type = EV_STEP_DONE,
               .worker = a[i].worker, .a = a[i].step};
      push(m, e);
      break;
    case SCHED_ACT_BUILD_PLAN:
      cr_assert_eq(a[i].participants[0], TRAINER);
      for (size_t k = 2; k < a[i].nparticipants; k++)
        cr_assert_gt(a[i].participants[k], a[i].participants[k - 1], "ranks in id order");
      snprintf(m->plan_id, sizeof m->plan_id, "%s", a[i].plan_id);
      m->plan_step = a[i].step;
      m->nplan_parts = a[i].nparticipants;
      for (size_t k = 0; k < a[i].nparticipants; k++) m->plan_parts[k] = a[i].participants[k];
      e = (ev){.t = m->now + 5, .type = EV_BUILT};
      snprintf(e.plan, sizeof e.plan, "%s", a[i].plan_id);
      push(m, e);
      for (size_t k = 0; k < a[i].nparticipants; k++) {
        ev ack = {.t = m->now + (int64_t)rnd(m, 6, 40), .type = EV_ACK,
                  .worker = a[i].participants[k]};
        snprintf(ack.plan, sizeof ack.plan, "%s", a[i].plan_id);
        push(m, ack);
      }
      break;
    case SCHED_ACT_TRIGGER:
      for (size_t k = 0; k < a[i].nparticipants; k++) {
        ev d = {.t = m->now + (int64_t)rnd(m, 20, 80), .type = EV_BDONE,
                .worker = a[i].participants[k], .a = a[i].step};
        snprintf(d.plan, sizeof d.plan, "%s", a[i].plan_id);
        push(m, d);
      }
      break;
    case SCHED_ACT_COMMIT:
      cr_assert_eq(a[i].record->policy_version, m->last_version + 1, "versions monotonic");
      m->last_version = a[i].record->policy_version;
      m->commits++;
      cr_assert_eq(a[i].record->rollouts_used, PER_STEP);
      break;
    case SCHED_ACT_WORKER_STATE:
      if (a[i].worker_state == SCHED_WORKER_LOST) {
        cr_assert(m->dead[a[i].worker], "live worker %" PRIu32 " lost: %s", a[i].worker, a[i].text);
        m->outstanding[a[i].worker] = 0;
      }
      break;
    case SCHED_ACT_RUN_STATE:
      cr_assert_neq(a[i].run_state, SCHED_RUN_FAILED, "run failed: %s", a[i].text);
      break;
    default: break;
    }
  }
  sched_action_batch_free(&b);
}

/* Accepts only what a correct shell may see in a world with losses. */
static void ok(sim *m, int rc) {
  cr_assert(rc == SCHED_OK || rc == SCHED_ESTALE, "rc %d: %s", rc, sched_last_error(m->s));
}

static void deliver(sim *m, const ev *e) {
  if (m->dead[e->worker] && e->type != EV_BUILT) return;
  switch (e->type) {
  case EV_ROLLOUT: {
    sched_rollout r[8];
    cr_assert_leq(e->count, 8);
    cr_assert_leq(m->next_rollout + e->count, MAX_ROLLOUTS);
    for (uint32_t k = 0; k < e->count; k++) {
      /* Weights may land mid-request: the last rollouts carry the newer version. */
      uint64_t v = k == e->count - 1 ? m->held[e->worker] : e->version;
      r[k] = (sched_rollout){.id = m->next_rollout, .policy_version = v, .tokens = 100,
                             .group_id = e->group};
      m->version_of[m->next_rollout] = v;
      m->group_of[m->next_rollout++] = e->group;
    }
    int rc = sched_rollouts_done(m->s, m->now, e->worker, e->a, r, e->count);
    if (m->cancelled[e->a]) {
      cr_assert_eq(rc, SCHED_ESTALE, "a cancelled request's result: %s", sched_last_error(m->s));
      m->late_cancelled++;
      break;
    }
    cr_assert_eq(rc, SCHED_OK, "rc %d: %s", rc, sched_last_error(m->s));
    cr_assert_not(m->accepted[e->group], "group %" PRIu64 " accepted twice", e->group);
    m->accepted[e->group] = 1;
    cr_assert_gt(m->outstanding[e->worker], 0);
    m->outstanding[e->worker]--;
    break;
  }
  case EV_STEP_DONE: {
    sched_offload off = {.gpu_tensors = 100, .pinned_tensors = 20, .gpu_bytes = 1 << 20,
                         .pinned_bytes = 1 << 18};
    ok(m, sched_step_done(m->s, m->now, e->worker, e->a, 0.2, &off));
    break;
  }
  case EV_BUILT: ok(m, sched_plan_built(m->s, m->now, e->plan, 0x1234, NULL)); break;
  case EV_ACK: {
    int rc = sched_plan_acked(m->s, m->now, e->worker, e->plan, 0x1234, NULL);
    cr_assert(rc == SCHED_OK || rc == SCHED_ESTALE || rc == SCHED_ESTATE, "ack rc %d: %s", rc,
              sched_last_error(m->s));
    if (rc == SCHED_ESTATE) { /* sent before the plan-built report: retry shortly */
      ev again = *e;
      again.t = m->now + 1;
      push(m, again);
    }
    break;
  }
  case EV_BDONE: {
    sched_bcast_report rep = {.transport = "nccl", .wire_bytes = 1 << 20, .total_seconds = 0.05,
                              .exposed_staging_seconds = 0.01, .weights_checksum = 9};
    if (e->worker != TRAINER) m->held[e->worker] = e->a + 1;
    ok(m, sched_broadcast_done(m->s, m->now, e->worker, e->plan, NULL, &rep));
    break;
  }
  case EV_HEARTBEAT:
    if (m->now >= m->dies_at[e->worker]) {
      m->dead[e->worker] = 1;
      break;
    }
    ok(m, sched_worker_heartbeat(m->s, m->now, e->worker, m->held[e->worker]));
    push(m, (ev){.t = m->now + 1000, .type = EV_HEARTBEAT, .worker = e->worker});
    break;
  }
}

static void check_all_workers(sim *m) {
  sched_worker_info w;
  for (size_t i = 0; i < sched_worker_count(m->s); i++) {
    cr_assert_eq(sched_get_worker_at(m->s, i, &w), SCHED_OK);
    if (w.role != SCHED_ROLE_INFERENCE) continue;
    cr_assert_leq(w.outstanding, m->cap[w.id]);
    if (w.state != SCHED_WORKER_LOST)
      cr_assert_eq(w.outstanding, m->outstanding[w.id], "worker %" PRIu32, w.id);
  }
  /* Open groups: ascending, each once, none already answered. */
  static uint64_t open[MAXW * K];
  size_t n = sched_open_groups(m->s, open, MAXW * K);
  cr_assert_leq(n, MAXW * K);
  for (size_t i = 0; i < n; i++) {
    if (i) cr_assert_lt(open[i - 1], open[i]);
    cr_assert_not(m->accepted[open[i]], "group %" PRIu64 " open after its answer", open[i]);
  }
}

/* Runs the world to success; its counters and the results of cancelled
 * requests delivered anyway (the simulated workers ignore aborts). */
static void run(const world *wd, sched_counters *out, uint64_t *late_cancelled) {
  sim *m = calloc(1, sizeof *m);
  m->w = wd;
  evq_init(&m->q, sizeof(ev));
  m->version_of = calloc(MAX_ROLLOUTS, sizeof *m->version_of);
  m->group_of = calloc(MAX_ROLLOUTS, sizeof *m->group_of);
  m->used = calloc(MAX_ROLLOUTS, 1);
  m->cancelled = calloc(MAX_REQUESTS, 1);
  m->accepted = calloc(MAX_REQUESTS, 1); /* group ids stay below request ids */
  m->batched = calloc(MAX_REQUESTS, 1);
  m->rng = 0x9e3779b97f4a7c15ull;
  sched_settings c;
  sched_settings_default(&c);
  snprintf(c.run_id, sizeof c.run_id, "sim");
  c.steps = wd->steps;
  c.rollouts_per_step = PER_STEP;
  c.group_size = wd->group;
  c.max_async_level = ASYNC;
  c.max_outstanding = K;
  c.request_timeout_ms = wd->request_timeout_ms;
  c.heartbeat_timeout_ms = 3500;
  /* Longer than the heartbeat timeout: a dead participant is lost (and the
   * step re-planned) before its missing ack could fail the run. */
  c.plan_ack_timeout_ms = 5000;
  c.broadcast_timeout_ms = 5000;
  char err[256];
  cr_assert_eq(sched_new(&c, &m->s, err, sizeof err), SCHED_OK, "%s", err);
  for (uint32_t id = 0; id <= wd->ninf; id++) {
    sched_role role = id == TRAINER ? SCHED_ROLE_TRAINER : SCHED_ROLE_INFERENCE;
    char name[32];
    snprintf(name, sizeof name, id ? "inference-%u" : "trainer", id);
    int narrow = id && wd->narrow_every && id % wd->narrow_every == 0;
    sched_caps caps = {.cuda_devices = 1, .nccl = 1, .max_concurrent_requests = narrow ? 1 : 0};
    m->cap[id] = narrow ? 1 : K;
    m->dies_at[id] = INT64_MAX;
    cr_assert_eq(sched_worker_registered(m->s, m->now, id, role, name, &caps, NULL, 0), SCHED_OK);
    cr_assert_eq(sched_worker_attached(m->s, m->now, id), SCHED_OK);
    react(m);
    push(m, (ev){.t = m->now + (int64_t)rnd(m, 1, 1000), .type = EV_HEARTBEAT, .worker = id});
  }
  for (int i = 0; i < NDEAD; i++) m->dies_at[rnd(m, 1, wd->ninf)] = (int64_t)rnd(m, 2000, 15000);

  sched_run_info ri;
  for (;;) {
    sched_get_run(m->s, &ri);
    if (ri.state == SCHED_RUN_SUCCEEDED || ri.state == SCHED_RUN_FAILED) break;
    cr_assert_gt(m->q.n, 0, "simulation ran dry in state %s", sched_run_state_name(ri.state));
    int64_t due = sched_next_deadline(m->s);
    if (due <= evq_next(&m->q)) {
      cr_assert_geq(due, m->now, "deadline in the past");
      m->now = due;
      ok(m, sched_tick(m->s, m->now));
    } else {
      ev e = pop(m);
      cr_assert_geq(e.t, m->now);
      m->now = e.t;
      deliver(m, &e);
    }
    react(m);
    if (++m->events % 512 == 0) check_all_workers(m);
    sched_counters k;
    sched_get_counters(m->s, &k);
    cr_assert_geq(k.policy_version, m->last_version);
    cr_assert_leq(k.rollouts_buffered + k.rollouts_requested, 2u * PER_STEP * (ASYNC + 1));
  }
  cr_assert_eq(ri.state, SCHED_RUN_SUCCEEDED, "%s", ri.message);
  cr_assert_eq(m->commits, wd->steps);
  sched_counters k;
  sched_get_counters(m->s, &k);
  cr_assert_eq(k.steps, wd->steps);
  cr_assert_eq(k.rollouts_used, (uint64_t)wd->steps * PER_STEP);
  cr_assert_eq(k.broadcasts[SCHED_MODE_STAGED], wd->steps);
  cr_assert_eq(k.rollouts_received, k.rollouts_used + k.rollouts_dropped_stale + k.rollouts_buffered);
  cr_assert_leq(k.requests_cancelled, k.groups_resent, "one cancel per re-send at most");
  int lost = 0;
  for (uint32_t id = 1; id <= wd->ninf; id++) {
    sched_worker_info w;
    sched_get_worker(m->s, id, &w);
    lost += w.state == SCHED_WORKER_LOST;
  }
  cr_assert_gt(lost, 0, "some workers should have died on the way");
  cr_assert_eq((int)ri.inference, (int)wd->ninf - lost);
  *out = k;
  *late_cancelled = m->late_cancelled;
  sched_free(m->s);
  evq_free(&m->q);
  free(m->version_of);
  free(m->group_of);
  free(m->used);
  free(m->cancelled);
  free(m->accepted);
  free(m->batched);
  free(m);
}

Test(sched_sim, thousand_workers_fifty_steps, .timeout = 240) {
  world w = {.ninf = 1000, .steps = 50, .group = 1};
  sched_counters k;
  uint64_t late;
  run(&w, &k, &late);
  cr_assert_eq(k.groups_resent, 0);
  cr_assert_eq(k.requests_cancelled, 0);
}

Test(sched_sim, groups_resent_requeued_and_cancelled, .timeout = 240) {
  world w = {.ninf = 12, .steps = 40, .group = 4, .request_timeout_ms = 4000,
             .slow_percent = 10, .narrow_every = 3};
  sched_counters k;
  uint64_t late;
  run(&w, &k, &late);
  cr_assert_gt(k.groups_resent, 0, "slow requests were re-sent");
  cr_assert_gt(k.requests_cancelled, 0, "duplicates were cancelled");
  cr_assert_gt(late, 0, "results of cancelled requests arrived, stale");
  cr_assert_gt(k.groups_requeued, 0, "the dead workers' groups were re-queued");
}
