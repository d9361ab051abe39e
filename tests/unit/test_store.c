/* SQLite store: runs, steps, workers, restart, migrations, bad data_dir. */
#include <criterion/criterion.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/daemon/store.h"

static char dir[64];

static void setup(void) {
  snprintf(dir, sizeof dir, "%s/rlorch_store_XXXXXX", P_tmpdir);
  cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "chmod -R u+w '%s'; rm -rf '%s'", dir, dir);
  cr_assert_eq(system(cmd), 0);
}

TestSuite(store, .init = setup, .fini = teardown);

static store *open_ok(const char *d) {
  store *s = NULL;
  char err[512] = "";
  cr_assert_eq(store_open(d, &s, err, sizeof err), 0, "%s", err);
  cr_assert_not_null(s);
  return s;
}

static Rlorch__V1__Run *create(store *s, const char *name, int64_t now) {
  Rlorch__V1__RunSpec spec = RLORCH__V1__RUN_SPEC__INIT;
  spec.name = (char *)name;
  spec.preset = "100m";
  spec.steps = 10;
  spec.async_bound_case = RLORCH__V1__RUN_SPEC__ASYNC_BOUND_MAX_ASYNC_LEVEL; /* 0 is a value */
  spec.max_async_level = 1;
  spec.policy = RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_STAGED;
  spec.rollouts_per_step = 8;
  Rlorch__V1__Run *r = NULL;
  cr_assert_eq(store_run_create(s, &spec, now, &r), 0, "%s", store_errmsg(s));
  return r;
}

static void run_free(Rlorch__V1__Run *r) { protobuf_c_message_free_unpacked(&r->base, NULL); }

Test(store, run_create_get_update_list) {
  store *s = open_ok(dir);
  Rlorch__V1__Run *a = create(s, "first", 1000);
  cr_assert_str_eq(a->id, "run-1");
  cr_assert_eq(a->state, RLORCH__V1__RUN_STATE__RUN_STATE_PENDING);
  cr_assert_eq(a->policy, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_STAGED);
  cr_assert_eq(a->created_unix_ms, 1000);
  cr_assert_eq(a->updated_unix_ms, 1000);
  cr_assert_str_eq(a->spec->name, "first");
  cr_assert_eq(a->spec->steps, 10);
  Rlorch__V1__Run *b = create(s, "second", 2000);
  cr_assert_str_eq(b->id, "run-2");

  a->state = RLORCH__V1__RUN_STATE__RUN_STATE_RUNNING;
  a->steps_done = 4;
  if (a->message != protobuf_c_empty_string) free(a->message); /* unpacked strings are malloc'd */
  a->message = strdup("going");
  a->updated_unix_ms = 3000;
  cr_assert_eq(store_run_update(s, a), 0, "%s", store_errmsg(s));
  Rlorch__V1__Run *g = NULL;
  cr_assert_eq(store_run_get(s, "run-1", &g), 0);
  cr_assert_eq(g->state, RLORCH__V1__RUN_STATE__RUN_STATE_RUNNING);
  cr_assert_eq(g->steps_done, 4);
  cr_assert_str_eq(g->message, "going");
  cr_assert_eq(g->updated_unix_ms, 3000);
  run_free(g);

  Rlorch__V1__Run **v = NULL;
  size_t n = 0;
  cr_assert_eq(store_run_list(s, 0, 0, &v, &n), 0);
  cr_assert_eq(n, 2);
  cr_assert_str_eq(v[0]->id, "run-2", "newest first");
  cr_assert_str_eq(v[1]->id, "run-1");
  store_runs_free(v, n);
  cr_assert_eq(store_run_list(s, RLORCH__V1__RUN_STATE__RUN_STATE_RUNNING, 0, &v, &n), 0);
  cr_assert_eq(n, 1);
  cr_assert_str_eq(v[0]->id, "run-1");
  store_runs_free(v, n);
  cr_assert_eq(store_run_list(s, RLORCH__V1__RUN_STATE__RUN_STATE_FAILED, 0, &v, &n), 0);
  cr_assert_eq(n, 0);
  store_runs_free(v, n);
  cr_assert_eq(store_run_list(s, 0, 1, &v, &n), 0);
  cr_assert_eq(n, 1, "limit");
  cr_assert_str_eq(v[0]->id, "run-2");
  store_runs_free(v, n);

  run_free(a);
  run_free(b);
  store_close(s);
}

Test(store, not_found_and_invalid) {
  store *s = open_ok(dir);
  Rlorch__V1__Run *r = (Rlorch__V1__Run *)1;
  cr_assert_eq(store_run_get(s, "run-42", &r), STORE_NOT_FOUND);
  cr_assert_null(r);
  cr_assert(strstr(store_errmsg(s), "run-42"), "%s", store_errmsg(s));
  Rlorch__V1__Run ghost = RLORCH__V1__RUN__INIT;
  ghost.id = "run-9";
  cr_assert_eq(store_run_update(s, &ghost), STORE_ENOTFOUND);
  ghost.id = "";
  cr_assert_eq(store_run_update(s, &ghost), STORE_EINVAL);
  cr_assert_eq(store_run_get(s, "", &r), STORE_EINVAL);
  Rlorch__V1__StepRecord rec = RLORCH__V1__STEP_RECORD__INIT;
  cr_assert_eq(store_step_put(s, &rec), STORE_EINVAL);
  cr_assert(strstr(store_errmsg(s), "run_id"), "%s", store_errmsg(s));
  Rlorch__V1__WorkerInfo w = RLORCH__V1__WORKER_INFO__INIT;
  cr_assert_eq(store_worker_put(s, &w), STORE_EINVAL);
  cr_assert_str_neq(store_strerror(STORE_ENOTFOUND), store_strerror(STORE_EIO));
  store_close(s);
}

typedef struct {
  uint64_t steps[16];
  double secs[16];
  size_t n;
  size_t stop_after;
} collect;

static int on_step(const Rlorch__V1__StepRecord *r, void *arg) {
  collect *c = arg;
  c->steps[c->n] = r->step;
  c->secs[c->n] = r->total_seconds;
  c->n++;
  return c->stop_after && c->n >= c->stop_after ? 7 : 0;
}

Test(store, steps_ordered_written_once_and_per_run) {
  store *s = open_ok(dir);
  const uint64_t order[] = {3, 0, 2, 1, 4};
  for (size_t i = 0; i < 5; i++) {
    Rlorch__V1__StepRecord rec = RLORCH__V1__STEP_RECORD__INIT;
    rec.run_id = "run-1";
    rec.step = order[i];
    rec.total_seconds = (double)order[i] + 0.5;
    rec.transport = "host-tcp";
    cr_assert_eq(store_step_put(s, &rec), 0, "%s", store_errmsg(s));
  }
  Rlorch__V1__StepRecord other = RLORCH__V1__STEP_RECORD__INIT;
  other.run_id = "run-2";
  other.step = 1;
  cr_assert_eq(store_step_put(s, &other), 0);
  Rlorch__V1__StepRecord again = RLORCH__V1__STEP_RECORD__INIT;
  again.run_id = "run-1";
  again.step = 2;
  again.total_seconds = 99;
  cr_assert_eq(store_step_put(s, &again), STORE_EEXIST, "a step is written once");
  cr_assert(strstr(store_errmsg(s), "run-1 step 2 is recorded already"), "%s", store_errmsg(s));

  collect c = {0};
  cr_assert_eq(store_steps_list(s, "run-1", -1, on_step, &c), 0);
  cr_assert_eq(c.n, 5);
  for (size_t i = 0; i < 5; i++) cr_assert_eq(c.steps[i], i, "step order");
  cr_assert_float_eq(c.secs[2], 2.5, 1e-12, "the first record is kept");
  cr_assert_float_eq(c.secs[3], 3.5, 1e-12);

  collect after = {0};
  cr_assert_eq(store_steps_list(s, "run-1", 2, on_step, &after), 0);
  cr_assert_eq(after.n, 2);
  cr_assert_eq(after.steps[0], 3);

  collect stop = {.stop_after = 2};
  cr_assert_eq(store_steps_list(s, "run-1", -1, on_step, &stop), 7, "callback stops the walk");
  cr_assert_eq(stop.n, 2);

  collect none = {0};
  cr_assert_eq(store_steps_list(s, "run-3", -1, on_step, &none), 0);
  cr_assert_eq(none.n, 0);
  store_close(s);
}

typedef struct {
  char ids[8][16];
  int states[8];
  size_t n;
} wcollect;

static int on_worker(const Rlorch__V1__WorkerInfo *w, void *arg) {
  wcollect *c = arg;
  snprintf(c->ids[c->n], sizeof c->ids[0], "%s", w->id);
  c->states[c->n++] = w->state;
  return 0;
}

Test(store, workers_in_registration_order) {
  store *s = open_ok(dir);
  const char *ids[] = {"w-b", "w-a", "w-c"};
  for (size_t i = 0; i < 3; i++) {
    Rlorch__V1__WorkerInfo w = RLORCH__V1__WORKER_INFO__INIT;
    w.id = (char *)ids[i];
    w.role = RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE;
    w.state = RLORCH__V1__WORKER_STATE__WORKER_STATE_REGISTERED;
    w.run_id = i == 2 ? "run-2" : "run-1";
    cr_assert_eq(store_worker_put(s, &w), 0, "%s", store_errmsg(s));
  }
  Rlorch__V1__WorkerInfo upd = RLORCH__V1__WORKER_INFO__INIT;
  upd.id = "w-b";
  upd.state = RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST;
  upd.run_id = "run-1";
  cr_assert_eq(store_worker_put(s, &upd), 0);
  wcollect all = {0};
  cr_assert_eq(store_workers_list(s, NULL, on_worker, &all), 0);
  cr_assert_eq(all.n, 3);
  cr_assert_str_eq(all.ids[0], "w-b");
  cr_assert_str_eq(all.ids[1], "w-a");
  cr_assert_str_eq(all.ids[2], "w-c");
  cr_assert_eq(all.states[0], RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST, "update kept its place");
  wcollect r1 = {0};
  cr_assert_eq(store_workers_list(s, "run-1", on_worker, &r1), 0);
  cr_assert_eq(r1.n, 2);
  store_close(s);
}

Test(store, survives_restart_and_ids_never_repeat) {
  store *s = open_ok(dir);
  Rlorch__V1__Run *a = create(s, "before", 10);
  Rlorch__V1__Run *b = create(s, "doomed", 20);
  cr_assert_str_eq(b->id, "run-2");
  store_close(s);
  /* Delete the newest run behind the store's back: its id must still not come back. */
  char path[128];
  snprintf(path, sizeof path, "%s/rlorch.db", dir);
  sqlite3 *db;
  cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
  cr_assert_eq(sqlite3_exec(db, "DELETE FROM runs WHERE id = 'run-2'", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);

  s = open_ok(dir);
  Rlorch__V1__Run *g = NULL;
  cr_assert_eq(store_run_get(s, a->id, &g), 0, "%s", store_errmsg(s));
  cr_assert_str_eq(g->spec->name, "before");
  cr_assert_eq(g->created_unix_ms, 10);
  Rlorch__V1__Run *c = create(s, "after", 30);
  cr_assert_str_eq(c->id, "run-3");
  run_free(a);
  run_free(b);
  run_free(c);
  run_free(g);
  store_close(s);
}

static int64_t query_int(const char *sql) {
  char path[128];
  snprintf(path, sizeof path, "%s/rlorch.db", dir);
  sqlite3 *db;
  sqlite3_stmt *st;
  cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
  cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
  cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
  int64_t v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

Test(store, migrates_empty_db_and_uses_wal) {
  char path[128];
  snprintf(path, sizeof path, "%s/rlorch.db", dir);
  FILE *f = fopen(path, "w"); /* an empty file is an empty database */
  cr_assert_not_null(f);
  fclose(f);
  store *s = open_ok(dir);
  store_close(s);
  cr_assert_eq(query_int("SELECT max(version) FROM schema_version"), STORE_SCHEMA_VERSION);
  cr_assert_eq(query_int("SELECT count(*) FROM sqlite_master WHERE name IN ('runs','steps','workers')"), 3);
  s = open_ok(dir); /* a second open applies nothing */
  store_close(s);
  cr_assert_eq(query_int("SELECT count(*) FROM schema_version"), STORE_SCHEMA_VERSION);
  sqlite3 *db;
  sqlite3_stmt *st;
  cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
  cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
  cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
  cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "wal");
  sqlite3_finalize(st);
  sqlite3_close(db);
}

Test(store, refuses_newer_schema) {
  store_close(open_ok(dir));
  char path[128];
  snprintf(path, sizeof path, "%s/rlorch.db", dir);
  sqlite3 *db;
  cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
  cr_assert_eq(sqlite3_exec(db, "INSERT INTO schema_version VALUES (999)", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
  store *s = (store *)1;
  char err[512] = "";
  cr_assert_eq(store_open(dir, &s, err, sizeof err), STORE_ETOONEW);
  cr_assert_null(s);
  cr_assert(strstr(err, path) && strstr(err, "999") && strstr(err, "newer"), "%s", err);
}

Test(store, data_dir_is_a_file) {
  char file[128];
  snprintf(file, sizeof file, "%s/plainfile", dir);
  FILE *f = fopen(file, "w");
  cr_assert_not_null(f);
  fclose(f);
  store *s = NULL;
  char err[512] = "";
  cr_assert_lt(store_open(file, &s, err, sizeof err), 0);
  cr_assert_null(s);
  cr_assert(strstr(err, file) && strstr(err, "not a directory"), "%s", err);
  char under[160];
  snprintf(under, sizeof under, "%s/sub", file);
  cr_assert_lt(store_open(under, &s, err, sizeof err), 0);
  cr_assert(strstr(err, under), "%s", err);
  cr_assert_lt(store_open("", &s, err, sizeof err), 0);
}

Test(store, creates_nested_missing_dir_parent_must_exist) {
  char sub[128];
  snprintf(sub, sizeof sub, "%s/new", dir);
  store_close(open_ok(sub));
  struct stat st;
  cr_assert_eq(stat(sub, &st), 0);
  cr_assert(S_ISDIR(st.st_mode));
}

Test(store, unwritable_data_dir) {
  if (geteuid() == 0) cr_skip_test("running as root: permissions are not enforced");
  char ro[128];
  snprintf(ro, sizeof ro, "%s/ro", dir);
  cr_assert_eq(mkdir(ro, 0500), 0);
  store *s = NULL;
  char err[512] = "";
  cr_assert_lt(store_open(ro, &s, err, sizeof err), 0);
  cr_assert(strstr(err, ro), "%s", err);
  char below[160];
  snprintf(below, sizeof below, "%s/x", ro);
  cr_assert_lt(store_open(below, &s, err, sizeof err), 0);
  cr_assert(strstr(err, below) && strstr(err, "Permission denied"), "%s", err);
}

/* A step's commit writes its record and the run together, or neither. */
Test(store, step_commit_is_atomic_and_refuses_a_second_record) {
  store *s = open_ok(dir);
  Rlorch__V1__Run *r = create(s, "c", 1);
  Rlorch__V1__StepRecord rec = RLORCH__V1__STEP_RECORD__INIT;
  rec.run_id = r->id;
  rec.step = 0;
  rec.policy_version = 1;
  r->steps_done = 1;
  r->policy_version = 1;
  cr_assert_eq(store_step_commit(s, &rec, r), 0, "%s", store_errmsg(s));
  uint64_t n = 0;
  int64_t last = 0;
  cr_assert_eq(store_steps_count(s, r->id, &n, &last), 0);
  cr_assert_eq(n, 1);
  cr_assert_eq(last, 0);
  /* The same step again: refused, and the run is not moved either. */
  r->steps_done = 2;
  cr_assert_eq(store_step_commit(s, &rec, r), STORE_EEXIST);
  cr_assert(strstr(store_errmsg(s), "step 0 is recorded already"), "%s", store_errmsg(s));
  Rlorch__V1__Run *got = NULL;
  cr_assert_eq(store_run_get(s, r->id, &got), 0);
  cr_assert_eq(got->steps_done, 1, "the run's update was rolled back with the record");
  run_free(got);
  /* A run that does not exist: the record is not kept either. */
  Rlorch__V1__Run ghost = RLORCH__V1__RUN__INIT;
  ghost.id = "run-99";
  Rlorch__V1__StepRecord other = RLORCH__V1__STEP_RECORD__INIT;
  other.run_id = "run-99";
  other.step = 0;
  cr_assert_eq(store_step_commit(s, &other, &ghost), STORE_ENOTFOUND);
  cr_assert_eq(store_steps_count(s, "run-99", &n, &last), 0);
  cr_assert_eq(n, 0, "nothing of the failed commit stays");
  cr_assert_eq(last, -1);
  run_free(r);
  store_close(s);
}

static mode_t mode_of(const char *path) {
  struct stat st;
  cr_assert_eq(stat(path, &st), 0, "%s", path);
  return st.st_mode & 07777;
}

Test(store, database_and_journals_are_private) {
  char sub[128], p[192];
  snprintf(sub, sizeof sub, "%s/new", dir);
  mode_t old = umask(0); /* what SQLite alone would make 0644 (0666 less the umask) */
  store *s = open_ok(sub);
  Rlorch__V1__Run *r = create(s, "x", 1); /* a write: the -wal and -shm exist now */
  umask(old);
  cr_assert_eq(mode_of(sub), 0700, "data_dir %o", mode_of(sub));
  snprintf(p, sizeof p, "%s/rlorch.db", sub);
  cr_assert_eq(mode_of(p), 0600, "rlorch.db %o", mode_of(p));
  snprintf(p, sizeof p, "%s/rlorch.db-wal", sub);
  cr_assert_eq(mode_of(p), 0600, "rlorch.db-wal %o", mode_of(p));
  snprintf(p, sizeof p, "%s/rlorch.db-shm", sub);
  cr_assert_eq(mode_of(p), 0600, "rlorch.db-shm %o", mode_of(p));
  run_free(r);
  store_close(s);
  /* A database an older rlorch left 0644 is narrowed at the next open. */
  snprintf(p, sizeof p, "%s/rlorch.db", sub);
  cr_assert_eq(chmod(p, 0644), 0);
  store_close(open_ok(sub));
  cr_assert_eq(mode_of(p), 0600, "narrowed to %o", mode_of(p));
}

Test(store, worker_ids_continue_past_those_an_older_schema_stored) {
  store *s = open_ok(dir);
  uint64_t id = 0;
  cr_assert_eq(store_worker_next_id(s, &id), 0);
  cr_assert_eq(id, 1);
  store_close(s);
  /* A database of schema 1: workers named by the in-memory counter of that time. */
  char path[128];
  snprintf(path, sizeof path, "%s/rlorch.db", dir);
  sqlite3 *db = NULL;
  cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
  cr_assert_eq(sqlite3_exec(db,
                            "DELETE FROM schema_version WHERE version = 2;"
                            "DELETE FROM counters WHERE name = 'worker';"
                            "INSERT INTO workers VALUES ('w-41', '', x''), ('w-7', '', x''),"
                            " ('other', '', x'');",
                            NULL, NULL, NULL),
               SQLITE_OK, "%s", sqlite3_errmsg(db));
  sqlite3_close(db);
  s = open_ok(dir);
  cr_assert_eq(store_worker_next_id(s, &id), 0);
  cr_assert_eq(id, 42, "past the stored w-41");
  cr_assert_eq(store_worker_next_id(s, &id), 0);
  cr_assert_eq(id, 43);
  cr_assert_eq(store_worker_delete(s, "w-41"), 0);
  cr_assert_eq(store_worker_delete(s, "w-41"), 0, "deleting nothing is fine");
  store_close(s);
}

Test(store, run_counts_by_state) {
  store *s = open_ok(dir);
  uint64_t c[STORE_RUN_STATES];
  cr_assert_eq(store_run_counts(s, c), 0);
  for (int i = 0; i < STORE_RUN_STATES; i++) cr_assert_eq(c[i], 0);
  Rlorch__V1__Run *a = create(s, "a", 1), *b = create(s, "b", 2), *d = create(s, "d", 3);
  b->state = RLORCH__V1__RUN_STATE__RUN_STATE_FAILED;
  cr_assert_eq(store_run_update(s, b), 0);
  cr_assert_eq(store_run_counts(s, c), 0);
  cr_assert_eq(c[RLORCH__V1__RUN_STATE__RUN_STATE_PENDING], 2);
  cr_assert_eq(c[RLORCH__V1__RUN_STATE__RUN_STATE_FAILED], 1);
  cr_assert_eq(c[RLORCH__V1__RUN_STATE__RUN_STATE_RUNNING], 0);
  cr_assert_eq(store_run_counts(NULL, c), STORE_EINVAL);
  run_free(a);
  run_free(b);
  run_free(d);
  store_close(s);
}
