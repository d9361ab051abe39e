/* The checksum of one source's part of a plan, the same on both sides of a
 * broadcast of several sources: a source computes it from its shard, each
 * receiver from its own tensors once the broadcast is in, so what is
 * compared is what each side holds, not what crossed the wire. */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "workers/bcast/bcast_internal.h"

#ifdef RLORCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define SUM_CHUNK_ELEMS 65536 /* elements cast at a time on a source */

static int name_cmp(const void *a, const void *b) {
  const bcast_tensor *x = *(const bcast_tensor *const *)a, *y = *(const bcast_tensor *const *)b;
  return strncmp(x->name, y->name, BCAST_NAME_MAX);
}

/* Elements [off, off + count) of `t`, which must hold them, into the hash in
 * the wire dtype `wd`: as they are when `wire` (or when storage is the wire
 * dtype), else cast a chunk at a time through `buf`. */
static int sum_range(XXH3_state_t *h, const bcast_tensor *t, bcast_dtype wd, int wire, uint64_t off,
                     uint64_t count, void *buf, void *bounce, bcast_err *err) {
  bcast_dtype have = wire ? wd : t->storage_dtype;
  size_t hs = bcast_dtype_size(have), ws = bcast_dtype_size(wd);
  const uint8_t *src = (const uint8_t *)t->data + (off - t->shard_offset) * hs;
  if (t->residency == BCAST_RES_GPU) {
    /* A chunk at a time through host memory: what the GPU holds is summed
     * as the same bytes a host copy would give. */
#ifdef RLORCH_HAVE_CUDA
    for (uint64_t done = 0; done < count;) {
      size_t k = count - done < SUM_CHUNK_ELEMS ? (size_t)(count - done) : SUM_CHUNK_ELEMS;
      cudaError_t e = cudaMemcpy(bounce, src + done * hs, k * hs, cudaMemcpyDeviceToHost);
      if (e != cudaSuccess)
        return bcast__fail(err, BCAST_ECUDA, "tensor '%s': copy from GPU %d for its checksum: %s", t->name,
                           t->device, cudaGetErrorString(e));
      bcast_tensor host = *t;
      host.residency = BCAST_RES_HOST_PAGEABLE;
      host.data = bounce;
      host.shard_offset = 0;
      int rc = sum_range(h, &host, wd, wire, 0, k, buf, NULL, err);
      if (rc) return rc;
      done += k;
    }
    return BCAST_OK;
#else
    (void)bounce;
    return bcast__fail(err, BCAST_ENOTSUP, "tensor '%s': on a GPU, and this build has no CUDA", t->name);
#endif
  }
  if (have == wd) {
    if (XXH3_64bits_update(h, src, count * ws) != XXH_OK)
      return bcast__fail(err, BCAST_EIO, "tensor '%s': checksum update failed", t->name);
    return BCAST_OK;
  }
  for (uint64_t done = 0; done < count;) {
    size_t k = count - done < SUM_CHUNK_ELEMS ? (size_t)(count - done) : SUM_CHUNK_ELEMS;
    int rc = bcast_cast_cpu(buf, wd, src + done * hs, have, k);
    if (rc) return bcast__fail(err, rc, "tensor '%s': cast from %s to %s failed", t->name,
                               bcast_dtype_name(have), bcast_dtype_name(wd));
    if (XXH3_64bits_update(h, buf, k * ws) != XXH_OK)
      return bcast__fail(err, BCAST_EIO, "tensor '%s': checksum update failed", t->name);
    done += k;
  }
  return BCAST_OK;
}

typedef struct sum_ctx {
  XXH3_state_t *h;
  const bcast_tensor *t;
  bcast_dtype wd;
  int wire;
  uint64_t e0; /* the slice's first element */
  void *buf, *bounce;
  bcast_err *err;
} sum_ctx;

/* One run of the view: a source reads it at its element of the full tensor
 * (sum_range honours its shard), a receiver at its place in its own buffer
 * (the dense part; for a whole tensor the same element). */
static int sum_run(void *ud, uint64_t off, uint64_t local, uint64_t n) {
  sum_ctx *c = ud;
  return sum_range(c->h, c->t, c->wd, c->wire, c->wire ? local : c->e0 + off, n, c->buf, c->bounce, c->err);
}

int bcast_plan_view_checksum(const bcast_plan *p, uint32_t source, uint32_t view, const bcast_tensor *local,
                             size_t n, int wire, uint64_t *out, bcast_err *err) {
  if (!p || !out || (n && !local))
    return bcast__fail(err, BCAST_EINVAL, "source_checksum: NULL argument");
  uint32_t ns = (uint32_t)bcast_plan_sources(p);
  if (source >= ns)
    return bcast__fail(err, BCAST_EINVAL, "source_checksum: source rank %u, the plan has %u", source, ns);
  if (view != BCAST_VIEW_WHOLE && view >= p->nviews)
    return bcast__fail(err, BCAST_EINVAL, "view_checksum: view %u, the plan has %u", view, p->nviews);
  const bcast_tensor **by_name = malloc((n ? n : 1) * sizeof *by_name);
  void *buf = malloc((size_t)SUM_CHUNK_ELEMS * 4), *bounce = malloc((size_t)SUM_CHUNK_ELEMS * 4);
  XXH3_state_t *h = XXH3_createState();
  int rc = BCAST_OK;
  if (!by_name || !buf || !bounce || !h) {
    rc = bcast__fail(err, BCAST_ENOMEM, "source_checksum: out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) by_name[i] = &local[i];
  qsort(by_name, n, sizeof *by_name, name_cmp);
  XXH3_64bits_reset(h);
  for (size_t b = 0; b < p->nbuckets && !rc; b++) {
    const bcast_bucket *bk = &p->buckets[b];
    if (ns > 1 && bk->source_rank != source) continue;
    for (size_t s = 0; s < bk->nslices && !rc; s++) {
      const bcast_slice *sl = &bk->slices[s];
      const bcast_tensor *pt = &p->tensors[sl->tensor];
      const bcast_part *part = bcast__view_part(p, view, sl->tensor);
      if (part->kind == BCAST_PART_NONE) continue;
      const bcast_tensor key_t = *pt, *key = &key_t;
      const bcast_tensor **hit = bsearch(&key, by_name, n, sizeof *by_name, name_cmp);
      if (!hit) {
        rc = bcast__fail(err, BCAST_EINVAL, "tensor '%s': not among the %zu local tensors", pt->name, n);
        break;
      }
      const bcast_tensor *t = *hit;
      uint64_t lo = t->shard_offset, hi = lo + bcast_tensor_held(t);
      if (wire) lo = 0, hi = bcast_part_elems(pt, part); /* a receiver holds its part, dense */
      uint64_t first = wire ? 0 : sl->elem_offset, last = wire ? hi : sl->elem_offset + sl->elem_count;
      if (!wire && (first < lo || last > hi)) {
        rc = bcast__fail(err, BCAST_EINVAL, "tensor '%s': source rank %u sends [%llu, %llu), the local "
                         "tensor holds [%llu, %llu)", pt->name, source, (unsigned long long)first,
                         (unsigned long long)last, (unsigned long long)lo, (unsigned long long)hi);
        break;
      }
      if (!t->data) {
        rc = bcast__fail(err, BCAST_EINVAL, "tensor '%s': no data", pt->name);
        break;
      }
      sum_ctx c = {.h = h, .t = t, .wd = pt->wire_dtype, .wire = wire, .e0 = sl->elem_offset, .buf = buf,
                   .bounce = bounce, .err = err};
      rc = bcast__part_runs(pt, part, sl->elem_offset, sl->elem_count, sum_run, &c);
    }
  }
  if (!rc) *out = XXH3_64bits_digest(h);
out:
  if (h) XXH3_freeState(h);
  free(buf);
  free(bounce);
  free(by_name);
  return rc;
}

int bcast_plan_source_checksum(const bcast_plan *p, uint32_t source, const bcast_tensor *local,
                               size_t n, int wire, uint64_t *out, bcast_err *err) {
  return bcast_plan_view_checksum(p, source, BCAST_VIEW_WHOLE, local, n, wire, out, err);
}
