/* The topology cost model (bcast_topo.h; formulas and the source of every
 * figure in docs/ARCHITECTURE.md, "Cost model of a plan on a topology").
 * Each stage is one resource, timed at its bottleneck (the busiest source,
 * process, node or link); work that shares a resource adds up inside its
 * stage, and the stages overlap over the buckets of the busiest source, as
 * the engine pipelines them. */
#include "workers/bcast/bcast_topo.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/bcast/bcast_internal.h"

void bcast_topo_default(bcast_topo *t, uint32_t nodes) {
  *t = (bcast_topo){.nodes = nodes,
                    .gpus_per_node = 8,
                    .h2d_gbps = 55.0,
                    .nvlink_gbps = 371.0,
                    .d2d_gbps = 2100.0,
                    .cast_gbps = 2600.0,
                    .nics_per_node = 8,
                    .nic_gbits = 400.0,
                    .nic_frame_bytes = 38.0,
                    .tcp_stream_gbps = 1.57,
                    .tls_stream_gbps = 1.0,
                    .tcp_send_gbps = 3.05,
                    .host_gbps = 22.0,
                    .host_cast_gbps = 50.0,
                    .pageable_gbps = 10.0,
                    .hop_latency_us = 10.0,
                    .nccl_bucket_us = 36.0,
                    .coloc_plan_us = 200.0,
                    .coloc_write_us = 2.9,
                    .coloc_source_us = 200.0};
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
               {"nic_gbits", t->nic_gbits}, {"pageable_gbps", t->pageable_gbps}};
  for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++)
    if (!positive(rates[i].v))
      return bcast__fail(err, BCAST_EINVAL, "topology: %s %g must be > 0", rates[i].name, rates[i].v);
  const struct {
    const char *name;
    double v;
    const char *zero;
  } caps[] = {{"tcp_stream_gbps", t->tcp_stream_gbps, " (0: no cap)"},
              {"tls_stream_gbps", t->tls_stream_gbps, " (0: no cap)"},
              {"tcp_send_gbps", t->tcp_send_gbps, " (0: no cap)"},
              {"host_gbps", t->host_gbps, " (0: no cap)"},
              {"host_cores_gbps", t->host_cores_gbps, " (0: no cap)"},
              {"host_cast_gbps", t->host_cast_gbps, " (0: no cap)"},
              {"tcp_plan_ms", t->tcp_plan_ms, ""},
              {"nic_frame_bytes", t->nic_frame_bytes, ""},
              {"hop_latency_us", t->hop_latency_us, ""},
              {"nccl_bucket_us", t->nccl_bucket_us, ""},
              {"coloc_plan_us", t->coloc_plan_us, ""},
              {"coloc_write_us", t->coloc_write_us, ""},
              {"coloc_source_us", t->coloc_source_us, ""}};
  for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++)
    if (!isfinite(caps[i].v) || caps[i].v < 0)
      return bcast__fail(err, BCAST_EINVAL, "topology: %s %g must be >= 0%s", caps[i].name, caps[i].v,
                         caps[i].zero);
  if (t->mtu && t->mtu < BCAST_TOPO_MTU_MIN)
    return bcast__fail(err, BCAST_EINVAL, "topology: mtu %u must be 0 (unknown) or >= %d", t->mtu,
                       BCAST_TOPO_MTU_MIN);
  for (uint32_t v = 0; t->node && v < t->nodes; v++) {
    if (t->node[v].mtu && t->node[v].mtu < BCAST_TOPO_MTU_MIN)
      return bcast__fail(err, BCAST_EINVAL, "topology: node[%u].mtu %u must be 0 (unknown) or >= %d", v,
                         t->node[v].mtu, BCAST_TOPO_MTU_MIN);
    if (t->node[v].nics < 1)
      return bcast__fail(err, BCAST_EINVAL, "topology: node[%u].nics 0 must be >= 1", v);
    if (!positive(t->node[v].nic_gbits))
      return bcast__fail(err, BCAST_EINVAL, "topology: node[%u].nic_gbits %g must be > 0", v,
                         t->node[v].nic_gbits);
  }
  return BCAST_OK;
}

/* Node v's NICs: its own entry, or the uniform figures. */
static bcast_topo_node node_nics(const bcast_topo *t, uint32_t v) {
  if (t->node) return t->node[v];
  return (bcast_topo_node){.nics = t->nics_per_node, .nic_gbits = t->nic_gbits, .mtu = t->mtu};
}
static double nic_gbps(const bcast_topo *t, uint32_t v) { return node_nics(t, v).nic_gbits / 8.0; }
static double node_gbps(const bcast_topo *t, uint32_t v) {
  bcast_topo_node n = node_nics(t, v);
  return n.nics * n.nic_gbits / 8.0;
}
/* What TCP gets of node v's NICs: each frame carries mtu - 52 bytes of
 * payload and costs the line mtu + nic_frame_bytes. RDMA and NCCL stages
 * keep the full rate (their framing is not the host transport's). */
static double node_tcp_gbps(const bcast_topo *t, uint32_t v) {
  uint32_t mtu = node_nics(t, v).mtu;
  double m = mtu ? mtu : BCAST_TOPO_MTU_ASSUMED;
  return node_gbps(t, v) * (m - BCAST_TOPO_TCP_HEADER_BYTES) / (m + t->nic_frame_bytes);
}

/* What one source moves, from its buckets and slices. */
typedef struct src_bytes {
  uint64_t wire;      /* W_j: its buckets' bytes */
  uint64_t gpu_stor;  /* G_j: storage bytes of slices whose storage is on the GPU */
  uint64_t gpu_copy;  /* wire bytes of GPU slices not cast (copied as they are) */
  uint64_t host_stor; /* H_j: storage bytes of slices in host memory */
  uint64_t cast_stor; /* C_j: storage bytes of slices cast on the way */
  uint64_t slices;    /* L_j */
  uint32_t buckets;   /* n_j */
} src_bytes;

/* A stage being found: its bottleneck so far. */
typedef struct worst {
  double s, gbps;
  uint64_t bytes;
  char where[BCAST_TOPO_WHERE_MAX];
} worst;

static void consider(worst *w, double s, uint64_t bytes, double gbps, const char *fmt, uint32_t id) {
  if (s <= w->s) return;
  w->s = s, w->bytes = bytes, w->gbps = gbps;
  snprintf(w->where, sizeof w->where, fmt, id);
}

static void add_stage(bcast_topo_pred *out, const char *name, const worst *w, int serial) {
  if (w->s <= 0) return;
  bcast_topo_stage *s = &out->stages[out->nstages++];
  s->name = name;
  s->seconds = w->s;
  s->bytes = w->bytes;
  s->gbps = w->gbps;
  s->serial = serial;
  snprintf(s->where, sizeof s->where, "%s", w->where);
}

/* Bytes over a rate in GB/s; 0 when the rate is 0 (no cap). */
static double over(uint64_t bytes, double gbps) { return gbps > 0 ? (double)bytes / (gbps * 1e9) : 0; }

/* The busiest source of one quantity: time = bytes / rate. */
static void source_stage(bcast_topo_pred *out, const char *name, const src_bytes *sb, uint32_t ns,
                         size_t field, double gbps, int serial) {
  worst w = {0};
  for (uint32_t j = 0; j < ns; j++) {
    uint64_t v = *(const uint64_t *)((const char *)&sb[j] + field);
    consider(&w, over(v, gbps), v, gbps, "source %u", j);
  }
  add_stage(out, name, &w, serial);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* ---- host transport: TCP edges between processes ------------------------------ */

/* What the edges (sender -> receiver, each carrying the bytes of its
 * stream) put on each process and node. */
typedef struct host_load {
  uint64_t *out;      /* per rank: bytes it sends over all its streams */
  uint64_t *stream;   /* per rank: its largest stream */
  uint32_t *fanout;   /* per rank: its streams */
  uint64_t *in;       /* per rank: bytes it receives */
  uint64_t *egress;   /* per node: bytes leaving it */
  uint64_t *ingress;  /* per node: bytes entering it */
  uint64_t *ends;     /* per node: stream ends on it, in bytes (a stream inside it twice) */
} host_load;

static void load_free(host_load *l) {
  free(l->out), free(l->stream), free(l->fanout), free(l->in);
  free(l->egress), free(l->ingress), free(l->ends);
}

static int load_alloc(host_load *l, uint32_t world, uint32_t nodes, bcast_err *err) {
  l->out = calloc(world, sizeof *l->out);
  l->stream = calloc(world, sizeof *l->stream);
  l->fanout = calloc(world, sizeof *l->fanout);
  l->in = calloc(world, sizeof *l->in);
  l->egress = calloc(nodes, sizeof *l->egress);
  l->ingress = calloc(nodes, sizeof *l->ingress);
  l->ends = calloc(nodes, sizeof *l->ends);
  if (l->out && l->stream && l->fanout && l->in && l->egress && l->ingress && l->ends) return BCAST_OK;
  load_free(l);
  return bcast__fail(err, BCAST_ENOMEM, "topology: out of memory");
}

static void add_edge(host_load *l, const bcast_topo_place *place, uint32_t from, uint32_t to, uint64_t bytes) {
  uint32_t a = place[from].node, b = place[to].node;
  l->out[from] += bytes;
  l->fanout[from]++;
  if (bytes > l->stream[from]) l->stream[from] = bytes;
  l->in[to] += bytes;
  l->ends[a] += bytes;
  l->ends[b] += bytes;
  if (a != b) l->egress[a] += bytes, l->ingress[b] += bytes;
}

/* Refuses relay_from unless every receiver's chain reaches the source. */
static int relays_check(const bcast_plan *p, const uint32_t *rf, uint32_t ns, bcast_err *err) {
  uint32_t world = p->world_size;
  if (p->mode != BCAST_MODE_HOST)
    return bcast__fail(err, BCAST_EINVAL, "relay_from: relays are for host mode, not %s",
                       bcast_mode_name(p->mode));
  if (ns != 1)
    return bcast__fail(err, BCAST_EINVAL, "relay_from: relays are for plans of one source, not %u", ns);
  if (p->nviews)
    return bcast__fail(err, BCAST_EINVAL, "relay_from: relays are for plans without receiver views (%u views)",
                       p->nviews);
  if (rf[0] != 0)
    return bcast__fail(err, BCAST_EINVAL, "relay_from[0] %u: the source takes from no one (its own rank, 0)",
                       rf[0]);
  for (uint32_t r = 1; r < world; r++) {
    if (rf[r] >= world)
      return bcast__fail(err, BCAST_EINVAL, "relay_from[%u] %u >= world_size %u", r, rf[r], world);
    if (rf[r] == r)
      return bcast__fail(err, BCAST_EINVAL, "relay_from[%u] %u: a receiver takes from another rank", r, rf[r]);
  }
  /* Each rank is walked once: a walk stops at the source or at a rank an
   * earlier walk proved reaches it (mark 0), and meeting its own mark again
   * is a cycle. */
  uint32_t *mark = malloc((size_t)world * sizeof *mark);
  if (!mark) return bcast__fail(err, BCAST_ENOMEM, "topology: out of memory");
  for (uint32_t r = 0; r < world; r++) mark[r] = r ? UINT32_MAX : 0;
  int rc = BCAST_OK;
  for (uint32_t r = 1; r < world && !rc; r++) {
    uint32_t at = r;
    while (mark[at] == UINT32_MAX) mark[at] = r, at = rf[at];
    if (mark[at] == r && at != 0)
      rc = bcast__fail(err, BCAST_EINVAL,
                       "relay_from[%u] %u: its chain never reaches the source (a cycle of receivers)", r, rf[r]);
    for (at = r; mark[at] == r; at = rf[at]) mark[at] = 0;
  }
  free(mark);
  return rc;
}

/* Every sending process's TCP time: its sending thread over its streams
 * (tcp_stream per stream, tcp_send over all) and then its node's host over
 * every stream end on it, which the thread waits for (the same cores and
 * memory), so the two add. A TLS stream is capped by its encrypting and
 * decrypting cores instead. */
static void send_stage(const host_load *l, const bcast_topo_place *place, const bcast_topo *t, int tls,
                       uint32_t from, uint32_t to, const char *fmt, worst *w) {
  double stream = tls ? t->tls_stream_gbps : t->tcp_stream_gbps;
  for (uint32_t r = from; r < to; r++) {
    if (!l->fanout[r]) continue;
    double thread = fmax(over(l->stream[r], stream), over(l->out[r], t->tcp_send_gbps));
    double s = thread + over(l->ends[place[r].node], t->host_gbps);
    consider(w, s, l->out[r], s > 0 ? (double)l->out[r] / s / 1e9 : 0, fmt, r);
  }
}

/* Host transport, as a set of TCP edges: without relays every source sends
 * its buckets to every receiver, with relay_from each receiver takes the
 * whole model from the rank it names. GPU tensors cross to and from host
 * memory whole, before and after the transfer (serial). */
static int predict_host(const bcast_plan *p, const bcast_topo_place *place, const bcast_topo *t,
                        const bcast_topo_opts *o, const src_bytes *sb, uint32_t ns, uint64_t total,
                        bcast_topo_pred *out, bcast_err *err) {
  uint32_t world = p->world_size;
  host_load l;
  int rc = load_alloc(&l, world, t->nodes, err);
  if (rc) return rc;
  if (o->relay_from)
    for (uint32_t r = ns; r < world; r++) add_edge(&l, place, o->relay_from[r], r, total);
  else
    for (uint32_t j = 0; j < ns; j++)
      for (uint32_t r = ns; r < world; r++) add_edge(&l, place, j, r, sb[j].wire);
  source_stage(out, "d2h", sb, ns, offsetof(src_bytes, gpu_stor), t->pageable_gbps, 1);
  source_stage(out, "cast", sb, ns, offsetof(src_bytes, cast_stor), t->host_cast_gbps, 0);
  worst tcp = {0}, relay = {0}, cores = {0}, nic = {0}, h2d = {0};
  send_stage(&l, place, t, p->tls, 0, ns, "source %u", &tcp);
  send_stage(&l, place, t, p->tls, ns, world, "relay %u", &relay);
  for (uint32_t r = ns; r < world; r++) {
    if (l.fanout[r]) out->relays++;
    /* A node of receivers only: its host still takes every stream. */
    consider(&tcp, over(l.ends[place[r].node], t->host_gbps), l.ends[place[r].node], t->host_gbps,
             "node %u host", place[r].node);
    if (!place[r].host) consider(&h2d, over(l.in[r], t->pageable_gbps), l.in[r], t->pageable_gbps, "receiver %u", r);
  }
  for (uint32_t v = 0; v < t->nodes; v++) {
    double n = node_tcp_gbps(t, v);
    consider(&cores, over(l.ends[v], t->host_cores_gbps), l.ends[v], t->host_cores_gbps, "node %u", v);
    consider(&nic, over(l.egress[v], n), l.egress[v], n, "node %u egress", v);
    consider(&nic, over(l.ingress[v], n), l.ingress[v], n, "node %u ingress", v);
  }
  add_stage(out, "tcp", &tcp, 0);
  add_stage(out, "relay", &relay, 0);
  add_stage(out, "cores", &cores, 0);
  add_stage(out, "nic", &nic, 0);
  add_stage(out, "h2d", &h2d, 1);
  out->latency_s = t->tcp_plan_ms * 1e-3;
  load_free(&l);
  return BCAST_OK;
}

/* NCCL ring through the ranks in rank order: the whole model crosses every
 * link once, pipelined, so the slowest link sets the rate; each bucket's
 * group costs a fixed time, each hop its latency. NVLink inside a node, the
 * slower node's NICs between nodes. */
static void predict_ring(const bcast_plan *p, const bcast_topo_place *place, const bcast_topo *t,
                         const src_bytes *sb, uint64_t total, bcast_topo_pred *out) {
  if (p->mode == BCAST_MODE_STAGED || sb[0].host_stor)
    source_stage(out, "h2d", sb, 1, offsetof(src_bytes, host_stor), t->h2d_gbps, 0);
  source_stage(out, "cast", sb, 1, offsetof(src_bytes, cast_stor), t->cast_gbps, 0);
  double slow = INFINITY;
  char where[BCAST_TOPO_WHERE_MAX] = "";
  for (uint32_t r = 0; r + 1 < p->world_size; r++) {
    uint32_t a = place[r].node, b = place[r + 1].node;
    double link = a == b ? t->nvlink_gbps : fmin(node_gbps(t, a), node_gbps(t, b));
    if (link < slow) {
      slow = link;
      snprintf(where, sizeof where, "rank %u -> %u (%s)", r, r + 1, a == b ? "nvlink" : "nic");
    }
  }
  double s = over(total, slow) + (double)p->nbuckets * t->nccl_bucket_us * 1e-6;
  worst ring = {.s = s, .bytes = total, .gbps = s > 0 ? (double)total / s / 1e9 : 0};
  snprintf(ring.where, sizeof ring.where, "%s", where);
  add_stage(out, "ring", &ring, 0);
  out->latency_s = (double)(p->world_size - 1) * t->hop_latency_us * 1e-6;
}

/* Colocated: every rank on one GPU. Host-resident storage crosses its host
 * link once (into staging, or straight into the first receiver when already
 * in the wire dtype); the GPU's memory then does, one after the other on the
 * cast stream, the casts into the first receiver, the copies of uncast GPU
 * slices into it, and a copy of every bucket into each further receiver,
 * each write a launch. */
static void predict_coloc(const bcast_plan *p, const bcast_topo *t, const src_bytes *sb, uint32_t ns,
                          uint64_t total, bcast_topo_pred *out) {
  uint32_t nr = p->world_size - ns;
  uint64_t host = 0, cast = 0, copies = total * (nr - 1), writes = 0;
  for (uint32_t j = 0; j < ns; j++) {
    host += sb[j].host_stor, cast += sb[j].cast_stor, copies += sb[j].gpu_copy;
    if (sb[j].slices * nr > writes) writes = sb[j].slices * nr;
  }
  worst h2d = {.s = over(host, t->h2d_gbps), .bytes = host, .gbps = t->h2d_gbps};
  snprintf(h2d.where, sizeof h2d.where, "the GPU's host link");
  add_stage(out, "h2d", &h2d, 0);
  double s = over(cast, t->cast_gbps) + over(copies, t->d2d_gbps) + (double)writes * t->coloc_write_us * 1e-6;
  worst mem = {.s = s, .bytes = cast + copies, .gbps = s > 0 ? (double)(cast + copies) / s / 1e9 : 0};
  snprintf(mem.where, sizeof mem.where, "the GPU's memory (casts, copies)");
  add_stage(out, "d2d", &mem, 0);
  out->latency_s = (t->coloc_plan_us + (double)(ns - 1) * t->coloc_source_us) * 1e-6;
}

/* Multiroot: receiver i (i = r - S) holds share i mod k of every source's
 * bytes. A node needs each distinct share of its receivers once: each source
 * sends W_j / k per distinct share to that node's relay for the share, over
 * one NIC of its own (sources beyond its node's NICs share them), or over
 * NVLink to relays on its own node; each node takes its distinct shares of
 * the other nodes' sources over all its NICs; then every receiver gets over
 * NVLink what its node's relays did not bring it directly (relays spread
 * over the node's receivers). */
static int predict_multiroot(const bcast_plan *p, const bcast_topo_place *place, const bcast_topo *t,
                             const src_bytes *sb, uint32_t ns, uint32_t k, uint64_t total,
                             bcast_topo_pred *out, bcast_err *err) {
  uint32_t world = p->world_size, nr = world - ns;
  uint32_t *srcs = calloc(t->nodes, sizeof *srcs), *recvs = calloc(t->nodes, sizeof *recvs);
  uint32_t *distinct = calloc(t->nodes, sizeof *distinct);
  uint64_t *keys = malloc((size_t)nr * sizeof *keys);
  uint64_t *local = calloc(t->nodes, sizeof *local); /* wire bytes of each node's sources */
  if (!srcs || !recvs || !distinct || !keys || !local) {
    free(srcs), free(recvs), free(distinct), free(keys), free(local);
    return bcast__fail(err, BCAST_ENOMEM, "topology: out of memory");
  }
  for (uint32_t r = 0; r < world; r++) (r < ns ? srcs : recvs)[place[r].node]++;
  for (uint32_t i = 0; i < nr; i++) keys[i] = (uint64_t)place[ns + i].node * k + i % k;
  qsort(keys, nr, sizeof *keys, cmp_u64);
  uint64_t shares_sent = 0; /* D: distinct (node, share) pairs */
  for (uint32_t i = 0; i < nr; i++)
    if (i == 0 || keys[i] != keys[i - 1]) distinct[keys[i] / k]++, shares_sent++;
  source_stage(out, "cast", sb, ns, offsetof(src_bytes, cast_stor), t->cast_gbps, 0);
  worst nic = {0}, nv = {0};
  for (uint32_t j = 0; j < ns; j++) {
    uint32_t home = place[j].node, on = srcs[home], nics = node_nics(t, home).nics;
    local[home] += sb[j].wire;
    /* Shares for the source's own node go to its relays over NVLink. */
    double link = on > nics ? node_gbps(t, home) / on : nic_gbps(t, home);
    uint64_t bytes = sb[j].wire * (shares_sent - distinct[home]) / k;
    uint64_t mine = sb[j].wire * distinct[home] / k;
    consider(&nic, over(bytes, link), bytes, link, "source %u egress", j);
    consider(&nv, over(mine, t->nvlink_gbps), mine, t->nvlink_gbps, "source %u to its node", j);
  }
  for (uint32_t v = 0; v < t->nodes; v++) {
    if (!recvs[v]) continue;
    uint64_t in = total * distinct[v] / k; /* what the node's relays receive */
    uint64_t over_nic = (total - local[v]) * distinct[v] / k;
    consider(&nic, over(over_nic, node_gbps(t, v)), over_nic, node_gbps(t, v), "node %u ingress", v);
    uint64_t need = total / k, direct = in / recvs[v];
    uint64_t fan = need > direct ? need - direct : 0;
    consider(&nv, over(fan, t->nvlink_gbps), fan, t->nvlink_gbps, "node %u receivers", v);
  }
  add_stage(out, "nic", &nic, 0);
  add_stage(out, "nvlink", &nv, 0);
  free(srcs), free(recvs), free(distinct), free(keys), free(local);
  return BCAST_OK;
}

/* Where the places must lie, for any layout. */
static int places_check(const bcast_plan *p, const bcast_topo_place *place, size_t nplace, const bcast_topo *t,
                        bcast_err *err) {
  if (nplace != p->world_size)
    return bcast__fail(err, BCAST_EINVAL, "placement: %zu places for a plan of %u ranks", nplace,
                       p->world_size);
  for (size_t r = 0; r < nplace; r++) {
    if (place[r].node >= t->nodes)
      return bcast__fail(err, BCAST_EINVAL, "placement[%zu].node %u >= nodes %u", r, place[r].node,
                         t->nodes);
    if (place[r].gpu >= t->gpus_per_node)
      return bcast__fail(err, BCAST_EINVAL, "placement[%zu].gpu %u >= gpus_per_node %u", r,
                         place[r].gpu, t->gpus_per_node);
  }
  return BCAST_OK;
}

/* Checks what the layout asks of the plan and the placement. */
static int layout_check(const bcast_plan *p, const bcast_topo_place *place, size_t nplace,
                        const bcast_topo_opts *o, uint32_t ns, bcast_err *err) {
  uint32_t nr = p->world_size - ns, k = o->replica_gpus ? o->replica_gpus : 1;
  if (o->layout != BCAST_LAYOUT_ENGINE && o->layout != BCAST_LAYOUT_MULTIROOT)
    return bcast__fail(err, BCAST_EINVAL, "layout %d is unknown", (int)o->layout);
  if (o->layout == BCAST_LAYOUT_ENGINE && k != 1)
    return bcast__fail(err, BCAST_EINVAL,
                       "replica_gpus %u: the engine layout sends every receiver the whole model", k);
  if (nr % k)
    return bcast__fail(err, BCAST_EINVAL, "replica_gpus %u does not divide the %u receivers", k, nr);
  if (o->relay_from && o->layout != BCAST_LAYOUT_ENGINE)
    return bcast__fail(err, BCAST_EINVAL, "relay_from: relays are for the engine layout, not %s",
                       bcast_topo_layout_name(o->layout));
  if (o->layout != BCAST_LAYOUT_ENGINE) return BCAST_OK;
  if (o->relay_from) {
    int rc = relays_check(p, o->relay_from, ns, err);
    if (rc) return rc;
  }
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
  return BCAST_OK;
}

/* Each source's bytes from its buckets' slices. */
static int source_bytes(const bcast_plan *p, uint32_t ns, src_bytes *sb, uint64_t *total, bcast_err *err) {
  *total = 0;
  for (size_t b = 0; b < p->nbuckets; b++) {
    const bcast_bucket *bk = &p->buckets[b];
    if (bk->source_rank >= ns)
      return bcast__fail(err, BCAST_EINVAL, "plan: bucket %zu's source_rank %u >= sources %u", b,
                         bk->source_rank, ns);
    src_bytes *s = &sb[bk->source_rank];
    s->wire += bk->bytes;
    s->buckets++;
    s->slices += bk->nslices;
    *total += bk->bytes;
    for (size_t i = 0; i < bk->nslices; i++) {
      const bcast_slice *sl = &bk->slices[i];
      const bcast_tensor *tn = &p->tensors[sl->tensor];
      uint64_t stor = sl->elem_count * bcast_dtype_size(tn->storage_dtype);
      int cast = tn->storage_dtype != tn->wire_dtype;
      if (tn->residency != BCAST_RES_GPU)
        s->host_stor += stor;
      else {
        s->gpu_stor += stor;
        if (!cast) s->gpu_copy += sl->elem_count * bcast_dtype_size(tn->wire_dtype);
      }
      if (cast) s->cast_stor += stor;
    }
  }
  return BCAST_OK;
}

int bcast_topo_predict(const bcast_plan *p, const bcast_topo_place *place, size_t nplace,
                       const bcast_topo *t, const bcast_topo_opts *o, bcast_topo_pred *out,
                       bcast_err *err) {
  if (!p || !place || !o || !out) return bcast__fail(err, BCAST_EINVAL, "topology: NULL argument");
  int rc = bcast_topo_check(t, err);
  if (rc) return rc;
  uint32_t ns = bcast__plan_nsources(p);
  rc = places_check(p, place, nplace, t, err);
  if (rc) return rc;
  if (p->world_size <= ns)
    return bcast__fail(err, BCAST_EINVAL, "plan: %u ranks, %u sources: no receiver", p->world_size, ns);
  rc = layout_check(p, place, nplace, o, ns, err);
  if (rc) return rc;
  /* ns is at least 1 (bcast__plan_nsources), which the analyser cannot see
   * across files. */
  src_bytes *sb = calloc(ns ? ns : 1, sizeof *sb);
  if (!sb) return bcast__fail(err, BCAST_ENOMEM, "topology: out of memory");
  uint64_t total = 0;
  rc = source_bytes(p, ns, sb, &total, err);
  memset(out, 0, sizeof *out);
  out->layout = o->layout;
  uint32_t k = o->replica_gpus ? o->replica_gpus : 1;
  if (!rc && o->layout == BCAST_LAYOUT_MULTIROOT)
    rc = predict_multiroot(p, place, t, sb, ns, k, total, out, err);
  else if (!rc && p->mode == BCAST_MODE_HOST)
    rc = predict_host(p, place, t, o, sb, ns, total, out, err);
  else if (!rc && p->mode == BCAST_MODE_COLOCATED)
    predict_coloc(p, t, sb, ns, total, out);
  else if (!rc)
    predict_ring(p, place, t, sb, total, out);
  uint32_t depth = 1;
  for (uint32_t j = 0; j < ns; j++)
    if (sb[j].buckets > depth) depth = sb[j].buckets;
  free(sb);
  if (rc) return rc;
  /* n equal buckets through pipelined stages s_k: the first bucket crosses
   * every stage, each later one leaves the slowest stage one bucket-time
   * later; serial stages run whole, before or after. */
  double sum = 0, max = 0, serial = 0;
  for (size_t i = 0; i < out->nstages; i++) {
    const bcast_topo_stage *s = &out->stages[i];
    if (s->serial) {
      serial += s->seconds;
      continue;
    }
    sum += s->seconds;
    if (s->seconds > max) max = s->seconds;
  }
  out->pipeline_depth = depth;
  out->total_s = serial + sum / depth + (double)(depth - 1) / depth * max + out->latency_s;
  return BCAST_OK;
}

const bcast_topo_stage *bcast_topo_pred_bottleneck(const bcast_topo_pred *p) {
  const bcast_topo_stage *best = NULL;
  for (size_t i = 0; p && i < p->nstages; i++)
    if (!best || p->stages[i].seconds > best->seconds) best = &p->stages[i];
  return best;
}

/* snprintf at buf + at, keeping count of the whole length when it does not fit. */
static size_t put(char *buf, size_t len, size_t at, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static size_t put(char *buf, size_t len, size_t at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(at < len ? buf + at : NULL, at < len ? len - at : 0, fmt, ap);
  va_end(ap);
  return n > 0 ? at + (size_t)n : at;
}

size_t bcast_topo_pred_describe(const bcast_topo_pred *p, char *buf, size_t len) {
  if (buf && len) buf[0] = '\0';
  if (!buf) len = 0;
  if (!p) return put(buf, len, 0, "no prediction");
  size_t at = put(buf, len, 0, "%s%s %.3f s:", bcast_topo_layout_name(p->layout), p->relays ? "+relays" : "",
                  p->total_s);
  for (size_t i = 0; i < p->nstages; i++) {
    const bcast_topo_stage *s = &p->stages[i];
    at = put(buf, len, at, "%s %s %.3f s at %s (%.2f GB at %.1f GB/s%s)", i ? "," : "", s->name, s->seconds,
             s->where, (double)s->bytes / 1e9, s->gbps, s->serial ? ", serial" : "");
  }
  at = put(buf, len, at, "; %u bucket%s deep", p->pipeline_depth, p->pipeline_depth == 1 ? "" : "s");
  if (p->relays) at = put(buf, len, at, ", %u relay%s", p->relays, p->relays == 1 ? "" : "s");
  if (p->latency_s > 0) at = put(buf, len, at, ", %.3f ms fixed", p->latency_s * 1e3);
  return at;
}
