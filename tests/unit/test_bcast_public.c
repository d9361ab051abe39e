/* The floors of bcast.h (bcast_floor_h2d, bcast_floor_broadcast): argument
 * checks everywhere, and on each machine either a measurement or a clear
 * BCAST_ENOTSUP that says what is missing. Uses the public header only. */
#include <criterion/criterion.h>
#include <string.h>

#include "workers/bcast/bcast.h"

static bcast_caps caps_here(void) {
  bcast_caps c;
  bcast_caps_probe(&c);
  return c;
}

#define ASSERT_FAILS(call, want, needle)                                                         \
  do {                                                                                           \
    bcast_err err_ = {0};                                                                        \
    int rc_ = (call);                                                                            \
    cr_assert_eq(rc_, (want), "%s: rc %d (%s), want %d", #call, rc_, err_.msg, (want));          \
    cr_assert_eq(err_.code, (want), "%s: err.code %d", #call, err_.code);                        \
    cr_assert(strstr(err_.msg, (needle)), "%s: message '%s' does not name '%s'", #call,          \
              err_.msg, (needle));                                                               \
  } while (0)

Test(bcast_floor, h2d_rejects_bad_arguments_by_name) {
  double g = 1;
  ASSERT_FAILS(bcast_floor_h2d(0, 1 << 20, 1, NULL, &err_), BCAST_EINVAL, "NULL result");
  ASSERT_FAILS(bcast_floor_h2d(0, 0, 1, &g, &err_), BCAST_EINVAL, "bytes");
  ASSERT_FAILS(bcast_floor_h2d(0, 1 << 20, 0, &g, &err_), BCAST_EINVAL, "reps 0");
  ASSERT_FAILS(bcast_floor_h2d(0, 1 << 20, 10001, &g, &err_), BCAST_EINVAL, "reps 10001");
  ASSERT_FAILS(bcast_floor_h2d(-1, 1 << 20, 1, &g, &err_), BCAST_EINVAL, "device -1");
  cr_assert_eq(g, 0, "a failed measurement leaves 0, not a stale figure");
  /* A NULL bcast_err is allowed: the code alone still comes back. */
  cr_assert_eq(bcast_floor_h2d(0, 0, 1, &g, NULL), BCAST_EINVAL);
}

Test(bcast_floor, broadcast_rejects_bad_arguments_by_name) {
  double s = 1;
  int two[2] = {0, 1}, same[2] = {1, 1}, neg[2] = {0, -2};
  ASSERT_FAILS(bcast_floor_broadcast(two, 2, 1 << 20, 1, NULL, &err_), BCAST_EINVAL, "NULL result");
  ASSERT_FAILS(bcast_floor_broadcast(two, 2, 0, 1, &s, &err_), BCAST_EINVAL, "bytes");
  ASSERT_FAILS(bcast_floor_broadcast(two, 2, 1 << 20, 0, &s, &err_), BCAST_EINVAL, "reps 0");
  ASSERT_FAILS(bcast_floor_broadcast(NULL, 2, 1 << 20, 1, &s, &err_), BCAST_EINVAL, "at least one device");
  ASSERT_FAILS(bcast_floor_broadcast(two, 0, 1 << 20, 1, &s, &err_), BCAST_EINVAL, "ndev 0");
  ASSERT_FAILS(bcast_floor_broadcast(neg, 2, 1 << 20, 1, &s, &err_), BCAST_EINVAL, "devices[1] = -2");
  ASSERT_FAILS(bcast_floor_broadcast(same, 2, 1 << 20, 1, &s, &err_), BCAST_EINVAL,
               "devices[1] = 1 repeats devices[0]");
  cr_assert_eq(s, 0, "a failed measurement leaves 0, not a stale figure");
}

/* With a device: a positive bandwidth, and a device past the last one is
 * refused by index. Without: ENOTSUP naming what is missing. */
Test(bcast_floor, h2d_measures_or_says_what_is_missing) {
  bcast_caps c = caps_here();
  double g = 0;
  bcast_err err = {0};
  int rc = bcast_floor_h2d(0, 1 << 20, 2, &g, &err);
  if (!c.cuda_built) {
    cr_assert_eq(rc, BCAST_ENOTSUP, "rc %d: %s", rc, err.msg);
    cr_assert(strstr(err.msg, "built without CUDA"), "%s", err.msg);
    cr_assert_eq(g, 0);
  } else if (c.cuda_devices == 0) {
    cr_assert_eq(rc, BCAST_ENOTSUP, "rc %d: %s", rc, err.msg);
    cr_assert(strstr(err.msg, "no CUDA device visible"), "%s", err.msg);
    cr_assert_eq(g, 0);
  } else {
    cr_assert_eq(rc, BCAST_OK, "%s", err.msg);
    cr_assert_gt(g, 0.01, "a 1 MiB pinned copy at %g GB/s", g);
    ASSERT_FAILS(bcast_floor_h2d(c.cuda_devices, 1 << 20, 1, &g, &err_), BCAST_EINVAL,
                 "CUDA device(s) visible");
  }
}

Test(bcast_floor, broadcast_measures_or_says_what_is_missing) {
  bcast_caps c = caps_here();
  int one[1] = {0};
  double s = 0;
  bcast_err err = {0};
  /* One rank is enough to run the collective on a one-GPU machine. */
  int rc = bcast_floor_broadcast(one, 1, 1 << 20, 3, &s, &err);
  if (!c.cuda_built || !c.nccl_built) {
    cr_assert_eq(rc, BCAST_ENOTSUP, "rc %d: %s", rc, err.msg);
    cr_assert(strstr(err.msg, "built without"), "%s", err.msg);
  } else if (c.cuda_devices == 0) {
    cr_assert_eq(rc, BCAST_ENOTSUP, "rc %d: %s", rc, err.msg);
    cr_assert(strstr(err.msg, "no CUDA device visible"), "%s", err.msg);
  } else {
    cr_assert_eq(rc, BCAST_OK, "%s", err.msg);
    cr_assert_gt(s, 0, "median of 3 broadcasts: %g s", s);
    cr_assert_lt(s, 10, "1 MiB on one device took %g s", s);
    int past[2] = {0, c.cuda_devices};
    ASSERT_FAILS(bcast_floor_broadcast(past, 2, 1 << 20, 1, &s, &err_), BCAST_EINVAL,
                 "CUDA device(s) visible");
  }
}

/* Colocated mode without a GPU (CI): refused, saying what is missing. */
Test(bcast_coloc, refused_without_a_gpu_naming_what_is_missing) {
  bcast_caps c;
  bcast_caps_probe(&c);
  cr_assert(c.host_id[0], "every machine has a host id");
  char why[256] = "";
  if (c.cuda_devices > 0) cr_skip_test("a CUDA device is visible: the GPU tests cover this");
  cr_assert_not(bcast_mode_available(&c, BCAST_MODE_COLOCATED, why, sizeof why));
  cr_assert(strstr(why, "without CUDA") || strstr(why, "no CUDA device"), "%s", why);
  cr_assert_str_eq(c.gpu_uuid, "", "no device, no UUID");
  cr_assert_str_eq(bcast_mode_name(BCAST_MODE_COLOCATED), "colocated");

  bcast_tensor t = {.name = "w", .storage_dtype = BCAST_DTYPE_FP32, .wire_dtype = BCAST_DTYPE_BF16,
                    .ndim = 1, .shape = {1024}, .residency = BCAST_RES_GPU};
  bcast_plan_opts po = {.id = "p", .mode = BCAST_MODE_COLOCATED, .world_size = 2};
  bcast_plan *p = NULL;
  bcast_err err = {0};
  cr_assert_eq(bcast_plan_build(&t, 1, &po, &p, &err), BCAST_OK, "%s", err.msg);
  bcast_engine_opts eo = {.rank = 1, .device = -1};
  bcast_engine *e = NULL;
  cr_assert_eq(bcast_engine_new(&eo, &e, &err), BCAST_OK, "%s", err.msg);
  uint8_t *ex = (uint8_t *)"sentinel";
  size_t len = 7;
  cr_assert_eq(bcast_engine_coloc_export(e, p, &t, 1, &ex, &len, &err), BCAST_ENOTSUP);
  cr_assert(strstr(err.msg, "colocated mode unavailable here"), "%s", err.msg);
  cr_assert_null(ex);
  cr_assert_eq(len, 0);
  cr_assert_eq(bcast_engine_coloc_import(e, p, 1, NULL, 0, &err), BCAST_ENOTSUP);
  cr_assert_eq(bcast_engine_execute(e, p, &t, 1, NULL, &err), BCAST_ENOTSUP);
  cr_assert(strstr(err.msg, "colocated"), "%s", err.msg);
  cr_assert_eq(bcast_engine_coloc_mappings(e), 0);
  cr_assert_eq(bcast_floor_d2d(0, 1 << 20, 1, &(double){0}, &err), BCAST_ENOTSUP);
  bcast_engine_free(e);
  bcast_plan_free(p);
}
