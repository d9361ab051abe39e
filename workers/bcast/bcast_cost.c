/* The cost model that bounds every wait on a plan (bcast.h states the
 * formula).  Pure arithmetic: the orchestrator derives each plan's ack and
 * broadcast deadlines from it, and the plan carries min_gbps so that the
 * engines cut off a transfer that runs slower than the model allows. */
#include <math.h>

#include "workers/bcast/bcast_internal.h"

void bcast_cost_model_default(bcast_cost_model *m) {
  *m = (bcast_cost_model){.prepare_gbps = 2.0, .safety = 4.0, .slack_s = 2.0, .detect_s = 5.0};
  m->gbps[BCAST_MODE_HOST] = 0.5;
  m->gbps[BCAST_MODE_STAGED] = 5.0;
  m->gbps[BCAST_MODE_DIRECT] = 10.0;
  /* Bound by the host-to-device link when the master is in host memory, as
   * staged is; far faster from a GPU master, which the bound only covers. */
  m->gbps[BCAST_MODE_COLOCATED] = 5.0;
}

static int positive(double v) { return isfinite(v) && v > 0; }

int bcast_cost_estimate(const bcast_cost_model *m, bcast_mode mode, uint64_t wire_bytes,
                        uint32_t receivers, double measured_gbps, bcast_cost *out, bcast_err *err) {
  if (!m || !out) return bcast__fail(err, BCAST_EINVAL, "cost model: NULL argument");
  if (mode != BCAST_MODE_HOST && mode != BCAST_MODE_STAGED && mode != BCAST_MODE_DIRECT &&
      mode != BCAST_MODE_COLOCATED)
    return bcast__fail(err, BCAST_EINVAL, "cost model: unknown mode %d", (int)mode);
  if (!positive(m->gbps[mode]))
    return bcast__fail(err, BCAST_EINVAL, "cost model: %s rate %g GB/s must be > 0", bcast_mode_name(mode),
                       m->gbps[mode]);
  if (!positive(m->prepare_gbps))
    return bcast__fail(err, BCAST_EINVAL, "cost model: prepare rate %g GB/s must be > 0", m->prepare_gbps);
  if (!isfinite(m->safety) || m->safety < 1)
    return bcast__fail(err, BCAST_EINVAL, "cost model: safety factor %g must be >= 1", m->safety);
  if (!isfinite(m->slack_s) || m->slack_s < 0 || !isfinite(m->detect_s) || m->detect_s < 0)
    return bcast__fail(err, BCAST_EINVAL, "cost model: slack %g s and detect %g s must be >= 0", m->slack_s,
                       m->detect_s);
  if (!isfinite(measured_gbps) || measured_gbps < 0)
    return bcast__fail(err, BCAST_EINVAL, "cost model: measured rate %g GB/s must be >= 0", measured_gbps);
  double rate = m->gbps[mode];
  int measured = measured_gbps > 0 && measured_gbps < rate;
  if (measured) rate = measured_gbps;
  /* Host mode writes one copy per receiver through the root's socket(s);
   * NCCL pipelines one copy through the ring or tree. */
  double fanout = mode == BCAST_MODE_HOST && receivers > 1 ? (double)receivers : 1.0;
  double fixed = m->slack_s + m->detect_s;
  out->rate_gbps = rate;
  out->measured = measured;
  out->wire_s = (double)wire_bytes * fanout / (rate * 1e9);
  out->broadcast_s = m->safety * out->wire_s + fixed;
  out->ack_s = m->safety * (double)wire_bytes / (m->prepare_gbps * 1e9) + fixed;
  out->min_gbps = rate / m->safety;
  return BCAST_OK;
}
