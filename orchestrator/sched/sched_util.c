/* The scheduler's pure helpers: names, settings, the mode choice. No state. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/sched/sched.h"

const char *sched_strerror(int code) {
  switch (code) {
  case SCHED_OK: return "ok";
  case SCHED_EINVAL: return "invalid argument";
  case SCHED_ENOENT: return "unknown worker or request";
  case SCHED_ESTATE: return "not valid in the current state";
  case SCHED_ESTALE: return "stale: refers to an older plan, request or step";
  case SCHED_EEXIST: return "already exists";
  case SCHED_ENOMEM: return "out of memory";
  case SCHED_ENOTSUP: return "mode not supported by the participants";
  default: return "unknown error";
  }
}

const char *sched_mode_name(sched_mode m) {
  switch (m) {
  case SCHED_MODE_AUTO: return "auto";
  case SCHED_MODE_DIRECT: return "direct";
  case SCHED_MODE_STAGED: return "staged";
  case SCHED_MODE_HOST: return "host";
  default: return "unknown";
  }
}

int sched_mode_parse(const char *s, sched_mode *out) {
  static const sched_mode all[] = {SCHED_MODE_AUTO, SCHED_MODE_DIRECT, SCHED_MODE_STAGED,
                                   SCHED_MODE_HOST};
  if (!s || !out) return SCHED_EINVAL;
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    if (strcmp(s, sched_mode_name(all[i])) == 0) {
      *out = all[i];
      return SCHED_OK;
    }
  }
  return SCHED_EINVAL;
}

const char *sched_run_state_name(sched_run_state s) {
  switch (s) {
  case SCHED_RUN_PENDING: return "pending";
  case SCHED_RUN_RUNNING: return "running";
  case SCHED_RUN_STOPPING: return "stopping";
  case SCHED_RUN_STOPPED: return "stopped";
  case SCHED_RUN_SUCCEEDED: return "succeeded";
  case SCHED_RUN_FAILED: return "failed";
  default: return "unknown";
  }
}

const char *sched_worker_state_name(sched_worker_state s) {
  switch (s) {
  case SCHED_WORKER_REGISTERED: return "registered";
  case SCHED_WORKER_READY: return "ready";
  case SCHED_WORKER_BUSY: return "busy";
  case SCHED_WORKER_LOST: return "lost";
  default: return "unknown";
  }
}

const char *sched_abort_reason_name(sched_abort_reason r) {
  switch (r) {
  case SCHED_ABORT_ERROR: return "error";
  case SCHED_ABORT_ACK_TIMEOUT: return "ack_timeout";
  case SCHED_ABORT_BROADCAST_TIMEOUT: return "broadcast_timeout";
  case SCHED_ABORT_PARTICIPANT_LOST: return "participant_lost";
  case SCHED_ABORT_REFUSED: return "refused";
  case SCHED_ABORT_STOP: return "stop";
  }
  return "unknown";
}

const char *sched_role_name(sched_role r) {
  switch (r) {
  case SCHED_ROLE_TRAINER: return "trainer";
  case SCHED_ROLE_INFERENCE: return "inference";
  default: return "unknown";
  }
}

/* ---- settings ---------------------------------------------------------------- */

void sched_settings_default(sched_settings *s) {
  memset(s, 0, sizeof *s);
  snprintf(s->run_id, sizeof s->run_id, "run");
  s->steps = 0;
  s->rollouts_per_step = 8;
  s->group_size = 1;
  s->max_async_level = 1;
  s->max_outstanding = 8;
  s->max_buffered = 0;
  s->policy = SCHED_MODE_AUTO;
  s->plan_ack_timeout_ms = 30000;
  s->broadcast_timeout_ms = 300000;
  s->heartbeat_timeout_ms = 15000;
  s->request_timeout_ms = 0;
}

static int sched__bad(char *err, size_t errlen, const char *msg) {
  if (err && errlen) snprintf(err, errlen, "%s", msg);
  return SCHED_EINVAL;
}

int sched_settings_validate(const sched_settings *s, char *err, size_t errlen) {
  if (!s) return sched__bad(err, errlen, "settings: NULL");
  if (memchr(s->run_id, '\0', sizeof s->run_id) == NULL)
    return sched__bad(err, errlen, "run_id: not NUL-terminated");
  if (s->run_id[0] == '\0') return sched__bad(err, errlen, "run_id: empty");
  if (s->rollouts_per_step == 0) return sched__bad(err, errlen, "rollouts_per_step: must be >= 1");
  if (s->group_size == 0) return sched__bad(err, errlen, "group_size: must be >= 1");
  /* Batches are whole groups: a remainder could never be filled. */
  if (s->rollouts_per_step % s->group_size != 0) {
    if (err && errlen)
      snprintf(err, errlen, "rollouts_per_step: %" PRIu32 " is not a multiple of group_size %" PRIu32,
               s->rollouts_per_step, s->group_size);
    return SCHED_EINVAL;
  }
  if (s->max_outstanding == 0) return sched__bad(err, errlen, "max_outstanding: must be >= 1");
  if (s->policy < SCHED_MODE_AUTO || s->policy > SCHED_MODE_HOST)
    return sched__bad(err, errlen, "policy: not auto, direct, staged or host");
  if (s->plan_ack_timeout_ms <= 0)
    return sched__bad(err, errlen, "plan_ack_timeout_ms: must be > 0");
  if (s->broadcast_timeout_ms <= 0)
    return sched__bad(err, errlen, "broadcast_timeout_ms: must be > 0");
  if (s->heartbeat_timeout_ms <= 0)
    return sched__bad(err, errlen, "heartbeat_timeout_ms: must be > 0");
  if (s->request_timeout_ms < 0)
    return sched__bad(err, errlen, "request_timeout_ms: must be >= 0 (0: never re-send)");
  /* rollouts_per_step is a multiple of group_size, so a whole group fits too. */
  if (s->max_buffered && s->max_buffered < s->rollouts_per_step)
    return sched__bad(err, errlen, "max_buffered: smaller than rollouts_per_step, no batch could form");
  return SCHED_OK;
}

/* ---- the mode choice ----------------------------------------------------------- */

/* Names the first participant (rank order) lacking CUDA or NCCL into `what`;
 * returns how many lack either. CUDA is named before NCCL: without a device
 * NCCL is moot. */
static size_t sched__missing(const sched_participant *parts, size_t n, char *what, size_t len) {
  size_t missing = 0;
  for (size_t i = 0; i < n; i++) {
    const char *cap = parts[i].caps.cuda_devices == 0 ? "CUDA" : !parts[i].caps.nccl ? "NCCL" : NULL;
    if (!cap) continue;
    if (missing == 0) {
      const char *name = parts[i].name && parts[i].name[0] ? parts[i].name : "?";
      snprintf(what, len, "%s missing on %s", cap, name);
    }
    missing++;
  }
  if (missing > 1) {
    size_t used = strlen(what);
    if (used < len) snprintf(what + used, len - used, " (and %zu more)", missing - 1);
  }
  return missing;
}

int sched_choose_mode(sched_mode policy, const sched_participant *parts, size_t n,
                      const sched_offload *off, sched_mode *mode, char *reason,
                      size_t reason_len) {
  char buf[SCHED_TEXT_MAX] = "";
  int rc = SCHED_OK;
  sched_mode m = policy;
  uint64_t host_t = 0, total_t = 0;
  if (off) {
    host_t = (uint64_t)off->pinned_tensors + off->pageable_tensors;
    total_t = host_t + off->gpu_tensors;
  }
  if (policy < SCHED_MODE_AUTO || policy > SCHED_MODE_HOST) {
    snprintf(buf, sizeof buf, "unknown broadcast policy %d", (int)policy);
    rc = SCHED_EINVAL;
  } else if (n == 0 || !parts) {
    snprintf(buf, sizeof buf, "no participants for the broadcast");
    rc = SCHED_EINVAL;
  } else if (total_t == 0) {
    snprintf(buf, sizeof buf, "manifest has no tensors to broadcast");
    rc = SCHED_EINVAL;
  } else {
    char miss[SCHED_TEXT_MAX] = "";
    size_t nmiss = sched__missing(parts, n, miss, sizeof miss);
    uint64_t host_b = off->pinned_bytes + off->pageable_bytes;
    switch (policy) {
    case SCHED_MODE_AUTO:
      if (nmiss) {
        m = SCHED_MODE_HOST;
        snprintf(buf, sizeof buf, "%s", miss);
      } else if (host_t) {
        m = SCHED_MODE_STAGED;
        snprintf(buf, sizeof buf,
                 "%" PRIu64 " of %" PRIu64 " tensors host-resident (%" PRIu32 " pinned, %" PRIu32
                 " pageable, %" PRIu64 " bytes)",
                 host_t, total_t, off->pinned_tensors, off->pageable_tensors, host_b);
      } else {
        m = SCHED_MODE_DIRECT;
        snprintf(buf, sizeof buf, "all %" PRIu64 " tensors on GPU", total_t);
      }
      break;
    case SCHED_MODE_DIRECT:
    case SCHED_MODE_STAGED:
      if (nmiss) {
        /* The list is cut to what fits in a reason beside the sentence. */
        snprintf(buf, sizeof buf,
                 "operator override %s needs CUDA and NCCL on every participant: %.180s",
                 sched_mode_name(policy), miss);
        rc = SCHED_ENOTSUP;
      } else if (policy == SCHED_MODE_DIRECT && host_t) {
        snprintf(buf, sizeof buf,
                 "operator override direct needs every tensor on GPU: %" PRIu64 " of %" PRIu64
                 " tensors are host-resident",
                 host_t, total_t);
        rc = SCHED_ENOTSUP;
      } else {
        snprintf(buf, sizeof buf, "operator override: %s", sched_mode_name(policy));
      }
      break;
    case SCHED_MODE_HOST:
      snprintf(buf, sizeof buf, "operator override: host");
      break;
    }
  }
  if (mode) *mode = m;
  if (reason && reason_len) snprintf(reason, reason_len, "%s", buf);
  return rc;
}
