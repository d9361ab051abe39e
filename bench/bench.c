/* `rlorch bench NAME`: dispatch to one benchmark. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench.h"

static const struct {
  const char *name;
  int (*fn)(int, char **);
  const char *help;
} benches[] = {
    {"broadcast", bench_broadcast, "weight broadcast vs PCIe and wire floors"},
    {"rpc", bench_rpc, "control-call latency vs a bare gRPC C-core echo server"},
    {"steploop", bench_steploop, "orchestration overhead per step and per rollout"},
    {NULL, NULL, NULL},
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

int bench_main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help")) {
    fprintf(argc < 2 ? stderr : stdout, "usage: rlorch bench NAME [FLAGS]\n\nbenchmarks:\n");
    for (int i = 0; benches[i].name; i++)
      fprintf(argc < 2 ? stderr : stdout, "  %-10s %s\n", benches[i].name, benches[i].help);
    return argc < 2 ? 2 : 0;
  }
  for (int i = 0; benches[i].name; i++)
    if (!strcmp(argv[1], benches[i].name)) return benches[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "rlorch bench: unknown benchmark '%s'\n", argv[1]);
  return 2;
}
