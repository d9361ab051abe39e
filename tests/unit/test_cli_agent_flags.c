/* Flags of `rlorch trainer` and `rlorch inference`. */
#include <criterion/criterion.h>
#include <string.h>

#include "orchestrator/cli/agent_flags.h"

#define ARGV(...) ((char *[]){"x", __VA_ARGS__, NULL})
#define ARGC(...) ((int)(sizeof((char *[]){"x", __VA_ARGS__}) / sizeof(char *)))
#define PARSE(role, o, err, ...) \
  agent_flags_parse(role, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), o, err, sizeof err)

static void expect_error(agent_role role, int argc, char **argv, const char *needle) {
  agent_flags o;
  char err[256] = "";
  cr_assert_eq(agent_flags_parse(role, argc, argv, &o, err, sizeof err), -1, "accepted, wanted '%s'",
               needle);
  cr_assert(strstr(err, needle), "error '%s' does not name '%s'", err, needle);
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
}

Test(agent_opts, inference_values) {
  agent_flags o;
  char err[256];
  cr_assert_eq(PARSE(AGENT_ROLE_INFERENCE, &o, err, "--orchestrator", "a:1", "--tokens-mean",
                     "100", "--tokens-std", "0", "--latency-ms-mean", "0.5", "--latency-ms-std",
                     "0.1", "--distribution", "normal", "--seed", "9"),
               0, "%s", err);
  cr_assert_float_eq(o.opts.rollout.tokens_mean, 100, 1e-9);
  cr_assert_float_eq(o.opts.rollout.tokens_std, 0, 1e-9);
  cr_assert_float_eq(o.opts.rollout.latency_ms_mean, 0.5, 1e-9);
  cr_assert_eq(o.opts.rollout.dist, AGENT_DIST_NORMAL);
  cr_assert_eq(o.opts.seed, 9u);
  cr_assert_eq(o.opts.seed_set, 1);
}

Test(agent_opts, help) {
  agent_flags o;
  char err[256];
  cr_assert_eq(PARSE(AGENT_ROLE_TRAINER, &o, err, "--help"), 1);
  cr_assert(strstr(agent_flags_usage(AGENT_ROLE_TRAINER), "--offload"));
  cr_assert(strstr(agent_flags_usage(AGENT_ROLE_INFERENCE), "--tokens-mean"));
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
}
