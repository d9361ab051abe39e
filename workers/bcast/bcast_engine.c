/* The engine: one participant's handle.  It owns the host transport's
 * listening socket (root) and the GPU backend (when opened), checks a plan
 * against what this build and machine can run, and dispatches it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "workers/bcast/bcast_internal.h"

#define ENGINE_DEFAULT_TIMEOUT_S 60.0

struct bcast_engine {
  bcast_engine_opts o;
  int listen_fd;
  char bound[96];
  bcast_gpu *gpu;
  bcast_caps caps;
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
  if (e->gpu) bcast__gpu_close(e->gpu);
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
  for (size_t b = 0; b < p->nbuckets; b++)
    if (p->buckets[b].source_rank != p->root_rank || p->buckets[b].stage_rank != p->root_rank)
      return bcast__fail(err, BCAST_ENOTSUP,
                         "bucket %zu (layer %u): source rank %u / stage rank %u differ from root %u; the host "
                         "transport sends and stages every bucket on the root", b, p->buckets[b].layer,
                         p->buckets[b].source_rank, p->buckets[b].stage_rank, p->root_rank);
  for (size_t i = 0; i < p->ntensors; i++)
    if (local[map[i]].residency == BCAST_RES_GPU)
      return bcast__fail(err, BCAST_ENOTSUP, "tensor '%s': GPU-resident, but the host transport reads and writes "
                         "host memory only", p->tensors[i].name);
  if (sender && e->listen_fd < 0)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': this rank is the host-mode root but the engine was opened "
                       "without host_listen", p->id);
  if (!sender && !p->host_endpoint[0])
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': host mode without host_endpoint", p->id);
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

static int cast_threads(const bcast_engine *e) {
  int t = e->caps.cpu_threads - 1; /* one core sends */
  return t < 1 ? 1 : t > 8 ? 8 : t;
}

int bcast_engine_execute(bcast_engine *e, const bcast_plan *p, const bcast_tensor *local, size_t n,
                         bcast_stats *stats, bcast_err *err) {
  if (stats) memset(stats, 0, sizeof *stats);
  if (!e || !p) return bcast__fail(err, BCAST_EINVAL, "engine_execute: NULL argument");
  int rc = plan_runnable(e, p, err);
  if (rc) return rc;
  if (p->mode != BCAST_MODE_HOST) return bcast__gpu_execute(e->gpu, p, e->o.rank, local, n, stats, err);
  int sender = e->o.rank == p->root_rank;
  uint32_t *map = malloc((p->ntensors ? p->ntensors : 1) * sizeof *map);
  if (!map) return bcast__fail(err, BCAST_ENOMEM, "engine_execute: out of memory");
  rc = bcast__plan_bind(p, local, n, sender, map, err);
  if (!rc) rc = host_mode_check(e, p, local, map, sender, err);
  if (!rc && sender) rc = bcast__host_send(e->listen_fd, p, local, map, e->o.timeout_s, cast_threads(e), stats, err);
  else if (!rc) rc = bcast__host_recv(p, e->o.rank, local, map, e->o.timeout_s, stats, err);
  free(map);
  return rc;
}
