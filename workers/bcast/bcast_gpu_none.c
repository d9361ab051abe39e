/* GPU backend stubs for builds without CUDA: direct and staged modes report
 * BCAST_ENOTSUP so callers can fall back to the host transport. */
#ifndef RLORCH_HAVE_CUDA

#include <stddef.h>

#include "workers/bcast/bcast_internal.h"

int bcast__gpu_open(const bcast_engine_opts *o, bcast_gpu **out, bcast_err *err) {
  (void)o;
  if (out) *out = NULL;
  return bcast__fail(err, BCAST_ENOTSUP, "built without CUDA: direct and staged modes unavailable");
}

void bcast__gpu_close(bcast_gpu *g) { (void)g; }

int bcast__gpu_copy(bcast_gpu *g, void *dst, const void *src, size_t bytes, int to_device,
                    bcast_err *err) {
  (void)g, (void)dst, (void)src, (void)bytes, (void)to_device;
  return bcast__fail(err, BCAST_ENOTSUP, "built without CUDA: no device copies");
}

int bcast__gpu_nccl_id(bcast_gpu *g, uint8_t id[128], bcast_err *err) {
  (void)g;
  (void)id;
  return bcast__fail(err, BCAST_ENOTSUP, "built without CUDA: no NCCL id");
}

int bcast__gpu_execute(bcast_gpu *g, const bcast_plan *p, uint32_t rank, const bcast_tensor *local,
                       size_t n, int cancel_fd, bcast_stats *stats, bcast_err *err) {
  (void)cancel_fd;
  (void)g;
  (void)p;
  (void)rank;
  (void)local;
  (void)n;
  (void)stats;
  return bcast__fail(err, BCAST_ENOTSUP, "built without CUDA: direct and staged modes unavailable");
}

#endif /* !RLORCH_HAVE_CUDA */
