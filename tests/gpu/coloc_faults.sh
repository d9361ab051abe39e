#!/usr/bin/env bash
# Colocated faults on one GPU: `rlorch serve`, a trainer and two inference
# agents on GPU 0 (every plan colocated, over CUDA IPC). Scenarios:
#   kill-receiver  inference-1 is killed (SIGKILL) as a colocated broadcast
#                  to it begins; it must be declared lost within the worker
#                  timeout, the step re-planned without it, the run succeed.
#   stop-receiver  inference-1 is stopped (SIGSTOP) as a broadcast to it
#                  begins, for STOP_S (8 s): declared lost within the worker
#                  timeout (4 s), the step re-planned without it, the run
#                  succeeds; resumed, it registers again and is caught up.
#   kill-sender    the trainer (100m, 2 layers, --checkpoint-dir) is killed as
#                  its third broadcast begins: the receivers' broadcast ends in
#                  a named error or a cancel, the trainer is declared lost,
#                  and started again on its checkpoint the run resumes.
#   double-buffer  the same run with both inference agents on two buffer
#                  sets (--double-buffer on): every step colocated, verified.
# Prints one row per scenario: detected in (s), recovered, steps lost, steps
# duplicated, measured from the daemon's log. The refusal of a mismatched
# colocated plan (an export for another plan hash, a corrupted or truncated
# one) is gpu_test_bcast_coloc's refusals_name_what_is_wrong.
#
# Runs RLORCH_BIN (ctest sets it: label gpu) or else `rlorch` in $BUNDLE/bin
# (default .devbundle) with its libraries in $BUNDLE/lib; exits 77 (skipped)
# without a CUDA device. Writes logs and the table under $OUT. PRESET and
# LAYERS set the model (default 1b, 8 layers), STEPS the steps of each run
# (default 12).
set -u
BUNDLE=${BUNDLE:-.devbundle}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
PRESET=${PRESET:-1b}
LAYERS=${LAYERS:-8}
STEPS=${STEPS:-12}
# DEVICE=-1 WANT_MODE=host runs the same scenarios on the host transport, as a
# check of the script itself on a machine without a GPU.
DEVICE=${DEVICE:-0}
WANT_MODE=${WANT_MODE:-colocated}
if [ -z "${RLORCH_BIN:-}" ]; then
  export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export NCCL_NVLS_ENABLE=0
R="${RLORCH_BIN:-$PWD/$BUNDLE/bin/rlorch}"
if [ "$DEVICE" -ge 0 ]; then
  ngpu="$("$R" version --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["cuda_devices"])')"
  if [ "${ngpu:-0}" -lt 1 ]; then
    echo "skipped: needs a CUDA device, ${ngpu:-0} visible (DEVICE=-1 WANT_MODE=host runs it on the host transport)"
    exit 77
  fi
fi
WORKER_TIMEOUT_MS=4000
STOP_S=8
work=$(mktemp -d)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
}
trap cleanup EXIT
rows=() failed=0

# signal_at LOG PID SIG: sends SIG to PID as LOG shows its third
# broadcast_start (SIGSTOP: SIGCONT after STOP_S); prints the Unix time.
signal_at() {
  timeout 120 python3 - "$1" "$2" "$3" "$STOP_S" <<'PY'
import os, signal, sys, time
log, pid, sig, hold = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
seen = 0
with open(log) as f:
    while seen < 3:
        line = f.readline()
        if not line:
            time.sleep(0.0005)
            continue
        seen += "event=broadcast_start" in line
os.kill(pid, getattr(signal, "SIG" + sig))
print(f"{time.time():.3f}", flush=True)
if sig == "STOP":
    time.sleep(hold)
    os.kill(pid, signal.SIGCONT)
PY
}

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# scenario NAME INFERENCE_FLAGS... : one daemon, its agents and one run.
scenario() {
  local name=$1
  shift
  local dir="$work/$name" addr="127.0.0.1:$(port)" maddr="127.0.0.1:$(port)"
  mkdir -p -m 700 "$dir/data"
  RLORCH_WORKER_TIMEOUT_MS=$WORKER_TIMEOUT_MS "$R" serve --listen "$addr" --metrics-listen "$maddr" \
    --data-dir "$dir/data" >"$dir/serve.log" 2>&1 &
  local serve=$!
  pids+=("$serve")
  local i
  for i in $(seq 1 100); do
    "$R" ctl --target "$addr" list-workers >/dev/null 2>&1 && break
    sleep 0.1
  done
  local preset=$PRESET layers=$LAYERS tflags=()
  if [ "$name" = kill-sender ]; then
    # Its checkpoint is written every step: a small model keeps that short.
    preset=100m layers=2 tflags=(--checkpoint-dir "$dir/ckpt")
  fi
  "$R" trainer --orchestrator "$addr" --name trainer-0 --device "$DEVICE" --preset "$preset" --layers "$layers" \
    --offload params "${tflags[@]}" >"$dir/trainer.log" 2>&1 &
  local trainer=$!
  pids+=($trainer)
  local inf=()
  for i in 0 1; do
    "$R" inference --orchestrator "$addr" --name "inference-$i" --device "$DEVICE" "$@" \
      >"$dir/inference.$i.log" 2>&1 &
    inf[i]=$!
    pids+=($!)
  done
  for i in $(seq 1 300); do
    "$R" ctl --target "$addr" --json list-workers 2>/dev/null | python3 -c '
import json, sys
ws = json.load(sys.stdin).get("workers", [])
sys.exit(0 if sum(w["state"] in ("WORKER_STATE_READY", "WORKER_STATE_BUSY") for w in ws) == 3 else 1)' && break
    sleep 0.2
  done
  local run
  run=$("$R" ctl --target "$addr" --json start-run --name "$name" --preset "$preset" \
    --steps "$STEPS" --rollouts-per-step 2 | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  local killed_at=0 sig=
  case $name in
    kill-receiver) sig=KILL ;;
    stop-receiver) sig=STOP ;;
  esac
  if [ "$name" = kill-sender ]; then
    # The trainer dies as its third colocated broadcast begins, writing into
    # both receivers; started again on its checkpoint, the run resumes.
    killed_at=$(signal_at "$dir/trainer.log" "$trainer" KILL)
    sleep 1
    "$R" trainer --orchestrator "$addr" --name trainer-0 --device "$DEVICE" --preset "$preset" --layers "$layers" \
      --offload params "${tflags[@]}" >"$dir/trainer.2.log" 2>&1 &
    pids+=($!)
  elif [ -n "$sig" ]; then
    # The third broadcast to inference-1: its plan acked, the trainer about to
    # write into it. A stopped one is resumed after STOP_S.
    killed_at=$(signal_at "$dir/inference.1.log" "${inf[1]}" "$sig")
  fi
  timeout 300 "$R" ctl --target "$addr" watch-run "$run" >/dev/null 2>&1
  "$R" ctl --target "$addr" --json get-run "$run" >"$dir/run.json"
  WANT_MODE=$WANT_MODE RX_LOG="$dir/inference.0.log" python3 - "$name" "$dir/serve.log" "$dir/run.json" "$run" "$STEPS" "${killed_at:-0}" <<'PY' >>"$OUT/coloc_faults.rows"
import datetime, json, os, re, sys
name, log, runf, run, steps, killed = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), float(sys.argv[6] or 0)
def ts(line):
    m = re.match(r"ts=(\S+)Z ", line)
    return datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=datetime.timezone.utc).timestamp()
state = json.load(open(runf)).get("state", "?")
lost, recs, modes, verified = None, [], set(), True
victim = "trainer-0" if name == "kill-sender" else "inference-1"
for line in open(log):
    if lost is None and "event=worker_lost" in line and f"name={victim}" in line:
        lost = ts(line)
    if "event=step " in line and f"run={run} " in line:
        m = re.search(r" step=(\d+) ", line)
        recs.append(int(m.group(1)))
        modes.add(re.search(r" mode=(\S+)", line).group(1))
        verified &= " verified=1" in line
detect = f"{lost - killed:.2f}" if killed and lost else ("-" if not killed else "never")
rx_err = "-"
if name == "kill-sender":
    # The surviving receiver's broadcast ends in a named error or a cancel.
    for line in open(os.environ["RX_LOG"]):
        if ("event=broadcast_failed" in line or "event=broadcast_cancelled" in line) and ts(line) >= killed:
            rx_err = f"{ts(line) - killed:.2f} s ({'cancelled' if 'cancelled' in line else 'failed'})"
            break
catchup = sum("event=plan_built" in l and "-catchup" in l and f"run={run} " in l for l in open(log))
lost_steps = len(set(range(steps)) - set(recs))
dup = len(recs) - len(set(recs))
ok = state == "RUN_STATE_SUCCEEDED" and lost_steps == 0 and dup == 0 and verified and modes == {os.environ["WANT_MODE"]}
if killed and not lost: ok = False
print(f"| {name} | {detect} | {'yes' if ok else 'no'} | {lost_steps} | {dup} | {state}, modes {'/'.join(sorted(modes))}, verified {verified}, catch-ups {catchup}, receiver ended {rx_err} | {'ok' if ok else 'FAIL'} |")
PY
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  pids=()
  for f in "$dir"/*.log; do cp "$f" "$OUT/$name.$(basename "$f")"; done
}

: >"$OUT/coloc_faults.rows"
scenario kill-receiver
scenario stop-receiver
scenario kill-sender
scenario double-buffer --double-buffer on
{
  echo "| scenario | detected in (s) | recovered | steps lost | steps duplicated | observed | result |"
  echo "|---|---|---|---|---|---|---|"
  cat "$OUT/coloc_faults.rows"
} | tee "$OUT/coloc_faults.md"
grep -q "| FAIL |$" "$OUT/coloc_faults.rows" && exit 1
exit 0
