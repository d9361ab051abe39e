/* rpc server and client over loopback (rpc_fixture.h). grpc.health.v1: Check
 * and Watch. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rpc_fixture.h"

Test(rpc_health, health_check) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  rpc_status st;
  int status = -1;
  cr_assert_eq(fx_health_check(c, "", &status, &st), GRPC_STATUS_OK);
  cr_assert_eq(status, 1);
  cr_assert_eq(fx_health_check(c, "rlorch.v1.Control", &status, &st), GRPC_STATUS_OK);
  cr_assert_eq(status, 1);
  cr_assert_eq(fx_health_check(c, "nope.Svc", &status, &st), GRPC_STATUS_NOT_FOUND);
  cr_assert(strstr(st.message, "nope.Svc"));
  fx_health_arg a = {"rlorch.v1.Control", 2};
  fx_on_loop(fx_do_set_health, &a);
  cr_assert_eq(fx_health_check(c, "rlorch.v1.Control", &status, &st), GRPC_STATUS_OK);
  cr_assert_eq(status, 2);
  rpc_client_free(c);
  fx_stop();
}

Test(rpc_health, health_watch_sees_every_change) {
  fx_start();
  fx_watcher w = {.c = fx_client(NULL), .svc = "svc.X", .stop_at = 3};
  uv_thread_t th;
  uv_thread_create(&th, fx_watch_thread, &w);
  cr_assert_eq(fx_wait_for(&w.n, 1), 1);
  fx_health_arg a = {"svc.X", 1};
  fx_on_loop(fx_do_set_health, &a);
  cr_assert_eq(fx_wait_for(&w.n, 2), 2);
  a.status = 1; /* no change: no message */
  fx_on_loop(fx_do_set_health, &a);
  a.status = 2;
  fx_on_loop(fx_do_set_health, &a);
  uv_thread_join(&th);
  cr_assert_eq(w.n, 3);
  cr_assert_eq(w.statuses[0], 3, "SERVICE_UNKNOWN first");
  cr_assert_eq(w.statuses[1], 1);
  cr_assert_eq(w.statuses[2], 2);
  cr_assert_eq(w.code, GRPC_STATUS_CANCELLED);
  rpc_client_free(w.c);
  fx_stop();
}
