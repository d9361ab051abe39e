/* The cluster simulator: a small run (200 inference workers, 8 trainer
 * ranks, a few steps) through the real scheduler and planner, with the
 * invariants a correct run keeps; every named scenario runs; bad workloads
 * and clusters are refused naming the field. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "orchestrator/sim/evq.h"
#include "orchestrator/sim/sim.h"

static void small(bcast_topo *t, sim_workload *w) {
  bcast_topo_default(t, 26); /* 208 GPUs */
  sim_workload_default(w);
  w->params = 1000000000ull;
  w->layers = 8;
  w->trainer_ranks = 8;
  w->inference_workers = 200;
  w->group_size = 4;
  w->steps = 4;
  w->max_async_level = 1;
  w->rollout_ms = 500;
  w->train_ms = 300;
  w->replica_gpus = 8;
}

Test(sim, small_run_keeps_its_invariants, .timeout = 120) {
  bcast_topo t;
  sim_workload w;
  small(&t, &w);
  sim_result r;
  char err[512] = "";
  cr_assert_eq(sim_run(&w, &t, &r, err, sizeof err), 0, "%s", err);
  cr_assert_eq(r.steps, 4, "every step committed");
  cr_assert_eq(r.counters.steps, 4);
  cr_assert_eq(r.plans, 4, "one plan a step, none aborted");
  cr_assert_eq(r.counters.aborts, 0);
  /* No request lost: each was answered, cancelled or is still out. */
  cr_assert_eq(r.dispatched, r.counters.requests_dispatched);
  cr_assert_eq(r.dispatched, r.answered + r.counters.requests_cancelled + r.in_flight,
               "dispatched %lu answered %lu in flight %lu", (unsigned long)r.dispatched,
               (unsigned long)r.answered, (unsigned long)r.in_flight);
  cr_assert_leq(r.stale, r.counters.requests_cancelled, "stale results come from cancels only");
  cr_assert_eq(r.in_flight, r.counters.requests_in_flight);
  cr_assert_eq(r.counters.rollouts_received,
               r.counters.rollouts_used + r.counters.rollouts_dropped_stale + r.counters.rollouts_buffered);
  cr_assert_eq(r.counters.rollouts_used, 4ull * 4 * 200, "each step a batch of one group a worker");
  /* Several sources: the scheduler picked the host transport; the record's
   * broadcast time is the model's prediction for the plan the planner built. */
  cr_assert_eq(r.mode, SCHED_MODE_HOST);
  cr_assert_gt(r.predicted_s, 0);
  cr_assert_eq(r.predicted_s, fmin(r.engine.total_s, r.multiroot.total_s));
  cr_assert(fabs(r.record_total_s - r.predicted_s) < 1e-12, "record %g, model %g", r.record_total_s,
            r.predicted_s);
  cr_assert(r.record_verified, "every receiver reported every source's checksum");
  /* By hand: 8 sources on node 0, 25 nodes of 8 receivers, replicas of 8.
   * Multiroot: each source sends W_j / 8 per (node, share), 200 of them, over
   * its own 50 GB/s NIC (a node's ingress, W over 400 GB/s, is less); each
   * receiver gets its share from the NIC (no NVLink stage); each source casts
   * its 5e8 fp32 bytes at the topology's cast rate; 8 layers, one bucket
   * each a source. */
  double wj = (double)r.wire_bytes / 8, nic = wj * 200 / 8 / 50e9, cast = 5e8 / (t.cast_gbps * 1e9);
  cr_assert_eq(r.multiroot.pipeline_depth, 8);
  cr_assert_eq(r.multiroot.nstages, 2);
  double want = (nic + cast) / 8 + 7.0 / 8 * nic;
  cr_assert(fabs(r.multiroot.total_s - want) < 1e-9 * want, "multiroot %.9g, by hand %.9g",
            r.multiroot.total_s, want);
  /* The engine: each source writes W_j to 200 receivers through node 0's
   * 400 GB/s, shared by its 8 sources: 50 GB/s each, of which TCP gets
   * 1448 bytes a frame of 1538 (MTU 1500 assumed, 38 bytes on the wire). */
  size_t ni = 0;
  while (ni < r.engine.nstages && strcmp(r.engine.stages[ni].name, "nic")) ni++;
  cr_assert_lt(ni, r.engine.nstages, "the engine layout crosses the NICs");
  cr_assert(fabs(r.engine.stages[ni].seconds - wj * 200 / (50e9 * 1448.0 / 1538.0)) < 1e-9, "engine nic %g",
            r.engine.stages[ni].seconds);
  cr_assert_eq(r.nodes_used, 26);
  cr_assert_gt(r.plan_buckets, 0);
  cr_assert_geq(r.wire_bytes, 2000000000ull, "1B parameters in bf16");
  cr_assert_gt(r.sched_cpu_s + r.plan_cpu_s, 0, "CPU was measured");
  cr_assert_gt(r.peak_rss_kib, 0);
  /* Simulated time: 4 steps of at least a train step and a broadcast. */
  cr_assert_gt(r.sim_seconds, 4 * (0.27 + r.predicted_s));
}

Test(sim, the_same_seed_replays_the_same_run, .timeout = 120) {
  bcast_topo t;
  sim_workload w;
  small(&t, &w);
  w.inference_workers = 40;
  w.trainer_ranks = 2;
  t.nodes = 6;
  sim_result a, b;
  char err[512] = "";
  cr_assert_eq(sim_run(&w, &t, &a, err, sizeof err), 0, "%s", err);
  cr_assert_eq(sim_run(&w, &t, &b, err, sizeof err), 0, "%s", err);
  cr_assert_eq(a.events, b.events);
  cr_assert_eq(a.sim_seconds, b.sim_seconds);
  w.seed = 7;
  cr_assert_eq(sim_run(&w, &t, &b, err, sizeof err), 0, "%s", err);
  cr_assert_neq(a.sim_seconds, b.sim_seconds, "another seed, other latencies");
}

Test(sim, one_trainer_runs_direct_over_nccl, .timeout = 60) {
  bcast_topo t;
  sim_workload w;
  small(&t, &w);
  w.trainer_ranks = 1;
  w.inference_workers = 7;
  w.replica_gpus = 1;
  t.nodes = 1;
  sim_result r;
  char err[512] = "";
  cr_assert_eq(sim_run(&w, &t, &r, err, sizeof err), 0, "%s", err);
  cr_assert_eq(r.mode, SCHED_MODE_DIRECT, "GPU tensors, a GPU each");
  cr_assert_eq(r.steps, 4);
  cr_assert_str_eq(r.engine.stages[r.engine.nstages - 1].name, "ring");
}

Test(sim, every_scenario_runs, .timeout = 240) {
  size_t n;
  const sim_scenario *sc = sim_scenarios(&n);
  cr_assert_geq(n, 3);
  for (size_t i = 0; i < n; i++) {
    bcast_topo t;
    sim_workload w;
    cr_assert_eq(sim_scenario_load(sc[i].name, &t, &w), 0);
    w.steps = 1;
    sim_result r;
    char err[512] = "";
    cr_assert_eq(sim_run(&w, &t, &r, err, sizeof err), 0, "%s: %s", sc[i].name, err);
    cr_assert_eq(r.steps, 1, "%s", sc[i].name);
    cr_assert_gt(r.predicted_s, 0, "%s", sc[i].name);
  }
  bcast_topo t;
  sim_workload w;
  cr_assert_eq(sim_scenario_load("no-such", &t, &w), -1);
}

static void refused(const sim_workload *w, const bcast_topo *t, const char *needle) {
  sim_result r;
  char err[512] = "";
  cr_assert_eq(sim_run(w, t, &r, err, sizeof err), -1, "want a refusal naming %s", needle);
  cr_assert(strstr(err, needle), "'%s' does not say '%s'", err, needle);
}

Test(sim, bad_input_names_the_field) {
  bcast_topo t, t0;
  sim_workload w, w0;
  small(&t0, &w0);
  w = w0, w.inference_workers = 0;
  refused(&w, &t0, "inference_workers");
  w = w0, w.trainer_ranks = 2000;
  refused(&w, &t0, "trainer_ranks");
  w = w0, w.rollouts_per_step = 6;
  refused(&w, &t0, "rollouts_per_step: 6 is not a multiple of group_size 4");
  w = w0, w.replica_gpus = 7;
  refused(&w, &t0, "replica_gpus: 7 does not divide");
  w = w0, w.rollout_ms = 0;
  refused(&w, &t0, "rollout_ms");
  w = w0, w.steps = 0;
  refused(&w, &t0, "steps");
  w = w0, w.params = 3;
  refused(&w, &t0, "params");
  w = w0, w.storage_dtype = BCAST_DTYPE_BF16, w.wire_dtype = BCAST_DTYPE_FP16;
  refused(&w, &t0, "dtype: bf16 cannot be sent as fp16");
  t = t0, t.nodes = 20;
  refused(&w0, &t, "nodes: 20 nodes of 8 GPUs hold 160 workers; 8 trainer ranks and 200 inference "
                   "workers need 26 nodes");
  t = t0, t.nic_gbits = 0;
  refused(&w0, &t, "nic_gbits");
}

Test(sim, event_queue_orders_by_time_then_insertion) {
  evq q;
  evq_init(&q, sizeof(int));
  int v[] = {5, 1, 3, 1, 9, 0};
  int64_t at[] = {50, 10, 30, 10, 90, 10};
  for (int i = 0; i < 6; i++) cr_assert_eq(evq_push(&q, at[i], &v[i]), 0);
  cr_assert_eq(evq_next(&q), 10);
  int want[] = {1, 1, 0, 3, 5, 9}, got;
  int64_t t_prev = 0;
  for (int i = 0; i < 6; i++) {
    int64_t t = evq_pop(&q, &got);
    cr_assert_geq(t, t_prev);
    t_prev = t;
    cr_assert_eq(got, want[i], "pop %d: %d, want %d", i, got, want[i]);
  }
  cr_assert_eq(evq_pop(&q, &got), -1);
  cr_assert_eq(evq_next(&q), INT64_MAX);
  for (int i = 0; i < 5000; i++) evq_push(&q, (i * 7919) % 1000, &i);
  for (int i = 0; i < 5000; i++) {
    int64_t t = evq_pop(&q, &got);
    cr_assert_geq(t, i ? t_prev : 0);
    t_prev = t;
  }
  evq_free(&q);
}
