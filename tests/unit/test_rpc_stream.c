/* rpc server and client over loopback (rpc_fixture.h). Server streams: order
 * of many messages, cancellation by the client. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rpc_fixture.h"

static int stop_after_two(ProtobufCMessage *m, void *ud) {
  int *n = ud;
  protobuf_c_message_free_unpacked(m, NULL);
  return ++*n >= 2;
}

Test(rpc_stream, client_cancellation_is_noticed) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  rpc_status st;
  Rlorch__V1__WatchRunRequest r = RLORCH__V1__WATCH_RUN_REQUEST__INIT;
  r.run_id = "open";
  r.from_step = 3;
  int n = 0;
  grpc_status_code code = rpc_client_stream(c, WATCHRUN, &r.base, &rlorch__v1__run_event__descriptor,
                                            0, stop_after_two, &n, &st);
  cr_assert_eq(code, GRPC_STATUS_CANCELLED, "%s: %s", rpc_status_name(code), st.message);
  cr_assert_eq(n, 2);
  cr_assert_eq(fx_wait_for(&F.cancels, 1), 1, "server must notice the cancellation");
  rpc_client_free(c);
  fx_stop();
}

Test(rpc_stream, stream_keeps_order_of_many_messages) {
  fx_start();
  fx_streamer s = {.c = fx_client(NULL), .run_id = "done", .n = 5000};
  fx_stream_thread(&s);
  cr_assert_eq(s.code, GRPC_STATUS_OK, "%s", s.st.message);
  cr_assert_eq(s.got, 5000);
  cr_assert_eq(s.out_of_order, 0);
  rpc_client_free(s.c);
  fx_stop();
  cr_assert_eq(fx_hook_count(WATCHRUN, GRPC_STATUS_OK), 1);
}

Test(rpc_stream, client_cancel_streams_from_another_thread) {
  fx_start();
  fx_streamer s = {.c = fx_client(NULL), .run_id = "open", .n = 1};
  uv_thread_t th;
  uv_thread_create(&th, fx_stream_thread, &s);
  cr_assert_eq(fx_wait_for(&s.got, 1), 1);
  rpc_client_cancel_streams(s.c);
  uv_thread_join(&th);
  cr_assert_eq(s.code, GRPC_STATUS_CANCELLED, "%s", rpc_status_name(s.code));
  cr_assert_eq(fx_wait_for(&F.cancels, 1), 1);
  /* Later streams on this client end at once. */
  fx_stream_thread(&s);
  cr_assert_eq(s.code, GRPC_STATUS_CANCELLED);
  rpc_client_free(s.c);
  fx_stop();
}

Test(rpc_stream, interrupt_ends_open_streams_and_leaves_later_ones_alone) {
  fx_start();
  fx_streamer s = {.c = fx_client(NULL), .run_id = "open", .n = 1};
  uv_thread_t th;
  uv_thread_create(&th, fx_stream_thread, &s);
  cr_assert_eq(fx_wait_for(&s.got, 1), 1);
  rpc_client_interrupt_streams(s.c);
  uv_thread_join(&th);
  cr_assert_eq(s.code, GRPC_STATUS_CANCELLED, "%s", rpc_status_name(s.code));
  /* A stream opened afterwards runs to its end. */
  fx_streamer t = {.c = s.c, .run_id = "done", .n = 10};
  fx_stream_thread(&t);
  cr_assert_eq(t.code, GRPC_STATUS_OK, "%s: %s", rpc_status_name(t.code), t.st.message);
  cr_assert_eq(t.got, 10);
  rpc_client_free(s.c);
  fx_stop();
}

/* ---- paced streams: the writable callback --------------------------------------- */

Test(rpc_stream, paced_stream_sends_the_next_message_once_the_last_went_out) {
  fx_start();
  fx_streamer s = {.c = fx_client(NULL), .run_id = "paced", .n = 3000};
  fx_stream_thread(&s);
  cr_assert_eq(s.code, GRPC_STATUS_OK, "%s: %s", rpc_status_name(s.code), s.st.message);
  cr_assert_eq(s.got, 3000);
  cr_assert_eq(s.out_of_order, 0);
  /* One callback after each message but the last, whose send finished the
   * stream; never one while a message was still unsent. */
  cr_assert_eq(F.writable_calls, 2999);
  cr_assert_eq(F.writable_backlog, 0);
  cr_assert_eq(F.writable_after_end, 0);
  rpc_client_free(s.c);
  fx_stop();
  cr_assert_eq(fx_hook_count(WATCHRUN, GRPC_STATUS_OK), 1);
}

typedef struct slow_reader {
  int got;
  int sent_while_stalled; /* what the server had sent when the reader woke */
} slow_reader;

/* Stalls on the first message, as a trainer busy elsewhere would. */
static int read_slowly(ProtobufCMessage *m, void *ud) {
  slow_reader *r = ud;
  protobuf_c_message_free_unpacked(m, NULL);
  if (r->got++ == 0) {
    usleep(800000);
    pthread_mutex_lock(&F.mu);
    r->sent_while_stalled = F.paced_sent;
    pthread_mutex_unlock(&F.mu);
  }
  return 0;
}

Test(rpc_stream, paced_stream_waits_for_a_slow_client) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  Rlorch__V1__WatchRunRequest r = RLORCH__V1__WATCH_RUN_REQUEST__INIT;
  r.run_id = "paced-big";
  r.from_step = 1000; /* 64 MiB in all, far beyond what HTTP/2 flow control lets out */
  slow_reader rd = {0};
  rpc_status st;
  grpc_status_code code = rpc_client_stream(c, WATCHRUN, &r.base, &rlorch__v1__run_event__descriptor,
                                            30, read_slowly, &rd, &st);
  cr_assert_eq(code, GRPC_STATUS_OK, "%s: %s", rpc_status_name(code), st.message);
  cr_assert_eq(rd.got, 1000);
  /* While the client read nothing the server encoded only what the transport
   * took, not the whole stream. */
  cr_assert_lt(rd.sent_while_stalled, 500, "%d of 1000 sent to a stalled client",
               rd.sent_while_stalled);
  cr_assert_gt(rd.sent_while_stalled, 0);
  cr_assert_eq(F.writable_backlog, 0);
  rpc_client_free(c);
  fx_stop();
}

Test(rpc_stream, no_writable_callback_after_the_client_cancels) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  Rlorch__V1__WatchRunRequest r = RLORCH__V1__WATCH_RUN_REQUEST__INIT;
  /* Its handler ends the cancelled stream only later: the send in flight
   * completes meanwhile, and must not ask it for more. */
  r.run_id = "paced-lazy";
  r.from_step = 100000000; /* never ends by itself */
  int n = 0;
  rpc_status st;
  grpc_status_code code = rpc_client_stream(c, WATCHRUN, &r.base, &rlorch__v1__run_event__descriptor,
                                            0, stop_after_two, &n, &st);
  cr_assert_eq(code, GRPC_STATUS_CANCELLED, "%s: %s", rpc_status_name(code), st.message);
  cr_assert_eq(fx_wait_for(&F.cancels, 1), 1, "the server notices the cancellation");
  pthread_mutex_lock(&F.mu);
  int sent = F.paced_sent;
  pthread_mutex_unlock(&F.mu);
  usleep(200000);
  pthread_mutex_lock(&F.mu);
  cr_assert_eq(F.paced_sent, sent, "nothing is sent after the cancel");
  cr_assert_eq(F.writable_after_end, 0, "the callback never runs after the cancel");
  pthread_mutex_unlock(&F.mu);
  fx_finish_lazy();
  rpc_client_free(c);
  fx_stop();
  cr_assert_eq(fx_hook_count(WATCHRUN, GRPC_STATUS_CANCELLED), 1);
}

Test(rpc_stream, shutdown_ends_a_paced_stream_without_calling_it_again) {
  fx_start();
  fx_streamer s = {.c = fx_client(NULL), .run_id = "paced-big", .n = 100000};
  uv_thread_t th;
  uv_thread_create(&th, fx_stream_thread, &s);
  cr_assert_geq(fx_wait_for(&s.got, 3), 3);
  fx_stop();
  uv_thread_join(&th);
  cr_assert_eq(s.code, GRPC_STATUS_UNAVAILABLE, "%s: %s", rpc_status_name(s.code), s.st.message);
  cr_assert_eq(F.cancels, 1, "the handler hears about it");
  cr_assert_eq(F.writable_after_end, 0);
  rpc_client_free(s.c);
}

static double mono_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* rpc_client_wait_ready: 1 at once for a live server; 0 after its timeout
 * when nothing listens (the caller then retries). */
Test(rpc_stream, wait_ready_says_whether_the_server_can_be_reached) {
  fx_start();
  char target[64];
  snprintf(target, sizeof target, "%s", F.target);
  rpc_client *c = fx_client(NULL);
  double t0 = mono_s();
  cr_assert_eq(rpc_client_wait_ready(c, 5.0), 1);
  cr_assert_lt(mono_s() - t0, 2.0, "a live server is reached without waiting out the timeout");
  rpc_client_free(c);
  fx_stop();
  rpc_client *dead = NULL;
  char err[256];
  rpc_client_opts o = {.target = target};
  cr_assert_eq(rpc_client_new(&o, &dead, err, sizeof err), 0, "%s", err);
  t0 = mono_s();
  cr_assert_eq(rpc_client_wait_ready(dead, 0.5), 0);
  double took = mono_s() - t0;
  cr_assert(took >= 0.4 && took < 3.0, "it waits its timeout, no more: %.3f s", took);
  rpc_client_free(dead);
}
