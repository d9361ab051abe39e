/* Plans, manifests and stats through the rlorch.v1 protobuf messages. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_pb.h"

static bcast_tensor T(const char *name, uint32_t layer, bcast_dtype st, bcast_dtype wt, uint64_t d0, uint64_t d1,
                      bcast_residency res) {
  bcast_tensor t;
  memset(&t, 0, sizeof t);
  snprintf(t.name, sizeof t.name, "%s", name);
  t.layer = layer;
  t.storage_dtype = st;
  t.wire_dtype = wt;
  t.ndim = d1 ? 2 : 1;
  t.shape[0] = d0;
  t.shape[1] = d1;
  t.residency = res;
  return t;
}

static bcast_plan *sample(void) {
  bcast_tensor t[] = {T("a", 0, BCAST_DTYPE_FP32, BCAST_DTYPE_BF16, 700, 0, BCAST_RES_HOST_PAGEABLE),
                      T("b", 0, BCAST_DTYPE_FP32, BCAST_DTYPE_BF16, 50, 3, BCAST_RES_GPU),
                      T("c", 1, BCAST_DTYPE_U16, BCAST_DTYPE_U16, 33, 0, BCAST_RES_HOST_PINNED),
                      T("d", 1, BCAST_DTYPE_FP32, BCAST_DTYPE_FP16, 9, 2, BCAST_RES_HOST_PAGEABLE)};
  bcast_plan_opts o = {.id = "run-1/step-7", .mode = BCAST_MODE_STAGED, .staging_budget = 1024, .world_size = 4,
                       .root_rank = 1, .policy_version = 8, .deadline_unix_ms = 1234567,
                       .host_endpoint = "10.1.2.3:4567"};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build(t, 4, &o, &p, &err), BCAST_OK, "%s", err.msg);
  uint8_t id[128];
  for (int i = 0; i < 128; i++) id[i] = (uint8_t)(i * 7);
  bcast_plan_set_nccl_id(p, id);
  snprintf(p->mode_reason, sizeof p->mode_reason, "params offloaded");
  p->min_gbps = 1.25;
  return p;
}

static void assert_same(const bcast_plan *a, const bcast_plan *b) {
  cr_assert_str_eq(a->id, b->id);
  cr_assert_eq(a->hash, b->hash);
  cr_assert_eq(a->mode, b->mode);
  cr_assert_eq(a->ntensors, b->ntensors);
  for (size_t i = 0; i < a->ntensors; i++) {
    cr_assert_str_eq(a->tensors[i].name, b->tensors[i].name);
    cr_assert_eq(a->tensors[i].residency, b->tensors[i].residency);
    cr_assert_eq(a->tensors[i].ndim, b->tensors[i].ndim);
    cr_assert_eq(memcmp(a->tensors[i].shape, b->tensors[i].shape, sizeof a->tensors[i].shape), 0);
  }
  cr_assert_eq(a->nbuckets, b->nbuckets);
  for (size_t k = 0; k < a->nbuckets; k++) {
    cr_assert_eq(a->buckets[k].nslices, b->buckets[k].nslices);
    for (size_t s = 0; s < a->buckets[k].nslices; s++) {
      const bcast_slice *x = &a->buckets[k].slices[s], *y = &b->buckets[k].slices[s];
      cr_assert(x->tensor == y->tensor && x->elem_offset == y->elem_offset && x->elem_count == y->elem_count &&
                x->bucket_offset == y->bucket_offset);
    }
    cr_assert_eq(a->buckets[k].source_rank, b->buckets[k].source_rank);
    cr_assert_eq(a->buckets[k].stage_rank, b->buckets[k].stage_rank);
    cr_assert_eq(a->buckets[k].bytes, b->buckets[k].bytes);
  }
  cr_assert_eq(memcmp(a->nccl_id, b->nccl_id, 128), 0);
  cr_assert_eq(a->has_nccl_id, b->has_nccl_id);
  cr_assert_eq(a->world_size, b->world_size);
  cr_assert_eq(a->root_rank, b->root_rank);
  cr_assert_eq(a->staging_budget, b->staging_budget);
  cr_assert_eq(a->deadline_unix_ms, b->deadline_unix_ms);
  cr_assert_eq(a->policy_version, b->policy_version);
  cr_assert_str_eq(a->host_endpoint, b->host_endpoint);
  cr_assert_eq(a->checksum, b->checksum);
  cr_assert_str_eq(a->mode_reason, b->mode_reason);
  cr_assert_eq(a->has_secret, b->has_secret);
  cr_assert_eq(memcmp(a->secret, b->secret, sizeof a->secret), 0);
  cr_assert_float_eq(a->min_gbps, b->min_gbps, 1e-12);
}

Test(bcast_pb, plan_round_trip_through_bytes) {
  bcast_plan *p = sample(), *q = NULL;
  uint8_t *buf;
  size_t len;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_pack(p, &buf, &len, &err), BCAST_OK, "%s", err.msg);
  cr_assert_gt(len, 100);
  cr_assert_eq(bcast_plan_unpack(buf, len, &q, &err), BCAST_OK, "%s", err.msg);
  assert_same(p, q);
  bcast_plan_free(q);
  cr_assert_eq(bcast_plan_unpack(buf, len / 2, &q, &err), BCAST_EINVAL);
  cr_assert_null(q);
  free(buf);
  bcast_plan_free(p);
}

Test(bcast_pb, tampered_plans_are_refused) {
  bcast_plan *p = sample(), *q = NULL;
  Rlorch__V1__BroadcastPlan *m;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_to_pb(p, &m, &err), BCAST_OK);
  cr_assert_eq(m->n_buckets, p->nbuckets);
  cr_assert_eq(m->nccl_unique_id.len, 128);

  m->policy_version++; /* consistent but not what was hashed */
  cr_assert_eq(bcast_plan_from_pb(m, &q, &err), BCAST_EMISMATCH);
  cr_assert(strstr(err.msg, "plan 'run-1/step-7': hash"), "%s", err.msg);
  cr_assert_null(q);
  m->policy_version--;

  m->buckets[0]->slices[0]->element_count++; /* inconsistent: validation names it */
  cr_assert_eq(bcast_plan_from_pb(m, &q, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "tensor 'a'") || strstr(err.msg, "bucket 0"), "%s", err.msg);
  m->buckets[0]->slices[0]->element_count--;

  m->deadline_unix_ms = 99; /* not covered by the hash: accepted */
  cr_assert_eq(bcast_plan_from_pb(m, &q, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(q->deadline_unix_ms, 99);
  bcast_plan_free(q);

  m->tensors[1]->shard_elems = 3; /* a plan never describes a part */
  cr_assert_eq(bcast_plan_from_pb(m, &q, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "tensor #1 'b': a plan's tensors are whole"), "%s", err.msg);
  m->tensors[1]->shard_elems = 0;

  m->tensors[2]->n_shape = 9;
  cr_assert_eq(bcast_plan_from_pb(m, &q, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "tensor #2 'c': shape: 9 dimensions"), "%s", err.msg);
  m->tensors[2]->n_shape = 1;

  m->nccl_unique_id.len = 5;
  cr_assert_eq(bcast_plan_from_pb(m, &q, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "NCCL id of 5 bytes"), "%s", err.msg);
  m->nccl_unique_id.len = 128;

  /* The data secret travels whole or not at all; it is not hashed. */
  cr_assert_eq(m->data_secret.len, BCAST_SECRET_BYTES);
  cr_assert_eq(memcmp(m->data_secret.data, p->secret, BCAST_SECRET_BYTES), 0);
  m->data_secret.len = 31;
  cr_assert_eq(bcast_plan_from_pb(m, &q, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "data secret of 31 bytes"), "%s", err.msg);
  m->data_secret.data[0] ^= 1;
  m->data_secret.len = BCAST_SECRET_BYTES;
  cr_assert_eq(bcast_plan_from_pb(m, &q, &err), BCAST_OK, "%s", err.msg);
  cr_assert(q->has_secret && q->secret[0] == (p->secret[0] ^ 1));
  bcast_plan_free(q);
  m->data_secret.len = 0; /* a plan without one decodes, and says so */
  cr_assert_eq(bcast_plan_from_pb(m, &q, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(q->has_secret, 0);
  bcast_plan_free(q);
  m->data_secret.len = BCAST_SECRET_BYTES;
  m->min_gbps = -1;
  cr_assert_eq(bcast_plan_from_pb(m, &q, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "min_gbps"), "%s", err.msg);
  m->min_gbps = 1.25;

  m->mode = RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_AUTO;
  cr_assert_eq(bcast_plan_from_pb(m, &q, &err), BCAST_EINVAL);
  m->mode = RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_STAGED;
  cr_assert_eq(bcast_plan_from_pb(m, &q, &err), BCAST_OK, "%s", err.msg);
  bcast_plan_free(q);
  bcast_pb_free(&m->base);
  bcast_plan_free(p);
}

Test(bcast_pb, manifest_round_trip) {
  bcast_tensor t[] = {T("x", 3, BCAST_DTYPE_FP32, BCAST_DTYPE_BF16, 10, 20, BCAST_RES_GPU),
                      T("y", 4, BCAST_DTYPE_U16, BCAST_DTYPE_U16, 7, 0, BCAST_RES_HOST_PINNED)};
  t[0].shard_offset = 50; /* a trainer rank's part: carried both ways */
  t[0].shard_elems = 120;
  Rlorch__V1__WeightManifest *m;
  bcast_err err = {0};
  cr_assert_eq(bcast_manifest_to_pb(t, 2, &m, &err), BCAST_OK);
  cr_assert_eq(m->tensors[0]->shard_offset, 50);
  cr_assert_eq(m->tensors[0]->shard_elems, 120);
  cr_assert_eq(m->storage_bytes, 200 * 4 + 7 * 2);
  cr_assert_eq(m->wire_bytes, 200 * 2 + 7 * 2);
  size_t len = rlorch__v1__weight_manifest__get_packed_size(m);
  uint8_t *buf = malloc(len);
  rlorch__v1__weight_manifest__pack(m, buf);
  bcast_pb_free(&m->base);
  Rlorch__V1__WeightManifest *u = rlorch__v1__weight_manifest__unpack(NULL, len, buf);
  cr_assert_not_null(u);
  bcast_tensor *back;
  size_t n;
  cr_assert_eq(bcast_manifest_from_pb(u, &back, &n, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(n, 2);
  for (size_t i = 0; i < 2; i++) {
    cr_assert_str_eq(back[i].name, t[i].name);
    cr_assert_eq(back[i].layer, t[i].layer);
    cr_assert_eq(back[i].storage_dtype, t[i].storage_dtype);
    cr_assert_eq(back[i].wire_dtype, t[i].wire_dtype);
    cr_assert_eq(back[i].residency, t[i].residency);
    cr_assert_eq(back[i].ndim, t[i].ndim);
    cr_assert_eq(memcmp(back[i].shape, t[i].shape, sizeof t[i].shape), 0);
    cr_assert_eq(back[i].shard_offset, t[i].shard_offset);
    cr_assert_eq(back[i].shard_elems, t[i].shard_elems);
    cr_assert_null(back[i].data);
  }
  free(back);
  u->tensors[1]->n_shape = 0;
  cr_assert_eq(bcast_manifest_from_pb(u, &back, &n, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "tensor #1 'y': shape: 0 dimensions"), "%s", err.msg);
  rlorch__v1__weight_manifest__free_unpacked(u, NULL);
  free(buf);
}

Test(bcast_pb, stats_fill_a_step_record) {
  bcast_bucket_timing bt[2] = {{0, 0.1, 0.2, 0.3}, {1, 0.4, 0.5, 0.6}};
  bcast_stats s = {.mode = BCAST_MODE_HOST, .transport = "host-tcp", .wire_bytes = 1000, .pcie_bytes = 0,
                   .cast_s = 0.7, .wire_s = 0.9, .total_s = 1.5, .wire_alone_s = 0.9, .exposed_measured = 1,
                   .exposed_s = 0.6, .gbps = 2.5, .nbuckets = 2, .buckets = bt};
  Rlorch__V1__StepRecord rec = RLORCH__V1__STEP_RECORD__INIT;
  rec.step = 41;
  bcast_err err = {0};
  cr_assert_eq(bcast_stats_to_step_record(&s, &rec, &err), BCAST_OK);
  cr_assert_eq(rec.step, 41);
  cr_assert_str_eq(rec.transport, "host-tcp");
  cr_assert_eq(rec.mode, RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_HOST);
  cr_assert_eq(rec.wire_bytes, 1000);
  cr_assert_float_eq(rec.exposed_staging_seconds, 0.6, 1e-12);
  cr_assert(rec.exposed_measured);
  cr_assert_eq(rec.buckets, 2);
  cr_assert_eq(rec.n_bucket_timings, 2);
  cr_assert_float_eq(rec.bucket_timings[1]->wire_seconds, 0.6, 1e-12);
  size_t len = rlorch__v1__step_record__get_packed_size(&rec);
  uint8_t *buf = malloc(len);
  rlorch__v1__step_record__pack(&rec, buf);
  Rlorch__V1__StepRecord *u = rlorch__v1__step_record__unpack(NULL, len, buf);
  cr_assert_not_null(u);
  cr_assert_eq(u->n_bucket_timings, 2);
  cr_assert_float_eq(u->gbps, 2.5, 1e-12);
  rlorch__v1__step_record__free_unpacked(u, NULL);
  free(buf);
  bcast_pb_step_record_clear(&rec);
  cr_assert_null(rec.bucket_timings);
}
