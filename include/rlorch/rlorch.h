/* rlorch.h: the embedding SDK of rlorch, librlorch.
 *
 * A process that embeds one trainer rank or one inference engine joins an
 * rlorch orchestrator through this API: it describes its own tensors by
 * pointer, starts a worker (registration, the command stream, heartbeats on
 * the library's own threads), pulls commands (generation requests, train
 * steps, aborts, shutdown) with rlorch_next, and reports what it made.
 * Broadcasts of the weights are the library's: it binds the orchestrator's
 * plans to the caller's tensors by name and sends from them (trainer) or
 * writes straight into them (inference), never copying them first; the
 * caller hears about each through two callbacks, so that an engine can pause
 * generation while its weights change.
 *
 * Conventions:
 * - Every function that can fail returns an rlorch_status (RLORCH_OK is 0,
 *   failures are negative) and, when `err` is not NULL, fills it with the
 *   code and a message naming what was wrong. Nothing here aborts the
 *   process or exits.
 * - Options structs start with the API version the caller was compiled
 *   against (set by rlorch_options_init, told the struct's size): a library of a later version reads
 *   only the fields that version had, so a program built against an older
 *   header keeps working.
 * - Strings and arrays passed in are borrowed for the duration of the call
 *   unless said otherwise; what the library hands out is owned by it until
 *   the matching *_free.
 * - Threads: all functions may be called from any thread; one worker's
 *   functions may be called from several threads at once (rlorch_next from
 *   one at a time). Callbacks run on the library's threads and must not call
 *   rlorch_stop or rlorch_free of their own worker.
 *
 * Link with `pkg-config --cflags --libs rlorch`. */
#ifndef RLORCH_RLORCH_H
#define RLORCH_RLORCH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The API this header describes. A change that breaks a caller compiled
 * against it raises the soname (librlorch.so.1); fields added at the end of
 * the options struct raise this number only. */
#define RLORCH_API_VERSION 4

/* The API version the loaded library implements (>= every version it can
 * serve), and its release ("0.1.0") in *release when release is not NULL. */
uint32_t rlorch_version(const char **release);

/* ---- status and errors ------------------------------------------------------- */

typedef enum rlorch_status {
  RLORCH_OK = 0,
  RLORCH_TIMEOUT = 1,          /* rlorch_next: no command within the timeout (not a failure) */
  RLORCH_E_INVALID = -1,       /* a bad argument or option; the message names it */
  RLORCH_E_VERSION = -2,       /* options built against an API version this library lacks */
  RLORCH_E_STATE = -3,         /* not started, already started, or the wrong role for the call */
  RLORCH_E_STOPPED = -4,       /* the worker stopped (shutdown, rlorch_stop, a fatal error) */
  RLORCH_E_REFUSED = -5,       /* the orchestrator refused: its gRPC status and text */
  RLORCH_E_UNAVAILABLE = -6,   /* the orchestrator could not be reached in time */
  RLORCH_E_NOMEM = -7,         /* out of memory */
  RLORCH_E_IO = -8             /* a file (token, TLS) or socket could not be used */
} rlorch_status;

typedef struct rlorch_error {
  int code;           /* an rlorch_status */
  char message[1024]; /* NUL-terminated, English */
} rlorch_error;

/* "RLORCH_E_INVALID", ... ("?" for an unknown code). */
const char *rlorch_status_name(int code);

/* ---- tensors ----------------------------------------------------------------- */

/* Element types (the values are part of the API). */
typedef enum rlorch_dtype {
  RLORCH_DTYPE_FP32 = 1,
  RLORCH_DTYPE_BF16 = 2,
  RLORCH_DTYPE_FP16 = 3,
  RLORCH_DTYPE_U16 = 4 /* raw 16-bit integers, never cast */
} rlorch_dtype;

/* Where a tensor's data lives. */
typedef enum rlorch_residency {
  RLORCH_RES_GPU = 1,
  RLORCH_RES_HOST_PINNED = 2,
  RLORCH_RES_HOST_PAGEABLE = 3
} rlorch_residency;

#define RLORCH_NAME_MAX 127 /* bytes of a tensor name */
#define RLORCH_MAX_DIMS 8

/* One of the caller's tensors. The library keeps `data` (never a copy): the
 * memory must stay valid, at that address, until rlorch_free.
 * - Trainer: `data` holds storage_dtype elements; the orchestrator's plan
 *   sends them as wire_dtype (fp32 -> fp32|bf16|fp16; a 16-bit type as it is).
 * - Inference: `data` holds wire_dtype elements (the engine's own weights),
 *   which the broadcast overwrites; storage_dtype must equal wire_dtype. */
typedef struct rlorch_tensor {
  const char *name;          /* unique within the worker, 1..RLORCH_NAME_MAX bytes */
  uint32_t layer;            /* the decoder layer it belongs to (plans bucket by layer) */
  rlorch_dtype storage_dtype;
  rlorch_dtype wire_dtype;
  uint32_t ndim;             /* 1..RLORCH_MAX_DIMS */
  const uint64_t *shape;     /* ndim sizes, each >= 1; copied at rlorch_create */
  rlorch_residency residency;
  int device;                /* CUDA device of RLORCH_RES_GPU data; ignored otherwise */
  void *data;
} rlorch_tensor;

/* API 2. The part of one tensor a rank of a sharded trainer holds (FSDP2's
 * local shard of a parameter, flattened): elements [element_offset,
 * element_offset + element_count) of the row-major full tensor whose shape
 * the rlorch_tensor gives; its `data` holds exactly those elements. The
 * ranks' parts must tile every tensor exactly, or Register is refused
 * naming the tensor and the ranks. A rank that holds none of a tensor
 * leaves the tensor out of its options.tensors. */
typedef struct rlorch_shard {
  uint64_t element_offset;
  uint64_t element_count; /* >= 1 */
} rlorch_shard;

/* API 3. The part of one tensor an inference worker holds, as a rank of a
 * tensor- or expert-parallel engine does (the values of rlorch_part_kind
 * are part of the API):
 * - WHOLE: every element (what a tensor not listed gets);
 * - SLICE: indices [start, start + count) along dimension `dim`, every index
 *   of the other dimensions: dim 0 is the rows of a 2-D weight (a column-
 *   parallel layer's output features), dim 1 its columns (a row-parallel
 *   layer's input features);
 * - NONE: nothing (an expert the rank does not serve).
 * Every broadcast then delivers the worker exactly its parts. The tensor's
 * rlorch_tensor keeps the FULL shape; its `data` holds the part, dense and
 * row-major in the part's own shape (shape[dim] replaced by count), as an
 * rlorch_shard's data holds a trainer rank's elements. A tensor held NONE is
 * left out of options.tensors, and on_bind is not asked to place it. */
typedef enum rlorch_part_kind {
  RLORCH_PART_WHOLE = 0,
  RLORCH_PART_SLICE = 1,
  RLORCH_PART_NONE = 2
} rlorch_part_kind;

typedef struct rlorch_part {
  const char *name;      /* the trainer's tensor, 1..RLORCH_NAME_MAX bytes, each at most once */
  rlorch_part_kind kind;
  uint32_t dim;          /* SLICE: the dimension cut, below the tensor's ndim */
  uint64_t start;        /* SLICE: first index along dim */
  uint64_t count;        /* SLICE: indices along dim, >= 1; start + count <= shape[dim] */
} rlorch_part;

/* ---- options ----------------------------------------------------------------- */

typedef enum rlorch_role { RLORCH_ROLE_TRAINER = 1, RLORCH_ROLE_INFERENCE = 2 } rlorch_role;

/* Where a trainer keeps its master weights and optimizer state, as a run's
 * spec may require it (the values are part of the API). */
typedef enum rlorch_offload {
  RLORCH_OFFLOAD_UNSET = 0,            /* not said: a spec that requires one refuses it */
  RLORCH_OFFLOAD_NONE = 1,             /* both on the GPU */
  RLORCH_OFFLOAD_PARAMS = 2,           /* weights in host memory, the optimizer on the GPU */
  RLORCH_OFFLOAD_PARAMS_OPTIMIZER = 3  /* both in host memory, the optimizer step on the CPU */
} rlorch_offload;

typedef enum rlorch_log_level {
  RLORCH_LOG_DEBUG = 0,
  RLORCH_LOG_INFO = 1,
  RLORCH_LOG_WARN = 2,
  RLORCH_LOG_ERROR = 3
} rlorch_log_level;

/* One event of the library: a name ("registered") and its fields as logfmt
 * ("worker_id=w-1 rank=0"), valid for the call only. Called from any of the
 * library's threads, possibly at once. */
typedef void (*rlorch_log_fn)(void *ud, rlorch_log_level level, const char *event,
                              const char *fields);

/* Around each broadcast, on the library's command thread:
 * - before: the library is about to read (trainer) or write (inference) the
 *   tensors for policy version `version`; an engine stops generating from
 *   them and returns once nothing reads them any more;
 * - after: the broadcast ended; ok is 1 when every tensor now holds version
 *   `version` (inference: then also the version rlorch_policy_version says),
 *   0 when it failed part-way (an inference worker's tensors are then torn:
 *   part new, part old; serve nothing from them until a later broadcast
 *   succeeds). `after` always follows `before`. */
typedef void (*rlorch_broadcast_before_fn)(void *ud, uint64_t version);
typedef void (*rlorch_broadcast_after_fn)(void *ud, int ok, uint64_t version);

/* Inference (API 2), on the library's command thread before each broadcast
 * (ahead of `before`): chooses the memory it writes. `tensors` are the
 * plan's, in its order, with name, layer, dtypes (storage = wire) and shape
 * filled in; the caller sets each one's residency, device and data (its own
 * buffers, a second set it swaps in after a successful broadcast, or memory
 * it allocates for a layout it meets for the first time). The memory must
 * stay valid until the broadcast's `after` has returned, and GPU memory
 * another process maps (the colocated mode) until the next broadcast has
 * ended. Returns 0, or non-zero to refuse the plan with `message` (a
 * NUL-terminated reason of at most `len` bytes): the broadcast fails, named.
 * A worker with options.parts (API 3) is given only the tensors it holds
 * (NONE ones left out), each with its FULL shape: the memory it places
 * holds the part (rlorch_part), shape[dim] replaced by count for a SLICE. */
typedef int (*rlorch_bind_fn)(void *ud, uint64_t version, rlorch_tensor *tensors, size_t n,
                              char *message, size_t len);

typedef struct rlorch_options {
  uint32_t api_version;         /* RLORCH_API_VERSION: first, always */
  rlorch_role role;
  const char *orchestrator;     /* required: "host:port" of rlorch serve's gRPC listener */
  const char *name;             /* NULL: "<role>-<host>-<pid>" */
  const char *token_file;       /* a bearer token to present; NULL: none */
  const char *tls_ca_file;      /* PEM roots to verify the orchestrator by (turns TLS on) */
  const char *tls_cert_file;    /* a client certificate and its key: both or neither */
  const char *tls_key_file;
  int device;                   /* CUDA device the worker uses; -1 (the default): none */
  const char *data_listen;      /* trainer: where receivers connect ("0.0.0.0:0"); NULL: 127.0.0.1:0;
                                   inference: where the receivers it relays to connect; NULL: none */
  uint32_t max_concurrent_requests; /* inference: generation requests at once, 1..1024 (default 8) */
  double connect_timeout_s;     /* rlorch_start waits this long for a first registration (default 30; INFINITY: no limit) */
  rlorch_log_fn log;            /* NULL: events are dropped */
  void *log_ud;
  rlorch_log_level log_level;   /* the lowest level passed to `log` (default INFO) */
  const rlorch_tensor *tensors; /* the caller's tensors (a trainer needs at least one) */
  size_t ntensors;
  rlorch_broadcast_before_fn on_broadcast_before; /* optional */
  rlorch_broadcast_after_fn on_broadcast_after;   /* optional */
  void *broadcast_ud;
  /* ---- API version 2 ---- */
  const char *token;            /* the bearer token itself, instead of token_file; NULL: none */
  const char *model;            /* trainer: the model its tensors are, as a run spec's preset names it; NULL: not said */
  rlorch_offload offload;       /* trainer: where its weights and optimizer live (default UNSET) */
  /* Trainer: the run and policy version its tensors hold when it restored
   * them from its own checkpoint; Register says so, and an orchestrator
   * resuming that run carries on from there. NULL: fresh weights. */
  const char *held_run_id;
  uint64_t held_version;
  rlorch_bind_fn on_bind;       /* inference, optional: then options.tensors may be empty */
  void *bind_ud;
  /* Trainer of several ranks (FSDP, ZeRO): one worker per rank, each
   * registering its own shard; every rank sends its part of each broadcast
   * and fetches its share of each batch (whole groups, rank r of N gets
   * groups [r*G/N, (r+1)*G/N)). trainer_ranks 0 or 1: a lone trainer. */
  uint32_t trainer_rank;        /* below trainer_ranks */
  uint32_t trainer_ranks;       /* 0..1024 */
  const rlorch_shard *shards;   /* NULL: whole tensors; else ntensors entries, shards[i] the
                                   part tensors[i].data holds; copied at rlorch_create */
  /* ---- API version 3 ---- */
  /* Inference: the parts of the trainer's tensors this worker holds
   * (rlorch_part), sent at Register; tensors not listed are held whole.
   * Checked at rlorch_create against options.tensors of the same name (dim
   * below its ndim, the slice inside its shape; a NONE part's tensor absent);
   * the orchestrator checks them against the trainer's manifest at Register
   * and refuses a part that does not fit, naming it. Copied at rlorch_create.
   * NULL / 0: every tensor whole. */
  const rlorch_part *parts;
  size_t nparts;
  /* ---- API version 4 ---- */
  /* Where the worker runs, for the orchestrator's model of every plan
   * (Capabilities.topology; `rlorch ctl list-workers` shows it). The library
   * detects it (the GPU's bus id, NUMA node and NVLink peers; the NICs in
   * /sys/class/net that are up, each link counted once: no loopback, bridge
   * or bond slave; and their speeds); these set what the system cannot say,
   * each checked at rlorch_create and named in Topology.configured:
   * - node: the node (machine) name, 1..127 bytes without spaces, quotes or
   *   control characters; workers of one name share its NICs. NULL: the
   *   machine's boot id (the same for every container of one host);
   * - nics with nic_gbits: the node has `nics` NICs (1..32, "nic0", ...) of
   *   nic_gbits Gb/s each instead of those detected; nics needs nic_gbits;
   * - nic_gbits alone (0 < G <= 10000): the speed of every detected NIC (a
   *   virtual or shaped link whose rate sysfs does not know). 0: detected. */
  const char *node;
  uint32_t nics;
  double nic_gbits;
} rlorch_options;

/* Fills every field with its default for `role`, api_version included.
 * `size` is sizeof *o as the caller was compiled: the library writes no
 * byte past it, so a program built against an older, shorter struct is safe
 * with a later library (it gets that older version's fields and number).
 * Call it as rlorch_options_init(&o, sizeof o, RLORCH_ROLE_TRAINER). */
void rlorch_options_init(rlorch_options *o, size_t size, rlorch_role role);

/* ---- the worker -------------------------------------------------------------- */

typedef struct rlorch_worker rlorch_worker;

/* Checks the options and the tensors (names, dtypes, shapes, residency) and
 * makes a worker; nothing is sent yet. The options are copied (strings too),
 * the tensors' data pointers are kept. The log callback is process-wide: the
 * last worker created with one receives the events of every worker. */
rlorch_status rlorch_create(const rlorch_options *o, rlorch_worker **out, rlorch_error *err);

/* Registers (with the caller's manifest on a trainer), opens the command
 * stream and starts heartbeats, on the library's own threads. Blocks until
 * the first registration succeeds (RLORCH_OK), the orchestrator refuses it
 * (RLORCH_E_REFUSED with its status text) or connect_timeout_s passes
 * (RLORCH_E_UNAVAILABLE); the worker is stopped after a failure. Later
 * losses (an orchestrator restart) are the library's: it re-registers. */
rlorch_status rlorch_start(rlorch_worker *w, rlorch_error *err);

/* Asks the worker to stop: rlorch_next then drains what is queued and
 * returns RLORCH_E_STOPPED. Does not block; safe from any thread but the
 * library's callbacks. */
void rlorch_stop(rlorch_worker *w);

/* Stops the worker if needed, waits for its threads (a broadcast executing
 * is cancelled), and frees it. No other call on this worker may be running
 * (rlorch_stop first, then let rlorch_next and the reports return) or come
 * after. Commands not freed yet stay valid until rlorch_command_free. NULL
 * is fine. */
void rlorch_free(rlorch_worker *w);

/* Why a stopped worker stopped: RLORCH_OK when on purpose (rlorch_stop, or
 * the orchestrator's SHUTDOWN command), otherwise the failure (a refused
 * registration, a fatal error of the library, a train step the caller could
 * not take) with its message; RLORCH_E_STATE while it has not stopped. A
 * program exits 0 on the first and 1 on the others. */
rlorch_status rlorch_stop_status(rlorch_worker *w, rlorch_error *err);

/* The policy version of the caller's tensors as the library knows it: a
 * trainer's after its last reported step, an inference worker's after its
 * last successful broadcast. Label rollouts with the version held when their
 * generation began. */
uint64_t rlorch_policy_version(const rlorch_worker *w);

/* The orchestrator's id of the plan ("run-1/step-4") that the broadcast
 * callbacks running now are about (on_bind, on_broadcast_before, _after),
 * for their logs to name the broadcast as the orchestrator's do: copied into
 * buf (at most len bytes, NUL included); "" outside those callbacks. Returns
 * the id's length. (API 2) */
size_t rlorch_broadcast_id(rlorch_worker *w, char *buf, size_t len);

/* Trainer (API 2): where its receivers connect for the weights, as Register
 * announces it: options.data_listen with the port the system chose for ":0"
 * ("0.0.0.0:41731"), known from rlorch_create on, valid until rlorch_free.
 * An inference worker given options.data_listen: where the receivers it
 * relays broadcasts to connect.  NULL for one without (or a NULL worker). */
const char *rlorch_data_address(const rlorch_worker *w);

/* ---- commands ---------------------------------------------------------------- */

typedef enum rlorch_command_kind {
  RLORCH_CMD_GENERATE = 1, /* inference: generate a group of completions */
  RLORCH_CMD_TRAIN = 2,    /* trainer: take one optimizer step */
  RLORCH_CMD_ABORT = 3,    /* inference: stop a generation request, report nothing for it */
  RLORCH_CMD_SHUTDOWN = 4  /* the orchestrator asks the process to exit; the worker stops */
} rlorch_command_kind;

typedef struct rlorch_sampling {
  double temperature;             /* 0: greedy */
  double top_p;                   /* 0: not set */
  int32_t top_k;                  /* 0: not set */
  uint32_t max_tokens;            /* 0: no cap */
  const uint32_t *stop_token_ids;
  size_t n_stop_token_ids;
  uint64_t seed;                  /* 0: the engine chooses */
} rlorch_sampling;

typedef struct rlorch_generate {
  uint64_t request_id;            /* echo it in rlorch_report_rollouts */
  uint64_t group_id;              /* the prompt group */
  uint32_t count;                 /* completions to make: exactly this many rollouts */
  const uint32_t *prompt_token_ids;
  size_t n_prompt_token_ids;
  const uint8_t *prompt_metadata; /* the prompt source's (a reference answer, say) */
  size_t n_prompt_metadata;
  rlorch_sampling sampling;
} rlorch_generate;

typedef struct rlorch_train {
  uint64_t step;                  /* the step number: report it with rlorch_report_step */
  uint64_t seed;                  /* the step's seed, from the run */
  size_t n_rollouts;              /* rollouts in the batch */
  uint32_t groups, group_size;
} rlorch_train;

typedef struct rlorch_abort {
  uint64_t request_id;
  const char *reason;
} rlorch_abort;

/* A command; every pointer in it stays valid until rlorch_command_free. */
typedef struct rlorch_command {
  rlorch_command_kind kind;
  const char *run_id;
  rlorch_generate generate;       /* kind GENERATE */
  rlorch_train train;             /* kind TRAIN */
  rlorch_abort abort;             /* kind ABORT */
  const char *shutdown_reason;    /* kind SHUTDOWN */
} rlorch_command;

/* Waits up to timeout_s seconds (< 0: without a limit; 0: does not wait)
 * for the next command, in the orchestrator's order. RLORCH_OK and *cmd
 * (free it with rlorch_command_free), RLORCH_TIMEOUT (nothing yet),
 * RLORCH_E_STATE (not started) or RLORCH_E_STOPPED (stopped, nothing left).
 * Plans, triggers and plan aborts never come here: the library executes
 * them. A train step holds the worker's command thread until it is reported
 * (rlorch_report_step or rlorch_report_error): no broadcast reads the
 * tensors while the caller changes them. */
rlorch_status rlorch_next(rlorch_worker *w, double timeout_s, rlorch_command **cmd,
                          rlorch_error *err);
/* A GENERATE command freed unanswered (aborted, dropped) is no longer in
 * flight for the worker's figures (Heartbeat.stats.requests_active). */
void rlorch_command_free(rlorch_command *cmd);

/* ---- a trainer's batch ------------------------------------------------------- */

typedef enum rlorch_finish {
  RLORCH_FINISH_UNSPECIFIED = 0,
  RLORCH_FINISH_STOP = 1,   /* a stop token */
  RLORCH_FINISH_LENGTH = 2, /* the token limit */
  RLORCH_FINISH_ABORT = 3   /* cut short */
} rlorch_finish;

typedef struct rlorch_batch_rollout {
  uint64_t id;
  uint64_t group_id;
  uint64_t policy_version;             /* the version that generated it */
  const uint32_t *prompt_token_ids;
  size_t n_prompt_token_ids;
  const uint32_t *completion_token_ids;
  size_t n_completion_token_ids;
  const float *completion_logprobs;    /* n_completion_token_ids of them, or NULL */
  const double *rewards;
  size_t n_rewards;
  rlorch_finish finish_reason;
  const uint8_t *metadata;             /* as the inference worker sent it */
  size_t n_metadata;
} rlorch_batch_rollout;

typedef struct rlorch_batch {
  uint64_t step;
  size_t n_rollouts;                   /* the train step's, in its order */
  const rlorch_batch_rollout *rollouts;
} rlorch_batch;

/* Trainer, with a TRAIN command not yet reported: streams the step's batch
 * from the orchestrator (retrying as rlorch's own trainer does) and checks
 * it is the step's; a rank of a sharded trainer gets its share (its
 * groups of the batch, options.trainer_rank of trainer_ranks, while
 * rlorch_train.n_rollouts counts the whole batch). Blocks. RLORCH_OK and
 * *out (rlorch_batch_free), or
 * RLORCH_E_REFUSED when the orchestrator no longer holds that batch (skip
 * the step: report it with rlorch_report_error), RLORCH_E_STOPPED, ... */
rlorch_status rlorch_fetch_batch(rlorch_worker *w, const rlorch_command *train, rlorch_batch **out,
                                 rlorch_error *err);
void rlorch_batch_free(rlorch_batch *b);

/* ---- reports ----------------------------------------------------------------- */

/* One completion of a generation request. */
typedef struct rlorch_rollout {
  const uint32_t *token_ids;    /* the completion; NULL: its length only (API 2: a synthetic
                                   load whose ids no trainer reads, e.g. a benchmark's) */
  size_t n_tokens;              /* >= 1 */
  const float *logprobs;        /* n_tokens natural-log probabilities (<= 0), or NULL (always
                                   without token_ids) */
  const double *rewards;        /* 1..16 finite values */
  size_t n_rewards;
  rlorch_finish finish_reason;
  const uint8_t *metadata;      /* opaque, carried to the trainer; may be NULL */
  size_t n_metadata;
  double seconds;               /* generation time, for the orchestrator's figures */
} rlorch_rollout;

/* Inference: reports the `n` completions of GENERATE command `gen` (n is its
 * count), generated from the weights of policy `version` (rlorch_policy_version
 * when generation began). Blocks until the orchestrator has it (retrying
 * while it is unreachable). RLORCH_E_INVALID names a bad rollout before
 * anything is sent; RLORCH_E_REFUSED carries the orchestrator's reason;
 * RLORCH_E_STOPPED also when the request came before the worker registered
 * again (the orchestrator restarted or forgot it): the request is gone and
 * nothing is sent. */
rlorch_status rlorch_report_rollouts(rlorch_worker *w, const rlorch_command *gen, uint64_t version,
                                     const rlorch_rollout *rollouts, size_t n, rlorch_error *err);

/* Trainer: the optimizer step of TRAIN command `train` is done and the
 * tensors hold the new weights. The library takes their checksum, sends it
 * with the manifest, adopts version step + 1 and releases its command thread
 * (the broadcast of the new weights follows). */
rlorch_status rlorch_report_step(rlorch_worker *w, const rlorch_command *train,
                                 double train_seconds, rlorch_error *err);

/* The caller could not serve `cmd`; `message` says why (logged).
 * - GENERATE: the request is answered with no rollout, which frees its slot
 *   (the orchestrator sends the group elsewhere or again).
 * - TRAIN after rlorch_fetch_batch returned RLORCH_E_REFUSED: the step is
 *   skipped (the orchestrator redoes or drops it itself) and the worker goes
 *   on, as rlorch's own trainer does.
 * - TRAIN otherwise: the trainer cannot take the step, so the worker stops
 *   (as rlorch's own trainer exits): the orchestrator sees the trainer lost
 *   and redoes the step when a trainer attaches.
 * Commands must come from rlorch_next (the library reads what it attached to
 * them). */
rlorch_status rlorch_report_error(rlorch_worker *w, const rlorch_command *cmd, const char *message,
                                  rlorch_error *err);

#ifdef __cplusplus
}
#endif

#endif
