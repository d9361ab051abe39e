/* Protobuf conversions of the agents. */
#include "workers/agent/agent_pb.h"

#include "workers/bcast/bcast_pb.h"

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

int agent_pb_plan(const Rlorch__V1__BroadcastPlan *pb, bcast_plan **out, bcast_err *err) {
  return bcast_plan_from_pb(pb, out, err);
}

Rlorch__V1__StepRecord *agent_pb_record(const bcast_stats *s, const bcast_plan *p) {
  Rlorch__V1__StepRecord *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  rlorch__v1__step_record__init(r);
  if (s) {
    bcast_err be = {0};
    if (bcast_stats_to_step_record(s, r, &be) != 0) {
      bcast_pb_step_record_clear(r);
      rlorch__v1__step_record__init(r);
    }
  }
  if (p) {
    r->mode_reason = (char *)p->mode_reason;
    r->policy_version = p->policy_version;
    if (!s) {
      r->mode = (Rlorch__V1__BroadcastMode)p->mode;
      r->buckets = (uint32_t)p->nbuckets;
    }
  }
  return r;
}

void agent_pb_record_free(Rlorch__V1__StepRecord *r) {
  if (!r) return;
  bcast_pb_step_record_clear(r);
  free(r);
}
