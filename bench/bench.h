/* Benchmarks run as `rlorch bench NAME [FLAGS]`. Each prints its figure, the
 * baseline measured in the same run, and their ratio; --json for machines. */
#ifndef RLORCH_BENCH_H
#define RLORCH_BENCH_H

#include <stddef.h>

/* `rlorch bench NAME [FLAGS]`: the exit status. */
int bench_main(int argc, char **argv);

int bench_adamw(int argc, char **argv);     /* bench/bench_adamw.c */
int bench_broadcast(int argc, char **argv); /* bench/bench_broadcast.c */
int bench_dispatch(int argc, char **argv);  /* bench/bench_dispatch.c */
int bench_rpc(int argc, char **argv);       /* bench/bench_rpc.c */
int bench_steploop(int argc, char **argv);  /* bench/bench_steploop.c */

/* Sorts samples ascending, for medians and percentiles. */
void bench_sort(double *v, size_t n);
/* Monotonic seconds, for wall-clock timings. */
double bench_now(void);

#endif
