/* The daemon's worker table without streams: ids and lookups, ids that never
 * repeat across restarts, the cap on live workers, the removal of lost ones,
 * which workers a run lists, the heartbeat sweep outside a run, and what
 * publishing stores and counts. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/daemon/metrics.h"
#include "orchestrator/daemon/now.h"
#include "orchestrator/daemon/store.h"
#include "orchestrator/daemon/watch.h"
#include "orchestrator/daemon/workers.h"

static char dir[64];
static store *db;
static metrics_registry *reg;
static metrics_gauge *gauge, *age;
static watch_hub *hub;
static workers_table *tab;
#define MAXW 8        /* max_workers of the table under test */
#define RETAIN_MS 60000
static int removed;   /* on_remove calls */
static char removed_id[24];

static void on_removed(workers_entry *w, void *ud) {
  (void)ud;
  removed++;
  snprintf(removed_id, sizeof removed_id, "%s", w->api_id);
}

static workers_table *new_table(void) {
  workers_metrics wm = {.states = gauge, .heartbeat_age = age};
  workers_limits lim = {.max_workers = MAXW, .lost_retention_ms = RETAIN_MS};
  workers_table *t = NULL;
  cr_assert_eq(workers_new(db, &wm, hub, &lim, &t), 0);
  workers_on_remove(t, on_removed, NULL);
  return t;
}

static void setup(void) {
  snprintf(dir, sizeof dir, "%s/rlorch_workers_XXXXXX", P_tmpdir);
  cr_assert_not_null(mkdtemp(dir));
  char err[512] = "";
  cr_assert_eq(store_open(dir, &db, err, sizeof err), 0, "%s", err);
  reg = metrics_registry_new();
  static const char *const labels[] = {"role", "state", NULL};
  gauge = metrics_gauge_new(reg, "rlorch_workers", "Workers by role and state.", labels, err,
                            sizeof err);
  cr_assert_not_null(gauge, "%s", err);
  static const char *const age_labels[] = {"worker", "role", NULL};
  age = metrics_gauge_new(reg, "rlorch_worker_heartbeat_age_seconds", "Age.", age_labels, err,
                          sizeof err);
  cr_assert_not_null(age, "%s", err);
  cr_assert_eq(watch_hub_new(&hub), 0);
  removed = 0;
  tab = new_table();
}

static void teardown(void) {
  workers_free(tab);
  watch_hub_free(hub);
  metrics_registry_free(reg);
  store_close(db);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

TestSuite(workers, .init = setup, .fini = teardown);

static workers_entry *add(Rlorch__V1__WorkerRole role, const char *name) {
  workers_entry *w = NULL;
  cr_assert_eq(workers_add(tab, role, name, "", NULL, NULL, &w), 0);
  return w;
}

static int count_stored(const Rlorch__V1__WorkerInfo *w, void *arg) {
  (void)w;
  ++*(int *)arg;
  return 0;
}

/* Whether the rendered metrics hold `series` (name, labels and value). */
static int gauge_has(const char *series) {
  char *buf = NULL;
  size_t len = 0;
  cr_assert_eq(metrics_render(reg, &buf, &len), 0);
  int found = strstr(buf, series) != NULL;
  free(buf);
  return found;
}

Test(workers, ids_names_and_lookups) {
  workers_entry *t = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER, "trainer-0");
  workers_entry *i = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "");
  cr_assert_str_eq(t->api_id, "w-1");
  cr_assert_str_eq(i->api_id, "w-2");
  cr_assert_str_eq(i->name, "w-2", "an empty name becomes the API id");
  cr_assert_eq(i->state, RLORCH__V1__WORKER_STATE__WORKER_STATE_REGISTERED);
  cr_assert_eq(workers_by_id(tab, 2), i);
  cr_assert_eq(workers_by_api_id(tab, "w-1"), t);
  cr_assert_null(workers_by_api_id(tab, "w-9"));
  cr_assert_null(workers_by_id(tab, 9));
  cr_assert_eq(workers_count(tab), 2);
  cr_assert_eq(workers_at(tab, 1), i);
  cr_assert_null(workers_at(tab, 2));
  Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
  cr_assert_eq(workers_send(tab, t, &cmd), -1, "no command stream yet");
  cr_assert_eq(t->cmd_seq, 0);
}

Test(workers, the_cap_counts_live_workers_only) {
  workers_entry *v[MAXW];
  for (int k = 0; k < MAXW; k++) v[k] = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "x");
  workers_entry *w = NULL;
  cr_assert_eq(workers_add(tab, RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "y", "", NULL,
                           NULL, &w),
               -1);
  cr_assert_null(w);
  cr_assert(strstr(workers_last_error(tab), "too many workers") &&
                strstr(workers_last_error(tab), "8") && strstr(workers_last_error(tab), "max_workers"),
            "%s", workers_last_error(tab));
  /* Lost ones do not count: a worker that registers again finds room. */
  workers_mark_lost(tab, v[3], "gone");
  cr_assert_eq(workers_live(tab), MAXW - 1);
  w = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "y");
  cr_assert_str_eq(w->api_id, "w-9");
  cr_assert_eq(workers_count(tab), MAXW + 1, "the lost one is still listed");
}

/* A flood of registrations that never attach: each is lost, then removed,
 * and real workers still get in; the table never holds more than twice the
 * cap meanwhile. */
Test(workers, a_flood_that_is_lost_locks_nobody_out) {
  for (int round = 0; round < 6; round++) {
    for (int k = 0; k < MAXW; k++) {
      workers_entry *w = NULL;
      cr_assert_eq(workers_add(tab, RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "flood", "",
                               NULL, NULL, &w),
                   0, "round %d: %s", round, workers_last_error(tab));
      w->last_seen_mono_ms = now_mono_ms() - 10000;
    }
    workers_sweep(tab, now_mono_ms(), 5000); /* all silent: lost, not yet removed */
    cr_assert_eq(workers_live(tab), 0);
    cr_assert_leq(workers_count(tab), 2 * MAXW, "round %d: %zu entries", round,
                  workers_count(tab));
  }
  workers_entry *real = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER, "real");
  cr_assert_not_null(real);
  cr_assert_gt(removed, 0, "the longest-lost ones made room");
  /* After the retention every lost one is gone, its row in the store too. */
  workers_sweep(tab, now_mono_ms() + RETAIN_MS, 5000 + RETAIN_MS);
  cr_assert_eq(workers_count(tab), 1);
  cr_assert_eq(workers_at(tab, 0), real);
}

Test(workers, lost_workers_are_removed_after_the_retention) {
  workers_entry *gone = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "gone");
  workers_entry *again = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "again");
  workers_entry *stay = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "stay");
  workers_publish(tab, gone);
  workers_mark_lost(tab, gone, "test");
  workers_mark_lost(tab, again, "test");
  workers_entry *back = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "again");
  int64_t lost_at = gone->lost_mono_ms;
  workers_sweep(tab, lost_at + RETAIN_MS - 1, 5000 + RETAIN_MS);
  cr_assert_eq(workers_count(tab), 4, "kept within the retention");
  cr_assert(gauge_has("rlorch_worker_heartbeat_age_seconds{worker=\"gone\",role=\"inference\"}"));
  int stored = 0;
  cr_assert_eq(store_workers_list(db, NULL, count_stored, &stored), 0);
  cr_assert_eq(stored, 2, "gone and again are stored, as lost");
  workers_sweep(tab, lost_at + RETAIN_MS + 100, 5000 + RETAIN_MS + 100);
  cr_assert_eq(workers_count(tab), 2);
  cr_assert_eq(workers_at(tab, 0), stay);
  cr_assert_eq(workers_at(tab, 1), back);
  cr_assert_null(workers_by_api_id(tab, "w-1"), "its id reaches nothing any more");
  cr_assert_eq(removed, 2);
  stored = 0;
  cr_assert_eq(store_workers_list(db, NULL, count_stored, &stored), 0);
  cr_assert_eq(stored, 0, "their rows went with them");
  cr_assert_not(gauge_has("worker=\"gone\""), "its series went with it");
  cr_assert(gauge_has("rlorch_worker_heartbeat_age_seconds{worker=\"again\",role=\"inference\"}"),
            "a name that registered again keeps its series");
  cr_assert(gauge_has("rlorch_workers{role=\"inference\",state=\"lost\"} 0"));
}

Test(workers, ids_never_repeat_across_restarts) {
  add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER, "a");
  add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "b");
  workers_free(tab);
  store_close(db);
  char err[512] = "";
  cr_assert_eq(store_open(dir, &db, err, sizeof err), 0, "%s", err);
  tab = new_table(); /* a daemon started again on the same data_dir */
  workers_entry *w = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "c");
  cr_assert_str_eq(w->api_id, "w-3", "not w-1 again");
  cr_assert_eq(w->id, 3);
  cr_assert_null(workers_by_api_id(tab, "w-1"), "an old id names no new worker");
}

Test(workers, list_by_run_and_leaving_it) {
  workers_entry *a = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER, "a");
  add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "b");
  workers_set_run(tab, "r1");
  a->in_run = 1;
  Rlorch__V1__WorkerInfo **v = NULL;
  size_t n = workers_list(tab, "r1", &v);
  cr_assert_eq(n, 1);
  cr_assert_str_eq(v[0]->id, "w-1");
  cr_assert_str_eq(v[0]->run_id, "r1");
  workers_list_free(v, n);
  n = workers_list(tab, "r2", &v);
  cr_assert_eq(n, 0, "another run has no workers");
  workers_list_free(v, n);
  n = workers_list(tab, "", &v);
  cr_assert_eq(n, 2);
  cr_assert_str_eq(v[1]->run_id, "", "not in the run");
  workers_list_free(v, n);
  workers_set_run(tab, NULL);
  cr_assert_not(a->in_run, "the run ended");
  n = workers_list(tab, "r1", &v);
  cr_assert_eq(n, 0);
  workers_list_free(v, n);
}

Test(workers, sweep_loses_silent_workers_outside_the_run) {
  workers_entry *quiet = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "quiet");
  workers_entry *inrun = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "in-run");
  workers_entry *fresh = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "fresh");
  int64_t now = now_mono_ms();
  quiet->last_seen_mono_ms = now - 5001;
  inrun->last_seen_mono_ms = now - 5001;
  inrun->in_run = 1; /* its run's scheduler judges it */
  fresh->last_seen_mono_ms = now - 5000;
  workers_sweep(tab, now, 5000);
  cr_assert_eq(quiet->state, RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST);
  cr_assert_eq(inrun->state, RLORCH__V1__WORKER_STATE__WORKER_STATE_REGISTERED);
  cr_assert_eq(fresh->state, RLORCH__V1__WORKER_STATE__WORKER_STATE_REGISTERED);
  int stored = 0;
  cr_assert_eq(store_workers_list(db, NULL, count_stored, &stored), 0);
  cr_assert_eq(stored, 1, "the lost worker is stored");
  cr_assert(gauge_has("rlorch_workers{role=\"inference\",state=\"lost\"} 1"));
  cr_assert(gauge_has("rlorch_workers{role=\"inference\",state=\"registered\"} 2"));
}

/* A manifest as a request's decoder leaves it: a protobuf-c tree of the
 * default allocator, which the table takes. */
static Rlorch__V1__WeightManifest *manifest_of(const char *name, uint64_t *shape) {
  Rlorch__V1__TensorSpec t = RLORCH__V1__TENSOR_SPEC__INIT;
  t.name = (char *)name;
  t.shape = shape;
  t.n_shape = 1;
  Rlorch__V1__TensorSpec *tp[] = {&t};
  Rlorch__V1__WeightManifest m = RLORCH__V1__WEIGHT_MANIFEST__INIT;
  m.tensors = tp;
  m.n_tensors = 1;
  uint8_t buf[256];
  size_t n = rlorch__v1__weight_manifest__pack(&m, buf);
  Rlorch__V1__WeightManifest *out = rlorch__v1__weight_manifest__unpack(NULL, n, buf);
  cr_assert_not_null(out);
  return out;
}

Test(workers, manifest_is_taken) {
  uint64_t shape[] = {2};
  workers_entry *w = NULL;
  Rlorch__V1__WeightManifest *m = manifest_of("w", shape);
  cr_assert_eq(workers_add(tab, RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER, "t", "h:1", NULL,
                           m, &w),
               0);
  cr_assert_eq(w->manifest, m, "taken, not copied");
  cr_assert_str_eq(w->manifest->tensors[0]->name, "w");
  cr_assert_str_eq(w->data_address, "h:1");
  /* A replacement is taken too; the old one is freed (ASan's leak check). */
  Rlorch__V1__WeightManifest *v = manifest_of("v", shape);
  workers_set_manifest(w, v);
  cr_assert_eq(w->manifest, v);
  cr_assert_str_eq(w->manifest->tensors[0]->name, "v");
}

/* ---- the indexes ------------------------------------------------------------ */

/* Stand-ins for command streams: only their addresses are used, as keys. A
 * stream the table would end (a replaced one, a lost worker's) is detached
 * first, so none is ever called. */
static char fake_calls[512];
#define FAKE_CALL(i) ((rpc_call *)(void *)&fake_calls[(i)])

/* What a scan of the table finds, the way the lookups worked before they
 * were indexed. */
static workers_entry *scan_id(uint32_t id) {
  for (size_t i = 0; i < workers_count(tab); i++)
    if (workers_at(tab, i)->id == id) return workers_at(tab, i);
  return NULL;
}

static workers_entry *scan_stream(const rpc_call *c) {
  for (size_t i = 0; i < workers_count(tab); i++)
    if (workers_at(tab, i)->attach == c) return workers_at(tab, i);
  return NULL;
}

static void assert_indexes_match_a_scan(uint32_t max_id, const char *when) {
  char api[32];
  for (uint32_t id = 0; id <= max_id + 1; id++) {
    workers_entry *w = scan_id(id);
    cr_assert_eq(workers_by_id(tab, id), w, "%s: workers_by_id(%u)", when, id);
    snprintf(api, sizeof api, "w-%u", id);
    cr_assert_eq(workers_by_api_id(tab, api), id ? w : NULL, "%s: workers_by_api_id(%s)", when,
                 api);
  }
  for (size_t i = 0; i < sizeof fake_calls; i++)
    cr_assert_eq(workers_by_stream(tab, FAKE_CALL(i)), scan_stream(FAKE_CALL(i)),
                 "%s: workers_by_stream(%zu)", when, i);
  size_t live = 0;
  size_t counts[2][4] = {{0}};
  for (size_t i = 0; i < workers_count(tab); i++) {
    const workers_entry *w = workers_at(tab, i);
    if (i) cr_assert_gt(w->id, workers_at(tab, i - 1)->id, "%s: in id order", when);
    live += w->state != RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST;
    counts[w->role == RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE][w->state - 1]++;
  }
  cr_assert_eq(workers_live(tab), live, "%s: workers_live", when);
  workers_gauge(tab);
  static const char *const roles[] = {"trainer", "inference"};
  static const char *const states[] = {"registered", "ready", "busy", "lost"};
  char series[128];
  for (size_t r = 0; r < 2; r++)
    for (size_t s = 0; s < 4; s++) {
      snprintf(series, sizeof series, "rlorch_workers{role=\"%s\",state=\"%s\"} %zu\n", roles[r],
               states[s], counts[r][s]);
      cr_assert(gauge_has(series), "%s: %s", when, series);
    }
}

Test(workers, lookups_after_losses_removals_and_registering_again) {
  workers_entry *a = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "a");
  workers_entry *b = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "b");
  workers_entry *c = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER, "c");
  workers_attach(a, FAKE_CALL(1));
  workers_attach(b, FAKE_CALL(2));
  cr_assert_eq(workers_by_stream(tab, FAKE_CALL(1)), a);
  cr_assert_eq(workers_by_stream(tab, FAKE_CALL(2)), b);
  cr_assert_null(workers_by_stream(tab, FAKE_CALL(3)));
  cr_assert_null(workers_by_stream(tab, NULL), "a worker without a stream is not found by NULL");
  workers_publish(tab, a);
  cr_assert(gauge_has("rlorch_workers{role=\"inference\",state=\"ready\"} 2"));
  cr_assert(gauge_has("rlorch_workers{role=\"trainer\",state=\"registered\"} 1"));
  /* b loses its stream and is lost; "b" registers again under a new id. */
  workers_detach(b);
  cr_assert_null(workers_by_stream(tab, FAKE_CALL(2)));
  workers_mark_lost(tab, b, "test");
  workers_entry *b2 = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "b");
  workers_attach(b2, FAKE_CALL(2)); /* gRPC may reuse a freed call's address */
  workers_publish(tab, b2);
  cr_assert_eq(workers_by_stream(tab, FAKE_CALL(2)), b2);
  cr_assert_eq(workers_by_api_id(tab, "w-2"), b, "the lost one keeps its id");
  cr_assert_eq(workers_by_api_id(tab, "w-4"), b2);
  cr_assert_eq(workers_live(tab), 3);
  cr_assert(gauge_has("rlorch_workers{role=\"inference\",state=\"lost\"} 1"));
  cr_assert(gauge_has("rlorch_workers{role=\"inference\",state=\"ready\"} 2"));
  /* Removed after the retention: its ids reach nothing, the others still
   * reach theirs. */
  workers_sweep(tab, b->lost_mono_ms + RETAIN_MS, 10 * RETAIN_MS);
  cr_assert_null(workers_by_api_id(tab, "w-2"));
  cr_assert_null(workers_by_id(tab, 2));
  cr_assert_eq(workers_by_id(tab, 1), a);
  cr_assert_eq(workers_by_id(tab, 3), c);
  cr_assert_eq(workers_by_id(tab, 4), b2);
  cr_assert(gauge_has("rlorch_workers{role=\"inference\",state=\"lost\"} 0"));
  /* Names that are not an id the table hands out find nothing. */
  static const char *const bad[] = {"", "w", "w-", "w-0", "w-01", "w-1x", "x-1", "W-1",
                                    "w--1", "w-4294967297", "w-99999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_assert_null(workers_by_api_id(tab, bad[i]), "%s", bad[i]);
  cr_assert_null(workers_by_api_id(tab, NULL));
  workers_detach(a);
  workers_detach(b2);
}

/* The model of which entries the table holds: removals are seen through the
 * on_remove callback. */
static char model[4096][24];
static size_t nmodel;

static void on_removed_model(workers_entry *w, void *ud) {
  (void)ud;
  for (size_t i = 0; i < nmodel; i++)
    if (!strcmp(model[i], w->api_id)) {
      memmove(&model[i], &model[i + 1], (nmodel - i - 1) * sizeof model[0]);
      nmodel--;
      return;
    }
  cr_assert_fail("removed %s, which the table did not hold", w->api_id);
}

Test(workers, indexes_agree_with_a_scan_over_random_operations) {
  workers_free(tab);
  workers_metrics wm = {.states = gauge, .heartbeat_age = age};
  workers_limits lim = {.max_workers = 40, .lost_retention_ms = RETAIN_MS};
  cr_assert_eq(workers_new(db, &wm, hub, &lim, &tab), 0);
  workers_on_remove(tab, on_removed_model, NULL);
  nmodel = 0;
  srand(14);
  uint32_t max_id = 0;
  size_t next_call = 0;
  static const char *const names[] = {"n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7"};
  char when[64];
  for (int op = 0; op < 3000; op++) {
    int k = rand() % 10;
    size_t n = workers_count(tab);
    workers_entry *w = n ? workers_at(tab, (size_t)rand() % n) : NULL;
    if (k < 3) { /* register, often under a name already in use */
      size_t live = workers_live(tab);
      workers_entry *e = NULL;
      int rc = workers_add(tab,
                           rand() % 4 ? RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE
                                      : RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER,
                           names[rand() % 8], "", NULL, NULL, &e);
      cr_assert_eq(rc, live >= 40 ? -1 : 0, "op %d: %s", op, workers_last_error(tab));
      if (rc == 0) {
        max_id = e->id;
        snprintf(model[nmodel++], sizeof model[0], "%s", e->api_id);
      }
    } else if (k < 5 && w && !w->attach &&
               w->state != RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST) {
      workers_attach(w, FAKE_CALL(next_call));
      next_call = (next_call + 1 + (size_t)rand() % 7) % sizeof fake_calls;
      if (scan_stream(FAKE_CALL(next_call))) next_call = (next_call + 1) % sizeof fake_calls;
      if (rand() % 2) workers_publish(tab, w);
    } else if (k < 6 && w) {
      workers_detach(w);
    } else if (k < 7 && w && w->state != RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST) {
      w->state = rand() % 2 ? RLORCH__V1__WORKER_STATE__WORKER_STATE_BUSY
                            : RLORCH__V1__WORKER_STATE__WORKER_STATE_READY;
      workers_publish(tab, w); /* as the runner does */
    } else if (k < 9 && w && w->state != RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST) {
      workers_detach(w);
      workers_mark_lost(tab, w, "test");
      w->lost_mono_ms -= rand() % RETAIN_MS; /* lost at various times */
    } else if (k == 9) {
      workers_sweep(tab, now_mono_ms() + rand() % RETAIN_MS, 100 * (int64_t)RETAIN_MS);
    }
    cr_assert_eq(workers_count(tab), nmodel, "op %d", op);
    for (size_t i = 0; i < nmodel; i++)
      cr_assert_str_eq(workers_at(tab, i)->api_id, model[i], "op %d: entry %zu", op, i);
    if (op % 25 == 0 || op == 2999) {
      snprintf(when, sizeof when, "op %d", op);
      assert_indexes_match_a_scan(max_id, when);
    }
  }
  cr_assert_gt(max_id, 200, "registrations went through the room-making removal");
  for (size_t i = 0; i < workers_count(tab); i++) workers_detach(workers_at(tab, i));
}

/* The cluster-scale goal: 10,000 inference workers and 256 trainer ranks
 * registered and live at once under a max_workers of 10,256. Each is found
 * by id, by API id and (the attached inference workers) by command stream,
 * the gauge counts them all, and the one after them is refused naming the
 * cap, without taking an id. */
#define SCALE_TRAINERS 256u
#define SCALE_INFERENCE 10000u
#define SCALE_MAX (SCALE_TRAINERS + SCALE_INFERENCE)
_Static_assert(SCALE_MAX <= WORKERS_MAX, "the table's cap holds the cluster-scale goal");
static char scale_calls[SCALE_MAX]; /* stand-in streams, as fake_calls */

Test(workers, ten_thousand_inference_workers_and_256_trainers_live_at_once) {
  workers_free(tab);
  workers_metrics wm = {.states = gauge, .heartbeat_age = age};
  workers_limits lim = {.max_workers = SCALE_MAX, .lost_retention_ms = RETAIN_MS};
  cr_assert_eq(workers_new(db, &wm, hub, &lim, &tab), 0);
  workers_entry **v = calloc(SCALE_MAX, sizeof *v);
  cr_assert_not_null(v);
  char name[32], api[32];
  for (uint32_t k = 0; k < SCALE_MAX; k++) {
    int trainer = k < SCALE_TRAINERS;
    snprintf(name, sizeof name, "%s-%u", trainer ? "trainer" : "inference", k);
    int rc = workers_add(tab,
                         trainer ? RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER
                                 : RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE,
                         name, "", NULL, NULL, &v[k]);
    cr_assert_eq(rc, 0, "worker %u: %s", k, workers_last_error(tab));
    if (!trainer) workers_attach(v[k], (rpc_call *)(void *)&scale_calls[k]);
  }
  cr_assert_eq(workers_live(tab), SCALE_MAX);
  cr_assert_eq(workers_count(tab), SCALE_MAX);
  for (uint32_t k = 0; k < SCALE_MAX; k++) {
    snprintf(api, sizeof api, "w-%u", k + 1);
    cr_assert_str_eq(v[k]->api_id, api);
    cr_assert_eq(workers_by_id(tab, k + 1), v[k], "workers_by_id(%u)", k + 1);
    cr_assert_eq(workers_by_api_id(tab, api), v[k], "workers_by_api_id(%s)", api);
    if (k >= SCALE_TRAINERS)
      cr_assert_eq(workers_by_stream(tab, (rpc_call *)(void *)&scale_calls[k]), v[k],
                   "workers_by_stream(%u)", k);
  }
  cr_assert_null(workers_by_id(tab, SCALE_MAX + 1));
  cr_assert_null(workers_by_stream(tab, (rpc_call *)(void *)&scale_calls[0]), "a trainer never attached");
  workers_gauge(tab);
  cr_assert(gauge_has("rlorch_workers{role=\"trainer\",state=\"registered\"} 256\n"));
  cr_assert(gauge_has("rlorch_workers{role=\"inference\",state=\"ready\"} 10000\n"));
  cr_assert(gauge_has("rlorch_workers{role=\"inference\",state=\"registered\"} 0\n"));

  workers_entry *w = NULL;
  cr_assert_eq(workers_add(tab, RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "one-too-many", "",
                           NULL, NULL, &w),
               -1);
  cr_assert_null(w);
  cr_assert_str_eq(workers_last_error(tab),
                   "too many workers: 10256 are registered and alive (max_workers)");
  cr_assert_eq(workers_count(tab), SCALE_MAX, "a refused worker is not held");
  /* A lost worker makes room, and the refusal took no id. */
  workers_detach(v[SCALE_MAX - 1]);
  workers_mark_lost(tab, v[SCALE_MAX - 1], "test");
  w = add(RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE, "again");
  snprintf(api, sizeof api, "w-%u", SCALE_MAX + 1);
  cr_assert_str_eq(w->api_id, api);
  cr_assert_eq(workers_live(tab), SCALE_MAX);
  cr_assert(gauge_has("rlorch_workers{role=\"inference\",state=\"lost\"} 1\n"));
  for (size_t i = 0; i < workers_count(tab); i++) workers_detach(workers_at(tab, i));
  free(v);
}
