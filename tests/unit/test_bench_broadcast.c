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
  cr_assert(strstr(c.out, "usage: rlorch bench broadcast --preset"), "%s", c.out);
}

static void bad(const char *const *args, const char *needle) {
  captured c;
  run(&c, args);
  cr_assert_eq(c.rc, 2, "%s %s: rc %d", args[0], args[1] ? args[1] : "", c.rc);
  cr_assert(strstr(c.err, needle), "stderr '%s' does not say '%s'", c.err, needle);
  cr_assert_eq(c.out[0], 0, "nothing on stdout for bad flags: %s", c.out);
}

Test(bench_broadcast, bad_flags_are_named) {
  bad((const char *[]){"--mode", "bogus", NULL}, "unknown --mode 'bogus'");
  bad((const char *[]){"--preset", "3b", NULL}, "unknown --preset '3b'");
  bad((const char *[]){"--reps", "0", NULL}, "--reps must be a whole number in 1..1000, got '0'");
  bad((const char *[]){"--reps", "5x", NULL}, "--reps must be");
  bad((const char *[]){"--budget-mib", "-1", NULL}, "--budget-mib must be");
  bad((const char *[]){"--layers", "two", NULL}, "--layers must be");
  bad((const char *[]){"--reps", NULL}, "--reps needs a value");
  bad((const char *[]){"--frobnicate", "1", NULL}, "unknown flag --frobnicate");
}

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
