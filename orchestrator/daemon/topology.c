/* The topology of a plan's participants (topology.h). */
#include "orchestrator/daemon/topology.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A rank's node: what it configured or detected, else its machine's id. */
static const char *node_of(const Rlorch__V1__Capabilities *c) {
  if (!c) return "unknown";
  if (c->topology && c->topology->node && c->topology->node[0]) return c->topology->node;
  if (c->host_id && c->host_id[0]) return c->host_id;
  return "unknown";
}

/* A rank's GPU on its node, "" for none. */
static const char *gpu_of(const Rlorch__V1__Capabilities *c) {
  if (!c) return "";
  if (c->topology && c->topology->gpu_pci_bus_id && c->topology->gpu_pci_bus_id[0])
    return c->topology->gpu_pci_bus_id;
  return c->gpu_uuid ? c->gpu_uuid : "";
}

/* The NICs a rank reports: how many have a known speed, their sum, and the
 * smallest MTU known among them (0: none), as the model takes one framing
 * for all of a node's NICs and the smallest frames are the costliest. */
static void nics_of(const Rlorch__V1__Capabilities *c, uint32_t *n, double *sum, uint32_t *mtu) {
  *n = 0;
  *sum = 0;
  *mtu = 0;
  if (!c || !c->topology) return;
  for (size_t i = 0; i < c->topology->n_nics; i++) {
    const Rlorch__V1__Nic *nic = c->topology->nics[i];
    if (nic->gbits <= 0) continue;
    (*n)++, *sum += nic->gbits;
    if (nic->mtu && (!*mtu || nic->mtu < *mtu)) *mtu = nic->mtu;
  }
}

static void note_add(topology *t, const char *fmt, ...) {
  size_t len = strlen(t->note);
  if (len + 2 >= sizeof t->note) return;
  if (len) len += (size_t)snprintf(t->note + len, sizeof t->note - len, "; ");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->note + len, sizeof t->note - len, fmt, ap);
  va_end(ap);
}

void topology_free(topology *t) {
  if (!t) return;
  free(t->node);
  free(t->place);
  free(t->node_name);
  free(t->nics_assumed);
  memset(t, 0, sizeof *t);
}

const char *topology_node_name(const topology *t, uint32_t node) {
  return t && node < t->topo.nodes ? t->node_name[node] : "?";
}

int topology_build(const Rlorch__V1__Capabilities *const *caps, size_t n, const bcast_topo *base,
                   topology *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  bcast_err be = {0};
  if (!base || bcast_topo_check(base, &be) != 0)
    return snprintf(err, errlen, "%s", base ? be.msg : "no base topology"), -1;
  if (n == 0) return snprintf(err, errlen, "no participants"), -1;
  out->topo = *base;
  out->place = calloc(n, sizeof *out->place);
  out->node = calloc(n, sizeof *out->node);
  out->node_name = calloc(n, sizeof *out->node_name);
  out->nics_assumed = calloc(n, sizeof *out->nics_assumed);
  /* Per rank: the first rank of its node, and of its GPU (n x n is fine: a
   * plan's ranks number in the thousands at most, once per plan). */
  uint32_t *gpus = calloc(n, sizeof *gpus); /* GPU slots taken on each node */
  double *best = calloc(n, sizeof *best);   /* NIC Gb/s summed of the best report per node */
  if (!out->place || !out->node || !out->node_name || !out->nics_assumed || !gpus || !best) {
    free(gpus);
    free(best);
    topology_free(out);
    return snprintf(err, errlen, "out of memory"), -1;
  }
  uint32_t nodes = 0, gpus_max = 1;
  for (size_t r = 0; r < n; r++) {
    const char *name = node_of(caps[r]);
    uint32_t v = 0;
    while (v < nodes && strncmp(out->node_name[v], name, TOPOLOGY_NODE_NAME_MAX - 1) != 0) v++;
    if (v == nodes) {
      snprintf(out->node_name[v], TOPOLOGY_NODE_NAME_MAX, "%s", name);
      nodes++;
    }
    uint32_t nn, mtu;
    double sum;
    nics_of(caps[r], &nn, &sum, &mtu);
    /* Workers of one node may see different NICs (containers, NUMA
     * affinity): the node is taken to have the most any of them reports. */
    if (sum > best[v]) best[v] = sum, out->node[v] = (bcast_topo_node){nn, sum / nn, mtu};
    const char *gpu = gpu_of(caps[r]);
    out->place[r] = (bcast_topo_place){.node = v, .gpu = UINT32_MAX, .host = gpu[0] == '\0'};
    for (size_t q = 0; gpu[0] && q < r; q++)
      if (out->place[q].node == v && !out->place[q].host && strcmp(gpu_of(caps[q]), gpu) == 0) {
        out->place[r].gpu = out->place[q].gpu;
        break;
      }
    if (out->place[r].gpu == UINT32_MAX) out->place[r].gpu = gpus[v]++;
    if (gpus[v] > gpus_max) gpus_max = gpus[v];
  }
  free(gpus);
  for (uint32_t v = 0; v < nodes; v++)
    if (best[v] <= 0) {
      out->node[v] = (bcast_topo_node){base->nics_per_node, base->nic_gbits, base->mtu};
      out->nics_assumed[v] = 1;
      note_add(out, "node %s reports no NIC speed: %u x %g Gb/s assumed", out->node_name[v],
               base->nics_per_node, base->nic_gbits);
    }
  for (uint32_t v = 0; v < nodes; v++)
    if (!out->node[v].mtu)
      note_add(out, "node %s: MTU unknown, %d assumed", out->node_name[v], BCAST_TOPO_MTU_ASSUMED);
  free(best);
  out->nplace = n;
  out->topo.nodes = nodes;
  out->topo.gpus_per_node = gpus_max;
  out->topo.node = out->node;
  /* A GPU's measured host-to-device rate beats the default: the slowest
   * participant's, since a stage waits for its slowest rank. */
  double h2d = 0;
  for (size_t r = 0; r < n; r++) {
    const Rlorch__V1__Topology *tp = caps[r] ? caps[r]->topology : NULL;
    if (tp && tp->h2d_gbps > 0 && (h2d == 0 || tp->h2d_gbps < h2d)) h2d = tp->h2d_gbps;
  }
  if (h2d > 0) out->topo.h2d_gbps = h2d, out->h2d_measured = 1;
  if (bcast_topo_check(&out->topo, &be) != 0) {
    snprintf(err, errlen, "%s", be.msg);
    topology_free(out);
    return -1;
  }
  return 0;
}

static void view_links(const bcast_topo *b, Rlorch__V1__LinkFigures *l) {
  rlorch__v1__link_figures__init(l);
  l->h2d_gbps = b->h2d_gbps;
  l->nvlink_gbps = b->nvlink_gbps;
  l->d2d_gbps = b->d2d_gbps;
  l->cast_gbps = b->cast_gbps;
  l->tcp_stream_gbps = b->tcp_stream_gbps;
  l->tls_stream_gbps = b->tls_stream_gbps;
  l->tcp_send_gbps = b->tcp_send_gbps;
  l->host_gbps = b->host_gbps;
  l->host_cast_gbps = b->host_cast_gbps;
  l->pageable_gbps = b->pageable_gbps;
  l->hop_latency_us = b->hop_latency_us;
  l->nics = b->nics_per_node;
  l->nic_gbits = b->nic_gbits;
}

void topology_view_free(topology_view *v) {
  if (!v) return;
  topology_free(&v->t);
  free(v->node);
  free(v->nodep);
  free(v->worker);
  free(v->workerp);
  free(v->gpus);
  memset(v, 0, sizeof *v);
}

/* A worker as GetTopology shows it, at the place the model gave it. */
static void view_worker(const Rlorch__V1__WorkerInfo *w, const bcast_topo_place *p,
                        Rlorch__V1__TopologyWorker *out) {
  const Rlorch__V1__Capabilities *c = w->capabilities;
  const Rlorch__V1__Topology *tp = c ? c->topology : NULL;
  rlorch__v1__topology_worker__init(out);
  out->id = w->id;
  out->name = w->name;
  out->role = w->role;
  out->numa_node = tp ? tp->numa_node : -1;
  out->host = p->host != 0;
  if (tp) out->gpu_pci_bus_id = tp->gpu_pci_bus_id, out->h2d_gbps = tp->h2d_gbps;
}

int topology_view_build(const Rlorch__V1__WorkerInfo *const *w, size_t n, const bcast_topo *base,
                        topology_view *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  rlorch__v1__get_topology_response__init(&out->resp);
  bcast_err be = {0};
  if (!base || bcast_topo_check(base, &be) != 0)
    return snprintf(err, errlen, "%s", base ? be.msg : "no base topology"), -1;
  view_links(base, &out->links);
  out->resp.links = &out->links;
  out->resp.h2d_gbps = base->h2d_gbps;
  if (n == 0) return 0;
  const Rlorch__V1__Capabilities **caps = calloc(n, sizeof *caps);
  if (!caps) return snprintf(err, errlen, "out of memory"), -1;
  for (size_t i = 0; i < n; i++) caps[i] = w[i]->capabilities;
  if (topology_build(caps, n, base, &out->t, err, errlen) != 0) {
    free(caps); /* out->t is left empty: nothing else to free */
    return -1;
  }
  const topology *t = &out->t;
  uint32_t nodes = t->topo.nodes;
  out->node = calloc(nodes, sizeof *out->node);
  out->nodep = calloc(nodes, sizeof *out->nodep);
  out->worker = calloc(n, sizeof *out->worker);
  out->workerp = calloc(n, sizeof *out->workerp);
  out->gpus = calloc(n, sizeof *out->gpus);
  if (!out->node || !out->nodep || !out->worker || !out->workerp || !out->gpus) {
    free(caps);
    topology_view_free(out);
    return snprintf(err, errlen, "out of memory"), -1;
  }
  /* Node by node, its workers and its GPUs in rank order: a GPU is listed at
   * the first worker that uses it, which is where the model numbered it. */
  size_t nw = 0, ng = 0;
  for (uint32_t v = 0; v < nodes; v++) {
    Rlorch__V1__TopologyNode *nd = &out->node[v];
    rlorch__v1__topology_node__init(nd);
    nd->name = t->node_name[v];
    nd->nics = t->node[v].nics;
    nd->nic_gbits = t->node[v].nic_gbits;
    nd->nics_assumed = t->nics_assumed[v] != 0;
    nd->workers = &out->workerp[nw];
    nd->gpus = &out->gpus[ng];
    for (size_t r = 0; r < n; r++) {
      const bcast_topo_place *p = &t->place[r];
      if (p->node != v) continue;
      view_worker(w[r], p, &out->worker[r]);
      out->workerp[nw++] = &out->worker[r];
      nd->n_workers++;
      if (p->host) continue;
      size_t q = 0;
      while (q < r && !(t->place[q].node == v && t->place[q].gpu == p->gpu)) q++;
      if (q < r) {
        out->worker[r].gpu = out->worker[q].gpu;
      } else {
        out->worker[r].gpu = (uint32_t)nd->n_gpus;
        out->gpus[ng++] = (char *)gpu_of(caps[r]);
        nd->n_gpus++;
      }
    }
    out->nodep[v] = nd;
  }
  free(caps);
  out->resp.nodes = out->nodep;
  out->resp.n_nodes = nodes;
  out->resp.h2d_gbps = t->topo.h2d_gbps;
  out->resp.h2d_measured = t->h2d_measured != 0;
  out->resp.note = out->t.note;
  return 0;
}
