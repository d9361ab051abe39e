/* Plan, trigger and abort: the same protocol for sender and receivers. */
#include "workers/agent/agent_xfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/agent/agent_log.h"
#include "workers/agent/agent_pb.h"

/* Only the command thread calls this; it swaps the engine under the lock so
 * that agent_xfer_cancel never sees a freed one. */
static int agent__engine(agent_xfer *x, uint32_t rank, bcast_err *err) {
  if (x->engine && x->rank == rank) return 0;
  if (x->engine) {
    agent_log_info("engine_rank_changed", "from=%u to=%u", x->rank, rank);
    /* The address Register announced stays this worker's: bind it again. */
    const char *bound = bcast_engine_data_address(x->engine);
    if (x->listens && bound) snprintf(x->listen, sizeof x->listen, "%s", bound);
    pthread_mutex_lock(&x->mu);
    bcast_engine_free(x->engine);
    x->engine = NULL;
    pthread_mutex_unlock(&x->mu);
  }
  bcast_engine_opts eo = {.rank = rank, .device = x->device,
                          .host_listen = x->listens ? x->listen : NULL};
  bcast_engine *e = NULL;
  int rc = bcast_engine_new(&eo, &e, err);
  if (rc) return rc;
  pthread_mutex_lock(&x->mu);
  x->engine = e;
  if (x->cancelled[0]) bcast_engine_cancel(e, x->cancelled); /* aborted before it existed */
  pthread_mutex_unlock(&x->mu);
  x->rank = rank;
  if (x->listens)
    agent_log_info("engine", "rank=%u device=%d data_address=%s", rank, x->device,
             bcast_engine_data_address(x->engine));
  return 0;
}

int agent_xfer_init(agent_xfer *x, int sender, uint32_t rank, int device, const char *listen,
                    agent_xfer_bind_fn bind, agent_xfer_done_fn done, void *ud, char *err,
                    size_t errlen) {
  memset(x, 0, sizeof *x);
  pthread_mutex_init(&x->mu, NULL);
  x->mu_ready = 1;
  x->sender = sender;
  x->device = device;
  snprintf(x->listen, sizeof x->listen, "%s", listen ? listen : "127.0.0.1:0");
  x->listens = sender || listen;
  x->bind = bind;
  x->done = done;
  x->ud = ud;
  if (!x->listens) return 0;
  bcast_err be = {0};
  if (agent__engine(x, rank, &be)) {
    snprintf(err, errlen, "broadcast engine (listen %s): %s", x->listen, be.msg);
    return -1;
  }
  return 0;
}

static void agent__drop_plan(agent_xfer *x) {
  if (x->begun && x->plan) {
    char err[64];
    x->done(x->ud, x->plan, 0, NULL, err, sizeof err);
  }
  x->begun = 0;
  bcast_plan_free(x->plan);
  x->plan = NULL;
  x->local = NULL;
  x->nlocal = 0;
}

void agent_xfer_free(agent_xfer *x) {
  agent__drop_plan(x);
  bcast_engine_free(x->engine);
  x->engine = NULL;
  if (x->mu_ready) pthread_mutex_destroy(&x->mu);
  x->mu_ready = 0;
}

void agent_xfer_cancel(agent_xfer *x, const char *plan_id) {
  char id[sizeof x->cancelled];
  pthread_mutex_lock(&x->mu);
  snprintf(id, sizeof id, "%s", plan_id ? plan_id : x->running);
  if (id[0]) {
    snprintf(x->cancelled, sizeof x->cancelled, "%s", id);
    if (x->engine) bcast_engine_cancel(x->engine, id);
  }
  pthread_mutex_unlock(&x->mu);
  if (id[0]) agent_log_info("plan_cancel", "plan_id=%s%s", id, plan_id ? "" : " reason=\"registration forgotten\"");
}

void agent_xfer_abort_hook(const char *plan_id, void *ud) { agent_xfer_cancel(ud, plan_id); }

const char *agent_xfer_data_address(const agent_xfer *x) {
  const char *s = x->engine ? bcast_engine_data_address(x->engine) : NULL;
  return s ? s : "";
}

bcast_engine *agent_xfer_engine(agent_xfer *x) { return x->engine; }

static void agent__ack_with(agent *a, const char *id, uint64_t hash, const char *error,
                            uint8_t *coloc, size_t coloc_len) {
  Rlorch__V1__PlanAck ack = RLORCH__V1__PLAN_ACK__INIT;
  ack.plan_id = (char *)id;
  ack.plan_hash = hash;
  ack.error = (char *)error;
  ack.colocated_export.data = coloc;
  ack.colocated_export.len = coloc_len;
  Rlorch__V1__ReportRequest req = RLORCH__V1__REPORT_REQUEST__INIT;
  req.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_PLAN_ACK;
  req.plan_ack = &ack;
  if (error[0]) agent_log_warn("plan_refused", "plan_id=%s error=\"%s\"", id, error);
  else agent_log_info("plan_acked", "plan_id=%s hash=%016llx", id, (unsigned long long)hash);
  agent_report_nowait(a, &req);
}

static void agent__ack(agent *a, const char *id, uint64_t hash, const char *error) {
  agent__ack_with(a, id, hash, error, NULL, 0);
}

void agent_xfer_on_plan(agent_xfer *x, agent *a, const Rlorch__V1__Command *cmd) {
  const Rlorch__V1__BroadcastPlan *pb = cmd->plan;
  const char *id = pb->plan_id ? pb->plan_id : "";
  agent__drop_plan(x); /* a new plan replaces an untriggered one */
  bcast_plan *p = NULL;
  bcast_err be = {0};
  char msg[600];
  if (agent_pb_plan(pb, &p, &be)) {
    agent__ack(a, id, pb->hash, be.msg);
    return;
  }
  uint64_t hash = bcast_plan_hash(p);
  if (hash != pb->hash) {
    snprintf(msg, sizeof msg, "plan hash mismatch: carried %016llx, computed %016llx",
             (unsigned long long)pb->hash, (unsigned long long)hash);
    bcast_plan_free(p);
    agent__ack(a, id, hash, msg);
    return;
  }
  if (cmd->rank >= p->world_size) {
    snprintf(msg, sizeof msg, "rank %u does not fit the plan (world size %u)", cmd->rank,
             p->world_size);
    bcast_plan_free(p);
    agent__ack(a, id, hash, msg);
    return;
  }
  bcast_tensor *local = NULL;
  size_t n = 0;
  if (x->bind(x->ud, p, cmd->rank, &local, &n, &be)) {
    bcast_plan_free(p);
    agent__ack(a, id, hash, be.msg);
    return;
  }
  /* A colocated receiver tells the sender where its buffers are, in the ack:
   * the sender gets the exports with its trigger, after every ack. */
  uint8_t *coloc = NULL;
  size_t coloc_len = 0;
  if (p->mode == BCAST_MODE_COLOCATED && !x->sender) {
    int rc = agent__engine(x, cmd->rank, &be);
    if (!rc) rc = bcast_engine_coloc_export(x->engine, p, local, n, &coloc, &coloc_len, &be);
    if (rc) {
      snprintf(msg, sizeof msg, "colocated export: %s", be.msg);
      bcast_plan_free(p);
      agent__ack(a, id, hash, msg);
      return;
    }
    agent_log_info("coloc_export", "plan_id=%s rank=%u bytes=%zu", id, cmd->rank, coloc_len);
  }
  x->plan = p;
  x->local = local;
  x->nlocal = n;
  if (coloc && x->begin) {
    x->begin(x->ud, p);
    x->begun = 1;
  }
  agent__ack_with(a, id, hash, "", coloc, coloc_len);
  free(coloc);
}

/* What a participant reports it holds after a broadcast: each side sums
 * the same bytes, so each receiver's sums are compared with its sources'. */
typedef struct agent__sums {
  uint64_t whole;     /* weights_checksum */
  uint64_t *per_src;  /* receiver: one per source, over its view; NULL: whole serves */
  size_t nsrc;
  uint64_t *per_view; /* source of a plan with views: one per view */
  size_t nview;
} agent__sums;

/* Whether this rank reports the done callback's whole checksum
 * (agent_weights over its tensors as a list): a lone trainer, and every
 * receiver that holds the whole model, which thereby says what it holds in
 * terms that do not depend on the plan (a group's receivers and a lone
 * trainer's compare equal). A source of several and a receiver of a view
 * hold a part: theirs are the plan's own sums, taken here. */
static int agent__whole_wanted(const bcast_plan *p, uint32_t rank) {
  uint32_t ns = (uint32_t)bcast_plan_sources(p);
  if (rank < ns) return ns == 1;
  return bcast_plan_rank_view(p, rank) == BCAST_VIEW_WHOLE;
}

static int agent__plan_sums(const agent_xfer *x, uint32_t rank, agent__sums *s, char *err,
                            size_t errlen) {
  const bcast_plan *p = x->plan;
  uint32_t ns = (uint32_t)bcast_plan_sources(p), view = bcast_plan_rank_view(p, rank);
  bcast_err se = {0};
  int rc = 0;
  if (rank < ns) {
    if (ns > 1) rc = bcast_plan_source_checksum(p, rank, x->local, x->nlocal, 0, &s->whole, &se);
    if (!rc && p->nviews && !(s->per_view = calloc(p->nviews, sizeof *s->per_view)))
      rc = (snprintf(se.msg, sizeof se.msg, "out of memory"), -1);
    if (s->per_view) s->nview = p->nviews;
    for (uint32_t v = 0; !rc && v < s->nview; v++)
      rc = bcast_plan_view_checksum(p, rank, v, x->local, x->nlocal, 0, &s->per_view[v], &se);
  } else if (ns > 1 || view != BCAST_VIEW_WHOLE) {
    if (!(s->per_src = calloc(ns ? ns : 1, sizeof *s->per_src)))
      rc = (snprintf(se.msg, sizeof se.msg, "out of memory"), -1);
    else s->nsrc = ns;
    for (uint32_t j = 0; !rc && j < ns; j++)
      rc = bcast_plan_view_checksum(p, j, view, x->local, x->nlocal, 1, &s->per_src[j], &se);
  }
  if (rc) snprintf(err, errlen, "%s checksum: %.480s", rank < ns ? "view" : "source", se.msg);
  return rc ? -1 : 0;
}

static void agent__done(agent *a, const char *id, const char *error, Rlorch__V1__StepRecord *rec,
                        const agent__sums *sums) {
  Rlorch__V1__BroadcastDone d = RLORCH__V1__BROADCAST_DONE__INIT;
  d.plan_id = (char *)id;
  d.error = (char *)error;
  d.record = rec;
  if (sums && !error[0]) {
    d.weights_checksum = sums->whole;
    d.source_checksums = sums->per_src;
    d.n_source_checksums = sums->nsrc;
    d.view_checksums = sums->per_view;
    d.n_view_checksums = sums->nview;
  }
  Rlorch__V1__ReportRequest req = RLORCH__V1__REPORT_REQUEST__INIT;
  req.kind_case = RLORCH__V1__REPORT_REQUEST__KIND_BROADCAST_DONE;
  req.broadcast_done = &d;
  agent_report_nowait(a, &req);
}

void agent_xfer_on_trigger(agent_xfer *x, agent *a, const Rlorch__V1__Command *cmd) {
  const Rlorch__V1__TriggerBroadcast *tg = cmd->trigger;
  const char *id = tg->plan_id ? tg->plan_id : "";
  char msg[600];
  if (!x->plan || strcmp(x->plan->id, id) != 0 || x->plan->hash != tg->plan_hash) {
    snprintf(msg, sizeof msg, "trigger for plan %s/%016llx, but the acknowledged plan is %s/%016llx",
             id, (unsigned long long)tg->plan_hash, x->plan ? x->plan->id : "(none)",
             (unsigned long long)(x->plan ? x->plan->hash : 0));
    agent_log_warn("trigger_refused", "plan_id=%s error=\"%s\"", id, msg);
    agent__done(a, id, msg, NULL, NULL);
    return;
  }
  bcast_err be = {0};
  bcast_stats st;
  memset(&st, 0, sizeof st);
  int rc = agent__engine(x, cmd->rank, &be);
  /* The sender of a colocated plan maps every receiver's export first. */
  for (size_t i = 0; !rc && x->sender && x->plan->mode == BCAST_MODE_COLOCATED && i < tg->n_colocated; i++)
    rc = bcast_engine_coloc_import(x->engine, x->plan, tg->colocated[i]->rank,
                                   tg->colocated[i]->export_bytes.data,
                                   tg->colocated[i]->export_bytes.len, &be);
  if (!rc) {
    if (x->begin && !x->begun) x->begin(x->ud, x->plan);
    x->begun = 1;
    agent_log_info("broadcast_start", "plan_id=%s mode=%s rank=%u world=%u buckets=%zu bytes=%llu", id,
             bcast_mode_name(x->plan->mode), cmd->rank, x->plan->world_size, x->plan->nbuckets,
             (unsigned long long)bcast_plan_wire_bytes(x->plan));
    pthread_mutex_lock(&x->mu);
    snprintf(x->running, sizeof x->running, "%s", id);
    pthread_mutex_unlock(&x->mu);
    rc = bcast_engine_execute(x->engine, x->plan, x->local, x->nlocal, &st, &be);
    pthread_mutex_lock(&x->mu);
    x->running[0] = 0;
    pthread_mutex_unlock(&x->mu);
  }
  agent__sums sums = {0};
  char cerr[512] = "";
  int whole = agent__whole_wanted(x->plan, cmd->rank);
  int crc = x->done(x->ud, x->plan, rc == 0, whole ? &sums.whole : NULL, cerr, sizeof cerr);
  x->begun = 0;
  if (!rc && !crc) crc = agent__plan_sums(x, cmd->rank, &sums, cerr, sizeof cerr);
  if (rc) {
    snprintf(msg, sizeof msg, "%s: %s", bcast_strerror(rc), be.msg);
    /* A cancelled plan was aborted by the orchestrator: expected, not a fault. */
    if (rc == BCAST_ECANCELED) agent_log_info("broadcast_cancelled", "plan_id=%s error=\"%s\"", id, msg);
    else agent_log_error("broadcast_failed", "plan_id=%s error=\"%s\"", id, msg);
  } else if (crc) {
    snprintf(msg, sizeof msg, "%s", cerr);
    agent_log_error("broadcast_checksum_failed", "plan_id=%s error=\"%s\"", id, msg);
  } else {
    msg[0] = 0;
    /* A part's holder (a source of several, a receiver of a view) has no
     * whole checksum: its first plan sum says what it holds. */
    uint64_t shown = sums.whole ? sums.whole : sums.per_src ? sums.per_src[0] : 0;
    agent_log_info("broadcast_done", "plan_id=%s transport=%s seconds=%.3f gbps=%.2f exposed_s=%.3f checksum=%016llx "
             "view=%s", id, st.transport ? st.transport : "?", st.total_s, st.gbps, st.exposed_s,
             (unsigned long long)shown, bcast_plan_rank_view(x->plan, cmd->rank) == BCAST_VIEW_WHOLE ? "whole" : "part");
  }
  Rlorch__V1__StepRecord *rec = agent_pb_record(rc ? NULL : &st, x->plan);
  agent__done(a, id, msg, rec, &sums);
  free(sums.per_src);
  free(sums.per_view);
  agent_pb_record_free(rec);
  bcast_stats_free(&st);
  agent__drop_plan(x);
}

void agent_xfer_on_abort(agent_xfer *x, const Rlorch__V1__Command *cmd) {
  const char *id = cmd->abort->plan_id ? cmd->abort->plan_id : "";
  const char *why = cmd->abort->reason ? cmd->abort->reason : "";
  /* An abort of a rollout request names no plan: it must not drop this one. */
  if (!id[0] && cmd->abort->request_id) return;
  if (x->plan && (!id[0] || !strcmp(id, x->plan->id))) {
    agent_log_info("plan_aborted", "plan_id=%s reason=\"%s\"", x->plan->id, why);
    agent__drop_plan(x);
  } else {
    agent_log_debug("abort_ignored", "plan_id=%s reason=\"%s\"", id, why);
  }
}
