#!/usr/bin/python3
"""The RL example in one command: `rlorch serve`, one trainer and two
inference workers (trainer.py, inference.py: PyTorch on the rlorch package),
a run of --steps steps on the reverse-digits task over the host transport, and
the reward curve, one line per step as the steps commit.

    examples/rl/run.py [--steps 60] [--control] [--summary FILE]

--control makes the inference workers ignore the weight updates (they
generate with their initial weights): the reward then stays at chance.
Exits 0 when the run succeeded, every step's broadcast was verified and every
logprob recomputed within --logprob-tolerance (not checked in the control
run, whose workers do not hold what they report); the thresholds on the
curve are the test's (tests/integration/test_rl_example.sh).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import policy as P  # noqa: E402  (after the path: this directory's module)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rollouts-per-step", type=int, default=128)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-async-level", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=7e-3)
    ap.add_argument("--seed", type=int, default=0, help="the policy's initial weights")
    ap.add_argument("--sampling-seed", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=1000, help="lines of the prompt file")
    ap.add_argument("--control", action="store_true",
                    help="the inference workers ignore the weight updates")
    ap.add_argument("--logprob-tolerance", type=float, default=0.01)
    ap.add_argument("--device", default="cpu",
                    help="the trainer's and the inference workers' device: cpu, or cuda[:N] (then all "
                         "three share that GPU and the orchestrator picks the colocated mode)")
    ap.add_argument("--offload", choices=("none", "params+optimizer"), default="none",
                    help="the trainer's parameters and optimizer in pinned host memory, its step on "
                         "the CPU (FSDP2's CPUOffloadPolicy; needs --device cuda)")
    ap.add_argument("--policy", default=None,
                    help="the run's broadcast policy (default host on cpu, auto on a GPU)")
    ap.add_argument("--rlorch", default=os.environ.get("RLORCH_BIN", os.path.join(ROOT, "build", "rlorch")),
                    help="the rlorch program (default build/rlorch, or $RLORCH_BIN)")
    ap.add_argument("--data-dir", help="orchestrator data, prompts, logs and the processes' ids (pids) "
                    "(default a temporary directory, removed)")
    ap.add_argument("--summary", help="write the run's figures to this JSON file")
    ap.add_argument("--timeout", type=float, default=600, help="seconds the run may take")
    args = ap.parse_args()
    if not args.temperature > 0:
        ap.error(f"--temperature {args.temperature}: the trainer's loss needs the distribution sampled from (> 0)")
    if args.steps < 1 or args.prompts < 1:
        ap.error("--steps and --prompts: at least 1")
    if args.offload != "none" and not args.device.startswith("cuda"):
        ap.error(f"--offload {args.offload}: offloads from a GPU; pass --device cuda[:N]")
    return args


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Launcher:
    def __init__(self, args, data):
        self.args, self.data = args, data
        self.procs = []
        self.logs = os.path.join(data, "logs")
        os.makedirs(self.logs, exist_ok=True)
        grpc, metrics = free_ports(2)
        self.target = f"127.0.0.1:{grpc}"
        self.metrics_addr = f"127.0.0.1:{metrics}"
        self.env = dict(os.environ)
        # The package from this checkout, on the library of this build,
        # unless the caller points elsewhere.
        self.env["PYTHONPATH"] = os.pathsep.join(
            [HERE, os.path.join(ROOT, "workers", "python")] + self.env.get("PYTHONPATH", "").split(os.pathsep))
        lib = os.path.join(os.path.dirname(os.path.abspath(args.rlorch)), "lib", "librlorch.so.1")
        if "RLORCH_LIBRARY" not in self.env and os.path.exists(lib):
            self.env["RLORCH_LIBRARY"] = lib
        self.env.setdefault("OMP_NUM_THREADS", "1")

    def start(self, name, argv):
        log = open(os.path.join(self.logs, name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                             start_new_session=True)
        log.close()
        self.procs.append((name, p))
        # For an operator (or a test) who wants to signal one of them.
        with open(os.path.join(self.data, "pids"), "a") as f:
            f.write(f"{name} {p.pid}\n")
        return p

    def ctl(self, *argv, timeout=30):
        r = subprocess.run([self.args.rlorch, "ctl", "--target", self.target, "--json", *argv],
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"rlorch ctl {argv[0]}: exit {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
        return r.stdout

    def wait_for(self, what, cond, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with status {p.returncode} "
                                       f"(log: {os.path.join(self.logs, name + '.log')})")
            try:
                if cond():
                    return
            except (RuntimeError, subprocess.TimeoutExpired, ValueError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{what}: not within {timeout:.0f} s")

    def attached(self):
        ws = json.loads(self.ctl("list-workers")).get("workers", [])
        return sum(w["state"] in ("WORKER_STATE_READY", "WORKER_STATE_BUSY") for w in ws) == 3

    def watchdog(self, watch, deadline, why, stop):
        """Ends the watch when a process of the run exits or the run outlasts
        its deadline: the orchestrator would wait for a lost worker to come
        back, and the launcher would wait with it."""
        while not stop.wait(0.5) and watch.poll() is None:
            dead = [(n, p.returncode) for n, p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why.append(f"{dead[0][0]} exited with status {dead[0][1]} during the run (log: "
                           f"{os.path.join(self.logs, dead[0][0] + '.log')})" if dead
                           else f"the run took more than {self.args.timeout:.0f} s")
                watch.kill()
                return

    def stop_all(self):
        # Workers first, then the orchestrator; each by its own process group.
        for name, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    print(f"{name} did not stop within 20 s of SIGTERM: killed", file=sys.stderr)
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        return {name: p.returncode for name, p in self.procs}


def _num(x):
    return float("nan") if x is None else x


def read_metrics(path):
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    m = json.loads(line)
                    out[m["step"]] = m
    return out


def run(args, data):
    L = Launcher(args, data)
    prompts = os.path.join(data, "prompts.jsonl")
    with open(prompts, "w") as f:
        f.write("\n".join(P.make_prompts(args.prompts, seed=args.seed + 1)) + "\n")
    metrics = os.path.join(data, "trainer-steps.jsonl")
    py = sys.executable
    t_start = time.monotonic()
    L.start("serve", [args.rlorch, "serve", "--listen", L.target, "--metrics-listen", L.metrics_addr,
                      "--data-dir", os.path.join(data, "orchestrator")])
    L.wait_for("rlorch serve", lambda: L.ctl("list-workers", timeout=5) is not None, 30)
    L.start("trainer", [py, os.path.join(HERE, "trainer.py"), "--orchestrator", L.target,
                        "--metrics", metrics, "--lr", str(args.lr), "--seed", str(args.seed),
                        "--temperature", str(args.temperature), "--device", args.device,
                        "--offload", args.offload, "--keep-versions", str(args.max_async_level + 3)])
    for i in range(2):
        argv = [py, os.path.join(HERE, "inference.py"), "--orchestrator", L.target,
                "--name", f"rl-inference-{i}", "--seed", str(args.seed),
                "--sampling-seed", str(args.sampling_seed), "--device", args.device]
        L.start(f"inference-{i}", argv + (["--ignore-updates"] if args.control else []))
    result = {"control": args.control, "steps": [], "ok": False}
    try:
        L.wait_for("1 trainer and 2 inference workers attached", L.attached, 90)
        t_attached = time.monotonic()
        run_id = json.loads(L.ctl(
            "start-run", "--name", "rl-example" + ("-control" if args.control else ""),
            "--steps", str(args.steps), "--rollouts-per-step", str(args.rollouts_per_step),
            "--group-size", str(args.group_size), "--max-async-level", str(args.max_async_level),
            "--prompts", prompts, "--max-tokens", str(P.MAX_TOKENS),
            "--temperature", str(args.temperature), "--sampling-seed", str(args.sampling_seed),
            "--policy", args.policy or ("host" if args.device == "cpu" else "auto")))["id"]
        print(f"run {run_id}: {args.steps} steps of {args.rollouts_per_step} rollouts "
              f"({args.group_size} a prompt), {'CONTROL: inference ignores the weight updates' if args.control else 'weights broadcast every step'}")
        print(f"{'step':>4} {'reward':>7} {'verified':>8} {'rcv':>3} {'versions':>9} {'gap_bf16':>8} {'gap_fp32':>8} {'step_s':>6} {'bcast_s':>7} {'transport':>9}  curve")
        watch = subprocess.Popen([args.rlorch, "ctl", "--target", L.target, "--json", "watch-run", run_id],
                                 stdout=subprocess.PIPE, text=True, env=L.env)
        why = []
        stop = threading.Event()
        threading.Thread(target=L.watchdog, args=(watch, time.monotonic() + args.timeout, why, stop),
                         daemon=True).start()
        for line in watch.stdout:
            ev = json.loads(line)
            s = ev.get("step")
            if not isinstance(s, dict):
                continue
            n = int(s.get("step", 0))
            m = read_metrics(metrics).get(n, {})
            for _ in range(20):               # written just before the report; the disk may lag
                if m:
                    break
                time.sleep(0.05)
                m = read_metrics(metrics).get(n, {})
            rec = {"step": n, "reward_mean": m.get("reward_mean"), "weights_verified": bool(s.get("weights_verified")),
                   "receivers": s.get("receivers", 0), "policy_version": int(s.get("policy_version", 0)),
                   "rollouts_used": s.get("rollouts_used", 0), "versions": m.get("versions"),
                   "logprob_gap_max": m.get("logprob_gap_max"),
                   "logprob_gap_fp32_max": m.get("logprob_gap_fp32_max"),
                   "versions_missing": m.get("versions_missing", []), "step_seconds": s.get("step_seconds", 0.0),
                   "mode": s.get("mode", ""), "transport": s.get("transport", ""),
                   "broadcast_seconds": s.get("total_seconds", 0.0)}
            result["steps"].append(rec)
            r = rec["reward_mean"]
            bar = "#" * int(round((r or 0) * 50))
            print(f"{n:>4} {_num(r):>7.3f} {str(rec['weights_verified']):>8} "
                  f"{rec['receivers']:>3} {','.join(map(str, rec['versions'] or [])):>9} "
                  f"{_num(rec['logprob_gap_max']):>8.5f} {_num(rec['logprob_gap_fp32_max']):>8.5f} "
                  f"{rec['step_seconds']:>6.3f} {rec['broadcast_seconds']:>7.4f} {rec['transport']:>9}  {bar}", flush=True)
        watch.wait()
        stop.set()
        if why:
            raise RuntimeError(why[0])
        state = json.loads(L.ctl("get-run", run_id)).get("state")
        result.update(run_id=run_id, state=state, run_seconds=time.monotonic() - t_attached)
    finally:
        result["exit"] = L.stop_all()
        result["total_seconds"] = time.monotonic() - t_start
    return result


def summarise(args, result):
    steps = result["steps"]
    rewards = [s["reward_mean"] for s in steps if s["reward_mean"] is not None]
    k = max(1, min(10, len(rewards) // 4))
    result.update(
        chance=P.CHANCE,
        first_mean=sum(rewards[:k]) / k if rewards else None,
        last_mean=sum(rewards[-k:]) / k if rewards else None,
        window=k,
        all_verified=bool(steps) and all(s["weights_verified"] and s["receivers"] == 2 for s in steps),
        transports=sorted({s["transport"] for s in steps}),
        broadcast_seconds_median=sorted(s["broadcast_seconds"] for s in steps)[len(steps) // 2] if steps else None,
        logprob_gap_max=max((s["logprob_gap_max"] or 0.0) for s in steps) if steps else None,
        logprob_gap_fp32_max=max((s["logprob_gap_fp32_max"] or 0.0) for s in steps) if steps else None)
    problems = []
    if result.get("state") != "RUN_STATE_SUCCEEDED":
        problems.append(f"run state {result.get('state')}")
    if len(steps) != args.steps or len(rewards) != args.steps:
        problems.append(f"{len(steps)} step records, {len(rewards)} trainer steps, {args.steps} asked")
    if not result["all_verified"]:
        problems.append("a step's broadcast was not verified by both receivers")
    if not args.control and result["logprob_gap_max"] is not None and result["logprob_gap_max"] > args.logprob_tolerance:
        problems.append(f"logprob gap {result['logprob_gap_max']:.5f} > {args.logprob_tolerance}")
    unchecked = [s["step"] for s in steps if s["versions_missing"]]
    if unchecked:
        problems.append(f"steps {unchecked}: rollouts of versions the trainer no longer held, logprobs unchecked")
    if any(rc != 0 for rc in result["exit"].values()):
        problems.append(f"exit statuses {result['exit']}")
    result["problems"] = problems
    result["ok"] = not problems
    print(f"reward: first {k} steps {_num(result['first_mean']):.3f}, last {k} steps {_num(result['last_mean']):.3f} "
          f"(chance {P.CHANCE:.3f}); all {len(steps)} steps verified: {result['all_verified']}; "
          f"largest logprob gap {_num(result['logprob_gap_max']):.6f} "
          f"(with the fp32 weights {_num(result['logprob_gap_fp32_max']):.6f}); broadcasts over "
          f"{','.join(result['transports'])}, median {_num(result['broadcast_seconds_median']):.4f} s; "
          f"run {result.get('run_seconds', 0):.1f} s, "
          f"all {result['total_seconds']:.1f} s")
    for p in problems:
        print("PROBLEM:", p)
    return result


def main():
    args = parse_args()
    if not os.access(args.rlorch, os.X_OK):
        print(f"{args.rlorch}: not an executable (build rlorch first, or pass --rlorch)", file=sys.stderr)
        return 2
    data = args.data_dir or tempfile.mkdtemp(prefix="rlorch-rl-example.")
    os.makedirs(data, exist_ok=True)
    try:
        result = summarise(args, run(args, data))
    except (RuntimeError, subprocess.SubprocessError, OSError, ValueError) as e:
        print(f"run.py: {e}", file=sys.stderr)
        for f in sorted(os.listdir(os.path.join(data, "logs"))) if os.path.isdir(os.path.join(data, "logs")) else []:
            with open(os.path.join(data, "logs", f)) as fh:
                print(f"---- {f} (last 30 lines)\n" + "".join(fh.readlines()[-30:]), file=sys.stderr)
        result = {"ok": False, "problems": [str(e)]}
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(result, f, indent=1)
    if not args.data_dir:
        shutil.rmtree(data, ignore_errors=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
