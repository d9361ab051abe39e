/* GPU backend of the broadcast engine: casts, direct and staged modes, mixed
 * residency, timeouts. Skips without a CUDA device; two-GPU tests skip with
 * fewer than two devices. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "workers/bcast/bcast_internal.h"
#include "workers/bcast/bcast_preset.h"

#ifdef RLORCH_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "workers/bcast/bcast_gpu.cuh"

static int devices(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

#define NEED_GPUS(k)                                                                             \
  do {                                                                                           \
    int have_ = devices();                                                                       \
    if (have_ < (k)) cr_skip_test("needs %d CUDA device(s), %d visible", (k), have_);            \
  } while (0)

/* The backend fills stats directly; its bucket array is the caller's to free. */
static void stats_clear(bcast_stats *s) {
  free(s->buckets);
  s->buckets = NULL;
  s->nbuckets = 0;
}

/* ---- the cast kernels against the CPU reference ----------------------------------- */

static uint32_t pattern(uint64_t i) {
  /* Walk the whole 32-bit space with a stride, plus every special neighbourhood. */
  static const uint32_t special[] = {0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00800000,
                                     0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7F800001, 0xFFC00001,
                                     0x7FFFFFFF, 0x477FF000, 0x477FEFFF, 0x33000000, 0x33000001,
                                     0x387FE000, 0x3F808000, 0x3F818000, 0x7F7F8000};
  size_t ns = sizeof special / sizeof special[0];
  if (i < ns) return special[i];
  return (uint32_t)(i * 67u + (i >> 26));
}

static void check_cast(bcast_dtype to, size_t n, size_t misalign) {
  uint32_t *h = malloc((n + misalign) * 4);
  uint16_t *out = malloc((n + misalign) * 2);
  cr_assert(h && out);
  for (size_t i = 0; i < n; i++) h[misalign + i] = pattern(i);
  void *d_in = NULL, *d_out = NULL;
  cr_assert_eq(cudaMalloc(&d_in, (n + misalign) * 4), cudaSuccess);
  cr_assert_eq(cudaMalloc(&d_out, (n + misalign) * 2), cudaSuccess);
  cr_assert_eq(cudaMemcpy(d_in, h, (n + misalign) * 4, cudaMemcpyHostToDevice), cudaSuccess);
  cr_assert_eq(bcast__cuda_cast((uint16_t *)d_out + misalign, to, (uint32_t *)d_in + misalign,
                                BCAST_DTYPE_FP32, n, NULL),
               0);
  cr_assert_eq(cudaMemcpy(out, d_out, (n + misalign) * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    float f;
    memcpy(&f, &h[misalign + i], 4);
    uint16_t want = to == BCAST_DTYPE_BF16 ? bcast_f32_to_bf16(f) : bcast_f32_to_f16(f);
    if (out[misalign + i] != want && bad++ < 5)
      cr_log_error("%s: input 0x%08x: GPU 0x%04x, CPU 0x%04x", bcast_dtype_name(to),
                   h[misalign + i], out[misalign + i], want);
  }
  cr_assert_eq(bad, 0, "%zu of %zu casts differ from the CPU reference", bad, n);
  cudaFree(d_in);
  cudaFree(d_out);
  free(h);
  free(out);
}

Test(gpu_cast, bf16_bit_exact_vector_and_scalar_paths) {
  NEED_GPUS(1);
  check_cast(BCAST_DTYPE_BF16, (size_t)1 << 25, 0);
  check_cast(BCAST_DTYPE_BF16, 1000003, 1); /* misaligned: scalar kernel */
}

Test(gpu_cast, fp16_bit_exact_vector_and_scalar_paths) {
  NEED_GPUS(1);
  check_cast(BCAST_DTYPE_FP16, (size_t)1 << 25, 0);
  check_cast(BCAST_DTYPE_FP16, 1000003, 3);
}

/* ---- two ranks in threads ------------------------------------------------------------ */

typedef struct rank_run {
  uint32_t rank;
  int device;
  double timeout_s;
  uint32_t staging_buffers;
  bcast_plan *plan;
  bcast_tensor *local;
  size_t n;
  bcast_gpu *gpu; /* opened by the caller for the root (it made the id) */
  bcast_stats stats;
  bcast_err err;
  int rc;
} rank_run;

static void *rank_main(void *arg) {
  rank_run *r = arg;
  cudaSetDevice(r->device);
  if (!r->gpu) {
    bcast_engine_opts o = {.rank = r->rank, .device = r->device, .timeout_s = r->timeout_s,
                           .staging_buffers = r->staging_buffers};
    r->rc = bcast__gpu_open(&o, &r->gpu, &r->err);
    if (r->rc) return NULL;
  }
  r->rc = bcast__gpu_execute(r->gpu, r->plan, r->rank, r->local, r->n, -1, &r->stats, &r->err);
  return NULL;
}

static bcast_plan *make_plan(const bcast_tensor *t, size_t n, bcast_mode mode, uint32_t world,
                             uint64_t budget, bcast_gpu *root) {
  bcast_plan_opts po = {.id = "gpu-test", .mode = mode, .world_size = world, .root_rank = 0,
                        .staging_budget = budget};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build(t, n, &po, &p, &err), BCAST_OK, "plan: %s", err.msg);
  cr_assert_eq(bcast__gpu_nccl_id(root, p->nccl_id, &err), BCAST_OK, "nccl id: %s", err.msg);
  p->has_nccl_id = 1;
  p->hash = bcast_plan_hash(p);
  return p;
}

static bcast_gpu *open_gpu(uint32_t rank, int device, double timeout_s, uint32_t bufs) {
  bcast_engine_opts o = {.rank = rank, .device = device, .timeout_s = timeout_s,
                         .staging_buffers = bufs};
  bcast_gpu *g = NULL;
  bcast_err err = {0};
  cudaSetDevice(device);
  cr_assert_eq(bcast__gpu_open(&o, &g, &err), BCAST_OK, "open: %s", err.msg);
  return g;
}

/* Copies any tensor's bytes (GPU or host) to a new host buffer. */
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

static void two_rank_run(bcast_tensor *snd, bcast_tensor *rcv, size_t n, bcast_mode mode,
                         uint64_t budget, uint32_t bufs, rank_run out[2]) {
  bcast_gpu *root = open_gpu(0, 0, 60, bufs);
  bcast_plan *p = make_plan(snd, n, mode, 2, budget, root);
  memset(out, 0, 2 * sizeof *out);
  out[0] = (rank_run){.rank = 0, .device = 0, .timeout_s = 60, .staging_buffers = bufs, .plan = p,
                      .local = snd, .n = n, .gpu = root};
  out[1] = (rank_run){.rank = 1, .device = 1, .timeout_s = 60, .staging_buffers = bufs, .plan = p,
                      .local = rcv, .n = n};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, rank_main, &out[i]);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  cr_assert_eq(out[0].rc, BCAST_OK, "rank 0: %s", out[0].err.msg);
  cr_assert_eq(out[1].rc, BCAST_OK, "rank 1: %s", out[1].err.msg);
  /* A second step on the cached communicator and registrations. */
  for (int i = 0; i < 2; i++) stats_clear(&out[i].stats);
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, rank_main, &out[i]);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  cr_assert_eq(out[0].rc, BCAST_OK, "rank 0, step 2: %s", out[0].err.msg);
  cr_assert_eq(out[1].rc, BCAST_OK, "rank 1, step 2: %s", out[1].err.msg);
  for (int i = 0; i < 2; i++) bcast__gpu_close(out[i].gpu);
  bcast_plan_free(p);
}

static bcast_tensor *preset(bcast_dtype storage, bcast_residency res, int device, size_t *n) {
  bcast_preset_opts po = {.storage_dtype = storage, .wire_dtype = BCAST_DTYPE_BF16,
                          .residency = res, .device = device, .max_layers = 2};
  bcast_tensor *t = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_preset_manifest("100m", &po, &t, n, &err), BCAST_OK, "%s", err.msg);
  return t;
}

Test(gpu_bcast, direct_two_gpus_bit_exact) {
  NEED_GPUS(2);
  size_t n = 0, m = 0;
  bcast_tensor *snd = preset(BCAST_DTYPE_BF16, BCAST_RES_GPU, 0, &n);
  bcast_tensor *rcv = preset(BCAST_DTYPE_BF16, BCAST_RES_GPU, 1, &m);
  bcast_storage *ss = NULL, *rs = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_storage_alloc(snd, n, BCAST_FILL_SENDER, 7, &ss, &err), 0, "%s", err.msg);
  cr_assert_eq(bcast_storage_alloc(rcv, m, BCAST_FILL_RECEIVER, 0, &rs, &err), 0, "%s", err.msg);
  rank_run r[2];
  two_rank_run(snd, rcv, n, BCAST_MODE_DIRECT, 8u << 20, 3, r);
  verify(snd, rcv, n);
  cr_assert_eq(r[0].stats.pcie_bytes, 0, "direct mode moved bytes over PCIe");
  cr_assert_gt(r[0].stats.wire_bytes, 0);
  cr_assert_gt(r[1].stats.wire_s, 0);
  cr_assert(r[0].stats.exposed_measured);
  for (int i = 0; i < 2; i++) stats_clear(&r[i].stats);
  bcast_storage_free(ss);
  bcast_storage_free(rs);
  free(snd);
  free(rcv);
}

Test(gpu_bcast, staged_two_gpus_fp32_pinned_to_bf16) {
  NEED_GPUS(2);
  size_t n = 0, m = 0;
  bcast_tensor *snd = preset(BCAST_DTYPE_FP32, BCAST_RES_HOST_PINNED, 0, &n);
  bcast_tensor *rcv = preset(BCAST_DTYPE_FP32, BCAST_RES_GPU, 1, &m);
  bcast_storage *ss = NULL, *rs = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_storage_alloc(snd, n, BCAST_FILL_SENDER, 11, &ss, &err), 0, "%s", err.msg);
  cr_assert_eq(bcast_storage_alloc(rcv, m, BCAST_FILL_RECEIVER, 0, &rs, &err), 0, "%s", err.msg);
  rank_run r[2];
  /* A small budget: many buckets, tensors split across buckets, the ring reused. */
  two_rank_run(snd, rcv, n, BCAST_MODE_STAGED, 3u << 20, 2, r);
  verify(snd, rcv, n);
  uint64_t fp32 = 0;
  for (size_t i = 0; i < n; i++) fp32 += bcast_tensor_elems(&snd[i]) * 4;
  cr_assert_eq(r[0].stats.pcie_bytes, fp32, "PCIe bytes %llu, fp32 storage %llu",
               (unsigned long long)r[0].stats.pcie_bytes, (unsigned long long)fp32);
  cr_assert_gt(r[0].stats.h2d_s, 0);
  cr_assert_gt(r[0].stats.nbuckets, 10);
  cr_assert_geq(r[0].stats.total_s, r[0].stats.exposed_s);
  for (int i = 0; i < 2; i++) stats_clear(&r[i].stats);
  bcast_storage_free(ss);
  bcast_storage_free(rs);
  free(snd);
  free(rcv);
}

/* One layer with GPU, pinned and pageable tensors on both sides, and values
 * that exercise rounding: NaN, infinities, subnormals, ties. */
Test(gpu_bcast, mixed_residency_one_layer_bit_exact) {
  NEED_GPUS(2);
  static const bcast_residency res[3] = {BCAST_RES_GPU, BCAST_RES_HOST_PINNED,
                                         BCAST_RES_HOST_PAGEABLE};
  bcast_tensor snd[6], rcv[6];
  memset(snd, 0, sizeof snd);
  for (int i = 0; i < 6; i++) {
    snprintf(snd[i].name, sizeof snd[i].name, "layer.t%d", i);
    snd[i].layer = 1;
    snd[i].storage_dtype = BCAST_DTYPE_FP32;
    snd[i].wire_dtype = i == 5 ? BCAST_DTYPE_FP16 : BCAST_DTYPE_BF16;
    snd[i].ndim = 2;
    snd[i].shape[0] = 257 + 64 * i;
    snd[i].shape[1] = 1023;
    snd[i].residency = res[i % 3];
    snd[i].device = 0;
    rcv[i] = snd[i];
    rcv[i].residency = res[(i + 1) % 3];
    rcv[i].device = 1;
  }
  bcast_storage *ss = NULL, *rs = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_storage_alloc(snd, 6, BCAST_FILL_SENDER, 3, &ss, &err), 0, "%s", err.msg);
  cr_assert_eq(bcast_storage_alloc(rcv, 6, BCAST_FILL_RECEIVER, 0, &rs, &err), 0, "%s", err.msg);
  for (int i = 0; i < 6; i++) { /* specials into every tensor's first elements */
    uint32_t sp[8] = {0x7FC00001, 0xFF800000, 0x7F800000, 0x00000001,
                      0x807FFFFF, 0x3F808000, 0x477FF000, 0xFFFFFFFF};
    if (snd[i].residency == BCAST_RES_GPU)
      cr_assert_eq(cudaMemcpy(snd[i].data, sp, sizeof sp, cudaMemcpyHostToDevice), cudaSuccess);
    else
      memcpy(snd[i].data, sp, sizeof sp);
  }
  rank_run r[2];
  two_rank_run(snd, rcv, 6, BCAST_MODE_STAGED, 1u << 20, 3, r);
  verify(snd, rcv, 6);
  for (int i = 0; i < 2; i++) stats_clear(&r[i].stats);
  bcast_storage_free(ss);
  bcast_storage_free(rs);
}

/* ---- one GPU ----------------------------------------------------------------------- */

Test(gpu_bcast, staging_pipeline_alone_world_one) {
  NEED_GPUS(1);
  size_t n = 0;
  bcast_tensor *t = preset(BCAST_DTYPE_FP32, BCAST_RES_HOST_PINNED, 0, &n);
  t[1].residency = BCAST_RES_HOST_PAGEABLE; /* registered once, then reused */
  bcast_storage *ss = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_storage_alloc(t, n, BCAST_FILL_SENDER, 5, &ss, &err), 0, "%s", err.msg);
  bcast_gpu *g = open_gpu(0, 0, 30, 2);
  bcast_plan *p = make_plan(t, n, BCAST_MODE_STAGED, 1, 4u << 20, g);
  uint64_t fp32 = 0;
  for (size_t i = 0; i < n; i++) fp32 += bcast_tensor_elems(&t[i]) * 4;
  for (int step = 0; step < 3; step++) {
    bcast_stats st = {0};
    cr_assert_eq(bcast__gpu_execute(g, p, 0, t, n, -1, &st, &err), BCAST_OK, "step %d: %s", step,
                 err.msg);
    cr_assert_eq(st.pcie_bytes, fp32);
    cr_assert_eq(st.wire_bytes, bcast_plan_wire_bytes(p));
    cr_assert_eq(st.nbuckets, p->nbuckets);
    cr_assert_gt(st.h2d_s, 0);
    cr_assert_gt(st.cast_s, 0);
    cr_assert_gt(st.gbps, 0);
    stats_clear(&st);
  }
  bcast__gpu_close(g);
  bcast_plan_free(p);
  bcast_storage_free(ss);
  free(t);
}

static void *cancel_after(void *arg) {
  usleep(500 * 1000);
  if (write(*(int *)arg, "x", 1) != 1) perror("cancel pipe");
  return NULL;
}

/* A world of two whose second rank never joins, on an engine with a
 * `timeout_s` deadline; cancelled after 0.5 s when `cancel` is set. Returns
 * the code and the seconds taken; the engine then runs a world of one. */
static int missing_peer(double timeout_s, int cancel, double *took, bcast_err *err) {
  size_t n = 0;
  bcast_tensor *t = preset(BCAST_DTYPE_BF16, BCAST_RES_GPU, 0, &n);
  bcast_storage *ss = NULL;
  cr_assert_eq(bcast_storage_alloc(t, n, BCAST_FILL_SENDER, 1, &ss, err), 0, "%s", err->msg);
  bcast_gpu *g = open_gpu(0, 0, timeout_s, 2);
  bcast_plan *p = make_plan(t, n, BCAST_MODE_DIRECT, 2, 8u << 20, g);
  int fds[2] = {-1, -1};
  pthread_t th;
  if (cancel) {
    cr_assert_eq(pipe(fds), 0);
    cr_assert_eq(pthread_create(&th, NULL, cancel_after, &fds[1]), 0);
  }
  double t0 = bcast__now();
  int rc = bcast__gpu_execute(g, p, 0, t, n, fds[0], NULL, err);
  *took = bcast__now() - t0;
  if (cancel) {
    pthread_join(th, NULL);
    close(fds[0]);
    close(fds[1]);
  }
  /* The engine stays usable: a world of one on a new id works. */
  bcast_err e1 = {0};
  bcast_plan *p1 = make_plan(t, n, BCAST_MODE_DIRECT, 1, 8u << 20, g);
  cr_assert_eq(bcast__gpu_execute(g, p1, 0, t, n, -1, NULL, &e1), BCAST_OK, "%s", e1.msg);
  bcast__gpu_close(g);
  bcast_plan_free(p);
  bcast_plan_free(p1);
  bcast_storage_free(ss);
  free(t);
  return rc;
}

Test(gpu_bcast, missing_peer_times_out_with_clear_error) {
  NEED_GPUS(1);
  bcast_err err = {0};
  double took = 0;
  int rc = missing_peer(3, 0, &took, &err);
  cr_assert_eq(rc, BCAST_ETIMEDOUT, "rc %d: %s", rc, err.msg);
  cr_assert_not_null(strstr(err.msg, "join"), "message does not say what was waited for: %s",
                     err.msg);
  cr_assert_lt(took, 20, "took %.1f s for a 3 s deadline", took);
}

/* The orchestrator aborts a plan whose peer never joins: the NCCL wait ends
 * at once with the communicator aborted, not at the (here 30 s) deadline. */
Test(gpu_bcast, a_cancelled_wait_for_a_peer_aborts_the_communicator_at_once) {
  NEED_GPUS(1);
  bcast_err err = {0};
  double took = 0;
  int rc = missing_peer(30, 1, &took, &err);
  cr_assert_eq(rc, BCAST_ECANCELED, "rc %d: %s", rc, err.msg);
  cr_assert_not_null(strstr(err.msg, "cancelled"), "%s", err.msg);
  cr_assert_not_null(strstr(err.msg, "aborted"), "%s", err.msg);
  cr_assert_lt(took, 5, "took %.1f s to honour a cancel sent after 0.5 s", took);
}

Test(gpu_bcast, bad_local_tensors_named_in_errors) {
  NEED_GPUS(1);
  size_t n = 0;
  bcast_tensor *t = preset(BCAST_DTYPE_FP32, BCAST_RES_HOST_PINNED, 0, &n);
  bcast_storage *ss = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_storage_alloc(t, n, BCAST_FILL_SENDER, 1, &ss, &err), 0, "%s", err.msg);
  bcast_gpu *g = open_gpu(0, 0, 5, 2);
  bcast_plan *p = make_plan(t, n, BCAST_MODE_STAGED, 1, 8u << 20, g);
  void *keep = t[3].data;
  t[3].data = NULL;
  cr_assert_eq(bcast__gpu_execute(g, p, 0, t, n, -1, NULL, &err), BCAST_EINVAL);
  cr_assert_not_null(strstr(err.msg, t[3].name), "%s", err.msg);
  t[3].data = keep;
  t[4].residency = BCAST_RES_GPU; /* host memory claimed to be on the GPU */
  cr_assert_eq(bcast__gpu_execute(g, p, 0, t, n, -1, NULL, &err), BCAST_EINVAL);
  cr_assert_not_null(strstr(err.msg, t[4].name), "%s", err.msg);
  t[4].residency = BCAST_RES_HOST_PINNED;
  cr_assert_eq(bcast__gpu_execute(g, p, 0, t, n - 1, -1, NULL, &err), BCAST_EINVAL);
  cr_assert_not_null(strstr(err.msg, t[n - 1].name), "%s", err.msg);
  bcast_engine_opts bad = {.rank = 0, .device = 999};
  bcast_gpu *g2 = NULL;
  cr_assert_eq(bcast__gpu_open(&bad, &g2, &err), BCAST_EINVAL);
  cr_assert_null(g2);
  bcast__gpu_close(g);
  bcast_plan_free(p);
  bcast_storage_free(ss);
  free(t);
}

#else

Test(gpu_bcast, built_without_cuda) {
  bcast_engine_opts o = {.rank = 0, .device = 0};
  bcast_gpu *g = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast__gpu_open(&o, &g, &err), BCAST_ENOTSUP);
  cr_assert_not_null(strstr(err.msg, "without CUDA"));
  cr_skip_test("built without CUDA: GPU tests need a CUDA build");
}

#endif
