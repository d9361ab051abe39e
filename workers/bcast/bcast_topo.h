/* The topology cost model: how long a plan takes on a described cluster.
 *
 * Pure arithmetic over a plan (bcast.h), where each of its ranks sits (node,
 * GPU) and what the links give; no I/O, no clock. The orchestrator's
 * deadlines still come from bcast_cost_estimate (a floor with a safety
 * factor); this model predicts the expected time per stage, for `rlorch sim`
 * and, later, for choosing a layout and explaining it in the step record.
 * docs/ARCHITECTURE.md ("Cost model of a plan on a topology") states every
 * formula; the comments here name them.
 *
 * Rates are GB/s (1e9 bytes/s) except nic_gbits (Gb/s, as NICs are sold). */
#ifndef RLORCH_BCAST_TOPO_H
#define RLORCH_BCAST_TOPO_H

#include <stddef.h>
#include <stdint.h>

#include "workers/bcast/bcast.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One node's NICs, where nodes differ. */
typedef struct bcast_topo_node {
  uint32_t nics;
  double nic_gbits;
} bcast_topo_node;

typedef struct bcast_topo {
  const bcast_topo_node *node; /* `nodes` entries, or NULL: every node has nics_per_node x nic_gbits */
  uint32_t nodes;          /* machines, >= 1 */
  uint32_t gpus_per_node;  /* >= 1 */
  double h2d_gbps;         /* per GPU, host <-> device (pinned), > 0 */
  double nvlink_gbps;      /* per GPU, one direction, > 0 */
  double d2d_gbps;         /* a copy inside one GPU's memory, > 0 */
  double cast_gbps;        /* per GPU, input bytes cast per second (fp32 -> bf16), > 0 */
  uint32_t nics_per_node;  /* >= 1 */
  double nic_gbits;        /* per NIC, Gb/s, > 0 */
  double tcp_stream_gbps;  /* one host-transport TCP stream at most; 0: no cap of its own */
  double hop_latency_us;   /* per hop of an NCCL ring, >= 0 */
} bcast_topo;

/* H200-class node, the figures docs/ARCHITECTURE.md sources: 8 GPUs, 55 GB/s
 * host-to-device, 450 GB/s NVLink, 2100 GB/s device copy, 2200 GB/s cast,
 * 8 x 400 Gb/s NICs, TCP stream 1.5 GB/s, 10 us per hop; `nodes` nodes. */
void bcast_topo_default(bcast_topo *t, uint32_t nodes);
/* BCAST_OK, or BCAST_EINVAL naming the field ("topology: nic_gbits ..."). */
int bcast_topo_check(const bcast_topo *t, bcast_err *err);

/* Where plan rank r runs. `host`: the rank holds its weights in host memory
 * and has no GPU (a CPU inference engine): nothing of it crosses a
 * host-to-device link; `gpu` then only tells ranks apart. */
typedef struct bcast_topo_place {
  uint32_t node, gpu;
  uint8_t host;
} bcast_topo_place;

typedef enum {
  /* The plan as the engine runs it today, by plan->mode: host transport
   * (every source sends its buckets to every receiver over TCP), NCCL ring
   * (direct, staged: one source), colocated (one GPU). */
  BCAST_LAYOUT_ENGINE = 1,
  /* Proposed, not yet run by the engine: each source sends its bytes over
   * its own NIC (GPU-direct RDMA) to one relay per receiving node and share,
   * which forwards them over NVLink to the other GPUs of its node that need
   * them. */
  BCAST_LAYOUT_MULTIROOT = 2
} bcast_topo_layout;
const char *bcast_topo_layout_name(bcast_topo_layout l); /* "engine", "multiroot" */

typedef struct bcast_topo_opts {
  bcast_topo_layout layout;
  /* Multiroot: receivers form replicas of this many consecutive ranks, each
   * holding 1/replica_gpus of the model (tensor or expert parallel); 0 or 1:
   * every receiver holds the whole model. The engine layout sends whole
   * models and requires 0 or 1. */
  uint32_t replica_gpus;
} bcast_topo_opts;

#define BCAST_TOPO_MAX_STAGES 6
#define BCAST_TOPO_WHERE_MAX 64

typedef struct bcast_topo_stage {
  const char *name;   /* "d2h", "cast", "nic", "h2d", "nvlink", "ring", "d2d" */
  double seconds;     /* its bottleneck's time */
  uint64_t bytes;     /* bytes through the bottleneck */
  double gbps;        /* the bottleneck's rate */
  char where[BCAST_TOPO_WHERE_MAX]; /* the bottleneck: "source 3", "node 5 ingress", ... */
} bcast_topo_stage;

typedef struct bcast_topo_pred {
  bcast_topo_layout layout;
  bcast_topo_stage stages[BCAST_TOPO_MAX_STAGES];
  size_t nstages;
  uint32_t pipeline_depth; /* buckets of the busiest source: stages overlap over them */
  double latency_s;        /* fixed latency added (NCCL hops) */
  double total_s;          /* sum(s) / n + (n - 1) / n * max(s) + latency_s */
} bcast_topo_pred;

/* Predicts plan `p` on `t` with rank r at place[r] (nplace = p->world_size).
 * Refused with BCAST_EINVAL naming the field: a bad topology, a place off
 * the topology ("placement[3].gpu 8 >= gpus_per_node 8"), a colocated plan
 * whose ranks are not on one GPU, an NCCL plan with several sources, a
 * replica_gpus that does not divide the receivers or is set for the engine
 * layout, a plan without receivers. */
int bcast_topo_predict(const bcast_plan *p, const bcast_topo_place *place, size_t nplace,
                       const bcast_topo *t, const bcast_topo_opts *o, bcast_topo_pred *out,
                       bcast_err *err);

#ifdef __cplusplus
}
#endif
#endif
