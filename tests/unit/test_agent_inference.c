/* The inference agent against a fake orchestrator (a Worker service on
 * 127.0.0.1:0 run on a uv loop of its own): what it registers, the groups it
 * reports, its heartbeat stats, request aborts, a failing reward hook, and
 * the versions it serves around a broadcast that fails (one set of buffers
 * and two), with a real sender engine in the test process. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "rlorch/v1/worker.pb-c.h"
#include "rpc/rpc.h"
#include "workers/agent/agent.h"
#include "workers/agent/agent_pb.h"
#include "workers/agent/agent_weights.h"
#include "workers/bcast/bcast.h"
#include "workers/bcast/bcast_pb.h"

#define M_REGISTER "/rlorch.v1.Worker/Register"
#define M_ATTACH "/rlorch.v1.Worker/Attach"
#define M_REPORT "/rlorch.v1.Worker/Report"
#define M_REPORT_STREAM "/rlorch.v1.Worker/ReportStream"

/* ---- the fake orchestrator ------------------------------------------------------------------- */

typedef struct fake {
  uv_loop_t loop;
  uv_thread_t th;
  rpc_server *s;
  uv_async_t wake;      /* drains `out` onto the attach stream, or stops */
  char target[64];
  pthread_mutex_t mu;   /* guards everything below */
  pthread_cond_t cv;
  rpc_call *attach;     /* the open command stream, loop thread */
  int attached;
  int attaches; /* Attach streams opened, in all */
  int registered;
  uint32_t max_concurrent; /* from Register */
  char reg_run[8][64];     /* each Register's run_id and policy_version */
  uint64_t reg_version[8];
  char reg_data_address[96]; /* the last Register's */
  int forget;              /* the next report is answered known = false */
  Rlorch__V1__Command *out[64]; /* commands to send */
  int nout;
  uint64_t seq;
  Rlorch__V1__ReportRequest *reports[4096]; /* copies, in arrival order */
  int via_stream[4096];                       /* each came on ReportStream */
  int nreports;
  int oneway;          /* ReportStream offered (else the agent must use Report) */
  grpc_status_code refuse_stream; /* the next stream report is refused so */
  int stopping;
  /* the agent */
  pthread_t agent_th;
  agent_opts opts;
  int agent_status;
  char log[1 << 20];    /* every agent log line, "event fields\n" */
  size_t loglen;
} fake;

static fake K;

static void *copy_msg(const ProtobufCMessage *m, const ProtobufCMessageDescriptor *d) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  protobuf_c_message_pack(m, buf);
  void *c = protobuf_c_message_unpack(d, NULL, n, buf);
  free(buf);
  cr_assert_not_null(c);
  return c;
}

static void h_register(rpc_call *c, const ProtobufCMessage *req, void *ud) {
  const Rlorch__V1__RegisterRequest *r = (const void *)req;
  pthread_mutex_lock(&K.mu);
  if (K.registered < 8) {
    snprintf(K.reg_run[K.registered], sizeof K.reg_run[0], "%s", r->run_id);
    K.reg_version[K.registered] = r->policy_version;
  }
  snprintf(K.reg_data_address, sizeof K.reg_data_address, "%s", r->data_address ? r->data_address : "");
  K.registered++;
  K.max_concurrent = r->capabilities ? r->capabilities->max_concurrent_requests : 0;
  pthread_cond_broadcast(&K.cv);
  pthread_mutex_unlock(&K.mu);
  Rlorch__V1__RegisterResponse resp = RLORCH__V1__REGISTER_RESPONSE__INIT;
  resp.worker_id = "w-1";
  resp.heartbeat_interval_ms = 50;
  resp.rank = 1;
  rpc_call_reply(c, &resp.base);
}

static void on_attach_cancel(rpc_call *c, void *ud) {
  pthread_mutex_lock(&K.mu);
  if (K.attach == c) K.attach = NULL;
  K.attached = 0;
  pthread_mutex_unlock(&K.mu);
  rpc_call_finish(c, GRPC_STATUS_CANCELLED, "cancelled");
}

static void h_attach(rpc_call *c, const ProtobufCMessage *req, void *ud) {
  rpc_call_set_cancel_cb(c, on_attach_cancel, NULL);
  pthread_mutex_lock(&K.mu);
  K.attach = c;
  K.attached = 1;
  K.attaches++;
  pthread_cond_broadcast(&K.cv);
  pthread_mutex_unlock(&K.mu);
  uv_async_send(&K.wake); /* what was sent while no stream was open goes out now */
}

static void keep_report(const ProtobufCMessage *req, int stream) {
  Rlorch__V1__ReportRequest *copy = copy_msg(req, &rlorch__v1__report_request__descriptor);
  pthread_mutex_lock(&K.mu);
  if (K.nreports < (int)(sizeof K.reports / sizeof K.reports[0])) {
    K.via_stream[K.nreports] = stream;
    K.reports[K.nreports++] = copy;
  } else {
    rlorch__v1__report_request__free_unpacked(copy, NULL);
  }
  pthread_cond_broadcast(&K.cv);
  pthread_mutex_unlock(&K.mu);
}

/* A refused report is not kept: the orchestrator did not take it. */
static void h_report_stream(rpc_call *c, const ProtobufCMessage *req, void *ud) {
  pthread_mutex_lock(&K.mu);
  grpc_status_code refuse = K.refuse_stream;
  K.refuse_stream = GRPC_STATUS_OK;
  pthread_mutex_unlock(&K.mu);
  if (refuse != GRPC_STATUS_OK) {
    rpc_call_fail(c, refuse, "refused by the test");
    return;
  }
  keep_report(req, 1);
  Rlorch__V1__ReportResponse resp = RLORCH__V1__REPORT_RESPONSE__INIT;
  rpc_call_reply(c, &resp.base);
}

static void h_report(rpc_call *c, const ProtobufCMessage *req, void *ud) {
  keep_report(req, 0);
  Rlorch__V1__ReportResponse resp = RLORCH__V1__REPORT_RESPONSE__INIT;
  pthread_mutex_lock(&K.mu);
  resp.known = !K.forget; /* as an orchestrator that restarted answers */
  K.forget = 0;
  pthread_mutex_unlock(&K.mu);
  rpc_call_reply(c, &resp.base);
}

static void on_done(void *ud) {}

static void on_wake(uv_async_t *a) {
  pthread_mutex_lock(&K.mu);
  /* Without an open stream (the agent registering again) the commands wait
   * for the next one: a Shutdown dropped here would leave the agent running
   * and the test waiting for it forever. */
  for (int i = 0; K.attach && i < K.nout; i++) {
    rpc_call_send(K.attach, &K.out[i]->base);
    rlorch__v1__command__free_unpacked(K.out[i], NULL);
  }
  if (K.attach) K.nout = 0;
  int stop = K.stopping;
  rpc_call *open = stop ? K.attach : NULL;
  if (stop) K.attach = NULL;
  pthread_mutex_unlock(&K.mu);
  if (open) rpc_call_finish(open, GRPC_STATUS_UNAVAILABLE, "stopping");
  if (stop) {
    rpc_server_shutdown(K.s, on_done, NULL);
    uv_close((uv_handle_t *)&K.wake, NULL);
  }
}

static void loop_main(void *arg) { uv_run(&K.loop, UV_RUN_DEFAULT); }

static void on_log(void *ud, agent_log_level level, const char *event, const char *fields,
                   va_list ap) {
  char line[2048];
  int n = snprintf(line, sizeof line, "%s ", event);
  if (fields) vsnprintf(line + n, sizeof line - (size_t)n, fields, ap);
  pthread_mutex_lock(&K.mu);
  size_t l = strlen(line);
  if (K.loglen + l + 2 < sizeof K.log) {
    memcpy(K.log + K.loglen, line, l);
    K.loglen += l;
    K.log[K.loglen++] = '\n';
    K.log[K.loglen] = 0;
  }
  pthread_mutex_unlock(&K.mu);
}

static void fake_start_with(int oneway) {
  memset(&K, 0, sizeof K);
  K.oneway = oneway;
  pthread_mutex_init(&K.mu, NULL);
  pthread_cond_init(&K.cv, NULL);
  cr_assert_eq(uv_loop_init(&K.loop), 0);
  rpc_method ms[] = {
      {M_REGISTER, RPC_UNARY, &rlorch__v1__register_request__descriptor,
       &rlorch__v1__register_response__descriptor, 0, h_register, NULL},
      {M_ATTACH, RPC_SERVER_STREAM, &rlorch__v1__attach_request__descriptor,
       &rlorch__v1__command__descriptor, 0, h_attach, NULL},
      {M_REPORT, RPC_UNARY, &rlorch__v1__report_request__descriptor,
       &rlorch__v1__report_response__descriptor, 0, h_report, NULL},
      {M_REPORT_STREAM, RPC_ONEWAY_STREAM, &rlorch__v1__report_request__descriptor,
       &rlorch__v1__report_response__descriptor, 0, h_report_stream, NULL},
  };
  rpc_server_opts o = {.listen = "127.0.0.1:0"};
  char err[256] = "";
  cr_assert_eq(rpc_server_new(&K.loop, &o, ms, oneway ? 4 : 3, &K.s, err, sizeof err), 0, "%s",
               err);
  snprintf(K.target, sizeof K.target, "127.0.0.1:%d", rpc_server_port(K.s));
  uv_async_init(&K.loop, &K.wake, on_wake);
  cr_assert_eq(uv_thread_create(&K.th, loop_main, NULL), 0);
  agent_log_config(on_log, NULL, AGENT_LOG_DEBUG);
  agent_opts_defaults(AGENT_ROLE_INFERENCE, &K.opts);
  K.opts.orchestrator = K.target;
  K.opts.device = -1;
  K.opts.device_set = 1;
  K.opts.seed = 5;
  K.opts.seed_set = 1;
  K.opts.rollout.latency_ms_mean = 1;
  K.opts.rollout.latency_ms_std = 0;
  K.opts.rollout.tokens_mean = 20;
  K.opts.rollout.tokens_std = 5;
}

/* An orchestrator without ReportStream (an older one): every report must
 * come through Report. */
static void fake_start(void) { fake_start_with(0); }

static void *agent_main(void *arg) {
  K.agent_status = agent_inference_run(&K.opts);
  return NULL;
}

/* Waits (up to 10 s) until cond() holds under K.mu. */
static int wait_until(int (*cond)(void *), void *arg) {
  pthread_mutex_lock(&K.mu);
  int ok = cond(arg);
  for (int i = 0; i < 1000 && !ok; i++) {
    pthread_mutex_unlock(&K.mu);
    usleep(10000);
    pthread_mutex_lock(&K.mu);
    ok = cond(arg);
  }
  pthread_mutex_unlock(&K.mu);
  return ok;
}

static int is_attached(void *arg) { return K.attached; }

/* The stream opened after the agent registered again: the old one may still
 * look open here until its cancel arrives, and what is sent on it is lost. */
static int attached_again(void *arg) { return K.attached && K.attaches >= 2; }

static void agent_start(void) {
  cr_assert_eq(pthread_create(&K.agent_th, NULL, agent_main, NULL), 0);
  cr_assert(wait_until(is_attached, NULL), "the agent attaches");
}

/* Queues cmd (copied; seq and run filled in) for the attach stream. */
static void send_cmd(Rlorch__V1__Command *cmd) {
  pthread_mutex_lock(&K.mu);
  cmd->seq = ++K.seq;
  cmd->run_id = "run-1";
  K.out[K.nout++] = copy_msg(&cmd->base, &rlorch__v1__command__descriptor);
  pthread_mutex_unlock(&K.mu);
  uv_async_send(&K.wake);
}

static void send_rollout(Rlorch__V1__RolloutRequest *rq) {
  Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
  cmd.kind_case = RLORCH__V1__COMMAND__KIND_ROLLOUT;
  cmd.rollout = rq;
  send_cmd(&cmd);
}

static void send_abort(uint64_t request_id) {
  Rlorch__V1__AbortCommand ab = RLORCH__V1__ABORT_COMMAND__INIT;
  ab.request_id = request_id;
  ab.reason = "answered elsewhere";
  Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
  cmd.kind_case = RLORCH__V1__COMMAND__KIND_ABORT;
  cmd.abort = &ab;
  send_cmd(&cmd);
}

/* The rollout result of request id, or NULL; K.mu held. */
static const Rlorch__V1__RolloutResult *result_of(uint64_t id) {
  for (int i = 0; i < K.nreports; i++)
    if (K.reports[i]->kind_case == RLORCH__V1__REPORT_REQUEST__KIND_ROLLOUTS &&
        K.reports[i]->rollouts->request_id == id)
      return K.reports[i]->rollouts;
  return NULL;
}

static int has_result(void *arg) { return result_of(*(uint64_t *)arg) != NULL; }

static const Rlorch__V1__RolloutResult *wait_result(uint64_t id) {
  cr_assert(wait_until(has_result, &id), "request %llu answered", (unsigned long long)id);
  pthread_mutex_lock(&K.mu);
  const Rlorch__V1__RolloutResult *r = result_of(id);
  pthread_mutex_unlock(&K.mu);
  return r; /* reports are kept until fake_stop */
}

/* The last heartbeat's stats; K.mu held. */
static const Rlorch__V1__WorkerStats *last_stats(void) {
  for (int i = K.nreports - 1; i >= 0; i--)
    if (K.reports[i]->kind_case == RLORCH__V1__REPORT_REQUEST__KIND_HEARTBEAT)
      return K.reports[i]->heartbeat->stats;
  return NULL;
}

static int stats_rollouts_at_least(void *arg) {
  const Rlorch__V1__WorkerStats *s = last_stats();
  return s && s->rollouts_generated >= *(uint64_t *)arg && s->requests_active == 0;
}

/* Shutdown command, the agent's exit status checked, then the server down. */
static void fake_stop(void) {
  Rlorch__V1__ShutdownCommand sd = RLORCH__V1__SHUTDOWN_COMMAND__INIT;
  sd.reason = "test over";
  Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
  cmd.kind_case = RLORCH__V1__COMMAND__KIND_SHUTDOWN;
  cmd.shutdown = &sd;
  send_cmd(&cmd);
  pthread_join(K.agent_th, NULL);
  cr_assert_eq(K.agent_status, 0, "the agent leaves cleanly on shutdown");
  pthread_mutex_lock(&K.mu);
  K.stopping = 1;
  pthread_mutex_unlock(&K.mu);
  uv_async_send(&K.wake);
  uv_thread_join(&K.th);
  rpc_server_free(K.s);
  cr_assert_eq(uv_loop_close(&K.loop), 0);
  for (int i = 0; i < K.nreports; i++) rlorch__v1__report_request__free_unpacked(K.reports[i], NULL);
  for (int i = 0; i < K.nout; i++) rlorch__v1__command__free_unpacked(K.out[i], NULL);
  agent_log_config(NULL, NULL, AGENT_LOG_ERROR);
  grpc_shutdown_blocking();
}

static int log_has(const char *needle) {
  pthread_mutex_lock(&K.mu);
  int yes = strstr(K.log, needle) != NULL;
  pthread_mutex_unlock(&K.mu);
  return yes;
}

/* ---- tests ---------------------------------------------------------------------------------- */

Test(agent_inference, registers_its_pool_and_answers_a_group) {
  fake_start();
  K.opts.concurrency = 3;
  agent_start();
  pthread_mutex_lock(&K.mu);
  cr_assert_geq(K.registered, 1);
  cr_assert_eq(K.max_concurrent, 3u, "Capabilities.max_concurrent_requests is --concurrency");
  pthread_mutex_unlock(&K.mu);

  uint32_t prompt[] = {1, 2, 3};
  uint32_t stops[] = {31990};
  uint8_t meta[] = "answer";
  Rlorch__V1__SamplingParams sp = RLORCH__V1__SAMPLING_PARAMS__INIT;
  sp.max_tokens = 8;
  sp.seed = 9;
  sp.temperature = 1;
  sp.n_stop_token_ids = 1;
  sp.stop_token_ids = stops;
  Rlorch__V1__RolloutRequest rq = RLORCH__V1__ROLLOUT_REQUEST__INIT;
  rq.request_id = 5;
  rq.count = 4;
  rq.group_id = 70;
  rq.n_prompt_token_ids = 3;
  rq.prompt_token_ids = prompt;
  rq.sampling = &sp;
  rq.prompt_metadata.data = meta;
  rq.prompt_metadata.len = 6;
  send_rollout(&rq);
  /* Today's orchestrator: no prompt, no sampling, no group id. */
  Rlorch__V1__RolloutRequest bare = RLORCH__V1__ROLLOUT_REQUEST__INIT;
  bare.request_id = 6;
  bare.count = 2;
  send_rollout(&bare);

  const Rlorch__V1__RolloutResult *r = wait_result(5);
  cr_assert_eq(r->n_rollouts, 4u, "exactly count rollouts");
  uint64_t tokens = 0;
  for (size_t i = 0; i < r->n_rollouts; i++) {
    const Rlorch__V1__Rollout *ro = r->rollouts[i];
    cr_assert_eq(ro->group_id, 70u);
    cr_assert_eq(ro->policy_version, 0u);
    cr_assert_eq(ro->n_prompt_token_ids, 0u, "the orchestrator fills the prompt in");
    cr_assert_geq(ro->n_completion_token_ids, 1u);
    cr_assert_leq(ro->n_completion_token_ids, 8u, "max_tokens");
    cr_assert_eq(ro->tokens, ro->n_completion_token_ids);
    cr_assert_eq(ro->n_completion_logprobs, ro->n_completion_token_ids);
    cr_assert_eq(ro->n_rewards, 1u);
    cr_assert(ro->rewards[0] >= 0 && ro->rewards[0] <= 1);
    cr_assert(ro->finish_reason == RLORCH__V1__FINISH_REASON__FINISH_REASON_LENGTH ||
              ro->finish_reason == RLORCH__V1__FINISH_REASON__FINISH_REASON_STOP);
    cr_assert_gt(ro->seconds, 0.0, "its latency was slept");
    tokens += ro->n_completion_token_ids;
  }
  const Rlorch__V1__RolloutResult *b = wait_result(6);
  cr_assert_eq(b->n_rollouts, 2u);
  for (size_t i = 0; i < b->n_rollouts; i++) {
    const Rlorch__V1__Rollout *ro = b->rollouts[i];
    cr_assert_eq(ro->group_id, 6u, "no group id: the request is its group");
    cr_assert_geq(ro->n_completion_token_ids, 1u, "an empty prompt still generates");
    cr_assert_eq(ro->finish_reason, RLORCH__V1__FINISH_REASON__FINISH_REASON_STOP);
    int sampled = 0;
    for (size_t k = 0; k < ro->n_completion_logprobs; k++) sampled |= ro->completion_logprobs[k] < 0;
    cr_assert(sampled, "no SamplingParams: temperature 1, not greedy");
    tokens += ro->n_completion_token_ids;
  }
  uint64_t want = 6;
  cr_assert(wait_until(stats_rollouts_at_least, &want), "a heartbeat counts the 6 rollouts");
  pthread_mutex_lock(&K.mu);
  const Rlorch__V1__WorkerStats *s = last_stats();
  cr_assert_eq(s->rollouts_generated, 6u);
  cr_assert_eq(s->tokens_generated, tokens);
  cr_assert_gt(s->generate_seconds, 0.0);
  cr_assert_lt(s->generate_seconds, 10.0);
  pthread_mutex_unlock(&K.mu);
  fake_stop();
}

/* Completions longer than AGENT_PB_SHAPED_TOKENS_MAX go as their length only:
 * a report of very long synthetic ones stays within max_rollout_bytes. */
Test(agent_inference, very_long_completions_go_as_their_length) {
  fake_start();
  K.opts.rollout.dist = AGENT_DIST_NORMAL;
  K.opts.rollout.tokens_mean = 3 * AGENT_PB_SHAPED_TOKENS_MAX;
  K.opts.rollout.tokens_std = 0;
  agent_start();
  Rlorch__V1__RolloutRequest rq = RLORCH__V1__ROLLOUT_REQUEST__INIT;
  rq.request_id = 1;
  rq.count = 2;
  send_rollout(&rq);
  Rlorch__V1__SamplingParams sp = RLORCH__V1__SAMPLING_PARAMS__INIT;
  sp.max_tokens = 16; /* short: sent whole */
  sp.temperature = 1;
  rq.request_id = 2;
  rq.sampling = &sp;
  send_rollout(&rq);
  const Rlorch__V1__RolloutResult *r = wait_result(1), *s = wait_result(2);
  cr_assert_eq(r->n_rollouts, 2u);
  for (size_t i = 0; i < r->n_rollouts; i++) {
    cr_assert_gt(r->rollouts[i]->tokens, AGENT_PB_SHAPED_TOKENS_MAX);
    cr_assert_eq(r->rollouts[i]->n_completion_token_ids, 0u, "no ids, its length only");
    cr_assert_eq(r->rollouts[i]->n_completion_logprobs, 0u);
    cr_assert_eq(r->rollouts[i]->n_rewards, 1u, "scored from the whole completion");
  }
  cr_assert_eq(s->n_rollouts, 2u);
  for (size_t i = 0; i < s->n_rollouts; i++) {
    cr_assert_eq(s->rollouts[i]->n_completion_token_ids, s->rollouts[i]->tokens);
    cr_assert_eq(s->rollouts[i]->n_completion_logprobs, s->rollouts[i]->tokens);
  }
  fake_stop();
}

static int stats_active(void *arg) {
  const Rlorch__V1__WorkerStats *s = last_stats();
  return s && s->requests_active == *(uint32_t *)arg;
}

/* The last heartbeat's run; K.mu held. */
static const char *last_hb_run(void) {
  for (int i = K.nreports - 1; i >= 0; i--)
    if (K.reports[i]->kind_case == RLORCH__V1__REPORT_REQUEST__KIND_HEARTBEAT)
      return K.reports[i]->heartbeat->run_id;
  return NULL;
}

static int hb_of_run(void *arg) {
  const char *r = last_hb_run();
  return r && !strcmp(r, (const char *)arg);
}

static int registered_twice(void *arg) { return K.registered >= 2; }

static int log_has_cb(void *arg) { return strstr(K.log, arg) != NULL; }

/* What the worker holds goes with it: heartbeats say the run their version
 * counts, and a registration after the orchestrator forgot the worker (it
 * restarted) says the run and the version held, for it to compare. */
Test(agent_inference, heartbeats_and_registrations_say_what_it_holds) {
  fake_start();
  agent_start();
  pthread_mutex_lock(&K.mu);
  cr_assert_str_eq(K.reg_run[0], "", "a fresh agent holds no run's version");
  cr_assert_eq(K.reg_version[0], 0);
  pthread_mutex_unlock(&K.mu);
  Rlorch__V1__RolloutRequest rq = RLORCH__V1__ROLLOUT_REQUEST__INIT;
  rq.request_id = 1;
  rq.count = 1;
  send_rollout(&rq); /* a command of run-1 */
  wait_result(1);
  cr_assert(wait_until(hb_of_run, "run-1"), "heartbeats name the run of the last command");
  pthread_mutex_lock(&K.mu);
  K.forget = 1;
  pthread_mutex_unlock(&K.mu);
  cr_assert(wait_until(registered_twice, NULL), "a worker forgotten registers again");
  pthread_mutex_lock(&K.mu);
  cr_assert_str_eq(K.reg_run[1], "run-1", "and says the run it holds a version of");
  cr_assert_eq(K.reg_version[1], 0);
  pthread_mutex_unlock(&K.mu);
  cr_assert(wait_until(attached_again, NULL), "and attaches again");
  fake_stop();
}

/* Request ids are the orchestrator's per registration: a request being
 * generated when the worker registers again (the orchestrator restarted and
 * forgot it) is gone there, and its id may name another request by then, so
 * its answer is dropped, not sent; requests of the new registration are
 * answered. */
Test(agent_inference, an_answer_from_before_a_new_registration_is_dropped) {
  fake_start();
  K.opts.concurrency = 1;
  K.opts.rollout.latency_ms_mean = 400; /* a request of 2 takes 0.8 s */
  agent_start();
  Rlorch__V1__RolloutRequest rq = RLORCH__V1__ROLLOUT_REQUEST__INIT;
  rq.request_id = 7;
  rq.count = 2;
  send_rollout(&rq);
  uint32_t one = 1, zero = 0;
  cr_assert(wait_until(stats_active, &one), "request 7 is being generated");
  pthread_mutex_lock(&K.mu);
  K.forget = 1;
  pthread_mutex_unlock(&K.mu);
  cr_assert(wait_until(registered_twice, NULL), "the worker registers again meanwhile");
  cr_assert(wait_until(stats_active, &zero), "request 7's generation ends");
  cr_assert(wait_until(log_has_cb, "stale_answer_dropped request_id=7 count=2"), "%s", K.log);
  pthread_mutex_lock(&K.mu);
  cr_assert_null(result_of(7), "the stale answer is not sent");
  pthread_mutex_unlock(&K.mu);
  cr_assert(wait_until(attached_again, NULL));
  rq.request_id = 8;
  send_rollout(&rq);
  cr_assert_eq(wait_result(8)->n_rollouts, 2u, "a request of the new registration is answered");
  fake_stop();
}

Test(agent_inference, aborted_requests_send_nothing) {
  fake_start();
  K.opts.concurrency = 1;
  K.opts.rollout.latency_ms_mean = 100; /* a request of 4 takes 0.4 s */
  agent_start();
  Rlorch__V1__RolloutRequest rq = RLORCH__V1__ROLLOUT_REQUEST__INIT;
  rq.count = 4;
  for (uint64_t id = 1; id <= 3; id++) {
    rq.request_id = id;
    send_rollout(&rq);
  }
  /* In flight from its arrival to its answer: the three are, request 1
   * generating (4 x 100 ms), 2 and 3 queued behind it. */
  uint32_t three = 3;
  cr_assert(wait_until(stats_active, &three), "the three requests are held");
  send_abort(2); /* still queued behind 1 */
  send_abort(1); /* generating */
  const Rlorch__V1__RolloutResult *r = wait_result(3);
  cr_assert_eq(r->n_rollouts, 4u, "the request after them is served whole");
  cr_assert(log_has("request_aborted request_id=2 state=\"queued\""), "%s", K.log);
  cr_assert(log_has("request_aborted request_id=1 state=\"generating\""), "%s", K.log);
  cr_assert(log_has("request_aborted request_id=1 state=generating made="), "%s", K.log);
  cr_assert_not(log_has("abort_ignored"), "a request abort is not a plan abort");
  /* An abort for a request already answered changes nothing. */
  send_abort(3);
  uint32_t zero = 0;
  cr_assert(wait_until(stats_active, &zero));
  usleep(200000);
  pthread_mutex_lock(&K.mu);
  cr_assert_null(result_of(1), "aborted while generating: not sent");
  cr_assert_null(result_of(2), "aborted while queued: not generated");
  pthread_mutex_unlock(&K.mu);
  cr_assert(log_has("request_aborted request_id=3 state=\"finished or unknown\""), "%s", K.log);
  fake_stop();
}

static int fail_group_13(void *ud, const agent_reward_input *in, double *rewards, size_t cap,
                         size_t *n, char *err, size_t errlen) {
  __atomic_add_fetch((int *)ud, 1, __ATOMIC_SEQ_CST);
  if (in->group_id == 13 && in->index == 1) {
    snprintf(err, errlen, "no reference answer in \"%.*s\"", (int)in->n_metadata,
             (const char *)in->prompt_metadata);
    return -1;
  }
  rewards[0] = 0.5;
  rewards[1] = (double)in->n_completion;
  *n = 2;
  return 0;
}

Test(agent_inference, a_failing_reward_hook_answers_with_no_rollout) {
  fake_start();
  int calls = 0;
  K.opts.reward = fail_group_13;
  K.opts.reward_ud = &calls;
  agent_start();
  uint8_t meta[] = "q7";
  Rlorch__V1__RolloutRequest rq = RLORCH__V1__ROLLOUT_REQUEST__INIT;
  rq.request_id = 1;
  rq.count = 3;
  rq.group_id = 13;
  rq.prompt_metadata.data = meta;
  rq.prompt_metadata.len = 2;
  send_rollout(&rq);
  rq.request_id = 2;
  rq.group_id = 14;
  send_rollout(&rq);
  const Rlorch__V1__RolloutResult *bad = wait_result(1), *good = wait_result(2);
  cr_assert_eq(bad->n_rollouts, 0u, "the group is not sent with made-up rewards");
  cr_assert(log_has("reward_failed request_id=1 group_id=13 reason=\"reward hook: group 13 "
                    "completion 1: no reference answer in \"q7\"\""), "%s", K.log);
  cr_assert_eq(good->n_rollouts, 3u);
  for (size_t i = 0; i < 3; i++) {
    cr_assert_eq(good->rollouts[i]->n_rewards, 2u, "the hook's rewards, as it gave them");
    cr_assert_eq(good->rollouts[i]->rewards[0], 0.5);
    cr_assert_eq(good->rollouts[i]->rewards[1], (double)good->rollouts[i]->n_completion_token_ids);
  }
  cr_assert_eq(__atomic_load_n(&calls, __ATOMIC_SEQ_CST), 5, "2 calls for group 13, 3 for 14");
  fake_stop();
}

/* ---- versions around a failed broadcast --------------------------------------------------- */

/* The report of kind `kind` about plan `id` (PlanAck or BroadcastDone), or
 * NULL; K.mu held. */
static const Rlorch__V1__ReportRequest *plan_report(int kind, const char *id) {
  for (int i = 0; i < K.nreports; i++) {
    const Rlorch__V1__ReportRequest *r = K.reports[i];
    if ((int)r->kind_case != kind) continue;
    const char *pid = kind == RLORCH__V1__REPORT_REQUEST__KIND_PLAN_ACK ? r->plan_ack->plan_id
                                                                        : r->broadcast_done->plan_id;
    if (!strcmp(pid, id)) return r;
  }
  return NULL;
}

typedef struct plan_wait {
  int kind;
  const char *id;
} plan_wait;

static int has_plan_report(void *arg) {
  const plan_wait *w = arg;
  return plan_report(w->kind, w->id) != NULL;
}

static const Rlorch__V1__BroadcastDone *wait_done(const char *id) {
  plan_wait w = {RLORCH__V1__REPORT_REQUEST__KIND_BROADCAST_DONE, id};
  cr_assert(wait_until(has_plan_report, &w), "plan %s: BroadcastDone\n%s", id, K.log);
  pthread_mutex_lock(&K.mu);
  const Rlorch__V1__BroadcastDone *d = plan_report(w.kind, id)->broadcast_done;
  pthread_mutex_unlock(&K.mu);
  return d;
}

/* The sender: one fp32 tensor sent as bf16, its engine rank 0. */
typedef struct sender {
  bcast_engine *e;
  bcast_tensor t[1];
  bcast_plan *p;
  pthread_t tid;
  int rc;
  bcast_err err;
} sender;

static void sender_init(sender *s) {
  memset(s, 0, sizeof *s);
  bcast_engine_opts o = {.rank = 0, .device = -1, .timeout_s = 30, .host_listen = "127.0.0.1:0"};
  cr_assert_eq(bcast_engine_new(&o, &s->e, &s->err), BCAST_OK, "%s", s->err.msg);
  bcast_tensor *t = &s->t[0];
  snprintf(t->name, sizeof t->name, "w");
  t->storage_dtype = BCAST_DTYPE_FP32;
  t->wire_dtype = BCAST_DTYPE_BF16;
  t->ndim = 2;
  t->shape[0] = 512;
  t->shape[1] = 64;
  t->residency = BCAST_RES_HOST_PAGEABLE;
  t->data = malloc(512 * 64 * sizeof(float));
  cr_assert_not_null(t->data);
}

/* Weights of version v, a plan `id` for them, sent to the agent (rank 1),
 * and its ack waited for. */
static void send_plan_only(sender *s, const char *id, uint64_t v);
static void sender_plan(sender *s, const char *id, uint64_t v) {
  send_plan_only(s, id, v);
  plan_wait w = {RLORCH__V1__REPORT_REQUEST__KIND_PLAN_ACK, id};
  cr_assert(wait_until(has_plan_report, &w), "plan %s acked\n%s", id, K.log);
  pthread_mutex_lock(&K.mu);
  cr_assert_str_empty(plan_report(w.kind, id)->plan_ack->error);
  pthread_mutex_unlock(&K.mu);
}

static void send_plan_only(sender *s, const char *id, uint64_t v) {
  for (size_t i = 0; i < 512 * 64; i++) ((float *)s->t[0].data)[i] = (float)(i % 97) * 0.5f + (float)v;
  bcast_plan_free(s->p);
  bcast_plan_opts o = {.id = id, .mode = BCAST_MODE_HOST, .staging_budget = 16 << 10,
                       .world_size = 2, .root_rank = 0, .policy_version = v,
                       .host_endpoint = bcast_engine_data_address(s->e)};
  cr_assert_eq(bcast_plan_build(s->t, 1, &o, &s->p, &s->err), BCAST_OK, "%s", s->err.msg);
  Rlorch__V1__BroadcastPlan *pb = NULL;
  cr_assert_eq(bcast_plan_to_pb(s->p, &pb, &s->err), BCAST_OK, "%s", s->err.msg);
  Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
  cmd.kind_case = RLORCH__V1__COMMAND__KIND_PLAN;
  cmd.plan = pb;
  cmd.rank = 1;
  send_cmd(&cmd);
  bcast_pb_free(&pb->base);
}

static void send_trigger(const bcast_plan *p) {
  Rlorch__V1__TriggerBroadcast tg = RLORCH__V1__TRIGGER_BROADCAST__INIT;
  tg.plan_id = (char *)p->id;
  tg.plan_hash = p->hash;
  Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
  cmd.kind_case = RLORCH__V1__COMMAND__KIND_TRIGGER;
  cmd.trigger = &tg;
  cmd.rank = 1;
  send_cmd(&cmd);
}

static void send_plan_abort(const char *id) {
  Rlorch__V1__AbortCommand ab = RLORCH__V1__ABORT_COMMAND__INIT;
  ab.plan_id = (char *)id;
  ab.reason = "a participant was lost";
  Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
  cmd.kind_case = RLORCH__V1__COMMAND__KIND_ABORT;
  cmd.abort = &ab;
  send_cmd(&cmd);
}

static void *sender_main(void *arg) {
  sender *s = arg;
  bcast_stats st;
  s->rc = bcast_engine_execute(s->e, s->p, s->t, 1, &st, &s->err);
  bcast_stats_free(&st);
  return NULL;
}

/* Plan, trigger, the sender's side executed: the agent holds version v. */
static void broadcast_ok(sender *s, const char *id, uint64_t v) {
  sender_plan(s, id, v);
  cr_assert_eq(pthread_create(&s->tid, NULL, sender_main, s), 0);
  send_trigger(s->p);
  cr_assert_eq(pthread_join(s->tid, NULL), 0);
  cr_assert_eq(s->rc, BCAST_OK, "%s", s->err.msg);
  const Rlorch__V1__BroadcastDone *d = wait_done(id);
  cr_assert_str_empty(d->error);
  uint64_t want = 0;
  char err[256];
  cr_assert_eq(agent_weights_checksum(s->t, 1, AGENT_WEIGHTS_STORAGE, &want, err, sizeof err), 0, "%s", err);
  cr_assert_eq(d->weights_checksum, want, "the agent holds the version sent, whole");
}

static void sender_free(sender *s) {
  bcast_plan_free(s->p);
  bcast_engine_free(s->e);
  free(s->t[0].data);
}


static void request(uint64_t id) {
  Rlorch__V1__RolloutRequest rq = RLORCH__V1__ROLLOUT_REQUEST__INIT;
  rq.request_id = id;
  rq.count = 2;
  send_rollout(&rq);
}

static uint64_t version_of(const Rlorch__V1__RolloutResult *r) {
  cr_assert_gt(r->n_rollouts, 0u);
  for (size_t i = 1; i < r->n_rollouts; i++)
    cr_assert_eq(r->rollouts[i]->policy_version, r->rollouts[0]->policy_version, "one group, one version");
  return r->rollouts[0]->policy_version;
}

/* Version 1 arrives; a group is being generated when the broadcast of
 * version 2 starts, which is then aborted (its sender never sends); then
 * version 2 arrives. */
static void failed_broadcast(int double_buffer) {
  fake_start();
  K.opts.double_buffer = double_buffer;
  K.opts.rollout.latency_ms_mean = 250; /* a request of 2 takes 0.5 s */
  agent_start();
  sender s;
  sender_init(&s);
  broadcast_ok(&s, "run-1/step-0", 1);
  request(1);
  cr_assert_eq(version_of(wait_result(1)), 1u);

  sender_plan(&s, "run-1/step-1", 2);
  uint32_t zero = 0, one = 1;
  cr_assert(wait_until(stats_active, &zero), "request 1 is over");
  request(2);
  cr_assert(wait_until(stats_active, &one), "request 2 is being generated");
  send_trigger(s.p);
  cr_assert(wait_until(log_has_cb, "broadcast_start plan_id=run-1/step-1"), "%s", K.log);
  cr_assert_eq(version_of(wait_result(2)), 1u, "the group is of the version it started from");
  pthread_mutex_lock(&K.mu);
  const char *made = strstr(K.log, "group_generated request_id=2 ");
  const char *start = strstr(K.log, "broadcast_start plan_id=run-1/step-1");
  pthread_mutex_unlock(&K.mu);
  cr_assert(made && start, "%s", K.log);
  if (double_buffer)
    cr_assert(start < made, "two sets: the broadcast starts while the group is generated\n%s", K.log);
  else
    cr_assert(made < start, "one set: the broadcast waits for the group being generated\n%s", K.log);
  send_plan_abort("run-1/step-1");
  cr_assert_str_not_empty(wait_done("run-1/step-1")->error, "the aborted broadcast reports its error");
  request(3);
  if (double_buffer) {
    cr_assert_eq(version_of(wait_result(3)), 1u, "a failed broadcast leaves the current version");
    cr_assert(log_has("weights_kept plan_id=run-1/step-1 version=1"), "%s", K.log);
    cr_assert_not(log_has("weights_torn"));
  } else {
    cr_assert_eq(wait_result(3)->n_rollouts, 0u, "torn weights: no rollout of any version");
    cr_assert(log_has("weights_torn plan_id=run-1/step-1 version_held=1"), "%s", K.log);
    cr_assert(log_has("rollouts_refused request_id=3"), "%s", K.log);
  }
  broadcast_ok(&s, "run-1/step-1-r2", 2);
  request(4);
  cr_assert_eq(version_of(wait_result(4)), 2u, "the next broadcast that succeeds is served");
  sender_free(&s);
  fake_stop();
}

Test(agent_inference, one_buffer_set_serves_nothing_from_torn_weights) { failed_broadcast(0); }

Test(agent_inference, two_buffer_sets_keep_serving_the_previous_version) { failed_broadcast(1); }

/* ---- relays ------------------------------------------------------------------------------ */

typedef struct downstream {
  bcast_engine *e;
  const bcast_plan *p;
  bcast_tensor t[1];
  int rc;
  bcast_err err;
} downstream;

static void *downstream_main(void *arg) {
  downstream *d = arg;
  d->rc = bcast_engine_execute(d->e, d->p, d->t, 1, NULL, &d->err);
  return NULL;
}

Test(agent_inference, a_worker_given_data_listen_registers_it_and_relays_to_another_receiver) {
  fake_start();
  K.opts.data_listen = "127.0.0.1:0";
  agent_start();
  pthread_mutex_lock(&K.mu);
  char relay[96];
  snprintf(relay, sizeof relay, "%s", K.reg_data_address);
  pthread_mutex_unlock(&K.mu);
  cr_assert(strncmp(relay, "127.0.0.1:", 10) == 0 && strcmp(relay, "127.0.0.1:0"),
            "Register carries the bound address, got '%s'", relay);
  sender s;
  sender_init(&s);
  for (size_t i = 0; i < 512 * 64; i++) ((float *)s.t[0].data)[i] = (float)(i % 89) * 0.25f;
  /* Rank 1 (the agent) takes from the sender and relays to rank 2. */
  uint32_t from[] = {0, 0, 1};
  const char *eps[] = {"", relay, ""};
  bcast_plan_opts o = {.id = "run-1/step-0", .mode = BCAST_MODE_HOST, .staging_budget = 16 << 10,
                       .world_size = 3, .policy_version = 1, .host_endpoint = bcast_engine_data_address(s.e),
                       .relay_from = from, .relay_endpoints = eps};
  cr_assert_eq(bcast_plan_build(s.t, 1, &o, &s.p, &s.err), BCAST_OK, "%s", s.err.msg);
  Rlorch__V1__BroadcastPlan *pb = NULL;
  cr_assert_eq(bcast_plan_to_pb(s.p, &pb, &s.err), BCAST_OK, "%s", s.err.msg);
  Rlorch__V1__Command cmd = RLORCH__V1__COMMAND__INIT;
  cmd.kind_case = RLORCH__V1__COMMAND__KIND_PLAN;
  cmd.plan = pb;
  cmd.rank = 1;
  send_cmd(&cmd);
  bcast_pb_free(&pb->base);
  plan_wait w = {RLORCH__V1__REPORT_REQUEST__KIND_PLAN_ACK, "run-1/step-0"};
  cr_assert(wait_until(has_plan_report, &w), "plan acked\n%s", K.log);
  downstream d = {.p = s.p, .t = {s.t[0]}};
  d.t[0].data = calloc(512 * 64, 2);
  bcast_engine_opts eo = {.rank = 2, .device = -1, .timeout_s = 30};
  cr_assert_eq(bcast_engine_new(&eo, &d.e, &d.err), BCAST_OK, "%s", d.err.msg);
  pthread_t dt;
  cr_assert_eq(pthread_create(&s.tid, NULL, sender_main, &s), 0);
  cr_assert_eq(pthread_create(&dt, NULL, downstream_main, &d), 0);
  send_trigger(s.p);
  cr_assert_eq(pthread_join(s.tid, NULL), 0);
  cr_assert_eq(pthread_join(dt, NULL), 0);
  cr_assert_eq(s.rc, BCAST_OK, "sender: %s", s.err.msg);
  cr_assert_eq(d.rc, BCAST_OK, "downstream: %s", d.err.msg);
  const Rlorch__V1__BroadcastDone *done = wait_done("run-1/step-0");
  cr_assert_str_empty(done->error);
  uint64_t want = 0, got = 0;
  char err[256];
  cr_assert_eq(agent_weights_checksum(s.t, 1, AGENT_WEIGHTS_STORAGE, &want, err, sizeof err), 0, "%s", err);
  cr_assert_eq(agent_weights_checksum(d.t, 1, AGENT_WEIGHTS_WIRE, &got, err, sizeof err), 0, "%s", err);
  cr_assert_eq(done->weights_checksum, want, "the relay holds the version sent, whole");
  cr_assert_eq(got, want, "so does the receiver it relayed to");
  cr_assert(log_has("engine_rank_changed from=0 to=1"),
            "the engine made at start was made again for rank 1, on the address registered\n%s", K.log);
  bcast_engine_free(d.e);
  free(d.t[0].data);
  sender_free(&s);
  fake_stop();
}

/* ---- the report stream ------------------------------------------------------------------- */

/* How many reports of `kind` about plan `id` arrived, and how many of them
 * on the stream; K.mu held. */
static int plan_reports(int kind, const char *id, int *on_stream) {
  int n = 0;
  *on_stream = 0;
  for (int i = 0; i < K.nreports; i++) {
    const Rlorch__V1__ReportRequest *r = K.reports[i];
    if ((int)r->kind_case != kind) continue;
    const char *pid = kind == RLORCH__V1__REPORT_REQUEST__KIND_PLAN_ACK ? r->plan_ack->plan_id
                                                                        : r->broadcast_done->plan_id;
    if (strcmp(pid, id)) continue;
    n++;
    *on_stream += K.via_stream[i];
  }
  return n;
}

static int kind_via(int kind, int stream) {
  int n = 0;
  for (int i = 0; i < K.nreports; i++)
    n += (int)K.reports[i]->kind_case == kind && K.via_stream[i] == stream;
  return n;
}

static int heartbeat_seen(void *arg) {
  return kind_via(RLORCH__V1__REPORT_REQUEST__KIND_HEARTBEAT, 0) > 0;
}

Test(agent_inference, acks_and_broadcast_reports_go_on_the_report_stream) {
  fake_start_with(1);
  agent_start();
  sender s;
  sender_init(&s);
  broadcast_ok(&s, "run-1/step-0", 1);
  broadcast_ok(&s, "run-1/step-1", 2);
  request(1);
  cr_assert_eq(version_of(wait_result(1)), 2u);
  cr_assert(wait_until(heartbeat_seen, NULL), "a heartbeat arrives\n%s", K.log);
  pthread_mutex_lock(&K.mu);
  int on_stream;
  for (int step = 0; step < 2; step++) {
    char id[32];
    snprintf(id, sizeof id, "run-1/step-%d", step);
    cr_assert_eq(plan_reports(RLORCH__V1__REPORT_REQUEST__KIND_PLAN_ACK, id, &on_stream), 1);
    cr_assert_eq(on_stream, 1, "%s: the ack came on the stream, once", id);
    cr_assert_eq(plan_reports(RLORCH__V1__REPORT_REQUEST__KIND_BROADCAST_DONE, id, &on_stream), 1);
    cr_assert_eq(on_stream, 1, "%s: so did the broadcast's end", id);
  }
  cr_assert_eq(kind_via(RLORCH__V1__REPORT_REQUEST__KIND_ROLLOUTS, 1), 0,
               "rollouts need their answer: Report");
  cr_assert_eq(kind_via(RLORCH__V1__REPORT_REQUEST__KIND_HEARTBEAT, 1), 0,
               "heartbeats say known=false in their answer: Report");
  pthread_mutex_unlock(&K.mu);
  cr_assert(!log_has("report_stream_unsupported"), "%s", K.log);
  sender_free(&s);
  fake_stop();
}

Test(agent_inference, without_a_report_stream_acks_and_reports_go_through_report) {
  fake_start(); /* an orchestrator without ReportStream */
  agent_start();
  sender s;
  sender_init(&s);
  broadcast_ok(&s, "run-1/step-0", 1);
  broadcast_ok(&s, "run-1/step-1", 2);
  pthread_mutex_lock(&K.mu);
  int on_stream;
  cr_assert_eq(plan_reports(RLORCH__V1__REPORT_REQUEST__KIND_PLAN_ACK, "run-1/step-1", &on_stream),
               1, "each ack once, nothing lost to the missing stream");
  cr_assert_eq(plan_reports(RLORCH__V1__REPORT_REQUEST__KIND_BROADCAST_DONE, "run-1/step-0",
                            &on_stream),
               1);
  pthread_mutex_unlock(&K.mu);
  cr_assert(log_has("report_stream_unsupported"), "the fallback is logged\n%s", K.log);
  sender_free(&s);
  fake_stop();
}

/* An orchestrator with the stream, an agent, a sender; the stream's next
 * report will be refused with `code`. */
static void start_refusing(sender *s, grpc_status_code code) {
  fake_start_with(1);
  agent_start();
  sender_init(s);
  pthread_mutex_lock(&K.mu);
  K.refuse_stream = code;
  pthread_mutex_unlock(&K.mu);
}

Test(agent_inference, a_report_the_stream_refuses_is_logged_and_not_sent_again) {
  sender s;
  start_refusing(&s, GRPC_STATUS_FAILED_PRECONDITION);
  /* The ack is refused (not kept): wait for the log instead. */
  send_plan_only(&s, "run-1/step-0", 1);
  for (int i = 0; i < 1000 && !log_has("report_refused seq=1 code=FAILED_PRECONDITION"); i++)
    usleep(10000);
  cr_assert(log_has("report_refused seq=1 code=FAILED_PRECONDITION msg=\"refused by the test\""),
            "%s", K.log);
  /* The next plan goes through; the refused ack was not sent again. */
  broadcast_ok(&s, "run-1/step-1", 2);
  pthread_mutex_lock(&K.mu);
  int on_stream;
  cr_assert_eq(plan_reports(RLORCH__V1__REPORT_REQUEST__KIND_PLAN_ACK, "run-1/step-0", &on_stream),
               0);
  pthread_mutex_unlock(&K.mu);
  sender_free(&s);
  fake_stop();
}

Test(agent_inference, a_worker_the_stream_does_not_know_registers_again) {
  sender s;
  start_refusing(&s, GRPC_STATUS_NOT_FOUND);
  send_plan_only(&s, "run-1/step-0", 1); /* its ack refused NOT_FOUND */
  cr_assert(wait_until(registered_twice, NULL), "registered again\n%s", K.log);
  pthread_mutex_lock(&K.mu);
  int on_stream;
  cr_assert_eq(plan_reports(RLORCH__V1__REPORT_REQUEST__KIND_PLAN_ACK, "run-1/step-0", &on_stream),
               0, "a forgotten worker's ack is stale: not sent again");
  pthread_mutex_unlock(&K.mu);
  cr_assert(log_has("worker_unknown"), "%s", K.log);
  sender_free(&s);
  fake_stop();
}

typedef struct twice {
  const char *id;
} twice;

static int ack_twice(void *arg) {
  int on_stream;
  return plan_reports(RLORCH__V1__REPORT_REQUEST__KIND_PLAN_ACK, ((twice *)arg)->id, &on_stream) >= 2;
}

/* The stream breaks after it took the ack (the agent registers again and
 * cancels its old streams): the ack may not have been handled, so it is sent
 * again, through Report. */
Test(agent_inference, the_last_report_is_sent_again_when_the_stream_breaks) {
  fake_start_with(1);
  agent_start();
  sender s;
  sender_init(&s);
  sender_plan(&s, "run-1/step-0", 1);
  pthread_mutex_lock(&K.mu);
  K.forget = 1; /* the next heartbeat hears known = false */
  pthread_mutex_unlock(&K.mu);
  cr_assert(wait_until(registered_twice, NULL), "registered again\n%s", K.log);
  twice t = {"run-1/step-0"};
  cr_assert(wait_until(ack_twice, &t), "the ack sent again\n%s", K.log);
  pthread_mutex_lock(&K.mu);
  int on_stream;
  cr_assert_eq(plan_reports(RLORCH__V1__REPORT_REQUEST__KIND_PLAN_ACK, "run-1/step-0", &on_stream),
               2);
  cr_assert_eq(on_stream, 1, "first on the stream, then through Report");
  pthread_mutex_unlock(&K.mu);
  sender_free(&s);
  fake_stop();
}
