/* Protobuf conversions of the agents. */
#include "workers/agent/agent_pb.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Rlorch__V1__WeightManifest *agent_pb_manifest(const bcast_tensor *t, size_t n, const char *preset,
                                              int offload) {
  /* One block: the manifest, its pointer array, the specs and their shapes. */
  size_t dims = 0;
  for (size_t i = 0; i < n; i++) dims += t[i].ndim;
  size_t bytes = sizeof(Rlorch__V1__WeightManifest) + n * sizeof(Rlorch__V1__TensorSpec *) +
                 n * sizeof(Rlorch__V1__TensorSpec) + dims * sizeof(uint64_t);
  char *mem = calloc(1, bytes);
  if (!mem) return NULL;
  Rlorch__V1__WeightManifest *m = (Rlorch__V1__WeightManifest *)mem;
  rlorch__v1__weight_manifest__init(m);
  Rlorch__V1__TensorSpec **ptrs = (Rlorch__V1__TensorSpec **)(m + 1);
  Rlorch__V1__TensorSpec *specs = (Rlorch__V1__TensorSpec *)(ptrs + n);
  uint64_t *shape = (uint64_t *)(specs + n);
  m->n_tensors = n;
  m->tensors = n ? ptrs : NULL;
  m->preset = (char *)(preset ? preset : "");
  m->offload = (Rlorch__V1__Offload)offload;
  for (size_t i = 0; i < n; i++) {
    Rlorch__V1__TensorSpec *s = &specs[i];
    rlorch__v1__tensor_spec__init(s);
    s->name = (char *)t[i].name;
    s->layer = t[i].layer;
    s->storage_dtype = (Rlorch__V1__DType)t[i].storage_dtype;
    s->wire_dtype = (Rlorch__V1__DType)t[i].wire_dtype;
    s->residency = (Rlorch__V1__Residency)t[i].residency;
    s->n_shape = t[i].ndim;
    s->shape = shape;
    for (uint32_t d = 0; d < t[i].ndim; d++) *shape++ = t[i].shape[d];
    ptrs[i] = s;
    uint64_t e = bcast_tensor_elems(&t[i]);
    m->storage_bytes += e * bcast_dtype_size(t[i].storage_dtype);
    m->wire_bytes += e * bcast_dtype_size(t[i].wire_dtype);
  }
  return m;
}

void agent_pb_manifest_free(Rlorch__V1__WeightManifest *m) { free(m); }

static int agent__tensor_from_pb(const Rlorch__V1__TensorSpec *s, size_t i, bcast_tensor *t,
                                 bcast_err *err) {
  memset(t, 0, sizeof *t);
  const char *name = s->name ? s->name : "";
  if (!*name || strlen(name) >= sizeof t->name) {
    err->code = BCAST_EINVAL;
    snprintf(err->msg, sizeof err->msg, "plan: tensors[%zu]: name empty or longer than %d bytes",
             i, BCAST_NAME_MAX - 1);
    return BCAST_EINVAL;
  }
  if (s->n_shape > BCAST_MAX_DIMS) {
    err->code = BCAST_EINVAL;
    snprintf(err->msg, sizeof err->msg, "plan: tensor %s: %zu dimensions (at most %d)", name,
             s->n_shape, BCAST_MAX_DIMS);
    return BCAST_EINVAL;
  }
  snprintf(t->name, sizeof t->name, "%s", name);
  t->layer = s->layer;
  t->storage_dtype = (bcast_dtype)s->storage_dtype;
  t->wire_dtype = (bcast_dtype)s->wire_dtype;
  t->residency = (bcast_residency)s->residency;
  t->ndim = (uint32_t)s->n_shape;
  for (size_t d = 0; d < s->n_shape; d++) t->shape[d] = s->shape[d];
  t->device = -1;
  return 0;
}

int agent_pb_plan(const Rlorch__V1__BroadcastPlan *pb, bcast_plan **out, bcast_err *err) {
  *out = NULL;
  bcast_plan *p = calloc(1, sizeof *p);
  if (!p) goto nomem;
  const char *id = pb->plan_id ? pb->plan_id : "";
  if (strlen(id) >= sizeof p->id) {
    bcast_plan_free(p);
    err->code = BCAST_EINVAL;
    snprintf(err->msg, sizeof err->msg, "plan: plan_id longer than %zu bytes", sizeof p->id - 1);
    return BCAST_EINVAL;
  }
  snprintf(p->id, sizeof p->id, "%s", id);
  p->hash = pb->hash;
  p->mode = (bcast_mode)pb->mode;
  p->tensors = calloc(pb->n_tensors ? pb->n_tensors : 1, sizeof *p->tensors);
  p->buckets = calloc(pb->n_buckets ? pb->n_buckets : 1, sizeof *p->buckets);
  if (!p->tensors || !p->buckets) goto nomem;
  for (size_t i = 0; i < pb->n_tensors; i++, p->ntensors++) {
    if (agent__tensor_from_pb(pb->tensors[i], i, &p->tensors[i], err)) {
      bcast_plan_free(p);
      return BCAST_EINVAL;
    }
  }
  for (size_t b = 0; b < pb->n_buckets; b++) {
    const Rlorch__V1__Bucket *q = pb->buckets[b];
    bcast_bucket *k = &p->buckets[b];
    k->index = q->index;
    k->layer = q->layer;
    k->wire_dtype = (bcast_dtype)q->wire_dtype;
    k->bytes = q->bytes;
    k->source_rank = q->source_rank;
    k->stage_rank = q->stage_rank;
    k->slices = calloc(q->n_slices ? q->n_slices : 1, sizeof *k->slices);
    p->nbuckets++;
    if (!k->slices) goto nomem;
    for (size_t s = 0; s < q->n_slices; s++) {
      k->slices[s] = (bcast_slice){q->slices[s]->tensor, q->slices[s]->element_offset,
                                   q->slices[s]->element_count, q->slices[s]->bucket_offset};
    }
    k->nslices = q->n_slices;
  }
  if (pb->nccl_unique_id.len) {
    if (pb->nccl_unique_id.len != sizeof p->nccl_id) {
      bcast_plan_free(p);
      err->code = BCAST_EINVAL;
      snprintf(err->msg, sizeof err->msg, "plan: nccl_unique_id has %zu bytes, not %zu",
               pb->nccl_unique_id.len, sizeof p->nccl_id);
      return BCAST_EINVAL;
    }
    memcpy(p->nccl_id, pb->nccl_unique_id.data, sizeof p->nccl_id);
    p->has_nccl_id = 1;
  }
  p->world_size = pb->world_size;
  p->root_rank = pb->root_rank;
  p->staging_budget = pb->staging_budget_bytes;
  p->deadline_unix_ms = pb->deadline_unix_ms;
  p->policy_version = pb->policy_version;
  snprintf(p->host_endpoint, sizeof p->host_endpoint, "%s",
           pb->host_endpoint ? pb->host_endpoint : "");
  p->checksum = (bcast_checksum)pb->checksum;
  snprintf(p->mode_reason, sizeof p->mode_reason, "%s", pb->mode_reason ? pb->mode_reason : "");
  int rc = bcast_plan_validate(p, err);
  if (rc) {
    bcast_plan_free(p);
    return rc;
  }
  *out = p;
  return 0;
nomem:
  bcast_plan_free(p);
  err->code = BCAST_ENOMEM;
  snprintf(err->msg, sizeof err->msg, "plan: no memory");
  return BCAST_ENOMEM;
}

Rlorch__V1__StepRecord *agent_pb_record(const bcast_stats *s, const bcast_plan *p) {
  uint32_t nb = s ? s->nbuckets : 0;
  size_t bytes = sizeof(Rlorch__V1__StepRecord) + nb * sizeof(Rlorch__V1__BucketTiming *) +
                 nb * sizeof(Rlorch__V1__BucketTiming);
  char *mem = calloc(1, bytes);
  if (!mem) return NULL;
  Rlorch__V1__StepRecord *r = (Rlorch__V1__StepRecord *)mem;
  rlorch__v1__step_record__init(r);
  if (p) {
    r->mode_reason = (char *)p->mode_reason;
    r->policy_version = p->policy_version;
    r->mode = (Rlorch__V1__BroadcastMode)p->mode;
    r->buckets = (uint32_t)p->nbuckets;
  }
  if (!s) return r;
  Rlorch__V1__BucketTiming **ptrs = (Rlorch__V1__BucketTiming **)(r + 1);
  Rlorch__V1__BucketTiming *bt = (Rlorch__V1__BucketTiming *)(ptrs + nb);
  r->mode = (Rlorch__V1__BroadcastMode)s->mode;
  r->transport = (char *)(s->transport ? s->transport : "");
  r->pcie_bytes = s->pcie_bytes;
  r->wire_bytes = s->wire_bytes;
  r->h2d_seconds = s->h2d_s;
  r->cast_seconds = s->cast_s;
  r->wire_seconds = s->wire_s;
  r->total_seconds = s->total_s;
  r->exposed_staging_seconds = s->exposed_s;
  r->exposed_measured = s->exposed_measured;
  r->gbps = s->gbps;
  r->buckets = s->nbuckets;
  r->n_bucket_timings = nb;
  r->bucket_timings = nb ? ptrs : NULL;
  for (uint32_t i = 0; i < nb; i++) {
    rlorch__v1__bucket_timing__init(&bt[i]);
    bt[i].bucket = s->buckets[i].bucket;
    bt[i].h2d_seconds = s->buckets[i].h2d_s;
    bt[i].cast_seconds = s->buckets[i].cast_s;
    bt[i].wire_seconds = s->buckets[i].wire_s;
    ptrs[i] = &bt[i];
  }
  return r;
}

void agent_pb_record_free(Rlorch__V1__StepRecord *r) { free(r); }
