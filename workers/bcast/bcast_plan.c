/* Bucket plans: build from a manifest, validate, hash, copy, bind to local
 * tensors.  A plan is plain data; everything here is pure (no I/O, no clock). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "workers/bcast/bcast_internal.h"

#define PLAN_DEFAULT_BUDGET (256ull << 20)

static uint64_t align_up(uint64_t v) { return (v + BCAST_ALIGN - 1) & ~(uint64_t)(BCAST_ALIGN - 1); }

uint64_t bcast_tensor_elems(const bcast_tensor *t) {
  if (t->ndim == 0 || t->ndim > BCAST_MAX_DIMS) return 0;
  uint64_t n = 1;
  for (uint32_t i = 0; i < t->ndim; i++) {
    if (t->shape[i] == 0) return 0;
    if (__builtin_mul_overflow(n, t->shape[i], &n)) return 0;
  }
  return n;
}

/* ---- validation of one tensor description ---------------------------------- */

static int name_ok(const char *name) {
  size_t len = strnlen(name, BCAST_NAME_MAX);
  return len > 0 && len < BCAST_NAME_MAX;
}

static int name_cmp(const void *a, const void *b) {
  const bcast_tensor *x = *(const bcast_tensor *const *)a, *y = *(const bcast_tensor *const *)b;
  return strncmp(x->name, y->name, BCAST_NAME_MAX);
}

/* Sorted array of pointers into `t`, for duplicate detection and lookup. */
static const bcast_tensor **sorted_by_name(const bcast_tensor *t, size_t n) {
  const bcast_tensor **v = malloc((n ? n : 1) * sizeof *v);
  if (!v) return NULL;
  for (size_t i = 0; i < n; i++) v[i] = &t[i];
  qsort(v, n, sizeof *v, name_cmp);
  return v;
}

/* ---- building ------------------------------------------------------------- */

typedef struct plan_builder {
  bcast_plan *p;
  size_t bcap;
  size_t scap; /* slice capacity of the open (last) bucket */
} plan_builder;

static bcast_bucket *builder_open(plan_builder *b, uint32_t layer, bcast_dtype wire, uint32_t source) {
  bcast_plan *p = b->p;
  if (p->nbuckets == b->bcap) {
    size_t cap = b->bcap ? b->bcap * 2 : 16;
    bcast_bucket *nb = realloc(p->buckets, cap * sizeof *nb);
    if (!nb) return NULL;
    p->buckets = nb;
    b->bcap = cap;
  }
  bcast_bucket *k = &p->buckets[p->nbuckets];
  memset(k, 0, sizeof *k);
  k->index = (uint32_t)p->nbuckets;
  k->layer = layer;
  k->wire_dtype = wire;
  k->source_rank = source;
  k->stage_rank = source;
  p->nbuckets++;
  b->scap = 0;
  return k;
}

static int builder_add(plan_builder *b, bcast_bucket *k, uint32_t tensor, uint64_t eoff, uint64_t count,
                       uint64_t boff, size_t esz) {
  if (k->nslices == b->scap) {
    size_t cap = b->scap ? b->scap * 2 : 8;
    bcast_slice *ns = realloc(k->slices, cap * sizeof *ns);
    if (!ns) return BCAST_ENOMEM;
    k->slices = ns;
    b->scap = cap;
  }
  k->slices[k->nslices++] = (bcast_slice){tensor, eoff, count, boff};
  k->bytes = boff + count * esz;
  return BCAST_OK;
}

/* Places elements [eoff, eoff + left) of one tensor, held by `source`, into
 * the open bucket of its group and source, opening new ones as needed.  A
 * piece that fits a fresh bucket is never split; a larger one fills the open
 * bucket's remainder, then whole buckets. */
static int place_piece(plan_builder *b, bcast_bucket **open, uint32_t ti, uint64_t eoff, uint64_t left,
                       uint32_t source) {
  bcast_plan *p = b->p;
  const bcast_tensor *t = &p->tensors[ti];
  size_t esz = bcast_dtype_size(t->wire_dtype);
  uint64_t budget = p->staging_budget, start = eoff;
  while (left > 0) {
    bcast_bucket *k = *open;
    uint64_t off = k && k->nslices ? align_up(k->bytes) : 0;
    uint64_t room = k && off < budget ? (budget - off) / esz : 0;
    int fits_fresh = left * esz <= budget;
    if (!k || room == 0 || (eoff == start && fits_fresh && room < left)) {
      if (!(k = builder_open(b, t->layer, t->wire_dtype, source))) return BCAST_ENOMEM;
      *open = k;
      continue;
    }
    uint64_t take = left < room ? left : room;
    if (builder_add(b, k, ti, eoff, take, off, esz)) return BCAST_ENOMEM;
    eoff += take;
    left -= take;
  }
  return BCAST_OK;
}

typedef struct group_key {
  uint32_t layer;
  int wire;
  size_t index;
} group_key;

static int group_cmp(const void *a, const void *b) {
  const group_key *x = a, *y = b;
  if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
  if (x->wire != y->wire) return x->wire < y->wire ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index; /* stable: manifest order */
}

static int opts_check(const bcast_plan_opts *o, uint64_t budget, bcast_err *err) {
  if (o->mode != BCAST_MODE_DIRECT && o->mode != BCAST_MODE_STAGED && o->mode != BCAST_MODE_HOST &&
      o->mode != BCAST_MODE_COLOCATED)
    return bcast__fail(err, BCAST_EINVAL, "plan options: unknown mode %d", (int)o->mode);
  if (o->world_size == 0) return bcast__fail(err, BCAST_EINVAL, "plan options: world_size must be >= 1");
  if (o->root_rank >= o->world_size)
    return bcast__fail(err, BCAST_EINVAL, "plan options: root_rank %u >= world_size %u", o->root_rank,
                       o->world_size);
  if (budget < BCAST_ALIGN || budget > BCAST_MAX_TENSOR_BYTES)
    return bcast__fail(err, BCAST_EINVAL, "plan options: staging_budget %llu outside %u..2^50 bytes",
                       (unsigned long long)budget, BCAST_ALIGN);
  if (o->checksum && o->checksum != BCAST_CHECKSUM_NONE && o->checksum != BCAST_CHECKSUM_XXH3_64)
    return bcast__fail(err, BCAST_EINVAL, "plan options: unknown checksum kind %d", (int)o->checksum);
  if (o->id && strlen(o->id) >= sizeof ((bcast_plan *)0)->id)
    return bcast__fail(err, BCAST_EINVAL, "plan options: id longer than 127 bytes");
  if (o->host_endpoint && strlen(o->host_endpoint) >= sizeof ((bcast_plan *)0)->host_endpoint)
    return bcast__fail(err, BCAST_EINVAL, "plan options: host_endpoint longer than 255 bytes");
  return BCAST_OK;
}

/* Buckets [from, p->nbuckets) are one group's, source by source (starts[s]
 * is where source s's begin, starts[ns] the end): interleaves them
 * round-robin by source so that every source has a bucket to send at once. */
static int interleave(bcast_plan *p, size_t from, const size_t *starts, uint32_t ns) {
  size_t n = p->nbuckets - from;
  if (ns < 2 || n < 2) return BCAST_OK;
  bcast_bucket *tmp = malloc(n * sizeof *tmp);
  if (!tmp) return BCAST_ENOMEM;
  size_t k = 0;
  for (size_t round = 0; k < n; round++)
    for (uint32_t s = 0; s < ns; s++)
      if (starts[s] + round < starts[s + 1]) tmp[k++] = p->buckets[starts[s] + round];
  memcpy(p->buckets + from, tmp, n * sizeof *tmp);
  free(tmp);
  for (size_t i = from; i < p->nbuckets; i++) p->buckets[i].index = (uint32_t)i;
  return BCAST_OK;
}

/* Lays out one group (keys[g0, g1): one layer and wire dtype), each source's
 * pieces in manifest order into buckets of its own.  Without a map the one
 * source is the root and holds every tensor whole. */
static int layout_group(plan_builder *b, const group_key *keys, size_t g0, size_t g1, const bcast_shard_map *m,
                        size_t *starts) {
  bcast_plan *p = b->p;
  uint32_t ns = m ? m->nranks : 1;
  size_t from = p->nbuckets;
  for (uint32_t s = 0; s < ns; s++) {
    bcast_bucket *open = NULL; /* a new group, or a new source, starts a new bucket */
    starts[s] = p->nbuckets;
    for (size_t i = g0; i < g1; i++) {
      uint32_t ti = (uint32_t)keys[i].index;
      if (!m) {
        if (place_piece(b, &open, ti, 0, bcast_tensor_elems(&p->tensors[ti]), p->root_rank)) return BCAST_ENOMEM;
        continue;
      }
      for (size_t j = m->first[ti]; j < m->first[ti + 1]; j++)
        if (m->pieces[j].rank == s &&
            place_piece(b, &open, ti, m->pieces[j].elem_offset, m->pieces[j].elem_count, s))
          return BCAST_ENOMEM;
    }
  }
  starts[ns] = p->nbuckets;
  return interleave(p, from, starts, ns);
}

static int plan_layout(bcast_plan *p, const bcast_shard_map *m, bcast_err *err) {
  size_t n = p->ntensors;
  uint32_t ns = m ? m->nranks : 1;
  group_key *keys = malloc((n ? n : 1) * sizeof *keys);
  size_t *starts = malloc(((size_t)ns + 1) * sizeof *starts);
  if (!keys || !starts) {
    free(keys);
    free(starts);
    return bcast__fail(err, BCAST_ENOMEM, "out of memory planning %zu tensors", n);
  }
  for (size_t i = 0; i < n; i++) keys[i] = (group_key){p->tensors[i].layer, (int)p->tensors[i].wire_dtype, i};
  qsort(keys, n, sizeof *keys, group_cmp);
  plan_builder b = {p, 0, 0};
  int rc = BCAST_OK;
  for (size_t g0 = 0; g0 < n && !rc;) {
    size_t g1 = g0 + 1;
    while (g1 < n && keys[g1].layer == keys[g0].layer && keys[g1].wire == keys[g0].wire) g1++;
    rc = layout_group(&b, keys, g0, g1, m, starts);
    g0 = g1;
  }
  free(keys);
  free(starts);
  if (rc) return bcast__fail(err, rc, "out of memory laying out buckets");
  return BCAST_OK;
}

static int plan_make(const bcast_tensor *tensors, size_t n, const bcast_shard_map *m, const bcast_plan_opts *o,
                     uint64_t budget, bcast_plan **out, bcast_err *err);

int bcast_plan_build(const bcast_tensor *tensors, size_t n, const bcast_plan_opts *o, bcast_plan **out,
                     bcast_err *err) {
  if (!out || !o || (n && !tensors)) return bcast__fail(err, BCAST_EINVAL, "plan_build: NULL argument");
  *out = NULL;
  uint64_t budget = o->staging_budget ? o->staging_budget : PLAN_DEFAULT_BUDGET;
  int rc = opts_check(o, budget, err);
  if (rc) return rc;
  if ((rc = bcast_manifest_check(tensors, n, o->limits, err))) return rc;
  for (size_t i = 0; i < n; i++)
    if (bcast_tensor_held(&tensors[i]) != bcast_tensor_elems(&tensors[i]))
      return bcast__fail(err, BCAST_EINVAL, "tensor #%zu '%s': a shard (elements [%llu, +%llu)); a plan of "
                         "shards is built with bcast_plan_build_sharded", i, tensors[i].name,
                         (unsigned long long)tensors[i].shard_offset, (unsigned long long)tensors[i].shard_elems);
  return plan_make(tensors, n, NULL, o, budget, out, err);
}

/* Source endpoints of a several-source plan, owned by it. */
static int endpoints_set(bcast_plan *p, const char *const *eps, uint32_t ns, bcast_err *err) {
  if (!(p->source_endpoints = calloc(ns, sizeof *p->source_endpoints)))
    return bcast__fail(err, BCAST_ENOMEM, "out of memory for %u source endpoints", ns);
  for (uint32_t r = 0; r < ns; r++) {
    const char *e = eps ? eps[r] : (r == 0 ? p->host_endpoint : "");
    if (!e) e = "";
    if (strlen(e) >= sizeof p->host_endpoint)
      return bcast__fail(err, BCAST_EINVAL, "plan options: source_endpoints[%u] longer than 255 bytes", r);
    if (!(p->source_endpoints[r] = strdup(e)))
      return bcast__fail(err, BCAST_ENOMEM, "out of memory for %u source endpoints", ns);
  }
  if (eps && p->host_endpoint[0] && strcmp(p->host_endpoint, p->source_endpoints[0]))
    return bcast__fail(err, BCAST_EINVAL, "plan options: host_endpoint '%s' is not source_endpoints[0] '%s'",
                       p->host_endpoint, p->source_endpoints[0]);
  if (!p->host_endpoint[0]) snprintf(p->host_endpoint, sizeof p->host_endpoint, "%s", p->source_endpoints[0]);
  return BCAST_OK;
}

/* One source: its endpoint is host_endpoint, and the plan is today's. */
static int endpoint_one(bcast_plan *p, const char *ep, bcast_err *err) {
  if (strlen(ep) >= sizeof p->host_endpoint)
    return bcast__fail(err, BCAST_EINVAL, "plan options: source_endpoints[0] longer than 255 bytes");
  if (p->host_endpoint[0] && strcmp(p->host_endpoint, ep))
    return bcast__fail(err, BCAST_EINVAL, "plan options: host_endpoint '%s' is not source_endpoints[0] '%s'",
                       p->host_endpoint, ep);
  snprintf(p->host_endpoint, sizeof p->host_endpoint, "%s", ep);
  return BCAST_OK;
}

int bcast_plan_build_sharded(const bcast_shard_map *m, const bcast_plan_opts *o, bcast_plan **out,
                             bcast_err *err) {
  if (!out || !o || !m) return bcast__fail(err, BCAST_EINVAL, "plan_build_sharded: NULL argument");
  *out = NULL;
  uint64_t budget = o->staging_budget ? o->staging_budget : PLAN_DEFAULT_BUDGET;
  int rc = opts_check(o, budget, err);
  if (rc) return rc;
  if (m->nranks == 0 || m->nranks >= o->world_size)
    return bcast__fail(err, BCAST_EINVAL, "plan options: %u source ranks need a world_size above them, not %u",
                       m->nranks, o->world_size);
  if (o->root_rank != 0)
    return bcast__fail(err, BCAST_EINVAL, "plan options: root_rank %u; the sources are ranks 0..%u", o->root_rank,
                       m->nranks - 1);
  if (m->nranks > 1 && o->mode != BCAST_MODE_HOST && o->mode != BCAST_MODE_COLOCATED)
    return bcast__fail(err, BCAST_EINVAL, "plan options: %u source ranks: %s mode has one source; only host and "
                       "colocated mode send from several", m->nranks, bcast_mode_name(o->mode));
  if ((rc = bcast_manifest_check(m->tensors, m->ntensors, o->limits, err))) return rc;
  return plan_make(m->tensors, m->ntensors, m, o, budget, out, err);
}

static int plan_make(const bcast_tensor *tensors, size_t n, const bcast_shard_map *m, const bcast_plan_opts *o,
                     uint64_t budget, bcast_plan **out, bcast_err *err) {
  int rc = BCAST_OK;

  bcast_plan *p = calloc(1, sizeof *p);
  if (!p || !(p->tensors = calloc(n ? n : 1, sizeof *p->tensors))) {
    free(p);
    return bcast__fail(err, BCAST_ENOMEM, "out of memory for a plan of %zu tensors", n);
  }
  snprintf(p->id, sizeof p->id, "%s", o->id ? o->id : "");
  p->mode = o->mode;
  p->ntensors = n;
  for (size_t i = 0; i < n; i++) {
    p->tensors[i] = tensors[i];
    p->tensors[i].data = NULL; /* a plan describes, it never points */
    p->tensors[i].device = 0;
    p->tensors[i].shard_offset = p->tensors[i].shard_elems = 0;
    memset(&p->tensors[i].part, 0, sizeof p->tensors[i].part);
  }
  p->world_size = o->world_size;
  p->root_rank = o->root_rank;
  p->staging_budget = budget;
  p->deadline_unix_ms = o->deadline_unix_ms;
  p->policy_version = o->policy_version;
  snprintf(p->host_endpoint, sizeof p->host_endpoint, "%s", o->host_endpoint ? o->host_endpoint : "");
  p->checksum = o->checksum ? o->checksum : BCAST_CHECKSUM_XXH3_64;
  p->min_gbps = o->min_gbps > 0 ? o->min_gbps : 0;
  p->tls = o->tls ? 1 : 0;
  /* Every plan gets its own secret: one that outlived its plan would let a
   * past participant (or a leaked log of it) into every later broadcast. */
  if (o->secret) memcpy(p->secret, o->secret, sizeof p->secret);
  else if (bcast__random(p->secret, sizeof p->secret)) {
    bcast_plan_free(p);
    return bcast__fail(err, BCAST_EIO, "plan: no randomness for its secret (getrandom failed)");
  }
  p->has_secret = 1;
  p->nsources = m ? m->nranks : 1;
  if (p->nsources > 1) rc = endpoints_set(p, o->source_endpoints, p->nsources, err);
  else if (m && o->source_endpoints && o->source_endpoints[0]) rc = endpoint_one(p, o->source_endpoints[0], err);
  if (rc) {
    bcast_plan_free(p);
    return rc;
  }
  if ((rc = plan_layout(p, m, err)) || (rc = bcast__views_set(p, o->receiver_views, err)) ||
      ((o->relay_from || o->relay_endpoints) &&
       (rc = bcast_plan_set_relays(p, o->relay_from, o->relay_endpoints, err)))) {
    bcast_plan_free(p);
    return rc;
  }
  p->hash = bcast_plan_hash(p);
  *out = p;
  return BCAST_OK;
}

/* ---- validation of a whole plan (e.g. one received over the network) ------ */

/* A slice of a several-source plan, kept to check the tiling once sorted. */
typedef struct slice_ref {
  uint32_t tensor;
  uint32_t bucket;
  uint64_t off, count;
} slice_ref;

static int slice_ref_cmp(const void *a, const void *b) {
  const slice_ref *x = a, *y = b;
  if (x->tensor != y->tensor) return x->tensor < y->tensor ? -1 : 1;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* next: a one-source plan's slices run in element order, tensor by tensor;
 * refs (several sources): every slice, to be sorted and checked after. */
static int bucket_check(const bcast_plan *p, const bcast_bucket *k, size_t bi, uint64_t *next, slice_ref *refs,
                        size_t *nrefs, bcast_err *err) {
  if (k->index != bi) return bcast__fail(err, BCAST_EINVAL, "bucket %zu: index field is %u", bi, k->index);
  if (!bcast_dtype_size(k->wire_dtype))
    return bcast__fail(err, BCAST_EINVAL, "bucket %zu: unknown wire dtype %d", bi, (int)k->wire_dtype);
  if (k->source_rank >= p->world_size || k->stage_rank >= p->world_size)
    return bcast__fail(err, BCAST_EINVAL, "bucket %zu (layer %u): source rank %u or stage rank %u >= world size %u",
                       bi, k->layer, k->source_rank, k->stage_rank, p->world_size);
  if (refs && k->source_rank >= p->nsources)
    return bcast__fail(err, BCAST_EINVAL, "bucket %zu (layer %u): source rank %u, but the plan has %u sources "
                       "(ranks 0..%u)", bi, k->layer, k->source_rank, p->nsources, p->nsources - 1);
  if (refs && k->stage_rank != k->source_rank)
    return bcast__fail(err, BCAST_EINVAL, "bucket %zu (layer %u): stage rank %u differs from its source rank %u",
                       bi, k->layer, k->stage_rank, k->source_rank);
  if (k->nslices == 0 || !k->slices)
    return bcast__fail(err, BCAST_EINVAL, "bucket %zu (layer %u): no slices", bi, k->layer);
  size_t esz = bcast_dtype_size(k->wire_dtype);
  uint64_t end = 0;
  for (size_t s = 0; s < k->nslices; s++) {
    const bcast_slice *sl = &k->slices[s];
    if (sl->tensor >= p->ntensors)
      return bcast__fail(err, BCAST_EINVAL, "bucket %zu slice %zu: tensor index %u out of range", bi, s, sl->tensor);
    const bcast_tensor *t = &p->tensors[sl->tensor];
    if (t->layer != k->layer || t->wire_dtype != k->wire_dtype)
      return bcast__fail(err, BCAST_EINVAL, "tensor '%s': sliced into bucket %zu of layer %u/%s but is layer %u/%s",
                         t->name, bi, k->layer, bcast_dtype_name(k->wire_dtype), t->layer,
                         bcast_dtype_name(t->wire_dtype));
    uint64_t want = s == 0 ? 0 : align_up(end);
    if (sl->bucket_offset != want)
      return bcast__fail(err, BCAST_EINVAL, "tensor '%s': slice at bucket %zu offset %llu, expected %llu (%s)",
                         t->name, bi, (unsigned long long)sl->bucket_offset, (unsigned long long)want,
                         sl->bucket_offset < want ? "overlap" : "gap");
    uint64_t elems = bcast_tensor_elems(t);
    if (refs) {
      if (sl->elem_count == 0 || sl->elem_offset > elems || sl->elem_count > elems - sl->elem_offset)
        return bcast__fail(err, BCAST_EINVAL, "tensor '%s': slice in bucket %zu covers elements %llu+%llu, outside "
                           "its %llu", t->name, bi, (unsigned long long)sl->elem_offset,
                           (unsigned long long)sl->elem_count, (unsigned long long)elems);
      refs[(*nrefs)++] = (slice_ref){sl->tensor, (uint32_t)bi, sl->elem_offset, sl->elem_count};
      end = sl->bucket_offset + sl->elem_count * esz;
      continue;
    }
    if (sl->elem_count == 0 || sl->elem_offset != next[sl->tensor] || sl->elem_count > elems - sl->elem_offset)
      return bcast__fail(err, BCAST_EINVAL,
                         "tensor '%s': slice in bucket %zu covers elements %llu+%llu, expected to start at %llu "
                         "of %llu (overlap, gap or out of order)",
                         t->name, bi, (unsigned long long)sl->elem_offset, (unsigned long long)sl->elem_count,
                         (unsigned long long)next[sl->tensor], (unsigned long long)elems);
    next[sl->tensor] += sl->elem_count;
    end = sl->bucket_offset + sl->elem_count * esz;
  }
  if (k->bytes != end)
    return bcast__fail(err, BCAST_EINVAL, "bucket %zu (layer %u): bytes %llu but slices end at %llu", bi, k->layer,
                       (unsigned long long)k->bytes, (unsigned long long)end);
  if (k->bytes > p->staging_budget)
    return bcast__fail(err, BCAST_EINVAL, "bucket %zu (layer %u): %llu bytes exceed the staging budget %llu", bi,
                       k->layer, (unsigned long long)k->bytes, (unsigned long long)p->staging_budget);
  return BCAST_OK;
}

/* Several sources: the sorted slices tile every tensor exactly. */
static int slices_tile(const bcast_plan *p, slice_ref *refs, size_t n, bcast_err *err) {
  qsort(refs, n, sizeof *refs, slice_ref_cmp);
  size_t i = 0;
  for (uint32_t t = 0; t < p->ntensors; t++) {
    const char *nm = p->tensors[t].name;
    uint64_t elems = bcast_tensor_elems(&p->tensors[t]), next = 0;
    for (; i < n && refs[i].tensor == t; i++) {
      if (refs[i].off != next)
        return bcast__fail(err, BCAST_EINVAL, "tensor '%s': slice in bucket %u starts at element %llu, expected "
                           "%llu (%s)", nm, refs[i].bucket, (unsigned long long)refs[i].off,
                           (unsigned long long)next, refs[i].off < next ? "overlap" : "gap");
      next += refs[i].count;
    }
    if (next != elems)
      return bcast__fail(err, BCAST_EINVAL, "tensor '%s': slices cover %llu of %llu elements", nm,
                         (unsigned long long)next, (unsigned long long)elems);
  }
  return BCAST_OK;
}

static int relays_check(const bcast_plan *p, bcast_err *err);
static int relays_copy(bcast_plan *p, const uint32_t *rf, const char *const *eps);

/* The sources' count and endpoints. */
static int sources_check(const bcast_plan *p, bcast_err *err) {
  if (p->nsources <= 1) {
    if (p->source_endpoints)
      return bcast__fail(err, BCAST_EINVAL, "plan '%s': source endpoints on a plan of one source", p->id);
    return BCAST_OK;
  }
  if (p->nsources >= p->world_size)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': %u sources in a world of %u leave no receiver", p->id,
                       p->nsources, p->world_size);
  if (p->root_rank != 0)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': root_rank %u with %u sources; the sources are ranks 0..%u",
                       p->id, p->root_rank, p->nsources, p->nsources - 1);
  /* Host mode sends each source's buckets over its own listener; colocated
   * sources write straight into the receivers (a done word each). */
  if (p->mode != BCAST_MODE_HOST && p->mode != BCAST_MODE_COLOCATED)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': %u sources in %s mode, which has one source", p->id,
                       p->nsources, bcast_mode_name(p->mode));
  if (!p->source_endpoints)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': %u sources but no source endpoints", p->id, p->nsources);
  for (uint32_t r = 0; r < p->nsources; r++)
    if (!p->source_endpoints[r] || strnlen(p->source_endpoints[r], sizeof p->host_endpoint) >= sizeof p->host_endpoint)
      return bcast__fail(err, BCAST_EINVAL, "plan '%s': source_endpoints[%u] missing or longer than 255 bytes",
                         p->id, r);
  if (strcmp(p->source_endpoints[0], p->host_endpoint))
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': source_endpoints[0] '%s' is not host_endpoint '%s'", p->id,
                       p->source_endpoints[0], p->host_endpoint);
  return BCAST_OK;
}

int bcast_plan_validate(const bcast_plan *p, bcast_err *err) {
  if (!p) return bcast__fail(err, BCAST_EINVAL, "plan: NULL");
  if (strnlen(p->id, sizeof p->id) == sizeof p->id)
    return bcast__fail(err, BCAST_EINVAL, "plan: id not terminated");
  bcast_plan_opts o = {.mode = p->mode, .world_size = p->world_size, .root_rank = p->root_rank,
                       .checksum = p->checksum};
  int rc = opts_check(&o, p->staging_budget, err);
  if (rc) return rc;
  if (p->checksum != BCAST_CHECKSUM_NONE && p->checksum != BCAST_CHECKSUM_XXH3_64)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': unknown checksum kind %d", p->id, (int)p->checksum);
  if ((p->ntensors && !p->tensors) || (p->nbuckets && !p->buckets))
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': NULL tensor or bucket array", p->id);
  if (p->nbuckets > UINT32_MAX)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': too many buckets", p->id);
  if ((rc = sources_check(p, err))) return rc;
  if ((rc = bcast_manifest_check(p->tensors, p->ntensors, NULL, err))) return rc;
  if ((rc = bcast__views_check(p, err))) return rc;
  if ((rc = relays_check(p, err))) return rc;
  for (size_t i = 0; i < p->ntensors; i++)
    if (p->tensors[i].shard_offset || p->tensors[i].shard_elems)
      return bcast__fail(err, BCAST_EINVAL, "plan '%s': tensor '%s' describes a shard; a plan's tensors are whole",
                         p->id, p->tensors[i].name);
  if (p->nsources > 1) {
    size_t total = 0;
    for (size_t b = 0; b < p->nbuckets; b++) {
      if (p->buckets[b].nslices > SIZE_MAX / sizeof(slice_ref) - total)
        return bcast__fail(err, BCAST_EINVAL, "plan '%s': too many slices", p->id);
      total += p->buckets[b].nslices;
    }
    slice_ref *refs = malloc((total ? total : 1) * sizeof *refs);
    if (!refs) return bcast__fail(err, BCAST_ENOMEM, "out of memory validating plan '%s'", p->id);
    size_t nrefs = 0;
    for (size_t b = 0; b < p->nbuckets && !rc; b++) rc = bucket_check(p, &p->buckets[b], b, NULL, refs, &nrefs, err);
    if (!rc) rc = slices_tile(p, refs, nrefs, err);
    free(refs);
    return rc;
  }
  uint64_t *next = calloc(p->ntensors ? p->ntensors : 1, sizeof *next);
  if (!next) return bcast__fail(err, BCAST_ENOMEM, "out of memory validating plan '%s'", p->id);
  for (size_t b = 0; b < p->nbuckets && !rc; b++) rc = bucket_check(p, &p->buckets[b], b, next, NULL, NULL, err);
  for (size_t i = 0; i < p->ntensors && !rc; i++)
    if (next[i] != bcast_tensor_elems(&p->tensors[i]))
      rc = bcast__fail(err, BCAST_EINVAL, "tensor '%s': slices cover %llu of %llu elements", p->tensors[i].name,
                       (unsigned long long)next[i], (unsigned long long)bcast_tensor_elems(&p->tensors[i]));
  free(next);
  return rc;
}

/* ---- hash ----------------------------------------------------------------- */

typedef struct hasher {
  XXH3_state_t *st;
  uint8_t buf[4096];
  size_t len;
} hasher;

static void h_bytes(hasher *h, const void *v, size_t n) {
  if (h->len + n > sizeof h->buf) {
    XXH3_64bits_update(h->st, h->buf, h->len);
    h->len = 0;
  }
  if (n > sizeof h->buf) {
    XXH3_64bits_update(h->st, v, n);
    return;
  }
  memcpy(h->buf + h->len, v, n);
  h->len += n;
}

static void h_u64(hasher *h, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i)); /* little endian everywhere */
  h_bytes(h, b, 8);
}

static void h_str(hasher *h, const char *s, size_t max) {
  size_t n = strnlen(s, max);
  h_u64(h, n);
  h_bytes(h, s, n);
}

uint64_t bcast_plan_hash(const bcast_plan *p) {
  hasher h = {.st = XXH3_createState()};
  if (!h.st) return 0;
  XXH3_64bits_reset(h.st);
  h_bytes(&h, "rlorch.bcast.plan/1", 19);
  h_str(&h, p->id, sizeof p->id);
  h_u64(&h, (uint64_t)p->mode);
  h_u64(&h, p->world_size);
  h_u64(&h, p->root_rank);
  h_u64(&h, p->staging_budget);
  h_u64(&h, (uint64_t)p->checksum);
  h_u64(&h, p->policy_version);
  h_u64(&h, p->tls ? 1 : 0);
  h_u64(&h, p->has_nccl_id ? 1 : 0);
  if (p->has_nccl_id) h_bytes(&h, p->nccl_id, sizeof p->nccl_id);
  /* Only when there are several: a one-source plan hashes as it always has. */
  if (p->nsources > 1) {
    h_bytes(&h, "sources", 7);
    h_u64(&h, p->nsources);
  }
  h_u64(&h, p->ntensors);
  for (size_t i = 0; i < p->ntensors; i++) {
    const bcast_tensor *t = &p->tensors[i];
    h_str(&h, t->name, BCAST_NAME_MAX);
    h_u64(&h, t->layer);
    h_u64(&h, (uint64_t)t->storage_dtype);
    h_u64(&h, (uint64_t)t->wire_dtype);
    uint32_t nd = t->ndim <= BCAST_MAX_DIMS ? t->ndim : BCAST_MAX_DIMS;
    h_u64(&h, t->ndim);
    for (uint32_t d = 0; d < nd; d++) h_u64(&h, t->shape[d]);
  }
  /* Only with views: a plan of whole receivers hashes as it always has. */
  if (p->nviews && p->view_parts && p->rank_view) {
    h_bytes(&h, "views", 5);
    h_u64(&h, p->nviews);
    for (size_t j = 0; j < (size_t)p->nviews * p->ntensors; j++) {
      const bcast_part *pt = &p->view_parts[j];
      h_u64(&h, (uint64_t)pt->kind);
      h_u64(&h, pt->dim);
      h_u64(&h, pt->start);
      h_u64(&h, pt->count);
    }
    for (uint32_t r = 0; r < p->world_size; r++) h_u64(&h, p->rank_view[r]);
  }
  /* Only with relays: a plan without them hashes as it always has. */
  if (p->relay_from) {
    h_bytes(&h, "relays", 6);
    for (uint32_t r = 0; r < p->world_size; r++) h_u64(&h, p->relay_from[r]);
  }
  h_u64(&h, p->nbuckets);
  for (size_t b = 0; b < p->nbuckets; b++) {
    const bcast_bucket *k = &p->buckets[b];
    h_u64(&h, k->index);
    h_u64(&h, k->layer);
    h_u64(&h, (uint64_t)k->wire_dtype);
    h_u64(&h, k->bytes);
    h_u64(&h, k->source_rank);
    h_u64(&h, k->stage_rank);
    h_u64(&h, k->nslices);
    for (size_t s = 0; s < k->nslices; s++) {
      h_u64(&h, k->slices[s].tensor);
      h_u64(&h, k->slices[s].elem_offset);
      h_u64(&h, k->slices[s].elem_count);
      h_u64(&h, k->slices[s].bucket_offset);
    }
  }
  XXH3_64bits_update(h.st, h.buf, h.len);
  uint64_t v = XXH3_64bits_digest(h.st);
  XXH3_freeState(h.st);
  return v;
}

/* ---- small helpers ----------------------------------------------------------- */

static void endpoints_free(char **eps, uint32_t n) {
  for (uint32_t r = 0; eps && r < n; r++) free(eps[r]);
  free(eps);
}

void bcast_plan_free(bcast_plan *p) {
  if (!p) return;
  endpoints_free(p->source_endpoints, p->nsources);
  endpoints_free(p->relay_endpoints, p->world_size);
  free(p->relay_from);
  bcast__views_free(p);
  bcast__wipe(p->secret, sizeof p->secret); /* freed memory is not a place to leave it */
  for (size_t b = 0; b < p->nbuckets; b++) free(p->buckets[b].slices);
  free(p->buckets);
  free(p->tensors);
  free(p);
}

uint64_t bcast_plan_wire_bytes(const bcast_plan *p) {
  uint64_t s = 0;
  for (size_t b = 0; b < p->nbuckets; b++) s += p->buckets[b].bytes;
  return s;
}

uint32_t bcast__plan_nsources(const bcast_plan *p) { return p->nsources > 1 ? p->nsources : 1; }

int bcast_plan_sources(const bcast_plan *p) { return p ? (int)bcast__plan_nsources(p) : 0; }

const char *bcast_plan_source_endpoint(const bcast_plan *p, uint32_t rank) {
  if (!p || rank >= bcast__plan_nsources(p)) return "";
  if (p->nsources <= 1 || !p->source_endpoints) return p->host_endpoint;
  return p->source_endpoints[rank] ? p->source_endpoints[rank] : "";
}

void bcast_plan_set_nccl_id(bcast_plan *p, const uint8_t id[128]) {
  memcpy(p->nccl_id, id, sizeof p->nccl_id);
  p->has_nccl_id = 1;
  p->hash = bcast_plan_hash(p);
}

bcast_plan *bcast_plan_dup(const bcast_plan *p) {
  bcast_plan *q = calloc(1, sizeof *q);
  if (!q) return NULL;
  *q = *p;
  q->tensors = NULL;
  q->buckets = NULL;
  q->nbuckets = 0;
  q->source_endpoints = NULL;
  q->relay_from = NULL;
  q->relay_endpoints = NULL;
  if (bcast__views_dup(q, p)) goto fail;
  if (p->relay_from && relays_copy(q, p->relay_from, (const char *const *)p->relay_endpoints)) goto fail;
  if (p->source_endpoints) {
    if (!(q->source_endpoints = calloc(p->nsources, sizeof *q->source_endpoints))) goto fail;
    for (uint32_t r = 0; r < p->nsources; r++)
      if (p->source_endpoints[r] && !(q->source_endpoints[r] = strdup(p->source_endpoints[r]))) goto fail;
  }
  if (!(q->tensors = malloc((p->ntensors ? p->ntensors : 1) * sizeof *q->tensors))) goto fail;
  if (p->ntensors) memcpy(q->tensors, p->tensors, p->ntensors * sizeof *q->tensors);
  if (!(q->buckets = calloc(p->nbuckets ? p->nbuckets : 1, sizeof *q->buckets))) goto fail;
  for (size_t b = 0; b < p->nbuckets; b++) {
    bcast_bucket *k = &q->buckets[b];
    *k = p->buckets[b];
    k->slices = malloc((k->nslices ? k->nslices : 1) * sizeof *k->slices);
    q->nbuckets = b + 1;
    if (!k->slices) goto fail;
    if (k->nslices) memcpy(k->slices, p->buckets[b].slices, k->nslices * sizeof *k->slices);
  }
  return q;
fail:
  bcast_plan_free(q);
  return NULL;
}

/* ---- relays ----------------------------------------------------------------------- */

/* p's relay arrays made from rf and eps (NULL or NULL entries: ""), both
 * world_size long.  BCAST_ENOMEM or 0; an endpoint too long is cut here and
 * refused by relays_check, which sees it at full length first. */
static int relays_copy(bcast_plan *p, const uint32_t *rf, const char *const *eps) {
  uint32_t n = p->world_size;
  if (!(p->relay_from = malloc((n ? n : 1) * sizeof *p->relay_from)) ||
      !(p->relay_endpoints = calloc(n ? n : 1, sizeof *p->relay_endpoints)))
    return BCAST_ENOMEM;
  memcpy(p->relay_from, rf, n * sizeof *rf);
  for (uint32_t r = 0; r < n; r++)
    if (!(p->relay_endpoints[r] = strndup(eps && eps[r] ? eps[r] : "", sizeof p->host_endpoint)))
      return BCAST_ENOMEM;
  return BCAST_OK;
}

/* depth[r]: the hops from the source to rank r along relay_from (0 for the
 * source), walking each chain once; -1 when r's chain never reaches the
 * source, with *at the rank where the walk found the cycle. */
static int relay_depths(const bcast_plan *p, uint32_t *depth, uint32_t *at) {
  uint32_t n = p->world_size, root = p->root_rank, unknown = UINT32_MAX, walking = UINT32_MAX - 1;
  for (uint32_t r = 0; r < n; r++) depth[r] = unknown;
  depth[root] = 0;
  for (uint32_t r = 0; r < n; r++) {
    uint32_t v = r;
    while (depth[v] == unknown) { /* mark the chain up to a known rank */
      depth[v] = walking;
      v = p->relay_from[v];
    }
    if (depth[v] == walking) { /* the walk met itself: a cycle */
      *at = v;
      return -1;
    }
    /* Unwind: each rank of the chain is one hop below the next. */
    uint32_t base = depth[v], len = 0;
    for (uint32_t u = r; depth[u] == walking; u = p->relay_from[u]) len++;
    for (uint32_t u = r, d = base + len; depth[u] == walking; d--) {
      uint32_t next = p->relay_from[u];
      depth[u] = d;
      u = next;
    }
  }
  return 0;
}

static int relays_check(const bcast_plan *p, bcast_err *err) {
  if (!p->relay_from) {
    if (p->relay_endpoints)
      return bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_endpoints without relay_from", p->id);
    return BCAST_OK;
  }
  if (p->mode != BCAST_MODE_HOST)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_from in %s mode: relays forward over the host "
                       "transport only", p->id, bcast_mode_name(p->mode));
  if (p->nsources > 1)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_from with %u sources: relays forward the bytes of "
                       "one source", p->id, p->nsources);
  if (p->nviews)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_from with receiver views: relays forward to whole "
                       "receivers only", p->id);
  if (!p->relay_endpoints)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_from without relay_endpoints", p->id);
  uint32_t n = p->world_size, root = p->root_rank;
  for (uint32_t r = 0; r < n; r++) {
    uint32_t u = p->relay_from[r];
    if (u >= n)
      return bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_from[%u] = %u: out of range (world size %u)", p->id,
                         r, u, n);
    if (r == root && u != r)
      return bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_from[%u] = %u: rank %u is the source, which takes "
                         "from no one (its entry is its own rank)", p->id, r, u, r);
    if (r != root && u == r)
      return bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_from[%u] = %u: a receiver takes from the source "
                         "or a relay, not from itself", p->id, r, u);
  }
  /* depth, then each rank's downstream count: one pass each, so that a
   * plan of many ranks (or a hostile one) costs linear time. */
  uint32_t *k = malloc((n ? n : 1) * sizeof *k), at = 0;
  if (!k) return bcast__fail(err, BCAST_ENOMEM, "out of memory validating plan '%s'", p->id);
  if (relay_depths(p, k, &at)) {
    free(k);
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_from[%u] = %u: rank %u is on a cycle that never "
                       "reaches the source (rank %u)", p->id, at, p->relay_from[at], at, root);
  }
  memset(k, 0, n * sizeof *k);
  for (uint32_t r = 0; r < n; r++)
    if (r != root) k[p->relay_from[r]]++;
  int rc = BCAST_OK;
  for (uint32_t r = 0; r < n && !rc; r++) {
    const char *e = p->relay_endpoints[r];
    uint32_t down = k[r];
    if (!e) rc = bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_endpoints[%u] missing", p->id, r);
    else if (strnlen(e, sizeof p->host_endpoint) >= sizeof p->host_endpoint)
      rc = bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_endpoints[%u] longer than 255 bytes", p->id, r);
    else if (r == root && e[0])
      rc = bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_endpoints[%u] '%s': rank %u is the source, which "
                       "listens at host_endpoint", p->id, r, e, r);
    else if (r != root && down && !e[0])
      rc = bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_endpoints[%u] empty: rank %u relays for %u "
                       "receiver(s)", p->id, r, r, down);
    else if (r != root && !down && e[0])
      rc = bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_endpoints[%u] '%s': rank %u relays for no receiver",
                       p->id, r, e, r);
  }
  free(k);
  return rc;
}

int bcast_plan_set_relays(bcast_plan *p, const uint32_t *relay_from, const char *const *relay_endpoints,
                          bcast_err *err) {
  if (!p) return bcast__fail(err, BCAST_EINVAL, "plan_set_relays: NULL plan");
  if (!relay_from && relay_endpoints)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_endpoints without relay_from", p->id);
  uint32_t *old_from = p->relay_from;
  char **old_eps = p->relay_endpoints;
  p->relay_from = NULL;
  p->relay_endpoints = NULL;
  int rc = BCAST_OK;
  for (uint32_t r = 0; relay_from && relay_endpoints && r < p->world_size && !rc; r++)
    if (relay_endpoints[r] && strlen(relay_endpoints[r]) >= sizeof p->host_endpoint)
      rc = bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_endpoints[%u] longer than 255 bytes", p->id, r);
  if (!rc && relay_from && relays_copy(p, relay_from, relay_endpoints))
    rc = bcast__fail(err, BCAST_ENOMEM, "plan '%s': out of memory for %u relay entries", p->id, p->world_size);
  if (!rc) rc = relays_check(p, err);
  if (rc) { /* the plan stays as it was */
    endpoints_free(p->relay_endpoints, p->world_size);
    free(p->relay_from);
    p->relay_from = old_from;
    p->relay_endpoints = old_eps;
    return rc;
  }
  endpoints_free(old_eps, p->world_size);
  free(old_from);
  p->hash = bcast_plan_hash(p);
  return BCAST_OK;
}

/* rank r's node, "" for a missing label */
static const char *node_of(const char *const *node, uint32_t r) { return node && node[r] ? node[r] : ""; }

uint32_t bcast_relay_layout(uint32_t world_size, uint32_t root, const char *const *node, const int *can_relay,
                            uint32_t *relay_from) {
  uint32_t relays = 0;
  for (uint32_t r = 0; r < world_size; r++) relay_from[r] = r == root ? r : root;
  if (root >= world_size) return 0;
  for (uint32_t r = 0; r < world_size; r++) {
    const char *nr = node_of(node, r);
    if (r == root || !strcmp(nr, node_of(node, root))) continue;
    /* The node's first receiver decides; later ones were settled by it. */
    int first = 1;
    for (uint32_t q = 0; q < r && first; q++) first = !(q != root && !strcmp(node_of(node, q), nr));
    if (!first) continue;
    uint32_t relay = UINT32_MAX, peers = 0;
    for (uint32_t q = r; q < world_size; q++)
      if (q != root && !strcmp(node_of(node, q), nr)) {
        peers++;
        if (relay == UINT32_MAX && (!can_relay || can_relay[q])) relay = q;
      }
    if (peers < 2 || relay == UINT32_MAX) continue; /* nothing to share, or no one to share it */
    relays++;
    for (uint32_t q = r; q < world_size; q++)
      if (q != root && q != relay && !strcmp(node_of(node, q), nr)) relay_from[q] = relay;
  }
  return relays;
}

uint32_t bcast_plan_upstream(const bcast_plan *p, uint32_t rank) {
  if (!p) return 0;
  return p->relay_from && rank < p->world_size ? p->relay_from[rank] : p->root_rank;
}

const char *bcast_plan_upstream_endpoint(const bcast_plan *p, uint32_t rank) {
  if (!p) return "";
  uint32_t u = bcast_plan_upstream(p, rank);
  if (u == p->root_rank || !p->relay_endpoints || !p->relay_endpoints[u]) return p->host_endpoint;
  return p->relay_endpoints[u];
}

uint32_t bcast_plan_downstreams(const bcast_plan *p, uint32_t rank) {
  if (!p || rank >= p->world_size) return 0;
  uint32_t ns = bcast__plan_nsources(p);
  if (!p->relay_from) {
    int source = ns > 1 ? rank < ns : rank == p->root_rank;
    return source ? p->world_size - ns : 0;
  }
  uint32_t k = 0;
  for (uint32_t r = 0; r < p->world_size; r++) k += r != rank && p->relay_from[r] == rank;
  return k;
}

uint32_t bcast__plan_fanout(const bcast_plan *p) {
  if (!p->relay_from) return p->world_size - bcast__plan_nsources(p);
  uint32_t *k = calloc(p->world_size ? p->world_size : 1, sizeof *k), m = 0;
  if (!k) return p->world_size - 1; /* every receiver on one link: the longest bound */
  for (uint32_t r = 0; r < p->world_size; r++)
    if (r != p->root_rank && p->relay_from[r] < p->world_size && ++k[p->relay_from[r]] > m) m = k[p->relay_from[r]];
  free(k);
  return m;
}

uint32_t bcast__plan_depth(const bcast_plan *p) {
  if (!p->relay_from) return 1;
  uint32_t *depth = malloc((p->world_size ? p->world_size : 1) * sizeof *depth), at = 0, m = 1;
  if (!depth) return p->world_size; /* a chain through every rank: the longest bound */
  if (relay_depths(p, depth, &at) == 0)
    for (uint32_t r = 0; r < p->world_size; r++)
      if (depth[r] > m) m = depth[r];
  free(depth);
  return m;
}

/* ---- binding local tensors ------------------------------------------------------ */

static const bcast_tensor *find_local(const bcast_tensor **sorted, size_t n, const char *name) {
  bcast_tensor key;
  memset(key.name, 0, sizeof key.name);
  snprintf(key.name, sizeof key.name, "%s", name);
  const bcast_tensor *kp = &key;
  const bcast_tensor **hit = bsearch(&kp, sorted, n, sizeof *sorted, name_cmp);
  return hit ? *hit : NULL;
}

static int bind_one(const bcast_tensor *pt, const bcast_tensor *lt, int sender, int shards, bcast_err *err) {
  const char *nm = pt->name;
  if (!lt) return bcast__fail(err, BCAST_EINVAL, "tensor '%s': in the plan but missing from the local tensors", nm);
  if (lt->ndim != pt->ndim || memcmp(lt->shape, pt->shape, pt->ndim * sizeof pt->shape[0]) != 0)
    return bcast__fail(err, BCAST_EINVAL, "tensor '%s': local shape differs from the plan's", nm);
  uint64_t elems = bcast_tensor_elems(pt);
  if (lt->shard_offset > elems || lt->shard_elems > elems - lt->shard_offset ||
      (!lt->shard_elems && lt->shard_offset))
    return bcast__fail(err, BCAST_EINVAL, "tensor '%s': local shard [%llu, +%llu) outside its %llu elements", nm,
                       (unsigned long long)lt->shard_offset, (unsigned long long)lt->shard_elems,
                       (unsigned long long)elems);
  if (!shards && bcast_tensor_held(lt) != elems)
    return bcast__fail(err, BCAST_EINVAL, "tensor '%s': the local tensor is a shard (elements [%llu, +%llu) of "
                       "%llu); %s", nm, (unsigned long long)lt->shard_offset, (unsigned long long)lt->shard_elems,
                       (unsigned long long)elems, sender ? "only a host-mode sender sends from shards"
                                                         : "receivers hold whole tensors");
  if (sender && lt->storage_dtype != pt->storage_dtype)
    return bcast__fail(err, BCAST_EINVAL, "tensor '%s': local storage dtype %s, plan says %s", nm,
                       bcast_dtype_name(lt->storage_dtype), bcast_dtype_name(pt->storage_dtype));
  if (!sender && lt->wire_dtype != pt->wire_dtype)
    return bcast__fail(err, BCAST_EINVAL, "tensor '%s': local buffer dtype %s, plan's wire dtype is %s", nm,
                       bcast_dtype_name(lt->wire_dtype), bcast_dtype_name(pt->wire_dtype));
  if (lt->residency < BCAST_RES_GPU || lt->residency > BCAST_RES_HOST_PAGEABLE)
    return bcast__fail(err, BCAST_EINVAL, "tensor '%s': unknown local residency %d", nm, (int)lt->residency);
  if (!lt->data) return bcast__fail(err, BCAST_EINVAL, "tensor '%s': local data pointer is NULL", nm);
  return BCAST_OK;
}

/* need: plan tensors to bind (NULL: all; the others map to UINT32_MAX);
 * shards: local tensors may be shards (a host-mode sender). */
int bcast__plan_bind_some(const bcast_plan *p, const bcast_tensor *local, size_t n, int sender,
                          const uint8_t *need, int shards, uint32_t *map, bcast_err *err) {
  if (n && !local) return bcast__fail(err, BCAST_EINVAL, "local tensors: NULL array");
  if (n > UINT32_MAX) return bcast__fail(err, BCAST_EINVAL, "local tensors: too many");
  for (size_t i = 0; i < n; i++)
    if (!name_ok(local[i].name))
      return bcast__fail(err, BCAST_EINVAL, "local tensor #%zu: name is empty or not terminated", i);
  const bcast_tensor **v = sorted_by_name(local, n);
  if (!v) return bcast__fail(err, BCAST_ENOMEM, "out of memory binding %zu tensors", n);
  int rc = BCAST_OK;
  for (size_t i = 1; i < n && !rc; i++)
    if (name_cmp(&v[i - 1], &v[i]) == 0)
      rc = bcast__fail(err, BCAST_EINVAL, "tensor '%s': duplicate name in the local tensors", v[i]->name);
  for (size_t i = 0; i < p->ntensors && !rc; i++) {
    if (need && !need[i]) {
      if (map) map[i] = UINT32_MAX;
      continue;
    }
    const bcast_tensor *lt = find_local(v, n, p->tensors[i].name);
    rc = bind_one(&p->tensors[i], lt, sender, shards, err);
    if (!rc && map) map[i] = (uint32_t)(lt - local);
  }
  free(v);
  return rc;
}

int bcast__plan_bind(const bcast_plan *p, const bcast_tensor *local, size_t n, int sender, uint32_t *map,
                     bcast_err *err) {
  return bcast__plan_bind_some(p, local, n, sender, NULL, 0, map, err);
}

int bcast__plan_bind_source(const bcast_plan *p, uint32_t rank, const bcast_tensor *local, size_t n,
                            uint32_t *map, bcast_err *err) {
  uint8_t *need = calloc(p->ntensors ? p->ntensors : 1, 1);
  if (!need) return bcast__fail(err, BCAST_ENOMEM, "out of memory binding %zu tensors", p->ntensors);
  for (size_t b = 0; b < p->nbuckets; b++)
    if (p->buckets[b].source_rank == rank)
      for (size_t s = 0; s < p->buckets[b].nslices; s++) need[p->buckets[b].slices[s].tensor] = 1;
  int rc = bcast__plan_bind_some(p, local, n, 1, need, 1, map, err);
  free(need);
  /* What this rank sends must be what it holds. */
  for (size_t b = 0; b < p->nbuckets && !rc; b++) {
    const bcast_bucket *k = &p->buckets[b];
    if (k->source_rank != rank) continue;
    for (size_t s = 0; s < k->nslices && !rc; s++) {
      const bcast_slice *sl = &k->slices[s];
      const bcast_tensor *lt = &local[map[sl->tensor]];
      uint64_t lo = lt->shard_offset, hi = lo + bcast_tensor_held(lt);
      if (sl->elem_offset < lo || sl->elem_offset + sl->elem_count > hi)
        rc = bcast__fail(err, BCAST_EINVAL, "tensor '%s': bucket %zu of source rank %u carries elements [%llu, "
                         "%llu), but this rank holds [%llu, %llu)", p->tensors[sl->tensor].name, b, rank,
                         (unsigned long long)sl->elem_offset, (unsigned long long)(sl->elem_offset + sl->elem_count),
                         (unsigned long long)lo, (unsigned long long)hi);
    }
  }
  return rc;
}

int bcast_plan_check_local(const bcast_plan *p, const bcast_tensor *local, size_t n, int sender,
                           bcast_err *err) {
  if (!p) return bcast__fail(err, BCAST_EINVAL, "plan: NULL");
  return bcast__plan_bind(p, local, n, sender, NULL, err);
}

int bcast_plan_check_source(const bcast_plan *p, uint32_t rank, const bcast_tensor *local, size_t n,
                            bcast_err *err) {
  if (!p) return bcast__fail(err, BCAST_EINVAL, "plan: NULL");
  if (rank >= bcast__plan_nsources(p) && !(bcast__plan_nsources(p) == 1 && rank == p->root_rank))
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': rank %u is not one of its %u sources", p->id, rank,
                       bcast__plan_nsources(p));
  uint32_t *map = malloc((p->ntensors ? p->ntensors : 1) * sizeof *map);
  if (!map) return bcast__fail(err, BCAST_ENOMEM, "out of memory checking %zu tensors", p->ntensors);
  int rc = bcast__plan_bind_source(p, rank, local, n, map, err);
  free(map);
  return rc;
}
