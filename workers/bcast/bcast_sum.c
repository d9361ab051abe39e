/* The checksum of one source's part of a plan, the same on both sides of a
 * broadcast of several sources: a source computes it from its shard, each
 * receiver from its own tensors once the broadcast is in, so what is
 * compared is what each side holds, not what crossed the wire. */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "workers/bcast/bcast_internal.h"

#define SUM_CHUNK_ELEMS 65536 /* elements cast at a time on a source */

static int name_cmp(const void *a, const void *b) {
  const bcast_tensor *x = *(const bcast_tensor *const *)a, *y = *(const bcast_tensor *const *)b;
  return strncmp(x->name, y->name, BCAST_NAME_MAX);
}

/* `count` elements at `src` (dtype `have`) into the hash in the wire dtype
 * `wd`: as they are when the dtypes agree, else cast a chunk at a time
 * through `buf`. */
static int sum_elems(XXH3_state_t *h, const char *name, bcast_dtype wd, bcast_dtype have, const uint8_t *src,
                     uint64_t count, void *buf, bcast_err *err) {
  size_t hs = bcast_dtype_size(have), ws = bcast_dtype_size(wd);
  if (have == wd) {
    if (XXH3_64bits_update(h, src, count * ws) != XXH_OK)
      return bcast__fail(err, BCAST_EIO, "tensor '%s': checksum update failed", name);
    return BCAST_OK;
  }
  for (uint64_t done = 0; done < count;) {
    size_t k = count - done < SUM_CHUNK_ELEMS ? (size_t)(count - done) : SUM_CHUNK_ELEMS;
    int rc = bcast_cast_cpu(buf, wd, src + done * hs, have, k);
    if (rc) return bcast__fail(err, rc, "tensor '%s': cast from %s to %s failed", name, bcast_dtype_name(have),
                               bcast_dtype_name(wd));
    if (XXH3_64bits_update(h, buf, k * ws) != XXH_OK)
      return bcast__fail(err, BCAST_EIO, "tensor '%s': checksum update failed", name);
    done += k;
  }
  return BCAST_OK;
}

/* One run of a slice restricted to a part: a source reads its shard (full
 * tensor's element order), a receiver of a view its dense part buffer. */
typedef struct run_ctx {
  XXH3_state_t *h;
  const bcast_tensor *pt; /* the plan's tensor (full shape) */
  const bcast_tensor *t;  /* the local one */
  const bcast_part *part;
  int wire;
  void *buf;
  bcast_err *err;
} run_ctx;

static int sum_run(void *arg, uint64_t elem, uint64_t n) {
  run_ctx *c = arg;
  const bcast_tensor *t = c->t;
  bcast_dtype wd = c->pt->wire_dtype, have = c->wire ? wd : t->storage_dtype;
  uint64_t at = c->wire ? bcast__part_index(c->pt, c->part, elem) : elem - t->shard_offset;
  return sum_elems(c->h, c->pt->name, wd, have, (const uint8_t *)t->data + at * bcast_dtype_size(have), n, c->buf,
                   c->err);
}

/* Whether local tensor t holds what slice sl restricted to `part` needs. */
static int holds(const bcast_plan *p, const bcast_tensor *pt, const bcast_tensor *t, const bcast_slice *sl,
                 const bcast_part *part, uint32_t source, int wire, bcast_err *err) {
  if (wire && part->kind != BCAST_PART_WHOLE) {
    const bcast_part *lp = &t->part;
    if (lp->kind != part->kind || lp->dim != part->dim || lp->start != part->start || lp->count != part->count)
      return bcast__fail(err, BCAST_EINVAL, "tensor '%s': the local tensor is not the view's part (kind %d, dim %u, "
                         "start %llu, count %llu)", pt->name, part->kind, part->dim,
                         (unsigned long long)part->start, (unsigned long long)part->count);
  } else {
    uint64_t lo = t->shard_offset, hi = lo + bcast_tensor_held(t);
    if (sl->elem_offset < lo || sl->elem_offset + sl->elem_count > hi)
      return bcast__fail(err, BCAST_EINVAL, "tensor '%s': source rank %u sends [%llu, %llu), the local tensor holds "
                         "[%llu, %llu)", pt->name, source, (unsigned long long)sl->elem_offset,
                         (unsigned long long)(sl->elem_offset + sl->elem_count), (unsigned long long)lo,
                         (unsigned long long)hi);
  }
  (void)p;
  if (t->residency == BCAST_RES_GPU)
    return bcast__fail(err, BCAST_ENOTSUP, "tensor '%s': on a GPU; a source checksum reads host memory", pt->name);
  if (!t->data) return bcast__fail(err, BCAST_EINVAL, "tensor '%s': no data", pt->name);
  return BCAST_OK;
}

int bcast_plan_source_checksum(const bcast_plan *p, uint32_t source, const bcast_tensor *local,
                               size_t n, int wire, uint64_t *out, bcast_err *err) {
  return bcast_plan_view_checksum(p, source, BCAST_VIEW_WHOLE, local, n, wire, out, err);
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
  void *buf = malloc((size_t)SUM_CHUNK_ELEMS * 4);
  XXH3_state_t *h = XXH3_createState();
  int rc = BCAST_OK;
  if (!by_name || !buf || !h) {
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
      if (part->kind == BCAST_PART_NONE) continue; /* the view gets none of it: need not be there */
      const bcast_tensor key_t = *pt, *key = &key_t;
      const bcast_tensor **hit = bsearch(&key, by_name, n, sizeof *by_name, name_cmp);
      if (!hit) {
        rc = bcast__fail(err, BCAST_EINVAL, "tensor '%s': not among the %zu local tensors", pt->name, n);
        break;
      }
      if ((rc = holds(p, pt, *hit, sl, part, source, wire, err))) break;
      run_ctx c = {h, pt, *hit, part, wire, buf, err};
      rc = bcast__part_runs(pt, part, sl->elem_offset, sl->elem_count, sum_run, &c);
    }
  }
  if (!rc) *out = XXH3_64bits_digest(h);
out:
  if (h) XXH3_freeState(h);
  free(buf);
  free(by_name);
  return rc;
}
