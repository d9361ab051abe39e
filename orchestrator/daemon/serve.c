/* `rlorch serve`: the orchestrator daemon. One libuv loop thread owns all state;
 * gRPC (control + worker API + health), HTTP (/metrics, /healthz, /readyz) and
 * timers all run on it. SIGTERM/SIGINT shut down gracefully and exit 0. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "build_info.h"
#include "orchestrator/daemon/serve.h"
#include "orchestrator/common/log.h"
#include "orchestrator/daemon/control_api.h"
#include "orchestrator/daemon/now.h"
#include "orchestrator/daemon/orch.h"
#include "orchestrator/daemon/rollout_check.h"
#include "orchestrator/daemon/runner.h"
#include "orchestrator/daemon/watch.h"
#include "orchestrator/daemon/worker_api.h"
#include "orchestrator/daemon/workers.h"
#include "workers/bcast/bcast.h"

extern char **environ;

/* ---- daemon metrics -------------------------------------------------------- */

static const double latency_buckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                         0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5,
                                         5,      10};
/* Up to hours: a step of a large model with slow generation takes minutes. */
static const double step_buckets[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                      2.5,   5,     10,   30,    60,   120, 300, 600, 1800,
                                      3600,  7200,  14400};

#define NB(a) (sizeof(a) / sizeof((a)[0]))

static int metrics_setup(orch *o, const bcast_caps *caps, char *err, size_t errlen) {
  orch_metrics *m = &o->m;
  static const char *const l_version[] = {"version", "cuda", "nccl", NULL};
  static const char *const l_method_code[] = {"method", "code", NULL};
  static const char *const l_method[] = {"method", NULL};
  static const char *const l_state[] = {"state", NULL};
  static const char *const l_mode[] = {"mode", NULL};
  static const char *const l_stage[] = {"stage", NULL};
  static const char *const l_mode_link[] = {"mode", "link", NULL};
  static const char *const l_outcome[] = {"outcome", NULL};
  static const char *const l_role_state[] = {"role", "state", NULL};
  static const char *const l_reason[] = {"reason", NULL};
  m->reg = metrics_registry_new();
  if (!m->reg) return snprintf(err, errlen, "metrics: out of memory"), -1;
#define REG(field, expr)                                                                         \
  if (!(m->field = (expr))) return -1
  REG(build_info, metrics_gauge_new(m->reg, "rlorch_build_info",
                                    "Build of the running orchestrator (always 1).", l_version,
                                    err, errlen));
  REG(rpc_requests, metrics_counter_new(m->reg, "rlorch_rpc_requests_total",
                                        "gRPC calls finished, by method and status code.",
                                        l_method_code, err, errlen));
  REG(rpc_duration, metrics_histogram_new(m->reg, "rlorch_rpc_duration_seconds",
                                          "gRPC call latency, from arrival to status.", l_method,
                                          latency_buckets, NB(latency_buckets), err, errlen));
  REG(loop_lag, metrics_gauge_new(m->reg, "rlorch_event_loop_lag_seconds",
                                  "How late the last event-loop timer fired.", NULL, err,
                                  errlen));
  REG(runs, metrics_gauge_new(m->reg, "rlorch_runs", "Runs in the store, by state.", l_state,
                              err, errlen));
  REG(step_duration, metrics_histogram_new(m->reg, "rlorch_step_duration_seconds",
                                           "Wall time of a step, from batch to broadcast done.",
                                           NULL, step_buckets, NB(step_buckets), err, errlen));
  REG(broadcast_duration,
      metrics_histogram_new(m->reg, "rlorch_broadcast_duration_seconds",
                            "Wall time of the weight broadcast after a step, by mode.", l_mode,
                            step_buckets, NB(step_buckets), err, errlen));
  REG(staging_seconds,
      metrics_histogram_new(m->reg, "rlorch_staging_seconds",
                            "Per-step staging time by stage (h2d, cast, exposed).", l_stage,
                            step_buckets, NB(step_buckets), err, errlen));
  REG(broadcast_bytes, metrics_counter_new(m->reg, "rlorch_broadcast_bytes_total",
                                           "Bytes moved by broadcasts, by mode and link "
                                           "(pcie: host to device, wire: to receivers).",
                                           l_mode_link, err, errlen));
  REG(broadcast_throughput,
      metrics_gauge_new(m->reg, "rlorch_broadcast_throughput_bytes_per_second",
                        "Wire bytes over wall time of the last broadcast.", NULL, err, errlen));
  REG(broadcast_predicted,
      metrics_gauge_new(m->reg, "rlorch_broadcast_predicted_seconds",
                        "Seconds the topology cost model predicted for the last broadcast.", NULL,
                        err, errlen));
  REG(broadcast_model_ratio,
      metrics_gauge_new(m->reg, "rlorch_broadcast_model_ratio",
                        "Measured over predicted seconds of the last broadcast.", NULL, err,
                        errlen));
  REG(policy_version, metrics_gauge_new(m->reg, "rlorch_policy_version",
                                        "Policy version held by the inference workers.", NULL,
                                        err, errlen));
  REG(async_level, metrics_gauge_new(m->reg, "rlorch_async_level",
                                     "Steps between the batch's oldest rollout version and the "
                                     "step that used it.",
                                     NULL, err, errlen));
  REG(rollouts, metrics_counter_new(m->reg, "rlorch_rollouts_total",
                                    "Rollouts by outcome (used, dropped_stale).", l_outcome, err,
                                    errlen));
  static const char *const l_malformed[] = {"reason", NULL};
  REG(rollouts_malformed,
      metrics_counter_new(m->reg, "rlorch_rollouts_malformed_total",
                          "Rollout reports refused, by the first fault found.", l_malformed, err,
                          errlen));
  REG(rollout_buffer_bytes,
      metrics_gauge_new(m->reg, "rlorch_rollout_buffer_bytes",
                        "Bytes of rollouts kept for the active run (packed): buffered "
                        "ones and the batch being trained; at rollout_buffer_bytes "
                        "dispatch is held back.",
                        NULL, err, errlen));
  REG(batch_fetch_bytes,
      metrics_counter_new(m->reg, "rlorch_batch_fetch_bytes_total",
                          "Bytes of rollouts FetchBatch streamed to trainer ranks (packed "
                          "sizes, as TrainStep.batch_bytes counts them).",
                          NULL, err, errlen));
  REG(workers, metrics_gauge_new(m->reg, "rlorch_workers", "Workers by role and state.",
                                 l_role_state, err, errlen));
  REG(broadcast_aborts, metrics_counter_new(m->reg, "rlorch_broadcast_aborts_total",
                                            "Broadcasts aborted, by reason.", l_reason, err,
                                            errlen));
  REG(run_steps_done, metrics_gauge_new(m->reg, "rlorch_run_steps_done",
                                        "Steps the active run has committed.", NULL, err,
                                        errlen));
  REG(run_steps_target, metrics_gauge_new(m->reg, "rlorch_run_steps_target",
                                          "Steps the active run is to take; 0: until stopped.",
                                          NULL, err, errlen));
  REG(last_step_time, metrics_gauge_new(m->reg, "rlorch_last_step_timestamp_seconds",
                                        "Unix time of the last committed step, whose broadcast "
                                        "succeeded (0: none yet).",
                                        NULL, err, errlen));
  static const char *const l_worker_role[] = {"worker", "role", NULL};
  REG(heartbeat_age, metrics_gauge_new(m->reg, "rlorch_worker_heartbeat_age_seconds",
                                       "Seconds since each worker was last heard from.",
                                       l_worker_role, err, errlen));
  static const char *const l_worker[] = {"worker", NULL};
  REG(rollouts_in_flight,
      metrics_gauge_new(m->reg, "rlorch_rollouts_in_flight",
                        "Rollouts the active run asked of inference workers and not yet received.",
                        NULL, err, errlen));
  REG(request_duration,
      metrics_histogram_new(m->reg, "rlorch_rollout_request_duration_seconds",
                            "Latency of a rollout request (one group): dispatch to its answer.",
                            NULL, step_buckets, NB(step_buckets), err, errlen));
  REG(generated_tokens,
      metrics_counter_new(m->reg, "rlorch_generated_tokens_total",
                          "Completion tokens of the rollouts received; rate() is tokens/s.", NULL,
                          err, errlen));
  REG(requests, metrics_counter_new(m->reg, "rlorch_rollout_requests_total",
                                    "Rollout requests by outcome (dispatched, resent: a slow "
                                    "request sent again elsewhere, requeued: a lost worker's, "
                                    "cancelled: answered elsewhere, late: answered after that).",
                                    l_outcome, err, errlen));
  REG(last_broadcast_time,
      metrics_gauge_new(m->reg, "rlorch_last_broadcast_timestamp_seconds",
                        "Unix time of the last successful weight broadcast (0: none yet).", NULL,
                        err, errlen));
  REG(worker_requests_active,
      metrics_gauge_new(m->reg, "rlorch_worker_requests_active",
                        "Rollout requests each inference worker reports generating now.",
                        l_worker, err, errlen));
  REG(worker_rollouts, metrics_counter_new(m->reg, "rlorch_worker_rollouts_generated_total",
                                           "Rollouts each worker generated, by its own count.",
                                           l_worker, err, errlen));
  REG(worker_tokens, metrics_counter_new(m->reg, "rlorch_worker_generated_tokens_total",
                                         "Completion tokens each worker generated, by its own "
                                         "count.",
                                         l_worker, err, errlen));
  REG(worker_generate_seconds,
      metrics_counter_new(m->reg, "rlorch_worker_generate_seconds_total",
                          "Seconds each worker spent generating, summed over concurrent "
                          "requests.",
                          l_worker, err, errlen));
#undef REG
  const char *bi[] = {RLORCH_VERSION, caps->cuda_built ? "yes" : "no",
                      caps->nccl_built ? "yes" : "no"};
  metrics_gauge_set(m->build_info, bi, 1);
  /* Zero series up front so rates and alerts see them before the first event. */
  const char *used[] = {"used"}, *stale[] = {"dropped_stale"};
  metrics_counter_add(m->rollouts, used, 0);
  metrics_counter_add(m->rollouts, stale, 0);
  for (int f = ROLLOUT_OK + 1; f < ROLLOUT_REASONS; f++) {
    const char *lv[] = {rollout_fault_name((rollout_fault)f)};
    metrics_counter_add(m->rollouts_malformed, lv, 0);
  }
  metrics_counter_add(m->batch_fetch_bytes, NULL, 0);
  metrics_gauge_set(m->run_steps_done, NULL, 0);
  metrics_gauge_set(m->run_steps_target, NULL, 0);
  metrics_gauge_set(m->last_step_time, NULL, 0);
  metrics_gauge_set(m->last_broadcast_time, NULL, 0);
  metrics_gauge_set(m->rollouts_in_flight, NULL, 0);
  metrics_counter_add(m->generated_tokens, NULL, 0);
  static const char *const outcomes[] = {"dispatched", "resent", "requeued", "cancelled", "late"};
  for (size_t i = 0; i < NB(outcomes); i++) {
    const char *lv[] = {outcomes[i]};
    metrics_counter_add(m->requests, lv, 0);
  }
  return 0;
}

static const char *known_method(const char *method) {
  for (size_t i = 0; i < control_api_nmethods; i++)
    if (!strcmp(control_api_methods[i].name, method)) return method;
  for (size_t i = 0; i < worker_api_nmethods; i++)
    if (!strcmp(worker_api_methods[i].name, method)) return method;
  if (!strncmp(method, "/grpc.health.v1.Health/", 23)) return method;
  return "unknown"; /* bounded label set: clients choose method names */
}

static void on_call_done(const char *method, grpc_status_code code, double seconds, void *ud) {
  orch *o = ud;
  const char *mname = known_method(method ? method : "");
  const char *lv[] = {mname, rpc_status_name(code)};
  metrics_counter_inc(o->m.rpc_requests, lv);
  metrics_histogram_observe(o->m.rpc_duration, lv, seconds);
}

static void on_scrape(void *arg) {
  orch *o = arg;
  static const char *const names[STORE_RUN_STATES] = {
      NULL, "pending", "running", "stopping", "stopped", "succeeded", "failed"};
  uint64_t counts[STORE_RUN_STATES];
  if (store_run_counts(o->db, counts) != 0) return;
  for (int i = 1; i < STORE_RUN_STATES; i++) {
    const char *lv[] = {names[i]};
    metrics_gauge_set(o->m.runs, lv, (double)counts[i]);
  }
}

static int is_ready(void *arg, char *reason, size_t len) {
  orch *o = arg;
  if (o->shutting_down) {
    snprintf(reason, len, "shutting down");
    return 0;
  }
  return 1;
}

/* Event-loop lag: a 250 ms timer that measures how late it fires. */
#define LAG_PERIOD_MS 250
static void on_lag_timer(uv_timer_t *t) {
  orch *o = t->data;
  uint64_t now = uv_now(o->loop);
  double lag = now > o->lag_expected_ms ? (double)(now - o->lag_expected_ms) / 1000.0 : 0.0;
  metrics_gauge_set(o->m.loop_lag, NULL, lag);
  o->lag_expected_ms = now + LAG_PERIOD_MS;
}

/* ---- start-up and shutdown --------------------------------------------------- */

static void on_rpc_shutdown_done(void *ud) {
  orch *o = ud;
  log_info("grpc_stopped", NULL);
  uv_stop(o->loop);
}

static void on_http_closed(void *ud) { (void)ud; }

static void begin_shutdown(orch *o, const char *why) {
  if (o->shutting_down) {
    log_warn("shutdown_already_in_progress", "signal=%s", why);
    return;
  }
  o->shutting_down = 1;
  log_info("shutdown", "reason=%s grace_s=%.1f", why, o->cfg->shutdown_grace_s);
  rpc_server_set_health(o->rpc, "", 2);
  rpc_server_set_health(o->rpc, "rlorch.v1.Control", 2);
  rpc_server_set_health(o->rpc, "rlorch.v1.Worker", 2);
  watch_hub_closing(o->watch);
  runner_shutdown(o->runner);
  /* WatchRun streams are ended by the rpc layer with UNAVAILABLE. */
  rpc_server_shutdown(o->rpc, on_rpc_shutdown_done, o);
}

static void on_signal(uv_signal_t *h, int signum) {
  begin_shutdown(h->data, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

static void close_walk(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

/* Everything the loop owns is released here, on every path: handles closed
 * and their callbacks drained, so the loop itself can be closed. */
static void serve_teardown(orch *o) {
  if (o->http) http_server_close(o->http, on_http_closed, o);
  o->http = NULL;
  if (o->runner) {
    runner_shutdown(o->runner);
    runner_free(o->runner);
    o->runner = NULL;
  }
  workers_free(o->workers);
  o->workers = NULL;
  watch_hub_free(o->watch);
  o->watch = NULL;
  uv_walk(o->loop, close_walk, NULL);
  uv_run(o->loop, UV_RUN_DEFAULT);
  if (o->rpc) rpc_server_free(o->rpc);
  o->rpc = NULL;
}

#define SERVE_WORKERS_PER_CQ 2048

static int start_rpc(orch *o, char *err, size_t errlen) {
  config *cfg = o->cfg;
  size_t nm = control_api_nmethods + worker_api_nmethods;
  rpc_method *methods = calloc(nm, sizeof *methods);
  if (!methods) return snprintf(err, errlen, "out of memory"), -1;
  memcpy(methods, control_api_methods, control_api_nmethods * sizeof *methods);
  memcpy(methods + control_api_nmethods, worker_api_methods,
         worker_api_nmethods * sizeof *methods);
  for (size_t i = 0; i < nm; i++) methods[i].ud = o;
  /* A queue per 2,048 workers the daemon may hold: with fewer a queue's scan
   * of its outstanding operations is cheap (rpc.h), and every queue more
   * costs thread hand-offs (docs/BENCHMARKS.md, the step loop). */
  int queues = (int)((cfg->max_workers + SERVE_WORKERS_PER_CQ - 1) / SERVE_WORKERS_PER_CQ);
  rpc_server_opts ro = {.listen = cfg->listen,
                        .completion_queues = queues,
                        .max_message_bytes = cfg->max_message_bytes,
                        .token = cfg->token,
                        .tls_cert_file = cfg->tls_cert_file,
                        .tls_key_file = cfg->tls_key_file,
                        .tls_client_ca_file = cfg->tls_client_ca_file,
                        .shutdown_grace_s = cfg->shutdown_grace_s,
                        .on_call_done = on_call_done,
                        .hook_ud = o};
  int rc = rpc_server_new(o->loop, &ro, methods, nm, &o->rpc, err, errlen);
  free(methods);
  return rc;
}

static void log_listening(orch *o, const bcast_caps *caps) {
  config *cfg = o->cfg;
  char host[256], mhost[256];
  int p;
  opt_parse_addr(cfg->listen, host, sizeof host, &p);
  opt_parse_addr(cfg->metrics_listen, mhost, sizeof mhost, &p);
  log_info("listening", "grpc=%s:%d metrics=http://%s:%d/metrics data_dir=\"%s\" auth=%s tls=%s",
           host[0] ? host : "0.0.0.0", rpc_server_port(o->rpc), mhost[0] ? mhost : "0.0.0.0",
           http_server_port(o->http), cfg->data_dir, cfg->token ? "bearer" : "none",
           cfg->tls_cert_file ? "on" : "off");
  log_info("transports", "cuda_devices=%d nccl=\"%s\" note=\"%s\"", caps->cuda_devices,
           caps->nccl_version, caps->note);
}

_Static_assert(WORKERS_MAX == 16384, "config.c bounds max_workers by WORKERS_MAX");

/* Files that would leak what they hold: said once at start-up, by name. */
static void warn_file_modes(const config *cfg, const datadir_info *di) {
  if (di->shared)
    log_warn("data_dir_shared", "data_dir=\"%s\" mode=%04o msg=\"group or others may enter "
             "it: the daemon's own files are 0600, but chmod 700 the directory\"",
             cfg->data_dir, (unsigned)di->mode);
  struct stat st;
  if (cfg->token_file && stat(cfg->token_file, &st) == 0 && (st.st_mode & (S_IRGRP | S_IROTH)))
    log_warn("token_file_readable", "path=\"%s\" mode=%04o msg=\"the bearer token can be read "
             "by group or others: chmod 600 it\"",
             cfg->token_file, (unsigned)(st.st_mode & 07777));
}

static int serve_loop(orch *o) {
  config *cfg = o->cfg;
  char err[1536];
  /* Before the database: a second daemon must not touch the first one's runs. */
  datadir_info di;
  int drc = datadir_open(cfg->data_dir, &o->dir, &di, err, sizeof err);
  if (drc != DATADIR_OK) {
    log_error(drc == DATADIR_ELOCKED ? "data_dir_locked" : "data_dir_failed",
              "data_dir=\"%s\" error=\"%s\"", cfg->data_dir, err);
    return 1;
  }
  warn_file_modes(cfg, &di);
  if (store_open(cfg->data_dir, &o->db, err, sizeof err) != 0) {
    log_error("store_open_failed", "data_dir=\"%s\" error=\"%s\"", cfg->data_dir, err);
    return 1;
  }
  bcast_caps caps; /* probed once: CUDA start-up is not free */
  bcast_caps_probe(&caps);
  if (metrics_setup(o, &caps, err, sizeof err) != 0) {
    log_error("metrics_setup_failed", "error=\"%s\"", err);
    return 1;
  }
  /* The runner uses the table and the hub: they are made first and freed last. */
  if (watch_hub_new(&o->watch) != 0 ||
      workers_new(o->db,
                  &(workers_metrics){.states = o->m.workers,
                                     .heartbeat_age = o->m.heartbeat_age,
                                     .requests_active = o->m.worker_requests_active,
                                     .rollouts = o->m.worker_rollouts,
                                     .tokens = o->m.worker_tokens,
                                     .generate_seconds = o->m.worker_generate_seconds},
                  o->watch,
                  &(workers_limits){.max_workers = cfg->max_workers,
                                    .lost_retention_ms =
                                        (int64_t)(cfg->lost_worker_retention_s * 1000.0)},
                  &o->workers) != 0 ||
      runner_new(o, &o->runner) != 0) {
    log_error("runner_setup_failed", "error=\"out of memory\"");
    serve_teardown(o);
    return 1;
  }
  /* Before the Worker API listens: workers that come back join the resumed run. */
  runner_resume(o->runner);
  if (start_rpc(o, err, sizeof err) != 0) {
    log_error("grpc_listen_failed", "addr=%s error=\"%s\"", cfg->listen, err);
    serve_teardown(o);
    return 1;
  }
  http_server_opts ho = {.metrics = o->m.reg,
                         .on_scrape = on_scrape,
                         .ready = is_ready,
                         .arg = o,
                         .timeout_ms = cfg->http_timeout_ms,
                         .max_connections = cfg->http_max_connections};
  if (http_server_start(o->loop, cfg->metrics_listen, &ho, &o->http, err, sizeof err) != 0) {
    log_error("http_listen_failed", "addr=%s error=\"%s\"", cfg->metrics_listen, err);
    o->http = NULL;
    rpc_server_shutdown(o->rpc, on_rpc_shutdown_done, o);
    uv_run(o->loop, UV_RUN_DEFAULT);
    serve_teardown(o);
    return 1;
  }
  rpc_server_set_health(o->rpc, "", 1);
  rpc_server_set_health(o->rpc, "rlorch.v1.Control", 1);
  rpc_server_set_health(o->rpc, "rlorch.v1.Worker", 1);
  log_listening(o, &caps);

  uv_signal_init(o->loop, &o->sigterm);
  uv_signal_init(o->loop, &o->sigint);
  o->sigterm.data = o->sigint.data = o;
  uv_signal_start(&o->sigterm, on_signal, SIGTERM);
  uv_signal_start(&o->sigint, on_signal, SIGINT);
  uv_timer_init(o->loop, &o->lag_timer);
  o->lag_timer.data = o;
  o->lag_expected_ms = uv_now(o->loop) + LAG_PERIOD_MS;
  uv_timer_start(&o->lag_timer, on_lag_timer, LAG_PERIOD_MS, LAG_PERIOD_MS);

  /* Runs until the rpc server finished its graceful shutdown (uv_stop). */
  uv_run(o->loop, UV_RUN_DEFAULT);
  serve_teardown(o);
  log_info("stopped", "exit_code=%d", o->exit_code);
  return o->exit_code;
}

int serve_main(int argc, char **argv) {
  config cfg;
  char err[1024];
  if (config_load(&cfg, argc, argv, environ, err, sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    config_free(&cfg);
    return 2;
  }
  if (cfg.help) {
    config_usage(stdout);
    config_free(&cfg);
    return 0;
  }
  if (cfg.print_config) {
    config_print(&cfg, stdout);
    config_free(&cfg);
    return 0;
  }
  log_setup(cfg.log_level, cfg.log_format, "serve");
  uv_loop_t loop;
  if (uv_loop_init(&loop) != 0) {
    config_free(&cfg);
    return 1;
  }
  orch o;
  memset(&o, 0, sizeof o);
  o.loop = &loop;
  o.cfg = &cfg;
  int rc = serve_loop(&o);
  if (o.m.reg) metrics_registry_free(o.m.reg);
  if (o.db) store_close(o.db);
  datadir_close(o.dir); /* last: the database is closed, another daemon may have it */
  uv_loop_close(&loop);
  config_free(&cfg);
  return rc;
}
