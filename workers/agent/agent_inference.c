/* `rlorch inference`: synthetic generation with the policy version held, the
 * receiving side of the broadcast.
 *
 * Rollout requests are served by a pool of generator threads, as an engine
 * batches many sequences: the command thread only queues a request, so up to
 * `concurrency` are generated at once and a plan or trigger queued behind
 * them is not held up. The orchestrator bounds how many are in flight
 * (max_requests_per_worker, and at most the pool's size, which Register
 * announces as Capabilities.max_concurrent_requests); requests beyond the
 * pool wait in its queue.
 *
 * A request is one group: `count` completions of its prompt (agent_rollout.h),
 * each completion's latency slept in turn, then scored by the reward hook and
 * reported in one RolloutResult. What is not sent:
 * - a request aborted (AbortCommand.request_id) while queued is dropped; one
 *   aborted while generating stops at its next completion and sends nothing
 *   (the orchestrator would ignore it). Aborts are handled in command order,
 *   so one queued behind a broadcast the command thread executes waits for it;
 * - a request whose reward hook fails, or that finds no memory, is answered
 *   with no rollout at all, and the reason is logged as an error: an empty
 *   result frees the orchestrator's slot, so the request does not stay in
 *   flight, and no group goes out with made-up rewards.
 *
 * Versions are transactional: a group is generated from one whole version and
 * labelled with it. With one set of buffers (the default) a broadcast takes
 * the weights lock for writing, so it waits for the groups being generated
 * and generation waits for it; a broadcast that fails leaves the buffers torn
 * (part new, part old), and until one succeeds every request is answered with
 * no rollout. With --double-buffer the broadcast writes the other set while
 * generation goes on from the current one, and the lock is taken only to swap
 * them; a failed broadcast leaves the current version as it was. */
#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "workers/agent/agent_log.h"
#include "workers/agent/agent.h"
#include "workers/agent/agent_core.h"
#include "workers/agent/agent_pb.h"
#include "workers/agent/agent_rollout.h"
#include "workers/agent/agent_weights.h"
#include "workers/agent/agent_xfer.h"
#include "workers/bcast/bcast_preset.h"

#ifdef RLORCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

typedef struct inference__set {
  bcast_tensor *t;
  size_t n;
  bcast_storage *storage;
} inference__set;

typedef struct agent__inference {
  agent_opts o;
  bcast_caps caps;
  int device;
  agent_rollout_gen gen; /* thread-safe: the generator threads share it */
  agent *a;
  /* Receive buffers in wire dtype, from the first plan: `cur` holds the
   * version served; with double buffering `next` is the one a broadcast
   * writes. `retired`: a set replaced by a new layout, freed after the next
   * broadcast: a colocated sender keeps its mapping of it until it imports
   * the new export, and CUDA IPC memory must outlive the mappings of it. */
  inference__set cur, next, retired;
  /* Read-held by a generator from the version it reads to its group's last
   * completion; write-held by a broadcast into `cur` (one set) or by the swap
   * (two), writers first. Guards `torn` and, with two sets, which is `cur`. */
  pthread_rwlock_t wlock;
  int torn;    /* one set: the last broadcast into it failed part-way */
  int writing; /* one set: the command thread write-holds wlock for a broadcast */
  agent_xfer xfer;
  Rlorch__V1__Capabilities caps_pb;
  Rlorch__V1__RegisterRequest reg;
  /* The generator pool. */
  pthread_mutex_t mu;   /* guards the queue, the active list, quit and the jobs' aborted flags */
  pthread_cond_t cond;  /* queue grew, or quit */
  struct inference__job *head, *tail; /* queued, not started */
  struct inference__job *active;      /* being generated */
  int quit;
  pthread_t *tids;
  size_t nthreads;
  /* Heartbeat.stats: written by the generator threads, read by the heartbeat
   * thread. Rollouts and tokens count every completion whose latency was
   * slept, sent or not (an abort, a failed reward); seconds are each
   * request's wall time, from its start to its report. */
  atomic_uint requests_active;
  atomic_uint_fast64_t rollouts_generated, tokens_generated, generate_ns;
} agent__inference;

typedef struct inference__job {
  Rlorch__V1__RolloutRequest *msg; /* a copy: the command is freed once queued */
  agent_request rq;                /* points into msg */
  uint64_t registration;           /* agent_registration when it was queued */
  int aborted;
  struct inference__job *next;
} inference__job;

static void inference__job_free(inference__job *j) {
  if (!j) return;
  if (j->msg) rlorch__v1__rollout_request__free_unpacked(j->msg, NULL);
  free(j);
}

static void inference__set_free(inference__set *b) {
  bcast_storage_free(b->storage);
  free(b->t);
  memset(b, 0, sizeof *b);
}

static void inference__free_buffers(agent__inference *in) {
  inference__set_free(&in->retired);
  inference__set_free(&in->cur);
  inference__set_free(&in->next);
}

/* Allocates buffers shaped like the plan's tensors into b (GPU memory with a
 * device, host memory otherwise). */
static int inference__set_alloc(agent__inference *in, const bcast_plan *p, inference__set *b,
                                bcast_err *err) {
  b->t = calloc(p->ntensors ? p->ntensors : 1, sizeof *b->t);
  if (!b->t) {
    err->code = BCAST_ENOMEM;
    snprintf(err->msg, sizeof err->msg, "receive buffers: no memory");
    return BCAST_ENOMEM;
  }
  memcpy(b->t, p->tensors, p->ntensors * sizeof *b->t);
  b->n = p->ntensors;
  for (size_t i = 0; i < b->n; i++) {
    b->t[i].residency = in->device >= 0 ? BCAST_RES_GPU : BCAST_RES_HOST_PAGEABLE;
    b->t[i].device = in->device;
    b->t[i].data = NULL;
  }
  int rc = bcast_storage_alloc(b->t, b->n, BCAST_FILL_RECEIVER, 0, &b->storage, err);
  if (!rc) rc = bcast_plan_check_local(p, b->t, b->n, 0, err);
  if (rc) {
    inference__set_free(b);
    return rc;
  }
  agent_log_info("receive_buffers", "tensors=%zu bytes=%llu where=%s set=%s", b->n,
                 (unsigned long long)bcast_storage_bytes(b->storage),
                 in->device >= 0 ? "gpu" : "host", b == &in->next ? "next" : "current");
  return 0;
}

/* The set the broadcast writes (the other one with double buffering), made
 * or remade to the plan's layout; the one it replaces is retired (the
 * previous retired one goes now). */
static int inference__bind(void *ud, const bcast_plan *p, bcast_tensor **local, size_t *n,
                           bcast_err *err) {
  agent__inference *in = ud;
  inference__set *b = in->o.double_buffer ? &in->next : &in->cur;
  if (!b->t || bcast_plan_check_local(p, b->t, b->n, 0, err) != 0) {
    if (b->t) {
      agent_log_info("receive_buffers_realloc", "reason=\"%s\"", err->msg);
      inference__set_free(&in->retired);
      in->retired = *b;
      memset(b, 0, sizeof *b);
    }
    int rc = inference__set_alloc(in, p, b, err);
    if (rc) return rc;
  }
  *local = b->t;
  *n = b->n;
  return 0;
}

/* One set: the broadcast is about to write the version served, so it waits
 * for the groups being generated from it, and new ones wait for it. */
static void inference__begin(void *ud, const bcast_plan *p) {
  agent__inference *in = ud;
  (void)p;
  if (in->o.double_buffer) return;
  pthread_rwlock_wrlock(&in->wlock);
  in->writing = 1;
}

/* After a broadcast: on success the checksum of the weights received, in plan
 * order (the plan's tensors are the buffers' order), then they are served at
 * the plan's version; on failure one set is torn, two keep the current one. */
static int inference__done(void *ud, const bcast_plan *p, int ok, uint64_t *checksum, char *err,
                           size_t errlen) {
  agent__inference *in = ud;
  int rc = 0;
  if (ok) {
    inference__set_free(&in->retired); /* every sender mapping of it is closed by now */
    const inference__set *b = in->o.double_buffer ? &in->next : &in->cur;
    rc = agent_weights_checksum(b->t, b->n, AGENT_WEIGHTS_WIRE, checksum, err, errlen);
  }
  if (in->o.double_buffer) {
    if (ok && !rc) {
      pthread_rwlock_wrlock(&in->wlock);
      inference__set t = in->cur;
      in->cur = in->next;
      in->next = t;
      agent_set_policy_version(in->a, p->policy_version);
      pthread_rwlock_unlock(&in->wlock);
    }
  } else if (in->writing) {
    int was = in->torn;
    in->torn = !ok || rc;
    if (!in->torn) agent_set_policy_version(in->a, p->policy_version);
    in->writing = 0;
    pthread_rwlock_unlock(&in->wlock);
    if (in->torn && !was)
      agent_log_warn("weights_torn", "plan_id=%s version_held=%llu action=\"serve no rollout until "
                     "a broadcast succeeds\"", p->id, (unsigned long long)agent_policy_version(in->a));
  }
  if (ok && !rc)
    agent_log_info("policy_version", "version=%llu", (unsigned long long)p->policy_version);
  else if (!ok && in->o.double_buffer)
    agent_log_info("weights_kept", "plan_id=%s version=%llu", p->id,
                   (unsigned long long)agent_policy_version(in->a));
  return rc;
}

/* Reports res (no rollout at all is a valid answer: it frees the
 * orchestrator's slot) for request `request_id`, received under registration
 * `registration`. Request ids are the orchestrator's per registration: after
 * the worker registered again (the orchestrator restarted or forgot it) the
 * request is gone there, and its id may name another one, so the answer is
 * dropped rather than sent. */
static void inference__send(agent__inference *in, Rlorch__V1__RolloutResult *res, uint64_t tokens,
                            uint64_t version, uint64_t registration) {
  if (registration != agent_registration(in->a)) {
    agent_log_info("stale_answer_dropped", "request_id=%llu count=%zu reason=\"the request came "
                   "before the worker registered again\"", (unsigned long long)res->request_id,
                   res->n_rollouts);
    return;
  }
  Rlorch__V1__ReportRequest req = RLORCH__V1__REPORT_REQUEST__INIT;
  req.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_ROLLOUTS;
  req.rollouts = res;
  agent_log_debug("rollouts", "request_id=%llu count=%zu tokens=%llu version=%llu",
                  (unsigned long long)res->request_id, res->n_rollouts,
                  (unsigned long long)tokens, (unsigned long long)version);
  agent_report(in->a, &req);
}

static void inference__send_none(agent__inference *in, uint64_t request_id, uint64_t registration) {
  Rlorch__V1__RolloutResult res = RLORCH__V1__ROLLOUT_RESULT__INIT;
  res.request_id = request_id;
  inference__send(in, &res, 0, agent_policy_version(in->a), registration);
}

static int inference__aborted(agent__inference *in, const inference__job *j) {
  pthread_mutex_lock(&in->mu);
  int a = j->aborted;
  pthread_mutex_unlock(&in->mu);
  return a;
}

/* Generates, sleeps, scores and reports one request (the header says what is
 * not sent); on a generator thread. */
static void inference__serve(agent__inference *in, inference__job *j) {
  const agent_request *rq = &j->rq;
  atomic_fetch_add(&in->requests_active, 1);
  double t0 = agent_now();
  pthread_rwlock_rdlock(&in->wlock);
  /* The version held when generation starts: never older than the one the
   * orchestrator counted the request at. */
  uint64_t version = agent_policy_version(in->a);
  char err[1024];
  agent_group g;
  if (in->torn) {
    pthread_rwlock_unlock(&in->wlock);
    agent_log_warn("rollouts_refused", "request_id=%llu group_id=%llu reason=\"the weights are torn "
                   "by a failed broadcast\" action=\"answer with no rollout\"",
                   (unsigned long long)rq->request_id, (unsigned long long)rq->group_id);
    inference__send_none(in, rq->request_id, j->registration);
    goto done;
  }
  if (agent_group_generate(&in->gen, rq, agent_id_tag(in->a), version, &g, err, sizeof err)) {
    pthread_rwlock_unlock(&in->wlock);
    agent_log_error("rollouts_failed", "request_id=%llu group_id=%llu reason=\"%s\" action=\"answer "
                    "with no rollout\"", (unsigned long long)rq->request_id,
                    (unsigned long long)rq->group_id, err);
    inference__send_none(in, rq->request_id, j->registration);
    goto done;
  }
  uint32_t made = 0;
  uint64_t tokens = 0;
  int aborted = 0;
  for (; made < g.n && !agent_stopping(in->a) && !(aborted = inference__aborted(in, j)); made++) {
    double t = agent_now();
    agent_sleep(in->a, g.c[made].latency_s);
    g.c[made].seconds = agent_now() - t;
    tokens += g.c[made].ntokens;
  }
  atomic_fetch_add(&in->rollouts_generated, made);
  atomic_fetch_add(&in->tokens_generated, tokens);
  if (!aborted) aborted = inference__aborted(in, j); /* during the last sleep */
  agent_log_debug("group_generated", "request_id=%llu version=%llu made=%u of=%u",
                  (unsigned long long)rq->request_id, (unsigned long long)version, made, g.n);
  /* Scored outside the lock: the group is made, and its reports may wait. */
  pthread_rwlock_unlock(&in->wlock);
  if (agent_stopping(in->a)) {
    /* Leaving: the report would be dropped anyway. */
  } else if (aborted) {
    agent_log_debug("request_aborted", "request_id=%llu state=generating made=%u of=%u action=\"send "
                    "nothing\"", (unsigned long long)rq->request_id, made, g.n);
  } else if (agent_group_reward(&in->gen, rq, &g, err, sizeof err)) {
    agent_log_error("reward_failed", "request_id=%llu group_id=%llu reason=\"%s\" action=\"answer "
                    "with no rollout\"", (unsigned long long)rq->request_id,
                    (unsigned long long)rq->group_id, err);
    inference__send_none(in, rq->request_id, j->registration);
  } else {
    Rlorch__V1__RolloutResult *res = agent_pb_rollout_result(&g);
    if (res) {
      inference__send(in, res, tokens, version, j->registration);
      agent_pb_rollout_result_free(res);
    } else {
      agent_log_error("rollouts_failed", "request_id=%llu reason=\"no memory for the report\" "
                      "action=\"answer with no rollout\"", (unsigned long long)rq->request_id);
      inference__send_none(in, rq->request_id, j->registration);
    }
  }
  agent_group_free(&g);
done:
  atomic_fetch_add(&in->generate_ns, (uint_fast64_t)((agent_now() - t0) * 1e9));
  atomic_fetch_sub(&in->requests_active, 1);
}

/* Unlinks j from the list at *head; 1 when it was there. */
static int inference__unlink(inference__job **head, inference__job *j) {
  for (inference__job **p = head; *p; p = &(*p)->next)
    if (*p == j) {
      *p = j->next;
      return 1;
    }
  return 0;
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
    j->next = in->active;
    in->active = j;
    pthread_mutex_unlock(&in->mu);
    inference__serve(in, j);
    pthread_mutex_lock(&in->mu);
    inference__unlink(&in->active, j);
    inference__job_free(j);
  }
  pthread_mutex_unlock(&in->mu);
  return NULL;
}

/* AbortCommand.request_id: drops the request if it still waits, or makes its
 * generation stop and send nothing. */
static void inference__abort_request(agent__inference *in, uint64_t request_id, const char *why) {
  const char *state = "finished or unknown";
  inference__job *drop = NULL;
  pthread_mutex_lock(&in->mu);
  for (inference__job *j = in->head, *prev = NULL; j; prev = j, j = j->next) {
    if (j->rq.request_id != request_id) continue;
    if (prev) prev->next = j->next;
    else in->head = j->next;
    if (in->tail == j) in->tail = prev;
    drop = j;
    state = "queued";
    break;
  }
  for (inference__job *j = in->active; !drop && j; j = j->next) {
    if (j->rq.request_id != request_id) continue;
    j->aborted = 1;
    state = "generating";
    break;
  }
  pthread_mutex_unlock(&in->mu);
  inference__job_free(drop);
  agent_log_debug("request_aborted", "request_id=%llu state=\"%s\" reason=\"%s\"",
                  (unsigned long long)request_id, state, why ? why : "");
}

static void inference__stats(Rlorch__V1__WorkerStats *s, void *ud) {
  agent__inference *in = ud;
  s->requests_active = atomic_load(&in->requests_active);
  s->rollouts_generated = atomic_load(&in->rollouts_generated);
  s->tokens_generated = atomic_load(&in->tokens_generated);
  s->generate_seconds = (double)atomic_load(&in->generate_ns) * 1e-9;
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
 * orchestrator forgets them with the worker's stream). */
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
    inference__job_free(j);
  }
  in->tail = NULL;
}

/* Queues a request for the pool; -1 (fatal) only when out of memory. */
static int inference__rollout(agent__inference *in, const Rlorch__V1__RolloutRequest *r) {
  inference__job *j = calloc(1, sizeof *j);
  /* A deep copy through the wire format: the job owns all it points to. */
  size_t n = rlorch__v1__rollout_request__get_packed_size(r);
  uint8_t *buf = malloc(n ? n : 1);
  if (j && buf) {
    rlorch__v1__rollout_request__pack(r, buf);
    j->msg = rlorch__v1__rollout_request__unpack(NULL, n, buf);
  }
  free(buf);
  if (!j || !j->msg) {
    inference__job_free(j);
    agent_log_error("fatal", "reason=\"no memory to queue request %llu\"",
                    (unsigned long long)r->request_id);
    return -1;
  }
  agent_pb_request(j->msg, &j->rq);
  j->registration = agent_registration(in->a);
  pthread_mutex_lock(&in->mu);
  if (in->tail) in->tail->next = j;
  else in->head = j;
  in->tail = j;
  pthread_cond_signal(&in->cond);
  pthread_mutex_unlock(&in->mu);
  return 0;
}

/* An abort about a request, a plan, or (neither named) the plan pending. */
static void inference__abort(agent__inference *in, const Rlorch__V1__Command *cmd) {
  const Rlorch__V1__AbortCommand *ab = cmd->abort;
  if (!ab) return;
  if (ab->request_id) inference__abort_request(in, ab->request_id, ab->reason);
  /* Not for a request only: an abort without a plan id drops whatever plan
   * is pending. */
  if ((ab->plan_id && ab->plan_id[0]) || !ab->request_id) agent_xfer_on_abort(&in->xfer, cmd);
}

static int inference__command(agent *a, const Rlorch__V1__Command *cmd, void *ud) {
  agent__inference *in = ud;
  /* A new run's count of versions starts at 0: the agent core has seen to it. */
  switch (cmd->kind_case) {
  case RLORCH__V1__COMMAND__KIND_ROLLOUT: return inference__rollout(in, cmd->rollout);
  case RLORCH__V1__COMMAND__KIND_PLAN: agent_xfer_on_plan(&in->xfer, a, cmd); return 0;
  case RLORCH__V1__COMMAND__KIND_TRIGGER: agent_xfer_on_trigger(&in->xfer, a, cmd); return 0;
  case RLORCH__V1__COMMAND__KIND_ABORT: inference__abort(in, cmd); return 0;
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
  pthread_rwlockattr_t ra;
  pthread_rwlockattr_init(&ra);
  /* A broadcast must not wait behind a stream of new groups. */
  pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&in.wlock, &ra);
  pthread_rwlockattr_destroy(&ra);
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
  bcast_caps_select_device(&in.caps, in.device);
  agent_log_devices(&in.caps, in.device);
  uint64_t seed = in.o.seed_set ? in.o.seed : (uint64_t)getpid() * 0x9E3779B97F4A7C15ull;
  agent_rollout_gen_init(&in.gen, &in.o.rollout, seed, in.o.reward, in.o.reward_ud);
  int status = 1;
  agent *a = NULL;
  agent_xfer_init(&in.xfer, 0, in.device, NULL, inference__bind, inference__done, &in, err,
                  sizeof err);
  in.xfer.begin = inference__begin;
  rlorch__v1__register_request__init(&in.reg);
  agent_caps_to_pb(&in.caps, in.device, &in.caps_pb);
  in.caps_pb.max_concurrent_requests = in.o.concurrency;
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
  agent_set_stats_fn(a, inference__stats, &in);
  agent_log_info("inference_ready", "distribution=%s tokens_mean=%g tokens_std=%g latency_ms_mean=%g "
           "latency_ms_std=%g vocab_size=%u reward=%s concurrency=%u device=%d buffers=%s",
           in.o.rollout.dist == AGENT_DIST_NORMAL ? "normal" : "lognormal",
           in.o.rollout.tokens_mean, in.o.rollout.tokens_std, in.o.rollout.latency_ms_mean,
           in.o.rollout.latency_ms_std, in.o.rollout.vocab_size, in.o.reward ? "hook" : "builtin",
           in.o.concurrency, in.device, in.o.double_buffer ? "double" : "single");
  status = agent_run(a);
out:
  /* Before agent_free: the generator threads report through the agent. */
  inference__pool_stop(&in);
  agent_free(a);
  agent_xfer_free(&in.xfer);
  inference__free_buffers(&in);
  pthread_cond_destroy(&in.cond);
  pthread_mutex_destroy(&in.mu);
  pthread_rwlock_destroy(&in.wlock);
  agent_log_info("exit", "status=%d", status);
  return status;
}
