/* `rlorch inference`: synthetic generation with the policy version held, the
 * receiving side of the broadcast. A program on the public API (rlorch.h),
 * as any embedded engine is: the library registers, streams commands, sends
 * heartbeats (its figures count the requests reported), executes every
 * broadcast into the buffers this agent places (on_bind) and reports what it
 * is given; the agent generates.
 *
 * Rollout requests are served by a pool of generator threads, as an engine
 * batches many sequences: the main thread only queues each request that
 * rlorch_next hands it, so up to `concurrency` are generated at once, and a
 * broadcast (the library's command thread) is not held up by them. The
 * orchestrator bounds how many are in flight (max_requests_per_worker, and at
 * most the pool's size, which the library announces from
 * max_concurrent_requests); requests beyond the pool wait in its queue.
 *
 * A request is one group: `count` completions of its prompt (agent_rollout.h),
 * each completion's latency slept in turn, then scored by the reward hook and
 * reported in one rlorch_report_rollouts. What is not sent:
 * - a request aborted (RLORCH_CMD_ABORT) while queued is dropped; one aborted
 *   while generating stops at once and sends nothing (the orchestrator would
 *   ignore it). Aborts come in command order, so one behind a broadcast waits
 *   for it;
 * - a request whose reward hook fails, or that finds no memory, is answered
 *   with no rollout at all (rlorch_report_error), the reason logged as an
 *   error: that frees the orchestrator's slot, so the request does not stay
 *   in flight, and no group goes out with made-up rewards;
 * - a request received before the worker registered again (the orchestrator
 *   restarted or forgot it): the library refuses its report, and the answer
 *   is dropped (stale_answer_dropped).
 *
 * Versions are transactional: a group is generated from one whole version and
 * labelled with it. The version served is the agent's own, changed under the
 * weights lock together with the buffers it names. With one set of buffers
 * (the default) a broadcast takes that lock for writing (on_broadcast_before
 * to on_broadcast_after), so it waits for the groups being generated and
 * generation waits for it; a broadcast that fails leaves the buffers torn
 * (part new, part old), and until one succeeds every request is answered
 * with no rollout. With --double-buffer the library writes the other set
 * while generation goes on from the current one, and the lock is taken only
 * to swap them; a failed broadcast leaves the current version as it was. */
#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rlorch/rlorch.h"
#include "workers/agent/agent.h"
#include "workers/agent/agent_core.h" /* agent_block_signals, agent_pick_device, agent_log_devices */
#include "workers/agent/agent_log.h"
#include "workers/agent/agent_pb.h" /* AGENT_PB_SHAPED_TOKENS_MAX */
#include "workers/agent/agent_rollout.h"
#include "workers/bcast/bcast_preset.h"

#ifdef RLORCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* One set of receive buffers, in wire dtype, shaped like a plan's tensors. */
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
  rlorch_worker *w;
  /* Receive buffers, from the first plan: `cur` holds the version served;
   * with double buffering `next` is the one a broadcast writes. `retired`: a
   * set replaced by a new layout, freed after the next successful broadcast:
   * a colocated sender keeps its mapping of it until it imports the new
   * export, and CUDA IPC memory must outlive the mappings of it. Touched on
   * the library's command thread only (the callbacks), then at exit. */
  inference__set cur, next, retired;
  /* Read-held by a generator from the version it reads to its group's last
   * completion; write-held by a broadcast into `cur` (one set) or by the swap
   * (two), writers first. Guards `torn` and `version`, and with two sets
   * which set is `cur`. */
  pthread_rwlock_t wlock;
  int torn;         /* one set: the last broadcast into it failed part-way */
  int writing;      /* one set: the command thread write-holds wlock for a broadcast */
  uint64_t version; /* the version `cur` holds */
  /* The generator pool. */
  pthread_mutex_t mu;   /* guards the queue, the active list, quit and the jobs' aborted flags */
  pthread_cond_t cond;  /* queue grew, or quit */
  pthread_cond_t wake;  /* a job aborted, or quit: a latency being slept ends (CLOCK_MONOTONIC) */
  struct inference__job *head, *tail; /* queued, not started */
  struct inference__job *active;      /* being generated */
  int quit;
  pthread_t *tids;
  size_t nthreads;
  agent_signals sig; /* SIGINT/SIGTERM stop the worker */
  /* --tp-size: the model's tensors (for their names) and this rank's parts
   * of them, registered; the buffers hold these parts only. */
  bcast_tensor *model;
  size_t nmodel;
  rlorch_part *parts;
  size_t nparts;
} agent__inference;

typedef struct inference__job {
  rlorch_command *cmd; /* kind GENERATE, owned until reported or dropped */
  agent_request rq;    /* points into cmd */
  int aborted;
  struct inference__job *next;
} inference__job;

static void inference__job_free(inference__job *j) {
  if (!j) return;
  rlorch_command_free(j->cmd);
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

/* NULL when the set holds tensors laid out as the plan's, else why not. */
static const char *inference__layout_differs(const inference__set *b, const rlorch_tensor *t,
                                             size_t n, char *why, size_t len) {
  if (b->n != n) return snprintf(why, len, "%zu tensors, the plan %zu", b->n, n), why;
  for (size_t i = 0; i < n; i++) {
    const bcast_tensor *h = &b->t[i];
    if (strcmp(h->name, t[i].name) != 0 || h->layer != t[i].layer ||
        (int)h->wire_dtype != (int)t[i].wire_dtype || h->ndim != t[i].ndim ||
        memcmp(h->shape, t[i].shape, t[i].ndim * sizeof *t[i].shape) != 0)
      return snprintf(why, len, "tensor %zu: '%s' held, the plan's '%s' differs", i, h->name,
                      t[i].name), why;
  }
  return NULL;
}

/* The part of tensor `name` this rank holds; NULL: whole. */
static const rlorch_part *inference__part(const agent__inference *in, const char *name) {
  for (size_t i = 0; i < in->nparts; i++)
    if (!strcmp(in->parts[i].name, name)) return &in->parts[i];
  return NULL;
}

/* --tp-size T: rank K's slice of every 2-D tensor of the preset, the 2-D
 * tensors along dim 0 and dim 1 in turn (column- then row-parallel layers),
 * slice k of an axis of len indices [k*(len/T) + min(k, len%T), ...) of
 * len/T indices, one more for the first len%T ranks; 1-D tensors whole.
 * An axis shorter than T would leave some rank nothing: refused. */
static int inference__tp_parts(agent__inference *in, char *msg, size_t len) {
  const agent_opts *o = &in->o;
  if (o->tp_size <= 1) return 0;
  bcast_preset_opts po = {.storage_dtype = BCAST_DTYPE_FP32, .wire_dtype = BCAST_DTYPE_BF16,
                          .max_layers = o->max_layers};
  bcast_err be = {0};
  if (bcast_preset_manifest(o->preset, &po, &in->model, &in->nmodel, &be))
    return snprintf(msg, len, "--preset %s: %s", o->preset, be.msg), -1;
  if (!(in->parts = calloc(in->nmodel ? in->nmodel : 1, sizeof *in->parts)))
    return snprintf(msg, len, "--tp-size: no memory"), -1;
  uint64_t held = 0, total = 0;
  size_t k2 = 0; /* 2-D tensors seen */
  for (size_t i = 0; i < in->nmodel; i++) {
    const bcast_tensor *t = &in->model[i];
    uint64_t e = bcast_tensor_elems(t);
    total += e;
    if (t->ndim != 2) {
      held += e;
      continue;
    }
    uint32_t dim = (uint32_t)(k2++ % 2);
    uint64_t n = t->shape[dim], base = n / o->tp_size, extra = n % o->tp_size, r = o->tp_rank;
    if (base == 0)
      return snprintf(msg, len, "--tp-size %u: tensor '%s' has %llu indices along dim %u, fewer "
                      "than the ranks", o->tp_size, t->name, (unsigned long long)n, dim), -1;
    rlorch_part *pt = &in->parts[in->nparts++];
    *pt = (rlorch_part){.name = t->name, .kind = RLORCH_PART_SLICE, .dim = dim,
                        .start = r * base + (r < extra ? r : extra), .count = base + (r < extra)};
    held += e / n * pt->count;
  }
  agent_log_info("tp_parts", "tp_rank=%u tp_size=%u preset=%s tensors=%zu sliced=%zu "
                 "elements_held=%llu elements_total=%llu", o->tp_rank, o->tp_size, o->preset,
                 in->nmodel, in->nparts, (unsigned long long)held, (unsigned long long)total);
  return 0;
}

/* Allocates buffers shaped like the plan's tensors into b (GPU memory with a
 * device, host memory otherwise), each the size of the part held of it. */
static int inference__set_alloc(agent__inference *in, const rlorch_tensor *t, size_t n,
                                inference__set *b, char *msg, size_t len) {
  b->t = calloc(n ? n : 1, sizeof *b->t);
  if (!b->t) return snprintf(msg, len, "receive buffers: no memory"), -1;
  b->n = n;
  for (size_t i = 0; i < n; i++) {
    bcast_tensor *h = &b->t[i];
    snprintf(h->name, sizeof h->name, "%s", t[i].name);
    h->layer = t[i].layer;
    h->storage_dtype = h->wire_dtype = (bcast_dtype)t[i].wire_dtype;
    h->ndim = t[i].ndim;
    memcpy(h->shape, t[i].shape, t[i].ndim * sizeof *t[i].shape);
    h->residency = in->device >= 0 ? BCAST_RES_GPU : BCAST_RES_HOST_PAGEABLE;
    h->device = in->device;
    /* Allocated in the part's shape; the full shape is put back below. */
    const rlorch_part *pt = inference__part(in, h->name);
    if (pt && pt->kind == RLORCH_PART_SLICE) {
      h->part = (bcast_part){.kind = BCAST_PART_SLICE, .dim = pt->dim, .start = pt->start,
                             .count = pt->count};
      h->shape[pt->dim] = pt->count;
    }
  }
  bcast_err err = {0};
  int rc = bcast_storage_alloc(b->t, b->n, BCAST_FILL_RECEIVER, 0, &b->storage, &err);
  for (size_t i = 0; i < n; i++) b->t[i].shape[b->t[i].part.dim] = t[i].shape[b->t[i].part.dim];
  if (rc) {
    snprintf(msg, len, "receive buffers: %s", err.msg);
    inference__set_free(b);
    return -1;
  }
  agent_log_info("receive_buffers", "tensors=%zu bytes=%llu where=%s set=%s", b->n,
                 (unsigned long long)bcast_storage_bytes(b->storage),
                 in->device >= 0 ? "gpu" : "host", b == &in->next ? "next" : "current");
  return 0;
}

/* options.on_bind: the set the broadcast writes (the other one with double
 * buffering), made or remade to the plan's layout; the one it replaces is
 * retired (the previous retired one goes now). */
static int inference__bind(void *ud, uint64_t version, rlorch_tensor *t, size_t n, char *msg,
                           size_t len) {
  agent__inference *in = ud;
  (void)version;
  inference__set *b = in->o.double_buffer ? &in->next : &in->cur;
  char why[256];
  const char *differs = b->t ? inference__layout_differs(b, t, n, why, sizeof why) : "none yet";
  if (differs) {
    if (b->t) {
      agent_log_info("receive_buffers_realloc", "reason=\"%s\"", differs);
      inference__set_free(&in->retired);
      in->retired = *b;
      memset(b, 0, sizeof *b);
    }
    if (inference__set_alloc(in, t, n, b, msg, len)) return -1;
  }
  for (size_t i = 0; i < n; i++) {
    t[i].residency = (rlorch_residency)b->t[i].residency;
    t[i].device = b->t[i].device;
    t[i].data = b->t[i].data;
  }
  return 0;
}

/* One set: the broadcast is about to write the version served, so it waits
 * for the groups being generated from it, and new ones wait for it. */
static void inference__before(void *ud, uint64_t version) {
  agent__inference *in = ud;
  (void)version;
  if (in->o.double_buffer) return;
  pthread_rwlock_wrlock(&in->wlock);
  in->writing = 1;
}

/* After a broadcast (the library checked the weights received): on success
 * they are served at its version; on failure one set is torn, two keep the
 * current one. */
static void inference__after(void *ud, int ok, uint64_t version) {
  agent__inference *in = ud;
  char plan[128]; /* the orchestrator's id, for the events */
  rlorch_broadcast_id(in->w, plan, sizeof plan);
  if (in->o.double_buffer) {
    if (ok) {
      pthread_rwlock_wrlock(&in->wlock);
      inference__set t = in->cur;
      in->cur = in->next;
      in->next = t;
      in->version = version;
      pthread_rwlock_unlock(&in->wlock);
    }
  } else if (in->writing) {
    int was = in->torn, torn = !ok;
    in->torn = torn;
    if (ok) in->version = version;
    uint64_t held = in->version;
    in->writing = 0;
    pthread_rwlock_unlock(&in->wlock);
    if (torn && !was)
      agent_log_warn("weights_torn", "plan_id=%s version_held=%llu action=\"serve no rollout until "
                     "a broadcast succeeds\"", plan, (unsigned long long)held);
  }
  if (ok) {
    inference__set_free(&in->retired); /* every sender mapping of it is closed by now */
    agent_log_info("policy_version", "version=%llu", (unsigned long long)version);
  } else if (in->o.double_buffer) {
    pthread_rwlock_rdlock(&in->wlock);
    uint64_t held = in->version;
    pthread_rwlock_unlock(&in->wlock);
    agent_log_info("weights_kept", "plan_id=%s version=%llu", plan, (unsigned long long)held);
  }
}

/* ---- serving a request ------------------------------------------------------ */

/* The version to label a group with; wlock read-held. The agent's own, but
 * never above the library's: a command of a new run starts the library's
 * count at 0 again (the weights held are that run's starting point), which
 * the agent hears of only with the run's first broadcast. */
static uint64_t inference__served(const agent__inference *in) {
  uint64_t lib = rlorch_policy_version(in->w);
  return in->version < lib ? in->version : lib;
}

static int inference__stopping(agent__inference *in) {
  pthread_mutex_lock(&in->mu);
  int q = in->quit;
  pthread_mutex_unlock(&in->mu);
  return q;
}

static int inference__aborted(agent__inference *in, const inference__job *j) {
  pthread_mutex_lock(&in->mu);
  int a = j->aborted;
  pthread_mutex_unlock(&in->mu);
  return a;
}

/* Sleeps `s` seconds, ending early when the job is aborted or the pool quits. */
static void inference__sleep(agent__inference *in, const inference__job *j, double s) {
  if (!(s > 0)) return;
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  double ns = (double)until.tv_nsec + (s - floor(s)) * 1e9;
  until.tv_sec += (time_t)s + (time_t)(ns / 1e9);
  until.tv_nsec = (long)fmod(ns, 1e9);
  pthread_mutex_lock(&in->mu);
  while (!in->quit && !j->aborted &&
         pthread_cond_timedwait(&in->wake, &in->mu, &until) == 0) {
  }
  pthread_mutex_unlock(&in->mu);
}

/* What a refused report means here. RLORCH_E_STOPPED while the worker runs:
 * the request came before it registered again (the orchestrator restarted or
 * forgot it), so the request is gone there and its id may name another one;
 * the answer is dropped. */
static void inference__report_failed(agent__inference *in, const inference__job *j, size_t count,
                                     rlorch_status rc, const rlorch_error *err) {
  if (rc == RLORCH_E_STOPPED && rlorch_stop_status(in->w, NULL) == RLORCH_E_STATE) {
    agent_log_info("stale_answer_dropped", "request_id=%llu count=%zu reason=\"the request came "
                   "before the worker registered again\"", (unsigned long long)j->rq.request_id,
                   count);
  } else if (rc != RLORCH_E_STOPPED) { /* stopping: nothing more is sent */
    /* The library logged the refusal itself (report_refused). */
    agent_log_warn("answer_not_delivered", "request_id=%llu code=%s reason=\"%s\"",
                   (unsigned long long)j->rq.request_id, rlorch_status_name(rc), err->message);
  }
}

/* Answers with no rollout at all: it frees the orchestrator's slot. The
 * library logs the answer (rollouts_failed, with `why`). */
static void inference__send_none(agent__inference *in, const inference__job *j, const char *why) {
  rlorch_error err;
  rlorch_status rc = rlorch_report_error(in->w, j->cmd, why, &err);
  if (rc) inference__report_failed(in, j, 0, rc, &err);
}

/* Reports the scored group g, generated from `version`. */
static void inference__send(agent__inference *in, const inference__job *j, const agent_group *g,
                            uint64_t version, uint64_t tokens) {
  rlorch_rollout *r = calloc(g->n ? g->n : 1, sizeof *r);
  if (!r) {
    inference__send_none(in, j, "no memory for the report");
    return;
  }
  for (uint32_t i = 0; i < g->n; i++) {
    const agent_completion *c = &g->c[i];
    /* A very long synthetic completion goes as its length only, so that its
     * report stays within the orchestrator's max_rollout_bytes. */
    int shaped = c->ntokens > AGENT_PB_SHAPED_TOKENS_MAX;
    r[i] = (rlorch_rollout){.token_ids = shaped ? NULL : c->token_ids, .n_tokens = c->ntokens,
                            .logprobs = shaped ? NULL : c->logprobs, .rewards = c->rewards,
                            .n_rewards = c->nrewards,
                            .finish_reason = (rlorch_finish)c->finish, .seconds = c->seconds};
  }
  agent_log_debug("rollouts", "request_id=%llu count=%u tokens=%llu version=%llu",
                  (unsigned long long)j->rq.request_id, g->n, (unsigned long long)tokens,
                  (unsigned long long)version);
  rlorch_error err;
  rlorch_status rc = rlorch_report_rollouts(in->w, j->cmd, version, r, g->n, &err);
  free(r);
  if (rc == RLORCH_E_INVALID) {
    /* Not the orchestrator's doing (the version, say, after a new run began):
     * still an answer, so that the request does not stay in flight. The
     * library logs it as rollouts_failed with this reason. */
    inference__send_none(in, j, err.message);
  } else if (rc) {
    inference__report_failed(in, j, g->n, rc, &err);
  }
}

/* Generates, sleeps, scores and reports one request (the header says what is
 * not sent); on a generator thread. */
static void inference__serve(agent__inference *in, inference__job *j) {
  const agent_request *rq = &j->rq;
  pthread_rwlock_rdlock(&in->wlock);
  /* The version held when generation starts: never older than the one the
   * orchestrator counted the request at. */
  uint64_t version = inference__served(in);
  char err[1024];
  agent_group g;
  if (in->torn) {
    pthread_rwlock_unlock(&in->wlock);
    agent_log_warn("rollouts_refused", "request_id=%llu group_id=%llu reason=\"the weights are torn "
                   "by a failed broadcast\" action=\"answer with no rollout\"",
                   (unsigned long long)rq->request_id, (unsigned long long)rq->group_id);
    inference__send_none(in, j, "the weights are torn by a failed broadcast");
    return;
  }
  /* Rollout ids are the library's: the generator's rank is left 0. */
  if (agent_group_generate(&in->gen, rq, 0, version, &g, err, sizeof err)) {
    pthread_rwlock_unlock(&in->wlock);
    inference__send_none(in, j, err);
    return;
  }
  uint32_t made = 0;
  uint64_t tokens = 0;
  int aborted = 0;
  for (; made < g.n && !inference__stopping(in) && !(aborted = inference__aborted(in, j)); made++) {
    double t = agent_now();
    inference__sleep(in, j, g.c[made].latency_s);
    g.c[made].seconds = agent_now() - t;
    tokens += g.c[made].ntokens;
  }
  if (!aborted) aborted = inference__aborted(in, j); /* during the last sleep */
  agent_log_debug("group_generated", "request_id=%llu version=%llu made=%u of=%u",
                  (unsigned long long)rq->request_id, (unsigned long long)version, made, g.n);
  /* Scored outside the lock: the group is made, and its report may wait. */
  pthread_rwlock_unlock(&in->wlock);
  if (inference__stopping(in)) {
    /* Leaving: the report would be dropped anyway. */
  } else if (aborted) {
    agent_log_debug("request_aborted", "request_id=%llu state=generating made=%u of=%u action=\"send "
                    "nothing\"", (unsigned long long)rq->request_id, made, g.n);
  } else if (agent_group_reward(&in->gen, rq, &g, err, sizeof err)) {
    agent_log_error("reward_failed", "request_id=%llu group_id=%llu reason=\"%s\" action=\"answer "
                    "with no rollout\"", (unsigned long long)rq->request_id,
                    (unsigned long long)rq->group_id, err);
    inference__send_none(in, j, err);
  } else {
    inference__send(in, j, &g, version, tokens);
  }
  agent_group_free(&g);
}

/* ---- the pool ------------------------------------------------------------------- */

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

/* RLORCH_CMD_ABORT: drops the request if it still waits, or makes its
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
    pthread_cond_broadcast(&in->wake);
    state = "generating";
    break;
  }
  pthread_mutex_unlock(&in->mu);
  inference__job_free(drop);
  agent_log_debug("request_aborted", "request_id=%llu state=\"%s\" reason=\"%s\"",
                  (unsigned long long)request_id, state, why ? why : "");
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
  pthread_cond_broadcast(&in->wake);
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

/* Queues a GENERATE command for the pool, which owns it from here. */
static void inference__queue(agent__inference *in, rlorch_command *cmd) {
  inference__job *j = calloc(1, sizeof *j);
  if (!j) {
    /* Answered rather than lost: the orchestrator would wait on it. */
    inference__job tmp = {.cmd = cmd, .rq = {.request_id = cmd->generate.request_id}};
    inference__send_none(in, &tmp, "no memory to queue the request"); /* logged as rollouts_failed */
    rlorch_command_free(cmd);
    return;
  }
  const rlorch_generate *g = &cmd->generate;
  j->cmd = cmd;
  j->rq.request_id = g->request_id;
  j->rq.group_id = g->group_id;
  j->rq.count = g->count;
  j->rq.prompt_token_ids = g->prompt_token_ids;
  j->rq.n_prompt = g->n_prompt_token_ids;
  j->rq.prompt_metadata = g->prompt_metadata;
  j->rq.n_metadata = g->n_prompt_metadata;
  j->rq.sampling.temperature = g->sampling.temperature;
  j->rq.sampling.max_tokens = g->sampling.max_tokens;
  j->rq.sampling.stop_token_ids = g->sampling.stop_token_ids;
  j->rq.sampling.nstop = g->sampling.n_stop_token_ids;
  j->rq.sampling.seed = g->sampling.seed;
  pthread_mutex_lock(&in->mu);
  if (in->tail) in->tail->next = j;
  else in->head = j;
  in->tail = j;
  pthread_cond_signal(&in->cond);
  pthread_mutex_unlock(&in->mu);
}

/* ---- signals, the command loop ------------------------------------------------- */

/* SIGINT or SIGTERM stops the worker, also while it waits for its first
 * registration; the library's own threads take neither. */
static void inference__on_signal(void *w) { rlorch_stop(w); }

/* Pulls commands until the worker stops; 0, or 1 when it could not go on. */
static int inference__loop(agent__inference *in) {
  for (;;) {
    rlorch_command *cmd = NULL;
    rlorch_error err;
    rlorch_status rc = rlorch_next(in->w, -1, &cmd, &err);
    if (rc == RLORCH_E_STOPPED) return 0;
    if (rc == RLORCH_TIMEOUT) continue;
    if (rc) {
      agent_log_error("fatal", "reason=\"%s\"", err.message);
      return 1;
    }
    switch (cmd->kind) {
    case RLORCH_CMD_GENERATE: inference__queue(in, cmd); continue;
    case RLORCH_CMD_ABORT:
      inference__abort_request(in, cmd->abort.request_id, cmd->abort.reason);
      break;
    case RLORCH_CMD_SHUTDOWN: /* the library logged it; the worker stops */
      rlorch_command_free(cmd);
      return 0;
    default:
      agent_log_warn("command_ignored", "kind=%d reason=\"not an inference worker's\"", (int)cmd->kind);
      break;
    }
    rlorch_command_free(cmd);
  }
}

/* The worker's options from the agent's settings. */
static void inference__options(agent__inference *in, rlorch_options *ro) {
  rlorch_options_init(ro, sizeof *ro, RLORCH_ROLE_INFERENCE);
  const agent_opts *o = &in->o;
  ro->orchestrator = o->orchestrator;
  ro->name = o->name;
  if (o->token) ro->token = o->token;
  else ro->token_file = o->token_file;
  ro->tls_ca_file = o->tls_ca_file;
  ro->tls_cert_file = o->tls_client_cert_file;
  ro->tls_key_file = o->tls_client_key_file;
  ro->device = in->device;
  ro->max_concurrent_requests = o->concurrency;
  ro->data_listen = o->data_listen; /* NULL: this worker relays to no one */
  ro->node = o->node;
  ro->nics = o->nics;
  ro->nic_gbits = o->nic_gbits;
  ro->connect_timeout_s = INFINITY; /* registration is retried without a limit */
  ro->parts = in->parts;
  ro->nparts = in->nparts;
  ro->on_bind = inference__bind;
  ro->bind_ud = in;
  ro->on_broadcast_before = inference__before;
  ro->on_broadcast_after = inference__after;
  ro->broadcast_ud = in;
  /* ro->log stays NULL: the library logs through the process's agent_log. */
}

int agent_inference_run(const agent_opts *o) {
  agent__inference in;
  memset(&in, 0, sizeof in);
  in.o = *o;
  pthread_mutex_init(&in.mu, NULL);
  pthread_cond_init(&in.cond, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&in.wake, &ca);
  pthread_condattr_destroy(&ca);
  pthread_rwlockattr_t ra;
  pthread_rwlockattr_init(&ra);
  /* A broadcast must not wait behind a stream of new groups. */
  pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&in.wlock, &ra);
  pthread_rwlockattr_destroy(&ra);
  /* First, before any thread exists: every later one inherits the mask, and
   * the signal thread alone takes SIGINT and SIGTERM. */
  agent_block_signals();
  char msg[1024];
  int status = 1;
  bcast_caps_probe(&in.caps);
  if (agent_pick_device(&in.o, &in.caps, &in.device, msg, sizeof msg)) {
    agent_log_error("fatal", "reason=\"%s\"", msg);
    goto out;
  }
#ifdef RLORCH_HAVE_CUDA
  if (in.device >= 0) cudaSetDevice(in.device);
#endif
  bcast_caps_select_device(&in.caps, in.device);
  agent_log_devices(&in.caps, in.device);
  uint64_t seed = in.o.seed_set ? in.o.seed : (uint64_t)getpid() * 0x9E3779B97F4A7C15ull;
  agent_rollout_gen_init(&in.gen, &in.o.rollout, seed, in.o.reward, in.o.reward_ud);
  if (inference__tp_parts(&in, msg, sizeof msg)) {
    agent_log_error("fatal", "reason=\"%s\"", msg);
    goto out;
  }
  rlorch_options ro;
  inference__options(&in, &ro);
  rlorch_error err;
  if (rlorch_create(&ro, &in.w, &err)) {
    agent_log_error("fatal", "reason=\"%s\"", err.message);
    goto out;
  }
  int rc = agent_signals_start(&in.sig, inference__on_signal, in.w);
  if (rc) {
    agent_log_error("fatal", "reason=\"signal thread: %s\"", strerror(rc));
    goto out;
  }
  if (inference__pool_start(&in, in.o.concurrency, msg, sizeof msg)) {
    agent_log_error("fatal", "reason=\"%s\"", msg);
    goto out;
  }
  agent_log_info("inference_ready", "distribution=%s tokens_mean=%g tokens_std=%g latency_ms_mean=%g "
           "latency_ms_std=%g vocab_size=%u reward=%s concurrency=%u device=%d buffers=%s",
           in.o.rollout.dist == AGENT_DIST_NORMAL ? "normal" : "lognormal",
           in.o.rollout.tokens_mean, in.o.rollout.tokens_std, in.o.rollout.latency_ms_mean,
           in.o.rollout.latency_ms_std, in.o.rollout.vocab_size, in.o.reward ? "hook" : "builtin",
           in.o.concurrency, in.device, in.o.double_buffer ? "double" : "single");
  rlorch_status st = rlorch_start(in.w, &err);
  if (st == RLORCH_E_STOPPED) {
    status = 0; /* a signal before it registered, or a failure: rlorch_stop_status says which */
  } else if (st) {
    /* A refusal was logged as register_refused already. */
    if (st != RLORCH_E_REFUSED) agent_log_error("fatal", "reason=\"%s\"", err.message);
  } else {
    status = inference__loop(&in);
  }
out:
  /* The generator threads report through the worker: they end before it. */
  if (in.w) rlorch_stop(in.w);
  inference__pool_stop(&in);
  /* A failure of the library's own (logged where it happened) exits 1 too. */
  if (in.w && status == 0 && rlorch_stop_status(in.w, NULL) != RLORCH_OK) status = 1;
  agent_signals_stop(&in.sig);
  rlorch_free(in.w);
  inference__free_buffers(&in);
  free(in.parts);
  free(in.model);
  pthread_cond_destroy(&in.wake);
  pthread_cond_destroy(&in.cond);
  pthread_mutex_destroy(&in.mu);
  pthread_rwlock_destroy(&in.wlock);
  agent_log_info("exit", "status=%d", status);
  return status;
}
