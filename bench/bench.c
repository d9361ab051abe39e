/* `rlorch bench NAME`: dispatch to one benchmark. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench.h"
#include "orchestrator/common/opt.h"

extern char **environ;

/* What each one measures is in the --help footer below. */
static const struct {
  const char *name;
  int (*fn)(int, char **);
} benches[] = {
    {"adamw", bench_adamw},
    {"broadcast", bench_broadcast},
    {"dispatch", bench_dispatch},
    {"rpc", bench_rpc},
    {"steploop", bench_steploop},
    {NULL, NULL},
};

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

void bench_sort(double *v, size_t n) { qsort(v, n, sizeof *v, cmp_double); }

double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const opt_cmd bench__cmd = {
    .name = "bench",
    .about = "Runs one benchmark; each prints its figure, the baseline measured in the same\n"
             "run, and their ratio (`rlorch bench NAME --help` for its flags).",
    .flags = OPT_CMD_SUBCOMMAND,
    .footer = "benchmarks:\n"
              "  adamw      CPU optimizer step with and without the bf16 shadow vs a cast pass\n"
              "  broadcast  weight broadcast vs PCIe and wire floors\n"
              "  dispatch   stale drops and inference utilisation at async levels 0..3\n"
              "  rpc        control-call latency vs a bare gRPC C-core echo server\n"
              "  steploop   orchestration overhead per step and per rollout\n",
};

int bench_main(int argc, char **argv) {
  opt_state st;
  int rc = opt_parse_main(&bench__cmd, NULL, NULL, argc, argv, environ, &st);
  if (rc >= 0) return rc;
  if (st.rest >= argc) {
    opt_fail(&st, "arguments", "missing NAME (see rlorch bench --help)");
    fprintf(stderr, "%s\n", st.err);
    return 2;
  }
  const char *name = argv[st.rest];
  for (int i = 0; benches[i].name; i++)
    if (!strcmp(name, benches[i].name)) return benches[i].fn(argc - st.rest, argv + st.rest);
  opt_fail(&st, "arguments", "unknown benchmark \"%s\" (see rlorch bench --help)", name);
  fprintf(stderr, "%s\n", st.err);
  return 2;
}
