/* `rlorch bench broadcast`: its flags, and a host-mode run through
 * bcast_engine_execute whose --json line keeps the keys and order that
 * scripts read. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "workers/bcast/bcast.h"

typedef struct captured {
  int rc;
  char out[8192], err[8192];
} captured;

static void slurp(FILE *f, char *buf, size_t cap) {
  rewind(f);
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = 0;
  fclose(f);
}

/* Runs bench_broadcast in this process with stdout and stderr sent to files. */
static void run(captured *c, const char *const *args) {
  char *argv[32];
  int argc = 0;
  argv[argc++] = "broadcast";
  for (; *args; args++) argv[argc++] = (char *)*args;
  argv[argc] = NULL;
  FILE *o = tmpfile(), *e = tmpfile();
  cr_assert(o && e);
  fflush(stdout);
  fflush(stderr);
  int so = dup(1), se = dup(2);
  cr_assert(so >= 0 && se >= 0);
  dup2(fileno(o), 1);
  dup2(fileno(e), 2);
  c->rc = bench_broadcast(argc, argv);
  fflush(stdout);
  fflush(stderr);
  dup2(so, 1);
  dup2(se, 2);
  close(so);
  close(se);
  slurp(o, c->out, sizeof c->out);
  slurp(e, c->err, sizeof c->err);
}

Test(bench_broadcast, help_goes_to_stdout_and_exits_0) {
  captured c;
  run(&c, (const char *[]){"--help", NULL});
  cr_assert_eq(c.rc, 0);
  const char *must[] = {"usage: rlorch bench broadcast [FLAGS]\n",
                        "  --mode MODE ", "direct|staged|host|colocated (default staged)\n",
                        "  --preset P ", "(default 100m)\n", "  --reps N ", "(default 5)\n",
                        "  --budget-mib M ", "(default 256)\n", "(default 0: all)\n",
                        "  --json ", "  RLORCH_PRESET ", "  RLORCH_MODE ", "  RLORCH_REPS ",
                        "  RLORCH_BUDGET_MIB ", "  RLORCH_LAYERS ", "  RLORCH_JSON "};
  for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
    cr_assert(strstr(c.out, must[i]), "--help lacks \"%s\":\n%s", must[i], c.out);
  cr_assert_eq(c.err[0], 0, "%s", c.err);
}

static void bad(const char *const *args, const char *want) {
  captured c;
  run(&c, args);
  cr_assert_eq(c.rc, 2, "rc %d for %s", c.rc, want);
  cr_assert_str_eq(c.err, want);
  cr_assert_eq(c.out[0], 0, "nothing on stdout for bad flags: %s", c.out);
}

static double num(const char *json, const char *key, const char **after);

#define BB "rlorch bench broadcast: "
Test(bench_broadcast, bad_flags_are_named) {
  bad((const char *[]){"--mode", "bogus", NULL},
      BB "--mode: invalid value \"bogus\" (want direct|staged|host|colocated)\n");
  bad((const char *[]){"--mode", "auto", NULL},
      BB "--mode: invalid value \"auto\" (want direct|staged|host|colocated)\n");
  bad((const char *[]){"--preset", "3b", NULL},
      BB "--preset: unknown preset \"3b\" (want 100m, 1b, 4b, 8b)\n");
  bad((const char *[]){"--reps", "0", NULL}, BB "--reps: 0 out of range [1, 1000]\n");
  bad((const char *[]){"--reps", "1001", NULL}, BB "--reps: 1001 out of range [1, 1000]\n");
  bad((const char *[]){"--reps", "5x", NULL}, BB "--reps: not an integer: \"5x\"\n");
  bad((const char *[]){"--budget-mib", "-1", NULL}, BB "--budget-mib: not an integer: \"-1\"\n");
  bad((const char *[]){"--budget-mib", "0", NULL},
      BB "--budget-mib: 0 out of range [1, 1048576]\n");
  bad((const char *[]){"--layers", "two", NULL}, BB "--layers: not an integer: \"two\"\n");
  bad((const char *[]){"--reps", NULL}, BB "--reps: missing value\n");
  bad((const char *[]){"--frobnicate", "1", NULL}, BB "--frobnicate: unknown flag (see --help)\n");
  bad((const char *[]){"--json=maybe", NULL},
      BB "--json: invalid value \"maybe\" (want true|false)\n");
}

/* The environment is read below the flags, and a bad variable is named. */
Test(bench_broadcast, environment_is_read_and_named) {
  cr_assert_eq(setenv("RLORCH_PRESET", "3b", 1), 0);
  bad((const char *[]){NULL}, BB "RLORCH_PRESET: unknown preset \"3b\" (want 100m, 1b, 4b, 8b)\n");
  cr_assert_eq(unsetenv("RLORCH_PRESET"), 0);
  cr_assert_eq(setenv("RLORCH_REPS", "0", 1), 0);
  bad((const char *[]){NULL}, BB "RLORCH_REPS: 0 out of range [1, 1000]\n");
  cr_assert_eq(unsetenv("RLORCH_REPS"), 0);
  cr_assert_eq(setenv("RLORCH_MODE", "gpu", 1), 0);
  bad((const char *[]){NULL}, BB "RLORCH_MODE: invalid value \"gpu\" (want direct|staged|host|colocated)\n");
  cr_assert_eq(unsetenv("RLORCH_MODE"), 0);
  /* A good environment for a host run that the flags then partly override. */
  cr_assert_eq(setenv("RLORCH_MODE", "host", 1), 0);
  cr_assert_eq(setenv("RLORCH_LAYERS", "1", 1), 0);
  cr_assert_eq(setenv("RLORCH_REPS", "9", 1), 0);
  cr_assert_eq(setenv("RLORCH_BUDGET_MIB", "16", 1), 0);
  cr_assert_eq(setenv("RLORCH_JSON", "true", 1), 0);
  captured c, big;
  run(&c, (const char *[]){"--reps", "1", NULL});
  run(&big, (const char *[]){"--reps", "1", "--budget-mib", "256", NULL});
  const char *vars[] = {"RLORCH_MODE", "RLORCH_LAYERS", "RLORCH_REPS", "RLORCH_BUDGET_MIB",
                        "RLORCH_JSON"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) cr_assert_eq(unsetenv(vars[i]), 0);
  cr_assert_eq(c.rc, 0, "stderr: %s", c.err);
  cr_assert_eq(big.rc, 0, "stderr: %s", big.err);
  const char *head = "{\"bench\":\"broadcast\",\"preset\":\"100m\",\"mode\":\"host\",\"reps\":1,";
  cr_assert(!strncmp(c.out, head, strlen(head)), "the flag beats RLORCH_REPS: %s", c.out);
  const char *at = c.out, *at_big = big.out;
  double small_buckets = num(c.out, "buckets", &at), big_buckets = num(big.out, "buckets", &at_big);
  cr_assert(small_buckets > big_buckets, "RLORCH_BUDGET_MIB=16 makes more buckets than the flag's "
            "256 MiB: %s\n%s", c.out, big.out);
}
#undef BB

/* The value of "key": in a one-line JSON object, which must follow `after`. */
static double num(const char *json, const char *key, const char **after) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(*after, pat);
  cr_assert(p, "key %s missing or out of order in %s", key, json);
  *after = p + strlen(pat);
  return strtod(*after, NULL);
}

Test(bench_broadcast, host_mode_json_keeps_its_keys) {
  captured c;
  run(&c, (const char *[]){"--preset", "100m", "--mode", "host", "--layers", "1", "--reps", "2",
                           "--budget-mib", "16", "--json", NULL});
  cr_assert_eq(c.rc, 0, "stderr: %s", c.err);
  const char *j = c.out, *at = j;
  const char *head = "{\"bench\":\"broadcast\",\"preset\":\"100m\",\"mode\":\"host\",\"reps\":2,";
  cr_assert(!strncmp(j, head, strlen(head)), "%s", j);
  cr_assert(num(j, "params", &at) > 0);
  double wire = num(j, "wire_bytes", &at);
  cr_assert_eq(num(j, "pcie_bytes", &at), 0, "pageable host tensors cross no PCIe");
  cr_assert(num(j, "buckets", &at) > 1, "a 16 MiB budget splits the embedding");
  cr_assert(strstr(at, "\"floor\":\"memcpy+socket\""), "%s", j);
  double floor_s = num(j, "floor_s", &at), gbps = num(j, "floor_gbps", &at);
  double engine_s = num(j, "engine_s", &at), ratio = num(j, "ratio", &at);
  cr_assert(floor_s > 0 && engine_s > 0, "%s", j);
  cr_assert_float_eq(gbps, wire / floor_s / 1e9, 0.01, "%s", j);
  cr_assert_float_eq(ratio, engine_s / floor_s, 1e-3 + 1e-3 * ratio, "%s", j);
  const char *rest[] = {"h2d_s", "cast_s", "wire_s", "wire_alone_s", "exposed_s", "rx_scatter_s"};
  for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) cr_assert(num(j, rest[i], &at) >= 0);
  cr_assert(num(j, "wire_s", &(const char *){j}) > 0, "the engine's stats came back: %s", j);
  cr_assert(!strstr(j, "pytorch_reference_s"), "the reference is for the GPU modes only");
  cr_assert(!strcmp(at + strcspn(at, "}"), "}\n"), "one line: %s", j);
}

/* --senders: one plan per sender count, 1, 2, ... N, beside the one sender
 * of the same bytes; the ratios are those of the times printed. */
Test(bench_broadcast, sharded_senders_json_runs_each_count_beside_one_sender) {
  captured c;
  run(&c, (const char *[]){"--mode", "host", "--senders", "3", "--receivers", "1", "--layers", "1", "--reps", "1",
                           "--budget-mib", "16", "--json", NULL});
  cr_assert_eq(c.rc, 0, "stderr: %s", c.err);
  const char *j = c.out, *at = j;
  const char *head = "{\"bench\":\"broadcast\",\"preset\":\"100m\",\"mode\":\"host\",\"reps\":1,";
  cr_assert(!strncmp(j, head, strlen(head)), "%s", j);
  double wire = num(j, "wire_bytes", &at);
  cr_assert_eq(num(j, "receivers", &at), 1);
  cr_assert(strstr(at, "\"baseline\":\"one sender\""), "%s", j);
  double base = 0;
  const uint32_t want[] = {1, 2, 3};
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(num(j, "senders", &at), want[i], "%s", j);
    double s = num(j, "engine_s", &at), gbps = num(j, "gbps", &at), ratio = num(j, "ratio", &at);
    double model = num(j, "model_ratio", &at);
    if (i == 0) base = s;
    cr_assert(s > 0, "%s", j);
    cr_assert_float_eq(gbps, wire / s / 1e9, 0.01, "%s", j);
    cr_assert_float_eq(ratio, s / base, 1e-3 + 1e-3 * ratio, "%s", j);
    /* dim-0 shards of 1/N of the rows each: the largest source has about 1/N. */
    cr_assert(model > 0.95 / want[i] && model < 1.1 / want[i], "model ratio %.4f for %u senders", model, want[i]);
  }
  cr_assert(!strcmp(at + strcspn(at, "]"), "]}\n"), "one line: %s", j);
  bad((const char *[]){"--mode", "staged", "--senders", "2", NULL},
      "rlorch bench broadcast: --senders: sharded senders run on the host transport or colocated (--mode "
      "host|colocated)\n");
  bad((const char *[]){"--mode", "host", "--senders", "17", NULL},
      "rlorch bench broadcast: --senders: 17 out of range [0, 16]\n");
}

/* --relays: the direct fan-out and the relay layout, same run; the ratio
 * is that of the two times printed, the sender's bytes those of each layout. */
Test(bench_broadcast, relays_json_runs_beside_the_direct_fan_out) {
  captured c;
  run(&c, (const char *[]){"--mode", "host", "--relays", "2", "--receivers", "4", "--layers", "1", "--reps", "1",
                           "--budget-mib", "16", "--json", NULL});
  cr_assert_eq(c.rc, 0, "stderr: %s", c.err);
  const char *j = c.out, *at = j;
  const char *head = "{\"bench\":\"broadcast\",\"preset\":\"100m\",\"mode\":\"host\",\"reps\":1,";
  cr_assert(!strncmp(j, head, strlen(head)), "%s", j);
  double wire = num(j, "wire_bytes", &at);
  cr_assert_eq(num(j, "receivers", &at), 4);
  cr_assert_eq(num(j, "relays", &at), 2);
  cr_assert(strstr(at, "\"baseline\":\"direct fan-out\""), "%s", j);
  double direct = num(j, "direct_s", &at), relays = num(j, "relays_s", &at), ratio = num(j, "ratio", &at);
  cr_assert(direct > 0 && relays > 0, "%s", j);
  cr_assert_float_eq(ratio, relays / direct, 1e-3 + 1e-3 * ratio, "%s", j);
  cr_assert_eq(num(j, "direct_source_bytes", &at), wire * 4, "%s", j);
  cr_assert_eq(num(j, "relays_source_bytes", &at), wire * 2, "%s", j);
  bad((const char *[]){"--mode", "staged", "--relays", "2", NULL},
      "rlorch bench broadcast: --relays: relays run on the host transport (--mode host)\n");
  bad((const char *[]){"--mode", "host", "--relays", "2", "--senders", "2", NULL},
      "rlorch bench broadcast: --relays: relays take one sender (no --senders)\n");
  bad((const char *[]){"--mode", "host", "--relays", "3", "--receivers", "2", NULL},
      "rlorch bench broadcast: --relays: 3 relays among 2 receivers: at most one relay per receiver\n");
}

/* Direct needs two GPUs: here it either runs or says what is missing. */
Test(bench_broadcast, direct_mode_runs_or_says_what_is_missing) {
  bcast_caps caps;
  bcast_caps_probe(&caps);
  captured c;
  run(&c, (const char *[]){"--preset", "100m", "--mode", "direct", "--layers", "1", "--reps", "1",
                           "--json", NULL});
  if (caps.cuda_built && caps.nccl_built && caps.cuda_devices >= 2) {
    cr_assert_eq(c.rc, 0, "stderr: %s", c.err);
    cr_assert(strstr(c.out, "\"floor\":\"wire\""), "%s", c.out);
    return;
  }
  cr_assert_eq(c.rc, 1);
  cr_assert(strstr(c.err, caps.cuda_built && caps.nccl_built ? "--mode direct needs 2 CUDA devices"
                                                              : "--mode direct needs a build with CUDA"),
            "%s", c.err);
  cr_assert_eq(c.out[0], 0);
}

/* Colocated --senders needs a GPU: with one it prints each sender count
 * beside one sender and the master's floor, measured in the run; without,
 * it says what is missing and prints nothing. */
Test(bench_broadcast, colocated_senders_run_or_say_what_is_missing) {
  bcast_caps caps;
  bcast_caps_probe(&caps);
  char why[256];
  captured c;
  run(&c, (const char *[]){"--mode", "colocated", "--senders", "2", "--receivers", "2", "--master", "gpu",
                           "--layers", "1", "--reps", "1", "--budget-mib", "16", "--json", NULL});
  if (bcast_mode_available(&caps, BCAST_MODE_COLOCATED, why, sizeof why)) {
    cr_assert_eq(c.rc, 0, "stderr: %s", c.err);
    const char *j = c.out, *at = j;
    const char *head = "{\"bench\":\"broadcast\",\"preset\":\"100m\",\"mode\":\"colocated\",\"master\":\"gpu\",";
    cr_assert(!strncmp(j, head, strlen(head)), "%s", j);
    cr_assert(strstr(j, "\"floor\":\"d2d\""), "%s", j);
    double floor_s = num(j, "floor_s", &at), base = 0;
    cr_assert(floor_s > 0, "%s", j);
    for (uint32_t want = 1; want <= 2; want++) {
      cr_assert_eq(num(j, "senders", &at), want, "%s", j);
      double s = num(j, "engine_s", &at);
      num(j, "gbps", &at);
      num(j, "ratio", &at);
      double fr = num(j, "floor_ratio", &at);
      if (want == 1) base = s;
      cr_assert(s > 0 && base > 0, "%s", j);
      cr_assert_float_eq(fr, s / floor_s, 1e-3 + 1e-3 * fr, "%s", j);
    }
    return;
  }
  cr_assert_eq(c.rc, 1);
  cr_assert(strstr(c.err, caps.cuda_built ? "--mode colocated unavailable: " : "--mode colocated needs a build "
                                                                                 "with CUDA"),
            "%s", c.err);
  cr_assert_eq(c.out[0], 0);
}
