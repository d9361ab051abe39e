"""A trainer in Python through the rlorch package: a small torch policy whose
fp32 parameters are the manifest (read in place, sent as bf16), a real
optimizer step on every batch (a policy-gradient loss on batch.to_torch()),
and a check of every batch: each rollout is the one its metadata names, as
py_inference.py makes it (token ids, logprobs, rewards, version). After each
step it saves the weights of the new version for the receivers to compare.

    py_trainer.py ORCHESTRATOR NAME WEIGHTS_DIR [--lora]

Prints "batch ..." and "step ..." lines, "FAIL ..." for anything wrong."""
import argparse
import logging
import os
import re
import signal
import sys
import time

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


def check_batch(batch, cmd):
    bad, by = 0, set()
    if len(batch) != cmd.n_rollouts or batch.step != cmd.step:
        fail(f"batch step={batch.step} rollouts={len(batch)}: want step={cmd.step} rollouts={cmd.n_rollouts}")
    for r in batch:
        m = re.fullmatch(rb"g=(\d+) j=(\d+) by=(\S+)", r.metadata)
        if not m or int(m.group(1)) != r.group_id:
            fail(f"batch step={batch.step} rollout={r.id}: metadata {r.metadata!r}")
            bad += 1
            continue
        g, j = int(m.group(1)), int(m.group(2))
        by.add(m.group(3).decode())
        toks = sm.completion_tokens(g, j, r.prompt_token_ids.tolist())
        lps = torch.tensor(sm.completion_logprobs(g, j, len(toks)), dtype=torch.float32)
        ok = (r.completion_token_ids.tolist() == toks and r.logprobs is not None
              and torch.equal(torch.from_numpy(r.logprobs), lps)
              and r.rewards.tolist() == [sm.completion_reward(g, j), float(r.policy_version)]
              and r.finish_reason == "stop")
        if not ok:
            fail(f"batch step={batch.step} rollout={r.id} group={g} j={j}: not what the engine made")
            bad += 1
    return bad, by


def check_tensors(t, batch):
    """batch.to_torch(): padded rows equal to the rollouts."""
    n = len(batch)
    for i, r in enumerate(batch):
        c = len(r.completion_token_ids)
        if (t["completion_mask"][i].sum().item() != c
                or t["completion_ids"][i, :c].tolist() != r.completion_token_ids.tolist()
                or not torch.equal(t["logprobs"][i, :c], torch.from_numpy(r.logprobs))
                or t["rewards"][i, 0].item() != torch.tensor(r.rewards[0], dtype=torch.float32).item()
                or t["group_ids"][i].item() != r.group_id or t["versions"][i].item() != r.policy_version
                or t["prompt_ids"][i, :len(r.prompt_token_ids)].tolist() != r.prompt_token_ids.tolist()):
            fail(f"to_torch row {i} differs from rollout {r.id}")
            return
    if t["completion_ids"].shape[0] != n or t["completion_ids"].dtype != torch.int64:
        fail(f"to_torch: completion_ids {tuple(t['completion_ids'].shape)} {t['completion_ids'].dtype}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("orchestrator")
    ap.add_argument("name")
    ap.add_argument("weights")
    ap.add_argument("--lora", action="store_true")
    a = ap.parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s %(message)s")

    model = sm.trainer_model(lora=a.lora)
    include = (lambda n: "lora_" in n) if a.lora else None
    tensors = rlorch.torch.manifest(model, include=include)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    say(f"manifest tensors={len(tensors)} layers={sorted({t.layer for t in tensors})}")

    def save(version):
        tmp = os.path.join(a.weights, f".v{version}.pt")
        torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, tmp)
        os.replace(tmp, os.path.join(a.weights, f"v{version}.pt"))

    save(0)
    w = rlorch.Worker(role="trainer", orchestrator=a.orchestrator, name=a.name, tensors=tensors,
                      data_listen="127.0.0.1:0",
                      on_broadcast_after=lambda ok, v: say(f"broadcast after ok={int(ok)} version={v}"))
    signal.signal(signal.SIGTERM, lambda *_: w.stop())
    with w:
        for cmd in w:
            if cmd.kind != "train":
                say(f"command {cmd.kind}")
                continue
            t0 = time.monotonic()
            try:
                batch = w.fetch_batch(cmd)
            except rlorch.Stopped:
                break
            except rlorch.RlorchError as e:
                say(f"batch step={cmd.step} refused: {e}")
                w.report_error(cmd, str(e))
                continue
            bad, by = check_batch(batch, cmd)
            t = batch.to_torch()
            check_tensors(t, batch)
            say(f"batch step={batch.step} rollouts={len(batch)} checked={len(batch) - bad} bad={bad} "
                f"by={','.join(sorted(by))}")
            # A policy-gradient step: group-normalised rewards times the
            # completion's log-likelihood (its first token) under the policy.
            r = t["rewards"][:, 0]
            adv = r - r.mean()
            logp = model(t["prompt_ids"], t["prompt_mask"])
            first = t["completion_ids"][:, 0] % sm.V
            loss = -(adv * logp.gather(1, first.unsqueeze(1)).squeeze(1)).mean() + \
                1e-3 * sum((p.float() ** 2).sum() for p in model.parameters() if p.requires_grad)
            opt.zero_grad()
            loss.backward()
            opt.step()  # in place: the manifest's memory holds the new weights
            with torch.no_grad():  # and a decay every element shows in bf16 (the receivers check)
                for p in model.parameters():
                    if p.requires_grad:
                        p.mul_(0.97)
            save(cmd.step + 1)
            w.report_step(cmd, time.monotonic() - t0)
            say(f"step={cmd.step} done loss={loss.item():.4f} policy_version={w.policy_version}")
    say(f"stopped failures={failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
