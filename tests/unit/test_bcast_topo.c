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
static bcast_plan *sharded_plan(uint32_t world) {
  bcast_tensor a = one_tensor(BCAST_DTYPE_BF16, BCAST_RES_GPU), b = a;
  a.shard_offset = 0, a.shard_elems = ELEMS / 2;
  b.shard_offset = ELEMS / 2, b.shard_elems = ELEMS / 2;
  const bcast_tensor *ranks[2] = {&a, &b};
  size_t n[2] = {1, 1};
  bcast_shard_map *m = NULL;
  bcast_err e = {0};
  cr_assert_eq(bcast_shards_check(ranks, n, 2, NULL, &m, &e), BCAST_OK, "%s", e.msg);
  static const uint8_t secret[BCAST_SECRET_BYTES];
  bcast_plan_opts o = {.id = "topo2", .mode = BCAST_MODE_HOST, .staging_budget = BUDGET,
                       .world_size = world, .host_endpoint = "127.0.0.1:1", .secret = secret};
  bcast_plan *p = NULL;
  cr_assert_eq(bcast_plan_build_sharded(m, &o, &p, &e), BCAST_OK, "%s", e.msg);
  bcast_shard_map_free(m);
  return p;
}

/* 3 nodes of 4 GPUs; 2 NICs of 80 Gb/s (10 GB/s each, 20 GB/s a node). */
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
  t.hop_latency_us = 10;
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

Test(bcast_topo, host_transport_one_source) {
  bcast_plan *p = plan_of(one_tensor(BCAST_DTYPE_BF16, BCAST_RES_GPU), BCAST_MODE_HOST, 4);
  cr_assert_eq(p->nbuckets, 4);
  bcast_topo t = small_topo();
  bcast_topo_place pl[4] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  bcast_topo_pred r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  double d2h = GIB / 50e9, nic = 3 * GIB / 20e9, h2d = GIB / 50e9;
  near(stage(&r, "d2h")->seconds, d2h, "d2h: B / h2d");
  /* egress 3B / 20 GB/s beats node 1's ingress 2B / 20 GB/s */
  near(stage(&r, "nic")->seconds, nic, "nic: B x receivers / node NICs");
  cr_assert_str_eq(stage(&r, "nic")->where, "source 0 egress");
  near(stage(&r, "h2d")->seconds, h2d, "receivers' h2d");
  cr_assert_null(stage(&r, "cast"), "bf16 to bf16: no cast");
  cr_assert_eq(r.pipeline_depth, 4);
  near(r.total_s, (d2h + nic + h2d) / 4 + 0.75 * nic, "pipelined total");

  /* A TCP stream cap of 1.5 GB/s makes each stream the bottleneck. */
  t.tcp_stream_gbps = 1.5;
  r = predict_ok(p, pl, &t, BCAST_LAYOUT_ENGINE, 0);
  near(stage(&r, "nic")->seconds, GIB / 1.5e9, "nic: one stream's B / tcp_stream");
  cr_assert_str_eq(stage(&r, "nic")->where, "source 0 tcp stream");
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
  near(stage(&r, "nic")->seconds, 4 * GIB / 20e9, "egress");
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

Test(bcast_topo, multiroot_relays_and_shares) {
  bcast_plan *p = sharded_plan(6);
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
  bcast_plan *p = sharded_plan(4);
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
  const char *fields[] = {"nodes", "gpus_per_node", "nics_per_node", "h2d_gbps", "nvlink_gbps",
                          "d2d_gbps", "cast_gbps", "nic_gbits", "tcp_stream_gbps", "hop_latency_us"};
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
