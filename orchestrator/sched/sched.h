/* The scheduler core: one pure state machine per run.
 *
 * Events go in (a worker registered, attached, sent a heartbeat or was lost;
 * rollouts arrived; the trainer finished a step; a plan was built, acked,
 * broadcast; the operator changed the policy or asked to stop; a timer fired),
 * actions come out (dispatch a group, cancel a request, start a train step,
 * build and send a plan, trigger it, abort it, commit a step record, report
 * state changes).
 *
 * Nothing here reads a clock, opens a socket or touches CUDA: every event
 * carries `now_ms`, a monotonic millisecond clock chosen by the caller (its
 * origin does not matter; it must never go backwards, so wall-clock time is
 * unfit). An event whose `now_ms` is before the previous event's is refused
 * with SCHED_EINVAL and changes nothing. After every event the caller takes
 * the actions it produced with sched_take_actions() (it then owns them); it
 * calls sched_tick() no later than sched_next_deadline().
 *
 * The step, as seen from here (policy version v = steps committed so far):
 *   groups(v) -> batch n -> TRAIN n -> step done -> BUILD_PLAN "RUN/step-n"
 *   -> plan built (hash) -> every participant acks (same id, same hash)
 *   -> TRIGGER -> every participant reports broadcast done -> COMMIT, v = n+1.
 *
 * Groups. One request asks one inference worker for one whole group:
 * group_size completions of one prompt, all carrying the request's group id
 * (new groups are numbered from 1). A result must hold exactly group_size
 * rollouts of that group. Batches are made of whole groups (GRPO takes its
 * baselines per group): the batch of step n takes rollouts_per_step /
 * group_size groups. A group's version is the oldest policy_version among its
 * rollouts (a worker may receive weights mid-request); a group is stale for
 * step n when its version < n - max_async_level and is then dropped whole,
 * counted in rollouts. The batch takes the oldest valid groups first (by
 * version, then arrival); TRAIN lists them group after group, each group's
 * rollouts in the order they were reported.
 *
 * Dispatch asks only for what those batches can use: a group goes to the
 * least loaded inference worker (at most its cap in flight: max_outstanding,
 * or the worker's max_concurrent_requests when lower) while the rollouts
 * buffered and in flight, counted by the version each carries (a request's:
 * the version its worker held when it was sent), leave room for a whole group
 * in steps next .. v + max_async_level (rollouts_per_step each; none past the
 * run's last step), filled earliest deadline first. So with on-time workers
 * nothing is dropped; a group goes stale only by arriving late or old.
 * max_buffered caps the total (rollouts buffered plus requested) on top of
 * that. Order of dispatch: groups waiting to be re-sent first (oldest first),
 * then second requests for slow groups, then new groups.
 *
 * Re-sending. A group is wanted until one whole valid answer for it is
 * buffered; the scheduler re-sends it, keeping its group id, when
 *   - its worker is lost, or its worker's report is refused (SCHED_EINVAL,
 *     or by the caller: sched_rollouts_refused),
 *     and no other request for it is in flight: the group waits in the re-send
 *     queue and goes to the next worker with room (another worker than the
 *     one whose report was refused, when one has room; counted in
 *     groups_requeued);
 *   - request_timeout_ms > 0 and its only request in flight has been out that
 *     long since dispatch (sched_tick fires it): a second request for the
 *     same group goes to another attached inference worker with a free slot
 *     and a version the window can use (not the same worker; counted in
 *     groups_resent). It needs no room in the window (its group is already
 *     counted) but does need room under max_buffered. While a slow request
 *     has no such worker, each later dispatch tries again; if its second
 *     request is refused or lost, it is alone and slow again and gets
 *     another.
 * A group has at most two requests in flight. The first whole valid answer is
 * kept; the group's other request is cancelled at once (a CANCEL action; its
 * slot is free; counted in requests_cancelled), and a result for it that
 * still arrives returns SCHED_ESTALE and changes nothing. Window accounting
 * with two requests for a group: each counts its group_size rollouts at its
 * own version, in the window and under max_buffered alike. That never asks
 * for more than the batches can use; while the second request is in flight,
 * dispatch may ask for up to one group less than it could.
 *
 * Failure policy. A participant that refuses the plan or acks another hash,
 * an ack or broadcast timeout, a broadcast error, or a policy override the
 * participants cannot run: the plan is aborted and the run FAILS with a
 * message naming the worker or the missing capability (the step is not
 * committed; nothing is retried silently). A worker LOST while a plan is
 * pending: the plan is aborted; an inference worker's loss re-plans the same
 * step without it (PENDING if none is left, until one attaches); the
 * trainer's loss (any rank of its group) sends the run back to PENDING until
 * a trainer attaches that holds the committed version (the step is redone
 * with a fresh batch) or the next (the step it trained is planned; see
 * "Resume"). Groups in flight on a lost worker are
 * re-sent (above); its results already received stay usable. A broadcast
 * error is held before it fails the run, since it is often the echo of a
 * peer's death or hang: until every participant has been heard from since the
 * error, and SCHED__PEER_GRACE_MS (3 s) at least, or until a silent one is
 * lost (at most heartbeat_timeout_ms: a re-plan instead).
 *
 * Versions and catch-up. The published version is the number of steps
 * committed. An inference worker is dispatched rollouts only once it is known
 * to hold the published version ("synced"): when it registers saying it holds
 * it, or when a plan that included it committed. One that registers holding
 * another (it joined late, came back after a gap, or the run was resumed) is
 * sent a catch-up plan before anything else: when no step can start, the
 * trainer broadcasts the weights it holds, version v unchanged, to the
 * attached workers that are not synced ("RUN/step-v-catchup", then
 * "-catchup-2", ...; on the host transport, which needs no NCCL communicator:
 * only a train step makes one). A catch-up commits no step: it emits
 * CAUGHT_UP. It fails and is aborted like any plan, and a lost participant
 * sends the scheduler back to idle, from where it catches up whoever is
 * left. A step's own plan catches up every attached worker it includes.
 *
 * Resume. A run the orchestrator reloads after a restart carries its
 * committed steps (settings.steps_done) and the number of that resume
 * (settings.resumes). Its trainer keeps the weights and optimizer state in
 * its own process, so it says at registration which version it holds: the
 * committed one, and the run carries on at step steps_done after a catch-up
 * of every inference worker (none of them is trusted until a plan after the
 * resume verified it); or one more, because it trained step steps_done and
 * the broadcast never committed, and that step's plan goes out first; any
 * other fails the run, naming both versions (a trainer that restarted
 * without a checkpoint holds 0). The same holds for a trainer that joins any
 * run later. Plan ids of the step in progress at the resume carry
 * "-resumeK", and request and group ids of resume K start at K * 2^40 + 1,
 * so nothing sent before the restart is taken for something sent after: a
 * result for an older request is SCHED_ESTALE.
 *
 * Trainer groups. A trainer of N ranks (FSDP, ZeRO: each rank holds a shard
 * of every parameter) registers one worker per rank, each saying its rank r
 * and the group size N in sched_caps (trainer_rank, trainer_ranks; 0 ranks
 * counts as 1: today's lone trainer, whose actions and messages are
 * unchanged). The group is the live trainers; the first one to register
 * while none is live sets N. Refused, with a message naming the field:
 * trainer_ranks over SCHED_MAX_TRAINER_RANKS, a rank >= N, or an N other
 * than the live group's (SCHED_EINVAL); a second live trainer of a rank
 * already held (SCHED_EEXIST). The run trains only while ranks 0..N-1 are
 * all attached; until then its message says what it waits for ("1 of 2
 * trainer ranks attached (rank 1 missing)").
 *   - Steps: TRAIN goes to every rank (one action each, rank order, the same
 *     step and batch; the action says trainer_rank and trainer_ranks, so that
 *     the shell tells each rank which share to fetch). The step is trained
 *     once every rank reported it done (train_seconds: the slowest rank's).
 *     A rank that reports another step than the one training, ahead of it,
 *     fails the run naming both ranks and steps (a lone trainer's report of
 *     that kind is refused with SCHED_EINVAL, as it always was); a repeat is
 *     SCHED_ESTALE.
 *   - Versions: every rank must hold the same version. At registration each
 *     rank's version is checked as a lone trainer's (the published one or
 *     the next, else the run fails naming both). A rank holds the next
 *     version when it registered with it or reported step steps_done while
 *     no step trains (the resume/redo case: the group trained the step on a
 *     batch from before a restart or a loss). The group adopts that step
 *     (plans it as trained, train_seconds the slowest report's) once every
 *     rank holds the next version; a catch-up not yet triggered is aborted
 *     at the first such report. While some ranks hold the next version and
 *     others the published one, no step or catch-up starts; the group may be
 *     whole and disagree for heartbeat_timeout_ms at most (a rank registers
 *     before it reports the step it was still training when the
 *     orchestrator restarted), then the run fails naming the ranks and their
 *     versions: an FSDP step is collective, the ranks finish it together or
 *     not at all.
 *   - Plans: the participants are the trainer ranks first, in rank order
 *     (plan ranks 0..N-1 are the sources), then the receivers; plan actions
 *     say trainer_ranks. Catch-ups the same. sched_choose_mode reads N from
 *     parts[0].caps.trainer_ranks: several sources run on the host transport
 *     only (auto picks it; an override to another mode fails the run).
 *   - Verification: each source reports the checksum of its own shard
 *     (sched_bcast_report.weights_checksum, or the one its step done gave,
 *     sched_shard_step_done, when the report has none; both given and
 *     different: the step is not verified). Each receiver reports one
 *     checksum per source (source_checksums); weights_verified = every
 *     receiver reported, for every source, that source's checksum. With one
 *     source the receiver's weights_checksum serves, as before. A receiver
 *     that holds part of the model (a view, sched_plan_views) is compared
 *     with each source's checksum of that view instead.
 *   - Figures: the step record sums bytes and buckets over the sources, takes
 *     each time as the slowest source's, the transport from rank 0, gbps as
 *     the summed wire bytes over the slowest total; `sources` says how many.
 *   - Losses: a rank lost is the group's trainer lost (see "Failure
 *     policy"): a pending plan is aborted, the step is redone with a fresh
 *     batch once the group is whole again at the published version, or
 *     planned again if every rank comes back holding the next; ranks that
 *     disagree then fail the run as above. The run waits, naming the ranks
 *     missing. A resumed run's group must come back whole the same way.
 *
 * Errors are negative SCHED_E* codes; sched_last_error() tells which field or
 * worker was at fault. A rejected event changes nothing unless its doc says so
 * (its `now_ms`, if not refused itself, still counts as the latest time seen).
 * Memory: sched_new allocates; registrations, rollouts and actions may grow
 * internal arrays geometrically (SCHED_ENOMEM if that fails). Not thread-safe:
 * one owner (the loop thread) calls everything. */
#ifndef RLORCH_SCHED_H
#define RLORCH_SCHED_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ---------------------------------------------------------------- */
enum {
  SCHED_OK = 0,
  SCHED_EINVAL = -1,  /* bad argument or malformed report (message names the field) */
  SCHED_ENOENT = -2,  /* unknown worker or request */
  SCHED_ESTATE = -3,  /* not valid in the current run, step or worker state */
  SCHED_ESTALE = -4,  /* refers to an old plan, request or step: ignored, harmless */
  SCHED_EEXIST = -5,  /* worker id already registered, or a second live trainer of a rank */
  SCHED_ENOMEM = -6,  /* allocation failed */
  SCHED_ENOTSUP = -7  /* the broadcast mode cannot run on these participants */
};
const char *sched_strerror(int code);

/* ---- enums (values equal the rlorch.v1 protobuf enums) --------------------- */
typedef enum {
  SCHED_MODE_AUTO = 1,
  SCHED_MODE_DIRECT = 2,
  SCHED_MODE_STAGED = 3,
  SCHED_MODE_HOST = 4,
  SCHED_MODE_COLOCATED = 5 /* every receiver on the trainer's GPU: CUDA IPC, no NCCL */
} sched_mode;
#define SCHED_MODE_COUNT 6 /* array size for per-mode counters, indexed by mode */

typedef enum {
  SCHED_RUN_PENDING = 1,
  SCHED_RUN_RUNNING = 2,
  SCHED_RUN_STOPPING = 3,
  SCHED_RUN_STOPPED = 4,
  SCHED_RUN_SUCCEEDED = 5,
  SCHED_RUN_FAILED = 6
} sched_run_state;

typedef enum { SCHED_ROLE_TRAINER = 1, SCHED_ROLE_INFERENCE = 2 } sched_role;

/* Why a plan was aborted (SCHED_ACT_ABORT), for the metrics. */
typedef enum {
  SCHED_ABORT_ERROR = 1,        /* a participant's broadcast error; a plan that could
                                   not be built; the shell failed the run */
  SCHED_ABORT_ACK_TIMEOUT,      /* not built or not acked by everyone in time */
  SCHED_ABORT_BROADCAST_TIMEOUT,
  SCHED_ABORT_PARTICIPANT_LOST, /* a participant's heartbeats or stream stopped */
  SCHED_ABORT_REFUSED,          /* a participant refused the plan or acked another
                                   hash; the mode cannot run on the participants */
  SCHED_ABORT_STOP              /* the run is stopping */
} sched_abort_reason;
#define SCHED_ABORT_COUNT 7 /* array size, indexed by reason */

typedef enum {
  SCHED_WORKER_REGISTERED = 1, /* known, no command stream yet */
  SCHED_WORKER_READY = 2,      /* attached and idle */
  SCHED_WORKER_BUSY = 3,       /* attached, executing a command */
  SCHED_WORKER_LOST = 4        /* heartbeats stopped or stream closed; terminal for the id
                                  (until sched_worker_forget drops it) */
} sched_worker_state;

const char *sched_mode_name(sched_mode m);            /* "auto", "direct", "staged", "host", "colocated" */
int sched_mode_parse(const char *s, sched_mode *out);  /* 0 or SCHED_EINVAL */
const char *sched_run_state_name(sched_run_state s);   /* "pending", "running", ... */
const char *sched_worker_state_name(sched_worker_state s);
const char *sched_role_name(sched_role r);
const char *sched_abort_reason_name(sched_abort_reason r); /* "error", "ack_timeout",
                                  "broadcast_timeout", "participant_lost", "refused", "stop" */

/* ---- sizes ----------------------------------------------------------------- */
#define SCHED_RUN_ID_MAX 64   /* run id, NUL included */
#define SCHED_NAME_MAX 64     /* worker name, NUL included */
#define SCHED_PLAN_ID_MAX 128 /* "RUN/step-N[-resumeK][-rA | -catchup[-C]]", NUL included */
#define SCHED_TEXT_MAX 256    /* reasons and messages, NUL included */
#define SCHED_GPU_UUID_MAX 48 /* "GPU-" and 36 characters, NUL included, with room */
#define SCHED_HOST_ID_MAX 64  /* a boot id (36) or a host name, NUL included */
#define SCHED_NEVER INT64_MAX /* sched_next_deadline() with nothing to wait for */
#define SCHED_MAX_TRAINER_RANKS 1024 /* ranks of one trainer group at most */

/* ---- settings of one run ----------------------------------------------------- */
typedef struct sched_settings {
  char run_id[SCHED_RUN_ID_MAX];  /* non-empty; prefixes plan ids */
  uint64_t steps;                 /* steps to take; 0: until stopped */
  uint32_t rollouts_per_step;     /* batch size in rollouts, >= 1, a multiple of group_size */
  uint32_t group_size;            /* rollouts per group = per request, >= 1 */
  uint32_t max_async_level;       /* off-policy bound */
  uint32_t max_outstanding;       /* K: outstanding requests per inference worker, >= 1 */
  uint32_t max_buffered;          /* hard cap on rollouts buffered + requested; 0: default
                                     2 * rollouts_per_step * (max_async_level + 1) */
  int64_t request_timeout_ms;     /* a group's only request out this long is sent to
                                     another worker too, >= 0; 0: never re-send */
  sched_mode policy;              /* initial broadcast policy */
  int64_t plan_ack_timeout_ms;    /* build request/plan built -> every ack, > 0 */
  int64_t broadcast_timeout_ms;   /* trigger -> every broadcast done, > 0 */
  int64_t heartbeat_timeout_ms;   /* silence after which a worker is lost, > 0 */
  uint64_t steps_done;            /* a resumed run: the steps it committed before; it
                                     carries on at this step (below `steps` if set) */
  uint32_t resumes;               /* a resumed run: which resume this is (1, 2, ...);
                                     0: a new run, whose steps_done is 0 */
} sched_settings;

/* Defaults: run "run", steps 0, 8 rollouts per step, groups of 1, async 1,
 * K 8, policy auto, timeouts 30 s ack, 300 s broadcast, 15 s heartbeat, no
 * request timeout. */
void sched_settings_default(sched_settings *s);
/* 0, or SCHED_EINVAL with a message naming the field in `err`. */
int sched_settings_validate(const sched_settings *s, char *err, size_t errlen);

/* ---- what the scheduler keeps about workers ------------------------------------ */
typedef struct sched_caps {
  uint32_t cuda_devices;       /* 0: no CUDA on this worker */
  int nccl;                    /* non-zero when NCCL is present */
  uint64_t pinned_limit_bytes; /* host memory it may pin */
  uint32_t max_concurrent_requests; /* inference: requests it serves at once; 0: no limit
                                       of its own (max_outstanding applies either way) */
  char gpu_uuid[SCHED_GPU_UUID_MAX]; /* GPU it uses ("GPU-..."); "" without one */
  char host_id[SCHED_HOST_ID_MAX];   /* machine it runs on; "" when it did not say */
  /* Trainer only (see "Trainer groups"): its rank and the group's size; 0
   * ranks is a lone trainer, stored as 1. Ignored for inference workers. */
  uint32_t trainer_rank;
  uint32_t trainer_ranks;
  /* Inference only: it holds part of the model (RegisterRequest.parts), which
   * only the host transport delivers (see sched_choose_mode). */
  int holds_part;
} sched_caps;

/* Offload summary of the trainer's manifest: where its tensors live. */
typedef struct sched_offload {
  uint32_t gpu_tensors, pinned_tensors, pageable_tensors;
  uint64_t gpu_bytes, pinned_bytes, pageable_bytes;
} sched_offload;

typedef struct sched_worker_info {
  uint32_t id;
  sched_role role;
  sched_worker_state state;
  char name[SCHED_NAME_MAX];
  sched_caps caps;
  sched_offload offload;   /* trainer: latest manifest summary */
  uint32_t outstanding;    /* inference: rollout requests in flight (cancelled ones not) */
  uint64_t policy_version; /* inference: version it holds; trainer: last produced */
  int synced;              /* inference: known to hold the published version, so it
                              may be dispatched (see "Versions and catch-up") */
  int64_t last_seen_ms;    /* last heartbeat or report */
} sched_worker_info;

/* ---- the step record (maps 1:1 onto rlorch.v1.StepRecord, minus bucket timings) -- */
typedef struct sched_step_record {
  char run_id[SCHED_RUN_ID_MAX];
  uint64_t step;
  sched_mode mode;
  char mode_reason[SCHED_TEXT_MAX];
  char transport[16];            /* "nccl", "host-tcp", "host-tls", "cuda-ipc": the sender's */
  uint64_t pcie_bytes, wire_bytes;
  double h2d_seconds, cast_seconds, wire_seconds, total_seconds;
  double exposed_staging_seconds;
  int exposed_measured;
  double gbps;                   /* wire_bytes / total_seconds / 1e9 */
  double train_seconds;
  uint32_t rollouts_used, rollouts_dropped;
  double step_seconds;           /* TRAIN action -> last broadcast done */
  double staging_share;          /* exposed_staging_seconds / step_seconds */
  uint64_t policy_version;       /* after the broadcast: step + 1 */
  uint32_t buckets;
  int64_t finished_unix_ms;      /* 0 here: the scheduler's clock is not wall time, so
                                    the caller stamps the commit's Unix time */
  int weights_verified;          /* every receiver reported every source's checksum */
  uint32_t receivers;            /* inference workers in the plan */
  uint32_t sources;              /* trainer ranks that sent (1: a lone trainer) */
} sched_step_record;

/* What a participant reports with broadcast done. Only the sources' figures
 * go into the step record; receivers may pass NULL (then the step's weights
 * are not verified) or only their checksums. A source's `weights_checksum` is
 * that of its own shard. A receiver of a plan of S sources gives
 * `source_checksums[0..S)` (its checksum of source j's slices; the caller
 * owns the array for the call), or none: with S = 1 its `weights_checksum`
 * then serves. Any other count is SCHED_EINVAL. */
typedef struct sched_bcast_report {
  char transport[16];
  uint64_t pcie_bytes, wire_bytes;
  double h2d_seconds, cast_seconds, wire_seconds, total_seconds;
  double exposed_staging_seconds;
  int exposed_measured;
  double gbps; /* 0: computed from wire_bytes and total_seconds */
  uint32_t buckets;
  uint64_t weights_checksum; /* 0: not computed */
  const uint64_t *source_checksums; /* receiver: one per source rank; 0: not computed */
  uint32_t nsource_checksums;
  /* Source of a plan with receiver views (sched_plan_views): its checksum of
   * what each view's receivers get from it, nviews of them (the caller owns
   * the array for the call), or none. Any other count is SCHED_EINVAL. */
  const uint64_t *view_checksums;
  uint32_t nview_checksums;
} sched_bcast_report;

/* One rollout as an inference worker reports it. Ids are unique within a run. */
typedef struct sched_rollout {
  uint64_t id;
  uint64_t policy_version;
  uint32_t tokens;
  uint64_t group_id; /* the group of the request it answers */
} sched_rollout;

/* ---- actions --------------------------------------------------------------------- */
typedef enum {
  SCHED_ACT_DISPATCH = 1,    /* send RolloutRequest{request_id, count, group_id} to `worker` */
  SCHED_ACT_TRAIN,           /* send TrainStep{step, rollout_ids} to the trainer `worker`,
                                rank `trainer_rank` of `trainer_ranks`: one per rank */
  SCHED_ACT_BUILD_PLAN,      /* build plan `plan_id` in `mode` for `participants`
                                (rank i = participants[i]; the trainer ranks are
                                ranks 0..trainer_ranks-1, the sources), send it to
                                all of them, then call sched_plan_built() */
  SCHED_ACT_TRIGGER,         /* send TriggerBroadcast{plan_id, hash} to `participants` */
  SCHED_ACT_ABORT,           /* send AbortCommand{plan_id, text} to `participants` */
  SCHED_ACT_COMMIT,          /* store and publish `record` */
  SCHED_ACT_RUN_STATE,       /* the run entered `run_state`; `text` says why */
  SCHED_ACT_WORKER_STATE,    /* `worker` entered `worker_state`; `text` says why */
  SCHED_ACT_CANCEL,          /* send AbortCommand{request_id, text} to `worker`: its group
                                `group_id` was answered by another request */
  SCHED_ACT_CAUGHT_UP        /* catch-up plan `plan_id` finished: `participants` (rank
                                order, trainer ranks first) hold `policy_version`; `record`
                                has its figures (nothing to store as a step) */
} sched_action_kind;

typedef struct sched_action {
  sched_action_kind kind;
  uint32_t worker;            /* DISPATCH, TRAIN, WORKER_STATE, CANCEL */
  uint64_t step;              /* TRAIN, BUILD_PLAN, TRIGGER, ABORT, COMMIT, CAUGHT_UP */
  uint64_t request_id;        /* DISPATCH, CANCEL */
  uint64_t group_id;          /* DISPATCH, CANCEL: the group; a re-sent group keeps its id */
  uint32_t count;             /* DISPATCH: rollouts asked for, always group_size */
  uint64_t policy_version;    /* DISPATCH: version the scheduler believes the worker
                                 holds; BUILD_PLAN: version the plan publishes (a
                                 catch-up's: the published one); CAUGHT_UP: the same */
  int catchup;                /* BUILD_PLAN, TRIGGER, ABORT, CAUGHT_UP: the plan is a
                                 catch-up, not a step's broadcast */
  const uint64_t *rollout_ids; /* TRAIN: the batch, whole groups oldest first, each
                                  group's rollouts in report order */
  size_t nrollouts;
  uint32_t ngroups;           /* TRAIN: groups in the batch (nrollouts / group_size) */
  uint64_t batch_tokens;      /* TRAIN: sum of the batch's tokens */
  const uint32_t *participants; /* BUILD_PLAN, TRIGGER, ABORT, CAUGHT_UP: worker ids by rank */
  size_t nparticipants;
  sched_mode mode;            /* BUILD_PLAN */
  uint64_t plan_hash;         /* TRIGGER */
  char plan_id[SCHED_PLAN_ID_MAX]; /* BUILD_PLAN, TRIGGER, ABORT */
  char text[SCHED_TEXT_MAX];  /* BUILD_PLAN: mode reason; ABORT, CANCEL: reason;
                                 RUN_STATE, WORKER_STATE: why */
  sched_run_state run_state;  /* RUN_STATE */
  sched_worker_state worker_state; /* WORKER_STATE */
  const sched_step_record *record; /* COMMIT; CAUGHT_UP (its figures only) */
  sched_abort_reason abort_reason; /* ABORT */
  uint32_t trainer_rank;      /* TRAIN: the rank this action goes to */
  uint32_t trainer_ranks;     /* TRAIN: the group's size; BUILD_PLAN, TRIGGER, ABORT,
                                 CAUGHT_UP: the sources, the first participants (an
                                 ABORT lists the live ones only) */
} sched_action;

/* Actions moved out of the scheduler: `actions[0..n)` in the order they were
 * produced. The batch owns them and everything they point to (rollout_ids,
 * participants, record), so they stay valid while the caller feeds the
 * scheduler more events, until sched_action_batch_free(). */
typedef struct sched_action_batch {
  sched_action *actions;
  size_t n;
  /* Private: the storage the actions point into. */
  uint32_t *ids_;
  uint64_t *rollouts_;
  sched_step_record *records_;
} sched_action_batch;

/* ---- counters the caller exports as metrics --------------------------------------- */
typedef struct sched_counters {
  uint64_t rollouts_received;   /* accepted from workers */
  uint64_t rollouts_used;       /* in committed steps */
  uint64_t rollouts_dropped_stale;
  uint64_t steps;               /* committed */
  uint64_t broadcasts[SCHED_MODE_COUNT]; /* committed, by mode (index: sched_mode) */
  uint64_t aborts;              /* plans aborted, any reason */
  uint64_t catchups;            /* catch-up plans finished */
  uint64_t requests_dispatched; /* every DISPATCH, re-sends included */
  uint64_t groups_requeued;     /* put in the re-send queue: worker lost, report refused */
  uint64_t groups_resent;       /* second requests for slow groups */
  uint64_t requests_cancelled;  /* CANCEL actions: their group was answered elsewhere */
  int64_t async_level;          /* last batch: step - oldest group version used */
  uint64_t policy_version;      /* published: steps committed */
  uint32_t rollouts_buffered;   /* received, not yet used or dropped */
  uint32_t rollouts_requested;  /* asked for, not yet received (both requests of a
                                   re-sent group count) */
  uint32_t requests_in_flight;  /* dispatched, not yet answered, refused, cancelled or lost */
  uint64_t aborts_by_reason[SCHED_ABORT_COUNT]; /* `aborts`, by sched_abort_reason */
} sched_counters;

typedef struct sched_run_info {
  sched_run_state state;
  char message[SCHED_TEXT_MAX];  /* why it is in that state */
  sched_mode policy;             /* in force */
  uint64_t steps_done;
  uint64_t policy_version;
  uint32_t trainers, inference;  /* attached and not lost */
} sched_run_info;

/* ---- the scheduler ----------------------------------------------------------------- */
typedef struct sched sched;

/* Validates and copies `settings`; 0 or a negative code with `err` filled. */
int sched_new(const sched_settings *settings, sched **out, char *err, size_t errlen);
void sched_free(sched *s); /* NULL is fine */

/* Message of the last rejected call (empty after a successful one). */
const char *sched_last_error(const sched *s);

/* Moves every action produced since the last take into `out` (overwritten:
 * free a previous batch first) and returns their count; the scheduler holds
 * none afterwards. With none pending `out` is empty and nothing is allocated. */
size_t sched_take_actions(sched *s, sched_action_batch *out);
/* Frees what the batch owns and leaves it empty; an empty or zeroed batch is
 * fine, and so is freeing twice. */
void sched_action_batch_free(sched_action_batch *b);

/* Earliest time the caller must call sched_tick() (SCHED_NEVER: none): plan
 * deadlines, heartbeat timeouts and request timeouts. */
int64_t sched_next_deadline(const sched *s);

/* ---- events ------------------------------------------------------------------------ */
/* A worker introduced itself. `name` appears in messages ("inference-2"); empty or
 * NULL gives "worker-<id>". The trainer passes its manifest summary (NULL: empty).
 * `policy_version`: the version of this run it says it holds (the shell passes 0
 * for a worker that holds another run's, or none). An inference worker holding
 * the published one is synced at once, another waits for a catch-up; a trainer
 * must hold the published one or the next (see "Resume"), or the run fails.
 * A lost id may register again; a live one is SCHED_EEXIST, as is a second live
 * trainer of a rank already held. A trainer gives its rank and its group's
 * size in `caps` (see "Trainer groups", which also says what is refused). */
int sched_worker_registered(sched *s, int64_t now_ms, uint32_t id, sched_role role,
                            const char *name, const sched_caps *caps,
                            const sched_offload *offload, uint64_t policy_version);
/* Its command stream opened: REGISTERED -> READY. */
int sched_worker_attached(sched *s, int64_t now_ms, uint32_t id);
/* Proof of life; `policy_version` is the version an inference worker holds
 * (ignored for the trainer; an older one than already known changes nothing:
 * it was read before a broadcast landed). A synced worker's version newer than
 * any broadcast gave it is SCHED_EINVAL, but still counts as proof of life; a
 * worker not synced may hold anything (another run's, a version from before a
 * restart) and is only recorded. */
int sched_worker_heartbeat(sched *s, int64_t now_ms, uint32_t id, uint64_t policy_version);
/* Stream closed or otherwise gone; `reason` may be NULL. SCHED_ESTALE if already lost.
 * Its groups in flight are re-sent to other workers (see "Re-sending"). */
int sched_worker_lost(sched *s, int64_t now_ms, uint32_t id, const char *reason);

/* Forgets lost worker `id` for good (its shell removed it after a grace
 * period): it leaves the worker list, so that workers which come and go do
 * not grow the scheduler. SCHED_ENOENT if unknown, SCHED_ESTATE if not lost. */
int sched_worker_forget(sched *s, int64_t now_ms, uint32_t id);

/* Results of request `request_id`: exactly its count, every rollout of its
 * group; versions not newer than the published one; ids unique. The group is
 * buffered whole and its other request in flight, if any, cancelled. A
 * malformed report closes the request, keeps none of its rollouts and returns
 * SCHED_EINVAL; its group is re-sent unless its other request is still in
 * flight. A result for a request that was cancelled returns SCHED_ESTALE and
 * changes nothing (the scheduler remembers the latest cancelled requests,
 * until their result arrives or their worker is lost). */
int sched_rollouts_done(sched *s, int64_t now_ms, uint32_t worker, uint64_t request_id,
                        const sched_rollout *rollouts, size_t n);

/* The caller refused the result of request `request_id` from `worker` for a
 * fault it alone can see (rollouts that answer another prompt than their
 * group's): the request is closed as for a malformed report, nothing of it
 * is kept and its group is re-sent unless its other request is still in
 * flight. SCHED_OK once closed; a request not in flight gives what
 * sched_rollouts_done would (SCHED_ESTALE for a cancelled one: nothing
 * changes). */
int sched_rollouts_refused(sched *s, int64_t now_ms, uint32_t worker, uint64_t request_id);

/* The trainer (one rank of its group) finished step `step`; `offload`
 * summarises the manifest it will broadcast (NULL: keep the one from
 * registration). Step steps_done reported while no step trains (the trainer
 * trained it on a batch from before a restart, or before it was lost and
 * registered again) means it holds the next version: that step is planned as
 * if trained now, once every rank holds it (a catch-up not yet triggered is
 * aborted for it). A repeat of a step already trained is SCHED_ESTALE. */
int sched_step_done(sched *s, int64_t now_ms, uint32_t worker, uint64_t step,
                    double train_seconds, const sched_offload *offload);
/* The same, with the checksum of the rank's own shard after the step (0: not
 * computed), which stands for its broadcast report's when that has none. */
int sched_shard_step_done(sched *s, int64_t now_ms, uint32_t worker, uint64_t step,
                          double train_seconds, const sched_offload *offload,
                          uint64_t shard_checksum);

/* The caller built the plan asked for and is sending it. `error` non-empty
 * (build failed) aborts the plan and fails the run. */
int sched_plan_built(sched *s, int64_t now_ms, const char *plan_id, uint64_t hash,
                     const char *error);

/* The bounds of the plan being built, from the shell's cost model (its bytes
 * at the rate of its mode): the ack and broadcast timeouts of this plan
 * instead of the run's plan_ack_timeout_ms and broadcast_timeout_ms, and in
 * words what they expect (at most SCHED_TEXT_MAX / 2 bytes are kept), which a
 * timeout's message quotes against what was observed. Call it before
 * sched_plan_built. They should exceed heartbeat_timeout_ms: a hung
 * participant is then lost, and its step re-planned, before the plan times
 * out. SCHED_EINVAL for a bound <= 0, SCHED_ESTALE for another plan. */
int sched_plan_limits(sched *s, int64_t now_ms, const char *plan_id, int64_t ack_timeout_ms,
                      int64_t broadcast_timeout_ms, const char *expected);

/* The receiver views of the plan being built (receivers that hold part of
 * the model): rank_view[r] for every rank of the plan (nranks is its
 * participants), each below nviews or SCHED_VIEW_WHOLE, the sources' always
 * WHOLE. A receiver of view v is then verified against each source's
 * checksum for view v (sched_bcast_report.view_checksums) instead of its
 * whole one. nviews 0 (the default of every plan): no views. Call it before
 * sched_plan_built. SCHED_EINVAL for a bad entry or count, SCHED_ESTALE for
 * another plan. */
#define SCHED_VIEW_WHOLE 0xffffffffu
int sched_plan_views(sched *s, int64_t now_ms, const char *plan_id, const uint32_t *rank_view,
                     size_t nranks, uint32_t nviews);

/* A participant acknowledged `plan_id` with `hash`; `error` non-empty: refused. */
int sched_plan_acked(sched *s, int64_t now_ms, uint32_t worker, const char *plan_id,
                     uint64_t hash, const char *error);

/* A participant finished the broadcast. The sender's `report` fills the record. */
int sched_broadcast_done(sched *s, int64_t now_ms, uint32_t worker, const char *plan_id,
                         const char *error, const sched_bcast_report *report);

/* The operator's policy; takes effect at the next plan. */
int sched_set_policy(sched *s, int64_t now_ms, sched_mode policy);

/* The shell's rollout buffer is full (hold != 0) or has room again: while
 * held, no rollout request is dispatched; what is in flight still arrives
 * and is kept. Nothing is dropped for it. */
int sched_hold_dispatch(sched *s, int64_t now_ms, int hold);
/* Whether rollout `id` is buffered (received, not yet batched or dropped). */
int sched_has_rollout(const sched *s, uint64_t id);
/* The ids of the buffered rollouts, ascending, into out (room for cap);
 * returns how many are buffered (more than cap: only cap were written). */
size_t sched_buffered_ids(const sched *s, uint64_t *out, size_t cap);
/* The ids of the groups still wanted (a request in flight, or waiting to be
 * re-sent), each once, ascending, into out (room for cap); returns how many
 * there are (more than cap: only cap were written). A group neither open nor
 * buffered is done with: batched, dropped, or lost with a trainer's batch. */
size_t sched_open_groups(const sched *s, uint64_t *out, size_t cap);

/* The shell cannot go on with the run (its prompt source broke, say): a
 * pending plan is aborted and the run FAILS with `reason`. SCHED_ESTATE when
 * the run already ended. */
int sched_fail(sched *s, int64_t now_ms, const char *reason);

/* No new steps; a pending plan is aborted; STOPPED once the trainer is quiet. */
int sched_stop(sched *s, int64_t now_ms, const char *reason);

/* Fires what is due at `now_ms`: ack and broadcast timeouts, heartbeat losses,
 * request timeouts. */
int sched_tick(sched *s, int64_t now_ms);

/* ---- queries ----------------------------------------------------------------------- */
void sched_get_run(const sched *s, sched_run_info *out);
void sched_get_counters(const sched *s, sched_counters *out);
/* 0 or SCHED_ENOENT. */
int sched_get_worker(const sched *s, uint32_t id, sched_worker_info *out);
size_t sched_worker_count(const sched *s); /* every id registered, lost included, not forgotten */
/* The i-th worker in id order (0 <= i < sched_worker_count()); 0 or SCHED_ENOENT. */
int sched_get_worker_at(const sched *s, size_t i, sched_worker_info *out);

/* ---- the mode choice, pure --------------------------------------------------------- */
typedef struct sched_participant {
  const char *name;
  sched_caps caps;
} sched_participant;

/* Chooses the broadcast mode for `policy` over participants (rank order) and
 * the trainer's `offload` summary (a group's: summed over its ranks);
 * parts[0] is the trainer, or parts[0..S) its ranks, S =
 * parts[0].caps.trainer_ranks (0 or 1: one). Several sources run on the host
 * transport, or colocated when every participant shares one GPU: AUTO picks
 * colocated then, else host, saying so; the NCCL overrides are SCHED_ENOTSUP
 * naming the mode and S, and a colocated override whose participants do not
 * all share the GPU names the first that does not; n <= S is SCHED_EINVAL.
 * Receivers that hold part of the model (sched_caps.holds_part) are served
 * by the host transport alone: AUTO picks it naming the first, any other
 * override is SCHED_ENOTSUP naming it. Two participants share a GPU when both
 * report the same host id and GPU UUID.
 * AUTO: colocated when there are receivers and every one shares the trainer's
 * GPU (and has CUDA); else host when CUDA or NCCL is missing on any
 * participant (the reason names the first one) or when two participants share
 * a GPU (NCCL needs one device per rank; the reason names them); else staged
 * when any tensor is host-resident, else direct.
 * DIRECT/STAGED/HOST/COLOCATED: the override, or SCHED_ENOTSUP when it cannot
 * run here (reason names the missing capability and the worker; direct also
 * needs every tensor on GPU, direct and staged a GPU per participant,
 * colocated every receiver on the trainer's GPU: a plan partly colocated is
 * refused, naming the receivers that are not). SCHED_EINVAL for no
 * participants, no tensors or an unknown policy. `reason` is always filled. */
int sched_choose_mode(sched_mode policy, const sched_participant *parts, size_t n,
                      const sched_offload *offload, sched_mode *mode, char *reason,
                      size_t reason_len);

#ifdef __cplusplus
}
#endif
#endif
