/* The topology cost model against values computed by hand from the formulas
 * of docs/ARCHITECTURE.md ("Cost model of a plan on a topology"), and its
 * refusals of bad descriptions, each naming the field. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_topo.h"

#define GIB 1073741824.0
#define ELEMS (512ull * 1024 * 1024) /* 1 GiB of bf16 */
#define BUDGET (256ull << 20)        /* 4 buckets of the tensor */

static bcast_tensor one_tensor(bcast_dtype storage, bcast_residency res) {
  bcast_tensor t = {.layer = 0, .storage_dtype = storage, .wire_dtype = BCAST_DTYPE_BF16, .ndim = 1,
                    .shape = {ELEMS}, .residency = res};
  snprintf(t.name, sizeof t.name, "w");
  return t;
}

static bcast_plan *plan_of(bcast_tensor t, bcast_mode mode, uint32_t world) {
  static const uint8_t secret[BCAST_SECRET_BYTES];
  bcast_plan_opts o = {.id = "topo", .mode = mode, .staging_budget = BUDGET, .world_size = world,
                       .host_endpoint = mode == BCAST_MODE_HOST ? "127.0.0.1:1" : NULL,
                       .secret = secret};
  bcast_plan *p = NULL;
  bcast_err e = {0};
  cr_assert_eq(bcast_plan_build(&t, 1, &o, &p, &e), BCAST_OK, "%s", e.msg);
  return p;
}

/* Two sources, each holding half of the tensor. */
static bcast_plan *sharded_plan(uint32_t world, bcast_mode mode) {
  bcast_tensor a = one_tensor(BCAST_DTYPE_BF16, BCAST_RES_GPU), b = a;
  a.shard_offset = 0, a.shard_elems = ELEMS / 2;
  b.shard_offset = ELEMS / 2, b.shard_elems = ELEMS / 2;
  const bcast_tensor *ranks[2] = {&a, &b};
  size_t n[2] = {1, 1};
  bcast_shard_map *m = NULL;
  bcast_err e = {0};
  cr_assert_eq(bcast_shards_check(ranks, n, 2, NULL, &m, &e), BCAST_OK, "%s", e.msg);
  static const uint8_t secret[BCAST_SECRET_BYTES];
  static const char *const eps[2] = {"127.0.0.1:1", "127.0.0.1:2"};
  bcast_plan_opts o = {.id = "topo2", .mode = mode, .staging_budget = BUDGET, .world_size = world,
                       .source_endpoints = mode == BCAST_MODE_HOST ? eps : NULL, .secret = secret};
  bcast_plan *p = NULL;
  cr_assert_eq(bcast_plan_build_sharded(m, &o, &p, &e), BCAST_OK, "%s", e.msg);
  bcast_shard_map_free(m);
  return p;
}

/* What TCP gets of a NIC at the default framing: MTU unknown (1500
 * assumed), 1448 bytes of payload a frame of 1500 + 38 on the wire. */
#define TCP (1448.0 / 1538.0)

/* 3 nodes of 4 GPUs; 2 NICs of 80 Gb/s (10 GB/s each, 20 GB/s a node); no
 * host-transport cap and no fixed cost unless a test sets one. */
static bcast_topo small_topo(void) {
  bcast_topo t;
  bcast_topo_default(&t, 3);
  t.gpus_per_node = 4;
  t.h2d_gbps = 50;
  t.nvlink_gbps = 400;
  t.d2d_gbps = 2000;
  t.cast_gbps = 100;
  t.nics_per_node = 2;
  t.nic_gbits = 80;
  t.tcp_stream_gbps = 0;
  t.tcp_send_gbps = 0;
  t.host_gbps = 0;
  t.host_cores_gbps = 0;
  t.host_cast_gbps = 0;
  t.pageable_gbps = 25;
  t.tcp_plan_ms = 0;
  t.hop_latency_us = 10;
  t.nccl_bucket_us = 0;
  t.coloc_plan_us = 0;
  t.coloc_write_us = 0;
  t.coloc_source_us = 0;
  return t;
}

static const bcast_topo_stage *stage(const bcast_topo_pred *p, const char *name) {
  for (size_t i = 0; i < p->nstages; i++)
    if (!strcmp(p->stages[i].name, name)) return &p->stages[i];
  return NULL;
}

static void near(double got, double want, const char *what) {
  cr_assert(fabs(got - want) <= 1e-9 * fmax(1.0, want), "%s: %.12g, want %.12g", what, got, want);
}

static bcast_topo_pred predict_ok(const bcast_plan *p, const bcast_topo_place *pl, const bcast_topo *t,
                                  bcast_topo_layout layout, uint32_t replica) {
  bcast_topo_opts o = {.layout = layout, .replica_gpus = replica};
  bcast_topo_pred out;
  bcast_err e = {0};
  cr_assert_eq(bcast_topo_predict(p, pl, p->world_size, t, &o, &out, &e), BCAST_OK, "%s", e.msg);
  return out;
}

/* Receiver 1 shares the source's node: its stream stays off the NICs. */
Test(bcast_topo, host_transport_one_source) {
  bcast_plan *p = plan_of(one_tensor(BCAST_DTYPE_BF16, BCAST_RES_GPU), BCAST_MODE_HOST, 4);
  cr_assert_eq(p->nbuckets, 4);
  bcast_topo t = small_topo();
  bcast_topo_place pl[4] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  bcast_topo_pred r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  double d2h = GIB / 25e9, nic = 2 * GIB / (20e9 * TCP), h2d = GIB / 25e9;
  near(stage(&r, "d2h")->seconds, d2h, "d2h: the GPU tensors' storage / pageable copies");
  cr_assert(stage(&r, "d2h")->serial, "the engine copies GPU tensors to host before it sends");
  near(stage(&r, "nic")->seconds, nic, "nic: B x receivers off the node / node NICs");
  cr_assert_str_eq(stage(&r, "nic")->where, "node 0 egress");
  near(stage(&r, "h2d")->seconds, h2d, "each receiver's copy to its GPU");
  cr_assert(stage(&r, "h2d")->serial);
  cr_assert_null(stage(&r, "cast"), "bf16 to bf16: no cast");
  cr_assert_null(stage(&r, "tcp"), "no TCP cap");
  cr_assert_eq(r.pipeline_depth, 4);
  near(r.total_s, d2h + h2d + nic, "serial copies around one pipelined stage");

  /* A TCP stream cap of 1.5 GB/s makes each stream the bottleneck. */
  t.tcp_stream_gbps = 1.5;
  r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  near(stage(&r, "tcp")->seconds, GIB / 1.5e9, "tcp: one stream's B / tcp_stream");
  cr_assert_str_eq(stage(&r, "tcp")->where, "source 0");
  near(r.total_s, d2h + h2d + (GIB / 1.5e9 + nic) / 4 + 0.75 * GIB / 1.5e9, "pipelined");

  /* Receivers without a GPU copy nothing after the transfer. */
  bcast_topo_place cpu[4] = {{0, 0}, {0, 1, 1}, {1, 0, 1}, {1, 1, 1}};
  r = predict_ok(p, cpu, &t, BCAST_LAYOUT_ENGINE, 0);
  cr_assert_null(stage(&r, "h2d"), "host receivers");
  bcast_plan_free(p);
}

/* One process's sending thread over its streams, the host they share, the
 * cores, the CPU cast: 1 fp32 source and 3 receivers, all on node 0. */
Test(bcast_topo, host_transport_processes_and_cores) {
  bcast_plan *p = plan_of(one_tensor(BCAST_DTYPE_FP32, BCAST_RES_HOST_PAGEABLE), BCAST_MODE_HOST, 4);
  bcast_topo t = small_topo();
  bcast_topo_place pl[4] = {{0, 0}, {0, 1, 1}, {0, 2, 1}, {0, 3, 1}};
  t.tcp_stream_gbps = 2;
  t.tcp_send_gbps = 4;
  t.host_gbps = 30;
  t.host_cast_gbps = 8;
  bcast_topo_pred r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  cr_assert_null(stage(&r, "nic"), "loopback: no NIC");
  cr_assert_null(stage(&r, "d2h"), "host source");
  /* the thread: max(B / 2, 3B / 4); then 6B of stream ends over 30 GB/s */
  double tcp = 3 * GIB / 4e9 + 6 * GIB / 30e9, cast = 2 * GIB / 8e9;
  near(stage(&r, "tcp")->seconds, tcp, "send thread plus the host");
  near(stage(&r, "cast")->seconds, cast, "fp32 bytes cast on the CPU");
  near(r.total_s, (tcp + cast) / 4 + 0.75 * tcp, "pipelined");
  t.tcp_plan_ms = 20;
  r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  near(r.total_s, (tcp + cast) / 4 + 0.75 * tcp + 0.020, "and the plan's fixed cost");
  t.tcp_plan_ms = 0;

  /* Shared cores: 6B of stream ends over 5 GB/s binds on its own. */
  t.host_cores_gbps = 5;
  r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  near(stage(&r, "cores")->seconds, 6 * GIB / 5e9, "cores");
  cr_assert_str_eq(stage(&r, "cores")->where, "node 0");
  cr_assert_str_eq(bcast_topo_pred_bottleneck(&r)->name, "cores");
  bcast_plan_free(p);

  /* Over TLS each stream is capped by tls_stream instead: B / 0.5. */
  static const uint8_t secret[BCAST_SECRET_BYTES];
  bcast_tensor tn = one_tensor(BCAST_DTYPE_BF16, BCAST_RES_HOST_PAGEABLE);
  bcast_plan_opts po = {.id = "tls", .mode = BCAST_MODE_HOST, .staging_budget = BUDGET, .world_size = 2,
                        .host_endpoint = "127.0.0.1:1", .secret = secret, .tls = 1};
  bcast_err e = {0};
  cr_assert_eq(bcast_plan_build(&tn, 1, &po, &p, &e), BCAST_OK, "%s", e.msg);
  t = small_topo();
  t.tcp_stream_gbps = 2;
  t.tls_stream_gbps = 0.5;
  r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  near(stage(&r, "tcp")->seconds, GIB / 0.5e9, "a TLS stream");
  bcast_plan_free(p);
}

/* 1 source on node 0, 3 receivers on node 1, 1 on node 2: egress 4B beats
 * node 1's ingress 3B, both over 20 GB/s; a pinned source copies nothing
 * off its GPU. */
Test(bcast_topo, host_transport_pinned_source) {
  bcast_plan *p = plan_of(one_tensor(BCAST_DTYPE_BF16, BCAST_RES_HOST_PINNED), BCAST_MODE_HOST, 5);
  bcast_topo t = small_topo();
  bcast_topo_place pl[5] = {{0, 0}, {1, 0}, {1, 1}, {1, 2}, {2, 0}};
  bcast_topo_pred r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  /* egress 4B / 20 GB/s; node 1 ingress 3B / 20 GB/s */
  near(stage(&r, "nic")->seconds, 4 * GIB / (20e9 * TCP), "egress");
  cr_assert_str_eq(stage(&r, "nic")->where, "node 0 egress");
  cr_assert_null(stage(&r, "d2h"), "pinned source: nothing to copy off the GPU");
  bcast_plan_free(p);
}

Test(bcast_topo, nccl_ring_across_nodes) {
  bcast_plan *p = plan_of(one_tensor(BCAST_DTYPE_BF16, BCAST_RES_GPU), BCAST_MODE_DIRECT, 4);
  bcast_topo t = small_topo();
  bcast_topo_place pl[4] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  bcast_topo_pred r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  cr_assert_eq(r.nstages, 1);
  near(stage(&r, "ring")->seconds, GIB / 20e9, "ring: B / slowest link (the NICs)");
  cr_assert_str_eq(stage(&r, "ring")->where, "rank 1 -> 2 (nic)");
  near(r.latency_s, 3 * 10e-6, "3 hops");
  near(r.total_s, GIB / 20e9 + 30e-6, "one stage: its time plus the hops");

  /* Each bucket's NCCL group costs a fixed time. */
  t.nccl_bucket_us = 50;
  r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  near(stage(&r, "ring")->seconds, GIB / 20e9 + 4 * 50e-6, "ring: B / link + 4 buckets' fixed cost");
  t.nccl_bucket_us = 0;

  /* All on one node: NVLink sets the rate. */
  bcast_topo_place one[4] = {{0, 0}, {0, 1}, {0, 2}, {0, 3}};
  r = predict_ok(p, one, &t, BCAST_LAYOUT_ENGINE, 0);
  near(stage(&r, "ring")->seconds, GIB / 400e9, "ring over NVLink");
  bcast_plan_free(p);
}

Test(bcast_topo, staged_cast_from_fp32_host) {
  bcast_plan *p = plan_of(one_tensor(BCAST_DTYPE_FP32, BCAST_RES_HOST_PINNED), BCAST_MODE_STAGED, 2);
  bcast_topo t = small_topo();
  bcast_topo_place pl[2] = {{0, 0}, {0, 1}};
  bcast_topo_pred r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  double h2d = 2 * GIB / 50e9, cast = 2 * GIB / 100e9, ring = GIB / 400e9;
  near(stage(&r, "h2d")->seconds, h2d, "fp32 bytes over the host link");
  near(stage(&r, "cast")->seconds, cast, "fp32 bytes cast");
  near(stage(&r, "ring")->seconds, ring, "bf16 bytes over NVLink");
  near(r.total_s, (h2d + cast + ring) / 4 + 0.75 * h2d + 10e-6, "pipelined, one hop");
  bcast_plan_free(p);
}

Test(bcast_topo, colocated_copies_per_receiver) {
  bcast_plan *p = plan_of(one_tensor(BCAST_DTYPE_BF16, BCAST_RES_GPU), BCAST_MODE_COLOCATED, 3);
  bcast_topo t = small_topo();
  bcast_topo_place pl[3] = {{1, 2}, {1, 2}, {1, 2}};
  bcast_topo_pred r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  cr_assert_eq(r.nstages, 1);
  near(stage(&r, "d2d")->seconds, 2 * GIB / 2000e9, "two device copies");
  bcast_plan_free(p);
}

/* An fp32 GPU master cast into the first receiver, copied to the second, on
 * one stream of one GPU's memory: the two add; every write a launch, and
 * fixed costs per plan and per source. */
Test(bcast_topo, colocated_cast_copies_and_fixed_costs) {
  bcast_plan *p = plan_of(one_tensor(BCAST_DTYPE_FP32, BCAST_RES_GPU), BCAST_MODE_COLOCATED, 3);
  bcast_topo t = small_topo();
  t.coloc_write_us = 5;
  t.coloc_plan_us = 300;
  bcast_topo_place pl[3] = {{0, 0}, {0, 0}, {0, 0}};
  bcast_topo_pred r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  double mem = 2 * GIB / 100e9 + GIB / 2000e9 + 4 * 2 * 5e-6; /* 4 slices into 2 receivers */
  near(stage(&r, "d2d")->seconds, mem, "cast, then the copy, then the launches");
  cr_assert_null(stage(&r, "h2d"), "nothing in host memory");
  near(r.latency_s, 300e-6, "the plan's fixed cost");
  near(r.total_s, mem + 300e-6, "one stage and the fixed cost");
  bcast_plan_free(p);

  /* Two sources: one more source's fixed cost. */
  p = sharded_plan(4, BCAST_MODE_COLOCATED);
  t.coloc_source_us = 100;
  bcast_topo_place four[4] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
  r = predict_ok(p, four, &t, BCAST_LAYOUT_ENGINE, 0);
  near(r.latency_s, 400e-6, "plan + one more source");
  bcast_plan_free(p);
}

Test(bcast_topo, multiroot_relays_and_shares) {
  bcast_plan *p = sharded_plan(6, BCAST_MODE_HOST);
  cr_assert_eq(p->nsources, 2);
  bcast_topo t = small_topo();
  /* sources on node 0, receivers 0,1 on node 1 and 2,3 on node 2 */
  bcast_topo_place pl[6] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 0}, {2, 1}};
  /* Replicas of 2 GPUs: each node needs both shares once (B), each source
   * sends W_j / 2 per (node, share), 4 of them: B over its own 10 GB/s NIC. */
  bcast_topo_pred r = predict_ok(p, pl, &t, BCAST_LAYOUT_MULTIROOT, 2);
  near(stage(&r, "nic")->seconds, GIB / 10e9, "source egress over one NIC");
  cr_assert_str_eq(stage(&r, "nic")->where, "source 0 egress");
  cr_assert_null(stage(&r, "nvlink"), "each receiver got its share from the NIC");
  cr_assert_eq(r.pipeline_depth, 2);
  near(r.total_s, GIB / 10e9, "one stage");

  /* Whole replicas: a node takes the model once (B / 20 GB/s), each source
   * sends W_j per node (B); receivers swap halves over NVLink (B / 2). */
  r = predict_ok(p, pl, &t, BCAST_LAYOUT_MULTIROOT, 1);
  near(stage(&r, "nic")->seconds, GIB / 10e9, "egress");
  near(stage(&r, "nvlink")->seconds, GIB / 2 / 400e9, "relay fan-out");
  near(r.total_s, (GIB / 10e9 + GIB / 2 / 400e9) / 2 + 0.5 * GIB / 10e9, "pipelined");

  /* Four sources' worth of NIC contention: 2 sources on a node of 1 NIC
   * share it. */
  t.nics_per_node = 1;
  r = predict_ok(p, pl, &t, BCAST_LAYOUT_MULTIROOT, 2);
  near(stage(&r, "nic")->seconds, GIB / 5e9, "two sources on one 10 GB/s NIC");
  bcast_plan_free(p);
}

Test(bcast_topo, multiroot_inside_one_node) {
  bcast_plan *p = sharded_plan(4, BCAST_MODE_HOST);
  bcast_topo t = small_topo();
  bcast_topo_place pl[4] = {{0, 0}, {0, 1}, {0, 2}, {0, 3}};
  /* No NIC: each source hands its half to a relay over NVLink (B / 2), the
   * two receivers swap halves (B / 2 each). */
  bcast_topo_pred r = predict_ok(p, pl, &t, BCAST_LAYOUT_MULTIROOT, 1);
  cr_assert_null(stage(&r, "nic"), "nothing leaves the node");
  near(stage(&r, "nvlink")->seconds, GIB / 2 / 400e9, "nvlink");
  near(r.total_s, GIB / 2 / 400e9, "one stage");
  bcast_plan_free(p);
}

/* Nodes that differ: node 1 has one NIC of 40 Gb/s (5 GB/s), the others
 * the uniform 2 x 80 Gb/s. */
static const bcast_topo_node mixed[3] = {{2, 80}, {1, 40}, {2, 80}};

Test(bcast_topo, nodes_of_their_own_nics) {
  bcast_plan *p = plan_of(one_tensor(BCAST_DTYPE_BF16, BCAST_RES_HOST_PINNED), BCAST_MODE_HOST, 4);
  bcast_topo t = small_topo();
  t.node = mixed;
  /* 1 receiver on node 1 (B over 5 GB/s), 2 on node 2 (2B over 20 GB/s) */
  bcast_topo_place pl[4] = {{0, 0}, {1, 0, 1}, {2, 0, 1}, {2, 1, 1}};
  bcast_topo_pred r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  near(stage(&r, "nic")->seconds, GIB / (5e9 * TCP), "node 1's one slow NIC");
  cr_assert_str_eq(stage(&r, "nic")->where, "node 1 ingress");
  bcast_plan_free(p);

  /* An NCCL ring through node 1 runs at its NICs' rate. */
  p = plan_of(one_tensor(BCAST_DTYPE_BF16, BCAST_RES_GPU), BCAST_MODE_DIRECT, 3);
  bcast_topo_place ring[3] = {{0, 0}, {1, 0}, {2, 0}};
  r = predict_ok(p, ring, &t, BCAST_LAYOUT_ENGINE, 0);
  near(stage(&r, "ring")->seconds, GIB / 5e9, "the slower end of each link");
  cr_assert_str_eq(stage(&r, "ring")->where, "rank 0 -> 1 (nic)");
  bcast_plan_free(p);

  /* Multiroot: a source on node 1 sends over its one 5 GB/s NIC. */
  p = sharded_plan(4, BCAST_MODE_HOST);
  bcast_topo_place mr[4] = {{1, 0}, {0, 0}, {2, 0}, {2, 1}};
  r = predict_ok(p, mr, &t, BCAST_LAYOUT_MULTIROOT, 2);
  /* source 0 (node 1) sends its half's halves to node 2's 2 relays: B / 2 */
  near(stage(&r, "nic")->seconds, GIB / 2 / 5e9, "source 0's own NIC");
  cr_assert_str_eq(stage(&r, "nic")->where, "source 0 egress");
  bcast_plan_free(p);
}

/* 1 source on node 0, receivers 1, 2 on node 1 and 3, 4 on node 2. */
static const bcast_topo_place relay_pl[5] = {{0, 0}, {1, 0, 1}, {1, 1, 1}, {2, 0, 1}, {2, 1, 1}};

static bcast_topo_pred predict_relays(const bcast_plan *p, const bcast_topo *t, const uint32_t *rf) {
  bcast_topo_opts o = {.layout = BCAST_LAYOUT_ENGINE, .relay_from = rf};
  bcast_topo_pred out;
  bcast_err e = {0};
  cr_assert_eq(bcast_topo_predict(p, relay_pl, p->world_size, t, &o, &out, &e), BCAST_OK, "%s", e.msg);
  return out;
}

Test(bcast_topo, relays_carry_the_model_once_per_node) {
  bcast_plan *p = plan_of(one_tensor(BCAST_DTYPE_BF16, BCAST_RES_HOST_PINNED), BCAST_MODE_HOST, 5);
  bcast_topo t = small_topo();
  t.tcp_stream_gbps = 4;
  bcast_topo_pred direct = predict_relays(p, &t, NULL);
  near(stage(&direct, "nic")->seconds, 4 * GIB / (20e9 * TCP), "4 streams leave node 0");
  cr_assert_eq(direct.relays, 0);

  /* Receivers 1 and 3 relay to their node's other receiver. */
  const uint32_t rf[5] = {0, 0, 1, 0, 3};
  bcast_topo_pred r = predict_relays(p, &t, rf);
  cr_assert_eq(r.relays, 2);
  near(stage(&r, "nic")->seconds, 2 * GIB / (20e9 * TCP), "the model leaves node 0 once per node");
  near(stage(&r, "tcp")->seconds, GIB / 4e9, "the source's streams");
  near(stage(&r, "relay")->seconds, GIB / 4e9, "the relay's forward: one stream");
  cr_assert_str_eq(stage(&r, "relay")->where, "relay 1");
  double nic = 2 * GIB / (20e9 * TCP), tcp = GIB / 4e9;
  near(r.total_s, (nic + 2 * tcp) / 4 + 0.75 * tcp, "the forward is one more pipelined stage");

  /* A chain: 1 <- 0, 2 <- 1, 3 <- 2, 4 <- 3. */
  const uint32_t chain[5] = {0, 0, 1, 2, 3};
  r = predict_relays(p, &t, chain);
  cr_assert_eq(r.relays, 3);
  near(stage(&r, "nic")->seconds, GIB / (20e9 * TCP), "each link of the chain carries B once");

  /* Every receiver from the source, spelled out: the same as no relay_from. */
  const uint32_t all[5] = {0, 0, 0, 0, 0};
  r = predict_relays(p, &t, all);
  cr_assert_eq(r.nstages, direct.nstages);
  for (size_t i = 0; i < r.nstages; i++) {
    cr_assert_str_eq(r.stages[i].name, direct.stages[i].name);
    near(r.stages[i].seconds, direct.stages[i].seconds, r.stages[i].name);
    cr_assert_str_eq(r.stages[i].where, direct.stages[i].where);
  }
  near(r.total_s, direct.total_s, "total");
  cr_assert_eq(r.relays, 0);
  bcast_plan_free(p);
}

Test(bcast_topo, relays_by_node) {
  bcast_plan *p = plan_of(one_tensor(BCAST_DTYPE_BF16, BCAST_RES_HOST_PINNED), BCAST_MODE_HOST, 6);
  bcast_topo t = small_topo();
  /* receiver 1 on the source's node; 2, 4 on node 1; 3, 5 on node 2 */
  bcast_topo_place pl[6] = {{0, 0}, {0, 1}, {1, 0}, {2, 0}, {1, 1}, {2, 1}};
  const char *node[6] = {"n0", "n0", "n1", "n2", "n1", "n2"};
  uint32_t rf[6];
  bcast_err e = {0};
  /* The engine's one-relay-per-node layout, priced by the model. */
  cr_assert_eq(bcast_relay_layout(6, 0, node, NULL, rf), 2);
  const uint32_t want[6] = {0, 0, 0, 0, 2, 3};
  for (int r = 0; r < 6; r++) cr_assert_eq(rf[r], want[r], "relay_from[%d] %u, want %u", r, rf[r], want[r]);
  /* NIC-bound: the model leaves node 0 twice instead of four times. */
  bcast_topo_opts o = {.layout = BCAST_LAYOUT_ENGINE, .relay_from = rf};
  bcast_topo_pred with, without;
  cr_assert_eq(bcast_topo_predict(p, pl, 6, &t, &o, &with, &e), BCAST_OK, "%s", e.msg);
  cr_assert_eq(with.relays, 2);
  o.relay_from = NULL;
  cr_assert_eq(bcast_topo_predict(p, pl, 6, &t, &o, &without, &e), BCAST_OK, "%s", e.msg);
  near(stage(&with, "nic")->seconds, 2 * GIB / (20e9 * TCP), "with relays");
  near(stage(&without, "nic")->seconds, 4 * GIB / (20e9 * TCP), "without");
  bcast_plan_free(p);
}

static void relay_refused(const bcast_plan *p, const bcast_topo_place *pl, bcast_topo_layout layout,
                          const uint32_t *rf, const char *needle) {
  bcast_topo t = small_topo();
  bcast_topo_opts o = {.layout = layout, .replica_gpus = 1, .relay_from = rf};
  bcast_topo_pred out;
  bcast_err e = {0};
  cr_assert_eq(bcast_topo_predict(p, pl, p->world_size, &t, &o, &out, &e), BCAST_EINVAL, "want: %s", needle);
  cr_assert(strstr(e.msg, needle), "'%s' does not say '%s'", e.msg, needle);
}

Test(bcast_topo, relay_from_refusals_name_the_field) {
  bcast_plan *p = plan_of(one_tensor(BCAST_DTYPE_BF16, BCAST_RES_HOST_PINNED), BCAST_MODE_HOST, 5);
  const uint32_t src[5] = {1, 0, 0, 0, 0}, range[5] = {0, 0, 9, 0, 0}, self[5] = {0, 0, 2, 0, 0},
                 cycle[5] = {0, 2, 1, 0, 0}, ok[5] = {0, 0, 1, 0, 3};
  relay_refused(p, relay_pl, BCAST_LAYOUT_ENGINE, src, "relay_from[0] 1: the source takes from no one");
  relay_refused(p, relay_pl, BCAST_LAYOUT_ENGINE, range, "relay_from[2] 9 >= world_size 5");
  relay_refused(p, relay_pl, BCAST_LAYOUT_ENGINE, self, "relay_from[2] 2: a receiver takes from another rank");
  relay_refused(p, relay_pl, BCAST_LAYOUT_ENGINE, cycle, "relay_from[1] 2: its chain never reaches the source");
  relay_refused(p, relay_pl, BCAST_LAYOUT_MULTIROOT, ok, "relay_from: relays are for the engine layout, not multiroot");
  bcast_plan_free(p);

  p = plan_of(one_tensor(BCAST_DTYPE_BF16, BCAST_RES_GPU), BCAST_MODE_DIRECT, 5);
  relay_refused(p, relay_pl, BCAST_LAYOUT_ENGINE, ok, "relay_from: relays are for host mode, not direct");
  bcast_plan_free(p);

  p = sharded_plan(5, BCAST_MODE_HOST);
  const uint32_t two[5] = {0, 1, 0, 0, 2};
  relay_refused(p, relay_pl, BCAST_LAYOUT_ENGINE, two, "relay_from: relays are for plans of one source, not 2");
  bcast_plan_free(p);

  /* A receiver view (rank 1 takes half the tensor). */
  static const uint8_t secret[BCAST_SECRET_BYTES];
  static const bcast_part_spec half[] = {{"w", {BCAST_PART_SLICE, 0, 0, ELEMS / 2}}};
  bcast_receiver_view rv[5] = {{0}, {half, 1}};
  bcast_tensor tn = one_tensor(BCAST_DTYPE_BF16, BCAST_RES_HOST_PINNED);
  bcast_plan_opts po = {.id = "views", .mode = BCAST_MODE_HOST, .staging_budget = BUDGET, .world_size = 5,
                        .host_endpoint = "127.0.0.1:1", .secret = secret, .receiver_views = rv};
  bcast_err e = {0};
  cr_assert_eq(bcast_plan_build(&tn, 1, &po, &p, &e), BCAST_OK, "%s", e.msg);
  relay_refused(p, relay_pl, BCAST_LAYOUT_ENGINE, ok, "relay_from: relays are for plans without receiver views");
  bcast_plan_free(p);
}

/* TCP over Ethernet: each frame of MTU + 38 bytes on the wire carries MTU -
 * 52 bytes of the stream. A 1 GB model from node 0 to node 1 over one
 * 1 Gb/s NIC each: 8 s at the full rate. */
Test(bcast_topo, host_transport_pays_the_framing_of_its_nic) {
  bcast_tensor tn = one_tensor(BCAST_DTYPE_BF16, BCAST_RES_HOST_PINNED);
  tn.shape[0] = 500000000; /* 1e9 bytes of bf16 */
  bcast_plan *p = plan_of(tn, BCAST_MODE_HOST, 2);
  bcast_topo t = small_topo();
  t.nics_per_node = 1;
  t.nic_gbits = 1;
  t.mtu = 1500;
  bcast_topo_place pl[2] = {{0, 0}, {1, 0, 1}}; /* a host receiver: no copy to a GPU */
  bcast_topo_pred r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  cr_assert_eq(r.nstages, 1, "the NIC alone");
  near(stage(&r, "nic")->seconds, 8.0 * 1538 / 1448, "MTU 1500, 38 bytes a frame");
  near(r.total_s, 8.0 * 1538 / 1448, "total");
  near(stage(&r, "nic")->gbps, 0.125 * 1448 / 1538, "TCP's rate of the NIC");

  t.mtu = 0; /* unknown: 1500 assumed */
  r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  near(r.total_s, 8.0 * 1538 / 1448, "MTU unknown");

  /* Jumbo frames through a tc shaper, which counts the Ethernet header only. */
  t.mtu = 9000;
  t.nic_frame_bytes = 14;
  r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  near(r.total_s, 8.0 * 9014 / 8948, "MTU 9000, 14 bytes a frame");

  /* A node's own MTU beats the uniform one: node 1's small frames. */
  const bcast_topo_node own[3] = {{1, 1, 9000}, {1, 1, 576}, {1, 1, 9000}};
  t.node = own;
  r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  near(r.total_s, 8.0 * 590 / 524, "node 1 ingress at MTU 576");
  cr_assert_str_eq(stage(&r, "nic")->where, "node 1 ingress");
  bcast_plan_free(p);

  /* An NCCL ring over the same NICs keeps their full rate. */
  tn.residency = BCAST_RES_GPU;
  p = plan_of(tn, BCAST_MODE_DIRECT, 2);
  pl[1].host = 0;
  r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  near(stage(&r, "ring")->seconds, 8.0, "NCCL: the NICs' rate");
  bcast_plan_free(p);
}

Test(bcast_topo, describe_in_one_line) {
  bcast_plan *p = plan_of(one_tensor(BCAST_DTYPE_BF16, BCAST_RES_GPU), BCAST_MODE_HOST, 5);
  bcast_topo t = small_topo();
  const uint32_t rf[5] = {0, 0, 1, 0, 3};
  bcast_topo_place pl[5] = {{0, 0}, {1, 0}, {1, 1}, {2, 0}, {2, 1}};
  bcast_topo_opts o = {.layout = BCAST_LAYOUT_ENGINE, .relay_from = rf};
  bcast_topo_pred r;
  bcast_err e = {0};
  cr_assert_eq(bcast_topo_predict(p, pl, 5, &t, &o, &r, &e), BCAST_OK, "%s", e.msg);
  char line[512];
  size_t n = bcast_topo_pred_describe(&r, line, sizeof line);
  cr_assert_eq(n, strlen(line));
  char want[128];
  snprintf(want, sizeof want, "engine+relays %.3f s: d2h %.3f s at source 0 (1.07 GB at 25.0 GB/s, serial)",
           r.total_s, GIB / 25e9);
  cr_assert(!strncmp(line, want, strlen(want)), "'%s' does not start '%s'", line, want);
  cr_assert(strstr(line, ", nic 0.114 s at node 0 egress (2.15 GB at 18.8 GB/s)"), "%s", line);
  cr_assert(strstr(line, "; 4 buckets deep, 2 relays"), "%s", line);
  cr_assert_str_eq(bcast_topo_pred_bottleneck(&r)->name, "nic");

  /* Too short a buffer: cut, terminated, and the whole length returned. */
  char small[16];
  cr_assert_eq(bcast_topo_pred_describe(&r, small, sizeof small), n);
  cr_assert_eq(strlen(small), sizeof small - 1);
  cr_assert(!strncmp(small, line, sizeof small - 1));
  cr_assert_eq(bcast_topo_pred_describe(&r, NULL, 0), n);
  bcast_topo_pred none = {0};
  cr_assert_null(bcast_topo_pred_bottleneck(&none));
  bcast_plan_free(p);
}

static void refused(const bcast_plan *p, const bcast_topo_place *pl, size_t n, const bcast_topo *t,
                    bcast_topo_layout layout, uint32_t replica, const char *needle) {
  bcast_topo_opts o = {.layout = layout, .replica_gpus = replica};
  bcast_topo_pred out;
  bcast_err e = {0};
  cr_assert_eq(bcast_topo_predict(p, pl, n, t, &o, &out, &e), BCAST_EINVAL, "want a refusal: %s", needle);
  cr_assert(strstr(e.msg, needle), "'%s' does not say '%s'", e.msg, needle);
}

Test(bcast_topo, refusals_name_the_field) {
  bcast_plan *p = plan_of(one_tensor(BCAST_DTYPE_BF16, BCAST_RES_GPU), BCAST_MODE_HOST, 3);
  bcast_topo_place pl[3] = {{0, 0}, {1, 0}, {1, 1}};
  const char *fields[] = {"nodes",          "gpus_per_node",   "nics_per_node",  "h2d_gbps",
                          "nvlink_gbps",    "d2d_gbps",        "cast_gbps",      "nic_gbits",
                          "tcp_stream_gbps", "hop_latency_us", "tcp_send_gbps",  "host_gbps",
                          "host_cores_gbps", "host_cast_gbps", "pageable_gbps",  "nccl_bucket_us",
                          "coloc_plan_us",  "coloc_write_us",  "coloc_source_us", "node[1].nics 0 must be >= 1",
                          "node[2].nic_gbits 0 must be > 0", "tls_stream_gbps", "tcp_plan_ms",
                          "nic_frame_bytes -1 must be >= 0", "mtu 52 must be 0 (unknown) or >= 68",
                          "node[1].mtu 67 must be 0 (unknown) or >= 68"};
  const bcast_topo_node no_nics[3] = {{2, 80}, {0, 80}, {2, 80}}, no_rate[3] = {{2, 80}, {1, 40}, {2, 0}};
  const bcast_topo_node tiny_mtu[3] = {{2, 80, 1500}, {2, 80, 67}, {2, 80, 0}};
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    bcast_topo t = small_topo();
    switch (i) {
    case 0: t.nodes = 0; break;
    case 1: t.gpus_per_node = 0; break;
    case 2: t.nics_per_node = 0; break;
    case 3: t.h2d_gbps = 0; break;
    case 4: t.nvlink_gbps = -1; break;
    case 5: t.d2d_gbps = NAN; break;
    case 6: t.cast_gbps = INFINITY; break;
    case 7: t.nic_gbits = 0; break;
    case 8: t.tcp_stream_gbps = -1; break;
    case 9: t.hop_latency_us = -5; break;
    case 10: t.tcp_send_gbps = -1; break;
    case 11: t.host_gbps = NAN; break;
    case 12: t.host_cores_gbps = -2; break;
    case 13: t.host_cast_gbps = INFINITY; break;
    case 14: t.pageable_gbps = 0; break;
    case 15: t.nccl_bucket_us = -1; break;
    case 16: t.coloc_plan_us = NAN; break;
    case 17: t.coloc_write_us = -1; break;
    case 18: t.coloc_source_us = -1; break;
    case 19: t.node = no_nics; break;
    case 20: t.node = no_rate; break;
    case 21: t.tls_stream_gbps = -1; break;
    case 22: t.tcp_plan_ms = NAN; break;
    case 23: t.nic_frame_bytes = -1; break;
    case 24: t.mtu = 52; break;
    case 25: t.node = tiny_mtu; break;
    }
    refused(p, pl, 3, &t, BCAST_LAYOUT_ENGINE, 0, fields[i]);
  }
  bcast_topo t = small_topo();
  bcast_topo_place off[3] = {{0, 0}, {1, 0}, {1, 4}};
  refused(p, off, 3, &t, BCAST_LAYOUT_ENGINE, 0, "placement[2].gpu 4 >= gpus_per_node 4");
  bcast_topo_place far[3] = {{0, 0}, {3, 0}, {1, 1}};
  refused(p, far, 3, &t, BCAST_LAYOUT_ENGINE, 0, "placement[1].node 3 >= nodes 3");
  refused(p, pl, 2, &t, BCAST_LAYOUT_ENGINE, 0, "2 places for a plan of 3 ranks");
  refused(p, pl, 3, &t, BCAST_LAYOUT_ENGINE, 2, "replica_gpus 2: the engine layout");
  refused(p, pl, 3, &t, BCAST_LAYOUT_MULTIROOT, 3, "replica_gpus 3 does not divide the 2 receivers");
  refused(p, pl, 3, &t, (bcast_topo_layout)7, 0, "layout 7 is unknown");
  bcast_plan_free(p);

  p = plan_of(one_tensor(BCAST_DTYPE_BF16, BCAST_RES_GPU), BCAST_MODE_COLOCATED, 3);
  refused(p, pl, 3, &t, BCAST_LAYOUT_ENGINE, 0, "placement[1]: a colocated plan's ranks share");
  bcast_plan_free(p);
}
