/* Writes the binary seeds of the fuzz corpora: small valid inputs, made with
 * the same code and the same plan the harnesses use, so that they stay
 * valid when a schema or the plan changes.
 *
 *   fuzz_seeds DIR    writes DIR/rpc/, DIR/plan/, DIR/data_root/, DIR/data_receiver/
 *
 * tests/fuzz/corpus holds its output (and the text seeds, written by hand). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data_plan.h"
#include "rlorch/v1/broadcast.pb-c.h"
#include "rlorch/v1/control.pb-c.h"
#include "rlorch/v1/worker.pb-c.h"
#include "rpc_kinds.h"
#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_pb.h"

static const char *root_dir;

static void die(const char *what) {
  fprintf(stderr, "fuzz_seeds: %s\n", what);
  exit(1);
}

static void write_seed(const char *target, const char *name, const void *data, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root_dir, target);
  if (mkdir(path, 0755) != 0 && errno != EEXIST) die(path);
  snprintf(path, sizeof path, "%s/%s/%s", root_dir, target, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) die(path);
}

/* rpc: the kind's index in rpc_kinds, then the packed message. */
static void rpc_seed(const char *name, const ProtobufCMessage *m) {
  size_t k = 0;
  while (k < RPC_NKINDS && rpc_kinds[k] != m->descriptor) k++;
  if (k == RPC_NKINDS) die("message type not in rpc_kinds");
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *b = malloc(n + 1);
  if (!b) die("out of memory");
  b[0] = (uint8_t)k;
  protobuf_c_message_pack(m, b + 1);
  write_seed("rpc", name, b, n + 1);
  free(b);
}

static bcast_plan *plan_or_die(const char *endpoint, bcast_checksum ck) {
  bcast_plan *p = NULL;
  bcast_err e = {0};
  if (data_plan(endpoint, ck, &p, &e) != 0) die(e.msg);
  return p;
}

static Rlorch__V1__WeightManifest *manifest_or_die(void) {
  bcast_tensor t[DATA_NTENSORS];
  data_tensors(t);
  Rlorch__V1__WeightManifest *m = NULL;
  bcast_err e = {0};
  if (bcast_manifest_to_pb(t, DATA_NTENSORS, &m, &e) != 0) die(e.msg);
  return m;
}

/* ---- rpc ------------------------------------------------------------------------------------ */

static void control_seeds(void) {
  Rlorch__V1__SamplingParams sp = RLORCH__V1__SAMPLING_PARAMS__INIT;
  uint32_t stops[] = {2, 7};
  sp.temperature = 0.7f;
  sp.top_p = 0.95f;
  sp.top_k = 40;
  sp.max_tokens = 64;
  sp.stop_token_ids = stops;
  sp.n_stop_token_ids = 2;
  sp.seed = 11;
  Rlorch__V1__PromptSource ps = RLORCH__V1__PROMPT_SOURCE__INIT;
  ps.source_case = RLORCH__V1__PROMPT_SOURCE__SOURCE_JSONL_PATH;
  ps.jsonl_path = "prompts.jsonl";
  Rlorch__V1__RunSpec s = RLORCH__V1__RUN_SPEC__INIT;
  s.name = "gsm8k-grpo";
  s.steps = 100;
  s.policy = RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_HOST;
  s.rollouts_per_step = 16;
  s.group_size = 4;
  s.staging_budget_bytes = 64u << 20;
  s.max_requests_per_worker = 4;
  s.request_timeout_ms = 30000;
  s.async_bound_case = RLORCH__V1__RUN_SPEC__ASYNC_BOUND_MAX_ASYNC_LEVEL;
  s.max_async_level = 2;
  s.prompts = &ps;
  s.sampling = &sp;
  rpc_seed("start_run_jsonl", &s.base);

  Rlorch__V1__SyntheticPrompts syn = RLORCH__V1__SYNTHETIC_PROMPTS__INIT;
  syn.prompt_tokens = 32;
  syn.vocab_size = 1000;
  syn.seed = 3;
  Rlorch__V1__PromptSource ps2 = RLORCH__V1__PROMPT_SOURCE__INIT;
  ps2.source_case = RLORCH__V1__PROMPT_SOURCE__SOURCE_SYNTHETIC;
  ps2.synthetic = &syn;
  Rlorch__V1__RunSpec s2 = RLORCH__V1__RUN_SPEC__INIT;
  s2.preset = "100m";
  s2.steps = 3;
  s2.offload = RLORCH__V1__OFFLOAD__OFFLOAD_NONE;
  s2.prompts = &ps2;
  rpc_seed("start_run_synthetic", &s2.base);

  Rlorch__V1__StopRunRequest stop = RLORCH__V1__STOP_RUN_REQUEST__INIT;
  stop.run_id = "run-1";
  stop.reason = "operator";
  rpc_seed("stop_run", &stop.base);
  Rlorch__V1__GetRunRequest get = RLORCH__V1__GET_RUN_REQUEST__INIT;
  get.run_id = "run-1";
  rpc_seed("get_run", &get.base);
  Rlorch__V1__ListRunsRequest lr = RLORCH__V1__LIST_RUNS_REQUEST__INIT;
  lr.limit = 10;
  lr.state = RLORCH__V1__RUN_STATE__RUN_STATE_RUNNING;
  rpc_seed("list_runs", &lr.base);
  Rlorch__V1__ListWorkersRequest lw = RLORCH__V1__LIST_WORKERS_REQUEST__INIT;
  lw.run_id = "run-1";
  rpc_seed("list_workers", &lw.base);
  Rlorch__V1__WatchRunRequest wr = RLORCH__V1__WATCH_RUN_REQUEST__INIT;
  wr.run_id = "run-1";
  wr.from_step = -1;
  rpc_seed("watch_run", &wr.base);
  Rlorch__V1__SetBroadcastPolicyRequest pol = RLORCH__V1__SET_BROADCAST_POLICY_REQUEST__INIT;
  pol.run_id = "run-1";
  pol.policy = RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_STAGED;
  rpc_seed("set_policy", &pol.base);
}

static void worker_seeds(void) {
  Rlorch__V1__Capabilities caps = RLORCH__V1__CAPABILITIES__INIT;
  caps.cuda_devices = 1;
  caps.cuda_version = "12.4";
  caps.nccl_version = "2.21.5";
  caps.cpu_threads = 16;
  caps.max_concurrent_requests = 8;
  Rlorch__V1__WeightManifest *man = manifest_or_die();
  Rlorch__V1__RegisterRequest reg = RLORCH__V1__REGISTER_REQUEST__INIT;
  reg.role = RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER;
  reg.name = "trainer-0";
  reg.capabilities = &caps;
  reg.manifest = man;
  reg.data_address = "0.0.0.0:7075";
  rpc_seed("register_trainer", &reg.base);
  Rlorch__V1__RegisterRequest inf = RLORCH__V1__REGISTER_REQUEST__INIT;
  inf.role = RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE;
  inf.name = "inference-0";
  inf.capabilities = &caps;
  rpc_seed("register_inference", &inf.base);

  Rlorch__V1__AttachRequest at = RLORCH__V1__ATTACH_REQUEST__INIT;
  at.worker_id = "w-1";
  rpc_seed("attach", &at.base);

  Rlorch__V1__WorkerStats ws = RLORCH__V1__WORKER_STATS__INIT;
  ws.requests_active = 3;
  ws.rollouts_generated = 120;
  ws.tokens_generated = 9000;
  ws.generate_seconds = 4.5;
  Rlorch__V1__Heartbeat hb = RLORCH__V1__HEARTBEAT__INIT;
  hb.policy_version = 4;
  hb.stats = &ws;
  Rlorch__V1__ReportRequest rep = RLORCH__V1__REPORT_REQUEST__INIT;
  rep.worker_id = "w-2";
  rep.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_HEARTBEAT;
  rep.heartbeat = &hb;
  rpc_seed("report_heartbeat", &rep.base);

  uint32_t prompt[] = {1, 2, 3}, comp0[] = {9, 8, 7, 2}, comp1[] = {5, 2};
  float lp0[] = {-0.5f, -1.25f, -0.01f, -2.0f}, lp1[] = {-0.3f, -0.7f};
  double rw0[] = {1.0}, rw1[] = {0.0, 0.5};
  Rlorch__V1__Rollout r0 = RLORCH__V1__ROLLOUT__INIT, r1 = RLORCH__V1__ROLLOUT__INIT;
  r0.id = 101;
  r0.policy_version = 4;
  r0.tokens = 4;
  r0.seconds = 0.02;
  r0.prompt_token_ids = prompt;
  r0.n_prompt_token_ids = 3;
  r0.completion_token_ids = comp0;
  r0.n_completion_token_ids = 4;
  r0.completion_logprobs = lp0;
  r0.n_completion_logprobs = 4;
  r0.rewards = rw0;
  r0.n_rewards = 1;
  r0.group_id = 7;
  r0.finish_reason = RLORCH__V1__FINISH_REASON__FINISH_REASON_STOP;
  r0.metadata.data = (uint8_t *)"answer=42";
  r0.metadata.len = 9;
  r1 = r0;
  r1.id = 102;
  r1.tokens = 0;
  r1.completion_token_ids = comp1;
  r1.n_completion_token_ids = 2;
  r1.completion_logprobs = lp1;
  r1.n_completion_logprobs = 2;
  r1.rewards = rw1;
  r1.n_rewards = 2;
  r1.finish_reason = RLORCH__V1__FINISH_REASON__FINISH_REASON_LENGTH;
  Rlorch__V1__Rollout *rs[] = {&r0, &r1};
  Rlorch__V1__RolloutResult res = RLORCH__V1__ROLLOUT_RESULT__INIT;
  res.request_id = 55;
  res.rollouts = rs;
  res.n_rollouts = 2;
  rep.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_ROLLOUTS;
  rep.rollouts = &res;
  rpc_seed("report_rollouts", &rep.base);

  Rlorch__V1__StepDone sd = RLORCH__V1__STEP_DONE__INIT;
  sd.step = 4;
  sd.train_seconds = 0.3;
  sd.manifest = man;
  sd.weights_checksum = 0x0123456789abcdefull;
  rep.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_STEP_DONE;
  rep.step_done = &sd;
  rpc_seed("report_step_done", &rep.base);

  bcast_plan *p = plan_or_die("10.0.0.1:7075", BCAST_CHECKSUM_XXH3_64);
  Rlorch__V1__PlanAck ack = RLORCH__V1__PLAN_ACK__INIT;
  ack.plan_id = p->id;
  ack.plan_hash = p->hash;
  rep.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_PLAN_ACK;
  rep.plan_ack = &ack;
  rpc_seed("report_plan_ack", &rep.base);

  Rlorch__V1__StepRecord rec = RLORCH__V1__STEP_RECORD__INIT;
  rec.mode = RLORCH__V1__BROADCAST_MODE__BROADCAST_MODE_HOST;
  rec.transport = "host-tcp";
  rec.wire_bytes = bcast_plan_wire_bytes(p);
  rec.wire_seconds = 0.001;
  rec.total_seconds = 0.002;
  rec.gbps = 0.1;
  rec.buckets = (uint32_t)p->nbuckets;
  Rlorch__V1__BroadcastDone bd = RLORCH__V1__BROADCAST_DONE__INIT;
  bd.plan_id = p->id;
  bd.record = &rec;
  bd.weights_checksum = 42;
  rep.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_BROADCAST_DONE;
  rep.broadcast_done = &bd;
  rpc_seed("report_broadcast_done", &rep.base);

  Rlorch__V1__FetchBatchRequest fb = RLORCH__V1__FETCH_BATCH_REQUEST__INIT;
  fb.worker_id = "w-1";
  fb.step = 4;
  fb.rank = 1;
  fb.ranks = 2;
  rpc_seed("fetch_batch", &fb.base);

  /* The agents' side: a plan command, a rollout request, a batch. */
  Rlorch__V1__BroadcastPlan *pm = NULL;
  bcast_err e = {0};
  if (bcast_plan_to_pb(p, &pm, &e) != 0) die(e.msg);
  Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
  cmd.seq = 9;
  cmd.run_id = "run-1";
  cmd.kind_case = RLORCH__V1__COMMAND__KIND_PLAN;
  cmd.plan = pm;
  cmd.rank = 1;
  rpc_seed("command_plan", &cmd.base);
  Rlorch__V1__SamplingParams sp = RLORCH__V1__SAMPLING_PARAMS__INIT;
  sp.temperature = 1.0f;
  sp.max_tokens = 16;
  Rlorch__V1__RolloutRequest rq = RLORCH__V1__ROLLOUT_REQUEST__INIT;
  rq.request_id = 55;
  rq.count = 2;
  rq.group_id = 7;
  rq.prompt_token_ids = prompt;
  rq.n_prompt_token_ids = 3;
  rq.sampling = &sp;
  rq.prompt_metadata.data = (uint8_t *)"answer=42";
  rq.prompt_metadata.len = 9;
  cmd.kind_case = RLORCH__V1__COMMAND__KIND_ROLLOUT;
  cmd.rollout = &rq;
  cmd.rank = 0;
  rpc_seed("command_rollout", &cmd.base);
  Rlorch__V1__BatchChunk ch = RLORCH__V1__BATCH_CHUNK__INIT;
  ch.rollouts = rs;
  ch.n_rollouts = 2;
  ch.share_rollouts = 2;
  ch.share_groups = 1;
  rpc_seed("batch_chunk", &ch.base);

  /* ctl's side: a run event, a worker list. */
  Rlorch__V1__Run run = RLORCH__V1__RUN__INIT;
  Rlorch__V1__RunSpec spec = RLORCH__V1__RUN_SPEC__INIT;
  spec.steps = 3;
  run.id = "run-1";
  run.spec = &spec;
  run.state = RLORCH__V1__RUN_STATE__RUN_STATE_RUNNING;
  run.steps_done = 1;
  Rlorch__V1__RunEvent ev = RLORCH__V1__RUN_EVENT__INIT;
  ev.seq = 1;
  ev.event_case = RLORCH__V1__RUN_EVENT__EVENT_RUN;
  ev.run = &run;
  rpc_seed("run_event", &ev.base);
  Rlorch__V1__WorkerInfo wi = RLORCH__V1__WORKER_INFO__INIT;
  wi.id = "w-1";
  wi.role = RLORCH__V1__WORKER_ROLE__WORKER_ROLE_TRAINER;
  wi.state = RLORCH__V1__WORKER_STATE__WORKER_STATE_READY;
  wi.name = "trainer-0";
  wi.capabilities = &caps;
  Rlorch__V1__WorkerInfo *wis[] = {&wi};
  Rlorch__V1__ListWorkersResponse lwr = RLORCH__V1__LIST_WORKERS_RESPONSE__INIT;
  lwr.workers = wis;
  lwr.n_workers = 1;
  rpc_seed("list_workers_response", &lwr.base);

  bcast_pb_free(&pm->base);
  bcast_plan_free(p);
  bcast_pb_free(&man->base);
}

/* ---- plan ----------------------------------------------------------------------------------- */

static void plan_seed(const char *name, const bcast_plan *p) {
  uint8_t *b = NULL;
  size_t n = 0;
  bcast_err e = {0};
  if (bcast_plan_pack(p, &b, &n, &e) != 0) die(e.msg);
  write_seed("plan", name, b, n);
  free(b);
}

static void plan_seeds(void) {
  bcast_plan *p = plan_or_die("10.0.0.1:7075", BCAST_CHECKSUM_XXH3_64);
  plan_seed("host_two_layers", p);
  uint8_t id[128];
  for (size_t i = 0; i < sizeof id; i++) id[i] = (uint8_t)(i * 7 + 1);
  bcast_plan_set_nccl_id(p, id);
  plan_seed("with_nccl_id", p);
  bcast_plan_free(p);

  /* A tensor larger than the budget, cut over buckets; a second dtype pair. */
  bcast_tensor t[3];
  memset(t, 0, sizeof t);
  snprintf(t[0].name, sizeof t[0].name, "embed");
  t[0].storage_dtype = BCAST_DTYPE_FP32;
  t[0].wire_dtype = BCAST_DTYPE_FP16;
  t[0].ndim = 2;
  t[0].shape[0] = 40;
  t[0].shape[1] = 50;
  t[0].residency = BCAST_RES_GPU;
  snprintf(t[1].name, sizeof t[1].name, "norm");
  t[1].storage_dtype = BCAST_DTYPE_BF16;
  t[1].wire_dtype = BCAST_DTYPE_BF16;
  t[1].ndim = 1;
  t[1].shape[0] = 50;
  t[1].residency = BCAST_RES_HOST_PINNED;
  snprintf(t[2].name, sizeof t[2].name, "ids");
  t[2].layer = 3;
  t[2].storage_dtype = BCAST_DTYPE_U16;
  t[2].wire_dtype = BCAST_DTYPE_U16;
  t[2].ndim = 3;
  t[2].shape[0] = 2;
  t[2].shape[1] = 3;
  t[2].shape[2] = 5;
  t[2].residency = BCAST_RES_HOST_PAGEABLE;
  bcast_plan_opts o = {.id = "run-2/step-9", .mode = BCAST_MODE_STAGED, .staging_budget = 1024,
                       .world_size = 4, .root_rank = 2, .policy_version = 9,
                       .deadline_unix_ms = 1700000000000, .checksum = BCAST_CHECKSUM_NONE};
  bcast_err e = {0};
  if (bcast_plan_build(t, 3, &o, &p, &e) != 0) die(e.msg);
  plan_seed("staged_split", p);
  bcast_plan_free(p);

  /* Two source ranks (a sharded trainer): "embed" split between them, "ids"
   * whole on rank 1; buckets of each source, taking turns. */
  bcast_tensor r0[1], r1[2];
  r0[0] = t[0];
  r0[0].shard_elems = 1200;
  r1[0] = t[0];
  r1[0].shard_offset = 1200;
  r1[0].shard_elems = 800;
  r1[1] = t[2];
  const bcast_tensor *ranks[2] = {r0, r1};
  size_t counts[2] = {1, 2};
  bcast_shard_map *map = NULL;
  if (bcast_shards_check(ranks, counts, 2, NULL, &map, &e) != 0) die(e.msg);
  const char *eps[2] = {"10.0.0.1:7075", "10.0.0.2:7075"};
  bcast_plan_opts so = {.id = "run-3/step-1", .mode = BCAST_MODE_HOST, .staging_budget = 1024,
                        .world_size = 4, .policy_version = 1, .source_endpoints = eps,
                        .secret = DATA_SECRET};
  if (bcast_plan_build_sharded(map, &so, &p, &e) != 0) die(e.msg);
  plan_seed("host_two_sources", p);
  bcast_plan_free(p);
  bcast_shard_map_free(map);
}

/* ---- data channel --------------------------------------------------------------------------- */

/* The root's framing after the handshake: every bucket of p, cast from the
 * storage the root harness holds. */
static size_t root_buckets(const bcast_plan *p, int with_sums, uint8_t *b) {
  size_t n = 0;
  for (size_t k = 0; k < p->nbuckets; k++) {
    const bcast_bucket *bk = &p->buckets[k];
    uint8_t *payload = b + n + 24;
    for (uint64_t i = 0; i < bk->bytes; i++) payload[i] = (uint8_t)(k * 31 + i);
    data_bucket_header(b + n, (uint32_t)k, bk->bytes,
                       with_sums ? bcast_checksum64(payload, bk->bytes) : 0);
    n += 24 + bk->bytes;
  }
  return n;
}

static void data_seeds(void) {
  bcast_plan *p = plan_or_die("", BCAST_CHECKSUM_XXH3_64);
  uint8_t b[8192], nonce[DATA_NONCE], zero[DATA_MAC] = {0};
  size_t n;
  for (size_t i = 0; i < DATA_NONCE; i++) nonce[i] = (uint8_t)(0xa5 ^ i);

  /* data_root: what a receiver, or anyone else, sends the root. A stranger
   * cannot answer the root's fresh nonce: its HELLOs carry a guessed proof. */
  n = data_hello(b, 1, DATA_PLAN_ID, p->hash, nonce, nonce, zero);
  n += data_status(b + n, DATA_MAGIC_ACK, 0, "");
  write_seed("data_root", "hello_ack", b, n);
  n = data_hello(b, 1, DATA_PLAN_ID, p->hash, nonce, nonce, zero);
  n += data_status(b + n, DATA_MAGIC_ACK, BCAST_ECHECKSUM, "bucket 1 (layer 1): checksum mismatch");
  write_seed("data_root", "hello_ack_failed", b, n);
  n = data_hello(b, 1, DATA_PLAN_ID, p->hash, nonce, nonce, zero);
  write_seed("data_root", "hello_no_ack", b, n);
  n = data_hello(b, 1, DATA_PLAN_ID, p->hash ^ 1, nonce, nonce, zero);
  write_seed("data_root", "hello_wrong_hash", b, n);
  n = data_hello(b, 1, "run-1/step-6", p->hash, nonce, nonce, zero);
  write_seed("data_root", "hello_wrong_plan", b, n);
  n = data_hello(b, 1, DATA_STALE_ID, 7, nonce, nonce, zero);
  write_seed("data_root", "hello_stale_plan", b, n);
  n = data_hello(b, 0, DATA_PLAN_ID, p->hash, nonce, nonce, zero);
  write_seed("data_root", "hello_root_rank", b, n);
  n = data_hello(b, 1, DATA_PLAN_ID, p->hash, nonce, nonce, zero);
  write_seed("data_root", "hello_cut", b, n - 3);
  n = data_hello(b, 1, DATA_PLAN_ID, p->hash, nonce, nonce, NULL);
  write_seed("data_root", "hello_other_nonce", b, n);

  /* data_receiver: the flags byte (bit 0: no checksum; bit 1: the bytes are
   * the root's handshake), then what the root sends. Mode 0: the framing
   * after an authenticated handshake. */
  b[0] = 0;
  n = 1 + root_buckets(p, 1, b + 1);
  write_seed("data_receiver", "xxh3_all_buckets", b, n);
  b[0] = 1;
  n = 1 + root_buckets(p, 0, b + 1);
  write_seed("data_receiver", "none_all_buckets", b, n);
  b[0] = 0;
  n = 1 + root_buckets(p, 0, b + 1);
  write_seed("data_receiver", "xxh3_bad_sum", b, n);
  b[0] = 1;
  n = 1 + data_bucket_header(b + 1, 1, p->buckets[0].bytes, 0);
  write_seed("data_receiver", "wrong_bucket", b, n);
  b[0] = 0;
  n = 1 + root_buckets(p, 1, b + 1);
  write_seed("data_receiver", "xxh3_cut_short", b, n - 5);
  /* Mode 1: the root's handshake. */
  b[0] = 2;
  n = 1 + data_challenge(b + 1, nonce);
  write_seed("data_receiver", "handshake_challenge_only", b, n);
  b[0] = 2;
  n = 1 + data_challenge(b + 1, nonce);
  n += data_reply_ok(b + n, 1, DATA_PLAN_ID, p->hash, nonce, zero); /* for another rx nonce */
  n += root_buckets(p, 1, b + n);
  write_seed("data_receiver", "handshake_forged_proof", b, n);
  b[0] = 2;
  n = 1 + data_challenge(b + 1, nonce);
  n += data_status(b + n, DATA_MAGIC_REPLY, BCAST_EMISMATCH, "receiver rank 1 holds another plan");
  write_seed("data_receiver", "handshake_refused", b, n);
  b[0] = 2;
  n = 1 + data_challenge(b + 1, nonce);
  write_seed("data_receiver", "handshake_cut_challenge", b, n - 7);
  b[0] = 3; /* a root of the first handshake: REPLY 0 and the buckets at once */
  n = 1 + data_status(b + 1, DATA_MAGIC_REPLY, 0, "");
  n += root_buckets(p, 0, b + n);
  write_seed("data_receiver", "handshake_protocol_1", b, n);
  bcast_plan_free(p);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  root_dir = argv[1];
  if (mkdir(root_dir, 0755) != 0 && errno != EEXIST) die(root_dir);
  control_seeds();
  worker_seeds();
  plan_seeds();
  data_seeds();
  return 0;
}
