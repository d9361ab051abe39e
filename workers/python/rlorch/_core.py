"""The Worker and its values: a thin, owning layer over librlorch's C API.

Ownership follows rlorch.h: the library keeps the tensors' data pointers
(never a copy), so a Worker keeps every Tensor (and what it points into)
alive until close(); commands and batches are copied into Python objects
when they arrive, and the C command stays attached (freed by the garbage
collector) because reports must name it. Callbacks run on the library's
threads: an exception in one is logged and goes no further, never into C."""
import array
import atexit
import ctypes
import logging
import operator
import threading
import weakref

import numpy as np

from . import _ffi as C
from ._ffi import LIBRARY_PATH, lib

API_VERSION = C.RLORCH_API_VERSION  # the API the declarations in _ffi describe
log = logging.getLogger("rlorch")

_FINISH = {
    "unspecified": C.RLORCH_FINISH_UNSPECIFIED,
    "stop": C.RLORCH_FINISH_STOP,
    "length": C.RLORCH_FINISH_LENGTH,
    "abort": C.RLORCH_FINISH_ABORT,
}
_FINISH_NAME = {v: k for k, v in _FINISH.items()}
_KIND = {
    C.RLORCH_CMD_GENERATE: "generate",
    C.RLORCH_CMD_TRAIN: "train",
    C.RLORCH_CMD_ABORT: "abort",
    C.RLORCH_CMD_SHUTDOWN: "shutdown",
}
_ROLE = {"trainer": C.RLORCH_ROLE_TRAINER, "inference": C.RLORCH_ROLE_INFERENCE}
_DTYPE = {
    "fp32": C.RLORCH_DTYPE_FP32,
    "float32": C.RLORCH_DTYPE_FP32,
    "bf16": C.RLORCH_DTYPE_BF16,
    "bfloat16": C.RLORCH_DTYPE_BF16,
    "fp16": C.RLORCH_DTYPE_FP16,
    "float16": C.RLORCH_DTYPE_FP16,
    "u16": C.RLORCH_DTYPE_U16,
    "uint16": C.RLORCH_DTYPE_U16,
}
_DTYPE_SIZE = {C.RLORCH_DTYPE_FP32: 4, C.RLORCH_DTYPE_BF16: 2, C.RLORCH_DTYPE_FP16: 2,
               C.RLORCH_DTYPE_U16: 2}
_RESIDENCY = {
    "gpu": C.RLORCH_RES_GPU,
    "host_pinned": C.RLORCH_RES_HOST_PINNED,
    "pinned": C.RLORCH_RES_HOST_PINNED,
    "host_pageable": C.RLORCH_RES_HOST_PAGEABLE,
    "host": C.RLORCH_RES_HOST_PAGEABLE,
}
_OFFLOAD = {
    "none": C.RLORCH_OFFLOAD_NONE,
    "params": C.RLORCH_OFFLOAD_PARAMS,
    "params+optimizer": C.RLORCH_OFFLOAD_PARAMS_OPTIMIZER,
}
_PART_KIND = {"whole": C.RLORCH_PART_WHOLE, "slice": C.RLORCH_PART_SLICE, "none": C.RLORCH_PART_NONE}
_LOG_LEVEL = {
    "debug": C.RLORCH_LOG_DEBUG,
    "info": C.RLORCH_LOG_INFO,
    "warn": C.RLORCH_LOG_WARN,
    "warning": C.RLORCH_LOG_WARN,
    "error": C.RLORCH_LOG_ERROR,
}
_PY_LEVEL = {
    C.RLORCH_LOG_DEBUG: logging.DEBUG,
    C.RLORCH_LOG_INFO: logging.INFO,
    C.RLORCH_LOG_WARN: logging.WARNING,
    C.RLORCH_LOG_ERROR: logging.ERROR,
}


def version():
    """(API version of the loaded library, its release string)."""
    rel = ctypes.c_char_p()
    v = lib.rlorch_version(ctypes.byref(rel))
    return int(v), (rel.value or b"").decode()


def library_path():
    """The librlorch file this package loaded."""
    return LIBRARY_PATH


class RlorchError(Exception):
    """A failure of the library: `code` (an rlorch_status, negative),
    `code_name` ("RLORCH_E_INVALID", ...) and the library's `message`."""

    def __init__(self, code, message):
        super().__init__(code, message)
        self.code = int(code)
        self.message = message

    @property
    def code_name(self):
        return (lib.rlorch_status_name(self.code) or b"?").decode()

    def __str__(self):
        return f"{self.code_name}: {self.message}"


class Stopped(RlorchError):
    """The worker stopped (shutdown, stop(), a fatal error): nothing more comes."""


def _raise(rc, err):
    msg = err.message.decode("utf-8", "replace") if err is not None else ""
    cls = Stopped if rc == C.RLORCH_E_STOPPED else RlorchError
    raise cls(rc, msg)


def _invalid(what):
    return RlorchError(C.RLORCH_E_INVALID, what)


def _enum(table, value, what):
    # An int goes to the library as it is, which names a bad one itself.
    if isinstance(value, int):
        return value
    key = str(value).lower()
    if key.startswith("torch."):
        key = key[len("torch."):]
    if key not in table:
        raise _invalid(f"{what}: unknown value {value!r} (one of {', '.join(sorted(table))})")
    return table[key]


_NP_DTYPE = {"float32": "fp32", "float16": "fp16", "uint16": "u16"}


class Tensor:
    """One of the caller's tensors, by address: the library reads (trainer) or
    writes (inference) `data` in place until the worker is closed.

    data: an address (int) with `shape` and `dtype`, or a C-contiguous numpy
    array (shape and dtype from it; a uint16 array holds bf16 when dtype="bf16").
    dtype/wire_dtype: "fp32" | "bf16" | "fp16" | "u16" (or the torch dtype);
    wire_dtype defaults to dtype. `owner` is kept alive with the tensor
    (rlorch.torch puts the torch tensor there)."""

    __slots__ = ("name", "data", "shape", "dtype", "wire_dtype", "layer", "residency", "device",
                 "owner")

    def __init__(self, name, data, shape=None, dtype=None, wire_dtype=None, layer=0,
                 residency="host_pageable", device=-1, owner=None):
        if hasattr(data, "__array_interface__"):
            arr = data
            ai = arr.__array_interface__
            if not arr.flags["C_CONTIGUOUS"]:
                raise _invalid(f"tensor {name!r}: the array is not C-contiguous (the library "
                               "reads and writes its memory in place; pass np.ascontiguousarray "
                               "of it and keep that one)")
            if shape is None:
                shape = arr.shape
            if dtype is None:
                dtype = _NP_DTYPE.get(str(arr.dtype))
                if dtype is None:
                    raise _invalid(f"tensor {name!r}: numpy dtype {arr.dtype} has no rlorch dtype")
            elif arr.dtype.itemsize != _DTYPE_SIZE.get(_enum(_DTYPE, dtype, "dtype"), -1):
                raise _invalid(f"tensor {name!r}: dtype {dtype} does not fit numpy {arr.dtype}")
            if owner is None:
                owner = arr
            data = ai["data"][0]
        if shape is None or dtype is None:
            raise _invalid(f"tensor {name!r}: an address needs shape and dtype")
        self.name = name
        self.data = int(data)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.wire_dtype = dtype if wire_dtype is None else wire_dtype
        self.layer = int(layer)
        self.residency = residency
        self.device = int(device)
        self.owner = owner

    def __repr__(self):
        return (f"rlorch.Tensor({self.name!r}, shape={self.shape}, dtype={self.dtype}, "
                f"wire_dtype={self.wire_dtype}, layer={self.layer}, residency={self.residency})")


class Part:
    """The part of one trainer tensor an inference worker holds (a rank of a
    tensor- or expert-parallel engine): kind "whole", "slice" (indices
    [start, start + count) along dimension `dim`: 0 the rows of a 2-D weight,
    1 its columns) or "none" (an expert it does not serve). The worker's
    Tensor of that name keeps the FULL shape (pass shape=), and its data holds
    the part, dense and row-major in the part's own shape; a tensor held
    "none" is left out of the worker's tensors."""

    __slots__ = ("name", "kind", "dim", "start", "count")

    def __init__(self, name, kind="slice", dim=0, start=0, count=0):
        self.name = name
        self.kind = kind
        self.dim = dim
        self.start = start
        self.count = count

    def __repr__(self):
        return (f"rlorch.Part({self.name!r}, {self.kind!r}, dim={self.dim}, start={self.start}, "
                f"count={self.count})")


class Sampling:
    __slots__ = ("temperature", "top_p", "top_k", "max_tokens", "stop_token_ids", "seed")

    def __init__(self, s):
        self.temperature = s.temperature
        self.top_p = s.top_p
        self.top_k = s.top_k
        self.max_tokens = s.max_tokens
        self.stop_token_ids = _u32_list(s.stop_token_ids, s.n_stop_token_ids)
        self.seed = s.seed

    def __repr__(self):
        return "Sampling(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


def _u32_list(ptr, n):
    return list(ptr[:n]) if n else []


def _str(p):
    # A char * field or argument reads as bytes, NULL as None.
    return p.decode("utf-8", "replace") if p is not None else ""


def _bytes(ptr, n):
    return ctypes.string_at(ptr, n) if n else b""


def _int(ctype, v):
    """v as a C integer of ctype, or the OverflowError/TypeError a C
    conversion would have: ctypes itself wraps out-of-range values silently."""
    i = operator.index(v)  # TypeError for a float, a str
    if ctype(i).value != i:
        raise OverflowError(f"{i} is out of range for C {ctype.__name__}")
    return i


def _c_array(ctype, typecode, values):
    """A C array of `values`, never empty (a zero-length one has no address to
    pass); array.array checks each value's range and type as C would."""
    a = array.array(typecode, values or [0])
    if a.itemsize != ctypes.sizeof(ctype):
        raise TypeError(f"array typecode {typecode!r} is not {ctype.__name__}")
    return (ctype * len(a)).from_buffer(a)  # shares a's memory and keeps it alive


class Command:
    """A command from the orchestrator, copied out of the library's. Fields
    that do not belong to the kind are None."""

    def __init__(self, ptr):
        self._ptr = ptr  # reports pass it back
        # Freed with this object, as the collector finds it, never at exit:
        # a report on another thread may still name it then.
        weakref.finalize(self, lib.rlorch_command_free, ptr).atexit = False
        c = ptr.contents
        self.kind = _KIND.get(c.kind, f"unknown-{int(c.kind)}")
        self.run_id = _str(c.run_id)
        self.request_id = self.group_id = self.count = None
        self.prompt_token_ids = self.prompt_metadata = self.sampling = None
        self.step = self.seed = self.n_rollouts = self.groups = self.group_size = None
        self.reason = None
        if self.kind == "generate":
            g = c.generate
            self.request_id, self.group_id, self.count = g.request_id, g.group_id, g.count
            self.prompt_token_ids = _u32_list(g.prompt_token_ids, g.n_prompt_token_ids)
            self.prompt_metadata = _bytes(g.prompt_metadata, g.n_prompt_metadata)
            self.sampling = Sampling(g.sampling)
        elif self.kind == "train":
            t = c.train
            self.step, self.seed, self.n_rollouts = t.step, t.seed, t.n_rollouts
            self.groups, self.group_size = t.groups, t.group_size
        elif self.kind == "abort":
            self.request_id, self.reason = c.abort.request_id, _str(c.abort.reason)
        elif self.kind == "shutdown":
            self.reason = _str(c.shutdown_reason)

    def __repr__(self):
        keys = {"generate": ("request_id", "group_id", "count"), "train": ("step", "n_rollouts"),
                "abort": ("request_id", "reason"), "shutdown": ("reason",)}.get(self.kind, ())
        return f"Command({self.kind}, " + ", ".join(f"{k}={getattr(self, k)!r}" for k in keys) + ")"


def _np(ptr, n, dtype):
    if not n:
        return np.empty(0, dtype=dtype)
    return np.ctypeslib.as_array(ptr, shape=(n,)).astype(dtype, copy=True)


class BatchRollout:
    """One rollout of a trainer's batch: token ids (uint32), logprobs (float32,
    or None when the engine sent none) and rewards (float64) as numpy arrays."""

    __slots__ = ("id", "group_id", "policy_version", "prompt_token_ids", "completion_token_ids",
                 "logprobs", "rewards", "finish_reason", "metadata")

    def __init__(self, r):
        self.id, self.group_id, self.policy_version = r.id, r.group_id, r.policy_version
        self.prompt_token_ids = _np(r.prompt_token_ids, r.n_prompt_token_ids, np.uint32)
        self.completion_token_ids = _np(r.completion_token_ids, r.n_completion_token_ids,
                                        np.uint32)
        self.logprobs = (None if not r.completion_logprobs else
                         _np(r.completion_logprobs, r.n_completion_token_ids, np.float32))
        self.rewards = _np(r.rewards, r.n_rewards, np.float64)
        self.finish_reason = _FINISH_NAME.get(r.finish_reason, "unspecified")
        self.metadata = _bytes(r.metadata, r.n_metadata)

    def __repr__(self):
        return (f"BatchRollout(id={self.id}, group_id={self.group_id}, "
                f"version={self.policy_version}, tokens={len(self.completion_token_ids)})")


class Batch:
    """A train step's batch, in the step's order."""

    def __init__(self, step, rollouts):
        self.step = step
        self.rollouts = rollouts

    def __len__(self):
        return len(self.rollouts)

    def __iter__(self):
        return iter(self.rollouts)

    def to_numpy(self, pad_id=0):
        """Padded arrays (rows in rollout order): prompt_ids, prompt_mask,
        completion_ids, completion_mask, logprobs (0 where missing), rewards
        (n x the most rewards a rollout has, 0-padded), group_ids, versions."""
        n = len(self.rollouts)
        p = max((len(r.prompt_token_ids) for r in self.rollouts), default=0)
        c = max((len(r.completion_token_ids) for r in self.rollouts), default=0)
        k = max((len(r.rewards) for r in self.rollouts), default=0)
        out = {
            "prompt_ids": np.full((n, p), pad_id, dtype=np.int64),
            "prompt_mask": np.zeros((n, p), dtype=bool),
            "completion_ids": np.full((n, c), pad_id, dtype=np.int64),
            "completion_mask": np.zeros((n, c), dtype=bool),
            "logprobs": np.zeros((n, c), dtype=np.float32),
            "rewards": np.zeros((n, k), dtype=np.float32),
            "group_ids": np.array([r.group_id for r in self.rollouts], dtype=np.int64),
            "versions": np.array([r.policy_version for r in self.rollouts], dtype=np.int64),
        }
        for i, r in enumerate(self.rollouts):
            lp, lc = len(r.prompt_token_ids), len(r.completion_token_ids)
            out["prompt_ids"][i, :lp] = r.prompt_token_ids
            out["prompt_mask"][i, :lp] = True
            out["completion_ids"][i, :lc] = r.completion_token_ids
            out["completion_mask"][i, :lc] = True
            if r.logprobs is not None:
                out["logprobs"][i, :lc] = r.logprobs
            out["rewards"][i, :len(r.rewards)] = r.rewards
        return out

    def to_torch(self, pad_id=0):
        """to_numpy() as torch tensors (rlorch.torch; imports torch)."""
        from .torch import batch_to_torch

        return batch_to_torch(self, pad_id=pad_id)

    def __repr__(self):
        return f"Batch(step={self.step}, rollouts={len(self.rollouts)})"


class Completion:
    """One completion of a generate command, for Worker.report_rollouts.
    token_ids/logprobs/rewards: sequences, numpy arrays or torch tensors."""

    __slots__ = ("token_ids", "logprobs", "rewards", "finish_reason", "metadata", "seconds")

    def __init__(self, token_ids, logprobs=None, rewards=None, finish_reason="stop", metadata=b"",
                 seconds=0.0):
        self.token_ids = token_ids
        self.logprobs = logprobs
        self.rewards = rewards
        self.finish_reason = finish_reason
        self.metadata = metadata
        self.seconds = seconds


def _seq(x):
    if x is None:
        return []
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, (int, float)):
        return [x]
    return list(x)


class BroadcastGate:
    """Generation against the broadcast, for an inference engine: pass
    gate.before and gate.after as on_broadcast_before/after and generate
    inside `with gate.reading():`. A broadcast waits for the generations
    reading the weights to finish and holds new ones back until it ends;
    `torn` is True after a broadcast that failed part-way (the weights are
    part new, part old until a later one succeeds)."""

    def __init__(self):
        self._cv = threading.Condition()
        self._readers = 0
        self._writing = False
        self.torn = False
        self.version = None  # of the last successful broadcast

    def before(self, version):
        with self._cv:
            self._writing = True
            self._cv.wait_for(lambda: self._readers == 0)

    def after(self, ok, version):
        with self._cv:
            self._writing = False
            self.torn = not ok
            if ok:
                self.version = version
            self._cv.notify_all()

    def reading(self):
        gate = self

        class _Reading:
            def __enter__(self):
                with gate._cv:
                    gate._cv.wait_for(lambda: not gate._writing)
                    gate._readers += 1
                return gate

            def __exit__(self, *exc):
                with gate._cv:
                    gate._readers -= 1
                    gate._cv.notify_all()
                return False

        return _Reading()


# The log callback is process-wide in the library (the last worker created
# with one gets every worker's events): one callback, for the module's life.
def _on_log(ud, level, event, fields):
    try:
        pylevel = _PY_LEVEL.get(level, logging.INFO)
        if log.isEnabledFor(pylevel):
            log.log(pylevel, "%s %s", _str(event), _str(fields))
    except BaseException:
        _callback_failed()


def _callback_failed():
    # Only reached if logging itself failed: say so on stderr, never raise into C.
    import traceback

    try:
        traceback.print_exc()
    except BaseException:
        pass


_log_cb = C.rlorch_log_fn(_on_log)

# Every worker not closed yet. The library's threads call back into a
# worker's callbacks until it is freed, so a worker must not be collected
# before close(): this set holds it (an unclosed worker leaks, it does not
# crash), and at exit, before the interpreter goes, the rest are closed.
_open_workers = set()


@atexit.register
def _close_open_workers():
    for w in list(_open_workers):
        w.stop()
    for w in list(_open_workers):
        w.close()


class Worker:
    """One trainer rank or inference engine joined to an orchestrator.

    Created (options and tensors checked by the library; RlorchError if bad),
    then start() registers. As a context manager: start on enter, stop and
    close on exit. Iterating yields commands until the worker stops.
    next() is for one thread at a time; the reports may come from any
    thread; stop() from any thread but the callbacks; close() once nothing
    else runs on the worker. A worker not closed is kept alive (the library
    may still call it) and closed when the interpreter exits.

    A trainer may say what it trains, as run specs require it: model (the
    spec's preset name) and offload ("none", "params", "params+optimizer":
    where its weights and optimizer live); one restored from its own
    checkpoint says which run and version its tensors hold (held_run_id,
    held_version). token is the bearer token itself, instead of token_file.

    A rank of a sharded trainer (FSDP, ZeRO) says its rank and its group's
    size (trainer_rank, trainer_ranks) and, parallel to tensors, the part of
    each it holds: shards[i] = (element_offset, element_count) of the
    row-major full tensor, whose shape the Tensor gives (pass shape= the full
    shape: the array holds only the part).

    An inference worker that is a rank of a tensor- or expert-parallel engine
    lists the parts it holds (parts: rlorch.Part each, by tensor name;
    tensors not listed are held whole); its Tensors keep the full shapes and
    hold the parts (see rlorch.Part).

    Where the worker runs is detected (its GPU's bus id, NUMA node and
    NVLink peers; the node's NICs and their speeds) and reported at
    registration; node (the node's name, default the machine's boot id),
    nics with nic_gbits (that many NICs of that speed in Gb/s instead of
    those detected) and nic_gbits alone (every detected NIC's speed) say
    what the system cannot, as rlorch's agents' --node, --nics and
    --nic-gbits do."""

    def __init__(self, role, orchestrator, tensors=(), name=None, token_file=None,
                 tls_ca_file=None, tls_cert_file=None, tls_key_file=None, device=-1,
                 data_listen=None, max_concurrent_requests=8, connect_timeout_s=30.0,
                 on_broadcast_before=None, on_broadcast_after=None, log_level="info",
                 token=None, model=None, offload=None, held_run_id=None, held_version=0,
                 trainer_rank=0, trainer_ranks=0, shards=None, parts=None, node=None, nics=0,
                 nic_gbits=0.0):
        if role not in _ROLE:
            raise _invalid(f"options.role: {role!r} is neither 'trainer' nor 'inference'")
        self.role = role
        self._w = None
        self._started = False
        self._lock = threading.Lock()
        self._tensors = list(tensors or ())
        self._before_fn, self._after_fn = on_broadcast_before, on_broadcast_after
        # The options of the API version declared here, however long a later
        # library's are: it is told the size, and writes nothing past it.
        # The options keep the C strings and arrays assigned to their fields
        # (ctypes holds a reference), for the create call.
        o = C.rlorch_options()
        lib.rlorch_options_init(ctypes.byref(o), ctypes.sizeof(C.rlorch_options), _ROLE[role])

        def cstr(field, v):
            if v is None:
                return None
            if not isinstance(v, (str, bytes)):
                v = str(v)  # a pathlib.Path
            b = v.encode() if isinstance(v, str) else v
            if b"\0" in b:
                raise _invalid(f"options.{field}: contains a NUL byte")
            return b

        ctype_of = {f: t for f, t in C.rlorch_options._fields_}

        def setnum(field, v):
            try:
                t = ctype_of[field]
                setattr(o, field, v if t is ctypes.c_double else _int(t, v))
            except (OverflowError, TypeError, ValueError) as e:
                raise _invalid(f"options.{field}: {v!r}: {e}") from None

        o.orchestrator = cstr("orchestrator", orchestrator)
        o.name = cstr("name", name)
        o.token_file = cstr("token_file", token_file)
        o.tls_ca_file = cstr("tls_ca_file", tls_ca_file)
        o.tls_cert_file = cstr("tls_cert_file", tls_cert_file)
        o.tls_key_file = cstr("tls_key_file", tls_key_file)
        o.data_listen = cstr("data_listen", data_listen)
        o.token = cstr("token", token)
        o.model = cstr("model", model)
        o.held_run_id = cstr("held_run_id", held_run_id)
        o.node = cstr("node", node)
        if offload is not None:
            o.offload = _int(ctypes.c_int, _enum(_OFFLOAD, offload, "options.offload"))
        setnum("held_version", held_version)
        setnum("trainer_rank", trainer_rank)
        setnum("trainer_ranks", trainer_ranks)
        setnum("device", device)
        setnum("max_concurrent_requests", max_concurrent_requests)
        setnum("connect_timeout_s", connect_timeout_s)
        setnum("nics", nics)
        setnum("nic_gbits", nic_gbits)
        o.log = _log_cb
        o.log_level = _int(ctypes.c_int, _enum(_LOG_LEVEL, log_level, "options.log_level"))

        # Kept until close(): the library calls them on its own threads.
        self._before_cb = self._after_cb = None
        if on_broadcast_before is not None:
            self._before_cb = C.rlorch_broadcast_before_fn(self._before)
            o.on_broadcast_before = self._before_cb
        if on_broadcast_after is not None:
            self._after_cb = C.rlorch_broadcast_after_fn(self._after)
            o.on_broadcast_after = self._after_cb

        n = len(self._tensors)
        arr = (C.rlorch_tensor * max(n, 1))()
        # The library copies the shapes at create; kept with the worker anyway,
        # as the tensors are, so nothing it was given goes before close().
        self._shapes = []
        for i, t in enumerate(self._tensors):
            if not isinstance(t, Tensor):
                raise _invalid(f"options.tensors[{i}]: a {type(t).__name__}, not an rlorch.Tensor")
            what = f"options.tensors[{i}] {t.name!r}"
            c = arr[i]
            c.name = cstr(f"tensors[{i}].name", t.name)
            c.storage_dtype = _int(ctypes.c_int, _enum(_DTYPE, t.dtype, f"{what}: storage_dtype"))
            c.wire_dtype = _int(ctypes.c_int, _enum(_DTYPE, t.wire_dtype, f"{what}: wire_dtype"))
            c.residency = _int(ctypes.c_int, _enum(_RESIDENCY, t.residency, f"{what}: residency"))
            try:
                c.layer = _int(ctypes.c_uint32, t.layer)
                c.device = _int(ctypes.c_int, t.device)
                shape = _c_array(ctypes.c_uint64, "Q", list(t.shape))
                c.data = _int(ctypes.c_size_t, t.data) or None  # an address: pointer-sized
            except (OverflowError, TypeError) as e:
                raise _invalid(f"{what}: {e}") from None
            self._shapes.append(shape)
            c.ndim = len(t.shape)
            c.shape = shape
        o.tensors = arr if n else None
        o.ntensors = n
        self._shards = None
        if shards is not None:
            shards = list(shards)
            if len(shards) != n:
                raise _invalid(f"options.shards: {len(shards)} entries for {n} tensors")
            self._shards = (C.rlorch_shard * max(n, 1))()
            for i, sh in enumerate(shards):
                try:
                    off, cnt = sh
                    self._shards[i].element_offset = _int(ctypes.c_uint64, off)
                    self._shards[i].element_count = _int(ctypes.c_uint64, cnt)
                except (OverflowError, TypeError, ValueError) as e:
                    raise _invalid(f"options.shards[{i}]: {sh!r}: {e}") from None
            o.shards = self._shards
        # Kept with the worker as the shapes are; the library copies them.
        self._parts = None
        if parts is not None:
            parts = list(parts)
            self._parts = (C.rlorch_part * max(len(parts), 1))()
            for i, pt in enumerate(parts):
                if not isinstance(pt, Part):
                    raise _invalid(f"options.parts[{i}]: a {type(pt).__name__}, not an rlorch.Part")
                c = self._parts[i]
                c.name = cstr(f"parts[{i}].name", pt.name)
                what = f"options.parts[{i}] {pt.name!r}"
                c.kind = _int(ctypes.c_int, _enum(_PART_KIND, pt.kind, f"{what}.kind"))
                for field, ctype in (("dim", ctypes.c_uint32), ("start", ctypes.c_uint64),
                                     ("count", ctypes.c_uint64)):
                    v = getattr(pt, field)
                    try:
                        setattr(c, field, _int(ctype, v))
                    except (OverflowError, TypeError, ValueError) as e:
                        raise _invalid(f"{what}.{field}: {v!r}: {e}") from None
            o.parts = self._parts if parts else None
            o.nparts = len(parts)

        wp = ctypes.POINTER(C.rlorch_worker)()
        err = C.rlorch_error()
        rc = lib.rlorch_create(ctypes.byref(o), ctypes.byref(wp), ctypes.byref(err))
        if rc != C.RLORCH_OK:
            _raise(rc, err)
        self._w = wp
        _open_workers.add(self)

    # ---- callbacks, on the library's command thread --------------------------------

    def _before(self, ud, version):
        try:
            self._before_fn(int(version))
        except BaseException:
            try:
                log.exception("on_broadcast_before(version=%d) raised; the broadcast goes on",
                              version)
            except BaseException:
                _callback_failed()

    def _after(self, ud, ok, version):
        try:
            self._after_fn(bool(ok), int(version))
        except BaseException:
            try:
                log.exception("on_broadcast_after(ok=%d, version=%d) raised", ok, version)
            except BaseException:
                _callback_failed()

    # ---- life --------------------------------------------------------------------

    def _handle(self):
        if self._w is None:
            raise RlorchError(C.RLORCH_E_STATE, "the worker is closed")
        return self._w

    def start(self):
        """Registers and starts the library's threads; blocks until the first
        registration (RlorchError: REFUSED, UNAVAILABLE after connect_timeout_s)."""
        err = C.rlorch_error()
        rc = lib.rlorch_start(self._handle(), ctypes.byref(err))
        if rc != C.RLORCH_OK:
            _raise(rc, err)
        self._started = True

    def stop(self):
        """Asks the worker to stop: next() drains what is queued, then raises Stopped."""
        if self._w is not None:
            lib.rlorch_stop(self._w)

    def close(self):
        """Stops, waits for the library's threads and frees the worker (and
        lets go of the tensors). Idempotent."""
        with self._lock:
            w, self._w = self._w, None
        if w is not None:
            lib.rlorch_free(w)
            _open_workers.discard(self)
        self._before_cb = self._after_cb = None
        self._tensors = []
        self._shapes = []

    def __enter__(self):
        if not self._started:
            self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        self.close()
        return False

    @property
    def policy_version(self):
        return int(lib.rlorch_policy_version(self._handle()))

    @property
    def broadcast_id(self):
        """In a broadcast callback, the plan id it is about; "" elsewhere."""
        buf = ctypes.create_string_buffer(128)
        lib.rlorch_broadcast_id(self._handle(), buf, len(buf))
        return buf.value.decode()

    @property
    def tensors(self):
        return list(self._tensors)

    # ---- commands ----------------------------------------------------------------

    def next(self, timeout=1.0):
        """The next command, or None when none came within `timeout` seconds
        (None: wait without a limit). Raises Stopped once the worker stopped
        and nothing is left."""
        cp = ctypes.POINTER(C.rlorch_command)()
        err = C.rlorch_error()
        t = -1.0 if timeout is None else float(timeout)
        rc = lib.rlorch_next(self._handle(), t, ctypes.byref(cp), ctypes.byref(err))
        if rc == C.RLORCH_TIMEOUT:
            return None
        if rc != C.RLORCH_OK:
            _raise(rc, err)
        return Command(cp)

    def __iter__(self):
        while True:
            try:
                c = self.next(1.0)
            except Stopped:
                return
            if c is not None:
                yield c

    def fetch_batch(self, cmd):
        """Trainer: the batch of train command `cmd` (blocks while it streams).
        RlorchError REFUSED when the orchestrator no longer holds it: then
        report_error(cmd, ...) skips the step."""
        bp = ctypes.POINTER(C.rlorch_batch)()
        err = C.rlorch_error()
        rc = lib.rlorch_fetch_batch(self._handle(), _cmd_ptr(cmd), ctypes.byref(bp),
                                    ctypes.byref(err))
        if rc != C.RLORCH_OK:
            _raise(rc, err)
        try:
            b = bp.contents
            return Batch(int(b.step), [BatchRollout(b.rollouts[i]) for i in range(b.n_rollouts)])
        finally:
            lib.rlorch_batch_free(bp)

    # ---- reports -----------------------------------------------------------------

    def report_rollouts(self, cmd, version, completions):
        """Inference: the cmd.count completions of generate command `cmd`, made
        from the weights of policy `version` (policy_version when generation began)."""
        completions = list(completions)
        n = len(completions)
        # Each rollout keeps the arrays assigned to its fields (ctypes holds them).
        arr = (C.rlorch_rollout * max(n, 1))()
        for i, c in enumerate(completions):
            what = f"completions[{i}]"
            if not isinstance(c, Completion):
                raise _invalid(f"{what}: a {type(c).__name__}, not an rlorch.Completion")
            r = arr[i]
            try:
                toks = _seq(c.token_ids)
                r.token_ids, r.n_tokens = _c_array(ctypes.c_uint32, "I", toks), len(toks)
                if c.logprobs is not None:
                    lps = _seq(c.logprobs)
                    if len(lps) != len(toks):
                        raise _invalid(f"{what}.logprobs: {len(lps)} values for {len(toks)} tokens")
                    r.logprobs = _c_array(ctypes.c_float, "f", lps)
                rw = [float(x) for x in _seq(c.rewards)]
                if rw:
                    r.rewards, r.n_rewards = _c_array(ctypes.c_double, "d", rw), len(rw)
                meta = c.metadata.encode() if isinstance(c.metadata, str) else bytes(c.metadata or b"")
                if meta:
                    r.metadata, r.n_metadata = _c_array(ctypes.c_uint8, "B", meta), len(meta)
                r.finish_reason = _int(ctypes.c_int,
                                       _enum(_FINISH, c.finish_reason, f"{what}.finish_reason"))
                r.seconds = float(c.seconds)
            except (OverflowError, TypeError, ValueError) as e:
                raise _invalid(f"{what}: {e}") from None
        err = C.rlorch_error()
        try:
            v = _int(ctypes.c_uint64, int(version))
        except (OverflowError, TypeError, ValueError):
            raise _invalid(f"version: {version!r} is not a policy version") from None
        rc = lib.rlorch_report_rollouts(self._handle(), _cmd_ptr(cmd), v, arr, n, ctypes.byref(err))
        if rc != C.RLORCH_OK:
            _raise(rc, err)

    def report_step(self, cmd, train_seconds=0.0):
        """Trainer: the optimizer step of `cmd` is done and the tensors hold
        the new weights (version cmd.step + 1); the broadcast follows."""
        err = C.rlorch_error()
        rc = lib.rlorch_report_step(self._handle(), _cmd_ptr(cmd), float(train_seconds),
                                    ctypes.byref(err))
        if rc != C.RLORCH_OK:
            _raise(rc, err)

    def report_error(self, cmd, message):
        """`cmd` could not be served, because of `message` (see rlorch.h:
        a generate request is freed, a refused batch's step skipped, any
        other train step stops the worker)."""
        err = C.rlorch_error()
        rc = lib.rlorch_report_error(self._handle(), _cmd_ptr(cmd), str(message).encode(),
                                     ctypes.byref(err))
        if rc != C.RLORCH_OK:
            _raise(rc, err)


def _cmd_ptr(cmd):
    if not isinstance(cmd, Command):
        raise _invalid(f"cmd: a {type(cmd).__name__}, not an rlorch.Command from next()")
    return cmd._ptr
