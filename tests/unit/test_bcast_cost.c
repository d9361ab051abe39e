/* The cost model that bounds a plan's ack and broadcast (bcast_cost_estimate). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "workers/bcast/bcast.h"

#define MB 1000000ull
#define GB 1000000000ull

static bcast_cost est(const bcast_cost_model *m, bcast_mode mode, uint64_t bytes, uint32_t rx, double measured) {
  bcast_cost c;
  bcast_err err = {0};
  cr_assert_eq(bcast_cost_estimate(m, mode, bytes, rx, measured, &c, &err), BCAST_OK, "%s", err.msg);
  return c;
}

Test(bcast_cost, defaults_are_the_documented_floors) {
  bcast_cost_model m;
  bcast_cost_model_default(&m);
  cr_assert_float_eq(m.gbps[BCAST_MODE_HOST], 0.5, 1e-12);
  cr_assert_float_eq(m.gbps[BCAST_MODE_STAGED], 5.0, 1e-12);
  cr_assert_float_eq(m.gbps[BCAST_MODE_DIRECT], 10.0, 1e-12);
  cr_assert_float_eq(m.gbps[BCAST_MODE_COLOCATED], 5.0, 1e-12);
  cr_assert_float_eq(m.safety, 4.0, 1e-12);
  /* Every mode a plan can have gets bounds. */
  const bcast_mode modes[] = {BCAST_MODE_DIRECT, BCAST_MODE_STAGED, BCAST_MODE_HOST,
                              BCAST_MODE_COLOCATED};
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
    bcast_cost c;
    bcast_err e = {0};
    cr_assert_eq(bcast_cost_estimate(&m, modes[i], 1u << 30, 1, 0, &c, &e), 0, "%s: %s",
                 bcast_mode_name(modes[i]), e.msg);
  }
  cr_assert_float_eq(m.slack_s, 2.0, 1e-12);
  cr_assert_float_eq(m.detect_s, 5.0, 1e-12);
  cr_assert_float_eq(m.prepare_gbps, 2.0, 1e-12);
}

/* The formula, figure by figure: 200 MB to 2 host receivers at 0.5 GB/s is
 * 0.8 s on the wire; x4 + 2 s + 5 s = 10.2 s, not the 300 s of old. */
Test(bcast_cost, a_small_host_plan_gets_seconds_not_minutes) {
  bcast_cost_model m;
  bcast_cost_model_default(&m);
  bcast_cost c = est(&m, BCAST_MODE_HOST, 200 * MB, 2, 0);
  cr_assert_float_eq(c.rate_gbps, 0.5, 1e-12);
  cr_assert_eq(c.measured, 0);
  cr_assert_float_eq(c.wire_s, 0.8, 1e-9);
  cr_assert_float_eq(c.broadcast_s, 4 * 0.8 + 2 + 5, 1e-9);
  cr_assert_float_eq(c.ack_s, 4 * 0.1 + 2 + 5, 1e-9);
  cr_assert_float_eq(c.min_gbps, 0.125, 1e-12);
  cr_assert_lt(c.ack_s, 30.0);
  cr_assert_lt(c.broadcast_s, 30.0);
}

/* Host mode sends one copy per receiver through the root; NCCL does not. */
Test(bcast_cost, host_mode_pays_per_receiver_nccl_modes_do_not) {
  bcast_cost_model m;
  bcast_cost_model_default(&m);
  cr_assert_float_eq(est(&m, BCAST_MODE_HOST, GB, 4, 0).wire_s, 4 * est(&m, BCAST_MODE_HOST, GB, 1, 0).wire_s,
                     1e-9);
  cr_assert_float_eq(est(&m, BCAST_MODE_HOST, GB, 0, 0).wire_s, 2.0, 1e-9, "no receiver counts as one");
  cr_assert_float_eq(est(&m, BCAST_MODE_DIRECT, GB, 7, 0).wire_s, 0.1, 1e-9);
  cr_assert_float_eq(est(&m, BCAST_MODE_STAGED, GB, 7, 0).wire_s, 0.2, 1e-9);
}

/* A trillion-parameter plan (2 TB in bf16) is given the time its bytes need,
 * far beyond any fixed timeout; nothing caps it. */
Test(bcast_cost, a_huge_plan_is_not_capped) {
  bcast_cost_model m;
  bcast_cost_model_default(&m);
  bcast_cost c = est(&m, BCAST_MODE_DIRECT, 2000 * GB, 8, 0);
  cr_assert_float_eq(c.wire_s, 200.0, 1e-6);
  cr_assert_float_eq(c.broadcast_s, 807.0, 1e-6);
  cr_assert_gt(c.broadcast_s, 300.0);
  cr_assert_float_eq(c.ack_s, 4007.0, 1e-6, "receivers prepare 2 TB at 2 GB/s, x4");
}

/* A measured rate below the model's lengthens the bounds; one above leaves
 * them: a fast step must not make the next one's jitter fatal. */
Test(bcast_cost, a_measured_rate_only_ever_lengthens_the_bounds) {
  bcast_cost_model m;
  bcast_cost_model_default(&m);
  bcast_cost slow = est(&m, BCAST_MODE_HOST, GB, 1, 0.1);
  cr_assert_eq(slow.measured, 1);
  cr_assert_float_eq(slow.rate_gbps, 0.1, 1e-12);
  cr_assert_float_eq(slow.wire_s, 10.0, 1e-9);
  cr_assert_float_eq(slow.min_gbps, 0.025, 1e-12);
  bcast_cost fast = est(&m, BCAST_MODE_HOST, GB, 1, 3.0);
  cr_assert_eq(fast.measured, 0);
  cr_assert_float_eq(fast.rate_gbps, 0.5, 1e-12);
  cr_assert_float_eq(fast.broadcast_s, est(&m, BCAST_MODE_HOST, GB, 1, 0).broadcast_s, 1e-12);
}

Test(bcast_cost, a_bad_model_is_refused_naming_the_field) {
  bcast_cost_model m;
  bcast_cost c;
  bcast_err err = {0};
  bcast_cost_model_default(&m);
  m.gbps[BCAST_MODE_STAGED] = 0;
  cr_assert_eq(bcast_cost_estimate(&m, BCAST_MODE_STAGED, GB, 1, 0, &c, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "staged rate"), "%s", err.msg);
  cr_assert_eq(bcast_cost_estimate(&m, BCAST_MODE_HOST, GB, 1, 0, &c, &err), BCAST_OK, "other modes still work");
  bcast_cost_model_default(&m);
  m.safety = 0.5;
  cr_assert_eq(bcast_cost_estimate(&m, BCAST_MODE_HOST, GB, 1, 0, &c, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "safety"), "%s", err.msg);
  bcast_cost_model_default(&m);
  m.slack_s = NAN;
  cr_assert_eq(bcast_cost_estimate(&m, BCAST_MODE_HOST, GB, 1, 0, &c, &err), BCAST_EINVAL);
  bcast_cost_model_default(&m);
  cr_assert_eq(bcast_cost_estimate(&m, (bcast_mode)9, GB, 1, 0, &c, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "unknown mode 9"), "%s", err.msg);
  cr_assert_eq(bcast_cost_estimate(&m, BCAST_MODE_HOST, GB, 1, -1, &c, &err), BCAST_EINVAL);
  cr_assert(strstr(err.msg, "measured"), "%s", err.msg);
}
