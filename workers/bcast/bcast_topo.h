/* The topology cost model: how long a plan takes on a described cluster.
 *
 * Pure arithmetic over a plan (bcast.h), where each of its ranks sits (node,
 * GPU) and what the links, GPUs and hosts give; no I/O, no clock. The
 * orchestrator predicts every plan with it, chooses layouts (relays or not)
 * by it and explains the choice in the step record; `rlorch sim` stands it
 * in for the transfers. docs/ARCHITECTURE.md ("Cost model of a plan on a
 * topology") states every formula and sources every figure; the comments
 * here name them. tests/unit/test_bcast_topo_reality.c holds it to every
 * broadcast measured so far.
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
  uint32_t nics;    /* >= 1 */
  double nic_gbits; /* per NIC, Gb/s, > 0 */
  uint32_t mtu;     /* bytes, 0 (unknown: BCAST_TOPO_MTU_ASSUMED) or >= BCAST_TOPO_MTU_MIN */
} bcast_topo_node;

/* The MTU a node of unknown MTU is taken to have: Ethernet's default. */
#define BCAST_TOPO_MTU_ASSUMED 1500
/* What an MTU must leave room for: IPv4 (20) and TCP (20) with timestamps
 * (12), the header of every TCP segment Linux sends; IPv4's least MTU. */
#define BCAST_TOPO_TCP_HEADER_BYTES 52
#define BCAST_TOPO_MTU_MIN 68

typedef struct bcast_topo {
  uint32_t nodes;          /* machines, >= 1 */
  uint32_t gpus_per_node;  /* >= 1 */
  double h2d_gbps;         /* per GPU, host <-> device (pinned, asynchronous), > 0 */
  double nvlink_gbps;      /* per GPU, one direction, as ncclBroadcast achieves it, > 0 */
  double d2d_gbps;         /* a copy inside one GPU's memory, > 0 */
  double cast_gbps;        /* per GPU, input bytes cast per second (fp32 -> bf16), > 0 */
  uint32_t nics_per_node;  /* >= 1; every node's unless `node` says otherwise */
  double nic_gbits;        /* per NIC, Gb/s, > 0; likewise */
  uint32_t mtu;            /* bytes, as bcast_topo_node.mtu; likewise */
  /* Bytes a NIC's line rate spends on each frame beside the MTU's: 38 on a
   * wire (Ethernet header 14, FCS 4, preamble 8, inter-frame gap 12), 14
   * through a tc tbf shaper (the header only); >= 0. TCP through a NIC
   * gets (mtu - 52) / (mtu + nic_frame_bytes) of its rate. */
  double nic_frame_bytes;
  /* `nodes` entries, or NULL: every node has nics_per_node x nic_gbits.
   * Borrowed: it must outlive every call that is given this topology. */
  const bcast_topo_node *node;
  /* Host transport (TCP between processes, casts on the CPU). 0: no cap. */
  double tcp_stream_gbps;  /* one TCP stream at most */
  double tls_stream_gbps;  /* one stream of a TLS plan (bcast_plan.tls) at most */
  double tcp_send_gbps;    /* one process's sending thread, over all its streams */
  double host_gbps;        /* a node's host over every stream end on it (a stream
                              inside the node counts twice): the memory and kernel
                              its streams' copies share; a sending thread waits for
                              it, so it adds to the thread's time */
  double host_cores_gbps;  /* a node's cores over every stream end on it: a bound of
                              its own where the threads outnumber the cores */
  double host_cast_gbps;   /* a source's CPU cast and checksum, storage bytes/s */
  double pageable_gbps;    /* the host transport's synchronous copies between GPU
                              tensors and pageable host memory, > 0 */
  double tcp_plan_ms;      /* fixed cost of a host-transport plan (connections,
                              handshakes, threads), >= 0 */
  double hop_latency_us;   /* per hop of an NCCL ring, >= 0 */
  double nccl_bucket_us;   /* fixed cost of each bucket's NCCL group, >= 0 */
  /* Colocated (every rank on one GPU): fixed costs of a plan, >= 0. */
  double coloc_plan_us;    /* once per plan (done words, the last stream's drain) */
  double coloc_write_us;   /* per slice written into a receiver (a kernel or copy launch) */
  double coloc_source_us;  /* per source past the first (its streams, its mappings) */
} bcast_topo;

/* An H200-class cluster of `nodes` nodes, each figure measured on the H200
 * machines of docs/BENCHMARKS.md or NVIDIA's (docs/ARCHITECTURE.md has the
 * table): 8 GPUs, 8 x 400 Gb/s NICs a node, `node` NULL. */
void bcast_topo_default(bcast_topo *t, uint32_t nodes);
/* BCAST_OK, or BCAST_EINVAL naming the field ("topology: nic_gbits 0 must be
 * > 0", "topology: node[2].nic_gbits 0 must be > 0"). */
int bcast_topo_check(const bcast_topo *t, bcast_err *err);

/* Where plan rank r runs. */
typedef struct bcast_topo_place {
  uint32_t node, gpu;
  /* 1: the rank holds its weights in host memory and has no GPU (a CPU
   * engine): a host-transport receiver copies nothing to a GPU. */
  int host;
} bcast_topo_place;

typedef enum {
  /* The plan as the engine runs it, by plan->mode: host transport (every
   * source sends its buckets to every receiver over TCP, or through the
   * relays of bcast_topo_opts.relay_from), NCCL ring (direct, staged: one
   * source), colocated (one GPU). */
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
  /* Host-transport relays, as BroadcastPlan.relay_from: world_size entries,
   * for each receiver the rank it takes its bytes from (the source, or a
   * receiver that relays them), the source's entry its own rank; NULL: every
   * receiver takes its bytes from the sources. Only for the engine layout of
   * a host-mode plan with one source and no receiver views. Borrowed. */
  const uint32_t *relay_from;
} bcast_topo_opts;

#define BCAST_TOPO_MAX_STAGES 8
#define BCAST_TOPO_WHERE_MAX 64

typedef struct bcast_topo_stage {
  /* "d2h", "cast", "tcp", "relay", "nic", "h2d", "nvlink", "ring", "d2d" */
  const char *name;
  double seconds;     /* its bottleneck's time */
  uint64_t bytes;     /* bytes through the bottleneck */
  double gbps;        /* the bottleneck's rate (bytes / seconds where fixed costs add) */
  char where[BCAST_TOPO_WHERE_MAX]; /* the bottleneck: "source 3", "node 5 ingress", ... */
  /* 1: runs before or after the pipeline, not overlapped with the other
   * stages (the host transport's copies of GPU tensors). */
  int serial;
} bcast_topo_stage;

typedef struct bcast_topo_pred {
  bcast_topo_layout layout;
  bcast_topo_stage stages[BCAST_TOPO_MAX_STAGES];
  size_t nstages;
  uint32_t pipeline_depth; /* buckets of the busiest source: stages overlap over them */
  uint32_t relays;         /* receivers that forward to others (relay_from) */
  double latency_s;        /* fixed costs added once (NCCL hops, colocated plan costs) */
  /* serial + sum(s) / n + (n - 1) / n * max(s) + latency_s, over the
   * pipelined stages s and the serial ones */
  double total_s;
} bcast_topo_pred;

/* Predicts plan `p` on `t` with rank r at place[r] (nplace = p->world_size).
 * Refused with BCAST_EINVAL naming the field: a bad topology, a place off
 * the topology ("placement[3].gpu 8 >= gpus_per_node 8"), a colocated plan
 * whose ranks are not on one GPU, an NCCL plan with several sources, a
 * replica_gpus that does not divide the receivers or is set for the engine
 * layout, a plan without receivers, a relay_from out of range, forming a
 * cycle, giving a source another rank, or set for another layout, mode,
 * several sources or receiver views. */
int bcast_topo_predict(const bcast_plan *p, const bcast_topo_place *place, size_t nplace,
                       const bcast_topo *t, const bcast_topo_opts *o, bcast_topo_pred *out,
                       bcast_err *err);

/* The stage that takes longest (serial stages included); NULL when none. */
const bcast_topo_stage *bcast_topo_pred_bottleneck(const bcast_topo_pred *p);

/* One line for a log or a step record, e.g. "engine 1.020 s: nic 1.000 s at
 * source 0 egress (25.00 GB at 25.0 GB/s), h2d 0.450 s at each receiver
 * (...); 40 buckets deep". Written as snprintf does (always terminated when
 * len > 0); returns the length the whole line needs. */
size_t bcast_topo_pred_describe(const bcast_topo_pred *p, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
