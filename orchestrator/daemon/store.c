/* SQLite store. Each table keeps the packed protobuf message in `msg` and
 * copies the fields queries need into indexed columns; the blob is the truth.
 * Migrations are SQL scripts applied in order inside one transaction each; the
 * schema_version table records how many ran. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/daemon/store.h"

struct store {
  sqlite3 *db;
  char path[1024];
  char msg[1024];
};

/* Append-only: a released database may hold any prefix of this list. */
static const char *const store__migrations[] = {
    /* 1: runs, steps, workers, and the id counter. */
    "CREATE TABLE runs (id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, state INTEGER NOT NULL,"
    "  created_ms INTEGER NOT NULL, msg BLOB NOT NULL);"
    "CREATE INDEX runs_state ON runs(state, seq);"
    "CREATE TABLE steps (run_id TEXT NOT NULL, step INTEGER NOT NULL, msg BLOB NOT NULL,"
    "  PRIMARY KEY (run_id, step)) WITHOUT ROWID;"
    "CREATE TABLE workers (id TEXT PRIMARY KEY, run_id TEXT NOT NULL, msg BLOB NOT NULL);"
    "CREATE INDEX workers_run ON workers(run_id);"
    "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);"
    "INSERT INTO counters VALUES ('run', 0);",
    /* 2: worker ids from a counter kept here, so that no id is ever handed out
     * twice by this data_dir's daemons (an agent still holding an id from
     * before a restart must not reach a new worker by it). It starts past
     * the ids the workers table already names. */
    "INSERT INTO counters (name, value) SELECT 'worker', "
    "  coalesce(max(CAST(substr(id, 3) AS INTEGER)), 0) FROM workers WHERE id GLOB 'w-[0-9]*';",
};
#define STORE__NMIGRATIONS (sizeof store__migrations / sizeof store__migrations[0])
_Static_assert(STORE__NMIGRATIONS == STORE_SCHEMA_VERSION, "STORE_SCHEMA_VERSION is stale");

static int store__fail(store *s, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int store__fail(store *s, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->msg, sizeof s->msg, fmt, ap);
  va_end(ap);
  return code;
}

/* SQLite failure: message names the operation and the database path. */
static int store__db_fail(store *s, const char *what) {
  int rc = sqlite3_errcode(s->db);
  int code = rc == SQLITE_NOMEM ? STORE_ENOMEM : STORE_EIO;
  return store__fail(s, code, "store: %s: %s: %s", s->path, what, sqlite3_errmsg(s->db));
}

const char *store_errmsg(const store *s) { return s ? s->msg : "store: not open"; }

const char *store_strerror(int code) {
  switch (code) {
    case STORE_OK: return "ok";
    case STORE_EIO: return "i/o or database error";
    case STORE_ENOTFOUND: return "not found";
    case STORE_ENOMEM: return "out of memory";
    case STORE_EINVAL: return "invalid argument";
    case STORE_ECORRUPT: return "corrupt record";
    case STORE_ETOONEW: return "database schema newer than this program";
    case STORE_EEXIST: return "already recorded";
    default: return "unknown error";
  }
}

static int store__exec(store *s, const char *sql, const char *what) {
  char *e = NULL;
  if (sqlite3_exec(s->db, sql, NULL, NULL, &e) == SQLITE_OK) return 0;
  store__fail(s, STORE_EIO, "store: %s: %s: %s", s->path, what, e ? e : sqlite3_errmsg(s->db));
  sqlite3_free(e);
  return STORE_EIO;
}

static int store__prepare(store *s, const char *sql, sqlite3_stmt **st) {
  if (sqlite3_prepare_v2(s->db, sql, -1, st, NULL) != SQLITE_OK) return store__db_fail(s, "prepare");
  return 0;
}

static int store__schema_version(store *s, int64_t *v) {
  sqlite3_stmt *st;
  int rc = store__exec(s, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);",
                       "create schema_version");
  if (rc || (rc = store__prepare(s, "SELECT max(version) FROM schema_version", &st))) return rc;
  *v = 0;
  if (sqlite3_step(st) == SQLITE_ROW) *v = sqlite3_column_int64(st, 0);
  else rc = store__db_fail(s, "read schema_version");
  sqlite3_finalize(st);
  return rc;
}

static int store__migrate(store *s) {
  int64_t v;
  int rc = store__schema_version(s, &v);
  if (rc) return rc;
  if (v > (int64_t)STORE__NMIGRATIONS)
    return store__fail(s, STORE_ETOONEW,
                       "store: %s: schema version %lld is newer than this rlorch supports (%d); "
                       "use a newer rlorch or another data_dir",
                       s->path, (long long)v, STORE_SCHEMA_VERSION);
  for (size_t i = (size_t)v; i < STORE__NMIGRATIONS; i++) {
    char what[64], sql[96];
    snprintf(what, sizeof what, "migration %zu", i + 1);
    if ((rc = store__exec(s, "BEGIN IMMEDIATE", what))) return rc;
    snprintf(sql, sizeof sql, "INSERT INTO schema_version VALUES (%zu)", i + 1);
    if ((rc = store__exec(s, store__migrations[i], what)) || (rc = store__exec(s, sql, what))) {
      sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
      return rc;
    }
    if ((rc = store__exec(s, "COMMIT", what))) return rc;
  }
  return 0;
}

static int store__mkdir(const char *dir, char *err, size_t errlen) {
  struct stat st;
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "store: cannot create data_dir \"%s\": %s", dir, strerror(errno));
    return STORE_EIO;
  }
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "store: data_dir \"%s\" is not a directory", dir);
    return STORE_EIO;
  }
  return 0;
}

/* The database and its -wal and -shm are 0600: they hold every run's spec
 * and records. SQLite would create the database 0644 (less the umask) and
 * gives its -wal and -shm the database's own mode, so the database is made
 * here first, and one an older rlorch made wider is narrowed, with the
 * journal files it left. */
static int store__private_files(store *s) {
  int fd = open(s->path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return store__fail(s, STORE_EIO, "store: %s: cannot open: %s", s->path, strerror(errno));
  struct stat st;
  int rc = 0;
  if (fstat(fd, &st) != 0 || ((st.st_mode & 077) && fchmod(fd, 0600) != 0))
    rc = store__fail(s, STORE_EIO, "store: %s: cannot make it private (0600): %s", s->path,
                     strerror(errno));
  close(fd);
  static const char *const journals[] = {"-wal", "-shm"};
  for (size_t i = 0; !rc && i < 2; i++) {
    char p[1100];
    snprintf(p, sizeof p, "%s%s", s->path, journals[i]);
    if (stat(p, &st) == 0 && (st.st_mode & 077) && chmod(p, 0600) != 0)
      rc = store__fail(s, STORE_EIO, "store: %s: cannot make it private (0600): %s", p,
                       strerror(errno));
  }
  return rc;
}

int store_open(const char *data_dir, store **out, char *err, size_t errlen) {
  *out = NULL;
  if (!data_dir || !*data_dir) {
    snprintf(err, errlen, "store: data_dir is empty");
    return STORE_EINVAL;
  }
  int rc = store__mkdir(data_dir, err, errlen);
  if (rc) return rc;
  store *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "store: out of memory");
    return STORE_ENOMEM;
  }
  if ((size_t)snprintf(s->path, sizeof s->path, "%s/rlorch.db", data_dir) >= sizeof s->path) {
    snprintf(err, errlen, "store: data_dir \"%s\" is too long", data_dir);
    free(s);
    return STORE_EINVAL;
  }
  if ((rc = store__private_files(s)) != 0) {
    snprintf(err, errlen, "%s", s->msg);
    free(s);
    return rc;
  }
  if (sqlite3_open_v2(s->path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                      NULL) != SQLITE_OK) {
    rc = store__db_fail(s, "open");
    goto fail;
  }
  sqlite3_busy_timeout(s->db, 5000);
  /* journal_mode returns a row; exec ignores it. A read-only directory fails here or below. */
  if ((rc = store__exec(s, "PRAGMA journal_mode=WAL", "set WAL")) ||
      (rc = store__exec(s, "PRAGMA synchronous=NORMAL", "set synchronous")) ||
      (rc = store__exec(s, "PRAGMA foreign_keys=ON", "set foreign_keys")) ||
      (rc = store__migrate(s)))
    goto fail;
  *out = s;
  return 0;
fail:
  snprintf(err, errlen, "%s", s->msg);
  store_close(s);
  return rc;
}

void store_close(store *s) {
  if (!s) return;
  sqlite3_close_v2(s->db);
  free(s);
}

/* ---- blobs ------------------------------------------------------------------ */

/* Binds the packed message at index idx. */
static int store__bind_msg(store *s, sqlite3_stmt *st, int idx, const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return store__fail(s, STORE_ENOMEM, "store: out of memory");
  protobuf_c_message_pack(m, buf);
  if (sqlite3_bind_blob64(st, idx, buf, n, free) != SQLITE_OK) return store__db_fail(s, "bind");
  return 0;
}

static void *store__unpack(store *s, sqlite3_stmt *st, int col, const ProtobufCMessageDescriptor *d) {
  const void *b = sqlite3_column_blob(st, col);
  size_t n = (size_t)sqlite3_column_bytes(st, col);
  void *m = protobuf_c_message_unpack(d, NULL, n, b ? b : (const void *)"");
  if (!m) store__fail(s, STORE_ECORRUPT, "store: %s: a stored %s does not unpack", s->path, d->name);
  return m;
}

/* Runs a statement expected to finish with SQLITE_DONE, then finalizes it. */
static int store__done(store *s, sqlite3_stmt *st, const char *what) {
  int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : store__db_fail(s, what);
  sqlite3_finalize(st);
  return rc;
}

/* ---- runs ------------------------------------------------------------------- */

static int store__put_run(store *s, const Rlorch__V1__Run *run, int64_t seq, int insert) {
  sqlite3_stmt *st;
  const char *sql = insert ? "INSERT INTO runs (id, seq, state, created_ms, msg) VALUES (?1, ?2, ?3, ?4, ?5)"
                           : "UPDATE runs SET state = ?3, created_ms = ?4, msg = ?5 WHERE id = ?1";
  int rc = store__prepare(s, sql, &st);
  if (rc) return rc;
  sqlite3_bind_text(st, 1, run->id, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 2, seq);
  sqlite3_bind_int(st, 3, (int)run->state);
  sqlite3_bind_int64(st, 4, run->created_unix_ms);
  if ((rc = store__bind_msg(s, st, 5, &run->base))) {
    sqlite3_finalize(st);
    return rc;
  }
  if ((rc = store__done(s, st, insert ? "insert run" : "update run"))) return rc;
  if (!insert && sqlite3_changes(s->db) == 0)
    return store__fail(s, STORE_ENOTFOUND, "store: run \"%s\" not found", run->id);
  return 0;
}

/* Takes the next value of counter `name` (one statement: atomic on its own,
 * and inside the caller's transaction when there is one). */
static int store__next(store *s, const char *name, int64_t *value) {
  sqlite3_stmt *st;
  int rc = store__prepare(s, "UPDATE counters SET value = value + 1 WHERE name = ?1 RETURNING value", &st);
  if (rc) return rc;
  sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
  if (sqlite3_step(st) == SQLITE_ROW) *value = sqlite3_column_int64(st, 0);
  else rc = store__db_fail(s, !strcmp(name, "run") ? "next run id" : "next worker id");
  sqlite3_finalize(st);
  return rc;
}

static int store__next_run_seq(store *s, int64_t *seq) { return store__next(s, "run", seq); }

int store_worker_next_id(store *s, uint64_t *id) {
  if (!s || !id) return s ? store__fail(s, STORE_EINVAL, "store: worker_next_id: NULL argument") : STORE_EINVAL;
  int64_t v = 0;
  int rc = store__next(s, "worker", &v);
  if (rc == 0) *id = (uint64_t)v;
  return rc;
}

int store_run_create(store *s, const Rlorch__V1__RunSpec *spec, int64_t now_ms, Rlorch__V1__Run **out) {
  if (!s || !spec || !out) return s ? store__fail(s, STORE_EINVAL, "store: run_create: NULL argument") : STORE_EINVAL;
  *out = NULL;
  int64_t seq = 0;
  char id[32];
  int rc = store__exec(s, "BEGIN IMMEDIATE", "create run");
  if (rc) return rc;
  if ((rc = store__next_run_seq(s, &seq))) goto rollback;
  snprintf(id, sizeof id, "run-%lld", (long long)seq);
  Rlorch__V1__Run run = RLORCH__V1__RUN__INIT;
  run.id = id;
  run.spec = (Rlorch__V1__RunSpec *)spec;
  run.state = RLORCH__V1__RUN_STATE__RUN_STATE_PENDING;
  run.policy = spec->policy;
  run.created_unix_ms = now_ms;
  run.updated_unix_ms = now_ms;
  if ((rc = store__put_run(s, &run, seq, 1))) goto rollback;
  if ((rc = store__exec(s, "COMMIT", "create run"))) goto rollback;
  return store_run_get(s, id, out);
rollback:
  sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
  return rc;
}

int store_run_update(store *s, const Rlorch__V1__Run *run) {
  if (!s) return STORE_EINVAL;
  if (!run || !run->id || !*run->id) return store__fail(s, STORE_EINVAL, "store: run_update: run without id");
  return store__put_run(s, run, 0, 0);
}

int store_run_get(store *s, const char *id, Rlorch__V1__Run **out) {
  if (!s) return STORE_EINVAL;
  *out = NULL;
  if (!id || !*id) return store__fail(s, STORE_EINVAL, "store: run_get: empty run id");
  sqlite3_stmt *st;
  int rc = store__prepare(s, "SELECT msg FROM runs WHERE id = ?1", &st);
  if (rc) return rc;
  sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
  int step = sqlite3_step(st);
  if (step == SQLITE_ROW) {
    *out = store__unpack(s, st, 0, &rlorch__v1__run__descriptor);
    rc = *out ? 0 : STORE_ECORRUPT;
  } else if (step == SQLITE_DONE) {
    rc = store__fail(s, STORE_ENOTFOUND, "store: run \"%s\" not found", id);
  } else {
    rc = store__db_fail(s, "get run");
  }
  sqlite3_finalize(st);
  return rc;
}

void store_runs_free(Rlorch__V1__Run **runs, size_t n) {
  for (size_t i = 0; runs && i < n; i++) protobuf_c_message_free_unpacked(&runs[i]->base, NULL);
  free(runs);
}

int store_run_list(store *s, Rlorch__V1__RunState state, uint32_t limit, Rlorch__V1__Run ***out, size_t *n) {
  if (!s) return STORE_EINVAL;
  *out = NULL;
  *n = 0;
  if (limit == 0) limit = 100;
  sqlite3_stmt *st;
  int rc = store__prepare(s, "SELECT msg FROM runs WHERE (?1 = 0 OR state = ?1) ORDER BY seq DESC LIMIT ?2", &st);
  if (rc) return rc;
  sqlite3_bind_int(st, 1, (int)state);
  sqlite3_bind_int64(st, 2, limit);
  Rlorch__V1__Run **v = NULL;
  size_t cnt = 0, cap = 0;
  int step;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    if (cnt == cap) {
      cap = cap ? cap * 2 : 16;
      void *p = realloc(v, cap * sizeof *v);
      if (!p) {
        rc = store__fail(s, STORE_ENOMEM, "store: out of memory");
        break;
      }
      v = p;
    }
    if (!(v[cnt] = store__unpack(s, st, 0, &rlorch__v1__run__descriptor))) {
      rc = STORE_ECORRUPT;
      break;
    }
    cnt++;
  }
  if (!rc && step != SQLITE_DONE) rc = store__db_fail(s, "list runs");
  sqlite3_finalize(st);
  if (rc) {
    store_runs_free(v, cnt);
    return rc;
  }
  *out = v;
  *n = cnt;
  return 0;
}

int store_run_counts(store *s, uint64_t counts[STORE_RUN_STATES]) {
  if (!s || !counts) return STORE_EINVAL;
  memset(counts, 0, STORE_RUN_STATES * sizeof counts[0]);
  sqlite3_stmt *st;
  int rc = store__prepare(s, "SELECT state, count(*) FROM runs GROUP BY state", &st);
  if (rc) return rc;
  int step;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    int state = sqlite3_column_int(st, 0);
    if (state >= 0 && state < STORE_RUN_STATES) counts[state] = (uint64_t)sqlite3_column_int64(st, 1);
  }
  if (step != SQLITE_DONE) rc = store__db_fail(s, "count runs");
  sqlite3_finalize(st);
  return rc;
}

/* ---- steps and workers ------------------------------------------------------- */

/* Inserts the record; a second record of the same step is refused, never
 * merged or replaced: a committed step is written exactly once. */
static int store__insert_step(store *s, const Rlorch__V1__StepRecord *rec) {
  if (!rec || !rec->run_id || !*rec->run_id)
    return store__fail(s, STORE_EINVAL, "store: step_put: record without run_id");
  if (rec->step > INT64_MAX) return store__fail(s, STORE_EINVAL, "store: step_put: step out of range");
  sqlite3_stmt *st;
  int rc = store__prepare(s, "INSERT INTO steps (run_id, step, msg) VALUES (?1, ?2, ?3)", &st);
  if (rc) return rc;
  sqlite3_bind_text(st, 1, rec->run_id, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 2, (int64_t)rec->step);
  if ((rc = store__bind_msg(s, st, 3, &rec->base))) {
    sqlite3_finalize(st);
    return rc;
  }
  int step = sqlite3_step(st);
  if (step == SQLITE_DONE) rc = 0;
  else if (sqlite3_extended_errcode(s->db) == SQLITE_CONSTRAINT_PRIMARYKEY)
    rc = store__fail(s, STORE_EEXIST,
                     "store: %s: run %s step %" PRIu64 " is recorded already (a step is written once)",
                     s->path, rec->run_id, rec->step);
  else rc = store__db_fail(s, "put step");
  sqlite3_finalize(st);
  return rc;
}

int store_step_put(store *s, const Rlorch__V1__StepRecord *rec) {
  if (!s) return STORE_EINVAL;
  return store__insert_step(s, rec);
}

int store_step_commit(store *s, const Rlorch__V1__StepRecord *rec, const Rlorch__V1__Run *run) {
  if (!s) return STORE_EINVAL;
  if (!run || !run->id || !*run->id)
    return store__fail(s, STORE_EINVAL, "store: step_commit: run without id");
  int rc = store__exec(s, "BEGIN IMMEDIATE", "commit step");
  if (rc) return rc;
  if ((rc = store__insert_step(s, rec)) || (rc = store__put_run(s, run, 0, 0)) ||
      (rc = store__exec(s, "COMMIT", "commit step"))) {
    char msg[sizeof s->msg];
    memcpy(msg, s->msg, sizeof msg); /* the rollback must not overwrite why */
    sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    memcpy(s->msg, msg, sizeof msg);
    return rc;
  }
  return 0;
}

int store_steps_count(store *s, const char *run_id, uint64_t *n, int64_t *last) {
  if (!s) return STORE_EINVAL;
  if (!run_id || !n || !last) return store__fail(s, STORE_EINVAL, "store: steps_count: NULL argument");
  sqlite3_stmt *st;
  int rc = store__prepare(s, "SELECT count(*), coalesce(max(step), -1) FROM steps WHERE run_id = ?1", &st);
  if (rc) return rc;
  sqlite3_bind_text(st, 1, run_id, -1, SQLITE_TRANSIENT);
  if (sqlite3_step(st) == SQLITE_ROW) {
    *n = (uint64_t)sqlite3_column_int64(st, 0);
    *last = sqlite3_column_int64(st, 1);
  } else {
    rc = store__db_fail(s, "count steps");
  }
  sqlite3_finalize(st);
  return rc;
}

/* One of the two callback types, so each is called through its own type. */
typedef struct {
  int (*step)(const Rlorch__V1__StepRecord *, void *);
  int (*worker)(const Rlorch__V1__WorkerInfo *, void *);
  void *arg;
} store__visit;

/* Walks the rows of st, unpacking column 0 and handing each message to v. */
static int store__walk(store *s, sqlite3_stmt *st, const ProtobufCMessageDescriptor *d,
                       const store__visit *v, const char *what) {
  int rc = 0, step;
  while ((step = sqlite3_step(st)) == SQLITE_ROW) {
    ProtobufCMessage *m = store__unpack(s, st, 0, d);
    if (!m) {
      rc = STORE_ECORRUPT;
      break;
    }
    rc = v->step ? v->step((const Rlorch__V1__StepRecord *)m, v->arg)
                 : v->worker((const Rlorch__V1__WorkerInfo *)m, v->arg);
    protobuf_c_message_free_unpacked(m, NULL);
    if (rc) break;
  }
  if (!rc && step != SQLITE_DONE) rc = store__db_fail(s, what);
  sqlite3_finalize(st);
  return rc;
}

int store_steps_list(store *s, const char *run_id, int64_t after_step,
                     int (*cb)(const Rlorch__V1__StepRecord *rec, void *arg), void *arg) {
  if (!s) return STORE_EINVAL;
  if (!run_id || !cb) return store__fail(s, STORE_EINVAL, "store: steps_list: NULL argument");
  sqlite3_stmt *st;
  int rc = store__prepare(s, "SELECT msg FROM steps WHERE run_id = ?1 AND step > ?2 ORDER BY step", &st);
  if (rc) return rc;
  sqlite3_bind_text(st, 1, run_id, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 2, after_step);
  store__visit v = {.step = cb, .arg = arg};
  return store__walk(s, st, &rlorch__v1__step_record__descriptor, &v, "list steps");
}

int store_worker_put(store *s, const Rlorch__V1__WorkerInfo *w) {
  if (!s) return STORE_EINVAL;
  if (!w || !w->id || !*w->id) return store__fail(s, STORE_EINVAL, "store: worker_put: worker without id");
  sqlite3_stmt *st;
  /* An upsert keeps the rowid, which is the registration order. */
  int rc = store__prepare(s,
                          "INSERT INTO workers (id, run_id, msg) VALUES (?1, ?2, ?3) "
                          "ON CONFLICT(id) DO UPDATE SET run_id = excluded.run_id, msg = excluded.msg",
                          &st);
  if (rc) return rc;
  sqlite3_bind_text(st, 1, w->id, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 2, w->run_id ? w->run_id : "", -1, SQLITE_TRANSIENT);
  if ((rc = store__bind_msg(s, st, 3, &w->base))) {
    sqlite3_finalize(st);
    return rc;
  }
  return store__done(s, st, "put worker");
}

int store_worker_delete(store *s, const char *id) {
  if (!s) return STORE_EINVAL;
  if (!id || !*id) return store__fail(s, STORE_EINVAL, "store: worker_delete: worker without id");
  sqlite3_stmt *st;
  int rc = store__prepare(s, "DELETE FROM workers WHERE id = ?1", &st);
  if (rc) return rc;
  sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
  return store__done(s, st, "delete worker");
}

int store_workers_list(store *s, const char *run_id,
                       int (*cb)(const Rlorch__V1__WorkerInfo *w, void *arg), void *arg) {
  if (!s) return STORE_EINVAL;
  if (!cb) return store__fail(s, STORE_EINVAL, "store: workers_list: NULL callback");
  sqlite3_stmt *st;
  int rc = store__prepare(s, "SELECT msg FROM workers WHERE (?1 = '' OR run_id = ?1) ORDER BY rowid", &st);
  if (rc) return rc;
  sqlite3_bind_text(st, 1, run_id ? run_id : "", -1, SQLITE_TRANSIENT);
  store__visit v = {.worker = cb, .arg = arg};
  return store__walk(s, st, &rlorch__v1__worker_info__descriptor, &v, "list workers");
}
