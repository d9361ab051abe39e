"""The C API of librlorch (include/rlorch/rlorch.h) through cffi in ABI mode.

The declarations below are the public header's, minus the preprocessor: no
compiler is needed, the library is opened at import. It is looked for at
RLORCH_LIBRARY (a path to the file), then next to this package in a build
tree (build/lib) or an install prefix (lib, lib/<multiarch>), then by the
dynamic loader's own search (LD_LIBRARY_PATH, ld.so.cache)."""
import os
import pathlib
import sysconfig

from cffi import FFI

CDEF = """
uint32_t rlorch_version(const char **release);

typedef enum rlorch_status {
  RLORCH_OK = 0,
  RLORCH_TIMEOUT = 1,
  RLORCH_E_INVALID = -1,
  RLORCH_E_VERSION = -2,
  RLORCH_E_STATE = -3,
  RLORCH_E_STOPPED = -4,
  RLORCH_E_REFUSED = -5,
  RLORCH_E_UNAVAILABLE = -6,
  RLORCH_E_NOMEM = -7,
  RLORCH_E_IO = -8
} rlorch_status;

typedef struct rlorch_error {
  int code;
  char message[1024];
} rlorch_error;

const char *rlorch_status_name(int code);

typedef enum rlorch_dtype {
  RLORCH_DTYPE_FP32 = 1,
  RLORCH_DTYPE_BF16 = 2,
  RLORCH_DTYPE_FP16 = 3,
  RLORCH_DTYPE_U16 = 4
} rlorch_dtype;

typedef enum rlorch_residency {
  RLORCH_RES_GPU = 1,
  RLORCH_RES_HOST_PINNED = 2,
  RLORCH_RES_HOST_PAGEABLE = 3
} rlorch_residency;

#define RLORCH_API_VERSION 1
#define RLORCH_NAME_MAX 127
#define RLORCH_MAX_DIMS 8

typedef struct rlorch_tensor {
  const char *name;
  uint32_t layer;
  rlorch_dtype storage_dtype;
  rlorch_dtype wire_dtype;
  uint32_t ndim;
  const uint64_t *shape;
  rlorch_residency residency;
  int device;
  void *data;
} rlorch_tensor;

typedef enum rlorch_role { RLORCH_ROLE_TRAINER = 1, RLORCH_ROLE_INFERENCE = 2 } rlorch_role;

typedef enum rlorch_log_level {
  RLORCH_LOG_DEBUG = 0,
  RLORCH_LOG_INFO = 1,
  RLORCH_LOG_WARN = 2,
  RLORCH_LOG_ERROR = 3
} rlorch_log_level;

typedef void (*rlorch_log_fn)(void *ud, rlorch_log_level level, const char *event,
                              const char *fields);
typedef void (*rlorch_broadcast_before_fn)(void *ud, uint64_t version);
typedef void (*rlorch_broadcast_after_fn)(void *ud, int ok, uint64_t version);

typedef struct rlorch_options {
  uint32_t api_version;
  rlorch_role role;
  const char *orchestrator;
  const char *name;
  const char *token_file;
  const char *tls_ca_file;
  const char *tls_cert_file;
  const char *tls_key_file;
  int device;
  const char *data_listen;
  uint32_t max_concurrent_requests;
  double connect_timeout_s;
  rlorch_log_fn log;
  void *log_ud;
  rlorch_log_level log_level;
  const rlorch_tensor *tensors;
  size_t ntensors;
  rlorch_broadcast_before_fn on_broadcast_before;
  rlorch_broadcast_after_fn on_broadcast_after;
  void *broadcast_ud;
} rlorch_options;

void rlorch_options_init(rlorch_options *o, rlorch_role role);

typedef struct rlorch_worker rlorch_worker;

rlorch_status rlorch_create(const rlorch_options *o, rlorch_worker **out, rlorch_error *err);
rlorch_status rlorch_start(rlorch_worker *w, rlorch_error *err);
void rlorch_stop(rlorch_worker *w);
void rlorch_free(rlorch_worker *w);
uint64_t rlorch_policy_version(const rlorch_worker *w);

typedef enum rlorch_command_kind {
  RLORCH_CMD_GENERATE = 1,
  RLORCH_CMD_TRAIN = 2,
  RLORCH_CMD_ABORT = 3,
  RLORCH_CMD_SHUTDOWN = 4
} rlorch_command_kind;

typedef struct rlorch_sampling {
  double temperature;
  double top_p;
  int32_t top_k;
  uint32_t max_tokens;
  const uint32_t *stop_token_ids;
  size_t n_stop_token_ids;
  uint64_t seed;
} rlorch_sampling;

typedef struct rlorch_generate {
  uint64_t request_id;
  uint64_t group_id;
  uint32_t count;
  const uint32_t *prompt_token_ids;
  size_t n_prompt_token_ids;
  const uint8_t *prompt_metadata;
  size_t n_prompt_metadata;
  rlorch_sampling sampling;
} rlorch_generate;

typedef struct rlorch_train {
  uint64_t step;
  uint64_t seed;
  size_t n_rollouts;
  uint32_t groups, group_size;
} rlorch_train;

typedef struct rlorch_abort {
  uint64_t request_id;
  const char *reason;
} rlorch_abort;

typedef struct rlorch_command {
  rlorch_command_kind kind;
  const char *run_id;
  rlorch_generate generate;
  rlorch_train train;
  rlorch_abort abort;
  const char *shutdown_reason;
} rlorch_command;

rlorch_status rlorch_next(rlorch_worker *w, double timeout_s, rlorch_command **cmd,
                          rlorch_error *err);
void rlorch_command_free(rlorch_command *cmd);

typedef enum rlorch_finish {
  RLORCH_FINISH_UNSPECIFIED = 0,
  RLORCH_FINISH_STOP = 1,
  RLORCH_FINISH_LENGTH = 2,
  RLORCH_FINISH_ABORT = 3
} rlorch_finish;

typedef struct rlorch_batch_rollout {
  uint64_t id;
  uint64_t group_id;
  uint64_t policy_version;
  const uint32_t *prompt_token_ids;
  size_t n_prompt_token_ids;
  const uint32_t *completion_token_ids;
  size_t n_completion_token_ids;
  const float *completion_logprobs;
  const double *rewards;
  size_t n_rewards;
  rlorch_finish finish_reason;
  const uint8_t *metadata;
  size_t n_metadata;
} rlorch_batch_rollout;

typedef struct rlorch_batch {
  uint64_t step;
  size_t n_rollouts;
  const rlorch_batch_rollout *rollouts;
} rlorch_batch;

rlorch_status rlorch_fetch_batch(rlorch_worker *w, const rlorch_command *train, rlorch_batch **out,
                                 rlorch_error *err);
void rlorch_batch_free(rlorch_batch *b);

typedef struct rlorch_rollout {
  const uint32_t *token_ids;
  size_t n_tokens;
  const float *logprobs;
  const double *rewards;
  size_t n_rewards;
  rlorch_finish finish_reason;
  const uint8_t *metadata;
  size_t n_metadata;
  double seconds;
} rlorch_rollout;

rlorch_status rlorch_report_rollouts(rlorch_worker *w, const rlorch_command *gen, uint64_t version,
                                     const rlorch_rollout *rollouts, size_t n, rlorch_error *err);
rlorch_status rlorch_report_step(rlorch_worker *w, const rlorch_command *train,
                                 double train_seconds, rlorch_error *err);
rlorch_status rlorch_report_error(rlorch_worker *w, const rlorch_command *cmd, const char *message,
                                  rlorch_error *err);
"""

SONAME = "librlorch.so.1"

ffi = FFI()
ffi.cdef(CDEF)


def _candidates():
    env = os.environ.get("RLORCH_LIBRARY")
    if env:
        # An explicit choice is the only one: a wrong path must not quietly
        # load some other copy of the library.
        return [env]
    here = pathlib.Path(__file__).resolve().parent
    found = []
    # A source checkout: workers/python/rlorch -> the tree's build/lib.
    found.append(here.parents[2] / "build" / "lib" / SONAME)
    # An install prefix: <prefix>/lib[/<multiarch>]/python3/dist-packages/rlorch.
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    for p in here.parents:
        found.append(p / "lib" / SONAME)
        if multiarch:
            found.append(p / "lib" / multiarch / SONAME)
    return [str(f) for f in found if f.is_file()] + [SONAME]


def _open():
    tried = []
    for path in _candidates():
        try:
            return ffi.dlopen(path), path
        except OSError as e:
            tried.append(f"{path}: {e}")
    raise ImportError("cannot load librlorch (set RLORCH_LIBRARY to its path): " + "; ".join(tried))


lib, LIBRARY_PATH = _open()
