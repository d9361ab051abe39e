"""A rank of a tensor-parallel inference engine in Python (numpy only):
rlorch.Worker(parts=...) holding, of the C SDK trainer's model
(tests/sdk/sdk_model.h, sdk_trainer), the embedding's rows and the mlp
weight's columns sliced in N near-equal parts, the norm whole. Each buffer
holds its part only, in its own shape; after each broadcast every element
is compared with the trainer's full tensor of that version in bf16. It
answers requests with the completions sdk_trainer checks.

    py_parts.py ORCHESTRATOR NAME R/N      (0/1: a whole receiver, no parts)

Prints "started", one "broadcast ok=... elements=... bad=..." line per
broadcast, "FAIL ..." for anything wrong; exits 0 after SIGTERM with nothing
wrong."""
import signal
import sys
import threading

import numpy as np

import rlorch

# tests/sdk/sdk_model.h: name, layer, shape.
MODEL = [("embed.weight", 0, (257, 16)), ("layers.0.mlp.weight", 0, (64, 48)),
         ("layers.1.norm.weight", 1, (1001,))]
F = np.float32
failures = 0
out_lock = threading.Lock()


def say(*a):
    with out_lock:
        print(*a, flush=True)


def fail(*a):
    global failures
    failures += 1
    say("FAIL", *a)


def value(v, k, idx):
    """sdk_model_value in float32, as the C trainer computes it (sinf may
    differ from numpy's sin by an ulp: compared in bf16 with one ulp's slack)."""
    x = np.sin(idx.astype(F) * F(0.37) + F(k) * F(1.3), dtype=F)
    return x * (F(1.0) + F(0.25) * F(v)) + F(0.001) * F(v)


def bf16(x):
    u = x.astype(F).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def completion(group, j, name, version):
    n = 3 + (group * 5 + j) % 8
    toks = [(group * 31 + j * 7 + t * 3) % 1000 for t in range(n)]
    lps = [float(F(-0.015625) * F(t + 1) - F(0.0078125) * F(j) - F(0.001) * F(group % 7))
           for t in range(n)]
    reward = (sum(toks) % 100) / 100.0
    meta = f"g={group} j={j} by={name}".encode() + b"\0"
    return rlorch.Completion(toks, lps, [reward, float(version)], "stop", meta, 0.001)


def main():
    orch, name, spec = sys.argv[1:4]
    r, n = (int(x) for x in spec.split("/"))
    parts, bufs, full_idx = [], [], []
    for k, (tname, layer, shape) in enumerate(MODEL):
        idx = np.arange(int(np.prod(shape)), dtype=np.uint64).reshape(shape)
        if len(shape) == 2 and n > 1:
            dim = k % 2  # rows of the embedding, columns of the mlp weight
            size, base, extra = shape[dim], shape[dim] // n, shape[dim] % n
            start, count = r * base + min(r, extra), base + (r < extra)
            parts.append(rlorch.Part(tname, "slice", dim=dim, start=start, count=count))
            idx = idx[start:start + count] if dim == 0 else idx[:, start:start + count]
        full_idx.append(np.ascontiguousarray(idx))
        bufs.append(np.zeros(idx.shape, dtype=np.uint16))
    tensors = [rlorch.Tensor(tname, bufs[k], shape=shape, dtype="bf16", layer=layer)
               for k, (tname, layer, shape) in enumerate(MODEL)]
    gate = rlorch.BroadcastGate()

    def after(ok, version):
        gate.after(ok, version)
        if not ok:
            say(f"broadcast ok=0 version={version}")
            return
        elems = bad = 0
        for k in range(len(MODEL)):
            want = bf16(value(version, k, full_idx[k]))
            diff = np.abs(bufs[k].astype(np.int32) - want.astype(np.int32))
            elems += bufs[k].size
            bad += int((diff > 1).sum())
        say(f"broadcast ok=1 version={version} elements={elems} bad={bad}")
        if bad:
            fail(f"version {version}: {bad} of {elems} elements differ from the trainer's weights")

    w = rlorch.Worker("inference", orch, tensors=tensors, name=name, parts=parts or None,
                      max_concurrent_requests=4, on_broadcast_before=gate.before,
                      on_broadcast_after=after)
    signal.signal(signal.SIGTERM, lambda *_: w.stop())
    w.start()
    say("started")
    for cmd in w:
        if cmd.kind != "generate":
            continue
        with gate.reading():
            version = w.policy_version
            done = [completion(cmd.group_id, j, name, version) for j in range(cmd.count)]
        w.report_rollouts(cmd, version, done)
    w.close()
    say(f"stopped failures={failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
