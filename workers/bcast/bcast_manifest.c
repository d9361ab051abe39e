/* The rules of a manifest, in one place: what a trainer registers, what a
 * step report carries, what a plan is built from and what a received plan
 * describes are all checked here, tensor by tensor, in one pass. A tensor is
 * read through a view, so the protobuf message and the engine's struct are
 * checked by the same code without converting one into the other first (a
 * manifest refused at Register costs no copy of it). Duplicate names are
 * found with a hash set of indices: one probe per tensor, whatever the count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "workers/bcast/bcast_internal.h"
#include "workers/bcast/bcast_pb.h"

/* One tensor as the rules see it. */
typedef struct tensor_view {
  const char *name; /* NULL: the entry itself is missing */
  size_t name_len;
  int unterminated; /* a struct's name that fills its array without a NUL */
  int storage, wire, residency;
  size_t ndim;
  const uint64_t *shape;
} tensor_view;

typedef void (*view_fn)(const void *src, size_t i, tensor_view *v);

static void view_struct(const void *src, size_t i, tensor_view *v) {
  const bcast_tensor *t = &((const bcast_tensor *)src)[i];
  size_t len = strnlen(t->name, BCAST_NAME_MAX);
  *v = (tensor_view){.name = t->name, .name_len = len, .unterminated = len == BCAST_NAME_MAX,
                     .storage = (int)t->storage_dtype, .wire = (int)t->wire_dtype,
                     .residency = (int)t->residency, .ndim = t->ndim, .shape = t->shape};
}

static void view_pb(const void *src, size_t i, tensor_view *v) {
  const Rlorch__V1__TensorSpec *s = ((Rlorch__V1__TensorSpec *const *)src)[i];
  if (!s) {
    *v = (tensor_view){0};
    return;
  }
  const char *nm = s->name ? s->name : "";
  *v = (tensor_view){.name = nm, .name_len = strlen(nm), .storage = (int)s->storage_dtype,
                     .wire = (int)s->wire_dtype, .residency = (int)s->residency,
                     .ndim = s->n_shape, .shape = s->shape};
}

/* ---- duplicate names: open addressing over tensor indices ------------------------------ */

typedef struct name_set {
  uint32_t *slot; /* index + 1; 0 is empty */
  size_t mask;
} name_set;

static int name_set_init(name_set *s, size_t n) {
  size_t cap = 16;
  while (cap < 2 * n) cap *= 2; /* at most half full: short probe runs */
  s->slot = calloc(cap, sizeof *s->slot);
  s->mask = cap - 1;
  return s->slot ? 0 : -1;
}

/* Inserts tensor i; returns the index of an earlier tensor of the same name,
 * or SIZE_MAX when the name is new. */
static size_t name_set_add(name_set *s, const void *src, view_fn view, size_t i,
                           const tensor_view *v) {
  size_t h = (size_t)XXH3_64bits(v->name, v->name_len) & s->mask;
  for (;; h = (h + 1) & s->mask) {
    uint32_t e = s->slot[h];
    if (!e) {
      s->slot[h] = (uint32_t)(i + 1);
      return SIZE_MAX;
    }
    tensor_view o;
    view(src, e - 1, &o); /* a tensor whose name passed: never a missing entry */
    if (o.name && o.name_len == v->name_len && !memcmp(o.name, v->name, v->name_len)) return e - 1;
  }
}

/* ---- one tensor --------------------------------------------------------------------------- */

static int name_check(const tensor_view *v, size_t i, bcast_err *err) {
  if (!v->name) return bcast__fail(err, BCAST_EINVAL, "tensor #%zu: missing", i);
  if (v->name_len == 0) return bcast__fail(err, BCAST_EINVAL, "tensor #%zu: name: empty", i);
  for (size_t k = 0; k < v->name_len; k++) {
    unsigned char ch = (unsigned char)v->name[k];
    if (ch < 0x20 || ch == 0x7f) /* names are quoted in logs and messages */
      return bcast__fail(err, BCAST_EINVAL, "tensor #%zu: name: control character 0x%02x at byte %zu",
                         i, ch, k);
  }
  if (v->unterminated)
    return bcast__fail(err, BCAST_EINVAL, "tensor #%zu '%.32s...': name: not terminated within %d bytes", i,
                       v->name, BCAST_NAME_MAX);
  if (v->name_len >= BCAST_NAME_MAX)
    return bcast__fail(err, BCAST_EINVAL, "tensor #%zu '%.32s...': name: %zu bytes, longer than %d", i,
                       v->name, v->name_len, BCAST_NAME_MAX - 1);
  return BCAST_OK;
}

/* Everything but the name and its uniqueness; *bytes is the tensor's size:
 * its elements times the larger of its two element sizes. */
static int fields_check(const tensor_view *v, size_t i, const bcast_manifest_limits *lim,
                        uint64_t *bytes, bcast_err *err) {
  const char *nm = v->name;
  if (v->ndim == 0 || v->ndim > BCAST_MAX_DIMS)
    return bcast__fail(err, BCAST_EINVAL, "tensor #%zu '%s': shape: %zu dimensions, want 1..%d", i, nm,
                       v->ndim, BCAST_MAX_DIMS);
  uint64_t elems = 1;
  for (size_t d = 0; d < v->ndim; d++) {
    if (v->shape[d] == 0)
      return bcast__fail(err, BCAST_EINVAL, "tensor #%zu '%s': shape[%zu]: 0, every dimension is at least 1",
                         i, nm, d);
    if (__builtin_mul_overflow(elems, v->shape[d], &elems))
      return bcast__fail(err, BCAST_EINVAL, "tensor #%zu '%s': shape: the element count overflows 64 bits",
                         i, nm);
  }
  size_t ss = bcast_dtype_size((bcast_dtype)v->storage), ws = bcast_dtype_size((bcast_dtype)v->wire);
  if (!ss)
    return bcast__fail(err, BCAST_EINVAL, "tensor #%zu '%s': storage_dtype: unknown value %d", i, nm,
                       v->storage);
  if (!ws)
    return bcast__fail(err, BCAST_EINVAL, "tensor #%zu '%s': wire_dtype: unknown value %d", i, nm, v->wire);
  if (!bcast_cast_supported((bcast_dtype)v->storage, (bcast_dtype)v->wire))
    return bcast__fail(err, BCAST_EINVAL, "tensor #%zu '%s': wire_dtype: no cast from %s to %s", i, nm,
                       bcast_dtype_name((bcast_dtype)v->storage), bcast_dtype_name((bcast_dtype)v->wire));
  if (v->residency < BCAST_RES_GPU || v->residency > BCAST_RES_HOST_PAGEABLE)
    return bcast__fail(err, BCAST_EINVAL, "tensor #%zu '%s': residency: unknown value %d", i, nm,
                       v->residency);
  size_t esz = ss > ws ? ss : ws;
  if (__builtin_mul_overflow(elems, (uint64_t)esz, bytes))
    return bcast__fail(err, BCAST_EINVAL, "tensor #%zu '%s': size: %llu elements of %zu bytes overflow 64 bits",
                       i, nm, (unsigned long long)elems, esz);
  if (*bytes > lim->max_tensor_bytes)
    return bcast__fail(err, BCAST_EINVAL,
                       "tensor #%zu '%s': size: %llu bytes is over the limit of %llu (max_tensor_bytes)", i,
                       nm, (unsigned long long)*bytes, (unsigned long long)lim->max_tensor_bytes);
  return BCAST_OK;
}

/* ---- a whole manifest ------------------------------------------------------------------- */

static bcast_manifest_limits limits_of(const bcast_manifest_limits *lim) {
  bcast_manifest_limits l = lim ? *lim : (bcast_manifest_limits){0};
  if (!l.max_manifest_tensors || l.max_manifest_tensors > BCAST_MAX_TENSORS)
    l.max_manifest_tensors = BCAST_MAX_TENSORS;
  if (!l.max_tensor_bytes || l.max_tensor_bytes > BCAST_MAX_TENSOR_BYTES)
    l.max_tensor_bytes = BCAST_MAX_TENSOR_BYTES;
  if (!l.max_manifest_bytes) l.max_manifest_bytes = UINT64_MAX;
  return l;
}

static int check_all(const void *src, size_t n, view_fn view, const bcast_manifest_limits *limits,
                     bcast_err *err) {
  bcast_manifest_limits lim = limits_of(limits);
  /* First, before anything is allocated for it. */
  if (n > lim.max_manifest_tensors)
    return bcast__fail(err, BCAST_EINVAL, "%zu tensors is over the limit of %llu (max_manifest_tensors)",
                       n, (unsigned long long)lim.max_manifest_tensors);
  name_set names;
  if (name_set_init(&names, n))
    return bcast__fail(err, BCAST_ENOMEM, "out of memory checking %zu tensor names", n);
  int rc = BCAST_OK;
  uint64_t total = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    tensor_view v;
    view(src, i, &v);
    uint64_t bytes = 0;
    if ((rc = name_check(&v, i, err)) || (rc = fields_check(&v, i, &lim, &bytes, err))) break;
    size_t first = name_set_add(&names, src, view, i, &v);
    if (first != SIZE_MAX)
      rc = bcast__fail(err, BCAST_EINVAL, "tensors #%zu and #%zu: duplicate name '%s'", first, i, v.name);
    else if (__builtin_add_overflow(total, bytes, &total) || total > lim.max_manifest_bytes)
      rc = bcast__fail(err, BCAST_EINVAL,
                       "the tensors' sizes summed pass the limit of %llu bytes "
                       "(max_manifest_bytes) at tensor #%zu '%s'",
                       (unsigned long long)lim.max_manifest_bytes, i, v.name);
  }
  free(names.slot);
  return rc;
}

int bcast_manifest_check(const bcast_tensor *t, size_t n, const bcast_manifest_limits *lim,
                         bcast_err *err) {
  if (n && !t) return bcast__fail(err, BCAST_EINVAL, "NULL tensor array");
  return check_all(t, n, view_struct, lim, err);
}

int bcast__specs_check(Rlorch__V1__TensorSpec *const *specs, size_t n,
                       const bcast_manifest_limits *lim, bcast_err *err) {
  if (n && !specs) return bcast__fail(err, BCAST_EINVAL, "NULL tensor array");
  return check_all(specs, n, view_pb, lim, err);
}

#define BCAST_PRESET_MAX 64 /* NUL included */

int bcast_manifest_check_pb(const Rlorch__V1__WeightManifest *m, const bcast_manifest_limits *lim,
                            bcast_err *err) {
  if (!m) return bcast__fail(err, BCAST_EINVAL, "NULL manifest");
  if (m->preset && strlen(m->preset) >= BCAST_PRESET_MAX)
    return bcast__fail(err, BCAST_EINVAL, "preset: longer than %d bytes", BCAST_PRESET_MAX - 1);
  if (!protobuf_c_enum_descriptor_get_value(&rlorch__v1__offload__descriptor, m->offload))
    return bcast__fail(err, BCAST_EINVAL, "offload: unknown value %d", (int)m->offload);
  return bcast__specs_check(m->tensors, m->n_tensors, lim, err);
}

/* ---- shards of several source ranks --------------------------------------------------------- */

uint64_t bcast_tensor_held(const bcast_tensor *t) {
  return t->shard_elems ? t->shard_elems : bcast_tensor_elems(t);
}

/* One rank's piece of one tensor, while sorting. */
typedef struct piece_ref {
  const bcast_tensor *t;
  uint32_t rank;
  uint32_t index; /* in its rank's list */
  uint64_t off, count;
} piece_ref;

static int ref_cmp(const void *a, const void *b) {
  const piece_ref *x = a, *y = b;
  int c = strncmp(x->t->name, y->t->name, BCAST_NAME_MAX);
  if (c) return c;
  if (x->off != y->off) return x->off < y->off ? -1 : 1;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* A tensor's first appearance: rank, then index in that rank's list. */
typedef struct group_ref {
  size_t start, end; /* in the sorted refs */
  uint32_t rank, index;
} group_ref;

static int group_ref_cmp(const void *a, const void *b) {
  const group_ref *x = a, *y = b;
  if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

static void shape_str(const bcast_tensor *t, char *out, size_t len) {
  size_t k = (size_t)snprintf(out, len, "[");
  for (uint32_t d = 0; d < t->ndim && d < BCAST_MAX_DIMS && k < len; d++)
    k += (size_t)snprintf(out + k, len - k, "%s%llu", d ? ", " : "", (unsigned long long)t->shape[d]);
  if (k < len) snprintf(out + k, len - k, "]");
}

/* What every rank holding part of one tensor must agree on. */
static int piece_agrees(const piece_ref *ref, const piece_ref *o, bcast_err *err) {
  const bcast_tensor *a = ref->t, *b = o->t;
  const char *nm = a->name;
  if (a->ndim != b->ndim || memcmp(a->shape, b->shape, a->ndim * sizeof a->shape[0])) {
    char sa[200], sb[200];
    shape_str(a, sa, sizeof sa);
    shape_str(b, sb, sizeof sb);
    return bcast__fail(err, BCAST_EINVAL, "tensor '%s': rank %u and rank %u disagree on shape (%s vs %s)", nm,
                       ref->rank, o->rank, sa, sb);
  }
  if (a->layer != b->layer)
    return bcast__fail(err, BCAST_EINVAL, "tensor '%s': rank %u and rank %u disagree on layer (%u vs %u)", nm,
                       ref->rank, o->rank, a->layer, b->layer);
  if (a->storage_dtype != b->storage_dtype)
    return bcast__fail(err, BCAST_EINVAL, "tensor '%s': rank %u and rank %u disagree on storage_dtype (%s vs %s)",
                       nm, ref->rank, o->rank, bcast_dtype_name(a->storage_dtype),
                       bcast_dtype_name(b->storage_dtype));
  if (a->wire_dtype != b->wire_dtype)
    return bcast__fail(err, BCAST_EINVAL, "tensor '%s': rank %u and rank %u disagree on wire_dtype (%s vs %s)",
                       nm, ref->rank, o->rank, bcast_dtype_name(a->wire_dtype), bcast_dtype_name(b->wire_dtype));
  return BCAST_OK;
}

static void edge_name(const piece_ref *r, const char *none, char *out, size_t len) {
  if (r) snprintf(out, len, "rank %u", r->rank);
  else snprintf(out, len, "%s", none);
}

/* refs[start, end) are one tensor's pieces by offset: they must tile it. */
static int group_tiles(const piece_ref *refs, size_t start, size_t end, int gaps_ok, bcast_err *err) {
  const char *nm = refs[start].t->name;
  uint64_t elems = bcast_tensor_elems(refs[start].t), next = 0;
  const piece_ref *last = NULL; /* the piece that reaches furthest so far */
  char a[32], b[32];
  for (size_t i = start; i < end; i++) {
    const piece_ref *r = &refs[i];
    if (r->off > next && !gaps_ok) {
      edge_name(last, "the start", a, sizeof a);
      return bcast__fail(err, BCAST_EINVAL, "tensor '%s': elements [%llu, %llu) of %llu are held by no rank "
                         "(between %s and rank %u)", nm, (unsigned long long)next, (unsigned long long)r->off,
                         (unsigned long long)elems, a, r->rank);
    }
    if (r->off < next)
      return bcast__fail(err, BCAST_EINVAL, "tensor '%s': rank %u holds [%llu, %llu) and rank %u holds [%llu, "
                         "%llu): they overlap", nm, last->rank, (unsigned long long)last->off,
                         (unsigned long long)(last->off + last->count), r->rank, (unsigned long long)r->off,
                         (unsigned long long)(r->off + r->count));
    if (r->off + r->count > next || !last) {
      next = r->off + r->count;
      last = r;
    }
  }
  if (next < elems && !gaps_ok) {
    edge_name(last, "the start", a, sizeof a);
    snprintf(b, sizeof b, "the end");
    return bcast__fail(err, BCAST_EINVAL, "tensor '%s': elements [%llu, %llu) of %llu are held by no rank "
                       "(between %s and %s)", nm, (unsigned long long)next, (unsigned long long)elems,
                       (unsigned long long)elems, a, b);
  }
  return BCAST_OK;
}

/* Each rank's list on its own: the manifest's rules, then its ranges. */
static int rank_check(const bcast_tensor *t, size_t n, uint32_t r, const bcast_manifest_limits *lim,
                      bcast_err *err) {
  int rc = bcast_manifest_check(t, n, lim, err);
  if (rc) {
    if (err) {
      char m[sizeof err->msg - 32]; /* the prefix fits in what is cut */
      snprintf(m, sizeof m, "%.*s", (int)sizeof m - 1, err->msg);
      snprintf(err->msg, sizeof err->msg, "source rank %u: %s", r, m);
    }
    return rc;
  }
  for (size_t i = 0; i < n; i++) {
    uint64_t elems = bcast_tensor_elems(&t[i]);
    if (!t[i].shard_elems && t[i].shard_offset)
      return bcast__fail(err, BCAST_EINVAL, "source rank %u: tensor #%zu '%s': shard_offset %llu without "
                         "shard_elems", r, i, t[i].name, (unsigned long long)t[i].shard_offset);
    if (t[i].shard_offset > elems || t[i].shard_elems > elems - t[i].shard_offset)
      return bcast__fail(err, BCAST_EINVAL, "source rank %u: tensor #%zu '%s': shard [%llu, +%llu) outside its "
                         "%llu elements", r, i, t[i].name, (unsigned long long)t[i].shard_offset,
                         (unsigned long long)t[i].shard_elems, (unsigned long long)elems);
  }
  return BCAST_OK;
}

void bcast_shard_map_free(bcast_shard_map *m) {
  if (!m) return;
  free(m->tensors);
  free(m->pieces);
  free(m->first);
  free(m);
}

static int map_fill(bcast_shard_map *m, const piece_ref *refs, group_ref *g, size_t ng) {
  qsort(g, ng, sizeof *g, group_ref_cmp); /* order of first appearance */
  m->tensors = calloc(ng ? ng : 1, sizeof *m->tensors);
  m->first = calloc(ng + 1, sizeof *m->first);
  m->pieces = calloc(m->npieces ? m->npieces : 1, sizeof *m->pieces);
  if (!m->tensors || !m->first || !m->pieces) return BCAST_ENOMEM;
  size_t k = 0;
  for (size_t i = 0; i < ng; i++) {
    bcast_tensor *t = &m->tensors[i];
    *t = *refs[g[i].start].t;
    t->data = NULL; /* the global view describes; it holds nothing */
    t->device = 0;
    t->shard_offset = t->shard_elems = 0;
    m->first[i] = k;
    for (size_t j = g[i].start; j < g[i].end; j++)
      m->pieces[k++] = (bcast_piece){refs[j].rank, refs[j].off, refs[j].count};
  }
  m->first[ng] = k;
  m->ntensors = ng;
  return BCAST_OK;
}

static int shards_check(const bcast_tensor *const *ranks, const size_t *n, size_t nranks,
                        const bcast_manifest_limits *lim, int gaps_ok, bcast_shard_map **out,
                        bcast_err *err) {
  if (!out || (nranks && (!ranks || !n))) return bcast__fail(err, BCAST_EINVAL, "shards_check: NULL argument");
  *out = NULL;
  if (nranks == 0 || nranks > UINT32_MAX)
    return bcast__fail(err, BCAST_EINVAL, "shards_check: %zu source ranks, want 1..%u", nranks, UINT32_MAX);
  size_t total = 0;
  for (size_t r = 0; r < nranks; r++) {
    if (n[r] && !ranks[r]) return bcast__fail(err, BCAST_EINVAL, "source rank %zu: NULL tensor array", r);
    int rc = rank_check(ranks[r], n[r], (uint32_t)r, lim, err);
    if (rc) return rc;
    if (__builtin_add_overflow(total, n[r], &total) || total > UINT32_MAX)
      return bcast__fail(err, BCAST_EINVAL, "shards_check: more than %u pieces", UINT32_MAX);
  }
  piece_ref *refs = malloc((total ? total : 1) * sizeof *refs);
  group_ref *g = malloc((total ? total : 1) * sizeof *g);
  bcast_shard_map *m = calloc(1, sizeof *m);
  int rc = BCAST_OK;
  if (!refs || !g || !m) {
    rc = bcast__fail(err, BCAST_ENOMEM, "out of memory checking %zu pieces", total);
    goto out;
  }
  size_t k = 0;
  for (size_t r = 0; r < nranks; r++)
    for (size_t i = 0; i < n[r]; i++) {
      const bcast_tensor *t = &ranks[r][i];
      refs[k++] = (piece_ref){t, (uint32_t)r, (uint32_t)i, t->shard_offset, bcast_tensor_held(t)};
    }
  qsort(refs, total, sizeof *refs, ref_cmp);
  size_t ng = 0;
  for (size_t s = 0; s < total && !rc;) {
    size_t e = s + 1;
    while (e < total && !strncmp(refs[e].t->name, refs[s].t->name, BCAST_NAME_MAX)) e++;
    size_t first = s; /* the lowest rank (then index) is the reference */
    for (size_t i = s + 1; i < e; i++)
      if (refs[i].rank < refs[first].rank) first = i;
    for (size_t i = s; i < e && !rc; i++)
      if (i != first) rc = piece_agrees(&refs[first], &refs[i], err);
    if (!rc) rc = group_tiles(refs, s, e, gaps_ok, err);
    g[ng++] = (group_ref){s, e, refs[first].rank, refs[first].index};
    s = e;
  }
  if (!rc && !gaps_ok) {
    m->nranks = (uint32_t)nranks;
    m->npieces = total;
    if (map_fill(m, refs, g, ng)) rc = bcast__fail(err, BCAST_ENOMEM, "out of memory for a map of %zu pieces", total);
  }
out:
  free(refs);
  free(g);
  if (rc || gaps_ok) bcast_shard_map_free(m);
  else *out = m;
  return rc;
}

int bcast_shards_check(const bcast_tensor *const *ranks, const size_t *n, size_t nranks,
                       const bcast_manifest_limits *lim, bcast_shard_map **out, bcast_err *err) {
  return shards_check(ranks, n, nranks, lim, 0, out, err);
}

int bcast_shards_check_partial(const bcast_tensor *const *ranks, const size_t *n, size_t nranks,
                               const bcast_manifest_limits *lim, bcast_err *err) {
  bcast_shard_map *m = NULL;
  return shards_check(ranks, n, nranks, lim, 1, &m, err);
}
