/* Receiver views: which part of every plan tensor each receiver rank holds,
 * and the runs of elements a slice of a bucket gives a part.  One place for
 * the arithmetic the planner, the host transport and the checksums share. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/bcast/bcast_internal.h"

static const bcast_part WHOLE_PART = {0};

uint64_t bcast_part_elems(const bcast_tensor *t, const bcast_part *pt) {
  if (!t || !pt || pt->kind == BCAST_PART_WHOLE) return t ? bcast_tensor_elems(t) : 0;
  if (pt->kind != BCAST_PART_SLICE || pt->dim >= t->ndim || !t->shape[pt->dim]) return 0;
  return bcast_tensor_elems(t) / t->shape[pt->dim] * pt->count;
}

uint32_t bcast_plan_rank_view(const bcast_plan *p, uint32_t rank) {
  if (!p || !p->nviews || !p->rank_view || rank >= p->world_size) return BCAST_VIEW_WHOLE;
  return p->rank_view[rank];
}

const bcast_part *bcast__view_part(const bcast_plan *p, uint32_t view, size_t tensor) {
  if (view == BCAST_VIEW_WHOLE || view >= p->nviews) return &WHOLE_PART;
  return &p->view_parts[(size_t)view * p->ntensors + tensor];
}

const bcast_part *bcast_plan_part(const bcast_plan *p, uint32_t rank, size_t tensor) {
  if (!p || tensor >= p->ntensors) return NULL;
  return bcast__view_part(p, bcast_plan_rank_view(p, rank), tensor);
}

/* Elements [e0, e0 + n) of tensor t against part pt: fn(ud, offset in the
 * range, index in the part's dense buffer, count) for each run the part
 * holds, in element order.  A SLICE along d of shape s holds, in each block
 * o of s[d] * inner elements (inner = the product of s[d+1..]), the run
 * [o * block + start * inner, + count * inner), which lands at o * count *
 * inner in the dense part. */
int bcast__part_runs(const bcast_tensor *t, const bcast_part *pt, uint64_t e0, uint64_t n,
                     bcast__run_fn fn, void *ud) {
  if (!n || pt->kind == BCAST_PART_NONE) return 0;
  if (pt->kind == BCAST_PART_WHOLE) return fn(ud, 0, e0, n);
  uint64_t inner = 1;
  for (uint32_t d = pt->dim + 1; d < t->ndim; d++) inner *= t->shape[d];
  uint64_t block = t->shape[pt->dim] * inner, lo_in = pt->start * inner, hi_in = (pt->start + pt->count) * inner;
  uint64_t width = pt->count * inner;
  for (uint64_t o = e0 / block; o * block < e0 + n; o++) {
    uint64_t lo = o * block + lo_in, hi = o * block + hi_in;
    if (lo < e0) lo = e0;
    if (hi > e0 + n) hi = e0 + n;
    if (hi <= lo) continue;
    int rc = fn(ud, lo - e0, o * width + (lo - o * block - lo_in), hi - lo);
    if (rc) return rc;
  }
  return 0;
}

static int count_run(void *ud, uint64_t off, uint64_t local, uint64_t n) {
  (void)off;
  (void)local;
  *(uint64_t *)ud += n;
  return 0;
}

uint64_t bcast__view_bucket_elems(const bcast_plan *p, uint32_t view, size_t k, size_t s) {
  const bcast_slice *sl = &p->buckets[k].slices[s];
  uint64_t got = 0;
  bcast__part_runs(&p->tensors[sl->tensor], bcast__view_part(p, view, sl->tensor), sl->elem_offset, sl->elem_count,
                   count_run, &got);
  return got;
}

uint64_t bcast__view_bucket_bytes(const bcast_plan *p, uint32_t view, size_t k) {
  const bcast_bucket *b = &p->buckets[k];
  if (view == BCAST_VIEW_WHOLE || view >= p->nviews) return b->bytes;
  uint64_t e = 0;
  for (size_t s = 0; s < b->nslices; s++) e += bcast__view_bucket_elems(p, view, k, s);
  return e * bcast_dtype_size(b->wire_dtype);
}

uint64_t bcast_plan_view_bytes(const bcast_plan *p, uint32_t view, uint32_t source) {
  if (!p) return 0;
  uint64_t total = 0;
  for (size_t k = 0; k < p->nbuckets; k++) {
    if (source != UINT32_MAX && bcast__plan_nsources(p) > 1 && p->buckets[k].source_rank != source) continue;
    if (view == BCAST_VIEW_WHOLE || view >= p->nviews) {
      const bcast_bucket *b = &p->buckets[k];
      for (size_t s = 0; s < b->nslices; s++) total += b->slices[s].elem_count * bcast_dtype_size(b->wire_dtype);
    } else {
      total += bcast__view_bucket_bytes(p, view, k);
    }
  }
  return total;
}

/* ---- building and checking ------------------------------------------------------ */

static int part_check(const bcast_plan *p, const bcast_tensor *t, const bcast_part *pt, const char *who,
                      bcast_err *err) {
  switch (pt->kind) {
  case BCAST_PART_WHOLE:
  case BCAST_PART_NONE: return BCAST_OK;
  case BCAST_PART_SLICE:
    if (pt->dim >= t->ndim)
      return bcast__fail(err, BCAST_EINVAL, "%s: tensor '%s': part dim %u, the tensor has %u dimensions", who,
                         t->name, pt->dim, t->ndim);
    if (!pt->count)
      return bcast__fail(err, BCAST_EINVAL, "%s: tensor '%s': part count 0; a slice holds at least one index", who,
                         t->name);
    if (pt->start > t->shape[pt->dim] || pt->count > t->shape[pt->dim] - pt->start)
      return bcast__fail(err, BCAST_EINVAL, "%s: tensor '%s': part [%llu, %llu) along dim %u is past its %llu",
                         who, t->name, (unsigned long long)pt->start,
                         (unsigned long long)(pt->start + pt->count), pt->dim,
                         (unsigned long long)t->shape[pt->dim]);
    return BCAST_OK;
  default:
    (void)p;
    return bcast__fail(err, BCAST_EINVAL, "%s: tensor '%s': unknown part kind %d", who, t->name, pt->kind);
  }
}

/* A whole-tensor slice is the same as WHOLE: one spelling for one meaning,
 * so equal views compare equal. */
static bcast_part canonical(const bcast_tensor *t, bcast_part pt) {
  if (pt.kind == BCAST_PART_SLICE && pt.dim < t->ndim && pt.start == 0 && pt.count == t->shape[pt.dim])
    return WHOLE_PART;
  if (pt.kind != BCAST_PART_SLICE) pt.dim = 0, pt.start = pt.count = 0;
  return pt;
}

static int name_idx_cmp(const void *a, const void *b) {
  const bcast_tensor *x = *(const bcast_tensor *const *)a, *y = *(const bcast_tensor *const *)b;
  return strncmp(x->name, y->name, BCAST_NAME_MAX);
}

/* One rank's specs resolved into parts[0..ntensors): 1 when the rank has a
 * view (some part not whole), 0 when it holds everything whole. */
static int resolve(const bcast_plan *p, const bcast_tensor **sorted, uint32_t r, const bcast_receiver_view *v,
                   bcast_part *parts, uint8_t *seen, bcast_err *err, int *has) {
  char who[48];
  snprintf(who, sizeof who, "receiver views: rank %u", r);
  memset(parts, 0, p->ntensors * sizeof *parts);
  memset(seen, 0, p->ntensors);
  *has = 0;
  if (!v->nparts) return BCAST_OK;
  if (!v->parts) return bcast__fail(err, BCAST_EINVAL, "%s: %zu parts but a NULL array", who, v->nparts);
  if (r < bcast__plan_nsources(p))
    return bcast__fail(err, BCAST_EINVAL, "%s is a source; a source holds its tensors whole", who);
  for (size_t j = 0; j < v->nparts; j++) {
    const bcast_part_spec *s = &v->parts[j];
    if (!s->name) return bcast__fail(err, BCAST_EINVAL, "%s: parts[%zu]: name is NULL", who, j);
    bcast_tensor key;
    memset(key.name, 0, sizeof key.name);
    snprintf(key.name, sizeof key.name, "%s", s->name);
    const bcast_tensor *kp = &key, **hit = bsearch(&kp, sorted, p->ntensors, sizeof *sorted, name_idx_cmp);
    if (!hit) return bcast__fail(err, BCAST_EINVAL, "%s: tensor '%s' is not in the plan", who, s->name);
    size_t i = (size_t)(*hit - p->tensors);
    if (seen[i]) return bcast__fail(err, BCAST_EINVAL, "%s: tensor '%s' is listed twice", who, s->name);
    seen[i] = 1;
    int rc = part_check(p, &p->tensors[i], &s->part, who, err);
    if (rc) return rc;
    parts[i] = canonical(&p->tensors[i], s->part);
  }
  int any = 0;
  for (size_t i = 0; i < p->ntensors; i++) {
    if (parts[i].kind != BCAST_PART_WHOLE) *has = 1;
    if (parts[i].kind != BCAST_PART_NONE) any = 1;
  }
  if (!any) return bcast__fail(err, BCAST_EINVAL, "%s: every tensor is NONE; the view leaves it nothing", who);
  return BCAST_OK;
}

int bcast__views_set(bcast_plan *p, const bcast_receiver_view *rv, bcast_err *err) {
  if (!rv) return BCAST_OK;
  size_t nt = p->ntensors ? p->ntensors : 1;
  const bcast_tensor **sorted = malloc(nt * sizeof *sorted);
  bcast_part *cur = malloc(nt * sizeof *cur);
  uint8_t *seen = malloc(nt);
  uint32_t *rank_view = malloc((p->world_size ? p->world_size : 1) * sizeof *rank_view);
  bcast_part *views = NULL;
  uint32_t nviews = 0;
  int rc = BCAST_OK;
  if (!sorted || !cur || !seen || !rank_view) {
    rc = bcast__fail(err, BCAST_ENOMEM, "out of memory for the receiver views");
    goto out;
  }
  for (size_t i = 0; i < p->ntensors; i++) sorted[i] = &p->tensors[i];
  qsort(sorted, p->ntensors, sizeof *sorted, name_idx_cmp);
  for (uint32_t r = 0; r < p->world_size && !rc; r++) {
    int has = 0;
    rank_view[r] = BCAST_VIEW_WHOLE;
    if ((rc = resolve(p, sorted, r, &rv[r], cur, seen, err, &has)) || !has) continue;
    uint32_t v = 0;
    while (v < nviews && memcmp(&views[(size_t)v * p->ntensors], cur, p->ntensors * sizeof *cur)) v++;
    if (v == nviews) {
      bcast_part *nv = realloc(views, (size_t)(nviews + 1) * nt * sizeof *nv);
      if (!nv) {
        rc = bcast__fail(err, BCAST_ENOMEM, "out of memory for the receiver views");
        break;
      }
      views = nv;
      memcpy(&views[(size_t)nviews * p->ntensors], cur, p->ntensors * sizeof *cur);
      nviews++;
    }
    rank_view[r] = v;
  }
  if (!rc && nviews && p->mode != BCAST_MODE_HOST)
    rc = bcast__fail(err, BCAST_EINVAL, "receiver views: %s mode moves whole buckets to every receiver; "
                     "receivers that hold part of the model run in host mode", bcast_mode_name(p->mode));
  if (!rc && nviews) {
    p->nviews = nviews;
    p->view_parts = views;
    p->rank_view = rank_view;
    views = NULL;
    rank_view = NULL;
  }
out:
  free(sorted);
  free(cur);
  free(seen);
  free(rank_view);
  free(views);
  return rc;
}

int bcast__views_check(const bcast_plan *p, bcast_err *err) {
  if (!p->nviews) {
    if (p->view_parts || p->rank_view)
      return bcast__fail(err, BCAST_EINVAL, "plan '%s': view arrays without views", p->id);
    return BCAST_OK;
  }
  if (!p->view_parts || !p->rank_view)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': %u views but no parts or rank views", p->id, p->nviews);
  if (p->mode != BCAST_MODE_HOST)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': receiver views in %s mode; they run in host mode", p->id,
                       bcast_mode_name(p->mode));
  if (p->nviews >= p->world_size)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': %u views for %u ranks", p->id, p->nviews, p->world_size);
  for (uint32_t r = 0; r < p->world_size; r++) {
    uint32_t v = p->rank_view[r];
    if (v == BCAST_VIEW_WHOLE) continue;
    if (v >= p->nviews)
      return bcast__fail(err, BCAST_EINVAL, "plan '%s': rank %u has view %u of %u", p->id, r, v, p->nviews);
    if (r < bcast__plan_nsources(p))
      return bcast__fail(err, BCAST_EINVAL, "plan '%s': source rank %u has view %u; a source holds its tensors "
                         "whole", p->id, r, v);
  }
  char who[64];
  snprintf(who, sizeof who, "plan '%.40s'", p->id);
  for (uint32_t v = 0; v < p->nviews; v++)
    for (size_t i = 0; i < p->ntensors; i++) {
      int rc = part_check(p, &p->tensors[i], bcast__view_part(p, v, i), who, err);
      if (rc) return rc;
    }
  return BCAST_OK;
}

void bcast__views_free(bcast_plan *p) {
  free(p->view_parts);
  free(p->rank_view);
  p->view_parts = NULL;
  p->rank_view = NULL;
  p->nviews = 0;
}

int bcast__views_dup(bcast_plan *q, const bcast_plan *p) {
  q->view_parts = NULL;
  q->rank_view = NULL;
  if (!p->nviews) return BCAST_OK;
  size_t np = (size_t)p->nviews * p->ntensors;
  q->view_parts = malloc((np ? np : 1) * sizeof *q->view_parts);
  q->rank_view = malloc(p->world_size * sizeof *q->rank_view);
  if (!q->view_parts || !q->rank_view) return BCAST_ENOMEM;
  memcpy(q->view_parts, p->view_parts, np * sizeof *q->view_parts);
  memcpy(q->rank_view, p->rank_view, p->world_size * sizeof *q->rank_view);
  return BCAST_OK;
}

/* ---- a receiver's local tensors ---------------------------------------------------- */

int bcast__plan_bind_receiver(const bcast_plan *p, uint32_t rank, const bcast_tensor *local, size_t n,
                              uint32_t *map, bcast_err *err) {
  uint32_t view = bcast_plan_rank_view(p, rank);
  uint8_t *need = malloc(p->ntensors ? p->ntensors : 1);
  if (!need) return bcast__fail(err, BCAST_ENOMEM, "out of memory binding %zu tensors", p->ntensors);
  for (size_t i = 0; i < p->ntensors; i++) need[i] = bcast__view_part(p, view, i)->kind != BCAST_PART_NONE;
  int rc = bcast__plan_bind_some(p, local, n, 0, need, 0, map, err);
  for (size_t i = 0; i < p->ntensors && !rc; i++) {
    if (!need[i]) continue;
    const bcast_part *want = bcast__view_part(p, view, i), *have = &local[map[i]].part;
    bcast_part h = canonical(&p->tensors[i], *have);
    if (memcmp(&h, want, sizeof h))
      rc = bcast__fail(err, BCAST_EINVAL, "tensor '%s': the local tensor holds part kind %d dim %u [%llu, +%llu), "
                       "the plan gives rank %u kind %d dim %u [%llu, +%llu)", p->tensors[i].name, have->kind,
                       have->dim, (unsigned long long)have->start, (unsigned long long)have->count, rank,
                       want->kind, want->dim, (unsigned long long)want->start, (unsigned long long)want->count);
  }
  free(need);
  return rc;
}

int bcast_plan_check_receiver(const bcast_plan *p, uint32_t rank, const bcast_tensor *local, size_t n,
                              bcast_err *err) {
  if (!p) return bcast__fail(err, BCAST_EINVAL, "plan: NULL");
  if (rank >= p->world_size)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': rank %u outside its %u ranks", p->id, rank, p->world_size);
  uint32_t *map = malloc((p->ntensors ? p->ntensors : 1) * sizeof *map);
  if (!map) return bcast__fail(err, BCAST_ENOMEM, "out of memory checking %zu tensors", p->ntensors);
  int rc = bcast__plan_bind_receiver(p, rank, local, n, map, err);
  free(map);
  return rc;
}
