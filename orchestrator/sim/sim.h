/* The cluster simulator behind `rlorch sim`: the unchanged scheduler
 * (sched.h) and planner (bcast_plan_build_sharded) driven by simulated
 * workers on a described cluster, in simulated time.
 *
 * Every action the scheduler emits is answered through an event queue
 * (evq.h): a rollout request after a latency drawn around rollout_ms, a
 * train step after train_ms, a plan built 10 ms after it was asked for,
 * acks after a few milliseconds, and a broadcast after the time the
 * topology cost model (bcast_topo.h) predicts for the plan the planner
 * built. Workers send heartbeats; none is lost. The scheduler and the
 * planner are timed with the thread's CPU clock around their calls only,
 * each less an empty interval timed beside it (the clock's own cost), so the
 * figures are the orchestrator's CPU, not the simulation's nor the clock's. */
#ifndef RLORCH_SIM_H
#define RLORCH_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/sched/sched.h"
#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_topo.h"

typedef struct sim_workload {
  uint64_t params;            /* model parameters, >= layers * 4 */
  uint32_t layers;            /* synthetic model: 4 equal tensors a layer, >= 1 */
  bcast_dtype storage_dtype;  /* the trainer's copy: fp32 or bf16 */
  bcast_dtype wire_dtype;     /* what receivers get: bf16 or fp16 */
  bcast_residency residency;  /* where the trainer's copy lives */
  uint32_t trainer_ranks;     /* sources, 1..SCHED_MAX_TRAINER_RANKS */
  uint32_t inference_workers; /* receivers, >= 1 */
  uint32_t group_size;        /* rollouts per request, >= 1 */
  uint32_t rollouts_per_step; /* a multiple of group_size; 0: group_size x workers */
  uint32_t max_async_level;
  uint32_t max_outstanding;   /* requests per worker, >= 1 */
  uint64_t steps;             /* >= 1 */
  double rollout_ms;          /* a request's mean latency (uniform 0.5x..1.5x), > 0 */
  double train_ms;            /* a step's mean (uniform 0.9x..1.1x per rank), > 0 */
  double heartbeat_ms;        /* each worker's heartbeat interval, > 0 */
  uint32_t replica_gpus;      /* receivers per model replica (multiroot); 0: 1 */
  uint64_t bucket_bytes;      /* planner's staging budget; 0: 256 MiB */
  uint64_t seed;              /* the latencies' random stream */
} sim_workload;

/* 8b parameters on 32 layers, fp32 GPU master to bf16, 1 rank, 1 worker,
 * groups of 8, async 1, K 2, 3 steps, rollouts 2 s, train 1 s, heartbeats
 * 2 s, replicas of 1, seed 1. */
void sim_workload_default(sim_workload *w);
/* 0, or -1 with `err` naming the field ("inference_workers: must be >= 1"). */
int sim_workload_check(const sim_workload *w, const bcast_topo *t, char *err, size_t errlen);

/* Where the scheduler's CPU went, by call. */
typedef enum {
  SIM_CPU_REGISTER = 0, /* registrations and attaches, before the first step */
  SIM_CPU_HEARTBEAT,
  SIM_CPU_ROLLOUTS,     /* rollout results */
  SIM_CPU_STEP,         /* train steps done */
  SIM_CPU_PLAN,         /* plan built and acks */
  SIM_CPU_BROADCAST,    /* broadcast reports */
  SIM_CPU_TICK,
  SIM_CPU_DEADLINE,     /* sched_next_deadline after every event, as the daemon's runner */
  SIM_CPU_ACTIONS,      /* taking and freeing actions */
  SIM_CPU_KINDS
} sim_cpu_kind;
const char *sim_cpu_kind_name(sim_cpu_kind k);

typedef struct sim_result {
  uint64_t steps;             /* committed */
  uint64_t events;            /* delivered to the scheduler */
  double sim_seconds;         /* simulated time at the last commit */
  double sched_cpu_s;         /* scheduler calls, the whole run (registrations excluded) */
  double timer_s;             /* an empty timed interval, the mean of those taken off the calls */
  uint64_t timed_calls;       /* scheduler calls timed */
  double cpu_by[SIM_CPU_KINDS]; /* the same by call, registrations included */
  double plan_cpu_s;          /* planner + cost model, every plan */
  double shard_cpu_s;         /* bcast_shards_check once, at the start */
  uint64_t plans;             /* plans built */
  long peak_rss_kib;          /* of the process, at the end */
  uint32_t nodes_used;
  sched_mode mode;            /* of the last plan */
  uint64_t plan_buckets;      /* of the last plan */
  uint64_t wire_bytes;        /* of the last plan */
  bcast_topo_pred engine;     /* the last plan, as the engine runs it */
  bcast_topo_pred multiroot;  /* the same bytes, multiroot */
  double predicted_s;         /* the better of the two: what each broadcast took */
  double record_total_s;      /* the last committed record's total_seconds */
  double record_step_s;       /* and its step_seconds */
  int record_verified;        /* and its weights_verified */
  uint64_t dispatched;        /* DISPATCH actions */
  uint64_t answered;          /* results accepted */
  uint64_t stale;             /* results of cancelled requests (ESTALE) */
  uint64_t in_flight;         /* requests unanswered when the run ended */
  sched_counters counters;
} sim_result;

/* Runs the workload on the topology until the run succeeds. 0, or -1 with
 * `err` saying what failed (a bad workload or topology naming the field, a
 * scheduler or planner refusal, the run failing, running out of memory). */
int sim_run(const sim_workload *w, const bcast_topo *t, sim_result *out, char *err, size_t errlen);

/* Where rank r of a plan runs: sources then receivers packed GPU by GPU
 * from node 0 (rank order = participants order). */
bcast_topo_place sim_place(const bcast_topo *t, uint32_t rank);

/* ---- named scenarios (scenarios.c) -------------------------------------- */
typedef struct sim_scenario {
  const char *name;
  const char *about;
} sim_scenario;

/* The scenarios, in order; *n set to how many. */
const sim_scenario *sim_scenarios(size_t *n);
/* Fills the topology and workload of scenario `name`; -1 when unknown. */
int sim_scenario_load(const char *name, bcast_topo *t, sim_workload *w);

/* Published weight-update times the predictions are printed beside. */
typedef struct sim_anchor {
  const char *what;
  double seconds;
} sim_anchor;
const sim_anchor *sim_anchors(size_t *n);

#endif
