"""An inference engine in Python through the rlorch package: its own bf16
torch model, received into straight from each broadcast (the manifest points
at the parameters' storage), optionally in a fused layout with a name map,
or only the LoRA adapters. After every broadcast it compares each of its
parameters with the trainer's fp32 weights of that version cast to bf16.

    py_inference.py ORCHESTRATOR NAME WEIGHTS_DIR [--fused] [--lora]
                    [--bad-reports] [--raise-in-callback]

Prints one line per event ("broadcast ...", "generate ..."), "ok ..." for a
bad report refused as it should be, "FAIL ..." for anything wrong."""
import argparse
import logging
import os
import signal
import sys

import torch

import rlorch
import rlorch.torch
import sdk_model as sm

failures = 0


def say(*a):
    print(*a, flush=True)


def fail(*a):
    global failures
    failures += 1
    say("FAIL", *a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("orchestrator")
    ap.add_argument("name")
    ap.add_argument("weights")
    ap.add_argument("--fused", action="store_true")
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--bad-reports", action="store_true")
    ap.add_argument("--raise-in-callback", action="store_true")
    a = ap.parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s %(message)s")

    model = sm.inference_model(fused=a.fused, lora=a.lora)
    initial = {n: t.clone() for n, t in sm.expected_views(model, a.fused).items()}
    include = (lambda n: "lora_" in n) if a.lora else None
    if a.fused:
        tensors = rlorch.torch.manifest(model, name_map=sm.engine_name_map, fused=sm.fused_spec(),
                                        include=include)
    else:
        tensors = rlorch.torch.manifest(model, include=include)
    # No copy: every rlorch tensor lies inside one of the model's parameters.
    spans = [(p.data_ptr(), p.data_ptr() + p.numel() * p.element_size()) for p in model.parameters()]
    for t in tensors:
        if not any(lo <= t.data < hi for lo, hi in spans):
            fail(f"tensor {t.name} does not point into the model's parameters")
    say(f"manifest tensors={len(tensors)} names={','.join(t.name for t in tensors)}")

    gate = rlorch.BroadcastGate()
    stats = {"ok": 0, "failed": 0, "raised": 0}

    def before(version):
        gate.before(version)
        if a.raise_in_callback and stats["raised"] == 0:
            stats["raised"] += 1
            raise RuntimeError("a deliberate error in on_broadcast_before")

    def after(ok, version):
        gate.after(ok, version)
        if not ok:
            stats["failed"] += 1
            say(f"broadcast ok=0 version={version}")
            return
        stats["ok"] += 1
        check(version)

    def check(version):
        # The library's command thread runs this: no broadcast writes meanwhile.
        path = os.path.join(a.weights, f"v{version}.pt")
        try:
            want = torch.load(path)
        except OSError as e:
            fail(f"broadcast version={version}: no trainer weights: {e}")
            return
        got = sm.expected_views(model, a.fused)
        bad = changed = compared = 0
        for name, t in got.items():
            sent = (not a.lora) or "lora_" in name
            ref = want[name].to(torch.bfloat16) if sent else initial[name]
            compared += 1
            if not torch.equal(t, ref):
                bad += 1
                fail(f"broadcast version={version} {name}: differs from the trainer's in bf16 "
                     f"(max gap {(t.float() - ref.float()).abs().max().item()})")
            if not torch.equal(t, initial[name]):
                changed += 1
        say(f"broadcast ok=1 version={version} compared={compared} changed={changed} bad={bad} "
            f"policy_version={w.policy_version}")

    w = rlorch.Worker(role="inference", orchestrator=a.orchestrator, name=a.name, tensors=tensors,
                      max_concurrent_requests=4, on_broadcast_before=before, on_broadcast_after=after)
    signal.signal(signal.SIGTERM, lambda *_: w.stop())
    bad_done = False
    with w:
        say(f"started policy_version={w.policy_version}")
        for cmd in w:
            if cmd.kind == "generate":
                if a.bad_reports and not bad_done:
                    bad_done = True
                    bad_reports(w, cmd)
                with gate.reading():
                    v = w.policy_version
                    out = []
                    for j in range(cmd.count):
                        toks = sm.completion_tokens(cmd.group_id, j, cmd.prompt_token_ids)
                        out.append(rlorch.Completion(
                            toks, logprobs=torch.tensor(sm.completion_logprobs(cmd.group_id, j, len(toks))),
                            rewards=[sm.completion_reward(cmd.group_id, j), float(v)], finish_reason="stop",
                            metadata=f"g={cmd.group_id} j={j} by={a.name}".encode()))
                w.report_rollouts(cmd, v, out)
                say(f"generate request_id={cmd.request_id} group={cmd.group_id} count={cmd.count} version={v}")
            elif cmd.kind == "abort":
                say(f"abort request_id={cmd.request_id} reason={cmd.reason}")
            elif cmd.kind == "shutdown":
                say(f"shutdown reason={cmd.reason}")
    say(f"stopped broadcasts={stats['ok']} broadcasts_failed={stats['failed']} failures={failures}")
    return 1 if failures else 0


def bad_reports(w, cmd):
    """Each bad report is refused before anything is sent, with its code and message."""
    v = w.policy_version
    good = lambda **kw: rlorch.Completion(**{"token_ids": [1, 2], "rewards": [0.5], **kw})  # noqa: E731
    cases = [
        ("one rollout short", [good()] * (cmd.count - 1), v, "RLORCH_E_INVALID"),
        ("a positive logprob", [good(logprobs=[-0.1, 0.5])] * cmd.count, v, "RLORCH_E_INVALID"),
        ("logprobs of another length", [good(logprobs=[-0.1])] * cmd.count, v, "RLORCH_E_INVALID"),
        ("a NaN reward", [good(rewards=[float("nan")])] * cmd.count, v, "RLORCH_E_INVALID"),
        ("no reward", [good(rewards=[])] * cmd.count, v, "RLORCH_E_INVALID"),
        ("an empty completion", [good(token_ids=[])] * cmd.count, v, "RLORCH_E_INVALID"),
        ("a negative token id", [good(token_ids=[1, -2])] * cmd.count, v, "RLORCH_E_INVALID"),
        ("an unknown finish reason", [good(finish_reason="tired")] * cmd.count, v, "RLORCH_E_INVALID"),
        ("a version the worker does not hold", [good()] * cmd.count, v + 5, "RLORCH_E_INVALID"),
    ]
    for what, comps, version, code in cases:
        try:
            w.report_rollouts(cmd, version, comps)
            fail(f"{what}: accepted")
        except rlorch.RlorchError as e:
            (say if e.code_name == code and e.message else fail)(f"ok {what}: {e}")
    for what, call in [("report_step on an inference worker", lambda: w.report_step(cmd, 0.1)),
                       ("fetch_batch on an inference worker", lambda: w.fetch_batch(cmd))]:
        try:
            call()
            fail(f"{what}: accepted")
        except rlorch.RlorchError as e:
            (say if e.code_name == "RLORCH_E_STATE" else fail)(f"ok {what}: {e}")


if __name__ == "__main__":
    sys.exit(main())
