/* rpc server and client over loopback (rpc_fixture.h). One-way streams
 * (RPC_ONEWAY_STREAM, rpc_oneway): order, failures answered and successes
 * not, refused messages, an older server, auth, the stream's end from either
 * side, callbacks that send, message calls ended late, refused batches. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rpc/rpc_internal.h"
#include "rpc_fixture.h"

/* What the client's callbacks saw; counters are read with fx_wait_for
 * (under F.mu). */
typedef struct ow {
  rpc_oneway *p;
  int failed;      /* on_failed calls */
  int failed_bad;  /* of them, not "refused f<seq>" FAILED_PRECONDITION */
  uint64_t last_failed_seq;
  rpc_status last_failed;
  int broken;      /* on_broken calls */
  rpc_status last_broken;
  int send_in_failed, send_in_broken; /* callbacks send once when set */
  int cb_sent;     /* sends from callbacks that returned a sequence */
  int cb_refused;  /* sends from callbacks that returned 0 */
  int expect_refused; /* on_failed checks nothing of the failure */
} ow;

static uint64_t send_id(rpc_oneway *p, const char *id, double timeout, rpc_status *st) {
  Rlorch__V1__ReportRequest r = RLORCH__V1__REPORT_REQUEST__INIT;
  r.worker_id = (char *)id;
  return rpc_oneway_send(p, &r.base, timeout, st);
}

static void cb_send(ow *w) {
  rpc_status st;
  uint64_t seq = send_id(w->p, "n1000000", 5, &st);
  pthread_mutex_lock(&F.mu);
  if (seq)
    w->cb_sent++;
  else
    w->cb_refused++;
  pthread_mutex_unlock(&F.mu);
}

static void on_failed(uint64_t seq, const rpc_status *st, void *ud) {
  ow *w = ud;
  char want[64];
  snprintf(want, sizeof want, "refused f%llu", (unsigned long long)seq);
  pthread_mutex_lock(&F.mu);
  w->failed++;
  if (!w->expect_refused && (st->code != GRPC_STATUS_FAILED_PRECONDITION || strcmp(st->message, want)))
    w->failed_bad++;
  w->last_failed_seq = seq;
  w->last_failed = *st;
  int send = w->send_in_failed;
  w->send_in_failed = 0;
  pthread_mutex_unlock(&F.mu);
  if (send) cb_send(w);
}

static void on_broken(const rpc_status *st, void *ud) {
  ow *w = ud;
  pthread_mutex_lock(&F.mu);
  w->broken++;
  w->last_broken = *st;
  int send = w->send_in_broken;
  w->send_in_broken = 0;
  pthread_mutex_unlock(&F.mu);
  if (send) cb_send(w);
}

static void ow_open(ow *w, rpc_client *c, const char *method) {
  memset(w, 0, sizeof *w);
  rpc_oneway_opts o = {.method = method, .on_failed = on_failed, .on_broken = on_broken, .ud = w};
  char err[256];
  cr_assert_eq(rpc_oneway_new(c, &o, &w->p, err, sizeof err), 0, "%s", err);
}


/* ---- the common path ------------------------------------------------------------ */

static void many_in_order(int queues);
Test(rpc_oneway, many_messages_arrive_in_order_and_successes_are_not_answered) {
  many_in_order(0);
}

/* A stream's completions all come from its own queue: order holds. */
Test(rpc_oneway, many_messages_arrive_in_order_over_four_queues) { many_in_order(4); }

static void many_in_order(int queues) {
  fx_start_opts((rpc_server_opts){.completion_queues = queues});
  rpc_client *c = fx_client(NULL);
  ow w;
  ow_open(&w, c, REPORTSTREAM);
  rpc_status st;
  for (int i = 1; i <= 5000; i++) {
    char id[32];
    snprintf(id, sizeof id, "n%d", i);
    uint64_t seq = send_id(w.p, id, 5, &st);
    cr_assert_eq(seq, (uint64_t)i, "send %d: seq %llu, %s: %s", i, (unsigned long long)seq,
                 rpc_status_name(st.code), st.message);
  }
  rpc_oneway_free(w.p, 5);
  cr_assert_eq(F.reports_ok, 5000);
  cr_assert_eq(F.report_out_of_order, 0);
  cr_assert_eq(F.report_api_bad, 0);
  cr_assert_eq(w.failed, 0, "a success is not answered");
  cr_assert_eq(w.broken, 0, "the stream ended by rpc_oneway_free is not broken");
  /* Every message call is counted, and the stream, ended OK by the
   * half-close once every message call ended. */
  cr_assert_eq(fx_wait_for(&F.nhooks, 5001), 5001);
  cr_assert_eq(fx_hook_count(REPORTSTREAM, GRPC_STATUS_OK), 5001);
  rpc_client_free(c);
  fx_stop();
}

Test(rpc_oneway, failures_come_back_with_their_sequence_and_status) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  ow w;
  ow_open(&w, c, REPORTSTREAM);
  rpc_status st;
  int n = 0;
  for (int i = 1; i <= 1000; i++) {
    char id[32];
    if (i % 10 == 0)
      snprintf(id, sizeof id, "f%d", i);
    else
      snprintf(id, sizeof id, "n%d", ++n);
    cr_assert_eq(send_id(w.p, id, 5, &st), (uint64_t)i, "%s", st.message);
  }
  cr_assert_eq(fx_wait_for(&w.failed, 100), 100);
  cr_assert_eq(w.failed_bad, 0, "last: seq %llu %s %s", (unsigned long long)w.last_failed_seq,
               rpc_status_name(w.last_failed.code), w.last_failed.message);
  cr_assert_eq(w.last_failed_seq, 1000, "answers go out in the order the calls end");
  rpc_oneway_free(w.p, 5);
  cr_assert_eq(w.failed, 100);
  cr_assert_eq(F.report_out_of_order, 0);
  cr_assert_eq(fx_wait_for(&F.nhooks, 1001), 1001);
  cr_assert_eq(fx_hook_count(REPORTSTREAM, GRPC_STATUS_FAILED_PRECONDITION), 100);
  cr_assert_eq(fx_hook_count(REPORTSTREAM, GRPC_STATUS_OK), 901);
  rpc_client_free(c);
  fx_stop();
}

Test(rpc_oneway, refused_messages_are_answered_and_the_stream_goes_on) {
  fx_start_opts((rpc_server_opts){.max_message_bytes = 1024});
  rpc_client *c = fx_client(NULL);
  ow w;
  ow_open(&w, c, REPORTSTREAM);
  w.expect_refused = 1;
  rpc_status st;
  /* RunEvent's field 1 is a varint, ReportRequest's a string: no decode. */
  Rlorch__V1__RunEvent ev = RLORCH__V1__RUN_EVENT__INIT;
  ev.seq = 7;
  cr_assert_eq(rpc_oneway_send(w.p, &ev.base, 5, &st), 1, "%s", st.message);
  cr_assert_eq(fx_wait_for(&w.failed, 1), 1);
  cr_assert_eq(w.last_failed_seq, 1);
  cr_assert_eq(w.last_failed.code, GRPC_STATUS_INVALID_ARGUMENT);
  cr_assert_str_eq(w.last_failed.message, "cannot decode rlorch.v1.ReportRequest");

  char big[2048];
  memset(big, 'n', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  cr_assert_eq(send_id(w.p, big, 5, &st), 2, "%s", st.message);
  cr_assert_eq(fx_wait_for(&w.failed, 2), 2);
  cr_assert_eq(w.last_failed_seq, 2);
  cr_assert_eq(w.last_failed.code, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s", w.last_failed.message);

  cr_assert_eq(send_id(w.p, "precheck", 5, &st), 3, "%s", st.message);
  cr_assert_eq(fx_wait_for(&w.failed, 3), 3);
  cr_assert_eq(w.last_failed_seq, 3);
  cr_assert_eq(w.last_failed.code, GRPC_STATUS_PERMISSION_DENIED);
  cr_assert_str_eq(w.last_failed.message, "precheck refused it");

  cr_assert_eq(send_id(w.p, "n1", 5, &st), 4, "%s", st.message);
  cr_assert_eq(fx_wait_for(&F.reports_ok, 1), 1, "a later message still gets through");
  rpc_oneway_free(w.p, 5);
  cr_assert_eq(F.reports, 1, "refused messages never reach the handler");
  cr_assert_eq(w.failed, 3);
  cr_assert_eq(w.broken, 0);
  cr_assert_eq(fx_wait_for(&F.nhooks, 5), 5);
  cr_assert_eq(fx_hook_count(REPORTSTREAM, GRPC_STATUS_INVALID_ARGUMENT), 1);
  cr_assert_eq(fx_hook_count(REPORTSTREAM, GRPC_STATUS_RESOURCE_EXHAUSTED), 1);
  cr_assert_eq(fx_hook_count(REPORTSTREAM, GRPC_STATUS_PERMISSION_DENIED), 1);
  rpc_client_free(c);
  fx_stop();
}

/* ---- opening -------------------------------------------------------------------- */

Test(rpc_oneway, a_server_without_the_method_answers_unimplemented_and_nothing_is_sent) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  ow w;
  ow_open(&w, c, "/rlorch.v1.Worker/NoSuchStream");
  rpc_status st;
  for (int i = 0; i < 2; i++) { /* asking again asks the server again */
    cr_assert_eq(send_id(w.p, "n1", 5, &st), 0);
    cr_assert_eq(st.code, GRPC_STATUS_UNIMPLEMENTED, "%s: %s", rpc_status_name(st.code), st.message);
  }
  rpc_oneway_free(w.p, 5);
  cr_assert_eq(w.broken, 0, "the send reported it");
  cr_assert_eq(F.reports, 0);
  cr_assert_eq(fx_wait_for(&F.nhooks, 2), 2);
  cr_assert_eq(fx_hook_count("/rlorch.v1.Worker/NoSuchStream", GRPC_STATUS_UNIMPLEMENTED), 2);
  rpc_client_free(c);
  fx_stop();
}

Test(rpc_oneway, auth_is_checked_when_the_stream_opens) {
  fx_start_opts((rpc_server_opts){.token = "t0ken"});
  const char *bad[] = {NULL, "wrong"};
  rpc_status st;
  for (int i = 0; i < 2; i++) {
    rpc_client *c = fx_client(bad[i]);
    ow w;
    ow_open(&w, c, REPORTSTREAM);
    cr_assert_eq(send_id(w.p, "n1", 5, &st), 0);
    cr_assert_eq(st.code, GRPC_STATUS_UNAUTHENTICATED, "%s: %s", rpc_status_name(st.code), st.message);
    rpc_oneway_free(w.p, 5);
    rpc_client_free(c);
  }
  cr_assert_eq(F.reports, 0);
  rpc_client *c = fx_client("t0ken");
  ow w;
  ow_open(&w, c, REPORTSTREAM);
  cr_assert_eq(send_id(w.p, "n1", 5, &st), 1, "%s", st.message);
  rpc_oneway_free(w.p, 5);
  cr_assert_eq(F.reports_ok, 1);
  rpc_client_free(c);
  fx_stop();
  cr_assert_eq(fx_hook_count(REPORTSTREAM, GRPC_STATUS_UNAUTHENTICATED), 2);
}

/* ---- the stream's end ---------------------------------------------------------- */

Test(rpc_oneway, server_shutdown_breaks_the_stream_and_the_next_send_opens_a_new_one) {
  fx_start();
  char target[64];
  snprintf(target, sizeof target, "%s", F.target);
  rpc_client *c = fx_client(NULL);
  ow w;
  ow_open(&w, c, REPORTSTREAM);
  rpc_status st;
  cr_assert_eq(send_id(w.p, "n1", 5, &st), 1, "%s", st.message);
  cr_assert_eq(send_id(w.p, "keep", 5, &st), 2, "%s", st.message);
  cr_assert_eq(fx_wait_for(&F.kept_total, 1), 1);
  fx_stop();
  cr_assert_eq(F.msg_cancels, 1, "a message call still open is cancelled at shutdown");
  cr_assert_eq(fx_hook_count(REPORTSTREAM, GRPC_STATUS_UNAVAILABLE), 2,
               "the kept message call and the stream");
  cr_assert_eq(fx_wait_for(&w.broken, 1), 1);
  cr_assert_eq(w.last_broken.code, GRPC_STATUS_UNAVAILABLE, "%s: %s",
               rpc_status_name(w.last_broken.code), w.last_broken.message);
  /* No server: the send fails, cleanly. */
  cr_assert_eq(send_id(w.p, "n2", 0.5, &st), 0);
  cr_assert(st.code == GRPC_STATUS_UNAVAILABLE || st.code == GRPC_STATUS_DEADLINE_EXCEEDED, "%s",
            rpc_status_name(st.code));
  /* A new server on the same address: a new stream, numbered from 1. */
  fx_start_opts((rpc_server_opts){.listen = target});
  cr_assert_eq(rpc_client_wait_ready(c, 5), 1);
  uint64_t seq = 0;
  for (int i = 0; i < 50 && !seq; i++) /* the failed stream may still be ending */
    if (!(seq = send_id(w.p, "n1", 5, &st))) usleep(20000);
  cr_assert_eq(seq, 1, "%s: %s", rpc_status_name(st.code), st.message);
  rpc_oneway_free(w.p, 5);
  cr_assert_eq(F.reports_ok, 1);
  rpc_client_free(c);
  fx_stop();
}

Test(rpc_oneway, cancel_streams_ends_the_stream_and_later_sends_fail_cancelled) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  ow w;
  ow_open(&w, c, REPORTSTREAM);
  rpc_status st;
  cr_assert_eq(send_id(w.p, "n1", 5, &st), 1, "%s", st.message);
  rpc_client_cancel_streams(c);
  cr_assert_eq(fx_wait_for(&w.broken, 1), 1);
  cr_assert_eq(w.last_broken.code, GRPC_STATUS_CANCELLED, "%s", rpc_status_name(w.last_broken.code));
  cr_assert_eq(send_id(w.p, "n2", 5, &st), 0);
  cr_assert_eq(st.code, GRPC_STATUS_CANCELLED, "%s: %s", rpc_status_name(st.code), st.message);
  rpc_oneway_free(w.p, 5);
  rpc_client_free(c);
  fx_stop();
}

Test(rpc_oneway, interrupt_streams_ends_the_stream_and_the_next_send_opens_a_new_one) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  ow w;
  ow_open(&w, c, REPORTSTREAM);
  rpc_status st;
  cr_assert_eq(send_id(w.p, "n1", 5, &st), 1, "%s", st.message);
  rpc_client_interrupt_streams(c);
  cr_assert_eq(fx_wait_for(&w.broken, 1), 1);
  cr_assert_eq(w.last_broken.code, GRPC_STATUS_CANCELLED);
  cr_assert_eq(send_id(w.p, "n2", 5, &st), 1, "%s: %s", rpc_status_name(st.code), st.message);
  rpc_oneway_free(w.p, 5);
  cr_assert_eq(F.reports_ok, 2);
  cr_assert_eq(F.report_out_of_order, 0);
  rpc_client_free(c);
  fx_stop();
}

Test(rpc_oneway, callbacks_may_send) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  ow w;
  ow_open(&w, c, REPORTSTREAM);
  w.send_in_failed = 1;
  w.send_in_broken = 1;
  rpc_status st;
  cr_assert_eq(send_id(w.p, "f1", 5, &st), 1, "%s", st.message);
  cr_assert_eq(fx_wait_for(&w.cb_sent, 1), 1, "a send from on_failed goes out on the stream");
  /* Another thread sends meanwhile: no lock order between the two. */
  for (int i = 0; i < 100; i++) cr_assert_gt(send_id(w.p, "n1", 5, &st), 0, "%s", st.message);
  cr_assert_eq(fx_wait_for(&F.reports, 102), 102); /* taken is not yet read */
  /* on_broken sends on a new stream, opened from the old one's reader. */
  rpc_client_interrupt_streams(c);
  cr_assert_eq(fx_wait_for(&w.broken, 1), 1);
  cr_assert_eq(fx_wait_for(&w.cb_sent, 2), 2, "refused %d", w.cb_refused);
  cr_assert_eq(send_id(w.p, "n1", 5, &st), 2, "the stream on_broken opened: %s", st.message);
  rpc_oneway_free(w.p, 5);
  cr_assert_eq(w.cb_refused, 0);
  cr_assert_eq(F.reports, 1 + 1 + 100 + 1 + 1);
  rpc_client_free(c);
  fx_stop();
}

Test(rpc_oneway, free_waits_for_the_answers_to_what_was_sent) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  ow w;
  ow_open(&w, c, REPORTSTREAM);
  rpc_status st;
  for (int i = 1; i <= 200; i++) {
    char id[32];
    snprintf(id, sizeof id, "f%d", i);
    cr_assert_eq(send_id(w.p, id, 5, &st), (uint64_t)i, "%s", st.message);
  }
  rpc_oneway_free(w.p, 5);
  cr_assert_eq(w.failed, 200, "every failure answered before free returned");
  cr_assert_eq(w.failed_bad, 0);
  cr_assert_eq(w.broken, 0);
  rpc_client_free(c);
  fx_stop();
  cr_assert_eq(fx_hook_count(REPORTSTREAM, GRPC_STATUS_OK), 1, "the stream");
}

/* ---- message calls ended later ----------------------------------------------------- */

Test(rpc_oneway, reading_pauses_while_too_many_message_calls_are_open) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  ow w;
  ow_open(&w, c, REPORTSTREAM);
  rpc_status st;
  for (int i = 1; i <= RPC_ONEWAY_PENDING + 6; i++)
    cr_assert_eq(send_id(w.p, "keep", 5, &st), (uint64_t)i, "%s", st.message);
  cr_assert_eq(fx_wait_for(&F.kept_total, RPC_ONEWAY_PENDING), RPC_ONEWAY_PENDING);
  usleep(200000);
  cr_assert_eq(F.kept_total, RPC_ONEWAY_PENDING, "no message read while %d are open",
               RPC_ONEWAY_PENDING);
  /* Ended later from the loop, failing: answered, and reading goes on. */
  fx_end_kept(GRPC_STATUS_ABORTED);
  cr_assert_eq(fx_wait_for(&F.kept_total, RPC_ONEWAY_PENDING + 6), RPC_ONEWAY_PENDING + 6);
  fx_end_kept(GRPC_STATUS_OK);
  cr_assert_eq(fx_wait_for(&w.failed, RPC_ONEWAY_PENDING), RPC_ONEWAY_PENDING);
  cr_assert_eq(w.last_failed.code, GRPC_STATUS_ABORTED);
  cr_assert_str_eq(w.last_failed.message, "kept and failed");
  rpc_oneway_free(w.p, 5);
  cr_assert_eq(w.failed, RPC_ONEWAY_PENDING, "the ones ended OK are not answered");
  for (int i = 0; i < F.nkept_end; i++) cr_assert_eq(F.kept_end_rc[i], 0);
  cr_assert_eq(F.nkept_end, RPC_ONEWAY_PENDING + 6);
  cr_assert_eq(F.msg_cancels, 0);
  rpc_client_free(c);
  fx_stop();
  cr_assert_eq(fx_hook_count(REPORTSTREAM, GRPC_STATUS_ABORTED), RPC_ONEWAY_PENDING);
  cr_assert_eq(fx_hook_count(REPORTSTREAM, GRPC_STATUS_OK), 6 + 1);
}

Test(rpc_oneway, a_message_call_ended_after_its_stream_was_cancelled_is_harmless) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  ow w;
  ow_open(&w, c, REPORTSTREAM);
  rpc_status st;
  cr_assert_eq(send_id(w.p, "keep", 5, &st), 1, "%s", st.message);
  cr_assert_eq(send_id(w.p, "keepc", 5, &st), 2, "%s", st.message);
  cr_assert_eq(fx_wait_for(&F.kept_total, 2), 2);
  rpc_client_interrupt_streams(c);
  cr_assert_eq(fx_wait_for(&F.msg_cancels, 2), 2, "each open message call is cancelled");
  /* The stream, the "keepc" call its cancel callback ended, and the "keep"
   * call, counted when its stream went. */
  cr_assert_eq(fx_wait_for(&F.nhooks, 3), 3);
  cr_assert_eq(fx_hook_count(REPORTSTREAM, GRPC_STATUS_CANCELLED), 3);
  fx_end_kept(GRPC_STATUS_ABORTED); /* the "keep" one, its stream gone */
  cr_assert_eq(F.nkept_end, 1);
  cr_assert_eq(F.kept_end_rc[0], -1, "ending a message call whose stream is gone does nothing");
  cr_assert_eq(F.msg_cancels, 2, "a cancel callback runs once");
  rpc_oneway_free(w.p, 5);
  rpc_client_free(c);
  fx_stop();
  cr_assert_eq(F.nhooks, 3);
}

Test(rpc_oneway, a_message_call_kept_past_shutdown_is_freed_with_the_server) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  ow w;
  ow_open(&w, c, REPORTSTREAM);
  rpc_status st;
  cr_assert_eq(send_id(w.p, "keep", 5, &st), 1, "%s", st.message);
  cr_assert_eq(fx_wait_for(&F.kept_total, 1), 1);
  rpc_oneway_free(w.p, 0.2); /* the half-close waits for it: cancelled after 0.2 s */
  cr_assert_eq(fx_wait_for(&F.msg_cancels, 1), 1);
  rpc_client_free(c);
  fx_stop(); /* its memory goes with the server (checked under ASan) */
  cr_assert_eq(fx_hook_count(REPORTSTREAM, GRPC_STATUS_CANCELLED), 2);
}

/* ---- refused batches ---------------------------------------------------------------- */

Test(rpc_oneway, refused_first_batch_ends_the_stream_internal) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  ow w;
  ow_open(&w, c, REPORTSTREAM);
  rpc_status st;
  fx_fail_batches(0, 1);
  cr_assert_eq(send_id(w.p, "n1", 5, &st), 0);
  cr_assert_eq(st.code, GRPC_STATUS_INTERNAL, "%s: %s", rpc_status_name(st.code), st.message);
  cr_assert_eq(send_id(w.p, "n1", 5, &st), 1, "the next stream opens: %s", st.message);
  rpc_oneway_free(w.p, 5);
  cr_assert_eq(w.broken, 0);
  cr_assert_eq(F.reports_ok, 1);
  rpc_client_free(c);
  fx_stop();
  cr_assert_eq(fx_hook_count(REPORTSTREAM, GRPC_STATUS_INTERNAL), 1);
}

/* Batches of a stream: 1 its metadata and first read, 2 RECV_CLOSE, then
 * the next read (3) after the first message. */
Test(rpc_oneway, refused_read_ends_the_stream_internal) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  ow w;
  ow_open(&w, c, REPORTSTREAM);
  rpc_status st;
  fx_fail_batches(2, 1);
  cr_assert_eq(send_id(w.p, "n1", 5, &st), 1, "%s", st.message);
  cr_assert_eq(fx_wait_for(&w.broken, 1), 1);
  cr_assert_eq(w.last_broken.code, GRPC_STATUS_INTERNAL, "%s: %s",
               rpc_status_name(w.last_broken.code), w.last_broken.message);
  cr_assert_eq(send_id(w.p, "n2", 5, &st), 1, "%s", st.message);
  rpc_oneway_free(w.p, 5);
  cr_assert_eq(F.reports_ok, 2);
  rpc_client_free(c);
  fx_stop();
  cr_assert_eq(fx_hook_count(REPORTSTREAM, GRPC_STATUS_INTERNAL), 1);
}

/* The answer to the first message (a failure) is batch 3. */
Test(rpc_oneway, refused_answer_ends_the_stream_internal) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  ow w;
  ow_open(&w, c, REPORTSTREAM);
  rpc_status st;
  fx_fail_batches(2, 1);
  cr_assert_eq(send_id(w.p, "f1", 5, &st), 1, "%s", st.message);
  cr_assert_eq(fx_wait_for(&w.broken, 1), 1);
  cr_assert_eq(w.last_broken.code, GRPC_STATUS_INTERNAL, "%s: %s",
               rpc_status_name(w.last_broken.code), w.last_broken.message);
  cr_assert_eq(w.failed, 0, "the answer did not go out");
  rpc_oneway_free(w.p, 5);
  rpc_client_free(c);
  fx_stop();
  cr_assert_eq(fx_hook_count(REPORTSTREAM, GRPC_STATUS_FAILED_PRECONDITION), 1);
  cr_assert_eq(fx_hook_count(REPORTSTREAM, GRPC_STATUS_INTERNAL), 1);
}
