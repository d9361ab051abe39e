/* `rlorch ctl`: command-line client of the Control API. Tables for people,
 * one JSON object per line with --json. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grpc/health/v1/health.pb-c.h"
#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/ctl_format.h"
#include "orchestrator/common/opt.h"
#include "orchestrator/common/pbjson.h"
#include "rlorch/v1/control.pb-c.h"
#include "rpc/rpc.h"

extern char **environ;

/* Global settings, before the command word. */
typedef struct ctl_opts {
  char *orchestrator;
  char *token_file;
  char *tls_ca_file;
  bool json;
  double timeout_s;
  char *tls_client_cert_file, *tls_client_key_file; /* for a server that asks (mutual TLS) */
} ctl_opts;

/* Every command's flags and arguments; each command's table uses its part. */
typedef struct ctl_args {
  char *run_name, *preset, *stop_reason, *run_id, *run_filter, *service, *prompts;
  uint32_t steps, max_async_level, rollouts_per_step, max_requests_per_worker, limit;
  uint32_t group_size, prompt_tokens, max_tokens, top_k, request_timeout_ms;
  uint64_t prompt_seed, sampling_seed;
  double temperature, top_p;
  int policy, offload, run_state;
  uint64_t staging_budget_bytes;
  int64_t from_step;
  bool max_async_set; /* --max-async-level given: 0 is a value, not "unset" */
  bool sampling_set;  /* a sampling flag given: the run gets these sampling parameters */
  bool temperature_set;
} ctl_args;

typedef struct ctl {
  rpc_client *client;
  int json;
  double timeout_s;
  int timeout_set;
} ctl;

/* Short names first; the protobuf names (RUN_STATE_STOPPED, ...) are accepted
 * too, as ctl always did. */
static const opt_name ctl__modes[] = {
    {"auto", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_AUTO},
    {"direct", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_DIRECT},
    {"staged", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_STAGED},
    {"host", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_HOST},
    {"colocated", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_COLOCATED},
    {"BROADCAST_MODE_AUTO", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_AUTO},
    {"BROADCAST_MODE_DIRECT", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_DIRECT},
    {"BROADCAST_MODE_STAGED", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_STAGED},
    {"BROADCAST_MODE_HOST", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_HOST},
    {"BROADCAST_MODE_COLOCATED", RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_COLOCATED},
    {NULL, 0}};
static const opt_name ctl__offloads[] = {
    {"none", RLORCH__V1__OFFLOAD__OFFLOAD_NONE},
    {"params", RLORCH__V1__OFFLOAD__OFFLOAD_PARAMS},
    {"params+optimizer", RLORCH__V1__OFFLOAD__OFFLOAD_PARAMS_AND_OPTIMIZER},
    {"OFFLOAD_NONE", RLORCH__V1__OFFLOAD__OFFLOAD_NONE},
    {"OFFLOAD_PARAMS", RLORCH__V1__OFFLOAD__OFFLOAD_PARAMS},
    {"OFFLOAD_PARAMS_AND_OPTIMIZER", RLORCH__V1__OFFLOAD__OFFLOAD_PARAMS_AND_OPTIMIZER},
    {NULL, 0}};
static const opt_name ctl__states[] = {
    {"pending", RLORCH__V1__RUN_STATE__RUN_STATE_PENDING},
    {"running", RLORCH__V1__RUN_STATE__RUN_STATE_RUNNING},
    {"stopping", RLORCH__V1__RUN_STATE__RUN_STATE_STOPPING},
    {"stopped", RLORCH__V1__RUN_STATE__RUN_STATE_STOPPED},
    {"succeeded", RLORCH__V1__RUN_STATE__RUN_STATE_SUCCEEDED},
    {"failed", RLORCH__V1__RUN_STATE__RUN_STATE_FAILED},
    {"RUN_STATE_PENDING", RLORCH__V1__RUN_STATE__RUN_STATE_PENDING},
    {"RUN_STATE_RUNNING", RLORCH__V1__RUN_STATE__RUN_STATE_RUNNING},
    {"RUN_STATE_STOPPING", RLORCH__V1__RUN_STATE__RUN_STATE_STOPPING},
    {"RUN_STATE_STOPPED", RLORCH__V1__RUN_STATE__RUN_STATE_STOPPED},
    {"RUN_STATE_SUCCEEDED", RLORCH__V1__RUN_STATE__RUN_STATE_SUCCEEDED},
    {"RUN_STATE_FAILED", RLORCH__V1__RUN_STATE__RUN_STATE_FAILED},
    {NULL, 0}};

#define CO(m, ctype) OPT_OFF(ctl_opts, m, ctype)
#define CA(m, ctype) OPT_OFF(ctl_args, m, ctype)

static const opt_field ctl__global_fields[] = {
    /* The address the agents dial too, hence RLORCH_ORCHESTRATOR; --target and
     * RLORCH_TARGET are the names ctl had first. */
    {.name = "orchestrator", .flag = "--target", .alias = "--orchestrator", .type = OPT_TARGET,
     .off = CO(orchestrator, char *), .metavar = "TARGET",
     .help = "orchestrator's gRPC target: HOST:PORT, dns:///HOST:PORT, unix:PATH, ...",
     .env_old = "RLORCH_TARGET"},
    {.name = "token_file", .flag = "--token-file", .type = OPT_PATH, .off = CO(token_file, char *),
     .metavar = "FILE", .help = "file holding the bearer token"},
    {.name = "tls_ca_file", .flag = "--tls-ca", .type = OPT_PATH, .off = CO(tls_ca_file, char *),
     .metavar = "FILE", .help = "PEM roots to verify the server by; turns TLS on"},
    {.name = "tls_client_cert_file", .flag = "--tls-client-cert", .type = OPT_PATH,
     .off = CO(tls_client_cert_file, char *), .metavar = "FILE",
     .help = "PEM client certificate for a server that asks for one (with --tls-client-key)"},
    {.name = "tls_client_key_file", .flag = "--tls-client-key", .type = OPT_PATH,
     .off = CO(tls_client_key_file, char *), .metavar = "FILE", .help = "PEM private key of --tls-client-cert"},
    {.name = "json", .flag = "--json", .type = OPT_SWITCH, .off = CO(json, bool),
     .help = "one JSON object per line instead of tables"},
    {.name = "timeout_s", .flag = "--timeout", .type = OPT_DOUBLE, .off = CO(timeout_s, double),
     .min = 0, .max = 86400, .flags = OPT_GT_MIN, .metavar = "SECONDS",
     .help = "deadline of a call; a watch-run has none unless set"},
};

static const opt_cmd ctl__global_cmd = {
    .name = "ctl",
    .about = "Calls the Control API: one call or one stream, then exits.",
    .fields = ctl__global_fields,
    .nfields = sizeof ctl__global_fields / sizeof ctl__global_fields[0],
    .flags = OPT_CMD_SUBCOMMAND,
    .footer = "commands (`rlorch ctl COMMAND --help` for each):\n"
              "  start-run      start a run\n"
              "  stop-run       stop a run\n"
              "  get-run        show a run\n"
              "  list-runs      list runs\n"
              "  list-workers   list workers: role, state, node and NICs, run, GPUs\n"
              "  topology       the nodes the cost model sees: NICs, workers, GPUs, links\n"
              "  watch-run      stream a run's events\n"
              "  set-policy     override the broadcast mode of a run\n"
              "  health         gRPC health of a service\n",
};

#define CTL__RUN_ID                                                                           \
  {.name = "run_id", .type = OPT_STR, .off = CA(run_id, char *), .metavar = "RUN_ID",          \
   .flags = OPT_ARG, .help = "the run"}

static const opt_field ctl__start_fields[] = {
    {.name = "run_name", .flag = "--name", .type = OPT_STR, .off = CA(run_name, char *),
     .metavar = "NAME", .help = "name of the run"},
    {.name = "preset", .flag = "--preset", .type = OPT_STR, .off = CA(preset, char *),
     .metavar = "P", .help = "model preset the trainer must hold: 100m, 1b, 4b, 8b",
     .dflt = "the trainer's"},
    {.name = "steps", .flag = "--steps", .type = OPT_U32, .off = CA(steps, uint32_t),
     .metavar = "N", .help = "steps to take", .dflt = "the orchestrator's"},
    {.name = "max_async_level", .flag = "--max-async-level", .type = OPT_U32,
     .off = CA(max_async_level, uint32_t), .metavar = "N", .help = "off-policy bound",
     .dflt = "the orchestrator's"},
    {.name = "policy", .flag = "--policy", .type = OPT_ENUM, .off = CA(policy, int),
     .names = ctl__modes, .metavar = "MODE", .help = "broadcast mode",
     .dflt = "the orchestrator's"},
    {.name = "rollouts_per_step", .flag = "--rollouts-per-step", .type = OPT_U32,
     .off = CA(rollouts_per_step, uint32_t), .metavar = "N", .help = "rollouts in a batch",
     .dflt = "the orchestrator's"},
    {.name = "max_requests_per_worker", .flag = "--max-requests-per-worker", .type = OPT_U32,
     .off = CA(max_requests_per_worker, uint32_t), .metavar = "N",
     .help = "rollout requests in flight on one inference worker", .dflt = "the orchestrator's"},
    {.name = "group_size", .flag = "--group-size", .type = OPT_U32, .off = CA(group_size, uint32_t),
     .metavar = "N", .help = "completions per prompt (rollouts-per-step is a multiple)",
     .dflt = "the orchestrator's"},
    {.name = "prompts", .flag = "--prompts", .type = OPT_STR, .off = CA(prompts, char *),
     .metavar = "FILE", .help = "JSONL prompts, a path on the orchestrator's host",
     .dflt = "the orchestrator's"},
    {.name = "prompt_tokens", .flag = "--synthetic-prompt-tokens", .type = OPT_U32,
     .off = CA(prompt_tokens, uint32_t), .metavar = "N",
     .help = "synthetic prompts of N tokens instead of a file", .dflt = "the orchestrator's"},
    {.name = "prompt_seed", .flag = "--prompt-seed", .type = OPT_U64, .off = CA(prompt_seed, uint64_t),
     .metavar = "S", .help = "seed of the synthetic prompts", .dflt = "0"},
    {.name = "temperature", .flag = "--temperature", .type = OPT_DOUBLE,
     .off = CA(temperature, double), .min = 0, .max = 100, .metavar = "T",
     .help = "sampling temperature, 0 greedy",
     .dflt = "1 with another sampling flag, else the orchestrator's"},
    {.name = "top_p", .flag = "--top-p", .type = OPT_DOUBLE, .off = CA(top_p, double), .min = 0,
     .max = 1, .metavar = "P", .help = "nucleus sampling; 0 or 1: off", .dflt = "off"},
    {.name = "top_k", .flag = "--top-k", .type = OPT_U32, .off = CA(top_k, uint32_t),
     .metavar = "K", .help = "sample among the K most likely tokens; 0: off", .dflt = "off"},
    {.name = "max_tokens", .flag = "--max-tokens", .type = OPT_U32, .off = CA(max_tokens, uint32_t),
     .metavar = "N", .help = "completion tokens per sequence", .dflt = "the orchestrator's"},
    {.name = "sampling_seed", .flag = "--sampling-seed", .type = OPT_U64,
     .off = CA(sampling_seed, uint64_t), .metavar = "S", .help = "sampling seed",
     .dflt = "the engine's choice"},
    {.name = "request_timeout_ms", .flag = "--request-timeout-ms", .type = OPT_U32,
     .off = CA(request_timeout_ms, uint32_t), .metavar = "MS",
     .help = "re-send a rollout request slower than this to another worker",
     .dflt = "the orchestrator's"},
    {.name = "offload", .flag = "--offload", .type = OPT_ENUM, .off = CA(offload, int),
     .names = ctl__offloads, .metavar = "O",
     .help = "what the trainer must keep in host memory", .dflt = "the trainer's"},
    {.name = "staging_budget_bytes", .flag = "--staging-budget", .type = OPT_BYTES,
     .off = CA(staging_budget_bytes, uint64_t), .metavar = "BYTES",
     .help = "staging memory per bucket", .dflt = "the orchestrator's"},
};
static const opt_field ctl__stop_fields[] = {
    CTL__RUN_ID,
    {.name = "stop_reason", .flag = "--reason", .type = OPT_STR, .off = CA(stop_reason, char *),
     .metavar = "TEXT", .help = "why, kept with the run"},
};
static const opt_field ctl__get_fields[] = {CTL__RUN_ID};
static const opt_field ctl__list_runs_fields[] = {
    {.name = "run_state", .flag = "--state", .type = OPT_ENUM, .off = CA(run_state, int),
     .names = ctl__states, .metavar = "STATE", .help = "only runs in this state",
     .dflt = "all"},
    {.name = "limit", .flag = "--limit", .type = OPT_U32, .off = CA(limit, uint32_t),
     .metavar = "N", .help = "at most N runs", .dflt = "the orchestrator's"},
};
static const opt_field ctl__list_workers_fields[] = {
    {.name = "run_id", .flag = "--run", .type = OPT_STR, .off = CA(run_filter, char *),
     .metavar = "RUN_ID", .help = "only the workers of this run", .dflt = "all"},
};
static const opt_field ctl__topology_fields[] = {
    {.name = "run_id", .flag = "--run", .type = OPT_STR, .off = CA(run_filter, char *),
     .metavar = "RUN_ID", .help = "only the workers of this run", .dflt = "every live worker"},
};
static const opt_field ctl__watch_fields[] = {
    CTL__RUN_ID,
    {.name = "from_step", .flag = "--from-step", .type = OPT_I64, .off = CA(from_step, int64_t),
     .metavar = "N", .help = "replay step records from step N; -1: only new events"},
};
static const opt_field ctl__set_policy_fields[] = {
    CTL__RUN_ID,
    {.name = "policy", .type = OPT_ENUM, .off = CA(policy, int), .names = ctl__modes,
     .metavar = "MODE", .flags = OPT_ARG, .help = "broadcast mode"},
};
static const opt_field ctl__health_fields[] = {
    {.name = "service", .type = OPT_STR, .off = CA(service, char *), .metavar = "SERVICE",
     .flags = OPT_ARG | OPT_OPTIONAL, .help = "service name", .dflt = "the whole server"},
};

typedef int (*ctl__fn)(ctl *c, const ctl_args *a);
static int fail_status(const char *what, const rpc_status *st) {
  fprintf(stderr, "rlorch ctl: %s: %s: %s\n", what, rpc_status_name(st->code), st->message);
  return 1;
}

static void print_json(const ProtobufCMessage *m) {
  pbjson_write(stdout, m);
  fputc('\n', stdout);
  fflush(stdout);
}

static int unary(ctl *c, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *rd, ProtobufCMessage **resp) {
  rpc_status st;
  if (rpc_client_call(c->client, method, req, rd, c->timeout_s, resp, &st) != GRPC_STATUS_OK)
    return fail_status(method, &st);
  return 0;
}

static int show_run(ctl *c, ProtobufCMessage *m) {
  if (c->json) print_json(m);
  else ctl_print_runs(stdout, (const Rlorch__V1__Run *const *)&m, 1);
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}

static int do_start_run(ctl *c, const ctl_args *a) {
  Rlorch__V1__RunSpec spec = RLORCH__V1__RUN_SPEC__INIT;
  if (a->run_name) spec.name = a->run_name;
  if (a->preset) spec.preset = a->preset;
  spec.steps = a->steps;
  if (a->max_async_set) {
    spec.async_bound_case = RLORCH__V1__RUN_SPEC__ASYNC_BOUND_MAX_ASYNC_LEVEL;
    spec.max_async_level = a->max_async_level;
  }
  spec.rollouts_per_step = a->rollouts_per_step;
  spec.max_requests_per_worker = a->max_requests_per_worker;
  spec.staging_budget_bytes = a->staging_budget_bytes;
  spec.policy = (Rlorch__V1__BroadcastMode)a->policy;
  spec.offload = (Rlorch__V1__Offload)a->offload;
  spec.group_size = a->group_size;
  spec.request_timeout_ms = a->request_timeout_ms;
  Rlorch__V1__PromptSource ps = RLORCH__V1__PROMPT_SOURCE__INIT;
  Rlorch__V1__SyntheticPrompts syn = RLORCH__V1__SYNTHETIC_PROMPTS__INIT;
  if (a->prompts && a->prompt_tokens) {
    fprintf(stderr, "rlorch ctl start-run: --prompts and --synthetic-prompt-tokens: give one\n");
    return 2;
  }
  if (a->prompts) {
    ps.source_case = RLORCH__V1__PROMPT_SOURCE__SOURCE_JSONL_PATH;
    ps.jsonl_path = a->prompts;
    spec.prompts = &ps;
  } else if (a->prompt_tokens || a->prompt_seed) {
    syn.prompt_tokens = a->prompt_tokens;
    syn.seed = a->prompt_seed;
    ps.source_case = RLORCH__V1__PROMPT_SOURCE__SOURCE_SYNTHETIC;
    ps.synthetic = &syn;
    spec.prompts = &ps;
  }
  Rlorch__V1__SamplingParams sp = RLORCH__V1__SAMPLING_PARAMS__INIT;
  if (a->sampling_set) {
    sp.temperature = a->temperature_set ? (float)a->temperature : 1.0f;
    sp.top_p = (float)a->top_p;
    sp.top_k = a->top_k;
    sp.max_tokens = a->max_tokens;
    sp.seed = a->sampling_seed;
    spec.sampling = &sp;
  }
  ProtobufCMessage *resp;
  if (unary(c, "/rlorch.v1.Control/StartRun", &spec.base, &rlorch__v1__run__descriptor, &resp))
    return 1;
  return show_run(c, resp);
}

static int do_stop_run(ctl *c, const ctl_args *a) {
  Rlorch__V1__StopRunRequest req = RLORCH__V1__STOP_RUN_REQUEST__INIT;
  req.run_id = a->run_id;
  if (a->stop_reason) req.reason = a->stop_reason;
  ProtobufCMessage *resp;
  if (unary(c, "/rlorch.v1.Control/StopRun", &req.base, &rlorch__v1__run__descriptor, &resp))
    return 1;
  return show_run(c, resp);
}

static int do_get_run(ctl *c, const ctl_args *a) {
  Rlorch__V1__GetRunRequest req = RLORCH__V1__GET_RUN_REQUEST__INIT;
  req.run_id = a->run_id;
  ProtobufCMessage *resp;
  if (unary(c, "/rlorch.v1.Control/GetRun", &req.base, &rlorch__v1__run__descriptor, &resp))
    return 1;
  return show_run(c, resp);
}

static int do_set_policy(ctl *c, const ctl_args *a) {
  Rlorch__V1__SetBroadcastPolicyRequest req = RLORCH__V1__SET_BROADCAST_POLICY_REQUEST__INIT;
  req.run_id = a->run_id;
  req.policy = (Rlorch__V1__BroadcastMode)a->policy;
  ProtobufCMessage *resp;
  if (unary(c, "/rlorch.v1.Control/SetBroadcastPolicy", &req.base, &rlorch__v1__run__descriptor,
            &resp))
    return 1;
  return show_run(c, resp);
}

static int do_list_runs(ctl *c, const ctl_args *a) {
  Rlorch__V1__ListRunsRequest req = RLORCH__V1__LIST_RUNS_REQUEST__INIT;
  req.limit = a->limit;
  req.state = (Rlorch__V1__RunState)a->run_state;
  ProtobufCMessage *resp;
  if (unary(c, "/rlorch.v1.Control/ListRuns", &req.base,
            &rlorch__v1__list_runs_response__descriptor, &resp))
    return 1;
  const Rlorch__V1__ListRunsResponse *r = (const Rlorch__V1__ListRunsResponse *)resp;
  if (c->json) print_json(resp);
  else ctl_print_runs(stdout, (const Rlorch__V1__Run *const *)r->runs, r->n_runs);
  protobuf_c_message_free_unpacked(resp, NULL);
  return 0;
}

static int do_list_workers(ctl *c, const ctl_args *a) {
  Rlorch__V1__ListWorkersRequest req = RLORCH__V1__LIST_WORKERS_REQUEST__INIT;
  if (a->run_filter) req.run_id = a->run_filter;
  ProtobufCMessage *resp;
  if (unary(c, "/rlorch.v1.Control/ListWorkers", &req.base,
            &rlorch__v1__list_workers_response__descriptor, &resp))
    return 1;
  const Rlorch__V1__ListWorkersResponse *r = (const Rlorch__V1__ListWorkersResponse *)resp;
  if (c->json) print_json(resp);
  else ctl_print_workers(stdout, (const Rlorch__V1__WorkerInfo *const *)r->workers, r->n_workers);
  protobuf_c_message_free_unpacked(resp, NULL);
  return 0;
}

static int do_topology(ctl *c, const ctl_args *a) {
  Rlorch__V1__GetTopologyRequest req = RLORCH__V1__GET_TOPOLOGY_REQUEST__INIT;
  if (a->run_filter) req.run_id = a->run_filter;
  ProtobufCMessage *resp;
  if (unary(c, "/rlorch.v1.Control/GetTopology", &req.base,
            &rlorch__v1__get_topology_response__descriptor, &resp))
    return 1;
  if (c->json) print_json(resp);
  else ctl_print_topology(stdout, (const Rlorch__V1__GetTopologyResponse *)resp);
  protobuf_c_message_free_unpacked(resp, NULL);
  return 0;
}

typedef struct watch_state {
  ctl *c;
  int header_done;
} watch_state;

static int on_event(ProtobufCMessage *m, void *ud) {
  watch_state *w = ud;
  if (w->c->json) print_json(m);
  else ctl_print_event(stdout, (const Rlorch__V1__RunEvent *)m, &w->header_done);
  fflush(stdout);
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}

static int do_watch(ctl *c, const ctl_args *a) {
  Rlorch__V1__WatchRunRequest req = RLORCH__V1__WATCH_RUN_REQUEST__INIT;
  req.run_id = a->run_id;
  req.from_step = a->from_step;
  watch_state w = {c, 0};
  rpc_status st;
  /* A watch lasts as long as the run unless --timeout was given. */
  if (rpc_client_stream(c->client, "/rlorch.v1.Control/WatchRun", &req.base,
                        &rlorch__v1__run_event__descriptor, c->timeout_set ? c->timeout_s : 0,
                        on_event, &w, &st) != GRPC_STATUS_OK)
    return fail_status("WatchRun", &st);
  return 0;
}

static int do_health(ctl *c, const ctl_args *a) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = a->service ? a->service : "";
  ProtobufCMessage *resp;
  if (unary(c, "/grpc.health.v1.Health/Check", &req.base,
            &grpc__health__v1__health_check_response__descriptor, &resp))
    return 1;
  const Grpc__Health__V1__HealthCheckResponse *h = (const void *)resp;
  int serving = h->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  if (c->json) print_json(resp);
  else
    printf("%s\n", protobuf_c_enum_descriptor_get_value(
                       &grpc__health__v1__health_check_response__serving_status__descriptor,
                       h->status)->name);
  protobuf_c_message_free_unpacked(resp, NULL);
  return serving ? 0 : 1;
}

#define CTL__CMD(n, tbl, what) \
  {.name = "ctl " n, .about = what, .fields = tbl, .nfields = sizeof tbl / sizeof tbl[0]}

static const struct {
  const char *word;
  opt_cmd cmd;
  ctl__fn fn;
} ctl__commands[] = {
    {"start-run", CTL__CMD("start-run", ctl__start_fields,
                           "Starts a run; unset fields take the orchestrator's defaults."),
     do_start_run},
    {"stop-run", CTL__CMD("stop-run", ctl__stop_fields,
                           "Stops a run after the step in flight."),
     do_stop_run},
    {"get-run", CTL__CMD("get-run", ctl__get_fields,
                           "Shows one run."),
     do_get_run},
    {"list-runs", CTL__CMD("list-runs", ctl__list_runs_fields,
                           "Lists runs, newest first."),
     do_list_runs},
    {"list-workers", CTL__CMD("list-workers", ctl__list_workers_fields,
                           "Lists the workers the orchestrator knows."),
     do_list_workers},
    {"topology", CTL__CMD("topology", ctl__topology_fields,
                           "Shows the nodes as the cost model places the workers on them."),
     do_topology},
    {"watch-run", CTL__CMD("watch-run", ctl__watch_fields,
                           "Streams a run's events until it ends (Ctrl-C stops)."),
     do_watch},
    {"set-policy", CTL__CMD("set-policy", ctl__set_policy_fields,
                           "Overrides the broadcast mode of a run from its next step."),
     do_set_policy},
    {"health", CTL__CMD("health", ctl__health_fields,
                           "gRPC health check; exit 0 when SERVING."),
     do_health},
};

static ctl *ctl_current; /* only for the SIGINT handler below */

static void on_sigint(int sig) {
  (void)sig;
  if (ctl_current) rpc_client_cancel_streams(ctl_current->client);
}

static void ctl__defaults(ctl_opts *o) {
  memset(o, 0, sizeof *o);
  o->orchestrator = "127.0.0.1:7070";
  o->timeout_s = 30.0;
}

/* Parses the command's own flags and arguments, then calls it. */
static int ctl__run_command(ctl *c, size_t k, int argc, char **argv) {
  const opt_cmd *cmd = &ctl__commands[k].cmd;
  ctl_args a;
  memset(&a, 0, sizeof a);
  a.from_step = -1;
  opt_state *st = malloc(sizeof *st);
  if (!st) return 1;
  int rc = 2;
  if (opt_parse(cmd, &a, argc, argv, environ, st) != 0) {
    fprintf(stderr, "%s\n", st->err);
  } else if (st->help) {
    ctl_args d;
    memset(&d, 0, sizeof d);
    d.from_step = -1;
    opt_usage(cmd, &d, stdout);
    rc = 0;
  } else {
    a.max_async_set = opt_is_set(st, "max_async_level");
    a.temperature_set = opt_is_set(st, "temperature");
    a.sampling_set = a.temperature_set || opt_is_set(st, "top_p") || opt_is_set(st, "top_k") ||
                     opt_is_set(st, "max_tokens") || opt_is_set(st, "sampling_seed");
    ctl_current = c;
    signal(SIGINT, on_sigint);
    rc = ctl__commands[k].fn(c, &a);
    signal(SIGINT, SIG_DFL);
    ctl_current = NULL;
  }
  opt_free(cmd, &a);
  free(st);
  return rc;
}

int cmd_ctl(int argc, char **argv) {
  ctl_opts o;
  ctl__defaults(&o);
  opt_state *st = malloc(sizeof *st);
  if (!st || opt_own(&ctl__global_cmd, &o)) {
    free(st);
    opt_free(&ctl__global_cmd, &o);
    fprintf(stderr, "rlorch ctl: out of memory\n");
    return 1;
  }
  ctl c = {NULL, 0, 30.0, 0};
  int rc = 2;
  if (opt_parse(&ctl__global_cmd, &o, argc, argv, environ, st) != 0) {
    fprintf(stderr, "%s\n", st->err);
    goto out;
  }
  if (st->help) {
    ctl_opts d;
    ctl__defaults(&d);
    opt_usage(&ctl__global_cmd, &d, stdout);
    rc = 0;
    goto out;
  }
  if (st->rest >= argc) {
    opt_fail(st, "arguments", "missing COMMAND (see rlorch ctl --help)");
    fprintf(stderr, "%s\n", st->err);
    goto out;
  }
  const char *word = argv[st->rest];
  size_t k = 0, n = sizeof ctl__commands / sizeof ctl__commands[0];
  while (k < n && strcmp(ctl__commands[k].word, word)) k++;
  if (k == n) {
    opt_fail(st, "arguments", "unknown command \"%s\" (see rlorch ctl --help)", word);
    fprintf(stderr, "%s\n", st->err);
    goto out;
  }
  c.json = o.json;
  c.timeout_s = o.timeout_s;
  c.timeout_set = opt_is_set(st, "timeout_s");
  char tokbuf[4096];
  if (o.token_file &&
      rpc_token_read(o.token_file, tokbuf, sizeof tokbuf, st->err, sizeof st->err) != 0) {
    char terr[sizeof st->err];
    snprintf(terr, sizeof terr, "%s", st->err);
    opt_fail(st, opt_origin(st, "token_file"), "%s", terr);
    fprintf(stderr, "%s\n", st->err);
    goto out;
  }
  rpc_client_opts co = {.target = o.orchestrator,
                        .token = o.token_file ? tokbuf : NULL,
                        .tls_ca_file = o.tls_ca_file,
                        .tls_cert_file = o.tls_client_cert_file,
                        .tls_key_file = o.tls_client_key_file};
  char err[512];
  if (rpc_client_new(&co, &c.client, err, sizeof err) != 0) {
    fprintf(stderr, "rlorch ctl: %s\n", err);
    rc = 1;
    goto out;
  }
  memset(tokbuf, 0, sizeof tokbuf);
  rc = ctl__run_command(&c, k, argc - st->rest, argv + st->rest);
  rpc_client_free(c.client);
out:
  opt_free(&ctl__global_cmd, &o);
  free(st);
  return rc;
}
