/* rpc server and client over loopback (rpc_fixture.h). Bearer-token
 * authentication and TLS. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rpc_fixture.h"

Test(rpc_auth, auth_missing_wrong_right) {
  fx_start_opts((rpc_server_opts){.token = "t0ken"});
  rpc_status st;
  rpc_client *none = fx_client(NULL), *wrong = fx_client("t0kem"), *right = fx_client("t0ken");
  cr_assert_eq(fx_getrun(none, "r1", 5, &st, NULL), GRPC_STATUS_UNAUTHENTICATED);
  cr_assert_str_eq(st.message, "missing bearer token");
  cr_assert_eq(fx_getrun(wrong, "r1", 5, &st, NULL), GRPC_STATUS_UNAUTHENTICATED);
  cr_assert_str_eq(st.message, "invalid bearer token");
  cr_assert_eq(fx_getrun(right, "r1", 5, &st, NULL), GRPC_STATUS_OK, "%s", st.message);
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
  fx_stop();
  cr_assert_eq(fx_hook_count(GETRUN, GRPC_STATUS_UNAUTHENTICATED), 2);
}

/* TLS with a throw-away self-signed certificate (skipped without openssl). */
Test(rpc_auth, tls_round_trip) {
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
  fx_start_opts((rpc_server_opts){.tls_cert_file = cert, .tls_key_file = key});
  rpc_client *c = NULL;
  char err[256];
  rpc_client_opts o = {.target = F.target, .tls_ca_file = cert};
  cr_assert_eq(rpc_client_new(&o, &c, err, sizeof err), 0, "%s", err);
  rpc_status st;
  cr_assert_eq(fx_getrun(c, "r1", 10, &st, NULL), GRPC_STATUS_OK, "%s", st.message);
  rpc_client_free(c);
  /* A plaintext client cannot talk to it. */
  c = fx_client(NULL);
  cr_assert_neq(fx_getrun(c, "r1", 2, &st, NULL), GRPC_STATUS_OK);
  rpc_client_free(c);
  o.tls_ca_file = "/nonexistent/ca.pem";
  cr_assert_eq(rpc_client_new(&o, &c, err, sizeof err), -1);
  cr_assert(strstr(err, "/nonexistent/ca.pem"), "%s", err);
  fx_stop();
  unlink(cert);
  unlink(key);
  rmdir(dir);
}
