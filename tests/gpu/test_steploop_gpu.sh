#!/usr/bin/env bash
# The step loop on GPUs: 1 trainer GPU and 1 inference GPU. offload=params must
# choose staged, offload=none direct, and every step must verify the
# receiver's weights. Needs 2 CUDA devices; exits 77 (skipped) otherwise.
set -u
R="${RLORCH_BIN:?RLORCH_BIN must point at build/rlorch}"
ngpu="$("$R" version --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["cuda_devices"])')"
if [ "${ngpu:-0}" -lt 2 ]; then
  echo "skipped: needs 2 CUDA devices, $ngpu visible"
  exit 77
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { # OFFLOAD WANT_MODE
  local out rc
  out="$("$R" run --preset "${PRESET:-1b}" --offload "$1" --steps 3 --inference-workers 1 \
    --data-dir "$tmp/$1" --json 2>"$tmp/$1.err")"
  rc=$?
  verdict="$(printf '%s\n' "$out" | python3 -c '
import json, sys
want = sys.argv[1]
steps = [json.loads(l)["step"] for l in sys.stdin if "\"step\":{" in l]
bad = ["step %s: %s verified=%s" % (s["step"], s["mode"], s["weights_verified"]) for s in steps
       if s["mode"] != want or not s["weights_verified"] or s["transport"] != "nccl"]
print("ok" if len(steps) == 3 and not bad else "; ".join(bad) or "%d steps" % len(steps))' "$2")"
  if [ "$rc" = 0 ] && [ "$verdict" = ok ]; then
    echo "ok   - offload $1: 3 verified $2 steps over nccl"
    pass=$((pass + 1))
  else
    echo "FAIL - offload $1: exit $rc, $verdict"
    tail -5 "$tmp/$1.err"
    fail=$((fail + 1))
  fi
}
check params BROADCAST_MODE_STAGED
check none BROADCAST_MODE_DIRECT
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
