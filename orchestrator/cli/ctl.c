/* `rlorch ctl`: command-line client of the Control API. Tables for people,
 * one JSON object per line with --json. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grpc/health/v1/health.pb-c.h"
#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/ctl_format.h"
#include "orchestrator/common/pbjson.h"
#include "rlorch/v1/control.pb-c.h"
#include "rpc/rpc.h"

typedef struct ctl {
  rpc_client *client;
  int json;
  double timeout_s;
  int timeout_set;
} ctl;

static int usage(FILE *f) {
  fprintf(f,
          "usage: rlorch ctl [--target ADDR] [--token-file F] [--tls-ca F] [--json]\n"
          "                  [--timeout SECONDS] COMMAND [ARGS]\n\n"
          "commands:\n"
          "  start-run [--name N] [--preset P] [--steps N] [--max-async-level N]\n"
          "            [--policy auto|direct|staged|host] [--rollouts-per-step N]\n"
          "            [--offload none|params|params+optimizer] [--staging-budget BYTES]\n"
          "  stop-run RUN_ID [--reason TEXT]\n"
          "  get-run RUN_ID\n"
          "  list-runs [--state STATE] [--limit N]\n"
          "  list-workers [--run RUN_ID]\n"
          "  watch-run RUN_ID [--from-step N]\n"
          "  set-policy RUN_ID auto|direct|staged|host\n"
          "  health [SERVICE]\n\n"
          "--target defaults to $RLORCH_TARGET or 127.0.0.1:7070.\n");
  return 2;
}

static int fail_status(const char *what, const rpc_status *st) {
  fprintf(stderr, "rlorch ctl: %s: %s: %s\n", what, rpc_status_name(st->code), st->message);
  return 1;
}

static int parse_u64(const char *flag, const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || !*s || s[0] == '-') {
    fprintf(stderr, "rlorch ctl: %s: not a non-negative integer: '%s'\n", flag, s);
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_enum(const char *flag, const ProtobufCEnumDescriptor *d, const char *s,
                      int *out) {
  if (pbjson_enum_parse(d, s, out) == 0) return 0;
  char choices[256];
  pbjson_enum_choices(d, choices, sizeof choices);
  fprintf(stderr, "rlorch ctl: %s: unknown value '%s' (want %s)\n", flag, s, choices);
  return -1;
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

static int do_start_run(ctl *c, int argc, char **argv) {
  Rlorch__V1__RunSpec spec = RLORCH__V1__RUN_SPEC__INIT;
  static const struct option opts[] = {
      {"name", required_argument, 0, 'n'},          {"preset", required_argument, 0, 'p'},
      {"steps", required_argument, 0, 's'},         {"max-async-level", required_argument, 0, 'a'},
      {"policy", required_argument, 0, 'P'},        {"rollouts-per-step", required_argument, 0, 'r'},
      {"offload", required_argument, 0, 'o'},       {"staging-budget", required_argument, 0, 'b'},
      {0, 0, 0, 0}};
  int ch, e;
  uint64_t v;
  optind = 1;
  while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (ch) {
    case 'n': spec.name = optarg; break;
    case 'p': spec.preset = optarg; break;
    case 's': if (parse_u64("--steps", optarg, &v)) return 2; spec.steps = (uint32_t)v; break;
    case 'a': if (parse_u64("--max-async-level", optarg, &v)) return 2; spec.max_async_level = (uint32_t)v; break;
    case 'r': if (parse_u64("--rollouts-per-step", optarg, &v)) return 2; spec.rollouts_per_step = (uint32_t)v; break;
    case 'b': if (parse_u64("--staging-budget", optarg, &v)) return 2; spec.staging_budget_bytes = v; break;
    case 'P':
      if (parse_enum("--policy", &rlorch__v1__broadcast_mode__descriptor, optarg, &e)) return 2;
      spec.policy = (Rlorch__V1__BroadcastMode)e;
      break;
    case 'o':
      if (parse_enum("--offload", &rlorch__v1__offload__descriptor, optarg, &e)) return 2;
      spec.offload = (Rlorch__V1__Offload)e;
      break;
    default: return usage(stderr);
    }
  }
  if (optind != argc) return usage(stderr);
  ProtobufCMessage *resp;
  if (unary(c, "/rlorch.v1.Control/StartRun", &spec.base, &rlorch__v1__run__descriptor, &resp))
    return 1;
  return show_run(c, resp);
}

static int do_run_id_call(ctl *c, int argc, char **argv, const char *method) {
  if (argc < 2) return usage(stderr);
  ProtobufCMessage *resp;
  int rc;
  if (!strcmp(method, "/rlorch.v1.Control/StopRun")) {
    Rlorch__V1__StopRunRequest req = RLORCH__V1__STOP_RUN_REQUEST__INIT;
    req.run_id = argv[1];
    if (argc == 4 && !strcmp(argv[2], "--reason")) req.reason = argv[3];
    else if (argc != 2) return usage(stderr);
    rc = unary(c, method, &req.base, &rlorch__v1__run__descriptor, &resp);
  } else {
    if (argc != 2) return usage(stderr);
    Rlorch__V1__GetRunRequest req = RLORCH__V1__GET_RUN_REQUEST__INIT;
    req.run_id = argv[1];
    rc = unary(c, method, &req.base, &rlorch__v1__run__descriptor, &resp);
  }
  return rc ? rc : show_run(c, resp);
}

static int do_set_policy(ctl *c, int argc, char **argv) {
  if (argc != 3) return usage(stderr);
  Rlorch__V1__SetBroadcastPolicyRequest req = RLORCH__V1__SET_BROADCAST_POLICY_REQUEST__INIT;
  int e;
  req.run_id = argv[1];
  if (parse_enum("policy", &rlorch__v1__broadcast_mode__descriptor, argv[2], &e)) return 2;
  req.policy = (Rlorch__V1__BroadcastMode)e;
  ProtobufCMessage *resp;
  if (unary(c, "/rlorch.v1.Control/SetBroadcastPolicy", &req.base, &rlorch__v1__run__descriptor,
            &resp))
    return 1;
  return show_run(c, resp);
}

static int do_list_runs(ctl *c, int argc, char **argv) {
  Rlorch__V1__ListRunsRequest req = RLORCH__V1__LIST_RUNS_REQUEST__INIT;
  for (int i = 1; i < argc; i += 2) {
    uint64_t v;
    int e;
    if (i + 1 >= argc) return usage(stderr);
    if (!strcmp(argv[i], "--limit")) {
      if (parse_u64("--limit", argv[i + 1], &v)) return 2;
      req.limit = (uint32_t)v;
    } else if (!strcmp(argv[i], "--state")) {
      if (parse_enum("--state", &rlorch__v1__run_state__descriptor, argv[i + 1], &e)) return 2;
      req.state = (Rlorch__V1__RunState)e;
    } else {
      return usage(stderr);
    }
  }
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

static int do_list_workers(ctl *c, int argc, char **argv) {
  Rlorch__V1__ListWorkersRequest req = RLORCH__V1__LIST_WORKERS_REQUEST__INIT;
  if (argc == 3 && !strcmp(argv[1], "--run")) req.run_id = argv[2];
  else if (argc != 1) return usage(stderr);
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

static int do_watch(ctl *c, int argc, char **argv) {
  Rlorch__V1__WatchRunRequest req = RLORCH__V1__WATCH_RUN_REQUEST__INIT;
  req.from_step = -1;
  if (argc < 2) return usage(stderr);
  req.run_id = argv[1];
  if (argc == 4 && !strcmp(argv[2], "--from-step")) {
    char *end;
    req.from_step = strtoll(argv[3], &end, 10);
    if (*end || !argv[3][0]) {
      fprintf(stderr, "rlorch ctl: --from-step: not an integer: '%s'\n", argv[3]);
      return 2;
    }
  } else if (argc != 2) {
    return usage(stderr);
  }
  watch_state w = {c, 0};
  rpc_status st;
  /* A watch lasts as long as the run unless --timeout was given. */
  if (rpc_client_stream(c->client, "/rlorch.v1.Control/WatchRun", &req.base,
                        &rlorch__v1__run_event__descriptor, c->timeout_set ? c->timeout_s : 0,
                        on_event, &w,
                        &st) != GRPC_STATUS_OK)
    return fail_status("WatchRun", &st);
  return 0;
}

static int do_health(ctl *c, int argc, char **argv) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = argc > 1 ? argv[1] : "";
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

static ctl *ctl_current; /* only for the SIGINT handler below */

static void on_sigint(int sig) {
  (void)sig;
  if (ctl_current) rpc_client_cancel_streams(ctl_current->client);
}

int cmd_ctl(int argc, char **argv) {
  const char *target = getenv("RLORCH_TARGET");
  const char *token_file = NULL, *ca = NULL;
  ctl c = {NULL, 0, 30.0, 0};
  if (!target || !*target) target = "127.0.0.1:7070";
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--json")) {
      c.json = 1;
    } else if (i + 1 < argc && !strcmp(a, "--target")) {
      target = argv[++i];
    } else if (i + 1 < argc && !strcmp(a, "--token-file")) {
      token_file = argv[++i];
    } else if (i + 1 < argc && !strcmp(a, "--tls-ca")) {
      ca = argv[++i];
    } else if (i + 1 < argc && !strcmp(a, "--timeout")) {
      char *end;
      c.timeout_s = strtod(argv[++i], &end);
      c.timeout_set = 1;
      if (*end || c.timeout_s <= 0) {
        fprintf(stderr, "rlorch ctl: --timeout: want a positive number of seconds\n");
        return 2;
      }
    } else {
      fprintf(stderr, "rlorch ctl: unknown or incomplete flag '%s'\n", a);
      return usage(stderr);
    }
  }
  if (i >= argc) return usage(stderr);
  char *token = NULL, tokbuf[4096];
  if (token_file) {
    char terr[512];
    if (rpc_token_read(token_file, tokbuf, sizeof tokbuf, terr, sizeof terr) != 0) {
      fprintf(stderr, "rlorch ctl: %s\n", terr);
      return 2;
    }
    token = tokbuf;
  }
  rpc_client_opts o = {.target = target, .token = token, .tls_ca_file = ca};
  char err[256];
  if (rpc_client_new(&o, &c.client, err, sizeof err) != 0) {
    fprintf(stderr, "rlorch ctl: %s\n", err);
      return 1;
  }
  const char *cmd = argv[i];
  int sub_argc = argc - i;
  char **sub_argv = argv + i;
  int rc;
  ctl_current = &c;
  signal(SIGINT, on_sigint);
  if (!strcmp(cmd, "start-run")) rc = do_start_run(&c, sub_argc, sub_argv);
  else if (!strcmp(cmd, "stop-run")) rc = do_run_id_call(&c, sub_argc, sub_argv, "/rlorch.v1.Control/StopRun");
  else if (!strcmp(cmd, "get-run")) rc = do_run_id_call(&c, sub_argc, sub_argv, "/rlorch.v1.Control/GetRun");
  else if (!strcmp(cmd, "list-runs")) rc = do_list_runs(&c, sub_argc, sub_argv);
  else if (!strcmp(cmd, "list-workers")) rc = do_list_workers(&c, sub_argc, sub_argv);
  else if (!strcmp(cmd, "watch-run")) rc = do_watch(&c, sub_argc, sub_argv);
  else if (!strcmp(cmd, "set-policy")) rc = do_set_policy(&c, sub_argc, sub_argv);
  else if (!strcmp(cmd, "health")) rc = do_health(&c, sub_argc, sub_argv);
  else {
    fprintf(stderr, "rlorch ctl: unknown command '%s'\n", cmd);
    rc = usage(stderr);
  }
  signal(SIGINT, SIG_DFL);
  ctl_current = NULL;
  rpc_client_free(c.client);
  return rc;
}
