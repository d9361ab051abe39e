/* `rlorch inference`: synthetic rollouts with the policy version held, the
 * receiving side of the broadcast.
 *
 * Rollout requests are served by a pool of generator threads, as an engine
 * batches many sequences: the command thread only queues a request, so up to
 * `concurrency` are generated at once and a plan or trigger queued behind
 * them is not held up. The orchestrator bounds how many are in flight
 * (max_requests_per_worker); requests beyond the pool wait in its queue. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "workers/agent/agent_log.h"
#include "workers/agent/agent.h"
#include "workers/agent/agent_core.h"
#include "workers/agent/agent_rollout.h"
#include "workers/agent/agent_weights.h"
#include "workers/agent/agent_xfer.h"
#include "workers/bcast/bcast_preset.h"

#ifdef RLORCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* Rollouts per report: bounds the message (about 30 bytes each) whatever
 * count the orchestrator asks for. */
#define AGENT__ROLLOUTS_PER_REPORT 65536u

typedef struct agent__inference {
  agent_opts o;
  bcast_caps caps;
  int device;
  agent_rollout_gen gen;
  agent *a;
  bcast_tensor *t; /* receive buffers in wire dtype, from the first plan */
  size_t n;
  bcast_storage *storage;
  agent_xfer xfer;
  Rlorch__V1__Capabilities caps_pb;
  Rlorch__V1__RegisterRequest reg;
  char run_id[64]; /* run of the last command: versions count per run */
  /* The generator pool. */
  pthread_mutex_t mu;   /* guards the queue, quit and gen */
  pthread_cond_t cond;  /* queue grew, or quit */
  struct inference__job *head, *tail;
  int quit;
  pthread_t *tids;
  size_t nthreads;
} agent__inference;

typedef struct inference__job {
  uint64_t request_id;
  uint32_t count;
  uint64_t group_id;
  struct inference__job *next;
} inference__job;

static void inference__free_buffers(agent__inference *in) {
  bcast_storage_free(in->storage);
  free(in->t);
  in->storage = NULL;
  in->t = NULL;
  in->n = 0;
}

/* Allocates receive buffers shaped like the plan's tensors (GPU memory with a
 * device, host memory otherwise), or reuses the ones it already has. */
static int inference__bind(void *ud, const bcast_plan *p, bcast_tensor **local, size_t *n,
                           bcast_err *err) {
  agent__inference *in = ud;
  if (in->t && bcast_plan_check_local(p, in->t, in->n, 0, err) == 0) {
    *local = in->t;
    *n = in->n;
    return 0;
  }
  if (in->t) agent_log_info("receive_buffers_realloc", "reason=\"%s\"", err->msg);
  inference__free_buffers(in);
  in->t = calloc(p->ntensors ? p->ntensors : 1, sizeof *in->t);
  if (!in->t) {
    err->code = BCAST_ENOMEM;
    snprintf(err->msg, sizeof err->msg, "receive buffers: no memory");
    return BCAST_ENOMEM;
  }
  memcpy(in->t, p->tensors, p->ntensors * sizeof *in->t);
  in->n = p->ntensors;
  for (size_t i = 0; i < in->n; i++) {
    in->t[i].residency = in->device >= 0 ? BCAST_RES_GPU : BCAST_RES_HOST_PAGEABLE;
    in->t[i].device = in->device;
    in->t[i].data = NULL;
  }
  int rc = bcast_storage_alloc(in->t, in->n, BCAST_FILL_RECEIVER, 0, &in->storage, err);
  if (!rc) rc = bcast_plan_check_local(p, in->t, in->n, 0, err);
  if (rc) {
    inference__free_buffers(in);
    return rc;
  }
  agent_log_info("receive_buffers", "tensors=%zu bytes=%llu where=%s", in->n,
           (unsigned long long)bcast_storage_bytes(in->storage),
           in->device >= 0 ? "gpu" : "host");
  *local = in->t;
  *n = in->n;
  return 0;
}

/* The checksum of the received weights, in plan order (the plan's tensors are
 * the buffers' order); on success the policy version of the plan. */
static int inference__done(void *ud, const bcast_plan *p, int ok, uint64_t *checksum, char *err,
                           size_t errlen) {
  agent__inference *in = ud;
  if (!ok) return 0;
  if (agent_weights_checksum(in->t, in->n, AGENT_WEIGHTS_WIRE, checksum, err, errlen)) return -1;
  agent_set_policy_version(in->a, p->policy_version);
  agent_log_info("policy_version", "version=%llu", (unsigned long long)p->policy_version);
  return 0;
}

/* Makes up to `count` rollouts of `version` one after another, each sleeping
 * its latency (waking early when the agent stops); returns how many. The
 * draws share the generator, the sleeps overlap with other threads'. */
static size_t inference__generate(agent__inference *in, uint32_t rank, uint64_t version,
                                  agent_rollout *out, size_t count) {
  size_t made = 0;
  for (; made < count && !agent_stopping(in->a); made++) {
    pthread_mutex_lock(&in->mu);
    agent_rollout_draw(&in->gen, rank, version, &out[made]);
    pthread_mutex_unlock(&in->mu);
    double t0 = agent_now();
    agent_sleep(in->a, out[made].latency_s);
    out[made].seconds = agent_now() - t0;
  }
  return made;
}

/* The synthetic rollouts have the shape of real ones (prompt and completion
 * token ids, a log-probability per completion token, a reward, the prompt
 * group), so the orchestrator and the benchmarks carry what an engine sends.
 * The values are made up from the ids; completions longer than this carry
 * their count only, which keeps a report of very long ones within limits. */
#define INFERENCE__SHAPED_TOKENS_MAX 8192
#define INFERENCE__PROMPT_TOKENS 16

static uint32_t inference__mix(uint64_t x) {
  x ^= x >> 33;
  x *= UINT64_C(0xff51afd7ed558ccd);
  x ^= x >> 33;
  return (uint32_t)x;
}

/* Fills the token fields of msgs from ro into ids/lps (room for `room`
 * completion tokens in all); the prompt is made up from the group, so a group
 * re-sent to another worker gets the same one. */
static void inference__shape(Rlorch__V1__Rollout *msgs, const agent_rollout *ro, size_t made,
                             uint64_t group_id, uint32_t *prompt, uint32_t *ids, float *lps,
                             double *rewards) {
  for (int k = 0; k < INFERENCE__PROMPT_TOKENS; k++)
    prompt[k] = inference__mix(group_id * 131 + (uint64_t)k) % 32000;
  size_t off = 0;
  for (size_t i = 0; i < made; i++) {
    Rlorch__V1__Rollout *m = &msgs[i];
    m->n_prompt_token_ids = INFERENCE__PROMPT_TOKENS;
    m->prompt_token_ids = prompt;
    m->finish_reason = RLORCH__V1__FINISH_REASON__FINISH_REASON_STOP;
    rewards[i] = (double)(inference__mix(ro[i].id) % 1000) / 1000.0;
    m->n_rewards = 1;
    m->rewards = &rewards[i];
    if (ro[i].tokens > INFERENCE__SHAPED_TOKENS_MAX) continue;
    for (uint32_t k = 0; k < ro[i].tokens; k++) {
      uint32_t h = inference__mix(ro[i].id * 7919 + k);
      ids[off + k] = h % 32000;
      lps[off + k] = -(float)(h % 4000) / 1000.0f;
    }
    m->tokens = 0; /* the ids say it */
    m->n_completion_token_ids = m->n_completion_logprobs = ro[i].tokens;
    m->completion_token_ids = &ids[off];
    m->completion_logprobs = &lps[off];
    off += ro[i].tokens;
  }
}

/* Reports `made` rollouts of `ro` (none is a valid answer: it frees the
 * orchestrator's slot) for request `request_id`. */
static void inference__report(agent__inference *in, uint64_t request_id, uint64_t group_id,
                              const agent_rollout *ro, Rlorch__V1__Rollout *msgs,
                              Rlorch__V1__Rollout **ptrs, size_t made, uint64_t version) {
  uint64_t tokens = 0;
  size_t shaped = 0;
  for (size_t i = 0; i < made; i++) {
    rlorch__v1__rollout__init(&msgs[i]);
    msgs[i].id = ro[i].id;
    msgs[i].policy_version = ro[i].policy_version;
    msgs[i].tokens = ro[i].tokens;
    msgs[i].seconds = ro[i].seconds;
    msgs[i].group_id = group_id; /* the orchestrator refuses a result of another group */
    ptrs[i] = &msgs[i];
    tokens += ro[i].tokens;
    if (ro[i].tokens <= INFERENCE__SHAPED_TOKENS_MAX) shaped += ro[i].tokens;
  }
  uint32_t prompt[INFERENCE__PROMPT_TOKENS];
  uint32_t *ids = made ? malloc((shaped ? shaped : 1) * sizeof *ids) : NULL;
  float *lps = made ? malloc((shaped ? shaped : 1) * sizeof *lps) : NULL;
  double *rewards = made ? malloc(made * sizeof *rewards) : NULL;
  if (ids && lps && rewards) inference__shape(msgs, ro, made, group_id, prompt, ids, lps, rewards);
  /* Without the memory the rollouts go as counts: still valid, only thinner. */
  Rlorch__V1__RolloutResult res = RLORCH__V1__ROLLOUT_RESULT__INIT;
  res.request_id = request_id;
  res.n_rollouts = made;
  res.rollouts = made ? ptrs : NULL;
  Rlorch__V1__ReportRequest req = RLORCH__V1__REPORT_REQUEST__INIT;
  req.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_ROLLOUTS;
  req.rollouts = &res;
  agent_log_debug("rollouts", "request_id=%llu count=%zu tokens=%llu version=%llu",
                  (unsigned long long)request_id, made, (unsigned long long)tokens,
                  (unsigned long long)version);
  agent_report(in->a, &req);
  free(ids);
  free(lps);
  free(rewards);
}

/* Serves one request on a generator thread. */
static void inference__serve(agent__inference *in, const inference__job *j) {
  uint32_t left = j->count;
  uint32_t rank = agent_id_tag(in->a);
  do {
    uint32_t k = left < AGENT__ROLLOUTS_PER_REPORT ? left : AGENT__ROLLOUTS_PER_REPORT;
    agent_rollout *ro = calloc(k ? k : 1, sizeof *ro);
    Rlorch__V1__Rollout *msgs = calloc(k ? k : 1, sizeof *msgs);
    Rlorch__V1__Rollout **ptrs = calloc(k ? k : 1, sizeof *ptrs);
    if (!ro || !msgs || !ptrs) {
      free(ro);
      free(msgs);
      free(ptrs);
      /* Answer with nothing rather than leave the request in flight forever:
       * the orchestrator asks again for what it still needs. */
      agent_log_error("rollouts_failed", "request_id=%llu reason=\"no memory for %u rollouts\"",
                      (unsigned long long)j->request_id, k);
      inference__report(in, j->request_id, j->group_id, NULL, NULL, NULL, 0, 0);
      return;
    }
    /* The version held when generation starts: never older than the one the
     * orchestrator counted the request at. */
    uint64_t version = agent_policy_version(in->a);
    size_t made = inference__generate(in, rank, version, ro, k);
    if (made > 0 || j->count == 0)
      inference__report(in, j->request_id, j->group_id, ro, msgs, ptrs, made, version);
    free(ro);
    free(msgs);
    free(ptrs);
    left -= k;
    if (made < k) break; /* stopping */
  } while (left > 0);
}

static void *inference__worker_main(void *arg) {
  agent__inference *in = arg;
  pthread_mutex_lock(&in->mu);
  for (;;) {
    while (!in->head && !in->quit) pthread_cond_wait(&in->cond, &in->mu);
    if (in->quit) break;
    inference__job *j = in->head;
    in->head = j->next;
    if (!in->head) in->tail = NULL;
    pthread_mutex_unlock(&in->mu);
    inference__serve(in, j);
    free(j);
    pthread_mutex_lock(&in->mu);
  }
  pthread_mutex_unlock(&in->mu);
  return NULL;
}

/* Starts `n` generator threads; 0, or -1 with err filled (none left running). */
static int inference__pool_start(agent__inference *in, size_t n, char *err, size_t errlen) {
  in->tids = calloc(n, sizeof *in->tids);
  if (!in->tids) return snprintf(err, errlen, "no memory for %zu generator threads", n), -1;
  for (size_t i = 0; i < n; i++) {
    int rc = pthread_create(&in->tids[i], NULL, inference__worker_main, in);
    if (rc) {
      snprintf(err, errlen, "generator thread %zu: %s", i, strerror(rc));
      return -1; /* inference__pool_stop joins those started */
    }
    in->nthreads++;
  }
  return 0;
}

/* Stops and joins the pool; requests not yet started are dropped (the
 * orchestrator sends their groups to other workers once the stream closes). */
static void inference__pool_stop(agent__inference *in) {
  pthread_mutex_lock(&in->mu);
  in->quit = 1;
  pthread_cond_broadcast(&in->cond);
  pthread_mutex_unlock(&in->mu);
  for (size_t i = 0; i < in->nthreads; i++) pthread_join(in->tids[i], NULL);
  free(in->tids);
  in->tids = NULL;
  in->nthreads = 0;
  while (in->head) {
    inference__job *j = in->head;
    in->head = j->next;
    free(j);
  }
  in->tail = NULL;
}

/* Queues a request for the pool; -1 (fatal) only when out of memory. */
static int inference__rollout(agent__inference *in, const Rlorch__V1__RolloutRequest *r) {
  inference__job *j = calloc(1, sizeof *j);
  if (!j) {
    agent_log_error("fatal", "reason=\"no memory to queue request %llu\"",
                    (unsigned long long)r->request_id);
    return -1;
  }
  j->request_id = r->request_id;
  j->count = r->count;
  j->group_id = r->group_id;
  pthread_mutex_lock(&in->mu);
  if (in->tail) in->tail->next = j;
  else in->head = j;
  in->tail = j;
  pthread_cond_signal(&in->cond);
  pthread_mutex_unlock(&in->mu);
  return 0;
}

static int inference__command(agent *a, const Rlorch__V1__Command *cmd, void *ud) {
  agent__inference *in = ud;
  /* Policy versions number the steps of one run: a new run starts again at 0
   * (the weights held until its first broadcast). */
  if (cmd->run_id && cmd->run_id[0] && strcmp(cmd->run_id, in->run_id) != 0) {
    if (in->run_id[0]) {
      agent_log_info("new_run", "run=%s previous=%s version=0", cmd->run_id, in->run_id);
      agent_set_policy_version(a, 0);
    }
    snprintf(in->run_id, sizeof in->run_id, "%s", cmd->run_id);
  }
  switch (cmd->kind_case) {
  case RLORCH__V1__COMMAND__KIND_ROLLOUT: return inference__rollout(in, cmd->rollout);
  case RLORCH__V1__COMMAND__KIND_PLAN: agent_xfer_on_plan(&in->xfer, a, cmd); return 0;
  case RLORCH__V1__COMMAND__KIND_TRIGGER: agent_xfer_on_trigger(&in->xfer, a, cmd); return 0;
  case RLORCH__V1__COMMAND__KIND_ABORT: agent_xfer_on_abort(&in->xfer, cmd); return 0;
  case RLORCH__V1__COMMAND__KIND_SHUTDOWN:
    agent_log_info("shutdown", "reason=\"%s\"", cmd->shutdown->reason ? cmd->shutdown->reason : "");
    return 1;
  case RLORCH__V1__COMMAND__KIND_TRAIN:
    agent_log_warn("command_ignored", "kind=train reason=\"an inference worker does not train\"");
    return 0;
  default:
    agent_log_warn("command_ignored", "kind=%d reason=\"unknown command\"", (int)cmd->kind_case);
    return 0;
  }
}

int agent_inference_run(const agent_opts *o) {
  agent__inference in;
  memset(&in, 0, sizeof in);
  in.o = *o;
  pthread_mutex_init(&in.mu, NULL);
  pthread_cond_init(&in.cond, NULL);
  agent_block_signals();
  char err[1024];
  bcast_caps_probe(&in.caps);
  if (agent_pick_device(&in.o, &in.caps, &in.device, err, sizeof err)) {
    agent_log_error("fatal", "reason=\"%s\"", err);
    return 1;
  }
#ifdef RLORCH_HAVE_CUDA
  if (in.device >= 0) cudaSetDevice(in.device);
#endif
  agent_log_devices(&in.caps, in.device);
  uint64_t seed = in.o.seed_set ? in.o.seed : (uint64_t)getpid() * 0x9E3779B97F4A7C15ull;
  agent_rollout_gen_init(&in.gen, &in.o.rollout, seed);
  int status = 1;
  agent *a = NULL;
  agent_xfer_init(&in.xfer, 0, in.device, NULL, inference__bind, inference__done, &in, err,
                  sizeof err);
  rlorch__v1__register_request__init(&in.reg);
  agent_caps_to_pb(&in.caps, in.device, &in.caps_pb);
  in.reg.role = RLORCH__V1__WORKER_ROLE__WORKER_ROLE_INFERENCE;
  in.reg.capabilities = &in.caps_pb;
  if (agent_new(&in.o, &in.reg, inference__command, &in, &a, err, sizeof err)) {
    agent_log_error("fatal", "reason=\"%s\"", err);
    goto out;
  }
  in.a = a;
  if (inference__pool_start(&in, in.o.concurrency, err, sizeof err)) {
    agent_log_error("fatal", "reason=\"%s\"", err);
    goto out;
  }
  agent_set_abort_fn(a, agent_xfer_abort_hook, &in.xfer);
  agent_log_info("inference_ready", "distribution=%s tokens_mean=%g tokens_std=%g latency_ms_mean=%g "
           "latency_ms_std=%g concurrency=%u device=%d",
           in.o.rollout.dist == AGENT_DIST_NORMAL ? "normal" : "lognormal",
           in.o.rollout.tokens_mean, in.o.rollout.tokens_std, in.o.rollout.latency_ms_mean,
           in.o.rollout.latency_ms_std, in.o.concurrency, in.device);
  status = agent_run(a);
out:
  /* Before agent_free: the generator threads report through the agent. */
  inference__pool_stop(&in);
  agent_free(a);
  agent_xfer_free(&in.xfer);
  inference__free_buffers(&in);
  pthread_cond_destroy(&in.cond);
  pthread_mutex_destroy(&in.mu);
  agent_log_info("exit", "status=%d", status);
  return status;
}
