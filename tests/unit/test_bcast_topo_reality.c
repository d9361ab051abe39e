/* The cost model against every broadcast measured so far: each row is a
 * figure of docs/BENCHMARKS.md (the comment names its section and line of
 * table), its configuration rebuilt with the real planner as the benchmark
 * or the run built it, predicted on a topology of the machine it ran on,
 * and held within 10% of the measurement (of both ends, where the
 * measurement is a range). The table it prints is the one of
 * docs/BENCHMARKS.md, "The cost model against every measured figure". */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_preset.h"
#include "workers/bcast/bcast_topo.h"

#define TOLERANCE 0.10

typedef enum {
  H200,    /* the H200 machines (2 x H200 NV18, 1 x H200) and their hosts: bcast_topo_default */
  H200B,   /* the 1 x H200 host lent on 2026-12-02: its own host-transport figures */
  DEV      /* the 2-core development machine: its host-transport figures */
} machine;

typedef struct row {
  const char *what;
  const char *preset;
  machine on;
  bcast_mode mode;
  bcast_dtype storage;     /* the sender's master */
  bcast_residency res;
  uint32_t senders;        /* 0: one rank's plan (bcast_plan_build); else dim-0 shards over them */
  uint32_t receivers;
  uint32_t layers;         /* 0: every decoder layer */
  int rx_host;             /* receivers hold host memory, no GPU */
  int tls;                 /* host transport over TLS */
  double lo, hi;           /* measured seconds (hi = lo for one figure) */
} row;

#define FP32 BCAST_DTYPE_FP32
#define BF16 BCAST_DTYPE_BF16
#define PINNED BCAST_RES_HOST_PINNED
#define PAGEABLE BCAST_RES_HOST_PAGEABLE
#define GPU BCAST_RES_GPU

static const row rows[] = {
    /* "Results (2 x H200, NV18 NVLink ...)": | 4b | staged | ... | 0.3049 s |, and
     * "Across the runs of that day": 4b staged 0.2927 s */
    {"bench broadcast, 2 x H200", "4b", H200, BCAST_MODE_STAGED, FP32, PINNED, 0, 1, 0, 0, 0, 0.2927, 0.3049},
    /* same table: | 8b | staged | ... | 0.5928 s | */
    {"bench broadcast, 2 x H200", "8b", H200, BCAST_MODE_STAGED, FP32, PINNED, 0, 1, 0, 0, 0, 0.5928, 0.5928},
    /* same table: | 1b | staged | ... | 0.0954 s | */
    {"bench broadcast, 2 x H200", "1b", H200, BCAST_MODE_STAGED, FP32, PINNED, 0, 1, 0, 0, 0, 0.0954, 0.0954},
    /* same table: | 4b | direct | ... | 0.0232 s | */
    {"bench broadcast, 2 x H200", "4b", H200, BCAST_MODE_DIRECT, BF16, GPU, 0, 1, 0, 0, 0, 0.0232, 0.0232},
    /* same table: | 8b | direct | ... | 0.0469 s | */
    {"bench broadcast, 2 x H200", "8b", H200, BCAST_MODE_DIRECT, BF16, GPU, 0, 1, 0, 0, 0, 0.0469, 0.0469},
    /* same table: | 1b | direct | ... | 0.0074 s | */
    {"bench broadcast, 2 x H200", "1b", H200, BCAST_MODE_DIRECT, BF16, GPU, 0, 1, 0, 0, 0, 0.0074, 0.0074},
    /* "The step loop on GPUs": | 1b | params | staged ... | 0.0903 |, | 1b |
     * params+optimizer | ... | 0.0904 | (fp32 bytes over PCIe: before the shadow) */
    {"run, step loop (offload params, params+optimizer)", "1b", H200, BCAST_MODE_STAGED, FP32, PINNED, 0, 1, 0, 0, 0, 0.0903,
     0.0904},
    /* same table: | 1b | none | direct ... | 0.0078 | */
    {"run, step loop (offload none)", "1b", H200, BCAST_MODE_DIRECT, BF16, GPU, 0, 1, 0, 0, 0, 0.0078, 0.0078},
    /* same table: | 4b | params | staged ... | 0.2925 | */
    {"run, step loop (offload params)", "4b", H200, BCAST_MODE_STAGED, FP32, PINNED, 0, 1, 0, 0, 0, 0.2925, 0.2925},
    /* "Colocated mode (one GPU)", results on 1 x H200: | 1b | host | ... | 0.0902 s | */
    {"bench broadcast colocated, 1 x H200", "1b", H200, BCAST_MODE_COLOCATED, FP32, PINNED, 0, 1, 0, 0, 0, 0.0902,
     0.0902},
    /* same table: | 1b | bf16-host | ... | 0.0458 s | */
    {"bench broadcast colocated, 1 x H200", "1b", H200, BCAST_MODE_COLOCATED, BF16, PINNED, 0, 1, 0, 0, 0, 0.0458,
     0.0458},
    /* same table: | 1b | gpu | ... | 0.0025 s |; "rlorch run --preset 1b" colocated:
     * | none (fp32 master on the GPU) | 1 | 0.0025 s | */
    {"bench broadcast colocated; run, offload none", "1b", H200, BCAST_MODE_COLOCATED, FP32, GPU, 0, 1, 0, 0, 0, 0.0025, 0.0025},
    /* same table: | 4b | host | ... | 0.2927 s | */
    {"bench broadcast colocated, 1 x H200", "4b", H200, BCAST_MODE_COLOCATED, FP32, PINNED, 0, 1, 0, 0, 0, 0.2927,
     0.2927},
    /* same table: | 4b | bf16-host | ... | 0.1470 s |; "The CPU optimizer step and
     * the bf16 shadow": the 4b broadcast from such a shadow takes 0.147-0.148 s */
    {"bench broadcast colocated, 1 x H200", "4b", H200, BCAST_MODE_COLOCATED, BF16, PINNED, 0, 1, 0, 0, 0, 0.1470,
     0.1480},
    /* same table: | 4b | gpu | ... | 0.0073 s | */
    {"bench broadcast colocated, 1 x H200", "4b", H200, BCAST_MODE_COLOCATED, FP32, GPU, 0, 1, 0, 0, 0, 0.0073, 0.0073},
    /* same table: | 8b | host | ... | 0.5927 s | */
    {"bench broadcast colocated, 1 x H200", "8b", H200, BCAST_MODE_COLOCATED, FP32, PINNED, 0, 1, 0, 0, 0, 0.5927,
     0.5927},
    /* same table: | 8b | gpu | ... | 0.0136 s | */
    {"bench broadcast colocated, 1 x H200", "8b", H200, BCAST_MODE_COLOCATED, FP32, GPU, 0, 1, 0, 0, 0, 0.0136, 0.0136},
    /* "rlorch run --preset 1b --steps 3" colocated: | params (fp32 master in
     * pinned host memory) | 2 | 0.090 s | */
    {"run colocated, offload params", "1b", H200, BCAST_MODE_COLOCATED, FP32, PINNED, 0, 2, 0, 0, 0,
     0.090, 0.090},
    /* "Two buffer sets": double-buffer scenario, 1b, 8 layers, params, 2
     * receivers: 0.0546 s minimum, 0.0550 s median */
    {"coloc_faults double-buffer, 8 layers", "1b", H200, BCAST_MODE_COLOCATED, FP32, PINNED, 0, 2, 8, 0, 0, 0.0546,
     0.0550},
    /* "The CPU optimizer step and the bf16 shadow": 0.0455 s a broadcast with
     * the shadow, 0.0900 s with --bf16-shadow off */
    {"run colocated, bf16 shadow", "1b", H200, BCAST_MODE_COLOCATED, BF16, PINNED, 0, 1, 0, 0, 0, 0.0455, 0.0455},
    {"run colocated, --bf16-shadow off", "1b", H200, BCAST_MODE_COLOCATED, FP32, PINNED, 0, 1, 0, 0, 0, 0.0900, 0.0900},
    /* "Several senders in colocated mode": | 1b fp32 pinned host, 2 receivers |
     * 0.0909 s | 0.0913 s | 0.0965 s | */
    {"bench broadcast colocated --senders", "1b", H200, BCAST_MODE_COLOCATED, FP32, PINNED, 1, 2, 0, 0, 0, 0.0909,
     0.0909},
    {"bench broadcast colocated --senders", "1b", H200, BCAST_MODE_COLOCATED, FP32, PINNED, 2, 2, 0, 0, 0,
     0.0913, 0.0913},
    {"bench broadcast colocated --senders", "1b", H200, BCAST_MODE_COLOCATED, FP32, PINNED, 4, 2, 0, 0, 0,
     0.0965, 0.0965},
    /* same table: | 1b bf16 pinned host (the shadow), 2 receivers | 0.0457 s |
     * 0.0464 s | 0.0482 s | */
    {"bench broadcast colocated --senders", "1b", H200, BCAST_MODE_COLOCATED, BF16, PINNED, 1, 2, 0, 0, 0, 0.0457,
     0.0457},
    {"bench broadcast colocated --senders", "1b", H200, BCAST_MODE_COLOCATED, BF16, PINNED, 2, 2, 0, 0, 0,
     0.0464, 0.0464},
    {"bench broadcast colocated --senders", "1b", H200, BCAST_MODE_COLOCATED, BF16, PINNED, 4, 2, 0, 0, 0,
     0.0482, 0.0482},
    /* same table: | 1b GPU master, 2 receivers | 0.0041 s | 0.0043 s | 0.0050 s | */
    {"bench broadcast colocated --senders", "1b", H200, BCAST_MODE_COLOCATED, FP32, GPU, 1, 2, 0, 0, 0, 0.0041,
     0.0041},
    {"bench broadcast colocated --senders", "1b", H200, BCAST_MODE_COLOCATED, FP32, GPU, 2, 2, 0, 0, 0, 0.0043,
     0.0043},
    {"bench broadcast colocated --senders", "1b", H200, BCAST_MODE_COLOCATED, FP32, GPU, 4, 2, 0, 0, 0, 0.0050,
     0.0050},
    /* same table: | 4b fp32 pinned host, 1 receiver | 0.2930 s | 0.2936 s | 0.3059 s | */
    {"bench broadcast colocated --senders", "4b", H200, BCAST_MODE_COLOCATED, FP32, PINNED, 1, 1, 0, 0, 0, 0.2930,
     0.2930},
    {"bench broadcast colocated --senders", "4b", H200, BCAST_MODE_COLOCATED, FP32, PINNED, 2, 1, 0, 0, 0,
     0.2936, 0.2936},
    {"bench broadcast colocated --senders", "4b", H200, BCAST_MODE_COLOCATED, FP32, PINNED, 4, 1, 0, 0, 0,
     0.3059, 0.3059},
    /* same section, tests/gpu/group_coloc.sh: | 2 | pinned host | 0.0919 s |,
     * | 4 | pinned host | 0.0938 s | (2 receivers) */
    {"group_coloc.sh, trainer group", "1b", H200, BCAST_MODE_COLOCATED, FP32, PINNED, 2, 2, 0, 0, 0,
     0.0919, 0.0919},
    {"group_coloc.sh, trainer group", "1b", H200, BCAST_MODE_COLOCATED, FP32, PINNED, 4, 2, 0, 0, 0,
     0.0938, 0.0938},
    /* "The host transport with TLS", H200 host: | 100m | ... | 0.1430 s | (plain engine) */
    {"bench broadcast --tls (plain), H200 host", "100m", H200, BCAST_MODE_HOST, FP32, PAGEABLE, 0, 1, 0, 1, 0, 0.1430, 0.1430},
    /* same table: | 1b | ... | 1.6473 s |; "Before and after the restructured
     * tree": bench broadcast 1b host 1.956 s (old), 1.850 s (new) */
    {"bench broadcast host, H200 host", "1b", H200, BCAST_MODE_HOST, FP32, PAGEABLE, 0, 1, 0, 1, 0, 1.6473, 1.956},
    /* "The host transport with TLS", H200 host: | 100m | ... | 0.2069 s |, | 1b |
     * ... | 2.8341 s | (engine, TLS) */
    {"bench broadcast --tls, H200 host", "100m", H200, BCAST_MODE_HOST, FP32, PAGEABLE, 0, 1, 0, 1, 1, 0.2069,
     0.2069},
    {"bench broadcast --tls, H200 host", "1b", H200, BCAST_MODE_HOST, FP32, PAGEABLE, 0, 1, 0, 1, 1, 2.8341,
     2.8341},
    /* "Before and after the restructured tree": run 1b offload params,
     * broadcast 1.67-1.90 s (fp32 pinned trainer, a CPU inference worker) */
    {"run, offload params, CPU inference worker", "1b", H200, BCAST_MODE_HOST, FP32, PINNED, 0, 1, 0, 1, 0, 1.67,
     1.90},
    /* same table: run 1b offload none, p50 2.310 s (old), 2.330 s (new): the
     * fp32 GPU master copied to host first */
    {"run, offload none, CPU inference worker", "1b", H200, BCAST_MODE_HOST, FP32, GPU, 0, 1, 0, 1, 0, 2.310,
     2.330},
    /* "The host transport with several senders", H200 host: | 1 | 2.2108 s |,
     * and "Several senders in colocated mode": the host transport's table from
     * the same run, 1.937 s */
    {"bench broadcast host --senders, H200 host", "1b", H200, BCAST_MODE_HOST, FP32, PAGEABLE, 1, 2, 0, 1, 0, 1.937, 2.2108},
    /* | 2 | 1.3085 s |; 1.216 s */
    {"bench broadcast host --senders, H200 host", "1b", H200, BCAST_MODE_HOST, FP32, PAGEABLE, 2, 2, 0, 1, 0, 1.216, 1.3085},
    /* | 4 | 0.8220 s |; 0.802 s */
    {"bench broadcast host --senders, H200 host", "1b", H200, BCAST_MODE_HOST, FP32, PAGEABLE, 4, 2, 0, 1, 0, 0.802, 0.8220},
    /* "The cost model against every measured figure", the host lent on
     * 2026-12-02: --senders 8 --receivers 4: 2.5459, 1.6259, 1.1073, 1.0879 s */
    {"bench broadcast host --senders, H200 host B", "1b", H200B, BCAST_MODE_HOST, FP32, PAGEABLE, 1, 4, 0, 1, 0,
     2.5459, 2.5459},
    {"bench broadcast host --senders, H200 host B", "1b", H200B, BCAST_MODE_HOST, FP32, PAGEABLE, 2, 4, 0, 1, 0,
     1.6259, 1.6259},
    {"bench broadcast host --senders, H200 host B", "1b", H200B, BCAST_MODE_HOST, FP32, PAGEABLE, 4, 4, 0, 1, 0,
     1.1073, 1.1073},
    {"bench broadcast host --senders, H200 host B", "1b", H200B, BCAST_MODE_HOST, FP32, PAGEABLE, 8, 4, 0, 1, 0,
     1.0879, 1.0879},
    /* same run, --senders 4 --receivers 2: 1.5537, 1.0964, 0.7038 s */
    {"bench broadcast host --senders, H200 host B", "1b", H200B, BCAST_MODE_HOST, FP32, PAGEABLE, 1, 2, 0, 1, 0,
     1.5537, 1.5537},
    {"bench broadcast host --senders, H200 host B", "1b", H200B, BCAST_MODE_HOST, FP32, PAGEABLE, 2, 2, 0, 1, 0,
     1.0964, 1.0964},
    {"bench broadcast host --senders, H200 host B", "1b", H200B, BCAST_MODE_HOST, FP32, PAGEABLE, 4, 2, 0, 1, 0,
     0.7038, 0.7038},
    /* same run: 4b engine 5.4262 s; 100m engine 0.1550 s, TLS 0.2310 s */
    {"bench broadcast host, H200 host B", "4b", H200B, BCAST_MODE_HOST, FP32, PAGEABLE, 0, 1, 0, 1, 0, 5.4262,
     5.4262},
    {"bench broadcast --tls (plain), H200 host B", "100m", H200B, BCAST_MODE_HOST, FP32, PAGEABLE, 0, 1, 0, 1, 0,
     0.1550, 0.1550},
    {"bench broadcast --tls, H200 host B", "100m", H200B, BCAST_MODE_HOST, FP32, PAGEABLE, 0, 1, 0, 1, 1, 0.2310,
     0.2310},
    /* "The host transport with several senders", this development machine:
     * | 1 | 0.2339 s |, a second run 0.2373 s */
    {"bench broadcast host --senders, 2 cores", "100m", DEV, BCAST_MODE_HOST, FP32, PAGEABLE, 1, 2, 0, 1, 0, 0.2339, 0.2373},
    /* | 2 | 0.1895 s |, 0.1798 s */
    {"bench broadcast host --senders, 2 cores", "100m", DEV, BCAST_MODE_HOST, FP32, PAGEABLE, 2, 2, 0, 1, 0, 0.1798, 0.1895},
    /* | 4 | 0.1803 s |, 0.1845 s */
    {"bench broadcast host --senders, 2 cores", "100m", DEV, BCAST_MODE_HOST, FP32, PAGEABLE, 4, 2, 0, 1, 0, 0.1803, 0.1845},
};

/* The development machine: the H200 host's figures but for what its two
 * shared cores give the host transport (docs/ARCHITECTURE.md sources each). */
static bcast_topo topo_of(machine m) {
  bcast_topo t;
  bcast_topo_default(&t, 1);
  if (m == H200B) {
    t.tcp_stream_gbps = 1.8;
    t.tls_stream_gbps = 1.15;
    t.tcp_send_gbps = 4.6;
    t.host_gbps = 40;
    t.host_cores_gbps = 19;
    t.tcp_plan_ms = 40;
  }
  if (m == DEV) {
    t.tcp_stream_gbps = 0;
    t.tcp_send_gbps = 1.80;
    t.host_gbps = 0;
    t.host_cores_gbps = 4.6;
    t.host_cast_gbps = 7.4;
  }
  return t;
}

static const uint8_t secret[BCAST_SECRET_BYTES];

/* The plan the benchmark or the run built for the row. */
static bcast_plan *plan_of(const row *r) {
  bcast_preset_opts so = {.storage_dtype = r->storage, .wire_dtype = BF16, .residency = r->res,
                          .max_layers = r->layers};
  bcast_tensor *t = NULL;
  size_t n = 0;
  bcast_err e = {0};
  cr_assert_eq(bcast_preset_manifest(r->preset, &so, &t, &n, &e), BCAST_OK, "%s: %s", r->what, e.msg);
  int host = r->mode == BCAST_MODE_HOST;
  bcast_plan *p = NULL;
  if (!r->senders) {
    bcast_plan_opts po = {.id = "reality", .mode = r->mode, .world_size = 1 + r->receivers,
                          .staging_budget = 256ull << 20, .host_endpoint = host ? "127.0.0.1:1" : NULL,
                          .secret = secret, .tls = r->tls};
    cr_assert_eq(bcast_plan_build(t, n, &po, &p, &e), BCAST_OK, "%s: %s", r->what, e.msg);
    free(t);
    return p;
  }
  uint32_t ns = r->senders;
  bcast_tensor *sh = calloc((size_t)ns * n, sizeof *sh);
  const bcast_tensor **ranks = calloc(ns, sizeof *ranks);
  size_t *counts = calloc(ns, sizeof *counts);
  const char **eps = calloc(ns, sizeof *eps);
  cr_assert(sh && ranks && counts && eps);
  for (uint32_t k = 0; k < ns; k++) {
    ranks[k] = sh + (size_t)k * n;
    counts[k] = bcast_preset_dim0_shards(t, n, k, ns, sh + (size_t)k * n);
    eps[k] = "127.0.0.1:1";
  }
  bcast_shard_map *m = NULL;
  cr_assert_eq(bcast_shards_check(ranks, counts, ns, NULL, &m, &e), BCAST_OK, "%s: %s", r->what, e.msg);
  bcast_plan_opts po = {.id = "reality-shards", .mode = r->mode, .world_size = ns + r->receivers,
                        .staging_budget = 256ull << 20, .source_endpoints = host ? eps : NULL, .secret = secret};
  cr_assert_eq(bcast_plan_build_sharded(m, &po, &p, &e), BCAST_OK, "%s: %s", r->what, e.msg);
  bcast_shard_map_free(m);
  free(sh), free(ranks), free(counts), free(eps), free(t);
  return p;
}

/* Where the ranks ran: NCCL plans on GPU 0 and GPU 1 of one node, colocated
 * and host plans on one node (the host transport over loopback), colocated
 * on GPU 0. */
static void place_of(const row *r, const bcast_plan *p, bcast_topo_place *pl) {
  uint32_t ns = p->nsources ? p->nsources : 1;
  for (uint32_t k = 0; k < p->world_size; k++) {
    int nccl = r->mode == BCAST_MODE_DIRECT || r->mode == BCAST_MODE_STAGED;
    pl[k] = (bcast_topo_place){.node = 0, .gpu = nccl ? k : 0, .host = k >= ns && r->rx_host};
  }
}

static const char *residency_name(bcast_residency r) {
  return r == GPU ? "GPU" : r == PINNED ? "pinned" : "pageable";
}

Test(bcast_topo_reality, every_measured_broadcast_within_10_percent) {
  size_t n = sizeof rows / sizeof rows[0], bad = 0;
  printf("| figure | preset | mode | senders -> receivers | master | machine | measured | predicted | predicted / "
         "measured | bottleneck |\n");
  printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (size_t i = 0; i < n; i++) {
    const row *r = &rows[i];
    bcast_plan *p = plan_of(r);
    bcast_topo_place pl[16];
    cr_assert_leq(p->world_size, 16);
    place_of(r, p, pl);
    bcast_topo t = topo_of(r->on);
    bcast_topo_opts o = {.layout = BCAST_LAYOUT_ENGINE};
    bcast_topo_pred pred;
    bcast_err e = {0};
    cr_assert_eq(bcast_topo_predict(p, pl, p->world_size, &t, &o, &pred, &e), BCAST_OK, "%s: %s", r->what, e.msg);
    double lo = pred.total_s / r->hi, hi = pred.total_s / r->lo;
    int ok = lo >= 1 - TOLERANCE && hi <= 1 + TOLERANCE;
    const bcast_topo_stage *b = bcast_topo_pred_bottleneck(&pred);
    char measured[64], ratio[64];
    if (r->lo == r->hi) {
      snprintf(measured, sizeof measured, "%.4f s", r->lo);
      snprintf(ratio, sizeof ratio, "%.3f", hi);
    } else {
      snprintf(measured, sizeof measured, "%.4f-%.4f s", r->lo, r->hi);
      snprintf(ratio, sizeof ratio, "%.3f-%.3f", lo, hi);
    }
    printf("| %s | %s | %s%s | %u -> %u | %s %s | %s | %s | %.4f s | %s%s | %s at %s |\n", r->what, r->preset,
           bcast_mode_name(r->mode), r->tls ? " (TLS)" : "", r->senders ? r->senders : 1, r->receivers,
           bcast_dtype_name(r->storage), residency_name(r->res), r->on == DEV ? "2-core" : r->on == H200B ? "H200 B" : "H200", measured,
           pred.total_s, ratio, ok ? "" : " **off**", b ? b->name : "-", b ? b->where : "-");
    if (!ok) {
      char line[512];
      bcast_topo_pred_describe(&pred, line, sizeof line);
      fprintf(stderr, "%s: %s\n", r->what, line);
      bad++;
    }
    bcast_plan_free(p);
  }
  cr_assert_eq(bad, 0, "%zu of %zu measured figures are more than 10%% off the model", bad, n);
}
