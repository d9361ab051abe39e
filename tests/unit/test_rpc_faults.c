/* rpc server and client over loopback (rpc_fixture.h), with batches refused
 * through the test hook rpc__test_fail_batches: gRPC refuses a batch only on
 * a misuse of its API, so these error paths cannot be reached otherwise. Each
 * test checks the call is counted, the server keeps answering and shuts down
 * cleanly (no call object left behind); under AddressSanitizer (`make
 * test-asan`) it also catches a call used after it was freed. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/rpc_internal.h"
#include "rpc_fixture.h"


/* The server still answers and nothing is left refused. */
static void assert_still_serves(rpc_client *c) {
  rpc_status st;
  cr_assert_eq(fx_getrun(c, "r1", 5, &st, NULL), GRPC_STATUS_OK, "%s", st.message);
}

/* An unknown method is answered by the final batch alone, with no other
 * batch in flight: when it is refused the call is over at once, on the path
 * that must not touch the call once it is freed. */
Test(rpc_faults, refused_final_batch_of_unknown_method) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  fx_fail_batches(0, 1);
  rpc_status st;
  uint8_t *resp = NULL;
  size_t len;
  grpc_status_code code = rpc_client_call_raw(c, "/x.Y/Z", "", 0, 5, &resp, &len, &st);
  cr_assert_neq(code, GRPC_STATUS_OK);
  cr_assert_neq(code, GRPC_STATUS_UNIMPLEMENTED, "the status was never sent");
  free(resp);
  cr_assert_eq(fx_wait_for(&F.nhooks, 1), 1);
  cr_assert_eq(fx_hook_count("/x.Y/Z", GRPC_STATUS_CANCELLED), 1,
               "a call whose status could not be sent counts as cancelled");
  assert_still_serves(c);
  rpc_client_free(c);
  fx_stop();
}

/* The handler replies at once and the reply's batch is refused. */
Test(rpc_faults, refused_unary_reply) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  fx_fail_batches(0, 1);
  rpc_status st;
  cr_assert_neq(fx_getrun(c, "r7", 5, &st, NULL), GRPC_STATUS_OK);
  cr_assert_eq(fx_wait_for(&F.nhooks, 1), 1);
  cr_assert_eq(fx_hook_count(GETRUN, GRPC_STATUS_CANCELLED), 1);
  assert_still_serves(c);
  rpc_client_free(c);
  fx_stop();
  cr_assert_eq(fx_hook_count(GETRUN, GRPC_STATUS_OK), 1);
}

/* The first of two stream messages cannot go out: the second is refused
 * too, and the stream does not end OK (the client would take the missing
 * messages for the whole stream). */
Test(rpc_faults, refused_stream_send_is_not_ok) {
  fx_start();
  fx_fail_batches(0, 1);
  fx_streamer s = {.c = fx_client(NULL), .run_id = "done", .n = 2};
  fx_stream_thread(&s);
  cr_assert_eq(s.got, 0, "no message after a refused one");
  cr_assert_eq(s.code, GRPC_STATUS_INTERNAL, "%s: %s", rpc_status_name(s.code), s.st.message);
  cr_assert_str_eq(s.st.message, "a stream message could not be sent");
  cr_assert_eq(fx_wait_for(&F.sends_refused, 1), 1, "the handler's second send is refused");
  cr_assert_eq(fx_wait_for(&F.nhooks, 1), 1);
  cr_assert_eq(fx_hook_count(WATCHRUN, GRPC_STATUS_INTERNAL), 1);
  assert_still_serves(s.c);
  rpc_client_free(s.c);
  fx_stop();
}

static int count(ProtobufCMessage *m, void *ud) {
  protobuf_c_message_free_unpacked(m, NULL);
  ++*(int *)ud;
  return 0;
}

/* The stream's status is sent from the completion of its last message (the
 * batches: the message, the close watch, then the status) and is refused:
 * the call ends when the client gives up. */
Test(rpc_faults, refused_status_after_stream_message) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  fx_fail_batches(2, 1);
  Rlorch__V1__WatchRunRequest r = RLORCH__V1__WATCH_RUN_REQUEST__INIT;
  r.run_id = "done";
  r.from_step = 1;
  rpc_status st;
  int got = 0;
  grpc_status_code code = rpc_client_stream(c, WATCHRUN, &r.base,
                                            &rlorch__v1__run_event__descriptor, 0.5, count, &got,
                                            &st);
  cr_assert_eq(got, 1, "the message went out");
  cr_assert_neq(code, GRPC_STATUS_OK, "the status was never sent");
  cr_assert_eq(fx_wait_for(&F.nhooks, 1), 1);
  assert_still_serves(c);
  rpc_client_free(c);
  fx_stop();
}
