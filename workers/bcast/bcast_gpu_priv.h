/* The GPU backend's state, shared by its two executors: bcast_gpu.c (direct
 * and staged, over NCCL) and bcast_coloc.c (colocated, through CUDA IPC).
 * CUDA builds only; not part of the public surface. */
#ifndef RLORCH_BCAST_GPU_PRIV_H
#define RLORCH_BCAST_GPU_PRIV_H

#include <cuda_runtime_api.h>
#ifdef RLORCH_HAVE_NCCL
#include <nccl.h>
#endif

#include "workers/bcast/bcast_internal.h"

typedef struct gpu_reg {
  void *ptr;
  size_t bytes;
} gpu_reg;

typedef struct bucket_ev {
  cudaEvent_t h2d0, h2d1, cast0, cast1, wire0, wire1;
} bucket_ev;

struct bcast_gpu {
  int device;
  uint32_t rank;
  uint32_t nslots;
  double timeout_s;
  int cancel_fd; /* during an execution: readable once the orchestrator aborted it; else -1 */
  cudaStream_t s_copy, s_cast, s_comm;
  void **wire;   /* nslots device buffers of wire_cap bytes */
  void **raw;    /* nslots device buffers of raw_cap bytes (sender staging) */
  void **bounce; /* nslots pinned host buffers of bounce_cap bytes, on demand */
  size_t wire_cap, raw_cap, bounce_cap;
  gpu_reg *regs; /* pageable ranges registered once, kept until close */
  size_t nregs, capregs;
#ifdef RLORCH_HAVE_NCCL
  ncclComm_t comm;
  uint8_t comm_id[128];
  uint32_t comm_world, comm_rank;
#endif
  bucket_ev *ev; /* per-bucket timing events, kept across steps (creation is not free) */
  size_t nev;
  uint64_t calib_sig; /* plan bucket layout the broadcast-alone time belongs to */
  double calib_s;
};

/* How one local tensor is reached. */
enum { AT_DEVICE = 1, AT_HOST_DMA = 2, AT_HOST_BOUNCE = 3 };

#define CUDA_FAIL(err, ce, ...)                                                                  \
  bcast__fail(err, (ce) == cudaErrorMemoryAllocation ? BCAST_ENOMEM : BCAST_ECUDA, __VA_ARGS__)

/* Pinned, registered before, or registered now (kept until close): AT_HOST_DMA;
 * registration refused (limits, overlap): AT_HOST_BOUNCE. */
int bcast__gpu_host_access(bcast_gpu *g, void *ptr, size_t bytes);
/* Grows the nslots buffers of `bufs` (device, or pinned host when `host`) to
 * at least `need` bytes each; what names them in the error. */
int bcast__gpu_grow(bcast_gpu *g, void **bufs, size_t *cap, size_t need, int host,
                    const char *what, bcast_err *err);
/* At least n per-bucket event sets in g->ev. */
int bcast__gpu_ev_ensure(bcast_gpu *g, size_t n, bcast_err *err);

#endif
