/* Floors: the host-to-device bandwidth and the broadcast-alone time of the
 * hardware, measured without the engine, for benchmarks that report the
 * engine's step against them (see bcast.h). */
#include <stdlib.h>
#include <string.h>

#include "workers/bcast/bcast_internal.h"

#ifdef RLORCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef RLORCH_HAVE_NCCL
#include <nccl.h>
#endif

/* A bound on reps keeps the sample arrays small; benchmarks use a handful. */
#define FLOOR_MAX_REPS 10000

static int floor__check(int reps, const void *out, uint64_t bytes, const char *what, bcast_err *err) {
  if (!out) return bcast__fail(err, BCAST_EINVAL, "%s: NULL result pointer", what);
  if (bytes == 0) return bcast__fail(err, BCAST_EINVAL, "%s: bytes must be > 0", what);
  if (reps < 1 || reps > FLOOR_MAX_REPS)
    return bcast__fail(err, BCAST_EINVAL, "%s: reps %d outside 1..%d", what, reps, FLOOR_MAX_REPS);
  return BCAST_OK;
}

#ifdef RLORCH_HAVE_CUDA
/* The devices must exist; a machine without a driver has none (not an error of the caller). */
static int floor__devices(const int *dev, int ndev, const char *what, bcast_err *err) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return bcast__fail(err, BCAST_ENOTSUP, "%s: no CUDA device visible", what);
  }
  for (int i = 0; i < ndev; i++)
    if (dev[i] >= count)
      return bcast__fail(err, BCAST_EINVAL, "%s: device %d: %d CUDA device(s) visible", what, dev[i], count);
  return BCAST_OK;
}

#define FLOOR_CK(x, what)                                                                          \
  do {                                                                                             \
    cudaError_t ce_ = (x);                                                                         \
    if (ce_ != cudaSuccess) {                                                                      \
      rc = bcast__fail(err, ce_ == cudaErrorMemoryAllocation ? BCAST_ENOMEM : BCAST_ECUDA,         \
                       "%s: %s: %s", what, #x, cudaGetErrorString(ce_));                           \
      (void)cudaGetLastError();                                                                    \
      goto out;                                                                                    \
    }                                                                                              \
  } while (0)
#endif

#ifdef RLORCH_HAVE_CUDA
/* The best of `reps` timed copies of `bytes` from src to dst after one
 * warm-up, in GB/s one way, on the current device's default stream. */
static int floor__time_copy(void *dst, const void *src, uint64_t bytes, enum cudaMemcpyKind kind,
                            int reps, const char *what, double *gbps, bcast_err *err) {
  int rc = 0;
  cudaEvent_t a = NULL, z = NULL;
  double best = 0;
  FLOOR_CK(cudaEventCreate(&a), what);
  FLOOR_CK(cudaEventCreate(&z), what);
  for (int i = 0; i <= reps; i++) { /* i == 0: warm-up */
    FLOOR_CK(cudaEventRecord(a, 0), what);
    FLOOR_CK(cudaMemcpyAsync(dst, src, (size_t)bytes, kind, 0), what);
    FLOOR_CK(cudaEventRecord(z, 0), what);
    FLOOR_CK(cudaEventSynchronize(z), what);
    float ms = 0;
    FLOOR_CK(cudaEventElapsedTime(&ms, a, z), what);
    double g = ms > 0 ? (double)bytes / (ms / 1e3) / 1e9 : 0;
    if (i > 0 && g > best) best = g;
  }
  *gbps = best;
out:
  if (a) cudaEventDestroy(a);
  if (z) cudaEventDestroy(z);
  return rc;
}
#endif

int bcast_floor_h2d(int device, uint64_t bytes, int reps, double *gbps, bcast_err *err) {
  static const char what[] = "host-to-device floor";
  int rc = floor__check(reps, gbps, bytes, what, err);
  if (rc) return rc;
  *gbps = 0;
  if (device < 0) return bcast__fail(err, BCAST_EINVAL, "%s: device %d is negative", what, device);
#ifndef RLORCH_HAVE_CUDA
  return bcast__fail(err, BCAST_ENOTSUP, "%s: built without CUDA", what);
#else
  if ((rc = floor__devices(&device, 1, what, err))) return rc;
  int prev = 0;
  void *h = NULL, *d = NULL;
  (void)cudaGetDevice(&prev);
  FLOOR_CK(cudaSetDevice(device), what);
  FLOOR_CK(cudaHostAlloc(&h, (size_t)bytes, cudaHostAllocDefault), what);
  FLOOR_CK(cudaMalloc(&d, (size_t)bytes), what);
  /* Touch every page so the first timed copy does not pay for faulting it in. */
  memset(h, 1, (size_t)bytes);
  rc = floor__time_copy(d, h, bytes, cudaMemcpyHostToDevice, reps, what, gbps, err);
out:
  if (d) cudaFree(d);
  if (h) cudaFreeHost(h);
  (void)cudaSetDevice(prev);
  return rc;
#endif
}

int bcast_floor_d2d(int device, uint64_t bytes, int reps, double *gbps, bcast_err *err) {
  static const char what[] = "device-to-device floor";
  int rc = floor__check(reps, gbps, bytes, what, err);
  if (rc) return rc;
  *gbps = 0;
  if (device < 0) return bcast__fail(err, BCAST_EINVAL, "%s: device %d is negative", what, device);
#ifndef RLORCH_HAVE_CUDA
  return bcast__fail(err, BCAST_ENOTSUP, "%s: built without CUDA", what);
#else
  if ((rc = floor__devices(&device, 1, what, err))) return rc;
  int prev = 0;
  void *s = NULL, *d = NULL;
  (void)cudaGetDevice(&prev);
  FLOOR_CK(cudaSetDevice(device), what);
  FLOOR_CK(cudaMalloc(&s, (size_t)bytes), what);
  FLOOR_CK(cudaMalloc(&d, (size_t)bytes), what);
  FLOOR_CK(cudaMemset(s, 1, (size_t)bytes), what);
  rc = floor__time_copy(d, s, bytes, cudaMemcpyDeviceToDevice, reps, what, gbps, err);
out:
  if (d) cudaFree(d);
  if (s) cudaFree(s);
  (void)cudaSetDevice(prev);
  return rc;
#endif
}

static int floor__cmp(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

int bcast_floor_broadcast(const int *devices, int ndev, uint64_t bytes, int reps, double *seconds,
                          bcast_err *err) {
  static const char what[] = "broadcast floor";
  int rc = floor__check(reps, seconds, bytes, what, err);
  if (rc) return rc;
  *seconds = 0;
  if (!devices || ndev < 1)
    return bcast__fail(err, BCAST_EINVAL, "%s: needs at least one device (ndev %d)", what, ndev);
  for (int i = 0; i < ndev; i++) {
    if (devices[i] < 0) return bcast__fail(err, BCAST_EINVAL, "%s: devices[%d] = %d is negative", what, i, devices[i]);
    for (int j = 0; j < i; j++)
      if (devices[j] == devices[i])
        return bcast__fail(err, BCAST_EINVAL, "%s: devices[%d] = %d repeats devices[%d]; NCCL needs one "
                           "device per rank", what, i, devices[i], j);
  }
#ifndef RLORCH_HAVE_CUDA
  (void)floor__cmp;
  return bcast__fail(err, BCAST_ENOTSUP, "%s: built without CUDA", what);
#elif !defined(RLORCH_HAVE_NCCL)
  (void)floor__cmp;
  return bcast__fail(err, BCAST_ENOTSUP, "%s: built without NCCL", what);
#else
  if ((rc = floor__devices(devices, ndev, what, err))) return rc;
  int prev = 0, ncomms = 0;
  ncclResult_t nr = ncclSuccess;
  (void)cudaGetDevice(&prev);
  ncclComm_t *comms = calloc((size_t)ndev, sizeof *comms);
  void **buf = calloc((size_t)ndev, sizeof *buf);
  cudaStream_t *st = calloc((size_t)ndev, sizeof *st);
  double *v = calloc((size_t)reps, sizeof *v);
  if (!comms || !buf || !st || !v) {
    rc = bcast__fail(err, BCAST_ENOMEM, "%s: out of memory", what);
    goto out;
  }
  nr = ncclCommInitAll(comms, ndev, devices);
  if (nr != ncclSuccess) {
    rc = bcast__fail(err, BCAST_ENCCL, "%s: ncclCommInitAll over %d devices: %s", what, ndev,
                     ncclGetErrorString(nr));
    goto out;
  }
  ncomms = ndev;
  for (int i = 0; i < ndev; i++) {
    FLOOR_CK(cudaSetDevice(devices[i]), what);
    FLOOR_CK(cudaMalloc(&buf[i], (size_t)bytes), what);
    FLOOR_CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking), what);
  }
  for (int r = -1; r < reps; r++) { /* r == -1: warm-up */
    for (int i = 0; i < ndev; i++) {
      FLOOR_CK(cudaSetDevice(devices[i]), what);
      FLOOR_CK(cudaStreamSynchronize(st[i]), what);
    }
    double t0 = bcast__now();
    nr = ncclGroupStart();
    for (int i = 0; i < ndev && nr == ncclSuccess; i++)
      nr = ncclBroadcast(buf[i], buf[i], (size_t)bytes, ncclUint8, 0, comms[i], st[i]);
    ncclResult_t ge = ncclGroupEnd();
    if (nr == ncclSuccess) nr = ge;
    if (nr != ncclSuccess) {
      rc = bcast__fail(err, BCAST_ENCCL, "%s: ncclBroadcast of %llu bytes: %s", what,
                       (unsigned long long)bytes, ncclGetErrorString(nr));
      goto out;
    }
    for (int i = 0; i < ndev; i++) {
      FLOOR_CK(cudaSetDevice(devices[i]), what);
      FLOOR_CK(cudaStreamSynchronize(st[i]), what);
    }
    if (r >= 0) v[r] = bcast__now() - t0;
  }
  qsort(v, (size_t)reps, sizeof *v, floor__cmp);
  *seconds = reps % 2 ? v[reps / 2] : (v[reps / 2 - 1] + v[reps / 2]) / 2;
out:
  for (int i = 0; st && buf && i < ndev; i++) {
    (void)cudaSetDevice(devices[i]);
    if (buf[i]) cudaFree(buf[i]);
    if (st[i]) cudaStreamDestroy(st[i]);
  }
  /* After a failed collective the communicators may wait on each other: abort them. */
  for (int i = 0; i < ncomms; i++) {
    if (rc) ncclCommAbort(comms[i]);
    else ncclCommDestroy(comms[i]);
  }
  free(comms);
  free(buf);
  free(st);
  free(v);
  (void)cudaGetLastError();
  (void)cudaSetDevice(prev);
  return rc;
#endif
}
