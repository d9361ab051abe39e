/* A plan's topology from its participants' reports (daemon/topology.c):
 * nodes by name, else by host id; GPUs shared or not; each node's NICs the
 * best any of its workers reports, else the configured default, said in the
 * note; the slowest measured host-to-device rate; bad input refused; and
 * GetTopology's view of it, node by node. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/daemon/topology.h"

#define MAXW 8

typedef struct {
  Rlorch__V1__Capabilities caps[MAXW];
  Rlorch__V1__Topology topo[MAXW];
  Rlorch__V1__Nic nic[MAXW][2];
  Rlorch__V1__Nic *nicp[MAXW][2];
  const Rlorch__V1__Capabilities *cp[MAXW];
  size_t n;
} fleet;

/* A worker: node ("" to leave it to host_id), host id, GPU bus id ("" for
 * none), and up to two NIC speeds (0: none reported). */
static void add(fleet *f, const char *node, const char *host, const char *gpu, double nic0,
                double nic1) {
  size_t i = f->n++;
  Rlorch__V1__Capabilities *c = &f->caps[i];
  Rlorch__V1__Topology *t = &f->topo[i];
  rlorch__v1__capabilities__init(c);
  rlorch__v1__topology__init(t);
  c->host_id = (char *)host;
  t->node = (char *)node;
  t->gpu_pci_bus_id = (char *)gpu;
  double g[2] = {nic0, nic1};
  for (int k = 0; k < 2; k++) {
    if (g[k] <= 0) continue;
    Rlorch__V1__Nic *n = &f->nic[i][k];
    rlorch__v1__nic__init(n);
    n->name = (char *)(k ? "eth1" : "eth0");
    n->gbits = g[k];
    f->nicp[i][t->n_nics++] = n;
  }
  t->nics = f->nicp[i];
  c->topology = t;
  f->cp[i] = c;
}

/* Worker i's NICs' MTUs (0: not reported), in the order add gave them. */
static void mtus(fleet *f, size_t i, uint32_t mtu0, uint32_t mtu1) {
  uint32_t m[2] = {mtu0, mtu1};
  for (size_t k = 0; k < f->topo[i].n_nics && k < 2; k++) f->nicp[i][k]->mtu = m[k];
}

static bcast_topo base(void) {
  bcast_topo t;
  bcast_topo_default(&t, 1);
  t.nics_per_node = 2;
  t.nic_gbits = 25;
  return t;
}

Test(topology, nodes_by_name_then_host_id_and_gpus_by_identity) {
  fleet f = {0};
  add(&f, "a", "boot-1", "0000:01:00.0", 100, 100); /* trainer on a */
  add(&f, "a", "boot-1", "0000:01:00.0", 0, 0);     /* colocated receiver: same GPU */
  add(&f, "a", "boot-1", "0000:02:00.0", 0, 0);     /* a's second GPU */
  add(&f, "", "boot-2", "", 0.2, 0);                /* no node name: its host id; no GPU */
  add(&f, "", "boot-2", "", 0, 0);                  /* a second CPU worker on boot-2 */
  mtus(&f, 0, 9000, 9000);
  mtus(&f, 3, 1500, 0);
  bcast_topo b = base();
  topology t;
  char err[256] = "";
  cr_assert_eq(topology_build(f.cp, f.n, &b, &t, err, sizeof err), 0, "%s", err);
  cr_assert_eq(t.topo.nodes, 2);
  cr_assert_str_eq(topology_node_name(&t, 0), "a");
  cr_assert_str_eq(topology_node_name(&t, 1), "boot-2");
  cr_assert_eq(t.nplace, 5);
  cr_assert_eq(t.place[0].node, 0);
  cr_assert_eq(t.place[1].gpu, t.place[0].gpu, "one GPU, one place");
  cr_assert_neq(t.place[2].gpu, t.place[0].gpu);
  cr_assert(!t.place[0].host && !t.place[2].host);
  cr_assert(t.place[3].host && t.place[4].host, "CPU workers are host-only");
  cr_assert_neq(t.place[3].gpu, t.place[4].gpu, "two CPU workers are two places");
  cr_assert_eq(t.topo.gpus_per_node, 2);
  cr_assert_eq(t.topo.node, t.node);
  cr_assert_eq(t.node[0].nics, 2);
  cr_assert_float_eq(t.node[0].nic_gbits, 100, 1e-9);
  cr_assert_eq(t.node[1].nics, 1);
  cr_assert_float_eq(t.node[1].nic_gbits, 0.2, 1e-12);
  cr_assert_eq(t.node[0].mtu, 9000);
  cr_assert_eq(t.node[1].mtu, 1500);
  cr_assert_str_eq(t.note, "", "nothing assumed: %s", t.note);
  topology_free(&t);
  cr_assert_null(t.place);
}

Test(topology, a_node_without_nic_speeds_gets_the_default_and_says_so) {
  fleet f = {0};
  add(&f, "t", "h", "", 40, 0);
  add(&f, "quiet", "h2", "", 0, 0);
  add(&f, "quiet", "h2", "", 0, 0);
  bcast_topo b = base();
  topology t;
  char err[256] = "";
  cr_assert_eq(topology_build(f.cp, f.n, &b, &t, err, sizeof err), 0, "%s", err);
  cr_assert_eq(t.node[1].nics, 2);
  cr_assert_float_eq(t.node[1].nic_gbits, 25, 1e-9);
  cr_assert(strstr(t.note, "node quiet reports no NIC speed: 2 x 25 Gb/s assumed"), "%s", t.note);
  topology_free(&t);
}

Test(topology, the_best_report_of_a_node_wins_and_nic_speeds_average) {
  fleet f = {0};
  add(&f, "n", "h", "", 10, 0);   /* a container that sees one NIC */
  add(&f, "n", "h", "", 100, 50); /* one that sees both */
  bcast_topo b = base();
  topology t;
  char err[256] = "";
  cr_assert_eq(topology_build(f.cp, f.n, &b, &t, err, sizeof err), 0, "%s", err);
  cr_assert_eq(t.topo.nodes, 1);
  cr_assert_eq(t.node[0].nics, 2);
  cr_assert_float_eq(t.node[0].nic_gbits, 75, 1e-9);
  topology_free(&t);
}

Test(topology, the_slowest_measured_h2d_rate_is_taken) {
  fleet f = {0};
  add(&f, "n", "h", "0000:01:00.0", 0, 0);
  add(&f, "n", "h", "0000:02:00.0", 0, 0);
  add(&f, "n", "h", "0000:03:00.0", 0, 0);
  f.topo[0].h2d_gbps = 52;
  f.topo[1].h2d_gbps = 48;
  bcast_topo b = base();
  topology t;
  char err[256] = "";
  cr_assert_eq(topology_build(f.cp, f.n, &b, &t, err, sizeof err), 0, "%s", err);
  cr_assert_float_eq(t.topo.h2d_gbps, 48, 1e-9);
  topology_free(&t);
  f.topo[0].h2d_gbps = f.topo[1].h2d_gbps = 0;
  cr_assert_eq(topology_build(f.cp, f.n, &b, &t, err, sizeof err), 0, "%s", err);
  cr_assert_float_eq(t.topo.h2d_gbps, b.h2d_gbps, 1e-9, "no measurement: the configured rate");
  topology_free(&t);
}

Test(topology, workers_that_report_nothing_share_one_unknown_node) {
  const Rlorch__V1__Capabilities *cp[3] = {NULL, NULL, NULL};
  Rlorch__V1__Capabilities bare;
  rlorch__v1__capabilities__init(&bare); /* no topology, no host id */
  cp[1] = &bare;
  bcast_topo b = base();
  topology t;
  char err[256] = "";
  cr_assert_eq(topology_build(cp, 3, &b, &t, err, sizeof err), 0, "%s", err);
  cr_assert_eq(t.topo.nodes, 1);
  cr_assert_str_eq(topology_node_name(&t, 0), "unknown");
  cr_assert(t.place[0].host && t.place[1].host && t.place[2].host);
  cr_assert(strstr(t.note, "node unknown reports no NIC speed"), "%s", t.note);
  topology_free(&t);
}

Test(topology, bad_input_is_refused_by_name) {
  fleet f = {0};
  add(&f, "n", "h", "", 10, 0);
  topology t;
  char err[256] = "";
  bcast_topo b = base();
  cr_assert_eq(topology_build(f.cp, 0, &b, &t, err, sizeof err), -1);
  cr_assert_str_eq(err, "no participants");
  b.nic_gbits = 0;
  cr_assert_eq(topology_build(f.cp, f.n, &b, &t, err, sizeof err), -1);
  cr_assert(strstr(err, "nic_gbits"), "%s", err);
  cr_assert_eq(topology_build(f.cp, f.n, NULL, &t, err, sizeof err), -1);
  cr_assert_null(t.place);
}

Test(topology, the_model_predicts_on_it) {
  /* One trainer on node t, one receiver on each of two nodes behind
   * 1 Gb/s: the trainer's NIC carries the model twice. */
  fleet f = {0};
  add(&f, "t", "h", "", 1, 0);
  add(&f, "r1", "h1", "", 1, 0);
  add(&f, "r2", "h2", "", 1, 0);
  bcast_topo b = base();
  b.tcp_stream_gbps = 0;
  topology t;
  char err[256] = "";
  cr_assert_eq(topology_build(f.cp, f.n, &b, &t, err, sizeof err), 0, "%s", err);
  bcast_tensor tensor = {.name = "w", .ndim = 1, .shape = {1u << 20}, .storage_dtype = BCAST_DTYPE_FP32,
                         .wire_dtype = BCAST_DTYPE_FP32, .residency = BCAST_RES_HOST_PINNED};
  bcast_plan_opts po = {.id = "p", .mode = BCAST_MODE_HOST, .staging_budget = 1u << 20,
                        .world_size = 3, .host_endpoint = "127.0.0.1:1"};
  bcast_plan *plan = NULL;
  bcast_err be = {0};
  cr_assert_eq(bcast_plan_build(&tensor, 1, &po, &plan, &be), 0, "%s", be.msg);
  bcast_topo_opts o = {.layout = BCAST_LAYOUT_ENGINE};
  bcast_topo_pred pred;
  cr_assert_eq(bcast_topo_predict(plan, t.place, t.nplace, &t.topo, &o, &pred, &be), 0, "%s",
               be.msg);
  /* 2 copies of 4 MiB over 1 Gb/s, of which TCP gets 1448 bytes a frame of
   * 1538 (no MTU reported: 1500 assumed). */
  double want = 2.0 * 4.0 * (1u << 20) / (1e9 / 8) * 1538.0 / 1448.0;
  cr_assert(strstr(t.note, "node t: MTU unknown, 1500 assumed"), "%s", t.note);
  cr_assert_float_eq(pred.total_s, want, want * 0.05, "%g s, want about %g s", pred.total_s,
                     want);
  bcast_plan_free(plan);
  topology_free(&t);
}

Test(topology, which_nodes_were_assumed_and_whether_h2d_was_measured) {
  fleet f = {0};
  add(&f, "t", "h", "0000:01:00.0", 40, 0);
  add(&f, "quiet", "h2", "", 0, 0);
  bcast_topo b = base();
  topology t;
  char err[256] = "";
  cr_assert_eq(topology_build(f.cp, f.n, &b, &t, err, sizeof err), 0, "%s", err);
  cr_assert_eq(t.nics_assumed[0], 0, "node t reports its NICs");
  cr_assert_eq(t.nics_assumed[1], 1, "node quiet reports none");
  cr_assert_eq(t.h2d_measured, 0);
  topology_free(&t);
  f.topo[0].h2d_gbps = 31;
  cr_assert_eq(topology_build(f.cp, f.n, &b, &t, err, sizeof err), 0, "%s", err);
  cr_assert_eq(t.h2d_measured, 1);
  cr_assert_float_eq(t.topo.h2d_gbps, 31, 1e-9);
  topology_free(&t);
  cr_assert_null(t.nics_assumed);
}

/* GetTopology's view: workers as ListWorkers gives them, on f's capabilities. */
typedef struct {
  Rlorch__V1__WorkerInfo info[MAXW];
  const Rlorch__V1__WorkerInfo *ip[MAXW];
} roster;

static void roster_of(const fleet *f, roster *r, const char *const *names) {
  static const char *const ids[MAXW] = {"w-1", "w-2", "w-3", "w-4", "w-5", "w-6", "w-7", "w-8"};
  for (size_t i = 0; i < f->n; i++) {
    rlorch__v1__worker_info__init(&r->info[i]);
    r->info[i].id = (char *)ids[i];
    r->info[i].name = (char *)names[i];
    r->info[i].role = i ? RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE
                        : RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER;
    r->info[i].capabilities = (Rlorch__V1__Capabilities *)&f->caps[i];
    r->ip[i] = &r->info[i];
  }
}

Test(topology, the_view_lists_each_node_with_its_workers_and_gpus) {
  fleet f = {0};
  add(&f, "a", "boot-1", "", 100, 100);             /* trainer, no GPU */
  add(&f, "b", "boot-2", "0000:3b:00.0", 0, 0);     /* b: no NIC speed */
  add(&f, "a", "boot-1", "", 0, 0);                 /* a's second worker, no GPU */
  add(&f, "b", "boot-2", "0000:5e:00.0", 0, 0);     /* b's second GPU */
  add(&f, "b", "boot-2", "0000:3b:00.0", 0, 0);     /* on b's first GPU too */
  f.topo[1].numa_node = 1;
  f.topo[1].h2d_gbps = 30;
  f.topo[3].h2d_gbps = 22;
  static const char *const names[] = {"t", "b1", "a2", "b2", "b3"};
  roster r;
  roster_of(&f, &r, names);
  bcast_topo b = base();
  topology_view v;
  char err[256] = "";
  cr_assert_eq(topology_view_build(r.ip, f.n, &b, &v, err, sizeof err), 0, "%s", err);
  const Rlorch__V1__GetTopologyResponse *g = &v.resp;
  cr_assert_eq(g->n_nodes, 2);
  const Rlorch__V1__TopologyNode *a = g->nodes[0], *bn = g->nodes[1];
  cr_assert_str_eq(a->name, "a");
  cr_assert_eq(a->nics, 2);
  cr_assert_float_eq(a->nic_gbits, 100, 1e-9);
  cr_assert(!a->nics_assumed);
  cr_assert_eq(a->n_gpus, 0, "host places are no GPUs");
  cr_assert_eq(a->n_workers, 2);
  cr_assert_str_eq(a->workers[0]->name, "t");
  cr_assert_str_eq(a->workers[0]->id, "w-1");
  cr_assert_eq(a->workers[0]->role, RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER);
  cr_assert_str_eq(a->workers[1]->name, "a2", "a's workers in registration order");
  cr_assert(a->workers[0]->host && a->workers[1]->host);
  cr_assert_str_eq(bn->name, "b");
  cr_assert(bn->nics_assumed);
  cr_assert_eq(bn->nics, 2, "the configured NICs");
  cr_assert_float_eq(bn->nic_gbits, 25, 1e-9);
  cr_assert_eq(bn->n_gpus, 2);
  cr_assert_str_eq(bn->gpus[0], "0000:3b:00.0");
  cr_assert_str_eq(bn->gpus[1], "0000:5e:00.0");
  cr_assert_eq(bn->n_workers, 3);
  cr_assert_str_eq(bn->workers[0]->name, "b1");
  cr_assert_eq(bn->workers[0]->gpu, 0);
  cr_assert_eq(bn->workers[0]->numa_node, 1);
  cr_assert_float_eq(bn->workers[0]->h2d_gbps, 30, 1e-9);
  cr_assert_str_eq(bn->workers[0]->gpu_pci_bus_id, "0000:3b:00.0");
  cr_assert_eq(bn->workers[1]->gpu, 1, "b2 on the second GPU");
  cr_assert_eq(bn->workers[2]->gpu, 0, "b3 shares b1's GPU");
  cr_assert(!bn->workers[0]->host && !bn->workers[2]->host);
  cr_assert_float_eq(g->h2d_gbps, 22, 1e-9, "the slowest measured rate");
  cr_assert(g->h2d_measured);
  /* No worker here reports an MTU: each node's is assumed too. */
  cr_assert_str_eq(g->note, "node b reports no NIC speed: 2 x 25 Gb/s assumed; node a: MTU unknown, "
                            "1500 assumed; node b: MTU unknown, 1500 assumed");
  cr_assert_eq(g->links->nics, 2);
  cr_assert_float_eq(g->links->nic_gbits, 25, 1e-9);
  cr_assert_float_eq(g->links->h2d_gbps, b.h2d_gbps, 1e-9, "links are base's, unmeasured");
  cr_assert_float_eq(g->links->nvlink_gbps, b.nvlink_gbps, 1e-9);
  cr_assert_float_eq(g->links->hop_latency_us, b.hop_latency_us, 1e-9);
  /* It packs as the RPC layer sends it, and comes back the same. */
  size_t len = protobuf_c_message_get_packed_size(&g->base);
  uint8_t *buf = malloc(len);
  cr_assert_not_null(buf);
  protobuf_c_message_pack(&g->base, buf);
  Rlorch__V1__GetTopologyResponse *back = rlorch__v1__get_topology_response__unpack(NULL, len, buf);
  cr_assert_not_null(back);
  cr_assert_eq(back->n_nodes, 2);
  cr_assert_eq(back->nodes[1]->n_workers, 3);
  cr_assert_str_eq(back->nodes[1]->gpus[1], "0000:5e:00.0");
  rlorch__v1__get_topology_response__free_unpacked(back, NULL);
  free(buf);
  topology_view_free(&v);
  cr_assert_null(v.node);
}

Test(topology, the_view_of_no_worker_is_the_links_alone) {
  bcast_topo b = base();
  topology_view v;
  char err[256] = "";
  cr_assert_eq(topology_view_build(NULL, 0, &b, &v, err, sizeof err), 0, "%s", err);
  cr_assert_eq(v.resp.n_nodes, 0);
  cr_assert_float_eq(v.resp.h2d_gbps, b.h2d_gbps, 1e-9);
  cr_assert(!v.resp.h2d_measured);
  cr_assert_eq(v.resp.links->nics, 2);
  cr_assert_str_eq(v.resp.note, "");
  topology_view_free(&v);
}

Test(topology, the_view_refuses_a_bad_base_by_name) {
  bcast_topo b = base();
  b.nvlink_gbps = 0;
  topology_view v;
  char err[256] = "";
  cr_assert_eq(topology_view_build(NULL, 0, &b, &v, err, sizeof err), -1);
  cr_assert(strstr(err, "nvlink_gbps"), "%s", err);
  cr_assert_eq(topology_view_build(NULL, 0, NULL, &v, err, sizeof err), -1);
  cr_assert_str_eq(err, "no base topology");
  topology_view_free(&v);
}

Test(topology, a_node_takes_the_mtu_of_its_best_report) {
  fleet f = {0};
  add(&f, "a", "h", "", 25, 0);
  mtus(&f, 0, 9000, 0);
  add(&f, "a", "h", "", 100, 100); /* the best report of a: its smallest MTU */
  mtus(&f, 1, 9000, 4000);
  add(&f, "b", "h2", "", 10, 0); /* speed known, MTU not */
  add(&f, "c", "h3", "", 0, 0);  /* nothing known: the base's NICs and MTU */
  bcast_topo b = base();
  b.mtu = 1500;
  topology t;
  char err[256] = "";
  cr_assert_eq(topology_build(f.cp, f.n, &b, &t, err, sizeof err), 0, "%s", err);
  cr_assert_eq(t.topo.nodes, 3);
  cr_assert_eq(t.node[0].nics, 2);
  cr_assert_eq(t.node[0].mtu, 4000);
  cr_assert_eq(t.node[1].mtu, 0);
  cr_assert_eq(t.node[2].mtu, 1500);
  cr_assert(strstr(t.note, "node b: MTU unknown, 1500 assumed"), "%s", t.note);
  cr_assert_null(strstr(t.note, "node a: MTU"), "%s", t.note);
  cr_assert_null(strstr(t.note, "node c: MTU"), "%s", t.note);
  topology_free(&t);

  /* A worker's MTU below IPv4's least is refused by name. */
  mtus(&f, 1, 9000, 40);
  cr_assert_eq(topology_build(f.cp, f.n, &b, &t, err, sizeof err), -1);
  cr_assert(strstr(err, "node[0].mtu 40 must be 0 (unknown) or >= 68"), "%s", err);
}
