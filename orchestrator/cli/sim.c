/* `rlorch sim`: the cluster simulator (orchestrator/sim/sim.h) from the
 * command line. A scenario (or the defaults) gives the cluster and the
 * workload; a cluster file (JSON, the topology's field names) and the flags
 * override them, in that order. Prints the run's figures and the predicted
 * broadcast beside the published anchors. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/rtt.h"
#include "orchestrator/common/opt.h"
#include "orchestrator/sim/sim.h"

extern char **environ;

/* Health Checks timed for the bare round trip: the yardstick of the
 * orchestrator's CPU per worker, measured after the run on this machine. */
#define SIM_RTT_CALLS 3000

typedef struct sim_opts {
  char *scenario, *cluster, *model;
  bool scenarios;
  uint32_t nodes, gpus_per_node, nics_per_node;
  double nic_gbits, h2d_gbps, nvlink_gbps, tcp_stream_gbps;
  uint64_t params, steps, seed;
  int storage_dtype;
  uint32_t trainer_ranks, inference_workers, group_size, rollouts_per_step, async, replica_gpus;
  double rollout_ms, train_ms;
} sim_opts;

static const opt_name dtype_names[] = {{"fp32", BCAST_DTYPE_FP32}, {"bf16", BCAST_DTYPE_BF16}, {NULL, 0}};

#define SO(m, ctype) OPT_OFF(sim_opts, m, ctype)
#define NE OPT_NO_FILE
static const opt_field sim_fields[] = {
    {.name = "scenario", .flag = "--scenario", .type = OPT_STR, .off = SO(scenario, char *),
     .metavar = "NAME", .help = "a named cluster and workload (--scenarios lists them)", .flags = NE},
    {.name = "scenarios", .flag = "--scenarios", .type = OPT_SWITCH, .off = SO(scenarios, bool),
     .help = "list the scenarios and exit", .flags = NE | OPT_NO_ENV},
    {.name = "cluster", .flag = "--cluster", .type = OPT_PATH, .off = SO(cluster, char *),
     .metavar = "FILE", .help = "JSON object of topology fields (nodes, gpus_per_node, ...)", .flags = NE},
    {.name = "nodes", .flag = "--nodes", .type = OPT_U32, .off = SO(nodes, uint32_t), .min = 1,
     .max = 1000000, .metavar = "N", .help = "machines", .flags = NE},
    {.name = "gpus_per_node", .flag = "--gpus-per-node", .type = OPT_U32, .off = SO(gpus_per_node, uint32_t),
     .min = 1, .max = 1024, .metavar = "N", .help = "GPUs of each machine", .flags = NE},
    {.name = "nics_per_node", .flag = "--nics-per-node", .type = OPT_U32, .off = SO(nics_per_node, uint32_t),
     .min = 1, .max = 1024, .metavar = "N", .help = "NICs of each machine", .flags = NE},
    {.name = "nic_gbits", .flag = "--nic-gbits", .type = OPT_DOUBLE, .off = SO(nic_gbits, double),
     .min = 0, .max = 1e6, .metavar = "GBIT", .help = "each NIC's speed, Gb/s", .flags = NE | OPT_GT_MIN},
    {.name = "h2d_gbps", .flag = "--h2d-gbps", .type = OPT_DOUBLE, .off = SO(h2d_gbps, double), .min = 0,
     .max = 1e6, .metavar = "GBPS", .help = "host-to-device GB/s per GPU", .flags = NE | OPT_GT_MIN},
    {.name = "nvlink_gbps", .flag = "--nvlink-gbps", .type = OPT_DOUBLE, .off = SO(nvlink_gbps, double),
     .min = 0, .max = 1e6, .metavar = "GBPS", .help = "NVLink GB/s per GPU and direction",
     .flags = NE | OPT_GT_MIN},
    {.name = "tcp_stream_gbps", .flag = "--tcp-stream-gbps", .type = OPT_DOUBLE,
     .off = SO(tcp_stream_gbps, double), .min = 0, .max = 1e6, .metavar = "GBPS",
     .help = "one host-transport TCP stream at most, GB/s (0: no cap)", .flags = NE},
    {.name = "model", .flag = "--model", .type = OPT_STR, .off = SO(model, char *), .metavar = "NAME",
     .help = "parameters of a preset: 8b, 70b or 1t", .flags = NE},
    {.name = "params", .flag = "--params", .type = OPT_U64, .off = SO(params, uint64_t), .min = 4,
     .max = 1e15, .metavar = "N", .help = "model parameters (instead of --model)", .flags = NE},
    {.name = "storage_dtype", .flag = "--storage-dtype", .type = OPT_ENUM, .off = SO(storage_dtype, int),
     .names = dtype_names, .metavar = "DTYPE", .help = "the trainer's copy (sent as bf16)", .flags = NE},
    {.name = "trainer_ranks", .flag = "--trainer-ranks", .type = OPT_U32, .off = SO(trainer_ranks, uint32_t),
     .min = 1, .max = SCHED_MAX_TRAINER_RANKS, .metavar = "N", .help = "trainer ranks (the sources)",
     .flags = NE},
    {.name = "inference_workers", .flag = "--inference-workers", .type = OPT_U32,
     .off = SO(inference_workers, uint32_t), .min = 1, .max = 1000000, .metavar = "N",
     .help = "inference workers (the receivers)", .flags = NE},
    {.name = "replica_gpus", .flag = "--replica-gpus", .type = OPT_U32, .off = SO(replica_gpus, uint32_t),
     .min = 1, .max = 1000000, .metavar = "N", .help = "inference workers per model replica", .flags = NE},
    {.name = "group_size", .flag = "--group-size", .type = OPT_U32, .off = SO(group_size, uint32_t), .min = 1,
     .max = 4096, .metavar = "N", .help = "rollouts per request", .flags = NE},
    {.name = "rollouts_per_step", .flag = "--rollouts-per-step", .type = OPT_U32,
     .off = SO(rollouts_per_step, uint32_t), .metavar = "N",
     .help = "a batch (0: one group per inference worker)", .flags = NE},
    {.name = "async", .flag = "--async", .type = OPT_U32, .off = SO(async, uint32_t), .max = 64,
     .metavar = "N", .help = "max_async_level", .flags = NE},
    {.name = "steps", .flag = "--steps", .type = OPT_U64, .off = SO(steps, uint64_t), .min = 1,
     .max = 1000000, .metavar = "N", .help = "steps to run", .flags = NE},
    {.name = "rollout_ms", .flag = "--rollout-ms", .type = OPT_DOUBLE, .off = SO(rollout_ms, double),
     .min = 0, .max = 1e9, .metavar = "MS", .help = "a request's mean latency", .flags = NE | OPT_GT_MIN},
    {.name = "train_ms", .flag = "--train-ms", .type = OPT_DOUBLE, .off = SO(train_ms, double), .min = 0,
     .max = 1e9, .metavar = "MS", .help = "a train step's mean time", .flags = NE | OPT_GT_MIN},
    {.name = "seed", .flag = "--seed", .type = OPT_U64, .off = SO(seed, uint64_t), .metavar = "N",
     .help = "the latencies' random stream", .flags = NE},
};

static const opt_cmd sim_cmd = {
    .name = "sim",
    .about = "Runs the scheduler and the planner against simulated workers on a described cluster,\n"
             "the topology cost model standing in for the transfers; prints the orchestrator's CPU\n"
             "per step and memory, and the predicted broadcast beside published figures. A\n"
             "scenario sets every value below; --cluster, then the flags, override it.",
    .fields = sim_fields,
    .nfields = sizeof sim_fields / sizeof sim_fields[0],
};

/* The cluster file: a JSON object whose keys are topology fields. */
static int load_cluster(const char *path, bcast_topo *t) {
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root) {
    if (je.line > 0)
      fprintf(stderr, "rlorch sim: %s:%d: %s\n", path, je.line, je.text);
    else
      fprintf(stderr, "rlorch sim: --cluster: %s\n", je.text);
    return -1;
  }
  int rc = 0;
  if (!json_is_object(root)) {
    fprintf(stderr, "rlorch sim: %s: the cluster must be a JSON object\n", path);
    rc = -1;
  }
  const struct {
    const char *key;
    uint32_t *u;
    double *d;
  } keys[] = {{"nodes", &t->nodes, NULL},
              {"gpus_per_node", &t->gpus_per_node, NULL},
              {"nics_per_node", &t->nics_per_node, NULL},
              {"h2d_gbps", NULL, &t->h2d_gbps},
              {"nvlink_gbps", NULL, &t->nvlink_gbps},
              {"d2d_gbps", NULL, &t->d2d_gbps},
              {"cast_gbps", NULL, &t->cast_gbps},
              {"nic_gbits", NULL, &t->nic_gbits},
              {"tcp_stream_gbps", NULL, &t->tcp_stream_gbps},
              {"hop_latency_us", NULL, &t->hop_latency_us}};
  const char *k;
  json_t *v;
  json_object_foreach(rc ? NULL : root, k, v) {
    size_t i = 0;
    while (i < sizeof keys / sizeof keys[0] && strcmp(keys[i].key, k)) i++;
    if (i == sizeof keys / sizeof keys[0]) {
      fprintf(stderr, "rlorch sim: %s: %s: unknown key\n", path, k);
      rc = -1;
      break;
    }
    if (keys[i].u) {
      json_int_t n = json_integer_value(v);
      if (!json_is_integer(v) || n < 1 || n > UINT32_MAX) {
        fprintf(stderr, "rlorch sim: %s: %s: must be an integer >= 1\n", path, k);
        rc = -1;
        break;
      }
      *keys[i].u = (uint32_t)n;
    } else {
      if (!json_is_number(v)) {
        fprintf(stderr, "rlorch sim: %s: %s: must be a number\n", path, k);
        rc = -1;
        break;
      }
      *keys[i].d = json_number_value(v);
    }
  }
  json_decref(root);
  return rc;
}

static void print_pred(const char *label, const bcast_topo_pred *p) {
  printf("  %-26s %8.3f s  (%u buckets deep", label, p->total_s, p->pipeline_depth);
  if (p->latency_s > 0) printf(", %.3f ms latency", p->latency_s * 1e3);
  printf(")\n");
  for (size_t i = 0; i < p->nstages; i++)
    printf("    %-8s %9.4f s  %10.2f GB at %8.1f GB/s  %s\n", p->stages[i].name, p->stages[i].seconds,
           (double)p->stages[i].bytes / 1e9, p->stages[i].gbps, p->stages[i].where);
}

static int list_scenarios(void) {
  size_t n;
  const sim_scenario *sc = sim_scenarios(&n);
  for (size_t i = 0; i < n; i++) printf("%-18s %s\n", sc[i].name, sc[i].about);
  return 0;
}

/* What --help shows: a run without a scenario starts from these. */
static sim_opts sim_defaults(void) {
  bcast_topo t;
  sim_workload w;
  bcast_topo_default(&t, 1);
  sim_workload_default(&w);
  return (sim_opts){.nodes = t.nodes, .gpus_per_node = t.gpus_per_node, .nics_per_node = t.nics_per_node,
                    .nic_gbits = t.nic_gbits, .h2d_gbps = t.h2d_gbps, .nvlink_gbps = t.nvlink_gbps,
                    .tcp_stream_gbps = t.tcp_stream_gbps, .params = w.params, .steps = w.steps,
                    .seed = w.seed, .storage_dtype = (int)w.storage_dtype,
                    .trainer_ranks = w.trainer_ranks, .inference_workers = w.inference_workers,
                    .group_size = w.group_size, .rollouts_per_step = w.rollouts_per_step,
                    .async = w.max_async_level, .replica_gpus = w.replica_gpus,
                    .rollout_ms = w.rollout_ms, .train_ms = w.train_ms};
}

int cmd_sim(int argc, char **argv) {
  const sim_opts defaults = sim_defaults();
  sim_opts o = defaults;
  opt_state st;
  if (opt_own(&sim_cmd, &o)) {
    fprintf(stderr, "rlorch sim: out of memory\n");
    return 1;
  }
  int parsed = opt_parse_main(&sim_cmd, &o, &defaults, argc, argv, environ, &st);
  if (parsed >= 0) {
    opt_free(&sim_cmd, &o);
    return parsed;
  }
  int status = 2;
  bcast_topo t;
  sim_workload w;
  const char *name = o.scenario ? o.scenario : "custom";
  if (o.scenarios) {
    status = list_scenarios();
    goto out;
  }
  if (o.scenario) {
    if (sim_scenario_load(o.scenario, &t, &w)) {
      fprintf(stderr, "rlorch sim: --scenario: unknown scenario '%s' (--scenarios lists them)\n",
              o.scenario);
      goto out;
    }
  } else {
    bcast_topo_default(&t, 1);
    sim_workload_default(&w);
  }
  if (o.cluster && load_cluster(o.cluster, &t)) goto out;
#define SET(field, dst) \
  if (opt_is_set(&st, #field)) dst = o.field
  SET(nodes, t.nodes);
  SET(gpus_per_node, t.gpus_per_node);
  SET(nics_per_node, t.nics_per_node);
  SET(nic_gbits, t.nic_gbits);
  SET(h2d_gbps, t.h2d_gbps);
  SET(nvlink_gbps, t.nvlink_gbps);
  SET(tcp_stream_gbps, t.tcp_stream_gbps);
  SET(params, w.params);
  SET(storage_dtype, w.storage_dtype);
  SET(trainer_ranks, w.trainer_ranks);
  SET(inference_workers, w.inference_workers);
  SET(replica_gpus, w.replica_gpus);
  SET(group_size, w.group_size);
  SET(rollouts_per_step, w.rollouts_per_step);
  SET(async, w.max_async_level);
  SET(steps, w.steps);
  SET(rollout_ms, w.rollout_ms);
  SET(train_ms, w.train_ms);
  SET(seed, w.seed);
#undef SET
  if (o.model) {
    if (opt_is_set(&st, "params")) {
      fprintf(stderr, "rlorch sim: --model: give --model or --params, not both\n");
      goto out;
    }
    const struct {
      const char *name;
      uint64_t params;
      uint32_t layers;
    } models[] = {{"8b", 8030000000ull, 32}, {"70b", 70600000000ull, 80}, {"1t", 1040000000000ull, 61}};
    size_t i = 0;
    while (i < 3 && strcmp(models[i].name, o.model)) i++;
    if (i == 3) {
      fprintf(stderr, "rlorch sim: --model: unknown model '%s' (8b, 70b or 1t)\n", o.model);
      goto out;
    }
    w.params = models[i].params;
    w.layers = models[i].layers;
  }
  char err[512];
  if (sim_workload_check(&w, &t, err, sizeof err)) {
    fprintf(stderr, "rlorch sim: %s\n", err);
    goto out;
  }
  sim_result r;
  if (sim_run(&w, &t, &r, err, sizeof err)) {
    fprintf(stderr, "rlorch sim: %s\n", err);
    status = 1;
    goto out;
  }
  /* After the run, so that the server's threads take nothing from it. */
  double rtt_s = 0;
  if (rtt_loopback(SIM_RTT_CALLS, &rtt_s, err, sizeof err)) {
    fprintf(stderr, "rlorch sim: %s\n", err);
    status = 1;
    goto out;
  }
  uint32_t k = w.replica_gpus ? w.replica_gpus : 1;
  uint32_t per_step = w.rollouts_per_step ? w.rollouts_per_step : w.group_size * w.inference_workers;
  uint32_t workers = w.trainer_ranks + w.inference_workers;
  printf("scenario   %s\n", name);
  printf("cluster    %u nodes x %u GPUs (%u used); %u x %g Gb/s NICs a node; h2d %g GB/s, NVLink %g "
         "GB/s, TCP stream %g GB/s\n",
         t.nodes, t.gpus_per_node, r.nodes_used, t.nics_per_node, t.nic_gbits, t.h2d_gbps, t.nvlink_gbps,
         t.tcp_stream_gbps);
  printf("workload   %.3g parameters (%s -> %s); %u trainer ranks, %u inference workers (replicas of "
         "%u); groups of %u, %u rollouts a step, async %u\n",
         (double)w.params, bcast_dtype_name(w.storage_dtype), bcast_dtype_name(w.wire_dtype), w.trainer_ranks,
         w.inference_workers, k, w.group_size, per_step, w.max_async_level);
  printf("run        %" PRIu64 " steps committed in %.1f s simulated, %" PRIu64 " events\n", r.steps,
         r.sim_seconds, r.events);
  double steps = r.steps ? (double)r.steps : 1;
  double cpu = r.sched_cpu_s + r.plan_cpu_s;
  printf("cpu        scheduler %.3f s (%.2f ms a step), planner and model %.3f s (%.2f ms a step, %" PRIu64
         " plans), shard map once %.3f s\n",
         r.sched_cpu_s, r.sched_cpu_s / steps * 1e3, r.plan_cpu_s, r.plan_cpu_s / steps * 1e3, r.plans,
         r.shard_cpu_s);
  printf("           scheduler by call:");
  for (int k = 0; k < SIM_CPU_KINDS; k++)
    printf(" %s %.3f s%s", sim_cpu_kind_name((sim_cpu_kind)k), r.cpu_by[k], k + 1 < SIM_CPU_KINDS ? "," : "\n");
  double per_worker_us = cpu / steps / workers * 1e6;
  printf("           timer: %.0f ns an empty interval (mean), one taken off each of %" PRIu64 " timed calls\n",
         r.timer_s * 1e9, r.timed_calls);
  printf("baseline   bare RPC round trip (unary health Check, loopback, least p50 of 3 x %d): %.1f us\n",
         SIM_RTT_CALLS / 3, rtt_s * 1e6);
  printf("per worker %.2f us a step = %.3f bare RPC round trips (%.1f us)\n", per_worker_us,
         per_worker_us / (rtt_s * 1e6), rtt_s * 1e6);
  printf("memory     peak RSS %.1f MiB\n", (double)r.peak_rss_kib / 1024.0);
  printf("plan       %s (the scheduler's choice), %" PRIu64 " buckets, %.2f GB on the wire\n",
         sched_mode_name(r.mode), r.plan_buckets, (double)r.wire_bytes / 1e9);
  printf("predicted broadcast per step\n");
  char label[64];
  snprintf(label, sizeof label, "engine (%s)", sched_mode_name(r.mode));
  print_pred(label, &r.engine);
  snprintf(label, sizeof label, "multiroot (replicas of %u)", k);
  print_pred(label, &r.multiroot);
  printf("  chosen: %s, %.3f s\n", r.multiroot.total_s < r.engine.total_s ? "multiroot" : "engine",
         r.predicted_s);
  size_t na;
  const sim_anchor *an = sim_anchors(&na);
  printf("anchors (predicted / anchor)\n");
  for (size_t i = 0; i < na; i++)
    printf("  %-58s %6.2f s  %6.2fx\n", an[i].what, an[i].seconds, r.predicted_s / an[i].seconds);
  status = 0;
out:
  opt_free(&sim_cmd, &o);
  return status;
}
