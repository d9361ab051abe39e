"""The example's trainer: one rlorch trainer worker whose manifest is the
policy's own fp32 parameters. Each train step fetches its batch (the
completions the inference workers sampled, with their logprobs and rewards),
takes one AdamW step on the GRPO loss and reports it; the library then
broadcasts the updated parameters, cast to bf16, straight from their memory.

It also checks the data it trains on: for every rollout it recomputes the
logprobs of the sampled tokens with the weights of the version that produced
them, exactly as the inference workers held them (that version's fp32
weights, kept for the last few versions, cast to bf16: the bytes the
broadcast sent), and reports the largest gap from the logprobs the inference
workers reported; and, for scale, the gap with the fp32 weights themselves.
One line of JSON per step goes to --metrics.

With --offload params+optimizer the trainer keeps its parameters the way
FSDP2's CPUOffloadPolicy(pin_memory=True) does: the fp32 parameters and the
AdamW state live in pinned host memory and the optimizer step runs on the
CPU; each step copies the parameters to the GPU for the forward and backward
passes and the gradients back. The manifest is then the pinned host
parameters: the library stages them to the GPU for the broadcast.
"""

import argparse
import json
import logging
import signal
import sys
import time

import torch

import rlorch
import rlorch.torch

import policy as P


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orchestrator", default="127.0.0.1:7070")
    ap.add_argument("--name", default="rl-trainer")
    ap.add_argument("--data-listen", default="127.0.0.1:0",
                    help="where the inference workers connect for the weights")
    ap.add_argument("--metrics", required=True, help="JSONL file: one line per step")
    ap.add_argument("--lr", type=float, default=7e-3)
    ap.add_argument("--temperature", type=float, default=1.0,
                    help="the run's sampling temperature: logprobs are of logits / T")
    ap.add_argument("--seed", type=int, default=0, help="the policy's initial weights")
    ap.add_argument("--device", default="cpu",
                    help="where the model and its optimizer live: cpu, or cuda[:N] (sent from there)")
    ap.add_argument("--offload", choices=("none", "params+optimizer"), default="none",
                    help="params+optimizer: parameters and optimizer state in pinned host memory, the "
                         "step on the CPU, forward and backward on --device (FSDP2's CPUOffloadPolicy)")
    ap.add_argument("--keep-versions", type=int, default=4,
                    help="versions kept for the logprob check (more than the off-policy bound + 1)")
    args = ap.parse_args()
    if args.offload != "none" and not args.device.startswith("cuda"):
        ap.error(f"--offload {args.offload}: offloads from a GPU; pass --device cuda[:N]")
    if not args.temperature > 0:
        ap.error(f"--temperature {args.temperature}: the loss needs the distribution sampled from (> 0)")
    if args.keep_versions < 2:
        ap.error(f"--keep-versions {args.keep_versions}: at least 2 (a batch is up to a version behind)")
    return args


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def recompute_gaps(snapshots, bf16, fp32, t, temperature):
    """Largest |recomputed - reported| logprob over the batch's completion
    tokens, each rollout at its own version: with that version's weights
    cast to bf16 (what the inference workers hold: the check) and with its
    fp32 weights (what bf16 rounding alone moves them by, for scale). The
    versions no longer held are listed."""
    gaps, missing = {"bf16": 0.0, "fp32": 0.0}, []
    mask = t["completion_mask"]
    for v in t["versions"].unique().tolist():
        if v not in snapshots:
            missing.append(v)
            continue
        rows = t["versions"] == v
        for key, model in (("bf16", bf16), ("fp32", fp32)):
            model.load_state_dict(snapshots[v])    # copy_ casts fp32 -> bf16 as the wire does
            with torch.no_grad():
                lp = model.token_logprobs(t["prompt_ids"][rows], t["completion_ids"][rows], temperature)
            d = (lp - t["logprobs"][rows]).abs()[mask[rows]]
            if d.numel():
                gaps[key] = max(gaps[key], d.max().item())
    return gaps, missing


def train_step(model, opt, t, temperature, off=None):
    """One AdamW step on the GRPO loss; with `off` (Offloaded) the passes run
    on its GPU copy and the step on the pinned host parameters."""
    rewards = t["rewards"].float()
    if rewards.dim() == 2:                    # one column per reward: the task has one
        rewards = rewards[:, 0]
    adv = P.group_advantages(rewards, t["group_ids"])
    new = (off or model).token_logprobs(t["prompt_ids"], t["completion_ids"], temperature)
    loss = P.grpo_loss(new, t["logprobs"].float(), adv, t["completion_mask"])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if off:
        off.gradients_to_host()
    opt.step()                                # in place: the manifest's memory
    return rewards, loss.item()


class Offloaded:
    """FSDP2's CPUOffloadPolicy for one unsharded model: `master` holds the
    fp32 parameters in pinned host memory (the optimizer's, and the
    broadcast's), `compute` their copy on the GPU for forward and backward,
    `grads` pinned host buffers the gradients come back to."""

    def __init__(self, master, device):
        for p in master.parameters():
            p.data = p.data.pin_memory()
        self.master = master
        self.compute = P.Policy(seed=0).to(device)
        self.grads = [torch.empty_like(p, pin_memory=True) for p in master.parameters()]

    def token_logprobs(self, *a):
        with torch.no_grad():
            for c, m in zip(self.compute.parameters(), self.master.parameters()):
                c.copy_(m, non_blocking=True)
        return self.compute.token_logprobs(*a)

    def gradients_to_host(self):
        for g, c, m in zip(self.grads, self.compute.parameters(), self.master.parameters()):
            g.copy_(c.grad, non_blocking=True)
            m.grad = g
        torch.cuda.synchronize()
        self.compute.zero_grad(set_to_none=True)


def check_batch(t):
    """The shapes this trainer relies on; a batch that breaks them is reported
    as the step's error rather than trained on."""
    n = t["prompt_ids"].shape[0]
    if n == 0:
        raise ValueError("empty batch")
    for k in ("completion_ids", "completion_mask", "logprobs", "rewards", "group_ids", "versions"):
        if t[k].shape[0] != n:
            raise ValueError(f"batch: {k} has {t[k].shape[0]} rows, prompt_ids {n}")
    if t["prompt_ids"].shape[1] != P.PROMPT_LEN:
        raise ValueError(f"batch: prompts of {t['prompt_ids'].shape[1]} tokens, the task's are {P.PROMPT_LEN}")


def main():
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s trainer %(levelname)s %(message)s")
    torch.set_num_threads(1)
    device = torch.device(args.device)
    off = None
    if args.offload == "params+optimizer":
        off = Offloaded(P.Policy(seed=args.seed), device)
        model = off.master                    # pinned host: what the optimizer and the broadcast use
    else:
        model = P.Policy(seed=args.seed).to(device)
    # Models to recompute logprobs with: the inference side's (bf16) and fp32.
    check_bf16 = P.Policy(seed=args.seed).to(torch.bfloat16).to(device)
    check_fp32 = P.Policy(seed=args.seed).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    snapshots = {0: snapshot(model)}
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))

    w = rlorch.Worker(role="trainer", orchestrator=args.orchestrator, name=args.name,
                      tensors=rlorch.torch.manifest(model), data_listen=args.data_listen,
                      device=P.cuda_index(device),
                      offload="params+optimizer" if off else ("none" if device.type == "cuda" else None))
    steps, failed = 0, 0
    with w, open(args.metrics, "a", buffering=1) as out:
        logging.info("attached, %d parameters, %s", sum(p.numel() for p in model.parameters()),
                     "offloaded: pinned host parameters, AdamW on the CPU" if off else f"on {device}")
        while not stopping:
            try:
                cmd = w.next(timeout=1.0)
            except rlorch.Stopped:
                break
            if cmd is None:
                continue
            if cmd.kind == "shutdown":
                logging.info("shutdown: %s", cmd.reason)
                break
            if cmd.kind != "train":
                continue
            t0 = time.monotonic()
            try:
                batch = w.fetch_batch(cmd)
                t = {k: v.to(device) for k, v in batch.to_torch().items()}
                check_batch(t)
                gaps, missing = recompute_gaps(snapshots, check_bf16, check_fp32, t, args.temperature)
                rewards, loss = train_step(model, opt, t, args.temperature, off)
            except (rlorch.RlorchError, ValueError, KeyError) as e:
                # The library stops the worker after a failed step (the
                # orchestrator redoes it when a trainer attaches): exit non-zero.
                logging.error("step %d: %s", cmd.step, e)
                failed += 1
                try:
                    w.report_error(cmd, f"step {cmd.step}: {e}")
                except rlorch.RlorchError as e2:
                    logging.error("step %d: error not reported: %s", cmd.step, e2)
                continue
            seconds = time.monotonic() - t0
            # The snapshot and the step's line before the report: the step
            # commits (and the launcher reads the line) once it is sent.
            snapshots[cmd.step + 1] = snapshot(model)
            for v in [v for v in snapshots if v <= cmd.step + 1 - args.keep_versions]:
                del snapshots[v]
            out.write(json.dumps({
                "run_id": cmd.run_id, "step": cmd.step, "rollouts": int(rewards.numel()),
                "groups": int(t["group_ids"].unique().numel()),
                "reward_mean": rewards.mean().item(),
                "versions": sorted(int(v) for v in t["versions"].unique()),
                "logprob_gap_max": gaps["bf16"], "logprob_gap_fp32_max": gaps["fp32"],
                "versions_missing": missing,
                "loss": loss, "train_seconds": seconds}) + "\n")
            try:
                w.report_step(cmd, seconds)
            except rlorch.RlorchError as e:
                logging.error("step %d not reported: %s", cmd.step, e)
                continue
            steps += 1
    logging.info("stopped after %d steps, %d failed", steps, failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
