#!/usr/bin/env bash
# Every GPU check and benchmark in one go, for a machine with NVIDIA GPUs.
# Expects the binaries in $BUNDLE/bin (default .devbundle, made with the
# device bundle script from build/rlorch and build/tests/gpu_test_*), writes
# results under $OUT. Each step is independent: a failure is recorded, the
# next step still runs. Exits 1 when any step failed (a step that exits 77
# skipped itself and is listed as skipped), 0 when every step passed.
set -u
BUNDLE=${BUNDLE:-.devbundle}
OUT=${OUT:-$(mktemp -d)}
export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R="$PWD/$BUNDLE/bin/rlorch"
work=$(mktemp -d)
failed=() skipped=() nsteps=0

step() { # NAME TIMEOUT CMD...
  local name=$1 t=$2
  shift 2
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

{ nvidia-smi -L; nvidia-smi topo -m; "$R" version; } >"$OUT/env.txt" 2>&1
ntests=0
for t in "$PWD/$BUNDLE"/bin/gpu_test_*; do
  [ -x "$t" ] || continue
  ntests=$((ntests + 1))
  step "$(basename "$t")" 300 "$t" --jobs 1 --verbose
done
# A bundle without its test programs would otherwise pass on benchmarks alone.
if [ "$ntests" = 0 ]; then
  failed+=("gpu_test_* (none in $BUNDLE/bin)")
  echo "gpu_test_* missing from $BUNDLE/bin" | tee -a "$OUT/summary.txt"
fi
step test_steploop_gpu 600 env RLORCH_BIN="$R" bash "$PWD/tests/gpu/test_steploop_gpu.sh"
step bench_rpc 300 "$R" bench rpc
step bench_steploop 300 "$R" bench steploop
step bench_4b_staged 300 "$R" bench broadcast --preset 4b --mode staged --reps 5
step bench_4b_direct 300 "$R" bench broadcast --preset 4b --mode direct --reps 5
step bench_1b_direct_1g 300 "$R" bench broadcast --preset 1b --mode direct --reps 5 --budget-mib 1024
step run_1b_params 300 "$R" run --preset 1b --offload params --steps 6 --inference-workers 1 \
  --data-dir "$work/r1"
step run_1b_none 300 "$R" run --preset 1b --offload none --steps 6 --inference-workers 1 \
  --data-dir "$work/r2"
step run_1b_params_opt 300 "$R" run --preset 1b --offload params+optimizer --steps 4 \
  --inference-workers 1 --data-dir "$work/r4"
step run_4b_params 400 "$R" run --preset 4b --offload params --steps 4 --inference-workers 1 \
  --data-dir "$work/r3"
for d in r1 r2 r3 r4; do
  for f in "$work/$d"/logs/*.log; do
    [ -f "$f" ] && { echo "== $d/$(basename "$f")"; grep -E 'level=(warn|error)|devices|no_gpu' "$f" | head -20; }
  done
done >"$OUT/run_logs.txt" 2>&1
# Few files travel back: everything in one archive, the summary beside it.
if ! (cd "$OUT" && tar czf results.tgz --exclude results.tgz --exclude summary.txt ./*.txt && \
  find . -name '*.txt' ! -name summary.txt -delete); then
  failed+=("results archive")
fi
{
  [ ${#skipped[@]} -gt 0 ] && echo "skipped: ${skipped[*]}"
  if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED ${#failed[@]} of $nsteps steps: ${failed[*]}"
  else
    echo "all $nsteps steps passed"
  fi
} >>"$OUT/summary.txt"
cat "$OUT/summary.txt"
[ ${#failed[@]} -eq 0 ]
