/* Streaming XXH3-64 over the wire-dtype cast of a tensor list. */
#include "workers/agent/agent_weights.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
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

/* Digest of elements [off, off + n) of tensor t: XXH3-64 of their wire bytes. */
static int agent__hash_segment(agent__hasher *h, const bcast_tensor *t, agent_weights_src src,
                               uint64_t off, uint64_t n, uint64_t *digest, char *err,
                               size_t errlen) {
  bcast_dtype sd = src == AGENT_WEIGHTS_STORAGE ? t->storage_dtype : t->wire_dtype;
  size_t ss = bcast_dtype_size(sd), ws = bcast_dtype_size(t->wire_dtype);
  if (XXH3_64bits_reset(h->xx) != XXH_OK) {
    snprintf(err, errlen, "checksum: tensor %s: hash reset failed", t->name);
    return -1;
  }
  for (uint64_t end = off + n; off < end; off += AGENT__CHUNK_ELEMS) {
    size_t k = (size_t)(end - off < AGENT__CHUNK_ELEMS ? end - off : AGENT__CHUNK_ELEMS);
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
  *digest = XXH3_64bits_digest(h->xx);
  return 0;
}

static int agent__check_tensor(const bcast_tensor *t, agent_weights_src src, char *err,
                               size_t errlen) {
  bcast_dtype sd = src == AGENT_WEIGHTS_STORAGE ? t->storage_dtype : t->wire_dtype;
  if (!bcast_dtype_size(sd) || !bcast_dtype_size(t->wire_dtype) ||
      !bcast_cast_supported(sd, t->wire_dtype)) {
    snprintf(err, errlen, "checksum: tensor %s: no cast from %s to %s", t->name,
             bcast_dtype_name(sd), bcast_dtype_name(t->wire_dtype));
    return -1;
  }
  if (bcast_tensor_held(t) && !t->data) {
    snprintf(err, errlen, "checksum: tensor %s has no data", t->name);
    return -1;
  }
  return 0;
}

typedef struct agent__seg {
  uint32_t tensor;
  uint64_t off, n;
} agent__seg;

typedef struct agent__job {
  const bcast_tensor *t;
  agent_weights_src src;
  const agent__seg *segs;
  uint64_t *digests;
  size_t nsegs;
  size_t next;      /* next segment to take, under mu */
  int failed;       /* first failure wins, under mu */
  char err[512];
  pthread_mutex_t mu;
} agent__job;

static void *agent__worker(void *arg) {
  agent__job *j = arg;
  agent__hasher h = {XXH3_createState(), NULL, 0, malloc((size_t)AGENT__CHUNK_ELEMS * 8)};
  char err[512] = "";
  int bad = !h.xx || !h.wire;
  if (bad) snprintf(err, sizeof err, "checksum: no memory");
  while (!bad) {
    pthread_mutex_lock(&j->mu);
    size_t i = j->failed ? j->nsegs : j->next++;
    pthread_mutex_unlock(&j->mu);
    if (i >= j->nsegs) break;
    const agent__seg *s = &j->segs[i];
    bad = agent__hash_segment(&h, &j->t[s->tensor], j->src, s->off, s->n, &j->digests[i], err,
                              sizeof err) != 0;
  }
  if (bad) {
    pthread_mutex_lock(&j->mu);
    if (!j->failed) snprintf(j->err, sizeof j->err, "%s", err);
    j->failed = 1;
    pthread_mutex_unlock(&j->mu);
  }
  agent__hasher_free(&h);
  return NULL;
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
  size_t nsegs = 0;
  for (size_t i = 0; i < n; i++) {
    if (agent__check_tensor(&t[i], src, err, errlen)) return -1;
    nsegs += (size_t)((bcast_tensor_held(&t[i]) + AGENT_WEIGHTS_SEGMENT_ELEMS - 1) /
                      AGENT_WEIGHTS_SEGMENT_ELEMS);
  }
  agent__job j = {.t = t, .src = src, .nsegs = nsegs};
  agent__seg *segs = calloc(nsegs ? nsegs : 1, sizeof *segs);
  j.digests = calloc(nsegs ? nsegs : 1, sizeof *j.digests);
  if (!segs || !j.digests) {
    free(segs);
    free(j.digests);
    snprintf(err, errlen, "checksum: no memory");
    return -1;
  }
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    for (uint64_t off = 0, e = bcast_tensor_held(&t[i]); off < e;
         off += AGENT_WEIGHTS_SEGMENT_ELEMS, k++)
      segs[k] = (agent__seg){(uint32_t)i, off,
                             e - off < AGENT_WEIGHTS_SEGMENT_ELEMS ? e - off
                                                                   : AGENT_WEIGHTS_SEGMENT_ELEMS};
  j.segs = segs;
  pthread_mutex_init(&j.mu, NULL);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  size_t nth = cpus > 1 ? (size_t)cpus : 1;
  if (nth > 16) nth = 16;
  if (nth > nsegs) nth = nsegs ? nsegs : 1;
  pthread_t th[16];
  size_t started = 0;
  for (size_t i = 1; i < nth; i++)
    if (pthread_create(&th[started], NULL, agent__worker, &j) == 0) started++;
  agent__worker(&j); /* this thread works too */
  for (size_t i = 0; i < started; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&j.mu);
  int rc = 0;
  if (j.failed) {
    snprintf(err, errlen, "%s", j.err);
    rc = -1;
  } else {
    *out = XXH3_64bits(j.digests, nsegs * sizeof *j.digests);
  }
  free(segs);
  free(j.digests);
  return rc;
}
