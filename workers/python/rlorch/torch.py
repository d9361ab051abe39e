"""PyTorch helpers: manifests over a model's own parameters, and batches as
tensors. Importing this module imports torch (`import rlorch` does not).

manifest() describes tensors by the address of their storage: a trainer's
fp32 parameters are read in place (the library casts them to the wire dtype
chunk by chunk), an inference model's own bf16 parameters are written in
place by each broadcast. Nothing is copied, so every tensor must be
contiguous, and the model must keep the very same storage while the worker
lives (an optimizer's in-place step does; `param.data = other` does not: the
worker would go on reading or writing the old memory)."""
import re
from collections.abc import Mapping

import torch

from ._core import Tensor, _invalid

_DTYPE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|blocks|h)\.(\d+)(?:\.|$)")


def layer_of_name(name):
    """The decoder layer a name like "model.layers.3.mlp.up.weight" belongs
    to (3); 0 for a name without one (embeddings, the final norm, the head)."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else 0


def _named(src):
    if isinstance(src, torch.nn.Module):
        return list(src.named_parameters())
    if isinstance(src, Mapping):
        return list(src.items())
    return list(src)  # (name, tensor) pairs


def _dtype(t, name, what):
    d = t if isinstance(t, str) else _DTYPE.get(t)  # a name goes to the library's check
    if d is None:
        raise _invalid(f"tensor {name!r}: {what} {t} has no rlorch dtype (fp32, bf16, fp16); "
                       "leave it out with include=")
    return d


def _where(t):
    if t.is_cuda:
        return "gpu", t.device.index if t.device.index is not None else torch.cuda.current_device()
    if t.device.type != "cpu":
        raise ValueError(f"device {t.device} is neither cpu nor cuda")
    return ("host_pinned" if t.is_pinned() else "host_pageable"), -1


def _parts(recv_name, spec, rows):
    """[(sender name, first row, rows)] of a fused receiver parameter: a list
    of names splits dim 0 evenly; (name, rows) pairs give each part's size
    (q, k and v of grouped-query attention differ)."""
    spec = list(spec)
    if not spec:
        raise _invalid(f"fused[{recv_name!r}]: no parts")
    if all(isinstance(p, str) for p in spec):
        if rows % len(spec):
            raise _invalid(f"fused[{recv_name!r}]: {rows} rows do not split evenly into "
                           f"{len(spec)} parts; give (name, rows) pairs")
        spec = [(p, rows // len(spec)) for p in spec]
    out, off = [], 0
    for p in spec:
        if isinstance(p, str) or len(p) != 2:
            raise _invalid(f"fused[{recv_name!r}]: mix of names and (name, rows) pairs")
        out.append((p[0], off, int(p[1])))
        off += int(p[1])
    if off != rows:
        raise _invalid(f"fused[{recv_name!r}]: parts have {off} rows, the parameter {rows}")
    return out


def manifest(model_or_state_dict, wire_dtype=torch.bfloat16, layer_of=None, name_map=None,
             fused=None, include=None):
    """rlorch.Tensors over the tensors' own memory, for Worker(tensors=...).

    model_or_state_dict: an nn.Module (its named_parameters()), a state dict,
        or (name, tensor) pairs.
    wire_dtype: what the broadcast carries. A trainer: fp32 parameters are
        the storage, sent as wire_dtype. An inference model: its own
        parameters are in the wire dtype (storage = wire: load the model in
        bf16 for the default). None: each tensor's own dtype.
    layer_of: callable(sender name) -> decoder layer; default layer_of_name.
    name_map: callable(own name) -> the sender's name, or a dict (names not
        in it are kept); a None result leaves the tensor out.
    fused: {own name: [sender names]} (or [(sender name, rows)]): one of the
        receiver's parameters made of the senders' tensors concatenated
        along dim 0 (q/k/v into qkv, gate/up into gate_up); each part is its
        own rlorch tensor under the sender's name, a view of its rows of
        the parameter (no copy).
    include: callable(own name) -> bool: a subset (only the LoRA adapters,
        say); the rest is neither sent nor received."""
    fused = dict(fused or {})
    if isinstance(name_map, Mapping):
        table = dict(name_map)
        name_map = lambda n: table.get(n, n)  # noqa: E731
    layer_of = layer_of or layer_of_name
    out = []
    for name, t in _named(model_or_state_dict):
        if include is not None and not include(name):
            fused.pop(name, None)
            continue
        if not isinstance(t, torch.Tensor):
            raise _invalid(f"tensor {name!r}: a {type(t).__name__}, not a torch.Tensor")
        t = t.detach()  # the same storage, without autograd
        if t.dim() == 0:
            raise _invalid(f"tensor {name!r}: a 0-dimensional tensor (rlorch tensors have 1..8 dims)")
        if not t.is_contiguous():
            raise _invalid(f"tensor {name!r}: not contiguous (shape {tuple(t.shape)}, stride "
                           f"{t.stride()}); the broadcast reads and writes its memory in place, "
                           "so make the model's parameter contiguous first (param.data = "
                           "param.data.contiguous()) and build the manifest after that")
        storage = _dtype(t.dtype, name, "dtype")
        wire = storage if wire_dtype is None else _dtype(wire_dtype, name, "wire_dtype")
        try:
            residency, device = _where(t)
        except ValueError as e:
            raise _invalid(f"tensor {name!r}: {e}") from None
        if name in fused:
            pieces = _parts(name, fused.pop(name), t.shape[0])
        else:
            sender = name_map(name) if name_map is not None else name
            if sender is None:
                continue
            pieces = [(sender, 0, t.shape[0])]
        for sender, first, rows in pieces:
            view = t if (first, rows) == (0, t.shape[0]) else t.narrow(0, first, rows)
            out.append(Tensor(sender, view.data_ptr(), shape=tuple(view.shape), dtype=storage,
                              wire_dtype=wire, layer=layer_of(sender), residency=residency,
                              device=device, owner=view))
    if fused:
        raise _invalid(f"fused: no parameter named {sorted(fused)[0]!r}")
    return out


def batch_to_torch(batch, pad_id=0):
    """Batch.to_numpy() as torch tensors (sharing the arrays' memory)."""
    return {k: torch.from_numpy(v) for k, v in batch.to_numpy(pad_id=pad_id).items()}
