/* The bf16 shadow of a params+optimizer trainer, broadcast colocated on one
 * GPU. The trainer's layout: fp32 master weights in pageable host memory,
 * updated by the CPU AdamW step, which writes the bf16 shadow into pinned
 * memory; the plan carries the shadow (storage bf16). Beside it the path the
 * shadow replaces: the same fp32 weights in pinned memory, cast on the GPU
 * by the engine into a second receiver. Over several steps, with NaN,
 * infinities, subnormals and rounding ties among the weights: both receivers
 * hold the same bytes, equal to the CPU cast of the master; the shadow's plan
 * moves half the PCIe bytes; the trainer's checksum of the shadow equals the
 * receiver's; receiver memory outside the tensors is untouched. Skips
 * without a GPU. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/agent/agent_adamw.h"
#include "workers/agent/agent_weights.h"
#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_preset.h"

#ifdef RLORCH_HAVE_CUDA
#include <cuda_runtime_api.h>

static int devices(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

#define CANARY 0x5A
#define GAP 4096

/* A receiver's tensors in one allocation with canaries around each (the
 * export's allocation + offset path, and a stray write shows). */
typedef struct slab {
  void *base;
  size_t bytes;
} slab;

static size_t wire_bytes(const bcast_tensor *t) {
  return (size_t)bcast_tensor_elems(t) * bcast_dtype_size(t->wire_dtype);
}

static slab slab_new(bcast_tensor *t, size_t n) {
  size_t total = GAP;
  for (size_t i = 0; i < n; i++) total += (wire_bytes(&t[i]) + 255) / 256 * 256 + GAP;
  slab s = {NULL, total};
  cr_assert_eq(cudaMalloc(&s.base, total), cudaSuccess);
  cr_assert_eq(cudaMemset(s.base, CANARY, total), cudaSuccess);
  size_t off = GAP;
  for (size_t i = 0; i < n; i++) {
    t[i].residency = BCAST_RES_GPU;
    t[i].device = 0;
    t[i].data = (char *)s.base + off;
    off += (wire_bytes(&t[i]) + 255) / 256 * 256 + GAP;
  }
  cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
  return s;
}

static void slab_check(const slab *s, const bcast_tensor *t, size_t n) {
  uint8_t *h = malloc(s->bytes), *inside = calloc(s->bytes, 1);
  cr_assert(h && inside);
  cr_assert_eq(cudaMemcpy(h, s->base, s->bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < n; i++)
    memset(inside + ((char *)t[i].data - (char *)s->base), 1, wire_bytes(&t[i]));
  size_t bad = 0;
  for (size_t i = 0; i < s->bytes; i++) bad += !inside[i] && h[i] != CANARY;
  cr_assert_eq(bad, 0, "%zu bytes outside the plan's tensors changed", bad);
  free(h);
  free(inside);
}

static bcast_tensor *manifest(size_t *n) {
  bcast_preset_opts po = {.storage_dtype = BCAST_DTYPE_FP32, .wire_dtype = BCAST_DTYPE_BF16,
                          .residency = BCAST_RES_HOST_PAGEABLE, .device = 0, .max_layers = 2};
  bcast_tensor *t = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_preset_manifest("100m", &po, &t, n, &err), BCAST_OK, "%s", err.msg);
  return t;
}

/* A copy of the manifest with another storage dtype and residency. */
static bcast_tensor *like(const bcast_tensor *t, size_t n, bcast_dtype storage,
                          bcast_residency res) {
  bcast_tensor *c = malloc(n * sizeof *c);
  cr_assert(c);
  memcpy(c, t, n * sizeof *c);
  for (size_t i = 0; i < n; i++) {
    c[i].storage_dtype = storage;
    c[i].residency = res;
    c[i].data = NULL;
  }
  return c;
}

static bcast_engine *engine(uint32_t rank) {
  bcast_engine_opts o = {.rank = rank, .device = 0, .timeout_s = 30};
  bcast_engine *e = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_engine_new(&o, &e, &err), BCAST_OK, "engine: %s", err.msg);
  return e;
}

/* One colocated sender and receiver with their plan, exported and imported
 * once (the layout never changes, as between a trainer's steps). */
typedef struct pair {
  bcast_engine *snd, *rx;
  bcast_plan *p;
} pair;

static pair pair_new(const bcast_tensor *st, bcast_tensor *rt, size_t n, const char *id) {
  pair q = {engine(0), engine(1), NULL};
  bcast_plan_opts po = {.id = id, .mode = BCAST_MODE_COLOCATED, .world_size = 2,
                        .root_rank = 0, .staging_budget = 2u << 20};
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build(st, n, &po, &q.p, &err), BCAST_OK, "plan: %s", err.msg);
  uint8_t *ex = NULL;
  size_t len = 0;
  cr_assert_eq(bcast_engine_coloc_export(q.rx, q.p, rt, n, &ex, &len, &err), BCAST_OK, "%s",
               err.msg);
  cr_assert_eq(bcast_engine_coloc_import(q.snd, q.p, 1, ex, len, &err), BCAST_OK, "%s", err.msg);
  free(ex);
  return q;
}

static uint64_t pair_run(pair *q, const bcast_tensor *st, bcast_tensor *rt, size_t n) {
  bcast_stats s = {0}, rs = {0};
  bcast_err err = {0};
  cr_assert_eq(bcast_engine_execute(q->snd, q->p, st, n, &s, &err), BCAST_OK, "sender: %s",
               err.msg);
  cr_assert_eq(bcast_engine_execute(q->rx, q->p, rt, n, &rs, &err), BCAST_OK, "receiver: %s",
               err.msg);
  cr_assert_eq(s.mode, BCAST_MODE_COLOCATED);
  uint64_t pcie = s.pcie_bytes;
  bcast_stats_free(&s);
  bcast_stats_free(&rs);
  return pcie;
}

static void pair_free(pair *q) {
  bcast_engine_free(q->snd);
  bcast_engine_free(q->rx);
  bcast_plan_free(q->p);
}

/* Special values written over the start of every tensor's master. */
static const uint32_t specials[] = {0x7fc00001u, 0xff800000u, 0x7f800000u, 0x00000001u,
                                    0x807fffffu, 0x3f808000u, 0x3f818000u, 0x7f7fffffu,
                                    0xffffffffu, 0x7f800001u, 0x00018000u, 0x80000000u};

Test(shadow_coloc, params_optimizer_trainer_broadcasts_its_shadow_bit_exactly) {
  if (devices() < 1) cr_skip_test("needs a CUDA device, none visible");
  size_t n = 0;
  bcast_tensor *master = manifest(&n);
  bcast_tensor *shadow = like(master, n, BCAST_DTYPE_BF16, BCAST_RES_HOST_PINNED);
  bcast_tensor *pinned = like(master, n, BCAST_DTYPE_FP32, BCAST_RES_HOST_PINNED);
  bcast_tensor *ra = like(master, n, BCAST_DTYPE_FP32, BCAST_RES_GPU);
  bcast_tensor *rb = like(master, n, BCAST_DTYPE_FP32, BCAST_RES_GPU);
  bcast_storage *ms = NULL, *ss = NULL, *ps = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_storage_alloc(master, n, BCAST_FILL_SENDER, 29, &ms, &err), 0, "%s", err.msg);
  /* The receiver role allocates the wire dtype: bf16 for the shadow. */
  cr_assert_eq(bcast_storage_alloc(shadow, n, BCAST_FILL_RECEIVER, 0, &ss, &err), 0, "%s",
               err.msg);
  cr_assert_eq(bcast_storage_alloc(pinned, n, BCAST_FILL_SENDER, 29, &ps, &err), 0, "%s", err.msg);
  uint64_t total = 0, bf16_bytes = 0, fp32_bytes = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t e = bcast_tensor_elems(&master[i]);
    size_t k = e < 12 ? (size_t)e : 12;
    memcpy(master[i].data, specials, k * 4);
    total += e;
    bf16_bytes += e * 2;
    fp32_bytes += e * 4;
  }
  float *m = calloc(total, 4), *v = calloc(total, 4);
  agent_adamw_span *sp = calloc(n, sizeof *sp);
  cr_assert(m && v && sp);
  for (size_t i = 0, off = 0; i < n; off += sp[i].n, i++)
    sp[i] = (agent_adamw_span){master[i].data, m + off, v + off, bcast_tensor_elems(&master[i]),
                               off, shadow[i].data};
  cr_assert_eq(agent_adamw_shadow_cpu(sp, n, 0), 0);

  slab sa = slab_new(ra, n), sb = slab_new(rb, n);
  pair qa = pair_new(shadow, ra, n, "shadow"), qb = pair_new(pinned, rb, n, "fp32");
  agent_adamw_hparams hp;
  agent_adamw_defaults(&hp);
  hp.lr = 1e-3; /* weights move by more than a bf16 ulp in some places each step */
  uint64_t prev = 0;
  for (uint64_t step = 0; step <= 3; step++) {
    if (step > 0) {
      agent_adamw_coef c;
      cr_assert_eq(agent_adamw_coef_for_step(&hp, step, 100 + step, &c), 0);
      cr_assert_eq(agent_adamw_cpu(&c, sp, n, 0), 0);
    }
    for (size_t i = 0; i < n; i++)
      memcpy(pinned[i].data, master[i].data, bcast_tensor_elems(&master[i]) * 4);
    uint64_t pa = pair_run(&qa, shadow, ra, n), pb = pair_run(&qb, pinned, rb, n);
    cr_assert_eq(pa, bf16_bytes, "step %llu: the shadow's plan moved %llu PCIe bytes, not %llu",
                 (unsigned long long)step, (unsigned long long)pa, (unsigned long long)bf16_bytes);
    cr_assert_eq(pb, fp32_bytes, "step %llu: the fp32 plan moved %llu PCIe bytes",
                 (unsigned long long)step, (unsigned long long)pb);
    for (size_t i = 0; i < n; i++) {
      size_t e = (size_t)bcast_tensor_elems(&master[i]);
      uint16_t *a = malloc(e * 2), *b = malloc(e * 2), *want = malloc(e * 2);
      cr_assert(a && b && want);
      cr_assert_eq(cudaMemcpy(a, ra[i].data, e * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      cr_assert_eq(cudaMemcpy(b, rb[i].data, e * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      cr_assert_eq(bcast_cast_cpu(want, BCAST_DTYPE_BF16, master[i].data, BCAST_DTYPE_FP32, e),
                   BCAST_OK);
      cr_assert_eq(memcmp(a, want, e * 2), 0, "step %llu tensor %s: the shadow's receiver differs "
                   "from the CPU cast of the master", (unsigned long long)step, master[i].name);
      cr_assert_eq(memcmp(b, want, e * 2), 0, "step %llu tensor %s: the GPU cast differs from the "
                   "CPU cast", (unsigned long long)step, master[i].name);
      free(a);
      free(b);
      free(want);
    }
    /* What the orchestrator compares: the trainer's checksum (of the shadow,
     * its storage) and the receiver's (of its wire-dtype buffers). */
    uint64_t ct = 0, cr = 0, cm = 0;
    char e1[512] = "", e2[512] = "", e3[512] = "";
    cr_assert_eq(agent_weights_checksum(shadow, n, AGENT_WEIGHTS_STORAGE, &ct, e1, sizeof e1), 0,
                 "%s", e1);
    cr_assert_eq(agent_weights_checksum(ra, n, AGENT_WEIGHTS_WIRE, &cr, e2, sizeof e2), 0, "%s",
                 e2);
    cr_assert_eq(agent_weights_checksum(master, n, AGENT_WEIGHTS_STORAGE, &cm, e3, sizeof e3), 0,
                 "%s", e3);
    cr_assert_eq(ct, cr, "step %llu: trainer %016llx, receiver %016llx", (unsigned long long)step,
                 (unsigned long long)ct, (unsigned long long)cr);
    cr_assert_eq(ct, cm, "step %llu: the shadow's checksum is not the fp32 master's",
                 (unsigned long long)step);
    if (step > 0) cr_assert_neq(ct, prev, "step %llu changed no weight", (unsigned long long)step);
    prev = ct;
  }
  slab_check(&sa, ra, n);
  slab_check(&sb, rb, n);
  pair_free(&qa);
  pair_free(&qb);
  cudaFree(sa.base);
  cudaFree(sb.base);
  bcast_storage_free(ms);
  bcast_storage_free(ss);
  bcast_storage_free(ps);
  free(m);
  free(v);
  free(sp);
  free(master);
  free(shadow);
  free(pinned);
  free(ra);
  free(rb);
}

#else

Test(shadow_coloc, built_without_cuda) {
  cr_skip_test("built without CUDA: GPU tests need a CUDA build");
}

#endif
