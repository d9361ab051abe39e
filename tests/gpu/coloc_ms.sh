#!/usr/bin/env bash
# Several trainer ranks writing into colocated receivers, on one GPU: the
# multi-source GPU tests (2 and 4 source engines, host-pinned and
# GPU-resident shards, 2 receivers, a source that never writes, invalid
# mixes), the one-source colocated tests beside them, and
# `rlorch bench broadcast --mode colocated --senders 4 --receivers 2` for a
# host and a GPU master (1b by default: PRESET=...), each against one sender
# and the floor measured in the same run.
#   bash tests/gpu/coloc_ms.sh OUTDIR
# Expects the binaries in $BUNDLE/bin (default .devbundle: rlorch and
# gpu_test_bcast_coloc) with their libraries in $BUNDLE/lib. Writes one file
# per step and summary.txt under OUTDIR; each step is independent. Exits 1
# when any step failed, 0 when all passed (a step that exits 77 skipped
# itself and is listed as skipped).
set -u
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
OUT=$1
mkdir -p "$OUT" || exit 2
BUNDLE=${BUNDLE:-.devbundle}
PRESET=${PRESET:-1b}
export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B="$PWD/$BUNDLE/bin"
failed=() skipped=()
: >"$OUT/summary.txt"

step() { # NAME TIMEOUT CMD...
  local name=$1 t=$2
  shift 2
  local t0=$SECONDS
  timeout "$t" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  case $rc in
    0) ;;
    77) skipped+=("$name") ;;
    *) failed+=("$name") ;;
  esac
  echo "$name rc=$rc seconds=$((SECONDS - t0))" | tee -a "$OUT/summary.txt"
}

nvidia-smi -L >"$OUT/gpus.txt" 2>&1
step gpu_test_coloc_ms 300 "$B/gpu_test_bcast_coloc" --jobs 1 --verbose --filter 'coloc_ms/*'
step gpu_test_coloc_one_source 300 "$B/gpu_test_bcast_coloc" --jobs 1 --verbose --filter 'coloc/*'
for m in host gpu; do
  step "bench_${PRESET}_senders4_rx2_master_$m" 300 "$B/rlorch" bench broadcast --preset "$PRESET" \
    --mode colocated --senders 4 --receivers 2 --master "$m" --reps 5
done
# The host transport's --senders table, which shares the runner: still whole.
step bench_host_senders4_rx2_100m 120 "$B/rlorch" bench broadcast --preset 100m --layers 4 --mode host \
  --senders 4 --receivers 2 --reps 3
echo "failed: ${failed[*]:-none}; skipped: ${skipped[*]:-none}" | tee -a "$OUT/summary.txt"
[ ${#failed[@]} -eq 0 ]
