/* rpc server and client over loopback (rpc_fixture.h). Server streams: order
 * of many messages, cancellation by the client. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
