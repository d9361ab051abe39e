/* `rlorch bench broadcast`: the engine's weight broadcast against floors
 * measured in the same run.
 *
 *   staged: fp32 master weights in pinned host memory on the sender, bf16 on
 *           the wire, bf16 into GPU memory on the receiver. Floor: the fp32
 *           bytes over the pinned host-to-device bandwidth (one big copy).
 *   direct: bf16 weights on the sender GPU. Floor: the same bf16 bytes
 *           broadcast alone as one buffer.
 *   host:   fp32 pageable host weights, bf16 over loopback TCP. Baseline: a
 *           memcpy plus a plain socket send of the same bytes.
 * Ranks are threads of this process, one GPU each (GPU 0 sends, GPU 1
 * receives); direct and staged drive the engine's GPU backend. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench/bench.h"
#include "workers/bcast/bcast_internal.h"
#include "workers/bcast/bcast_preset.h"

#ifdef RLORCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef RLORCH_HAVE_NCCL
#include <nccl.h>
#endif

typedef struct bb_args {
  const char *preset, *mode;
  int reps, json;
  uint64_t budget;
  uint32_t max_layers;
} bb_args;

typedef struct bb_result {
  double floor_s, engine_s, baseline_s; /* baseline: host mode only */
  double floor_gbps;
  const char *floor_name;
  uint64_t params, wire_bytes, pcie_bytes;
  bcast_stats last; /* sender's stats of the last rep */
  double rx_wire_s, rx_cast_s;
  uint32_t nbuckets;
} bb_result;

static double median(double *v, int n) {
  bench_sort(v, (size_t)n);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void usage(FILE *f) {
  fprintf(f, "usage: rlorch bench broadcast --preset {100m,1b,4b,8b} --mode {direct,staged,host}\n"
             "                              [--reps N] [--budget-mib M] [--layers L] [--json]\n");
}

static int parse(int argc, char **argv, bb_args *a) {
  *a = (bb_args){.preset = "100m", .mode = "staged", .reps = 5, .budget = 256u << 20};
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(k, "--json")) {
      a->json = 1;
      continue;
    }
    if (!strcmp(k, "--help")) {
      usage(stdout);
      exit(0);
    }
    if (!v) {
      fprintf(stderr, "bench broadcast: %s needs a value\n", k);
      return 2;
    }
    i++;
    if (!strcmp(k, "--preset")) a->preset = v;
    else if (!strcmp(k, "--mode")) a->mode = v;
    else if (!strcmp(k, "--reps")) a->reps = atoi(v);
    else if (!strcmp(k, "--budget-mib")) a->budget = (uint64_t)atoll(v) << 20;
    else if (!strcmp(k, "--layers")) a->max_layers = (uint32_t)atoi(v);
    else {
      fprintf(stderr, "bench broadcast: unknown flag %s\n", k);
      usage(stderr);
      return 2;
    }
  }
  if (!bcast_preset_find(a->preset)) {
    fprintf(stderr, "bench broadcast: unknown preset '%s' (100m, 1b, 4b, 8b)\n", a->preset);
    return 2;
  }
  if (strcmp(a->mode, "direct") && strcmp(a->mode, "staged") && strcmp(a->mode, "host")) {
    fprintf(stderr, "bench broadcast: unknown mode '%s' (direct, staged, host)\n", a->mode);
    return 2;
  }
  if (a->reps < 1 || a->reps > 1000 || a->budget < 4096) {
    fprintf(stderr, "bench broadcast: --reps must be 1..1000 and --budget-mib >= 1\n");
    return 2;
  }
  return 0;
}

/* ---- ranks as threads ---------------------------------------------------------- */

typedef struct bb_rank {
  uint32_t rank;
  int device;
  bcast_gpu *gpu;
  bcast_engine *eng;
  const bcast_plan *plan;
  bcast_tensor *local;
  size_t n;
  int reps; /* warm-up included */
  pthread_barrier_t *bar;
  double *t_start, *t_end; /* per rep */
  bcast_stats stats;
  bcast_err err;
  int rc;
} bb_rank;

static void *rank_loop(void *arg) {
  bb_rank *r = arg;
#ifdef RLORCH_HAVE_CUDA
  if (r->device >= 0) cudaSetDevice(r->device);
#endif
  for (int i = 0; i < r->reps; i++) {
    pthread_barrier_wait(r->bar);
    free(r->stats.buckets);
    memset(&r->stats, 0, sizeof r->stats);
    r->t_start[i] = bcast__now();
    if (r->rc == 0)
      r->rc = r->gpu ? bcast__gpu_execute(r->gpu, r->plan, r->rank, r->local, r->n, &r->stats,
                                          &r->err)
                     : bcast_engine_execute(r->eng, r->plan, r->local, r->n, &r->stats, &r->err);
    r->t_end[i] = bcast__now();
    pthread_barrier_wait(r->bar);
  }
  return NULL;
}

/* Runs warm-up + reps steps on two ranks; engine_s is the median step time,
 * first start to last end. */
static int run_ranks(bb_rank rk[2], int reps, bb_result *res) {
  int total = reps + 1;
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  double *ts = calloc((size_t)total * 4, sizeof(double)), *steps = calloc((size_t)total, sizeof(double));
  if (!ts || !steps) return 1;
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    rk[i].reps = total;
    rk[i].bar = &bar;
    rk[i].t_start = ts + (size_t)total * (2 * i);
    rk[i].t_end = ts + (size_t)total * (2 * i + 1);
    pthread_create(&th[i], NULL, rank_loop, &rk[i]);
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&bar);
  int rc = 0;
  for (int i = 0; i < 2; i++)
    if (rk[i].rc) {
      fprintf(stderr, "bench broadcast: rank %u: %s (%s)\n", rk[i].rank, rk[i].err.msg,
                      bcast_strerror(rk[i].rc));
      rc = 1;
    }
  if (!rc) {
    for (int k = 1; k < total; k++) {
      double a = rk[0].t_start[k] < rk[1].t_start[k] ? rk[0].t_start[k] : rk[1].t_start[k];
      double z = rk[0].t_end[k] > rk[1].t_end[k] ? rk[0].t_end[k] : rk[1].t_end[k];
      steps[k - 1] = z - a;
    }
    res->engine_s = median(steps, reps);
    res->last = rk[0].stats;
    rk[0].stats.buckets = NULL;
    res->rx_wire_s = rk[1].stats.wire_s;
    res->rx_cast_s = rk[1].stats.cast_s;
  }
  free(rk[1].stats.buckets);
  free(ts);
  free(steps);
  return rc;
}

/* ---- GPU modes -------------------------------------------------------------------- */
#if defined(RLORCH_HAVE_CUDA) && defined(RLORCH_HAVE_NCCL)

#define CUCK(x)                                                                                   \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      fprintf(stderr, "bench broadcast: %s: %s\n", #x, cudaGetErrorString(e_));                 \
      return -1;                                                                                  \
    }                                                                                             \
  } while (0)

/* Pinned host-to-device bandwidth: one big copy, best of three. */
static double h2d_gbps(void) {
  const size_t bytes = (size_t)2 << 30;
  void *h = NULL, *d = NULL;
  cudaSetDevice(0);
  CUCK(cudaHostAlloc(&h, bytes, cudaHostAllocDefault));
  CUCK(cudaMalloc(&d, bytes));
  memset(h, 1, bytes);
  cudaEvent_t a, z;
  cudaEventCreate(&a);
  cudaEventCreate(&z);
  double best = 0;
  for (int i = 0; i < 4; i++) {
    cudaEventRecord(a, 0);
    cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, 0);
    cudaEventRecord(z, 0);
    cudaEventSynchronize(z);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, z);
    double g = (double)bytes / (ms / 1e3) / 1e9;
    if (i > 0 && g > best) best = g;
  }
  cudaEventDestroy(a);
  cudaEventDestroy(z);
  cudaFree(d);
  cudaFreeHost(h);
  return best;
}

/* The wire floor: `bytes` broadcast GPU 0 -> GPU 1 as one buffer, median of reps. */
static double wire_alone_s(uint64_t bytes, int reps) {
  ncclComm_t comms[2];
  int devs[2] = {0, 1};
  if (ncclCommInitAll(comms, 2, devs) != ncclSuccess) return -1;
  void *buf[2] = {NULL, NULL};
  cudaStream_t st[2];
  for (int i = 0; i < 2; i++) {
    cudaSetDevice(i);
    CUCK(cudaMalloc(&buf[i], bytes));
    cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking);
  }
  double *v = calloc((size_t)reps, sizeof(double));
  for (int r = -1; r < reps; r++) {
    for (int i = 0; i < 2; i++) {
      cudaSetDevice(i);
      cudaStreamSynchronize(st[i]);
    }
    double t0 = bcast__now();
    ncclGroupStart();
    for (int i = 0; i < 2; i++) ncclBroadcast(buf[i], buf[i], bytes, ncclUint8, 0, comms[i], st[i]);
    ncclGroupEnd();
    for (int i = 0; i < 2; i++) {
      cudaSetDevice(i);
      cudaStreamSynchronize(st[i]);
    }
    if (r >= 0) v[r] = bcast__now() - t0;
  }
  double m = median(v, reps);
  free(v);
  for (int i = 0; i < 2; i++) {
    cudaSetDevice(i);
    cudaFree(buf[i]);
    cudaStreamDestroy(st[i]);
    ncclCommDestroy(comms[i]);
  }
  return m;
}

static int bench_gpu(const bb_args *a, bb_result *res) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 2) {
    fprintf(stderr, "bench broadcast: --mode %s needs 2 CUDA devices, %d visible\n", a->mode, ndev);
    return 1;
  }
  int staged = !strcmp(a->mode, "staged");
  bcast_preset_opts so = {.storage_dtype = staged ? BCAST_DTYPE_FP32 : BCAST_DTYPE_BF16,
                          .wire_dtype = BCAST_DTYPE_BF16,
                          .residency = staged ? BCAST_RES_HOST_PINNED : BCAST_RES_GPU,
                          .device = 0, .max_layers = a->max_layers};
  bcast_preset_opts ro = so;
  ro.residency = BCAST_RES_GPU;
  ro.device = 1;
  bcast_tensor *snd = NULL, *rcv = NULL;
  size_t n = 0, m = 0;
  bcast_storage *ss = NULL, *rs = NULL;
  bcast_gpu *g[2] = {NULL, NULL};
  bcast_plan *plan = NULL;
  bcast_err err = {0};
  int rc = 1;
  res->params = bcast_preset_params(bcast_preset_find(a->preset), &so);
  if (bcast_preset_manifest(a->preset, &so, &snd, &n, &err) ||
      bcast_preset_manifest(a->preset, &ro, &rcv, &m, &err) ||
      bcast_storage_alloc(snd, n, BCAST_FILL_SENDER, 42, &ss, &err) ||
      bcast_storage_alloc(rcv, m, BCAST_FILL_RECEIVER, 0, &rs, &err))
    goto fail;
  uint64_t fp32 = 0, bf16 = 0;
  for (size_t i = 0; i < n; i++) {
    fp32 += bcast_tensor_elems(&snd[i]) * 4;
    bf16 += bcast_tensor_elems(&snd[i]) * 2;
  }
  if (staged) {
    res->floor_gbps = h2d_gbps();
    if (res->floor_gbps <= 0) goto out;
    res->floor_s = (double)fp32 / (res->floor_gbps * 1e9);
    res->floor_name = "pcie";
  } else {
    res->floor_s = wire_alone_s(bf16, a->reps);
    if (res->floor_s <= 0) goto out;
    res->floor_gbps = (double)bf16 / res->floor_s / 1e9;
    res->floor_name = "wire";
  }
  for (int i = 0; i < 2; i++) {
    bcast_engine_opts eo = {.rank = (uint32_t)i, .device = i, .timeout_s = 120};
    cudaSetDevice(i);
    if (bcast__gpu_open(&eo, &g[i], &err)) goto fail;
  }
  bcast_plan_opts po = {.id = "bench", .mode = staged ? BCAST_MODE_STAGED : BCAST_MODE_DIRECT,
                        .world_size = 2, .root_rank = 0, .staging_budget = a->budget};
  if (bcast_plan_build(snd, n, &po, &plan, &err) || bcast__gpu_nccl_id(g[0], plan->nccl_id, &err))
    goto fail;
  plan->has_nccl_id = 1;
  plan->hash = bcast_plan_hash(plan);
  res->wire_bytes = bcast_plan_wire_bytes(plan);
  res->nbuckets = (uint32_t)plan->nbuckets;
  bb_rank rk[2] = {{.rank = 0, .device = 0, .gpu = g[0], .plan = plan, .local = snd, .n = n},
                   {.rank = 1, .device = 1, .gpu = g[1], .plan = plan, .local = rcv, .n = m}};
  if (run_ranks(rk, a->reps, res)) goto out;
  res->pcie_bytes = res->last.pcie_bytes;
  rc = 0;
  goto out;
fail:
  fprintf(stderr, "bench broadcast: %s (%s)\n", err.msg, bcast_strerror(err.code));
out:
  for (int i = 0; i < 2; i++) bcast__gpu_close(g[i]);
  bcast_plan_free(plan);
  bcast_storage_free(ss);
  bcast_storage_free(rs);
  free(snd);
  free(rcv);
  return rc;
}
#else
static int bench_gpu(const bb_args *a, bb_result *res) {
  (void)res;
  fprintf(stderr, "bench broadcast: --mode %s needs a build with CUDA and NCCL\n", a->mode);
  return 1;
}
#endif

/* ---- host mode ----------------------------------------------------------------------- */

typedef struct sock_pair {
  int fd;
  char *buf;
  size_t bytes;
} sock_pair;

static void *sock_reader(void *arg) {
  sock_pair *s = arg;
  size_t got = 0;
  while (got < s->bytes) {
    ssize_t k = recv(s->fd, s->buf + got, s->bytes - got, 0);
    if (k <= 0) break;
    got += (size_t)k;
  }
  return NULL;
}

/* memcpy of the wire bytes, then a plain send over loopback TCP to a reader. */
static double socket_baseline(const char *src, size_t bytes) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 1) ||
      getsockname(ls, (struct sockaddr *)&sa, &sl))
    return -1;
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (c < 0 || connect(c, (struct sockaddr *)&sa, sizeof sa)) return -1;
  int a = accept(ls, NULL, NULL);
  char *tmp = malloc(bytes), *dst = malloc(bytes);
  if (a < 0 || !tmp || !dst) return -1;
  sock_pair rd = {a, dst, bytes};
  pthread_t th;
  double t0 = bcast__now();
  pthread_create(&th, NULL, sock_reader, &rd);
  memcpy(tmp, src, bytes);
  size_t sent = 0;
  while (sent < bytes) {
    ssize_t k = send(c, tmp + sent, bytes - sent, MSG_NOSIGNAL);
    if (k <= 0) break;
    sent += (size_t)k;
  }
  pthread_join(th, NULL);
  double t = bcast__now() - t0;
  close(a);
  close(c);
  close(ls);
  free(tmp);
  free(dst);
  return t;
}

static int bench_host(const bb_args *a, bb_result *res) {
  bcast_preset_opts so = {.storage_dtype = BCAST_DTYPE_FP32, .wire_dtype = BCAST_DTYPE_BF16,
                          .residency = BCAST_RES_HOST_PAGEABLE, .max_layers = a->max_layers};
  bcast_tensor *snd = NULL, *rcv = NULL;
  size_t n = 0, m = 0;
  bcast_storage *ss = NULL, *rs = NULL;
  bcast_engine *e[2] = {NULL, NULL};
  bcast_plan *plan = NULL;
  bcast_err err = {0};
  int rc = 1;
  res->params = bcast_preset_params(bcast_preset_find(a->preset), &so);
  if (bcast_preset_manifest(a->preset, &so, &snd, &n, &err) ||
      bcast_preset_manifest(a->preset, &so, &rcv, &m, &err) ||
      bcast_storage_alloc(snd, n, BCAST_FILL_SENDER, 42, &ss, &err) ||
      bcast_storage_alloc(rcv, m, BCAST_FILL_RECEIVER, 0, &rs, &err))
    goto fail;
  bcast_engine_opts o0 = {.rank = 0, .device = -1, .timeout_s = 120, .host_listen = "127.0.0.1:0"};
  bcast_engine_opts o1 = {.rank = 1, .device = -1, .timeout_s = 120};
  if (bcast_engine_new(&o0, &e[0], &err) || bcast_engine_new(&o1, &e[1], &err)) goto fail;
  bcast_plan_opts po = {.id = "bench-host", .mode = BCAST_MODE_HOST, .world_size = 2,
                        .root_rank = 0, .staging_budget = a->budget,
                        .host_endpoint = bcast_engine_data_address(e[0])};
  if (bcast_plan_build(snd, n, &po, &plan, &err)) goto fail;
  res->wire_bytes = bcast_plan_wire_bytes(plan);
  res->nbuckets = (uint32_t)plan->nbuckets;
  /* Baseline over the largest tensor's worth of bytes, scaled to the wire bytes. */
  {
    size_t big = 0, bi = 0;
    for (size_t i = 0; i < n; i++)
      if (bcast_tensor_elems(&snd[i]) > big) big = bcast_tensor_elems(&snd[i]), bi = i;
    size_t bytes = big * 2;
    double v[5];
    for (int r = 0; r < 5; r++) v[r] = socket_baseline(snd[bi].data, bytes);
    res->baseline_s = median(v, 5) * (double)res->wire_bytes / (double)bytes;
    res->floor_s = res->baseline_s;
    res->floor_gbps = (double)res->wire_bytes / res->baseline_s / 1e9;
    res->floor_name = "memcpy+socket";
  }
  bb_rank rk[2] = {{.rank = 0, .device = -1, .eng = e[0], .plan = plan, .local = snd, .n = n},
                   {.rank = 1, .device = -1, .eng = e[1], .plan = plan, .local = rcv, .n = m}};
  if (run_ranks(rk, a->reps, res)) goto out;
  rc = 0;
  goto out;
fail:
  fprintf(stderr, "bench broadcast: %s (%s)\n", err.msg, bcast_strerror(err.code));
out:
  for (int i = 0; i < 2; i++)
    if (e[i]) bcast_engine_free(e[i]);
  bcast_plan_free(plan);
  bcast_storage_free(ss);
  bcast_storage_free(rs);
  free(snd);
  free(rcv);
  return rc;
}

/* ---- report ----------------------------------------------------------------------- */

static void report(const bb_args *a, const bb_result *r) {
  const bcast_stats *s = &r->last;
  double ratio = r->floor_s > 0 ? r->engine_s / r->floor_s : 0;
  int is4b = !strcmp(a->preset, "4b") && strcmp(a->mode, "host");
  if (a->json) {
    printf("{\"bench\":\"broadcast\",\"preset\":\"%s\",\"mode\":\"%s\",\"reps\":%d,"
           "\"params\":%llu,\"wire_bytes\":%llu,\"pcie_bytes\":%llu,\"buckets\":%u,"
           "\"floor\":\"%s\",\"floor_s\":%.6f,\"floor_gbps\":%.2f,\"engine_s\":%.6f,"
           "\"ratio\":%.4f,\"h2d_s\":%.6f,\"cast_s\":%.6f,\"wire_s\":%.6f,"
           "\"wire_alone_s\":%.6f,\"exposed_s\":%.6f,\"rx_scatter_s\":%.6f%s}\n",
           a->preset, a->mode, a->reps, (unsigned long long)r->params,
           (unsigned long long)r->wire_bytes, (unsigned long long)r->pcie_bytes, r->nbuckets,
           r->floor_name, r->floor_s, r->floor_gbps, r->engine_s, ratio, s->h2d_s, s->cast_s,
           s->wire_s, s->wire_alone_s, s->exposed_s, r->rx_cast_s,
           is4b ? ",\"pytorch_reference_s\":0.331" : "");
    return;
  }
  printf("broadcast %s, mode %s: %.2f B params, %.2f GB on the wire in %u buckets, %d reps\n",
         a->preset, a->mode, r->params / 1e9, r->wire_bytes / 1e9, r->nbuckets, a->reps);
  printf("  %-16s %.4f s  (%.1f GB/s)\n", r->floor_name, r->floor_s, r->floor_gbps);
  printf("  %-16s %.4f s  (median after a warm-up)\n", "engine", r->engine_s);
  printf("  %-16s %.3fx\n", "ratio", ratio);
  if (strcmp(a->mode, "host")) {
    printf("  sender stages (sums): h2d %.4f s, cast %.4f s, wire %.4f s; PCIe %.2f GB\n",
           s->h2d_s, s->cast_s, s->wire_s, s->pcie_bytes / 1e9);
    printf("  receiver: wire %.4f s, scatter %.4f s\n", r->rx_wire_s, r->rx_cast_s);
    printf("  broadcast alone (same buckets, measured) %.4f s; exposed staging %.4f s\n",
           s->wire_alone_s, s->exposed_s);
  }
  if (is4b) printf("  reference: PyTorch per-tensor pinned copies + GPU cast + per-layer "
                   "broadcast took 0.331 s on the same machine type (%.2fx of it)\n",
                   r->engine_s / 0.331);
}

int bench_broadcast(int argc, char **argv) {
  bb_args a;
  int rc = parse(argc, argv, &a);
  if (rc) return rc;
  bb_result res;
  memset(&res, 0, sizeof res);
  rc = !strcmp(a.mode, "host") ? bench_host(&a, &res) : bench_gpu(&a, &res);
  if (rc) return 1;
  report(&a, &res);
  free(res.last.buckets);
  return 0;
}
