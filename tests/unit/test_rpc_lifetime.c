/* rpc server and client over loopback (rpc_fixture.h). Server lifetime:
 * start-up failures, graceful shutdown of open streams and unary calls. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rpc_fixture.h"

Test(rpc_lifetime, bind_failure_names_the_address) {
  fx_start();
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
  fx_stop();
}

static void shutdown_ends_streams(int queues) {
  fx_start_opts((rpc_server_opts){.completion_queues = queues});
  fx_streamer s = {.c = fx_client(NULL), .run_id = "open", .n = 2};
  fx_watcher w = {.c = fx_client(NULL), .svc = "", .stop_at = 100};
  uv_thread_t th, th2;
  uv_thread_create(&th, fx_stream_thread, &s);
  uv_thread_create(&th2, fx_watch_thread, &w);
  cr_assert_eq(fx_wait_for(&s.got, 2), 2);
  cr_assert_eq(fx_wait_for(&w.n, 1), 1);
  cr_assert_eq(fx_wait_for(&F.stream_open, 1), 1);
  double t0 = uv_hrtime() * 1e-9;
  fx_stop(); /* asserts done() ran and the loop ran dry */
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

Test(rpc_lifetime, shutdown_ends_open_streams_with_unavailable) { shutdown_ends_streams(0); }

/* More queues than calls, and more than the bound (8 are used): every
 * queue's thread is joined at shutdown. */
Test(rpc_lifetime, shutdown_ends_open_streams_over_several_queues) {
  shutdown_ends_streams(3);
  shutdown_ends_streams(64);
}

typedef struct holder {
  rpc_client *c;
  grpc_status_code code;
} holder;

static void hold_thread(void *arg) {
  holder *h = arg;
  rpc_status st;
  h->code = fx_getrun(h->c, "hold", 10, &st, NULL);
}

Test(rpc_lifetime, shutdown_cancels_unary_after_grace) {
  fx_start_opts((rpc_server_opts){.shutdown_grace_s = 0.3});
  holder h = {.c = fx_client(NULL)};
  uv_thread_t th;
  uv_thread_create(&th, hold_thread, &h);
  /* Give the call time to reach the handler (which holds it). */
  usleep(200000);
  double t0 = uv_hrtime() * 1e-9;
  fx_stop();
  double dt = uv_hrtime() * 1e-9 - t0;
  uv_thread_join(&th);
  cr_assert(dt >= 0.25 && dt < 3, "grace not honoured: %.3f s", dt);
  cr_assert_eq(F.cancels, 1);
  cr_assert_neq(h.code, GRPC_STATUS_OK);
  rpc_client_free(h.c);
}
