/* The worker table: an array in registration order. Ids only grow, so it is
 * also in id order, and an id (or an API id, "w-<id>") is found by binary
 * search. Command streams are found through the scheduler's hash map, from
 * the stream's address to its worker's id, with room taken at every add for
 * every entry to hold one, so that attaching never allocates. The
 * rlorch_workers gauge is kept as counts per role and state, moved as each
 * worker's state changes. Every RPC a worker sends thus costs the table
 * O(log n) at most, whatever the count. */
#include "orchestrator/daemon/workers.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/common/log.h"
#include "orchestrator/daemon/now.h"
#include "orchestrator/sched/sched_map.h"

/* Every worker the table holds (twice max_workers at most, the lost ones
 * included) keeps its per-worker series. */
_Static_assert(METRICS_MAX_SERIES >= 2 * WORKERS_MAX,
               "the per-worker metric families hold a series for every entry of the table");

struct workers_table {
  store *db;
  workers_metrics m;
  watch_hub *watch;
  workers_limits lim;
  workers_removed_fn on_remove;
  void *on_remove_ud;
  workers_entry **v; /* live and lost, registration order */
  size_t n, cap;
  sched_map streams; /* open command stream (its address) -> worker id */
  /* Workers by role (trainer, inference, other) and counted state
   * (registered, ready, busy, lost, other). */
  size_t counts[3][5];
  char run_id[64]; /* the active run, or "" */
  char err[256];   /* why the last workers_add failed */
};

int workers_new(store *db, const workers_metrics *m, watch_hub *watch, const workers_limits *lim,
                workers_table **out) {
  workers_table *t = calloc(1, sizeof *t);
  if (!t) return -1;
  sched_map_init(&t->streams);
  t->db = db;
  if (m) t->m = *m;
  t->watch = watch;
  t->lim = lim ? *lim : (workers_limits){.max_workers = WORKERS_MAX, .lost_retention_ms = 60000};
  if (t->lim.max_workers == 0 || t->lim.max_workers > WORKERS_MAX) t->lim.max_workers = WORKERS_MAX;
  *out = t;
  return 0;
}

void workers_on_remove(workers_table *t, workers_removed_fn fn, void *ud) {
  t->on_remove = fn;
  t->on_remove_ud = ud;
}

static void workers__manifest_free(Rlorch__V1__WeightManifest *m) {
  if (m) protobuf_c_message_free_unpacked(&m->base, NULL);
}

static void workers__parts_free(workers_entry *w) {
  for (size_t i = 0; i < w->nparts; i++) protobuf_c_message_free_unpacked(&w->parts[i]->base, NULL);
  free(w->parts);
  w->parts = NULL;
  w->nparts = 0;
}

void workers_take_parts(workers_entry *w, Rlorch__V1__RegisterRequest *q) {
  workers__parts_free(w);
  w->parts = q->parts;
  w->nparts = q->n_parts;
  q->parts = NULL;
  q->n_parts = 0;
}

static void workers__entry_free(workers_entry *w) {
  if (w->caps) protobuf_c_message_free_unpacked(&w->caps->base, NULL);
  workers__manifest_free(w->manifest);
  workers__parts_free(w);
  free(w->coloc_export);
  free(w);
}

void workers_free(workers_table *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n; i++) workers__entry_free(t->v[i]);
  free(t->v);
  sched_map_free(&t->streams);
  free(t);
}

/* ---- counts by role and state ---------------------------------------------- */

static size_t workers__role_ix(Rlorch__V1__WorkerRole r) {
  switch (r) {
  case RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER: return 0;
  case RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE: return 1;
  default: return 2;
  }
}

static size_t workers__state_ix(Rlorch__V1__WorkerState s) {
  switch (s) {
  case RLORCH__V1__WORKER_STATE__WORKER_STATE_REGISTERED: return 0;
  case RLORCH__V1__WORKER_STATE__WORKER_STATE_READY: return 1;
  case RLORCH__V1__WORKER_STATE__WORKER_STATE_BUSY: return 2;
  case RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST: return 3;
  default: return 4;
  }
}

#define WORKERS__LOST_IX 3

static size_t *workers__counter(workers_table *t, const workers_entry *w) {
  return &t->counts[workers__role_ix(w->role)][workers__state_ix(w->counted)];
}

/* Moves w from the count of the state it was counted in to its state now. */
static void workers__recount(workers_table *t, workers_entry *w) {
  if (w->counted == w->state) return;
  --*workers__counter(t, w);
  w->counted = w->state;
  ++*workers__counter(t, w);
}

size_t workers_count(const workers_table *t) { return t->n; }

size_t workers_live(const workers_table *t) {
  size_t lost = 0;
  for (size_t r = 0; r < 3; r++) lost += t->counts[r][WORKERS__LOST_IX];
  return t->n - lost;
}

/* ---- the stream index ---------------------------------------------------------- */

static uint64_t workers__stream_key(const rpc_call *c) { return (uint64_t)(uintptr_t)c; }

/* Room was taken at workers_add for every entry to hold a stream. */
static void workers__stream_put(workers_table *t, const workers_entry *w) {
  (void)sched_map_put(&t->streams, workers__stream_key(w->attach), w->id);
}

static void workers__stream_del(workers_table *t, const workers_entry *w) {
  (void)sched_map_del(&t->streams, workers__stream_key(w->attach));
}

const char *workers_last_error(const workers_table *t) { return t->err; }

/* Whether an entry other than `w` goes by w's name (and role, if asked):
 * per-worker series are labelled by name, which a worker that registered
 * again keeps. */
static int workers__name_taken(const workers_table *t, const workers_entry *w, int same_role) {
  for (size_t i = 0; i < t->n; i++) {
    const workers_entry *o = t->v[i];
    if (o != w && !strcmp(o->name, w->name) && (!same_role || o->role == w->role)) return 1;
  }
  return 0;
}

/* Drops w, a lost worker already out of t->v: the runner forgets it first,
 * then its row in the store and the series only it fed go. */
static void workers__drop(workers_table *t, workers_entry *w, int64_t now_mono_ms,
                          const char *why) {
  if (t->on_remove) t->on_remove(w, t->on_remove_ud);
  if (store_worker_delete(t->db, w->api_id) != 0)
    log_warn("store_failed", "worker=%s error=\"%s\"", w->api_id, store_errmsg(t->db));
  if (w->attach) workers__stream_del(t, w);
  --*workers__counter(t, w);
  if (!workers__name_taken(t, w, 1)) {
    const char *lv[] = {w->name, workers_role_label(w->role)};
    metrics_series_remove(t->m.heartbeat_age, lv);
  }
  if (!workers__name_taken(t, w, 0)) {
    const char *wl[] = {w->name};
    metrics_series_remove(t->m.requests_active, wl);
    metrics_series_remove(t->m.rollouts, wl);
    metrics_series_remove(t->m.tokens, wl);
    metrics_series_remove(t->m.generate_seconds, wl);
  }
  log_info("worker_removed", "worker=%s name=%s lost_s=%.1f reason=\"%s\"", w->api_id, w->name,
           (double)(now_mono_ms - w->lost_mono_ms) / 1000.0, why);
  workers__entry_free(w);
}

static void workers__remove(workers_table *t, size_t i, int64_t now_mono_ms, const char *why) {
  workers_entry *w = t->v[i];
  memmove(&t->v[i], &t->v[i + 1], (t->n - i - 1) * sizeof *t->v);
  t->n--;
  workers__drop(t, w, now_mono_ms, why);
  workers_gauge(t);
}

workers_entry *workers_at(workers_table *t, size_t i) { return i < t->n ? t->v[i] : NULL; }

workers_entry *workers_by_id(workers_table *t, uint32_t id) {
  size_t lo = 0, hi = t->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (t->v[mid]->id < id) lo = mid + 1;
    else hi = mid;
  }
  return lo < t->n && t->v[lo]->id == id ? t->v[lo] : NULL;
}

workers_entry *workers_by_api_id(workers_table *t, const char *api_id) {
  /* Only the form workers_add writes: "w-", then the id in decimal without
   * a leading zero. Anything else names no worker. */
  if (!api_id || api_id[0] != 'w' || api_id[1] != '-' || api_id[2] < '1' || api_id[2] > '9')
    return NULL;
  uint64_t id = 0;
  for (const char *p = api_id + 2; *p; p++) {
    if (*p < '0' || *p > '9') return NULL;
    id = id * 10 + (uint64_t)(*p - '0');
    if (id > UINT32_MAX) return NULL;
  }
  return workers_by_id(t, (uint32_t)id);
}

workers_entry *workers_by_stream(workers_table *t, const rpc_call *attach) {
  if (!attach) return NULL;
  const uint32_t *id = sched_map_get(&t->streams, workers__stream_key(attach));
  workers_entry *w = id ? workers_by_id(t, *id) : NULL;
  return w && w->attach == attach ? w : NULL;
}

/* protobuf-c has no deep copy: pack and unpack. */
static ProtobufCMessage *workers__pb_copy(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return NULL;
  protobuf_c_message_pack(m, buf);
  ProtobufCMessage *c = protobuf_c_message_unpack(m->descriptor, NULL, n, buf);
  free(buf);
  return c;
}

static int workers__add(workers_table *t, Rlorch__V1__WorkerRole role, const char *name,
                        const char *data_address, const Rlorch__V1__Capabilities *caps,
                        workers_entry **out);

int workers_add(workers_table *t, Rlorch__V1__WorkerRole role, const char *name,
                const char *data_address, const Rlorch__V1__Capabilities *caps,
                Rlorch__V1__WeightManifest *manifest, workers_entry **out) {
  int rc = workers__add(t, role, name, data_address, caps, out);
  if (rc == 0) (*out)->manifest = manifest;
  else workers__manifest_free(manifest);
  return rc;
}

static int workers__add(workers_table *t, Rlorch__V1__WorkerRole role, const char *name,
                        const char *data_address, const Rlorch__V1__Capabilities *caps,
                        workers_entry **out) {
  *out = NULL;
  t->err[0] = '\0';
  if (workers_live(t) >= t->lim.max_workers) {
    snprintf(t->err, sizeof t->err, "too many workers: %u are registered and alive (max_workers)",
             t->lim.max_workers);
    return -1;
  }
  /* Lost workers are kept for operators to see, but never at the price of a
   * live one: beyond twice the cap the longest-lost one makes room. */
  if (t->n >= 2 * (size_t)t->lim.max_workers) {
    size_t oldest = t->n;
    for (size_t i = 0; i < t->n; i++)
      if (t->v[i]->state == RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST &&
          (oldest == t->n || t->v[i]->lost_mono_ms < t->v[oldest]->lost_mono_ms))
        oldest = i;
    if (oldest < t->n) workers__remove(t, oldest, now_mono_ms(), "its room was needed");
  }
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 64;
    workers_entry **v = realloc(t->v, cap * sizeof *v);
    if (!v) return snprintf(t->err, sizeof t->err, "out of memory"), -2;
    t->v = v;
    t->cap = cap;
  }
  if (sched_map_reserve(&t->streams, t->cap) != 0)
    return snprintf(t->err, sizeof t->err, "out of memory"), -2;
  uint64_t id = 0;
  if (store_worker_next_id(t->db, &id) != 0) {
    snprintf(t->err, sizeof t->err, "cannot take a worker id: %s", store_errmsg(t->db));
    return -3;
  }
  if (id == 0 || id > UINT32_MAX) {
    snprintf(t->err, sizeof t->err, "worker ids of this data_dir are used up (%" PRIu64 ")", id);
    return -3;
  }
  workers_entry *w = calloc(1, sizeof *w);
  if (!w) return snprintf(t->err, sizeof t->err, "out of memory"), -2;
  w->id = (uint32_t)id;
  snprintf(w->api_id, sizeof w->api_id, "w-%u", w->id);
  w->role = role;
  w->state = RLORCH__V1__WORKER_STATE__WORKER_STATE_REGISTERED;
  snprintf(w->name, sizeof w->name, "%s", name && name[0] ? name : w->api_id);
  snprintf(w->data_address, sizeof w->data_address, "%s", data_address ? data_address : "");
  /* A failed copy leaves the worker without capabilities: it then plans as
   * one without CUDA or NCCL, which is safe. */
  if (caps) w->caps = (Rlorch__V1__Capabilities *)workers__pb_copy(&caps->base);
  workers_seen(w);
  w->table = t;
  w->counted = w->state;
  ++*workers__counter(t, w);
  t->v[t->n++] = w;
  *out = w;
  return 0;
}

void workers_set_manifest(workers_entry *w, Rlorch__V1__WeightManifest *m) {
  workers__manifest_free(w->manifest);
  w->manifest = m;
}

int workers_set_coloc_export(workers_entry *w, const char *plan_id, const uint8_t *b, size_t len) {
  free(w->coloc_export);
  w->coloc_export = NULL;
  w->coloc_export_len = 0;
  w->coloc_plan[0] = '\0';
  if (!len || !b || !plan_id) return 0;
  w->coloc_export = malloc(len);
  if (!w->coloc_export) return -1;
  memcpy(w->coloc_export, b, len);
  w->coloc_export_len = len;
  snprintf(w->coloc_plan, sizeof w->coloc_plan, "%s", plan_id);
  return 0;
}

void workers_seen(workers_entry *w) {
  w->last_seen_unix_ms = now_unix_ms();
  w->last_seen_mono_ms = now_mono_ms();
}

void workers_detach(workers_entry *w) {
  if (w->attach) workers__stream_del(w->table, w);
  w->attach = NULL;
}

void workers_end_stream(workers_entry *w, grpc_status_code code, const char *msg) {
  if (!w->attach) return;
  workers__stream_del(w->table, w);
  rpc_call_set_cancel_cb(w->attach, NULL, NULL);
  rpc_call_finish(w->attach, code, msg);
  w->attach = NULL;
}

void workers_attach(workers_entry *w, rpc_call *call) {
  workers_end_stream(w, GRPC_STATUS_ABORTED, "replaced by a newer Attach");
  w->attach = call;
  if (call) workers__stream_put(w->table, w);
  workers_seen(w);
  w->state = RLORCH__V1__WORKER_STATE__WORKER_STATE_READY;
  workers__recount(w->table, w);
}

int workers_send(workers_table *t, workers_entry *w, Rlorch__V1__Command *cmd) {
  if (!w->attach) return -1;
  cmd->seq = ++w->cmd_seq;
  cmd->run_id = t->run_id; /* protobuf-c never writes through it */
  return rpc_call_send(w->attach, &cmd->base);
}

void workers_set_run(workers_table *t, const char *run_id) {
  snprintf(t->run_id, sizeof t->run_id, "%s", run_id ? run_id : "");
  if (!run_id)
    for (size_t i = 0; i < t->n; i++) t->v[i]->in_run = 0;
}

const char *workers_role_label(Rlorch__V1__WorkerRole r) {
  return r == RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER ? "trainer" : "inference";
}

static const char *workers__state_label(Rlorch__V1__WorkerState s) {
  switch (s) {
  case RLORCH__V1__WORKER_STATE__WORKER_STATE_REGISTERED: return "registered";
  case RLORCH__V1__WORKER_STATE__WORKER_STATE_READY: return "ready";
  case RLORCH__V1__WORKER_STATE__WORKER_STATE_BUSY: return "busy";
  case RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST: return "lost";
  default: return "unknown";
  }
}

void workers_gauge(workers_table *t) {
  static const Rlorch__V1__WorkerState states[] = {
      RLORCH__V1__WORKER_STATE__WORKER_STATE_REGISTERED,
      RLORCH__V1__WORKER_STATE__WORKER_STATE_READY, RLORCH__V1__WORKER_STATE__WORKER_STATE_BUSY,
      RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST};
  static const Rlorch__V1__WorkerRole roles[] = {RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER,
                                                 RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE};
  for (size_t a = 0; a < 2; a++) {
    for (size_t b = 0; b < 4; b++) {
      const char *lv[] = {workers_role_label(roles[a]), workers__state_label(states[b])};
      metrics_gauge_set(t->m.states, lv,
                        (double)t->counts[workers__role_ix(roles[a])][workers__state_ix(states[b])]);
    }
  }
}

static void workers__info(const workers_table *t, const workers_entry *w,
                          Rlorch__V1__WorkerInfo *info) {
  rlorch__v1__worker_info__init(info);
  /* protobuf-c wants char*, but never writes through it when packing. */
  info->id = (char *)w->api_id;
  info->role = w->role;
  info->state = w->state;
  info->name = (char *)w->name;
  info->capabilities = w->caps;
  info->run_id = (char *)(t->run_id[0] && w->in_run ? t->run_id : "");
  info->policy_version = w->policy_version;
  info->last_heartbeat_unix_ms = w->last_seen_unix_ms;
  info->data_address = (char *)w->data_address;
}

void workers_publish(workers_table *t, workers_entry *w) {
  workers__recount(t, w);
  workers_gauge(t);
  Rlorch__V1__WorkerInfo info;
  workers__info(t, w, &info);
  store_worker_put(t->db, &info);
  if (!t->run_id[0]) return;
  Rlorch__V1__WorkerEvent we = RLORCH__V1__WORKER_EVENT__INIT;
  we.worker = &info;
  Rlorch__V1__RunEvent ev = RLORCH__V1__RUN_EVENT__INIT;
  ev.event_case = RLORCH__V1__RUN_EVENT__EVENT_WORKER;
  ev.worker = &we;
  watch_publish(t->watch, t->run_id, &ev);
}

void workers_mark_lost(workers_table *t, workers_entry *w, const char *reason) {
  w->state = RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST;
  w->lost_mono_ms = now_mono_ms();
  log_warn("worker_lost", "worker=%s name=%s reason=\"%s\"", w->api_id, w->name, reason);
  workers_end_stream(w, GRPC_STATUS_UNAVAILABLE, "worker declared lost");
  workers_publish(t, w);
}

void workers_set_stats(workers_entry *w, const Rlorch__V1__WorkerStats *s) {
  w->stats = *s;
  w->stats.base = (ProtobufCMessage)PROTOBUF_C_MESSAGE_INIT(&rlorch__v1__worker_stats__descriptor);
  w->has_stats = 1;
}

void workers_sweep(workers_table *t, int64_t now_mono_ms, int64_t timeout_ms) {
  /* The workers to remove go to the end in one pass (those kept keep their
   * order: swapping with the first removed one), so that removing many
   * moves the array once. */
  size_t kept = 0;
  for (size_t i = 0; i < t->n; i++) {
    workers_entry *w = t->v[i];
    if (w->state == RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST &&
        now_mono_ms - w->lost_mono_ms >= t->lim.lost_retention_ms)
      continue;
    t->v[i] = t->v[kept];
    t->v[kept++] = w;
  }
  size_t n = t->n;
  t->n = kept;
  for (size_t i = kept; i < n; i++)
    workers__drop(t, t->v[i], now_mono_ms, "lost_worker_retention_s passed");
  if (kept < n) workers_gauge(t);
  for (size_t i = 0; i < t->n; i++) {
    workers_entry *w = t->v[i];
    int64_t age = now_mono_ms - w->last_seen_mono_ms;
    const char *lv[] = {w->name, workers_role_label(w->role)};
    metrics_gauge_set(t->m.heartbeat_age, lv, age > 0 ? (double)age / 1000.0 : 0.0);
    if (w->has_stats) {
      const char *wl[] = {w->name};
      metrics_gauge_set(t->m.requests_active, wl, w->stats.requests_active);
      metrics_counter_set(t->m.rollouts, wl, (double)w->stats.rollouts_generated);
      metrics_counter_set(t->m.tokens, wl, (double)w->stats.tokens_generated);
      if (w->stats.generate_seconds >= 0)
        metrics_counter_set(t->m.generate_seconds, wl, w->stats.generate_seconds);
    }
    if (w->in_run || w->state == RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST) continue;
    if (age > timeout_ms) workers_mark_lost(t, w, "no heartbeat");
  }
}

void workers_disconnect(workers_table *t, const char *why) {
  for (size_t i = 0; i < t->n; i++) workers_end_stream(t->v[i], GRPC_STATUS_UNAVAILABLE, why);
}

size_t workers_list(workers_table *t, const char *run_id, Rlorch__V1__WorkerInfo ***out) {
  Rlorch__V1__WorkerInfo **v = calloc(t->n ? t->n : 1, sizeof *v);
  size_t n = 0;
  if (!v) {
    *out = NULL;
    return 0;
  }
  for (size_t i = 0; i < t->n; i++) {
    workers_entry *w = t->v[i];
    if (run_id && run_id[0] && !(t->run_id[0] && w->in_run && !strcmp(t->run_id, run_id)))
      continue;
    Rlorch__V1__WorkerInfo tmp;
    workers__info(t, w, &tmp);
    v[n] = (Rlorch__V1__WorkerInfo *)workers__pb_copy(&tmp.base);
    if (v[n]) n++;
  }
  *out = v;
  return n;
}

void workers_list_free(Rlorch__V1__WorkerInfo **w, size_t n) {
  for (size_t i = 0; i < n; i++) protobuf_c_message_free_unpacked(&w[i]->base, NULL);
  free(w);
}
