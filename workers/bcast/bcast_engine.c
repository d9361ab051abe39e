/* The engine: one participant's handle.  It owns the host transport's
 * listening socket (root) and the GPU backend (when opened), checks a plan
 * against what this build and machine can run, and dispatches it. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "workers/bcast/bcast_internal.h"

#define ENGINE_DEFAULT_TIMEOUT_S 60.0

/* Host copies of GPU-resident tensors for the host transport, kept across
 * plans: allocating and faulting in gigabytes every step would dominate. */
typedef struct shadow_buf {
  void *mem;
  size_t bytes;
} shadow_buf;

struct bcast_engine {
  bcast_engine_opts o;
  /* Cancellation, the only state shared with another thread. The pipe is
   * written only while the cancelled plan is the running one, and drained
   * when a plan starts, so "readable" means "cancel this execution". */
  pthread_mutex_t cancel_mu;
  int cancel_pipe[2];
  char cancelled[sizeof ((bcast_plan *)0)->id]; /* latest cancelled plan id */
  char running[sizeof ((bcast_plan *)0)->id];   /* plan being executed, "" if none */
  int listen_fd;
  char bound[96];
  bcast_gpu *gpu;
  bcast_coloc *coloc; /* colocated mode, made at the first export or import */
  bcast_caps caps;
  shadow_buf *shadows; /* one per local tensor index, grown on demand */
  size_t nshadows;
};

double bcast__deadline(double timeout_s, int64_t deadline_unix_ms) {
  double now = bcast__now(), d = now + timeout_s;
  if (deadline_unix_ms > 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double left = (double)deadline_unix_ms / 1e3 - ((double)ts.tv_sec + (double)ts.tv_nsec * 1e-9);
    if (now + left < d) d = now + left;
  }
  return d;
}

void bcast_stats_free(bcast_stats *s) {
  if (!s) return;
  free(s->buckets);
  s->buckets = NULL;
  s->nbuckets = 0;
}

int bcast_engine_new(const bcast_engine_opts *o, bcast_engine **out, bcast_err *err) {
  if (!o || !out) return bcast__fail(err, BCAST_EINVAL, "engine_new: NULL argument");
  *out = NULL;
  if (o->staging_buffers == 1)
    return bcast__fail(err, BCAST_EINVAL, "engine_new: staging_buffers must be >= 2 (0 for the default)");
  if (o->timeout_s < 0) return bcast__fail(err, BCAST_EINVAL, "engine_new: negative timeout_s");
  bcast_engine *e = calloc(1, sizeof *e);
  if (!e) return bcast__fail(err, BCAST_ENOMEM, "engine_new: out of memory");
  e->o = *o;
  e->o.host_listen = NULL; /* not kept: the caller's string may not outlive us */
  if (!e->o.staging_buffers) e->o.staging_buffers = 3;
  if (e->o.timeout_s == 0) e->o.timeout_s = ENGINE_DEFAULT_TIMEOUT_S;
  e->listen_fd = -1;
  pthread_mutex_init(&e->cancel_mu, NULL);
  if (pipe(e->cancel_pipe) != 0) {
    int en = errno;
    pthread_mutex_destroy(&e->cancel_mu);
    free(e);
    return bcast__fail(err, BCAST_EIO, "engine_new: cancel pipe: %s", strerror(en));
  }
  for (int i = 0; i < 2; i++) {
    fcntl(e->cancel_pipe[i], F_SETFD, FD_CLOEXEC);
    fcntl(e->cancel_pipe[i], F_SETFL, fcntl(e->cancel_pipe[i], F_GETFL) | O_NONBLOCK);
  }
  bcast_caps_probe(&e->caps);
  int rc = BCAST_OK;
  if (o->host_listen) rc = bcast__host_listen(o->host_listen, &e->listen_fd, e->bound, sizeof e->bound, err);
  if (!rc && o->device >= 0) rc = bcast__gpu_open(&e->o, &e->gpu, err);
  if (rc) {
    bcast_engine_free(e);
    return rc;
  }
  *out = e;
  return BCAST_OK;
}

void bcast_engine_free(bcast_engine *e) {
  if (!e) return;
  if (e->listen_fd >= 0) close(e->listen_fd);
  close(e->cancel_pipe[0]);
  close(e->cancel_pipe[1]);
  pthread_mutex_destroy(&e->cancel_mu);
  bcast__coloc_free(e->coloc, e->gpu); /* mappings and the done word go before the device */
  if (e->gpu) bcast__gpu_close(e->gpu);
  for (size_t i = 0; i < e->nshadows; i++) free(e->shadows[i].mem);
  free(e->shadows);
  free(e);
}

const char *bcast_engine_data_address(const bcast_engine *e) {
  return e && e->listen_fd >= 0 ? e->bound : NULL;
}

int bcast_engine_nccl_id(bcast_engine *e, uint8_t id[128], bcast_err *err) {
  if (!e || !id) return bcast__fail(err, BCAST_EINVAL, "engine_nccl_id: NULL argument");
  if (!e->gpu) return bcast__fail(err, BCAST_ENOTSUP, "engine has no GPU backend (opened with device -1)");
  return bcast__gpu_nccl_id(e->gpu, id, err);
}

/* The host transport moves every bucket from the root and reads/writes host
 * memory only; say clearly when a plan asks for more. */
static int host_mode_check(const bcast_engine *e, const bcast_plan *p, const bcast_tensor *local,
                           const uint32_t *map, int sender, bcast_err *err) {
  uint32_t ns = bcast__plan_nsources(p);
  /* Several sources: each bucket's source sends and stages it (validated). */
  for (size_t b = 0; b < p->nbuckets && ns == 1; b++)
    if (p->buckets[b].source_rank != p->root_rank || p->buckets[b].stage_rank != p->root_rank)
      return bcast__fail(err, BCAST_ENOTSUP,
                         "bucket %zu (layer %u): source rank %u / stage rank %u differ from root %u; the host "
                         "transport sends and stages every bucket on the root", b, p->buckets[b].layer,
                         p->buckets[b].source_rank, p->buckets[b].stage_rank, p->root_rank);
  for (size_t i = 0; i < p->ntensors; i++)
    if (map[i] != UINT32_MAX && local[map[i]].residency == BCAST_RES_GPU && !e->gpu)
      return bcast__fail(err, BCAST_ENOTSUP, "tensor '%s': GPU-resident, but this engine has no GPU backend "
                         "to move it through host memory", p->tensors[i].name);
  if (sender && e->listen_fd < 0)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': this rank is the host-mode root but the engine was opened "
                       "without host_listen", p->id);
  if (!sender && !p->host_endpoint[0])
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': host mode without host_endpoint", p->id);
  for (uint32_t r = 1; !sender && r < ns; r++)
    if (!bcast_plan_source_endpoint(p, r)[0])
      return bcast__fail(err, BCAST_EINVAL, "plan '%s': host mode without an endpoint for source rank %u", p->id,
                         r);
  return BCAST_OK;
}

static int plan_runnable(const bcast_engine *e, const bcast_plan *p, bcast_err *err) {
  int rc = bcast_plan_validate(p, err);
  if (rc) return rc;
  if (p->hash != bcast_plan_hash(p))
    return bcast__fail(err, BCAST_EMISMATCH, "plan '%s': hash %016llx does not match its contents (%016llx)", p->id,
                       (unsigned long long)p->hash, (unsigned long long)bcast_plan_hash(p));
  if (e->o.rank >= p->world_size)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': engine rank %u >= world size %u", p->id, e->o.rank,
                       p->world_size);
  char why[256];
  if (!bcast_mode_available(&e->caps, p->mode, why, sizeof why))
    return bcast__fail(err, BCAST_ENOTSUP, "plan '%s': %s mode unavailable here: %s", p->id,
                       bcast_mode_name(p->mode), why);
  if (p->mode != BCAST_MODE_HOST && !e->gpu)
    return bcast__fail(err, BCAST_ENOTSUP, "plan '%s': %s mode needs an engine opened with a CUDA device", p->id,
                       bcast_mode_name(p->mode));
  return BCAST_OK;
}

/* Direct and staged mode move whole tensors from one source (validation
 * refuses a plan of several there); a shard among the local tensors is
 * refused here, before any backend reads past it. Host and colocated
 * sources bind shards themselves (bcast__plan_bind_source). */
static int whole_tensors(const bcast_plan *p, const bcast_tensor *local, size_t n, bcast_err *err) {
  for (size_t i = 0; local && i < n; i++)
    if (local[i].shard_offset || (local[i].shard_elems && local[i].shard_elems != bcast_tensor_elems(&local[i])))
      return bcast__fail(err, BCAST_EINVAL, "tensor '%s': a shard (elements [%llu, +%llu)); %s mode needs whole "
                         "tensors, only host and colocated mode send from shards", local[i].name,
                         (unsigned long long)local[i].shard_offset, (unsigned long long)local[i].shard_elems,
                         bcast_mode_name(p->mode));
  return BCAST_OK;
}

static int cast_threads(const bcast_engine *e) {
  int t = e->caps.cpu_threads - 1; /* one core sends */
  return t < 1 ? 1 : t > 8 ? 8 : t;
}

/* Host mode with GPU-resident tensors on this rank (a GPU trainer feeding
 * inference workers without one, or the reverse): the host transport works on
 * host memory, so those tensors go through host copies made here. The copies
 * are counted as PCIe bytes and time; host mode is the slow path by nature. */
typedef struct host_shadow {
  bcast_tensor *t; /* copy of the caller's array, GPU tensors pointed at host memory */
  size_t n;
  uint64_t bytes;
} host_shadow;

static void shadow_free(host_shadow *h) {
  free(h->t);
  memset(h, 0, sizeof *h);
}

/* The engine's host buffer for local tensor i, at least `bytes` long. */
static void *shadow_buffer(bcast_engine *e, size_t i, size_t bytes) {
  if (i >= e->nshadows) {
    size_t n = i + 1 > 2 * e->nshadows ? i + 1 : 2 * e->nshadows;
    shadow_buf *v = realloc(e->shadows, n * sizeof *v);
    if (!v) return NULL;
    memset(v + e->nshadows, 0, (n - e->nshadows) * sizeof *v);
    e->shadows = v;
    e->nshadows = n;
  }
  shadow_buf *b = &e->shadows[i];
  if (b->bytes < bytes) {
    free(b->mem);
    b->mem = malloc(bytes ? bytes : 1);
    b->bytes = b->mem ? bytes : 0;
  }
  return b->mem;
}

static int shadow_make(bcast_engine *e, const bcast_tensor *local, size_t n, int sender,
                       host_shadow *h, bcast_err *err) {
  memset(h, 0, sizeof *h);
  h->t = malloc((n ? n : 1) * sizeof *h->t);
  h->n = n;
  if (!h->t) return bcast__fail(err, BCAST_ENOMEM, "host copies of GPU tensors: out of memory");
  memcpy(h->t, local, n * sizeof *h->t);
  for (size_t i = 0; i < n; i++) {
    if (local[i].residency != BCAST_RES_GPU) continue;
    size_t bytes = (size_t)(sender ? bcast_tensor_held(&local[i]) : bcast_tensor_elems(&local[i])) *
                   bcast_dtype_size(sender ? local[i].storage_dtype : local[i].wire_dtype);
    void *mem = shadow_buffer(e, i, bytes);
    if (!mem) {
      shadow_free(h);
      return bcast__fail(err, BCAST_ENOMEM, "tensor '%s': no host memory for its %zu-byte copy",
                         local[i].name, bytes);
    }
    if (sender) {
      int rc = bcast__gpu_copy(e->gpu, mem, local[i].data, bytes, 0, err);
      if (rc) {
        shadow_free(h);
        return rc;
      }
    }
    h->t[i].data = mem;
    h->t[i].residency = BCAST_RES_HOST_PAGEABLE;
    h->bytes += bytes;
  }
  return BCAST_OK;
}

/* Receiver: the received host copies go to their GPU tensors. */
static int shadow_flush(bcast_engine *e, const bcast_tensor *local, host_shadow *h, bcast_err *err) {
  for (size_t i = 0; i < h->n; i++) {
    if (local[i].residency != BCAST_RES_GPU) continue;
    size_t bytes = (size_t)bcast_tensor_elems(&local[i]) * bcast_dtype_size(local[i].wire_dtype);
    int rc = bcast__gpu_copy(e->gpu, local[i].data, h->t[i].data, bytes, 1, err);
    if (rc) return rc;
  }
  return BCAST_OK;
}

static int has_gpu_tensor(const bcast_tensor *local, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (local[i].residency == BCAST_RES_GPU) return 1;
  return 0;
}

int bcast_engine_cancel(bcast_engine *e, const char *plan_id) {
  if (!e || !plan_id || !plan_id[0]) return BCAST_EINVAL;
  pthread_mutex_lock(&e->cancel_mu);
  snprintf(e->cancelled, sizeof e->cancelled, "%s", plan_id);
  if (!strcmp(e->running, e->cancelled)) {
    ssize_t w = write(e->cancel_pipe[1], "x", 1); /* full pipe: already signalled */
    (void)w;
  }
  pthread_mutex_unlock(&e->cancel_mu);
  return BCAST_OK;
}

/* Marks `p` running unless it was cancelled already; `stale` gets the
 * cancelled id (a root ignores receivers that still present it). */
static int cancel_begin(bcast_engine *e, const bcast_plan *p, char *stale, size_t stalelen, bcast_err *err) {
  char drain[64];
  pthread_mutex_lock(&e->cancel_mu);
  int cancelled = !strcmp(e->cancelled, p->id);
  if (!cancelled) {
    snprintf(e->running, sizeof e->running, "%s", p->id);
    while (read(e->cancel_pipe[0], drain, sizeof drain) > 0) {
    }
  }
  snprintf(stale, stalelen, "%s", e->cancelled);
  pthread_mutex_unlock(&e->cancel_mu);
  return cancelled ? bcast__fail(err, BCAST_ECANCELED, "plan '%s': cancelled before it started", p->id) : BCAST_OK;
}

static void cancel_end(bcast_engine *e) {
  pthread_mutex_lock(&e->cancel_mu);
  e->running[0] = '\0';
  pthread_mutex_unlock(&e->cancel_mu);
}

static int execute_host(bcast_engine *e, const bcast_plan *p, const bcast_tensor *local, size_t n,
                        const char *stale, bcast_stats *stats, bcast_err *err);

int bcast_engine_execute(bcast_engine *e, const bcast_plan *p, const bcast_tensor *local, size_t n,
                         bcast_stats *stats, bcast_err *err) {
  if (stats) memset(stats, 0, sizeof *stats);
  if (!e || !p) return bcast__fail(err, BCAST_EINVAL, "engine_execute: NULL argument");
  int rc = plan_runnable(e, p, err);
  if (!rc && p->mode != BCAST_MODE_HOST && p->mode != BCAST_MODE_COLOCATED) rc = whole_tensors(p, local, n, err);
  if (rc) return rc;
  char stale[sizeof p->id];
  rc = cancel_begin(e, p, stale, sizeof stale, err);
  if (rc) return rc;
  if (p->mode == BCAST_MODE_COLOCATED)
    rc = e->coloc ? bcast__coloc_execute(e->coloc, e->gpu, p, e->o.rank, local, n, e->cancel_pipe[0],
                                         stats, err)
                  : bcast__fail(err, BCAST_EINVAL,
                                "plan '%s': colocated mode needs the receivers' exports imported "
                                "first (bcast_engine_coloc_export / bcast_engine_coloc_import)",
                                p->id);
  else if (p->mode != BCAST_MODE_HOST) rc = bcast__gpu_execute(e->gpu, p, e->o.rank, local, n, e->cancel_pipe[0], stats, err);
  else rc = execute_host(e, p, local, n, stale, stats, err);
  cancel_end(e);
  return rc;
}

/* What export and import need: a valid colocated plan this engine can run,
 * and the colocated state (made once). */
static int coloc_ready(bcast_engine *e, const bcast_plan *p, bcast_err *err) {
  if (!e || !p) return bcast__fail(err, BCAST_EINVAL, "colocated: NULL argument");
  int rc = plan_runnable(e, p, err);
  if (rc) return rc;
  if (p->mode != BCAST_MODE_COLOCATED)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': mode %s, exports are for colocated plans", p->id,
                       bcast_mode_name(p->mode));
  if (!e->coloc) rc = bcast__coloc_new(e->gpu, &e->coloc, err);
  return rc;
}

int bcast_engine_coloc_export(bcast_engine *e, const bcast_plan *p, const bcast_tensor *local,
                              size_t n, uint8_t **out, size_t *len, bcast_err *err) {
  if (!out || !len) return bcast__fail(err, BCAST_EINVAL, "coloc_export: NULL argument");
  *out = NULL;
  *len = 0;
  int rc = coloc_ready(e, p, err);
  return rc ? rc : bcast__coloc_export(e->coloc, e->gpu, p, e->o.rank, local, n, out, len, err);
}

int bcast_engine_coloc_import(bcast_engine *e, const bcast_plan *p, uint32_t rank, const uint8_t *buf,
                              size_t len, bcast_err *err) {
  int rc = coloc_ready(e, p, err);
  uint32_t ns = rc ? 1 : bcast__plan_nsources(p);
  if (!rc && ns == 1 && e->o.rank != p->root_rank)
    rc = bcast__fail(err, BCAST_EINVAL, "plan '%s': rank %u imports exports, but only the sender (rank %u) "
                     "writes into receivers", p->id, e->o.rank, p->root_rank);
  if (!rc && ns > 1 && e->o.rank >= ns)
    rc = bcast__fail(err, BCAST_EINVAL, "plan '%s': rank %u imports exports, but only the senders (source "
                     "ranks 0..%u) write into receivers", p->id, e->o.rank, ns - 1);
  return rc ? rc : bcast__coloc_import(e->coloc, e->gpu, p, rank, buf, len, err);
}

size_t bcast_engine_coloc_mappings(const bcast_engine *e) {
  return e ? bcast__coloc_mapped(e->coloc) : 0;
}

static int execute_host(bcast_engine *e, const bcast_plan *p, const bcast_tensor *local, size_t n,
                        const char *stale, bcast_stats *stats, bcast_err *err) {
  uint32_t ns = bcast__plan_nsources(p);
  int sender = ns > 1 ? e->o.rank < ns : e->o.rank == p->root_rank;
  uint32_t *map = malloc((p->ntensors ? p->ntensors : 1) * sizeof *map);
  if (!map) return bcast__fail(err, BCAST_ENOMEM, "engine_execute: out of memory");
  /* A source binds what its buckets carry, from whole tensors or shards. */
  int rc = sender ? bcast__plan_bind_source(p, e->o.rank, local, n, map, err)
                  : bcast__plan_bind_receiver(p, e->o.rank, local, n, map, err);
  if (!rc) rc = host_mode_check(e, p, local, map, sender, err);
  /* The host copies of GPU tensors are of whole tensors. */
  if (!rc && !sender && bcast_plan_rank_view(p, e->o.rank) != BCAST_VIEW_WHOLE && has_gpu_tensor(local, n))
    rc = bcast__fail(err, BCAST_ENOTSUP, "plan '%s': rank %u holds part of the model; on the host transport "
                     "a receiver of a view keeps its parts in host memory", p->id, e->o.rank);
  host_shadow h = {0};
  const bcast_tensor *caller = local;
  double t0 = bcast__now(), copy_s = 0;
  if (!rc && has_gpu_tensor(local, n)) {
    rc = shadow_make(e, local, n, sender, &h, err);
    local = h.t;
    copy_s = bcast__now() - t0;
  }
  bcast__host_io io = {.timeout_s = e->o.timeout_s, .cancel_fd = e->cancel_pipe[0], .stale_id = stale};
  if (!rc && sender) rc = bcast__host_send(e->listen_fd, p, e->o.rank, local, map, &io, cast_threads(e), stats, err);
  else if (!rc) rc = bcast__host_recv(e->listen_fd, p, e->o.rank, local, map, &io, stats, err);
  if (!rc && h.t && !sender) {
    double t1 = bcast__now();
    rc = shadow_flush(e, caller, &h, err);
    copy_s += bcast__now() - t1;
  }
  if (!rc && h.t && stats) {
    stats->pcie_bytes += h.bytes;
    stats->h2d_s += copy_s;
    stats->total_s = bcast__now() - t0;
  }
  shadow_free(&h);
  free(map);
  return rc;
}
