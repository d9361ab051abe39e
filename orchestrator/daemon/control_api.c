/* The Control API: what operators and tooling call. Validation happens here;
 * the run itself is driven by the runner, WatchRun streams are kept by the
 * watch hub. */
#include "orchestrator/daemon/control_api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/common/log.h"
#include "orchestrator/daemon/now.h"
#include "orchestrator/daemon/orch.h"
#include "orchestrator/daemon/prompt_source.h"
#include "orchestrator/daemon/runner.h"
#include "orchestrator/daemon/topology.h"
#include "orchestrator/daemon/watch.h"
#include "orchestrator/daemon/workers.h"
#include "workers/bcast/bcast_preset.h"

#define MAX_STEPS 10000000u
#define MAX_ROLLOUTS_PER_STEP 65536u
#define MAX_REQUESTS_PER_WORKER 1024u
#define MIN_STAGING_BUDGET (1u << 20)
#define MAX_STAGING_BUDGET (1ull << 40) /* staging_budget_bytes' own bound in the configuration */
#define MAX_REQUEST_TIMEOUT_MS 86400000u /* request_timeout_ms' own bound: a day */
#define MAX_GROUP_SIZE 4096u
#define MAX_STOP_TOKENS 64u
#define MAX_PATH_BYTES 4096u

/* Storage for the defaults spec_validate fills into sub-messages: the spec is
 * a shallow copy of the request, whose own sub-messages must not change. */
typedef struct spec_fill {
  Rlorch__V1__SamplingParams sampling;
  Rlorch__V1__PromptSource prompts;
  Rlorch__V1__SyntheticPrompts synthetic;
} spec_fill;

static int sampling_validate(const config *c, Rlorch__V1__RunSpec *s, spec_fill *f, char *err,
                             size_t len) {
  if (s->sampling) {
    f->sampling = *s->sampling;
  } else {
    rlorch__v1__sampling_params__init(&f->sampling);
    f->sampling.temperature = (float)c->temperature;
  }
  Rlorch__V1__SamplingParams *p = &f->sampling;
  s->sampling = p;
  if (p->max_tokens == 0) p->max_tokens = c->max_tokens;
  if (!(p->temperature >= 0 && p->temperature <= 100)) /* NaN fails too */
    return snprintf(err, len, "sampling.temperature: %g is not in [0, 100]", p->temperature), -1;
  if (!(p->top_p >= 0 && p->top_p <= 1))
    return snprintf(err, len, "sampling.top_p: %g is not in [0, 1]", p->top_p), -1;
  if (p->max_tokens > c->max_tokens)
    return snprintf(err, len, "sampling.max_tokens: %u is over the limit of %u (max_tokens)",
                    p->max_tokens, c->max_tokens),
           -1;
  if (p->n_stop_token_ids > MAX_STOP_TOKENS)
    return snprintf(err, len, "sampling.stop_token_ids: %zu ids, more than %u",
                    p->n_stop_token_ids, MAX_STOP_TOKENS),
           -1;
  return 0;
}

static int prompts_validate(const config *c, Rlorch__V1__RunSpec *s, spec_fill *f, char *err,
                            size_t len) {
  rlorch__v1__prompt_source__init(&f->prompts);
  rlorch__v1__synthetic_prompts__init(&f->synthetic);
  if (s->prompts) f->prompts = *s->prompts;
  if (f->prompts.source_case == RLORCH__V1__PROMPT_SOURCE__SOURCE__NOT_SET && c->prompts_file) {
    f->prompts.source_case = RLORCH__V1__PROMPT_SOURCE__SOURCE_JSONL_PATH;
    f->prompts.jsonl_path = c->prompts_file;
  }
  if (f->prompts.source_case == RLORCH__V1__PROMPT_SOURCE__SOURCE__NOT_SET) {
    f->prompts.source_case = RLORCH__V1__PROMPT_SOURCE__SOURCE_SYNTHETIC;
    f->prompts.synthetic = NULL;
  }
  s->prompts = &f->prompts;
  if (f->prompts.source_case == RLORCH__V1__PROMPT_SOURCE__SOURCE_SYNTHETIC) {
    /* Stored with the values used, so the run record says what it got. */
    if (f->prompts.synthetic) f->synthetic = *f->prompts.synthetic;
    f->prompts.synthetic = &f->synthetic;
    if (!f->synthetic.prompt_tokens) f->synthetic.prompt_tokens = PROMPT_SOURCE_SYNTHETIC_TOKENS;
    if (!f->synthetic.vocab_size) f->synthetic.vocab_size = PROMPT_SOURCE_SYNTHETIC_VOCAB;
  } else if (strlen(f->prompts.jsonl_path) >= MAX_PATH_BYTES) {
    return snprintf(err, len, "prompts.jsonl_path: longer than %u bytes", MAX_PATH_BYTES - 1), -1;
  }
  /* Opened once here so that a missing file, a bad first line or a bad
   * synthetic setting is the caller's INVALID_ARGUMENT, not a run that fails
   * later; the runner opens it again for itself. */
  prompt_source *ps = NULL;
  int rc = prompt_source_open(&f->prompts, c->max_prompt_tokens, &ps, err, len);
  prompt_source_close(ps);
  return rc;
}

int control_api_run_is_final(Rlorch__V1__RunState s) {
  return s == RLORCH__V1__RUN_STATE__RUN_STATE_STOPPED ||
         s == RLORCH__V1__RUN_STATE__RUN_STATE_SUCCEEDED ||
         s == RLORCH__V1__RUN_STATE__RUN_STATE_FAILED;
}

static int enum_known(const ProtobufCEnumDescriptor *d, int v) {
  return protobuf_c_enum_descriptor_get_value(d, v) != NULL;
}

/* Fills defaults into spec and checks every field; returns 0 or -1 with a
 * message naming the field. */
static int spec_validate(const config *c, Rlorch__V1__RunSpec *s, spec_fill *fill, char *err,
                         size_t len) {
  if (strlen(s->name) > 128) return snprintf(err, len, "name: longer than 128 bytes"), -1;
  /* An empty preset or an unspecified offload takes the trainer's (the runner
   * fills them in when it joins); a given one admits only a trainer that holds it. */
  if (s->preset[0] && !bcast_preset_find(s->preset)) {
    char names[128] = "";
    for (const char *const *n = bcast_preset_names(); *n; n++)
      snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
               names[0] ? "|" : "", *n);
    return snprintf(err, len, "preset: unknown preset '%s' (want %s)", s->preset, names), -1;
  }
  if (s->steps > MAX_STEPS)
    return snprintf(err, len, "steps: %u is over the limit of %u", s->steps, MAX_STEPS), -1;
  if (s->async_bound_case != RLORCH__V1__RUN_SPEC__ASYNC_BOUND_MAX_ASYNC_LEVEL) {
    s->async_bound_case = RLORCH__V1__RUN_SPEC__ASYNC_BOUND_MAX_ASYNC_LEVEL;
    s->max_async_level = c->max_async_level;
  }
  if (s->max_async_level > 64)
    return snprintf(err, len, "max_async_level: %u is over the limit of 64", s->max_async_level),
           -1;
  if (s->rollouts_per_step == 0) s->rollouts_per_step = c->rollouts_per_step;
  if (s->rollouts_per_step > MAX_ROLLOUTS_PER_STEP)
    return snprintf(err, len, "rollouts_per_step: %u is over the limit of %u",
                    s->rollouts_per_step, MAX_ROLLOUTS_PER_STEP),
           -1;
  if (s->group_size == 0) s->group_size = c->group_size;
  if (s->group_size > MAX_GROUP_SIZE)
    return snprintf(err, len, "group_size: %u is over the limit of %u", s->group_size,
                    MAX_GROUP_SIZE),
           -1;
  if (s->rollouts_per_step % s->group_size)
    return snprintf(err, len, "rollouts_per_step: %u is not a multiple of group_size (%u)",
                    s->rollouts_per_step, s->group_size),
           -1;
  if (s->request_timeout_ms == 0) s->request_timeout_ms = c->request_timeout_ms;
  if (s->request_timeout_ms > MAX_REQUEST_TIMEOUT_MS)
    return snprintf(err, len, "request_timeout_ms: %u is over the limit of %u (a day)",
                    s->request_timeout_ms, MAX_REQUEST_TIMEOUT_MS),
           -1;
  if (sampling_validate(c, s, fill, err, len) || prompts_validate(c, s, fill, err, len))
    return -1;
  if (s->max_requests_per_worker == 0) s->max_requests_per_worker = c->max_requests_per_worker;
  if (s->max_requests_per_worker > MAX_REQUESTS_PER_WORKER)
    return snprintf(err, len, "max_requests_per_worker: %u is over the limit of %u",
                    s->max_requests_per_worker, MAX_REQUESTS_PER_WORKER),
           -1;
  if (s->policy == RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_UNSPECIFIED)
    s->policy = c->default_policy;
  if (!enum_known(&rlorch__v1__broadcast_mode__descriptor, s->policy))
    return snprintf(err, len, "policy: unknown value %d", (int)s->policy), -1;
  if (!enum_known(&rlorch__v1__offload__descriptor, s->offload))
    return snprintf(err, len, "offload: unknown value %d", (int)s->offload), -1;
  if (s->staging_budget_bytes == 0) s->staging_budget_bytes = c->staging_budget_bytes;
  if (s->staging_budget_bytes < MIN_STAGING_BUDGET)
    return snprintf(err, len, "staging_budget_bytes: %llu is below the minimum of 1 MiB",
                    (unsigned long long)s->staging_budget_bytes),
           -1;
  if (s->staging_budget_bytes > MAX_STAGING_BUDGET)
    return snprintf(err, len, "staging_budget_bytes: %llu is over the limit of %llu (1 TiB)",
                    (unsigned long long)s->staging_budget_bytes, MAX_STAGING_BUDGET),
           -1;
  return 0;
}

int control_api_validate_spec(const config *c, const Rlorch__V1__RunSpec *spec, char *err,
                              size_t len) {
  Rlorch__V1__RunSpec filled = *spec; /* shallow, as StartRun's: spec stays as it was */
  spec_fill fill;
  return spec_validate(c, &filled, &fill, err, len);
}

static int run_id_ok(rpc_call *call, const char *id) {
  if (!id || !id[0]) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "run_id: required");
    return 0;
  }
  if (strlen(id) >= 64) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "run_id: longer than 63 bytes");
    return 0;
  }
  return 1;
}

/* Loads a run or answers NOT_FOUND / INTERNAL; returns NULL when answered. */
static Rlorch__V1__Run *load_run(orch *o, rpc_call *call, const char *id) {
  if (!run_id_ok(call, id)) return NULL;
  Rlorch__V1__Run *run = NULL;
  int rc = store_run_get(o->db, id, &run);
  if (rc == STORE_ENOTFOUND) {
    rpc_call_fail(call, GRPC_STATUS_NOT_FOUND, "run '%s' not found", id);
    return NULL;
  }
  if (rc != 0) {
    rpc_call_fail(call, GRPC_STATUS_INTERNAL, "store: %s", store_errmsg(o->db));
    return NULL;
  }
  return run;
}

static void reply_run(rpc_call *call, Rlorch__V1__Run *run) {
  rpc_call_reply(call, &run->base);
  protobuf_c_message_free_unpacked(&run->base, NULL);
}

static void h_start_run(rpc_call *call, const ProtobufCMessage *req, void *ud) {
  orch *o = ud;
  /* A shallow copy: defaults are filled in with static strings, and the
   * request itself is freed by the rpc layer. */
  Rlorch__V1__RunSpec filled = *(const Rlorch__V1__RunSpec *)req;
  Rlorch__V1__RunSpec *spec = &filled;
  char err[400];
  spec_fill fill;
  if (o->shutting_down) {
    rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "server shutting down");
    return;
  }
  if (spec_validate(o->cfg, spec, &fill, err, sizeof err) != 0) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "%s", err);
    return;
  }
  const Rlorch__V1__Run *active = runner_active(o->runner);
  if (active) {
    rpc_call_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                  "run '%s' is active (%s); stop it first", active->id,
                  protobuf_c_enum_descriptor_get_value(&rlorch__v1__run_state__descriptor,
                                                       active->state)->name);
    return;
  }
  /* A spec the registered trainer cannot serve is refused now, by name; one
   * that joins later is not admitted and the run says why it waits. */
  size_t trainers = 0, admitted = 0;
  char why[400] = "";
  for (size_t i = 0; i < workers_count(o->workers); i++) {
    const workers_entry *w = workers_at(o->workers, i);
    if (w->state == RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST ||
        w->role != RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER)
      continue;
    trainers++;
    char one[sizeof why];
    if (runner_admits(spec, w, one, sizeof one) == 0) admitted++;
    else if (!why[0]) snprintf(why, sizeof why, "%s", one); /* the first reason */
  }
  if (trainers && !admitted) {
    rpc_call_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "%s", why);
    return;
  }
  Rlorch__V1__Run *run = NULL;
  if (store_run_create(o->db, spec, now_unix_ms(), &run) != 0) {
    rpc_call_fail(call, GRPC_STATUS_INTERNAL, "store: %s", store_errmsg(o->db));
    return;
  }
  log_info("run_created", "run=%s preset=%s steps=%u policy=%d", run->id, spec->preset,
           spec->steps, (int)spec->policy);
  /* Reply with the stored run before the runner may change it. */
  rpc_call_reply(call, &run->base);
  if (runner_start(o->runner, run, err, sizeof err) != 0)
    log_error("run_start_failed", "run=%s error=\"%s\"", run->id, err);
}

static void h_get_run(rpc_call *call, const ProtobufCMessage *req, void *ud) {
  const Rlorch__V1__GetRunRequest *r = (const void *)req;
  Rlorch__V1__Run *run = load_run(ud, call, r->run_id);
  if (run) reply_run(call, run);
}

static void h_stop_run(rpc_call *call, const ProtobufCMessage *req, void *ud) {
  orch *o = ud;
  const Rlorch__V1__StopRunRequest *r = (const void *)req;
  Rlorch__V1__Run *run = load_run(o, call, r->run_id);
  if (!run) return;
  if (control_api_run_is_final(run->state)) {
    rpc_call_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "run '%s' already ended (%s)", run->id,
                  protobuf_c_enum_descriptor_get_value(&rlorch__v1__run_state__descriptor,
                                                       run->state)->name);
    protobuf_c_message_free_unpacked(&run->base, NULL);
    return;
  }
  protobuf_c_message_free_unpacked(&run->base, NULL);
  char err[256];
  if (runner_stop(o->runner, r->run_id, r->reason[0] ? r->reason : "stopped by operator",
                       err, sizeof err) != 0) {
    rpc_call_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "%s", err);
    return;
  }
  run = load_run(o, call, r->run_id);
  if (run) reply_run(call, run);
}

static void h_list_runs(rpc_call *call, const ProtobufCMessage *req, void *ud) {
  orch *o = ud;
  const Rlorch__V1__ListRunsRequest *r = (const void *)req;
  if (r->state && !enum_known(&rlorch__v1__run_state__descriptor, r->state)) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "state: unknown value %d", (int)r->state);
    return;
  }
  if (r->limit > 10000) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "limit: %u is over the limit of 10000",
                  r->limit);
    return;
  }
  Rlorch__V1__ListRunsResponse resp = RLORCH__V1__LIST_RUNS_RESPONSE__INIT;
  Rlorch__V1__Run **runs = NULL;
  size_t n = 0;
  if (store_run_list(o->db, r->state, r->limit, &runs, &n) != 0) {
    rpc_call_fail(call, GRPC_STATUS_INTERNAL, "store: %s", store_errmsg(o->db));
    return;
  }
  resp.runs = runs;
  resp.n_runs = n;
  rpc_call_reply(call, &resp.base);
  store_runs_free(runs, n);
}

static void h_list_workers(rpc_call *call, const ProtobufCMessage *req, void *ud) {
  orch *o = ud;
  const Rlorch__V1__ListWorkersRequest *r = (const void *)req;
  if (r->run_id[0]) {
    Rlorch__V1__Run *run = load_run(o, call, r->run_id);
    if (!run) return;
    protobuf_c_message_free_unpacked(&run->base, NULL);
  }
  Rlorch__V1__ListWorkersResponse resp = RLORCH__V1__LIST_WORKERS_RESPONSE__INIT;
  Rlorch__V1__WorkerInfo **w = NULL;
  size_t n = workers_list(o->workers, r->run_id, &w);
  resp.workers = w;
  resp.n_workers = n;
  rpc_call_reply(call, &resp.base);
  workers_list_free(w, n);
}

static void h_set_policy(rpc_call *call, const ProtobufCMessage *req, void *ud) {
  orch *o = ud;
  const Rlorch__V1__SetBroadcastPolicyRequest *r = (const void *)req;
  if (r->policy == RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_UNSPECIFIED ||
      !enum_known(&rlorch__v1__broadcast_mode__descriptor, r->policy)) {
    rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                  "policy: want auto, direct, staged, host or colocated (got %d)", (int)r->policy);
    return;
  }
  Rlorch__V1__Run *run = load_run(o, call, r->run_id);
  if (!run) return;
  int final = control_api_run_is_final(run->state);
  protobuf_c_message_free_unpacked(&run->base, NULL);
  if (final) {
    rpc_call_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "run '%s' already ended", r->run_id);
    return;
  }
  char err[256];
  if (runner_set_policy(o->runner, r->run_id, r->policy, err, sizeof err) != 0) {
    rpc_call_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "%s", err);
    return;
  }
  run = load_run(o, call, r->run_id);
  if (run) reply_run(call, run);
}

/* The live workers, or the live ones of a run, as the cost model would
 * place them in a plan (topology.h: the runner's own function). */
static void h_get_topology(rpc_call *call, const ProtobufCMessage *req, void *ud) {
  orch *o = ud;
  const Rlorch__V1__GetTopologyRequest *r = (const void *)req;
  if (r->run_id[0]) {
    Rlorch__V1__Run *run = load_run(o, call, r->run_id);
    if (!run) return;
    protobuf_c_message_free_unpacked(&run->base, NULL);
  }
  Rlorch__V1__WorkerInfo **w = NULL;
  size_t n = workers_list(o->workers, r->run_id, &w), live = 0;
  if (!w) {
    rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  for (size_t i = 0; i < n; i++)
    if (w[i]->state != RLORCH__V1__WORKER_STATE__WORKER_STATE_LOST) w[live++] = w[i];
    else protobuf_c_message_free_unpacked(&w[i]->base, NULL);
  topology_view v;
  char err[TOPOLOGY_NOTE_MAX];
  if (topology_view_build((const Rlorch__V1__WorkerInfo *const *)w, live, &o->cfg->topology, &v,
                          err, sizeof err) != 0)
    rpc_call_fail(call, GRPC_STATUS_INTERNAL, "topology: %s", err);
  else
    rpc_call_reply(call, &v.resp.base);
  topology_view_free(&v);
  workers_list_free(w, live);
}

/* ---- WatchRun ---------------------------------------------------------------- */

static int replay_step(const Rlorch__V1__StepRecord *rec, void *arg) {
  watch_sub *sub = arg;
  Rlorch__V1__RunEvent ev = RLORCH__V1__RUN_EVENT__INIT;
  ev.event_case = RLORCH__V1__RUN_EVENT__EVENT_STEP;
  ev.step = (Rlorch__V1__StepRecord *)rec;
  ev.unix_ms = rec->finished_unix_ms;
  return watch_send(sub, &ev) == 0 ? 0 : 1;
}

static void h_watch_run(rpc_call *call, const ProtobufCMessage *req, void *ud) {
  orch *o = ud;
  const Rlorch__V1__WatchRunRequest *r = (const void *)req;
  Rlorch__V1__Run *run = load_run(o, call, r->run_id);
  if (!run) return;
  if (o->shutting_down) {
    protobuf_c_message_free_unpacked(&run->base, NULL);
    rpc_call_finish(call, GRPC_STATUS_UNAVAILABLE, "server shutting down");
    return;
  }
  watch_sub *sub = watch_sub_new(call, r->run_id);
  if (!sub) {
    protobuf_c_message_free_unpacked(&run->base, NULL);
    rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  /* First the run as it is, then stored steps after from_step, then live events. */
  Rlorch__V1__RunEvent ev = RLORCH__V1__RUN_EVENT__INIT;
  ev.event_case = RLORCH__V1__RUN_EVENT__EVENT_RUN;
  ev.run = run;
  watch_send(sub, &ev);
  if (r->from_step >= -1) store_steps_list(o->db, r->run_id, r->from_step, replay_step, sub);
  int final = control_api_run_is_final(run->state);
  protobuf_c_message_free_unpacked(&run->base, NULL);
  if (final) {
    rpc_call_finish(call, GRPC_STATUS_OK, "run ended");
    watch_sub_free(sub);
    return;
  }
  watch_subscribe(o->watch, sub);
}

#define M(name, kind, req, resp, fn)                                                             \
  {"/rlorch.v1.Control/" name, kind, &req, &resp, 1, fn, NULL}
const rpc_method control_api_methods[] = {
    M("StartRun", RPC_UNARY, rlorch__v1__run_spec__descriptor, rlorch__v1__run__descriptor,
      h_start_run),
    M("StopRun", RPC_UNARY, rlorch__v1__stop_run_request__descriptor,
      rlorch__v1__run__descriptor, h_stop_run),
    M("GetRun", RPC_UNARY, rlorch__v1__get_run_request__descriptor, rlorch__v1__run__descriptor,
      h_get_run),
    M("ListRuns", RPC_UNARY, rlorch__v1__list_runs_request__descriptor,
      rlorch__v1__list_runs_response__descriptor, h_list_runs),
    M("ListWorkers", RPC_UNARY, rlorch__v1__list_workers_request__descriptor,
      rlorch__v1__list_workers_response__descriptor, h_list_workers),
    M("WatchRun", RPC_SERVER_STREAM, rlorch__v1__watch_run_request__descriptor,
      rlorch__v1__run_event__descriptor, h_watch_run),
    M("SetBroadcastPolicy", RPC_UNARY, rlorch__v1__set_broadcast_policy_request__descriptor,
      rlorch__v1__run__descriptor, h_set_policy),
    M("GetTopology", RPC_UNARY, rlorch__v1__get_topology_request__descriptor,
      rlorch__v1__get_topology_response__descriptor, h_get_topology),
};
const size_t control_api_nmethods = sizeof control_api_methods / sizeof control_api_methods[0];
#undef M
