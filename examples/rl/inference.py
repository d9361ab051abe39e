"""The example's inference engine: one rlorch inference worker whose model,
held in bf16, is the broadcast's target: the library writes each new version
straight into the model's own parameters (no copy). Each generation request
asks for a group of completions of one prompt; the engine samples them from
its policy at the requested temperature, reports each sampled token's logprob
and scores every completion with the task's checker against the reference
answer carried in the prompt's metadata (the reward lives here, beside
generation).

--ignore-updates is the control run: the broadcast still lands, verified, in
a second copy of the parameters, but generation keeps the initial weights.
"""

import argparse
import copy
import logging
import signal
import sys
import threading
import time

import torch

import rlorch
import rlorch.torch

import policy as P


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orchestrator", default="127.0.0.1:7070")
    ap.add_argument("--name", default="rl-inference")
    ap.add_argument("--seed", type=int, default=0, help="the policy's initial weights (the trainer's)")
    ap.add_argument("--sampling-seed", type=int, default=1,
                    help="seed of requests that carry none (0 in the request)")
    ap.add_argument("--device", default="cpu",
                    help="where the model lives: cpu, or cuda[:N] (its weights then receive the broadcast there)")
    ap.add_argument("--ignore-updates", action="store_true",
                    help="the control run: receive the broadcast but generate with the initial weights")
    return ap.parse_args()


class Engine:
    """The model and the lock that keeps generation off weights being written."""

    def __init__(self, model):
        self.model = model
        self.lock = threading.Lock()
        self.torn = False
        self.broadcasts = 0

    # Both on the library's command thread: the broadcast waits for the
    # request being generated, and no request starts until it is done.
    def before(self, version):
        self.lock.acquire()

    def after(self, ok, version):
        self.torn = not ok
        self.broadcasts += 1
        self.lock.release()
        if not ok:
            logging.warning("broadcast of version %d failed: the weights are torn until the next one", version)


def generate(model, cmd, default_seed):
    s = cmd.sampling
    # The completion is the answer: at most the task's length fits the
    # model's positions.
    max_tokens = min(s.max_tokens or P.MAX_TOKENS, P.MAX_TOKENS)
    # One stream per (seed, group): a group sent again elsewhere gets the
    # same completions.
    seed = (s.seed or default_seed) * 1_000_003 + cmd.group_id
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed % (1 << 63))
    ids, lps = model.sample(cmd.prompt_token_ids, cmd.count, max_tokens, s.temperature, gen,
                            top_k=s.top_k, top_p=s.top_p)
    stop = set(s.stop_token_ids or ())
    out = []
    for row, lp in zip(ids.tolist(), lps.tolist()):
        finish = "length"
        for i, tok in enumerate(row):
            if tok in stop:
                row, lp, finish = row[:i + 1], lp[:i + 1], "stop"
                break
        out.append((row, lp, finish))
    return out


def main():
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.name} %(levelname)s %(message)s")
    torch.set_num_threads(1)
    device = torch.device(args.device)
    model = P.Policy(seed=args.seed).to(torch.bfloat16).to(device)
    # The control run's broadcast target is a copy; otherwise the model itself.
    target = copy.deepcopy(model) if args.ignore_updates else model
    engine = Engine(model)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))

    w = rlorch.Worker(role="inference", orchestrator=args.orchestrator, name=args.name,
                      tensors=rlorch.torch.manifest(target), max_concurrent_requests=4,
                      device=P.cuda_index(device),
                      on_broadcast_before=engine.before, on_broadcast_after=engine.after)
    served = 0
    with w:
        logging.info("attached%s", " (ignoring weight updates: the control run)" if args.ignore_updates else "")
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
            if cmd.kind != "generate":
                continue                      # an abort names a request already answered
            t0 = time.monotonic()
            try:
                answer = P.answer_of(cmd.prompt_metadata)
                with engine.lock:
                    if engine.torn:
                        raise RuntimeError("weights torn by a failed broadcast; waiting for the next")
                    version = w.policy_version
                    done = generate(engine.model, cmd, args.sampling_seed)
            except (ValueError, KeyError, RuntimeError) as e:
                # Answered with no rollout: the orchestrator sends the group
                # elsewhere or again.
                logging.error("request %d: %s", cmd.request_id, e)
                try:
                    w.report_error(cmd, f"request {cmd.request_id}: {e}")
                except rlorch.RlorchError as e2:
                    logging.warning("request %d: error not reported: %s", cmd.request_id, e2)
                continue
            seconds = time.monotonic() - t0
            comps = [rlorch.Completion(row, logprobs=lp, rewards=[P.reward(row, answer)],
                                       finish_reason=finish, seconds=seconds)
                     for row, lp, finish in done]
            try:
                w.report_rollouts(cmd, version, comps)
                served += 1
            except rlorch.RlorchError as e:
                # A request of an earlier registration, or a run that ended:
                # the orchestrator sends the group again where it still wants it.
                logging.warning("request %d not reported: %s", cmd.request_id, e)
    logging.info("stopped: %d requests served, %d broadcasts", served, engine.broadcasts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
