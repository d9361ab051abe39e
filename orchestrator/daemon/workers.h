/* The worker table: every live worker registered with the daemon, and the
 * lost ones for a while (lost_worker_retention_s: long enough to be seen in
 * ListWorkers and the metrics), their command streams, the heartbeat sweep
 * of workers outside a run, and how workers are shown (ListWorkers, the
 * rlorch_workers gauge, the store, WatchRun worker events). Workers register
 * with the daemon, not with a run; the runner tells the table which run is
 * active and which workers joined it. Loop thread only.
 *
 * Ids ("w-N", N from a counter in the store) are never handed out twice by
 * the daemons of one data_dir, so an agent that still holds an id from
 * before a restart, or from before it was lost, reaches no other worker by
 * it: it is told it is unknown and registers again. */
#ifndef RLORCH_DAEMON_WORKERS_H
#define RLORCH_DAEMON_WORKERS_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/daemon/metrics.h"
#include "orchestrator/daemon/store.h"
#include "orchestrator/daemon/watch.h"
#include "rlorch/v1/control.pb-c.h"
#include "rlorch/v1/worker.pb-c.h"
#include "rpc/rpc.h"

/* Live workers at most (max_workers may lower it). Lost ones do not count:
 * a registration flood that is lost and removed locks nobody out. Room for
 * 10,000 inference workers and 256 trainer ranks in one run, with margin;
 * nothing is sized by it (the table grows with what registers), so a larger
 * cap costs nothing until workers come. */
#define WORKERS_MAX 16384
#define WORKERS_NAME_MAX 64 /* NUL included; equals the scheduler's SCHED_NAME_MAX */
#define WORKERS_ADDRESS_MAX 256
#define WORKERS_RUN_ID_MAX 64 /* NUL included; equals the scheduler's SCHED_RUN_ID_MAX */

/* One worker. The table owns it; fields are read by the runner and the
 * Worker API, and changed only through the functions below unless noted. */
typedef struct workers_entry {
  uint32_t id;         /* scheduler id; the API id is "w-<id>" */
  char api_id[24];
  Rlorch__V1__WorkerRole role;
  Rlorch__V1__WorkerState state;           /* the runner sets it from the scheduler, then
                                              calls workers_publish, which counts it */
  char name[WORKERS_NAME_MAX];
  Rlorch__V1__Capabilities *caps;          /* owned copy, or NULL */
  Rlorch__V1__WeightManifest *manifest;    /* owned (trainer: always one), or NULL */
  /* Inference: the parts of the model it holds (RegisterRequest.parts),
   * owned, checked at Register; none: every tensor whole. */
  Rlorch__V1__TensorPart **parts;
  size_t nparts;
  char data_address[WORKERS_ADDRESS_MAX];
  rpc_call *attach;                        /* open command stream, or NULL */
  uint64_t cmd_seq;
  uint64_t policy_version;                 /* as last reported; the Worker API sets it */
  char version_run[WORKERS_RUN_ID_MAX];    /* the run policy_version counts steps of ("":
                                              none said); the Worker API sets it */
  int64_t last_seen_unix_ms;               /* shown to operators */
  int64_t last_seen_mono_ms;               /* what the heartbeat sweep compares */
  int64_t lost_mono_ms;                    /* when it was declared lost (state LOST) */
  int in_run;                              /* known to the active run's scheduler; the runner sets it */
  Rlorch__V1__WorkerStats stats;           /* the worker's own figures, last heartbeat */
  int has_stats;
  /* Colocated plans: the export this receiver acked plan `coloc_plan` with,
   * handed to the trainer with the trigger. Owned; replaced at each ack. */
  uint8_t *coloc_export;
  size_t coloc_export_len;
  char coloc_plan[128];
  /* The table's own: the state its counts hold for this worker, and where
   * the stream index keeps it. */
  Rlorch__V1__WorkerState counted;
  struct workers_table *table;
} workers_entry;

/* The metrics the table keeps up to date; any may be NULL. */
typedef struct workers_metrics {
  metrics_gauge *states;          /* role, state: workers in each */
  metrics_gauge *heartbeat_age;   /* worker, role: seconds since last heard from */
  metrics_gauge *requests_active; /* worker: what it reports generating now */
  metrics_counter *rollouts;      /* worker: rollouts it generated, by its own count */
  metrics_counter *tokens;        /* worker: completion tokens it generated */
  metrics_counter *generate_seconds; /* worker: seconds it spent generating */
} workers_metrics;

/* How many workers the table holds, and for how long lost ones. */
typedef struct workers_limits {
  uint32_t max_workers;      /* live workers at most, 1..WORKERS_MAX */
  int64_t lost_retention_ms; /* a lost worker is removed this long after it was lost */
} workers_limits;

typedef struct workers_table workers_table;

/* `db`, the metrics in `m` (copied) and `watch` must outlive the table. The
 * per-worker series are refreshed at every sweep. `lim` NULL: WORKERS_MAX
 * and 60 s. */
int workers_new(store *db, const workers_metrics *m, watch_hub *watch, const workers_limits *lim,
                workers_table **out);
void workers_free(workers_table *t); /* NULL is fine; streams must be ended already */

/* Called with a lost worker just before the table removes it (retention
 * passed, or its room was needed); the entry is freed after it returns. */
typedef void (*workers_removed_fn)(workers_entry *w, void *ud);
void workers_on_remove(workers_table *t, workers_removed_fn fn, void *ud);

size_t workers_count(const workers_table *t); /* live and lost */
size_t workers_live(const workers_table *t);  /* not lost: what max_workers bounds */
workers_entry *workers_at(workers_table *t, size_t i); /* 0 <= i < workers_count() */
workers_entry *workers_by_id(workers_table *t, uint32_t id);
workers_entry *workers_by_api_id(workers_table *t, const char *api_id);
workers_entry *workers_by_stream(workers_table *t, const rpc_call *attach);

/* Adds a REGISTERED worker with the next id from the store, copying caps and
 * taking manifest (see workers_set_manifest; either may be NULL, and the
 * manifest is freed when the worker is not added); an empty name becomes the
 * API id. Room for
 * it is made by removing the longest-lost worker if the table holds twice
 * max_workers. 0; -1 when max_workers live workers are registered; -2 out of
 * memory; -3 no id (the store failed, its message in store_errmsg, or the
 * data_dir's ids ran out). */
int workers_add(workers_table *t, Rlorch__V1__WorkerRole role, const char *name,
                const char *data_address, const Rlorch__V1__Capabilities *caps,
                Rlorch__V1__WeightManifest *manifest, workers_entry **out);
/* Why the last workers_add failed, for the caller's answer. */
const char *workers_last_error(const workers_table *t);
/* Replaces the manifest with `m`, which the entry takes (a message decoded
 * with protobuf-c's default allocator, taken out of a request: a manifest
 * can be large, and is never copied). */
void workers_set_manifest(workers_entry *w, Rlorch__V1__WeightManifest *m);
/* Takes the request's parts (decoded with protobuf-c's default allocator,
 * as the manifest), leaving it none. */
void workers_take_parts(workers_entry *w, Rlorch__V1__RegisterRequest *q);
/* Keeps a copy of the colocated export acked for plan_id (len 0: drops it); 0 or
 * -1 out of memory (the old one is dropped either way). */
int workers_set_coloc_export(workers_entry *w, const char *plan_id, const uint8_t *b, size_t len);
/* Keeps the figures a worker reported about itself (a heartbeat's stats). */
void workers_set_stats(workers_entry *w, const Rlorch__V1__WorkerStats *s);
/* Proof of life now, on both clocks. */
void workers_seen(workers_entry *w);
/* `call` becomes the command stream (a previous one ends ABORTED); READY. The
 * caller sets the cancel callback. */
void workers_attach(workers_entry *w, rpc_call *call);
/* The peer closed the command stream: forget it (the closing side finishes it). */
void workers_detach(workers_entry *w);
/* Ends the command stream, if any, without its cancel callback. */
void workers_end_stream(workers_entry *w, grpc_status_code code, const char *msg);
/* Sends `cmd` on the stream with the next seq and the active run's id; -1
 * without a stream or when the send fails. */
int workers_send(workers_table *t, workers_entry *w, Rlorch__V1__Command *cmd);

/* The active run (NULL: none). Ending it clears every worker's in_run. */
void workers_set_run(workers_table *t, const char *run_id);
/* Gauge, store and a WatchRun worker event for the active run. */
void workers_publish(workers_table *t, workers_entry *w);
/* Sets the rlorch_workers gauge from the counts the table keeps as states
 * change (it walks no worker). */
void workers_gauge(workers_table *t);
/* LOST, logged with `reason`, stream ended, published. */
void workers_mark_lost(workers_table *t, workers_entry *w, const char *reason);
/* Heartbeat loss of workers outside the run (the run's scheduler judges its
 * own), the age gauge of every worker (a lost one's keeps growing, which is
 * the signal), and the removal of workers lost for lost_retention_ms (their
 * row in the store and their per-worker series go with them): one walk over
 * the table. */
void workers_sweep(workers_table *t, int64_t now_mono_ms, int64_t timeout_ms);
/* Every worker's command stream ends UNAVAILABLE with `why`; nothing tells the
 * workers to leave: they stay up, with what they hold, and register again
 * with the next daemon (which resumes the run). */
void workers_disconnect(workers_table *t, const char *why);

/* Workers as the Control API shows them, all or those of run_id; free with
 * workers_list_free. */
size_t workers_list(workers_table *t, const char *run_id, Rlorch__V1__WorkerInfo ***out);
void workers_list_free(Rlorch__V1__WorkerInfo **w, size_t n);

const char *workers_role_label(Rlorch__V1__WorkerRole r); /* "trainer", "inference" */

#endif
