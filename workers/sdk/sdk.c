/* librlorch: a worker of the embedding SDK (include/rlorch/rlorch.h).
 *
 * The worker protocol is the agents' (agent_core): registration, the Attach
 * stream, heartbeats, reports with retries and re-registration. A command
 * thread of the library runs agent_run; its command function executes plans,
 * triggers and plan aborts itself (agent_xfer, bound to the caller's tensors)
 * and queues the rest for rlorch_next. A train step keeps that thread waiting
 * until the caller reports it, as rlorch's own trainer executes its step on
 * that thread: nothing the orchestrator sends after the step (the broadcast of
 * its weights) runs before the step is done. Generation requests do not wait:
 * the caller serves several at once, and a broadcast queued behind them
 * starts as soon as the caller's before-callback returns. */
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "build_info.h"
#include "workers/agent/agent_batch.h"
#include "workers/agent/agent_log.h"
#include "workers/agent/agent_pb.h"
#include "workers/agent/agent_weights.h"
#include "workers/sdk/sdk_internal.h"

#ifdef RLORCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---- version, status names, the log ----------------------------------------- */

SDK__EXPORT uint32_t rlorch_version(const char **release) {
  if (release) *release = RLORCH_VERSION;
  return RLORCH_API_VERSION;
}

SDK__EXPORT const char *rlorch_status_name(int code) {
  switch (code) {
  case RLORCH_OK: return "RLORCH_OK";
  case RLORCH_TIMEOUT: return "RLORCH_TIMEOUT";
  case RLORCH_E_INVALID: return "RLORCH_E_INVALID";
  case RLORCH_E_VERSION: return "RLORCH_E_VERSION";
  case RLORCH_E_STATE: return "RLORCH_E_STATE";
  case RLORCH_E_STOPPED: return "RLORCH_E_STOPPED";
  case RLORCH_E_REFUSED: return "RLORCH_E_REFUSED";
  case RLORCH_E_UNAVAILABLE: return "RLORCH_E_UNAVAILABLE";
  case RLORCH_E_NOMEM: return "RLORCH_E_NOMEM";
  case RLORCH_E_IO: return "RLORCH_E_IO";
  }
  return "?";
}

/* The agents log through one process-wide callback (agent_log.h): this one
 * formats the fields and hands them to the caller's. */
static rlorch_log_fn sdk__log_fn;
static void *sdk__log_ud;

static void sdk__log(void *ud, agent_log_level level, const char *event, const char *fields,
                     va_list ap) {
  (void)ud;
  rlorch_log_fn fn = sdk__log_fn;
  if (!fn) return;
  char buf[2048] = "";
  if (fields) vsnprintf(buf, sizeof buf, fields, ap);
  fn(sdk__log_ud, (rlorch_log_level)level, event, buf);
}

/* ---- commands ------------------------------------------------------------------ */

/* A generation request is no longer in flight here (the worker's figures). */
static void sdk__settle_cmd(sdk_cmd *c) {
  if (c->active && !atomic_exchange(&c->settled, 1)) atomic_fetch_sub(&c->active->n, 1);
}

static void sdk__active_put(sdk_active *a) {
  if (a && atomic_fetch_sub(&a->refs, 1) == 1) free(a);
}

static void sdk__cmd_free(sdk_cmd *c) {
  if (!c) return;
  sdk__settle_cmd(c);
  sdk__active_put(c->active);
  if (c->msg) protobuf_c_message_free_unpacked(&c->msg->base, NULL);
  free(c);
}

SDK__EXPORT void rlorch_command_free(rlorch_command *cmd) { sdk__cmd_free((sdk_cmd *)cmd); }

/* A deep copy through the wire format: the command owns all it points to. */
static sdk_cmd *sdk__cmd_new(const Rlorch__V1__Command *m, rlorch_command_kind kind) {
  sdk_cmd *c = calloc(1, sizeof *c);
  size_t n = rlorch__v1__command__get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  if (c && buf) {
    rlorch__v1__command__pack(m, buf);
    c->msg = rlorch__v1__command__unpack(NULL, n, buf);
  }
  free(buf);
  if (!c || !c->msg) {
    sdk__cmd_free(c);
    return NULL;
  }
  const Rlorch__V1__Command *k = c->msg;
  rlorch_command *p = &c->pub;
  p->kind = kind;
  p->run_id = k->run_id ? k->run_id : "";
  if (kind == RLORCH_CMD_GENERATE) {
    const Rlorch__V1__RolloutRequest *r = k->rollout;
    p->generate.request_id = r->request_id;
    /* An orchestrator that does not number groups: one request is one group. */
    p->generate.group_id = r->group_id ? r->group_id : r->request_id;
    p->generate.count = r->count;
    p->generate.prompt_token_ids = r->prompt_token_ids;
    p->generate.n_prompt_token_ids = r->n_prompt_token_ids;
    p->generate.prompt_metadata = r->prompt_metadata.data;
    p->generate.n_prompt_metadata = r->prompt_metadata.len;
    p->generate.sampling.temperature = 1.0;
    if (r->sampling) {
      p->generate.sampling.temperature = r->sampling->temperature;
      p->generate.sampling.top_p = r->sampling->top_p;
      p->generate.sampling.top_k = (int32_t)r->sampling->top_k;
      p->generate.sampling.max_tokens = r->sampling->max_tokens;
      p->generate.sampling.stop_token_ids = r->sampling->stop_token_ids;
      p->generate.sampling.n_stop_token_ids = r->sampling->n_stop_token_ids;
      p->generate.sampling.seed = r->sampling->seed;
    }
  } else if (kind == RLORCH_CMD_TRAIN) {
    p->train.step = k->train->step;
    p->train.seed = k->train->seed;
    p->train.n_rollouts = k->train->n_rollout_ids;
    p->train.groups = k->train->groups;
    p->train.group_size = k->train->group_size;
  } else if (kind == RLORCH_CMD_ABORT) {
    p->abort.request_id = k->abort->request_id;
    p->abort.reason = k->abort->reason ? k->abort->reason : "";
  } else if (kind == RLORCH_CMD_SHUTDOWN) {
    p->shutdown_reason = k->shutdown && k->shutdown->reason ? k->shutdown->reason : "";
  }
  return c;
}

/* Queues a command for rlorch_next; -1 (fatal: the worker stops) when out
 * of memory, for a command lost silently would leave the orchestrator
 * waiting on it. */
static int sdk__queue(rlorch_worker *w, const Rlorch__V1__Command *m, rlorch_command_kind kind) {
  sdk_cmd *c = sdk__cmd_new(m, kind);
  if (!c) {
    agent_log_error("fatal", "reason=\"no memory to queue command %llu\"", (unsigned long long)m->seq);
    return -1;
  }
  c->t0 = agent_now();
  c->registration = agent_registration(w->a);
  if (kind == RLORCH_CMD_GENERATE) {
    c->active = w->active;
    atomic_fetch_add(&w->active->refs, 1);
    atomic_fetch_add(&w->active->n, 1);
  }
  pthread_mutex_lock(&w->mu);
  if (w->tail) w->tail->next = c;
  else w->head = c;
  w->tail = c;
  if (kind == RLORCH_CMD_TRAIN) {
    w->train_waiting = 1;
    w->train_step = m->train->step;
    w->train_fetched = w->train_skip = w->train_fail = 0;
  }
  pthread_cond_broadcast(&w->cond);
  pthread_mutex_unlock(&w->mu);
  return 0;
}

/* The command thread waits for the caller's report of the train step. */
static int sdk__await_step(rlorch_worker *w) {
  pthread_mutex_lock(&w->mu);
  while (w->train_waiting && !agent_stopping(w->a)) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += 1; /* a stop wakes no condition of ours: look again each second */
    pthread_cond_timedwait(&w->cond, &w->mu, &ts);
  }
  int fail = w->train_fail;
  w->train_waiting = 0;
  pthread_mutex_unlock(&w->mu);
  return fail ? -1 : 0;
}

static int sdk__command(agent *a, const Rlorch__V1__Command *cmd, void *ud) {
  rlorch_worker *w = ud;
  int trainer = w->ao.role == AGENT_ROLE_TRAINER;
  switch (cmd->kind_case) {
  case RLORCH__V1__COMMAND__KIND_ROLLOUT:
    if (trainer) {
      agent_log_warn("command_ignored", "kind=rollout reason=\"a trainer makes no rollouts\"");
      return 0;
    }
    return sdk__queue(w, cmd, RLORCH_CMD_GENERATE);
  case RLORCH__V1__COMMAND__KIND_TRAIN:
    if (!trainer) {
      agent_log_warn("command_ignored", "kind=train reason=\"an inference worker does not train\"");
      return 0;
    }
    if (sdk__queue(w, cmd, RLORCH_CMD_TRAIN)) return -1;
    return sdk__await_step(w);
  case RLORCH__V1__COMMAND__KIND_PLAN: agent_xfer_on_plan(&w->xfer, a, cmd); return 0;
  case RLORCH__V1__COMMAND__KIND_TRIGGER: agent_xfer_on_trigger(&w->xfer, a, cmd); return 0;
  case RLORCH__V1__COMMAND__KIND_ABORT: {
    const Rlorch__V1__AbortCommand *ab = cmd->abort;
    if (!ab) return 0;
    if (ab->request_id && !trainer && sdk__queue(w, cmd, RLORCH_CMD_ABORT)) return -1;
    /* Not for a request only: an abort without a plan id drops whatever plan
     * is pending. */
    if ((ab->plan_id && ab->plan_id[0]) || !ab->request_id) agent_xfer_on_abort(&w->xfer, cmd);
    return 0;
  }
  case RLORCH__V1__COMMAND__KIND_SHUTDOWN:
    agent_log_info("shutdown", "reason=\"%s\"", cmd->shutdown->reason ? cmd->shutdown->reason : "");
    if (sdk__queue(w, cmd, RLORCH_CMD_SHUTDOWN)) return -1;
    return 1;
  default:
    agent_log_warn("command_ignored", "kind=%d reason=\"unknown command\"", (int)cmd->kind_case);
    return 0;
  }
}

/* ---- the broadcast, bound to the caller's tensors -------------------------------- */

/* Grows the receiver's bound arrays to n tensors. */
static int sdk__bound_room(rlorch_worker *w, size_t n, bcast_err *err) {
  if (n <= w->bound_cap) return 0;
  bcast_tensor *b = realloc(w->bound, n * sizeof *b);
  if (b) w->bound = b;
  rlorch_tensor *pb = b ? realloc(w->pub_bound, n * sizeof *pb) : NULL;
  if (!pb) {
    err->code = BCAST_ENOMEM;
    snprintf(err->msg, sizeof err->msg, "no memory to bind %zu tensors", n);
    return BCAST_ENOMEM;
  }
  w->pub_bound = pb;
  w->bound_cap = n;
  return 0;
}

/* The part of tensor `name` options.parts declares (WHOLE when not listed). */
static bcast_part sdk__declared(const rlorch_worker *w, const char *name) {
  for (size_t i = 0; i < w->nparts; i++)
    if (!strcmp(w->parts[i].name, name)) return w->parts[i].part;
  return (bcast_part){.kind = BCAST_PART_WHOLE};
}

/* Whether options.parts holds anything but whole tensors. */
static int sdk__partial(const rlorch_worker *w) {
  for (size_t i = 0; i < w->nparts; i++)
    if (w->parts[i].part.kind != BCAST_PART_WHOLE) return 1;
  return 0;
}

/* The plan gives this rank a view, or none when it holds every tensor
 * whole. Memory sized for options.parts must never take a whole tensor: a
 * partial worker's plan without a view is refused before anything is bound
 * (the orchestrator planned it from other parts than these). */
static int sdk__viewed(const rlorch_worker *w, const bcast_plan *p, uint32_t rank, bcast_err *err) {
  int viewed = bcast_plan_rank_view(p, rank) != BCAST_VIEW_WHOLE;
  if (!viewed && sdk__partial(w)) {
    err->code = BCAST_EINVAL;
    snprintf(err->msg, sizeof err->msg, "the plan gives receiver rank %u every tensor whole, but "
             "options.parts says this worker holds only part of some tensors", rank);
    return -1;
  }
  return viewed;
}

/* on_bind: the caller places the plan's tensors (those it holds part of,
 * with a view); what it sets (residency, device, data) is checked as
 * options.tensors are, and what it holds against the plan's view. */
static int sdk__bind_caller(rlorch_worker *w, const bcast_plan *p, uint32_t rank, bcast_err *err) {
  int viewed = sdk__viewed(w, p, rank, err);
  if (viewed < 0) return BCAST_EINVAL;
  int rc = sdk__bound_room(w, p->ntensors, err);
  if (rc) return rc;
  /* The caller's k-th tensor is the plan's k-th one it holds (NONE ones
   * left out); both loops below skip the same ones. */
  size_t k = 0;
  for (size_t i = 0; i < p->ntensors; i++) {
    const bcast_tensor *pt = &p->tensors[i];
    if (viewed && bcast_plan_part(p, rank, i)->kind == BCAST_PART_NONE) continue;
    w->pub_bound[k++] = (rlorch_tensor){.name = pt->name, .layer = pt->layer,
                                      .storage_dtype = (rlorch_dtype)pt->wire_dtype,
                                      .wire_dtype = (rlorch_dtype)pt->wire_dtype,
                                      .ndim = pt->ndim, .shape = pt->shape,
                                      .residency = w->device >= 0 ? RLORCH_RES_GPU : RLORCH_RES_HOST_PAGEABLE,
                                      .device = w->device};
  }
  size_t nheld = k;
  char msg[256] = "";
  if (w->so.o.on_bind(w->so.o.bind_ud, p->policy_version, w->pub_bound, nheld, msg, sizeof msg)) {
    err->code = BCAST_EINVAL;
    snprintf(err->msg, sizeof err->msg, "on_bind refused the plan: %s", msg[0] ? msg : "no reason given");
    return BCAST_EINVAL;
  }
  for (size_t i = 0, j = 0; i < p->ntensors; i++) {
    if (viewed && bcast_plan_part(p, rank, i)->kind == BCAST_PART_NONE) continue;
    const rlorch_tensor *in = &w->pub_bound[j];
    bcast_tensor *out = &w->bound[j++];
    *out = p->tensors[i];
    out->storage_dtype = out->wire_dtype;
    /* What the caller placed memory for, which the view must equal. */
    if (viewed) out->part = sdk__declared(w, out->name);
    out->residency = (bcast_residency)in->residency;
    out->device = in->residency == RLORCH_RES_GPU ? in->device : -1;
    out->data = in->data;
    const char *bad = !in->data ? "data is NULL"
                      : in->residency < RLORCH_RES_GPU || in->residency > RLORCH_RES_HOST_PAGEABLE
                          ? "residency: unknown value"
                      : in->residency == RLORCH_RES_GPU && in->device != w->device
                          ? "on another GPU than options.device"
                          : NULL;
    if (bad) {
      err->code = BCAST_EINVAL;
      snprintf(err->msg, sizeof err->msg, "on_bind: tensors[%zu] '%s': %s", j - 1, p->tensors[i].name, bad);
      return BCAST_EINVAL;
    }
  }
  w->nbound = nheld;
  return viewed ? bcast_plan_check_receiver(p, rank, w->bound, w->nbound, err)
                : bcast_plan_check_local(p, w->bound, w->nbound, 0, err);
}

/* A receiver of a view: the caller's tensors it holds part of, in the
 * plan's order (NONE ones left out), each with the part options.parts gave
 * it; bcast_plan_check_receiver refuses any that differs from the view. */
static int sdk__bind_view(rlorch_worker *w, const bcast_plan *p, uint32_t rank, bcast_err *err) {
  int rc = sdk__bound_room(w, p->ntensors, err);
  if (rc) return rc;
  size_t k = 0;
  for (size_t i = 0; i < p->ntensors; i++) {
    if (bcast_plan_part(p, rank, i)->kind == BCAST_PART_NONE) continue;
    for (size_t j = 0; j < w->n; j++)
      if (!strcmp(w->t[j].name, p->tensors[i].name)) {
        w->bound[k++] = w->t[j];
        break;
      }
  }
  w->nbound = k;
  return bcast_plan_check_receiver(p, rank, w->bound, w->nbound, err);
}

/* The plan the broadcast callbacks are about (rlorch_broadcast_id); NULL: none. */
static void sdk__bcast_id(rlorch_worker *w, const bcast_plan *p) {
  pthread_mutex_lock(&w->mu);
  snprintf(w->bcast_id, sizeof w->bcast_id, "%s", p ? p->id : "");
  pthread_mutex_unlock(&w->mu);
}

/* The sender sends the caller's tensors as they are; a receiver's are
 * gathered in the plan's order (its checksum's order), pointing at the
 * caller's memory (or where on_bind put them): the engine writes straight
 * into it. */
static int sdk__bind(void *ud, const bcast_plan *p, uint32_t rank, bcast_tensor **local,
                     size_t *n, bcast_err *err) {
  rlorch_worker *w = ud;
  int sender = w->ao.role == AGENT_ROLE_TRAINER;
  if (!sender && w->so.o.on_bind) {
    sdk__bcast_id(w, p);
    int rc = sdk__bind_caller(w, p, rank, err);
    sdk__bcast_id(w, NULL);
    *local = w->bound;
    *n = w->nbound;
    return rc;
  }
  if (!sender) {
    int viewed = sdk__viewed(w, p, rank, err);
    if (viewed < 0) return BCAST_EINVAL;
    if (viewed) {
      int rc = sdk__bind_view(w, p, rank, err);
      *local = w->bound;
      *n = w->nbound;
      return rc;
    }
  }
  /* A trainer group's rank sends only its own part (it may hold shards). */
  int rc = sender && bcast_plan_sources(p) > 1
               ? bcast_plan_check_source(p, w->so.o.trainer_rank, w->t, w->n, err)
               : bcast_plan_check_local(p, w->t, w->n, sender, err);
  if (rc) return rc;
  if (sender) {
    *local = w->t;
    *n = w->n;
    return 0;
  }
  if ((rc = sdk__bound_room(w, p->ntensors, err))) return rc;
  for (size_t i = 0; i < p->ntensors; i++)
    for (size_t j = 0; j < w->n; j++)
      if (!strcmp(w->t[j].name, p->tensors[i].name)) {
        w->bound[i] = w->t[j];
        break;
      }
  w->nbound = p->ntensors;
  *local = w->bound;
  *n = w->nbound;
  return 0;
}

static void sdk__begin(void *ud, const bcast_plan *p) {
  rlorch_worker *w = ud;
  w->broadcasting = 1;
  sdk__bcast_id(w, p);
  if (w->so.o.on_broadcast_before) w->so.o.on_broadcast_before(w->so.o.broadcast_ud, p->policy_version);
}

static int sdk__done(void *ud, const bcast_plan *p, int ok, uint64_t *checksum, char *err,
                     size_t errlen) {
  rlorch_worker *w = ud;
  int rc = 0;
  if (w->ao.role == AGENT_ROLE_TRAINER) {
    if (checksum) *checksum = w->checksum; /* the tensors have not changed since the step */
  } else if (ok) {
    if (checksum)
      rc = agent_weights_checksum(w->bound, w->nbound, AGENT_WEIGHTS_WIRE, checksum, err, errlen);
    if (!rc) agent_set_policy_version(w->a, p->policy_version);
  }
  if (w->broadcasting) {
    w->broadcasting = 0;
    if (w->so.o.on_broadcast_after)
      w->so.o.on_broadcast_after(w->so.o.broadcast_ud, ok && !rc, p->policy_version);
    sdk__bcast_id(w, NULL);
  }
  return rc;
}

/* ---- lifecycle --------------------------------------------------------------------- */

/* RegisterRequest.parts from options.parts (the names are w's copies). */
static int sdk__register_parts(rlorch_worker *w) {
  if (!w->nparts) return 0;
  w->parts_pb = calloc(w->nparts, sizeof *w->parts_pb);
  w->parts_pbp = calloc(w->nparts, sizeof *w->parts_pbp);
  if (!w->parts_pb || !w->parts_pbp) return -1;
  for (size_t i = 0; i < w->nparts; i++) {
    Rlorch__V1__TensorPart *t = &w->parts_pb[i];
    const bcast_part *pt = &w->parts[i].part;
    rlorch__v1__tensor_part__init(t);
    t->name = w->part_names[i];
    t->kind = pt->kind == BCAST_PART_SLICE  ? RLORCH__V1__PART_KIND__PART_KIND_SLICE
              : pt->kind == BCAST_PART_NONE ? RLORCH__V1__PART_KIND__PART_KIND_NONE
                                            : RLORCH__V1__PART_KIND__PART_KIND_WHOLE;
    t->dim = pt->dim;
    t->start = pt->start;
    t->count = pt->count;
    w->parts_pbp[i] = t;
  }
  w->reg.n_parts = w->nparts;
  w->reg.parts = w->parts_pbp;
  return 0;
}

static void sdk__stats(Rlorch__V1__WorkerStats *s, void *ud) {
  rlorch_worker *w = ud;
  s->requests_active = atomic_load(&w->active->n);
  s->rollouts_generated = atomic_load(&w->rollouts_generated);
  s->tokens_generated = atomic_load(&w->tokens_generated);
  s->generate_seconds = (double)atomic_load(&w->generate_ns) * 1e-9;
}

SDK__EXPORT rlorch_status rlorch_create(const rlorch_options *o, rlorch_worker **out,
                                        rlorch_error *err) {
  if (err) err->code = 0, err->message[0] = 0;
  if (out) *out = NULL;
  if (!o || !out) return sdk_fail(err, RLORCH_E_INVALID, "rlorch_create: %s is NULL", o ? "out" : "options");
  rlorch_worker *w = calloc(1, sizeof *w);
  if (!w || !(w->active = calloc(1, sizeof *w->active))) {
    free(w);
    return sdk_fail(err, RLORCH_E_NOMEM, "no memory for a worker");
  }
  atomic_init(&w->active->refs, 1);
  pthread_mutex_init(&w->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&w->cond, &ca);
  pthread_condattr_destroy(&ca);
  rlorch_status rc = sdk_opts_take(w, o, err);
  if (rc) goto fail;
  if (o->log) {
    sdk__log_fn = o->log;
    sdk__log_ud = o->log_ud;
    agent_log_config(sdk__log, NULL, (agent_log_level)o->log_level);
  }
  bcast_systopo_measure_h2d(&w->caps.topo, w->device);
  agent_log_topology(&w->caps.topo);
  char msg[1024];
  int trainer = w->ao.role == AGENT_ROLE_TRAINER;
  /* A trainer group's rank r is source rank r of every plan. */
  if (agent_xfer_init(&w->xfer, trainer, w->so.o.trainer_rank, w->device, w->ao.data_listen,
                           sdk__bind, sdk__done, w, msg, sizeof msg)) {
    rc = sdk_fail(err, RLORCH_E_IO, "options.data_listen: %s", msg);
    goto fail;
  }
  w->xfer_ready = 1;
  w->xfer.begin = sdk__begin;
  rlorch__v1__register_request__init(&w->reg);
  agent_caps_to_pb(&w->caps, w->device, &w->caps_pb);
  w->reg.capabilities = &w->caps_pb.caps;
  w->caps_pb.caps.trainer_rank = w->so.o.trainer_rank;
  w->caps_pb.caps.trainer_ranks = w->so.o.trainer_ranks;
  if (trainer) {
    w->manifest = agent_pb_manifest(w->t, w->n, w->so.model, (int)w->so.o.offload);
    if (!w->manifest) {
      rc = sdk_fail(err, RLORCH_E_NOMEM, "no memory for the manifest");
      goto fail;
    }
    w->reg.role = RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER;
    w->reg.manifest = w->manifest;
    w->reg.data_address = (char *)agent_xfer_data_address(&w->xfer);
  } else {
    w->caps_pb.caps.max_concurrent_requests = w->ao.concurrency;
    w->reg.role = RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE;
    /* Given data_listen it may relay broadcasts to other receivers. */
    w->reg.data_address = (char *)agent_xfer_data_address(&w->xfer);
    if (sdk__register_parts(w)) {
      rc = sdk_fail(err, RLORCH_E_NOMEM, "no memory for the parts");
      goto fail;
    }
  }
  if (agent_new(&w->ao, &w->reg, sdk__command, w, &w->a, msg, sizeof msg)) {
    rc = sdk_fail(err, RLORCH_E_IO, "%s", msg);
    goto fail;
  }
  agent_set_abort_fn(w->a, agent_xfer_abort_hook, &w->xfer);
  if (!trainer) agent_set_stats_fn(w->a, sdk__stats, w);
  if (w->so.held_run_id) agent_set_holds(w->a, w->so.held_run_id, w->so.o.held_version);
  *out = w;
  return RLORCH_OK;
fail:
  rlorch_free(w);
  return rc;
}

static void *sdk__command_main(void *arg) {
  rlorch_worker *w = arg;
#ifdef RLORCH_HAVE_CUDA
  if (w->device >= 0) cudaSetDevice(w->device); /* the broadcast's device */
#endif
  int status = agent_run(w->a);
  agent_log_info("worker_stopped", "status=%d", status);
  pthread_mutex_lock(&w->mu);
  w->run_status = status;
  w->run_done = 1;
  pthread_cond_broadcast(&w->cond);
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

static void sdk__join(rlorch_worker *w) {
  if (!w->a) return;
  agent_stop(w->a);
  if (w->xfer_ready) agent_xfer_cancel(&w->xfer, NULL); /* a broadcast executing now */
  pthread_mutex_lock(&w->mu);
  pthread_cond_broadcast(&w->cond);
  int joinable = w->thread_started;
  w->thread_started = 0;
  pthread_mutex_unlock(&w->mu);
  if (joinable) pthread_join(w->cmd_tid, NULL);
}

SDK__EXPORT rlorch_status rlorch_start(rlorch_worker *w, rlorch_error *err) {
  if (err) err->code = 0, err->message[0] = 0;
  if (!w) return sdk_fail(err, RLORCH_E_INVALID, "rlorch_start: worker is NULL");
  pthread_mutex_lock(&w->mu);
  int again = w->started;
  w->started = 1;
  pthread_mutex_unlock(&w->mu);
  if (again) return sdk_fail(err, RLORCH_E_STATE, "rlorch_start: the worker was started already");
  char msg[1024];
  /* A start that fails leaves the worker stopped: rlorch_next says so. */
  if (w->ao.role == AGENT_ROLE_TRAINER &&
      agent_weights_checksum(w->t, w->n, AGENT_WEIGHTS_STORAGE, &w->checksum, msg, sizeof msg)) {
    agent_stop(w->a);
    return sdk_fail(err, RLORCH_E_INVALID, "tensors: %s", msg);
  }
  /* The library's threads take no SIGINT or SIGTERM: those stay the host's. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  int rc = pthread_create(&w->cmd_tid, NULL, sdk__command_main, w);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    agent_stop(w->a);
    return sdk_fail(err, RLORCH_E_NOMEM, "rlorch_start: cannot start a thread: %s", strerror(rc));
  }
  pthread_mutex_lock(&w->mu);
  w->thread_started = 1;
  pthread_mutex_unlock(&w->mu);
  double end = agent_now() + w->so.o.connect_timeout_s;
  for (;;) {
    if (agent_registered(w->a)) return RLORCH_OK;
    grpc_status_code code = agent_refusal(w->a, msg, sizeof msg);
    if (code != GRPC_STATUS_OK) {
      sdk__join(w);
      return sdk_fail(err, RLORCH_E_REFUSED, "the orchestrator refused the registration: %s: %s",
                      rpc_status_name(code), msg);
    }
    pthread_mutex_lock(&w->mu);
    int done = w->run_done;
    pthread_mutex_unlock(&w->mu);
    if (done) return sdk_fail(err, RLORCH_E_STOPPED, "the worker stopped before it registered");
    if (agent_now() > end) {
      sdk__join(w);
      return sdk_fail(err, RLORCH_E_UNAVAILABLE,
                      "no registration with the orchestrator at %s within %g s (options.connect_timeout_s)",
                      w->so.orchestrator, w->so.o.connect_timeout_s);
    }
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

SDK__EXPORT void rlorch_stop(rlorch_worker *w) {
  if (!w || !w->a) return;
  agent_stop(w->a);
  pthread_mutex_lock(&w->mu);
  pthread_cond_broadcast(&w->cond);
  pthread_mutex_unlock(&w->mu);
}

SDK__EXPORT void rlorch_free(rlorch_worker *w) {
  if (!w) return;
  sdk__join(w);
  agent_free(w->a);
  if (w->xfer_ready) agent_xfer_free(&w->xfer);
  while (w->head) {
    sdk_cmd *c = w->head;
    w->head = c->next;
    sdk__cmd_free(c);
  }
  agent_pb_manifest_free(w->manifest);
  free(w->bound);
  free(w->pub_bound);
  free(w->parts_pb);
  free(w->parts_pbp);
  sdk_opts_free(w);
  sdk__active_put(w->active);
  pthread_cond_destroy(&w->cond);
  pthread_mutex_destroy(&w->mu);
  free(w);
}

SDK__EXPORT rlorch_status rlorch_stop_status(rlorch_worker *w, rlorch_error *err) {
  if (err) err->code = 0, err->message[0] = 0;
  if (!w) return sdk_fail(err, RLORCH_E_INVALID, "rlorch_stop_status: worker is NULL");
  char msg[1024];
  grpc_status_code code = w->a ? agent_refusal(w->a, msg, sizeof msg) : GRPC_STATUS_OK;
  if (code != GRPC_STATUS_OK)
    return sdk_fail(err, RLORCH_E_REFUSED, "the orchestrator refused the registration: %s: %s",
                    rpc_status_name(code), msg);
  pthread_mutex_lock(&w->mu);
  int done = w->run_done, status = w->run_status, started = w->thread_started || w->run_done;
  snprintf(msg, sizeof msg, "%s", w->stop_msg);
  pthread_mutex_unlock(&w->mu);
  if (!done && !(started && agent_stopping(w->a)))
    return sdk_fail(err, RLORCH_E_STATE, "rlorch_stop_status: the worker has not stopped");
  if (done && status != 0)
    return sdk_fail(err, RLORCH_E_STOPPED, "the worker stopped on a failure: %s",
                    msg[0] ? msg : "a fatal error (logged as event \"fatal\")");
  return RLORCH_OK;
}

SDK__EXPORT uint64_t rlorch_policy_version(const rlorch_worker *w) {
  return w && w->a ? agent_policy_version(w->a) : 0;
}

SDK__EXPORT size_t rlorch_broadcast_id(rlorch_worker *w, char *buf, size_t len) {
  if (!w) {
    if (buf && len) buf[0] = 0;
    return 0;
  }
  pthread_mutex_lock(&w->mu);
  size_t n = strlen(w->bcast_id);
  if (buf && len) snprintf(buf, len, "%s", w->bcast_id);
  pthread_mutex_unlock(&w->mu);
  return n;
}

SDK__EXPORT const char *rlorch_data_address(const rlorch_worker *w) {
  if (!w || !w->xfer_ready) return NULL;
  const char *a = agent_xfer_data_address(&w->xfer);
  return a[0] ? a : NULL;
}

SDK__EXPORT rlorch_status rlorch_next(rlorch_worker *w, double timeout_s, rlorch_command **cmd,
                                      rlorch_error *err) {
  if (err) err->code = 0, err->message[0] = 0;
  if (!w || !cmd) return sdk_fail(err, RLORCH_E_INVALID, "rlorch_next: %s is NULL", w ? "cmd" : "worker");
  *cmd = NULL;
  if (isnan(timeout_s)) return sdk_fail(err, RLORCH_E_INVALID, "rlorch_next: timeout_s is NaN");
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  if (timeout_s > 0) {
    double s = timeout_s > 1e9 ? 1e9 : timeout_s;
    double ns = (double)until.tv_nsec + (s - (double)(time_t)s) * 1e9;
    until.tv_sec += (time_t)s + (time_t)(ns / 1e9);
    until.tv_nsec = (long)fmod(ns, 1e9);
  }
  pthread_mutex_lock(&w->mu);
  rlorch_status rc = RLORCH_OK;
  if (!w->started) {
    rc = sdk_fail(err, RLORCH_E_STATE, "rlorch_next: the worker is not started (rlorch_start)");
    goto out;
  }
  for (;;) {
    if (w->head) {
      sdk_cmd *c = w->head;
      w->head = c->next;
      if (!w->head) w->tail = NULL;
      c->next = NULL;
      *cmd = &c->pub;
      break;
    }
    if (w->run_done || agent_stopping(w->a)) {
      rc = sdk_fail(err, RLORCH_E_STOPPED, "the worker stopped");
      break;
    }
    if (timeout_s == 0) {
      rc = sdk_fail(err, RLORCH_TIMEOUT, "no command queued");
      break;
    }
    /* Wake at least every 100 ms: a stop from the orchestrator's side ends
     * the command thread without our condition knowing first. */
    struct timespec now, step;
    clock_gettime(CLOCK_MONOTONIC, &now);
    step = now;
    step.tv_nsec += 100 * 1000 * 1000;
    if (step.tv_nsec >= 1000000000L) step.tv_sec++, step.tv_nsec -= 1000000000L;
    int last = timeout_s > 0 && (until.tv_sec < step.tv_sec ||
                                 (until.tv_sec == step.tv_sec && until.tv_nsec <= step.tv_nsec));
    if (timeout_s > 0 && (now.tv_sec > until.tv_sec ||
                          (now.tv_sec == until.tv_sec && now.tv_nsec >= until.tv_nsec))) {
      rc = sdk_fail(err, RLORCH_TIMEOUT, "no command within %g s", timeout_s);
      break;
    }
    pthread_cond_timedwait(&w->cond, &w->mu, last ? &until : &step);
  }
out:
  pthread_mutex_unlock(&w->mu);
  return rc;
}

/* ---- a trainer's batch ------------------------------------------------------------- */

typedef struct sdk__batch {
  rlorch_batch pub;
  rlorch_batch_rollout *r;
  void **mem; /* one block per rollout */
  size_t n, cap;
  int oom;
} sdk__batch;

SDK__EXPORT void rlorch_batch_free(rlorch_batch *b) {
  sdk__batch *s = (sdk__batch *)b;
  if (!s) return;
  for (size_t i = 0; i < s->n; i++) free(s->mem[i]);
  free(s->mem);
  free(s->r);
  free(s);
}

static void sdk__batch_begin(void *ud) {
  sdk__batch *s = ud;
  for (size_t i = 0; i < s->n; i++) free(s->mem[i]);
  s->n = 0;
}

/* Copies one rollout, its arrays in one block. */
static int sdk__batch_rollout(void *ud, const Rlorch__V1__Rollout *m) {
  sdk__batch *s = ud;
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    rlorch_batch_rollout *r = realloc(s->r, cap * sizeof *r);
    if (r) s->r = r;
    void **mem = r ? realloc(s->mem, cap * sizeof *mem) : NULL;
    if (!mem) return -1;
    s->mem = mem;
    s->cap = cap;
  }
  size_t nlp = m->n_completion_logprobs == m->n_completion_token_ids ? m->n_completion_logprobs : 0;
  size_t bytes = m->n_rewards * sizeof(double) + m->n_prompt_token_ids * sizeof(uint32_t) +
                 m->n_completion_token_ids * sizeof(uint32_t) + nlp * sizeof(float) +
                 m->metadata.len;
  char *blk = malloc(bytes ? bytes : 1), *p = blk;
  if (!blk) return -1;
  rlorch_batch_rollout *r = &s->r[s->n];
  memset(r, 0, sizeof *r);
  r->id = m->id;
  r->group_id = m->group_id;
  r->policy_version = m->policy_version;
  r->finish_reason = (rlorch_finish)m->finish_reason;
  /* Largest alignment first: doubles, then the 4-byte arrays, then bytes. */
#define SDK__COPY(dst, src, count, type)                 \
  do {                                                   \
    if (count) {                                         \
      memcpy(p, src, (count) * sizeof(type));            \
      dst = (const type *)(void *)p;                     \
      p += (count) * sizeof(type);                       \
    }                                                    \
  } while (0)
  SDK__COPY(r->rewards, m->rewards, m->n_rewards, double);
  SDK__COPY(r->prompt_token_ids, m->prompt_token_ids, m->n_prompt_token_ids, uint32_t);
  SDK__COPY(r->completion_token_ids, m->completion_token_ids, m->n_completion_token_ids, uint32_t);
  SDK__COPY(r->completion_logprobs, m->completion_logprobs, nlp, float);
  SDK__COPY(r->metadata, m->metadata.data, m->metadata.len, uint8_t);
#undef SDK__COPY
  r->n_rewards = m->n_rewards;
  r->n_prompt_token_ids = m->n_prompt_token_ids;
  r->n_completion_token_ids = m->n_completion_token_ids;
  r->n_metadata = m->metadata.len;
  s->mem[s->n++] = blk;
  return 0;
}

/* The TRAIN command `train` is the one the command thread waits on. */
static rlorch_status sdk__check_train(rlorch_worker *w, const rlorch_command *train,
                                      const char *fn, rlorch_error *err) {
  if (!w || !train) return sdk_fail(err, RLORCH_E_INVALID, "%s: %s is NULL", fn, w ? "command" : "worker");
  if (w->ao.role != AGENT_ROLE_TRAINER)
    return sdk_fail(err, RLORCH_E_STATE, "%s: an inference worker has no train step", fn);
  if (train->kind != RLORCH_CMD_TRAIN)
    return sdk_fail(err, RLORCH_E_INVALID, "%s: command kind %d is not RLORCH_CMD_TRAIN", fn,
                    (int)train->kind);
  pthread_mutex_lock(&w->mu);
  int ok = w->train_waiting && w->train_step == train->train.step;
  pthread_mutex_unlock(&w->mu);
  if (!ok) {
    if (agent_stopping(w->a)) return sdk_fail(err, RLORCH_E_STOPPED, "%s: the worker stopped", fn);
    return sdk_fail(err, RLORCH_E_STATE, "%s: step %llu is not the train step in progress", fn,
                    (unsigned long long)train->train.step);
  }
  return RLORCH_OK;
}

SDK__EXPORT rlorch_status rlorch_fetch_batch(rlorch_worker *w, const rlorch_command *train,
                                             rlorch_batch **out, rlorch_error *err) {
  if (err) err->code = 0, err->message[0] = 0;
  if (!out) return sdk_fail(err, RLORCH_E_INVALID, "rlorch_fetch_batch: out is NULL");
  *out = NULL;
  rlorch_status rc = sdk__check_train(w, train, "rlorch_fetch_batch", err);
  if (rc) return rc;
  sdk__batch *s = calloc(1, sizeof *s);
  if (!s) return sdk_fail(err, RLORCH_E_NOMEM, "no memory for a batch");
  agent_batch_sink sink = {sdk__batch_begin, sdk__batch_rollout, s};
  char msg[512];
  int got = agent_batch_fetch(w->a, ((const sdk_cmd *)train)->msg->train, &sink, msg, sizeof msg);
  if (got != 0) {
    rlorch_batch_free(&s->pub);
    pthread_mutex_lock(&w->mu);
    if (got > 0) w->train_skip = 1;
    pthread_mutex_unlock(&w->mu);
    if (agent_stopping(w->a)) return sdk_fail(err, RLORCH_E_STOPPED, "%s", msg);
    return sdk_fail(err, got > 0 ? RLORCH_E_REFUSED : RLORCH_E_UNAVAILABLE, "%s", msg);
  }
  /* From here the version held changes: a registration (after an
   * orchestrator restart) waits until it says the new one. */
  pthread_mutex_lock(&w->mu);
  if (!w->train_fetched) agent_hold_registration(w->a, 1);
  w->train_fetched = 1;
  pthread_mutex_unlock(&w->mu);
  s->pub.step = train->train.step;
  s->pub.n_rollouts = s->n;
  s->pub.rollouts = s->r;
  *out = &s->pub;
  return RLORCH_OK;
}

/* Releases the command thread from train step `step`. */
static void sdk__step_over(rlorch_worker *w, int fail) {
  pthread_mutex_lock(&w->mu);
  if (w->train_fetched) agent_hold_registration(w->a, 0);
  w->train_fetched = 0;
  w->train_fail = fail;
  w->train_waiting = 0;
  pthread_cond_broadcast(&w->cond);
  pthread_mutex_unlock(&w->mu);
}

static rlorch_status sdk__refused(rlorch_error *err, const char *what, const rpc_status *st) {
  if (st->code == GRPC_STATUS_CANCELLED)
    return sdk_fail(err, RLORCH_E_STOPPED, "%s: the worker stopped", what);
  if (st->code == GRPC_STATUS_UNAVAILABLE || st->code == GRPC_STATUS_DEADLINE_EXCEEDED)
    return sdk_fail(err, RLORCH_E_UNAVAILABLE, "%s: %s: %s", what, rpc_status_name(st->code),
                    st->message);
  if (st->code == GRPC_STATUS_OK || st->code == GRPC_STATUS_NOT_FOUND)
    return sdk_fail(err, RLORCH_E_REFUSED,
                    "%s: the orchestrator no longer knows this worker (it registers again)", what);
  return sdk_fail(err, RLORCH_E_REFUSED, "%s: the orchestrator refused: %s: %s", what,
                  rpc_status_name(st->code), st->message);
}

SDK__EXPORT rlorch_status rlorch_report_step(rlorch_worker *w, const rlorch_command *train,
                                             double train_seconds, rlorch_error *err) {
  if (err) err->code = 0, err->message[0] = 0;
  rlorch_status rc = sdk__check_train(w, train, "rlorch_report_step", err);
  if (rc) return rc;
  if (!(train_seconds >= 0) || !isfinite(train_seconds))
    return sdk_fail(err, RLORCH_E_INVALID, "rlorch_report_step: train_seconds %g is not a finite "
                    "number >= 0", train_seconds);
  char msg[512];
  uint64_t sum;
  if (agent_weights_checksum(w->t, w->n, AGENT_WEIGHTS_STORAGE, &sum, msg, sizeof msg)) {
    sdk__step_over(w, 1);
    return sdk_fail(err, RLORCH_E_INVALID, "rlorch_report_step: checksum: %s", msg);
  }
  uint64_t step = train->train.step;
  w->checksum = sum; /* read by the command thread's next broadcast, after the release below */
  Rlorch__V1__StepDone d = RLORCH__V1__STEP_DONE__INIT;
  d.step = step;
  d.train_seconds = train_seconds;
  d.manifest = w->manifest;
  d.weights_checksum = sum;
  /* The root of an NCCL broadcast makes the unique id its receivers join by. */
  uint8_t id[128];
  if (((const sdk_cmd *)train)->msg->train->want_nccl_id) {
    bcast_err be = {0};
    if (w->caps.nccl_built && w->device >= 0 &&
        bcast_engine_nccl_id(agent_xfer_engine(&w->xfer), id, &be) == 0) {
      d.nccl_unique_id.data = id;
      d.nccl_unique_id.len = sizeof id;
    } else {
      agent_log_warn("nccl_id_unavailable", "step=%llu reason=\"%s\"", (unsigned long long)step,
                     be.msg[0] ? be.msg : "no NCCL or no GPU here");
    }
  }
  agent_set_policy_version(w->a, step + 1);
  sdk__step_over(w, 0);
  agent_log_info("step_done", "step=%llu train_s=%.4f checksum=%016llx", (unsigned long long)step,
                 train_seconds, (unsigned long long)sum);
  Rlorch__V1__ReportRequest req = RLORCH__V1__REPORT_REQUEST__INIT;
  req.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_STEP_DONE;
  req.step_done = &d;
  rpc_status st;
  if (agent_report_status(w->a, &req, &st)) return sdk__refused(err, "StepDone", &st);
  return RLORCH_OK;
}

/* ---- rollouts ----------------------------------------------------------------------- */

static rlorch_status sdk__check_rollout(const rlorch_rollout *r, size_t i, rlorch_error *err) {
  if (r->n_tokens < 1)
    return sdk_fail(err, RLORCH_E_INVALID, "rollouts[%zu].token_ids: a completion has at least one token", i);
  if (!r->token_ids && r->logprobs)
    return sdk_fail(err, RLORCH_E_INVALID, "rollouts[%zu].logprobs: set without token_ids (a length "
                    "only has none)", i);
  if (r->n_tokens > UINT32_MAX)
    return sdk_fail(err, RLORCH_E_INVALID, "rollouts[%zu].n_tokens: %zu is too many", i, r->n_tokens);
  for (size_t k = 0; r->logprobs && k < r->n_tokens; k++)
    if (!(r->logprobs[k] <= 0) || !isfinite(r->logprobs[k]))
      return sdk_fail(err, RLORCH_E_INVALID, "rollouts[%zu].logprobs[%zu]: %g is not a log-probability",
                      i, k, (double)r->logprobs[k]);
  if (r->n_rewards < 1 || r->n_rewards > AGENT_REWARDS_MAX || !r->rewards)
    return sdk_fail(err, RLORCH_E_INVALID, "rollouts[%zu].rewards: %zu values, not 1..%d", i,
                    r->rewards ? r->n_rewards : 0, AGENT_REWARDS_MAX);
  for (size_t k = 0; k < r->n_rewards; k++)
    if (!isfinite(r->rewards[k]))
      return sdk_fail(err, RLORCH_E_INVALID, "rollouts[%zu].rewards[%zu]: %g is not finite", i, k,
                      r->rewards[k]);
  if ((int)r->finish_reason < RLORCH_FINISH_UNSPECIFIED || r->finish_reason > RLORCH_FINISH_ABORT)
    return sdk_fail(err, RLORCH_E_INVALID, "rollouts[%zu].finish_reason: unknown value %d", i,
                    (int)r->finish_reason);
  if (r->n_metadata && !r->metadata)
    return sdk_fail(err, RLORCH_E_INVALID, "rollouts[%zu].metadata: NULL with n_metadata %zu", i,
                    r->n_metadata);
  if (!(r->seconds >= 0) || !isfinite(r->seconds))
    return sdk_fail(err, RLORCH_E_INVALID, "rollouts[%zu].seconds: %g is not a finite number >= 0", i,
                    r->seconds);
  return RLORCH_OK;
}

static rlorch_status sdk__check_generate(rlorch_worker *w, const rlorch_command *gen,
                                         const char *fn, rlorch_error *err) {
  if (!w || !gen) return sdk_fail(err, RLORCH_E_INVALID, "%s: %s is NULL", fn, w ? "command" : "worker");
  if (w->ao.role != AGENT_ROLE_INFERENCE)
    return sdk_fail(err, RLORCH_E_STATE, "%s: a trainer makes no rollouts", fn);
  if (gen->kind != RLORCH_CMD_GENERATE)
    return sdk_fail(err, RLORCH_E_INVALID, "%s: command kind %d is not RLORCH_CMD_GENERATE", fn,
                    (int)gen->kind);
  /* Request ids are the orchestrator's per registration: an answer under a
   * later one could be taken for another request's. */
  if (((const sdk_cmd *)gen)->registration != agent_registration(w->a)) {
    sdk__settle_cmd((sdk_cmd *)gen);
    return sdk_fail(err, RLORCH_E_STOPPED,
                    "%s: request %llu came before the worker registered again (the orchestrator "
                    "restarted or forgot it): the request is gone, nothing was sent", fn,
                    (unsigned long long)gen->generate.request_id);
  }
  return RLORCH_OK;
}

/* Sends the result of request `gen` (no rollout at all is a valid answer). */
static rlorch_status sdk__send_result(rlorch_worker *w, const rlorch_command *gen,
                                      Rlorch__V1__RolloutResult *res, rlorch_error *err) {
  Rlorch__V1__ReportRequest req = RLORCH__V1__REPORT_REQUEST__INIT;
  req.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_ROLLOUTS;
  req.rollouts = res;
  rpc_status st;
  int rc = agent_report_status(w->a, &req, &st);
  sdk__settle_cmd((sdk_cmd *)gen);
  atomic_fetch_add(&w->generate_ns,
                   (uint_fast64_t)((agent_now() - ((const sdk_cmd *)gen)->t0) * 1e9));
  return rc ? sdk__refused(err, "RolloutResult", &st) : RLORCH_OK;
}

SDK__EXPORT rlorch_status rlorch_report_rollouts(rlorch_worker *w, const rlorch_command *gen,
                                                 uint64_t version, const rlorch_rollout *rollouts,
                                                 size_t n, rlorch_error *err) {
  if (err) err->code = 0, err->message[0] = 0;
  rlorch_status rc = sdk__check_generate(w, gen, "rlorch_report_rollouts", err);
  if (rc) return rc;
  if (n != gen->generate.count)
    return sdk_fail(err, RLORCH_E_INVALID, "rlorch_report_rollouts: %zu rollouts for request %llu of "
                    "count %u", n, (unsigned long long)gen->generate.request_id, gen->generate.count);
  if (n && !rollouts) return sdk_fail(err, RLORCH_E_INVALID, "rlorch_report_rollouts: rollouts is NULL");
  if (version > agent_policy_version(w->a))
    return sdk_fail(err, RLORCH_E_INVALID, "rlorch_report_rollouts: version %llu is newer than the "
                    "%llu the worker holds", (unsigned long long)version,
                    (unsigned long long)agent_policy_version(w->a));
  for (size_t i = 0; i < n; i++)
    if ((rc = sdk__check_rollout(&rollouts[i], i, err))) return rc;
  Rlorch__V1__Rollout *msgs = calloc(n ? n : 1, sizeof *msgs);
  Rlorch__V1__Rollout **ptrs = calloc(n ? n : 1, sizeof *ptrs);
  if (!msgs || !ptrs) {
    free(msgs);
    free(ptrs);
    return sdk_fail(err, RLORCH_E_NOMEM, "no memory for %zu rollouts", n);
  }
  uint64_t tag = agent_id_tag(w->a), tokens = 0;
  for (size_t i = 0; i < n; i++) {
    const rlorch_rollout *r = &rollouts[i];
    Rlorch__V1__Rollout *m = &msgs[i];
    rlorch__v1__rollout__init(m);
    /* Ids as rlorch's own engines make them: (tag << 40) | counter. */
    uint64_t k = __atomic_add_fetch(&w->rollout_counter, 1, __ATOMIC_RELAXED);
    m->id = ((tag & 0xffffffu) << 40) | (k & ((UINT64_C(1) << 40) - 1));
    m->policy_version = version;
    m->tokens = (uint32_t)r->n_tokens;
    m->seconds = r->seconds;
    m->group_id = gen->generate.group_id;
    m->finish_reason = (Rlorch__V1__FinishReason)r->finish_reason;
    if (r->token_ids) {
      m->n_completion_token_ids = r->n_tokens;
      m->completion_token_ids = (uint32_t *)r->token_ids;
    }
    if (r->logprobs) {
      m->n_completion_logprobs = r->n_tokens;
      m->completion_logprobs = (float *)r->logprobs;
    }
    m->n_rewards = r->n_rewards;
    m->rewards = (double *)r->rewards;
    m->metadata.data = (uint8_t *)r->metadata;
    m->metadata.len = r->n_metadata;
    ptrs[i] = m;
    tokens += r->n_tokens;
  }
  Rlorch__V1__RolloutResult res = RLORCH__V1__ROLLOUT_RESULT__INIT;
  res.request_id = gen->generate.request_id;
  res.n_rollouts = n;
  res.rollouts = n ? ptrs : NULL;
  atomic_fetch_add(&w->rollouts_generated, n);
  atomic_fetch_add(&w->tokens_generated, tokens);
  rc = sdk__send_result(w, gen, &res, err);
  free(ptrs);
  free(msgs);
  return rc;
}

SDK__EXPORT rlorch_status rlorch_report_error(rlorch_worker *w, const rlorch_command *cmd,
                                              const char *message, rlorch_error *err) {
  if (err) err->code = 0, err->message[0] = 0;
  if (!w || !cmd) return sdk_fail(err, RLORCH_E_INVALID, "rlorch_report_error: %s is NULL", w ? "command" : "worker");
  const char *why = message ? message : "";
  if (cmd->kind == RLORCH_CMD_GENERATE) {
    rlorch_status rc = sdk__check_generate(w, cmd, "rlorch_report_error", err);
    if (rc) return rc;
    agent_log_error("rollouts_failed", "request_id=%llu group_id=%llu reason=\"%s\" action=\"answer "
                    "with no rollout\"", (unsigned long long)cmd->generate.request_id,
                    (unsigned long long)cmd->generate.group_id, why);
    Rlorch__V1__RolloutResult res = RLORCH__V1__ROLLOUT_RESULT__INIT;
    res.request_id = cmd->generate.request_id;
    return sdk__send_result(w, cmd, &res, err);
  }
  if (cmd->kind == RLORCH_CMD_TRAIN) {
    rlorch_status rc = sdk__check_train(w, cmd, "rlorch_report_error", err);
    if (rc) return rc;
    pthread_mutex_lock(&w->mu);
    int skip = w->train_skip;
    pthread_mutex_unlock(&w->mu);
    if (skip) {
      agent_log_warn("step_skipped", "step=%llu reason=\"%s\"", (unsigned long long)cmd->train.step, why);
      sdk__step_over(w, 0);
      return RLORCH_OK;
    }
    agent_log_error("step_failed", "step=%llu reason=\"%s\" action=stop",
                    (unsigned long long)cmd->train.step, why);
    pthread_mutex_lock(&w->mu);
    snprintf(w->stop_msg, sizeof w->stop_msg, "train step %llu failed: %s",
             (unsigned long long)cmd->train.step, why);
    pthread_mutex_unlock(&w->mu);
    sdk__step_over(w, 1);
    return RLORCH_OK;
  }
  return sdk_fail(err, RLORCH_E_INVALID, "rlorch_report_error: command kind %d has nothing to "
                  "report (GENERATE or TRAIN)", (int)cmd->kind);
}
