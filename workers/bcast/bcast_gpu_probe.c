/* Run-time discovery of CUDA devices and NCCL. A machine without a driver is a
 * machine with zero devices, not an error. */
#include <stdio.h>
#include <string.h>

#include "workers/bcast/bcast_internal.h"

#ifdef RLORCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef RLORCH_HAVE_NCCL
#include <nccl.h>
#endif

int bcast__gpu_uuid(int device, char *out, size_t len) {
  if (out && len) out[0] = '\0';
#ifdef RLORCH_HAVE_CUDA
  if (!out || len < 41) return BCAST_EINVAL;
  struct cudaDeviceProp prop;
  cudaError_t ce = cudaGetDeviceProperties(&prop, device);
  if (ce != cudaSuccess) {
    (void)cudaGetLastError();
    return BCAST_ECUDA;
  }
  const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
  snprintf(out, len,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
           u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  return BCAST_OK;
#else
  (void)device;
  return BCAST_ENOTSUP;
#endif
}

void bcast__gpu_probe(bcast_caps *c) {
#ifdef RLORCH_HAVE_CUDA
  c->cuda_built = 1;
  int rt = 0, drv = 0, count = 0;
  if (cudaRuntimeGetVersion(&rt) == cudaSuccess)
    snprintf(c->cuda_version, sizeof c->cuda_version, "%d.%d", rt / 1000, (rt % 1000) / 10);
  if (cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0)
    snprintf(c->driver_version, sizeof c->driver_version, "%d.%d", drv / 1000, (drv % 1000) / 10);
  /* Without a driver the call fails and leaves count untouched: zero devices. */
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    count = 0;
    (void)cudaGetLastError();
    snprintf(c->note, sizeof c->note, "no CUDA driver or device: host transport only");
  }
  c->cuda_devices = count;
  if (count > 0) {
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
      snprintf(c->gpu_name, sizeof c->gpu_name, "%.127s", prop.name);
    bcast__gpu_uuid(0, c->gpu_uuid, sizeof c->gpu_uuid);
  }
#else
  snprintf(c->note, sizeof c->note, "built without CUDA: host transport only");
#endif
#ifdef RLORCH_HAVE_NCCL
  c->nccl_built = 1;
  int v = 0;
  if (ncclGetVersion(&v) == ncclSuccess && v > 0)
    snprintf(c->nccl_version, sizeof c->nccl_version, "%d.%d.%d", v / 10000, (v / 100) % 100,
             v % 100);
#else
  if (c->cuda_built && !c->note[0])
    snprintf(c->note, sizeof c->note, "built without NCCL: direct and staged unavailable");
#endif
}
