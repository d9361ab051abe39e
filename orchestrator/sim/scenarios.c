/* The named scenarios of `rlorch sim` and the published figures they are
 * compared with (docs/BENCHMARKS.md, "Cluster simulator"). */
#include <string.h>

#include "orchestrator/sim/sim.h"

static const sim_scenario scenarios[] = {
    {"8b-1node", "8B on one node of 8 GPUs: 4 trainer ranks, 4 inference workers, NVLink"},
    {"70b-4+4", "70B from 4 training nodes to 4 inference nodes of 8 GPUs, 8 x 400 Gb/s a node"},
    {"1t-256-128-bf16",
     "1T in bf16 from 32 training nodes x 8 to 16 inference nodes x 8, 8 x 400 Gb/s a node"},
};

static const sim_anchor anchors[] = {
    {"Kimi-K2 1T FP8, 256 -> 128 GPUs over RDMA (Perplexity)", 1.3},
    {"DeepSeek-V3 resharding refit, fastest (NeMo-RL)", 1.9},
    {"DeepSeek-V3 resharding refit, slowest (NeMo-RL)", 2.8},
    {"1T on 256 x H20 (checkpoint-engine)", 16.0},
};

const sim_scenario *sim_scenarios(size_t *n) {
  *n = sizeof scenarios / sizeof scenarios[0];
  return scenarios;
}

const sim_anchor *sim_anchors(size_t *n) {
  *n = sizeof anchors / sizeof anchors[0];
  return anchors;
}

int sim_scenario_load(const char *name, bcast_topo *t, sim_workload *w) {
  sim_workload_default(w);
  if (!strcmp(name, "8b-1node")) {
    bcast_topo_default(t, 1);
    w->params = 8030000000ull;
    w->layers = 32;
    w->trainer_ranks = 4;
    w->inference_workers = 4;
    w->replica_gpus = 1;
    return 0;
  }
  if (!strcmp(name, "70b-4+4")) {
    bcast_topo_default(t, 8);
    w->params = 70600000000ull;
    w->layers = 80;
    w->trainer_ranks = 32;
    w->inference_workers = 32;
    w->replica_gpus = 8; /* tensor parallel over one node */
    return 0;
  }
  if (!strcmp(name, "1t-256-128-bf16")) {
    bcast_topo_default(t, 48);
    w->params = 1040000000000ull;
    w->layers = 61;
    w->storage_dtype = BCAST_DTYPE_BF16;
    w->trainer_ranks = 256;
    w->inference_workers = 128;
    /* 2.08 TB of bf16 needs 15 H200s of 141 GB: replicas of 2 nodes. */
    w->replica_gpus = 16;
    w->train_ms = 20000;
    w->rollout_ms = 30000;
    return 0;
  }
  return -1;
}
