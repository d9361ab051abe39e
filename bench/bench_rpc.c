/* `rlorch bench rpc`: latency and throughput of a unary control call through
 * the rpc module (cq thread -> libuv loop -> method table -> protobuf-c
 * handler) against a bare gRPC C-core echo server answering from its own cq
 * thread, both in this process, both on loopback, same client. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "bench/bench.h"
#include "orchestrator/common/opt.h"
#include "rlorch/v1/control.pb-c.h"
#include "rpc/rpc.h"

extern char **environ;

#define BENCH_METHOD "/rlorch.v1.Control/GetRun"
#define BASE_ARMED 64

/* ---- baseline: bare C-core echo server ------------------------------------------ */

typedef struct base_call {
  int kind; /* 0: requested, 1: answered */
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_byte_buffer *payload;
  int cancelled;
  grpc_slice details;
} base_call;

typedef struct base_server {
  grpc_server *server;
  grpc_completion_queue *cq;
  void *method;
  int port;
  uv_thread_t th;
} base_server;

static void base_arm(base_server *b) {
  base_call *c = calloc(1, sizeof *c);
  grpc_metadata_array_init(&c->md);
  grpc_server_request_registered_call(b->server, b->method, &c->call, &c->deadline, &c->md,
                                      &c->payload, b->cq, b->cq, c);
}

static void base_free(base_call *c) {
  if (c->call) grpc_call_unref(c->call);
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  grpc_metadata_array_destroy(&c->md);
  grpc_slice_unref(c->details);
  free(c);
}

/* Answers each call in one batch straight from the cq thread. */
static void base_thread(void *arg) {
  base_server *b = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(b->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) return;
    base_call *c = ev.tag;
    if (!c) continue; /* shutdown notification */
    if (c->kind == 1 || !ev.success) {
      base_free(c);
      continue;
    }
    base_arm(b);
    c->kind = 1;
    c->details = grpc_empty_slice();
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = c->payload;
    ops[2].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[2].data.send_status_from_server.status = GRPC_STATUS_OK;
    ops[2].data.send_status_from_server.status_details = &c->details;
    ops[3].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[3].data.recv_close_on_server.cancelled = &c->cancelled;
    if (grpc_call_start_batch(c->call, ops, 4, c, NULL) != GRPC_CALL_OK) base_free(c);
  }
}

static int base_start(base_server *b) {
  grpc_arg a = {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0};
  grpc_channel_args args = {1, &a};
  b->server = grpc_server_create(&args, NULL);
  b->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(b->server, b->cq, NULL);
  b->method = grpc_server_register_method(b->server, BENCH_METHOD, NULL,
                                          GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
  grpc_server_credentials *cr = grpc_insecure_server_credentials_create();
  b->port = grpc_server_add_http2_port(b->server, "127.0.0.1:0", cr);
  grpc_server_credentials_release(cr);
  if (b->port <= 0) return -1;
  grpc_server_start(b->server);
  for (int i = 0; i < BASE_ARMED; i++) base_arm(b);
  return uv_thread_create(&b->th, base_thread, b);
}

static void base_stop(base_server *b) {
  grpc_server_shutdown_and_notify(b->server, b->cq, NULL);
  grpc_server_cancel_all_calls(b->server);
  /* The notification and the given-back requests arrive on the cq, which
   * reports shutdown only after them. */
  grpc_completion_queue_shutdown(b->cq);
  uv_thread_join(&b->th);
  grpc_server_destroy(b->server);
  grpc_completion_queue_destroy(b->cq);
}

/* ---- rlorch server on a libuv loop ------------------------------------------------ */

typedef struct rl_server {
  uv_loop_t loop;
  uv_thread_t th;
  rpc_server *s;
  uv_async_t stop;
} rl_server;

static void rl_getrun(rpc_call *c, const ProtobufCMessage *req, void *ud) {
  const Rlorch__V1__GetRunRequest *r = (const void *)req;
  Rlorch__V1__Run run = RLORCH__V1__RUN__INIT;
  run.id = r->run_id;
  rpc_call_reply(c, &run.base);
}

static void rl_loop(void *arg) { uv_run(&((rl_server *)arg)->loop, UV_RUN_DEFAULT); }

static void rl_on_stop(uv_async_t *a) {
  rl_server *r = a->data;
  rpc_server_shutdown(r->s, NULL, NULL);
  uv_close((uv_handle_t *)a, NULL);
}

static int rl_start(rl_server *r, char *err, size_t errlen) {
  static const rpc_method m = {BENCH_METHOD, RPC_UNARY, &rlorch__v1__get_run_request__descriptor,
                               &rlorch__v1__run__descriptor, 0, rl_getrun, NULL};
  rpc_server_opts o = {.listen = "127.0.0.1:0"};
  uv_loop_init(&r->loop);
  if (rpc_server_new(&r->loop, &o, &m, 1, &r->s, err, errlen) < 0) return -1;
  uv_async_init(&r->loop, &r->stop, rl_on_stop);
  r->stop.data = r;
  return uv_thread_create(&r->th, rl_loop, r);
}

static void rl_stop(rl_server *r) {
  uv_async_send(&r->stop);
  uv_thread_join(&r->th);
  rpc_server_free(r->s);
  uv_loop_close(&r->loop);
}

/* ---- load ------------------------------------------------------------------------- */

typedef struct worker {
  const char *target;
  int n;
  double *lat;
  int errors;
} worker;

static void worker_run(void *arg) {
  worker *w = arg;
  rpc_client *c;
  char err[256];
  rpc_client_opts o = {.target = w->target};
  if (rpc_client_new(&o, &c, err, sizeof err) < 0) {
    w->errors = w->n;
    return;
  }
  Rlorch__V1__GetRunRequest req = RLORCH__V1__GET_RUN_REQUEST__INIT;
  req.run_id = "run-0001";
  for (int i = -50; i < w->n; i++) { /* 50 warm-up calls */
    ProtobufCMessage *resp = NULL;
    rpc_status st;
    uint64_t t0 = uv_hrtime();
    grpc_status_code code =
        rpc_client_call(c, BENCH_METHOD, &req.base, &rlorch__v1__run__descriptor, 10, &resp, &st);
    uint64_t t1 = uv_hrtime();
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    if (i < 0) continue;
    if (code != GRPC_STATUS_OK) w->errors++;
    w->lat[i] = (double)(t1 - t0) * 1e-3; /* microseconds */
  }
  rpc_client_free(c);
}

typedef struct result {
  double p50_us, p99_us, rps;
  int errors;
} result;

static result measure(const char *target, int threads, int requests) {
  result r = {0};
  int per = requests / threads;
  if (per < 1) per = 1;
  double *lat = calloc((size_t)per * threads, sizeof *lat);
  worker *w = calloc(threads, sizeof *w);
  uv_thread_t *th = calloc(threads, sizeof *th);
  uint64_t t0 = uv_hrtime();
  for (int i = 0; i < threads; i++) {
    w[i] = (worker){target, per, lat + (size_t)i * per, 0};
    uv_thread_create(&th[i], worker_run, &w[i]);
  }
  for (int i = 0; i < threads; i++) {
    uv_thread_join(&th[i]);
    r.errors += w[i].errors;
  }
  double secs = (double)(uv_hrtime() - t0) * 1e-9;
  size_t n = (size_t)per * threads;
  bench_sort(lat, n);
  r.p50_us = lat[n / 2];
  r.p99_us = lat[(size_t)(n * 0.99)];
  r.rps = (double)n / secs; /* warm-up included in the time: a slight underestimate */
  free(lat);
  free(w);
  free(th);
  return r;
}

typedef struct bench_rpc_opts {
  uint32_t requests;
  bool json;
} bench_rpc_opts;

static const opt_field bench_rpc__fields[] = {
    {.name = "requests", .flag = "--requests", .type = OPT_U32,
     .off = OPT_OFF(bench_rpc_opts, requests, uint32_t), .min = 16, .max = 100000000,
     .metavar = "N", .help = "calls per setting"},
    {.name = "json", .flag = "--json", .type = OPT_SWITCH,
     .off = OPT_OFF(bench_rpc_opts, json, bool), .help = "one JSON object instead of a table"},
};

static const opt_cmd bench_rpc__cmd = {
    .name = "bench rpc",
    .about = "Latency and throughput of a unary control call through the rpc module against\n"
             "a bare gRPC C-core echo server, both in this process, on loopback.",
    .fields = bench_rpc__fields,
    .nfields = sizeof bench_rpc__fields / sizeof bench_rpc__fields[0],
};

int bench_rpc(int argc, char **argv) {
  const bench_rpc_opts defaults = {.requests = 20000};
  bench_rpc_opts o = defaults;
  opt_state st;
  int rc = opt_parse_main(&bench_rpc__cmd, &o, &defaults, argc, argv, environ, &st);
  if (rc >= 0) return rc;
  int requests = (int)o.requests, json = o.json;
  grpc_init();
  char err[256];
  rl_server rl;
  base_server base;
  memset(&rl, 0, sizeof rl);
  memset(&base, 0, sizeof base);
  if (rl_start(&rl, err, sizeof err) < 0 || base_start(&base) < 0) {
    fprintf(stderr, "bench rpc: cannot start servers: %s\n", err);
    return 1;
  }
  char t_rl[64], t_base[64];
  snprintf(t_rl, sizeof t_rl, "127.0.0.1:%d", rpc_server_port(rl.s));
  snprintf(t_base, sizeof t_base, "127.0.0.1:%d", base.port);
  static const int conc[] = {1, 16};
  result rr[2], rb[2];
  for (int k = 0; k < 2; k++) {
    /* Interleave so that machine noise hits both alike. */
    rb[k] = measure(t_base, conc[k], requests / 2);
    rr[k] = measure(t_rl, conc[k], requests / 2);
    result b2 = measure(t_base, conc[k], requests / 2);
    result r2 = measure(t_rl, conc[k], requests / 2);
    rb[k].p50_us = (rb[k].p50_us + b2.p50_us) / 2;
    rb[k].p99_us = (rb[k].p99_us + b2.p99_us) / 2;
    rb[k].rps = (rb[k].rps + b2.rps) / 2;
    rb[k].errors += b2.errors;
    rr[k].p50_us = (rr[k].p50_us + r2.p50_us) / 2;
    rr[k].p99_us = (rr[k].p99_us + r2.p99_us) / 2;
    rr[k].rps = (rr[k].rps + r2.rps) / 2;
    rr[k].errors += r2.errors;
  }
  rl_stop(&rl);
  base_stop(&base);
  grpc_shutdown_blocking();
  int errors = rr[0].errors + rr[1].errors + rb[0].errors + rb[1].errors;
  if (json) {
    printf("{\"bench\":\"rpc\",\"requests\":%d,\"errors\":%d,\"results\":[", requests, errors);
    for (int k = 0; k < 2; k++)
      printf("%s{\"concurrency\":%d,\"rlorch\":{\"p50_us\":%.1f,\"p99_us\":%.1f,\"rps\":%.0f},"
             "\"baseline\":{\"p50_us\":%.1f,\"p99_us\":%.1f,\"rps\":%.0f},"
             "\"ratio\":{\"p50\":%.3f,\"p99\":%.3f,\"rps\":%.3f}}",
             k ? "," : "", conc[k], rr[k].p50_us, rr[k].p99_us, rr[k].rps, rb[k].p50_us,
             rb[k].p99_us, rb[k].rps, rr[k].p50_us / rb[k].p50_us, rr[k].p99_us / rb[k].p99_us,
             rr[k].rps / rb[k].rps);
    printf("]}\n");
  } else {
    printf("rpc: unary %s, %d requests per setting, loopback\n", BENCH_METHOD, requests);
    printf("%-5s %-9s %10s %10s %10s\n", "conc", "server", "p50 us", "p99 us", "req/s");
    for (int k = 0; k < 2; k++) {
      printf("%-5d %-9s %10.1f %10.1f %10.0f\n", conc[k], "rlorch", rr[k].p50_us, rr[k].p99_us,
             rr[k].rps);
      printf("%-5d %-9s %10.1f %10.1f %10.0f\n", conc[k], "baseline", rb[k].p50_us, rb[k].p99_us,
             rb[k].rps);
      printf("%-5d %-9s %10.2f %10.2f %10.2f   (rlorch / baseline; p50 aim <= 1.3)\n", conc[k],
             "ratio", rr[k].p50_us / rb[k].p50_us, rr[k].p99_us / rb[k].p99_us,
             rr[k].rps / rb[k].rps);
    }
    if (errors) printf("errors: %d calls failed\n", errors);
  }
  return errors ? 1 : 0;
}
