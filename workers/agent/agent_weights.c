/* Streaming XXH3-64 over the wire-dtype cast of a tensor list. */
#include "workers/agent/agent_weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <xxhash.h>

#ifdef RLORCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* Elements per chunk: 1 Mi keeps the bounce and cast buffers small (4 + 2 MiB
 * for fp32 -> bf16) and each XXH3 update long enough to run at full speed. */
#define AGENT__CHUNK_ELEMS (UINT64_C(1) << 20)

typedef struct agent__hasher {
  XXH3_state_t *xx;
  void *bounce;   /* source-dtype chunk copied back from a GPU */
  int bounce_pinned;
  void *wire;     /* wire-dtype chunk */
} agent__hasher;

static void agent__hasher_free(agent__hasher *h) {
  if (h->xx) XXH3_freeState(h->xx);
#ifdef RLORCH_HAVE_CUDA
  if (h->bounce_pinned) {
    cudaFreeHost(h->bounce);
    h->bounce = NULL;
  }
#endif
  free(h->bounce);
  free(h->wire);
}

/* Copies a chunk of a GPU tensor to host memory; -1 with a message on failure. */
static int agent__fetch(agent__hasher *h, const bcast_tensor *t, const void *src, size_t bytes,
                        char *err, size_t errlen) {
#ifdef RLORCH_HAVE_CUDA
  if (!h->bounce) {
    size_t cap = (size_t)AGENT__CHUNK_ELEMS * 4;
    if (cudaMallocHost(&h->bounce, cap) == cudaSuccess) {
      h->bounce_pinned = 1;
    } else {
      cudaGetLastError();
      h->bounce = malloc(cap);
    }
    if (!h->bounce) {
      snprintf(err, errlen, "checksum: no memory for a bounce buffer");
      return -1;
    }
  }
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(t->device);
  cudaError_t e = cudaMemcpy(h->bounce, src, bytes, cudaMemcpyDeviceToHost);
  cudaSetDevice(prev);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "checksum: tensor %s: copy from GPU %d: %s", t->name, t->device,
             cudaGetErrorString(e));
    return -1;
  }
  return 0;
#else
  (void)h, (void)src, (void)bytes;
  snprintf(err, errlen, "checksum: tensor %s is on a GPU but this build has no CUDA", t->name);
  return -1;
#endif
}

static int agent__hash_tensor(agent__hasher *h, const bcast_tensor *t, agent_weights_src src,
                              char *err, size_t errlen) {
  bcast_dtype sd = src == AGENT_WEIGHTS_STORAGE ? t->storage_dtype : t->wire_dtype;
  size_t ss = bcast_dtype_size(sd), ws = bcast_dtype_size(t->wire_dtype);
  if (!ss || !ws || !bcast_cast_supported(sd, t->wire_dtype)) {
    snprintf(err, errlen, "checksum: tensor %s: no cast from %s to %s", t->name,
             bcast_dtype_name(sd), bcast_dtype_name(t->wire_dtype));
    return -1;
  }
  uint64_t elems = bcast_tensor_elems(t);
  if (elems && !t->data) {
    snprintf(err, errlen, "checksum: tensor %s has no data", t->name);
    return -1;
  }
  for (uint64_t off = 0; off < elems; off += AGENT__CHUNK_ELEMS) {
    size_t k = (size_t)(elems - off < AGENT__CHUNK_ELEMS ? elems - off : AGENT__CHUNK_ELEMS);
    const void *chunk = (const char *)t->data + off * ss;
    if (t->residency == BCAST_RES_GPU) {
      if (agent__fetch(h, t, chunk, k * ss, err, errlen)) return -1;
      chunk = h->bounce;
    }
    const void *bytes = chunk;
    if (sd != t->wire_dtype) {
      int rc = bcast_cast_cpu(h->wire, t->wire_dtype, chunk, sd, k);
      if (rc) {
        snprintf(err, errlen, "checksum: tensor %s: cast: %s", t->name, bcast_strerror(rc));
        return -1;
      }
      bytes = h->wire;
    }
    if (XXH3_64bits_update(h->xx, bytes, k * ws) != XXH_OK) {
      snprintf(err, errlen, "checksum: tensor %s: hash update failed", t->name);
      return -1;
    }
  }
  return 0;
}

int agent_weights_checksum(const bcast_tensor *t, size_t n, agent_weights_src src,
                           uint64_t *out, char *err, size_t errlen) {
  if (src != AGENT_WEIGHTS_STORAGE && src != AGENT_WEIGHTS_WIRE) {
    snprintf(err, errlen, "checksum: unknown source kind %d", (int)src);
    return -1;
  }
  if (n && !t) {
    snprintf(err, errlen, "checksum: no tensors");
    return -1;
  }
  agent__hasher h = {XXH3_createState(), NULL, 0, malloc((size_t)AGENT__CHUNK_ELEMS * 8)};
  if (!h.xx || !h.wire || XXH3_64bits_reset(h.xx) != XXH_OK) {
    agent__hasher_free(&h);
    snprintf(err, errlen, "checksum: no memory");
    return -1;
  }
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) rc = agent__hash_tensor(&h, &t[i], src, err, errlen);
  if (!rc) *out = XXH3_64bits_digest(h.xx);
  agent__hasher_free(&h);
  return rc;
}
