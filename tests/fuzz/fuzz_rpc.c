/* Fuzz target: the gRPC request messages as the handlers receive them.
 *
 * Input: one byte that picks the message type, then the message's bytes,
 * decoded as the rpc layer decodes every message (rpc_unpack). A message that
 * decodes goes through what its handler checks before any state is touched:
 *   RunSpec (Control.StartRun)   control_api_validate_spec, StartRun's checks
 *   RegisterRequest              the role and length checks of Register, the
 *                                trainer's manifest (bcast_manifest_from_pb),
 *                                and a plan built from it as the runner does
 *   ReportRequest                rollout_check and the conversions for the
 *                                scheduler (sched_pb_*), the step's manifest
 *   Command (agents' side)       the plan decoder (agent_pb_plan) and the
 *                                rollout request (agent_pb_request)
 * and every message through pbjson (what ctl prints and the rollout log
 * writes) and through pack/unpack (what the store keeps must decode again to
 * the same bytes). */
#include "fuzz_util.h"
#include "rpc_kinds.h"

#include <inttypes.h>

#include "orchestrator/common/pbjson.h"
#include "orchestrator/daemon/config.h"
#include "orchestrator/daemon/control_api.h"
#include "orchestrator/daemon/rollout_check.h"
#include "orchestrator/daemon/sched_pb.h"
#include "orchestrator/daemon/workers.h"
#include "rpc/rpc.h"
#include "rlorch/v1/control.pb-c.h"
#include "rlorch/v1/worker.pb-c.h"
#include "workers/agent/agent_pb.h"
#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_pb.h"

static config cfg;
static FILE *devnull;
static fuzz_file prompts; /* the JSONL file a RunSpec's jsonl_path is pointed at */

/* ---- Control ------------------------------------------------------------------------------ */

static void check_run_spec(const ProtobufCMessage *m) {
  const Rlorch__V1__RunSpec *in = (const void *)m;
  Rlorch__V1__RunSpec spec = *in;
  Rlorch__V1__PromptSource ps;
  /* A path from the input would open whatever file it names: point it at the
   * harness's own, except when it is too long to be opened at all (that
   * check is the spec's). */
  if (in->prompts && in->prompts->source_case == RLORCH__V1__PROMPT_SOURCE__SOURCE_JSONL_PATH &&
      strlen(in->prompts->jsonl_path) < 4096) {
    ps = *in->prompts;
    ps.jsonl_path = in->prompts->jsonl_path[0] ? prompts.path : "";
    spec.prompts = &ps;
  }
  char err[400] = "";
  int rc = control_api_validate_spec(&cfg, &spec, err, sizeof err);
  FUZZ_CHECK(rc == 0 || rc == -1, "rc %d", rc);
  /* A refusal names the field: "steps: ...", "prompts.jsonl_path: ...". */
  if (rc) FUZZ_CHECK(err[0] && strchr(err, ':'), "refused without a reason: '%s'", err);
  /* The request itself is left as it came (the handler's is freed by the rpc layer). */
  FUZZ_CHECK(spec.sampling == in->sampling, "validation changed the request's sampling");
}

/* ---- Worker ------------------------------------------------------------------------------- */

/* A plan as the runner builds one from a trainer's manifest, bounded: a
 * manifest may declare up to 2^50 bytes a tensor, and one bucket per staging
 * budget of them is a size the harness has no use for. */
static void check_planned(const bcast_tensor *t, size_t n, uint64_t budget) {
  uint64_t buckets = n;
  for (size_t i = 0; i < n; i++) {
    size_t esz = bcast_dtype_size(t[i].wire_dtype);
    buckets += bcast_tensor_elems(&t[i]) / (budget / (esz ? esz : 1));
  }
  if (buckets > 4096) return;
  bcast_plan_opts o = {.id = "run-1/step-0", .mode = BCAST_MODE_HOST, .world_size = 3,
                       .root_rank = 0, .staging_budget = budget, .host_endpoint = "127.0.0.1:1"};
  bcast_plan *p = NULL;
  bcast_err e = {0};
  if (bcast_plan_build(t, n, &o, &p, &e) != 0) {
    FUZZ_CHECK(e.msg[0], "plan refused without a reason");
    return;
  }
  /* What the planner makes, every participant's decoder must accept. */
  FUZZ_CHECK(bcast_plan_validate(p, &e) == 0, "built plan does not validate: %s", e.msg);
  FUZZ_CHECK(bcast_plan_hash(p) == p->hash, "built plan's hash is stale");
  uint8_t *buf = NULL;
  size_t len = 0;
  FUZZ_CHECK(bcast_plan_pack(p, &buf, &len, &e) == 0, "pack: %s", e.msg);
  bcast_plan *q = NULL;
  FUZZ_CHECK(bcast_plan_unpack(buf, len, &q, &e) == 0, "a packed plan does not unpack: %s", e.msg);
  FUZZ_CHECK(q->hash == p->hash && q->nbuckets == p->nbuckets, "plan changed on the wire");
  FUZZ_CHECK(bcast_plan_wire_bytes(q) == bcast_plan_wire_bytes(p), "wire bytes changed");
  bcast_plan_free(q);
  free(buf);
  bcast_plan_free(p);
}

static void check_manifest(const Rlorch__V1__WeightManifest *m, uint64_t budget) {
  bcast_tensor *t = NULL;
  size_t n = 0;
  bcast_err e = {0};
  if (bcast_manifest_from_pb(m, &t, &n, &e) != 0) {
    FUZZ_CHECK(e.msg[0] && !t, "manifest refused without a reason");
    return;
  }
  FUZZ_CHECK(n == m->n_tensors, "%zu of %zu tensors", n, m->n_tensors);
  check_planned(t, n, budget);
  free(t);
}

static void check_register(const ProtobufCMessage *m) {
  const Rlorch__V1__RegisterRequest *q = (const void *)m;
  /* Register's own checks, in its order; the rest is the worker table's. */
  if (q->role != RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER &&
      q->role != RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE)
    return;
  if (strlen(q->name) >= WORKERS_NAME_MAX || strlen(q->data_address) >= WORKERS_ADDRESS_MAX)
    return;
  if (q->manifest && q->manifest->n_tensors) check_manifest(q->manifest, cfg.staging_budget_bytes);
}

static void check_report(const ProtobufCMessage *m) {
  const Rlorch__V1__ReportRequest *q = (const void *)m;
  switch (q->kind_case) {
  case RLORCH__V1__REPORT_REQUEST__KIND_ROLLOUTS: {
    const Rlorch__V1__RolloutResult *res = q->rollouts;
    FUZZ_CHECK(res, "rollouts case without a message");
    char why[256] = "";
    rollout_fault f = rollout_check(res, cfg.max_rollout_bytes, why, sizeof why);
    FUZZ_CHECK(f >= ROLLOUT_OK && f < ROLLOUT_REASONS, "fault %d", (int)f);
    if (f != ROLLOUT_OK) {
      FUZZ_CHECK(why[0], "fault %s without a message", rollout_fault_name(f));
      break;
    }
    /* Accepted: what the scheduler is handed. */
    sched_rollout *v = calloc(res->n_rollouts ? res->n_rollouts : 1, sizeof *v);
    FUZZ_CHECK(v, "out of memory");
    sched_pb_rollouts(res, v);
    for (size_t i = 0; i < res->n_rollouts; i++)
      FUZZ_CHECK(v[i].id == res->rollouts[i]->id && v[i].tokens == rollout_tokens(res->rollouts[i]),
                 "rollout %zu converted wrong", i);
    free(v);
    break;
  }
  case RLORCH__V1__REPORT_REQUEST__KIND_BROADCAST_DONE: {
    sched_bcast_report rep;
    sched_pb_bcast_report(q->broadcast_done, &rep);
    FUZZ_CHECK(memchr(rep.transport, 0, sizeof rep.transport), "transport not terminated");
    break;
  }
  case RLORCH__V1__REPORT_REQUEST__KIND_STEP_DONE:
    if (q->step_done->manifest && q->step_done->manifest->n_tensors)
      check_manifest(q->step_done->manifest, cfg.staging_budget_bytes);
    break;
  default:
    break;
  }
}

/* ---- what the agents decode --------------------------------------------------------------- */

static void check_command(const ProtobufCMessage *m) {
  const Rlorch__V1__Command *c = (const void *)m;
  if (c->kind_case == RLORCH__V1__COMMAND__KIND_PLAN) {
    bcast_plan *p = NULL;
    bcast_err e = {0};
    if (agent_pb_plan(c->plan, &p, &e) == 0) {
      FUZZ_CHECK(bcast_plan_validate(p, &e) == 0, "decoded plan does not validate: %s", e.msg);
      bcast_plan_free(p);
    } else {
      FUZZ_CHECK(e.msg[0] && !p, "plan refused without a reason");
    }
  } else if (c->kind_case == RLORCH__V1__COMMAND__KIND_ROLLOUT) {
    agent_request r;
    agent_pb_request(c->rollout, &r);
    FUZZ_CHECK(r.n_prompt == c->rollout->n_prompt_token_ids, "prompt length changed");
    FUZZ_CHECK(r.group_id != 0 || c->rollout->request_id == 0, "group id 0 for request %" PRIu64,
               c->rollout->request_id);
  }
}

/* ---- the table ---------------------------------------------------------------------------- */

/* The check of a message type; none beyond decoding, pbjson and re-packing
 * for the others. */
typedef void check_fn(const ProtobufCMessage *m);

static check_fn *check_of(const ProtobufCMessageDescriptor *d) {
  if (d == &rlorch__v1__run_spec__descriptor) return check_run_spec;
  if (d == &rlorch__v1__register_request__descriptor) return check_register;
  if (d == &rlorch__v1__report_request__descriptor) return check_report;
  if (d == &rlorch__v1__command__descriptor) return check_command;
  return NULL;
}

/* Packed again, a decoded message decodes to the same bytes once more. */
static void check_repack(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *a = malloc(n ? n : 1);
  FUZZ_CHECK(a, "out of memory");
  FUZZ_CHECK(protobuf_c_message_pack(m, a) == n, "packed size differs");
  ProtobufCMessage *m2 = rpc_unpack(m->descriptor, a, n);
  FUZZ_CHECK(m2, "%s: its own encoding does not decode", m->descriptor->name);
  size_t n2 = protobuf_c_message_get_packed_size(m2);
  uint8_t *b = malloc(n2 ? n2 : 1);
  FUZZ_CHECK(b, "out of memory");
  FUZZ_CHECK(protobuf_c_message_pack(m2, b) == n2, "packed size differs");
  FUZZ_CHECK(n == n2 && !memcmp(a, b, n), "%s: encoding not stable", m->descriptor->name);
  free(b);
  protobuf_c_message_free_unpacked(m2, NULL);
  free(a);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  config_defaults(&cfg);
  devnull = fopen("/dev/null", "w");
  FUZZ_CHECK(devnull, "cannot open /dev/null");
  fuzz_file_init(&prompts, "prompts.jsonl");
  static const char line[] = "{\"prompt_token_ids\": [1, 2, 3], \"metadata\": \"m\"}\n";
  fuzz_file_set(&prompts, line, sizeof line - 1);
  /* The seam answers as StartRun does: a spec is refused by the field at fault. */
  Rlorch__V1__RunSpec s = RLORCH__V1__RUN_SPEC__INIT;
  char err[400];
  FUZZ_CHECK(control_api_validate_spec(&cfg, &s, err, sizeof err) == 0, "empty spec: %s", err);
  s.steps = 10000001;
  FUZZ_CHECK(control_api_validate_spec(&cfg, &s, err, sizeof err) == -1 && !strncmp(err, "steps:", 6),
             "steps over the limit: '%s'", err);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const ProtobufCMessageDescriptor *d = rpc_kinds[data[0] % RPC_NKINDS];
  ProtobufCMessage *m = rpc_unpack(d, data + 1, size - 1);
  if (!m) return 0;
  check_fn *check = check_of(d);
  if (check) check(m);
  pbjson_write(devnull, m);
  check_repack(m);
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}
