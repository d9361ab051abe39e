/* rpc server and client over loopback (rpc_fixture.h). Unary calls: replies,
 * handler errors, refusals by the rpc layer (unknown method, undecodable or
 * oversized request), deadlines, concurrency and garbage input. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rpc_fixture.h"

Test(rpc_unary, unary_ok_and_handler_errors) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  rpc_status st;
  Rlorch__V1__Run *run = NULL;
  cr_assert_eq(fx_getrun(c, "r42", 5, &st, &run), GRPC_STATUS_OK, "%s", st.message);
  cr_assert_str_eq(run->id, "r42");
  cr_assert_eq(run->steps_done, 3);
  cr_assert_str_eq(run->message, "fake");
  protobuf_c_message_free_unpacked(&run->base, NULL);
  cr_assert_eq(fx_getrun(c, "nope", 5, &st, NULL), GRPC_STATUS_NOT_FOUND);
  cr_assert_str_eq(st.message, "run 'nope' not found");
  cr_assert_eq(fx_getrun(c, "precondition", 5, &st, NULL), GRPC_STATUS_FAILED_PRECONDITION);
  cr_assert(strstr(st.message, "not running"));
  rpc_client_free(c);
  fx_stop();
  cr_assert_eq(fx_hook_count(GETRUN, GRPC_STATUS_OK), 1);
  cr_assert_eq(fx_hook_count(GETRUN, GRPC_STATUS_NOT_FOUND), 1);
  cr_assert_eq(fx_hook_count(GETRUN, GRPC_STATUS_FAILED_PRECONDITION), 1);
}

Test(rpc_unary, unknown_method_is_unimplemented) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  rpc_status st;
  uint8_t *resp;
  size_t len;
  cr_assert_eq(rpc_client_call_raw(c, "/x.Y/Z", "", 0, 5, &resp, &len, &st),
               GRPC_STATUS_UNIMPLEMENTED);
  cr_assert_str_eq(st.message, "unknown method /x.Y/Z");
  cr_assert_null(resp);
  rpc_client_free(c);
  fx_stop();
  cr_assert_eq(fx_hook_count("/x.Y/Z", GRPC_STATUS_UNIMPLEMENTED), 1);
}

Test(rpc_unary, undecodable_request_is_invalid_argument) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  rpc_status st;
  uint8_t *resp;
  size_t len;
  static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
  cr_assert_eq(rpc_client_call_raw(c, STARTRUN, junk, sizeof junk, 5, &resp, &len, &st),
               GRPC_STATUS_INVALID_ARGUMENT);
  cr_assert_str_eq(st.message, "cannot decode rlorch.v1.RunSpec");
  rpc_client_free(c);
  fx_stop();
  cr_assert_eq(fx_hook_count(STARTRUN, GRPC_STATUS_INVALID_ARGUMENT), 1);
}

Test(rpc_unary, precheck_refuses_before_decoding) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  rpc_status st;
  Rlorch__V1__RunSpec spec = RLORCH__V1__RUN_SPEC__INIT;
  spec.name = "plain";
  ProtobufCMessage *resp = NULL;
  cr_assert_eq(rpc_client_call(c, STARTRUN, &spec.base, &rlorch__v1__run__descriptor, 5, &resp, &st),
               GRPC_STATUS_OK, "%s", st.message);
  protobuf_c_message_free_unpacked(resp, NULL);
  resp = NULL;
  Rlorch__V1__SyntheticPrompts syn = RLORCH__V1__SYNTHETIC_PROMPTS__INIT;
  Rlorch__V1__PromptSource ps = RLORCH__V1__PROMPT_SOURCE__INIT;
  ps.source_case = RLORCH__V1__PROMPT_SOURCE__SOURCE_SYNTHETIC;
  ps.synthetic = &syn;
  spec.prompts = &ps;
  cr_assert_eq(rpc_client_call(c, STARTRUN, &spec.base, &rlorch__v1__run__descriptor, 5, &resp, &st),
               GRPC_STATUS_RESOURCE_EXHAUSTED);
  cr_assert_null(resp, "the handler did not answer");
  cr_assert_str_eq(st.message, "precheck: 1 synthetic sources (ud ok)");
  /* Bytes the precheck cannot follow are the decoder's to refuse. */
  static const uint8_t junk[] = {0x5a, 0x40, 0x01};
  uint8_t *out = NULL;
  size_t len = 0;
  cr_assert_eq(rpc_client_call_raw(c, STARTRUN, junk, sizeof junk, 5, &out, &len, &st),
               GRPC_STATUS_INVALID_ARGUMENT);
  cr_assert(strstr(st.message, "cannot decode rlorch.v1.RunSpec"), "%s", st.message);
  free(out);
  rpc_client_free(c);
  fx_stop();
  cr_assert_eq(fx_hook_count(STARTRUN, GRPC_STATUS_OK), 1);
  cr_assert_eq(fx_hook_count(STARTRUN, GRPC_STATUS_RESOURCE_EXHAUSTED), 1);
}

Test(rpc_unary, oversized_message_is_resource_exhausted) {
  fx_start_opts((rpc_server_opts){.max_message_bytes = 1024});
  rpc_client *c = fx_client(NULL);
  rpc_status st;
  char *big = malloc(4096);
  memset(big, 'r', 4095);
  big[4095] = '\0';
  cr_assert_eq(fx_getrun(c, big, 5, &st, NULL), GRPC_STATUS_RESOURCE_EXHAUSTED);
  cr_assert(strlen(st.message) > 0);
  big[900] = '\0'; /* under the limit: fine */
  cr_assert_eq(fx_getrun(c, big, 5, &st, NULL), GRPC_STATUS_OK, "%s", st.message);
  free(big);
  rpc_client_free(c);
  fx_stop();
}

Test(rpc_unary, deadline_runs_on_cancel) {
  fx_start();
  rpc_client *c = fx_client(NULL);
  rpc_status st;
  double t0 = uv_hrtime() * 1e-9;
  cr_assert_eq(fx_getrun(c, "hold", 0.2, &st, NULL), GRPC_STATUS_DEADLINE_EXCEEDED);
  double dt = uv_hrtime() * 1e-9 - t0;
  cr_assert(dt >= 0.15 && dt < 3, "took %.3f s", dt);
  cr_assert_eq(fx_wait_for(&F.cancels, 1), 1, "on_cancel must run once");
  /* The server still answers. */
  cr_assert_eq(fx_getrun(c, "r1", 5, &st, NULL), GRPC_STATUS_OK);
  rpc_client_free(c);
  fx_stop();
  cr_assert_eq(fx_hook_count(GETRUN, GRPC_STATUS_DEADLINE_EXCEEDED), 1);
}

Test(rpc_unary, survives_bad_input) {
  fx_start_opts((rpc_server_opts){.max_message_bytes = 256});
  rpc_client *c = fx_client(NULL);
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
  cr_assert_eq(fx_getrun(c, "r1", 5, &st, NULL), GRPC_STATUS_OK, "%s", st.message);
  rpc_client_free(c);
  fx_stop();
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
    if (fx_getrun(h->c, id, 10, &st, &run) == GRPC_STATUS_OK && !strcmp(run->id, id)) h->ok++;
    if (run) protobuf_c_message_free_unpacked(&run->base, NULL);
  }
}

static void sixteen_clients(int queues) {
  fx_start_opts((rpc_server_opts){.completion_queues = queues});
  hammer h[16];
  uv_thread_t th[16];
  rpc_client *shared = fx_client(NULL);
  for (int i = 0; i < 16; i++) {
    h[i] = (hammer){.c = i % 2 ? shared : fx_client(NULL)};
    uv_thread_create(&th[i], hammer_thread, &h[i]);
  }
  for (int i = 0; i < 16; i++) {
    uv_thread_join(&th[i]);
    cr_assert_eq(h[i].ok, 50, "thread %d: %d of 50", i, h[i].ok);
    if (h[i].c != shared) rpc_client_free(h[i].c);
  }
  rpc_client_free(shared);
  fx_stop();
  cr_assert_eq(fx_hook_count(GETRUN, GRPC_STATUS_OK), 800);
}

Test(rpc_unary, sixteen_concurrent_clients) { sixteen_clients(0); }

/* The calls bound to four queues in turn, each drained by its own thread:
 * every call answered once, nothing lost between the queues. */
Test(rpc_unary, sixteen_concurrent_clients_over_four_queues) { sixteen_clients(4); }
