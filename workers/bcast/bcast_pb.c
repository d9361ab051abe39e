/* bcast structs <-> rlorch.v1 protobuf messages. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/bcast/bcast_internal.h"
#include "workers/bcast/bcast_pb.h"

/* ---- tensors ------------------------------------------------------------------ */

static void spec_free(Rlorch__V1__TensorSpec *s) {
  if (!s) return;
  free(s->name);
  free(s->shape);
  free(s);
}

static Rlorch__V1__TensorSpec *spec_new(const bcast_tensor *t) {
  Rlorch__V1__TensorSpec *s = malloc(sizeof *s);
  if (!s) return NULL;
  rlorch__v1__tensor_spec__init(s);
  uint32_t nd = t->ndim <= BCAST_MAX_DIMS ? t->ndim : BCAST_MAX_DIMS;
  s->name = strndup(t->name, BCAST_NAME_MAX - 1);
  s->shape = malloc((nd ? nd : 1) * sizeof *s->shape);
  if (!s->name || !s->shape) {
    spec_free(s);
    return NULL;
  }
  s->layer = t->layer;
  s->storage_dtype = (Rlorch__V1__DType)t->storage_dtype;
  s->wire_dtype = (Rlorch__V1__DType)t->wire_dtype;
  s->n_shape = nd;
  memcpy(s->shape, t->shape, nd * sizeof *s->shape);
  s->residency = (Rlorch__V1__Residency)t->residency;
  s->shard_offset = t->shard_offset;
  s->shard_elems = t->shard_elems;
  return s;
}

/* A conversion: the specs were checked by the manifest's rules first
 * (bcast__specs_check), so the shape fits and the name is terminated. */
static void spec_to_tensor(const Rlorch__V1__TensorSpec *s, bcast_tensor *t) {
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", s->name);
  t->layer = s->layer;
  t->storage_dtype = (bcast_dtype)s->storage_dtype;
  t->wire_dtype = (bcast_dtype)s->wire_dtype;
  t->ndim = (uint32_t)s->n_shape;
  memcpy(t->shape, s->shape, s->n_shape * sizeof *t->shape);
  t->residency = (bcast_residency)s->residency;
  t->shard_offset = s->shard_offset;
  t->shard_elems = s->shard_elems;
}

/* ---- plan ------------------------------------------------------------------------ */

static void bucket_free(Rlorch__V1__Bucket *b) {
  if (!b) return;
  for (size_t s = 0; b->slices && s < b->n_slices; s++) free(b->slices[s]);
  free(b->slices);
  free(b);
}

static Rlorch__V1__Bucket *bucket_new(const bcast_bucket *k) {
  Rlorch__V1__Bucket *b = malloc(sizeof *b);
  if (!b) return NULL;
  rlorch__v1__bucket__init(b);
  b->index = k->index;
  b->layer = k->layer;
  b->wire_dtype = (Rlorch__V1__DType)k->wire_dtype;
  b->bytes = k->bytes;
  b->source_rank = k->source_rank;
  b->stage_rank = k->stage_rank;
  if (!(b->slices = calloc(k->nslices ? k->nslices : 1, sizeof *b->slices))) {
    free(b);
    return NULL;
  }
  for (size_t s = 0; s < k->nslices; s++) {
    Rlorch__V1__BucketSlice *sl = malloc(sizeof *sl);
    if (!sl) {
      bucket_free(b);
      return NULL;
    }
    rlorch__v1__bucket_slice__init(sl);
    sl->tensor = k->slices[s].tensor;
    sl->element_offset = k->slices[s].elem_offset;
    sl->element_count = k->slices[s].elem_count;
    sl->bucket_offset = k->slices[s].bucket_offset;
    b->slices[s] = sl;
    b->n_slices = s + 1;
  }
  return b;
}

static void plan_msg_free(Rlorch__V1__BroadcastPlan *m) {
  free(m->plan_id);
  free(m->host_endpoint);
  free(m->mode_reason);
  free(m->nccl_unique_id.data);
  for (size_t i = 0; m->source_endpoints && i < m->n_source_endpoints; i++) free(m->source_endpoints[i]);
  free(m->source_endpoints);
  if (m->data_secret.data) bcast__wipe(m->data_secret.data, m->data_secret.len);
  free(m->data_secret.data);
  for (size_t i = 0; m->tensors && i < m->n_tensors; i++) spec_free(m->tensors[i]);
  free(m->tensors);
  for (size_t i = 0; m->buckets && i < m->n_buckets; i++) bucket_free(m->buckets[i]);
  free(m->buckets);
  for (size_t v = 0; m->views && v < m->n_views; v++) {
    for (size_t j = 0; m->views[v] && j < m->views[v]->n_parts; j++) free(m->views[v]->parts[j]);
    if (m->views[v]) free(m->views[v]->parts);
    free(m->views[v]);
  }
  free(m->views);
  free(m->rank_views);
  free(m->relay_from);
  for (size_t i = 0; m->relay_endpoints && i < m->n_relay_endpoints; i++) free(m->relay_endpoints[i]);
  free(m->relay_endpoints);
  free(m);
}

/* Relays on the wire: world_size entries each, only when the plan has them
 * (a plan without relays encodes as it did before). 1, or 0 out of memory. */
static int relays_to_pb(const bcast_plan *p, Rlorch__V1__BroadcastPlan *m) {
  if (!p->relay_from) return 1;
  size_t n = p->world_size;
  if (!(m->relay_from = malloc((n ? n : 1) * sizeof *m->relay_from)) ||
      !(m->relay_endpoints = calloc(n ? n : 1, sizeof *m->relay_endpoints)))
    return 0;
  memcpy(m->relay_from, p->relay_from, n * sizeof *m->relay_from);
  m->n_relay_from = n;
  for (size_t r = 0; r < n; r++) {
    const char *e = p->relay_endpoints && p->relay_endpoints[r] ? p->relay_endpoints[r] : "";
    if (!(m->relay_endpoints[r] = strdup(e))) return 0;
    m->n_relay_endpoints = r + 1;
  }
  return 1;
}

/* The arrays as they came; bcast_plan_validate judges the layout. */
static int relays_from_pb(const Rlorch__V1__BroadcastPlan *m, bcast_plan *p, bcast_err *err) {
  if (!m->n_relay_from && !m->n_relay_endpoints) return BCAST_OK;
  if (m->n_relay_from != p->world_size)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_from has %zu entries for %u ranks", p->id,
                       m->n_relay_from, p->world_size);
  if (m->n_relay_endpoints && m->n_relay_endpoints != p->world_size)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_endpoints has %zu entries for %u ranks", p->id,
                       m->n_relay_endpoints, p->world_size);
  size_t n = p->world_size;
  if (!(p->relay_from = malloc(n * sizeof *p->relay_from)) ||
      !(p->relay_endpoints = calloc(n, sizeof *p->relay_endpoints)))
    return bcast__fail(err, BCAST_ENOMEM, "plan_from_pb: out of memory");
  memcpy(p->relay_from, m->relay_from, n * sizeof *p->relay_from);
  for (size_t r = 0; r < n; r++) {
    const char *e = m->n_relay_endpoints && m->relay_endpoints[r] ? m->relay_endpoints[r] : "";
    if (strlen(e) >= sizeof p->host_endpoint)
      return bcast__fail(err, BCAST_EINVAL, "plan '%s': relay_endpoints[%zu] longer than 255 bytes", p->id, r);
    if (!(p->relay_endpoints[r] = strdup(e))) return bcast__fail(err, BCAST_ENOMEM, "plan_from_pb: out of memory");
  }
  return BCAST_OK;
}

/* Views on the wire: each view's parts other than whole, by tensor index. */
static int views_to_pb(const bcast_plan *p, Rlorch__V1__BroadcastPlan *m) {
  if (!p->nviews) return 1;
  if (!(m->views = calloc(p->nviews, sizeof *m->views)) ||
      !(m->rank_views = malloc(p->world_size * sizeof *m->rank_views)))
    return 0;
  memcpy(m->rank_views, p->rank_view, p->world_size * sizeof *m->rank_views);
  m->n_rank_views = p->world_size;
  for (uint32_t v = 0; v < p->nviews; v++) {
    Rlorch__V1__ReceiverView *rv = calloc(1, sizeof *rv);
    if (!(m->views[v] = rv)) return 0;
    m->n_views = v + 1;
    rlorch__v1__receiver_view__init(rv);
    size_t k = 0;
    for (size_t i = 0; i < p->ntensors; i++) k += p->view_parts[(size_t)v * p->ntensors + i].kind != BCAST_PART_WHOLE;
    if (!(rv->parts = calloc(k ? k : 1, sizeof *rv->parts))) return 0;
    for (size_t i = 0; i < p->ntensors; i++) {
      const bcast_part *pt = &p->view_parts[(size_t)v * p->ntensors + i];
      if (pt->kind == BCAST_PART_WHOLE) continue;
      Rlorch__V1__TensorPart *tp = calloc(1, sizeof *tp);
      if (!(rv->parts[rv->n_parts] = tp)) return 0;
      rv->n_parts++;
      rlorch__v1__tensor_part__init(tp);
      tp->name = (char *)protobuf_c_empty_string;
      tp->tensor = (uint32_t)i;
      tp->kind = (Rlorch__V1__PartKind)pt->kind;
      tp->dim = pt->dim;
      tp->start = pt->start;
      tp->count = pt->count;
    }
  }
  return 1;
}

static int views_from_pb(const Rlorch__V1__BroadcastPlan *m, bcast_plan *p, bcast_err *err) {
  if (!m->n_views && !m->n_rank_views) return BCAST_OK;
  if (!m->n_views || m->n_rank_views != p->world_size)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': %zu views and %zu rank_views for %u ranks", p->id,
                       m->n_views, m->n_rank_views, p->world_size);
  if (m->n_views >= p->world_size)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': %zu views for %u ranks", p->id, m->n_views, p->world_size);
  size_t nt = p->ntensors ? p->ntensors : 1;
  if (!(p->view_parts = calloc(m->n_views * nt, sizeof *p->view_parts)) ||
      !(p->rank_view = malloc(p->world_size * sizeof *p->rank_view)))
    return bcast__fail(err, BCAST_ENOMEM, "plan_from_pb: out of memory");
  p->nviews = (uint32_t)m->n_views;
  memcpy(p->rank_view, m->rank_views, p->world_size * sizeof *p->rank_view);
  for (size_t v = 0; v < m->n_views; v++) {
    const Rlorch__V1__ReceiverView *rv = m->views[v];
    for (size_t j = 0; rv && j < rv->n_parts; j++) {
      const Rlorch__V1__TensorPart *tp = rv->parts[j];
      if (tp->tensor >= p->ntensors)
        return bcast__fail(err, BCAST_EINVAL, "plan '%s': views[%zu].parts[%zu].tensor %u of %zu tensors", p->id,
                           v, j, tp->tensor, p->ntensors);
      bcast_part *pt = &p->view_parts[v * p->ntensors + tp->tensor];
      if (pt->kind != BCAST_PART_WHOLE)
        return bcast__fail(err, BCAST_EINVAL, "plan '%s': views[%zu]: tensor %u given twice", p->id, v,
                           tp->tensor);
      if (tp->kind != RLORCH__V1__PART_KIND__PART_KIND_SLICE && tp->kind != RLORCH__V1__PART_KIND__PART_KIND_NONE)
        return bcast__fail(err, BCAST_EINVAL, "plan '%s': views[%zu].parts[%zu].kind %d", p->id, v, j,
                           (int)tp->kind);
      *pt = (bcast_part){.kind = (int)tp->kind};
      if (tp->kind == RLORCH__V1__PART_KIND__PART_KIND_SLICE)
        pt->dim = tp->dim, pt->start = tp->start, pt->count = tp->count;
    }
  }
  return BCAST_OK;
}

int bcast_plan_to_pb(const bcast_plan *p, Rlorch__V1__BroadcastPlan **out, bcast_err *err) {
  if (!p || !out) return bcast__fail(err, BCAST_EINVAL, "plan_to_pb: NULL argument");
  *out = NULL;
  Rlorch__V1__BroadcastPlan *m = calloc(1, sizeof *m);
  if (!m) return bcast__fail(err, BCAST_ENOMEM, "plan_to_pb: out of memory");
  rlorch__v1__broadcast_plan__init(m);
  m->plan_id = strndup(p->id, sizeof p->id - 1);
  m->host_endpoint = strndup(p->host_endpoint, sizeof p->host_endpoint - 1);
  m->mode_reason = strndup(p->mode_reason, sizeof p->mode_reason - 1);
  m->tensors = calloc(p->ntensors ? p->ntensors : 1, sizeof *m->tensors);
  m->buckets = calloc(p->nbuckets ? p->nbuckets : 1, sizeof *m->buckets);
  int ok = m->plan_id && m->host_endpoint && m->mode_reason && m->tensors && m->buckets;
  for (size_t i = 0; ok && i < p->ntensors; i++) {
    ok = (m->tensors[i] = spec_new(&p->tensors[i])) != NULL;
    m->n_tensors = i + 1;
  }
  for (size_t b = 0; ok && b < p->nbuckets; b++) {
    ok = (m->buckets[b] = bucket_new(&p->buckets[b])) != NULL;
    m->n_buckets = b + 1;
  }
  if (ok && p->has_nccl_id) {
    ok = (m->nccl_unique_id.data = malloc(sizeof p->nccl_id)) != NULL;
    if (ok) {
      memcpy(m->nccl_unique_id.data, p->nccl_id, sizeof p->nccl_id);
      m->nccl_unique_id.len = sizeof p->nccl_id;
    }
  }
  /* A one-source plan encodes as it did before there were several. */
  if (ok && p->nsources > 1 && p->source_endpoints) {
    ok = (m->source_endpoints = calloc(p->nsources, sizeof *m->source_endpoints)) != NULL;
    for (uint32_t r = 0; ok && r < p->nsources; r++) {
      ok = (m->source_endpoints[r] = strdup(p->source_endpoints[r] ? p->source_endpoints[r] : "")) != NULL;
      m->n_source_endpoints = r + 1;
    }
  }
  if (ok) ok = views_to_pb(p, m);
  if (ok) ok = relays_to_pb(p, m);
  if (ok && p->has_secret) {
    ok = (m->data_secret.data = malloc(sizeof p->secret)) != NULL;
    if (ok) {
      memcpy(m->data_secret.data, p->secret, sizeof p->secret);
      m->data_secret.len = sizeof p->secret;
    }
  }
  if (!ok) {
    plan_msg_free(m);
    return bcast__fail(err, BCAST_ENOMEM, "plan_to_pb: out of memory");
  }
  m->hash = p->hash;
  m->min_gbps = p->min_gbps;
  m->data_tls = p->tls ? 1 : 0;
  m->mode = (Rlorch__V1__BroadcastMode)p->mode;
  m->world_size = p->world_size;
  m->root_rank = p->root_rank;
  m->source_ranks = p->nsources > 1 ? p->nsources : 0;
  m->staging_budget_bytes = p->staging_budget;
  m->deadline_unix_ms = p->deadline_unix_ms;
  m->policy_version = p->policy_version;
  m->checksum = (Rlorch__V1__Checksum)p->checksum;
  *out = m;
  return BCAST_OK;
}

static int bucket_from_pb(const Rlorch__V1__Bucket *b, size_t i, bcast_bucket *k, bcast_err *err) {
  if (!b) return bcast__fail(err, BCAST_EINVAL, "bucket %zu: missing", i);
  k->index = b->index;
  k->layer = b->layer;
  k->wire_dtype = (bcast_dtype)b->wire_dtype;
  k->bytes = b->bytes;
  k->source_rank = b->source_rank;
  k->stage_rank = b->stage_rank;
  k->slices = calloc(b->n_slices ? b->n_slices : 1, sizeof *k->slices);
  if (!k->slices) return bcast__fail(err, BCAST_ENOMEM, "bucket %zu: out of memory", i);
  k->nslices = b->n_slices;
  for (size_t s = 0; s < b->n_slices; s++) {
    const Rlorch__V1__BucketSlice *sl = b->slices[s];
    if (!sl) return bcast__fail(err, BCAST_EINVAL, "bucket %zu slice %zu: missing", i, s);
    k->slices[s] = (bcast_slice){sl->tensor, sl->element_offset, sl->element_count, sl->bucket_offset};
  }
  return BCAST_OK;
}

static int plan_fields_from_pb(const Rlorch__V1__BroadcastPlan *m, bcast_plan *p, bcast_err *err) {
  const char *id = m->plan_id ? m->plan_id : "";
  if (strlen(id) >= sizeof p->id) return bcast__fail(err, BCAST_EINVAL, "plan: id longer than 127 bytes");
  memcpy(p->id, id, strlen(id) + 1);
  const char *ep = m->host_endpoint ? m->host_endpoint : "";
  if (strlen(ep) >= sizeof p->host_endpoint)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': host_endpoint longer than 255 bytes", p->id);
  memcpy(p->host_endpoint, ep, strlen(ep) + 1);
  snprintf(p->mode_reason, sizeof p->mode_reason, "%s", m->mode_reason ? m->mode_reason : "");
  if (m->nccl_unique_id.len != 0 && m->nccl_unique_id.len != sizeof p->nccl_id)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': NCCL id of %zu bytes, expected 0 or 128", p->id,
                       m->nccl_unique_id.len);
  if (m->nccl_unique_id.len) {
    memcpy(p->nccl_id, m->nccl_unique_id.data, sizeof p->nccl_id);
    p->has_nccl_id = 1;
  }
  if (m->data_secret.len != 0 && m->data_secret.len != sizeof p->secret)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': data secret of %zu bytes, expected 0 or %zu", p->id,
                       m->data_secret.len, sizeof p->secret);
  if (m->data_secret.len) {
    memcpy(p->secret, m->data_secret.data, sizeof p->secret);
    p->has_secret = 1;
  }
  if (!isfinite(m->min_gbps) || m->min_gbps < 0)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': min_gbps %g is not a rate >= 0", p->id, m->min_gbps);
  p->min_gbps = m->min_gbps;
  p->tls = m->data_tls ? 1 : 0;
  p->hash = m->hash;
  p->mode = (bcast_mode)m->mode;
  p->world_size = m->world_size;
  p->root_rank = m->root_rank;
  p->nsources = m->source_ranks > 1 ? m->source_ranks : 1;
  if (m->n_source_endpoints && m->n_source_endpoints != p->nsources)
    return bcast__fail(err, BCAST_EINVAL, "plan '%s': %zu source endpoints for %u source ranks", p->id,
                       m->n_source_endpoints, p->nsources);
  if (m->n_source_endpoints) {
    if (!(p->source_endpoints = calloc(p->nsources, sizeof *p->source_endpoints)))
      return bcast__fail(err, BCAST_ENOMEM, "plan_from_pb: out of memory");
    for (uint32_t r = 0; r < p->nsources; r++) {
      const char *e = m->source_endpoints[r] ? m->source_endpoints[r] : "";
      if (strlen(e) >= sizeof p->host_endpoint)
        return bcast__fail(err, BCAST_EINVAL, "plan '%s': source_endpoints[%u] longer than 255 bytes", p->id, r);
      if (!(p->source_endpoints[r] = strdup(e))) return bcast__fail(err, BCAST_ENOMEM, "plan_from_pb: out of memory");
    }
  }
  p->staging_budget = m->staging_budget_bytes;
  p->deadline_unix_ms = m->deadline_unix_ms;
  p->policy_version = m->policy_version;
  p->checksum = (bcast_checksum)m->checksum;
  return BCAST_OK;
}

int bcast_plan_from_pb(const Rlorch__V1__BroadcastPlan *m, bcast_plan **out, bcast_err *err) {
  if (!m || !out) return bcast__fail(err, BCAST_EINVAL, "plan_from_pb: NULL argument");
  *out = NULL;
  bcast_plan *p = calloc(1, sizeof *p);
  if (!p) return bcast__fail(err, BCAST_ENOMEM, "plan_from_pb: out of memory");
  int rc = plan_fields_from_pb(m, p, err);
  if (!rc) rc = bcast__specs_check(m->tensors, m->n_tensors, NULL, err);
  if (!rc && (!(p->tensors = calloc(m->n_tensors ? m->n_tensors : 1, sizeof *p->tensors)) ||
              !(p->buckets = calloc(m->n_buckets ? m->n_buckets : 1, sizeof *p->buckets))))
    rc = bcast__fail(err, BCAST_ENOMEM, "plan_from_pb: out of memory");
  for (size_t i = 0; !rc && i < m->n_tensors; i++) {
    /* A plan moves whole tensors: only a trainer rank's manifest has parts. */
    if (m->tensors[i]->shard_offset || m->tensors[i]->shard_elems) {
      rc = bcast__fail(err, BCAST_EINVAL, "tensor #%zu '%s': a plan's tensors are whole (shard_offset "
                       "%llu, shard_elems %llu)", i, m->tensors[i]->name,
                       (unsigned long long)m->tensors[i]->shard_offset,
                       (unsigned long long)m->tensors[i]->shard_elems);
      break;
    }
    spec_to_tensor(m->tensors[i], &p->tensors[i]);
    p->ntensors = i + 1;
  }
  for (size_t b = 0; !rc && b < m->n_buckets; b++) {
    p->nbuckets = b + 1;
    rc = bucket_from_pb(m->buckets[b], b, &p->buckets[b], err);
  }
  if (!rc) rc = views_from_pb(m, p, err);
  if (!rc) rc = relays_from_pb(m, p, err);
  if (!rc) rc = bcast_plan_validate(p, err);
  if (!rc && bcast_plan_hash(p) != p->hash)
    rc = bcast__fail(err, BCAST_EMISMATCH, "plan '%s': hash %016llx does not match its contents (%016llx)", p->id,
                     (unsigned long long)p->hash, (unsigned long long)bcast_plan_hash(p));
  if (rc) {
    bcast_plan_free(p);
    return rc;
  }
  *out = p;
  return BCAST_OK;
}

int bcast_plan_pack(const bcast_plan *p, uint8_t **buf, size_t *len, bcast_err *err) {
  Rlorch__V1__BroadcastPlan *m;
  int rc = bcast_plan_to_pb(p, &m, err);
  if (rc) return rc;
  *len = rlorch__v1__broadcast_plan__get_packed_size(m);
  *buf = malloc(*len ? *len : 1);
  if (*buf) rlorch__v1__broadcast_plan__pack(m, *buf);
  plan_msg_free(m);
  return *buf ? BCAST_OK : bcast__fail(err, BCAST_ENOMEM, "plan_pack: out of memory");
}

int bcast_plan_unpack(const uint8_t *buf, size_t len, bcast_plan **out, bcast_err *err) {
  if (out) *out = NULL;
  Rlorch__V1__BroadcastPlan *m = rlorch__v1__broadcast_plan__unpack(NULL, len, buf);
  if (!m) return bcast__fail(err, BCAST_EINVAL, "plan: %zu bytes are not a BroadcastPlan message", len);
  int rc = bcast_plan_from_pb(m, out, err);
  rlorch__v1__broadcast_plan__free_unpacked(m, NULL);
  return rc;
}

/* ---- manifest ---------------------------------------------------------------------- */

static void manifest_msg_free(Rlorch__V1__WeightManifest *m) {
  for (size_t i = 0; m->tensors && i < m->n_tensors; i++) spec_free(m->tensors[i]);
  free(m->tensors);
  if (m->preset != protobuf_c_empty_string) free(m->preset);
  free(m);
}

int bcast_manifest_to_pb(const bcast_tensor *t, size_t n, Rlorch__V1__WeightManifest **out, bcast_err *err) {
  if (!out || (n && !t)) return bcast__fail(err, BCAST_EINVAL, "manifest_to_pb: NULL argument");
  *out = NULL;
  Rlorch__V1__WeightManifest *m = calloc(1, sizeof *m);
  if (!m) return bcast__fail(err, BCAST_ENOMEM, "manifest_to_pb: out of memory");
  rlorch__v1__weight_manifest__init(m);
  int ok = (m->tensors = calloc(n ? n : 1, sizeof *m->tensors)) != NULL;
  for (size_t i = 0; ok && i < n; i++) {
    ok = (m->tensors[i] = spec_new(&t[i])) != NULL;
    m->n_tensors = i + 1;
    uint64_t e = bcast_tensor_elems(&t[i]);
    m->storage_bytes += e * bcast_dtype_size(t[i].storage_dtype);
    m->wire_bytes += e * bcast_dtype_size(t[i].wire_dtype);
  }
  if (!ok) {
    manifest_msg_free(m);
    return bcast__fail(err, BCAST_ENOMEM, "manifest_to_pb: out of memory");
  }
  *out = m;
  return BCAST_OK;
}

int bcast_manifest_from_pb(const Rlorch__V1__WeightManifest *m, bcast_tensor **out, size_t *n, bcast_err *err) {
  if (!m || !out || !n) return bcast__fail(err, BCAST_EINVAL, "manifest_from_pb: NULL argument");
  *out = NULL;
  *n = 0;
  int rc = bcast_manifest_check_pb(m, NULL, err);
  if (rc) return rc;
  bcast_tensor *t = calloc(m->n_tensors ? m->n_tensors : 1, sizeof *t);
  if (!t) return bcast__fail(err, BCAST_ENOMEM, "manifest_from_pb: out of memory");
  for (size_t i = 0; i < m->n_tensors; i++) spec_to_tensor(m->tensors[i], &t[i]);
  *out = t;
  *n = m->n_tensors;
  return BCAST_OK;
}

/* ---- step record ----------------------------------------------------------------------- */

int bcast_stats_to_step_record(const bcast_stats *s, Rlorch__V1__StepRecord *rec, bcast_err *err) {
  if (!s || !rec) return bcast__fail(err, BCAST_EINVAL, "stats_to_step_record: NULL argument");
  Rlorch__V1__BucketTiming **v = NULL;
  if (s->nbuckets && s->buckets) {
    /* one block: the pointer array followed by the messages */
    v = malloc(s->nbuckets * (sizeof *v + sizeof **v));
    if (!v) return bcast__fail(err, BCAST_ENOMEM, "stats_to_step_record: out of memory");
    Rlorch__V1__BucketTiming *bt = (Rlorch__V1__BucketTiming *)(v + s->nbuckets);
    for (uint32_t i = 0; i < s->nbuckets; i++) {
      rlorch__v1__bucket_timing__init(&bt[i]);
      bt[i].bucket = s->buckets[i].bucket;
      bt[i].h2d_seconds = s->buckets[i].h2d_s;
      bt[i].cast_seconds = s->buckets[i].cast_s;
      bt[i].wire_seconds = s->buckets[i].wire_s;
      v[i] = &bt[i];
    }
  }
  rec->mode = (Rlorch__V1__BroadcastMode)s->mode;
  rec->transport = (char *)(s->transport ? s->transport : ""); /* static string */
  rec->pcie_bytes = s->pcie_bytes;
  rec->wire_bytes = s->wire_bytes;
  rec->h2d_seconds = s->h2d_s;
  rec->cast_seconds = s->cast_s;
  rec->wire_seconds = s->wire_s;
  rec->total_seconds = s->total_s;
  rec->exposed_staging_seconds = s->exposed_s;
  rec->exposed_measured = s->exposed_measured ? 1 : 0;
  rec->gbps = s->gbps;
  rec->buckets = s->nbuckets;
  rec->n_bucket_timings = v ? s->nbuckets : 0;
  rec->bucket_timings = v;
  return BCAST_OK;
}

void bcast_pb_step_record_clear(Rlorch__V1__StepRecord *rec) {
  if (!rec) return;
  free(rec->bucket_timings);
  rec->bucket_timings = NULL;
  rec->n_bucket_timings = 0;
}

void bcast_pb_free(ProtobufCMessage *m) {
  if (!m) return;
  if (m->descriptor == &rlorch__v1__broadcast_plan__descriptor) plan_msg_free((Rlorch__V1__BroadcastPlan *)m);
  else if (m->descriptor == &rlorch__v1__weight_manifest__descriptor)
    manifest_msg_free((Rlorch__V1__WeightManifest *)m);
}
