#!/usr/bin/env bash
# The orchestration benchmarks end to end, as a smoke test (no figure is
# judged here; bench/ and docs/BENCHMARKS.md do that): each drives a real
# `rlorch serve` through whole runs and must see every run succeed.
source "$(dirname "$0")/lib.sh"
need_cmd python3

out="$("$RLORCH_BIN" bench steploop --steps 2 --rollouts-per-step 4 --json 2>&1)"
assert_eq 0 "$?" "bench steploop exits 0" || printf '%s\n' "$out"
assert_eq "true true true" "$(printf '%s\n' "$out" | python3 -c '
import json, sys
print(" ".join(str(r["ok"]).lower() for r in json.loads(sys.stdin.read().splitlines()[-1])["rounds"]))')" \
  "every steploop round's run succeeded"

out="$("$RLORCH_BIN" bench dispatch --steps 3 --rollouts-per-step 8 --json 2>&1)"
assert_eq 0 "$?" "bench dispatch exits 0" || printf '%s\n' "$out"
assert_eq "3 3 3 3" "$(printf '%s\n' "$out" | python3 -c '
import json, sys
print(" ".join(str(r["steps"]) for r in json.loads(sys.stdin.read().splitlines()[-1])["rounds"]))')" \
  "every dispatch round (async 0..3) ran its 3 steps"

finish
