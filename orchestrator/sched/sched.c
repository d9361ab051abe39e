/* The scheduler core: the state machine behind sched.h.
 *
 * Every event validates its input, changes state, then calls sched__pump(),
 * the one place that decides what happens next (run state, next step, next
 * plan, rollout dispatch). Keeping that decision in one function means an
 * event never has to know which other transitions it enables. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/sched/sched.h"
#include "orchestrator/sched/sched_heap.h"
#include "orchestrator/sched/sched_map.h"

typedef enum {
  SCHED__IDLE = 0,     /* waiting for a batch */
  SCHED__TRAINING,     /* TRAIN sent, waiting for step done */
  SCHED__TRAINED,      /* step done, waiting for participants to plan */
  SCHED__PLANNING,     /* BUILD_PLAN sent, waiting for plan built */
  SCHED__ACKING,       /* plan sent, waiting for every ack */
  SCHED__BROADCASTING  /* triggered, waiting for every broadcast done */
} sched__phase;

typedef struct sched__request {
  uint64_t id;
  uint32_t worker;
  uint32_t count;
  uint64_t group;
  uint64_t version; /* the worker's version at dispatch: the one its rollouts will carry */
  int64_t sent_ms;  /* dispatch time: the request timeout counts from it */
  uint64_t twin;    /* the other request in flight for the same group; 0: none */
  int overdue;      /* out for request_timeout_ms: its group may go to another worker too */
  int dead;         /* answered, cancelled or lost: a slot kept until the array is compacted */
} sched__request;

typedef struct sched__rollout {
  sched_rollout r;
  uint64_t gversion; /* its group's version: the oldest among the group's rollouts */
  uint64_t seq;      /* arrival order: ties between equal versions go oldest first; a
                        group's rollouts arrive together, so their seqs are consecutive */
} sched__rollout;

/* Rollouts counted by version: what dispatch's demand is made of. */
typedef struct sched__tally_entry {
  uint64_t version;
  uint64_t count;
} sched__tally_entry;

/* One entry per version present, none at count 0: a handful, since versions
 * older than the window's are pruned or answered away. */
typedef struct sched__tally {
  sched__tally_entry *e;
  size_t n, cap;
} sched__tally;

/* The inference workers that may be given a group now (sched__has_slot), of
 * one version, by (requests in flight, id): the least loaded is at the top. */
typedef struct sched__candidates {
  uint64_t version;
  sched_heap h;
} sched__candidates;

#define SCHED__NONE UINT32_MAX

/* A worker's place in the list of live workers by last proof of life. */
typedef struct sched__seen_link {
  uint32_t prev, next; /* worker indices, SCHED__NONE at the ends */
  uint32_t in;         /* in the list: live */
} sched__seen_link;

/* A group waiting to be sent again (its worker lost, its report refused). */
typedef struct sched__requeued {
  uint64_t group;
  uint32_t avoid; /* the worker whose report was refused, when has_avoid */
  int has_avoid;
} sched__requeued;

/* A cancelled request: a result still sent for it is expected and harmless. */
typedef struct sched__cancelled {
  uint64_t id;
  uint32_t worker;
} sched__cancelled;

/* Cancelled requests remembered at most: a worker may never answer one it was
 * told to abort, so the list must not grow with the run. One forgotten gets
 * SCHED_ENOENT instead of SCHED_ESTALE for its late result, nothing worse. */
#define SCHED__CANCELLED_MAX 4096

/* The step in progress and its plan. */
typedef struct sched__step {
  sched__phase phase;
  int catchup;                 /* the plan pending is a catch-up: no step is trained */
  uint32_t attempt;            /* plans built for this step, over all its batches: a step
                                  redone after its trainer was lost, or adopted again,
                                  must not name a plan as an earlier one (an agent may
                                  have been told to abort that name) */
  int64_t start_ms;            /* TRAIN sent */
  double train_seconds;
  uint64_t *batch;             /* rollouts_per_step ids */
  uint32_t nbatch;
  uint64_t batch_tokens;
  char plan_id[SCHED_PLAN_ID_MAX];
  sched_mode mode;
  char reason[SCHED_TEXT_MAX];
  uint64_t hash;
  uint32_t *parts;             /* worker ids by rank */
  uint8_t *acked, *done;       /* per rank */
  size_t nparts, nacked, ndone, parts_cap;
  int64_t deadline_ms;
  uint32_t nsrc;               /* sources: the trainer ranks, ranks 0..nsrc-1 */
  sched_bcast_report *src;     /* per source: its figures (source_checksums dropped) */
  size_t src_cap;
  uint64_t *rx_sums;           /* per receiver (rank - nsrc), nsrc checksums each; 0: none */
  size_t rx_cap;
  /* Receiver views (sched_plan_views): nviews 0, or each receiver's view
   * (SCHED_VIEW_WHOLE: every tensor whole) and each source's checksum of
   * what each view gets from it (nsrc x nviews; 0: not reported). */
  uint32_t nviews;
  uint32_t *rx_view;
  size_t rx_view_cap;
  uint64_t *src_view_sums;
  size_t src_view_cap;
  uint32_t ntrained;           /* ranks that reported the step training done */
  int failing;                 /* a participant reported a broadcast error */
  int64_t failing_since;       /* when the first one came */
  char fail_msg[SCHED_TEXT_MAX];
  /* This plan's bounds: the shell's cost model (sched_plan_limits), else the run's. */
  int64_t ack_timeout_ms, broadcast_timeout_ms;
  char expected[SCHED_TEXT_MAX / 2];
} sched__step;

/* A participant's broadcast error is often only the echo of another one's
 * death or hang (its connection reset, its socket stalled), reported before
 * the dead worker's stream is seen closing or the hung one's heartbeats are
 * missed. The run fails only once every participant has been heard from
 * since the error, and this long at least; a participant that stays silent
 * is lost within heartbeat_timeout_ms, which re-plans the step without it,
 * as for any lost worker. */
#define SCHED__PEER_GRACE_MS 3000

struct sched {
  sched_settings cfg;
  uint32_t max_buffered;
  sched_run_state state;
  char message[SCHED_TEXT_MAX];
  sched_mode policy;
  uint64_t steps_done;
  uint64_t dropped_since_commit;
  sched_counters c;
  char err[2 * SCHED_TEXT_MAX];

  sched_worker_info *workers;  /* sorted by id */
  size_t nworkers, workers_cap;
  sched_map worker_index;      /* id -> index in workers */

  sched__request *reqs;        /* sorted by id (ids only grow), dead slots included */
  size_t nreqs, reqs_cap;      /* slots */
  size_t nlive;                /* requests in flight: slots not dead */
  uint64_t next_request_id;
  uint64_t next_group_id;
  sched__requeued *requeue;    /* groups to send again, oldest first; room reserved at
                                  dispatch, so a loss or refusal never allocates */
  size_t nrequeue, requeue_cap;
  sched__cancelled *cancelled; /* SCHED__CANCELLED_MAX, oldest first */
  size_t ncancelled;

  sched__rollout *pool;        /* arrival order */
  size_t npool, pool_cap;
  sched_map pool_ids;          /* the ids in pool: a result's duplicates found in O(1) */
  sched__tally pool_tally;     /* pool by group version */
  sched__tally req_tally;      /* requests in flight by version, each its count */
  uint64_t next_seq;
  sched__rollout *scratch;     /* batch selection */
  uint64_t *demand;            /* dispatch: rollouts per last usable step, window_len */
  uint64_t *fill;              /* dispatch: room by deadline index, window_len */
  uint32_t window_len;         /* steps one rollout may serve at most: async bound + 1 */

  sched__step st;
  uint64_t id_base;            /* first request and group id of this scheduler (resume K:
                                  K * 2^40 + 1): lower ones were sent before a restart */
  int resume_pending;          /* resumed, and no plan has committed since: no inference
                                  worker is trusted to hold the published version */
  uint64_t catchup_step;       /* the step catchup_seq counts catch-ups at */
  uint32_t catchup_seq;        /* catch-ups started at that step: their plan ids */
  int dispatch_held;           /* sched_hold_dispatch */
  int64_t last_now;            /* latest event time: the clock must not go back */
  sched_participant *pscratch; /* sched_choose_mode input */
  size_t pscratch_cap;

  /* Indexes kept with every change, so that no event scans every worker or
   * request: a step with N workers costs O(N log N), not O(N^2). */
  /* The live workers, least recently seen first: a proof of life carries the
   * latest time (the clock never goes back), so it moves its worker to the
   * tail in O(1), and the head times out first. Links are indices into the
   * worker array, kept beside it; a small array, so a heartbeat touches
   * little memory. */
  sched__seen_link *seen;      /* workers_cap of them, by worker index */
  size_t seen_cap;
  uint32_t seen_head, seen_tail; /* SCHED__NONE: empty */
  sched_heap timers;           /* requests in flight not yet overdue by sent_ms
                                  (request_timeout_ms > 0): the next request timeout */
  sched__candidates *cands;    /* dispatch candidates by version; empty ones kept for reuse */
  size_t ncands, cands_cap;
  uint32_t *expired;           /* sched_tick: the workers whose heartbeat timed out */
  size_t expired_cap;
  uint32_t inf_attached;       /* attached inference workers */
  uint32_t inf_unsynced;       /* attached inference workers not synced */
  int index_oom;               /* an index could not grow: the run fails at the next pump */
  /* The trainer group's counts, recomputed after a rank changed state or
   * version (g_valid 0); ranks, not pointers: the worker array moves. */
  int g_valid;
  uint32_t g_live, g_attached;
  int64_t g_ahead, g_behind;   /* first rank holding the next version, the published one; -1 none */

  /* The trainer group: the live trainers, by rank (see "Trainer groups"). */
  uint32_t group_n;            /* its size; 0: no live trainer */
  uint32_t rank_worker[SCHED_MAX_TRAINER_RANKS]; /* worker id of rank r, when rank_live */
  uint8_t rank_live[SCHED_MAX_TRAINER_RANKS];
  uint8_t rank_trained[SCHED_MAX_TRAINER_RANKS]; /* reported the step training */
  double rank_seconds[SCHED_MAX_TRAINER_RANKS];  /* its last step done's train_seconds */
  uint64_t rank_sum[SCHED_MAX_TRAINER_RANKS];    /* its last step done's shard checksum */
  int mixed;                   /* whole, idle, and some ranks hold the next version */
  int64_t mixed_since;         /* since when */

  sched_action *acts;          /* pending actions */
  size_t *act_off;             /* arena offset per action (a32 or a64) */
  size_t *act_rec;             /* index in recs per action (COMMIT, CAUGHT_UP) */
  size_t act_rec_cap;
  size_t off_cap;
  size_t nacts, acts_cap;
  uint32_t *a32;               /* participant lists of actions */
  size_t n32, cap32;
  uint64_t *a64;               /* rollout ids of actions */
  size_t n64, cap64;
  sched_step_record *recs;     /* records of COMMIT actions */
  size_t nrecs, recs_cap;
};

static void sched__plan_timeout(sched *s);
static int sched__failing_due(sched *s, int64_t now);

/* ---- small helpers ---------------------------------------------------------------- */

static void sched__errorf(sched *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sched__errorf(sched *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->err, sizeof s->err, fmt, ap);
  va_end(ap);
}

/* Records the message and yields `code`. A macro, so that static analysis
 * (which does not follow variadic calls) sees the code it returns. */
#define sched__fail_arg(s, code, ...)                                                              \
  __extension__({                                                                                  \
    int sched__code_ = (code);                                                                     \
    sched__errorf((s), __VA_ARGS__);                                                               \
    sched__code_;                                                                                  \
  })

/* Grows the array `*pp` (a pointer to any element pointer, elements of size
 * `sz`) to hold at least `need` elements. memcpy keeps this free of type punning. */
static int sched__grow(void *pp, size_t *cap, size_t need, size_t sz) {
  if (need <= *cap) return 0;
  size_t ncap = *cap ? *cap : 16;
  while (ncap < need) ncap *= 2;
  void *p;
  memcpy(&p, pp, sizeof p);
  void *np = realloc(p, ncap * sz);
  if (!np) return SCHED_ENOMEM;
  memcpy(pp, &np, sizeof np);
  *cap = ncap;
  return 0;
}

static int sched__live(const sched_worker_info *w) { return w->state != SCHED_WORKER_LOST; }
static int sched__attached(const sched_worker_info *w) {
  return w->state == SCHED_WORKER_READY || w->state == SCHED_WORKER_BUSY;
}
static int sched__terminal(const sched *s) {
  return s->state == SCHED_RUN_STOPPED || s->state == SCHED_RUN_SUCCEEDED ||
         s->state == SCHED_RUN_FAILED;
}
static int sched__plan_pending(const sched *s) {
  return s->st.phase >= SCHED__PLANNING;
}

static size_t sched__lower(const sched *s, uint32_t id) {
  size_t lo = 0, hi = s->nworkers;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (s->workers[mid].id < id) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* By the id index: every event looks its worker up, and a binary search
 * over thousands of workers misses the cache at every step. */
static sched_worker_info *sched__worker(sched *s, uint32_t id) {
  const uint32_t *i = sched_map_get(&s->worker_index, id);
  return i ? &s->workers[*i] : NULL;
}

/* Workers from `from` on moved in the array: their index entries follow
 * (room reserved; only an id out of order or a forget moves any). */
static void sched__reindex_workers(sched *s, size_t from) {
  for (size_t i = from; i < s->nworkers; i++)
    if (sched_map_put(&s->worker_index, s->workers[i].id, (uint32_t)i)) s->index_oom = 1;
}

static const char *sched__name(sched *s, uint32_t id) {
  sched_worker_info *w = sched__worker(s, id);
  return w ? w->name : "?";
}

/* ---- indexes ------------------------------------------------------------------------ */

/* Requests worker `w` may have in flight: K, or less if it says so. */
static uint32_t sched__cap(const sched *s, const sched_worker_info *w) {
  uint32_t k = s->cfg.max_outstanding, m = w->caps.max_concurrent_requests;
  return m && m < k ? m : k;
}

/* Only a synced worker is given rollouts to make: one that may hold another
 * version waits for its catch-up. */
static int sched__has_slot(const sched *s, const sched_worker_info *w) {
  return w->role == SCHED_ROLE_INFERENCE && sched__attached(w) && w->synced &&
         w->outstanding < sched__cap(s, w);
}

/* Dispatch's order: least loaded first, then lowest id (unique, so no ties). */
static int64_t sched__load_key(const sched_worker_info *w) {
  return (int64_t)(((uint64_t)w->outstanding << 32) | w->id);
}

/* The candidates of `version`; with `create`, made (or an empty one reused)
 * when missing. NULL when missing, or out of memory. */
static sched_heap *sched__cands_of(sched *s, uint64_t version, int create) {
  sched__candidates *spare = NULL;
  for (size_t i = 0; i < s->ncands; i++) {
    if (s->cands[i].version == version) return &s->cands[i].h;
    if (!spare && sched_heap_size(&s->cands[i].h) == 0) spare = &s->cands[i];
  }
  if (!create) return NULL;
  if (!spare) {
    if (sched__grow(&s->cands, &s->cands_cap, s->ncands + 1, sizeof *s->cands)) return NULL;
    spare = &s->cands[s->ncands++];
    sched_heap_init(&spare->h);
  }
  spare->version = version;
  return &spare->h;
}

/* Adds (sign +1) or removes (-1) worker `w` as it stands to or from the
 * counts and candidates. Every change to what they depend on (state,
 * synced, policy_version, outstanding) is made between a -1 and a +1. */
static void sched__track(sched *s, const sched_worker_info *w, int sign) {
  if (w->role != SCHED_ROLE_INFERENCE || !sched__attached(w)) return;
  s->inf_attached += (uint32_t)sign;
  if (!w->synced) s->inf_unsynced += (uint32_t)sign;
  if (!sched__has_slot(s, w)) return;
  sched_heap *h = sched__cands_of(s, w->policy_version, sign > 0);
  if (sign < 0) {
    if (h) sched_heap_del(h, w->id);
  } else if (!h || sched_heap_set(h, w->id, sched__load_key(w))) {
    s->index_oom = 1;
  }
}

static void sched__seen_unlink(sched *s, uint32_t k) {
  sched__seen_link *l = &s->seen[k];
  if (!l->in) return;
  if (l->prev != SCHED__NONE) s->seen[l->prev].next = l->next;
  else s->seen_head = l->next;
  if (l->next != SCHED__NONE) s->seen[l->next].prev = l->prev;
  else s->seen_tail = l->prev;
  *l = (sched__seen_link){SCHED__NONE, SCHED__NONE, 0};
}

/* Worker `w` was heard from at `now`, the latest time yet: to the tail. */
static void sched__seen(sched *s, sched_worker_info *w, int64_t now) {
  uint32_t k = (uint32_t)(w - s->workers);
  w->last_seen_ms = now;
  if (s->seen[k].in && s->seen_tail == k) return;
  sched__seen_unlink(s, k);
  s->seen[k] = (sched__seen_link){s->seen_tail, SCHED__NONE, 1};
  if (s->seen_tail != SCHED__NONE) s->seen[s->seen_tail].next = k;
  else s->seen_head = k;
  s->seen_tail = k;
}

/* The worker array moved by `by` (+1: opened at index `at`; -1: closed
 * there): the links follow. O(workers), as the move itself. */
static void sched__seen_shift(sched *s, uint32_t at, int by) {
  size_t n = s->nworkers; /* after the move */
  if (by > 0 && at + 1 == n) { /* appended: nothing moved */
    s->seen[at] = (sched__seen_link){SCHED__NONE, SCHED__NONE, 0};
    return;
  }
  if (by > 0) memmove(&s->seen[at + 1], &s->seen[at], (n - 1 - at) * sizeof *s->seen);
  else memmove(&s->seen[at], &s->seen[at + 1], (n - at) * sizeof *s->seen);
#define SCHED__FIX(x) \
  if ((x) != SCHED__NONE && (x) >= at) (x) = (uint32_t)((int64_t)(x) + by)
  for (size_t i = 0; i < n; i++) {
    SCHED__FIX(s->seen[i].prev);
    SCHED__FIX(s->seen[i].next);
  }
  SCHED__FIX(s->seen_head);
  SCHED__FIX(s->seen_tail);
#undef SCHED__FIX
  if (by > 0) s->seen[at] = (sched__seen_link){SCHED__NONE, SCHED__NONE, 0};
}

/* Adds `delta` rollouts of `version`. Room for a new version is reserved by
 * the caller (sched__tally_reserve) wherever failing is not allowed. */
static int sched__tally_add(sched__tally *t, uint64_t version, int64_t delta) {
  for (size_t i = 0; i < t->n; i++) {
    if (t->e[i].version != version) continue;
    t->e[i].count += (uint64_t)delta;
    if (t->e[i].count == 0) t->e[i] = t->e[--t->n];
    return 0;
  }
  if (delta <= 0) return 0; /* nothing of it was counted */
  if (sched__grow(&t->e, &t->cap, t->n + 1, sizeof *t->e)) return SCHED_ENOMEM;
  t->e[t->n++] = (sched__tally_entry){.version = version, .count = (uint64_t)delta};
  return 0;
}

static int sched__tally_reserve(sched__tally *t) {
  return sched__grow(&t->e, &t->cap, t->n + 1, sizeof *t->e);
}

/* The trainer group's counts and disagreement, from the ranks as they stand. */
static void sched__group_cache(sched *s);

/* ---- the trainer group ------------------------------------------------------------- */

static uint32_t sched__ranks_of(const sched_caps *c) {
  return c && c->trainer_ranks ? c->trainer_ranks : 1;
}

/* The live trainer of rank `r`, if any (attached or not). */
static sched_worker_info *sched__rank(sched *s, uint32_t r) {
  return r < s->group_n && s->rank_live[r] ? sched__worker(s, s->rank_worker[r]) : NULL;
}

/* Rebuilds the group from the live trainers (registration keeps them one
 * group: one size, one trainer per rank). */
static void sched__group_scan(sched *s) {
  s->g_valid = 0;
  memset(s->rank_live, 0, s->group_n);
  s->group_n = 0;
  for (size_t i = 0; i < s->nworkers; i++) {
    const sched_worker_info *w = &s->workers[i];
    if (w->role != SCHED_ROLE_TRAINER || !sched__live(w)) continue;
    s->group_n = w->caps.trainer_ranks;
    s->rank_live[w->caps.trainer_rank] = 1;
    s->rank_worker[w->caps.trainer_rank] = w->id;
  }
}

static void sched__group_cache(sched *s) {
  if (s->g_valid) return;
  s->g_live = s->g_attached = 0;
  s->g_ahead = s->g_behind = -1;
  for (uint32_t r = 0; r < s->group_n; r++) {
    const sched_worker_info *w = sched__rank(s, r);
    if (!w) continue;
    s->g_live++;
    if (sched__attached(w)) s->g_attached++;
    int64_t *slot = w->policy_version > s->steps_done ? &s->g_ahead : &s->g_behind;
    if (*slot < 0) *slot = r;
  }
  s->g_valid = 1;
}

/* Ranks live (attached too, when `attached`). */
static uint32_t sched__ranks_count(sched *s, int attached) {
  sched__group_cache(s);
  return attached ? s->g_attached : s->g_live;
}

static int sched__group_ready(sched *s) {
  return s->group_n > 0 && sched__ranks_count(s, 1) == s->group_n;
}

/* "trainer NAME" for a lone trainer, "trainer rank R (NAME)" in a group. */
static const char *sched__who(const sched_worker_info *t, char *buf, size_t len) {
  if (t->caps.trainer_ranks > 1)
    snprintf(buf, len, "trainer rank %" PRIu32 " (%s)", t->caps.trainer_rank, t->name);
  else
    snprintf(buf, len, "trainer %s", t->name);
  return buf;
}

/* Lists the ranks not attached ("rank 1", "ranks 1, 3", "ranks 0, 1, 2, 3
 * and 5 more") into `buf`. */
static void sched__missing_ranks(sched *s, char *buf, size_t len) {
  uint32_t missing = s->group_n - sched__ranks_count(s, 1), listed = 0;
  size_t used = (size_t)snprintf(buf, len, "%s", missing == 1 ? "rank" : "ranks");
  for (uint32_t r = 0; r < s->group_n && used < len; r++) {
    const sched_worker_info *w = sched__rank(s, r);
    if (w && sched__attached(w)) continue;
    if (listed == 4) {
      snprintf(buf + used, len - used, " and %" PRIu32 " more", missing - listed);
      return;
    }
    used += (size_t)snprintf(buf + used, len - used, "%s%" PRIu32, listed ? ", " : " ", r);
    listed++;
  }
}

/* The offload summary of the group's manifests, summed over its ranks. */
static void sched__group_offload(sched *s, sched_offload *out) {
  memset(out, 0, sizeof *out);
  for (uint32_t r = 0; r < s->group_n; r++) {
    const sched_worker_info *w = sched__rank(s, r);
    if (!w) continue;
    out->gpu_tensors += w->offload.gpu_tensors;
    out->pinned_tensors += w->offload.pinned_tensors;
    out->pageable_tensors += w->offload.pageable_tensors;
    out->gpu_bytes += w->offload.gpu_bytes;
    out->pinned_bytes += w->offload.pinned_bytes;
    out->pageable_bytes += w->offload.pageable_bytes;
  }
}

/* ---- actions ------------------------------------------------------------------------ */

static sched_action *sched__act(sched *s, sched_action_kind kind) {
  if (sched__grow(&s->acts, &s->acts_cap, s->nacts + 1, sizeof *s->acts)) return NULL;
  if (sched__grow(&s->act_rec, &s->act_rec_cap, s->nacts + 1, sizeof *s->act_rec)) return NULL;
  if (sched__grow(&s->act_off, &s->off_cap, s->nacts + 1, sizeof *s->act_off)) return NULL;
  sched_action *a = &s->acts[s->nacts];
  memset(a, 0, sizeof *a);
  a->kind = kind;
  s->act_off[s->nacts] = 0;
  s->act_rec[s->nacts] = 0;
  s->nacts++;
  return a;
}

/* Attaches the current plan's participant list (the live ones) to action `a`. */
static void sched__act_parts(sched *s, sched_action *a) {
  size_t n = 0;
  if (sched__grow(&s->a32, &s->cap32, s->n32 + s->st.nparts, sizeof *s->a32)) return;
  size_t off = s->n32;
  a->trainer_ranks = 0;
  for (size_t i = 0; i < s->st.nparts; i++) {
    sched_worker_info *w = sched__worker(s, s->st.parts[i]);
    /* Lost workers cannot receive anything; telling the shell to send to them is noise. */
    if (a->kind == SCHED_ACT_ABORT && (!w || !sched__live(w))) continue;
    s->a32[off + n++] = s->st.parts[i];
    if (i < s->st.nsrc) a->trainer_ranks++;
  }
  s->n32 += n;
  a->nparticipants = n;
  s->act_off[a - s->acts] = off;
}

static void sched__emit_worker(sched *s, const sched_worker_info *w, const char *why) {
  sched_action *a = sched__act(s, SCHED_ACT_WORKER_STATE);
  if (!a) return;
  a->worker = w->id;
  a->worker_state = w->state;
  snprintf(a->text, sizeof a->text, "%s", why ? why : "");
}

static void sched__set_worker_state(sched *s, sched_worker_info *w, sched_worker_state st,
                                    const char *why) {
  if (w->state == st) return;
  sched__track(s, w, -1);
  w->state = st;
  sched__track(s, w, +1);
  if (w->role == SCHED_ROLE_TRAINER) s->g_valid = 0;
  sched__emit_worker(s, w, why);
}

static void sched__set_run_state(sched *s, sched_run_state st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void sched__set_run_state(sched *s, sched_run_state st, const char *fmt, ...) {
  char msg[SCHED_TEXT_MAX]; /* the arguments may point at s->message itself */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  memcpy(s->message, msg, sizeof msg);
  if (s->state == st) return;
  s->state = st;
  sched_action *a = sched__act(s, SCHED_ACT_RUN_STATE);
  if (!a) return;
  a->run_state = st;
  snprintf(a->text, sizeof a->text, "%s", s->message);
}

/* ---- plan abort and run failure ------------------------------------------------------- */

/* Aborts the pending plan, if any; the trained weights stay with the trainer,
  * so the step goes back to TRAINED and may be planned again. An aborted
 * catch-up goes back to idle: the pump decides again whom to catch up. */
static void sched__abort_plan(sched *s, sched_abort_reason why, const char *reason) {
  if (!sched__plan_pending(s)) return;
  sched_action *a = sched__act(s, SCHED_ACT_ABORT);
  if (a) {
    a->step = s->steps_done;
    a->catchup = s->st.catchup;
    snprintf(a->plan_id, sizeof a->plan_id, "%s", s->st.plan_id);
    snprintf(a->text, sizeof a->text, "%s", reason);
    a->abort_reason = why;
    sched__act_parts(s, a);
  }
  s->c.aborts++;
  if (why > 0 && why < SCHED_ABORT_COUNT) s->c.aborts_by_reason[why]++;
  s->st.phase = s->st.catchup ? SCHED__IDLE : SCHED__TRAINED;
  s->st.catchup = 0;
  s->st.deadline_ms = SCHED_NEVER;
}

static void sched__fail_run(sched *s, sched_abort_reason why, const char *msg) {
  sched__abort_plan(s, why, msg);
  sched__set_run_state(s, SCHED_RUN_FAILED, "%s", msg);
}

/* ---- rollouts: requests, pool, batch ---------------------------------------------------- */

static size_t sched__req_find(const sched *s, uint64_t id) {
  size_t lo = 0, hi = s->nreqs;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (s->reqs[mid].id < id) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Index of request `id` in flight, or s->nreqs. */
static size_t sched__req_index(const sched *s, uint64_t id) {
  size_t i = sched__req_find(s, id);
  return i < s->nreqs && s->reqs[i].id == id && !s->reqs[i].dead ? i : s->nreqs;
}

/* Drops the dead slots once they outnumber the live ones: a removal costs
 * O(1) amortised instead of a move of every later request. Indices into
 * s->reqs do not survive a removal. */
static void sched__req_compact(sched *s) {
  if (s->nreqs - s->nlive <= s->nlive || s->nreqs < 64) return;
  size_t j = 0;
  for (size_t i = 0; i < s->nreqs; i++)
    if (!s->reqs[i].dead) s->reqs[j++] = s->reqs[i];
  s->nreqs = j;
}

/* Request q leaves the flight: its counts and its timer go with it. */
static void sched__req_forget(sched *s, const sched__request *q) {
  s->c.rollouts_requested -= q->count;
  sched__tally_add(&s->req_tally, q->version, -(int64_t)q->count);
  sched_heap_del(&s->timers, q->id);
}

/* The other request of q's group no longer has q beside it. */
static void sched__unlink_twin(sched *s, const sched__request *q) {
  if (!q->twin) return;
  size_t t = sched__req_index(s, q->twin);
  if (t < s->nreqs) s->reqs[t].twin = 0;
}

static void sched__req_remove(sched *s, size_t i) {
  sched_worker_info *w = sched__worker(s, s->reqs[i].worker);
  sched__req_forget(s, &s->reqs[i]);
  sched__unlink_twin(s, &s->reqs[i]);
  s->reqs[i].dead = 1;
  s->nlive--;
  sched__req_compact(s);
  if (w && w->outstanding > 0) {
    sched__track(s, w, -1);
    w->outstanding--;
    sched__track(s, w, +1);
    if (w->outstanding == 0 && w->state == SCHED_WORKER_BUSY)
      sched__set_worker_state(s, w, SCHED_WORKER_READY, "no rollout request in flight");
  }
}

/* Puts `group` in the re-send queue. The room was reserved when its request
 * was dispatched (sched__send), so this cannot fail. */
static void sched__requeue(sched *s, uint64_t group, const uint32_t *avoid) {
  s->requeue[s->nrequeue++] =
      (sched__requeued){.group = group, .avoid = avoid ? *avoid : 0, .has_avoid = avoid != NULL};
  s->c.groups_requeued++;
}

/* Remembers a cancelled request, forgetting the oldest half when full (one
 * move per SCHED__CANCELLED_MAX / 2 cancels). */
static void sched__remember_cancelled(sched *s, uint64_t id, uint32_t worker) {
  if (s->ncancelled == SCHED__CANCELLED_MAX) {
    size_t keep = SCHED__CANCELLED_MAX / 2;
    memmove(s->cancelled, s->cancelled + (s->ncancelled - keep), keep * sizeof *s->cancelled);
    s->ncancelled = keep;
  }
  s->cancelled[s->ncancelled++] = (sched__cancelled){.id = id, .worker = worker};
}

/* Index of cancelled request `id`, or s->ncancelled. Linear: only a result
 * for no request in flight looks here. */
static size_t sched__cancelled_index(const sched *s, uint64_t id) {
  for (size_t i = 0; i < s->ncancelled; i++)
    if (s->cancelled[i].id == id) return i;
  return s->ncancelled;
}

static void sched__cancelled_remove(sched *s, size_t i) {
  memmove(&s->cancelled[i], &s->cancelled[i + 1], (s->ncancelled - i - 1) * sizeof *s->cancelled);
  s->ncancelled--;
}

/* Cancels request i (its group was answered by request `by`): the worker is
 * told, its slot is free at once, and a late result for it is stale. */
static void sched__cancel(sched *s, size_t i, uint64_t by, const char *by_worker) {
  const sched__request *q = &s->reqs[i];
  sched_action *a = sched__act(s, SCHED_ACT_CANCEL);
  if (a) {
    a->worker = q->worker;
    a->request_id = q->id;
    a->group_id = q->group;
    snprintf(a->text, sizeof a->text, "group %" PRIu64 " answered by request %" PRIu64 " on %s",
             q->group, by, by_worker);
  }
  sched__remember_cancelled(s, q->id, q->worker);
  s->c.requests_cancelled++;
  sched__req_remove(s, i);
}

/* Takes every request in flight on worker `id` away (it is lost): a group
 * with no other request in flight is queued to be sent again, oldest
 * request first; one whose other request is on another worker leaves it to
 * that one. Its cancelled requests cannot answer any more. */
static void sched__requeue_worker(sched *s, uint32_t id) {
  size_t j = 0;
  int orphans = 0;
  for (size_t i = 0; i < s->nreqs; i++) {
    const sched__request *q = &s->reqs[i];
    if (q->dead) continue;
    if (q->worker != id) {
      s->reqs[j++] = *q;
      continue;
    }
    sched__req_forget(s, q);
    if (q->twin) orphans = 1;
    else sched__requeue(s, q->group, NULL);
  }
  s->nreqs = s->nlive = j;
  /* The twins of removed requests stand alone now; they may sit before or
   * after theirs, so they are found once the array is whole again. */
  for (size_t i = 0; orphans && i < s->nreqs; i++)
    if (s->reqs[i].twin && sched__req_index(s, s->reqs[i].twin) == s->nreqs) s->reqs[i].twin = 0;
  sched_worker_info *w = sched__worker(s, id);
  if (w) {
    sched__track(s, w, -1);
    w->outstanding = 0;
    sched__track(s, w, +1);
  }
  size_t k = 0;
  for (size_t i = 0; i < s->ncancelled; i++)
    if (s->cancelled[i].worker != id) s->cancelled[k++] = s->cancelled[i];
  s->ncancelled = k;
}

/* Rollout r leaves the pool (batched or stale): its id and its count go. */
static void sched__pool_forget(sched *s, const sched__rollout *r) {
  sched_map_del(&s->pool_ids, r->r.id);
  sched__tally_add(&s->pool_tally, r->gversion, -1);
}

/* Drops buffered groups older than the bound of step `n` (a group's
 * rollouts share its version, so groups go whole): versions only go up, so a
 * group stale for step n is stale for every later step. */
static void sched__prune(sched *s, uint64_t n) {
  int64_t bound = (int64_t)n - (int64_t)s->cfg.max_async_level;
  int any = 0; /* the pump calls this on every event while idle: scan only for a reason */
  for (size_t i = 0; i < s->pool_tally.n; i++)
    if ((int64_t)s->pool_tally.e[i].version < bound) any = 1;
  if (!any) return;
  size_t j = 0;
  for (size_t i = 0; i < s->npool; i++) {
    if ((int64_t)s->pool[i].gversion >= bound) s->pool[j++] = s->pool[i];
    else sched__pool_forget(s, &s->pool[i]);
  }
  uint64_t dropped = s->npool - j;
  s->npool = j;
  s->c.rollouts_dropped_stale += dropped;
  s->dropped_since_commit += dropped;
  s->c.rollouts_buffered = (uint32_t)s->npool;
}

/* (group version, arrival): a group's rollouts share the version and have
 * consecutive seqs, so in this order every group stays in one piece and in
 * report order. */
static int sched__cmp_rollout(const void *a, const void *b) {
  const sched__rollout *x = a, *y = b;
  if (x->gversion != y->gversion) return x->gversion < y->gversion ? -1 : 1;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Moves the rollouts_per_step / group_size oldest valid groups into the
 * step's batch. Every buffered group is whole (group_size rollouts) and
 * rollouts_per_step is a multiple of group_size, so the first
 * rollouts_per_step in (version, arrival) order are whole groups. */
static void sched__take_batch(sched *s, uint64_t n) {
  uint32_t need = s->cfg.rollouts_per_step;
  memcpy(s->scratch, s->pool, s->npool * sizeof *s->pool);
  qsort(s->scratch, s->npool, sizeof *s->scratch, sched__cmp_rollout);
  uint64_t cut_version = s->scratch[need - 1].gversion;
  uint64_t cut_seq = s->scratch[need - 1].seq;
  s->st.nbatch = need;
  s->st.batch_tokens = 0;
  for (uint32_t i = 0; i < need; i++) {
    s->st.batch[i] = s->scratch[i].r.id;
    s->st.batch_tokens += s->scratch[i].r.tokens;
  }
  s->c.async_level = (int64_t)n - (int64_t)s->scratch[0].gversion;
  /* Keep, in arrival order, exactly those after the cut in (version, seq) order. */
  size_t j = 0;
  for (size_t i = 0; i < s->npool; i++) {
    const sched__rollout *r = &s->pool[i];
    int taken = r->gversion < cut_version || (r->gversion == cut_version && r->seq <= cut_seq);
    if (!taken) s->pool[j++] = *r;
    else sched__pool_forget(s, r);
  }
  s->npool = j;
  s->c.rollouts_buffered = (uint32_t)s->npool;
}

static void sched__start_step(sched *s, int64_t now) {
  uint64_t n = s->steps_done;
  sched__prune(s, n);
  if (s->npool < s->cfg.rollouts_per_step) return;
  sched__take_batch(s, n);
  /* One copy of the batch: every rank's TRAIN points at it. */
  int have_ids = !sched__grow(&s->a64, &s->cap64, s->n64 + s->st.nbatch, sizeof *s->a64);
  size_t off = s->n64;
  if (have_ids) {
    memcpy(s->a64 + s->n64, s->st.batch, s->st.nbatch * sizeof *s->a64);
    s->n64 += s->st.nbatch;
  }
  s->st.phase = SCHED__TRAINING;
  s->st.catchup = 0;
  s->st.start_ms = now;
  s->st.ntrained = 0;
  for (uint32_t r = 0; r < s->group_n; r++) {
    sched_worker_info *t = sched__rank(s, r);
    s->rank_trained[r] = 0;
    s->rank_seconds[r] = 0;
    s->rank_sum[r] = 0;
    sched_action *a = sched__act(s, SCHED_ACT_TRAIN);
    if (a) {
      a->worker = t->id;
      a->step = n;
      a->trainer_rank = r;
      a->trainer_ranks = s->group_n;
      a->nrollouts = have_ids ? s->st.nbatch : 0;
      a->ngroups = have_ids ? s->st.nbatch / s->cfg.group_size : 0;
      a->batch_tokens = s->st.batch_tokens;
      s->act_off[a - s->acts] = off;
    }
    sched__set_worker_state(s, t, SCHED_WORKER_BUSY, "training");
  }
}

/* Dispatch asks only for rollouts a batch within the off-policy bound will
 * use. A rollout of version v serves one of the steps first .. v + async
 * (first: the next step still to be batched), so what is buffered and what is
 * in flight is a set of items with deadlines, and each step takes
 * rollouts_per_step of them. Filling the steps earliest deadline first is
 * optimal for such items; a new group of version v is worth asking for only
 * while that filling leaves group_size free slots at or before v + async that
 * no item with a later deadline needs. Whatever is then dropped as stale went
 * stale by being late (a slow or lost worker), never by being surplus.
 *
 * A group with two requests in flight (a re-send of a slow one) is counted
 * twice, each request at its own version. Counting more items never frees a
 * slot, so a duplicate cannot make dispatch ask for too much; it asks for up
 * to one group less until one of the two is answered and the other cancelled.
 * Counting the group once instead would have to guess which of the two
 * versions it will come back with, and the newer guess can be wrong. */
typedef struct sched__window {
  uint64_t first, last; /* steps still to batch that a rollout may serve */
  int open;             /* 0: no step left to serve (run ends, or the bound is past) */
} sched__window;

static sched__window sched__dispatch_window(const sched *s) {
  sched__window w = {0, 0, 0};
  /* A catch-up trains nothing: the next step to batch is still steps_done. */
  w.first = s->steps_done + (s->st.phase == SCHED__IDLE || s->st.catchup ? 0 : 1);
  w.last = w.first + s->window_len - 1;
  if (s->cfg.steps) {
    if (w.first >= s->cfg.steps) return w;
    if (w.last > s->cfg.steps - 1) w.last = s->cfg.steps - 1;
  }
  w.open = 1;
  return w;
}

/* Index of the last step a rollout of `version` may serve, or -1 if none. */
static int64_t sched__deadline(const sched *s, const sched__window *w, uint64_t version) {
  uint64_t end = version + s->cfg.max_async_level;
  if (end < w->first) return -1;
  if (end > w->last) end = w->last;
  return (int64_t)(end - w->first);
}

/* Counts what is buffered or requested by deadline into s->demand. */
static void sched__demand(sched *s, const sched__window *w) {
  size_t len = (size_t)(w->last - w->first + 1);
  memset(s->demand, 0, len * sizeof *s->demand);
  const sched__tally *t[2] = {&s->pool_tally, &s->req_tally};
  for (size_t k = 0; k < 2; k++) {
    for (size_t i = 0; i < t[k]->n; i++) {
      int64_t d = sched__deadline(s, w, t[k]->e[i].version);
      if (d >= 0) s->demand[d] += t[k]->e[i].count;
    }
  }
}

/* Fills s->fill[d] with the rollouts of deadline index d that may still be
 * asked for without displacing anything buffered or in flight: the free
 * slots left by the earliest-deadline-first filling, at the tightest step at
 * or after d. Once per dispatch, so that each worker's room is a look-up. */
static void sched__room(sched *s, const sched__window *w) {
  size_t len = (size_t)(w->last - w->first + 1);
  uint64_t per = s->cfg.rollouts_per_step, cum = 0;
  for (size_t k = 0; k < len; k++) {
    uint64_t cap = per * (k + 1);
    cum += s->demand[k];
    if (cum > cap) cum = cap; /* the excess cannot be used: it will go stale */
    s->fill[k] = cap - cum;   /* free through step k, for now */
  }
  for (size_t k = len - 1; k-- > 0;)
    if (s->fill[k + 1] < s->fill[k]) s->fill[k] = s->fill[k + 1];
}

/* Whether max_buffered leaves room for one more group. */
static int sched__under_cap(const sched *s) {
  return (uint64_t)s->npool + s->c.rollouts_requested + s->cfg.group_size <= s->max_buffered;
}

/* Least loaded attached inference worker with a free slot and room for a
 * whole group at its version (s->fill current); ties: lowest id. Workers may
 * hold different versions (one that attached after the last broadcast holds
 * an older one), so room is per worker. `avoid`, if not NULL, is skipped. */
static sched_worker_info *sched__pick(sched *s, const sched__window *win, const uint32_t *avoid) {
  sched_heap_entry best = {0, 0}, two[2];
  int found = 0;
  for (size_t i = 0; i < s->ncands; i++) {
    int64_t d = sched__deadline(s, win, s->cands[i].version);
    if (d < 0 || s->fill[d] < s->cfg.group_size) continue;
    size_t n = sched_heap_least(&s->cands[i].h, two);
    /* The least, or the one after it when the least is to be avoided. */
    size_t k = n && avoid && two[0].key == *avoid ? 1 : 0;
    if (k < n && (!found || two[k].prio < best.prio)) {
      best = two[k];
      found = 1;
    }
  }
  return found ? sched__worker(s, (uint32_t)best.key) : NULL;
}

/* Sends `group` to worker `w`: a DISPATCH and a request in flight, counted in
 * the demand. Returns the request's index, or -1 when out of memory. */
static int64_t sched__send(sched *s, int64_t now, const sched__window *win, sched_worker_info *w,
                           uint64_t group) {
  uint32_t g = s->cfg.group_size;
  if (sched__grow(&s->reqs, &s->reqs_cap, s->nreqs + 1, sizeof *s->reqs)) return -1;
  /* Every request may come back as a queued group (lost worker, refused
   * report) where nothing can be allowed to fail: room for it now. */
  if (sched__grow(&s->requeue, &s->requeue_cap, s->nreqs + s->nrequeue + 1, sizeof *s->requeue))
    return -1;
  int timed = s->cfg.request_timeout_ms > 0 && now <= INT64_MAX - s->cfg.request_timeout_ms;
  if (sched__tally_reserve(&s->req_tally) || (timed && sched_heap_reserve(&s->timers, s->nlive + 1)))
    return -1;
  sched_action *a = sched__act(s, SCHED_ACT_DISPATCH);
  if (!a) return -1;
  uint64_t id = s->next_request_id++;
  a->worker = w->id;
  a->request_id = id;
  a->group_id = group;
  a->count = g;
  a->policy_version = w->policy_version;
  size_t i = s->nreqs++;
  s->nlive++;
  s->reqs[i] = (sched__request){.id = id, .worker = w->id, .count = g, .group = group,
                                .version = w->policy_version, .sent_ms = now};
  sched__tally_add(&s->req_tally, w->policy_version, g); /* room reserved */
  if (timed) sched_heap_set(&s->timers, id, now);       /* room reserved */
  int64_t d = sched__deadline(s, win, w->policy_version);
  if (d >= 0) s->demand[d] += g;
  s->c.rollouts_requested += g;
  s->c.requests_dispatched++;
  sched__track(s, w, -1);
  w->outstanding++;
  sched__track(s, w, +1);
  sched__set_worker_state(s, w, SCHED_WORKER_BUSY, "generating rollouts");
  return (int64_t)i;
}

/* The two least loaded attached inference workers with a free slot whose
 * version some step in the window can use (ties: lowest id); NULL if none. */
static void sched__two_free(sched *s, const sched__window *win, sched_worker_info **b1,
                            sched_worker_info **b2) {
  sched_heap_entry best[2], two[2];
  size_t found = 0;
  for (size_t i = 0; i < s->ncands; i++) {
    if (sched__deadline(s, win, s->cands[i].version) < 0) continue;
    size_t n = sched_heap_least(&s->cands[i].h, two);
    for (size_t k = 0; k < n; k++) {
      if (found < 2) {
        best[found++] = two[k];
      } else if (two[k].prio < best[1].prio) {
        best[1] = two[k];
      }
      if (found == 2 && best[1].prio < best[0].prio) {
        sched_heap_entry t = best[0];
        best[0] = best[1];
        best[1] = t;
      }
    }
  }
  /* Looked up only now: both lookups see the worker array as it stands. */
  *b1 = found > 0 ? sched__worker(s, (uint32_t)best[0].key) : NULL;
  *b2 = found > 1 ? sched__worker(s, (uint32_t)best[1].key) : NULL;
}

/* A second request for every slow group: one whose only request in flight is
 * overdue goes to another worker with a free slot, oldest request first. The
 * group is already counted in the window, so only max_buffered must have
 * room; the worker's version must be one the window can use, or its answer
 * would be stale on arrival. */
static void sched__resend_slow(sched *s, int64_t now, const sched__window *win) {
  sched_worker_info *b1 = NULL, *b2 = NULL;
  int looked = 0; /* the workers are scanned only once a slow group is found */
  size_t n = s->nreqs; /* the second requests appended below are not overdue */
  for (size_t i = 0; i < n; i++) {
    if (s->reqs[i].dead || !s->reqs[i].overdue || s->reqs[i].twin) continue;
    if (!sched__under_cap(s)) return;
    if (!looked) {
      sched__two_free(s, win, &b1, &b2);
      looked = 1;
    }
    if (!b1) return;
    sched_worker_info *to = s->reqs[i].worker != b1->id ? b1 : b2;
    if (!to) continue;
    int64_t k = sched__send(s, now, win, to, s->reqs[i].group);
    if (k < 0) return;
    s->reqs[k].twin = s->reqs[i].id;
    s->reqs[i].twin = s->reqs[k].id;
    s->c.groups_resent++;
    sched__two_free(s, win, &b1, &b2);
  }
}

static void sched__dispatch(sched *s, int64_t now) {
  if (s->dispatch_held) return;
  sched__window win = sched__dispatch_window(s);
  if (!win.open) return;
  sched__demand(s, &win);
  /* Groups waiting to be sent again come first: they are the oldest wanted.
   * One that cannot go anywhere means no worker has room for any group. */
  size_t sent = 0;
  while (sent < s->nrequeue && sched__under_cap(s)) {
    sched__room(s, &win);
    const sched__requeued *e = &s->requeue[sent];
    /* Another worker than the one whose report was refused, if one has room. */
    sched_worker_info *w = sched__pick(s, &win, e->has_avoid ? &e->avoid : NULL);
    if (!w && e->has_avoid) w = sched__pick(s, &win, NULL);
    if (!w || sched__send(s, now, &win, w, e->group) < 0) break;
    sent++;
  }
  if (sent) { /* requeue may still be NULL when nothing was ever queued */
    memmove(s->requeue, s->requeue + sent, (s->nrequeue - sent) * sizeof *s->requeue);
    s->nrequeue -= sent;
  }
  if (s->cfg.request_timeout_ms > 0) sched__resend_slow(s, now, &win);
  while (s->nrequeue == 0 && sched__under_cap(s)) {
    sched__room(s, &win);
    sched_worker_info *w = sched__pick(s, &win, NULL);
    if (!w || sched__send(s, now, &win, w, s->next_group_id) < 0) return;
    s->next_group_id++;
  }
}

/* ---- planning ------------------------------------------------------------------------------ */

static int sched__plan_reserve(sched *s, size_t n) {
  if (n <= s->st.parts_cap) return 0;
  size_t cap = s->st.parts_cap;
  if (sched__grow(&s->st.parts, &cap, n, sizeof *s->st.parts)) return SCHED_ENOMEM;
  uint8_t *a = realloc(s->st.acked, cap);
  if (!a) return SCHED_ENOMEM;
  s->st.acked = a;
  uint8_t *d = realloc(s->st.done, cap);
  if (!d) return SCHED_ENOMEM;
  s->st.done = d;
  if (sched__grow(&s->pscratch, &s->pscratch_cap, cap, sizeof *s->pscratch))
    return SCHED_ENOMEM;
  s->st.parts_cap = cap;
  return 0;
}

/* Run id, "/step-", 20 digits, "-resumeK": room left in SCHED_PLAN_ID_MAX for
 * the longest suffix ("-catchup-" and 10 digits). */
#define SCHED__PLAN_BASE_MAX (SCHED_RUN_ID_MAX + 6 + 20 + 7 + 10)
_Static_assert(SCHED__PLAN_BASE_MAX - 1 + 9 + 10 < SCHED_PLAN_ID_MAX, "plan ids may be cut");

/* "RUN/step-N" for the step in progress, with "-resumeK" when it is the one a
 * resume started in: plans of that step were sent before the restart under
 * the plain name, and an agent may still hold one of them. */
static void sched__plan_base(const sched *s, char *out, size_t len) {
  if (s->cfg.resumes && s->steps_done == s->cfg.steps_done)
    snprintf(out, len, "%s/step-%" PRIu64 "-resume%" PRIu32, s->cfg.run_id, s->steps_done,
             s->cfg.resumes);
  else
    snprintf(out, len, "%s/step-%" PRIu64, s->cfg.run_id, s->steps_done);
}

/* The trainer ranks first, in rank order (the sources), then every attached
 * inference worker (only those not synced for a catch-up), in id order. 0,
 * or -1 out of memory (the run failed). */
static int sched__plan_parts(sched *s, int catchup) {
  sched__step *st = &s->st;
  if (sched__plan_reserve(s, s->nworkers + 1) ||
      sched__grow(&st->src, &st->src_cap, s->group_n, sizeof *st->src) ||
      sched__grow(&st->rx_sums, &st->rx_cap, (size_t)s->nworkers * s->group_n,
                  sizeof *st->rx_sums)) {
    sched__fail_run(s, SCHED_ABORT_ERROR, "out of memory while planning the broadcast");
    return -1;
  }
  st->nparts = 0;
  st->nsrc = s->group_n;
  for (uint32_t r = 0; r < s->group_n; r++) st->parts[st->nparts++] = s->rank_worker[r];
  for (size_t i = 0; i < s->nworkers; i++) {
    const sched_worker_info *w = &s->workers[i];
    if (w->role == SCHED_ROLE_INFERENCE && sched__attached(w) && !(catchup && w->synced))
      st->parts[st->nparts++] = w->id;
  }
  return 0;
}

/* A fresh plan of st->nparts participants: nothing acked or done yet. */
static void sched__plan_reset(sched *s) {
  sched__step *st = &s->st;
  st->phase = SCHED__PLANNING; /* so that a refusal after this is an abort of the plan */
  st->nacked = st->ndone = 0;
  memset(st->acked, 0, st->nparts);
  memset(st->done, 0, st->nparts);
  memset(st->src, 0, st->nsrc * sizeof *st->src);
  memset(st->rx_sums, 0, (st->nparts - st->nsrc) * st->nsrc * sizeof *st->rx_sums);
  st->nviews = 0;
  st->hash = 0;
  st->failing = 0;
  st->fail_msg[0] = '\0';
  st->ack_timeout_ms = s->cfg.plan_ack_timeout_ms;
  st->broadcast_timeout_ms = s->cfg.broadcast_timeout_ms;
  st->expected[0] = '\0';
}

static void sched__start_plan(sched *s, int64_t now) {
  sched__step *st = &s->st;
  if (sched__plan_parts(s, 0)) return;
  for (size_t i = 0; i < st->nparts; i++) {
    const sched_worker_info *w = sched__worker(s, st->parts[i]);
    s->pscratch[i] = (sched_participant){.name = w->name, .caps = w->caps};
  }
  st->attempt++;
  char base[SCHED__PLAN_BASE_MAX];
  sched__plan_base(s, base, sizeof base);
  if (st->attempt == 1) snprintf(st->plan_id, sizeof st->plan_id, "%s", base);
  else snprintf(st->plan_id, sizeof st->plan_id, "%s-r%" PRIu32, base, st->attempt);
  sched_offload off;
  sched__group_offload(s, &off);
  int rc = sched_choose_mode(s->policy, s->pscratch, st->nparts, &off, &st->mode, st->reason,
                             sizeof st->reason);
  st->catchup = 0;
  sched__plan_reset(s);
  if (rc != SCHED_OK) {
    char msg[SCHED_TEXT_MAX];
    snprintf(msg, sizeof msg, "broadcast of step %" PRIu64 " refused: %.200s", s->steps_done,
             st->reason);
    sched__fail_run(s, SCHED_ABORT_REFUSED, msg);
    return;
  }
  sched_action *a = sched__act(s, SCHED_ACT_BUILD_PLAN);
  if (a) {
    a->step = s->steps_done;
    a->mode = st->mode;
    a->policy_version = s->steps_done + 1;
    snprintf(a->plan_id, sizeof a->plan_id, "%s", st->plan_id);
    snprintf(a->text, sizeof a->text, "%s", st->reason);
    sched__act_parts(s, a);
  }
  st->deadline_ms = now + s->cfg.plan_ack_timeout_ms;
}

/* Whether an attached inference worker waits for its catch-up. */
static int sched__wants_catchup(const sched *s) { return s->inf_unsynced > 0; }

/* No step can start and some attached workers may not hold the published
 * version: the trainer sends them the weights it holds, which are that
 * version (it trained nothing since the last commit). Host transport: a
 * collective needs a communicator, and the trainer makes one only with a
 * train step. */
static void sched__start_catchup(sched *s, int64_t now) {
  sched__step *st = &s->st;
  if (!sched__group_ready(s) || sched__plan_parts(s, 1)) return;
  if (s->catchup_step != s->steps_done) {
    s->catchup_step = s->steps_done;
    s->catchup_seq = 0;
  }
  s->catchup_seq++;
  char base[SCHED__PLAN_BASE_MAX];
  sched__plan_base(s, base, sizeof base);
  if (s->catchup_seq == 1) snprintf(st->plan_id, sizeof st->plan_id, "%s-catchup", base);
  else snprintf(st->plan_id, sizeof st->plan_id, "%s-catchup-%" PRIu32, base, s->catchup_seq);
  st->mode = SCHED_MODE_HOST;
  snprintf(st->reason, sizeof st->reason,
           "catch-up of %zu worker%s to policy version %" PRIu64 ": host transport (only a "
           "train step makes an NCCL communicator)",
           st->nparts - st->nsrc, st->nparts - st->nsrc == 1 ? "" : "s", s->steps_done);
  st->catchup = 1;
  sched__plan_reset(s);
  sched_action *a = sched__act(s, SCHED_ACT_BUILD_PLAN);
  if (a) {
    a->step = s->steps_done;
    a->mode = st->mode;
    a->policy_version = s->steps_done;
    a->catchup = 1;
    snprintf(a->plan_id, sizeof a->plan_id, "%s", st->plan_id);
    snprintf(a->text, sizeof a->text, "%s", st->reason);
    sched__act_parts(s, a);
  }
  st->deadline_ms = now + s->cfg.plan_ack_timeout_ms;
}

/* Every rank holds version steps_done + 1: they trained step steps_done on a
 * batch this scheduler did not hand them (one from before a restart, or from
 * before a rank was lost). The step is as good as trained: plan it. The batch
 * used had rollouts_per_step rollouts, as every batch has. */
static void sched__adopt_step(sched *s, int64_t now) {
  sched__step *st = &s->st;
  st->phase = SCHED__TRAINED;
  st->catchup = 0;
  st->start_ms = now;
  st->train_seconds = 0;
  for (uint32_t r = 0; r < s->group_n; r++)
    if (s->rank_seconds[r] > st->train_seconds) st->train_seconds = s->rank_seconds[r];
  st->nbatch = s->cfg.rollouts_per_step;
  st->batch_tokens = 0;
  st->deadline_ms = SCHED_NEVER;
}

/* The first rank holding the next version and the first holding the
 * published one, when the live ranks disagree; 0 when they agree. */
static int sched__ranks_disagree(sched *s, sched_worker_info **ahead, sched_worker_info **behind) {
  sched__group_cache(s);
  *ahead = s->g_ahead >= 0 ? sched__rank(s, (uint32_t)s->g_ahead) : NULL;
  *behind = s->g_behind >= 0 ? sched__rank(s, (uint32_t)s->g_behind) : NULL;
  return *ahead && *behind;
}

/* "trainer ranks disagree: rank 0 (t0) holds version 4, rank 1 (t1) holds 3". */
static void sched__disagree_text(sched *s, char *buf, size_t len) {
  sched_worker_info *a, *b;
  if (!sched__ranks_disagree(s, &a, &b)) {
    snprintf(buf, len, "trainer ranks agree");
    return;
  }
  snprintf(buf, len,
           "trainer ranks disagree: rank %" PRIu32 " (%s) holds policy version %" PRIu64
           ", rank %" PRIu32 " (%s) holds %" PRIu64,
           a->caps.trainer_rank, a->name, a->policy_version, b->caps.trainer_rank, b->name,
           b->policy_version);
}

/* Idle, with every rank live: all holding the next version adopt its step;
 * some holding it wait for the others' step done, at most
 * heartbeat_timeout_ms, then the run fails naming them. */
static void sched__settle_group(sched *s, int64_t now) {
  sched_worker_info *ahead = NULL, *behind = NULL;
  int whole = s->group_n > 0 && sched__ranks_count(s, 0) == s->group_n;
  if (s->st.phase != SCHED__IDLE || !whole) {
    s->mixed = 0;
    return;
  }
  if (!sched__ranks_disagree(s, &ahead, &behind)) {
    s->mixed = 0;
    if (ahead) sched__adopt_step(s, now);
    return;
  }
  if (!s->mixed) {
    s->mixed = 1;
    s->mixed_since = now;
  }
  if (now - s->mixed_since < s->cfg.heartbeat_timeout_ms) return;
  char why[SCHED_TEXT_MAX], msg[2 * SCHED_TEXT_MAX];
  sched__disagree_text(s, why, sizeof why);
  snprintf(msg, sizeof msg,
           "%s, and rank %" PRIu32 " did not report step %" PRIu64 " within %" PRId64
           " ms: a group's ranks finish a step together or not at all",
           why, behind->caps.trainer_rank, s->steps_done, s->cfg.heartbeat_timeout_ms);
  s->mixed = 0;
  sched__fail_run(s, SCHED_ABORT_ERROR, msg);
}

/* ---- the pump -------------------------------------------------------------------------------- */

static void sched__update_run_state(sched *s) {
  if (s->state != SCHED_RUN_PENDING && s->state != SCHED_RUN_RUNNING) return;
  int ready = sched__group_ready(s);
  uint32_t ninf = s->inf_attached, n = s->group_n;
  char why[SCHED_TEXT_MAX];
  if (n > 1 && s->mixed) {
    sched__disagree_text(s, why, sizeof why);
    sched__set_run_state(s, ready && ninf > 0 ? SCHED_RUN_RUNNING : SCHED_RUN_PENDING,
                         "%.180s; waiting for the others to report step %" PRIu64, why,
                         s->steps_done);
  } else if (ready && ninf > 0) {
    if (n > 1)
      sched__set_run_state(s, SCHED_RUN_RUNNING,
                           "%" PRIu32 " trainer ranks and %" PRIu32 " inference workers attached",
                           n, ninf);
    else
      sched__set_run_state(s, SCHED_RUN_RUNNING,
                           "1 trainer and %" PRIu32 " inference workers attached", ninf);
  } else if (n > 1) {
    /* A group says which ranks it waits for from the first rank on. */
    if (!ready) {
      sched__missing_ranks(s, why, sizeof why);
      sched__set_run_state(s, SCHED_RUN_PENDING,
                           "waiting for trainer ranks: %" PRIu32 " of %" PRIu32
                           " trainer ranks attached (%.160s missing)",
                           sched__ranks_count(s, 1), n, why);
    } else {
      sched__set_run_state(s, SCHED_RUN_PENDING,
                           "waiting for an inference worker (%" PRIu32 " trainer ranks attached)", n);
    }
  } else if (s->state == SCHED_RUN_RUNNING) {
    sched__set_run_state(s, SCHED_RUN_PENDING, "waiting for %s",
                         !ready ? "a trainer" : "an inference worker");
  }
}

static void sched__pump(sched *s, int64_t now) {
  if (sched__terminal(s)) return;
  if (s->index_oom) {
    sched__fail_run(s, SCHED_ABORT_ERROR, "out of memory growing the scheduler's indexes");
    return;
  }
  sched__settle_group(s, now);
  if (sched__terminal(s)) return;
  sched__update_run_state(s);
  if (s->state == SCHED_RUN_STOPPING) {
    if (s->st.phase != SCHED__TRAINING && s->st.phase != SCHED__BROADCASTING)
      sched__set_run_state(s, SCHED_RUN_STOPPED, "%s", s->message);
    return;
  }
  if (s->state != SCHED_RUN_RUNNING) return;
  /* Ranks that disagree on the version can train nothing together, nor send
   * one version. */
  if (s->st.phase == SCHED__IDLE && !s->mixed) sched__start_step(s, now);
  if (s->st.phase == SCHED__TRAINED) sched__start_plan(s, now);
  /* A step that can start goes first: its plan catches everyone up too. */
  if (s->state == SCHED_RUN_RUNNING && s->st.phase == SCHED__IDLE && !s->mixed &&
      sched__wants_catchup(s))
    sched__start_catchup(s, now);
  if (s->state == SCHED_RUN_RUNNING) sched__dispatch(s, now);
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

int sched_new(const sched_settings *settings, sched **out, char *err, size_t errlen) {
  if (!out) {
    if (err && errlen) snprintf(err, errlen, "out: NULL");
    return SCHED_EINVAL;
  }
  *out = NULL;
  int rc = sched_settings_validate(settings, err, errlen);
  if (rc) return rc;
  sched *s = calloc(1, sizeof *s);
  if (!s) goto nomem;
  s->cfg = *settings;
  uint64_t mb = settings->max_buffered;
  if (!mb) mb = 2ull * settings->rollouts_per_step * ((uint64_t)settings->max_async_level + 1);
  if (mb > UINT32_MAX) mb = UINT32_MAX;
  s->max_buffered = (uint32_t)mb;
  s->state = SCHED_RUN_PENDING;
  snprintf(s->message, sizeof s->message, "waiting for workers");
  s->policy = settings->policy;
  s->steps_done = settings->steps_done;
  s->c.steps = s->c.policy_version = s->steps_done;
  s->resume_pending = settings->resumes > 0;
  if (s->resume_pending)
    snprintf(s->message, sizeof s->message, "resumed at step %" PRIu64 ": waiting for workers",
             s->steps_done);
  s->id_base = ((uint64_t)settings->resumes << 40) + 1;
  s->next_request_id = s->id_base;
  s->next_group_id = s->id_base;
  s->st.deadline_ms = SCHED_NEVER;
  s->seen_head = s->seen_tail = SCHED__NONE;
  s->last_now = INT64_MIN;
  s->pool_cap = s->max_buffered;
  s->pool = malloc(s->pool_cap * sizeof *s->pool);
  s->scratch = malloc(s->pool_cap * sizeof *s->scratch);
  s->st.batch = malloc(settings->rollouts_per_step * sizeof *s->st.batch);
  /* Steps beyond what max_buffered can hold never limit a dispatch. */
  uint64_t wl = (uint64_t)settings->max_async_level + 1;
  uint64_t held = s->max_buffered / settings->rollouts_per_step + 1;
  s->window_len = (uint32_t)(wl < held ? wl : held);
  s->demand = malloc(s->window_len * sizeof *s->demand);
  s->fill = malloc(s->window_len * sizeof *s->fill);
  s->cancelled = malloc(SCHED__CANCELLED_MAX * sizeof *s->cancelled);
  if (!s->pool || !s->scratch || !s->st.batch || !s->demand || !s->fill || !s->cancelled)
    goto nomem;
  if (sched_map_reserve(&s->pool_ids, s->pool_cap)) goto nomem;
  *out = s;
  return SCHED_OK;
nomem:
  sched_free(s);
  if (err && errlen) snprintf(err, errlen, "out of memory");
  return SCHED_ENOMEM;
}

void sched_free(sched *s) {
  if (!s) return;
  free(s->seen);
  sched_heap_free(&s->timers);
  for (size_t i = 0; i < s->ncands; i++) sched_heap_free(&s->cands[i].h);
  free(s->cands);
  free(s->expired);
  sched_map_free(&s->pool_ids);
  sched_map_free(&s->worker_index);
  free(s->pool_tally.e);
  free(s->req_tally.e);
  free(s->workers);
  free(s->reqs);
  free(s->requeue);
  free(s->cancelled);
  free(s->pool);
  free(s->scratch);
  free(s->demand);
  free(s->fill);
  free(s->st.batch);
  free(s->st.parts);
  free(s->st.acked);
  free(s->st.done);
  free(s->st.src);
  free(s->st.rx_sums);
  free(s->st.rx_view);
  free(s->st.src_view_sums);
  free(s->pscratch);
  free(s->acts);
  free(s->act_off);
  free(s->act_rec);
  free(s->a32);
  free(s->a64);
  free(s->recs);
  free(s);
}

const char *sched_last_error(const sched *s) { return s->err; }

size_t sched_take_actions(sched *s, sched_action_batch *out) {
  memset(out, 0, sizeof *out);
  if (s->nacts == 0) return 0;
  /* Arena pointers are resolved only now: the arenas may move while an event grows them. */
  for (size_t i = 0; i < s->nacts; i++) {
    sched_action *a = &s->acts[i];
    if (a->kind == SCHED_ACT_TRAIN) a->rollout_ids = a->nrollouts ? s->a64 + s->act_off[i] : NULL;
    if (a->kind == SCHED_ACT_BUILD_PLAN || a->kind == SCHED_ACT_TRIGGER ||
        a->kind == SCHED_ACT_ABORT || a->kind == SCHED_ACT_CAUGHT_UP)
      a->participants = a->nparticipants ? s->a32 + s->act_off[i] : NULL;
    if (a->kind == SCHED_ACT_COMMIT || a->kind == SCHED_ACT_CAUGHT_UP)
      a->record = &s->recs[s->act_rec[i]];
  }
  /* Hand the arenas over whole: nothing is copied, and the scheduler grows
   * fresh ones for the next events. */
  out->actions = s->acts;
  out->n = s->nacts;
  out->ids_ = s->a32;
  out->rollouts_ = s->a64;
  out->records_ = s->recs;
  s->acts = NULL;
  s->a32 = NULL;
  s->a64 = NULL;
  s->recs = NULL;
  s->nacts = s->acts_cap = 0;
  s->n32 = s->cap32 = 0;
  s->n64 = s->cap64 = 0;
  s->nrecs = s->recs_cap = 0;
  return out->n;
}

void sched_action_batch_free(sched_action_batch *b) {
  if (!b) return;
  free(b->actions);
  free(b->ids_);
  free(b->rollouts_);
  free(b->records_);
  memset(b, 0, sizeof *b);
}

int64_t sched_next_deadline(const sched *s) {
  if (sched__terminal(s)) return SCHED_NEVER;
  int64_t d = sched__plan_pending(s) ? s->st.deadline_ms : SCHED_NEVER;
  /* A held error may stand at the end of its grace (later only at a report). */
  if (sched__plan_pending(s) && s->st.failing && s->st.failing_since + SCHED__PEER_GRACE_MS > s->last_now &&
      s->st.failing_since + SCHED__PEER_GRACE_MS < d)
    d = s->st.failing_since + SCHED__PEER_GRACE_MS;
  /* The least recently seen live worker times out first. */
  if (s->seen_head != SCHED__NONE) {
    int64_t due = s->workers[s->seen_head].last_seen_ms + s->cfg.heartbeat_timeout_ms;
    if (due < d) d = due;
  }
  if (s->mixed && s->mixed_since + s->cfg.heartbeat_timeout_ms < d)
    d = s->mixed_since + s->cfg.heartbeat_timeout_ms;
  /* The oldest request not yet overdue (none whose due time would overflow). */
  const sched_heap_entry *sent = sched_heap_min(&s->timers);
  if (sent && sent->prio + s->cfg.request_timeout_ms < d) d = sent->prio + s->cfg.request_timeout_ms;
  return d;
}

/* Every event starts here: a clean error message, and time that does not go
 * back (deadlines and durations would otherwise come out wrong without a
 * trace). */
static int sched__begin(sched *s, int64_t now) {
  s->err[0] = '\0';
  if (now < s->last_now)
    return sched__fail_arg(s, SCHED_EINVAL,
                           "now_ms: %" PRId64 " is before the previous event's %" PRId64
                           " (the clock must be monotonic)",
                           now, s->last_now);
  s->last_now = now;
  return SCHED_OK;
}

/* A known, live worker, or an error naming the id. */
static int sched__get_live(sched *s, uint32_t id, sched_worker_info **out) {
  sched_worker_info *w = sched__worker(s, id);
  if (!w) return sched__fail_arg(s, SCHED_ENOENT, "worker %" PRIu32 ": not registered", id);
  if (!sched__live(w))
    return sched__fail_arg(s, SCHED_ESTALE, "worker %s: lost, ignored", w->name);
  *out = w;
  return SCHED_OK;
}

/* Newest version a worker may hold: the published one, or the next while its
 * broadcast is under way (a receiver that is done holds it before the commit). */
static uint64_t sched__max_version(const sched *s) {
  return s->steps_done + (s->st.phase >= SCHED__TRAINED && !s->st.catchup ? 1 : 0);
}

/* ---- worker events ---------------------------------------------------------------------------- */

/* A trainer that joins holds the run's weights only if it holds the
 * committed version, or the next (a step trained, not committed); anything
 * else fails the run, saying which versions. Returns whether it may go on. */
static int sched__trainer_fits(sched *s, sched_worker_info *t, uint64_t v) {
  uint64_t n = s->steps_done;
  t->policy_version = v;
  s->g_valid = 0;
  /* The next version: its step is adopted once every rank holds it
   * (sched__settle_group). */
  if (v == n || (v == n + 1 && s->st.phase == SCHED__IDLE)) return 1;
  char msg[2 * SCHED_TEXT_MAX]; /* what does not fit the run's message is cut there */
  char who[SCHED_TEXT_MAX];
  sched__who(t, who, sizeof who);
  if (v < n)
    snprintf(msg, sizeof msg,
             "%s holds policy version %" PRIu64 ", older than the committed %" PRIu64
             ": it lost the run's weights and optimizer state (restarted without a "
             "checkpoint?); restore version %" PRIu64 " or start a new run",
             who, v, n, n);
  else
    snprintf(msg, sizeof msg,
             "%s holds policy version %" PRIu64 ", newer than the committed %" PRIu64
             " and the step after it: it does not hold this run's weights",
             who, v, n);
  t->policy_version = v;
  sched__fail_run(s, SCHED_ABORT_ERROR, msg);
  return 0;
}

int sched_worker_registered(sched *s, int64_t now, uint32_t id, sched_role role,
                            const char *name, const sched_caps *caps,
                            const sched_offload *offload, uint64_t policy_version) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  if (role != SCHED_ROLE_TRAINER && role != SCHED_ROLE_INFERENCE)
    return sched__fail_arg(s, SCHED_EINVAL, "worker %" PRIu32 ": role %d is not trainer or inference",
                           id, (int)role);
  sched_worker_info *w = sched__worker(s, id);
  if (w && sched__live(w))
    return sched__fail_arg(s, SCHED_EEXIST, "worker %" PRIu32 ": already registered as %s", id,
                           w->name);
  uint32_t rank = 0, ranks = 1;
  if (role == SCHED_ROLE_TRAINER) {
    rank = caps ? caps->trainer_rank : 0;
    ranks = sched__ranks_of(caps);
    if (ranks > SCHED_MAX_TRAINER_RANKS)
      return sched__fail_arg(s, SCHED_EINVAL,
                             "worker %" PRIu32 ": trainer_ranks %" PRIu32
                             " is over the limit of %d ranks",
                             id, ranks, SCHED_MAX_TRAINER_RANKS);
    if (rank >= ranks)
      return sched__fail_arg(s, SCHED_EINVAL,
                             "worker %" PRIu32 ": trainer_rank %" PRIu32
                             " is not below trainer_ranks %" PRIu32,
                             id, rank, ranks);
    sched_worker_info *r0 = NULL;
    for (uint32_t r = 0; !r0 && r < s->group_n; r++) r0 = sched__rank(s, r);
    if (r0 && ranks != s->group_n)
      return sched__fail_arg(s, SCHED_EINVAL,
                             "worker %" PRIu32 ": trainer_ranks %" PRIu32
                             ", but the run's trainer group has %" PRIu32 " ranks (%s is rank %" PRIu32
                             ")",
                             id, ranks, s->group_n, r0->name, r0->caps.trainer_rank);
    sched_worker_info *held = sched__rank(s, rank);
    if (held && ranks == 1)
      return sched__fail_arg(s, SCHED_EEXIST, "worker %" PRIu32 ": the run already has trainer %s",
                             id, held->name);
    if (held)
      return sched__fail_arg(s, SCHED_EEXIST,
                             "worker %" PRIu32 ": trainer rank %" PRIu32 " is held by %s", id,
                             rank, held->name);
  }
  /* Room in every index for one more worker: no later event may fail on it. */
  size_t room = s->nworkers + 1;
  int nomem = sched_map_reserve(&s->worker_index, room) ||
              sched__grow(&s->seen, &s->seen_cap, room, sizeof *s->seen) ||
              sched__grow(&s->expired, &s->expired_cap, room, sizeof *s->expired);
  for (size_t i = 0; !nomem && i < s->ncands; i++) nomem = sched_heap_reserve(&s->cands[i].h, room);
  if (nomem) return sched__fail_arg(s, SCHED_ENOMEM, "out of memory registering worker %" PRIu32, id);
  if (!w) {
    if (sched__grow(&s->workers, &s->workers_cap, s->nworkers + 1, sizeof *s->workers))
      return sched__fail_arg(s, SCHED_ENOMEM, "out of memory registering worker %" PRIu32, id);
    size_t i = sched__lower(s, id);
    memmove(&s->workers[i + 1], &s->workers[i], (s->nworkers - i) * sizeof *s->workers);
    s->nworkers++;
    w = &s->workers[i];
    w->id = id;
    sched__reindex_workers(s, i);
    sched__seen_shift(s, (uint32_t)i, +1);
  }
  memset(w, 0, sizeof *w);
  w->id = id;
  w->role = role;
  w->state = SCHED_WORKER_REGISTERED;
  if (name && name[0]) snprintf(w->name, sizeof w->name, "%s", name);
  else snprintf(w->name, sizeof w->name, "worker-%" PRIu32, id);
  if (caps) w->caps = *caps;
  w->caps.trainer_rank = rank;
  w->caps.trainer_ranks = role == SCHED_ROLE_TRAINER ? ranks : 0;
  if (offload && role == SCHED_ROLE_TRAINER) w->offload = *offload;
  w->policy_version = policy_version;
  /* After a resume nobody is trusted until a plan verified it. */
  w->synced = role == SCHED_ROLE_INFERENCE && !s->resume_pending && policy_version == s->steps_done;
  sched__seen(s, w, now); /* room reserved above */
  sched__emit_worker(s, w, "registered");
  if (role == SCHED_ROLE_TRAINER) {
    sched__group_scan(s);
    s->rank_trained[rank] = 0;
    s->rank_seconds[rank] = 0;
    s->rank_sum[rank] = 0;
    if (!sched__terminal(s)) sched__trainer_fits(s, w, policy_version);
  }
  sched__pump(s, now);
  return SCHED_OK;
}

int sched_worker_attached(sched *s, int64_t now, uint32_t id) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  sched_worker_info *w = NULL;
  int rc = sched__get_live(s, id, &w);
  if (rc) return rc;
  if (w->state != SCHED_WORKER_REGISTERED)
    return sched__fail_arg(s, SCHED_ESTATE, "worker %s: already attached", w->name);
  sched__seen(s, w, now);
  sched__set_worker_state(s, w, SCHED_WORKER_READY, "command stream open");
  sched__pump(s, now);
  return SCHED_OK;
}

int sched_worker_heartbeat(sched *s, int64_t now, uint32_t id, uint64_t policy_version) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  sched_worker_info *w = NULL;
  int rc = sched__get_live(s, id, &w);
  if (rc) return rc;
  /* Alive, whatever the version says: refusing the proof of life would have
   * the worker lost and registering again in a loop. */
  sched__seen(s, w, now);
  if (w->role == SCHED_ROLE_INFERENCE) {
    if (!w->synced) { /* any version: its catch-up will set it */
      sched__track(s, w, -1);
      w->policy_version = policy_version;
      sched__track(s, w, +1);
    } else if (policy_version > sched__max_version(s)) {
      return sched__fail_arg(s, SCHED_EINVAL,
                             "worker %s: heartbeat policy_version %" PRIu64
                             " is newer than the published %" PRIu64,
                             w->name, policy_version, s->steps_done);
    } else if (policy_version > w->policy_version) {
      /* Within a run a worker's weights only move forward; a heartbeat read
       * before its broadcast landed may arrive after the commit, and taking
       * its older version would shut the worker out of dispatch until the next. */
      sched__track(s, w, -1);
      w->policy_version = policy_version;
      sched__track(s, w, +1);
    }
  }
  /* The last participant heard from since a broadcast error: the error stands. */
  if (!sched__terminal(s) && sched__failing_due(s, now)) {
    sched__plan_timeout(s);
    sched__pump(s, now);
  }
  return SCHED_OK;
}

static void sched__lose(sched *s, sched_worker_info *w, const char *reason) {
  char why[SCHED_TEXT_MAX];
  snprintf(why, sizeof why, "%s", reason && reason[0] ? reason : "connection lost");
  uint32_t id = w->id;
  int trainer = w->role == SCHED_ROLE_TRAINER;
  sched__requeue_worker(s, id);
  sched__set_worker_state(s, w, SCHED_WORKER_LOST, why);
  w->synced = 0; /* lost: in no count, nothing to untrack */
  sched__seen_unlink(s, (uint32_t)(w - s->workers));
  int in_plan = 0;
  for (size_t i = 0; sched__plan_pending(s) && i < s->st.nparts; i++)
    if (s->st.parts[i] == id) in_plan = 1;
  if (in_plan) {
    char msg[SCHED_TEXT_MAX];
    snprintf(msg, sizeof msg, "%s %s lost: %.150s", trainer ? "trainer" : "inference worker",
             w->name, why);
    sched__abort_plan(s, SCHED_ABORT_PARTICIPANT_LOST, msg);
  }
  /* Without its trainer (any rank of it) the step's weights are gone: redo it
   * with a fresh batch, or plan it if every rank comes back holding it. */
  if (trainer && !sched__terminal(s)) {
    if (s->st.phase == SCHED__TRAINING) {
      /* The other ranks' part of the step is given up: nothing waits on them. */
      for (uint32_t r = 0; r < s->group_n; r++) {
        sched_worker_info *o = sched__rank(s, r);
        if (!o || o == w || o->state != SCHED_WORKER_BUSY) continue;
        char msg[SCHED_TEXT_MAX];
        snprintf(msg, sizeof msg, "step %" PRIu64 " given up: trainer rank %" PRIu32 " (%s) lost",
                 s->steps_done, w->caps.trainer_rank, w->name);
        sched__set_worker_state(s, o, SCHED_WORKER_READY, msg);
      }
    }
    s->st.phase = SCHED__IDLE;
    s->st.catchup = 0;
  }
  if (trainer) sched__group_scan(s);
}

int sched_worker_lost(sched *s, int64_t now, uint32_t id, const char *reason) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  sched_worker_info *w = NULL;
  int rc = sched__get_live(s, id, &w);
  if (rc) return rc;
  sched__lose(s, w, reason);
  sched__pump(s, now);
  return SCHED_OK;
}

int sched_worker_forget(sched *s, int64_t now, uint32_t id) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  size_t i = sched__lower(s, id);
  if (i == s->nworkers || s->workers[i].id != id)
    return sched__fail_arg(s, SCHED_ENOENT, "worker %" PRIu32 ": not registered", id);
  if (sched__live(&s->workers[i]))
    return sched__fail_arg(s, SCHED_ESTATE, "worker %s: not lost, cannot be forgotten",
                           s->workers[i].name);
  /* Nothing refers to it any more: its requests and cancels went when it was
   * lost, and a plan pending since then was built without it. */
  memmove(&s->workers[i], &s->workers[i + 1], (s->nworkers - i - 1) * sizeof *s->workers);
  s->nworkers--;
  sched_map_del(&s->worker_index, id);
  sched__reindex_workers(s, i);
  sched__seen_shift(s, (uint32_t)i, -1); /* it was lost: in the list no more */
  return SCHED_OK;
}

/* ---- rollouts --------------------------------------------------------------------------------- */

static int sched__pool_has(const sched *s, uint64_t id) {
  return sched_map_get(&s->pool_ids, id) != NULL;
}

/* Checks a report before anything is kept: all or nothing. A group is
 * batched whole, so a short one is as unusable as a long one. */
static int sched__check_rollouts(sched *s, const sched_worker_info *w, const sched__request *q,
                                 const sched_rollout *r, size_t n) {
  if (n && !r)
    return sched__fail_arg(s, SCHED_EINVAL, "worker %s: request %" PRIu64 ": rollouts: NULL",
                           w->name, q->id);
  if (n != q->count)
    return sched__fail_arg(s, SCHED_EINVAL,
                           "worker %s: request %" PRIu64 " asked for %" PRIu32
                           " rollouts, got %zu",
                           w->name, q->id, q->count, n);
  for (size_t i = 0; i < n; i++) {
    if (r[i].group_id != q->group)
      return sched__fail_arg(s, SCHED_EINVAL,
                             "worker %s: rollout %" PRIu64 ": group_id %" PRIu64
                             ", but request %" PRIu64 " is for group %" PRIu64,
                             w->name, r[i].id, r[i].group_id, q->id, q->group);
    if (r[i].policy_version > sched__max_version(s))
      return sched__fail_arg(s, SCHED_EINVAL,
                             "worker %s: rollout %" PRIu64 ": policy_version %" PRIu64
                             " is newer than the published %" PRIu64,
                             w->name, r[i].id, r[i].policy_version, s->steps_done);
    if (sched__pool_has(s, r[i].id))
      return sched__fail_arg(s, SCHED_EINVAL, "worker %s: rollout %" PRIu64 ": duplicate id",
                             w->name, r[i].id);
    for (size_t j = 0; j < i; j++)
      if (r[j].id == r[i].id)
        return sched__fail_arg(s, SCHED_EINVAL,
                               "worker %s: rollout %" PRIu64 ": duplicate id in the report",
                               w->name, r[i].id);
  }
  return SCHED_OK;
}

/* A result for no request in flight: a cancelled one's is stale (expected:
 * the abort and the result may cross), anything else unknown. */
static int sched__not_in_flight(sched *s, const sched_worker_info *w, uint64_t request_id) {
  size_t ci = sched__cancelled_index(s, request_id);
  if (ci == s->ncancelled)
    return sched__fail_arg(s, SCHED_ENOENT, "worker %s: request %" PRIu64 ": not in flight",
                           w->name, request_id);
  if (s->cancelled[ci].worker != w->id)
    return sched__fail_arg(s, SCHED_EINVAL, "worker %s: request %" PRIu64 " was sent to %s",
                           w->name, request_id, sched__name(s, s->cancelled[ci].worker));
  sched__cancelled_remove(s, ci);
  return sched__fail_arg(s, SCHED_ESTALE,
                         "worker %s: request %" PRIu64 " was cancelled (its group was answered "
                         "by another request): result ignored",
                         w->name, request_id);
}

/* The request `request_id` in flight on `worker`, which answered it: its
 * index in s->reqs, or a code (not in flight, or another worker's). */
static int sched__answered(sched *s, int64_t now, uint32_t worker, uint64_t request_id,
                           sched_worker_info **w, size_t *qi) {
  int rc = sched__get_live(s, worker, w);
  if (rc) return rc;
  sched__seen(s, *w, now);
  if (request_id < s->id_base)
    return sched__fail_arg(s, SCHED_ESTALE,
                           "worker %s: request %" PRIu64 " was sent before the orchestrator "
                           "restarted: result ignored",
                           (*w)->name, request_id);
  *qi = sched__req_index(s, request_id);
  if (*qi == s->nreqs) return sched__not_in_flight(s, *w, request_id);
  if (s->reqs[*qi].worker != worker)
    return sched__fail_arg(s, SCHED_EINVAL, "worker %s: request %" PRIu64 " was sent to %s",
                           (*w)->name, request_id, sched__name(s, s->reqs[*qi].worker));
  return SCHED_OK;
}

int sched_rollouts_refused(sched *s, int64_t now, uint32_t worker, uint64_t request_id) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  sched_worker_info *w = NULL;
  size_t qi = 0;
  int rc = sched__answered(s, now, worker, request_id, &w, &qi);
  if (rc) return rc;
  sched__request q = s->reqs[qi];
  sched__req_remove(s, qi);
  /* As for a report the scheduler refuses itself (sched_rollouts_done). */
  if (!q.twin) sched__requeue(s, q.group, &worker);
  sched__pump(s, now);
  return SCHED_OK;
}

int sched_rollouts_done(sched *s, int64_t now, uint32_t worker, uint64_t request_id,
                        const sched_rollout *rollouts, size_t n) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  sched_worker_info *w = NULL;
  size_t qi = 0;
  int rc = sched__answered(s, now, worker, request_id, &w, &qi);
  if (rc) return rc;
  sched__request q = s->reqs[qi];
  rc = sched__check_rollouts(s, w, &q, rollouts, n);
  /* A new version in the pool's tally is the only growth below. */
  if (rc == SCHED_OK && sched__tally_reserve(&s->pool_tally))
    return sched__fail_arg(s, SCHED_ENOMEM, "out of memory buffering request %" PRIu64, q.id);
  sched__req_remove(s, qi); /* frees the reservation: the pool has room for its count */
  if (rc == SCHED_OK) {
    /* The first whole answer wins: the group's other request is not needed. */
    size_t ti = q.twin ? sched__req_index(s, q.twin) : s->nreqs;
    if (ti < s->nreqs) sched__cancel(s, ti, q.id, w->name);
    uint64_t gversion = rollouts[0].policy_version;
    for (size_t i = 1; i < n; i++)
      if (rollouts[i].policy_version < gversion) gversion = rollouts[i].policy_version;
    for (size_t i = 0; i < n; i++) {
      s->pool[s->npool++] =
          (sched__rollout){.r = rollouts[i], .gversion = gversion, .seq = s->next_seq++};
      if (sched_map_put(&s->pool_ids, rollouts[i].id, 0)) s->index_oom = 1; /* room reserved */
    }
    sched__tally_add(&s->pool_tally, gversion, (int64_t)n); /* room reserved */
    s->c.rollouts_received += n;
    s->c.rollouts_buffered = (uint32_t)s->npool;
  } else if (!q.twin) {
    /* Nothing of it is kept, but the prompt is still wanted: another worker
     * gets it, if one has room. */
    sched__requeue(s, q.group, &worker);
  }
  sched__pump(s, now);
  return rc;
}

/* ---- the step and its broadcast -------------------------------------------------------------------- */

static int sched__is_trainer(sched *s, uint32_t worker, sched_worker_info **out) {
  int rc = sched__get_live(s, worker, out);
  if (rc) return rc;
  if ((*out)->role != SCHED_ROLE_TRAINER)
    return sched__fail_arg(s, SCHED_EINVAL, "worker %s: not the trainer", (*out)->name);
  return SCHED_OK;
}

/* A rank reported step `step` done ahead of the step training: the group no
 * longer trains one step, so the run fails naming both ranks and steps. */
static void sched__step_mismatch(sched *s, const sched_worker_info *t, uint64_t step) {
  const sched_worker_info *o = NULL;
  for (uint32_t r = 0; !o && r < s->group_n; r++)
    if (s->rank_trained[r]) o = sched__rank(s, r);
  char msg[2 * SCHED_TEXT_MAX];
  if (o)
    snprintf(msg, sizeof msg,
             "trainer rank %" PRIu32 " (%s) reported step %" PRIu64 " done, but rank %" PRIu32
             " (%s) reported step %" PRIu64 ", the step training: a group's ranks train one step "
             "together",
             t->caps.trainer_rank, t->name, step, o->caps.trainer_rank, o->name, s->steps_done);
  else {
    o = sched__rank(s, t->caps.trainer_rank == 0 ? 1 : 0);
    snprintf(msg, sizeof msg,
             "trainer rank %" PRIu32 " (%s) reported step %" PRIu64 " done, but rank %" PRIu32
             " (%s) was sent step %" PRIu64 ", the step training: a group's ranks train one step "
             "together",
             t->caps.trainer_rank, t->name, step, o ? o->caps.trainer_rank : 0,
             o ? o->name : "?", s->steps_done);
  }
  sched__fail_run(s, SCHED_ABORT_ERROR, msg);
}

int sched_step_done(sched *s, int64_t now, uint32_t worker, uint64_t step,
                    double train_seconds, const sched_offload *offload) {
  return sched_shard_step_done(s, now, worker, step, train_seconds, offload, 0);
}

int sched_shard_step_done(sched *s, int64_t now, uint32_t worker, uint64_t step,
                          double train_seconds, const sched_offload *offload,
                          uint64_t shard_checksum) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  sched_worker_info *t = NULL;
  int rc = sched__is_trainer(s, worker, &t);
  if (rc) return rc;
  sched__seen(s, t, now);
  if (!(train_seconds >= 0))
    return sched__fail_arg(s, SCHED_EINVAL, "trainer %s: train_seconds %g: must be >= 0",
                           t->name, train_seconds);
  uint32_t rank = t->caps.trainer_rank;
  char who[SCHED_TEXT_MAX];
  sched__who(t, who, sizeof who);
  /* Trained on a batch from before a restart or a loss: it holds the next
   * version now, which no catch-up may send in place of it. */
  int unasked = s->st.phase == SCHED__IDLE ||
                (s->st.catchup && s->st.phase != SCHED__BROADCASTING);
  if (step == s->steps_done && unasked && !sched__terminal(s)) {
    if (s->st.catchup) {
      char msg[SCHED_TEXT_MAX];
      snprintf(msg, sizeof msg, "%.200s trained step %" PRIu64 " meanwhile: its plan goes first",
               who, step);
      sched__abort_plan(s, SCHED_ABORT_REFUSED, msg);
    }
    if (offload) t->offload = *offload;
    t->policy_version = step + 1;
    s->g_valid = 0;
    s->rank_seconds[rank] = train_seconds;
    s->rank_sum[rank] = shard_checksum;
    sched__pump(s, now); /* adopts the step once every rank holds it */
    return SCHED_OK;
  }
  if (step == s->steps_done && s->st.phase >= SCHED__TRAINED && !s->st.catchup)
    return sched__fail_arg(s, SCHED_ESTALE, "trainer %s: step %" PRIu64 " is trained already",
                           t->name, step);
  if (s->st.phase != SCHED__TRAINING || step < s->steps_done)
    return sched__fail_arg(s, step < s->steps_done ? SCHED_ESTALE : SCHED_ESTATE,
                           "trainer %s: step %" PRIu64 " done, but no such step is training",
                           t->name, step);
  if (step != s->steps_done && s->group_n == 1)
    return sched__fail_arg(s, SCHED_EINVAL, "trainer %s: step %" PRIu64 " done, training step %" PRIu64,
                           t->name, step, s->steps_done);
  if (step != s->steps_done) {
    sched__step_mismatch(s, t, step);
    return SCHED_OK;
  }
  if (s->rank_trained[rank])
    return sched__fail_arg(s, SCHED_ESTALE, "%s: step %" PRIu64 " reported already", who, step);
  if (offload) t->offload = *offload;
  t->policy_version = step + 1;
  s->g_valid = 0;
  s->rank_trained[rank] = 1;
  s->rank_seconds[rank] = train_seconds;
  s->rank_sum[rank] = shard_checksum;
  sched__set_worker_state(s, t, SCHED_WORKER_READY, "step done");
  if (++s->st.ntrained == s->group_n) {
    /* The step took as long as its slowest rank. */
    s->st.train_seconds = 0;
    for (uint32_t r = 0; r < s->group_n; r++)
      if (s->rank_seconds[r] > s->st.train_seconds) s->st.train_seconds = s->rank_seconds[r];
    s->st.phase = SCHED__TRAINED;
  }
  sched__pump(s, now);
  return SCHED_OK;
}

/* The current plan's rank of `worker`, or an error; plan id checked first. */
static int sched__plan_rank(sched *s, sched__phase want, uint32_t worker, const char *plan_id,
                            size_t *rank) {
  if (!plan_id) return sched__fail_arg(s, SCHED_EINVAL, "plan_id: NULL");
  if (!sched__plan_pending(s) || strcmp(plan_id, s->st.plan_id) != 0)
    return sched__fail_arg(s, SCHED_ESTALE, "plan %s: not the pending plan", plan_id);
  if (s->st.phase != want)
    return sched__fail_arg(s, SCHED_ESTATE, "plan %s: not expected in this phase", plan_id);
  /* Ranks 0..nsrc-1 are the trainer ranks in rank order; the others are
   * inference workers in id order. */
  size_t lo = s->st.nsrc, hi = s->st.nparts;
  const sched_worker_info *w = sched__worker(s, worker);
  if (w && w->role == SCHED_ROLE_TRAINER && w->caps.trainer_rank < s->st.nsrc &&
      s->st.parts[w->caps.trainer_rank] == worker)
    lo = hi = w->caps.trainer_rank;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (s->st.parts[mid] < worker) lo = mid + 1;
    else hi = mid;
  }
  if (lo < s->st.nparts && s->st.parts[lo] == worker) {
    *rank = lo;
    return SCHED_OK;
  }
  return sched__fail_arg(s, SCHED_EINVAL, "worker %s: not a participant of plan %s",
                         sched__name(s, worker), plan_id);
}

int sched_plan_built(sched *s, int64_t now, const char *plan_id, uint64_t hash,
                     const char *error) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  if (!plan_id) return sched__fail_arg(s, SCHED_EINVAL, "plan_id: NULL");
  if (!sched__plan_pending(s) || strcmp(plan_id, s->st.plan_id) != 0)
    return sched__fail_arg(s, SCHED_ESTALE, "plan %s: not the pending plan", plan_id);
  if (s->st.phase != SCHED__PLANNING)
    return sched__fail_arg(s, SCHED_ESTATE, "plan %s: already built", plan_id);
  if (error && error[0]) {
    char msg[SCHED_TEXT_MAX];
    snprintf(msg, sizeof msg, "plan %s could not be built: %s", plan_id, error);
    sched__fail_run(s, SCHED_ABORT_ERROR, msg);
    return SCHED_OK;
  }
  s->st.hash = hash;
  s->st.phase = SCHED__ACKING;
  s->st.deadline_ms = now + s->st.ack_timeout_ms;
  return SCHED_OK;
}

int sched_plan_limits(sched *s, int64_t now, const char *plan_id, int64_t ack_timeout_ms,
                      int64_t broadcast_timeout_ms, const char *expected) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  if (!plan_id) return sched__fail_arg(s, SCHED_EINVAL, "plan_id: NULL");
  if (ack_timeout_ms <= 0 || broadcast_timeout_ms <= 0)
    return sched__fail_arg(s, SCHED_EINVAL, "plan %s: timeouts %" PRId64 " ms and %" PRId64
                           " ms must be > 0", plan_id, ack_timeout_ms, broadcast_timeout_ms);
  if (!sched__plan_pending(s) || strcmp(plan_id, s->st.plan_id) != 0)
    return sched__fail_arg(s, SCHED_ESTALE, "plan %s: not the pending plan", plan_id);
  if (s->st.phase != SCHED__PLANNING)
    return sched__fail_arg(s, SCHED_ESTATE, "plan %s: already built", plan_id);
  s->st.ack_timeout_ms = ack_timeout_ms;
  s->st.broadcast_timeout_ms = broadcast_timeout_ms;
  snprintf(s->st.expected, sizeof s->st.expected, "%s", expected ? expected : "");
  return SCHED_OK;
}

int sched_plan_views(sched *s, int64_t now, const char *plan_id, const uint32_t *rank_view,
                     size_t nranks, uint32_t nviews) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  if (!plan_id) return sched__fail_arg(s, SCHED_EINVAL, "plan_id: NULL");
  if (!sched__plan_pending(s) || strcmp(plan_id, s->st.plan_id) != 0)
    return sched__fail_arg(s, SCHED_ESTALE, "plan %s: not the pending plan", plan_id);
  sched__step *st = &s->st;
  if (st->phase != SCHED__PLANNING)
    return sched__fail_arg(s, SCHED_ESTATE, "plan %s: already built", plan_id);
  if (!nviews) {
    st->nviews = 0;
    return SCHED_OK;
  }
  if (!rank_view || nranks != st->nparts)
    return sched__fail_arg(s, SCHED_EINVAL, "plan %s: %zu rank views for %zu participants",
                           plan_id, rank_view ? nranks : 0, st->nparts);
  for (size_t r = 0; r < nranks; r++) {
    uint32_t v = rank_view[r];
    if (r < st->nsrc && v != SCHED_VIEW_WHOLE)
      return sched__fail_arg(s, SCHED_EINVAL, "plan %s: source rank %zu has view %" PRIu32
                             "; a source holds its tensors whole", plan_id, r, v);
    if (v != SCHED_VIEW_WHOLE && v >= nviews)
      return sched__fail_arg(s, SCHED_EINVAL, "plan %s: rank %zu has view %" PRIu32 " of %" PRIu32,
                             plan_id, r, v, nviews);
  }
  size_t nrx = st->nparts - st->nsrc;
  if (sched__grow(&st->rx_view, &st->rx_view_cap, nrx ? nrx : 1, sizeof *st->rx_view) ||
      sched__grow(&st->src_view_sums, &st->src_view_cap, (size_t)st->nsrc * nviews,
                  sizeof *st->src_view_sums))
    return sched__fail_arg(s, SCHED_EINVAL, "plan %s: out of memory for its views", plan_id);
  memcpy(st->rx_view, rank_view + st->nsrc, nrx * sizeof *st->rx_view);
  memset(st->src_view_sums, 0, (size_t)st->nsrc * nviews * sizeof *st->src_view_sums);
  st->nviews = nviews;
  return SCHED_OK;
}

int sched_plan_acked(sched *s, int64_t now, uint32_t worker, const char *plan_id, uint64_t hash,
                     const char *error) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  sched_worker_info *w = NULL;
  int rc = sched__get_live(s, worker, &w);
  if (rc) return rc;
  sched__seen(s, w, now);
  size_t rank;
  /* Every participant acked once the broadcast runs: an ack then is one
   * sent again (a worker whose report stream broke cannot tell whether it
   * went through), which changes nothing. */
  if (s->st.phase == SCHED__BROADCASTING &&
      sched__plan_rank(s, SCHED__BROADCASTING, worker, plan_id, &rank) == SCHED_OK &&
      s->st.acked[rank])
    return SCHED_OK;
  rc = sched__plan_rank(s, SCHED__ACKING, worker, plan_id, &rank);
  if (rc) return rc;
  char msg[SCHED_TEXT_MAX];
  if (error && error[0]) {
    snprintf(msg, sizeof msg, "%s refused plan %s: %s", w->name, plan_id, error);
    sched__fail_run(s, SCHED_ABORT_REFUSED, msg);
    return SCHED_OK;
  }
  if (hash != s->st.hash) {
    snprintf(msg, sizeof msg, "%s acked plan %s with hash %016" PRIx64 ", expected %016" PRIx64,
             w->name, plan_id, hash, s->st.hash);
    sched__fail_run(s, SCHED_ABORT_REFUSED, msg);
    return SCHED_OK;
  }
  if (s->st.acked[rank]) return SCHED_OK; /* a repeated ack changes nothing */
  s->st.acked[rank] = 1;
  if (++s->st.nacked < s->st.nparts) return SCHED_OK;
  sched_action *a = sched__act(s, SCHED_ACT_TRIGGER);
  if (a) {
    a->step = s->steps_done;
    a->catchup = s->st.catchup;
    a->plan_hash = s->st.hash;
    snprintf(a->plan_id, sizeof a->plan_id, "%s", s->st.plan_id);
    sched__act_parts(s, a);
  }
  s->st.phase = SCHED__BROADCASTING;
  s->st.deadline_ms = now + s->st.broadcast_timeout_ms;
  return SCHED_OK;
}

/* The checksum source rank `j` sent: its broadcast report's, else the one
 * its step done gave (a step's plan only: a catch-up sends what the rank
 * held before). 0 when none, or when the two differ: the weights sent are
 * then not the ones trained. */
static uint64_t sched__source_sum(const sched *s, uint32_t j) {
  uint64_t b = s->st.src[j].weights_checksum, d = s->st.catchup ? 0 : s->rank_sum[j];
  if (b && d && b != d) return 0;
  return b ? b : d;
}

/* The figures of the plan that just finished, as a step record of step
 * steps_done publishing `version`. Bytes and buckets are summed over the
 * sources, which send at the same time; times are the slowest source's. */
static void sched__record(sched *s, int64_t now, uint64_t version, sched_step_record *r) {
  sched__step *st = &s->st;
  memset(r, 0, sizeof *r);
  snprintf(r->run_id, sizeof r->run_id, "%s", s->cfg.run_id);
  r->step = s->steps_done;
  r->mode = st->mode;
  snprintf(r->mode_reason, sizeof r->mode_reason, "%s", st->reason);
  snprintf(r->transport, sizeof r->transport, "%s", st->src[0].transport);
  r->exposed_measured = st->src[0].exposed_measured;
  for (uint32_t j = 0; j < st->nsrc; j++) {
    const sched_bcast_report *b = &st->src[j];
    r->pcie_bytes += b->pcie_bytes;
    r->wire_bytes += b->wire_bytes;
    r->buckets += b->buckets;
    if (b->h2d_seconds > r->h2d_seconds) r->h2d_seconds = b->h2d_seconds;
    if (b->cast_seconds > r->cast_seconds) r->cast_seconds = b->cast_seconds;
    if (b->wire_seconds > r->wire_seconds) r->wire_seconds = b->wire_seconds;
    if (b->total_seconds > r->total_seconds) r->total_seconds = b->total_seconds;
    if (b->exposed_staging_seconds > r->exposed_staging_seconds)
      r->exposed_staging_seconds = b->exposed_staging_seconds;
    if (!b->exposed_measured) r->exposed_measured = 0;
  }
  /* One source's own rate stands; several give their bytes over the slowest. */
  r->gbps = st->nsrc == 1 && st->src[0].gbps > 0 ? st->src[0].gbps
            : r->total_seconds > 0 ? (double)r->wire_bytes / r->total_seconds / 1e9 : 0;
  r->train_seconds = st->train_seconds;
  r->rollouts_used = st->nbatch;
  r->rollouts_dropped = (uint32_t)s->dropped_since_commit;
  r->step_seconds = (double)(now - st->start_ms) / 1000.0;
  r->staging_share = r->step_seconds > 0 ? r->exposed_staging_seconds / r->step_seconds : 0;
  r->policy_version = version;
  r->finished_unix_ms = 0; /* wall time is the caller's */
  r->receivers = (uint32_t)(st->nparts - st->nsrc);
  r->sources = st->nsrc;
  r->weights_verified = 1;
  for (uint32_t j = 0; j < st->nsrc; j++) {
    uint64_t whole = sched__source_sum(s, j);
    for (size_t i = 0; i < r->receivers; i++) {
      uint32_t v = st->nviews ? st->rx_view[i] : SCHED_VIEW_WHOLE;
      uint64_t want = v == SCHED_VIEW_WHOLE ? whole : st->src_view_sums[j * st->nviews + v];
      if (!want || st->rx_sums[i * st->nsrc + j] != want) r->weights_verified = 0;
    }
    if (!whole && !st->nviews) r->weights_verified = 0;
  }
}

/* Keeps `rec` for action `a` (COMMIT, CAUGHT_UP); 0, or -1 out of memory. */
static int sched__act_record(sched *s, sched_action *a, const sched_step_record *rec) {
  if (sched__grow(&s->recs, &s->recs_cap, s->nrecs + 1, sizeof *s->recs)) return -1;
  s->act_rec[a - s->acts] = s->nrecs;
  s->recs[s->nrecs++] = *rec;
  return 0;
}

/* Every participant of the plan that finished holds the published version:
 * the inference workers among them are synced. */
static void sched__participants_hold(sched *s) {
  for (size_t i = 0; i < s->st.nparts; i++) {
    sched_worker_info *w = sched__worker(s, s->st.parts[i]);
    if (!w) continue;
    sched__track(s, w, -1);
    w->policy_version = s->steps_done;
    if (w->role == SCHED_ROLE_INFERENCE && sched__live(w)) w->synced = 1;
    sched__track(s, w, +1);
  }
  s->g_valid = 0; /* the ranks hold the published version */
  s->resume_pending = 0;
}

/* A catch-up finished: its receivers hold the published version, no step moved. */
static void sched__catchup_done(sched *s, int64_t now) {
  sched__step *st = &s->st;
  sched_step_record rec;
  sched__record(s, now, s->steps_done, &rec);
  sched__participants_hold(s);
  s->c.catchups++;
  sched_action *a = sched__act(s, SCHED_ACT_CAUGHT_UP);
  if (a) {
    a->step = s->steps_done;
    a->policy_version = s->steps_done;
    a->catchup = 1;
    a->mode = st->mode;
    snprintf(a->plan_id, sizeof a->plan_id, "%s", st->plan_id);
    sched__act_parts(s, a);
    if (sched__act_record(s, a, &rec)) s->nacts--; /* CAUGHT_UP promises its record */
  }
  st->phase = SCHED__IDLE;
  st->catchup = 0;
  st->deadline_ms = SCHED_NEVER;
}

static void sched__commit(sched *s, int64_t now) {
  sched__step *st = &s->st;
  sched_step_record rec;
  sched__record(s, now, s->steps_done + 1, &rec);

  s->steps_done++;
  s->g_valid = 0; /* which ranks hold the next version is counted from steps_done */
  st->attempt = 0; /* the next step's plans are named afresh */
  s->c.steps = s->steps_done;
  s->c.policy_version = s->steps_done;
  s->c.rollouts_used += st->nbatch;
  s->c.broadcasts[st->mode]++;
  s->dropped_since_commit = 0;
  sched__participants_hold(s);
  sched_action *a = sched__act(s, SCHED_ACT_COMMIT);
  if (a) {
    a->step = rec.step;
    if (sched__act_record(s, a, &rec)) s->nacts--; /* a COMMIT without its record would be useless */
  }
  st->phase = SCHED__IDLE;
  st->deadline_ms = SCHED_NEVER;
  if (s->cfg.steps && s->steps_done >= s->cfg.steps)
    sched__set_run_state(s, SCHED_RUN_SUCCEEDED, "%" PRIu64 " steps done", s->steps_done);
}

int sched_broadcast_done(sched *s, int64_t now, uint32_t worker, const char *plan_id,
                         const char *error, const sched_bcast_report *report) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  sched_worker_info *w = NULL;
  int rc = sched__get_live(s, worker, &w);
  if (rc) return rc;
  sched__seen(s, w, now);
  size_t rank;
  rc = sched__plan_rank(s, SCHED__BROADCASTING, worker, plan_id, &rank);
  if (rc) return rc;
  if (error && error[0]) {
    if (!s->st.failing) {
      s->st.failing = 1;
      s->st.failing_since = now;
      snprintf(s->st.fail_msg, sizeof s->st.fail_msg, "broadcast of plan %s failed on %s: %s",
               plan_id, w->name, error);
      /* By then every participant has been heard from or is lost (see
       * SCHED__PEER_GRACE_MS), whatever the broadcast's own bound. */
      int64_t hold = s->cfg.heartbeat_timeout_ms > SCHED__PEER_GRACE_MS ? s->cfg.heartbeat_timeout_ms
                                                                          : SCHED__PEER_GRACE_MS;
      s->st.deadline_ms = now + hold;
    }
    if (sched__failing_due(s, now)) sched__plan_timeout(s);
    return SCHED_OK;
  }
  if (s->st.failing) { /* this plan will not commit */
    if (sched__failing_due(s, now)) sched__plan_timeout(s);
    return SCHED_OK;
  }
  uint32_t ns = s->st.nsrc;
  if (rank < ns && !report)
    return sched__fail_arg(s, SCHED_EINVAL, "trainer %s: broadcast done without figures",
                           w->name);
  if (rank >= ns && report && report->nsource_checksums &&
      (report->nsource_checksums != ns || !report->source_checksums))
    return sched__fail_arg(s, SCHED_EINVAL,
                           "worker %s: source_checksums: %" PRIu32 " given%s, plan %s has %" PRIu32
                           " source%s",
                           w->name, report->nsource_checksums,
                           report->source_checksums ? "" : " (NULL)", plan_id, ns,
                           ns == 1 ? "" : "s");
  if (rank < ns && report->nview_checksums &&
      (report->nview_checksums != s->st.nviews || !report->view_checksums))
    return sched__fail_arg(s, SCHED_EINVAL,
                           "trainer %s: view_checksums: %" PRIu32 " given%s, plan %s has %" PRIu32
                           " receiver view%s",
                           w->name, report->nview_checksums,
                           report->view_checksums ? "" : " (NULL)", plan_id, s->st.nviews,
                           s->st.nviews == 1 ? "" : "s");
  if (s->st.done[rank]) return SCHED_OK;
  s->st.done[rank] = 1;
  if (rank < ns && report->nview_checksums)
    memcpy(s->st.src_view_sums + (size_t)rank * s->st.nviews, report->view_checksums,
           s->st.nviews * sizeof *s->st.src_view_sums);
  if (rank < ns) {
    s->st.src[rank] = *report;
    s->st.src[rank].view_checksums = NULL; /* the caller's, for this call only */
    s->st.src[rank].nview_checksums = 0;
    s->st.src[rank].transport[sizeof s->st.src[rank].transport - 1] = '\0';
    s->st.src[rank].source_checksums = NULL; /* the caller's, for this call only */
    s->st.src[rank].nsource_checksums = 0;
  } else if (report) {
    uint64_t *row = s->st.rx_sums + (rank - ns) * ns;
    if (report->nsource_checksums) memcpy(row, report->source_checksums, ns * sizeof *row);
    else if (ns == 1) row[0] = report->weights_checksum;
  }
  if (++s->st.ndone < s->st.nparts) return SCHED_OK;
  if (s->st.catchup) sched__catchup_done(s, now);
  else sched__commit(s, now);
  sched__pump(s, now);
  return SCHED_OK;
}

/* ---- operator ------------------------------------------------------------------------------------------ */

int sched_hold_dispatch(sched *s, int64_t now, int hold) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  s->dispatch_held = hold != 0;
  sched__pump(s, now);
  return SCHED_OK;
}

int sched_has_rollout(const sched *s, uint64_t id) { return s && sched__pool_has(s, id); }

static int sched__cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

static int sched__cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

size_t sched_buffered_ids(const sched *s, uint64_t *out, size_t cap) {
  size_t n = s->npool < cap ? s->npool : cap;
  for (size_t i = 0; i < n; i++) out[i] = s->pool[i].r.id;
  if (n > 1) qsort(out, n, sizeof *out, sched__cmp_u64); /* out may be NULL when n is 0 */
  return s->npool;
}

size_t sched_open_groups(const sched *s, uint64_t *out, size_t cap) {
  size_t n = 0, total = 0;
  for (size_t i = 0; i < s->nreqs; i++) {
    const sched__request *q = &s->reqs[i];
    if (q->dead) continue;
    if (q->twin && q->twin < q->id) continue; /* listed with the first of the two */
    if (n < cap) out[n++] = q->group;
    total++;
  }
  /* A queued group has no request in flight: no id is listed twice. */
  for (size_t i = 0; i < s->nrequeue; i++) {
    if (n < cap) out[n++] = s->requeue[i].group;
    total++;
  }
  if (n > 1) qsort(out, n, sizeof *out, sched__cmp_u64);
  return total;
}

int sched_set_policy(sched *s, int64_t now, sched_mode policy) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  if (policy < SCHED_MODE_AUTO || policy > SCHED_MODE_COLOCATED)
    return sched__fail_arg(s, SCHED_EINVAL, "policy %d: not auto, direct, staged, host or colocated",
                           (int)policy);
  if (sched__terminal(s))
    return sched__fail_arg(s, SCHED_ESTATE, "run %s: already %s", s->cfg.run_id,
                           sched_run_state_name(s->state));
  s->policy = policy;
  return SCHED_OK;
}

int sched_fail(sched *s, int64_t now, const char *reason) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  if (sched__terminal(s))
    return sched__fail_arg(s, SCHED_ESTATE, "run %s: already %s", s->cfg.run_id,
                           sched_run_state_name(s->state));
  sched__fail_run(s, SCHED_ABORT_ERROR, reason && reason[0] ? reason : "failed by the orchestrator");
  return SCHED_OK;
}

int sched_stop(sched *s, int64_t now, const char *reason) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  if (sched__terminal(s) || s->state == SCHED_RUN_STOPPING)
    return sched__fail_arg(s, SCHED_ESTATE, "run %s: already %s", s->cfg.run_id,
                           sched_run_state_name(s->state));
  char msg[SCHED_TEXT_MAX];
  snprintf(msg, sizeof msg, "stop requested: %s", reason && reason[0] ? reason : "no reason given");
  /* A broadcast in flight is let finish (bounded by its deadline) and its step
   * committed: aborting it would interrupt every participant mid-transfer and
   * throw away a trained step. A plan not yet triggered is simply dropped. */
  if (s->st.phase != SCHED__BROADCASTING) sched__abort_plan(s, SCHED_ABORT_STOP, msg);
  sched__set_run_state(s, SCHED_RUN_STOPPING, "%s", msg);
  sched__pump(s, now);
  return SCHED_OK;
}

/* ---- time ------------------------------------------------------------------------------------------------ */

/* Names the first participant that has not yet done what the phase waits for. */
static const char *sched__laggard(sched *s, size_t *count) {
  const uint8_t *flags = s->st.phase == SCHED__ACKING ? s->st.acked : s->st.done;
  const char *first = NULL;
  *count = 0;
  for (size_t i = 0; i < s->st.nparts; i++) {
    if (flags[i]) continue;
    if (!first) first = sched__name(s, s->st.parts[i]);
    (*count)++;
  }
  return first ? first : "?";
}

static void sched__plan_timeout(sched *s) {
  char msg[2 * SCHED_TEXT_MAX]; /* cut to SCHED_TEXT_MAX where it is kept */
  size_t late = 0;
  sched__phase ph = s->st.phase;
  if (s->st.failing) {
    sched__fail_run(s, SCHED_ABORT_ERROR, s->st.fail_msg);
    return;
  }
  int acking = ph != SCHED__BROADCASTING;
  int64_t limit = acking ? s->st.ack_timeout_ms : s->st.broadcast_timeout_ms;
  const char *exp = s->st.expected[0] ? s->st.expected : NULL;
  if (ph == SCHED__PLANNING) {
    snprintf(msg, sizeof msg, "plan %s was not built within %" PRId64 " ms", s->st.plan_id, limit);
  } else {
    const char *who = sched__laggard(s, &late);
    /* Observed: nothing from the laggard within the bound; expected: what the
     * bound was made of. */
    snprintf(msg, sizeof msg, "plan %s: %s timed out: observed no %s from %s%s in %.1f s, expected "
             "within %.1f s%s%.120s%s",
             s->st.plan_id, acking ? "ack" : "broadcast", acking ? "ack" : "broadcast report", who,
             late > 1 ? " and others" : "", (double)limit / 1000.0, (double)limit / 1000.0,
             exp ? " (" : "", exp ? exp : "", exp ? ")" : "");
  }
  sched_abort_reason why = acking ? SCHED_ABORT_ACK_TIMEOUT : SCHED_ABORT_BROADCAST_TIMEOUT;
  if (s->state == SCHED_RUN_STOPPING) {
    /* The run was stopping anyway: give the step up, the run still ends STOPPED. */
    sched__abort_plan(s, why, msg);
    return;
  }
  sched__fail_run(s, why, msg);
}

/* A broadcast error stands once every participant has been heard from since
 * it came (none of them is dead or hung, so the error is no echo of one),
 * and SCHED__PEER_GRACE_MS has passed. */
static int sched__failing_due(sched *s, int64_t now) {
  if (!sched__plan_pending(s) || !s->st.failing) return 0;
  if (now >= s->st.deadline_ms) return 1;
  if (now < s->st.failing_since + SCHED__PEER_GRACE_MS) return 0;
  for (size_t i = 0; i < s->st.nparts; i++) {
    const sched_worker_info *w = sched__worker(s, s->st.parts[i]);
    if (w && sched__live(w) && w->last_seen_ms <= s->st.failing_since) return 0;
  }
  return 1;
}

int sched_tick(sched *s, int64_t now) {
  if (sched__begin(s, now)) return SCHED_EINVAL;
  if (sched__terminal(s)) return SCHED_OK;
  /* Losses first: a silent participant re-plans the step rather than failing the run.
   * In id order, as a scan of the workers would find them. */
  size_t nexp = 0;
  for (uint32_t k = s->seen_head;
       k != SCHED__NONE && now - s->workers[k].last_seen_ms >= s->cfg.heartbeat_timeout_ms;
       k = s->seen[k].next)
    s->expired[nexp++] = s->workers[k].id; /* room for every worker reserved at registration */
  if (nexp > 1) qsort(s->expired, nexp, sizeof *s->expired, sched__cmp_u32);
  for (size_t i = 0; i < nexp && !sched__terminal(s); i++) {
    sched_worker_info *w = sched__worker(s, s->expired[i]);
    char why[SCHED_TEXT_MAX];
    snprintf(why, sizeof why, "no heartbeat for %" PRId64 " ms", now - w->last_seen_ms);
    sched__lose(s, w, why);
  }
  if (!sched__terminal(s) && sched__plan_pending(s) &&
      (now >= s->st.deadline_ms || sched__failing_due(s, now)))
    sched__plan_timeout(s);
  /* Marked here, acted on by every dispatch until the group has its second
   * request: a slow request may find no other worker free at once. */
  sched_heap_entry e;
  while (sched_heap_size(&s->timers) && now - sched_heap_min(&s->timers)->prio >= s->cfg.request_timeout_ms &&
         sched_heap_pop(&s->timers, &e)) {
    size_t qi = sched__req_index(s, e.key);
    if (qi < s->nreqs) s->reqs[qi].overdue = 1;
  }
  sched__pump(s, now);
  return SCHED_OK;
}

/* ---- queries ---------------------------------------------------------------------------------------------- */

void sched_get_run(const sched *s, sched_run_info *out) {
  memset(out, 0, sizeof *out);
  out->state = s->state;
  snprintf(out->message, sizeof out->message, "%s", s->message);
  out->policy = s->policy;
  out->steps_done = s->steps_done;
  out->policy_version = s->steps_done;
  for (size_t i = 0; i < s->nworkers; i++) {
    const sched_worker_info *w = &s->workers[i];
    if (!sched__attached(w)) continue;
    if (w->role == SCHED_ROLE_TRAINER) out->trainers++;
    else out->inference++;
  }
}

void sched_get_counters(const sched *s, sched_counters *out) {
  *out = s->c;
  out->policy_version = s->steps_done;
  out->requests_in_flight = (uint32_t)s->nlive;
}

int sched_get_worker(const sched *s, uint32_t id, sched_worker_info *out) {
  sched_worker_info *w = sched__worker((sched *)s, id);
  if (!w) return SCHED_ENOENT;
  *out = *w;
  return SCHED_OK;
}

size_t sched_worker_count(const sched *s) { return s->nworkers; }

int sched_get_worker_at(const sched *s, size_t i, sched_worker_info *out) {
  if (i >= s->nworkers) return SCHED_ENOENT;
  *out = s->workers[i];
  return SCHED_OK;
}
