/* Shared fixture of the rpc unit tests (see rpc_fixture.h). */
#include "rpc_fixture.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "rpc/rpc_internal.h"

fx F;

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

/* StartRun's precheck: a spec whose encoding carries synthetic prompts
 * (RunSpec.prompts = 11, PromptSource.synthetic = 2) is refused before it is
 * decoded, naming the count and whether the method's ud came along. */
static grpc_status_code pre_startrun(const uint8_t *data, size_t len, void *ud, char *err,
                                     size_t errlen) {
  static const uint32_t path[] = {11, 2};
  uint64_t n = 0;
  if (rpc_wire_count(data, len, path, 2, &n) != 0 || n == 0) return GRPC_STATUS_OK;
  snprintf(err, errlen, "precheck: %llu synthetic sources (ud %s)", (unsigned long long)n,
           ud == &F ? "ok" : "wrong");
  return GRPC_STATUS_RESOURCE_EXHAUSTED;
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

/* Sends the pacer's next event; after the last one the stream ends OK (the
 * status follows it out). */
static void pace_send(rpc_call *c, fx_pacer *p) {
  static char big[FX_BIG_BYTES + 1];
  Rlorch__V1__RunEvent ev = RLORCH__V1__RUN_EVENT__INIT;
  Rlorch__V1__Run run = RLORCH__V1__RUN__INIT;
  ev.seq = (uint64_t)p->next;
  ev.unix_ms = p->next * 10;
  if (p->big) {
    if (!big[0]) memset(big, 'x', FX_BIG_BYTES);
    run.message = big;
    ev.event_case = RLORCH__V1__RUN_EVENT__EVENT_RUN;
    ev.run = &run;
  }
  if (rpc_call_send(c, &ev.base) < 0) { /* cancelled: on_cancel_paced ends it */
    p->over = 1;
    return;
  }
  pthread_mutex_lock(&p->f->mu);
  p->f->paced_sent++;
  pthread_mutex_unlock(&p->f->mu);
  if (p->next++ == p->last) {
    p->over = 1;
    rpc_call_finish(c, GRPC_STATUS_OK, "");
  }
}

static void on_writable_paced(rpc_call *c, void *ud) {
  fx_pacer *p = ud;
  pthread_mutex_lock(&p->f->mu);
  p->f->writable_calls++;
  if (rpc__test_unsent(c)) p->f->writable_backlog++;
  if (p->over) p->f->writable_after_end++;
  pthread_mutex_unlock(&p->f->mu);
  if (!p->over) pace_send(c, p);
}

static void on_cancel_paced(rpc_call *c, void *ud) {
  fx_pacer *p = ud;
  p->over = 1;
  if (!p->lazy) {
    on_cancel_stream(c, p->f);
    return;
  }
  p->cancelled = c;
  pthread_mutex_lock(&p->f->mu);
  p->f->cancels++;
  pthread_mutex_unlock(&p->f->mu);
}

static void do_finish_lazy(fx *f, void *arg) {
  (void)arg;
  for (int i = 0; i < f->npacers; i++)
    if (f->pacers[i].cancelled) {
      rpc_call_finish(f->pacers[i].cancelled, GRPC_STATUS_CANCELLED, "cancelled");
      f->pacers[i].cancelled = NULL;
    }
}

void fx_finish_lazy(void) { fx_on_loop(do_finish_lazy, NULL); }

/* Sends from_step events numbered 1..n; run "open" then stays open. */
static void h_watchrun(rpc_call *c, const ProtobufCMessage *req, void *ud) {
  fx *f = ud;
  const Rlorch__V1__WatchRunRequest *r = (const void *)req;
  if (!strncmp(r->run_id, "paced", 5) && r->from_step > 0 && f->npacers < FX_PACERS) {
    fx_pacer *p = &f->pacers[f->npacers++];
    *p = (fx_pacer){.f = f, .next = 1, .last = r->from_step, .big = !strcmp(r->run_id, "paced-big"),
                    .lazy = !strcmp(r->run_id, "paced-lazy")};
    rpc_call_set_cancel_cb(c, on_cancel_paced, p);
    rpc_call_set_writable_cb(c, on_writable_paced, p);
    pace_send(c, p);
    return;
  }
  for (int64_t i = 1; i <= r->from_step; i++) {
    Rlorch__V1__RunEvent ev = RLORCH__V1__RUN_EVENT__INIT;
    ev.seq = (uint64_t)i;
    ev.unix_ms = i * 10;
    if (rpc_call_send(c, &ev.base) < 0) { /* the stream is broken: stop */
      pthread_mutex_lock(&f->mu);
      f->sends_refused++;
      pthread_mutex_unlock(&f->mu);
      break;
    }
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

/* ---- ReportStream (one-way) ------------------------------------------------------- */

static void on_cancel_kept(rpc_call *c, void *ud) {
  fx *f = ud;
  pthread_mutex_lock(&f->mu);
  f->msg_cancels++;
  pthread_mutex_unlock(&f->mu);
  if (!rpc_call_cancelled(c)) f->report_api_bad++;
}

static void on_cancel_keepc(rpc_call *c, void *ud) {
  fx *f = ud;
  on_cancel_kept(c, ud);
  for (int i = 0; i < f->nkept; i++)
    if (f->kept[i] == c) {
      f->kept[i] = f->kept[--f->nkept];
      break;
    }
  rpc_call_fail(c, GRPC_STATUS_CANCELLED, "cancelled");
}

/* What a message call answers of the call API (rpc.h). */
static int msg_api_ok(rpc_call *c, fx *f) {
  Rlorch__V1__ReportResponse resp = RLORCH__V1__REPORT_RESPONSE__INIT;
  return !strcmp(rpc_call_method(c), REPORTSTREAM) && rpc_call_peer(c)[0] != '\0' &&
         isinf(rpc_call_deadline_remaining(c)) && rpc_call_server(c) == f->s &&
         !rpc_call_cancelled(c) && rpc_call_send(c, &resp.base) == -1 &&
         rpc_call_finish(c, GRPC_STATUS_OK, "") == -1;
}

static void h_report(rpc_call *c, const ProtobufCMessage *req, void *ud) {
  fx *f = ud;
  const Rlorch__V1__ReportRequest *r = (const void *)req;
  const char *id = r->worker_id;
  pthread_mutex_lock(&f->mu);
  f->reports++;
  if (!msg_api_ok(c, f)) f->report_api_bad++;
  if (id[0] == 'n') {
    int64_t k = strtoll(id + 1, NULL, 10);
    if (k != f->report_last + 1) f->report_out_of_order++;
    f->report_last = k;
    f->reports_ok++;
  }
  pthread_mutex_unlock(&f->mu);
  if (!strncmp(id, "keep", 4) && f->nkept < FX_KEPT) {
    rpc_call_set_cancel_cb(c, id[4] == 'c' ? on_cancel_keepc : on_cancel_kept, f);
    pthread_mutex_lock(&f->mu);
    f->kept[f->nkept++] = c;
    f->kept_total++;
    pthread_mutex_unlock(&f->mu);
    return;
  }
  if (id[0] == 'f') {
    cr_assert_eq(rpc_call_fail(c, GRPC_STATUS_FAILED_PRECONDITION, "refused %s", id), 0);
  } else {
    Rlorch__V1__ReportResponse resp = RLORCH__V1__REPORT_RESPONSE__INIT;
    resp.known = 1;
    cr_assert_eq(rpc_call_reply(c, &resp.base), 0);
  }
  /* Ended: a second end is refused. */
  cr_assert_eq(rpc_call_fail(c, GRPC_STATUS_INTERNAL, "twice"), -1);
}

static grpc_status_code pre_report(const uint8_t *data, size_t len, void *ud, char *err,
                                   size_t errlen) {
  (void)ud;
  size_t i = 0;
  while (i + 8 <= len && memcmp(data + i, "precheck", 8)) i++;
  if (i + 8 > len) return GRPC_STATUS_OK;
  snprintf(err, errlen, "precheck refused it");
  return GRPC_STATUS_PERMISSION_DENIED;
}

static void do_end_kept(fx *f, void *arg) {
  grpc_status_code code = *(grpc_status_code *)arg;
  Rlorch__V1__ReportResponse resp = RLORCH__V1__REPORT_RESPONSE__INIT;
  while (f->nkept > 0) {
    rpc_call *c = f->kept[--f->nkept];
    int rc = code == GRPC_STATUS_OK ? rpc_call_reply(c, &resp.base)
                                    : rpc_call_fail(c, code, "kept and failed");
    pthread_mutex_lock(&f->mu);
    if (f->nkept_end < FX_KEPT) f->kept_end_rc[f->nkept_end++] = rc;
    pthread_mutex_unlock(&f->mu);
  }
}

void fx_end_kept(grpc_status_code code) { fx_on_loop(do_end_kept, &code); }

static void fx__hook(const char *method, grpc_status_code code, double seconds, void *ud) {
  fx *f = ud;
  pthread_mutex_lock(&f->mu);
  if (f->nhooks < 16384) {
    snprintf(f->hooks[f->nhooks].method, sizeof f->hooks[0].method, "%s", method);
    f->hooks[f->nhooks].code = code;
    f->nhooks++;
  }
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  cr_assert(seconds >= 0 && seconds < 60);
}

int fx_hook_count(const char *method, grpc_status_code code) {
  int n = 0;
  pthread_mutex_lock(&F.mu);
  for (int i = 0; i < F.nhooks; i++)
    if (!strcmp(F.hooks[i].method, method) && F.hooks[i].code == code) n++;
  pthread_mutex_unlock(&F.mu);
  return n;
}

int fx_wait_for(int *v, int want) {
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

void fx_on_loop(void (*fn)(fx *, void *), void *arg) {
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

typedef struct fx__fail_arg {
  int skip, fail;
} fx__fail_arg;

static void fx__do_fail_batches(fx *f, void *arg) {
  fx__fail_arg *a = arg;
  rpc__test_fail_batches(f->s, a->skip, a->fail);
}

void fx_fail_batches(int skip, int fail) {
  fx__fail_arg a = {skip, fail};
  fx_on_loop(fx__do_fail_batches, &a);
}

static void loop_main(void *arg) {
  fx *f = arg;
  uv_run(&f->loop, UV_RUN_DEFAULT);
}

void fx_start_opts(rpc_server_opts o) {
  memset(&F, 0, sizeof F);
  pthread_mutex_init(&F.mu, NULL);
  pthread_cond_init(&F.cv, NULL);
  cr_assert_eq(uv_loop_init(&F.loop), 0);
  rpc_method ms[] = {
      {GETRUN, RPC_UNARY, &rlorch__v1__get_run_request__descriptor, &rlorch__v1__run__descriptor,
       1, h_getrun, &F},
      {STARTRUN, RPC_UNARY, &rlorch__v1__run_spec__descriptor, &rlorch__v1__run__descriptor, 1,
       h_startrun, &F, pre_startrun},
      {WATCHRUN, RPC_SERVER_STREAM, &rlorch__v1__watch_run_request__descriptor,
       &rlorch__v1__run_event__descriptor, 1, h_watchrun, &F},
      {REPORTSTREAM, RPC_ONEWAY_STREAM, &rlorch__v1__report_request__descriptor,
       &rlorch__v1__report_response__descriptor, 1, h_report, &F, pre_report},
  };
  if (!o.listen) o.listen = "127.0.0.1:0";
  o.on_call_done = fx__hook;
  o.hook_ud = &F;
  char err[256] = "";
  cr_assert_eq(rpc_server_new(&F.loop, &o, ms, 4, &F.s, err, sizeof err), 0, "%s", err);
  cr_assert_gt(rpc_server_port(F.s), 0);
  snprintf(F.target, sizeof F.target, "127.0.0.1:%d", rpc_server_port(F.s));
  uv_async_init(&F.loop, &F.cmd, on_cmd);
  F.cmd.data = &F;
  cr_assert_eq(uv_thread_create(&F.th, loop_main, &F), 0);
}

void fx_start(void) { fx_start_opts((rpc_server_opts){0}); }

static void on_done(void *ud) {
  fx *f = ud;
  f->done_called++;
}

static void do_shutdown(fx *f, void *arg) {
  rpc_server_shutdown(f->s, on_done, f);
  uv_close((uv_handle_t *)&f->cmd, NULL);
}

void fx_stop(void) {
  fx_on_loop(do_shutdown, NULL);
  uv_thread_join(&F.th);
  cr_assert_eq(F.done_called, 1, "shutdown done() must run exactly once");
  rpc_server_free(F.s);
  cr_assert_eq(uv_loop_close(&F.loop), 0);
  grpc_shutdown_blocking();
}

rpc_client *fx_client(const char *token) {
  rpc_client *c = NULL;
  char err[256];
  rpc_client_opts o = {.target = F.target, .token = token};
  cr_assert_eq(rpc_client_new(&o, &c, err, sizeof err), 0, "%s", err);
  return c;
}

grpc_status_code fx_getrun(rpc_client *c, const char *id, double timeout, rpc_status *st,
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

/* ---- shared stream readers ---------------------------------------------------------- */

static int fx__collect(ProtobufCMessage *m, void *ud) {
  fx_streamer *s = ud;
  Rlorch__V1__RunEvent *ev = (Rlorch__V1__RunEvent *)m;
  if (ev->seq != s->last_seq + 1 || ev->unix_ms != (int64_t)ev->seq * 10) s->out_of_order++;
  s->last_seq = ev->seq;
  protobuf_c_message_free_unpacked(m, NULL);
  __atomic_add_fetch(&s->got, 1, __ATOMIC_SEQ_CST);
  return 0;
}

void fx_stream_thread(void *arg) {
  fx_streamer *s = arg;
  Rlorch__V1__WatchRunRequest r = RLORCH__V1__WATCH_RUN_REQUEST__INIT;
  r.run_id = (char *)s->run_id;
  r.from_step = s->n;
  s->code = rpc_client_stream(s->c, WATCHRUN, &r.base, &rlorch__v1__run_event__descriptor, 0,
                              fx__collect, s, &s->st);
}

grpc_status_code fx_health_check(rpc_client *c, const char *svc, int *status, rpc_status *st) {
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

void fx_do_set_health(fx *f, void *arg) {
  fx_health_arg *a = arg;
  rpc_server_set_health(f->s, a->svc, a->status);
}

static int fx__on_health(ProtobufCMessage *m, void *ud) {
  fx_watcher *w = ud;
  int st = ((Grpc__Health__V1__HealthCheckResponse *)m)->status;
  protobuf_c_message_free_unpacked(m, NULL);
  pthread_mutex_lock(&F.mu);
  if (w->n < 8) w->statuses[w->n] = st;
  w->n++;
  pthread_mutex_unlock(&F.mu);
  return w->n >= w->stop_at;
}

void fx_watch_thread(void *arg) {
  fx_watcher *w = arg;
  Grpc__Health__V1__HealthCheckRequest hr = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  hr.service = (char *)w->svc;
  rpc_status st;
  w->code = rpc_client_stream(w->c, WATCH, &hr.base,
                              &grpc__health__v1__health_check_response__descriptor, 10, fx__on_health,
                              w, &st);
}
