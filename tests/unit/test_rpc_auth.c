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

/* Mutual TLS: a server that asks for client certificates signed by its
 * client CA lets in the client that presents one, not the one without or
 * with a stranger's; a certificate without its key is refused up front. */
Test(rpc_auth, client_certificates_when_the_server_asks) {
  const char *tmp = getenv("TMPDIR");
  char dir[256];
  snprintf(dir, sizeof dir, "%s/rpc-mtls-XXXXXX", tmp && *tmp ? tmp : P_tmpdir);
  cr_assert_not_null(mkdtemp(dir));
  char cmd[4096], cert[300], key[300], ccert[300], ckey[300], other[300], okey[300];
  snprintf(cert, sizeof cert, "%s/cert.pem", dir);
  snprintf(key, sizeof key, "%s/key.pem", dir);
  snprintf(ccert, sizeof ccert, "%s/client.pem", dir);
  snprintf(ckey, sizeof ckey, "%s/client.key", dir);
  snprintf(other, sizeof other, "%s/other.pem", dir);
  snprintf(okey, sizeof okey, "%s/other.key", dir);
  /* Self-signed server and client certificates: each is its own CA. */
  snprintf(cmd, sizeof cmd,
           "openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=localhost -days 1 "
           "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout %s -out %s >/dev/null 2>&1 && "
           "openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=worker -days 1 -keyout %s -out %s "
           ">/dev/null 2>&1 && "
           "openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=stranger -days 1 -keyout %s -out %s "
           ">/dev/null 2>&1",
           key, cert, ckey, ccert, okey, other);
  if (system(cmd) != 0) cr_skip_test("openssl cannot make certificates here");
  fx_start_opts((rpc_server_opts){.tls_cert_file = cert, .tls_key_file = key, .tls_client_ca_file = ccert});
  char err[256];
  rpc_status st;
  rpc_client *c = NULL;
  rpc_client_opts o = {.target = F.target, .tls_ca_file = cert, .tls_cert_file = ccert, .tls_key_file = ckey};
  cr_assert_eq(rpc_client_new(&o, &c, err, sizeof err), 0, "%s", err);
  cr_assert_eq(fx_getrun(c, "r1", 10, &st, NULL), GRPC_STATUS_OK, "%s", st.message);
  rpc_client_free(c);
  o.tls_cert_file = o.tls_key_file = NULL; /* no certificate: no call */
  cr_assert_eq(rpc_client_new(&o, &c, err, sizeof err), 0, "%s", err);
  cr_assert_neq(fx_getrun(c, "r1", 3, &st, NULL), GRPC_STATUS_OK);
  rpc_client_free(c);
  o.tls_cert_file = other; /* one the server's client CA did not sign */
  o.tls_key_file = okey;
  cr_assert_eq(rpc_client_new(&o, &c, err, sizeof err), 0, "%s", err);
  cr_assert_neq(fx_getrun(c, "r1", 3, &st, NULL), GRPC_STATUS_OK);
  rpc_client_free(c);
  o.tls_key_file = NULL;
  cr_assert_eq(rpc_client_new(&o, &c, err, sizeof err), -1);
  cr_assert(strstr(err, "needs its key") && strstr(err, other), "%s", err);
  o.tls_key_file = "/nonexistent/client.key";
  cr_assert_eq(rpc_client_new(&o, &c, err, sizeof err), -1);
  cr_assert(strstr(err, "/nonexistent/client.key"), "%s", err);
  fx_stop();
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert_eq(system(cmd), 0);
}
