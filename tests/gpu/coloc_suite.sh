#!/usr/bin/env bash
# Colocated mode on one GPU, every check and benchmark in one go: the GPU
# tests, `rlorch run` with the trainer and inference workers sharing GPU 0
# (params+optimizer with the bf16 shadow on and off among them),
# `rlorch bench broadcast --mode colocated` for 1b, 4b and 8b, and
# `rlorch bench adamw` (the CPU optimizer step with and without the shadow)
# for 1b and 4b. Expects the binaries in $BUNDLE/bin (default .devbundle:
# rlorch, gpu_test_bcast_coloc, gpu_test_bcast_gpu, gpu_test_agent_shadow),
# writes results under $OUT, stays within $BUDGET_S seconds (default 450): a
# step that would start later is listed as skipped. STEPS, a regular
# expression, runs only the steps whose names match (STEPS='shadow|adamw':
# the bf16 shadow's test, run and benchmarks). Each step is independent;
# exits 1 when any step failed.
set -u
BUNDLE=${BUNDLE:-.devbundle}
OUT=${OUT:-$(mktemp -d)}
BUDGET_S=${BUDGET_S:-450}
export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B="$PWD/$BUNDLE/bin"
R="$B/rlorch"
work=$(mktemp -d)
failed=() skipped=() nsteps=0

step() { # NAME TIMEOUT CMD...
  local name=$1 t=$2
  shift 2
  [[ -n ${STEPS:-} && ! $name =~ $STEPS ]] && return
  if [ $((SECONDS + 20)) -gt "$BUDGET_S" ]; then
    skipped+=("$name(time)")
    echo "$name skipped: ${SECONDS}s of ${BUDGET_S}s used" | tee -a "$OUT/summary.txt"
    return
  fi
  [ $((SECONDS + t)) -gt "$BUDGET_S" ] && t=$((BUDGET_S - SECONDS))
  local t0=$SECONDS
  timeout "$t" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  nsteps=$((nsteps + 1))
  case $rc in
    0) ;;
    77) skipped+=("$name") ;;
    *) failed+=("$name") ;;
  esac
  echo "$name rc=$rc seconds=$((SECONDS - t0))" | tee -a "$OUT/summary.txt"
}

# `rlorch run` on this GPU: every step colocated, over CUDA IPC, verified.
run_check() { # OFFLOAD WORKERS
  local dir="$work/run-$1-$2" out rc
  out="$("$R" run --preset 1b --offload "$1" --steps 3 --inference-workers "$2" \
    --data-dir "$dir" --json)"
  rc=$?
  printf '%s\n' "$out" | grep -E '"step":\{' | tail -3
  for f in "$dir"/logs/*.log; do
    [ -f "$f" ] && grep -E 'level=(warn|error)|devices|coloc_export' "$f" | head -8
  done
  printf '%s\n' "$out" | python3 -c '
import json, sys
steps = [json.loads(l)["step"] for l in sys.stdin if "\"step\":{" in l]
bad = ["step %s: %s %s verified=%s" % (s["step"], s["mode"], s.get("transport"), s["weights_verified"])
       for s in steps if s["mode"] != "BROADCAST_MODE_COLOCATED" or not s["weights_verified"]
       or s.get("transport") != "cuda-ipc"]
for s in steps: print("step %s: %.4f s, %s, %s" % (s["step"], s.get("total_seconds", 0), s["mode"], s.get("transport")))
print("ok" if len(steps) == 3 and not bad else "FAIL: " + ("; ".join(bad) or "%d steps" % len(steps)))
sys.exit(0 if len(steps) == 3 and not bad else 1)' || return 1
  return $rc
}

# params+optimizer on this GPU: the trainer sends the bf16 shadow its CPU
# AdamW step writes (--bf16-shadow on) or its pinned fp32 master (off). Both
# run colocated and verify every step; the trainer's checksums are the same
# step by step, and the shadow's steps move half the PCIe bytes.
shadow_check() {
  local s
  for s in on off; do
    "$R" run --preset 1b --offload params+optimizer --bf16-shadow "$s" --steps 3 \
      --inference-workers 1 --data-dir "$work/shadow-$s" --json >"$work/shadow-$s.jsonl" || return 1
  done
  python3 - "$work" <<'EOF'
import json, re, sys
w, res, bad = sys.argv[1], {}, []
for s in ("on", "off"):
    steps = [json.loads(l)["step"] for l in open(f"{w}/shadow-{s}.jsonl") if '"step":{' in l]
    log = open(f"{w}/shadow-{s}/logs/trainer-0.log").read()
    ready = re.search(r"event=trainer_ready .*", log)
    sums = re.findall(r"event=(?:trainer_ready|step_done) .*?checksum=([0-9a-f]+)", log)
    res[s] = (steps, ready.group(0) if ready else "", sums)
    for t in steps:
        print("shadow %s step %s: %.4f s, %s, %s, PCIe %s bytes, verified %s" % (
            s, t["step"], t.get("total_seconds", 0), t["mode"], t.get("transport"),
            t.get("pcie_bytes"), t["weights_verified"]))
    if len(steps) != 3:
        bad.append("%s: %d steps" % (s, len(steps)))
    bad += ["%s step %s: %s %s verified=%s" % (s, t["step"], t["mode"], t.get("transport"),
                                               t["weights_verified"])
            for t in steps if t["mode"] != "BROADCAST_MODE_COLOCATED"
            or t.get("transport") != "cuda-ipc" or not t["weights_verified"]]
print("trainer on:  " + res["on"][1])
print("trainer off: " + res["off"][1])
if "bf16_shadow=host-pinned" not in res["on"][1]:
    bad.append("on: the trainer does not send a pinned shadow")
if "bf16_shadow=off" not in res["off"][1]:
    bad.append("off: the trainer sends a shadow")
if len(res["on"][2]) != 4 or res["on"][2] != res["off"][2]:
    bad.append("checksums on %s, off %s" % (res["on"][2], res["off"][2]))
pon = [int(t.get("pcie_bytes", 0)) for t in res["on"][0]]
poff = [int(t.get("pcie_bytes", 0)) for t in res["off"][0]]
if not pon or len(pon) != len(poff) or any(a == 0 or 2 * a != b for a, b in zip(pon, poff)):
    bad.append("PCIe bytes on %s, off %s: not half" % (pon, poff))
print("ok" if not bad else "FAIL: " + "; ".join(bad))
sys.exit(1 if bad else 0)
EOF
}

{ nvidia-smi -L; nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv; "$R" version; } \
  >"$OUT/env.txt" 2>&1
step gpu_test_bcast_coloc 240 "$B/gpu_test_bcast_coloc" --jobs 1 --verbose
step gpu_test_bcast_gpu 120 "$B/gpu_test_bcast_gpu" --jobs 1
step gpu_test_agent_shadow 120 "$B/gpu_test_agent_shadow" --jobs 1 --verbose
export -f run_check shadow_check
export R work
step run_1b_none_coloc 150 bash -c 'run_check none 1'
step run_1b_params_coloc_2rx 170 bash -c 'run_check params 2'
step run_1b_params_optimizer_shadow 240 bash -c 'shadow_check'
for p in 1b 4b; do
  for m in gpu host bf16-host; do
    step "bench_${p}_${m}" 150 "$R" bench broadcast --mode colocated --preset "$p" --master "$m" \
      --reps 5 --json
  done
  # 16 bytes of host memory per parameter: 65 GB for 4b.
  step "bench_adamw_${p}" 240 "$R" bench adamw --preset "$p" --reps 5 --json
done
step bench_8b_gpu 120 "$R" bench broadcast --mode colocated --preset 8b --master gpu --reps 5 --json
step bench_8b_host 200 "$R" bench broadcast --mode colocated --preset 8b --master host --reps 3 --json

# The benchmark lines side by side, then every output in one archive.
grep -h -E '"bench":"(broadcast|adamw)"' "$OUT"/bench_*.txt >"$OUT/bench.jsonl" 2>/dev/null
grep -h -E 'GPU free|RSS|PASS|FAIL|SKIP|Synthesis' "$OUT/gpu_test_bcast_coloc.txt" \
  >"$OUT/tests_digest.txt" 2>/dev/null
if ! (cd "$OUT" && tar czf results.tgz --exclude results.tgz ./*.txt && \
  find . -name '*.txt' ! -name summary.txt ! -name tests_digest.txt -delete); then
  failed+=("results archive")
fi
{
  [ ${#skipped[@]} -gt 0 ] && echo "skipped: ${skipped[*]}"
  if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED ${#failed[@]} of $nsteps steps: ${failed[*]}"
  else
    echo "all $nsteps steps passed"
  fi
  echo "total ${SECONDS}s"
} >>"$OUT/summary.txt"
cat "$OUT/summary.txt"
[ -f "$OUT/bench.jsonl" ] && cat "$OUT/bench.jsonl"
rm -rf "$work"
[ ${#failed[@]} -eq 0 ]
