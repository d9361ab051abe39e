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
