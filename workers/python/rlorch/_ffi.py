"""The C API of librlorch (include/rlorch/rlorch.h) through ctypes.

The declarations below are the public header's, transcribed: no compiler
is needed, the library is opened at import (tests/python/py_abi.py checks
them against the header with one). It is looked for at RLORCH_LIBRARY (a
path to the file), then next to this package in a build tree (build/lib) or
an install prefix (lib, lib/<multiarch>), then by the dynamic loader's own
search (LD_LIBRARY_PATH, ld.so.cache)."""
import ctypes
import os
import pathlib
import sysconfig
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int,
                    c_int32, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p)

# ---- constants: the header's #defines and enum values --------------------------

RLORCH_API_VERSION = 4
RLORCH_NAME_MAX = 127
RLORCH_MAX_DIMS = 8

# rlorch_status
RLORCH_OK = 0
RLORCH_TIMEOUT = 1
RLORCH_E_INVALID = -1
RLORCH_E_VERSION = -2
RLORCH_E_STATE = -3
RLORCH_E_STOPPED = -4
RLORCH_E_REFUSED = -5
RLORCH_E_UNAVAILABLE = -6
RLORCH_E_NOMEM = -7
RLORCH_E_IO = -8

# rlorch_dtype
RLORCH_DTYPE_FP32 = 1
RLORCH_DTYPE_BF16 = 2
RLORCH_DTYPE_FP16 = 3
RLORCH_DTYPE_U16 = 4

# rlorch_residency
RLORCH_RES_GPU = 1
RLORCH_RES_HOST_PINNED = 2
RLORCH_RES_HOST_PAGEABLE = 3

# rlorch_role
RLORCH_ROLE_TRAINER = 1
RLORCH_ROLE_INFERENCE = 2

# rlorch_offload
RLORCH_OFFLOAD_UNSET = 0
RLORCH_OFFLOAD_NONE = 1
RLORCH_OFFLOAD_PARAMS = 2
RLORCH_OFFLOAD_PARAMS_OPTIMIZER = 3

# rlorch_log_level
RLORCH_LOG_DEBUG = 0
RLORCH_LOG_INFO = 1
RLORCH_LOG_WARN = 2
RLORCH_LOG_ERROR = 3

# rlorch_command_kind
RLORCH_CMD_GENERATE = 1
RLORCH_CMD_TRAIN = 2
RLORCH_CMD_ABORT = 3
RLORCH_CMD_SHUTDOWN = 4

# rlorch_finish
RLORCH_FINISH_UNSPECIFIED = 0
RLORCH_FINISH_STOP = 1
RLORCH_FINISH_LENGTH = 2
RLORCH_FINISH_ABORT = 3

# rlorch_part_kind (API 3)
RLORCH_PART_WHOLE = 0
RLORCH_PART_SLICE = 1
RLORCH_PART_NONE = 2

# Every enum of the header has int's size and alignment (its values fit an
# int; the C compiler then picks int on every ABI the library builds for).
rlorch_status = rlorch_dtype = rlorch_residency = rlorch_role = c_int
rlorch_log_level = rlorch_command_kind = rlorch_finish = rlorch_offload = c_int
rlorch_part_kind = c_int

# ---- structs, in the header's order, fields in its order ------------------------


class rlorch_error(Structure):
    _fields_ = [("code", c_int), ("message", c_char * 1024)]


class rlorch_tensor(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("layer", c_uint32),
        ("storage_dtype", rlorch_dtype),
        ("wire_dtype", rlorch_dtype),
        ("ndim", c_uint32),
        ("shape", POINTER(c_uint64)),
        ("residency", rlorch_residency),
        ("device", c_int),
        ("data", c_void_p),
    ]


class rlorch_shard(Structure):
    _fields_ = [("element_offset", c_uint64), ("element_count", c_uint64)]


class rlorch_part(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("kind", rlorch_part_kind),
        ("dim", c_uint32),
        ("start", c_uint64),
        ("count", c_uint64),
    ]


rlorch_log_fn = CFUNCTYPE(None, c_void_p, rlorch_log_level, c_char_p, c_char_p)
rlorch_broadcast_before_fn = CFUNCTYPE(None, c_void_p, c_uint64)
rlorch_broadcast_after_fn = CFUNCTYPE(None, c_void_p, c_int, c_uint64)

rlorch_bind_fn = CFUNCTYPE(c_int, c_void_p, c_uint64, POINTER(rlorch_tensor), c_size_t, c_void_p,
                           c_size_t)

CALLBACKS = {
    "rlorch_log_fn": rlorch_log_fn,
    "rlorch_broadcast_before_fn": rlorch_broadcast_before_fn,
    "rlorch_broadcast_after_fn": rlorch_broadcast_after_fn,
    "rlorch_bind_fn": rlorch_bind_fn,
}


class rlorch_options(Structure):
    _fields_ = [
        ("api_version", c_uint32),
        ("role", rlorch_role),
        ("orchestrator", c_char_p),
        ("name", c_char_p),
        ("token_file", c_char_p),
        ("tls_ca_file", c_char_p),
        ("tls_cert_file", c_char_p),
        ("tls_key_file", c_char_p),
        ("device", c_int),
        ("data_listen", c_char_p),
        ("max_concurrent_requests", c_uint32),
        ("connect_timeout_s", c_double),
        ("log", rlorch_log_fn),
        ("log_ud", c_void_p),
        ("log_level", rlorch_log_level),
        ("tensors", POINTER(rlorch_tensor)),
        ("ntensors", c_size_t),
        ("on_broadcast_before", rlorch_broadcast_before_fn),
        ("on_broadcast_after", rlorch_broadcast_after_fn),
        ("broadcast_ud", c_void_p),
        # API version 2
        ("token", c_char_p),
        ("model", c_char_p),
        ("offload", rlorch_offload),
        ("held_run_id", c_char_p),
        ("held_version", c_uint64),
        ("on_bind", rlorch_bind_fn),
        ("bind_ud", c_void_p),
        ("trainer_rank", c_uint32),
        ("trainer_ranks", c_uint32),
        ("shards", POINTER(rlorch_shard)),
        # API version 3
        ("parts", POINTER(rlorch_part)),
        ("nparts", c_size_t),
        # API version 4
        ("node", c_char_p),
        ("nics", c_uint32),
        ("nic_gbits", c_double),
    ]


class rlorch_worker(Structure):
    """Opaque: only ever behind a pointer."""


class rlorch_sampling(Structure):
    _fields_ = [
        ("temperature", c_double),
        ("top_p", c_double),
        ("top_k", c_int32),
        ("max_tokens", c_uint32),
        ("stop_token_ids", POINTER(c_uint32)),
        ("n_stop_token_ids", c_size_t),
        ("seed", c_uint64),
    ]


class rlorch_generate(Structure):
    _fields_ = [
        ("request_id", c_uint64),
        ("group_id", c_uint64),
        ("count", c_uint32),
        ("prompt_token_ids", POINTER(c_uint32)),
        ("n_prompt_token_ids", c_size_t),
        ("prompt_metadata", POINTER(c_uint8)),
        ("n_prompt_metadata", c_size_t),
        ("sampling", rlorch_sampling),
    ]


class rlorch_train(Structure):
    _fields_ = [
        ("step", c_uint64),
        ("seed", c_uint64),
        ("n_rollouts", c_size_t),
        ("groups", c_uint32),
        ("group_size", c_uint32),
    ]


class rlorch_abort(Structure):
    _fields_ = [("request_id", c_uint64), ("reason", c_char_p)]


class rlorch_command(Structure):
    _fields_ = [
        ("kind", rlorch_command_kind),
        ("run_id", c_char_p),
        ("generate", rlorch_generate),
        ("train", rlorch_train),
        ("abort", rlorch_abort),
        ("shutdown_reason", c_char_p),
    ]


class rlorch_batch_rollout(Structure):
    _fields_ = [
        ("id", c_uint64),
        ("group_id", c_uint64),
        ("policy_version", c_uint64),
        ("prompt_token_ids", POINTER(c_uint32)),
        ("n_prompt_token_ids", c_size_t),
        ("completion_token_ids", POINTER(c_uint32)),
        ("n_completion_token_ids", c_size_t),
        ("completion_logprobs", POINTER(c_float)),
        ("rewards", POINTER(c_double)),
        ("n_rewards", c_size_t),
        ("finish_reason", rlorch_finish),
        ("metadata", POINTER(c_uint8)),
        ("n_metadata", c_size_t),
    ]


class rlorch_batch(Structure):
    _fields_ = [
        ("step", c_uint64),
        ("n_rollouts", c_size_t),
        ("rollouts", POINTER(rlorch_batch_rollout)),
    ]


class rlorch_rollout(Structure):
    _fields_ = [
        ("token_ids", POINTER(c_uint32)),
        ("n_tokens", c_size_t),
        ("logprobs", POINTER(c_float)),
        ("rewards", POINTER(c_double)),
        ("n_rewards", c_size_t),
        ("finish_reason", rlorch_finish),
        ("metadata", POINTER(c_uint8)),
        ("n_metadata", c_size_t),
        ("seconds", c_double),
    ]


STRUCTS = [rlorch_error, rlorch_tensor, rlorch_shard, rlorch_part, rlorch_options, rlorch_sampling, rlorch_generate,
           rlorch_train, rlorch_abort, rlorch_command, rlorch_batch_rollout, rlorch_batch,
           rlorch_rollout]

# ---- functions: name -> (restype, argtypes) -------------------------------------

_worker_p = POINTER(rlorch_worker)
_command_p = POINTER(rlorch_command)
_error_p = POINTER(rlorch_error)

FUNCTIONS = {
    "rlorch_version": (c_uint32, [POINTER(c_char_p)]),
    "rlorch_status_name": (c_char_p, [c_int]),
    "rlorch_options_init": (None, [POINTER(rlorch_options), c_size_t, rlorch_role]),
    "rlorch_create": (rlorch_status, [POINTER(rlorch_options), POINTER(_worker_p), _error_p]),
    "rlorch_start": (rlorch_status, [_worker_p, _error_p]),
    "rlorch_stop": (None, [_worker_p]),
    "rlorch_free": (None, [_worker_p]),
    "rlorch_stop_status": (rlorch_status, [_worker_p, _error_p]),
    "rlorch_policy_version": (c_uint64, [_worker_p]),
    "rlorch_broadcast_id": (c_size_t, [_worker_p, c_char_p, c_size_t]),
    "rlorch_data_address": (c_char_p, [_worker_p]),
    "rlorch_next": (rlorch_status, [_worker_p, c_double, POINTER(_command_p), _error_p]),
    "rlorch_command_free": (None, [_command_p]),
    "rlorch_fetch_batch": (rlorch_status, [_worker_p, _command_p, POINTER(POINTER(rlorch_batch)),
                                           _error_p]),
    "rlorch_batch_free": (None, [POINTER(rlorch_batch)]),
    "rlorch_report_rollouts": (rlorch_status, [_worker_p, _command_p, c_uint64,
                                               POINTER(rlorch_rollout), c_size_t, _error_p]),
    "rlorch_report_step": (rlorch_status, [_worker_p, _command_p, c_double, _error_p]),
    "rlorch_report_error": (rlorch_status, [_worker_p, _command_p, c_char_p, _error_p]),
}

SONAME = "librlorch.so.1"


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
            # CDLL releases the GIL around every call: rlorch_next blocks,
            # and the library's threads call back into Python meanwhile.
            handle = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path}: {e}")
            continue
        for name, (restype, argtypes) in FUNCTIONS.items():
            try:
                fn = getattr(handle, name)
            except AttributeError:
                raise ImportError(f"{path} lacks {name}: not the library this package "
                                  "declares") from None
            fn.restype, fn.argtypes = restype, argtypes
        return handle, path
    raise ImportError("cannot load librlorch (set RLORCH_LIBRARY to its path): " + "; ".join(tried))


lib, LIBRARY_PATH = _open()
