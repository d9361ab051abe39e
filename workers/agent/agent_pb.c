/* Protobuf conversions of the agents. */
#include "workers/agent/agent_pb.h"

#include "workers/bcast/bcast_pb.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The generator's finish reasons are sent as they are. */
_Static_assert((int)AGENT_FINISH_STOP == (int)RLORCH__V1__FINISH_REASON__FINISH_REASON_STOP,
               "AGENT_FINISH_STOP");
_Static_assert((int)AGENT_FINISH_LENGTH == (int)RLORCH__V1__FINISH_REASON__FINISH_REASON_LENGTH,
               "AGENT_FINISH_LENGTH");

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
    s->shard_offset = t[i].shard_offset; /* a trainer rank's part; 0/0: the whole tensor */
    s->shard_elems = t[i].shard_elems;
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

void agent_pb_request(const Rlorch__V1__RolloutRequest *msg, agent_request *out) {
  memset(out, 0, sizeof *out);
  out->request_id = msg->request_id;
  out->group_id = msg->group_id ? msg->group_id : msg->request_id;
  out->count = msg->count;
  out->prompt_token_ids = msg->prompt_token_ids;
  out->n_prompt = msg->n_prompt_token_ids;
  out->prompt_metadata = msg->prompt_metadata.data;
  out->n_metadata = msg->prompt_metadata.len;
  agent_sampling_defaults(&out->sampling);
  const Rlorch__V1__SamplingParams *s = msg->sampling;
  if (s) {
    out->sampling.temperature = s->temperature;
    out->sampling.max_tokens = s->max_tokens;
    out->sampling.stop_token_ids = s->stop_token_ids;
    out->sampling.nstop = s->n_stop_token_ids;
    out->sampling.seed = s->seed;
  }
}

Rlorch__V1__RolloutResult *agent_pb_rollout_result(const agent_group *g) {
  /* One block: the result, its pointer array and the rollouts. */
  size_t n = g->n;
  char *mem = calloc(1, sizeof(Rlorch__V1__RolloutResult) + n * sizeof(Rlorch__V1__Rollout *) +
                            n * sizeof(Rlorch__V1__Rollout));
  if (!mem) return NULL;
  Rlorch__V1__RolloutResult *res = (Rlorch__V1__RolloutResult *)mem;
  rlorch__v1__rollout_result__init(res);
  Rlorch__V1__Rollout **ptrs = (Rlorch__V1__Rollout **)(res + 1);
  Rlorch__V1__Rollout *msgs = (Rlorch__V1__Rollout *)(ptrs + n);
  res->request_id = g->request_id;
  res->n_rollouts = n;
  res->rollouts = n ? ptrs : NULL;
  for (size_t i = 0; i < n; i++) {
    const agent_completion *c = &g->c[i];
    Rlorch__V1__Rollout *m = &msgs[i];
    rlorch__v1__rollout__init(m);
    m->id = c->id;
    m->policy_version = g->policy_version;
    m->tokens = c->ntokens;
    m->seconds = c->seconds;
    m->group_id = g->group_id;
    m->finish_reason = (Rlorch__V1__FinishReason)c->finish;
    m->n_rewards = c->nrewards;
    m->rewards = c->nrewards ? (double *)c->rewards : NULL;
    if (c->ntokens <= AGENT_PB_SHAPED_TOKENS_MAX) {
      m->n_completion_token_ids = m->n_completion_logprobs = c->ntokens;
      m->completion_token_ids = c->token_ids;
      m->completion_logprobs = c->logprobs;
    }
    ptrs[i] = m;
  }
  return res;
}

void agent_pb_rollout_result_free(Rlorch__V1__RolloutResult *r) { free(r); }
