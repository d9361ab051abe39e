/* The runner: the shell around the scheduler core of the active run (one at a
 * time). It feeds the scheduler events (from the Worker API, the Control API
 * and its timer) and turns the actions that come out into commands on the
 * workers' Attach streams, broadcast plans built from the trainer's manifest,
 * SQLite step and run records, WatchRun events and metrics. It knows neither
 * API: both call it. Loop thread only. */
#ifndef RLORCH_DAEMON_RUNNER_H
#define RLORCH_DAEMON_RUNNER_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/daemon/orch.h"
#include "orchestrator/daemon/workers.h"
#include "orchestrator/sched/sched.h"
#include "rlorch/v1/control.pb-c.h"
#include "rlorch/v1/worker.pb-c.h"

typedef struct runner runner;

/* Uses o's loop, config, store, metrics, worker table and watch hub, which
 * must outlive it. 0, or -1 out of memory. */
int runner_new(orch *o, runner **out);
void runner_free(runner *r); /* NULL is fine; call runner_shutdown first */
/* The daemon goes away: the active run is left as it is in the store (its
 * message says why; the next daemon resumes it), the workers' command streams
 * end UNAVAILABLE without telling them to leave, the timer closes. Safe to
 * call twice. */
void runner_shutdown(runner *r);

/* ---- the Control API's side ---- */
/* Becomes the active run (takes ownership of run). A refusal returns -1 with
 * a message; a run the scheduler refuses is stored FAILED and freed. */
int runner_start(runner *r, Rlorch__V1__Run *run, char *err, size_t errlen);
/* At start-up, before any worker registers: the run the previous daemon left
 * active (a crash or a restart) becomes the active run again, carrying on
 * after its last step record (see sched.h "Resume": the trainer must hold the
 * committed version, or the next). One that was stopping is STOPPED; one
 * whose last step was its last is SUCCEEDED; one that cannot be resumed is
 * FAILED saying why. Runs already final are not touched. */
void runner_resume(runner *r);
/* Whether trainer w can serve a run of `spec`: the preset and offload state the
 * spec names (empty / UNSPECIFIED: any) must be what w's manifest holds, since
 * the trainer's weights come from its own settings. 0, or -1 with a message
 * naming the field, the worker and the flag that would fix it. Any other role: 0. */
int runner_admits(const Rlorch__V1__RunSpec *spec, const workers_entry *w, char *err,
                  size_t errlen);
const Rlorch__V1__Run *runner_active(const runner *r); /* or NULL */
int runner_stop(runner *r, const char *run_id, const char *reason, char *err, size_t errlen);
int runner_set_policy(runner *r, const char *run_id, Rlorch__V1__BroadcastMode p, char *err,
                      size_t errlen);

/* ---- the Worker API's side ----
 * A worker's life; each of these also runs the actions it causes. */
void runner_worker_registered(runner *r, workers_entry *w);
void runner_worker_attached(runner *r, workers_entry *w); /* after workers_attach */
/* Its command stream closed (process gone, network cut): it is lost now, not
 * after a heartbeat timeout. The stream must be detached already. */
void runner_worker_stream_closed(runner *r, workers_entry *w);
/* Lost now, for `reason` (a trainer that registered again replaced it): the
 * run treats it as a worker whose stream closed; its stream is ended. */
void runner_worker_lost(runner *r, workers_entry *w, const char *reason);

/* Reports, fed to the scheduler when the worker is in the active run (0
 * otherwise). They return 0 or a negative SCHED_E* code (message:
 * runner_last_error) and run no actions: the caller answers the report, then
 * calls runner_drain, so that the answer goes out before the commands it
 * causes. */
/* `run_id`: the run policy_version counts steps of ("": the active one's). */
int runner_heartbeat(runner *r, workers_entry *w, uint64_t policy_version, const char *run_id);
/* A worker's rollouts (checked by rollout_check): kept whole for the batch,
 * handed to the scheduler. SCHED_ENOMEM when they cannot be kept. */
int runner_rollouts_done(runner *r, workers_entry *w, const Rlorch__V1__RolloutResult *res);
/* A worker's rollouts that rollout_check refused (the caller answered the
 * report): the request is closed and its group sent again, as for a report
 * the runner or the scheduler refuses. Runs no actions either. */
void runner_rollouts_refused(runner *r, workers_entry *w, uint64_t request_id);
/* The trainer finished `step`; its manifest (workers_set_manifest) is current.
 * `nccl_id` of the engine's size replaces the NCCL id the next plans carry. */
int runner_step_done(runner *r, workers_entry *w, uint64_t step, double train_seconds,
                     const uint8_t *nccl_id, size_t nccl_len);
/* `coloc`/`coloc_len`: a colocated receiver's export (PlanAck.colocated_export),
 * kept for the trainer's trigger; NULL/0 otherwise. */
int runner_plan_acked(runner *r, workers_entry *w, const char *plan_id, uint64_t hash,
                      const char *error, const uint8_t *coloc, size_t coloc_len);
int runner_broadcast_done(runner *r, workers_entry *w, const char *plan_id, const char *error,
                          const sched_bcast_report *report);
const char *runner_last_error(const runner *r); /* "" without an active run */

/* ---- the held batch, for FetchBatch ----
 * The batch of the step the trainer executes is held from its TRAIN command
 * (which carries its ids, groups and size) until the trainer reports the step
 * done, the step is trained again, the trainer is lost or the run ends; its
 * rollouts stay in the store meanwhile and count against
 * rollout_buffer_bytes. A trainer rank reads its share of it, in batch order,
 * a rollout at a time, at its own pace: the share stays valid while the
 * batch is held and is refused (not freed memory) afterwards. */
typedef struct runner_share {
  uint64_t gen;        /* which held batch it was cut from */
  uint64_t step;
  size_t first, end;   /* rollouts [first, end) of the batch, in batch order */
  uint32_t groups;     /* whole groups in it */
  uint64_t bytes;      /* packed sizes of its rollouts summed */
} runner_share;

/* Cuts trainer w's share `rank` of `ranks` (0 or 1: the whole batch) of
 * step's batch: the groups split in batch order into `ranks` contiguous runs
 * as even as whole groups allow (rank r gets groups [r G/ranks, (r+1) G/ranks)).
 * 0, or SCHED_ESTATE (no active run; w is not its trainer; step's batch is not
 * held) or SCHED_EINVAL (rank not below ranks) with the message in err. */
int runner_batch_share(runner *r, const workers_entry *w, uint64_t step, uint32_t rank,
                       uint32_t ranks, runner_share *out, char *err, size_t errlen);
/* Rollout i (s->first <= i < s->end) of the share, valid until the runner is
 * next entered, and its packed size. 0; SCHED_ESTATE once the batch is no
 * longer held (err says why: the step done, the run ended, ...); SCHED_ENOENT
 * when the rollout is missing from the store (act_train logged it);
 * SCHED_EINVAL for an index outside the share. */
int runner_batch_rollout(runner *r, const runner_share *s, size_t i, const Rlorch__V1__Rollout **out,
                         size_t *bytes, char *err, size_t errlen);
/* Executes every pending scheduler action. */
void runner_drain(runner *r);

#endif
