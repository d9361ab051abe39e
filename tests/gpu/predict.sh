#!/usr/bin/env bash
# The cost model against real broadcasts on a GPU machine: `rlorch run` in
# each case (policy, offload), every step's record read back, and the
# measured seconds set beside the orchestrator's prediction; plus each
# worker's start-up topology line (what it detected: GPU bus id, NUMA node,
# NVLink peers, NICs). Prints one line per step and a summary per case.
# Usage: predict.sh OUTDIR (binaries in $BUNDLE/bin, default .devbundle).
# CASES: "policy:offload[:preset[:workers]]" separated by spaces.
# Exits 1 when a case's run failed or a step has no prediction.
set -u
OUT=${1:?usage: predict.sh OUTDIR}
BUNDLE=${BUNDLE:-.devbundle}
STEPS=${STEPS:-4}
CASES=${CASES:-"colocated:none:1b colocated:params:1b host:none:1b:2 host:params:100m:2"}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R="$PWD/$BUNDLE/bin/rlorch"
failed=()
for c in $CASES; do
  IFS=: read -r policy offload preset workers <<<"$c"
  dir="$OUT/run-$policy-$offload"
  rm -rf "$dir"
  "$R" run --steps "$STEPS" --policy "$policy" --offload "$offload" --preset "${preset:-1b}" \
    --inference-workers "${workers:-1}" --data-dir "$dir" --json >"$OUT/$policy-$offload.jsonl" \
    2>"$OUT/$policy-$offload.err"
  rc=$?
  echo "== $c: rlorch run exit $rc"
  grep -h 'event=topology' "$dir"/logs/*.log 2>/dev/null | sed 's/^ts=[^ ]* //' | sort -u | head -4
  python3 - "$OUT/$policy-$offload.jsonl" <<'PY' || failed+=("$c")
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"step":{' in l]
bad, ratios = 0, []
for s in steps:
    p = s.get("prediction")
    if not p:
        print(f"  step {s['step']}: {s['total_seconds']:.4f} s, no prediction: {s.get('prediction_note')}")
        bad += 1
        continue
    ratios.append(p["measured_over_predicted"])
    print(f"  step {s['step']}: {s['mode']} {s['transport']} measured {s['total_seconds']:.4f} s"
          f" predicted {p['total_seconds']:.4f} s ratio {p['measured_over_predicted']:.3f}"
          f" {p['layout']} bottleneck {p['bottleneck']} verified {s['weights_verified']}")
if ratios:
    r = sorted(ratios)
    print(f"  median ratio {r[len(r) // 2]:.3f} over {len(r)} steps (min {r[0]:.3f}, max {r[-1]:.3f})")
sys.exit(1 if bad or not steps else 0)
PY
  ((rc == 0)) || failed+=("$c")
done
((${#failed[@]} == 0)) || { echo "FAILED: ${failed[*]}"; exit 1; }
