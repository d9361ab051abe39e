/* Flags and environment of `rlorch trainer` and `rlorch inference`. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "orchestrator/cli/agent_flags.h"

#define ARGV(...) ((char *[]){"x", __VA_ARGS__, NULL})
#define ARGC(...) ((int)(sizeof((char *[]){"x", __VA_ARGS__}) / sizeof(char *)))
#define PARSE(role, o, err, ...) \
  agent_flags_parse(role, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), NULL, o, err, sizeof err)
#define PARSE_ENV(role, envp, o, err, ...) \
  agent_flags_parse(role, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), envp, o, err, sizeof err)

static void expect_error_env(agent_role role, char **envp, int argc, char **argv,
                             const char *needle) {
  agent_flags o;
  char err[512] = "";
  cr_assert_eq(agent_flags_parse(role, argc, argv, envp, &o, err, sizeof err), -1,
               "accepted, wanted '%s'", needle);
  cr_assert(strstr(err, needle), "error '%s' does not name '%s'", err, needle);
  const char *prefix = role == AGENT_ROLE_TRAINER ? "rlorch trainer: " : "rlorch inference: ";
  cr_assert(!strncmp(err, prefix, strlen(prefix)), "error '%s' does not start with '%s'", err,
            prefix);
  agent_flags_free(&o);
}

static void expect_error(agent_role role, int argc, char **argv, const char *needle) {
  expect_error_env(role, NULL, argc, argv, needle);
}
#define EXPECT_ERROR(role, needle, ...) expect_error(role, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), needle)

Test(agent_opts, trainer_defaults_and_values) {
  agent_flags o;
  char err[256];
  cr_assert_eq(PARSE(AGENT_ROLE_TRAINER, &o, err, "--orchestrator", "127.0.0.1:7070"), 0, "%s", err);
  cr_assert_str_eq(o.opts.orchestrator, "127.0.0.1:7070");
  cr_assert_str_eq(o.opts.preset, "100m");
  cr_assert_eq(o.opts.offload, AGENT_OFFLOAD_NONE);
  cr_assert_eq(o.opts.device_set, 0);
  agent_flags_free(&o);
  cr_assert_eq(PARSE(AGENT_ROLE_TRAINER, &o, err, "--orchestrator=h:1", "--preset", "1b",
                     "--offload=params+optimizer", "--device", "-1", "--data-listen",
                     "0.0.0.0:9000", "--name", "t0", "--log-level", "debug", "--log-format",
                     "json", "--threads", "3", "--layers", "2"),
               0, "%s", err);
  cr_assert_str_eq(o.opts.orchestrator, "h:1");
  cr_assert_str_eq(o.opts.preset, "1b");
  cr_assert_eq(o.opts.offload, AGENT_OFFLOAD_PARAMS_OPTIMIZER);
  cr_assert_eq(o.opts.device, -1);
  cr_assert_eq(o.opts.device_set, 1);
  cr_assert_str_eq(o.opts.data_listen, "0.0.0.0:9000");
  cr_assert_str_eq(o.opts.name, "t0");
  cr_assert_eq(o.log_level, LOG_DEBUG);
  cr_assert_eq(o.log_format, LOG_FORMAT_JSON);
  cr_assert_eq(o.opts.threads, 3);
  cr_assert_eq(o.opts.max_layers, 2u);
  cr_assert_str_eq(agent_offload_name(o.opts.offload), "params+optimizer");
  agent_flags_free(&o);
}

Test(agent_opts, inference_values) {
  agent_flags o;
  char err[256];
  cr_assert_eq(PARSE(AGENT_ROLE_INFERENCE, &o, err, "--orchestrator", "a:1", "--tokens-mean",
                     "100", "--tokens-std", "0", "--latency-ms-mean", "0.5", "--latency-ms-std",
                     "0.1", "--distribution", "normal", "--seed", "9", "--concurrency", "32",
                     "--vocab-size", "50"),
               0, "%s", err);
  cr_assert_eq(o.opts.rollout.vocab_size, 50u);
  cr_assert_float_eq(o.opts.rollout.tokens_mean, 100, 1e-9);
  cr_assert_float_eq(o.opts.rollout.tokens_std, 0, 1e-9);
  cr_assert_float_eq(o.opts.rollout.latency_ms_mean, 0.5, 1e-9);
  cr_assert_eq(o.opts.rollout.dist, AGENT_DIST_NORMAL);
  cr_assert_eq(o.opts.seed, 9u);
  cr_assert_eq(o.opts.seed_set, 1);
  cr_assert_eq(o.opts.concurrency, 32);
  agent_flags_free(&o);
  cr_assert_eq(PARSE(AGENT_ROLE_INFERENCE, &o, err, "--orchestrator", "a:1"), 0, "%s", err);
  cr_assert_eq(o.opts.concurrency, 8, "the orchestrator's default max_requests_per_worker");
  cr_assert_eq(o.opts.rollout.vocab_size, 32000u);
  cr_assert_null(o.opts.reward, "the built-in reward unless the embedding program sets one");
  agent_flags_free(&o);
}

/* A rank of a tensor-parallel engine: its rank, the engine's size, the
 * trainer's model whose tensors it slices. */
Test(agent_opts, inference_tensor_parallel) {
  agent_flags o;
  char err[256];
  cr_assert_eq(PARSE(AGENT_ROLE_INFERENCE, &o, err, "--orchestrator", "a:1"), 0, "%s", err);
  cr_assert_eq(o.opts.tp_size, 0u, "every tensor whole unless --tp-size says otherwise");
  cr_assert_eq(o.opts.tp_rank, 0u);
  agent_flags_free(&o);
  cr_assert_eq(PARSE(AGENT_ROLE_INFERENCE, &o, err, "--orchestrator", "a:1", "--tp-size", "4",
                     "--tp-rank", "3", "--preset", "1b", "--layers", "2"),
               0, "%s", err);
  cr_assert_eq(o.opts.tp_size, 4u);
  cr_assert_eq(o.opts.tp_rank, 3u);
  cr_assert_str_eq(o.opts.preset, "1b");
  cr_assert_eq(o.opts.max_layers, 2u);
  agent_flags_free(&o);
  char *envp[] = {"RLORCH_TP_SIZE=2", "RLORCH_TP_RANK=1", NULL};
  cr_assert_eq(PARSE_ENV(AGENT_ROLE_INFERENCE, envp, &o, err, "--orchestrator", "a:1"), 0, "%s", err);
  cr_assert_eq(o.opts.tp_size, 2u, "from the environment");
  cr_assert_eq(o.opts.tp_rank, 1u);
  agent_flags_free(&o);
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--tp-rank: 2 is not below --tp-size 2", "--orchestrator",
               "a:1", "--tp-size", "2", "--tp-rank", "2");
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--tp-rank: 1 is not below --tp-size 0", "--orchestrator",
               "a:1", "--tp-rank", "1");
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--preset: unknown preset \"2b\"", "--orchestrator", "a:1",
               "--tp-size", "2", "--preset", "2b");
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--tp-size", "--orchestrator", "a:1", "--tp-size", "1025");
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--tp-rank", "--orchestrator", "a:1", "--tp-rank", "x");
  /* The trainer has no such flag. */
  EXPECT_ERROR(AGENT_ROLE_TRAINER, "--tp-size", "--orchestrator", "a:1", "--tp-size", "2");
}

static char *usage_text(agent_role role) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  agent_flags_usage(role, f);
  fclose(f);
  return text;
}

Test(agent_opts, help) {
  agent_flags o;
  char err[256];
  cr_assert_eq(PARSE(AGENT_ROLE_TRAINER, &o, err, "--help"), 1);
  agent_flags_free(&o);
  /* --help wins over a bad value: the user asked for the text. */
  cr_assert_eq(PARSE(AGENT_ROLE_TRAINER, &o, err, "--device", "x", "--help"), 1);
  agent_flags_free(&o);
  char *tr = usage_text(AGENT_ROLE_TRAINER), *inf = usage_text(AGENT_ROLE_INFERENCE);
  const char *tr_must[] = {"usage: rlorch trainer", "--offload O", "(default none)",
                           "--preset P", "(default 100m)", "RLORCH_ORCHESTRATOR",
                           "RLORCH_TOKEN_FILE", "RLORCH_DATA_LISTEN", "RLORCH_DEVICE",
                           "RLORCH_LOG_LEVEL", "(required)"};
  for (size_t i = 0; i < sizeof tr_must / sizeof tr_must[0]; i++)
    cr_assert(strstr(tr, tr_must[i]), "trainer usage lacks %s:\n%s", tr_must[i], tr);
  cr_assert(strstr(inf, "--tokens-mean X"), "%s", inf);
  cr_assert(strstr(inf, "RLORCH_TOKENS_MEAN"), "%s", inf);
  cr_assert_null(strstr(inf, "--offload"), "inference usage lists a trainer flag:\n%s", inf);
  free(tr);
  free(inf);
}

Test(agent_opts, environment_below_flags) {
  agent_flags o;
  char err[512];
  char *envp[] = {"PATH=/bin", "RLORCH_ORCHESTRATOR=env-host:7070", "RLORCH_DEVICE=-1",
                  "RLORCH_DATA_LISTEN=0.0.0.0:7075", "RLORCH_LOG_LEVEL=warn",
                  "RLORCH_OFFLOAD=params", "RLORCH_SEED=5", "RLORCH_NAME=from-env", NULL};
  cr_assert_eq(PARSE_ENV(AGENT_ROLE_TRAINER, envp, &o, err, "--name", "from-flag"), 0, "%s", err);
  cr_assert_str_eq(o.opts.orchestrator, "env-host:7070");
  cr_assert_eq(o.opts.device, -1);
  cr_assert_eq(o.opts.device_set, 1, "a device from the environment counts as set");
  cr_assert_str_eq(o.opts.data_listen, "0.0.0.0:7075");
  cr_assert_eq(o.log_level, LOG_WARN);
  cr_assert_eq(o.opts.offload, AGENT_OFFLOAD_PARAMS);
  cr_assert_eq(o.opts.seed_set, 1);
  cr_assert_str_eq(o.opts.name, "from-flag", "a flag beats the environment");
  agent_flags_free(&o);
  /* The same environment for an inference agent: shared names apply, trainer
   * ones are ignored rather than refused (one env file serves both). */
  cr_assert_eq(PARSE_ENV(AGENT_ROLE_INFERENCE, envp, &o, err, "--seed", "2"), 0, "%s", err);
  cr_assert_str_eq(o.opts.orchestrator, "env-host:7070");
  cr_assert_str_eq(o.opts.name, "from-env");
  agent_flags_free(&o);
}

/* Kubernetes services and systemd sockets are reached through gRPC's own
 * schemes: the address goes to the channel as given, from a flag or a variable. */
Test(agent_opts, orchestrator_takes_grpc_targets) {
  const char *targets[] = {"dns:///orchestrator.rlorch.svc:7070", "unix:/run/rlorch.sock",
                           "unix-abstract:rlorch", "ipv4:10.0.0.5:7070", "ipv6:[::1]:7070",
                           "[::1]:7070"};
  for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
    agent_flags o;
    char err[512];
    for (int role = 0; role < 2; role++) {
      agent_role r = role ? AGENT_ROLE_INFERENCE : AGENT_ROLE_TRAINER;
      cr_assert_eq(PARSE(r, &o, err, "--orchestrator", (char *)targets[i]), 0, "%s", err);
      cr_assert_str_eq(o.opts.orchestrator, targets[i]);
      agent_flags_free(&o);
    }
    char var[128];
    snprintf(var, sizeof var, "RLORCH_ORCHESTRATOR=%s", targets[i]);
    char *envp[] = {var, NULL};
    cr_assert_eq(PARSE_ENV(AGENT_ROLE_TRAINER, envp, &o, err, "--name", "t"), 0, "%s", err);
    cr_assert_str_eq(o.opts.orchestrator, targets[i]);
    agent_flags_free(&o);
  }
  EXPECT_ERROR(AGENT_ROLE_TRAINER, "--orchestrator: invalid gRPC target \"dns:///\"",
               "--orchestrator", "dns:///");
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--orchestrator: invalid gRPC target \"http://h:7070\"",
               "--orchestrator", "http://h:7070");
  char *bad[] = {"RLORCH_ORCHESTRATOR=unix:", NULL};
  expect_error_env(AGENT_ROLE_INFERENCE, bad, ARGC("--name", "i"), ARGV("--name", "i"),
                   "RLORCH_ORCHESTRATOR: invalid gRPC target \"unix:\"");
}

Test(agent_opts, token_file_from_environment) {
  char path[64];
  snprintf(path, sizeof path, "%s/rlorch_agent_tok_XXXXXX", P_tmpdir);
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, "  tok\n", 6), 6);
  close(fd);
  char var[96];
  snprintf(var, sizeof var, "RLORCH_TOKEN_FILE=%s", path);
  char *envp[] = {"RLORCH_ORCHESTRATOR=a:1", var, NULL};
  agent_flags o;
  char err[512];
  cr_assert_eq(PARSE_ENV(AGENT_ROLE_INFERENCE, envp, &o, err, "--seed", "3"), 0, "%s", err);
  cr_assert_str_eq(o.opts.token_file, path);
  cr_assert_str_eq(o.opts.token, "tok", "read once, trimmed, and handed to the agent");
  agent_flags_free(&o);
  cr_assert_null(o.opts.token, "freed with the flags");
  /* Longer than an agent holds: refused at parse time, naming the variable. */
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  for (int i = 0; i < AGENT_TOKEN_MAX; i++) fputc('x', f);
  fclose(f);
  expect_error_env(AGENT_ROLE_INFERENCE, envp, ARGC("--seed", "3"), ARGV("--seed", "3"),
                   "is larger than 1022 bytes");
  unlink(path);
  /* The file is gone: the variable is named. */
  expect_error_env(AGENT_ROLE_INFERENCE, envp, ARGC("--seed", "3"), ARGV("--seed", "3"),
                   "RLORCH_TOKEN_FILE: cannot read");
}

Test(agent_opts, environment_errors_name_the_variable) {
  char *bad_device[] = {"RLORCH_ORCHESTRATOR=a:1", "RLORCH_DEVICE=gpu0", NULL};
  expect_error_env(AGENT_ROLE_TRAINER, bad_device, ARGC("--name", "t"), ARGV("--name", "t"),
                   "RLORCH_DEVICE: not an integer: \"gpu0\"");
  char *bad_addr[] = {"RLORCH_ORCHESTRATOR=nohost", NULL};
  expect_error_env(AGENT_ROLE_INFERENCE, bad_addr, ARGC("--name", "i"), ARGV("--name", "i"),
                   "RLORCH_ORCHESTRATOR: invalid gRPC target \"nohost\" (want HOST:PORT, or dns:");
  char *bad_level[] = {"RLORCH_ORCHESTRATOR=a:1", "RLORCH_LOG_LEVEL=loud", NULL};
  expect_error_env(AGENT_ROLE_INFERENCE, bad_level, ARGC("--name", "i"), ARGV("--name", "i"),
                   "RLORCH_LOG_LEVEL: invalid value \"loud\"");
  char *bad_mean[] = {"RLORCH_ORCHESTRATOR=a:1", "RLORCH_TOKENS_MEAN=0", NULL};
  expect_error_env(AGENT_ROLE_INFERENCE, bad_mean, ARGC("--name", "i"), ARGV("--name", "i"),
                   "RLORCH_TOKENS_MEAN: 0 out of range");
  /* Every source is checked, also one a flag overrides: a broken environment
   * is found before it bites another command. */
  expect_error_env(AGENT_ROLE_TRAINER, bad_device, ARGC("--device", "0"), ARGV("--device", "0"),
                   "RLORCH_DEVICE");
  /* Missing orchestrator names the flag and the variable. */
  expect_error_env(AGENT_ROLE_TRAINER, NULL, ARGC("--name", "t"), ARGV("--name", "t"),
                   "--orchestrator: required: set it or RLORCH_ORCHESTRATOR");
}

Test(agent_opts, errors_name_the_flag) {
  EXPECT_ERROR(AGENT_ROLE_TRAINER, "--orchestrator", "--name", "x");
  EXPECT_ERROR(AGENT_ROLE_TRAINER, "--offload", "--orchestrator", "a:1", "--offload", "gpu");
  EXPECT_ERROR(AGENT_ROLE_TRAINER, "--preset", "--orchestrator", "a:1", "--preset", "70b");
  EXPECT_ERROR(AGENT_ROLE_TRAINER, "--device", "--orchestrator", "a:1", "--device", "x1");
  EXPECT_ERROR(AGENT_ROLE_TRAINER, "--device", "--orchestrator", "a:1", "--device", "-2");
  EXPECT_ERROR(AGENT_ROLE_TRAINER, "--data-listen", "--orchestrator", "a:1", "--data-listen", "nope");
  EXPECT_ERROR(AGENT_ROLE_TRAINER, "--log-level", "--orchestrator", "a:1", "--log-level", "loud");
  EXPECT_ERROR(AGENT_ROLE_TRAINER, "--log-format", "--orchestrator", "a:1", "--log-format=xml");
  EXPECT_ERROR(AGENT_ROLE_TRAINER, "--bogus", "--orchestrator", "a:1", "--bogus", "1");
  EXPECT_ERROR(AGENT_ROLE_TRAINER, "--device", "--orchestrator", "a:1", "--device");
  EXPECT_ERROR(AGENT_ROLE_TRAINER, "stray", "--orchestrator", "a:1", "stray");
  /* Inference flags are not trainer flags and the other way round. */
  EXPECT_ERROR(AGENT_ROLE_TRAINER, "--tokens-mean", "--orchestrator", "a:1", "--tokens-mean", "5");
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--offload", "--orchestrator", "a:1", "--offload", "none");
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--tokens-mean", "--orchestrator", "a:1", "--tokens-mean", "abc");
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--tokens-mean", "--orchestrator", "a:1", "--tokens-mean", "0");
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--latency-ms-mean", "--orchestrator", "a:1",
               "--latency-ms-mean", "-3");
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--latency-ms-std", "--orchestrator", "a:1",
               "--latency-ms-std", "inf");
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--distribution", "--orchestrator", "a:1",
               "--distribution", "gamma");
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--seed", "--orchestrator", "a:1", "--seed", "-1");
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--concurrency", "--orchestrator", "a:1", "--concurrency", "0");
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--concurrency", "--orchestrator", "a:1", "--concurrency",
               "1025");
  EXPECT_ERROR(AGENT_ROLE_TRAINER, "--concurrency", "--orchestrator", "a:1", "--concurrency", "4");
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--vocab-size", "--orchestrator", "a:1", "--vocab-size", "1");
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--tokens-mean", "--orchestrator", "a:1", "--tokens-mean",
               "2e6");
}

/* The bf16 shadow: on by default, off by flag or variable, a flag beating the
 * variable, a bad value named with its origin, and no such setting on an
 * inference agent. */
Test(agent_opts, bf16_shadow) {
  agent_flags o;
  char err[512];
  cr_assert_eq(PARSE(AGENT_ROLE_TRAINER, &o, err, "--orchestrator", "a:1"), 0, "%s", err);
  cr_assert_eq(o.opts.bf16_shadow, 1, "on unless turned off");
  agent_flags_free(&o);
  cr_assert_eq(PARSE(AGENT_ROLE_TRAINER, &o, err, "--orchestrator", "a:1", "--offload",
                     "params+optimizer", "--bf16-shadow", "off"),
               0, "%s", err);
  cr_assert_eq(o.opts.bf16_shadow, 0);
  agent_flags_free(&o);
  char *envp[] = {"RLORCH_ORCHESTRATOR=a:1", "RLORCH_BF16_SHADOW=off", NULL};
  cr_assert_eq(PARSE_ENV(AGENT_ROLE_TRAINER, envp, &o, err, "--name", "t"), 0, "%s", err);
  cr_assert_eq(o.opts.bf16_shadow, 0, "off from the environment");
  agent_flags_free(&o);
  cr_assert_eq(PARSE_ENV(AGENT_ROLE_TRAINER, envp, &o, err, "--bf16-shadow=on"), 0, "%s", err);
  cr_assert_eq(o.opts.bf16_shadow, 1, "a flag beats the environment");
  agent_flags_free(&o);
  EXPECT_ERROR(AGENT_ROLE_TRAINER, "--bf16-shadow", "--orchestrator", "a:1", "--bf16-shadow",
               "yes");
  char *bad[] = {"RLORCH_ORCHESTRATOR=a:1", "RLORCH_BF16_SHADOW=2", NULL};
  expect_error_env(AGENT_ROLE_TRAINER, bad, ARGC("--name", "t"), ARGV("--name", "t"),
                   "RLORCH_BF16_SHADOW");
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--bf16-shadow", "--orchestrator", "a:1", "--bf16-shadow",
               "on");
}

/* TLS to the orchestrator, from flags or the environment (as the token and
 * the address): the CA, and a client certificate with its key. */
Test(agent_opts, tls_from_flags_and_environment) {
  char ca[64], crt[64], key[64];
  char *paths[] = {ca, crt, key};
  for (int i = 0; i < 3; i++) {
    snprintf(paths[i], 64, "%s/rlorch_agent_tls_XXXXXX", P_tmpdir);
    int fd = mkstemp(paths[i]);
    cr_assert_geq(fd, 0);
    close(fd);
  }
  char vca[96], vcrt[96], vkey[96];
  snprintf(vca, sizeof vca, "RLORCH_TLS_CA_FILE=%s", ca);
  snprintf(vcrt, sizeof vcrt, "RLORCH_TLS_CLIENT_CERT_FILE=%s", crt);
  snprintf(vkey, sizeof vkey, "RLORCH_TLS_CLIENT_KEY_FILE=%s", key);
  char *envp[] = {"RLORCH_ORCHESTRATOR=orch:7070", vca, vcrt, vkey, NULL};
  agent_flags o;
  char err[512];
  for (int role = 0; role < 2; role++) {
    agent_role r = role ? AGENT_ROLE_INFERENCE : AGENT_ROLE_TRAINER;
    cr_assert_eq(PARSE_ENV(r, envp, &o, err, "--name", "w"), 0, "%s", err);
    cr_assert_str_eq(o.opts.tls_ca_file, ca);
    cr_assert_str_eq(o.opts.tls_client_cert_file, crt);
    cr_assert_str_eq(o.opts.tls_client_key_file, key);
    agent_flags_free(&o);
  }
  cr_assert_eq(PARSE(AGENT_ROLE_INFERENCE, &o, err, "--orchestrator", "a:1", "--tls-ca", ca), 0, "%s", err);
  cr_assert_str_eq(o.opts.tls_ca_file, ca);
  cr_assert_null(o.opts.tls_client_cert_file);
  agent_flags_free(&o);
  EXPECT_ERROR(AGENT_ROLE_INFERENCE, "--tls-client-cert: set without --tls-client-key", "--orchestrator", "a:1",
               "--tls-client-cert", crt);
  char *half[] = {"RLORCH_ORCHESTRATOR=a:1", vkey, NULL};
  expect_error_env(AGENT_ROLE_TRAINER, half, ARGC("--name", "t"), ARGV("--name", "t"),
                   "RLORCH_TLS_CLIENT_KEY_FILE: set without --tls-client-cert");
  EXPECT_ERROR(AGENT_ROLE_TRAINER, "--tls-ca: cannot read \"/nonexistent/ca.pem\"", "--orchestrator", "a:1",
               "--tls-ca", "/nonexistent/ca.pem");
  for (int i = 0; i < 3; i++) unlink(paths[i]);
}
