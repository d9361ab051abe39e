/* The worker protocol: register, attach, heartbeat, command queue, signals. */
#include "workers/agent/agent_core.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "workers/agent/agent_log.h"
#include "rpc/rpc.h"

#define AGENT__M_REGISTER "/rlorch.v1.Worker/Register"
#define AGENT__M_ATTACH "/rlorch.v1.Worker/Attach"
#define AGENT__M_REPORT "/rlorch.v1.Worker/Report"
#define AGENT__M_REPORT_STREAM "/rlorch.v1.Worker/ReportStream"
#define AGENT__M_FETCH_BATCH "/rlorch.v1.Worker/FetchBatch"
#define AGENT__CALL_TIMEOUT_S 10.0
#define AGENT__BACKOFF_MIN_S 0.1
#define AGENT__BACKOFF_MAX_S 5.0
/* While the orchestrator is unreachable the command stream's retry waits for
 * the channel to connect, at most this long a try (the agent's stop is
 * noticed between tries): a restarted orchestrator is found, the worker
 * forgotten and registered again as soon as it listens, not after a backoff
 * grown to seconds. */
#define AGENT__ATTACH_WAIT_MAX_S 1.0
#define AGENT__REPORT_GIVE_UP_S 120.0

typedef enum { AGENT__CONN_UNKNOWN = 0, AGENT__CONN_UP, AGENT__CONN_DOWN } agent__conn;

typedef struct agent__item {
  Rlorch__V1__Command *cmd;
  struct agent__item *next;
} agent__item;

struct agent {
  agent_opts opts;
  Rlorch__V1__RegisterRequest *reg;
  char name[256];
  char token[AGENT_TOKEN_MAX];
  agent_command_fn fn;
  void *ud;
  agent_abort_fn abort_fn; /* set before the threads start, read-only after */
  void *abort_ud;
  agent_stats_fn stats_fn; /* likewise */
  void *stats_ud;
  rpc_client *rpc;

  pthread_mutex_t mu; /* guards everything below, and the queue */
  pthread_cond_t cond; /* queue grew, registration changed, or stop */
  char worker_id[128];
  uint32_t rank;
  uint32_t hb_ms;
  uint64_t gen;        /* bumped by every successful registration */
  uint64_t attach_gen; /* the registration the attach thread's stream is under */
  char run_id[64];     /* run of the last command executed: policy_version counts its steps */
  int reg_hold;        /* agent_hold_registration */
  agent__conn conn;
  agent__item *head, *tail;
  size_t queued;

  pthread_mutex_t reg_mu; /* one registration at a time; guards reg_run */
  char reg_run[64];       /* the run id the RegisterRequest points to */
  atomic_int stop;
  atomic_uint_fast64_t policy_version;
  int refused; /* registration refused for good: exit 1 */
  rpc_status refusal; /* what the refusal said */

  pthread_t attach_tid, hb_tid;
  int attach_started, hb_started;

  /* Reports that need no answer go on a one-way stream (ReportStream). The
   * orchestrator's next command confirms all but the last one sent (a
   * trigger follows every ack, a plan every broadcast's end), so only that
   * one is kept: sent again through Report if the stream breaks. */
  rpc_oneway *reports;
  atomic_uint_fast64_t oneway_off_gen; /* registration whose orchestrator lacks the stream */
  pthread_mutex_t last_mu;             /* guards last* */
  uint8_t *last;                       /* packed ReportRequest; NULL: none kept */
  size_t last_len;
  uint64_t last_seq, last_gen;
  uint64_t refused_seq; /* refused before its sender could keep it */
};

/* ---- small helpers ------------------------------------------------------- */

double agent_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int agent_stopping(const agent *a) { return atomic_load(&a->stop); }
uint64_t agent_policy_version(const agent *a) { return atomic_load(&a->policy_version); }
void agent_set_policy_version(agent *a, uint64_t v) { atomic_store(&a->policy_version, v); }

void agent_hold_registration(agent *a, int hold) {
  pthread_mutex_lock(&a->mu);
  a->reg_hold = hold;
  pthread_cond_broadcast(&a->cond);
  pthread_mutex_unlock(&a->mu);
}

void agent_held_run(agent *a, char *run, size_t len) {
  pthread_mutex_lock(&a->mu);
  snprintf(run, len, "%s", a->run_id);
  pthread_mutex_unlock(&a->mu);
}

void agent_set_holds(agent *a, const char *run, uint64_t v) {
  pthread_mutex_lock(&a->mu);
  snprintf(a->run_id, sizeof a->run_id, "%s", run ? run : "");
  atomic_store(&a->policy_version, v);
  pthread_mutex_unlock(&a->mu);
}

/* The run and the version of it held, read together (mu held by the caller). */
static uint64_t agent__holds(agent *a, char *run, size_t len) {
  snprintf(run, len, "%s", a->run_id);
  return atomic_load(&a->policy_version);
}

/* A command of another run: versions count that run's steps from 0. */
static void agent__note_run(agent *a, const Rlorch__V1__Command *cmd) {
  if (!cmd->run_id || !cmd->run_id[0]) return;
  char prev[64];
  pthread_mutex_lock(&a->mu);
  int changed = strcmp(cmd->run_id, a->run_id) != 0;
  snprintf(prev, sizeof prev, "%s", a->run_id);
  if (changed) {
    snprintf(a->run_id, sizeof a->run_id, "%s", cmd->run_id);
    if (prev[0]) atomic_store(&a->policy_version, 0);
  }
  pthread_mutex_unlock(&a->mu);
  if (changed && prev[0]) agent_log_info("new_run", "run=%s previous=%s version=0", cmd->run_id, prev);
}

uint32_t agent_rank(const agent *a) {
  agent *m = (agent *)a;
  pthread_mutex_lock(&m->mu);
  uint32_t r = m->rank;
  pthread_mutex_unlock(&m->mu);
  return r;
}

uint32_t agent_id_tag(const agent *a) {
  agent *m = (agent *)a;
  pthread_mutex_lock(&m->mu);
  uint32_t tag = m->rank;
  if (tag == 0 && m->opts.role == AGENT_ROLE_INFERENCE) {
    /* FNV-1a of the worker id, folded to 23 bits, with bit 23 set so it never
     * equals a real rank. */
    uint32_t h = 2166136261u;
    for (const char *p = m->worker_id; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
    tag = 0x800000u | ((h ^ (h >> 23)) & 0x7fffffu);
  }
  pthread_mutex_unlock(&m->mu);
  return tag;
}

/* Waits on the agent's condition for up to s seconds; mu must be held. */
static void agent__timedwait(agent *a, double s) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double end = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + s;
  ts.tv_sec = (time_t)end;
  ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
  pthread_cond_timedwait(&a->cond, &a->mu, &ts);
}

/* Sleeps up to s seconds, ending early when the agent stops or, with gen
 * set, when the worker registers again (generation *gen is left). */
static void agent__sleep(agent *a, double s, const uint64_t *gen) {
  double end = agent_now() + s;
  pthread_mutex_lock(&a->mu);
  for (double left = s; left > 0 && !atomic_load(&a->stop) && (!gen || a->gen == *gen);
       left = end - agent_now())
    agent__timedwait(a, left);
  pthread_mutex_unlock(&a->mu);
}

void agent_sleep(agent *a, double s) { agent__sleep(a, s, NULL); }

static double agent__backoff_next(double b) {
  b *= 2;
  return b > AGENT__BACKOFF_MAX_S ? AGENT__BACKOFF_MAX_S : b;
}

static void agent__wake(agent *a) {
  pthread_mutex_lock(&a->mu);
  pthread_cond_broadcast(&a->cond);
  pthread_mutex_unlock(&a->mu);
}

/* Requests a stop from any thread: wakes sleepers and the blocked stream. */
static void agent__request_stop(agent *a) {
  atomic_store(&a->stop, 1);
  if (a->rpc) rpc_client_cancel_streams(a->rpc);
  agent__wake(a);
}

void agent_stop(agent *a) { agent__request_stop(a); }

int agent_registered(const agent *a) {
  agent *m = (agent *)a;
  pthread_mutex_lock(&m->mu);
  int r = m->gen > 0;
  pthread_mutex_unlock(&m->mu);
  return r;
}

uint64_t agent_registration(const agent *a) {
  agent *m = (agent *)a;
  pthread_mutex_lock(&m->mu);
  uint64_t g = m->gen;
  pthread_mutex_unlock(&m->mu);
  return g;
}

grpc_status_code agent_refusal(const agent *a, char *msg, size_t len) {
  agent *m = (agent *)a;
  pthread_mutex_lock(&m->mu);
  grpc_status_code c = m->refused ? m->refusal.code : GRPC_STATUS_OK;
  if (len) snprintf(msg, len, "%s", m->refused ? m->refusal.message : "");
  pthread_mutex_unlock(&m->mu);
  return c;
}

/* Logs connectivity once per change, not once per attempt. */
static void agent__set_conn(agent *a, agent__conn c, const rpc_status *st) {
  pthread_mutex_lock(&a->mu);
  agent__conn was = a->conn;
  a->conn = c;
  pthread_mutex_unlock(&a->mu);
  if (was == c) return;
  if (c == AGENT__CONN_UP)
    agent_log_info("orchestrator_reachable", "addr=%s", a->opts.orchestrator);
  else
    agent_log_warn("orchestrator_unreachable", "addr=%s code=%s msg=\"%s\" retry=backoff max_s=%.0f",
             a->opts.orchestrator, rpc_status_name(st->code), st->message, AGENT__BACKOFF_MAX_S);
}

static uint64_t agent__snapshot(agent *a, char *id, size_t idlen) {
  pthread_mutex_lock(&a->mu);
  snprintf(id, idlen, "%s", a->worker_id);
  uint64_t g = a->gen;
  pthread_mutex_unlock(&a->mu);
  return g;
}

/* ---- registration -------------------------------------------------------- */

static int agent__register_once(agent *a, rpc_status *st) {
  ProtobufCMessage *resp = NULL;
  pthread_mutex_lock(&a->mu);
  a->reg->policy_version = agent__holds(a, a->reg_run, sizeof a->reg_run);
  pthread_mutex_unlock(&a->mu);
  a->reg->run_id = a->reg_run;
  grpc_status_code code =
      rpc_client_call(a->rpc, AGENT__M_REGISTER, &a->reg->base,
                      &rlorch__v1__register_response__descriptor, AGENT__CALL_TIMEOUT_S, &resp, st);
  if (code != GRPC_STATUS_OK) return -1;
  Rlorch__V1__RegisterResponse *r = (Rlorch__V1__RegisterResponse *)resp;
  pthread_mutex_lock(&a->mu);
  snprintf(a->worker_id, sizeof a->worker_id, "%s", r->worker_id ? r->worker_id : "");
  a->rank = r->rank;
  a->hb_ms = r->heartbeat_interval_ms ? r->heartbeat_interval_ms : 1000;
  if (a->hb_ms < 50) a->hb_ms = 50;
  a->gen++;
  pthread_cond_broadcast(&a->cond);
  pthread_mutex_unlock(&a->mu);
  agent_log_info("registered", "worker_id=%s rank=%u heartbeat_ms=%u name=%s policy_version=%llu run=%s",
           r->worker_id, r->rank, r->heartbeat_interval_ms, a->name,
           (unsigned long long)a->reg->policy_version, a->reg_run[0] ? a->reg_run : "none");
  protobuf_c_message_free_unpacked(resp, NULL);
  return 0;
}

/* Registers unless someone already did since generation `seen`. Retries with
 * backoff until it succeeds or the agent stops; returns 1 (registered here),
 * 0 (another thread had) or -1 (stopping). Fatal refusals (bad arguments,
 * authentication) stop the agent. */
static int agent__register(agent *a, uint64_t seen) {
  pthread_mutex_lock(&a->reg_mu);
  pthread_mutex_lock(&a->mu);
  while (a->reg_hold && !atomic_load(&a->stop)) agent__timedwait(a, 1.0);
  int done = a->gen != seen;
  pthread_mutex_unlock(&a->mu);
  /* The orchestrator forgot registration `seen`, and with it every plan that
   * registration was part of: a broadcast still executing would only wait
   * for its peers until its deadline while the next plan goes unacked. */
  if (!done && seen && a->abort_fn) a->abort_fn(NULL, a->abort_ud);
  double backoff = AGENT__BACKOFF_MIN_S;
  int registered = 0;
  while (!done && !atomic_load(&a->stop)) {
    rpc_status st;
    if (agent__register_once(a, &st) == 0) {
      agent__set_conn(a, AGENT__CONN_UP, &st);
      done = registered = 1;
      break;
    }
    if (st.code == GRPC_STATUS_INVALID_ARGUMENT || st.code == GRPC_STATUS_UNAUTHENTICATED ||
        st.code == GRPC_STATUS_PERMISSION_DENIED || st.code == GRPC_STATUS_FAILED_PRECONDITION) {
      agent_log_error("register_refused", "code=%s msg=\"%s\"", rpc_status_name(st.code), st.message);
      pthread_mutex_unlock(&a->reg_mu);
      pthread_mutex_lock(&a->mu);
      a->refused = 1;
      a->refusal = st;
      pthread_mutex_unlock(&a->mu);
      agent__request_stop(a);
      return -1;
    }
    agent__set_conn(a, AGENT__CONN_DOWN, &st);
    agent_sleep(a, backoff);
    backoff = agent__backoff_next(backoff);
  }
  pthread_mutex_unlock(&a->reg_mu);
  return done ? registered : -1;
}

/* The orchestrator forgot the worker: register again, then make the attach
 * thread re-open its stream under the new id. */
static void agent__reregister(agent *a, uint64_t seen, const char *why) {
  agent_log_warn("worker_unknown", "reason=\"%s\" action=register", why);
  /* Interrupt, not cancel: cancelling would also end every stream opened
   * later, so the attach thread could never open one under the new id. And
   * only a stream of an older registration: one the attach thread already
   * opened under the new id must stay, or the orchestrator would see it
   * close and declare the worker lost again. */
  if (agent__register(a, seen) < 0 || atomic_load(&a->stop)) return;
  pthread_mutex_lock(&a->mu);
  int stale = a->attach_gen != a->gen;
  pthread_mutex_unlock(&a->mu);
  if (stale) rpc_client_interrupt_streams(a->rpc);
}

/* ---- attach thread ------------------------------------------------------- */

typedef struct agent__attach_ctx {
  agent *a;
  uint64_t count;
} agent__attach_ctx;

static int agent__on_command(ProtobufCMessage *m, void *ud) {
  agent__attach_ctx *c = ud;
  agent *a = c->a;
  agent__item *it = malloc(sizeof *it);
  if (!it) {
    agent_log_error("command_dropped", "reason=\"no memory\"");
    protobuf_c_message_free_unpacked(m, NULL);
    return 1;
  }
  it->cmd = (Rlorch__V1__Command *)m;
  it->next = NULL;
  c->count++;
  if (it->cmd->kind_case == RLORCH__V1__COMMAND__KIND_ABORT && a->abort_fn && it->cmd->abort &&
      it->cmd->abort->plan_id && it->cmd->abort->plan_id[0])
    a->abort_fn(it->cmd->abort->plan_id, a->abort_ud);
  pthread_mutex_lock(&a->mu);
  if (a->tail) a->tail->next = it;
  else a->head = it;
  a->tail = it;
  a->queued++;
  pthread_cond_broadcast(&a->cond);
  pthread_mutex_unlock(&a->mu);
  return atomic_load(&a->stop) ? 1 : 0;
}

static void *agent__attach_main(void *arg) {
  agent *a = arg;
  double backoff = AGENT__BACKOFF_MIN_S;
  while (!atomic_load(&a->stop)) {
    char id[128];
    uint64_t gen = agent__snapshot(a, id, sizeof id);
    pthread_mutex_lock(&a->mu);
    a->attach_gen = gen;
    pthread_mutex_unlock(&a->mu);
    Rlorch__V1__AttachRequest req = RLORCH__V1__ATTACH_REQUEST__INIT;
    req.worker_id = id;
    agent__attach_ctx ctx = {a, 0};
    rpc_status st;
    agent_log_debug("attach", "worker_id=%s", id);
    grpc_status_code code = rpc_client_stream(a->rpc, AGENT__M_ATTACH, &req.base,
                                              &rlorch__v1__command__descriptor, 0,
                                              agent__on_command, &ctx, &st);
    if (atomic_load(&a->stop)) break;
    if (ctx.count > 0) backoff = AGENT__BACKOFF_MIN_S;
    char now_id[128];
    if (agent__snapshot(a, now_id, sizeof now_id) != gen) continue; /* re-registered: re-attach */
    if (code == GRPC_STATUS_NOT_FOUND) {
      agent__reregister(a, gen, st.message);
      continue;
    }
    if (code == GRPC_STATUS_OK) {
      agent_log_info("attach_closed", "worker_id=%s commands=%llu", id, (unsigned long long)ctx.count);
    } else {
      agent_log_debug("attach_failed", "code=%s msg=\"%s\"", rpc_status_name(code), st.message);
      if (code != GRPC_STATUS_CANCELLED) agent__set_conn(a, AGENT__CONN_DOWN, &st);
    }
    /* Not past a new registration: then there is an id to open a stream
     * under. An unreachable orchestrator is waited for by the channel. */
    if (code == GRPC_STATUS_UNAVAILABLE) {
      double t0 = agent_now();
      int up = rpc_client_wait_ready(a->rpc, backoff < AGENT__ATTACH_WAIT_MAX_S ? backoff : AGENT__ATTACH_WAIT_MAX_S);
      if (!up && agent_now() - t0 < AGENT__BACKOFF_MIN_S) agent__sleep(a, AGENT__BACKOFF_MIN_S, &gen);
    } else {
      agent__sleep(a, backoff, &gen);
    }
    backoff = agent__backoff_next(backoff);
  }
  return NULL;
}

/* ---- heartbeat thread ------------------------------------------------------ */

/* One report under the current id. Returns the gRPC code; *known is false
 * when the orchestrator answered that it does not know the worker. */
static grpc_status_code agent__report_once(agent *a, Rlorch__V1__ReportRequest *req, char *id,
                                           uint64_t *gen, int *known, rpc_status *st) {
  *gen = agent__snapshot(a, id, 128);
  req->worker_id = id;
  ProtobufCMessage *resp = NULL;
  grpc_status_code code =
      rpc_client_call(a->rpc, AGENT__M_REPORT, &req->base,
                      &rlorch__v1__report_response__descriptor, AGENT__CALL_TIMEOUT_S, &resp, st);
  *known = code != GRPC_STATUS_NOT_FOUND;
  if (code == GRPC_STATUS_OK) {
    *known = ((Rlorch__V1__ReportResponse *)resp)->known;
    protobuf_c_message_free_unpacked(resp, NULL);
  }
  return code;
}

static void *agent__heartbeat_main(void *arg) {
  agent *a = arg;
  double backoff = 0;
  while (!atomic_load(&a->stop)) {
    pthread_mutex_lock(&a->mu);
    double wait = backoff > 0 ? backoff : a->hb_ms / 1000.0;
    pthread_mutex_unlock(&a->mu);
    agent_sleep(a, wait);
    if (atomic_load(&a->stop)) break;
    Rlorch__V1__Heartbeat hb = RLORCH__V1__HEARTBEAT__INIT;
    char run[64];
    pthread_mutex_lock(&a->mu);
    hb.policy_version = agent__holds(a, run, sizeof run);
    pthread_mutex_unlock(&a->mu);
    hb.run_id = run;
    Rlorch__V1__WorkerStats stats = RLORCH__V1__WORKER_STATS__INIT;
    if (a->stats_fn) {
      a->stats_fn(&stats, a->stats_ud);
      hb.stats = &stats;
    }
    Rlorch__V1__ReportRequest req = RLORCH__V1__REPORT_REQUEST__INIT;
    req.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_HEARTBEAT;
    req.heartbeat = &hb;
    char id[128];
    uint64_t gen;
    int known;
    rpc_status st;
    grpc_status_code code = agent__report_once(a, &req, id, &gen, &known, &st);
    if (!known) {
      agent__set_conn(a, AGENT__CONN_UP, &st);
      agent__reregister(a, gen, code == GRPC_STATUS_OK ? "heartbeat: known=false" : st.message);
      backoff = 0;
    } else if (code == GRPC_STATUS_OK) {
      agent__set_conn(a, AGENT__CONN_UP, &st);
      backoff = 0;
    } else {
      agent__set_conn(a, AGENT__CONN_DOWN, &st);
      backoff = backoff > 0 ? agent__backoff_next(backoff) : AGENT__BACKOFF_MIN_S * 2;
    }
  }
  return NULL;
}

int agent_report(agent *a, Rlorch__V1__ReportRequest *req) {
  rpc_status st;
  return agent_report_status(a, req, &st);
}

int agent_report_status(agent *a, Rlorch__V1__ReportRequest *req, rpc_status *out) {
  double backoff = AGENT__BACKOFF_MIN_S, start = agent_now();
  rpc_status st = {.code = GRPC_STATUS_CANCELLED};
  snprintf(st.message, sizeof st.message, "the worker is stopping");
  *out = st;
  while (!atomic_load(&a->stop)) {
    char id[128];
    uint64_t gen;
    int known;
    grpc_status_code code = agent__report_once(a, req, id, &gen, &known, &st);
    *out = st;
    req->worker_id = NULL;
    if (!known) {
      agent_log_warn("report_dropped", "kind=%d reason=\"orchestrator forgot the worker\"",
               (int)req->kind_case);
      agent__reregister(a, gen, code == GRPC_STATUS_OK ? "report: known=false" : st.message);
      return -1;
    }
    if (code == GRPC_STATUS_OK) return 0;
    if (code == GRPC_STATUS_INVALID_ARGUMENT || code == GRPC_STATUS_FAILED_PRECONDITION ||
        code == GRPC_STATUS_PERMISSION_DENIED || code == GRPC_STATUS_UNAUTHENTICATED) {
      agent_log_error("report_refused", "kind=%d code=%s msg=\"%s\"", (int)req->kind_case,
                rpc_status_name(code), st.message);
      return -1;
    }
    agent__set_conn(a, AGENT__CONN_DOWN, &st);
    if (agent_now() - start > AGENT__REPORT_GIVE_UP_S) {
      agent_log_error("report_dropped", "kind=%d reason=\"unreachable for %.0f s\"", (int)req->kind_case,
                AGENT__REPORT_GIVE_UP_S);
      return -1;
    }
    agent_sleep(a, backoff);
    backoff = agent__backoff_next(backoff);
  }
  return -1;
}

/* ---- reports on the one-way stream ------------------------------------------ */

/* Keeps `bytes` (taken) as the last report the stream took, unless a later
 * one is kept already (two senders may return out of order). */
static void agent__keep_last(agent *a, uint8_t *bytes, size_t len, uint64_t seq, uint64_t gen) {
  pthread_mutex_lock(&a->last_mu);
  if (seq == a->refused_seq) {
    a->refused_seq = 0;
  } else if (seq > a->last_seq || !a->last) {
    free(a->last);
    a->last = bytes;
    a->last_len = len;
    a->last_seq = seq;
    a->last_gen = gen;
    bytes = NULL;
  }
  pthread_mutex_unlock(&a->last_mu);
  free(bytes);
}

/* Takes the kept report out (NULL: none), with the registration it was
 * sent under. */
static uint8_t *agent__take_last(agent *a, size_t *len, uint64_t *gen) {
  pthread_mutex_lock(&a->last_mu);
  uint8_t *b = a->last;
  *len = a->last_len;
  *gen = a->last_gen;
  a->last = NULL;
  a->last_seq = 0;
  a->refused_seq = 0; /* sequence numbers start again on the next stream */
  pthread_mutex_unlock(&a->last_mu);
  return b;
}

static void agent__on_report_failed(uint64_t seq, const rpc_status *st, void *ud) {
  agent *a = ud;
  char id[128];
  uint64_t gen = agent__snapshot(a, id, sizeof id);
  pthread_mutex_lock(&a->last_mu);
  if (a->last && a->last_seq == seq) { /* refused: sending it again changes nothing */
    gen = a->last_gen;
    free(a->last);
    a->last = NULL;
    a->last_seq = 0;
  } else if (seq > a->last_seq) { /* its sender has not kept it yet */
    a->refused_seq = seq;
  }
  pthread_mutex_unlock(&a->last_mu);
  if (st->code == GRPC_STATUS_NOT_FOUND) {
    agent_log_warn("report_dropped", "seq=%llu reason=\"orchestrator forgot the worker\"",
                   (unsigned long long)seq);
    agent__reregister(a, gen, st->message);
    return;
  }
  agent_log_error("report_refused", "seq=%llu code=%s msg=\"%s\"", (unsigned long long)seq,
                  rpc_status_name(st->code), st->message);
}

/* The stream ended: the last report it took may not have been handled. */
static void agent__on_reports_broken(const rpc_status *st, void *ud) {
  agent *a = ud;
  size_t len;
  uint64_t gen;
  uint8_t *b = agent__take_last(a, &len, &gen);
  agent_log_debug("report_stream_closed", "code=%s msg=\"%s\" resend=%d",
                  rpc_status_name(st->code), st->message, b != NULL);
  if (!b || atomic_load(&a->stop)) {
    free(b);
    return;
  }
  Rlorch__V1__ReportRequest *req = rlorch__v1__report_request__unpack(NULL, len, b);
  free(b);
  if (!req) return; /* packed here: cannot happen but for memory */
  char *was = req->worker_id;
  agent_report(a, req); /* under the current id: one of an older registration is stale anyway */
  req->worker_id = was;
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

void agent_report_nowait(agent *a, Rlorch__V1__ReportRequest *req) {
  char id[128];
  uint64_t gen = agent__snapshot(a, id, sizeof id);
  if (!a->reports || atomic_load(&a->oneway_off_gen) == gen) {
    agent_report(a, req);
    return;
  }
  req->worker_id = id;
  size_t len = protobuf_c_message_get_packed_size(&req->base);
  uint8_t *bytes = malloc(len ? len : 1);
  if (!bytes) {
    req->worker_id = NULL;
    agent_report(a, req);
    return;
  }
  protobuf_c_message_pack(&req->base, bytes);
  rpc_status st;
  uint64_t seq = rpc_oneway_send(a->reports, &req->base, AGENT__CALL_TIMEOUT_S, &st);
  req->worker_id = NULL;
  if (seq) {
    agent__keep_last(a, bytes, len, seq, gen);
    return;
  }
  free(bytes);
  if (st.code == GRPC_STATUS_CANCELLED && atomic_load(&a->stop)) return;
  if (st.code == GRPC_STATUS_UNIMPLEMENTED) {
    agent_log_info("report_stream_unsupported", "msg=\"%s\" action=unary", st.message);
    atomic_store(&a->oneway_off_gen, gen);
  } else {
    agent_log_debug("report_stream_failed", "code=%s msg=\"%s\" action=unary",
                    rpc_status_name(st.code), st.message);
  }
  agent_report(a, req); /* the stream did not take it: nothing was sent */
}

/* ---- the batch of a train step ---------------------------------------------- */

typedef struct agent__fetch_ctx {
  int (*on_chunk)(const Rlorch__V1__BatchChunk *c, void *ud);
  void *ud;
} agent__fetch_ctx;

static int agent__on_chunk(ProtobufCMessage *m, void *ud) {
  agent__fetch_ctx *f = ud;
  int rc = f->on_chunk((const Rlorch__V1__BatchChunk *)m, f->ud);
  protobuf_c_message_free_unpacked(m, NULL);
  return rc;
}

grpc_status_code agent_fetch_batch(agent *a, uint64_t step, uint32_t rank, uint32_t ranks,
                                   double timeout_s,
                                   int (*on_chunk)(const Rlorch__V1__BatchChunk *c, void *ud),
                                   void *ud, rpc_status *st) {
  char id[128];
  agent__snapshot(a, id, sizeof id);
  Rlorch__V1__FetchBatchRequest req = RLORCH__V1__FETCH_BATCH_REQUEST__INIT;
  req.worker_id = id;
  req.step = step;
  req.rank = rank;
  req.ranks = ranks;
  agent__fetch_ctx f = {on_chunk, ud};
  return rpc_client_stream(a->rpc, AGENT__M_FETCH_BATCH, &req.base,
                           &rlorch__v1__batch_chunk__descriptor, timeout_s, agent__on_chunk, &f,
                           st);
}

/* ---- signals ---------------------------------------------------------------- */

void agent_block_signals(void) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
}

static void *agent__signal_main(void *arg) {
  agent_signals *s = arg;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (atomic_load(&s->done)) return NULL; /* agent_signals_stop's own wake-up */
    agent_log_info("signal", "signal=%s action=stop", sig == SIGINT ? "SIGINT" : "SIGTERM");
    s->fn(s->ud);
    atomic_store(&s->ended, 1);
    return NULL;
  }
}

int agent_signals_start(agent_signals *s, void (*fn)(void *ud), void *ud) {
  s->fn = fn;
  s->ud = ud;
  atomic_store(&s->done, 0);
  atomic_store(&s->ended, 0);
  int rc = pthread_create(&s->tid, NULL, agent__signal_main, s);
  s->started = rc == 0;
  return rc;
}

void agent_signals_stop(agent_signals *s) {
  if (!s->started) return;
  atomic_store(&s->done, 1);
  if (!atomic_load(&s->ended)) pthread_kill(s->tid, SIGTERM); /* wakes its sigwait */
  pthread_join(s->tid, NULL);
  s->started = 0;
}

/* ---- lifecycle -------------------------------------------------------------- */

int agent_new(const agent_opts *o, Rlorch__V1__RegisterRequest *reg, agent_command_fn fn,
              void *ud, agent **out, char *err, size_t errlen) {
  agent *a = calloc(1, sizeof *a);
  if (!a) {
    snprintf(err, errlen, "no memory");
    return -1;
  }
  a->opts = *o;
  a->reg = reg;
  a->fn = fn;
  a->ud = ud;
  if (o->name) snprintf(a->name, sizeof a->name, "%s", o->name);
  else agent_default_name(o->role, a->name, sizeof a->name);
  if (!reg->name || !*reg->name) reg->name = a->name;
  if (o->token) {
    if (strlen(o->token) >= sizeof a->token) {
      snprintf(err, errlen, "token: longer than %zu bytes", sizeof a->token - 1);
      free(a);
      return -1;
    }
    snprintf(a->token, sizeof a->token, "%s", o->token);
  } else if (o->token_file &&
             rpc_token_read(o->token_file, a->token, sizeof a->token, err, errlen)) {
    free(a);
    return -1;
  }
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&a->cond, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&a->mu, NULL);
  pthread_mutex_init(&a->reg_mu, NULL);
  a->hb_ms = 1000;
  /* The orchestrator bounds what it sends (batch chunks, commands) by its own
   * max_message_bytes, up to 2 GiB: take whatever it is configured to. */
  rpc_client_opts co = {.target = o->orchestrator, .token = a->token[0] ? a->token : NULL,
                        .max_message_bytes = 0x7fffffff, .tls_ca_file = o->tls_ca_file,
                        .tls_cert_file = o->tls_client_cert_file,
                        .tls_key_file = o->tls_client_key_file};
  pthread_mutex_init(&a->last_mu, NULL);
  rpc_oneway_opts ro = {.method = AGENT__M_REPORT_STREAM,
                        .on_failed = agent__on_report_failed,
                        .on_broken = agent__on_reports_broken,
                        .ud = a};
  if (rpc_client_new(&co, &a->rpc, err, errlen) != 0 ||
      rpc_oneway_new(a->rpc, &ro, &a->reports, err, errlen) != 0) {
    agent_free(a);
    return -1;
  }
  *out = a;
  return 0;
}

void agent_set_abort_fn(agent *a, agent_abort_fn fn, void *ud) {
  a->abort_fn = fn;
  a->abort_ud = ud;
}

void agent_set_stats_fn(agent *a, agent_stats_fn fn, void *ud) {
  a->stats_fn = fn;
  a->stats_ud = ud;
}

static Rlorch__V1__Command *agent__pop(agent *a) {
  pthread_mutex_lock(&a->mu);
  while (!a->head && !atomic_load(&a->stop)) pthread_cond_wait(&a->cond, &a->mu);
  Rlorch__V1__Command *cmd = NULL;
  if (a->head && !atomic_load(&a->stop)) {
    agent__item *it = a->head;
    a->head = it->next;
    if (!a->head) a->tail = NULL;
    a->queued--;
    cmd = it->cmd;
    free(it);
  }
  pthread_mutex_unlock(&a->mu);
  return cmd;
}

static void agent__join(agent *a) {
  agent__request_stop(a);
  if (a->attach_started) pthread_join(a->attach_tid, NULL);
  if (a->hb_started) pthread_join(a->hb_tid, NULL);
  a->attach_started = a->hb_started = 0;
}

int agent_run(agent *a) {
  int status = 0;
  if (agent__register(a, 0) < 0) goto out;
  a->attach_started = pthread_create(&a->attach_tid, NULL, agent__attach_main, a) == 0;
  a->hb_started = pthread_create(&a->hb_tid, NULL, agent__heartbeat_main, a) == 0;
  if (!a->attach_started || !a->hb_started) {
    agent_log_error("fatal", "reason=\"cannot start threads\"");
    status = 1;
    goto out;
  }
  for (;;) {
    Rlorch__V1__Command *cmd = agent__pop(a);
    if (!cmd) break;
    agent_log_debug("command", "seq=%llu kind=%d rank=%u", (unsigned long long)cmd->seq,
              (int)cmd->kind_case, cmd->rank);
    agent__note_run(a, cmd);
    int rc = a->fn(a, cmd, a->ud);
    protobuf_c_message_free_unpacked(&cmd->base, NULL);
    if (rc < 0) {
      status = 1;
      break;
    }
    if (rc > 0) break;
  }
out:
  agent__join(a);
  pthread_mutex_lock(&a->mu);
  if (a->refused) status = 1;
  pthread_mutex_unlock(&a->mu);
  return status;
}

void agent_free(agent *a) {
  if (!a) return;
  agent__join(a);
  while (a->head) {
    agent__item *it = a->head;
    a->head = it->next;
    protobuf_c_message_free_unpacked(&it->cmd->base, NULL);
    free(it);
  }
  /* The answers to what the stream took still come back before it goes. */
  rpc_oneway_free(a->reports, 1.0);
  free(a->last);
  if (a->rpc) rpc_client_free(a->rpc);
  pthread_mutex_destroy(&a->last_mu);
  pthread_mutex_destroy(&a->mu);
  pthread_mutex_destroy(&a->reg_mu);
  pthread_cond_destroy(&a->cond);
  memset(a->token, 0, sizeof a->token);
  free(a);
}

/* ---- helpers for both roles ------------------------------------------------- */

static void agent__topo_to_pb(const bcast_systopo *t, int device, agent_caps_pb *out) {
  Rlorch__V1__Topology *m = &out->topo;
  rlorch__v1__topology__init(m);
  m->node = (char *)t->node;
  m->numa_node = t->numa_node;
  if (device >= 0) {
    m->gpu_pci_bus_id = (char *)t->gpu_pci_bus_id;
    for (uint32_t i = 0; i < t->n_nvlink_peers; i++) out->peers[i] = (char *)t->nvlink_peers[i];
    m->n_nvlink_peers = t->n_nvlink_peers;
    m->nvlink_peers = out->peers;
    m->h2d_gbps = t->h2d_gbps; /* 0 where it could not be measured */
  }
  for (uint32_t i = 0; i < t->n_nics; i++) {
    Rlorch__V1__Nic *n = &out->nic[i];
    rlorch__v1__nic__init(n);
    n->name = (char *)t->nics[i].name;
    n->gbits = t->nics[i].gbits;
    n->numa_node = t->nics[i].numa_node;
    n->rdma = t->nics[i].rdma != 0;
    n->mtu = t->nics[i].mtu;
    out->nicp[i] = n;
  }
  m->n_nics = t->n_nics;
  m->nics = out->nicp;
  const char *names[3];
  m->n_configured = bcast_systopo_configured_names(t->configured, names);
  for (size_t i = 0; i < m->n_configured; i++) out->configured[i] = (char *)names[i];
  m->configured = out->configured;
}

void agent_caps_to_pb(const bcast_caps *caps, int device, agent_caps_pb *out) {
  Rlorch__V1__Capabilities *c = &out->caps;
  rlorch__v1__capabilities__init(c);
  c->cuda_devices = device >= 0 ? (uint32_t)caps->cuda_devices : 0;
  c->cuda_version = (char *)caps->cuda_version;
  c->nccl_version = (char *)caps->nccl_version;
  c->pinned_limit_bytes = caps->pinned_limit_bytes;
  c->cpu_threads = (uint32_t)caps->cpu_threads;
  c->gpu_name = device >= 0 ? (char *)caps->gpu_name : "";
  /* Colocation is read from these two (bcast_caps_select_device set them). */
  c->gpu_uuid = device >= 0 ? (char *)caps->gpu_uuid : "";
  c->host_id = (char *)caps->host_id;
  agent__topo_to_pb(&caps->topo, device, out);
  c->topology = &out->topo;
}

void agent_default_name(agent_role role, char *buf, size_t len) {
  char host[128] = "localhost";
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
  host[sizeof host - 1] = 0;
  snprintf(buf, len, "%s-%s-%ld", role == AGENT_ROLE_TRAINER ? "trainer" : "inference", host,
           (long)getpid());
}

int agent_pick_device(const agent_opts *o, const bcast_caps *caps, int *device, char *err,
                      size_t errlen) {
  if (!o->device_set) {
    *device = caps->cuda_devices > 0 ? 0 : -1;
    return 0;
  }
  if (o->device >= 0 && o->device >= caps->cuda_devices) {
    snprintf(err, errlen, "--device %d: no such CUDA device (%d visible%s%s)", o->device,
             caps->cuda_devices, caps->cuda_built ? "" : "; built without CUDA",
             caps->note[0] ? "; " : "");
    if (caps->note[0]) {
      size_t l = strlen(err);
      snprintf(err + l, errlen - l, "%s", caps->note);
    }
    return -1;
  }
  *device = o->device;
  return 0;
}

/* Logs what the agent runs on; the host transport is said loudly. */
void agent_log_devices(const bcast_caps *caps, int device) {
  if (device >= 0)
    agent_log_info("devices", "device=%d gpu=\"%s\" cuda=%s driver=%s nccl=%s transport=%s", device,
             caps->gpu_name, caps->cuda_version, caps->driver_version,
             caps->nccl_version[0] ? caps->nccl_version : "none",
             caps->nccl_built ? "nccl (host-tcp when the plan says host)" : "host-tcp");
  else
    agent_log_warn("devices", "device=none transport=host-tcp cpu_threads=%d msg=\"NO GPU: weights "
             "move over the HOST TCP transport with CPU casts%s%s\"",
             caps->cpu_threads, caps->note[0] ? "; " : "", caps->note);
}

/* The house rule: a worker says what it uses. A NIC of unknown speed, or
 * none at all, leaves the model of its plans guessing: said at warning
 * level. */
void agent_log_topology(const bcast_systopo *t) {
  char line[4096];
  bcast_systopo_describe(t, line, sizeof line);
  int unknown = 0;
  for (uint32_t i = 0; i < t->n_nics; i++) unknown |= !(t->nics[i].gbits > 0);
  if (unknown || !t->n_nics) agent_log_warn("topology", "%s", line);
  else agent_log_info("topology", "%s", line);
}
