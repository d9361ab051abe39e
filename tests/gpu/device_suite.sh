#!/usr/bin/env bash
# Every GPU check and benchmark in one go, for a machine with NVIDIA GPUs.
# Expects the binaries in $BUNDLE/bin (default .devbundle, made with the
# device bundle script from build/rlorch and build/tests/gpu_test_*), writes
# results under $OUT. Each step is independent: a failure is recorded, the
# next step still runs.
set -u
BUNDLE=${BUNDLE:-.devbundle}
OUT=${OUT:-$(mktemp -d)}
export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R="$PWD/$BUNDLE/bin/rlorch"
work=$(mktemp -d)

step() { # NAME TIMEOUT CMD...
  local name=$1 t=$2
  shift 2
  local t0=$SECONDS
  timeout "$t" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - t0))" | tee -a "$OUT/summary.txt"
}

{ nvidia-smi -L; nvidia-smi topo -m; "$R" version; } >"$OUT/env.txt" 2>&1
for t in "$PWD/$BUNDLE"/bin/gpu_test_*; do
  [ -x "$t" ] && step "$(basename "$t")" 300 "$t" --jobs 1 --verbose
done
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
(cd "$OUT" && tar czf results.tgz --exclude results.tgz --exclude summary.txt ./*.txt && \
  find . -name '*.txt' ! -name summary.txt -delete)
cat "$OUT/summary.txt"
