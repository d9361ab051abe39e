/* The scheduler's indexes against the rules they replace, over random runs:
 * workers registering (in shuffled id order), attaching, sending heartbeats
 * or falling silent, answering requests in any order, being lost, coming
 * back holding an old version (a catch-up), being forgotten; steps trained
 * and broadcast. After every event:
 *   - sched_next_deadline equals a scan of every live worker's heartbeat
 *     deadline and every request in flight not yet overdue (the test keeps
 *     its own list of requests and their dispatch times);
 *   - every DISPATCH went to the worker the old rule picks: the least loaded
 *     synced attached inference worker with a free slot, ties to the lowest
 *     id; a second request for a slow group to the least loaded other one;
 *   - the counters of requests in flight and buffered rollouts match.
 * Plans are built, acked and broadcast at once, so none is pending between
 * events and the deadline is the workers' and the requests' alone. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/sched/sched.h"

#define NW 48        /* inference workers */
#define TRAINER 1000 /* the trainer's id: above theirs, so registration moves none */
#define MAXQ 4096
#define HB_MS 5000   /* heartbeat timeout */
#define RT_MS 700    /* request timeout */

static const sched_offload ALL_GPU = {.gpu_tensors = 4, .gpu_bytes = 4096};

typedef struct req {
  uint64_t id, group, version;
  uint32_t worker;
  int64_t sent;
  int overdue;
} req;

typedef struct run {
  sched *s;
  int64_t now;
  uint64_t rng;
  req q[MAXQ];
  size_t nq;
  uint64_t held[NW + 2];   /* the version each inference worker holds */
  uint32_t cap[NW + 2];    /* its max_concurrent_requests */
  int train_pending;
  uint64_t train_step;
  uint64_t next_rollout;
  uint64_t buffered;       /* rollouts accepted less those batched or dropped */
  int64_t rt;              /* the run's request timeout: RT_MS or 0 (none) */
  size_t dispatches, hedges, plans;
  /* Follow-ups of the last call, run once its actions are checked. */
  char plan_id[SCHED_PLAN_ID_MAX];
  uint32_t parts[NW + 2];
  size_t nparts;
  int plan_todo;
  uint64_t plan_version;
} run;

static uint64_t rnd(run *r) {
  r->rng ^= r->rng << 13;
  r->rng ^= r->rng >> 7;
  r->rng ^= r->rng << 17;
  return r->rng;
}

static size_t find_req(run *r, uint64_t id) {
  for (size_t i = 0; i < r->nq; i++)
    if (r->q[i].id == id) return i;
  return r->nq;
}

static void drop_req(run *r, size_t i) { r->q[i] = r->q[--r->nq]; }

/* The old rule of dispatch over the workers as they stand, `out[w]` being
 * each one's requests in flight just before the DISPATCH examined: the least
 * loaded eligible worker with the lowest id, and the one after it. */
static void old_pick(run *r, const uint32_t *out, uint32_t *b1, uint32_t *b2) {
  *b1 = *b2 = 0;
  size_t n = sched_worker_count(r->s);
  for (size_t i = 0; i < n; i++) {
    sched_worker_info w;
    cr_assert_eq(sched_get_worker_at(r->s, i, &w), SCHED_OK);
    if (w.role != SCHED_ROLE_INFERENCE || !w.synced) continue;
    if (w.state != SCHED_WORKER_READY && w.state != SCHED_WORKER_BUSY) continue;
    uint32_t cap = r->cap[w.id] && r->cap[w.id] < 3 ? r->cap[w.id] : 3;
    if (out[w.id] >= cap) continue;
    if (!*b1 || out[w.id] < out[*b1]) {
      *b2 = *b1;
      *b1 = w.id;
    } else if (!*b2 || out[w.id] < out[*b2]) {
      *b2 = w.id;
    }
  }
}

/* Takes and checks the actions of the call just made. */
static void actions(run *r) {
  sched_action_batch b;
  sched_take_actions(r->s, &b);
  /* Requests in flight per worker before this call's dispatches: the
   * dispatches come last in an event, after every answer and loss. */
  uint32_t out[NW + 2] = {0};
  for (size_t i = 0; i < NW + 2; i++) {
    sched_worker_info w;
    if (sched_get_worker(r->s, (uint32_t)i, &w) == SCHED_OK) out[i] = w.outstanding;
  }
  for (size_t i = 0; i < b.n; i++)
    if (b.actions[i].kind == SCHED_ACT_DISPATCH) out[b.actions[i].worker]--;
  for (size_t i = 0; i < b.n; i++) {
    const sched_action *a = &b.actions[i];
    switch (a->kind) {
    case SCHED_ACT_DISPATCH: {
      uint32_t b1, b2;
      old_pick(r, out, &b1, &b2);
      size_t first = r->nq;
      for (size_t k = 0; k < r->nq; k++)
        if (r->q[k].group == a->group_id) first = k;
      uint32_t want = b1;
      if (first < r->nq) { /* a second request for a slow group: another worker */
        want = r->q[first].worker != b1 ? b1 : b2;
        r->hedges++;
      }
      cr_assert_eq(a->worker, want, "t=%" PRId64 ": request %" PRIu64 " (group %" PRIu64
                   ") went to %u, the old rule picks %u", r->now, a->request_id, a->group_id,
                   a->worker, want);
      cr_assert_lt(r->nq, MAXQ);
      r->q[r->nq++] = (req){.id = a->request_id, .group = a->group_id, .worker = a->worker,
                            .version = a->policy_version, .sent = r->now};
      out[a->worker]++;
      r->dispatches++;
      break;
    }
    case SCHED_ACT_CANCEL: {
      size_t k = find_req(r, a->request_id);
      cr_assert_lt(k, r->nq, "a cancelled request was in flight");
      drop_req(r, k);
      break;
    }
    case SCHED_ACT_TRAIN:
      r->train_pending = 1;
      r->train_step = a->step;
      cr_assert_geq(r->buffered, a->nrollouts);
      r->buffered -= a->nrollouts;
      break;
    case SCHED_ACT_BUILD_PLAN:
      snprintf(r->plan_id, sizeof r->plan_id, "%s", a->plan_id);
      memcpy(r->parts, a->participants, a->nparticipants * sizeof *r->parts);
      r->nparts = a->nparticipants;
      r->plan_version = a->policy_version;
      r->plan_todo = 1;
      break;
    case SCHED_ACT_WORKER_STATE:
      if (a->worker_state == SCHED_WORKER_LOST) /* its requests went with it */
        for (size_t k = r->nq; k-- > 0;)
          if (r->q[k].worker == a->worker) drop_req(r, k);
      break;
    default:
      break;
    }
  }
  sched_action_batch_free(&b);
}

static void call(run *r, int rc, const char *what) {
  cr_assert_eq(rc, SCHED_OK, "t=%" PRId64 ": %s: %s: %s", r->now, what, sched_strerror(rc),
               sched_last_error(r->s));
  actions(r);
}

/* A plan, built, acked and broadcast at once. */
static void finish_plan(run *r) {
  while (r->plan_todo) {
    r->plan_todo = 0;
    r->plans++;
    char id[SCHED_PLAN_ID_MAX];
    snprintf(id, sizeof id, "%s", r->plan_id);
    uint32_t parts[NW + 2];
    size_t n = r->nparts;
    memcpy(parts, r->parts, n * sizeof *parts);
    call(r, sched_plan_built(r->s, r->now, id, 42, NULL), "built");
    /* A millisecond or two apart: the participants' deadlines do not all tie. */
    for (size_t i = 0; i < n; i++) {
      r->now += (int64_t)(rnd(r) % 3);
      call(r, sched_plan_acked(r->s, r->now, parts[i], id, 42, NULL), "ack");
    }
    sched_bcast_report rep = {.total_seconds = 0.1, .wire_bytes = 1000, .weights_checksum = 7};
    for (size_t i = 0; i < n; i++) {
      r->now += (int64_t)(rnd(r) % 3);
      call(r, sched_broadcast_done(r->s, r->now, parts[i], id, NULL, parts[i] == TRAINER ? &rep : NULL),
           "broadcast done");
      if (parts[i] != TRAINER) r->held[parts[i]] = r->plan_version;
    }
  }
}

/* The deadline a scan finds: every live worker's heartbeat, every request
 * in flight not yet overdue. */
static int64_t scan_deadline(run *r) {
  int64_t d = SCHED_NEVER;
  size_t n = sched_worker_count(r->s);
  for (size_t i = 0; i < n; i++) {
    sched_worker_info w;
    sched_get_worker_at(r->s, i, &w);
    if (w.state != SCHED_WORKER_LOST && w.last_seen_ms + HB_MS < d) d = w.last_seen_ms + HB_MS;
  }
  for (size_t i = 0; r->rt && i < r->nq; i++)
    if (!r->q[i].overdue && r->q[i].sent + r->rt < d) d = r->q[i].sent + r->rt;
  return d;
}

static void register_worker(run *r, uint32_t id) {
  sched_caps caps = {.cuda_devices = 1, .nccl = 1, .max_concurrent_requests = r->cap[id]};
  char name[32];
  snprintf(name, sizeof name, "inf-%u", id);
  call(r, sched_worker_registered(r->s, r->now, id, SCHED_ROLE_INFERENCE, name, &caps, NULL, r->held[id]),
       "register");
  call(r, sched_worker_attached(r->s, r->now, id), "attach");
  finish_plan(r);
}

/* The shell's timer: a tick once the deadline is due. */
static void tick_if_due(run *r) {
  if (sched_next_deadline(r->s) > r->now) return;
  for (size_t i = 0; i < r->nq; i++)
    if (r->rt && r->now - r->q[i].sent >= r->rt) r->q[i].overdue = 1;
  call(r, sched_tick(r->s, r->now), "tick");
  finish_plan(r);
}

static void random_event(run *r) {
  /* Time moves at nearly every event, so that deadlines seldom tie. */
  r->now += (int64_t)(rnd(r) % 30);
  tick_if_due(r);
  uint32_t id = 2 + (uint32_t)(rnd(r) % NW);
  sched_worker_info w;
  int known = sched_get_worker(r->s, id, &w) == SCHED_OK;
  int live = known && w.state != SCHED_WORKER_LOST;
  switch (rnd(r) % 10) {
  case 0: /* a longer pause */
    r->now += (int64_t)(rnd(r) % 400);
    tick_if_due(r);
    break;
  case 1:
  case 2: /* heartbeats; a fifth of the workers, another fifth every 7 s, fall silent */
    if (live && (id + (uint64_t)r->now / 7000) % 5 != 0)
      call(r, sched_worker_heartbeat(r->s, r->now, id, r->held[id]), "heartbeat");
    break;
  case 3:
  case 4:
  case 5: { /* an answer, to any request in flight */
    if (!r->nq) break;
    req q = r->q[rnd(r) % r->nq];
    sched_rollout ro[2];
    for (int k = 0; k < 2; k++)
      ro[k] = (sched_rollout){.id = ++r->next_rollout, .policy_version = q.version, .tokens = 3,
                              .group_id = q.group};
    drop_req(r, find_req(r, q.id));
    r->buffered += 2; /* before the call: a batch may form in it */
    call(r, sched_rollouts_done(r->s, r->now, q.worker, q.id, ro, 2), "rollouts");
    break;
  }
  case 6: /* the trainer reports its step */
    if (r->train_pending) {
      r->train_pending = 0;
      call(r, sched_step_done(r->s, r->now, TRAINER, r->train_step, 0.5, &ALL_GPU), "step done");
      finish_plan(r);
    }
    break;
  case 7: /* a worker lost; or back again, holding what it held (a catch-up follows) */
    if (live && rnd(r) % 3 == 0) call(r, sched_worker_lost(r->s, r->now, id, "gone"), "lost");
    else if (known && !live) register_worker(r, id);
    break;
  case 8: /* a lost worker forgotten */
    if (known && !live && rnd(r) % 2) call(r, sched_worker_forget(r->s, r->now, id), "forget");
    else if (!known) register_worker(r, id);
    break;
  default: /* the trainer stays alive */
    call(r, sched_worker_heartbeat(r->s, r->now, TRAINER, 0), "trainer heartbeat");
  }
  finish_plan(r);
}

static void check_state(run *r) {
  sched_run_info ri;
  sched_get_run(r->s, &ri);
  cr_assert(ri.state == SCHED_RUN_RUNNING || ri.state == SCHED_RUN_PENDING,
            "t=%" PRId64 ": the run goes on: %s", r->now, ri.message);
  cr_assert_eq(sched_next_deadline(r->s), scan_deadline(r), "t=%" PRId64 ": next deadline %" PRId64 ", a scan finds %" PRId64, r->now, sched_next_deadline(r->s), scan_deadline(r));
  sched_counters c;
  sched_get_counters(r->s, &c);
  cr_assert_eq(c.requests_in_flight, r->nq, "t=%" PRId64 ": requests in flight", r->now);
  cr_assert_eq(c.rollouts_buffered + c.rollouts_dropped_stale, r->buffered,
               "t=%" PRId64 ": rollouts buffered", r->now);
  for (size_t i = 0; i < r->nq; i++) {
    sched_worker_info w;
    cr_assert_eq(sched_get_worker(r->s, r->q[i].worker, &w), SCHED_OK);
    cr_assert_neq(w.state, SCHED_WORKER_LOST, "a lost worker has nothing in flight");
  }
}

static uint64_t lost_count(run *r) {
  sched_counters c;
  sched_get_counters(r->s, &c);
  return c.groups_requeued;
}

static void one_run(uint64_t seed, uint32_t async, int64_t request_timeout_ms) {
  run *r = calloc(1, sizeof *r);
  r->rt = request_timeout_ms;
  r->rng = seed * 0x9e3779b97f4a7c15ull + 1;
  r->now = 1000;
  sched_settings c;
  sched_settings_default(&c);
  snprintf(c.run_id, sizeof c.run_id, "scale");
  c.group_size = 2;
  c.rollouts_per_step = 16;
  c.max_async_level = async;
  c.max_outstanding = 3;
  c.max_buffered = 4096;
  c.heartbeat_timeout_ms = HB_MS;
  c.request_timeout_ms = request_timeout_ms;
  char err[256];
  cr_assert_eq(sched_new(&c, &r->s, err, sizeof err), SCHED_OK, "%s", err);
  call(r, sched_worker_registered(r->s, r->now, TRAINER, SCHED_ROLE_TRAINER, "trainer",
                                   &(sched_caps){.cuda_devices = 1, .nccl = 1}, &ALL_GPU, 0),
       "trainer");
  call(r, sched_worker_attached(r->s, r->now, TRAINER), "trainer attach");
  /* Shuffled ids: registration inserts into the middle of the worker table. */
  uint32_t order[NW];
  for (uint32_t i = 0; i < NW; i++) order[i] = 2 + i;
  for (uint32_t i = NW - 1; i > 0; i--) {
    uint32_t j = (uint32_t)(rnd(r) % (i + 1)), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  for (uint32_t i = 0; i < NW; i++) {
    r->cap[order[i]] = (uint32_t)(rnd(r) % 4); /* 0: the run's K */
    if (i % 3 == 0) register_worker(r, order[i]);
  }
  for (int ev = 0; ev < 6000; ev++) {
    random_event(r);
    check_state(r);
  }
  sched_run_info ri;
  sched_get_run(r->s, &ri);
  cr_assert_eq(ri.state, SCHED_RUN_RUNNING, "the run went on: %s", ri.message);
  cr_assert_gt(r->dispatches, 500, "seed %" PRIu64 ": dispatches: %zu", seed, r->dispatches);
  cr_assert_gt(r->plans, 10, "seed %" PRIu64 ": steps and catch-ups were broadcast", seed);
  if (getenv("SCALE_STATS"))
    fprintf(stderr, "seed %" PRIu64 ": %zu dispatches, %zu hedges, %zu plans, %" PRIu64 " lost\n", seed,
            r->dispatches, r->hedges, r->plans, lost_count(r));
  sched_free(r->s);
  free(r);
}

Test(sched_scale, deadlines_and_picks_equal_the_scans_on_policy) {
  for (uint64_t seed = 1; seed <= 6; seed++) one_run(seed, 0, RT_MS);
}

Test(sched_scale, deadlines_and_picks_equal_the_scans_off_policy) {
  for (uint64_t seed = 11; seed <= 16; seed++) one_run(seed, 2, RT_MS);
}

/* Without a request timeout the heartbeats alone make the deadline. */
Test(sched_scale, heartbeat_deadlines_equal_the_scan) {
  for (uint64_t seed = 21; seed <= 26; seed++) one_run(seed, 1, 0);
}
