/* Configuration: defaults, precedence, every rejected input with its message,
 * and the print/load round trip. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/daemon/config.h"
#include "rpc/rpc.h"

static char tmpdir[64];

static void setup(void) {
  snprintf(tmpdir, sizeof tmpdir, "%s/rlorch_cfg_XXXXXX", P_tmpdir);
  cr_assert_not_null(mkdtemp(tmpdir));
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  cr_assert_eq(system(cmd), 0);
}

TestSuite(config, .init = setup, .fini = teardown);

/* Writes text to tmpdir/name; returns the path in a static buffer. */
static const char *write_file(const char *name, const char *text) {
  static char path[2][256];
  static int k;
  char *p = path[k++ & 1];
  snprintf(p, 256, "%s/%s", tmpdir, name);
  FILE *f = fopen(p, "w");
  cr_assert_not_null(f);
  fputs(text, f);
  fclose(f);
  return p;
}

/* Runs config_load on a NULL-terminated argument list. */
static int load(config *c, char *err, size_t n, char **envp, ...) {
  char *argv[32] = {"serve"};
  int argc = 1;
  va_list ap;
  va_start(ap, envp);
  for (char *a; (a = va_arg(ap, char *)) != NULL && argc < 31;) argv[argc++] = a;
  va_end(ap);
  return config_load(c, argc, argv, envp, err, n);
}

#define LOAD(c, err, envp, ...) load(c, err, sizeof err, envp, ##__VA_ARGS__, (char *)NULL)

/* Loads a YAML file and expects a failure whose message contains want. */
static void expect_file_error(const char *yaml, const char *want) {
  const char *path = write_file("rlorch.yaml", yaml);
  config c;
  char err[512] = "";
  int rc = LOAD(&c, err, NULL, "--config", (char *)path);
  cr_assert_eq(rc, -1, "accepted:\n%s", yaml);
  cr_assert(strstr(err, want), "yaml:\n%s\ngot:  %s\nwant: %s", yaml, err, want);
  cr_assert(!strncmp(err, "rlorch serve: ", 14), "%s", err);
  config_free(&c);
}

static void expect_env_error(const char *var, const char *want) {
  char *envp[] = {(char *)var, NULL};
  config c;
  char err[512] = "";
  cr_assert_eq(LOAD(&c, err, envp), -1, "accepted %s", var);
  cr_assert(strstr(err, want), "%s\ngot:  %s\nwant: %s", var, err, want);
  config_free(&c);
}

Test(config, defaults) {
  config c;
  char err[256] = "";
  cr_assert_eq(LOAD(&c, err, NULL), 0, "%s", err);
  cr_assert_str_eq(c.listen, "127.0.0.1:7070");
  cr_assert_str_eq(c.metrics_listen, "127.0.0.1:9464");
  cr_assert_str_eq(c.data_dir, "rlorch-data");
  cr_assert_null(c.token_file);
  cr_assert_null(c.token);
  cr_assert_null(c.tls_cert_file);
  cr_assert_null(c.tls_key_file);
  cr_assert_eq(c.log_level, LOG_INFO);
  cr_assert_eq(c.log_format, LOG_FORMAT_LOGFMT);
  cr_assert_eq(c.max_message_bytes, 4u << 20);
  cr_assert_eq(c.batch_chunk_bytes, 4u << 20);
  cr_assert_float_eq(c.shutdown_grace_s, 5.0, 1e-12);
  cr_assert_eq(c.heartbeat_interval_ms, 1000);
  cr_assert_eq(c.worker_timeout_ms, 5000);
  cr_assert_eq(c.max_workers, 4096);
  cr_assert_float_eq(c.lost_worker_retention_s, 60.0, 1e-12);
  cr_assert_eq(c.http_timeout_ms, 5000);
  cr_assert_eq(c.http_max_connections, 256);
  cr_assert_eq(c.max_manifest_tensors, 131072);
  cr_assert_eq(c.max_tensor_bytes, 1ull << 40);
  cr_assert_eq(c.max_manifest_bytes, 1ull << 44);
  bcast_manifest_limits lim = config_manifest_limits(&c);
  cr_assert_eq(lim.max_manifest_tensors, 131072);
  cr_assert_eq(lim.max_tensor_bytes, 1ull << 40);
  cr_assert_eq(lim.max_manifest_bytes, 1ull << 44);
  cr_assert_eq(c.default_policy, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_AUTO);
  cr_assert_eq(c.max_async_level, 1);
  cr_assert_eq(c.rollouts_per_step, 8);
  cr_assert_eq(c.max_requests_per_worker, 8);
  cr_assert_eq(c.staging_budget_bytes, 256u << 20);
  cr_assert_float_eq(c.broadcast_gbps_host, 0.5, 1e-12);
  cr_assert_float_eq(c.broadcast_gbps_staged, 5.0, 1e-12);
  cr_assert_float_eq(c.broadcast_gbps_direct, 10.0, 1e-12);
  cr_assert_float_eq(c.broadcast_safety, 4.0, 1e-12);
  cr_assert_eq(c.broadcast_slack_ms, 2000);
  cr_assert(!c.print_config && !c.help);
  config_free(&c);
}

/* The cost model's settings come from every source, and a rate must be a
 * positive number, a safety factor at least 1. */
Test(config, broadcast_cost_model_settings) {
  const char *path = write_file("rlorch.yaml", "broadcast_gbps_host: 1.5\nbroadcast_safety: 2\n");
  char *envp[] = {"RLORCH_BROADCAST_GBPS_DIRECT=40", "RLORCH_BROADCAST_SLACK_MS=500", NULL};
  config c;
  char err[512] = "";
  cr_assert_eq(LOAD(&c, err, envp, "--config", (char *)path), 0, "%s", err);
  cr_assert_float_eq(c.broadcast_gbps_host, 1.5, 1e-12);
  cr_assert_float_eq(c.broadcast_safety, 2.0, 1e-12);
  cr_assert_float_eq(c.broadcast_gbps_direct, 40.0, 1e-12);
  cr_assert_eq(c.broadcast_slack_ms, 500);
  config_free(&c);
  expect_file_error("broadcast_gbps_host: 0\n", "rlorch.yaml:1: broadcast_gbps_host: 0 out of range");
  expect_file_error("broadcast_gbps_staged: -1\n", "broadcast_gbps_staged: -1 out of range");
  expect_file_error("broadcast_safety: 0.5\n", "broadcast_safety: 0.5 out of range");
  expect_env_error("RLORCH_BROADCAST_GBPS_DIRECT=fast", "RLORCH_BROADCAST_GBPS_DIRECT: not a number");
}

Test(config, precedence_file_env_flags) {
  const char *path = write_file("rlorch.yaml",
                                "# comment\n"
                                "listen: 0.0.0.0:1111\n"
                                "metrics_listen: \"[::1]:2222\"\n"
                                "data_dir: /var/lib/x\n"
                                "log_level: debug\n"
                                "max_async_level: 3\n"
                                "rollouts_per_step: 16\n"
                                "max_requests_per_worker: 4\n"
                                "staging_budget_bytes: 64MiB\n"
                                "shutdown_grace_s: 2.5\n"
                                "default_policy: staged\n");
  char *envp[] = {"PATH=/bin", "RLORCH_LISTEN=127.0.0.1:3333", "RLORCH_MAX_ASYNC_LEVEL=5",
                  "RLORCH_MAX_REQUESTS_PER_WORKER=32",
                  "RLORCH_BIN=ignored", "RLORCH_LOG_FORMAT=json", NULL};
  config c;
  char err[256] = "";
  int rc = LOAD(&c, err, envp, "--config", (char *)path, "--listen", "localhost:4444",
                "--log-level=warn");
  cr_assert_eq(rc, 0, "%s", err);
  cr_assert_str_eq(c.listen, "localhost:4444");     /* flag beats env beats file */
  cr_assert_str_eq(c.metrics_listen, "[::1]:2222"); /* file */
  cr_assert_str_eq(c.data_dir, "/var/lib/x");
  cr_assert_eq(c.log_level, LOG_WARN);
  cr_assert_eq(c.log_format, LOG_FORMAT_JSON);
  cr_assert_eq(c.max_async_level, 5); /* env beats file */
  cr_assert_eq(c.rollouts_per_step, 16);
  cr_assert_eq(c.max_requests_per_worker, 32); /* env beats file */
  cr_assert_eq(c.staging_budget_bytes, 64u << 20);
  cr_assert_float_eq(c.shutdown_grace_s, 2.5, 1e-12);
  cr_assert_eq(c.default_policy, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_STAGED);
  cr_assert_str_eq(c.config_file, path);
  config_free(&c);
}

Test(config, config_file_from_env_and_empty_file) {
  const char *path = write_file("empty.yaml", "# nothing set\n");
  char var[300];
  snprintf(var, sizeof var, "RLORCH_CONFIG=%s", path);
  char *envp[] = {var, NULL};
  config c;
  char err[256] = "";
  cr_assert_eq(LOAD(&c, err, envp), 0, "%s", err);
  cr_assert_str_eq(c.config_file, path);
  cr_assert_str_eq(c.listen, "127.0.0.1:7070");
  config_free(&c);
}

Test(config, help_and_print_flags) {
  config c;
  char err[256] = "";
  cr_assert_eq(LOAD(&c, err, NULL, "--help", "--config", "/nonexistent.yaml"), 0, "%s", err);
  cr_assert(c.help);
  config_free(&c);
  cr_assert_eq(LOAD(&c, err, NULL, "--print-config"), 0, "%s", err);
  cr_assert(c.print_config && !c.help);
  config_free(&c);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  config_usage(f);
  fclose(f);
  const char *must[] = {"--listen", "--metrics-listen", "--data-dir", "--config", "--token-file",
                        "--log-level", "--log-format", "--tls-cert", "--tls-key", "--print-config",
                        "--help", "RLORCH_WORKER_TIMEOUT_MS", "staging_budget_bytes"};
  for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
    cr_assert(strstr(text, must[i]), "usage lacks %s", must[i]);
  free(text);
}

/* What YAML does not take raw in a scalar is printed escaped, so that the
 * printed file loads to the same string: control characters, C1 controls,
 * NEL and the line separators (a reader folds them), a BOM. Bytes that are
 * not UTF-8 print as \\xNN: the file still loads. */
Test(config, print_round_trip_of_any_characters) {
  static const char dir[] = "a\tb\rc\x7f" "d\xc2\x81" "e\xc2\x85" "f\xe2\x80\xa8" "g\xe2\x80\xa9"
                            "h\xef\xbb\xbf" "i \xc3\xa9\xe6\x97\xa5\xf0\x9f\x99\x82 \"q\" \\";
  char env[256];
  snprintf(env, sizeof env, "RLORCH_DATA_DIR=%s", dir);
  char *envp[] = {env, NULL};
  config a, b;
  char err[512] = "";
  cr_assert_eq(LOAD(&a, err, envp), 0, "%s", err);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  config_print(&a, f);
  fclose(f);
  const char *path = write_file("printed.yaml", text);
  cr_assert_eq(LOAD(&b, err, NULL, "--config", (char *)path), 0, "%s\n%s", err, text);
  cr_assert_str_eq(b.data_dir, dir, "printed as %s", strstr(text, "data_dir:"));
  free(text);
  config_free(&a);
  config_free(&b);
  char *bad[] = {"RLORCH_DATA_DIR=x\xff\xc0\x80" "y", NULL};
  cr_assert_eq(LOAD(&a, err, bad), 0, "%s", err);
  f = open_memstream(&text, &len);
  config_print(&a, f);
  fclose(f);
  cr_assert(strstr(text, "data_dir: \"x\\xff\\xc0\\x80y\""), "%s", text);
  path = write_file("printed.yaml", text);
  cr_assert_eq(LOAD(&b, err, NULL, "--config", (char *)path), 0, "%s\n%s", err, text);
  free(text);
  config_free(&a);
  config_free(&b);
}

Test(config, print_round_trip) {
  const char *tok = write_file("token", "s3cret-token\n");
  const char *crt = write_file("cert.pem", "cert");
  char tokv[300], crtv[300];
  snprintf(tokv, sizeof tokv, "RLORCH_TOKEN_FILE=%s", tok);
  snprintf(crtv, sizeof crtv, "%s", crt);
  char *envp[] = {tokv, "RLORCH_DATA_DIR=dir with \"quotes\" and \\ slash", "RLORCH_SHUTDOWN_GRACE_S=0.1",
                  "RLORCH_DEFAULT_POLICY=host", "RLORCH_HTTP_MAX_CONNECTIONS=7", NULL};
  config a, b;
  char err[512] = "";
  cr_assert_eq(LOAD(&a, err, envp, "--tls-cert", crtv, "--tls-key", crtv, "--log-format", "json"), 0,
               "%s", err);
  cr_assert_str_eq(a.token, "s3cret-token");
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  config_print(&a, f);
  fclose(f);
  cr_assert_null(strstr(text, "s3cret"), "token printed:\n%s", text);
  cr_assert(strstr(text, "token_file:"), "%s", text);
  const char *path = write_file("printed.yaml", text);
  cr_assert_eq(LOAD(&b, err, NULL, "--config", (char *)path), 0, "%s\n%s", err, text);
  cr_assert_str_eq(a.listen, b.listen);
  cr_assert_str_eq(a.metrics_listen, b.metrics_listen);
  cr_assert_str_eq(a.data_dir, b.data_dir);
  cr_assert_str_eq(a.token_file, b.token_file);
  cr_assert_str_eq(a.token, b.token);
  cr_assert_str_eq(a.tls_cert_file, b.tls_cert_file);
  cr_assert_str_eq(a.tls_key_file, b.tls_key_file);
  cr_assert_eq(a.log_level, b.log_level);
  cr_assert_eq(a.log_format, b.log_format);
  cr_assert_eq(a.max_message_bytes, b.max_message_bytes);
  cr_assert_eq(a.batch_chunk_bytes, b.batch_chunk_bytes);
  cr_assert_eq(a.shutdown_grace_s, b.shutdown_grace_s);
  cr_assert_eq(a.heartbeat_interval_ms, b.heartbeat_interval_ms);
  cr_assert_eq(a.worker_timeout_ms, b.worker_timeout_ms);
  cr_assert_eq(a.http_timeout_ms, b.http_timeout_ms);
  cr_assert_eq(a.http_max_connections, b.http_max_connections);
  cr_assert_eq(a.default_policy, b.default_policy);
  cr_assert_eq(a.max_async_level, b.max_async_level);
  cr_assert_eq(a.rollouts_per_step, b.rollouts_per_step);
  cr_assert_eq(a.max_requests_per_worker, b.max_requests_per_worker);
  cr_assert_eq(a.staging_budget_bytes, b.staging_budget_bytes);
  /* Printing the reloaded configuration gives the same text. */
  char *text2 = NULL;
  f = open_memstream(&text2, &len);
  config_print(&b, f);
  fclose(f);
  cr_assert_str_eq(text, text2);
  /* Defaults round-trip too, with null paths. */
  config d, e;
  cr_assert_eq(LOAD(&d, err, NULL), 0);
  free(text);
  f = open_memstream(&text, &len);
  config_print(&d, f);
  fclose(f);
  path = write_file("defaults.yaml", text);
  cr_assert_eq(LOAD(&e, err, NULL, "--config", (char *)path), 0, "%s\n%s", err, text);
  cr_assert_null(e.token_file);
  free(text);
  free(text2);
  config_free(&a);
  config_free(&b);
  config_free(&d);
  config_free(&e);
}

Test(config, parse_addr) {
  char h[64];
  int port = -1;
  cr_assert_eq(opt_parse_addr("127.0.0.1:7070", h, sizeof h, &port), 0);
  cr_assert_str_eq(h, "127.0.0.1");
  cr_assert_eq(port, 7070);
  cr_assert_eq(opt_parse_addr("[::1]:0", h, sizeof h, &port), 0);
  cr_assert_str_eq(h, "::1");
  cr_assert_eq(port, 0);
  cr_assert_eq(opt_parse_addr("my-host.example:65535", h, sizeof h, &port), 0);
  cr_assert_eq(port, 65535);
  const char *bad[] = {"x:y:z", "host", "host:", ":80", "host:65536", "host:-1", "host:80x",
                       "::1:80", "[::1]", "[::1]80", "[zz]:80", "[]:80", "a b:80", "",
                       "host:123456"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_assert_eq(opt_parse_addr(bad[i], h, sizeof h, &port), -1, "accepted \"%s\"", bad[i]);
  char small[4];
  cr_assert_eq(opt_parse_addr("localhost:80", small, sizeof small, &port), -1);
}

Test(config, file_errors_name_file_line_and_field) {
  struct {
    const char *yaml, *want;
  } cases[] = {
      {"data_dir: x\nmax_async_level: 2\nlisten: x:y:z\n",
       "rlorch.yaml:3: listen: invalid address \"x:y:z\" (want HOST:PORT)"},
      {"metrics_listen: nohost\n", "rlorch.yaml:1: metrics_listen: invalid address \"nohost\""},
      {"listen: \"h:70000\"\n", "rlorch.yaml:1: listen: invalid address \"h:70000\""},
      {"\n\nbogus_key: 1\n", "rlorch.yaml:3: unknown key \"bogus_key\""},
      {"max_async_level: abc\n", "rlorch.yaml:1: max_async_level: not an integer: \"abc\""},
      {"max_async_level: \"2\"\n", "rlorch.yaml:1: max_async_level: wrong type: want a number"},
      {"max_async_level: 65\n", "rlorch.yaml:1: max_async_level: 65 out of range [0, 64]"},
      {"max_async_level: -1\n", "rlorch.yaml:1: max_async_level: not an integer: \"-1\""},
      {"max_async_level: 2.5\n", "rlorch.yaml:1: max_async_level: not an integer: \"2.5\""},
      {"rollouts_per_step: 0\n", "rlorch.yaml:1: rollouts_per_step: 0 out of range"},
      {"max_requests_per_worker: 0\n", "rlorch.yaml:1: max_requests_per_worker: 0 out of range [1, 1024]"},
      {"max_requests_per_worker: 1025\n", "rlorch.yaml:1: max_requests_per_worker: 1025 out of range [1, 1024]"},
      {"rollouts_per_step: 99999999999999999999999\n", "rollouts_per_step: out of range"},
      {"http_max_connections: 0\n", "rlorch.yaml:1: http_max_connections: 0 out of range"},
      {"http_timeout_ms: 1\n", "rlorch.yaml:1: http_timeout_ms: 1 out of range"},
      {"heartbeat_interval_ms: 0\n", "heartbeat_interval_ms: 0 out of range"},
      {"max_message_bytes: 10\n", "rlorch.yaml:1: max_message_bytes: 10 out of range"},
      {"batch_chunk_bytes: 4095\n", "rlorch.yaml:1: batch_chunk_bytes: 4095 out of range [4096, "},
      /* A smaller limit would leave no chunk size in range. */
      {"max_message_bytes: 3000\n", "rlorch.yaml:1: max_message_bytes: 3000 out of range [4096, "},
      {"\nbatch_chunk_bytes: 8MiB\n",
       "rlorch.yaml:2: batch_chunk_bytes: 8388608 exceeds max_message_bytes (4194304), the "
       "largest gRPC message the server uses"},
      {"staging_budget_bytes: 12XB\n", "staging_budget_bytes: not a byte count: \"12XB\""},
      {"max_manifest_tensors: 0\n", "rlorch.yaml:1: max_manifest_tensors: 0 out of range [1, "},
      {"max_manifest_tensors: 4294967296\n", "rlorch.yaml:1: max_manifest_tensors: 4294967296 out of range"},
      {"max_tensor_bytes: 0\n", "rlorch.yaml:1: max_tensor_bytes: 0 out of range"},
      {"max_tensor_bytes: 1125899906842625\n", "rlorch.yaml:1: max_tensor_bytes: 1125899906842625 out of range"},
      {"max_manifest_bytes: 0\n", "rlorch.yaml:1: max_manifest_bytes: 0 out of range"},
      {"staging_budget_bytes: 2048GiB\n", "staging_budget_bytes: 2048GiB out of range"},
      {"shutdown_grace_s: 0\n", "rlorch.yaml:1: shutdown_grace_s: 0 out of range"},
      {"shutdown_grace_s: soon\n", "shutdown_grace_s: not a number: \"soon\""},
      {"shutdown_grace_s: .nan\n", "shutdown_grace_s: not a number"},
      {"log_level: loud\n", "rlorch.yaml:1: log_level: invalid value \"loud\""},
      {"log_format: xml\n", "rlorch.yaml:1: log_format: invalid value \"xml\" (want logfmt|json)"},
      {"default_policy: fast\n", "rlorch.yaml:1: default_policy: invalid value \"fast\""},
      {"listen: [a, b]\n", "rlorch.yaml:1: listen: wrong type: want a scalar, got a sequence"},
      {"listen:\n  host: x\n", "rlorch.yaml:1: listen: wrong type: want a scalar, got a mapping"},
      {"listen:\n", "rlorch.yaml:1: listen: missing value"},
      {"data_dir: \"\"\n", "rlorch.yaml:1: data_dir: empty value"},
      {"listen: a:1\nlisten: b:2\n", "rlorch.yaml:2: listen: duplicate key (first on line 1)"},
      {"- a\n- b\n", "rlorch.yaml:1: want a mapping of settings, got a sequence"},
      {"just text\n", "rlorch.yaml:1: want a mapping of settings, got a scalar"},
      {"listen: a:1\n---\nlisten: b:2\n", "rlorch.yaml:2: more than one YAML document"},
      {"listen: \"unterminated\n", "YAML syntax error"},
      {"data_dir: x\n\"key: 1\n", "rlorch.yaml:3: YAML syntax error"},
      {"print_config: true\n", "unknown key \"print_config\""},
      {"worker_timeout_ms: 500\n", "rlorch.yaml:1: worker_timeout_ms: 500 must exceed heartbeat_interval_ms"},
      {"tls_cert_file: c.pem\n", "rlorch.yaml:1: tls_cert_file: set without tls_key_file"},
      {"\ntls_key_file: k.pem\n", "rlorch.yaml:2: tls_key_file: set without tls_cert_file"},
      {"tls_client_ca_file: ca.pem\n",
       "rlorch.yaml:1: tls_client_ca_file: client certificates need TLS: set tls_cert_file and tls_key_file too"},
      {"tls_cert_file: /nonexistent/c.pem\ntls_key_file: /nonexistent/k.pem\n",
       "rlorch.yaml:1: tls_cert_file: cannot read \"/nonexistent/c.pem\""},
      {"token_file: /nonexistent/token\n",
       "rlorch.yaml:1: token_file: cannot read \"/nonexistent/token\": No such file"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_file_error(cases[i].yaml, cases[i].want);
}

Test(config, token_file_empty_or_directory) {
  const char *empty = write_file("empty_token", " \n\n");
  char yaml[400];
  snprintf(yaml, sizeof yaml, "\ntoken_file: %s\n", empty);
  expect_file_error(yaml, "rlorch.yaml:2: token_file: \"");
  expect_file_error(yaml, "\" is empty");
  snprintf(yaml, sizeof yaml, "token_file: %s\n", tmpdir);
  expect_file_error(yaml, "rlorch.yaml:1: token_file: cannot read");
}

Test(config, missing_config_file) {
  config c;
  char err[512] = "";
  cr_assert_eq(LOAD(&c, err, NULL, "--config", "/nonexistent/rlorch.yaml"), -1);
  cr_assert(strstr(err, "rlorch serve: /nonexistent/rlorch.yaml: cannot open: No such file"), "%s", err);
  config_free(&c);
}

Test(config, env_errors_name_the_variable) {
  expect_env_error("RLORCH_MAX_ASYNC_LEVEL=abc", "rlorch serve: RLORCH_MAX_ASYNC_LEVEL: not an integer: \"abc\"");
  expect_env_error("RLORCH_LISTEN=x:y:z", "rlorch serve: RLORCH_LISTEN: invalid address \"x:y:z\"");
  expect_env_error("RLORCH_METRICS_LISTEN=", "rlorch serve: RLORCH_METRICS_LISTEN: empty value");
  expect_env_error("RLORCH_LOG_LEVEL=verbose", "rlorch serve: RLORCH_LOG_LEVEL: invalid value \"verbose\"");
  expect_env_error("RLORCH_HTTP_TIMEOUT_MS=5s", "rlorch serve: RLORCH_HTTP_TIMEOUT_MS: not an integer: \"5s\"");
  expect_env_error("RLORCH_SHUTDOWN_GRACE_S=-1", "rlorch serve: RLORCH_SHUTDOWN_GRACE_S: -1 out of range");
  expect_env_error("RLORCH_DEFAULT_POLICY=AUTO", "rlorch serve: RLORCH_DEFAULT_POLICY: invalid value");
  expect_env_error("RLORCH_TOKEN_FILE=/nonexistent/t", "rlorch serve: RLORCH_TOKEN_FILE: cannot read");
  expect_env_error("RLORCH_TLS_KEY_FILE=/k", "rlorch serve: RLORCH_TLS_KEY_FILE: set without tls_cert_file");
  expect_env_error("RLORCH_CONFIG=/nonexistent/x.yaml", "rlorch serve: /nonexistent/x.yaml: cannot open");
}

/* max_workers reaches the worker table's cap (WORKERS_MAX, 16384: 10,000
 * inference workers and 256 trainer ranks with room) from the file and the
 * environment, and not one past it. */
Test(config, max_workers_up_to_the_table_cap) {
  const char *path = write_file("rlorch.yaml", "max_workers: 16384\n");
  config c;
  char err[512] = "";
  cr_assert_eq(LOAD(&c, err, NULL, "--config", (char *)path), 0, "%s", err);
  cr_assert_eq(c.max_workers, 16384);
  config_free(&c);
  char *envp[] = {"RLORCH_MAX_WORKERS=10256", NULL};
  cr_assert_eq(LOAD(&c, err, envp), 0, "%s", err);
  cr_assert_eq(c.max_workers, 10256);
  config_free(&c);
  expect_file_error("max_workers: 16385\n", "rlorch.yaml:1: max_workers: 16385 out of range [1, 16384]");
  expect_file_error("max_workers: 0\n", "rlorch.yaml:1: max_workers: 0 out of range [1, 16384]");
  expect_env_error("RLORCH_MAX_WORKERS=20000", "rlorch serve: RLORCH_MAX_WORKERS: 20000 out of range [1, 16384]");
}

Test(config, batch_chunk_bytes_from_every_source_and_bounded_by_the_message_limit) {
  config c;
  char err[512] = "";
  char *env[] = {"RLORCH_BATCH_CHUNK_BYTES=64KiB", NULL};
  cr_assert_eq(LOAD(&c, err, env), 0, "%s", err);
  cr_assert_eq(c.batch_chunk_bytes, 64u << 10);
  config_free(&c);
  cr_assert_eq(LOAD(&c, err, env, "--batch-chunk-bytes", "8192"), 0, "%s", err);
  cr_assert_eq(c.batch_chunk_bytes, 8192, "the flag wins over the environment");
  config_free(&c);
  /* Left at its default, it follows a smaller message limit... */
  char *small[] = {"RLORCH_MAX_MESSAGE_BYTES=16KiB", NULL};
  cr_assert_eq(LOAD(&c, err, small), 0, "%s", err);
  cr_assert_eq(c.batch_chunk_bytes, 16u << 10);
  config_free(&c);
  /* ...set, it is refused above it, naming where it came from. */
  cr_assert_eq(LOAD(&c, err, small, "--batch-chunk-bytes", "32KiB"), -1);
  cr_assert(strstr(err, "rlorch serve: --batch-chunk-bytes: 32768 exceeds max_message_bytes (16384)"),
            "%s", err);
  config_free(&c);
  char *both[] = {"RLORCH_MAX_MESSAGE_BYTES=16KiB", "RLORCH_BATCH_CHUNK_BYTES=16KiB", NULL};
  cr_assert_eq(LOAD(&c, err, both), 0, "%s", err);
  cr_assert_eq(c.batch_chunk_bytes, 16u << 10, "equal to the limit is fine");
  config_free(&c);
  expect_env_error("RLORCH_BATCH_CHUNK_BYTES=1", "rlorch serve: RLORCH_BATCH_CHUNK_BYTES: 1 out of range");
}

Test(config, env_empty_clears_optional_path) {
  const char *path = write_file("rlorch.yaml", "tls_cert_file: a\ntls_key_file: b\n");
  char *envp[] = {"RLORCH_TLS_CERT_FILE=", "RLORCH_TLS_KEY_FILE=", NULL};
  config c;
  char err[256] = "";
  cr_assert_eq(LOAD(&c, err, envp, "--config", (char *)path), 0, "%s", err);
  cr_assert_null(c.tls_cert_file);
  cr_assert_null(c.tls_key_file);
  config_free(&c);
}

Test(config, flag_errors) {
  struct {
    const char *args[4];
    const char *want;
  } cases[] = {
      {{"--listen"}, "rlorch serve: --listen: missing value"},
      {{"--listen", "--data-dir", "x"}, "rlorch serve: --listen: missing value"},
      {{"--listen="}, "rlorch serve: --listen: missing value"},
      {{"--config"}, "rlorch serve: --config: missing value"},
      {{"--listen", "x:y:z"}, "rlorch serve: --listen: invalid address \"x:y:z\" (want HOST:PORT)"},
      {{"--metrics-listen=bad"}, "rlorch serve: --metrics-listen: invalid address \"bad\""},
      {{"--log-level", "chatty"}, "rlorch serve: --log-level: invalid value \"chatty\""},
      {{"--log-format", "xml"}, "rlorch serve: --log-format: invalid value \"xml\""},
      {{"--bogus", "1"}, "rlorch serve: --bogus: unknown flag"},
      {{"stray"}, "unexpected argument \"stray\""},
      {{"--tls-cert", "/c"}, "rlorch serve: --tls-cert: set without tls_key_file"},
      {{"--token-file", "/nonexistent/t"}, "rlorch serve: --token-file: cannot read \"/nonexistent/t\""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *argv[6] = {"serve"};
    int argc = 1;
    for (int k = 0; k < 4 && cases[i].args[k]; k++) argv[argc++] = (char *)cases[i].args[k];
    config c;
    char err[512] = "";
    cr_assert_eq(config_load(&c, argc, argv, NULL, err, sizeof err), -1, "case %zu accepted", i);
    cr_assert(strstr(err, cases[i].want), "case %zu\ngot:  %s\nwant: %s", i, err, cases[i].want);
    config_free(&c);
  }
}

Test(config, flag_error_reported_before_bad_file) {
  const char *path = write_file("rlorch.yaml", "bogus: 1\n");
  config c;
  char err[512] = "";
  cr_assert_eq(LOAD(&c, err, NULL, "--config", (char *)path, "--listen"), -1);
  cr_assert(strstr(err, "--listen: missing value"), "%s", err);
  config_free(&c);
}

Test(config, token_is_trimmed) {
  const char *tok = write_file("token", "abc def\r\n\n");
  config c;
  char err[256] = "";
  cr_assert_eq(LOAD(&c, err, NULL, "--token-file", (char *)tok), 0, "%s", err);
  cr_assert_str_eq(c.token, "abc def");
  config_free(&c);
}

/* The server reads token files with the clients' reader (rpc_token_read):
 * white space on both sides goes, so a file that works for ctl and the agents
 * works for serve. A server that kept the leading blanks would expect a token
 * no client sends. */
Test(config, token_is_trimmed_on_both_sides_like_the_clients) {
  const char *tok = write_file("padded", " \t  abc def \r\n\n");
  config c;
  char err[256] = "";
  cr_assert_eq(LOAD(&c, err, NULL, "--token-file", (char *)tok), 0, "%s", err);
  cr_assert_str_eq(c.token, "abc def");
  char buf[64], terr[256];
  cr_assert_eq(rpc_token_read(tok, buf, sizeof buf, terr, sizeof terr), 0, "%s", terr);
  cr_assert_str_eq(c.token, buf, "server and clients read the same token");
  config_free(&c);
  /* A NUL byte would cut the token short for one side only: refused. */
  const char *nul = write_file("nul", "");
  FILE *f = fopen(nul, "wb");
  cr_assert_not_null(f);
  fwrite("ab\0cd", 1, 5, f);
  fclose(f);
  cr_assert_eq(LOAD(&c, err, NULL, "--token-file", (char *)nul), -1);
  cr_assert(strstr(err, "rlorch serve: --token-file: \""), "%s", err);
  cr_assert(strstr(err, "\" holds a NUL byte"), "%s", err);
  config_free(&c);
}

Test(config, policy_names) {
  Rlorch__V1__BroadcastMode m;
  const char *names[] = {"auto", "direct", "staged", "host"};
  for (size_t i = 0; i < 4; i++) {
    cr_assert_eq(config_policy_parse(names[i], &m), 0);
    cr_assert_str_eq(config_policy_name(m), names[i]);
  }
  cr_assert_eq(config_policy_parse("unspecified", &m), -1);
  cr_assert_eq(config_policy_parse(NULL, &m), -1);
}
