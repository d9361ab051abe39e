/* The scheduler's pure helpers: names, settings, the mode choice. No state. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
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
  case SCHED_MODE_COLOCATED: return "colocated";
  default: return "unknown";
  }
}

int sched_mode_parse(const char *s, sched_mode *out) {
  static const sched_mode all[] = {SCHED_MODE_AUTO, SCHED_MODE_DIRECT, SCHED_MODE_STAGED,
                                   SCHED_MODE_HOST, SCHED_MODE_COLOCATED};
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
  if (s->policy < SCHED_MODE_AUTO || s->policy > SCHED_MODE_COLOCATED)
    return sched__bad(err, errlen, "policy: not auto, direct, staged, host or colocated");
  if (s->plan_ack_timeout_ms <= 0)
    return sched__bad(err, errlen, "plan_ack_timeout_ms: must be > 0");
  if (s->broadcast_timeout_ms <= 0)
    return sched__bad(err, errlen, "broadcast_timeout_ms: must be > 0");
  if (s->heartbeat_timeout_ms <= 0)
    return sched__bad(err, errlen, "heartbeat_timeout_ms: must be > 0");
  if (s->request_timeout_ms < 0)
    return sched__bad(err, errlen, "request_timeout_ms: must be >= 0 (0: never re-send)");
  if (s->resumes == 0 && s->steps_done != 0)
    return sched__bad(err, errlen, "steps_done: only a resumed run (resumes >= 1) starts past step 0");
  /* Request and group ids of resume K start at K * 2^40 + 1: K stays far below 2^24. */
  if (s->resumes >= (1u << 23))
    return sched__bad(err, errlen, "resumes: too many (request ids would run out)");
  if (s->steps && s->steps_done >= s->steps) {
    if (err && errlen)
      snprintf(err, errlen, "steps_done: %" PRIu64 " of the run's %" PRIu64 " steps: none left to take",
               s->steps_done, s->steps);
    return SCHED_EINVAL;
  }
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

/* Two participants share a GPU when both name the same one on the same host:
 * a UUID alone could repeat across machines only by accident, a host alone
 * says nothing about devices. Workers that report neither never match. */
static int sched__same_gpu(const sched_caps *a, const sched_caps *b) {
  return a->cuda_devices > 0 && b->cuda_devices > 0 && a->gpu_uuid[0] && a->host_id[0] &&
         !strcmp(a->gpu_uuid, b->gpu_uuid) && !strcmp(a->host_id, b->host_id);
}

static const char *sched__pname(const sched_participant *p) {
  return p->name && p->name[0] ? p->name : "?";
}

/* Appends to `buf` what fits. */
static void sched__cat(char *buf, size_t len, const char *fmt, const char *a, const char *b) {
  size_t used = strlen(buf);
  if (used + 1 < len) snprintf(buf + used, len - used, fmt, a, b);
}

/* Lists the receivers (parts[1..]) not on the trainer's GPU into `what`;
 * returns how many. */
static size_t sched__not_colocated(const sched_participant *parts, size_t n, char *what,
                                   size_t len) {
  size_t count = 0;
  what[0] = '\0';
  for (size_t i = 1; i < n; i++) {
    if (sched__same_gpu(&parts[0].caps, &parts[i].caps)) continue;
    const sched_caps *c = &parts[i].caps;
    if (count) sched__cat(what, len, "%s%s", ", ", "");
    if (c->cuda_devices == 0 || !c->gpu_uuid[0])
      sched__cat(what, len, "%s reports no GPU%s", sched__pname(&parts[i]), "");
    else if (strcmp(c->host_id, parts[0].caps.host_id) != 0)
      sched__cat(what, len, "%s is on another host%s", sched__pname(&parts[i]), "");
    else
      sched__cat(what, len, "%s is on %s", sched__pname(&parts[i]), c->gpu_uuid);
    count++;
  }
  return count;
}

static int sched__shared_gpu_say(const sched_participant *parts, size_t i, size_t j, char *what,
                                 size_t len) {
  snprintf(what, len, "%s and %s share GPU %s", sched__pname(&parts[i]), sched__pname(&parts[j]),
           parts[i].caps.gpu_uuid);
  return 1;
}

/* A participant that names its GPU and host, with its place: what the sort
 * of sched__shared_gpu orders. */
typedef struct sched__gpu_ref {
  const sched_caps *caps;
  size_t i;
} sched__gpu_ref;

static int sched__gpu_ref_cmp(const void *a, const void *b) {
  const sched__gpu_ref *x = a, *y = b;
  int c = strcmp(x->caps->host_id, y->caps->host_id);
  if (!c) c = strcmp(x->caps->gpu_uuid, y->caps->gpu_uuid);
  return c ? c : (x->i > y->i) - (x->i < y->i);
}

/* Names the first two participants sharing a GPU into `what` (the smallest
 * i with a j > i on its GPU, then the smallest such j); 1 when found. A plan
 * has every inference worker of the run among its participants, so the
 * pairs are not compared one by one (10,000 workers: 5e7 pairs a step):
 * sorted by host, GPU and place, each GPU's first two are adjacent. Out of
 * memory, the pairs are compared after all. */
static int sched__shared_gpu(const sched_participant *parts, size_t n, char *what, size_t len) {
  sched__gpu_ref *v = n ? malloc(n * sizeof *v) : NULL;
  if (!v) {
    for (size_t i = 0; i < n; i++)
      for (size_t j = i + 1; j < n; j++)
        if (sched__same_gpu(&parts[i].caps, &parts[j].caps))
          return sched__shared_gpu_say(parts, i, j, what, len);
    return 0;
  }
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if (sched__same_gpu(&parts[i].caps, &parts[i].caps)) /* it names its GPU and host */
      v[m++] = (sched__gpu_ref){&parts[i].caps, i};
  qsort(v, m, sizeof *v, sched__gpu_ref_cmp);
  size_t best = n, second = n;
  for (size_t k = 0; k + 1 < m; k++) {
    /* v[k] opens its GPU's run when the one before is on another GPU. */
    if (k && sched__same_gpu(v[k - 1].caps, v[k].caps)) continue;
    if (sched__same_gpu(v[k].caps, v[k + 1].caps) && v[k].i < best) {
      best = v[k].i;
      second = v[k + 1].i;
    }
  }
  free(v);
  return best < n ? sched__shared_gpu_say(parts, best, second, what, len) : 0;
}

/* The first receiver that holds part of the model, or NULL. */
static const sched_participant *sched__holding_part(const sched_participant *parts, size_t n) {
  uint32_t ns = parts[0].caps.trainer_ranks > 1 ? parts[0].caps.trainer_ranks : 1;
  for (size_t i = ns; i < n; i++)
    if (parts[i].caps.holds_part) return &parts[i];
  return NULL;
}

/* The first participant not on parts[0]'s GPU (parts[0] without one: parts[0]
 * itself), or NULL when every one shares it. */
static const sched_participant *sched__off_shared_gpu(const sched_participant *parts, size_t n) {
  const sched_caps *c = &parts[0].caps;
  if (c->cuda_devices == 0 || !c->gpu_uuid[0] || !c->host_id[0]) return &parts[0];
  for (size_t i = 1; i < n; i++)
    if (!sched__same_gpu(c, &parts[i].caps)) return &parts[i];
  return NULL;
}

int sched_choose_mode(sched_mode policy, const sched_participant *parts, size_t n,
                      const sched_offload *off, sched_mode *mode, char *reason,
                      size_t reason_len) {
  char buf[SCHED_TEXT_MAX] = "";
  int rc = SCHED_OK;
  sched_mode m = policy;
  const sched_participant *part = NULL;
  uint64_t host_t = 0, total_t = 0;
  if (off) {
    host_t = (uint64_t)off->pinned_tensors + off->pageable_tensors;
    total_t = host_t + off->gpu_tensors;
  }
  if (policy < SCHED_MODE_AUTO || policy > SCHED_MODE_COLOCATED) {
    snprintf(buf, sizeof buf, "unknown broadcast policy %d", (int)policy);
    rc = SCHED_EINVAL;
  } else if (n == 0 || !parts) {
    snprintf(buf, sizeof buf, "no participants for the broadcast");
    rc = SCHED_EINVAL;
  } else if (total_t == 0) {
    snprintf(buf, sizeof buf, "manifest has no tensors to broadcast");
    rc = SCHED_EINVAL;
  } else if ((part = sched__holding_part(parts, n)) != NULL) {
    /* Views (each receiver only its part) are cut on the host transport's
     * per-receiver streams; a broadcast or a colocated write moves whole
     * buckets. */
    if (policy == SCHED_MODE_AUTO || policy == SCHED_MODE_HOST) {
      m = SCHED_MODE_HOST;
      snprintf(buf, sizeof buf, "%s%.100s holds part of the model: receivers' parts run on the "
               "host transport", policy == SCHED_MODE_HOST ? "operator override: host; " : "",
               sched__pname(part));
    } else {
      snprintf(buf, sizeof buf, "operator override %s cannot serve %.100s, which holds part of "
               "the model: receivers' parts run on the host transport only",
               sched_mode_name(policy), sched__pname(part));
      rc = SCHED_ENOTSUP;
    }
  } else if (parts[0].caps.trainer_ranks > 1) {
    uint32_t ns = parts[0].caps.trainer_ranks;
    /* Buckets from several roots at once: the host transport's parallel
     * streams, or every rank writing its own slices on one GPU; an NCCL
     * broadcast has one root. */
    const sched_participant *off_gpu = sched__off_shared_gpu(parts, n);
    if (n <= ns) {
      snprintf(buf, sizeof buf, "%" PRIu32 " trainer ranks and %zu participants: no receiver",
               ns, n);
      rc = SCHED_EINVAL;
    } else if ((policy == SCHED_MODE_AUTO || policy == SCHED_MODE_COLOCATED) && !off_gpu) {
      m = SCHED_MODE_COLOCATED;
      snprintf(buf, sizeof buf, "%s%" PRIu32 " trainer ranks and all %zu receivers share GPU %s",
               policy == SCHED_MODE_COLOCATED ? "operator override: colocated; " : "", ns, n - ns,
               parts[0].caps.gpu_uuid);
    } else if (policy == SCHED_MODE_AUTO || policy == SCHED_MODE_HOST) {
      m = SCHED_MODE_HOST;
      snprintf(buf, sizeof buf, "%s%" PRIu32 " trainer ranks: several sources run on the host "
               "transport", policy == SCHED_MODE_HOST ? "operator override: host; " : "", ns);
    } else if (policy == SCHED_MODE_COLOCATED) {
      snprintf(buf, sizeof buf,
               "operator override colocated cannot run %" PRIu32 " trainer ranks: %.60s does "
               "not share %.60s's GPU",
               ns, sched__pname(off_gpu), sched__pname(&parts[0]));
      rc = SCHED_ENOTSUP;
    } else {
      snprintf(buf, sizeof buf,
               "operator override %s cannot run %" PRIu32 " trainer ranks: several sources run "
               "on the host transport, or colocated on one GPU",
               sched_mode_name(policy), ns);
      rc = SCHED_ENOTSUP;
    }
  } else {
    char miss[SCHED_TEXT_MAX] = "";
    size_t nmiss = sched__missing(parts, n, miss, sizeof miss);
    char far[SCHED_TEXT_MAX] = "", share[SCHED_TEXT_MAX] = "";
    size_t nfar = sched__not_colocated(parts, n, far, sizeof far);
    int shared = sched__shared_gpu(parts, n, share, sizeof share);
    uint64_t host_b = off->pinned_bytes + off->pageable_bytes;
    switch (policy) {
    case SCHED_MODE_AUTO:
      if (n >= 2 && nfar == 0) {
        m = SCHED_MODE_COLOCATED;
        snprintf(buf, sizeof buf, "all %zu receivers share the trainer's GPU %s", n - 1,
                 parts[0].caps.gpu_uuid);
      } else if (nmiss) {
        m = SCHED_MODE_HOST;
        snprintf(buf, sizeof buf, "%s", miss);
      } else if (shared) {
        /* NCCL refuses two ranks on one device, and colocated mode needs all
         * receivers on the trainer's GPU: only the host transport is left. */
        m = SCHED_MODE_HOST;
        snprintf(buf, sizeof buf, "%.120s, but %.100s: NCCL needs a GPU per rank", share, far);
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
      } else if (shared) {
        snprintf(buf, sizeof buf, "operator override %s needs a GPU per participant (NCCL): %.160s",
                 sched_mode_name(policy), share);
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
    case SCHED_MODE_COLOCATED:
      if (n < 2) {
        snprintf(buf, sizeof buf, "operator override colocated needs at least one receiver");
        rc = SCHED_ENOTSUP;
      } else if (parts[0].caps.cuda_devices == 0 || !parts[0].caps.gpu_uuid[0] ||
                 !parts[0].caps.host_id[0]) {
        snprintf(buf, sizeof buf,
                 "operator override colocated needs the trainer on a GPU: %.100s reports no GPU "
                 "UUID or host id",
                 sched__pname(&parts[0]));
        rc = SCHED_ENOTSUP;
      } else if (nfar) {
        /* A plan partly colocated is refused rather than split between CUDA
         * IPC and NCCL: one transport per plan keeps the barrier simple. */
        snprintf(buf, sizeof buf,
                 "operator override colocated needs every receiver on the trainer's GPU %s: "
                 "%.120s",
                 parts[0].caps.gpu_uuid, far);
        rc = SCHED_ENOTSUP;
      } else {
        snprintf(buf, sizeof buf, "operator override: colocated (all %zu receivers on GPU %s)",
                 n - 1, parts[0].caps.gpu_uuid);
      }
      break;
    }
  }
  if (mode) *mode = m;
  if (reason && reason_len) snprintf(reason, reason_len, "%s", buf);
  return rc;
}
