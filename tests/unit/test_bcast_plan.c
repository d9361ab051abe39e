/* Bucket plans: layout, budget splitting, validation messages, hash. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_internal.h"

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

static bcast_plan_opts OPTS(uint64_t budget) {
  return (bcast_plan_opts){.id = "run/step-1", .mode = BCAST_MODE_HOST, .staging_budget = budget,
                           .world_size = 3, .root_rank = 0, .checksum = BCAST_CHECKSUM_XXH3_64};
}

#define F32 BCAST_DTYPE_FP32
#define BF16 BCAST_DTYPE_BF16
#define FP16 BCAST_DTYPE_FP16
#define U16 BCAST_DTYPE_U16
#define GPU BCAST_RES_GPU
#define PIN BCAST_RES_HOST_PINNED
#define PAGE BCAST_RES_HOST_PAGEABLE

/* Every tensor element appears exactly once, slices aligned, buckets in budget. */
static void assert_layout_sound(const bcast_plan *p) {
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_validate(p, &err), BCAST_OK, "%s", err.msg);
  for (size_t b = 0; b < p->nbuckets; b++) {
    cr_assert_leq(p->buckets[b].bytes, p->staging_budget);
    for (size_t s = 0; s < p->buckets[b].nslices; s++) cr_assert_eq(p->buckets[b].slices[s].bucket_offset % 256, 0);
  }
}

Test(bcast_plan, groups_by_layer_and_wire_dtype) {
  bcast_tensor t[] = {
      T("l1.w", 1, F32, BF16, 10, 10, PAGE), T("l0.w", 0, F32, BF16, 3, 0, GPU),
      T("l0.ids", 0, U16, U16, 7, 0, PIN),   T("l0.b", 0, F32, BF16, 5, 0, PIN),
      T("l1.h", 1, F32, FP16, 4, 0, GPU),
  };
  bcast_plan *p = NULL;
  bcast_err err = {0};
  bcast_plan_opts o = OPTS(0);
  cr_assert_eq(bcast_plan_build(t, 5, &o, &p, &err), BCAST_OK, "%s", err.msg);
  assert_layout_sound(p);
  cr_assert_eq(p->staging_budget, 256ull << 20);
  cr_assert_eq(p->nbuckets, 4); /* (0,bf16) (0,u16) (1,bf16) (1,fp16) */
  cr_assert_eq(p->buckets[0].layer, 0);
  cr_assert_eq(p->buckets[0].wire_dtype, BF16);
  cr_assert_eq(p->buckets[0].nslices, 2); /* mixed residency in one layer */
  cr_assert_str_eq(p->tensors[p->buckets[0].slices[0].tensor].name, "l0.w");
  cr_assert_str_eq(p->tensors[p->buckets[0].slices[1].tensor].name, "l0.b");
  cr_assert_eq(p->buckets[0].slices[1].bucket_offset, 256);
  cr_assert_eq(p->buckets[0].bytes, 256 + 5 * 2);
  cr_assert_eq(p->buckets[1].wire_dtype, U16);
  cr_assert_eq(p->buckets[2].layer, 1);
  cr_assert_eq(p->buckets[3].wire_dtype, FP16);
  cr_assert_eq(bcast_plan_wire_bytes(p), (256 + 5 * 2) + 7 * 2 + 100 * 2 + 4 * 2);
  cr_assert_eq(p->hash, bcast_plan_hash(p));
  for (size_t i = 0; i < p->ntensors; i++) cr_assert_null(p->tensors[i].data);
  bcast_plan_free(p);
}

Test(bcast_plan, budget_splits_buckets_without_splitting_small_tensors) {
  bcast_tensor t[6];
  char nm[32];
  for (int i = 0; i < 6; i++) {
    snprintf(nm, sizeof nm, "t%d", i);
    t[i] = T(nm, 0, F32, BF16, 300, 0, PAGE); /* 600 wire bytes each */
  }
  bcast_plan *p = NULL;
  bcast_err err = {0};
  bcast_plan_opts o = OPTS(2048); /* 600 | 768+600 = 1368 | 1536+600 > 2048 */
  cr_assert_eq(bcast_plan_build(t, 6, &o, &p, &err), BCAST_OK, "%s", err.msg);
  assert_layout_sound(p);
  cr_assert_eq(p->nbuckets, 3);
  for (size_t b = 0; b < 3; b++) {
    cr_assert_eq(p->buckets[b].nslices, 2);
    for (size_t s = 0; s < 2; s++) cr_assert_eq(p->buckets[b].slices[s].elem_count, 300);
  }
  bcast_plan_free(p);
}

Test(bcast_plan, tensor_larger_than_budget_is_cut_over_buckets) {
  bcast_tensor t[] = {T("small", 2, F32, BF16, 100, 0, PIN), T("big", 2, F32, BF16, 1000, 3, PAGE),
                      T("after", 2, F32, BF16, 10, 0, GPU)};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  bcast_plan_opts o = OPTS(1024); /* 512 bf16 elements per bucket */
  cr_assert_eq(bcast_plan_build(t, 3, &o, &p, &err), BCAST_OK, "%s", err.msg);
  assert_layout_sound(p);
  uint64_t covered = 0, pieces = 0;
  for (size_t b = 0; b < p->nbuckets; b++)
    for (size_t s = 0; s < p->buckets[b].nslices; s++)
      if (p->buckets[b].slices[s].tensor == 1) {
        cr_assert_eq(p->buckets[b].slices[s].elem_offset, covered);
        covered += p->buckets[b].slices[s].elem_count;
        pieces++;
      }
  cr_assert_eq(covered, 3000);
  cr_assert_geq(pieces, 6);
  /* "big" starts in the remainder of the first bucket after "small". */
  cr_assert_eq(p->buckets[0].nslices, 2);
  cr_assert_eq(p->buckets[0].slices[1].bucket_offset, 256);
  cr_assert_eq(p->buckets[0].slices[1].elem_count, (1024 - 256) / 2);
  bcast_plan_free(p);
}

Test(bcast_plan, empty_manifest_gives_an_empty_plan) {
  bcast_plan *p = NULL;
  bcast_err err = {0};
  bcast_plan_opts o = OPTS(0);
  cr_assert_eq(bcast_plan_build(NULL, 0, &o, &p, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(p->nbuckets, 0);
  cr_assert_eq(p->ntensors, 0);
  cr_assert_eq(bcast_plan_validate(p, &err), BCAST_OK);
  cr_assert_eq(bcast_plan_wire_bytes(p), 0);
  bcast_plan_free(p);
}

Test(bcast_plan, very_large_tensors_plan_without_data) {
  /* 2^40 elements of fp32 (4 TiB) in 1 GiB buckets: planning only, no memory touched. */
  bcast_tensor t[] = {T("huge", 0, F32, BF16, 1ull << 20, 1ull << 20, PAGE)};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  bcast_plan_opts o = OPTS(1ull << 30);
  cr_assert_eq(bcast_plan_build(t, 1, &o, &p, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(p->nbuckets, 2048);
  cr_assert_eq(bcast_plan_wire_bytes(p), 2ull << 40);
  cr_assert_eq(bcast_plan_validate(p, &err), BCAST_OK, "%s", err.msg);
  bcast_plan_free(p);
}

static void expect_refused(bcast_tensor *t, size_t n, const char *needle) {
  bcast_plan *p = (bcast_plan *)0x1;
  bcast_err err = {0};
  bcast_plan_opts o = OPTS(4096);
  int rc = bcast_plan_build(t, n, &o, &p, &err);
  cr_assert_eq(rc, BCAST_EINVAL, "expected EINVAL for '%s', got %d", needle, rc);
  cr_assert_eq(err.code, BCAST_EINVAL);
  cr_assert_null(p);
  cr_assert(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s'", err.msg, needle);
}

Test(bcast_plan, invalid_manifests_are_refused_by_name) {
  bcast_tensor t[2];
  t[0] = T("a", 0, F32, BF16, 4, 0, PAGE);
  t[1] = T("a", 1, F32, BF16, 4, 0, PAGE);
  expect_refused(t, 2, "tensors #0 and #1: duplicate name 'a'");

  t[0] = T("zero", 0, F32, BF16, 4, 0, PAGE);
  t[0].shape[0] = 0;
  expect_refused(t, 1, "tensor #0 'zero': shape[0]: 0");

  t[0] = T("nodims", 0, F32, BF16, 4, 0, PAGE);
  t[0].ndim = 0;
  expect_refused(t, 1, "tensor #0 'nodims': shape: 0 dimensions");

  t[0] = T("ninedims", 0, F32, BF16, 4, 0, PAGE);
  t[0].ndim = 9;
  expect_refused(t, 1, "tensor #0 'ninedims': shape: 9 dimensions");

  t[0] = T("overflow", 0, F32, BF16, 1ull << 40, 1ull << 40, PAGE);
  expect_refused(t, 1, "tensor #0 'overflow': shape: the element count overflows");

  t[0] = T("absurd", 0, F32, BF16, 1ull << 25, 1ull << 24, PAGE); /* 2^49 elems * 4 bytes = 2^51 */
  expect_refused(t, 1, "tensor #0 'absurd': size: 2251799813685248 bytes is over the limit");
  cr_assert_eq(T("", 0, F32, BF16, 1, 0, PAGE).name[0], 0);

  t[0] = T("ids", 0, U16, BF16, 4, 0, PAGE);
  expect_refused(t, 1, "'ids': wire_dtype: no cast from u16 to bf16");
  t[0] = T("toids", 0, F32, U16, 4, 0, PAGE);
  expect_refused(t, 1, "'toids': wire_dtype: no cast from fp32 to u16");
  t[0] = T("widen", 0, BF16, F32, 4, 0, PAGE);
  expect_refused(t, 1, "'widen': wire_dtype: no cast from bf16 to fp32");
  t[0] = T("twice", 0, BF16, FP16, 4, 0, PAGE);
  expect_refused(t, 1, "'twice': wire_dtype: no cast");

  t[0] = T("where", 0, F32, BF16, 4, 0, (bcast_residency)7);
  expect_refused(t, 1, "'where': residency: unknown value 7");
  t[0] = T("what", 0, (bcast_dtype)9, BF16, 4, 0, PAGE);
  expect_refused(t, 1, "'what': storage_dtype: unknown value 9");

  t[0] = T("", 0, F32, BF16, 4, 0, PAGE);
  expect_refused(t, 1, "tensor #0: name: empty");
  t[0] = T("x", 0, F32, BF16, 4, 0, PAGE);
  memset(t[0].name, 'x', sizeof t[0].name);
  expect_refused(t, 1, "name: not terminated within 128 bytes");
}

Test(bcast_plan, invalid_options_are_refused) {
  bcast_tensor t[] = {T("a", 0, F32, BF16, 4, 0, PAGE)};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  bcast_plan_opts o = OPTS(4096);
  o.root_rank = 3;
  cr_assert_eq(bcast_plan_build(t, 1, &o, &p, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "root_rank 3 >= world_size 3"), "%s", err.msg);
  o = OPTS(100);
  cr_assert_eq(bcast_plan_build(t, 1, &o, &p, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "staging_budget"), "%s", err.msg);
  o = OPTS(4096);
  o.mode = (bcast_mode)1;
  cr_assert_eq(bcast_plan_build(t, 1, &o, &p, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "mode"), "%s", err.msg);
  o = OPTS(4096);
  o.world_size = 0;
  cr_assert_eq(bcast_plan_build(t, 1, &o, &p, &err), BCAST_EINVAL);
  cr_assert_null(p);
}

static bcast_plan *sample_plan(void) {
  bcast_tensor t[] = {T("a", 0, F32, BF16, 700, 0, PAGE), T("b", 0, F32, BF16, 50, 0, GPU),
                      T("c", 1, U16, U16, 33, 0, PIN), T("d", 1, F32, FP16, 9, 2, PAGE)};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  bcast_plan_opts o = OPTS(1024);
  cr_assert_eq(bcast_plan_build(t, 4, &o, &p, &err), BCAST_OK, "%s", err.msg);
  return p;
}

Test(bcast_plan, hash_is_stable_and_sensitive) {
  bcast_plan *p = sample_plan(), *q = sample_plan();
  cr_assert_eq(p->hash, q->hash);
  cr_assert_neq(p->hash, 0);
  uint64_t h = p->hash;
#define CHANGES(stmt)                                                                  \
  do {                                                                                 \
    bcast_plan *c = bcast_plan_dup(p);                                                 \
    cr_assert_not_null(c);                                                             \
    cr_assert_eq(bcast_plan_hash(c), h);                                               \
    stmt;                                                                              \
    cr_assert_neq(bcast_plan_hash(c), h, "hash ignores: %s", #stmt);                   \
    bcast_plan_free(c);                                                                \
  } while (0)
#define KEEPS(stmt)                                                                    \
  do {                                                                                 \
    bcast_plan *c = bcast_plan_dup(p);                                                 \
    stmt;                                                                              \
    cr_assert_eq(bcast_plan_hash(c), h, "hash covers: %s", #stmt);                     \
    bcast_plan_free(c);                                                                \
  } while (0)
  CHANGES(c->id[0] = 'X');
  CHANGES(c->mode = BCAST_MODE_STAGED);
  CHANGES(c->world_size = 4);
  CHANGES(c->root_rank = 1);
  CHANGES(c->staging_budget = 2048);
  CHANGES(c->checksum = BCAST_CHECKSUM_NONE);
  CHANGES(c->policy_version = 7);
  CHANGES(c->has_nccl_id = 1);
  CHANGES(c->tensors[1].name[0] = 'z');
  CHANGES(c->tensors[1].layer = 9);
  CHANGES(c->tensors[0].storage_dtype = BF16);
  CHANGES(c->tensors[3].wire_dtype = BF16);
  CHANGES(c->tensors[3].shape[1] = 3);
  CHANGES(c->buckets[0].bytes++);
  CHANGES(c->buckets[1].source_rank = 2);
  CHANGES(c->buckets[1].stage_rank = 1);
  CHANGES(c->buckets[0].slices[0].elem_count--);
  CHANGES(c->buckets[0].slices[0].bucket_offset = 256);
  KEEPS(c->tensors[0].residency = GPU);
  KEEPS(c->deadline_unix_ms = 12345);
  KEEPS(snprintf(c->host_endpoint, sizeof c->host_endpoint, "10.0.0.1:9"));
  KEEPS(snprintf(c->mode_reason, sizeof c->mode_reason, "operator"));
  uint8_t id[128];
  memset(id, 0xab, sizeof id);
  bcast_plan_set_nccl_id(q, id);
  cr_assert_neq(q->hash, h);
  cr_assert_eq(q->hash, bcast_plan_hash(q));
  bcast_plan_free(p);
  bcast_plan_free(q);
}

static void expect_invalid(bcast_plan *c, const char *needle) {
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_validate(c, &err), BCAST_EINVAL, "expected '%s'", needle);
  cr_assert(strstr(err.msg, needle), "message '%s' lacks '%s'", err.msg, needle);
  bcast_plan_free(c);
}

Test(bcast_plan, validate_catches_overlaps_gaps_and_bad_fields) {
  bcast_plan *p = sample_plan(), *c;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_validate(p, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(p->buckets[0].nslices, 1); /* "a" fills bucket 0 then spills into bucket 1 */

  c = bcast_plan_dup(p);
  c->buckets[1].slices[1].bucket_offset -= 256;
  expect_invalid(c, "overlap");
  c = bcast_plan_dup(p);
  c->buckets[1].slices[1].bucket_offset += 256;
  expect_invalid(c, "gap");
  c = bcast_plan_dup(p);
  c->buckets[0].slices[0].elem_count -= 1;
  c->buckets[0].bytes -= 2;
  expect_invalid(c, "tensor 'a'");
  c = bcast_plan_dup(p);
  c->buckets[1].slices[0].elem_offset += 1;
  expect_invalid(c, "tensor 'a'");
  c = bcast_plan_dup(p);
  c->buckets[0].bytes += 2;
  expect_invalid(c, "bucket 0");
  c = bcast_plan_dup(p);
  c->buckets[1].source_rank = 3;
  expect_invalid(c, "bucket 1");
  c = bcast_plan_dup(p);
  c->buckets[0].slices[0].tensor = 99;
  expect_invalid(c, "out of range");
  c = bcast_plan_dup(p);
  c->buckets[0].index = 5;
  expect_invalid(c, "bucket 0: index");
  c = bcast_plan_dup(p);
  snprintf(c->tensors[1].name, sizeof c->tensors[1].name, "a");
  expect_invalid(c, "duplicate name 'a'");
  c = bcast_plan_dup(p);
  c->tensors[3].layer = 0;
  expect_invalid(c, "tensor 'd'");
  c = bcast_plan_dup(p);
  c->nbuckets--; /* the last tensor is no longer covered */
  free(c->buckets[c->nbuckets].slices);
  expect_invalid(c, "tensor 'c': slices cover 0 of 33");
  bcast_plan_free(p);
}

Test(bcast_plan, local_tensors_must_match) {
  bcast_plan *p = sample_plan();
  bcast_tensor loc[4] = {T("a", 0, F32, BF16, 700, 0, PAGE), T("b", 0, F32, BF16, 50, 0, GPU),
                         T("c", 1, U16, U16, 33, 0, PIN), T("d", 1, F32, FP16, 9, 2, PAGE)};
  static char mem[8192];
  for (int i = 0; i < 4; i++) loc[i].data = mem;
  bcast_err err = {0};
  uint32_t map[4];
  bcast_tensor rev[4] = {loc[3], loc[2], loc[1], loc[0]};
  cr_assert_eq(bcast__plan_bind(p, rev, 4, 1, map, &err), BCAST_OK, "%s", err.msg);
  cr_assert_eq(map[0], 3);
  cr_assert_eq(map[3], 0);
  cr_assert_eq(bcast_plan_check_local(p, loc, 4, 0, &err), BCAST_OK, "%s", err.msg);

  bcast_tensor bad[4];
  memcpy(bad, loc, sizeof bad);
  bad[2].shape[0] = 34;
  cr_assert_eq(bcast_plan_check_local(p, bad, 4, 0, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "'c': local shape"), "%s", err.msg);
  memcpy(bad, loc, sizeof bad);
  bad[1].data = NULL;
  cr_assert_eq(bcast_plan_check_local(p, bad, 4, 0, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "'b': local data pointer is NULL"), "%s", err.msg);
  memcpy(bad, loc, sizeof bad);
  bad[3].wire_dtype = BF16;
  cr_assert_eq(bcast_plan_check_local(p, bad, 4, 0, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "'d': local buffer dtype bf16"), "%s", err.msg);
  cr_assert_eq(bcast_plan_check_local(p, bad, 4, 1, &err), BCAST_OK, "%s", err.msg); /* sender: storage */
  memcpy(bad, loc, sizeof bad);
  bad[0].storage_dtype = BF16;
  cr_assert_eq(bcast_plan_check_local(p, bad, 4, 1, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "'a': local storage dtype bf16"), "%s", err.msg);
  cr_assert_eq(bcast_plan_check_local(p, loc, 3, 0, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "'d': in the plan but missing"), "%s", err.msg);
  memcpy(bad, loc, sizeof bad);
  snprintf(bad[3].name, sizeof bad[3].name, "a");
  cr_assert_eq(bcast_plan_check_local(p, bad, 4, 0, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "'a': duplicate"), "%s", err.msg);
  bcast_plan_free(p);
}
