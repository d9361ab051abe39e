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
