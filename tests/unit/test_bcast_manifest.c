/* The rules of a manifest (bcast_manifest_check, bcast_manifest_check_pb):
 * each rule with its exact message, on the engine's struct and on the
 * protobuf message alike, the limits, and a large manifest checked in time
 * proportional to its size. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_pb.h"

#define F32 BCAST_DTYPE_FP32
#define BF16 BCAST_DTYPE_BF16
#define U16 BCAST_DTYPE_U16
#define PAGE BCAST_RES_HOST_PAGEABLE

static bcast_tensor T(const char *name, uint64_t d0, uint64_t d1) {
  bcast_tensor t;
  memset(&t, 0, sizeof t);
  snprintf(t.name, sizeof t.name, "%s", name);
  t.storage_dtype = F32;
  t.wire_dtype = BF16;
  t.ndim = d1 ? 2 : 1;
  t.shape[0] = d0;
  t.shape[1] = d1;
  t.residency = PAGE;
  return t;
}

/* The same tensors as a WeightManifest message, pointing into `t`'s names
 * and shapes (nothing to free but the arrays). */
typedef struct pb_manifest {
  Rlorch__V1__WeightManifest m;
  Rlorch__V1__TensorSpec *specs;
  Rlorch__V1__TensorSpec **ptrs;
} pb_manifest;

static void to_pb(const bcast_tensor *t, size_t n, pb_manifest *out) {
  rlorch__v1__weight_manifest__init(&out->m);
  out->specs = calloc(n ? n : 1, sizeof *out->specs);
  out->ptrs = calloc(n ? n : 1, sizeof *out->ptrs);
  cr_assert(out->specs && out->ptrs);
  for (size_t i = 0; i < n; i++) {
    Rlorch__V1__TensorSpec *s = &out->specs[i];
    rlorch__v1__tensor_spec__init(s);
    s->name = (char *)t[i].name;
    s->layer = t[i].layer;
    s->storage_dtype = (Rlorch__V1__DType)t[i].storage_dtype;
    s->wire_dtype = (Rlorch__V1__DType)t[i].wire_dtype;
    s->n_shape = t[i].ndim;
    s->shape = (uint64_t *)t[i].shape;
    s->residency = (Rlorch__V1__Residency)t[i].residency;
    out->ptrs[i] = s;
  }
  out->m.tensors = out->ptrs;
  out->m.n_tensors = n;
}

static void pb_free(pb_manifest *p) {
  free(p->specs);
  free(p->ptrs);
}

/* Both checks refuse t with exactly `want`. */
static void refused(const bcast_tensor *t, size_t n, const bcast_manifest_limits *lim,
                    const char *want) {
  bcast_err err = {0};
  cr_assert_eq(bcast_manifest_check(t, n, lim, &err), BCAST_EINVAL, "struct: accepted, want '%s'", want);
  cr_assert_str_eq(err.msg, want);
  cr_assert_eq(err.code, BCAST_EINVAL);
  pb_manifest p;
  to_pb(t, n, &p);
  memset(&err, 0, sizeof err);
  cr_assert_eq(bcast_manifest_check_pb(&p.m, lim, &err), BCAST_EINVAL, "pb: accepted, want '%s'", want);
  cr_assert_str_eq(err.msg, want);
  pb_free(&p);
}

static void accepted(const bcast_tensor *t, size_t n, const bcast_manifest_limits *lim) {
  bcast_err err = {0};
  cr_assert_eq(bcast_manifest_check(t, n, lim, &err), BCAST_OK, "struct: %s", err.msg);
  pb_manifest p;
  to_pb(t, n, &p);
  cr_assert_eq(bcast_manifest_check_pb(&p.m, lim, &err), BCAST_OK, "pb: %s", err.msg);
  pb_free(&p);
}

Test(bcast_manifest, a_good_manifest_passes) {
  bcast_tensor t[] = {T("embed", 32000, 512), T("layers.0.w", 512, 512), T("ids", 7, 0)};
  t[2].storage_dtype = t[2].wire_dtype = U16;
  t[1].residency = BCAST_RES_GPU;
  accepted(t, 3, NULL);
  accepted(NULL, 0, NULL);
}

Test(bcast_manifest, names) {
  bcast_tensor t[3] = {T("a", 4, 0), T("", 4, 0), T("c", 4, 0)};
  refused(t, 3, NULL, "tensor #1: name: empty");
  t[1] = T("b\nc", 4, 0);
  refused(t, 3, NULL, "tensor #1: name: control character 0x0a at byte 1");
  t[1] = T("b\x7f", 4, 0);
  refused(t, 3, NULL, "tensor #1: name: control character 0x7f at byte 1");
  /* A struct's name that fills its array has no end. */
  t[1] = T("b", 4, 0);
  memset(t[1].name, 'n', sizeof t[1].name);
  bcast_err err = {0};
  cr_assert_eq(bcast_manifest_check(t, 3, NULL, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "tensor #1 'nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn...': name: not terminated within 128 bytes");
  /* A message's name has a length: 127 bytes pass, 128 do not. */
  char name[200];
  memset(name, 'n', sizeof name);
  name[127] = 0;
  t[1] = T("b", 4, 0);
  pb_manifest p;
  to_pb(t, 3, &p);
  p.specs[1].name = name;
  cr_assert_eq(bcast_manifest_check_pb(&p.m, NULL, &err), BCAST_OK, "%s", err.msg);
  name[127] = 'n';
  name[199] = 0;
  cr_assert_eq(bcast_manifest_check_pb(&p.m, NULL, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "tensor #1 'nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn...': name: 199 bytes, longer than 127");
  p.ptrs[1] = NULL;
  cr_assert_eq(bcast_manifest_check_pb(&p.m, NULL, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "tensor #1: missing");
  pb_free(&p);
}

Test(bcast_manifest, duplicate_names_name_both_indices) {
  bcast_tensor t[5] = {T("a", 4, 0), T("b", 4, 0), T("c", 4, 0), T("d", 4, 0), T("b", 8, 0)};
  refused(t, 5, NULL, "tensors #1 and #4: duplicate name 'b'");
  /* Names that share a prefix are different names. */
  snprintf(t[4].name, sizeof t[4].name, "bb");
  accepted(t, 5, NULL);
}

Test(bcast_manifest, shapes) {
  bcast_tensor t[2] = {T("a", 4, 0), T("w", 4, 0)};
  t[1].ndim = 0;
  refused(t, 2, NULL, "tensor #1 'w': shape: 0 dimensions, want 1..8");
  t[1].ndim = 9;
  refused(t, 2, NULL, "tensor #1 'w': shape: 9 dimensions, want 1..8");
  t[1] = T("w", 4, 0);
  t[1].ndim = 3;
  t[1].shape[1] = 2;
  t[1].shape[2] = 0;
  refused(t, 2, NULL, "tensor #1 'w': shape[2]: 0, every dimension is at least 1");
  t[1] = T("w", 1ull << 40, 1ull << 40);
  refused(t, 2, NULL, "tensor #1 'w': shape: the element count overflows 64 bits");
}

Test(bcast_manifest, dtypes_and_residency) {
  bcast_tensor t[2] = {T("a", 4, 0), T("w", 4, 0)};
  t[1].storage_dtype = (bcast_dtype)99;
  refused(t, 2, NULL, "tensor #1 'w': storage_dtype: unknown value 99");
  t[1].storage_dtype = (bcast_dtype)0;
  refused(t, 2, NULL, "tensor #1 'w': storage_dtype: unknown value 0");
  t[1] = T("w", 4, 0);
  t[1].wire_dtype = (bcast_dtype)99;
  refused(t, 2, NULL, "tensor #1 'w': wire_dtype: unknown value 99");
  t[1].wire_dtype = U16;
  refused(t, 2, NULL, "tensor #1 'w': wire_dtype: no cast from fp32 to u16");
  t[1] = T("w", 4, 0);
  t[1].residency = (bcast_residency)7;
  refused(t, 2, NULL, "tensor #1 'w': residency: unknown value 7");
  t[1].residency = (bcast_residency)0;
  refused(t, 2, NULL, "tensor #1 'w': residency: unknown value 0");
}

Test(bcast_manifest, sizes) {
  bcast_tensor t[2] = {T("a", 4, 0), T("w", 1ull << 62, 0)}; /* 2^62 fp32 elements */
  refused(t, 2, NULL, "tensor #1 'w': size: 4611686018427387904 elements of 4 bytes overflow 64 bits");
  /* The engine's own bound, 2^50 bytes, without limits. */
  t[1] = T("w", 1ull << 48, 2); /* 2^49 elements of 4 bytes: 2^51 */
  refused(t, 2, NULL,
          "tensor #1 'w': size: 2251799813685248 bytes is over the limit of 1125899906842624 "
          "(max_tensor_bytes)");
  /* The size counts the larger element: fp32 storage of a bf16 tensor. */
  bcast_manifest_limits lim = {.max_tensor_bytes = 1024};
  t[1] = T("w", 256, 0); /* 1024 bytes of fp32 */
  accepted(t, 2, &lim);
  t[1] = T("w", 257, 0);
  refused(t, 2, &lim, "tensor #1 'w': size: 1028 bytes is over the limit of 1024 (max_tensor_bytes)");
  /* A limit above the engine's bound is the engine's bound. */
  lim.max_tensor_bytes = UINT64_MAX;
  t[1] = T("w", 1ull << 48, 2);
  refused(t, 2, &lim,
          "tensor #1 'w': size: 2251799813685248 bytes is over the limit of 1125899906842624 "
          "(max_tensor_bytes)");
}

Test(bcast_manifest, totals_and_counts) {
  bcast_tensor t[3] = {T("a", 100, 0), T("b", 100, 0), T("c", 100, 0)}; /* 400 bytes each */
  bcast_manifest_limits lim = {.max_manifest_bytes = 1200};
  accepted(t, 3, &lim);
  lim.max_manifest_bytes = 1199;
  refused(t, 3, &lim,
          "the tensors' sizes summed pass the limit of 1199 bytes (max_manifest_bytes) at "
          "tensor #2 'c'");
  /* Without a total limit any sum of allowed sizes passes; with one, it is the sum that counts. */
  bcast_tensor big[5];
  for (int i = 0; i < 5; i++) {
    char nm[8];
    snprintf(nm, sizeof nm, "t%d", i);
    big[i] = T(nm, 1ull << 47, 2); /* 2^50 bytes each: the most a tensor may have */
  }
  accepted(big, 5, NULL);
  bcast_manifest_limits none = {0};
  accepted(big, 5, &none);
  lim = (bcast_manifest_limits){.max_manifest_bytes = 4ull << 50};
  refused(big, 5, &lim,
          "the tensors' sizes summed pass the limit of 4503599627370496 bytes "
          "(max_manifest_bytes) at tensor #4 't4'");
  lim = (bcast_manifest_limits){.max_manifest_tensors = 2};
  refused(t, 3, &lim, "3 tensors is over the limit of 2 (max_manifest_tensors)");
  lim.max_manifest_tensors = 3;
  accepted(t, 3, &lim);
}

Test(bcast_manifest, message_fields) {
  bcast_tensor t[1] = {T("a", 4, 0)};
  pb_manifest p;
  to_pb(t, 1, &p);
  bcast_err err = {0};
  p.m.offload = (Rlorch__V1__Offload)9;
  cr_assert_eq(bcast_manifest_check_pb(&p.m, NULL, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "offload: unknown value 9");
  p.m.offload = RLORCH__V1__OFFLOAD__OFFLOAD_PARAMS;
  char preset[80];
  memset(preset, 'p', sizeof preset);
  preset[64] = 0;
  p.m.preset = preset;
  cr_assert_eq(bcast_manifest_check_pb(&p.m, NULL, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "preset: longer than 63 bytes");
  preset[63] = 0;
  cr_assert_eq(bcast_manifest_check_pb(&p.m, NULL, &err), BCAST_OK, "%s", err.msg);
  /* from_pb applies the same rules, with the engine's bounds. */
  p.specs[0].storage_dtype = (Rlorch__V1__DType)99;
  bcast_tensor *out = (bcast_tensor *)1;
  size_t n = 7;
  cr_assert_eq(bcast_manifest_from_pb(&p.m, &out, &n, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "tensor #0 'a': storage_dtype: unknown value 99");
  cr_assert_null(out);
  cr_assert_eq(n, 0);
  pb_free(&p);
}

Test(bcast_manifest, plans_follow_the_same_rules) {
  bcast_tensor t[2] = {T("a", 4, 0), T("a", 4, 0)};
  bcast_plan_opts o = {.id = "r/s", .mode = BCAST_MODE_HOST, .world_size = 2};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build(t, 2, &o, &p, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "tensors #0 and #1: duplicate name 'a'");
  /* The options' limits are the manifest's. */
  snprintf(t[1].name, sizeof t[1].name, "b");
  bcast_manifest_limits lim = {.max_manifest_tensors = 1};
  o.limits = &lim;
  cr_assert_eq(bcast_plan_build(t, 2, &o, &p, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "2 tensors is over the limit of 1 (max_manifest_tensors)");
  o.limits = NULL;
  cr_assert_eq(bcast_plan_build(t, 2, &o, &p, &err), BCAST_OK, "%s", err.msg);
  /* A plan whose tensors break a rule does not validate. */
  p->tensors[1].residency = (bcast_residency)5;
  cr_assert_eq(bcast_plan_validate(p, &err), BCAST_EINVAL);
  cr_assert_str_eq(err.msg, "tensor #1 'b': residency: unknown value 5");
  bcast_plan_free(p);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The duplicate check probes a hash set: a manifest 8 times larger takes
 * about 8 times as long, not 64 (pairwise) and not much more (a sort). */
static double check_time(pb_manifest *p, size_t n, int dup_last) {
  if (dup_last) p->specs[n - 1].name = p->specs[0].name;
  p->m.n_tensors = n;
  bcast_err err = {0};
  double t0 = now_s();
  int rc = bcast_manifest_check_pb(&p->m, NULL, &err);
  double dt = now_s() - t0;
  if (dup_last) {
    cr_assert_eq(rc, BCAST_EINVAL);
    char want[96];
    snprintf(want, sizeof want, "tensors #0 and #%zu: duplicate name 't0000000'", n - 1);
    cr_assert_str_eq(err.msg, want);
  } else {
    cr_assert_eq(rc, BCAST_OK, "%s", err.msg);
  }
  return dt;
}

Test(bcast_manifest, large_manifests_in_linear_time, .timeout = 120) {
  enum { N = 400000 };
  bcast_tensor one = T("x", 64, 64);
  char (*names)[16] = malloc((size_t)N * sizeof *names);
  pb_manifest p;
  to_pb(&one, 1, &p);
  free(p.specs);
  free(p.ptrs);
  p.specs = calloc(N, sizeof *p.specs);
  p.ptrs = calloc(N, sizeof *p.ptrs);
  cr_assert(names && p.specs && p.ptrs);
  for (size_t i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "t%07zu", i);
    rlorch__v1__tensor_spec__init(&p.specs[i]);
    p.specs[i].name = names[i];
    p.specs[i].storage_dtype = RLORCH__V1__DTYPE__DTYPE_FP32;
    p.specs[i].wire_dtype = RLORCH__V1__DTYPE__DTYPE_BF16;
    p.specs[i].n_shape = 2;
    p.specs[i].shape = one.shape;
    p.specs[i].residency = RLORCH__V1__RESIDENCY__RESIDENCY_HOST_PAGEABLE;
    p.ptrs[i] = &p.specs[i];
  }
  p.m.tensors = p.ptrs;
  /* Best of three, so that a moment of load does not decide. */
  double small = 1e9, large = 1e9;
  for (int r = 0; r < 3; r++) {
    double a = check_time(&p, N / 8, 0), b = check_time(&p, N, 0);
    small = a < small ? a : small;
    large = b < large ? b : large;
  }
  cr_log_info("%d tensors checked in %.1f ms, %d in %.1f ms", N / 8, small * 1e3, N, large * 1e3);
  cr_assert_lt(large, 40 * small + 0.05, "%.3f s for %d tensors against %.3f s for %d", large, N,
               small, N / 8);
  check_time(&p, N, 1);
  free(names);
  pb_free(&p);
}
