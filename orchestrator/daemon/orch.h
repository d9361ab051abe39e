/* The daemon's state: owned by `rlorch serve`, touched on the loop thread only.
 *
 * Modules of the daemon and who calls whom (an arrow: calls, includes). Every
 * arrow points down the list, so there is no circle; orch.h itself is only
 * this struct, read by the modules that are handed an orch.
 *
 *   serve        start-up, signals, shutdown, daemon metrics: wires everything
 *     -> control_api, worker_api, runner, workers, watch, now, config, datadir,
 *        store, metrics, http
 *   control_api  the Control API handlers (runs, workers, WatchRun streams)
 *     -> runner, workers, watch, store, now
 *   worker_api   the Worker API handlers: decode, answer, call the runner/table,
 *                stream the held batch (FetchBatch)
 *     -> runner, workers, sched_pb, bcast (manifest check), now, metrics
 *   runner       the shell around the scheduler: actions -> commands, plans,
 *                records, events, metrics; timers; run start/stop/policy
 *     -> workers, watch, sched_pb, sched, store, metrics, bcast, now
 *   workers      the worker table, command streams, heartbeat sweep, how
 *                workers are shown (ListWorkers, gauge, store, events)
 *     -> watch, store, metrics, now
 *   watch        WatchRun subscribers: subscribe, publish, end
 *     -> now, rpc
 *   sched_pb     scheduler <-> protobuf and broadcast-engine conversions
 *     -> sched, schemas, bcast (types only)
 *   now          the wall and monotonic clocks
 *   datadir, store, metrics, http, config: leaf modules with their own
 *                headers (datadir: the data_dir's lock; -> now). */
#ifndef RLORCH_ORCH_H
#define RLORCH_ORCH_H

#include <stdint.h>

#include <uv.h>

#include "orchestrator/daemon/config.h"
#include "orchestrator/daemon/datadir.h"
#include "orchestrator/daemon/http.h"
#include "orchestrator/daemon/metrics.h"
#include "orchestrator/daemon/store.h"
#include "rpc/rpc.h"

/* The modules' objects; each header declares the same names. */
typedef struct runner runner;               /* runner.h */
typedef struct workers_table workers_table; /* workers.h */
typedef struct watch_hub watch_hub;         /* watch.h */

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
  metrics_gauge *broadcast_predicted;    /* the cost model's seconds for the last broadcast */
  metrics_gauge *broadcast_model_ratio;  /* its measured seconds over the predicted */
  metrics_gauge *policy_version;
  metrics_gauge *async_level;
  metrics_counter *rollouts;             /* outcome */
  metrics_counter *rollouts_malformed;   /* reason */
  metrics_gauge *rollout_buffer_bytes;   /* the active run's kept rollouts (buffered and
                                            the held batch), packed */
  metrics_counter *batch_fetch_bytes;    /* rollout bytes FetchBatch streamed */
  metrics_gauge *workers;                /* role, state */
  metrics_counter *broadcast_aborts;     /* reason */
  metrics_gauge *run_steps_done;         /* the active run's committed steps */
  metrics_gauge *run_steps_target;       /* its target; 0: until stopped */
  metrics_gauge *last_step_time;         /* Unix seconds of the last commit */
  metrics_gauge *heartbeat_age;          /* worker, role */
  metrics_gauge *rollouts_in_flight;     /* asked of inference workers, not yet received */
  metrics_histogram *request_duration;   /* a rollout request: dispatch to its answer */
  metrics_counter *generated_tokens;     /* completion tokens of the rollouts received */
  metrics_counter *requests;             /* outcome: dispatched, resent, requeued, cancelled */
  metrics_gauge *last_broadcast_time;    /* Unix seconds of the last successful broadcast */
  metrics_gauge *worker_requests_active; /* worker: as each reports */
  metrics_counter *worker_rollouts;      /* worker: its own count */
  metrics_counter *worker_tokens;        /* worker */
  metrics_counter *worker_generate_seconds; /* worker */
} orch_metrics;

typedef struct orch {
  uv_loop_t *loop;
  config *cfg;
  datadir *dir;  /* holds the data_dir's lock; released after db is closed */
  store *db;
  orch_metrics m;
  rpc_server *rpc;
  http_server *http;
  uv_signal_t sigterm, sigint;
  uv_timer_t lag_timer;
  uint64_t lag_expected_ms;
  watch_hub *watch;
  workers_table *workers;
  runner *runner;
  int shutting_down;
  int exit_code;
} orch;

#endif
