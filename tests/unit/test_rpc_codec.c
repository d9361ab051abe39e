/* rpc codec, method table, bearer check and status names: no sockets. */
#include <criterion/criterion.h>
#include <signal.h>
#include <string.h>

#include "rlorch/v1/control.pb-c.h"
#include "rlorch/v1/worker.pb-c.h"
#include "rpc/rpc_internal.h"

#include <grpc/support/sync.h>

static void noop_handler(rpc_call *c, const ProtobufCMessage *req, void *ud) {}

Test(rpc_codec, round_trip_keeps_every_field) {
  grpc_init();
  Rlorch__V1__RunSpec spec = RLORCH__V1__RUN_SPEC__INIT;
  spec.name = "run-a";
  spec.preset = "1b";
  spec.steps = 42;
  spec.staging_budget_bytes = 1ull << 33;
  Rlorch__V1__Run run = RLORCH__V1__RUN__INIT;
  run.id = "r-17";
  run.spec = &spec;
  run.steps_done = 9;
  run.message = "ok";
  grpc_byte_buffer *bb = rpc__encode(&run.base);
  cr_assert_eq(grpc_byte_buffer_length(bb), protobuf_c_message_get_packed_size(&run.base));
  Rlorch__V1__Run *back = (Rlorch__V1__Run *)rpc__decode(bb, &rlorch__v1__run__descriptor);
  cr_assert_not_null(back);
  cr_assert_str_eq(back->id, "r-17");
  cr_assert_str_eq(back->message, "ok");
  cr_assert_eq(back->steps_done, 9);
  cr_assert_not_null(back->spec);
  cr_assert_str_eq(back->spec->name, "run-a");
  cr_assert_str_eq(back->spec->preset, "1b");
  cr_assert_eq(back->spec->steps, 42);
  cr_assert_eq(back->spec->staging_budget_bytes, 1ull << 33);
  protobuf_c_message_free_unpacked(&back->base, NULL);
  grpc_byte_buffer_destroy(bb);
  grpc_shutdown_blocking();
}

Test(rpc_codec, garbage_does_not_decode) {
  grpc_init();
  static const uint8_t bad[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  grpc_slice sl = grpc_slice_from_copied_buffer((const char *)bad, sizeof bad);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  cr_assert_null(rpc__decode(bb, &rlorch__v1__run_spec__descriptor));
  grpc_byte_buffer_destroy(bb);
  /* A length-delimited field that claims more bytes than there are. */
  static const uint8_t trunc[] = {0x0a, 0x40, 'a', 'b'};
  sl = grpc_slice_from_copied_buffer((const char *)trunc, sizeof trunc);
  bb = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  cr_assert_null(rpc__decode(bb, &rlorch__v1__run_spec__descriptor));
  grpc_byte_buffer_destroy(bb);
  cr_assert_null(rpc__decode(NULL, &rlorch__v1__run_spec__descriptor));
  grpc_shutdown_blocking();
}

/* A field number 0 spelled in two bytes: protobuf-c reads it, writes it back
 * in one byte and cannot read that. Refused at any depth, as the top-level
 * message, a sub-message, a repeated one or a oneof member; field 0 in one
 * byte was refused already, and other unknown fields still decode. */
Test(rpc_codec, field_number_zero_does_not_decode) {
  static const uint8_t top[] = {0x80, 0x00, 0x05};
  cr_assert_null(rpc_unpack(&rlorch__v1__get_run_request__descriptor, top, sizeof top));
  static const uint8_t one_byte[] = {0x00, 0x05};
  cr_assert_null(rpc_unpack(&rlorch__v1__get_run_request__descriptor, one_byte, sizeof one_byte));
  /* RunSpec.sampling (field 12) holding it: what StartRun would have stored. */
  static const uint8_t nested[] = {0x62, 0x03, 0x80, 0x00, 0x05};
  cr_assert_null(rpc_unpack(&rlorch__v1__run_spec__descriptor, nested, sizeof nested));
  /* ListRunsResponse.runs[0] (repeated), then RunSpec.prompts.synthetic (a oneof member). */
  static const uint8_t repeated[] = {0x0a, 0x03, 0x80, 0x00, 0x05};
  cr_assert_null(rpc_unpack(&rlorch__v1__list_runs_response__descriptor, repeated, sizeof repeated));
  static const uint8_t oneof[] = {0x5a, 0x05, 0x12, 0x03, 0x80, 0x00, 0x05};
  cr_assert_null(rpc_unpack(&rlorch__v1__run_spec__descriptor, oneof, sizeof oneof));
  /* An unknown field 99 is kept, and what is packed again decodes again. */
  static const uint8_t unknown[] = {0x0a, 0x01, 'r', 0x98, 0x06, 0x07};
  ProtobufCMessage *m = rpc_unpack(&rlorch__v1__get_run_request__descriptor, unknown, sizeof unknown);
  cr_assert_not_null(m);
  cr_assert_eq(m->n_unknown_fields, 1);
  uint8_t buf[16];
  size_t n = protobuf_c_message_pack(m, buf);
  ProtobufCMessage *again = rpc_unpack(&rlorch__v1__get_run_request__descriptor, buf, n);
  cr_assert_not_null(again);
  protobuf_c_message_free_unpacked(again, NULL);
  protobuf_c_message_free_unpacked(m, NULL);
}

#define M(name, kind) \
  { name, kind, &rlorch__v1__get_run_request__descriptor, &rlorch__v1__run__descriptor, 0, noop_handler, NULL }

/* Counting a manifest's tensors in an encoded RegisterRequest, as the
 * Worker API does before decoding one. */
Test(rpc_codec, wire_count_follows_a_path) {
  Rlorch__V1__TensorSpec t[3];
  Rlorch__V1__TensorSpec *tp[3];
  uint64_t shape[] = {4, 4};
  for (int i = 0; i < 3; i++) {
    rlorch__v1__tensor_spec__init(&t[i]);
    t[i].name = "w";
    t[i].shape = shape;
    t[i].n_shape = 2;
    tp[i] = &t[i];
  }
  Rlorch__V1__WeightManifest m = RLORCH__V1__WEIGHT_MANIFEST__INIT;
  m.tensors = tp;
  m.n_tensors = 3;
  m.preset = "1b";
  Rlorch__V1__RegisterRequest q = RLORCH__V1__REGISTER_REQUEST__INIT;
  q.role = RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER;
  q.name = "t";
  q.manifest = &m;
  uint8_t buf[512];
  size_t n = rlorch__v1__register_request__pack(&q, buf);
  static const uint32_t tensors[] = {4, 1}, shapes[] = {4, 1, 5}, names[] = {2};
  uint64_t c = 0;
  cr_assert_eq(rpc_wire_count(buf, n, tensors, 2, &c), 0);
  cr_assert_eq(c, 3, "three tensors");
  c = 0;
  cr_assert_eq(rpc_wire_count(buf, n, names, 1, &c), 0);
  cr_assert_eq(c, 1, "one name");
  c = 0;
  cr_assert_eq(rpc_wire_count(buf, n, shapes, 3, &c), 0);
  cr_assert_eq(c, 3, "a packed shape is one field");
  /* A sub-message sent twice is merged by decoders: its entries add up. */
  uint8_t twice[1024];
  memcpy(twice, buf, n);
  memcpy(twice + n, buf, n);
  c = 0;
  cr_assert_eq(rpc_wire_count(twice, 2 * n, tensors, 2, &c), 0);
  cr_assert_eq(c, 6);
  /* No manifest: none. */
  q.manifest = NULL;
  size_t n0 = rlorch__v1__register_request__pack(&q, buf);
  c = 0;
  cr_assert_eq(rpc_wire_count(buf, n0, tensors, 2, &c), 0);
  cr_assert_eq(c, 0);
  /* What is not a well-formed encoding along the path is refused. */
  q.manifest = &m;
  n = rlorch__v1__register_request__pack(&q, buf);
  c = 0;
  cr_assert_eq(rpc_wire_count(buf, n - 1, tensors, 2, &c), -1, "truncated");
  static const uint8_t group[] = {0x0b}, varint_manifest[] = {0x20, 0x01}, long_varint[] = {
      0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  cr_assert_eq(rpc_wire_count(group, sizeof group, tensors, 2, &c), -1, "a group");
  cr_assert_eq(rpc_wire_count(varint_manifest, sizeof varint_manifest, tensors, 2, &c), -1,
               "field 4 as a varint where a message is expected");
  cr_assert_eq(rpc_wire_count(long_varint, sizeof long_varint, tensors, 2, &c), -1,
               "a varint longer than 10 bytes");
  cr_assert_eq(rpc_wire_count(buf, n, tensors, 0, &c), -1, "an empty path");
}

Test(rpc_table, lookup_finds_exact_names_only) {
  rpc_method ms[] = {M("/rlorch.v1.Control/StopRun", RPC_UNARY),
                     M("/rlorch.v1.Control/GetRun", RPC_UNARY),
                     M("/rlorch.v1.Control/WatchRun", RPC_SERVER_STREAM),
                     M("/rlorch.v1.Control/Get", RPC_UNARY)};
  rpc__table t;
  char err[256];
  cr_assert_eq(rpc__table_init(&t, ms, 4, err, sizeof err), 0, "%s", err);
  const char *n = "/rlorch.v1.Control/GetRun";
  rpc__entry *e = rpc__table_find(&t, n, strlen(n));
  cr_assert_not_null(e);
  cr_assert_str_eq(e->m.name, n);
  e = rpc__table_find(&t, "/rlorch.v1.Control/Get", 22);
  cr_assert_not_null(e);
  cr_assert_str_eq(e->m.name, "/rlorch.v1.Control/Get");
  /* A prefix of a longer name, and a name not NUL-terminated at len. */
  cr_assert_not_null(rpc__table_find(&t, "/rlorch.v1.Control/GetRunXYZ", 25));
  cr_assert_null(rpc__table_find(&t, "/rlorch.v1.Control/GetRu", 24));
  cr_assert_null(rpc__table_find(&t, "/rlorch.v1.Control/GetRuns", 26));
  cr_assert_null(rpc__table_find(&t, "", 0));
  e = rpc__table_find(&t, "/rlorch.v1.Control/WatchRun", 27);
  cr_assert_not_null(e);
  cr_assert_eq(e->m.kind, RPC_SERVER_STREAM);
  rpc__table_free(&t);
}

Test(rpc_table, rejects_duplicates_and_bad_names) {
  rpc__table t;
  char err[256];
  rpc_method dup[] = {M("/a.B/C", RPC_UNARY), M("/a.B/C", RPC_UNARY)};
  cr_assert_eq(rpc__table_init(&t, dup, 2, err, sizeof err), -1);
  cr_assert(strstr(err, "/a.B/C") && strstr(err, "twice"), "%s", err);
  rpc_method bad[] = {M("a.B/C", RPC_UNARY)};
  cr_assert_eq(rpc__table_init(&t, bad, 1, err, sizeof err), -1);
  cr_assert(strstr(err, "a.B/C"), "%s", err);
  rpc_method nohandler[] = {M("/a.B/C", RPC_UNARY)};
  nohandler[0].handler = NULL;
  cr_assert_eq(rpc__table_init(&t, nohandler, 1, err, sizeof err), -1);
  rpc_method badkind[] = {M("/a.B/C", 7)};
  cr_assert_eq(rpc__table_init(&t, badkind, 1, err, sizeof err), -1);
}

Test(rpc_status, names_follow_grpc) {
  cr_assert_str_eq(rpc_status_name(GRPC_STATUS_OK), "OK");
  cr_assert_str_eq(rpc_status_name(GRPC_STATUS_NOT_FOUND), "NOT_FOUND");
  cr_assert_str_eq(rpc_status_name(GRPC_STATUS_INVALID_ARGUMENT), "INVALID_ARGUMENT");
  cr_assert_str_eq(rpc_status_name(GRPC_STATUS_RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED");
  cr_assert_str_eq(rpc_status_name(GRPC_STATUS_FAILED_PRECONDITION), "FAILED_PRECONDITION");
  cr_assert_str_eq(rpc_status_name(GRPC_STATUS_UNIMPLEMENTED), "UNIMPLEMENTED");
  cr_assert_str_eq(rpc_status_name(GRPC_STATUS_UNAVAILABLE), "UNAVAILABLE");
  cr_assert_str_eq(rpc_status_name(GRPC_STATUS_UNAUTHENTICATED), "UNAUTHENTICATED");
  cr_assert_str_eq(rpc_status_name(GRPC_STATUS_DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED");
  cr_assert_str_eq(rpc_status_name((grpc_status_code)17), "INVALID_STATUS");
  cr_assert_str_eq(rpc_status_name((grpc_status_code)-1), "INVALID_STATUS");
}

Test(rpc_auth, bearer_check) {
  const char *ok = "Bearer s3cret";
  cr_assert_eq(rpc__check_bearer(ok, strlen(ok), "s3cret"), 0);
  const char *lower = "bearer s3cret";
  cr_assert_eq(rpc__check_bearer(lower, strlen(lower), "s3cret"), 0);
  const char *bad[] = {"Bearer s3cre", "Bearer s3cret!", "Bearer S3cret", "s3cret", "Bearer ", "",
                       "Basic s3cret"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_assert_eq(rpc__check_bearer(bad[i], strlen(bad[i]), "s3cret"), -1, "%s", bad[i]);
  /* An empty configured token never matches. */
  cr_assert_eq(rpc__check_bearer("Bearer ", 7, ""), -1);
}

/* Takes two of gRPC's mutexes in both orders: a lock-order inversion, which
 * Abseil's deadlock detection, where it is on, answers by aborting. */
static void invert_lock_order(void) {
  gpr_mu a, b;
  gpr_mu_init(&a);
  gpr_mu_init(&b);
  gpr_mu_lock(&a);
  gpr_mu_lock(&b);
  gpr_mu_unlock(&b);
  gpr_mu_unlock(&a);
  gpr_mu_lock(&b);
  gpr_mu_lock(&a);
  gpr_mu_unlock(&a);
  gpr_mu_unlock(&b);
  gpr_mu_destroy(&a);
  gpr_mu_destroy(&b);
}

/* The Abseil this project builds against keeps the graph (each test runs in
 * a process of its own, so rpc__init has not run here). */
Test(absl, deadlock_detection_is_on_as_built, .signal = SIGABRT) { invert_lock_order(); }

Test(absl, rpc_init_turns_deadlock_detection_off) {
  cr_assert_eq(rpc__init(), 0, "the setter was found");
  invert_lock_order();
  grpc_shutdown();
}
