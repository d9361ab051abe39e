#!/usr/bin/env bash
# A trainer group on one GPU: N `rlorch trainer --rank r --ranks N --device 0`
# processes and two `rlorch inference --device 0` agents share the GPU, so
# every plan runs colocated, each rank writing its own slices into both
# receivers over CUDA IPC. For each case (N, offload) a run of STEPS steps on
# a daemon of its own; every step record must say colocated, cuda-ipc,
# sources N, 2 receivers, verified. With VIEWS=1 the trainers keep their
# parts on the GPU and the receivers are CPU processes: one whole and a
# tensor-parallel engine of 2 (`--tp-size 2`), so every plan runs on the
# host transport with receiver views, and every step record must say host,
# 3 receivers, verified (N = 1: a lone trainer). Usage: group_coloc.sh
# OUTDIR (binaries in $BUNDLE/bin, default .devbundle). Exits 1 when a case
# failed.
set -u
OUT=${1:?usage: group_coloc.sh OUTDIR}
BUNDLE=${BUNDLE:-.devbundle}
STEPS=${STEPS:-4}
PRESET=${PRESET:-1b}
LAYERS=${LAYERS:-0}
VIEWS=${VIEWS:-0}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export RLORCH_HEARTBEAT_INTERVAL_MS=200 RLORCH_WORKER_TIMEOUT_MS=5000
R="$PWD/$BUNDLE/bin/rlorch"
failed=()
port=$((20000 + RANDOM % 20000))

one_case() { # N OFFLOAD
  local n=$1 off=$2 tag="n$1-$2" dir pids=() r out run
  dir=$(mktemp -d)
  port=$((port + 2))
  local addr="127.0.0.1:$port"
  "$R" serve --listen "$addr" --metrics-listen "127.0.0.1:$((port + 1))" --data-dir "$dir" \
    >"$OUT/serve.$tag.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do "$R" ctl --target "$addr" list-workers >/dev/null 2>&1 && break; sleep 0.1; done
  local rx=(0 1) want_mode=BROADCAST_MODE_COLOCATED want_transport=cuda-ipc
  ((VIEWS)) && rx=(whole 0 1) want_mode=BROADCAST_MODE_HOST want_transport=host-tcp
  for ((r = 0; r < n; r++)); do
    local rf=(--rank "$r" --ranks "$n")
    ((n == 1)) && rf=()
    "$R" trainer --orchestrator "$addr" --name "rank-$r" --preset "$PRESET" --layers "$LAYERS" \
      --device 0 --offload "$off" "${rf[@]}" >"$OUT/trainer.$tag.$r.log" 2>&1 &
    pids+=($!)
  done
  for r in "${rx[@]}"; do
    local f=(--device 0)
    ((VIEWS)) && f=(--device -1)
    ((VIEWS)) && [ "$r" != whole ] && f+=(--tp-size 2 --tp-rank "$r" --preset "$PRESET" --layers "$LAYERS")
    "$R" inference --orchestrator "$addr" --name "inference-$r" "${f[@]}" \
      >"$OUT/inference.$tag.$r.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 600); do
    [ "$("$R" ctl --target "$addr" --json list-workers 2>/dev/null | grep -o WORKER_STATE_READY | wc -l)" -ge $((n + ${#rx[@]})) ] && break
    sleep 0.1
  done
  run=$("$R" ctl --target "$addr" --json start-run --name "$tag" --preset "$PRESET" --steps "$STEPS" \
    --rollouts-per-step 8 --group-size 2 | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  timeout 300 "$R" ctl --target "$addr" --json watch-run "$run" >"$OUT/events.$tag.jsonl"
  out=$(python3 - "$OUT/events.$tag.jsonl" "$STEPS" "$n" "$want_mode" "$want_transport" "${#rx[@]}" <<'PY'
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"step":{' in l]
want, n, mode, transport, nrx = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6])
bad = []
for i, s in enumerate(steps):
    if not s.get("weights_verified"): bad.append(f"step {i} not verified")
    if s.get("mode") != mode: bad.append(f"step {i}: mode {s.get('mode')}")
    if s.get("transport") != transport: bad.append(f"step {i}: transport {s.get('transport')}")
    if s.get("sources", 1) != n: bad.append(f"step {i}: sources {s.get('sources')}")
    if s.get("receivers") != nrx: bad.append(f"step {i}: receivers {s.get('receivers')}")
if len(steps) != want: bad.append(f"{len(steps)} steps of {want}")
t = sorted(float(s.get("total_seconds", 0)) for s in steps)
print("; ".join(bad) or "ok", "median_total_s=%.4f" % (t[len(t) // 2] if t else 0))
PY
)
  echo "$tag: $out" | tee -a "$OUT/summary.txt"
  case $out in ok*) ;; *) failed+=("$tag") ;; esac
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$dir"
}

# CASES: "N OFFLOAD" pairs, comma-separated.
IFS=, read -ra cases <<<"${CASES:-2 params,4 params,2 none}"
for c in "${cases[@]}"; do
  one_case $c
done
echo "failed: ${failed[*]:-none}" | tee -a "$OUT/summary.txt"
[ ${#failed[@]} -eq 0 ]
