/* The topology cost model (bcast_topo.h; formulas in docs/ARCHITECTURE.md,
 * "Cost model of a plan on a topology").  Each stage is the time of its
 * bottleneck (the busiest source, node or link); stages overlap over the
 * buckets of the busiest source, as the engine pipelines them. */
#include "workers/bcast/bcast_topo.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/bcast/bcast_internal.h"

void bcast_topo_default(bcast_topo *t, uint32_t nodes) {
  *t = (bcast_topo){.nodes = nodes,
                    .gpus_per_node = 8,
                    .h2d_gbps = 55.0,
                    .nvlink_gbps = 450.0,
                    .d2d_gbps = 2100.0,
                    .cast_gbps = 2200.0,
                    .nics_per_node = 8,
                    .nic_gbits = 400.0,
                    .tcp_stream_gbps = 1.5,
                    .hop_latency_us = 10.0};
}

const char *bcast_topo_layout_name(bcast_topo_layout l) {
  switch (l) {
  case BCAST_LAYOUT_ENGINE: return "engine";
  case BCAST_LAYOUT_MULTIROOT: return "multiroot";
  }
  return "unknown";
}

static int positive(double v) { return isfinite(v) && v > 0; }

int bcast_topo_check(const bcast_topo *t, bcast_err *err) {
  if (!t) return bcast__fail(err, BCAST_EINVAL, "topology: NULL");
  if (t->nodes < 1) return bcast__fail(err, BCAST_EINVAL, "topology: nodes must be >= 1");
  if (t->gpus_per_node < 1)
    return bcast__fail(err, BCAST_EINVAL, "topology: gpus_per_node must be >= 1");
  if (t->nics_per_node < 1)
    return bcast__fail(err, BCAST_EINVAL, "topology: nics_per_node must be >= 1");
  const struct {
    const char *name;
    double v;
  } rates[] = {{"h2d_gbps", t->h2d_gbps},   {"nvlink_gbps", t->nvlink_gbps},
               {"d2d_gbps", t->d2d_gbps},   {"cast_gbps", t->cast_gbps},
               {"nic_gbits", t->nic_gbits}};
  for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++)
    if (!positive(rates[i].v))
      return bcast__fail(err, BCAST_EINVAL, "topology: %s %g must be > 0", rates[i].name, rates[i].v);
  if (!isfinite(t->tcp_stream_gbps) || t->tcp_stream_gbps < 0)
    return bcast__fail(err, BCAST_EINVAL, "topology: tcp_stream_gbps %g must be >= 0 (0: no cap)",
                       t->tcp_stream_gbps);
  if (!isfinite(t->hop_latency_us) || t->hop_latency_us < 0)
    return bcast__fail(err, BCAST_EINVAL, "topology: hop_latency_us %g must be >= 0", t->hop_latency_us);
  return BCAST_OK;
}

/* What one source moves, from its buckets and slices. */
typedef struct src_bytes {
  uint64_t wire;      /* W_j: its buckets' bytes */
  uint64_t gpu_wire;  /* G_j: wire bytes of slices whose storage is on the GPU */
  uint64_t host_stor; /* H_j: storage bytes of slices in host memory */
  uint64_t cast_stor; /* C_j: storage bytes of slices cast on the way */
  uint32_t buckets;   /* n_j */
} src_bytes;

static void add_stage(bcast_topo_pred *out, const char *name, double seconds, uint64_t bytes,
                      double gbps, const char *where) {
  bcast_topo_stage *s = &out->stages[out->nstages++];
  s->name = name;
  s->seconds = seconds;
  s->bytes = bytes;
  s->gbps = gbps;
  snprintf(s->where, sizeof s->where, "%s", where);
}

/* The busiest source of one quantity: time = bytes / rate; appended when any
 * source moves any. */
static void source_stage(bcast_topo_pred *out, const char *name, const src_bytes *sb, uint32_t ns,
                         size_t field, double gbps) {
  uint64_t best = 0;
  uint32_t at = 0;
  for (uint32_t j = 0; j < ns; j++) {
    uint64_t v = *(const uint64_t *)((const char *)&sb[j] + field);
    if (v > best) best = v, at = j;
  }
  if (!best) return;
  char where[BCAST_TOPO_WHERE_MAX];
  snprintf(where, sizeof where, "source %u", at);
  add_stage(out, name, (double)best / (gbps * 1e9), best, gbps, where);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Sources on each node, and receivers on it. */
static int count_nodes(const bcast_topo_place *place, uint32_t world, uint32_t ns, uint32_t nodes,
                       uint32_t **srcs, uint32_t **recvs, bcast_err *err) {
  *srcs = calloc(nodes, sizeof **srcs);
  *recvs = calloc(nodes, sizeof **recvs);
  if (!*srcs || !*recvs) {
    free(*srcs), free(*recvs);
    *srcs = *recvs = NULL;
    return bcast__fail(err, BCAST_ENOMEM, "topology: out of memory");
  }
  for (uint32_t r = 0; r < world; r++) (r < ns ? *srcs : *recvs)[place[r].node]++;
  return BCAST_OK;
}

/* Host transport: every source writes each of its buckets to every receiver
 * through its node's NICs, which its node's sources share; each TCP stream
 * carries at most tcp_stream_gbps; each receiving node takes the whole model
 * once per receiver on it; receivers then copy it to their GPU. */
static int predict_host(const bcast_plan *p, const bcast_topo_place *place, const bcast_topo *t,
                        const src_bytes *sb, uint32_t ns, uint64_t total, bcast_topo_pred *out,
                        bcast_err *err) {
  uint32_t world = p->world_size, nr = world - ns;
  uint32_t *srcs, *recvs;
  int rc = count_nodes(place, world, ns, t->nodes, &srcs, &recvs, err);
  if (rc) return rc;
  double node_gbps = t->nics_per_node * t->nic_gbits / 8.0;
  source_stage(out, "d2h", sb, ns, offsetof(src_bytes, gpu_wire), t->h2d_gbps);
  source_stage(out, "cast", sb, ns, offsetof(src_bytes, cast_stor), t->cast_gbps);
  double nic_s = 0, nic_gbps = 0;
  uint64_t nic_bytes = 0;
  char where[BCAST_TOPO_WHERE_MAX] = "";
  for (uint32_t j = 0; j < ns; j++) {
    double link = node_gbps / srcs[place[j].node];
    uint64_t bytes = sb[j].wire * nr;
    double s = (double)bytes / (link * 1e9);
    if (s > nic_s) {
      nic_s = s, nic_gbps = link, nic_bytes = bytes;
      snprintf(where, sizeof where, "source %u egress", j);
    }
    if (t->tcp_stream_gbps > 0) {
      double st = (double)sb[j].wire / (t->tcp_stream_gbps * 1e9);
      if (st > nic_s) {
        nic_s = st, nic_gbps = t->tcp_stream_gbps, nic_bytes = sb[j].wire;
        snprintf(where, sizeof where, "source %u tcp stream", j);
      }
    }
  }
  for (uint32_t n = 0; n < t->nodes; n++) {
    if (!recvs[n]) continue;
    uint64_t bytes = total * recvs[n];
    double s = (double)bytes / (node_gbps * 1e9);
    if (s > nic_s) {
      nic_s = s, nic_gbps = node_gbps, nic_bytes = bytes;
      snprintf(where, sizeof where, "node %u ingress", n);
    }
  }
  add_stage(out, "nic", nic_s, nic_bytes, nic_gbps, where);
  add_stage(out, "h2d", (double)total / (t->h2d_gbps * 1e9), total, t->h2d_gbps, "each receiver");
  free(srcs);
  free(recvs);
  return BCAST_OK;
}

/* NCCL ring through the ranks in rank order: the whole model crosses every
 * link once, pipelined, so the slowest link sets the rate; each hop adds its
 * latency. NVLink inside a node, the node's NICs between nodes. */
static void predict_ring(const bcast_plan *p, const bcast_topo_place *place, const bcast_topo *t,
                         const src_bytes *sb, uint64_t total, bcast_topo_pred *out) {
  if (p->mode == BCAST_MODE_STAGED || sb[0].host_stor)
    source_stage(out, "h2d", sb, 1, offsetof(src_bytes, host_stor), t->h2d_gbps);
  source_stage(out, "cast", sb, 1, offsetof(src_bytes, cast_stor), t->cast_gbps);
  double node_gbps = t->nics_per_node * t->nic_gbits / 8.0, slow = INFINITY;
  char where[BCAST_TOPO_WHERE_MAX] = "";
  for (uint32_t r = 0; r + 1 < p->world_size; r++) {
    int same = place[r].node == place[r + 1].node;
    double link = same ? t->nvlink_gbps : node_gbps;
    if (link < slow) {
      slow = link;
      snprintf(where, sizeof where, "rank %u -> %u (%s)", r, r + 1, same ? "nvlink" : "nic");
    }
  }
  add_stage(out, "ring", (double)total / (slow * 1e9), total, slow, where);
  out->latency_s = (double)(p->world_size - 1) * t->hop_latency_us * 1e-6;
}

/* Colocated: every rank on one GPU; host-resident storage crosses the GPU's
 * host link once, then each receiver gets its own device copy. */
static void predict_coloc(const bcast_plan *p, const bcast_topo *t, const src_bytes *sb, uint32_t ns,
                          uint64_t total, bcast_topo_pred *out) {
  uint64_t host = 0, cast = 0;
  for (uint32_t j = 0; j < ns; j++) host += sb[j].host_stor, cast += sb[j].cast_stor;
  if (host) add_stage(out, "h2d", (double)host / (t->h2d_gbps * 1e9), host, t->h2d_gbps, "the GPU");
  if (cast) add_stage(out, "cast", (double)cast / (t->cast_gbps * 1e9), cast, t->cast_gbps, "the GPU");
  uint64_t copies = total * (p->world_size - ns);
  add_stage(out, "d2d", (double)copies / (t->d2d_gbps * 1e9), copies, t->d2d_gbps, "the GPU");
}

/* Multiroot: receiver i (i = r - S) holds share i mod k of every source's
 * bytes. A node needs each distinct share of its receivers once: each source
 * sends W_j / k per distinct share to that node's relay for the share, over
 * one NIC of its own (sources beyond nics_per_node on a node share them),
 * or over NVLink to relays on its own node; each node takes its distinct
 * shares of the other nodes' sources over all its NICs; then every receiver
 * gets over NVLink what its node's relays did not bring it directly (relays
 * spread over the node's receivers). */
static int predict_multiroot(const bcast_plan *p, const bcast_topo_place *place, const bcast_topo *t,
                             const src_bytes *sb, uint32_t ns, uint32_t k, uint64_t total,
                             bcast_topo_pred *out, bcast_err *err) {
  uint32_t world = p->world_size, nr = world - ns;
  uint32_t *srcs, *recvs;
  int rc = count_nodes(place, world, ns, t->nodes, &srcs, &recvs, err);
  if (rc) return rc;
  uint64_t *keys = malloc((size_t)nr * sizeof *keys);
  uint32_t *distinct = calloc(t->nodes, sizeof *distinct);
  if (!keys || !distinct) {
    free(keys), free(distinct), free(srcs), free(recvs);
    return bcast__fail(err, BCAST_ENOMEM, "topology: out of memory");
  }
  for (uint32_t i = 0; i < nr; i++) keys[i] = (uint64_t)place[ns + i].node * k + i % k;
  qsort(keys, nr, sizeof *keys, cmp_u64);
  uint64_t shares_sent = 0; /* D: distinct (node, share) pairs */
  for (uint32_t i = 0; i < nr; i++)
    if (i == 0 || keys[i] != keys[i - 1]) distinct[keys[i] / k]++, shares_sent++;
  source_stage(out, "cast", sb, ns, offsetof(src_bytes, cast_stor), t->cast_gbps);
  double nic = t->nic_gbits / 8.0, node_gbps = t->nics_per_node * nic;
  double nic_s = 0, nic_gbps = 0, nv_s = 0;
  uint64_t nic_bytes = 0, nv_bytes = 0;
  uint64_t *local = calloc(t->nodes, sizeof *local); /* wire bytes of each node's sources */
  if (!local) {
    free(keys), free(distinct), free(srcs), free(recvs);
    return bcast__fail(err, BCAST_ENOMEM, "topology: out of memory");
  }
  char where[BCAST_TOPO_WHERE_MAX] = "", nv_where[BCAST_TOPO_WHERE_MAX] = "";
  for (uint32_t j = 0; j < ns; j++) {
    uint32_t home = place[j].node, on = srcs[home];
    local[home] += sb[j].wire;
    /* Shares for the source's own node go to its relays over NVLink. */
    double link = on > t->nics_per_node ? node_gbps / on : nic;
    uint64_t bytes = sb[j].wire * (shares_sent - distinct[home]) / k;
    uint64_t mine = sb[j].wire * distinct[home] / k;
    double s = (double)bytes / (link * 1e9);
    if (s > nic_s) {
      nic_s = s, nic_gbps = link, nic_bytes = bytes;
      snprintf(where, sizeof where, "source %u egress", j);
    }
    if ((double)mine / (t->nvlink_gbps * 1e9) > nv_s) {
      nv_s = (double)mine / (t->nvlink_gbps * 1e9), nv_bytes = mine;
      snprintf(nv_where, sizeof nv_where, "source %u to its node", j);
    }
  }
  for (uint32_t n = 0; n < t->nodes; n++) {
    if (!recvs[n]) continue;
    uint64_t in = total * distinct[n] / k; /* what the node's relays receive */
    uint64_t over_nic = (total - local[n]) * distinct[n] / k;
    double s = (double)over_nic / (node_gbps * 1e9);
    if (s > nic_s) {
      nic_s = s, nic_gbps = node_gbps, nic_bytes = over_nic;
      snprintf(where, sizeof where, "node %u ingress", n);
    }
    uint64_t need = total / k, direct = in / recvs[n];
    uint64_t nv = need > direct ? need - direct : 0;
    if ((double)nv / (t->nvlink_gbps * 1e9) > nv_s) {
      nv_s = (double)nv / (t->nvlink_gbps * 1e9), nv_bytes = nv;
      snprintf(nv_where, sizeof nv_where, "node %u receivers", n);
    }
  }
  free(local);
  if (nic_bytes) add_stage(out, "nic", nic_s, nic_bytes, nic_gbps, where);
  if (nv_bytes) add_stage(out, "nvlink", nv_s, nv_bytes, t->nvlink_gbps, nv_where);
  free(keys);
  free(distinct);
  free(srcs);
  free(recvs);
  return BCAST_OK;
}

int bcast_topo_predict(const bcast_plan *p, const bcast_topo_place *place, size_t nplace,
                       const bcast_topo *t, const bcast_topo_opts *o, bcast_topo_pred *out,
                       bcast_err *err) {
  if (!p || !place || !o || !out) return bcast__fail(err, BCAST_EINVAL, "topology: NULL argument");
  int rc = bcast_topo_check(t, err);
  if (rc) return rc;
  uint32_t ns = bcast__plan_nsources(p);
  if (nplace != p->world_size)
    return bcast__fail(err, BCAST_EINVAL, "placement: %zu places for a plan of %u ranks", nplace,
                       p->world_size);
  if (p->world_size <= ns)
    return bcast__fail(err, BCAST_EINVAL, "plan: %u ranks, %u sources: no receiver", p->world_size, ns);
  for (size_t r = 0; r < nplace; r++) {
    if (place[r].node >= t->nodes)
      return bcast__fail(err, BCAST_EINVAL, "placement[%zu].node %u >= nodes %u", r, place[r].node,
                         t->nodes);
    if (place[r].gpu >= t->gpus_per_node)
      return bcast__fail(err, BCAST_EINVAL, "placement[%zu].gpu %u >= gpus_per_node %u", r,
                         place[r].gpu, t->gpus_per_node);
  }
  uint32_t nr = p->world_size - ns, k = o->replica_gpus ? o->replica_gpus : 1;
  if (o->layout != BCAST_LAYOUT_ENGINE && o->layout != BCAST_LAYOUT_MULTIROOT)
    return bcast__fail(err, BCAST_EINVAL, "layout %d is unknown", (int)o->layout);
  if (o->layout == BCAST_LAYOUT_ENGINE && k != 1)
    return bcast__fail(err, BCAST_EINVAL,
                       "replica_gpus %u: the engine layout sends every receiver the whole model", k);
  if (nr % k)
    return bcast__fail(err, BCAST_EINVAL, "replica_gpus %u does not divide the %u receivers", k, nr);
  if (o->layout == BCAST_LAYOUT_ENGINE) {
    if ((p->mode == BCAST_MODE_DIRECT || p->mode == BCAST_MODE_STAGED) && ns > 1)
      return bcast__fail(err, BCAST_EINVAL, "plan: %s mode with %u sources (NCCL plans have one)",
                         bcast_mode_name(p->mode), ns);
    if (p->mode == BCAST_MODE_COLOCATED)
      for (size_t r = 1; r < nplace; r++)
        if (place[r].node != place[0].node || place[r].gpu != place[0].gpu)
          return bcast__fail(err, BCAST_EINVAL,
                             "placement[%zu]: a colocated plan's ranks share rank 0's GPU (node %u gpu "
                             "%u), not node %u gpu %u",
                             r, place[0].node, place[0].gpu, place[r].node, place[r].gpu);
  }
  src_bytes *sb = calloc(ns, sizeof *sb);
  if (!sb) return bcast__fail(err, BCAST_ENOMEM, "topology: out of memory");
  uint64_t total = 0;
  for (size_t b = 0; b < p->nbuckets; b++) {
    const bcast_bucket *bk = &p->buckets[b];
    if (bk->source_rank >= ns) {
      free(sb);
      return bcast__fail(err, BCAST_EINVAL, "plan: bucket %zu's source_rank %u >= sources %u", b,
                         bk->source_rank, ns);
    }
    src_bytes *s = &sb[bk->source_rank];
    s->wire += bk->bytes;
    s->buckets++;
    total += bk->bytes;
    for (size_t i = 0; i < bk->nslices; i++) {
      const bcast_slice *sl = &bk->slices[i];
      const bcast_tensor *tn = &p->tensors[sl->tensor];
      uint64_t stor = sl->elem_count * bcast_dtype_size(tn->storage_dtype);
      if (tn->residency == BCAST_RES_GPU)
        s->gpu_wire += sl->elem_count * bcast_dtype_size(tn->wire_dtype);
      else
        s->host_stor += stor;
      if (tn->storage_dtype != tn->wire_dtype) s->cast_stor += stor;
    }
  }
  memset(out, 0, sizeof *out);
  out->layout = o->layout;
  if (o->layout == BCAST_LAYOUT_MULTIROOT)
    rc = predict_multiroot(p, place, t, sb, ns, k, total, out, err);
  else if (p->mode == BCAST_MODE_HOST)
    rc = predict_host(p, place, t, sb, ns, total, out, err);
  else if (p->mode == BCAST_MODE_COLOCATED)
    predict_coloc(p, t, sb, ns, total, out);
  else
    predict_ring(p, place, t, sb, total, out);
  uint32_t depth = 1;
  for (uint32_t j = 0; j < ns; j++)
    if (sb[j].buckets > depth) depth = sb[j].buckets;
  free(sb);
  if (rc) return rc;
  /* n equal buckets through stages s_k: the first bucket crosses every
   * stage, each later one leaves the slowest stage one bucket-time later. */
  double sum = 0, max = 0;
  for (size_t i = 0; i < out->nstages; i++) {
    sum += out->stages[i].seconds;
    if (out->stages[i].seconds > max) max = out->stages[i].seconds;
  }
  out->pipeline_depth = depth;
  out->total_s = sum / depth + (double)(depth - 1) / depth * max + out->latency_s;
  return BCAST_OK;
}
