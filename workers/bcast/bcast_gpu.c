/* GPU backend of the engine: direct and staged modes over NCCL.
 *
 * One executor serves both modes; what differs is where each slice lives.
 * Per bucket k (slot k % nslots of the staging ring):
 *   sender    copy stream: host slices -> raw staging (H2D, pinned or registered)
 *             cast stream: raw staging or GPU tensors -> wire bucket (cast kernel)
 *             comm stream: ncclBroadcast of the wire bucket
 *   receiver  comm stream: ncclBroadcast into the wire bucket
 *             cast stream: scatter into the destination tensors (GPU or host)
 * CUDA events order the streams: the copy of bucket k+1 overlaps the cast and
 * broadcast of bucket k, and a slot is refilled only after the bucket that
 * used it nslots earlier has left it. The host enqueues every bucket, then
 * polls the events and NCCL's async error against the deadline, so a missing
 * or failed peer ends in an abort and an error, never a hang. */
#ifdef RLORCH_HAVE_CUDA

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <cuda_runtime_api.h>
#ifdef RLORCH_HAVE_NCCL
#include <nccl.h>
#endif

#include "workers/bcast/bcast_gpu.cuh"
#include "workers/bcast/bcast_gpu_priv.h"
#include "workers/bcast/bcast_internal.h"

static void sleep_us(long us) {
  struct timespec ts = {0, us * 1000};
  nanosleep(&ts, NULL);
}

/* Absolute monotonic deadline from a relative timeout and the plan's wall-clock one. */
static double deadline_from(double timeout_s, int64_t plan_deadline_ms) {
  double d = bcast__now() + timeout_s;
  if (plan_deadline_ms > 0) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    double left = (double)plan_deadline_ms / 1e3 - ((double)tv.tv_sec + tv.tv_usec * 1e-6);
    if (bcast__now() + left < d) d = bcast__now() + left;
  }
  return d;
}

/* ---- open / close ------------------------------------------------------------ */

int bcast__gpu_open(const bcast_engine_opts *o, bcast_gpu **out, bcast_err *err) {
  if (!o || !out) return bcast__fail(err, BCAST_EINVAL, "gpu open: NULL argument");
  *out = NULL;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return bcast__fail(err, BCAST_ENOTSUP, "no CUDA device visible: direct and staged unavailable");
  }
  if (o->device < 0 || o->device >= count)
    return bcast__fail(err, BCAST_EINVAL, "engine device %d: %d CUDA device(s) visible", o->device,
                       count);
  cudaError_t ce = cudaSetDevice(o->device);
  if (ce != cudaSuccess)
    return CUDA_FAIL(err, ce, "cudaSetDevice(%d): %s", o->device, cudaGetErrorString(ce));
  bcast_gpu *g = calloc(1, sizeof *g);
  if (!g) return bcast__fail(err, BCAST_ENOMEM, "gpu open: no memory");
  g->device = o->device;
  g->rank = o->rank;
  g->nslots = o->staging_buffers ? o->staging_buffers : 3;
  if (g->nslots < 2) g->nslots = 2;
  g->timeout_s = o->timeout_s > 0 ? o->timeout_s : 60;
  g->cancel_fd = -1;
  g->wire = calloc(g->nslots, sizeof(void *));
  g->raw = calloc(g->nslots, sizeof(void *));
  g->bounce = calloc(g->nslots, sizeof(void *));
  if (!g->wire || !g->raw || !g->bounce) {
    bcast__gpu_close(g);
    return bcast__fail(err, BCAST_ENOMEM, "gpu open: no memory");
  }
  /* The comm stream gets the highest priority so cast work never delays NCCL. */
  int lo = 0, hi = 0;
  cudaDeviceGetStreamPriorityRange(&lo, &hi);
  if ((ce = cudaStreamCreateWithFlags(&g->s_copy, cudaStreamNonBlocking)) != cudaSuccess ||
      (ce = cudaStreamCreateWithFlags(&g->s_cast, cudaStreamNonBlocking)) != cudaSuccess ||
      (ce = cudaStreamCreateWithPriority(&g->s_comm, cudaStreamNonBlocking, hi)) != cudaSuccess) {
    bcast__gpu_close(g);
    return CUDA_FAIL(err, ce, "creating CUDA streams on device %d: %s", o->device,
                     cudaGetErrorString(ce));
  }
  *out = g;
  return BCAST_OK;
}

#ifdef RLORCH_HAVE_NCCL
/* Ends a communicator without waiting on peers that may be gone. */
static void comm_drop(bcast_gpu *g, int abort) {
  if (!g->comm) return;
  if (!abort) {
    ncclResult_t r = ncclCommFinalize(g->comm);
    double dl = bcast__now() + (g->timeout_s < 10 ? g->timeout_s : 10);
    ncclResult_t st = r;
    while (st == ncclInProgress && bcast__now() < dl) {
      if (ncclCommGetAsyncError(g->comm, &st) != ncclSuccess) break;
      if (st == ncclInProgress) sleep_us(100);
    }
    if (st == ncclSuccess)
      ncclCommDestroy(g->comm);
    else
      ncclCommAbort(g->comm);
  } else {
    ncclCommAbort(g->comm);
  }
  g->comm = NULL;
  memset(g->comm_id, 0, sizeof g->comm_id);
  g->calib_sig = 0;
}
#endif

static void ev_destroy(bucket_ev *e);

static void free_slots(bcast_gpu *g, void **bufs, int host) {
  for (uint32_t i = 0; bufs && i < g->nslots; i++) {
    if (bufs[i]) host ? cudaFreeHost(bufs[i]) : cudaFree(bufs[i]);
    bufs[i] = NULL;
  }
}

void bcast__gpu_close(bcast_gpu *g) {
  if (!g) return;
  cudaSetDevice(g->device);
  if (g->s_copy) cudaStreamSynchronize(g->s_copy);
  if (g->s_cast) cudaStreamSynchronize(g->s_cast);
  if (g->s_comm) cudaStreamSynchronize(g->s_comm);
#ifdef RLORCH_HAVE_NCCL
  comm_drop(g, 0);
#endif
  free_slots(g, g->wire, 0);
  free_slots(g, g->raw, 0);
  free_slots(g, g->bounce, 1);
  for (size_t i = 0; i < g->nregs; i++) cudaHostUnregister(g->regs[i].ptr);
  for (size_t i = 0; i < g->nev; i++) ev_destroy(&g->ev[i]);
  free(g->ev);
  if (g->s_copy) cudaStreamDestroy(g->s_copy);
  if (g->s_cast) cudaStreamDestroy(g->s_cast);
  if (g->s_comm) cudaStreamDestroy(g->s_comm);
  free(g->regs);
  free(g->wire);
  free(g->raw);
  free(g->bounce);
  free(g);
}

/* ---- NCCL id and communicator ---------------------------------------------------- */

int bcast__gpu_copy(bcast_gpu *g, void *dst, const void *src, size_t bytes, int to_device,
                    bcast_err *err) {
  if (!g) return bcast__fail(err, BCAST_EINVAL, "device copy: no GPU backend");
  cudaError_t ce = cudaSetDevice(g->device);
  if (ce == cudaSuccess)
    ce = cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
  if (ce != cudaSuccess)
    return bcast__fail(err, BCAST_ECUDA, "%s copy of %zu bytes: %s",
                       to_device ? "host-to-device" : "device-to-host", bytes, cudaGetErrorString(ce));
  return BCAST_OK;
}

int bcast__gpu_nccl_id(bcast_gpu *g, uint8_t id[128], bcast_err *err) {
  if (!g || !id) return bcast__fail(err, BCAST_EINVAL, "nccl id: NULL argument");
#ifdef RLORCH_HAVE_NCCL
  ncclUniqueId uid;
  ncclResult_t r = ncclGetUniqueId(&uid);
  if (r != ncclSuccess)
    return bcast__fail(err, BCAST_ENCCL, "ncclGetUniqueId: %s", ncclGetErrorString(r));
  memcpy(id, uid.internal, 128);
  return BCAST_OK;
#else
  return bcast__fail(err, BCAST_ENOTSUP, "built without NCCL: no NCCL id");
#endif
}

/* The orchestrator aborted the execution in progress (bcast_engine_cancel). */
static int gpu_cancelled(const bcast_gpu *g) {
  if (g->cancel_fd < 0) return 0;
  struct pollfd pf = {.fd = g->cancel_fd, .events = POLLIN};
  return poll(&pf, 1, 0) == 1;
}

#ifdef RLORCH_HAVE_NCCL
/* Polls a non-blocking communicator until its pending operation settles. */
static int comm_settle(bcast_gpu *g, ncclResult_t r, double deadline, const char *what,
                       bcast_err *err) {
  /* An enqueue usually settles within microseconds; a fixed sleep here would
   * add its length to every bucket of a step. Poll tightly first, then back off. */
  double t0 = bcast__now();
  while (r == ncclInProgress) {
    double now = bcast__now();
    if (now > deadline) {
      comm_drop(g, 1);
      return bcast__fail(err, BCAST_ETIMEDOUT, "%s: deadline passed (rank %u): communicator aborted",
                         what, g->rank);
    }
    if (gpu_cancelled(g)) {
      comm_drop(g, 1);
      return bcast__fail(err, BCAST_ECANCELED, "%s: cancelled (rank %u): communicator aborted", what,
                         g->rank);
    }
    if (now - t0 > 1e-3) sleep_us(100);
    if (ncclCommGetAsyncError(g->comm, &r) != ncclSuccess) break;
  }
  if (r != ncclSuccess) {
    const char *last = ncclGetLastError(g->comm);
    comm_drop(g, 1);
    return bcast__fail(err, BCAST_ENCCL, "%s: %s%s%s", what, ncclGetErrorString(r),
                       last && *last ? ": " : "", last ? last : "");
  }
  return BCAST_OK;
}

/* The communicator for this plan: kept while the nccl id stays the same. */
static int comm_ensure(bcast_gpu *g, const bcast_plan *p, uint32_t rank, bcast_err *err) {
  if (g->comm && !memcmp(g->comm_id, p->nccl_id, 128) && g->comm_world == p->world_size &&
      g->comm_rank == rank)
    return BCAST_OK;
  comm_drop(g, 0);
  ncclUniqueId uid;
  memcpy(uid.internal, p->nccl_id, 128);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  double t0 = bcast__now();
  double deadline = deadline_from(g->timeout_s, p->deadline_unix_ms);
  ncclResult_t r = ncclCommInitRankConfig(&g->comm, (int)p->world_size, uid, (int)rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    g->comm = NULL;
    return bcast__fail(err, BCAST_ENCCL, "ncclCommInitRankConfig (rank %u of %u): %s", rank,
                       p->world_size, ncclGetErrorString(r));
  }
  while (r == ncclInProgress) {
    if (bcast__now() > deadline) {
      comm_drop(g, 1);
      return bcast__fail(err, BCAST_ETIMEDOUT,
                         "NCCL communicator init: rank %u waited %.1f s for the other %u rank(s) "
                         "of the plan's world (%u) to join; aborted",
                         rank, bcast__now() - t0, p->world_size - 1, p->world_size);
    }
    if (gpu_cancelled(g)) {
      comm_drop(g, 1);
      return bcast__fail(err, BCAST_ECANCELED, "NCCL communicator init (rank %u of %u): cancelled "
                         "after %.1f s; aborted", rank, p->world_size, bcast__now() - t0);
    }
    sleep_us(200);
    if (ncclCommGetAsyncError(g->comm, &r) != ncclSuccess) break;
  }
  if (r != ncclSuccess) {
    comm_drop(g, 1);
    return bcast__fail(err, BCAST_ENCCL, "NCCL communicator init (rank %u of %u): %s", rank,
                       p->world_size, ncclGetErrorString(r));
  }
  memcpy(g->comm_id, p->nccl_id, 128);
  g->comm_world = p->world_size;
  g->comm_rank = rank;
  g->calib_sig = 0;
  return BCAST_OK;
}
#endif

/* ---- buffers and host memory ------------------------------------------------------- */

int bcast__gpu_grow(bcast_gpu *g, void **bufs, size_t *cap, size_t need, int host, const char *what,
                bcast_err *err) {
  if (need <= *cap && (need == 0 || bufs[0])) return BCAST_OK;
  free_slots(g, bufs, host);
  *cap = 0;
  for (uint32_t i = 0; i < g->nslots; i++) {
    cudaError_t ce = host ? cudaHostAlloc(&bufs[i], need, cudaHostAllocDefault)
                          : cudaMalloc(&bufs[i], need);
    if (ce != cudaSuccess) {
      bufs[i] = NULL;
      free_slots(g, bufs, host);
      return CUDA_FAIL(err, ce, "%s: %u x %zu bytes on device %d: %s", what, g->nslots, need,
                       g->device, cudaGetErrorString(ce));
    }
  }
  *cap = need;
  return BCAST_OK;
}

/* Pinned, registered here before, or registered now (once, kept until close):
 * AT_HOST_DMA. Registration refused (limits, overlap): AT_HOST_BOUNCE. */
int bcast__gpu_host_access(bcast_gpu *g, void *ptr, size_t bytes) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, ptr) == cudaSuccess && a.type == cudaMemoryTypeHost)
    return AT_HOST_DMA;
  (void)cudaGetLastError();
  for (size_t i = 0; i < g->nregs; i++)
    if (g->regs[i].ptr == ptr && g->regs[i].bytes >= bytes) return AT_HOST_DMA;
  if (g->nregs == g->capregs) {
    size_t nc = g->capregs ? g->capregs * 2 : 64;
    gpu_reg *r = realloc(g->regs, nc * sizeof *r);
    if (!r) return AT_HOST_BOUNCE;
    g->regs = r;
    g->capregs = nc;
  }
  cudaError_t ce = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
  if (ce == cudaErrorHostMemoryAlreadyRegistered) {
    (void)cudaGetLastError();
    return AT_HOST_DMA;
  }
  if (ce != cudaSuccess) {
    (void)cudaGetLastError();
    return AT_HOST_BOUNCE;
  }
  g->regs[g->nregs++] = (gpu_reg){ptr, bytes};
  return AT_HOST_DMA;
}

/* ---- execution --------------------------------------------------------------------- */

typedef struct exec_ctx {
  bcast_gpu *g;
  const bcast_plan *p;
  uint32_t rank;
  const bcast_tensor **loc; /* plan tensor index -> local tensor */
  uint8_t *access;          /* plan tensor index -> AT_* */
  bucket_ev *ev;
  double deadline_s; /* stall timeout: progress re-arms it */
  uint64_t pcie_bytes;
} exec_ctx;

static int by_name(const void *a, const void *b) {
  return strcmp((*(const bcast_tensor *const *)a)->name, (*(const bcast_tensor *const *)b)->name);
}

/* Maps plan tensors to local ones (same order, or by name) and checks what the
 * GPU path needs: data present, GPU tensors on this device, castable dtypes. */
static int map_local(exec_ctx *x, const bcast_tensor *local, size_t n, bcast_err *err) {
  const bcast_plan *p = x->p;
  bcast_gpu *g = x->g;
  const bcast_tensor **sorted = NULL;
  for (size_t i = 0; i < p->ntensors; i++) {
    const bcast_tensor *t = NULL;
    if (i < n && !strcmp(local[i].name, p->tensors[i].name)) {
      t = &local[i];
    } else {
      if (!sorted) {
        sorted = malloc((n ? n : 1) * sizeof *sorted);
        if (!sorted) return bcast__fail(err, BCAST_ENOMEM, "gpu execute: no memory");
        for (size_t k = 0; k < n; k++) sorted[k] = &local[k];
        qsort(sorted, n, sizeof *sorted, by_name);
      }
      bcast_tensor key;
      strncpy(key.name, p->tensors[i].name, sizeof key.name);
      const bcast_tensor *kp = &key;
      const bcast_tensor **hit = bsearch(&kp, sorted, n, sizeof *sorted, by_name);
      t = hit ? *hit : NULL;
    }
    if (!t) {
      free(sorted);
      return bcast__fail(err, BCAST_EINVAL, "tensor %s of the plan has no local tensor on rank %u",
                         p->tensors[i].name, x->rank);
    }
    x->loc[i] = t;
  }
  free(sorted);
  (void)g;
  return BCAST_OK;
}

/* Roles are per bucket (its source rank), so a tensor's role is that of the
 * first bucket holding it; checks follow the role. */
static int check_tensor(exec_ctx *x, uint32_t ti, int sender, bcast_err *err) {
  const bcast_tensor *t = x->loc[ti];
  const bcast_tensor *pt = &x->p->tensors[ti];
  if (x->access[ti]) return BCAST_OK;
  if (!t->data)
    return bcast__fail(err, BCAST_EINVAL, "tensor %s: data is NULL on rank %u", t->name, x->rank);
  bcast_dtype have = sender ? t->storage_dtype : t->wire_dtype;
  if (sender && !bcast__cuda_cast_supported(have, pt->wire_dtype))
    return bcast__fail(err, BCAST_ENOTSUP, "tensor %s: no GPU cast from %s to %s", t->name,
                       bcast_dtype_name(have), bcast_dtype_name(pt->wire_dtype));
  if (!sender && have != pt->wire_dtype)
    return bcast__fail(err, BCAST_EINVAL, "tensor %s: receiver buffer is %s, the wire carries %s",
                       t->name, bcast_dtype_name(have), bcast_dtype_name(pt->wire_dtype));
  size_t bytes = (size_t)bcast_tensor_elems(t) * bcast_dtype_size(have);
  if (t->residency == BCAST_RES_GPU) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, t->data) != cudaSuccess ||
        (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)) {
      (void)cudaGetLastError();
      return bcast__fail(err, BCAST_EINVAL, "tensor %s: marked GPU-resident but not device memory",
                         t->name);
    }
    if (a.type == cudaMemoryTypeDevice && a.device != x->g->device)
      return bcast__fail(err, BCAST_EINVAL, "tensor %s: lives on GPU %d, the engine uses GPU %d",
                         t->name, a.device, x->g->device);
    x->access[ti] = AT_DEVICE;
  } else if (t->residency == BCAST_RES_HOST_PINNED || t->residency == BCAST_RES_HOST_PAGEABLE) {
    x->access[ti] = (uint8_t)bcast__gpu_host_access(x->g, t->data, bytes);
  } else {
    return bcast__fail(err, BCAST_EINVAL, "tensor %s: unknown residency %d", t->name,
                       (int)t->residency);
  }
  return BCAST_OK;
}

static int ev_create(bucket_ev *e, bcast_err *err) {
  cudaEvent_t *all[6] = {&e->h2d0, &e->h2d1, &e->cast0, &e->cast1, &e->wire0, &e->wire1};
  for (int i = 0; i < 6; i++) {
    cudaError_t ce = cudaEventCreate(all[i]);
    if (ce != cudaSuccess) return CUDA_FAIL(err, ce, "cudaEventCreate: %s", cudaGetErrorString(ce));
  }
  return BCAST_OK;
}

static void ev_destroy(bucket_ev *e) {
  cudaEvent_t all[6] = {e->h2d0, e->h2d1, e->cast0, e->cast1, e->wire0, e->wire1};
  for (int i = 0; i < 6; i++)
    if (all[i]) cudaEventDestroy(all[i]);
}

int bcast__gpu_ev_ensure(bcast_gpu *g, size_t n, bcast_err *err) {
  if (n <= g->nev) return BCAST_OK;
  bucket_ev *e = realloc(g->ev, n * sizeof *e);
  if (!e) return bcast__fail(err, BCAST_ENOMEM, "gpu execute: no memory for events");
  g->ev = e;
  for (; g->nev < n; g->nev++) {
    memset(&g->ev[g->nev], 0, sizeof *e);
    int rc = ev_create(&g->ev[g->nev], err);
    if (rc) {
      ev_destroy(&g->ev[g->nev]);
      return rc;
    }
  }
  return BCAST_OK;
}

/* Waits for one event on the host, polling NCCL and the deadline. */
static int wait_event(exec_ctx *x, cudaEvent_t e, const char *what, uint32_t bucket,
                      bcast_err *err) {
  for (;;) {
    cudaError_t ce = cudaEventQuery(e);
    if (ce == cudaSuccess) return BCAST_OK;
    if (ce != cudaErrorNotReady)
      return CUDA_FAIL(err, ce, "bucket %u: %s: %s", bucket, what, cudaGetErrorString(ce));
#ifdef RLORCH_HAVE_NCCL
    ncclResult_t st = ncclSuccess;
    if (x->g->comm && ncclCommGetAsyncError(x->g->comm, &st) == ncclSuccess &&
        st != ncclSuccess && st != ncclInProgress) {
      const char *last = ncclGetLastError(x->g->comm);
      comm_drop(x->g, 1);
      return bcast__fail(err, BCAST_ENCCL, "bucket %u: %s: NCCL: %s%s%s", bucket, what,
                         ncclGetErrorString(st), last && *last ? ": " : "", last ? last : "");
    }
#endif
    if (gpu_cancelled(x->g)) {
#ifdef RLORCH_HAVE_NCCL
      comm_drop(x->g, 1);
#endif
      return bcast__fail(err, BCAST_ECANCELED, "bucket %u: %s: cancelled on rank %u; communicator "
                         "aborted", bucket, what, x->rank);
    }
    if (bcast__now() > x->deadline_s) {
#ifdef RLORCH_HAVE_NCCL
      comm_drop(x->g, 1);
#endif
      const bcast_bucket *b = &x->p->buckets[bucket];
      return bcast__fail(err, BCAST_ETIMEDOUT,
                         "bucket %u (layer %u, %llu bytes from rank %u): %s not done by the "
                         "deadline on rank %u; communicator aborted",
                         bucket, b->layer, (unsigned long long)b->bytes, b->source_rank, what,
                         x->rank);
    }
    sleep_us(20);
  }
}

#define CK(call, ...)                                                                            \
  do {                                                                                           \
    cudaError_t ce_ = (call);                                                                    \
    if (ce_ != cudaSuccess) return CUDA_FAIL(err, ce_, __VA_ARGS__);                             \
  } while (0)

/* Bytes of storage one slice occupies on the sender. */
static size_t slice_src_bytes(const exec_ctx *x, const bcast_slice *s) {
  return (size_t)s->elem_count * bcast_dtype_size(x->loc[s->tensor]->storage_dtype);
}

static int ncclwrap(exec_ctx *x, const void *send, void *recv, size_t bytes, uint32_t root,
                    uint32_t bucket, bcast_err *err) {
#ifdef RLORCH_HAVE_NCCL
  char what[96];
  snprintf(what, sizeof what, "ncclBroadcast of bucket %u", bucket);
  ncclResult_t r = ncclBroadcast(send, recv, bytes, ncclUint8, (int)root, x->g->comm, x->g->s_comm);
  return comm_settle(x->g, r, x->deadline_s, what, err);
#else
  (void)x, (void)send, (void)recv, (void)bytes, (void)root;
  return bcast__fail(err, BCAST_ENOTSUP, "bucket %u: built without NCCL", bucket);
#endif
}

/* Single slice that is a whole GPU run of wire-dtype bytes: the bucket can be
 * the tensor itself, no packing. */
static void *zero_copy(const exec_ctx *x, const bcast_bucket *b, int sender) {
  if (b->nslices != 1) return NULL;
  const bcast_slice *s = &b->slices[0];
  const bcast_tensor *t = x->loc[s->tensor];
  if (x->access[s->tensor] != AT_DEVICE) return NULL;
  bcast_dtype have = sender ? t->storage_dtype : t->wire_dtype;
  if (have != b->wire_dtype || s->bucket_offset != 0) return NULL;
  return (char *)t->data + s->elem_offset * bcast_dtype_size(have);
}

/* Direct mode sends every slice as its own broadcast, grouped per bucket:
 * slices already on the device in the wire dtype go straight from the
 * sender's tensor into the receiver's tensor, with no pack and no scatter.
 * The sequence of collectives depends on the plan only (one per slice), so
 * every rank issues the same one whatever its local residency; each rank only
 * picks its own pointers. */
static int per_slice(const exec_ctx *x) { return x->p->mode == BCAST_MODE_DIRECT; }

/* This rank's device pointer for slice s when it can take part without going
 * through the wire buffer, else NULL. */
static void *slice_direct_ptr(const exec_ctx *x, const bcast_slice *s, int sender) {
  const bcast_tensor *t = x->loc[s->tensor];
  if (x->access[s->tensor] != AT_DEVICE) return NULL;
  bcast_dtype have = sender ? t->storage_dtype : t->wire_dtype;
  if (have != x->p->tensors[s->tensor].wire_dtype) return NULL;
  return (char *)t->data + s->elem_offset * bcast_dtype_size(have);
}

static int nccl_slices(exec_ctx *x, const bcast_bucket *b, char *wire, int sender, uint32_t k,
                       bcast_err *err) {
#ifdef RLORCH_HAVE_NCCL
  char what[96];
  snprintf(what, sizeof what, "grouped ncclBroadcast of bucket %u", k);
  ncclResult_t r = ncclGroupStart();
  for (size_t i = 0; i < b->nslices && (r == ncclSuccess || r == ncclInProgress); i++) {
    const bcast_slice *s = &b->slices[i];
    void *ptr = slice_direct_ptr(x, s, sender);
    if (!ptr) ptr = wire + s->bucket_offset;
    size_t bytes = (size_t)s->elem_count * bcast_dtype_size(b->wire_dtype);
    r = ncclBroadcast(ptr, ptr, bytes, ncclUint8, (int)b->source_rank, x->g->comm, x->g->s_comm);
  }
  ncclResult_t e = ncclGroupEnd();
  if (r == ncclSuccess || r == ncclInProgress) r = e;
  return comm_settle(x->g, r, x->deadline_s, what, err);
#else
  (void)x, (void)b, (void)wire, (void)sender;
  return bcast__fail(err, BCAST_ENOTSUP, "bucket %u: built without NCCL", k);
#endif
}

/* Whether any slice of the bucket goes through this rank's wire buffer. */
static int uses_wire(const exec_ctx *x, const bcast_bucket *b, int sender) {
  for (size_t i = 0; i < b->nslices; i++)
    if (!slice_direct_ptr(x, &b->slices[i], sender)) return 1;
  return 0;
}

static int enqueue_send(exec_ctx *x, uint32_t k, bcast_err *err) {
  bcast_gpu *g = x->g;
  const bcast_bucket *b = &x->p->buckets[k];
  bucket_ev *e = &x->ev[k];
  uint32_t slot = k % g->nslots;
  char *raw = g->raw[slot], *wire = g->wire[slot];
  const bucket_ev *prev = k >= g->nslots ? &x->ev[k - g->nslots] : NULL;
  size_t esw = bcast_dtype_size(b->wire_dtype);
  /* Stage 1: host slices into the raw staging buffer. */
  if (prev) CK(cudaStreamWaitEvent(g->s_copy, prev->cast1, 0), "bucket %u: wait", k);
  CK(cudaEventRecord(e->h2d0, g->s_copy), "bucket %u: event", k);
  size_t roff = 0;
  for (size_t i = 0; i < b->nslices; i++) {
    const bcast_slice *s = &b->slices[i];
    uint8_t at = x->access[s->tensor];
    if (at == AT_DEVICE) continue;
    const bcast_tensor *t = x->loc[s->tensor];
    size_t nb = slice_src_bytes(x, s);
    const char *src = (const char *)t->data + s->elem_offset * bcast_dtype_size(t->storage_dtype);
    if (at == AT_HOST_BOUNCE) {
      /* The bounce buffer of this slot is free once its last H2D finished. */
      int rc = prev ? wait_event(x, prev->h2d1, "staging slot reuse", k, err) : 0;
      if (rc) return rc;
      memcpy((char *)g->bounce[slot] + roff, src, nb);
      src = (const char *)g->bounce[slot] + roff;
    }
    CK(cudaMemcpyAsync(raw + roff, src, nb, cudaMemcpyHostToDevice, g->s_copy),
       "bucket %u: host-to-device copy of tensor %s", k, t->name);
    x->pcie_bytes += nb;
    roff += (nb + 255) & ~(size_t)255;
  }
  CK(cudaEventRecord(e->h2d1, g->s_copy), "bucket %u: event", k);
  /* Stage 2: cast (or copy) every slice into the wire bucket. */
  int ps = per_slice(x);
  void *zc = ps ? NULL : zero_copy(x, b, 1);
  int wire_used = ps ? uses_wire(x, b, 1) : !zc;
  CK(cudaStreamWaitEvent(g->s_cast, e->h2d1, 0), "bucket %u: wait", k);
  if (prev && wire_used) CK(cudaStreamWaitEvent(g->s_cast, prev->wire1, 0), "bucket %u: wait", k);
  CK(cudaEventRecord(e->cast0, g->s_cast), "bucket %u: event", k);
  roff = 0;
  for (size_t i = 0; i < b->nslices && !zc; i++) {
    const bcast_slice *s = &b->slices[i];
    const bcast_tensor *t = x->loc[s->tensor];
    size_t es = bcast_dtype_size(t->storage_dtype);
    const char *src;
    if (ps && slice_direct_ptr(x, s, 1)) continue; /* sent from the tensor itself */
    if (x->access[s->tensor] == AT_DEVICE) {
      src = (const char *)t->data + s->elem_offset * es;
    } else {
      src = raw + roff;
      roff += (slice_src_bytes(x, s) + 255) & ~(size_t)255;
    }
    int ce = bcast__cuda_cast(wire + s->bucket_offset, b->wire_dtype, src, t->storage_dtype,
                              s->elem_count, g->s_cast);
    if (ce)
      return CUDA_FAIL(err, (cudaError_t)ce, "bucket %u: cast of tensor %s: %s", k, t->name,
                       cudaGetErrorString((cudaError_t)ce));
  }
  (void)esw;
  CK(cudaEventRecord(e->cast1, g->s_cast), "bucket %u: event", k);
  /* Stage 3: broadcast. */
  CK(cudaStreamWaitEvent(g->s_comm, e->cast1, 0), "bucket %u: wait", k);
  CK(cudaEventRecord(e->wire0, g->s_comm), "bucket %u: event", k);
  int rc = ps ? nccl_slices(x, b, wire, 1, k, err)
              : ncclwrap(x, zc ? zc : wire, zc ? zc : wire, b->bytes, b->source_rank, k, err);
  if (rc) return rc;
  CK(cudaEventRecord(e->wire1, g->s_comm), "bucket %u: event", k);
  return BCAST_OK;
}

static int enqueue_recv(exec_ctx *x, uint32_t k, bcast_err *err) {
  bcast_gpu *g = x->g;
  const bcast_bucket *b = &x->p->buckets[k];
  bucket_ev *e = &x->ev[k];
  uint32_t slot = k % g->nslots;
  char *wire = g->wire[slot];
  const bucket_ev *prev = k >= g->nslots ? &x->ev[k - g->nslots] : NULL;
  int ps = per_slice(x);
  void *zc = ps ? NULL : zero_copy(x, b, 0);
  int wire_used = ps ? uses_wire(x, b, 0) : !zc;
  CK(cudaEventRecord(e->h2d0, g->s_comm), "bucket %u: event", k);
  CK(cudaEventRecord(e->h2d1, g->s_comm), "bucket %u: event", k);
  /* The slot is free once the scatter of its previous bucket finished. */
  if (prev && wire_used) CK(cudaStreamWaitEvent(g->s_comm, prev->cast1, 0), "bucket %u: wait", k);
  CK(cudaEventRecord(e->wire0, g->s_comm), "bucket %u: event", k);
  int rc = ps ? nccl_slices(x, b, wire, 0, k, err)
              : ncclwrap(x, zc ? zc : wire, zc ? zc : wire, b->bytes, b->source_rank, k, err);
  if (rc) return rc;
  CK(cudaEventRecord(e->wire1, g->s_comm), "bucket %u: event", k);
  CK(cudaStreamWaitEvent(g->s_cast, e->wire1, 0), "bucket %u: wait", k);
  CK(cudaEventRecord(e->cast0, g->s_cast), "bucket %u: event", k);
  int bounced = 0;
  for (size_t i = 0; i < b->nslices && !zc; i++) {
    const bcast_slice *s = &b->slices[i];
    if (ps && slice_direct_ptr(x, s, 0)) continue; /* received in place */
    const bcast_tensor *t = x->loc[s->tensor];
    size_t es = bcast_dtype_size(t->wire_dtype), nb = (size_t)s->elem_count * es;
    char *dst = (char *)t->data + s->elem_offset * es;
    uint8_t at = x->access[s->tensor];
    if (at == AT_HOST_BOUNCE) {
      dst = (char *)g->bounce[slot] + s->bucket_offset;
      bounced = 1;
    }
    CK(cudaMemcpyAsync(dst, wire + s->bucket_offset, nb, cudaMemcpyDefault, g->s_cast),
       "bucket %u: scatter of tensor %s", k, t->name);
  }
  CK(cudaEventRecord(e->cast1, g->s_cast), "bucket %u: event", k);
  if (bounced) {
    /* Unregistrable pageable destinations: finish this bucket on the host. */
    rc = wait_event(x, e->cast1, "scatter to host", k, err);
    if (rc) return rc;
    for (size_t i = 0; i < b->nslices; i++) {
      const bcast_slice *s = &b->slices[i];
      if (x->access[s->tensor] != AT_HOST_BOUNCE) continue;
      const bcast_tensor *t = x->loc[s->tensor];
      size_t es = bcast_dtype_size(t->wire_dtype);
      memcpy((char *)t->data + s->elem_offset * es, (char *)g->bounce[slot] + s->bucket_offset,
             (size_t)s->elem_count * es);
    }
  }
  return BCAST_OK;
}

/* A fingerprint of the bucket layout: the broadcast-alone time is measured once
 * per communicator and layout. */
static uint64_t layout_sig(const bcast_plan *p) {
  uint64_t h = 1469598103934665603ull ^ p->nbuckets;
  for (size_t i = 0; i < p->nbuckets; i++) {
    h = (h ^ p->buckets[i].bytes) * 1099511628211ull;
    h = (h ^ p->buckets[i].source_rank) * 1099511628211ull;
  }
  return h ? h : 1;
}

/* Broadcast alone: the same buckets, back to back, from the staging ring with
 * nothing to copy or cast. Every rank runs it at the same point of the same
 * plan, so the collectives match. Two passes; the second (warm) counts. */
static int calibrate(exec_ctx *x, bcast_err *err) {
  bcast_gpu *g = x->g;
  uint64_t sig = layout_sig(x->p);
  if (g->calib_sig == sig) return BCAST_OK;
  cudaEvent_t a = NULL, z = NULL;
  int rc = BCAST_OK;
  if (cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&z) != cudaSuccess) {
    rc = bcast__fail(err, BCAST_ECUDA, "calibration: cudaEventCreate failed");
    goto out;
  }
  for (int pass = 0; pass < 2 && !rc; pass++) {
    if (cudaEventRecord(a, g->s_comm) != cudaSuccess) {
      rc = bcast__fail(err, BCAST_ECUDA, "calibration: event record failed");
      break;
    }
    for (uint32_t k = 0; k < x->p->nbuckets && !rc; k++) {
      const bcast_bucket *b = &x->p->buckets[k];
      void *buf = g->wire[k % g->nslots];
      rc = ncclwrap(x, buf, buf, b->bytes, b->source_rank, k, err);
    }
    if (rc) break;
    cudaEventRecord(z, g->s_comm);
    rc = wait_event(x, z, "broadcast-alone calibration", (uint32_t)x->p->nbuckets - 1, err);
  }
  if (!rc) {
    float ms = 0;
    cudaEventElapsedTime(&ms, a, z);
    g->calib_s = ms / 1e3;
    g->calib_sig = sig;
  }
out:
  if (a) cudaEventDestroy(a);
  if (z) cudaEventDestroy(z);
  return rc;
}

static float elapsed(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return ms;
}

static int fill_stats(exec_ctx *x, double total, bcast_stats *st, bcast_err *err) {
  const bcast_plan *p = x->p;
  st->mode = p->mode;
  st->transport = "nccl";
  st->pcie_bytes = x->pcie_bytes;
  st->wire_bytes = bcast_plan_wire_bytes(p);
  st->h2d_s = st->cast_s = st->wire_s = 0;
  st->nbuckets = (uint32_t)p->nbuckets;
  st->buckets = calloc(p->nbuckets ? p->nbuckets : 1, sizeof *st->buckets);
  if (!st->buckets) return bcast__fail(err, BCAST_ENOMEM, "stats: no memory");
  for (size_t k = 0; k < p->nbuckets; k++) {
    bucket_ev *e = &x->ev[k];
    bcast_bucket_timing *bt = &st->buckets[k];
    bt->bucket = (uint32_t)k;
    bt->h2d_s = elapsed(e->h2d0, e->h2d1) / 1e3;
    bt->cast_s = elapsed(e->cast0, e->cast1) / 1e3;
    bt->wire_s = elapsed(e->wire0, e->wire1) / 1e3;
    st->h2d_s += bt->h2d_s;
    st->cast_s += bt->cast_s;
    st->wire_s += bt->wire_s;
  }
  st->total_s = total;
  st->wire_alone_s = x->g->calib_s;
  st->exposed_measured = 1;
  st->exposed_s = bcast__exposed_s(total, st->wire_alone_s);
  st->gbps = total > 0 ? (double)st->wire_bytes / total / 1e9 : 0;
  return BCAST_OK;
}

static int prepare(exec_ctx *x, const bcast_tensor *local, size_t n, bcast_err *err) {
  const bcast_plan *p = x->p;
  bcast_gpu *g = x->g;
  int rc = map_local(x, local, n, err);
  if (rc) return rc;
  size_t wire_need = 0, raw_need = 0, bounce_need = 0;
  for (size_t k = 0; k < p->nbuckets; k++) {
    const bcast_bucket *b = &p->buckets[k];
    int sender = b->source_rank == x->rank;
    size_t raw = 0;
    if (b->bytes > wire_need) wire_need = b->bytes;
    for (size_t i = 0; i < b->nslices; i++) {
      const bcast_slice *s = &b->slices[i];
      if (s->tensor >= p->ntensors)
        return bcast__fail(err, BCAST_EINVAL, "bucket %zu: slice names tensor %u of %zu", k,
                           s->tensor, p->ntensors);
      if ((rc = check_tensor(x, s->tensor, sender, err))) return rc;
      uint8_t at = x->access[s->tensor];
      if (sender && at != AT_DEVICE) raw += (slice_src_bytes(x, s) + 255) & ~(size_t)255;
      if (at == AT_HOST_BOUNCE && b->bytes > bounce_need) bounce_need = b->bytes;
    }
    if (raw > raw_need) raw_need = raw;
    if (sender && raw > bounce_need) bounce_need = raw; /* only used when bouncing */
  }
  int any_bounce = 0;
  for (size_t i = 0; i < p->ntensors; i++) any_bounce |= x->access[i] == AT_HOST_BOUNCE;
  if ((rc = bcast__gpu_grow(g, g->wire, &g->wire_cap, wire_need, 0, "wire buckets", err))) return rc;
  if (raw_need && (rc = bcast__gpu_grow(g, g->raw, &g->raw_cap, raw_need, 0, "staging buffers", err)))
    return rc;
  if (any_bounce &&
      (rc = bcast__gpu_grow(g, g->bounce, &g->bounce_cap, bounce_need, 1, "pinned bounce buffers", err)))
    return rc;
  return BCAST_OK;
}

int bcast__gpu_execute(bcast_gpu *g, const bcast_plan *p, uint32_t rank, const bcast_tensor *local,
                       size_t n, int cancel_fd, bcast_stats *stats, bcast_err *err) {
  if (!g || !p || (!local && n))
    return bcast__fail(err, BCAST_EINVAL, "gpu execute: NULL argument");
  if (p->mode != BCAST_MODE_DIRECT && p->mode != BCAST_MODE_STAGED)
    return bcast__fail(err, BCAST_EINVAL, "gpu execute: plan mode %s is not direct or staged",
                       bcast_mode_name(p->mode));
  if (!p->has_nccl_id)
    return bcast__fail(err, BCAST_EINVAL, "plan %s: no nccl_id (the root makes it)", p->id);
  if (p->world_size < 1 || rank >= p->world_size)
    return bcast__fail(err, BCAST_EINVAL, "plan %s: rank %u outside world of %u", p->id, rank,
                       p->world_size);
  cudaError_t ce = cudaSetDevice(g->device);
  if (ce != cudaSuccess)
    return CUDA_FAIL(err, ce, "cudaSetDevice(%d): %s", g->device, cudaGetErrorString(ce));
  exec_ctx x = {.g = g, .p = p, .rank = rank};
  g->cancel_fd = cancel_fd;
  x.deadline_s = deadline_from(g->timeout_s, p->deadline_unix_ms);
  x.loc = calloc(p->ntensors ? p->ntensors : 1, sizeof *x.loc);
  x.access = calloc(p->ntensors ? p->ntensors : 1, 1);
  int rc = BCAST_OK;
  if (!x.loc || !x.access) {
    rc = bcast__fail(err, BCAST_ENOMEM, "gpu execute: no memory");
    goto out;
  }
  if ((rc = prepare(&x, local, n, err))) goto out;
#ifdef RLORCH_HAVE_NCCL
  if ((rc = comm_ensure(g, p, rank, err))) goto out;
#else
  rc = bcast__fail(err, BCAST_ENOTSUP, "built without NCCL: direct and staged unavailable");
  goto out;
#endif
  if ((rc = bcast__gpu_ev_ensure(g, p->nbuckets, err))) goto out;
  x.ev = g->ev;
  x.deadline_s = deadline_from(g->timeout_s, p->deadline_unix_ms);
  double t0 = bcast__now(); /* the broadcast proper: set-up above is not counted */
  for (uint32_t k = 0; k < p->nbuckets && !rc; k++)
    rc = p->buckets[k].source_rank == rank ? enqueue_send(&x, k, err) : enqueue_recv(&x, k, err);
  /* Completion, bucket by bucket: each finished bucket re-arms the stall deadline. */
  for (uint32_t k = 0; k < p->nbuckets && !rc; k++) {
    int send = p->buckets[k].source_rank == rank;
    rc = wait_event(&x, send ? x.ev[k].wire1 : x.ev[k].cast1,
                    send ? "broadcast to the receivers" : "broadcast from the sender", k, err);
    if (!rc) {
      double again = deadline_from(g->timeout_s, p->deadline_unix_ms);
      if (again > x.deadline_s) x.deadline_s = again;
    }
  }
  double total = bcast__now() - t0;
  if (!rc) rc = calibrate(&x, err);
  if (!rc && stats) rc = fill_stats(&x, total, stats, err);
out:
  /* Whatever happened, nothing may still be using the buffers or events. */
  cudaStreamSynchronize(g->s_copy);
  cudaStreamSynchronize(g->s_cast);
  cudaStreamSynchronize(g->s_comm);
  (void)cudaGetLastError();
  g->cancel_fd = -1;
  free(x.loc);
  free(x.access);
  return rc;
}

#endif /* RLORCH_HAVE_CUDA */
