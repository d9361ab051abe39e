/* Colocated mode: receivers on the sender's GPU, written through CUDA IPC.
 *
 * A receiver exports, once per layout, where its wire-dtype tensors live: the
 * CUDA IPC handle of every allocation that holds one (a handle names a whole
 * allocation, so each tensor is an allocation and an offset in it) and one
 * done word per source rank of the plan. The export travels through the control plane (the
 * receiver's PlanAck, then the sender's trigger), so nothing is mapped or
 * written before every participant acked the plan. The sender maps each
 * allocation once and keeps the mapping while that receiver's export stays
 * the same; its copies and cast kernels write straight into receiver memory,
 * bucket by bucket, with the staged mode's pipeline:
 *   copy stream: host slices -> staging ring (or, already in the wire dtype,
 *                straight into the first receiver)
 *   cast stream: cast into the first receiver; device copies to the others
 * A slot of the ring is refilled only after the cast that read it nslots
 * buckets earlier finished (CUDA events), so the copy of bucket k+1 overlaps
 * the cast of bucket k.
 *
 * Several sources (a sharded trainer, every rank on this GPU): each source is
 * an engine of its own that imports every receiver's export, binds only the
 * tensors its buckets carry (whole or shards), and stages, casts and writes
 * only its own buckets' slices, all sources at once; the slices of different
 * sources are disjoint (the plan tiles every tensor), so their writes never
 * meet. One source is the case S = 1, the root writing every bucket.
 *
 * Ordering, the one rule: a source waits on the host until both its streams
 * drained (every write of its buckets into every receiver done), then writes
 * its own done word in each receiver (word s for source s, holding a token
 * made of the plan hash and s, so that neither another source's word nor a
 * word left from another plan can pass for it) and waits for that too; a
 * receiver's execute returns only once all S words hold their tokens. So a
 * receiver is told the version is complete only after every write of every
 * source finished, and its BroadcastDone (and checksum) follow from there.
 *
 * Receivers in the sender's own process (a benchmark, an embedding program)
 * are recognised by a per-process nonce in the export: their pointers are
 * used as they are, since CUDA refuses to open a process's own IPC handles. */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "workers/bcast/bcast_internal.h"

#ifdef RLORCH_HAVE_CUDA
#include <cuda.h>

#include "workers/bcast/bcast_gpu.cuh"
#include "workers/bcast/bcast_gpu_priv.h"

/* ---- the export's format: little-endian, versioned ------------------------------- */

#define COLOC_MAGIC 0x58434c52u /* "RLCX" */
#define COLOC_VERSION 2u           /* 2: a done word per source (nflags) */
#define COLOC_HANDLE_BYTES 64
#define COLOC_FLAG_BYTES (2u << 20) /* the done words' allocation: a whole 2 MiB page of its own */
#define COLOC_MAX_ALLOCS (1u << 20)
/* Sources one receiver waits for: every one a trainer rank on this GPU, so a
 * few; the bound keeps the done words and their pinned read-back small. */
#define COLOC_MAX_SOURCES 256u

_Static_assert(sizeof(cudaIpcMemHandle_t) == COLOC_HANDLE_BYTES, "IPC handle size changed");

typedef struct coloc_alloc {
  uint8_t handle[COLOC_HANDLE_BYTES];
  uint64_t base; /* the exporter's address: used as is within one process */
  uint64_t bytes;
} coloc_alloc;

typedef struct coloc_place {
  uint32_t alloc;
  uint64_t offset, bytes; /* of the whole tensor, in wire bytes */
} coloc_place;

typedef struct coloc_desc {
  uint64_t plan_hash;
  uint64_t process;    /* the exporter's process nonce */
  uint64_t owner;      /* the exporting engine's nonce */
  uint64_t generation; /* bumped whenever its allocations or places change */
  char gpu_uuid[48];
  char host_id[64];
  uint32_t flag_alloc;
  uint64_t flag_offset; /* done word s (source s) at flag_offset + 8 s */
  uint32_t nflags;      /* done words: the plan's sources */
  coloc_alloc *allocs;
  uint32_t nallocs;
  coloc_place *places; /* one per plan tensor */
  uint32_t nplaces;
} coloc_desc;

typedef struct coloc_peer {
  coloc_desc d;
  void **mapped; /* per allocation: its address in this process */
  int same_process;
  uint32_t rank;
} coloc_peer;

struct bcast_coloc {
  uint64_t owner;
  char uuid[48], host[64]; /* this engine's GPU and machine, probed once */
  /* receiver */
  coloc_desc mine; /* plan_hash: the plan exported for last */
  uint64_t sig;    /* layout the allocations and places were made for */
  void *flag;      /* the done words, one per source */
  uint64_t *pinned; /* [0]: token to write (sender); [1 + s]: done word s read back */
  int armed;       /* an export was made for mine.plan_hash */
  /* sender */
  coloc_peer *peers;
  size_t npeers, cap;
};

/* ---- nonces, allocation ranges ------------------------------------------------------ */

static uint64_t coloc_random(void) {
  uint64_t v = 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (read(fd, &v, sizeof v) != (ssize_t)sizeof v) v = 0;
    close(fd);
  }
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  /* Never 0, and different per process even without /dev/urandom. */
  v ^= ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40);
  return v ? v : 1;
}

static pthread_once_t coloc_once = PTHREAD_ONCE_INIT;
static uint64_t coloc_process;
typedef CUresult (*coloc_range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);
static coloc_range_fn coloc_range;

static void coloc_init_once(void) {
  coloc_process = coloc_random();
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  /* The driver call that finds an allocation's base, through the runtime's
   * entry-point query: no link against libcuda needed. */
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q) ==
          cudaSuccess &&
      q == cudaDriverEntryPointSuccess)
    coloc_range = (coloc_range_fn)fn;
  else
    (void)cudaGetLastError();
}

/* Source s's token for a plan: never 0 (a cleared word), and different per
 * source and per plan hash. */
static uint64_t coloc_token(uint64_t plan_hash, uint32_t source) {
  uint64_t v = plan_hash ^ (0x9E3779B97F4A7C15ull * ((uint64_t)source + 1));
  return v ? v : 1;
}

/* The plan's sources and whether `rank` is one; its done word's index. */
static uint32_t coloc_nsources(const bcast_plan *p) { return bcast__plan_nsources(p); }
static int coloc_is_source(const bcast_plan *p, uint32_t rank) {
  return coloc_nsources(p) > 1 ? rank < coloc_nsources(p) : rank == p->root_rank;
}
static uint32_t coloc_source_index(const bcast_plan *p, uint32_t rank) {
  return coloc_nsources(p) > 1 ? rank : 0;
}

/* ---- serialisation -------------------------------------------------------------------- */

typedef struct wbuf {
  uint8_t *b;
  size_t len, cap;
  int oom;
} wbuf;

static void w_bytes(wbuf *w, const void *p, size_t n) {
  if (w->oom) return;
  if (w->len + n > w->cap) {
    size_t nc = w->cap ? w->cap * 2 : 1024;
    while (nc < w->len + n) nc *= 2;
    uint8_t *nb = realloc(w->b, nc);
    if (!nb) {
      w->oom = 1;
      return;
    }
    w->b = nb;
    w->cap = nc;
  }
  memcpy(w->b + w->len, p, n);
  w->len += n;
}

static void w_u32(wbuf *w, uint32_t v) {
  uint8_t b[4];
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
  w_bytes(w, b, 4);
}

static void w_u64(wbuf *w, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
  w_bytes(w, b, 8);
}

static void w_str(wbuf *w, const char *s, size_t field) {
  char tmp[64] = {0};
  snprintf(tmp, field < sizeof tmp ? field : sizeof tmp, "%s", s);
  w_bytes(w, tmp, field);
}

typedef struct rbuf {
  const uint8_t *b;
  size_t len, off;
  int bad;
} rbuf;

static const uint8_t *r_bytes(rbuf *r, size_t n) {
  if (r->bad || r->len - r->off < n) {
    r->bad = 1;
    return NULL;
  }
  const uint8_t *p = r->b + r->off;
  r->off += n;
  return p;
}

static uint32_t r_u32(rbuf *r) {
  const uint8_t *p = r_bytes(r, 4);
  uint32_t v = 0;
  for (int i = 0; p && i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}

static uint64_t r_u64(rbuf *r) {
  const uint8_t *p = r_bytes(r, 8);
  uint64_t v = 0;
  for (int i = 0; p && i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static void r_str(rbuf *r, char *out, size_t field) {
  const uint8_t *p = r_bytes(r, field);
  out[0] = '\0';
  if (p) snprintf(out, field, "%.*s", (int)(field - 1), (const char *)p);
}

static int desc_write(const coloc_desc *d, uint8_t **out, size_t *len) {
  wbuf w = {0};
  w_u32(&w, COLOC_MAGIC);
  w_u32(&w, COLOC_VERSION);
  w_u64(&w, d->plan_hash);
  w_u64(&w, d->process);
  w_u64(&w, d->owner);
  w_u64(&w, d->generation);
  w_str(&w, d->gpu_uuid, sizeof d->gpu_uuid);
  w_str(&w, d->host_id, sizeof d->host_id);
  w_u32(&w, d->flag_alloc);
  w_u64(&w, d->flag_offset);
  w_u32(&w, d->nflags);
  w_u32(&w, d->nallocs);
  for (uint32_t i = 0; i < d->nallocs; i++) {
    w_bytes(&w, d->allocs[i].handle, COLOC_HANDLE_BYTES);
    w_u64(&w, d->allocs[i].base);
    w_u64(&w, d->allocs[i].bytes);
  }
  w_u32(&w, d->nplaces);
  for (uint32_t i = 0; i < d->nplaces; i++) {
    w_u32(&w, d->places[i].alloc);
    w_u64(&w, d->places[i].offset);
    w_u64(&w, d->places[i].bytes);
  }
  if (w.oom) {
    free(w.b);
    return BCAST_ENOMEM;
  }
  *out = w.b;
  *len = w.len;
  return BCAST_OK;
}

static void desc_clear(coloc_desc *d) {
  free(d->allocs);
  free(d->places);
  memset(d, 0, sizeof *d);
}

/* Decodes and checks an export against the plan it claims to be for. */
static int desc_read(const uint8_t *buf, size_t len, const bcast_plan *p, uint32_t rank,
                     coloc_desc *d, bcast_err *err) {
  memset(d, 0, sizeof *d);
  rbuf r = {buf, len, 0, 0};
  uint32_t magic = r_u32(&r), version = r_u32(&r);
  if (r.bad || magic != COLOC_MAGIC)
    return bcast__fail(err, BCAST_EINVAL, "rank %u: colocated export of %zu bytes is not one (bad magic)",
                       rank, len);
  if (version != COLOC_VERSION)
    return bcast__fail(err, BCAST_EINVAL, "rank %u: colocated export version %u, this engine reads %u",
                       rank, version, COLOC_VERSION);
  d->plan_hash = r_u64(&r);
  d->process = r_u64(&r);
  d->owner = r_u64(&r);
  d->generation = r_u64(&r);
  r_str(&r, d->gpu_uuid, sizeof d->gpu_uuid);
  r_str(&r, d->host_id, sizeof d->host_id);
  d->flag_alloc = r_u32(&r);
  d->flag_offset = r_u64(&r);
  d->nflags = r_u32(&r);
  d->nallocs = r_u32(&r);
  if (r.bad || d->nallocs == 0 || d->nallocs > COLOC_MAX_ALLOCS ||
      (size_t)d->nallocs * (COLOC_HANDLE_BYTES + 16) > len - r.off)
    return bcast__fail(err, BCAST_EINVAL, "rank %u: colocated export truncated or with %u allocations",
                       rank, d->nallocs);
  d->allocs = calloc(d->nallocs, sizeof *d->allocs);
  if (!d->allocs) return bcast__fail(err, BCAST_ENOMEM, "rank %u: colocated export: no memory", rank);
  for (uint32_t i = 0; i < d->nallocs; i++) {
    const uint8_t *h = r_bytes(&r, COLOC_HANDLE_BYTES);
    if (h) memcpy(d->allocs[i].handle, h, COLOC_HANDLE_BYTES);
    d->allocs[i].base = r_u64(&r);
    d->allocs[i].bytes = r_u64(&r);
  }
  d->nplaces = r_u32(&r);
  if (r.bad || d->nplaces != p->ntensors || (size_t)d->nplaces * 20 != len - r.off) {
    int bad = r.bad;
    desc_clear(d);
    return bcast__fail(err, BCAST_EINVAL,
                       "rank %u: colocated export %s (%zu bytes; the plan has %zu tensors)", rank,
                       bad ? "truncated" : "places another number of tensors than the plan", len,
                       p->ntensors);
  }
  d->places = calloc(d->nplaces ? d->nplaces : 1, sizeof *d->places);
  if (!d->places) {
    desc_clear(d);
    return bcast__fail(err, BCAST_ENOMEM, "rank %u: colocated export: no memory", rank);
  }
  for (uint32_t i = 0; i < d->nplaces; i++) {
    d->places[i].alloc = r_u32(&r);
    d->places[i].offset = r_u64(&r);
    d->places[i].bytes = r_u64(&r);
  }
  /* Every write lands inside an allocation the receiver named, at the size
   * the plan gives: a wrong export is refused here, never written through. */
  for (uint32_t i = 0; i < d->nplaces; i++) {
    const coloc_place *pl = &d->places[i];
    const bcast_tensor *t = &p->tensors[i];
    uint64_t want = bcast_tensor_elems(t) * bcast_dtype_size(t->wire_dtype);
    if (pl->bytes != want || pl->alloc >= d->nallocs ||
        pl->offset > d->allocs[pl->alloc].bytes ||
        d->allocs[pl->alloc].bytes - pl->offset < pl->bytes) {
      desc_clear(d);
      return bcast__fail(err, BCAST_EINVAL,
                         "rank %u: colocated export places tensor '%s' (%llu wire bytes) outside "
                         "its allocations",
                         rank, t->name, (unsigned long long)want);
    }
  }
  if (d->nflags != coloc_nsources(p)) {
    uint32_t nf = d->nflags;
    desc_clear(d);
    return bcast__fail(err, BCAST_EINVAL,
                       "rank %u: colocated export has %u done words, the plan has %u sources", rank,
                       nf, coloc_nsources(p));
  }
  uint64_t flag_bytes = 8ull * d->nflags;
  if (d->flag_alloc >= d->nallocs || d->allocs[d->flag_alloc].bytes < flag_bytes ||
      d->flag_offset > d->allocs[d->flag_alloc].bytes - flag_bytes) {
    desc_clear(d);
    return bcast__fail(err, BCAST_EINVAL, "rank %u: colocated export has no valid done words", rank);
  }
  return BCAST_OK;
}

/* ---- life cycle ------------------------------------------------------------------------ */

int bcast__coloc_new(bcast_gpu *g, bcast_coloc **out, bcast_err *err) {
  *out = NULL;
  pthread_once(&coloc_once, coloc_init_once);
  bcast_coloc *c = calloc(1, sizeof *c);
  if (!c) return bcast__fail(err, BCAST_ENOMEM, "colocated mode: no memory");
  c->owner = coloc_random();
  bcast__host_id(c->host, sizeof c->host);
  cudaError_t ce = cudaSetDevice(g->device);
  if (ce == cudaSuccess)
    ce = cudaHostAlloc((void **)&c->pinned, (1 + COLOC_MAX_SOURCES) * sizeof(uint64_t),
                       cudaHostAllocDefault);
  if (ce != cudaSuccess) {
    c->pinned = NULL;
    bcast__coloc_free(c, g);
    return CUDA_FAIL(err, ce, "colocated mode: pinned done word on device %d: %s", g->device,
                     cudaGetErrorString(ce));
  }
  int rc = bcast__gpu_uuid(g->device, c->uuid, sizeof c->uuid);
  if (rc) {
    bcast__coloc_free(c, g);
    return bcast__fail(err, BCAST_ECUDA, "colocated mode: no UUID for device %d", g->device);
  }
  *out = c;
  return BCAST_OK;
}

static void peer_close(coloc_peer *pr) {
  for (uint32_t i = 0; pr->mapped && i < pr->d.nallocs; i++)
    if (pr->mapped[i] && !pr->same_process) {
      if (cudaIpcCloseMemHandle(pr->mapped[i]) != cudaSuccess) (void)cudaGetLastError();
    }
  free(pr->mapped);
  desc_clear(&pr->d);
  memset(pr, 0, sizeof *pr);
}

void bcast__coloc_free(bcast_coloc *c, bcast_gpu *g) {
  if (!c) return;
  if (g) cudaSetDevice(g->device);
  for (size_t i = 0; i < c->npeers; i++) peer_close(&c->peers[i]);
  free(c->peers);
  if (c->flag) cudaFree(c->flag);
  if (c->pinned) cudaFreeHost(c->pinned);
  desc_clear(&c->mine);
  (void)cudaGetLastError();
  free(c);
}

size_t bcast__coloc_mapped(const bcast_coloc *c) {
  size_t n = 0;
  for (size_t i = 0; c && i < c->npeers; i++) n += c->peers[i].d.nallocs;
  return n;
}

/* ---- receiver: the export ------------------------------------------------------------------ */

/* A fingerprint of where the plan's tensors are: the export is rebuilt only
 * when it changes (new buffers, another plan layout). */
static uint64_t layout_sig(const bcast_plan *p, const bcast_tensor *local, const uint32_t *map,
                           int device) {
  XXH3_state_t *st = XXH3_createState();
  if (!st) return 0;
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, &device, sizeof device);
  for (size_t i = 0; i < p->ntensors; i++) {
    const bcast_tensor *t = &local[map[i]];
    uint64_t v[2] = {(uint64_t)(uintptr_t)t->data,
                     bcast_tensor_elems(t) * bcast_dtype_size(p->tensors[i].wire_dtype)};
    XXH3_64bits_update(st, v, sizeof v);
  }
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h ? h : 1;
}

/* Index of the allocation holding `ptr` in d (added, with its IPC handle,
 * when new). */
static int alloc_of(coloc_desc *d, uint32_t *cap, const void *ptr, const char *what,
                    uint32_t *index, bcast_err *err) {
  if (!coloc_range)
    return bcast__fail(err, BCAST_ENOTSUP,
                       "%s: the CUDA driver offers no cuMemGetAddressRange (needed to find the "
                       "allocation to export)", what);
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult cr = coloc_range(&base, &size, (CUdeviceptr)(uintptr_t)ptr);
  if (cr != CUDA_SUCCESS)
    return bcast__fail(err, BCAST_ECUDA, "%s: cuMemGetAddressRange(%p) failed with CUresult %d", what,
                       ptr, (int)cr);
  for (uint32_t i = 0; i < d->nallocs; i++)
    if (d->allocs[i].base == (uint64_t)base) {
      *index = i;
      return BCAST_OK;
    }
  if (d->nallocs == *cap) {
    uint32_t nc = *cap ? *cap * 2 : 16;
    coloc_alloc *na = realloc(d->allocs, nc * sizeof *na);
    if (!na) return bcast__fail(err, BCAST_ENOMEM, "%s: no memory for the export", what);
    d->allocs = na;
    *cap = nc;
  }
  coloc_alloc *a = &d->allocs[d->nallocs];
  memset(a, 0, sizeof *a);
  cudaIpcMemHandle_t h;
  cudaError_t ce = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)base);
  if (ce != cudaSuccess)
    return CUDA_FAIL(err, ce,
                     "%s: cudaIpcGetMemHandle on its allocation (%zu bytes): %s (only cudaMalloc "
                     "memory can be exported; not pools of cudaMallocAsync nor cuMemCreate "
                     "mappings)",
                     what, size, cudaGetErrorString(ce));
  memcpy(a->handle, &h, COLOC_HANDLE_BYTES);
  a->base = (uint64_t)base;
  a->bytes = size;
  *index = d->nallocs++;
  return BCAST_OK;
}

/* Rebuilds the allocations and places of this receiver's export. */
static int export_build(bcast_coloc *c, bcast_gpu *g, const bcast_plan *p, uint32_t rank,
                        const bcast_tensor *local, const uint32_t *map, bcast_err *err) {
  coloc_desc d = {0};
  uint32_t cap = 0;
  int rc = BCAST_OK;
  d.places = calloc(p->ntensors ? p->ntensors : 1, sizeof *d.places);
  if (!d.places) return bcast__fail(err, BCAST_ENOMEM, "colocated export: no memory");
  d.nplaces = (uint32_t)p->ntensors;
  char what[BCAST_NAME_MAX + 64];
  for (size_t i = 0; i < p->ntensors && !rc; i++) {
    const bcast_tensor *t = &local[map[i]];
    snprintf(what, sizeof what, "tensor '%s' on rank %u", t->name, rank);
    if (t->residency != BCAST_RES_GPU) {
      rc = bcast__fail(err, BCAST_EINVAL,
                       "%s: colocated mode writes into device memory, and this buffer is in host "
                       "memory", what);
      break;
    }
    struct cudaPointerAttributes a;
    cudaError_t ce = cudaPointerGetAttributes(&a, t->data);
    if (ce != cudaSuccess || a.type != cudaMemoryTypeDevice) {
      (void)cudaGetLastError();
      rc = bcast__fail(err, BCAST_EINVAL, "%s: marked GPU-resident but not device memory (cudaMalloc)",
                       what);
      break;
    }
    if (a.device != g->device) {
      rc = bcast__fail(err, BCAST_EINVAL, "%s: lives on GPU %d, the engine uses GPU %d", what,
                       a.device, g->device);
      break;
    }
    uint32_t ai = 0;
    rc = alloc_of(&d, &cap, t->data, what, &ai, err);
    if (rc) break;
    d.places[i] = (coloc_place){ai, (uint64_t)(uintptr_t)t->data - d.allocs[ai].base,
                                bcast_tensor_elems(t) * bcast_dtype_size(p->tensors[i].wire_dtype)};
  }
  if (!rc && !c->flag) {
    cudaError_t ce = cudaMalloc(&c->flag, COLOC_FLAG_BYTES);
    if (ce != cudaSuccess) {
      c->flag = NULL;
      rc = CUDA_FAIL(err, ce, "colocated export: done word on device %d: %s", g->device,
                     cudaGetErrorString(ce));
    }
  }
  if (!rc) rc = alloc_of(&d, &cap, c->flag, "the done word", &d.flag_alloc, err);
  if (!rc) d.flag_offset = (uint64_t)(uintptr_t)c->flag - d.allocs[d.flag_alloc].base;
  d.nflags = coloc_nsources(p);
  if (rc) {
    desc_clear(&d);
    return rc;
  }
  d.generation = c->mine.generation + 1;
  desc_clear(&c->mine);
  c->mine = d;
  return BCAST_OK;
}

int bcast__coloc_export(bcast_coloc *c, bcast_gpu *g, const bcast_plan *p, uint32_t rank,
                        const bcast_tensor *local, size_t n, uint8_t **out, size_t *len,
                        bcast_err *err) {
  *out = NULL;
  *len = 0;
  if (coloc_is_source(p, rank))
    return bcast__fail(err, BCAST_EINVAL,
                       "plan '%s': rank %u is a sender (source rank); only receivers export", p->id,
                       rank);
  if (coloc_nsources(p) > COLOC_MAX_SOURCES)
    return bcast__fail(err, BCAST_ENOTSUP,
                       "plan '%s': %u sources; colocated receivers wait for at most %u", p->id,
                       coloc_nsources(p), COLOC_MAX_SOURCES);
  cudaError_t ce = cudaSetDevice(g->device);
  if (ce != cudaSuccess)
    return CUDA_FAIL(err, ce, "cudaSetDevice(%d): %s", g->device, cudaGetErrorString(ce));
  uint32_t *map = malloc((p->ntensors ? p->ntensors : 1) * sizeof *map);
  if (!map) return bcast__fail(err, BCAST_ENOMEM, "colocated export: no memory");
  int rc = bcast__plan_bind(p, local, n, 0, map, err);
  uint64_t sig = rc ? 0 : layout_sig(p, local, map, g->device);
  if (!rc && (sig != c->sig || !c->mine.nallocs || c->mine.nflags != coloc_nsources(p))) {
    c->armed = 0;
    c->sig = 0;
    rc = export_build(c, g, p, rank, local, map, err);
    if (!rc) c->sig = sig;
  }
  free(map);
  if (rc) return rc;
  /* A fresh plan starts from cleared done words; the sources set theirs only
   * after the trigger, which comes after this export's ack. */
  if ((ce = cudaMemsetAsync(c->flag, 0, 8ull * coloc_nsources(p), g->s_cast)) != cudaSuccess ||
      (ce = cudaStreamSynchronize(g->s_cast)) != cudaSuccess)
    return CUDA_FAIL(err, ce, "colocated export: clearing the done words: %s", cudaGetErrorString(ce));
  c->mine.plan_hash = p->hash;
  c->mine.process = coloc_process;
  c->mine.owner = c->owner;
  snprintf(c->mine.gpu_uuid, sizeof c->mine.gpu_uuid, "%s", c->uuid);
  snprintf(c->mine.host_id, sizeof c->mine.host_id, "%s", c->host);
  if (desc_write(&c->mine, out, len)) return bcast__fail(err, BCAST_ENOMEM, "colocated export: no memory");
  c->armed = 1;
  return BCAST_OK;
}

/* ---- sender: importing exports ---------------------------------------------------------------- */

static int peer_open(coloc_peer *pr, bcast_err *err) {
  pr->mapped = calloc(pr->d.nallocs, sizeof *pr->mapped);
  if (!pr->mapped) return bcast__fail(err, BCAST_ENOMEM, "rank %u: no memory for its mappings", pr->rank);
  pr->same_process = pr->d.process == coloc_process;
  for (uint32_t i = 0; i < pr->d.nallocs; i++) {
    if (pr->same_process) {
      pr->mapped[i] = (void *)(uintptr_t)pr->d.allocs[i].base;
      continue;
    }
    cudaIpcMemHandle_t h;
    memcpy(&h, pr->d.allocs[i].handle, COLOC_HANDLE_BYTES);
    cudaError_t ce = cudaIpcOpenMemHandle(&pr->mapped[i], h, cudaIpcMemLazyEnablePeerAccess);
    if (ce != cudaSuccess) {
      pr->mapped[i] = NULL;
      return CUDA_FAIL(err, ce,
                       "rank %u: cudaIpcOpenMemHandle of its allocation %u (%llu bytes): %s", pr->rank,
                       i, (unsigned long long)pr->d.allocs[i].bytes, cudaGetErrorString(ce));
    }
  }
  return BCAST_OK;
}

int bcast__coloc_import(bcast_coloc *c, bcast_gpu *g, const bcast_plan *p, uint32_t rank,
                        const uint8_t *buf, size_t len, bcast_err *err) {
  if (coloc_is_source(p, rank) || rank >= p->world_size)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': colocated export for rank %u, which is not a "
                       "receiver of the plan (world %u, %u source%s from rank %u)", p->id, rank,
                       p->world_size, coloc_nsources(p), coloc_nsources(p) > 1 ? "s" : "",
                       coloc_nsources(p) > 1 ? 0 : p->root_rank);
  if (!buf || !len)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': rank %u sent no colocated export", p->id, rank);
  coloc_desc d;
  int rc = desc_read(buf, len, p, rank, &d, err);
  if (rc) return rc;
  if (d.plan_hash != p->hash) {
    desc_clear(&d);
    return bcast__fail(err, BCAST_EMISMATCH,
                       "rank %u exported for plan hash %016llx, this plan's is %016llx", rank,
                       (unsigned long long)d.plan_hash, (unsigned long long)p->hash);
  }
  if (strcmp(d.host_id, c->host) != 0 || strcmp(d.gpu_uuid, c->uuid) != 0) {
    rc = bcast__fail(err, BCAST_ENOTSUP,
                     "rank %u is on GPU %s of host %s, the sender on GPU %s of host %s: colocated "
                     "mode needs every receiver on the sender's GPU",
                     rank, d.gpu_uuid, d.host_id, c->uuid, c->host);
    desc_clear(&d);
    return rc;
  }
  cudaError_t ce = cudaSetDevice(g->device);
  if (ce != cudaSuccess) {
    desc_clear(&d);
    return CUDA_FAIL(err, ce, "cudaSetDevice(%d): %s", g->device, cudaGetErrorString(ce));
  }
  for (size_t i = 0; i < c->npeers; i++) {
    coloc_peer *pr = &c->peers[i];
    if (pr->d.owner != d.owner && pr->d.plan_hash == p->hash && pr->rank == rank) {
      desc_clear(&d);
      return bcast__fail(err, BCAST_EINVAL, "plan '%s': two exports for rank %u", p->id, rank);
    }
    if (pr->d.owner != d.owner) continue;
    if (pr->d.generation == d.generation) {
      /* The same buffers as before: the mappings stay; only the plan changes. */
      pr->d.plan_hash = d.plan_hash;
      pr->rank = rank;
      desc_clear(&d);
      return BCAST_OK;
    }
    peer_close(pr); /* its layout changed: the old mappings go first */
    c->peers[i] = c->peers[--c->npeers];
    break;
  }
  if (c->npeers == c->cap) {
    size_t nc = c->cap ? c->cap * 2 : 4;
    coloc_peer *np = realloc(c->peers, nc * sizeof *np);
    if (!np) {
      desc_clear(&d);
      return bcast__fail(err, BCAST_ENOMEM, "colocated import: no memory");
    }
    c->peers = np;
    c->cap = nc;
  }
  coloc_peer *pr = &c->peers[c->npeers];
  memset(pr, 0, sizeof *pr);
  pr->d = d;
  pr->rank = rank;
  rc = peer_open(pr, err);
  if (rc) {
    peer_close(pr);
    return rc;
  }
  c->npeers++;
  return BCAST_OK;
}

/* ---- execution ---------------------------------------------------------------------------------- */

#define CK(call, ...)                                                                            \
  do {                                                                                           \
    cudaError_t ce_ = (call);                                                                    \
    if (ce_ != cudaSuccess) return CUDA_FAIL(err, ce_, __VA_ARGS__);                             \
  } while (0)

static void nap(double s) {
  struct timespec ts = {0, (long)(s * 1e9)};
  nanosleep(&ts, NULL);
}

static int cancelled(int fd) {
  if (fd < 0) return 0;
  struct pollfd pf = {.fd = fd, .events = POLLIN};
  return poll(&pf, 1, 0) > 0 && (pf.revents & POLLIN);
}

typedef struct coloc_tx {
  bcast_gpu *g;
  const bcast_plan *p;
  uint32_t source;          /* this sender's source index: its done word */
  uint32_t *own;            /* the buckets it sends, in plan order */
  uint32_t nown;
  const bcast_tensor **src; /* plan tensor -> local (NULL: not carried by this source) */
  uint8_t *access;          /* plan tensor -> AT_* */
  coloc_peer **rx;          /* receivers, rank order */
  uint32_t nrx;
  int cancel_fd;
  double deadline;
  uint64_t pcie;
} coloc_tx;

/* Waits for an event on the host against the deadline and a cancellation. */
static int tx_wait(coloc_tx *x, cudaEvent_t e, uint32_t k, const char *what, bcast_err *err) {
  double t0 = bcast__now();
  for (;;) {
    cudaError_t ce = cudaEventQuery(e);
    if (ce == cudaSuccess) return BCAST_OK;
    if (ce != cudaErrorNotReady)
      return CUDA_FAIL(err, ce, "bucket %u: %s: %s", k, what, cudaGetErrorString(ce));
    if (cancelled(x->cancel_fd))
      return bcast__fail(err, BCAST_ECANCELED, "plan '%s': cancelled at bucket %u", x->p->id, k);
    if (bcast__now() > x->deadline)
      return bcast__fail(err, BCAST_ETIMEDOUT, "bucket %u (layer %u): %s not done by the deadline",
                         k, x->p->buckets[k].layer, what);
    nap(bcast__now() - t0 < 1e-3 ? 5e-6 : 50e-6);
  }
}

static char *rx_ptr(const coloc_tx *x, uint32_t r, const bcast_slice *s) {
  const coloc_peer *pr = x->rx[r];
  const coloc_place *pl = &pr->d.places[s->tensor];
  return (char *)pr->mapped[pl->alloc] + pl->offset +
         s->elem_offset * bcast_dtype_size(x->p->tensors[s->tensor].wire_dtype);
}

/* Where a slice's first element is in the source's local tensor, which holds
 * elements from its shard_offset on (0 for a whole tensor). */
static const char *src_ptr(const coloc_tx *x, const bcast_slice *s) {
  const bcast_tensor *t = x->src[s->tensor];
  return (const char *)t->data + (s->elem_offset - t->shard_offset) * bcast_dtype_size(t->storage_dtype);
}

static size_t align256(size_t v) { return (v + 255) & ~(size_t)255; }

/* Bytes of the raw staging ring and of the bounce ring one bucket needs. */
static void bucket_needs(const coloc_tx *x, const bcast_bucket *b, size_t *raw, size_t *bounce) {
  *raw = *bounce = 0;
  for (size_t i = 0; i < b->nslices; i++) {
    const bcast_slice *s = &b->slices[i];
    const bcast_tensor *t = x->src[s->tensor];
    if (x->access[s->tensor] == AT_DEVICE) continue;
    size_t nb = (size_t)s->elem_count * bcast_dtype_size(t->storage_dtype);
    if (t->storage_dtype != x->p->tensors[s->tensor].wire_dtype) *raw += align256(nb);
    if (x->access[s->tensor] == AT_HOST_BOUNCE) *bounce += align256(nb);
  }
}

/* The j-th bucket of this source (plan bucket k = own[j]); the ring slot is
 * j's, so a source's buckets fill the ring in turn whichever plan indices
 * the other sources' buckets take between them. */
static int tx_bucket(coloc_tx *x, uint32_t j, bcast_err *err) {
  bcast_gpu *g = x->g;
  uint32_t k = x->own[j];
  const bcast_bucket *b = &x->p->buckets[k];
  bucket_ev *e = &g->ev[k];
  uint32_t slot = j % g->nslots;
  const bucket_ev *prev = j >= g->nslots ? &g->ev[x->own[j - g->nslots]] : NULL;
  /* Stage 1: host slices to the GPU. The slot is free once the cast that
   * read it, nslots buckets ago, finished. */
  if (prev) CK(cudaStreamWaitEvent(g->s_copy, prev->cast1, 0), "bucket %u: wait", k);
  CK(cudaEventRecord(e->h2d0, g->s_copy), "bucket %u: event", k);
  size_t roff = 0, boff = 0;
  for (size_t i = 0; i < b->nslices; i++) {
    const bcast_slice *s = &b->slices[i];
    uint8_t at = x->access[s->tensor];
    if (at == AT_DEVICE) continue;
    const bcast_tensor *t = x->src[s->tensor];
    size_t nb = (size_t)s->elem_count * bcast_dtype_size(t->storage_dtype);
    const char *from = src_ptr(x, s);
    if (at == AT_HOST_BOUNCE) {
      int rc = prev ? tx_wait(x, prev->h2d1, k, "staging slot reuse", err) : BCAST_OK;
      if (rc) return rc;
      memcpy((char *)g->bounce[slot] + boff, from, nb);
      from = (const char *)g->bounce[slot] + boff;
      boff += align256(nb);
    }
    char *to;
    if (t->storage_dtype == x->p->tensors[s->tensor].wire_dtype) {
      to = rx_ptr(x, 0, s); /* already the wire bytes: straight into the receiver */
    } else {
      to = (char *)g->raw[slot] + roff;
      roff += align256(nb);
    }
    CK(cudaMemcpyAsync(to, from, nb, cudaMemcpyHostToDevice, g->s_copy),
       "bucket %u: host-to-device copy of tensor %s", k, t->name);
    x->pcie += nb;
  }
  CK(cudaEventRecord(e->h2d1, g->s_copy), "bucket %u: event", k);
  /* Stage 2: cast into the first receiver, copy to the others. */
  CK(cudaStreamWaitEvent(g->s_cast, e->h2d1, 0), "bucket %u: wait", k);
  CK(cudaEventRecord(e->cast0, g->s_cast), "bucket %u: event", k);
  roff = 0;
  for (size_t i = 0; i < b->nslices; i++) {
    const bcast_slice *s = &b->slices[i];
    const bcast_tensor *t = x->src[s->tensor];
    bcast_dtype wire = x->p->tensors[s->tensor].wire_dtype;
    size_t es = bcast_dtype_size(t->storage_dtype);
    char *dst0 = rx_ptr(x, 0, s);
    const char *from = NULL;
    if (x->access[s->tensor] == AT_DEVICE) {
      from = src_ptr(x, s);
    } else if (t->storage_dtype != wire) {
      from = (const char *)g->raw[slot] + roff;
      roff += align256((size_t)s->elem_count * es);
    }
    if (from) {
      int ce = bcast__cuda_cast(dst0, wire, from, t->storage_dtype, s->elem_count, g->s_cast);
      if (ce)
        return CUDA_FAIL(err, (cudaError_t)ce, "bucket %u: cast of tensor %s into rank %u: %s", k,
                         t->name, x->rx[0]->rank, cudaGetErrorString((cudaError_t)ce));
    }
    size_t wb = (size_t)s->elem_count * bcast_dtype_size(wire);
    for (uint32_t r = 1; r < x->nrx; r++)
      CK(cudaMemcpyAsync(rx_ptr(x, r, s), dst0, wb, cudaMemcpyDeviceToDevice, g->s_cast),
         "bucket %u: copy of tensor %s to rank %u", k, t->name, x->rx[r]->rank);
  }
  CK(cudaEventRecord(e->cast1, g->s_cast), "bucket %u: event", k);
  return BCAST_OK;
}

static float ev_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return ms;
}

/* A source's stats count its own buckets and bytes (with one source: the
 * whole plan), as in host mode. */
static int tx_stats(coloc_tx *x, double total, bcast_stats *st, bcast_err *err) {
  const bcast_plan *p = x->p;
  memset(st, 0, sizeof *st);
  st->mode = BCAST_MODE_COLOCATED;
  int ipc = 0;
  for (uint32_t r = 0; r < x->nrx; r++) ipc |= !x->rx[r]->same_process;
  st->transport = ipc ? "cuda-ipc" : "in-process";
  st->pcie_bytes = x->pcie;
  st->nbuckets = x->nown;
  st->buckets = calloc(x->nown ? x->nown : 1, sizeof *st->buckets);
  if (!st->buckets) return bcast__fail(err, BCAST_ENOMEM, "stats: no memory");
  for (uint32_t j = 0; j < x->nown; j++) {
    uint32_t k = x->own[j];
    bucket_ev *e = &x->g->ev[k];
    bcast_bucket_timing *bt = &st->buckets[j];
    bt->bucket = k;
    bt->h2d_s = ev_ms(e->h2d0, e->h2d1) / 1e3;
    bt->cast_s = ev_ms(e->cast0, e->cast1) / 1e3;
    st->h2d_s += bt->h2d_s;
    st->cast_s += bt->cast_s;
    st->wire_bytes += p->buckets[k].bytes;
  }
  /* No wire to hide staging behind: the casts write the receivers' memory
   * themselves, so the whole time is exposed, measured. */
  st->total_s = total;
  st->wire_alone_s = 0;
  st->exposed_measured = 1;
  st->exposed_s = total;
  st->gbps = total > 0 ? (double)st->wire_bytes / total / 1e9 : 0;
  return BCAST_OK;
}

/* Which receivers this plan writes, in rank order; closes the mappings of
 * receivers that are no longer in it (a participant left, or re-registered). */
static int tx_receivers(bcast_coloc *c, coloc_tx *x, bcast_err *err) {
  const bcast_plan *p = x->p;
  for (size_t i = 0; i < c->npeers;) {
    if (c->peers[i].d.plan_hash != p->hash) {
      peer_close(&c->peers[i]);
      c->peers[i] = c->peers[--c->npeers];
    } else {
      i++;
    }
  }
  x->nrx = 0;
  for (uint32_t r = 0; r < p->world_size; r++) {
    if (coloc_is_source(p, r)) continue;
    coloc_peer *hit = NULL;
    for (size_t i = 0; i < c->npeers && !hit; i++)
      if (c->peers[i].rank == r) hit = &c->peers[i];
    if (!hit)
      return bcast__fail(err, BCAST_EINVAL,
                         "plan '%s': no colocated export from rank %u (its PlanAck carries it; the "
                         "sender imports it with bcast_engine_coloc_import)",
                         p->id, r);
    x->rx[x->nrx++] = hit;
  }
  if (x->nrx == 0)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': colocated mode with no receiver", p->id);
  return BCAST_OK;
}

/* Local tensors of a source: the ones its buckets carry, whole or shards
 * holding every range it sends (bcast__plan_bind_source); GPU tensors on
 * this device, host ones pinned or registered (bounced when registration is
 * refused). */
static int tx_bind(coloc_tx *x, uint32_t rank, const bcast_tensor *local, size_t n, bcast_err *err) {
  const bcast_plan *p = x->p;
  uint32_t *map = malloc((p->ntensors ? p->ntensors : 1) * sizeof *map);
  if (!map) return bcast__fail(err, BCAST_ENOMEM, "colocated execute: no memory");
  int rc = bcast__plan_bind_source(p, rank, local, n, map, err);
  for (size_t i = 0; i < p->ntensors && !rc; i++) {
    if (map[i] == UINT32_MAX) continue; /* another source's */
    const bcast_tensor *t = &local[map[i]];
    x->src[i] = t;
    if (!bcast__cuda_cast_supported(t->storage_dtype, p->tensors[i].wire_dtype)) {
      rc = bcast__fail(err, BCAST_ENOTSUP, "tensor %s: no GPU cast from %s to %s", t->name,
                       bcast_dtype_name(t->storage_dtype), bcast_dtype_name(p->tensors[i].wire_dtype));
    } else if (t->residency == BCAST_RES_GPU) {
      struct cudaPointerAttributes a;
      if (cudaPointerGetAttributes(&a, t->data) != cudaSuccess ||
          (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)) {
        (void)cudaGetLastError();
        rc = bcast__fail(err, BCAST_EINVAL, "tensor %s: marked GPU-resident but not device memory",
                         t->name);
      } else if (a.type == cudaMemoryTypeDevice && a.device != x->g->device) {
        rc = bcast__fail(err, BCAST_EINVAL, "tensor %s: lives on GPU %d, the engine uses GPU %d",
                         t->name, a.device, x->g->device);
      } else {
        x->access[i] = AT_DEVICE;
      }
    } else {
      size_t bytes = (size_t)bcast_tensor_held(t) * bcast_dtype_size(t->storage_dtype);
      x->access[i] = (uint8_t)bcast__gpu_host_access(x->g, t->data, bytes);
    }
  }
  free(map);
  return rc;
}

/* The buckets this source sends, in plan order. */
static int tx_own(coloc_tx *x, uint32_t rank, bcast_err *err) {
  const bcast_plan *p = x->p;
  x->own = malloc((p->nbuckets ? p->nbuckets : 1) * sizeof *x->own);
  if (!x->own) return bcast__fail(err, BCAST_ENOMEM, "colocated execute: no memory");
  x->nown = 0;
  for (size_t k = 0; k < p->nbuckets; k++)
    if (p->buckets[k].source_rank == rank) x->own[x->nown++] = (uint32_t)k;
  return BCAST_OK;
}

static int coloc_send(bcast_coloc *c, bcast_gpu *g, const bcast_plan *p, uint32_t rank,
                      const bcast_tensor *local, size_t n, int cancel_fd, bcast_stats *stats,
                      bcast_err *err) {
  coloc_tx x = {.g = g, .p = p, .cancel_fd = cancel_fd, .source = coloc_source_index(p, rank)};
  x.src = calloc(p->ntensors ? p->ntensors : 1, sizeof *x.src);
  x.access = calloc(p->ntensors ? p->ntensors : 1, 1);
  x.rx = calloc(p->world_size, sizeof *x.rx);
  int rc = BCAST_OK;
  if (!x.src || !x.access || !x.rx) {
    rc = bcast__fail(err, BCAST_ENOMEM, "colocated execute: no memory");
    goto out;
  }
  if ((rc = tx_receivers(c, &x, err)) || (rc = tx_own(&x, rank, err)) ||
      (rc = tx_bind(&x, rank, local, n, err)))
    goto out;
  size_t raw_need = 0, bounce_need = 0;
  for (uint32_t j = 0; j < x.nown; j++) {
    size_t raw, bounce;
    bucket_needs(&x, &p->buckets[x.own[j]], &raw, &bounce);
    if (raw > raw_need) raw_need = raw;
    if (bounce > bounce_need) bounce_need = bounce;
  }
  if ((raw_need && (rc = bcast__gpu_grow(g, g->raw, &g->raw_cap, raw_need, 0, "staging buffers", err))) ||
      (bounce_need &&
       (rc = bcast__gpu_grow(g, g->bounce, &g->bounce_cap, bounce_need, 1, "pinned bounce buffers", err))) ||
      (rc = bcast__gpu_ev_ensure(g, p->nbuckets, err)))
    goto out;
  if (cancelled(cancel_fd)) {
    rc = bcast__fail(err, BCAST_ECANCELED, "plan '%s': cancelled before it started", p->id);
    goto out;
  }
  x.deadline = bcast__deadline(g->timeout_s, p->deadline_unix_ms);
  double t0 = bcast__now();
  for (uint32_t j = 0; j < x.nown && !rc; j++) rc = tx_bucket(&x, j, err);
  /* Progress, bucket by bucket: each finished bucket re-arms the deadline. */
  for (uint32_t j = 0; j < x.nown && !rc; j++) {
    rc = tx_wait(&x, g->ev[x.own[j]].cast1, x.own[j], "writes into the receivers", err);
    double again = bcast__deadline(g->timeout_s, p->deadline_unix_ms);
    if (again > x.deadline) x.deadline = again;
  }
  cudaError_t ce = cudaSuccess;
  /* Every write of this source done, seen by the host, before any receiver
   * is told. */
  if (!rc && ((ce = cudaStreamSynchronize(g->s_copy)) != cudaSuccess ||
              (ce = cudaStreamSynchronize(g->s_cast)) != cudaSuccess))
    rc = CUDA_FAIL(err, ce, "plan '%s': finishing the writes: %s", p->id, cudaGetErrorString(ce));
  double total = bcast__now() - t0;
  if (!rc) {
    c->pinned[0] = coloc_token(p->hash, x.source);
    for (uint32_t r = 0; r < x.nrx && !rc; r++) {
      const coloc_peer *pr = x.rx[r];
      char *flag = (char *)pr->mapped[pr->d.flag_alloc] + pr->d.flag_offset + 8ull * x.source;
      if ((ce = cudaMemcpyAsync(flag, &c->pinned[0], 8, cudaMemcpyHostToDevice, g->s_cast)) !=
          cudaSuccess)
        rc = CUDA_FAIL(err, ce, "plan '%s': setting rank %u's done word of source rank %u: %s",
                       p->id, pr->rank, rank, cudaGetErrorString(ce));
    }
    if (!rc && (ce = cudaStreamSynchronize(g->s_cast)) != cudaSuccess)
      rc = CUDA_FAIL(err, ce, "plan '%s': setting the done words: %s", p->id, cudaGetErrorString(ce));
  }
  if (!rc && stats) rc = tx_stats(&x, total, stats, err);
out:
  /* Whatever happened, nothing may still be using the buffers or events. */
  cudaStreamSynchronize(g->s_copy);
  cudaStreamSynchronize(g->s_cast);
  (void)cudaGetLastError();
  free(x.src);
  free(x.access);
  free(x.rx);
  free(x.own);
  return rc;
}

/* The first source whose done word does not hold its token yet (ns: all do);
 * *late: how many do not. */
static uint32_t rx_missing(const bcast_coloc *c, const bcast_plan *p, uint32_t ns, uint32_t *late) {
  uint32_t first = ns;
  *late = 0;
  for (uint32_t s = 0; s < ns; s++)
    if (c->pinned[1 + s] != coloc_token(p->hash, s)) {
      if (first == ns) first = s;
      (*late)++;
    }
  return first;
}

static int coloc_recv(bcast_coloc *c, bcast_gpu *g, const bcast_plan *p, uint32_t rank,
                      const bcast_tensor *local, size_t n, int cancel_fd, bcast_stats *stats,
                      bcast_err *err) {
  if (!c->armed || c->mine.plan_hash != p->hash)
    return bcast__fail(err, BCAST_EINVAL,
                       "plan '%s': rank %u made no colocated export for it (bcast_engine_coloc_export "
                       "comes before the ack)", p->id, rank);
  uint32_t ns = coloc_nsources(p);
  uint32_t *map = malloc((p->ntensors ? p->ntensors : 1) * sizeof *map);
  if (!map) return bcast__fail(err, BCAST_ENOMEM, "colocated execute: no memory");
  int rc = bcast__plan_bind(p, local, n, 0, map, err);
  if (!rc && layout_sig(p, local, map, g->device) != c->sig)
    rc = bcast__fail(err, BCAST_EINVAL,
                     "plan '%s': rank %u's tensors moved since its colocated export", p->id, rank);
  free(map);
  if (rc) return rc;
  double t0 = bcast__now(), deadline = bcast__deadline(g->timeout_s, p->deadline_unix_ms);
  cudaError_t ce;
  for (;;) {
    if ((ce = cudaMemcpyAsync(&c->pinned[1], c->flag, 8ull * ns, cudaMemcpyDeviceToHost, g->s_cast)) !=
            cudaSuccess ||
        (ce = cudaStreamSynchronize(g->s_cast)) != cudaSuccess)
      return CUDA_FAIL(err, ce, "plan '%s': reading the done words: %s", p->id, cudaGetErrorString(ce));
    uint32_t late = 0, first = rx_missing(c, p, ns, &late);
    if (first == ns) break;
    if (cancelled(cancel_fd))
      return bcast__fail(err, BCAST_ECANCELED, "plan '%s': cancelled while waiting for the sender",
                         p->id);
    if (bcast__now() > deadline) {
      uint32_t who = ns > 1 ? first : p->root_rank;
      if (late > 1)
        return bcast__fail(err, BCAST_ETIMEDOUT,
                           "plan '%s': rank %u waited %.1f s for the sender (source rank %u and %u "
                           "more of %u sources) to finish its writes; none came by the deadline",
                           p->id, rank, bcast__now() - t0, who, late - 1, ns);
      return bcast__fail(err, BCAST_ETIMEDOUT,
                         "plan '%s': rank %u waited %.1f s for the sender (source rank %u%s) to "
                         "finish its writes; none came by the deadline",
                         p->id, rank, bcast__now() - t0, who,
                         ns > 1 ? ", the others are done" : "");
    }
    nap(bcast__now() - t0 < 2e-3 ? 10e-6 : 100e-6);
  }
  double total = bcast__now() - t0;
  /* Cleared again, so that running the same plan once more waits anew. */
  if ((ce = cudaMemsetAsync(c->flag, 0, 8ull * ns, g->s_cast)) != cudaSuccess ||
      (ce = cudaStreamSynchronize(g->s_cast)) != cudaSuccess)
    return CUDA_FAIL(err, ce, "plan '%s': clearing the done words: %s", p->id, cudaGetErrorString(ce));
  if (stats) {
    memset(stats, 0, sizeof *stats);
    stats->mode = BCAST_MODE_COLOCATED;
    stats->transport = "cuda-ipc";
    stats->wire_bytes = bcast_plan_wire_bytes(p);
    stats->total_s = total;
    stats->exposed_measured = 1;
    stats->exposed_s = total;
    stats->gbps = total > 0 ? (double)stats->wire_bytes / total / 1e9 : 0;
  }
  return BCAST_OK;
}

int bcast__coloc_execute(bcast_coloc *c, bcast_gpu *g, const bcast_plan *p, uint32_t rank,
                         const bcast_tensor *local, size_t n, int cancel_fd, bcast_stats *stats,
                         bcast_err *err) {
  if (!c || !g || !p || (!local && n))
    return bcast__fail(err, BCAST_EINVAL, "colocated execute: NULL argument");
  if (p->mode != BCAST_MODE_COLOCATED)
    return bcast__fail(err, BCAST_EINVAL, "colocated execute: plan mode is %s", bcast_mode_name(p->mode));
  uint32_t ns = coloc_nsources(p);
  if (ns > COLOC_MAX_SOURCES)
    return bcast__fail(err, BCAST_ENOTSUP, "plan '%s': %u sources; colocated receivers wait for at most %u",
                       p->id, ns, COLOC_MAX_SOURCES);
  /* One source stages every bucket on the root; several stage their own
   * (validation holds source_rank < S and stage rank = source rank). */
  for (size_t b = 0; ns == 1 && b < p->nbuckets; b++)
    if (p->buckets[b].source_rank != p->root_rank || p->buckets[b].stage_rank != p->root_rank)
      return bcast__fail(err, BCAST_ENOTSUP,
                         "bucket %zu (layer %u): source rank %u / stage rank %u differ from root %u; "
                         "colocated mode with one source sends and stages every bucket on the root",
                         b, p->buckets[b].layer, p->buckets[b].source_rank, p->buckets[b].stage_rank,
                         p->root_rank);
  cudaError_t ce = cudaSetDevice(g->device);
  if (ce != cudaSuccess)
    return CUDA_FAIL(err, ce, "cudaSetDevice(%d): %s", g->device, cudaGetErrorString(ce));
  return coloc_is_source(p, rank) ? coloc_send(c, g, p, rank, local, n, cancel_fd, stats, err)
                                  : coloc_recv(c, g, p, rank, local, n, cancel_fd, stats, err);
}

#else /* !RLORCH_HAVE_CUDA */

#define COLOC_NOTSUP(err) \
  bcast__fail(err, BCAST_ENOTSUP, "built without CUDA: colocated mode (CUDA IPC) unavailable")

int bcast__coloc_new(bcast_gpu *g, bcast_coloc **out, bcast_err *err) {
  (void)g;
  *out = NULL;
  return COLOC_NOTSUP(err);
}
void bcast__coloc_free(bcast_coloc *c, bcast_gpu *g) { (void)c, (void)g; }
size_t bcast__coloc_mapped(const bcast_coloc *c) {
  (void)c;
  return 0;
}
int bcast__coloc_export(bcast_coloc *c, bcast_gpu *g, const bcast_plan *p, uint32_t rank,
                        const bcast_tensor *local, size_t n, uint8_t **out, size_t *len,
                        bcast_err *err) {
  (void)c, (void)g, (void)p, (void)rank, (void)local, (void)n;
  *out = NULL;
  *len = 0;
  return COLOC_NOTSUP(err);
}
int bcast__coloc_import(bcast_coloc *c, bcast_gpu *g, const bcast_plan *p, uint32_t rank,
                        const uint8_t *buf, size_t len, bcast_err *err) {
  (void)c, (void)g, (void)p, (void)rank, (void)buf, (void)len;
  return COLOC_NOTSUP(err);
}
int bcast__coloc_execute(bcast_coloc *c, bcast_gpu *g, const bcast_plan *p, uint32_t rank,
                         const bcast_tensor *local, size_t n, int cancel_fd, bcast_stats *stats,
                         bcast_err *err) {
  (void)c, (void)g, (void)p, (void)rank, (void)local, (void)n, (void)cancel_fd, (void)stats;
  return COLOC_NOTSUP(err);
}

#endif /* RLORCH_HAVE_CUDA */
