/* Durable state of the daemon in SQLite (data_dir/rlorch.db, WAL journal).
 *
 * Runs, step records and workers are stored as packed rlorch.v1 protobuf
 * messages plus indexed columns for the queries below. The schema is versioned:
 * migrations are applied in order at open time, and a database written by a
 * newer rlorch (schema_version above STORE_SCHEMA_VERSION) is refused.
 *
 * Every function returns 0 or a negative STORE_E* code; the message of the last
 * failure is in store_errmsg(). Messages handed out are unpacked protobuf-c
 * messages owned by the caller: free each with protobuf_c_message_free_unpacked
 * (or a list with store_runs_free). Calls block on disk I/O (short with WAL and
 * synchronous=NORMAL); one store is used from one thread at a time. */
#ifndef RLORCH_STORE_H
#define RLORCH_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "rlorch/v1/broadcast.pb-c.h"
#include "rlorch/v1/control.pb-c.h"

typedef struct store store;

enum {
  STORE_OK = 0,
  STORE_EIO = -1,        /* SQLite or file system error */
  STORE_ENOTFOUND = -2,  /* no such run */
  STORE_ENOMEM = -3,
  STORE_EINVAL = -4,     /* NULL or malformed argument (empty run id...) */
  STORE_ECORRUPT = -5,   /* a stored blob does not unpack */
  STORE_ETOONEW = -6,    /* database schema newer than this program */
  STORE_EEXIST = -7,     /* a step recorded already: records are written once */
};
#define STORE_NOT_FOUND STORE_ENOTFOUND

/* Schema version this code writes (the number of migrations). */
#define STORE_SCHEMA_VERSION 2

/* Creates data_dir (0700) if needed and opens data_dir/rlorch.db, which with
 * its -wal and -shm is made 0600 (narrowed if wider). On failure *out is
 * NULL and err names the path and the cause. */
int store_open(const char *data_dir, store **out, char *err, size_t errlen);
void store_close(store *s);
const char *store_errmsg(const store *s);
/* Human name of a STORE_E* code. */
const char *store_strerror(int code);

/* Creates a run from spec (copied as given: fill defaults first) with a new id
 * "run-N" (N from a counter kept in the database, never reused), state
 * PENDING, policy = spec->policy, created = updated = now_ms. */
int store_run_create(store *s, const Rlorch__V1__RunSpec *spec, int64_t now_ms,
                     Rlorch__V1__Run **out);
/* Replaces the stored run with the same id; STORE_ENOTFOUND if there is none. */
int store_run_update(store *s, const Rlorch__V1__Run *run);
int store_run_get(store *s, const char *id, Rlorch__V1__Run **out);
/* Runs newest first; state 0 (UNSPECIFIED) for all; limit 0 means 100. */
int store_run_list(store *s, Rlorch__V1__RunState state, uint32_t limit, Rlorch__V1__Run ***out,
                   size_t *n);
void store_runs_free(Rlorch__V1__Run **runs, size_t n);
/* Number of runs in each state, indexed by Rlorch__V1__RunState (one query). */
#define STORE_RUN_STATES 7
int store_run_counts(store *s, uint64_t counts[STORE_RUN_STATES]);

/* Inserts the record of (rec->run_id, rec->step); STORE_EEXIST, changing
 * nothing, when that step is recorded already. */
int store_step_put(store *s, const Rlorch__V1__StepRecord *rec);
/* A step's commit: its record (as store_step_put) and the run's new state
 * (as store_run_update) in one transaction, so that a crash leaves both or
 * neither. STORE_EEXIST (nothing written) when the step is recorded already. */
int store_step_commit(store *s, const Rlorch__V1__StepRecord *rec, const Rlorch__V1__Run *run);
/* How many steps run_id has recorded and the highest (-1: none). */
int store_steps_count(store *s, const char *run_id, uint64_t *n, int64_t *last);
/* Calls cb for each record of run_id with step > after_step (-1 for all), in
 * step order. The record is freed after cb returns. A non-zero return from cb
 * stops the walk and is returned. */
int store_steps_list(store *s, const char *run_id, int64_t after_step,
                     int (*cb)(const Rlorch__V1__StepRecord *rec, void *arg), void *arg);

/* The next worker number of this data_dir (1, 2, ...): from a counter kept in
 * the database, so a number is never handed out twice, across restarts too. */
int store_worker_next_id(store *s, uint64_t *id);
/* Inserts or replaces the worker with w->id (keeps its registration order). */
int store_worker_put(store *s, const Rlorch__V1__WorkerInfo *w);
/* Forgets the worker with this id (none stored is fine). */
int store_worker_delete(store *s, const char *id);
/* Calls cb for each worker (of run_id, or all when run_id is NULL or ""), in
 * registration order; stops like store_steps_list. */
int store_workers_list(store *s, const char *run_id,
                       int (*cb)(const Rlorch__V1__WorkerInfo *w, void *arg), void *arg);

#endif
