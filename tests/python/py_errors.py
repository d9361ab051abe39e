"""The rlorch package's bad-input paths: every one raises RlorchError with a
code and a message naming what was wrong (the library's own where the
library checks it), nothing crashes or hangs.

    py_errors.py ORCHESTRATOR DEAD_ADDR TOKEN_FILE

ORCHESTRATOR wants the bearer token in TOKEN_FILE; nothing listens at
DEAD_ADDR. Prints "ok ..." or "FAIL ..." per case, then "N ok, M failed"."""
import logging
import os
import sys
import time

import rlorch

torch_at_import = "torch" in sys.modules  # before anything imports it

import numpy as np  # noqa: E402

results = {"ok": 0, "failed": 0}


def report(ok, what, detail):
    results["ok" if ok else "failed"] += 1
    print(f"{'ok' if ok else 'FAIL'} {what}: {detail}", flush=True)


def expect(what, code, contains, fn):
    t0 = time.monotonic()
    try:
        fn()
    except rlorch.RlorchError as e:
        ok = e.code_name == code and contains in e.message and e.code < 0
        report(ok, what, f"{e} ({time.monotonic() - t0:.1f} s)")
        return e
    except Exception as e:  # anything else is a bug: a crash of the binding
        report(False, what, f"{type(e).__name__}: {e}")
        return None
    report(False, what, "no error")
    return None


def main():
    orch, dead, token = sys.argv[1:4]
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    report(not torch_at_import, "import rlorch imports no torch", f"torch loaded={torch_at_import}")
    api, release = rlorch.version()
    report(api >= rlorch.API_VERSION and release, "version", f"api={api} release={release}")

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    good = [rlorch.Tensor("w", a, wire_dtype="bf16")]
    T = lambda **kw: rlorch.Worker(**{"role": "trainer", "orchestrator": orch, "tensors": good,  # noqa: E731
                                      "token_file": token, **kw})
    I = lambda **kw: rlorch.Worker(**{"role": "inference", "orchestrator": orch,  # noqa: E731
                                      "token_file": token, **kw})

    E = "RLORCH_E_INVALID"
    expect("an unknown role", E, "options.role: 'critic'", lambda: rlorch.Worker("critic", orch))
    expect("a trainer without tensors", E, "options.tensors: a trainer needs at least one tensor",
           lambda: T(tensors=[]))
    expect("no orchestrator", E, "options.orchestrator: required", lambda: T(orchestrator=None))
    expect("max_concurrent_requests 0", E, "options.max_concurrent_requests: 0 is outside 1..1024",
           lambda: I(max_concurrent_requests=0))
    expect("max_concurrent_requests -1", E, "options.max_concurrent_requests: -1",
           lambda: I(max_concurrent_requests=-1))
    expect("connect_timeout_s 0", E, "options.connect_timeout_s", lambda: I(connect_timeout_s=0))
    expect("a certificate without its key", E, "options.tls_cert_file is set without options.tls_key_file",
           lambda: I(tls_cert_file=token))
    expect("an unknown log level", E, "options.log_level", lambda: I(log_level="chatty"))
    expect("a data_listen that is no address", "RLORCH_E_IO",
           "options.data_listen: broadcast engine (listen no-port)", lambda: I(data_listen="no-port"))
    # API version 2's options.
    expect("a token and a token file", E, "options.token and options.token_file are both set",
           lambda: I(token="t"))
    expect("a model named by an inference worker", E, "options.model: only a trainer names its model",
           lambda: I(model="7b"))
    expect("an unknown offload", E, "options.offload: unknown value 'disk'", lambda: T(offload="disk"))
    expect("an offload out of the library's range", E, "options.offload: unknown value 9",
           lambda: T(offload=9))
    expect("an inference worker that offloads", E, "options.offload: only a trainer offloads",
           lambda: I(offload="params"))
    expect("a held version without its run", E, "options.held_version: 4 without options.held_run_id",
           lambda: T(held_version=4))
    expect("a held run on an inference worker", E, "options.held_run_id: only a trainer restores",
           lambda: I(held_run_id="run-1"))
    # A rank of a sharded trainer: a's 12 elements are the second half of a
    # [6, 4] tensor.
    half = [rlorch.Tensor("w", a, shape=(6, 4), wire_dtype="bf16")]
    expect("a rank past its group", E, "options.trainer_rank: 2 is not below options.trainer_ranks 2",
           lambda: T(tensors=half, trainer_rank=2, trainer_ranks=2, shards=[(12, 12)]))
    expect("shards on a lone trainer", E, "options.shards: set with options.trainer_ranks 0",
           lambda: T(tensors=half, shards=[(12, 12)]))
    expect("a part past the tensor's end", E, "options.shards[0] 'w': elements [20, 20 + 12) are past",
           lambda: T(tensors=half, trainer_rank=1, trainer_ranks=2, shards=[(20, 12)]))
    expect("shards not parallel to the tensors", E, "options.shards: 2 entries for 1 tensors",
           lambda: T(tensors=half, trainer_rank=1, trainer_ranks=2, shards=[(12, 12), (0, 1)]))
    expect("a negative offset", E, "options.shards[0]: (-1, 12)",
           lambda: T(tensors=half, trainer_rank=1, trainer_ranks=2, shards=[(-1, 12)]))
    expect("ranks on an inference worker", E, "options.trainer_ranks: only a trainer has ranks",
           lambda: I(trainer_ranks=2))
    T(tensors=half, trainer_rank=1, trainer_ranks=2, shards=[(12, 12)]).close()
    report(True, "a rank holding the second half of its tensor is created", "")
    # A rank of a tensor-parallel engine: b holds columns [2, 4) of a [3, 4]
    # tensor in bf16, dense in its own [3, 2] shape.
    b = np.zeros((3, 2), dtype=np.uint16)
    cols = [rlorch.Tensor("w", b, shape=(3, 4), dtype="bf16")]
    P = rlorch.Part
    expect("parts on a trainer", E, "options.parts: only an inference worker holds parts",
           lambda: T(parts=[P("w", "slice", dim=1, start=2, count=2)]))
    expect("an unknown part kind", E, "options.parts[0] 'w'.kind: unknown value 'half'",
           lambda: I(tensors=cols, parts=[P("w", "half")]))
    expect("a part kind out of the library's range", E, "options.parts[0] 'w'.kind: unknown value 5",
           lambda: I(tensors=cols, parts=[P("w", 5)]))
    expect("a part with an empty name", E, "options.parts[0].name: empty",
           lambda: I(tensors=cols, parts=[P("", "none")]))
    expect("a tensor's part given twice", E, "options.parts[1] 'w': listed twice",
           lambda: I(tensors=cols, parts=[P("w", "slice", 1, 2, 2), P("w", "slice", 1, 0, 2)]))
    expect("a slice of no index", E, "options.parts[0] 'w'.count: 0",
           lambda: I(tensors=cols, parts=[P("w", "slice", dim=1, start=2)]))
    expect("a slice along a dimension the tensor lacks", E,
           "options.parts[0] 'w'.dim: 2, but options.tensors[0] has 2 dimensions",
           lambda: I(tensors=cols, parts=[P("w", "slice", dim=2, start=0, count=1)]))
    expect("a slice past the tensor's shape", E, "options.parts[0] 'w': indices [3, 5) along dim 1",
           lambda: I(tensors=cols, parts=[P("w", "slice", dim=1, start=3, count=2)]))
    expect("a negative start", E, "options.parts[0] 'w'.start: -1",
           lambda: I(tensors=cols, parts=[P("w", "slice", dim=1, start=-1, count=2)]))
    expect("a NONE part's tensor given", E, "options.parts[0] 'w': NONE, but options.tensors[0] holds it",
           lambda: I(tensors=cols, parts=[P("w", "none")]))
    expect("a part that is not an rlorch.Part", E, "options.parts[0]: a tuple, not an rlorch.Part",
           lambda: I(tensors=cols, parts=[("w", "slice", 1, 2, 2)]))
    I(tensors=cols, parts=[P("w", "slice", dim=1, start=2, count=2), P("expert.1", "none")]).close()
    report(True, "an inference worker holding columns [2, 4) of its tensor is created", "")
    # API version 4: where the worker runs.
    expect("an empty node name", E, "options.node: empty", lambda: I(node=""))
    expect("a node name with a space", E, "options.node: \"rack 1\" holds a space", lambda: I(node="rack 1"))
    expect("a node name too long", E, "options.node: 199 bytes, more than 127", lambda: T(node="n" * 199))
    expect("NICs without their speed", E, "options.nics: 2 NICs without nic_gbits", lambda: T(nics=2))
    expect("a negative NIC count", E, "options.nics: -1", lambda: T(nics=-1, nic_gbits=100))
    expect("too many NICs", E, "options.nics: 33, more than 32", lambda: T(nics=33, nic_gbits=100))
    expect("a speed of 0 with NICs", E, "options.nics: 2 NICs without nic_gbits",
           lambda: T(nics=2, nic_gbits=0))
    expect("a negative speed", E, "options.nic_gbits: -5 is not a positive speed", lambda: I(nic_gbits=-5))
    expect("an absurd speed", E, "options.nic_gbits: 1e+06 Gb/s, more than 10000", lambda: I(nic_gbits=1e6))
    expect("a speed that is not a number", E, "options.nic_gbits: 'fast'", lambda: I(nic_gbits="fast"))
    I(node="py-node", nics=2, nic_gbits=25).close()
    report(True, "an inference worker on node py-node with 2 x 25 Gb/s is created", "")
    expect("a storage dtype the library lacks", E, "storage_dtype: unknown value 9",
           lambda: T(tensors=[rlorch.Tensor("w", a.ctypes.data, shape=a.shape, dtype=9, wire_dtype="bf16",
                                            owner=a)]))
    expect("a dtype name the package lacks", E, "options.tensors[0] 'w': storage_dtype: unknown value 'int4'",
           lambda: T(tensors=[rlorch.Tensor("w", a.ctypes.data, shape=a.shape, dtype="int4", owner=a)]))
    expect("two tensors of one name", E, "'w'", lambda: T(tensors=good + good))
    expect("an empty shape", E, "ndim 0", lambda: T(tensors=[rlorch.Tensor("s", a.ctypes.data, shape=(),
                                                                           dtype="fp32", owner=a)]))
    expect("an inference buffer not in the wire dtype", E, "an inference worker's buffers hold the wire dtype",
           lambda: I(tensors=good))
    # bf16 in numpy: uint16 arrays said to be bf16; an inference worker takes them.
    h = np.zeros((3, 4), dtype=np.uint16)
    try:
        rlorch.Worker("inference", orch, tensors=[rlorch.Tensor("w", h, dtype="bf16")]).close()
        report(True, "an inference worker of numpy bf16 buffers", "created")
    except rlorch.RlorchError as e:
        report(False, "an inference worker of numpy bf16 buffers", str(e))
    expect("a dtype that does not fit the array", E, "dtype fp32 does not fit numpy uint16",
           lambda: rlorch.Tensor("w", h, dtype="fp32"))
    expect("a non-contiguous numpy array", E, "not C-contiguous",
           lambda: rlorch.Tensor("t", a.T, wire_dtype="bf16"))
    expect("a name with a NUL byte", E, "NUL", lambda: T(name="a\0b"))
    expect("a tensor that is not an rlorch.Tensor", E, "options.tensors[0]: a ndarray",
           lambda: T(tensors=[a]))

    # The torch helpers' own checks (torch is imported from here on).
    import torch
    import rlorch.torch as rt

    m = torch.nn.Linear(4, 6)
    m.weight.data = m.weight.data.t().contiguous().t()  # a transposed view: not contiguous
    expect("a non-contiguous parameter", E, "tensor 'weight': not contiguous", lambda: rt.manifest(m))
    expect("an integer buffer", E, "tensor 'steps': dtype torch.int64 has no rlorch dtype",
           lambda: rt.manifest({"steps": torch.zeros(3, dtype=torch.int64)}))
    qkv = torch.zeros(10, 4, dtype=torch.bfloat16)
    expect("fused parts that do not add up", E, "parts have 9 rows, the parameter 10",
           lambda: rt.manifest({"qkv": qkv}, fused={"qkv": [("q", 5), ("k", 2), ("v", 2)]}))
    expect("fused names that do not split evenly", E, "10 rows do not split evenly into 3 parts",
           lambda: rt.manifest({"qkv": qkv}, fused={"qkv": ["q", "k", "v"]}))
    expect("a fused target the model lacks", E, "fused: no parameter named 'gate_up'",
           lambda: rt.manifest({"qkv": qkv}, fused={"gate_up": ["g", "u"]}))
    parts = rt.manifest({"qkv": qkv}, fused={"qkv": [("q", 6), ("k", 2), ("v", 2)]})
    ok = [(t.name, t.shape, t.data - qkv.data_ptr()) for t in parts] == \
        [("q", (6, 4), 0), ("k", (2, 4), 48), ("v", (2, 4), 64)]
    report(ok, "fused parts are views of the fused tensor", [(t.name, t.shape, t.data - qkv.data_ptr()) for t in parts])

    # Failures of start, against a real orchestrator and a dead address.
    expect("an unreachable orchestrator", "RLORCH_E_UNAVAILABLE", f"at {dead} within 0.5 s",
           lambda: I(orchestrator=dead, connect_timeout_s=0.5).start())
    wrong = os.path.join(os.path.dirname(token), "wrong-token")
    with open(wrong, "w") as f:
        f.write("not-the-token\n")
    expect("a wrong token", "RLORCH_E_REFUSED", "UNAUTHENTICATED", lambda: I(token_file=wrong).start())
    expect("a wrong token given inline", "RLORCH_E_REFUSED", "UNAUTHENTICATED",
           lambda: I(token_file=None, token="not-the-token").start())
    with open(token) as f:
        good_token = f.read().strip()
    w = I(token_file=None, token=good_token, name="py-errors-inline-token")
    try:
        w.start()
        report(True, "the right token given inline registers", "started")
    except rlorch.RlorchError as e:
        report(False, "the right token given inline registers", str(e))
    w.close()
    expect("a token file that does not exist", "RLORCH_E_IO", "missing-token",
           lambda: I(token_file=wrong + "missing-token").start())

    # The life of a worker: next before start, after stop, after close.
    w = I(name="py-errors-inference")
    expect("next before start", "RLORCH_E_STATE", "", lambda: w.next(0))
    w.start()
    report(w.policy_version == 0 and w.next(0) is None, "a started worker holds version 0, nothing queued",
           f"policy_version={w.policy_version}")
    expect("start twice", "RLORCH_E_STATE", "", w.start)
    w.stop()
    e = expect("next after stop", "RLORCH_E_STOPPED", "", lambda: w.next(1.0))
    report(isinstance(e, rlorch.Stopped), "Stopped is raised once stopped", type(e).__name__)
    w.close()
    w.close()  # closing twice is fine
    expect("next after close", "RLORCH_E_STATE", "the worker is closed", lambda: w.next(0))
    # A trainer of numpy buffers joins (the manifest is accepted) and leaves.
    with T(name="py-errors-trainer") as t:
        report(t.policy_version == 0, "a numpy trainer registers", f"policy_version={t.policy_version}")
    # One left running: the package stops and frees it at exit (the test
    # sees the interpreter exit 0, the library's stop logged).
    rlorch.Worker("inference", orch, token_file=token, name="py-errors-left-running").start()
    print(f"{results['ok']} ok, {results['failed']} failed", flush=True)
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
