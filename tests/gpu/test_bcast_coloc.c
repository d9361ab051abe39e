/* Colocated mode on one GPU: the sender writes the receivers' buffers.
 * Bit-exact against the CPU casts for a GPU-resident master, a host master
 * (pinned, pageable, mixed in one layer), a bf16 host copy, two receivers;
 * receiver memory outside the plan's tensors untouched; a receiver in
 * another process through CUDA IPC; bad exports and missing peers refused by
 * name; no GPU or host memory growth over 1,000 plans; several sources (2
 * and 4 trainer ranks, threads of this process, each writing its own dim-0
 * shards) into two receivers at once, a source that never writes named by
 * the receivers' timeout. Skips without a GPU. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

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

#define NEED_GPU()                                                                               \
  do {                                                                                           \
    if (devices() < 1) cr_skip_test("needs a CUDA device, none visible");                        \
  } while (0)

#define CANARY 0xA5
#define GAP 4096 /* bytes of canary before, between and after the tensors */

/* Receiver buffers: every tensor inside one allocation, canaries around each,
 * so the export's allocation + offset path is the one exercised and a write
 * outside a tensor shows. */
typedef struct slab {
  void *base;
  size_t bytes;
} slab;

static slab slab_new(bcast_tensor *t, size_t n) {
  size_t total = GAP;
  for (size_t i = 0; i < n; i++)
    total += (bcast_tensor_elems(&t[i]) * bcast_dtype_size(t[i].wire_dtype) + 255) / 256 * 256 + GAP;
  slab s = {NULL, total};
  cr_assert_eq(cudaMalloc(&s.base, total), cudaSuccess);
  cr_assert_eq(cudaMemset(s.base, CANARY, total), cudaSuccess);
  size_t off = GAP;
  for (size_t i = 0; i < n; i++) {
    t[i].residency = BCAST_RES_GPU;
    t[i].device = 0;
    t[i].data = (char *)s.base + off;
    off += (bcast_tensor_elems(&t[i]) * bcast_dtype_size(t[i].wire_dtype) + 255) / 256 * 256 + GAP;
  }
  cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
  return s;
}

/* Bytes of the slab outside the tensors are all canary. */
static void slab_check(const slab *s, const bcast_tensor *t, size_t n) {
  uint8_t *h = malloc(s->bytes);
  cr_assert(h);
  cr_assert_eq(cudaMemcpy(h, s->base, s->bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  uint8_t *inside = calloc(s->bytes, 1);
  cr_assert(inside);
  for (size_t i = 0; i < n; i++) {
    size_t off = (size_t)((char *)t[i].data - (char *)s->base);
    memset(inside + off, 1, bcast_tensor_elems(&t[i]) * bcast_dtype_size(t[i].wire_dtype));
  }
  size_t bad = 0;
  for (size_t i = 0; i < s->bytes; i++)
    if (!inside[i] && h[i] != CANARY && bad++ < 3)
      cr_log_error("byte %zu outside every tensor changed to 0x%02x", i, h[i]);
  cr_assert_eq(bad, 0, "%zu bytes outside the plan's tensors changed", bad);
  free(h);
  free(inside);
}

static void *to_host(const bcast_tensor *t, bcast_dtype dt) {
  size_t bytes = bcast_tensor_elems(t) * bcast_dtype_size(dt);
  void *h = malloc(bytes ? bytes : 1);
  cr_assert(h);
  if (t->residency == BCAST_RES_GPU)
    cr_assert_eq(cudaMemcpy(h, t->data, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  else
    memcpy(h, t->data, bytes);
  return h;
}

/* Every receiver tensor equals the CPU reference cast of the sender's. */
static void verify(const bcast_tensor *snd, const bcast_tensor *rcv, size_t n) {
  for (size_t i = 0; i < n; i++) {
    size_t e = bcast_tensor_elems(&snd[i]);
    void *s = to_host(&snd[i], snd[i].storage_dtype);
    void *r = to_host(&rcv[i], rcv[i].wire_dtype);
    size_t wb = e * bcast_dtype_size(rcv[i].wire_dtype);
    void *want = malloc(wb ? wb : 1);
    cr_assert_eq(bcast_cast_cpu(want, rcv[i].wire_dtype, s, snd[i].storage_dtype, e), BCAST_OK);
    cr_assert_eq(memcmp(want, r, wb), 0, "tensor %s: received bytes differ from the CPU cast",
                 rcv[i].name);
    free(s);
    free(r);
    free(want);
  }
}

static bcast_tensor *manifest(bcast_dtype storage, bcast_residency res, uint32_t layers,
                              size_t *n) {
  bcast_preset_opts po = {.storage_dtype = storage, .wire_dtype = BCAST_DTYPE_BF16,
                          .residency = res, .device = 0, .max_layers = layers};
  bcast_tensor *t = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_preset_manifest("100m", &po, &t, n, &err), BCAST_OK, "%s", err.msg);
  return t;
}

static bcast_engine *engine(uint32_t rank, double timeout_s) {
  bcast_engine_opts o = {.rank = rank, .device = 0, .timeout_s = timeout_s};
  bcast_engine *e = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_engine_new(&o, &e, &err), BCAST_OK, "engine: %s", err.msg);
  return e;
}

static bcast_plan *plan(const bcast_tensor *t, size_t n, const char *id, uint32_t world,
                        uint64_t budget) {
  bcast_plan_opts po = {.id = id, .mode = BCAST_MODE_COLOCATED, .world_size = world,
                        .root_rank = 0, .staging_budget = budget};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build(t, n, &po, &p, &err), BCAST_OK, "plan: %s", err.msg);
  return p;
}

/* The control plane's part, in one process: every receiver exports, the
 * sender imports every export. */
static void handshake(bcast_engine *snd, bcast_engine **rx, bcast_tensor **rt, size_t n,
                      uint32_t nrx, const bcast_plan *p) {
  for (uint32_t r = 0; r < nrx; r++) {
    uint8_t *ex = NULL;
    size_t len = 0;
    bcast_err err = {0};
    cr_assert_eq(bcast_engine_coloc_export(rx[r], p, rt[r], n, &ex, &len, &err), BCAST_OK,
                 "export of rank %u: %s", r + 1, err.msg);
    cr_assert_eq(bcast_engine_coloc_import(snd, p, r + 1, ex, len, &err), BCAST_OK,
                 "import of rank %u: %s", r + 1, err.msg);
    free(ex);
  }
}

/* Sender first, then each receiver: a receiver returns at once when its done
 * word is set, which is the order the engine guarantees. */
static void run_plan(bcast_engine *snd, const bcast_tensor *st, bcast_engine **rx,
                     bcast_tensor **rt, size_t n, uint32_t nrx, const bcast_plan *p,
                     bcast_stats *out) {
  bcast_stats s = {0};
  bcast_err err = {0};
  cr_assert_eq(bcast_engine_execute(snd, p, st, n, &s, &err), BCAST_OK, "sender: %s", err.msg);
  for (uint32_t r = 0; r < nrx; r++) {
    bcast_stats rs = {0};
    cr_assert_eq(bcast_engine_execute(rx[r], p, rt[r], n, &rs, &err), BCAST_OK, "rank %u: %s",
                 r + 1, err.msg);
    cr_assert_eq(rs.mode, BCAST_MODE_COLOCATED);
    bcast_stats_free(&rs);
  }
  if (out) *out = s;
  else bcast_stats_free(&s);
}

static void one_receiver(bcast_dtype storage, bcast_residency res, uint64_t budget, int mixed) {
  size_t n = 0, m = 0;
  bcast_tensor *st = manifest(storage, res, 2, &n);
  bcast_tensor *rt = manifest(storage, res, 2, &m);
  if (mixed) /* one layer holding GPU, pinned and pageable tensors */
    for (size_t i = 0; i < n; i++)
      st[i].residency = (bcast_residency)(BCAST_RES_GPU + (int)(i % 3));
  bcast_storage *ss = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_storage_alloc(st, n, BCAST_FILL_SENDER, 17, &ss, &err), 0, "%s", err.msg);
  slab sl = slab_new(rt, m);
  bcast_engine *snd = engine(0, 30), *rx = engine(1, 30);
  bcast_plan *p = plan(st, n, "coloc-1", 2, budget);
  handshake(snd, &rx, &rt, n, 1, p);
  bcast_stats s;
  run_plan(snd, st, &rx, &rt, n, 1, p, &s);
  verify(st, rt, n);
  slab_check(&sl, rt, m);
  uint64_t host = 0;
  for (size_t i = 0; i < n; i++)
    if (st[i].residency != BCAST_RES_GPU)
      host += bcast_tensor_elems(&st[i]) * bcast_dtype_size(st[i].storage_dtype);
  cr_assert_eq(s.pcie_bytes, host, "PCIe bytes %llu, host storage %llu",
               (unsigned long long)s.pcie_bytes, (unsigned long long)host);
  cr_assert_eq(s.mode, BCAST_MODE_COLOCATED);
  cr_assert_str_eq(s.transport, "in-process");
  cr_assert_eq(s.wire_bytes, bcast_plan_wire_bytes(p));
  cr_assert_eq(s.nbuckets, p->nbuckets);
  cr_assert_gt(s.total_s, 0);
  bcast_stats_free(&s);
  /* The same plan again: the receiver waits for the new writes, not the old word. */
  run_plan(snd, st, &rx, &rt, n, 1, p, NULL);
  verify(st, rt, n);
  cr_assert_eq(bcast_engine_coloc_mappings(snd), 2, "one slab and one done word mapped");
  bcast_engine_free(snd);
  bcast_engine_free(rx);
  bcast_plan_free(p);
  cudaFree(sl.base);
  bcast_storage_free(ss);
  free(st);
  free(rt);
}

Test(coloc, gpu_master_bit_exact_and_nothing_outside_the_tensors) {
  NEED_GPU();
  one_receiver(BCAST_DTYPE_FP32, BCAST_RES_GPU, 3u << 20, 0);
}

Test(coloc, host_master_pinned_bit_exact_pipelined) {
  NEED_GPU();
  one_receiver(BCAST_DTYPE_FP32, BCAST_RES_HOST_PINNED, 2u << 20, 0); /* many buckets, splits */
}

Test(coloc, mixed_residency_in_one_layer_bit_exact) {
  NEED_GPU();
  one_receiver(BCAST_DTYPE_FP32, BCAST_RES_GPU, 4u << 20, 1);
}

Test(coloc, bf16_host_storage_goes_straight_in) {
  NEED_GPU();
  one_receiver(BCAST_DTYPE_BF16, BCAST_RES_HOST_PINNED, 8u << 20, 0);
}

/* Rounding corners (NaN, infinities, subnormals, ties) and an fp16 wire. */
Test(coloc, special_values_and_fp16_wire) {
  NEED_GPU();
  static const bcast_residency res[3] = {BCAST_RES_GPU, BCAST_RES_HOST_PINNED,
                                         BCAST_RES_HOST_PAGEABLE};
  bcast_tensor st[6], rt[6];
  memset(st, 0, sizeof st);
  for (int i = 0; i < 6; i++) {
    snprintf(st[i].name, sizeof st[i].name, "layer.t%d", i);
    st[i].layer = 1;
    st[i].storage_dtype = BCAST_DTYPE_FP32;
    st[i].wire_dtype = i == 5 ? BCAST_DTYPE_FP16 : BCAST_DTYPE_BF16;
    st[i].ndim = 2;
    st[i].shape[0] = 257 + 64 * i;
    st[i].shape[1] = 1023;
    st[i].residency = res[i % 3];
    rt[i] = st[i];
  }
  bcast_storage *ss = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_storage_alloc(st, 6, BCAST_FILL_SENDER, 3, &ss, &err), 0, "%s", err.msg);
  uint32_t sp[8] = {0x7FC00001, 0xFF800000, 0x7F800000, 0x00000001,
                    0x807FFFFF, 0x3F808000, 0x477FF000, 0xFFFFFFFF};
  for (int i = 0; i < 6; i++) {
    if (st[i].residency == BCAST_RES_GPU)
      cr_assert_eq(cudaMemcpy(st[i].data, sp, sizeof sp, cudaMemcpyHostToDevice), cudaSuccess);
    else
      memcpy(st[i].data, sp, sizeof sp);
  }
  slab sl = slab_new(rt, 6);
  bcast_engine *snd = engine(0, 30), *rx = engine(1, 30);
  bcast_plan *p = plan(st, 6, "coloc-special", 2, 1u << 20);
  bcast_tensor *rtp = rt;
  handshake(snd, &rx, &rtp, 6, 1, p);
  run_plan(snd, st, &rx, &rtp, 6, 1, p, NULL);
  verify(st, rt, 6);
  slab_check(&sl, rt, 6);
  bcast_engine_free(snd);
  bcast_engine_free(rx);
  bcast_plan_free(p);
  cudaFree(sl.base);
  bcast_storage_free(ss);
}

Test(coloc, two_receivers_on_one_gpu) {
  NEED_GPU();
  size_t n = 0, m = 0;
  bcast_tensor *st = manifest(BCAST_DTYPE_FP32, BCAST_RES_HOST_PINNED, 1, &n);
  bcast_tensor *rt[2] = {manifest(BCAST_DTYPE_FP32, BCAST_RES_GPU, 1, &m),
                         manifest(BCAST_DTYPE_FP32, BCAST_RES_GPU, 1, &m)};
  bcast_storage *ss = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_storage_alloc(st, n, BCAST_FILL_SENDER, 5, &ss, &err), 0, "%s", err.msg);
  slab sl[2] = {slab_new(rt[0], m), slab_new(rt[1], m)};
  bcast_engine *snd = engine(0, 30), *rx[2] = {engine(1, 30), engine(2, 30)};
  bcast_plan *p = plan(st, n, "coloc-two", 3, 4u << 20);
  handshake(snd, rx, rt, n, 2, p);
  run_plan(snd, st, rx, rt, n, 2, p, NULL);
  for (int r = 0; r < 2; r++) {
    verify(st, rt[r], n);
    slab_check(&sl[r], rt[r], m);
  }
  bcast_engine_free(snd);
  for (int r = 0; r < 2; r++) {
    bcast_engine_free(rx[r]);
    cudaFree(sl[r].base);
    free(rt[r]);
  }
  bcast_plan_free(p);
  bcast_storage_free(ss);
  free(st);
}

Test(coloc, refusals_name_what_is_wrong) {
  NEED_GPU();
  size_t n = 0, m = 0;
  bcast_tensor *st = manifest(BCAST_DTYPE_FP32, BCAST_RES_GPU, 1, &n);
  bcast_tensor *rt = manifest(BCAST_DTYPE_FP32, BCAST_RES_GPU, 1, &m);
  bcast_storage *ss = NULL, *rs = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_storage_alloc(st, n, BCAST_FILL_SENDER, 1, &ss, &err), 0, "%s", err.msg);
  cr_assert_eq(bcast_storage_alloc(rt, m, BCAST_FILL_RECEIVER, 0, &rs, &err), 0, "%s", err.msg);
  bcast_engine *snd = engine(0, 2), *rx = engine(1, 2);
  bcast_plan *p = plan(st, n, "coloc-refuse", 2, 8u << 20);
  bcast_plan *q = plan(st, n, "coloc-other", 2, 8u << 20);
  uint8_t *ex = NULL;
  size_t len = 0;
  /* The sender runs without the receiver's export: named. */
  cr_assert_eq(bcast_engine_coloc_import(rx, p, 1, (const uint8_t *)"x", 1, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "only the sender"), "%s", err.msg);
  cr_assert_neq(bcast_engine_execute(snd, p, st, n, NULL, &err), BCAST_OK);
  cr_assert(strstr(err.msg, "export"), "%s", err.msg);
  cr_assert_eq(bcast_engine_coloc_export(snd, p, st, n, &ex, &len, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "only receivers export") && strstr(err.msg, "rank 0 is a sender"), "%s", err.msg);
  /* An export for another plan, a corrupted one, a truncated one. */
  cr_assert_eq(bcast_engine_coloc_export(rx, q, rt, m, &ex, &len, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(bcast_engine_coloc_import(snd, p, 1, ex, len, &err), BCAST_EMISMATCH);
  cr_assert(strstr(err.msg, "rank 1 exported for plan hash"), "%s", err.msg);
  cr_assert_eq(bcast_engine_coloc_import(snd, p, 1, ex, len / 2, &err), BCAST_EINVAL);
  ex[0] ^= 0xFF;
  cr_assert_eq(bcast_engine_coloc_import(snd, q, 1, ex, len, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "magic"), "%s", err.msg);
  free(ex);
  cr_assert_eq(bcast_engine_coloc_import(snd, q, 2, NULL, 0, &err), BCAST_EINVAL, "rank 2 is outside");
  /* A receiver whose buffer is host memory cannot be written through IPC. */
  void *keep = rt[2].data;
  bcast_tensor host = rt[2];
  host.residency = BCAST_RES_HOST_PAGEABLE;
  host.data = malloc(bcast_tensor_elems(&host) * 2);
  rt[2] = host;
  cr_assert_eq(bcast_engine_coloc_export(rx, p, rt, m, &ex, &len, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, rt[2].name) && strstr(err.msg, "host memory"), "%s", err.msg);
  free(host.data);
  rt[2].data = keep;
  rt[2].residency = BCAST_RES_GPU;
  /* A receiver whose sender never comes: a named timeout within its deadline. */
  cr_assert_eq(bcast_engine_coloc_export(rx, p, rt, m, &ex, &len, &err), BCAST_OK, "%s", err.msg);
  free(ex);
  struct timespec a, z;
  clock_gettime(CLOCK_MONOTONIC, &a);
  int rc = bcast_engine_execute(rx, p, rt, m, NULL, &err);
  clock_gettime(CLOCK_MONOTONIC, &z);
  double took = (double)(z.tv_sec - a.tv_sec) + (double)(z.tv_nsec - a.tv_nsec) * 1e-9;
  cr_assert_eq(rc, BCAST_ETIMEDOUT, "rc %d: %s", rc, err.msg);
  cr_assert_lt(took, 10, "a 2 s deadline took %.1f s", took);
  cr_assert(strstr(err.msg, "waited") && strstr(err.msg, "sender"), "%s", err.msg);
  /* Cancelled while waiting: ECANCELED, named. */
  cr_assert_eq(bcast_engine_cancel(rx, p->id), BCAST_OK);
  cr_assert_eq(bcast_engine_execute(rx, p, rt, m, NULL, &err), BCAST_ECANCELED);
  bcast_engine_free(snd);
  bcast_engine_free(rx);
  bcast_plan_free(p);
  bcast_plan_free(q);
  bcast_storage_free(ss);
  bcast_storage_free(rs);
  free(st);
  free(rt);
}

/* ---- several sources: a sharded trainer's ranks on the receivers' GPU ------------------- */

#define MS_RX 2


/* One participant's execute on a thread of its own: all run at once. */
typedef struct ms_party {
  bcast_engine *e;
  const bcast_plan *p;
  const bcast_tensor *local;
  size_t n;
  int rc;
  bcast_err err;
  bcast_stats st;
  pthread_t tid;
} ms_party;

static void *ms_main(void *arg) {
  ms_party *x = arg;
  memset(&x->st, 0, sizeof x->st);
  x->rc = bcast_engine_execute(x->e, x->p, x->local, x->n, &x->st, &x->err);
  return NULL;
}

typedef struct ms_world {
  uint32_t ns;
  size_t n;
  bcast_tensor *st;          /* the full model, storage dtype */
  bcast_storage *ss;
  bcast_tensor *shard;       /* ns x n: rank r's at shard + r n */
  size_t nshard[8];
  bcast_tensor *rt[MS_RX];   /* receivers' buffers, in slabs */
  slab sl[MS_RX];
  bcast_engine *e[8 + MS_RX];
  bcast_plan *p;
} ms_world;

static void ms_init(ms_world *w, uint32_t ns, bcast_residency res, double timeout_s, uint64_t seed) {
  memset(w, 0, sizeof *w);
  cr_assert_leq(ns, 8);
  w->ns = ns;
  w->st = manifest(BCAST_DTYPE_FP32, res, 2, &w->n);
  bcast_err err = {0};
  cr_assert_eq(bcast_storage_alloc(w->st, w->n, BCAST_FILL_SENDER, seed, &w->ss, &err), 0, "%s", err.msg);
  w->shard = calloc((size_t)ns * w->n, sizeof *w->shard);
  cr_assert(w->shard);
  const bcast_tensor *ranks[8];
  for (uint32_t r = 0; r < ns; r++) {
    w->nshard[r] = bcast_preset_dim0_shards(w->st, w->n, r, ns, w->shard + (size_t)r * w->n);
    ranks[r] = w->shard + (size_t)r * w->n;
  }
  bcast_shard_map *map = NULL;
  cr_assert_eq(bcast_shards_check(ranks, w->nshard, ns, NULL, &map, &err), BCAST_OK, "%s", err.msg);
  char id[64];
  snprintf(id, sizeof id, "coloc-ms-%u", ns);
  /* A small budget: many buckets per source, the ring wrapping around. */
  bcast_plan_opts po = {.id = id, .mode = BCAST_MODE_COLOCATED, .world_size = ns + MS_RX, .root_rank = 0,
                        .staging_budget = 2u << 20};
  cr_assert_eq(bcast_plan_build_sharded(map, &po, &w->p, &err), BCAST_OK, "%s", err.msg);
  bcast_shard_map_free(map);
  cr_assert_eq(bcast_plan_sources(w->p), (int)ns);
  for (uint32_t r = 0; r < MS_RX; r++) {
    size_t m = 0;
    w->rt[r] = manifest(BCAST_DTYPE_FP32, BCAST_RES_GPU, 2, &m);
    cr_assert_eq(m, w->n);
    w->sl[r] = slab_new(w->rt[r], m);
  }
  for (uint32_t i = 0; i < ns + MS_RX; i++) w->e[i] = engine(i, timeout_s);
  /* The control plane's part: every receiver's export to every source. */
  for (uint32_t r = 0; r < MS_RX; r++) {
    uint8_t *ex = NULL;
    size_t len = 0;
    cr_assert_eq(bcast_engine_coloc_export(w->e[ns + r], w->p, w->rt[r], w->n, &ex, &len, &err), BCAST_OK,
                 "export of rank %u: %s", ns + r, err.msg);
    for (uint32_t s = 0; s < ns; s++)
      cr_assert_eq(bcast_engine_coloc_import(w->e[s], w->p, ns + r, ex, len, &err), BCAST_OK,
                   "source %u importing rank %u: %s", s, ns + r, err.msg);
    free(ex);
  }
}

static void ms_free(ms_world *w) {
  for (uint32_t i = 0; i < w->ns + MS_RX; i++) bcast_engine_free(w->e[i]);
  for (uint32_t r = 0; r < MS_RX; r++) {
    cudaFree(w->sl[r].base);
    free(w->rt[r]);
  }
  bcast_plan_free(w->p);
  bcast_storage_free(w->ss);
  free(w->shard);
  free(w->st);
}

/* Runs the participants whose `run` entry is set, all at once; the others
 * never execute. */
static void ms_exec(ms_world *w, const int *run, ms_party *pt) {
  for (uint32_t i = 0; i < w->ns + MS_RX; i++) {
    int src = i < w->ns;
    pt[i] = (ms_party){.e = w->e[i], .p = w->p, .local = src ? w->shard + (size_t)i * w->n : w->rt[i - w->ns],
                       .n = src ? w->nshard[i] : w->n};
    if (run[i]) cr_assert_eq(pthread_create(&pt[i].tid, NULL, ms_main, &pt[i]), 0);
  }
  for (uint32_t i = 0; i < w->ns + MS_RX; i++)
    if (run[i]) pthread_join(pt[i].tid, NULL);
}

/* Host copies of tensors (storage dtype for the sources' shards, wire dtype
 * for a receiver's), for bcast_plan_source_checksum, which reads host memory. */
static bcast_tensor *ms_host_copy(const bcast_tensor *t, size_t n, int wire) {
  bcast_tensor *h = malloc((n ? n : 1) * sizeof *h);
  cr_assert(h);
  for (size_t i = 0; i < n; i++) {
    h[i] = t[i];
    size_t bytes = bcast_tensor_held(&t[i]) * bcast_dtype_size(wire ? t[i].wire_dtype : t[i].storage_dtype);
    h[i].data = malloc(bytes ? bytes : 1);
    cr_assert(h[i].data);
    if (t[i].residency == BCAST_RES_GPU)
      cr_assert_eq(cudaMemcpy(h[i].data, t[i].data, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    else
      memcpy(h[i].data, t[i].data, bytes);
    h[i].residency = BCAST_RES_HOST_PAGEABLE;
  }
  return h;
}

static void ms_host_free(bcast_tensor *h, size_t n) {
  for (size_t i = 0; i < n; i++) free(h[i].data);
  free(h);
}

static void multi_source(uint32_t ns, bcast_residency res) {
  ms_world w;
  ms_init(&w, ns, res, 30, 100 + ns);
  int run[8 + MS_RX];
  for (uint32_t i = 0; i < ns + MS_RX; i++) run[i] = 1;
  ms_party pt[8 + MS_RX];
  for (int round = 0; round < 2; round++) { /* again: the receivers wait anew for every source */
    if (round == 1) { /* new values, so that the second round cannot pass on the first's bytes */
      bcast_storage_free(w.ss);
      bcast_err err = {0};
      cr_assert_eq(bcast_storage_alloc(w.st, w.n, BCAST_FILL_SENDER, 200 + ns, &w.ss, &err), 0, "%s", err.msg);
      for (uint32_t r = 0; r < ns; r++) w.nshard[r] = bcast_preset_dim0_shards(w.st, w.n, r, ns, w.shard + (size_t)r * w.n);
    }
    ms_exec(&w, run, pt);
    for (uint32_t i = 0; i < ns + MS_RX; i++)
      cr_assert_eq(pt[i].rc, BCAST_OK, "round %d, rank %u: %s", round, i, pt[i].err.msg);
    for (uint32_t r = 0; r < MS_RX; r++) {
      verify(w.st, w.rt[r], w.n);
      slab_check(&w.sl[r], w.rt[r], w.n);
    }
    /* A source counts its own buckets and bytes. */
    for (uint32_t s = 0; s < ns; s++) {
      uint32_t nb = 0;
      uint64_t bytes = 0;
      for (size_t k = 0; k < w.p->nbuckets; k++)
        if (w.p->buckets[k].source_rank == s) nb++, bytes += w.p->buckets[k].bytes;
      cr_assert_gt(nb, 0, "source %u has buckets", s);
      cr_assert_eq(pt[s].st.nbuckets, nb, "source %u: %u buckets in its stats, %u in the plan", s,
                   pt[s].st.nbuckets, nb);
      cr_assert_eq(pt[s].st.wire_bytes, bytes, "source %u", s);
      cr_assert_str_eq(pt[s].st.transport, "in-process");
      for (uint32_t j = 0; j < nb; j++)
        cr_assert_eq(w.p->buckets[pt[s].st.buckets[j].bucket].source_rank, s);
    }
    /* Per-source checksums: each source's of its shard, cast, against each
     * receiver's of what it holds. */
    for (uint32_t r = 0; r < MS_RX; r++) {
      bcast_tensor *rh = ms_host_copy(w.rt[r], w.n, 1);
      for (uint32_t s = 0; s < ns; s++) {
        bcast_tensor *sh = ms_host_copy(w.shard + (size_t)s * w.n, w.nshard[s], 0);
        uint64_t want = 0, got = 0;
        bcast_err err = {0};
        cr_assert_eq(bcast_plan_source_checksum(w.p, s, sh, w.nshard[s], 0, &want, &err), BCAST_OK, "%s",
                     err.msg);
        cr_assert_eq(bcast_plan_source_checksum(w.p, s, rh, w.n, 1, &got, &err), BCAST_OK, "%s", err.msg);
        cr_assert_eq(got, want, "receiver %u, source %u: checksum %016llx, the source's %016llx", ns + r, s,
                     (unsigned long long)got, (unsigned long long)want);
        ms_host_free(sh, w.nshard[s]);
      }
      ms_host_free(rh, w.n);
    }
    for (uint32_t i = 0; i < ns + MS_RX; i++) bcast_stats_free(&pt[i].st);
  }
  ms_free(&w);
}

Test(coloc_ms, two_sources_host_pinned_shards_into_two_receivers) {
  NEED_GPU();
  multi_source(2, BCAST_RES_HOST_PINNED);
}

Test(coloc_ms, two_sources_gpu_resident_shards_into_two_receivers) {
  NEED_GPU();
  multi_source(2, BCAST_RES_GPU);
}

Test(coloc_ms, four_sources_host_pinned_shards_into_two_receivers) {
  NEED_GPU();
  multi_source(4, BCAST_RES_HOST_PINNED);
}

Test(coloc_ms, four_sources_gpu_resident_shards_into_two_receivers) {
  NEED_GPU();
  multi_source(4, BCAST_RES_GPU);
}

/* Source 1 never executes: source 0 finishes its writes, and every receiver
 * times out within its deadline naming source rank 1; a cancel still ends a
 * receiver's wait at once. */
Test(coloc_ms, a_source_that_never_writes_is_named_by_every_receiver) {
  NEED_GPU();
  ms_world w;
  ms_init(&w, 2, BCAST_RES_GPU, 2, 7);
  int run[2 + MS_RX] = {1, 0, 1, 1};
  ms_party pt[2 + MS_RX];
  struct timespec a, z;
  clock_gettime(CLOCK_MONOTONIC, &a);
  ms_exec(&w, run, pt);
  clock_gettime(CLOCK_MONOTONIC, &z);
  double took = (double)(z.tv_sec - a.tv_sec) + (double)(z.tv_nsec - a.tv_nsec) * 1e-9;
  cr_assert_eq(pt[0].rc, BCAST_OK, "source 0: %s", pt[0].err.msg);
  for (uint32_t r = 0; r < MS_RX; r++) {
    ms_party *x = &pt[2 + r];
    cr_assert_eq(x->rc, BCAST_ETIMEDOUT, "rank %u: rc %d: %s", 2 + r, x->rc, x->err.msg);
    cr_assert(strstr(x->err.msg, "source rank 1") && strstr(x->err.msg, "waited"), "%s", x->err.msg);
  }
  cr_assert_lt(took, 10, "a 2 s deadline took %.1f s", took);
  for (uint32_t i = 0; i < 2 + MS_RX; i++) bcast_stats_free(&pt[i].st);
  /* Cancelled before it starts: ECANCELED, not a timeout. */
  cr_assert_eq(bcast_engine_cancel(w.e[2], w.p->id), BCAST_OK);
  bcast_err err = {0};
  cr_assert_eq(bcast_engine_execute(w.e[2], w.p, w.rt[0], w.n, NULL, &err), BCAST_ECANCELED, "%s", err.msg);
  ms_free(&w);
}

/* What several sources must not do: a source given another's shard, a
 * receiver rank importing, an export of the wrong number of done words;
 * and a shard in direct mode is still refused. */
Test(coloc_ms, invalid_mixes_are_refused_by_name) {
  NEED_GPU();
  ms_world w;
  ms_init(&w, 2, BCAST_RES_GPU, 5, 9);
  bcast_err err = {0};
  /* Source 1 executing with source 0's shards. */
  cr_assert_eq(bcast_engine_execute(w.e[1], w.p, w.shard, w.nshard[0], NULL, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "of source rank 1 carries elements"), "%s", err.msg);
  /* A receiver does not import, and a source does not export. */
  cr_assert_eq(bcast_engine_coloc_import(w.e[2], w.p, 3, (const uint8_t *)"x", 1, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "only the senders (source ranks 0..1)"), "%s", err.msg);
  uint8_t *ex = NULL;
  size_t len = 0;
  cr_assert_eq(bcast_engine_coloc_export(w.e[1], w.p, w.rt[0], w.n, &ex, &len, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "rank 1 is a sender"), "%s", err.msg);
  cr_assert_eq(bcast_engine_coloc_import(w.e[0], w.p, 1, (const uint8_t *)"x", 1, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "rank 1, which is not a receiver"), "%s", err.msg);
  /* An export made for a one-source plan of the same tensors has one done
   * word, not two: refused by the source importing it against this plan. */
  bcast_plan *one = plan(w.st, w.n, w.p->id, 2 + MS_RX, 2u << 20);
  cr_assert_eq(bcast_engine_coloc_export(w.e[2], one, w.rt[0], w.n, &ex, &len, &err), BCAST_OK, "%s", err.msg);
  cr_assert_neq(bcast_engine_coloc_import(w.e[0], w.p, 2, ex, len, &err), BCAST_OK);
  cr_assert(strstr(err.msg, "rank 2"), "%s", err.msg);
  free(ex);
  bcast_plan_free(one);
  /* Direct mode takes whole tensors only. */
  bcast_plan_opts po = {.id = "direct-shard", .mode = BCAST_MODE_DIRECT, .world_size = 2, .root_rank = 0};
  bcast_plan *d = NULL;
  cr_assert_eq(bcast_plan_build(w.st, w.n, &po, &d, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(bcast_engine_execute(w.e[0], d, w.shard, w.nshard[0], NULL, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "a shard") && strstr(err.msg, "direct mode needs whole tensors"), "%s", err.msg);
  bcast_plan_free(d);
  ms_free(&w);
}

/* ---- a receiver in another process ------------------------------------------------------ */

/* Both sides build the same plans from the same manifest: the hash matches. */
#define XP_SEED 23
#define XP_LAYERS 1

static int full_write(int fd, const void *b, size_t n) {
  const char *p = b;
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

static int full_read(int fd, void *b, size_t n) {
  char *p = b;
  while (n) {
    ssize_t k = read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

static bcast_plan *xp_plan(const bcast_tensor *t, size_t n, int k) {
  char id[64];
  snprintf(id, sizeof id, "xp-%d", k);
  bcast_plan_opts po = {.id = id, .mode = BCAST_MODE_COLOCATED, .world_size = 2, .root_rank = 0,
                        .staging_budget = 4u << 20, .policy_version = (uint64_t)k};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  return bcast_plan_build(t, n, &po, &p, &err) ? NULL : p;
}

static long rss_kib(void) {
  long pages = 0, rss = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
  fclose(f);
  return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

/* The receiver process: no Criterion here, only exit codes. For each plan:
 * export, send it, wait for the writes, check them (every `verify_every`),
 * answer one status byte. Buffers are made anew every `realloc_every`
 * plans (a new layout for the sender to map). Exit 0, 77 without a GPU. */
static int xp_child(int to_parent, int from_parent, int plans, int realloc_every,
                    int verify_every) {
  if (devices() < 1) return 77;
  cudaSetDevice(0);
  bcast_preset_opts po = {.storage_dtype = BCAST_DTYPE_FP32, .wire_dtype = BCAST_DTYPE_BF16,
                          .residency = BCAST_RES_GPU, .device = 0, .max_layers = XP_LAYERS};
  bcast_tensor *sender_view = NULL, *t = NULL, *buf[2] = {NULL, NULL};
  size_t n = 0;
  bcast_err err = {0};
  if (bcast_preset_manifest("100m", &po, &sender_view, &n, &err)) return 10;
  for (int b = 0; b < 2; b++) {
    buf[b] = malloc(n * sizeof *buf[b]);
    if (!buf[b]) return 10;
    memcpy(buf[b], sender_view, n * sizeof *buf[b]);
  }
  bcast_engine_opts eo = {.rank = 1, .device = 0, .timeout_s = 60};
  bcast_engine *e = NULL;
  if (bcast_engine_new(&eo, &e, &err)) return 11;
  bcast_storage *rs[2] = {NULL, NULL};
  int cur = 1;
  long rss0 = 0;
  for (int k = 0; k < plans; k++) {
    int old = -1;
    if (k % realloc_every == 0) {
      /* New buffers first, the old ones freed only after the plan that made
       * the sender drop its mapping of them (its import of the new export). */
      old = cur;
      cur = 1 - cur;
      if (bcast_storage_alloc(buf[cur], n, BCAST_FILL_RECEIVER, 0, &rs[cur], &err)) return 12;
      t = buf[cur];
    }
    bcast_plan *p = xp_plan(sender_view, n, k);
    if (!p) return 13;
    uint8_t *ex = NULL;
    size_t len = 0;
    if (bcast_engine_coloc_export(e, p, t, n, &ex, &len, &err)) {
      fprintf(stderr, "child: export: %s\n", err.msg);
      return 14;
    }
    uint64_t l64 = len;
    if (full_write(to_parent, &l64, 8) || full_write(to_parent, ex, len)) return 15;
    free(ex);
    int rc = bcast_engine_execute(e, p, t, n, NULL, &err);
    uint8_t status = rc ? 1 : 0;
    if (rc) fprintf(stderr, "child: plan %d: %s\n", k, err.msg);
    if (!rc && k % verify_every == 0) {
      for (size_t i = 0; i < n && !status; i++) {
        uint64_t e2 = bcast_tensor_elems(&t[i]);
        uint16_t *h = malloc(e2 * 2);
        if (!h || cudaMemcpy(h, t[i].data, e2 * 2, cudaMemcpyDeviceToHost) != cudaSuccess) {
          status = 2;
        } else {
          for (uint64_t j = 0; j < e2; j++)
            if (h[j] != bcast_f32_to_bf16(bcast_preset_value(XP_SEED + (uint64_t)k, (uint32_t)i, j))) {
              fprintf(stderr, "child: plan %d: tensor %s element %llu differs\n", k, t[i].name,
                      (unsigned long long)j);
              status = 3;
              break;
            }
        }
        free(h);
      }
    }
    bcast_plan_free(p);
    if (full_write(to_parent, &status, 1)) return 16;
    uint8_t go;
    if (full_read(from_parent, &go, 1)) return 17; /* the sender finished this plan */
    if (old >= 0 && rs[old]) {
      bcast_storage_free(rs[old]);
      rs[old] = NULL;
    }
    if (k == 9) rss0 = rss_kib();
  }
  long rss1 = rss_kib();
  fprintf(stderr, "receiver process: RSS %ld KiB after plan 10, %ld KiB after plan %d\n", rss0,
          rss1, plans);
  int64_t grow = rss1 - rss0;
  if (full_write(to_parent, &grow, 8)) return 18;
  bcast_engine_free(e);
  for (int b = 0; b < 2; b++) {
    bcast_storage_free(rs[b]);
    free(buf[b]);
  }
  free(sender_view);
  return 0;
}

typedef struct xp_figures {
  size_t gpu_free_10, gpu_free_end;
  long rss_10, rss_end, child_rss_growth;
  size_t mappings_max;
} xp_figures;

/* Forks before any CUDA call of this process (a forked CUDA context is
 * unusable), then drives `plans` plans as the sender. */
static void xp_run(int plans, int realloc_every, int verify_every, bcast_residency res,
                   xp_figures *fig) {
  int up[2], down[2];
  cr_assert_eq(pipe(up), 0);
  cr_assert_eq(pipe(down), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    _exit(xp_child(up[1], down[0], plans, realloc_every, verify_every));
  }
  close(up[1]);
  close(down[0]);
  if (devices() < 1) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    cr_skip_test("needs a CUDA device, none visible");
  }
  cudaSetDevice(0);
  bcast_preset_opts po = {.storage_dtype = BCAST_DTYPE_FP32, .wire_dtype = BCAST_DTYPE_BF16,
                          .residency = res, .device = 0, .max_layers = XP_LAYERS};
  bcast_tensor *t = NULL;
  size_t n = 0;
  bcast_err err = {0};
  cr_assert_eq(bcast_preset_manifest("100m", &po, &t, &n, &err), BCAST_OK, "%s", err.msg);
  bcast_engine *e = engine(0, 60);
  memset(fig, 0, sizeof *fig);
  bcast_storage *ss = NULL;
  for (int k = 0; k < plans; k++) {
    /* New values when they are checked: a stale buffer cannot pass. */
    if (k % verify_every == 0) {
      bcast_storage_free(ss);
      ss = NULL;
      cr_assert_eq(bcast_storage_alloc(t, n, BCAST_FILL_SENDER, XP_SEED + (uint64_t)k, &ss, &err),
                   0, "%s", err.msg);
    }
    bcast_plan *p = xp_plan(t, n, k);
    cr_assert_not_null(p);
    uint64_t len = 0;
    cr_assert_eq(full_read(up[0], &len, 8), 0, "plan %d: the receiver process went away", k);
    uint8_t *ex = malloc(len);
    cr_assert_eq(full_read(up[0], ex, len), 0);
    cr_assert_eq(bcast_engine_coloc_import(e, p, 1, ex, len, &err), BCAST_OK, "plan %d: %s", k,
                 err.msg);
    free(ex);
    bcast_stats st = {0};
    cr_assert_eq(bcast_engine_execute(e, p, t, n, &st, &err), BCAST_OK, "plan %d: %s", k, err.msg);
    cr_assert_str_eq(st.transport, "cuda-ipc");
    bcast_stats_free(&st);
    uint8_t status = 9;
    cr_assert_eq(full_read(up[0], &status, 1), 0);
    cr_assert_eq(status, 0, "plan %d: the receiver process found status %u", k, status);
    size_t maps = bcast_engine_coloc_mappings(e);
    if (maps > fig->mappings_max) fig->mappings_max = maps;
    if (k == 9 || k == plans - 1) {
      size_t fr = 0, tot = 0;
      cr_assert_eq(cudaMemGetInfo(&fr, &tot), cudaSuccess);
      if (k == 9) fig->gpu_free_10 = fr, fig->rss_10 = rss_kib();
      else fig->gpu_free_end = fr, fig->rss_end = rss_kib();
    }
    bcast_plan_free(p);
    uint8_t go = 1;
    cr_assert_eq(full_write(down[1], &go, 1), 0);
  }
  cr_assert_eq(full_read(up[0], &fig->child_rss_growth, 8), 0);
  int ws = 0;
  waitpid(pid, &ws, 0);
  cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "receiver process exit %d",
            WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
  /* Only the current layout stays mapped: the tensors' allocations and the done word. */
  cr_assert_leq(fig->mappings_max, n + 1, "%zu mappings for %zu tensors", fig->mappings_max, n);
  bcast_engine_free(e);
  bcast_storage_free(ss);
  free(t);
  close(up[0]);
  close(down[1]);
}

Test(coloc_ipc, receiver_in_another_process_bit_exact_gpu_master) {
  xp_figures f;
  xp_run(6, 3, 1, BCAST_RES_GPU, &f);
}

Test(coloc_ipc, receiver_in_another_process_bit_exact_host_master) {
  xp_figures f;
  xp_run(4, 2, 1, BCAST_RES_HOST_PINNED, &f);
}

Test(coloc_ipc, no_memory_growth_over_1000_plans, .timeout = 240) {
  xp_figures f;
  xp_run(1000, 100, 250, BCAST_RES_GPU, &f);
  long gpu_mib = ((long)f.gpu_free_10 - (long)f.gpu_free_end) / (1 << 20);
  long rss_mib = (f.rss_end - f.rss_10) / 1024;
  fprintf(stderr,
          "1000 plans, receiver buffers remade every 100: GPU free %zu MiB after plan 10, %zu MiB "
          "after plan 1000 (%+ld MiB used); sender RSS %+ld MiB, receiver RSS %+ld MiB; at most "
          "%zu allocations mapped\n",
          f.gpu_free_10 >> 20, f.gpu_free_end >> 20, gpu_mib, rss_mib,
          f.child_rss_growth / 1024, f.mappings_max);
  cr_assert_leq(gpu_mib, 16, "GPU memory grew by %ld MiB over 1000 plans", gpu_mib);
  cr_assert_leq(rss_mib, 16, "sender host memory grew by %ld MiB", rss_mib);
  cr_assert_leq(f.child_rss_growth / 1024, 16, "receiver host memory grew by %ld MiB",
                f.child_rss_growth / 1024);
}

#else

Test(coloc, built_without_cuda) {
  bcast_caps c;
  bcast_caps_probe(&c);
  char why[256];
  cr_assert_not(bcast_mode_available(&c, BCAST_MODE_COLOCATED, why, sizeof why));
  cr_assert(strstr(why, "without CUDA"), "%s", why);
  cr_skip_test("built without CUDA: GPU tests need a CUDA build");
}

#endif
