/* The daemon's state: owned by `rlorch serve`, touched on the loop thread only.
 *
 * serve.c        start-up, signals, graceful shutdown, daemon metrics
 * control_svc.c  the Control API handlers (runs, workers, WatchRun streams)
 * worker_svc.c   the Worker API handlers and the shell around the scheduler:
 *                turns scheduler actions into commands on Attach streams,
 *                plans, SQLite step records, events and metrics. */
#ifndef RLORCH_ORCH_H
#define RLORCH_ORCH_H

#include <stdint.h>

#include <uv.h>

#include "orchestrator/daemon/config.h"
#include "orchestrator/daemon/http.h"
#include "orchestrator/daemon/metrics.h"
#include "orchestrator/daemon/store.h"
#include "rlorch/v1/control.pb-c.h"
#include "rlorch/v1/worker.pb-c.h"
#include "rpc/rpc.h"

typedef struct orch_runner orch_runner; /* worker_svc.c */

/* An open WatchRun stream. */
typedef struct orch_watcher {
  rpc_call *call;
  char run_id[64];
  uint64_t seq;
  struct orch_watcher *next;
} orch_watcher;

typedef struct orch_metrics {
  metrics_registry *reg;
  metrics_gauge *build_info;
  metrics_counter *rpc_requests;     /* method, code */
  metrics_histogram *rpc_duration;   /* method */
  metrics_gauge *loop_lag;
  metrics_gauge *runs;               /* state */
  metrics_histogram *step_duration;
  metrics_histogram *broadcast_duration; /* mode */
  metrics_histogram *staging_seconds;    /* stage */
  metrics_counter *broadcast_bytes;      /* mode, link */
  metrics_gauge *broadcast_throughput;
  metrics_gauge *policy_version;
  metrics_gauge *async_level;
  metrics_counter *rollouts;             /* outcome */
  metrics_gauge *workers;                /* role, state */
  metrics_counter *broadcast_aborts;     /* reason */
} orch_metrics;

typedef struct orch {
  uv_loop_t *loop;
  config *cfg;
  store *db;
  orch_metrics m;
  rpc_server *rpc;
  http_server *http;
  uv_signal_t sigterm, sigint;
  uv_timer_t lag_timer;
  uint64_t lag_expected_ms;
  orch_watcher *watchers;
  orch_runner *runner;
  int shutting_down;
  int exit_code;
} orch;

int64_t orch_now_ms(void); /* wall clock, Unix milliseconds */

/* control_svc.c */
extern const rpc_method orch_control_methods[];
extern const size_t orch_control_nmethods;
/* Sends an event to every watcher of run_id; seq and time are filled in here. */
void orch_publish(orch *o, const char *run_id, Rlorch__V1__RunEvent *ev);
/* Ends every watcher of run_id with OK after the run reached a final state. */
void orch_watchers_end(orch *o, const char *run_id);
int orch_run_is_final(Rlorch__V1__RunState s);
/* Frees the watcher list at exit (their calls are already ended). */
void orch_watchers_free(orch *o);

/* worker_svc.c */
extern const rpc_method orch_worker_methods[];
extern const size_t orch_worker_nmethods;
int orch_runner_new(orch *o, orch_runner **out);
void orch_runner_free(orch_runner *r);
/* Becomes the active run (takes ownership of run). FAILED_PRECONDITION-worthy
 * refusals return -1 with a message. */
int orch_runner_start(orch_runner *r, Rlorch__V1__Run *run, char *err, size_t errlen);
/* The active run, or NULL. */
const Rlorch__V1__Run *orch_runner_active(const orch_runner *r);
int orch_runner_stop(orch_runner *r, const char *run_id, const char *reason, char *err,
                     size_t errlen);
int orch_runner_set_policy(orch_runner *r, const char *run_id, Rlorch__V1__BroadcastMode p,
                           char *err, size_t errlen);
/* Workers as the control API shows them; free with orch_workers_free. */
size_t orch_runner_workers(orch_runner *r, const char *run_id, Rlorch__V1__WorkerInfo ***out);
void orch_workers_free(Rlorch__V1__WorkerInfo **w, size_t n);
/* Shutdown: stop the active run, end Attach streams, tell workers to leave. */
void orch_runner_shutdown(orch_runner *r);

#endif
