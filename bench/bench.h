/* Benchmarks run as `rlorch bench NAME [FLAGS]`. Each prints its figure, the
 * baseline measured in the same run, and their ratio; --json for machines. */
#ifndef RLORCH_BENCH_H
#define RLORCH_BENCH_H

int bench_broadcast(int argc, char **argv); /* bench/bench_broadcast.c */
int bench_rpc(int argc, char **argv);       /* bench/bench_rpc.c */
int bench_steploop(int argc, char **argv);  /* bench/bench_steploop.c */

#endif
