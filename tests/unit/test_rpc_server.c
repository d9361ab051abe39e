/* rpc server and client over loopback: a server on 127.0.0.1:0 runs on a uv
 * loop in its own thread; the test thread is the client. Handlers are fakes
 * of the control API (rlorch.v1 messages). */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "grpc/health/v1/health.pb-c.h"
#include "rlorch/v1/control.pb-c.h"
#include <grpc/grpc.h>

#include "rpc/rpc.h"

#define GETRUN "/rlorch.v1.Control/GetRun"
#define STARTRUN "/rlorch.v1.Control/StartRun"
#define WATCHRUN "/rlorch.v1.Control/WatchRun"
#define CHECK "/grpc.health.v1.Health/Check"
#define WATCH "/grpc.health.v1.Health/Watch"

typedef struct hook_rec {
  char method[64];
  grpc_status_code code;
} hook_rec;

typedef struct fx {
  uv_loop_t loop;
  uv_thread_t th;
  rpc_server *s;
  uv_async_t cmd;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  void (*cmd_fn)(struct fx *, void *);
  void *cmd_arg;
  int cmd_done;
  int cancels;     /* on_cancel callbacks seen */
  int done_called; /* shutdown done() ran */
  int stream_open; /* an "open" WatchRun stream is held */
  hook_rec hooks[1024];
  int nhooks;
  char target[64];
} fx;

static fx F;

/* ---- handlers ------------------------------------------------------------------ */

static void on_cancel_fail(rpc_call *c, void *ud) {
  fx *f = ud;
  pthread_mutex_lock(&f->mu);
  f->cancels++;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  rpc_call_fail(c, GRPC_STATUS_CANCELLED, "cancelled");
}

static void h_getrun(rpc_call *c, const ProtobufCMessage *req, void *ud) {
  const Rlorch__V1__GetRunRequest *r = (const void *)req;
  if (!strcmp(r->run_id, "hold")) { /* until cancelled */
    rpc_call_set_cancel_cb(c, on_cancel_fail, ud);
    return;
  }
  if (!strcmp(r->run_id, "precondition")) {
    rpc_call_fail(c, GRPC_STATUS_FAILED_PRECONDITION, "run %s is not running", r->run_id);
    return;
  }
  if (strncmp(r->run_id, "r", 1) != 0) {
    rpc_call_fail(c, GRPC_STATUS_NOT_FOUND, "run '%s' not found", r->run_id);
    return;
  }
  Rlorch__V1__Run run = RLORCH__V1__RUN__INIT;
  run.id = r->run_id;
  run.steps_done = strlen(r->run_id);
  run.message = "fake";
  rpc_call_reply(c, &run.base);
}

static void h_startrun(rpc_call *c, const ProtobufCMessage *req, void *ud) {
  const Rlorch__V1__RunSpec *r = (const void *)req;
  Rlorch__V1__Run run = RLORCH__V1__RUN__INIT;
  run.id = "run-1";
  run.spec = (Rlorch__V1__RunSpec *)r;
  rpc_call_reply(c, &run.base);
}

static void on_cancel_stream(rpc_call *c, void *ud) {
  fx *f = ud;
  pthread_mutex_lock(&f->mu);
  f->cancels++;
  f->stream_open = 0;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  rpc_call_finish(c, GRPC_STATUS_CANCELLED, "cancelled");
}

/* Sends from_step events numbered 1..n; run "open" then stays open. */
static void h_watchrun(rpc_call *c, const ProtobufCMessage *req, void *ud) {
  fx *f = ud;
  const Rlorch__V1__WatchRunRequest *r = (const void *)req;
  for (int64_t i = 1; i <= r->from_step; i++) {
    Rlorch__V1__RunEvent ev = RLORCH__V1__RUN_EVENT__INIT;
    ev.seq = (uint64_t)i;
    ev.unix_ms = i * 10;
    cr_assert_eq(rpc_call_send(c, &ev.base), 0);
  }
  if (!strcmp(r->run_id, "open")) {
    rpc_call_set_cancel_cb(c, on_cancel_stream, f);
    pthread_mutex_lock(&f->mu);
    f->stream_open = 1;
    pthread_mutex_unlock(&f->mu);
    return;
  }
  rpc_call_finish(c, GRPC_STATUS_OK, "");
}

static void hook(const char *method, grpc_status_code code, double seconds, void *ud) {
  fx *f = ud;
  pthread_mutex_lock(&f->mu);
  if (f->nhooks < 1024) {
    snprintf(f->hooks[f->nhooks].method, sizeof f->hooks[0].method, "%s", method);
    f->hooks[f->nhooks].code = code;
    f->nhooks++;
  }
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  cr_assert(seconds >= 0 && seconds < 60);
}

static int hook_count(const char *method, grpc_status_code code) {
  int n = 0;
  pthread_mutex_lock(&F.mu);
  for (int i = 0; i < F.nhooks; i++)
    if (!strcmp(F.hooks[i].method, method) && F.hooks[i].code == code) n++;
  pthread_mutex_unlock(&F.mu);
  return n;
}

/* Waits until *v >= want or about 5 s pass. */
static int wait_for(int *v, int want) {
  pthread_mutex_lock(&F.mu);
  for (int i = 0; i < 500 && *v < want; i++) {
    pthread_mutex_unlock(&F.mu);
    usleep(10000);
    pthread_mutex_lock(&F.mu);
  }
  int got = *v;
  pthread_mutex_unlock(&F.mu);
  return got;
}

/* ---- fixture --------------------------------------------------------------------- */

static void on_cmd(uv_async_t *a) {
  fx *f = a->data;
  pthread_mutex_lock(&f->mu);
  void (*fn)(fx *, void *) = f->cmd_fn;
  void *arg = f->cmd_arg;
  f->cmd_fn = NULL;
  pthread_mutex_unlock(&f->mu);
  if (fn) fn(f, arg);
  pthread_mutex_lock(&f->mu);
  f->cmd_done = 1;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

/* Runs fn on the loop thread and waits for it. */
static void on_loop(void (*fn)(fx *, void *), void *arg) {
  pthread_mutex_lock(&F.mu);
  F.cmd_fn = fn;
  F.cmd_arg = arg;
  F.cmd_done = 0;
  pthread_mutex_unlock(&F.mu);
  uv_async_send(&F.cmd);
  pthread_mutex_lock(&F.mu);
  while (!F.cmd_done) pthread_cond_wait(&F.cv, &F.mu);
  pthread_mutex_unlock(&F.mu);
}

static void loop_main(void *arg) {
  fx *f = arg;
  uv_run(&f->loop, UV_RUN_DEFAULT);
}

static void start_opts(rpc_server_opts o) {
  memset(&F, 0, sizeof F);
  pthread_mutex_init(&F.mu, NULL);
  pthread_cond_init(&F.cv, NULL);
  cr_assert_eq(uv_loop_init(&F.loop), 0);
  rpc_method ms[] = {
      {GETRUN, RPC_UNARY, &rlorch__v1__get_run_request__descriptor, &rlorch__v1__run__descriptor,
       1, h_getrun, &F},
      {STARTRUN, RPC_UNARY, &rlorch__v1__run_spec__descriptor, &rlorch__v1__run__descriptor, 1,
       h_startrun, &F},
      {WATCHRUN, RPC_SERVER_STREAM, &rlorch__v1__watch_run_request__descriptor,
       &rlorch__v1__run_event__descriptor, 1, h_watchrun, &F},
  };
  o.listen = "127.0.0.1:0";
  o.on_call_done = hook;
  o.hook_ud = &F;
  char err[256] = "";
  cr_assert_eq(rpc_server_new(&F.loop, &o, ms, 3, &F.s, err, sizeof err), 0, "%s", err);
  cr_assert_gt(rpc_server_port(F.s), 0);
  snprintf(F.target, sizeof F.target, "127.0.0.1:%d", rpc_server_port(F.s));
  uv_async_init(&F.loop, &F.cmd, on_cmd);
  F.cmd.data = &F;
  cr_assert_eq(uv_thread_create(&F.th, loop_main, &F), 0);
}

static void start(void) { start_opts((rpc_server_opts){0}); }

static void on_done(void *ud) {
  fx *f = ud;
  f->done_called++;
}

static void do_shutdown(fx *f, void *arg) {
  rpc_server_shutdown(f->s, on_done, f);
  uv_close((uv_handle_t *)&f->cmd, NULL);
}

/* Graceful shutdown from the loop thread; the loop must then run dry. */
static void stop(void) {
  on_loop(do_shutdown, NULL);
  uv_thread_join(&F.th);
  cr_assert_eq(F.done_called, 1, "shutdown done() must run exactly once");
  rpc_server_free(F.s);
  cr_assert_eq(uv_loop_close(&F.loop), 0);
  grpc_shutdown_blocking();
}

static rpc_client *client(const char *token) {
  rpc_client *c = NULL;
  char err[256];
  rpc_client_opts o = {.target = F.target, .token = token};
  cr_assert_eq(rpc_client_new(&o, &c, err, sizeof err), 0, "%s", err);
  return c;
}

static grpc_status_code getrun(rpc_client *c, const char *id, double timeout, rpc_status *st,
                               Rlorch__V1__Run **out) {
  Rlorch__V1__GetRunRequest r = RLORCH__V1__GET_RUN_REQUEST__INIT;
  r.run_id = (char *)id;
  ProtobufCMessage *resp = NULL;
  grpc_status_code code =
      rpc_client_call(c, GETRUN, &r.base, &rlorch__v1__run__descriptor, timeout, &resp, st);
  if (out)
    *out = (Rlorch__V1__Run *)resp;
  else if (resp)
    protobuf_c_message_free_unpacked(resp, NULL);
  return code;
}

/* ---- tests ------------------------------------------------------------------------ */

Test(rpc_server, unary_ok_and_handler_errors) {
  start();
  rpc_client *c = client(NULL);
  rpc_status st;
  Rlorch__V1__Run *run = NULL;
  cr_assert_eq(getrun(c, "r42", 5, &st, &run), GRPC_STATUS_OK, "%s", st.message);
  cr_assert_str_eq(run->id, "r42");
  cr_assert_eq(run->steps_done, 3);
  cr_assert_str_eq(run->message, "fake");
  protobuf_c_message_free_unpacked(&run->base, NULL);
  cr_assert_eq(getrun(c, "nope", 5, &st, NULL), GRPC_STATUS_NOT_FOUND);
  cr_assert_str_eq(st.message, "run 'nope' not found");
  cr_assert_eq(getrun(c, "precondition", 5, &st, NULL), GRPC_STATUS_FAILED_PRECONDITION);
  cr_assert(strstr(st.message, "not running"));
  rpc_client_free(c);
  stop();
  cr_assert_eq(hook_count(GETRUN, GRPC_STATUS_OK), 1);
  cr_assert_eq(hook_count(GETRUN, GRPC_STATUS_NOT_FOUND), 1);
  cr_assert_eq(hook_count(GETRUN, GRPC_STATUS_FAILED_PRECONDITION), 1);
}

Test(rpc_server, unknown_method_is_unimplemented) {
  start();
  rpc_client *c = client(NULL);
  rpc_status st;
  uint8_t *resp;
  size_t len;
  cr_assert_eq(rpc_client_call_raw(c, "/x.Y/Z", "", 0, 5, &resp, &len, &st),
               GRPC_STATUS_UNIMPLEMENTED);
  cr_assert_str_eq(st.message, "unknown method /x.Y/Z");
  cr_assert_null(resp);
  rpc_client_free(c);
  stop();
  cr_assert_eq(hook_count("/x.Y/Z", GRPC_STATUS_UNIMPLEMENTED), 1);
}

Test(rpc_server, undecodable_request_is_invalid_argument) {
  start();
  rpc_client *c = client(NULL);
  rpc_status st;
  uint8_t *resp;
  size_t len;
  static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
  cr_assert_eq(rpc_client_call_raw(c, STARTRUN, junk, sizeof junk, 5, &resp, &len, &st),
               GRPC_STATUS_INVALID_ARGUMENT);
  cr_assert_str_eq(st.message, "cannot decode rlorch.v1.RunSpec");
  rpc_client_free(c);
  stop();
  cr_assert_eq(hook_count(STARTRUN, GRPC_STATUS_INVALID_ARGUMENT), 1);
}

Test(rpc_server, oversized_message_is_resource_exhausted) {
  start_opts((rpc_server_opts){.max_message_bytes = 1024});
  rpc_client *c = client(NULL);
  rpc_status st;
  char *big = malloc(4096);
  memset(big, 'r', 4095);
  big[4095] = '\0';
  cr_assert_eq(getrun(c, big, 5, &st, NULL), GRPC_STATUS_RESOURCE_EXHAUSTED);
  cr_assert(strlen(st.message) > 0);
  big[900] = '\0'; /* under the limit: fine */
  cr_assert_eq(getrun(c, big, 5, &st, NULL), GRPC_STATUS_OK, "%s", st.message);
  free(big);
  rpc_client_free(c);
  stop();
}

Test(rpc_server, deadline_runs_on_cancel) {
  start();
  rpc_client *c = client(NULL);
  rpc_status st;
  double t0 = uv_hrtime() * 1e-9;
  cr_assert_eq(getrun(c, "hold", 0.2, &st, NULL), GRPC_STATUS_DEADLINE_EXCEEDED);
  double dt = uv_hrtime() * 1e-9 - t0;
  cr_assert(dt >= 0.15 && dt < 3, "took %.3f s", dt);
  cr_assert_eq(wait_for(&F.cancels, 1), 1, "on_cancel must run once");
  /* The server still answers. */
  cr_assert_eq(getrun(c, "r1", 5, &st, NULL), GRPC_STATUS_OK);
  rpc_client_free(c);
  stop();
  cr_assert_eq(hook_count(GETRUN, GRPC_STATUS_DEADLINE_EXCEEDED), 1);
}

static int stop_after_two(ProtobufCMessage *m, void *ud) {
  int *n = ud;
  protobuf_c_message_free_unpacked(m, NULL);
  return ++*n >= 2;
}

Test(rpc_server, client_cancellation_is_noticed) {
  start();
  rpc_client *c = client(NULL);
  rpc_status st;
  Rlorch__V1__WatchRunRequest r = RLORCH__V1__WATCH_RUN_REQUEST__INIT;
  r.run_id = "open";
  r.from_step = 3;
  int n = 0;
  grpc_status_code code = rpc_client_stream(c, WATCHRUN, &r.base, &rlorch__v1__run_event__descriptor,
                                            0, stop_after_two, &n, &st);
  cr_assert_eq(code, GRPC_STATUS_CANCELLED, "%s: %s", rpc_status_name(code), st.message);
  cr_assert_eq(n, 2);
  cr_assert_eq(wait_for(&F.cancels, 1), 1, "server must notice the cancellation");
  rpc_client_free(c);
  stop();
}

typedef struct streamer {
  rpc_client *c;
  const char *run_id;
  int64_t n;
  int got;
  uint64_t last_seq;
  int out_of_order;
  grpc_status_code code;
  rpc_status st;
} streamer;

static int collect(ProtobufCMessage *m, void *ud) {
  streamer *s = ud;
  Rlorch__V1__RunEvent *ev = (Rlorch__V1__RunEvent *)m;
  if (ev->seq != s->last_seq + 1 || ev->unix_ms != (int64_t)ev->seq * 10) s->out_of_order++;
  s->last_seq = ev->seq;
  protobuf_c_message_free_unpacked(m, NULL);
  __atomic_add_fetch(&s->got, 1, __ATOMIC_SEQ_CST);
  return 0;
}

static void stream_thread(void *arg) {
  streamer *s = arg;
  Rlorch__V1__WatchRunRequest r = RLORCH__V1__WATCH_RUN_REQUEST__INIT;
  r.run_id = (char *)s->run_id;
  r.from_step = s->n;
  s->code = rpc_client_stream(s->c, WATCHRUN, &r.base, &rlorch__v1__run_event__descriptor, 0,
                              collect, s, &s->st);
}

Test(rpc_server, stream_keeps_order_of_many_messages) {
  start();
  streamer s = {.c = client(NULL), .run_id = "done", .n = 5000};
  stream_thread(&s);
  cr_assert_eq(s.code, GRPC_STATUS_OK, "%s", s.st.message);
  cr_assert_eq(s.got, 5000);
  cr_assert_eq(s.out_of_order, 0);
  rpc_client_free(s.c);
  stop();
  cr_assert_eq(hook_count(WATCHRUN, GRPC_STATUS_OK), 1);
}

Test(rpc_server, client_cancel_streams_from_another_thread) {
  start();
  streamer s = {.c = client(NULL), .run_id = "open", .n = 1};
  uv_thread_t th;
  uv_thread_create(&th, stream_thread, &s);
  cr_assert_eq(wait_for(&s.got, 1), 1);
  rpc_client_cancel_streams(s.c);
  uv_thread_join(&th);
  cr_assert_eq(s.code, GRPC_STATUS_CANCELLED, "%s", rpc_status_name(s.code));
  cr_assert_eq(wait_for(&F.cancels, 1), 1);
  /* Later streams on this client end at once. */
  stream_thread(&s);
  cr_assert_eq(s.code, GRPC_STATUS_CANCELLED);
  rpc_client_free(s.c);
  stop();
}

Test(rpc_server, auth_missing_wrong_right) {
  start_opts((rpc_server_opts){.token = "t0ken"});
  rpc_status st;
  rpc_client *none = client(NULL), *wrong = client("t0kem"), *right = client("t0ken");
  cr_assert_eq(getrun(none, "r1", 5, &st, NULL), GRPC_STATUS_UNAUTHENTICATED);
  cr_assert_str_eq(st.message, "missing bearer token");
  cr_assert_eq(getrun(wrong, "r1", 5, &st, NULL), GRPC_STATUS_UNAUTHENTICATED);
  cr_assert_str_eq(st.message, "invalid bearer token");
  cr_assert_eq(getrun(right, "r1", 5, &st, NULL), GRPC_STATUS_OK, "%s", st.message);
  /* Health needs no token. */
  Grpc__Health__V1__HealthCheckRequest hr = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  cr_assert_eq(rpc_client_call(none, CHECK, &hr.base,
                               &grpc__health__v1__health_check_response__descriptor, 5, &resp, &st),
               GRPC_STATUS_OK, "%s", st.message);
  protobuf_c_message_free_unpacked(resp, NULL);
  rpc_client_free(none);
  rpc_client_free(wrong);
  rpc_client_free(right);
  stop();
  cr_assert_eq(hook_count(GETRUN, GRPC_STATUS_UNAUTHENTICATED), 2);
}

static grpc_status_code health_check(rpc_client *c, const char *svc, int *status, rpc_status *st) {
  Grpc__Health__V1__HealthCheckRequest hr = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  hr.service = (char *)svc;
  ProtobufCMessage *resp = NULL;
  grpc_status_code code = rpc_client_call(
      c, CHECK, &hr.base, &grpc__health__v1__health_check_response__descriptor, 5, &resp, st);
  if (resp) {
    *status = ((Grpc__Health__V1__HealthCheckResponse *)resp)->status;
    protobuf_c_message_free_unpacked(resp, NULL);
  }
  return code;
}

typedef struct set_health_arg {
  const char *svc;
  int status;
} set_health_arg;

static void do_set_health(fx *f, void *arg) {
  set_health_arg *a = arg;
  rpc_server_set_health(f->s, a->svc, a->status);
}

Test(rpc_server, health_check) {
  start();
  rpc_client *c = client(NULL);
  rpc_status st;
  int status = -1;
  cr_assert_eq(health_check(c, "", &status, &st), GRPC_STATUS_OK);
  cr_assert_eq(status, 1);
  cr_assert_eq(health_check(c, "rlorch.v1.Control", &status, &st), GRPC_STATUS_OK);
  cr_assert_eq(status, 1);
  cr_assert_eq(health_check(c, "nope.Svc", &status, &st), GRPC_STATUS_NOT_FOUND);
  cr_assert(strstr(st.message, "nope.Svc"));
  set_health_arg a = {"rlorch.v1.Control", 2};
  on_loop(do_set_health, &a);
  cr_assert_eq(health_check(c, "rlorch.v1.Control", &status, &st), GRPC_STATUS_OK);
  cr_assert_eq(status, 2);
  rpc_client_free(c);
  stop();
}

typedef struct watcher {
  rpc_client *c;
  const char *svc;
  int statuses[8];
  int n;
  int stop_at;
  grpc_status_code code;
} watcher;

static int on_health(ProtobufCMessage *m, void *ud) {
  watcher *w = ud;
  int st = ((Grpc__Health__V1__HealthCheckResponse *)m)->status;
  protobuf_c_message_free_unpacked(m, NULL);
  pthread_mutex_lock(&F.mu);
  if (w->n < 8) w->statuses[w->n] = st;
  w->n++;
  pthread_mutex_unlock(&F.mu);
  return w->n >= w->stop_at;
}

static void watch_thread(void *arg) {
  watcher *w = arg;
  Grpc__Health__V1__HealthCheckRequest hr = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  hr.service = (char *)w->svc;
  rpc_status st;
  w->code = rpc_client_stream(w->c, WATCH, &hr.base,
                              &grpc__health__v1__health_check_response__descriptor, 10, on_health,
                              w, &st);
}

Test(rpc_server, health_watch_sees_every_change) {
  start();
  watcher w = {.c = client(NULL), .svc = "svc.X", .stop_at = 3};
  uv_thread_t th;
  uv_thread_create(&th, watch_thread, &w);
  cr_assert_eq(wait_for(&w.n, 1), 1);
  set_health_arg a = {"svc.X", 1};
  on_loop(do_set_health, &a);
  cr_assert_eq(wait_for(&w.n, 2), 2);
  a.status = 1; /* no change: no message */
  on_loop(do_set_health, &a);
  a.status = 2;
  on_loop(do_set_health, &a);
  uv_thread_join(&th);
  cr_assert_eq(w.n, 3);
  cr_assert_eq(w.statuses[0], 3, "SERVICE_UNKNOWN first");
  cr_assert_eq(w.statuses[1], 1);
  cr_assert_eq(w.statuses[2], 2);
  cr_assert_eq(w.code, GRPC_STATUS_CANCELLED);
  rpc_client_free(w.c);
  stop();
}

Test(rpc_server, shutdown_ends_open_streams_with_unavailable) {
  start();
  streamer s = {.c = client(NULL), .run_id = "open", .n = 2};
  watcher w = {.c = client(NULL), .svc = "", .stop_at = 100};
  uv_thread_t th, th2;
  uv_thread_create(&th, stream_thread, &s);
  uv_thread_create(&th2, watch_thread, &w);
  cr_assert_eq(wait_for(&s.got, 2), 2);
  cr_assert_eq(wait_for(&w.n, 1), 1);
  cr_assert_eq(wait_for(&F.stream_open, 1), 1);
  double t0 = uv_hrtime() * 1e-9;
  stop(); /* asserts done() ran and the loop ran dry */
  cr_assert_lt(uv_hrtime() * 1e-9 - t0, 3.0, "streams must not wait for the grace period");
  uv_thread_join(&th);
  uv_thread_join(&th2);
  cr_assert_eq(s.code, GRPC_STATUS_UNAVAILABLE, "%s", rpc_status_name(s.code));
  cr_assert_str_eq(s.st.message, "server shutting down");
  cr_assert_eq(w.code, GRPC_STATUS_UNAVAILABLE, "%s", rpc_status_name(w.code));
  cr_assert_eq(F.cancels, 1, "the handler hears about it");
  rpc_client_free(s.c);
  rpc_client_free(w.c);
}

typedef struct holder {
  rpc_client *c;
  grpc_status_code code;
} holder;

static void hold_thread(void *arg) {
  holder *h = arg;
  rpc_status st;
  h->code = getrun(h->c, "hold", 10, &st, NULL);
}

Test(rpc_server, shutdown_cancels_unary_after_grace) {
  start_opts((rpc_server_opts){.shutdown_grace_s = 0.3});
  holder h = {.c = client(NULL)};
  uv_thread_t th;
  uv_thread_create(&th, hold_thread, &h);
  /* Give the call time to reach the handler (which holds it). */
  usleep(200000);
  double t0 = uv_hrtime() * 1e-9;
  stop();
  double dt = uv_hrtime() * 1e-9 - t0;
  uv_thread_join(&th);
  cr_assert(dt >= 0.25 && dt < 3, "grace not honoured: %.3f s", dt);
  cr_assert_eq(F.cancels, 1);
  cr_assert_neq(h.code, GRPC_STATUS_OK);
  rpc_client_free(h.c);
}

typedef struct hammer {
  rpc_client *c;
  int ok;
} hammer;

static void hammer_thread(void *arg) {
  hammer *h = arg;
  for (int i = 0; i < 50; i++) {
    rpc_status st;
    char id[32];
    snprintf(id, sizeof id, "r%d", i);
    Rlorch__V1__Run *run = NULL;
    if (getrun(h->c, id, 10, &st, &run) == GRPC_STATUS_OK && !strcmp(run->id, id)) h->ok++;
    if (run) protobuf_c_message_free_unpacked(&run->base, NULL);
  }
}

Test(rpc_server, sixteen_concurrent_clients) {
  start();
  hammer h[16];
  uv_thread_t th[16];
  rpc_client *shared = client(NULL);
  for (int i = 0; i < 16; i++) {
    h[i] = (hammer){.c = i % 2 ? shared : client(NULL)};
    uv_thread_create(&th[i], hammer_thread, &h[i]);
  }
  for (int i = 0; i < 16; i++) {
    uv_thread_join(&th[i]);
    cr_assert_eq(h[i].ok, 50, "thread %d: %d of 50", i, h[i].ok);
    if (h[i].c != shared) rpc_client_free(h[i].c);
  }
  rpc_client_free(shared);
  stop();
  cr_assert_eq(hook_count(GETRUN, GRPC_STATUS_OK), 800);
}

Test(rpc_server, survives_bad_input) {
  start_opts((rpc_server_opts){.max_message_bytes = 256});
  rpc_client *c = client(NULL);
  rpc_status st;
  uint8_t *resp;
  size_t len;
  static const uint8_t inputs[][12] = {
      {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
      {0x0a, 0x7f, 'x'},          /* string longer than the message */
      {0x08},                     /* tag without value */
      {0x12, 0x02, 0xff, 0xff},   /* nested message that is garbage */
      {0x00, 0x00, 0x00, 0x00},   /* field number 0 */
  };
  const char *methods[] = {GETRUN, STARTRUN, WATCHRUN, CHECK, WATCH, "/", "//", "/a",
                           "/rlorch.v1.Control/", "/rlorch.v1.Control/GetRun/extra"};
  for (size_t m = 0; m < sizeof methods / sizeof methods[0]; m++)
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
      grpc_status_code code =
          rpc_client_call_raw(c, methods[m], inputs[i], sizeof inputs[i], 5, &resp, &len, &st);
      cr_assert_neq(code, GRPC_STATUS_OK, "%s input %zu", methods[m], i);
      cr_assert_neq(code, GRPC_STATUS_UNAVAILABLE, "%s input %zu: server gone", methods[m], i);
      free(resp);
    }
  /* Empty bytes are a valid (empty) message: NOT_FOUND from the handler. */
  cr_assert_eq(rpc_client_call_raw(c, GETRUN, "", 0, 5, &resp, &len, &st), GRPC_STATUS_NOT_FOUND);
  uint8_t big[1024] = {0};
  cr_assert_eq(rpc_client_call_raw(c, GETRUN, big, sizeof big, 5, &resp, &len, &st),
               GRPC_STATUS_RESOURCE_EXHAUSTED);
  cr_assert_eq(getrun(c, "r1", 5, &st, NULL), GRPC_STATUS_OK, "%s", st.message);
  rpc_client_free(c);
  stop();
}

Test(rpc_server, bind_failure_names_the_address) {
  start();
  char err[256] = "";
  rpc_server *other = NULL;
  uv_loop_t loop;
  uv_loop_init(&loop);
  rpc_server_opts o = {.listen = F.target};
  cr_assert_eq(rpc_server_new(&loop, &o, NULL, 0, &other, err, sizeof err), -1);
  cr_assert_null(other);
  cr_assert(strstr(err, F.target), "%s", err);
  o.listen = "";
  cr_assert_eq(rpc_server_new(&loop, &o, NULL, 0, &other, err, sizeof err), -1);
  o = (rpc_server_opts){.listen = "127.0.0.1:0", .tls_cert_file = "/nonexistent/cert.pem",
                        .tls_key_file = "/nonexistent/key.pem"};
  cr_assert_eq(rpc_server_new(&loop, &o, NULL, 0, &other, err, sizeof err), -1);
  cr_assert(strstr(err, "/nonexistent/cert.pem"), "%s", err);
  uv_loop_close(&loop);
  stop();
}

/* TLS with a throw-away self-signed certificate (skipped without openssl). */
Test(rpc_server, tls_round_trip) {
  const char *tmp = getenv("TMPDIR");
  char dir[256];
  snprintf(dir, sizeof dir, "%s/rpc-tls-XXXXXX", tmp && *tmp ? tmp : P_tmpdir);
  cr_assert_not_null(mkdtemp(dir));
  char cmd[1024], cert[300], key[300];
  snprintf(cert, sizeof cert, "%s/cert.pem", dir);
  snprintf(key, sizeof key, "%s/key.pem", dir);
  snprintf(cmd, sizeof cmd,
           "openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=localhost -days 1 "
           "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout %s -out %s >/dev/null 2>&1",
           key, cert);
  if (system(cmd) != 0) cr_skip_test("openssl cannot make a certificate here");
  start_opts((rpc_server_opts){.tls_cert_file = cert, .tls_key_file = key});
  rpc_client *c = NULL;
  char err[256];
  rpc_client_opts o = {.target = F.target, .tls_ca_file = cert};
  cr_assert_eq(rpc_client_new(&o, &c, err, sizeof err), 0, "%s", err);
  rpc_status st;
  cr_assert_eq(getrun(c, "r1", 10, &st, NULL), GRPC_STATUS_OK, "%s", st.message);
  rpc_client_free(c);
  /* A plaintext client cannot talk to it. */
  c = client(NULL);
  cr_assert_neq(getrun(c, "r1", 2, &st, NULL), GRPC_STATUS_OK);
  rpc_client_free(c);
  o.tls_ca_file = "/nonexistent/ca.pem";
  cr_assert_eq(rpc_client_new(&o, &c, err, sizeof err), -1);
  cr_assert(strstr(err, "/nonexistent/ca.pem"), "%s", err);
  stop();
  unlink(cert);
  unlink(key);
  rmdir(dir);
}
