#!/usr/bin/env bash
# The orchestration benchmarks end to end, as a smoke test (no figure is
# judged here; bench/ and docs/BENCHMARKS.md do that): each drives a real
# `rlorch serve` through whole runs and must see every run succeed; bench
# adamw checks its own shadow against the engine's cast.
source "$(dirname "$0")/lib.sh"
need_cmd python3

out="$("$RLORCH_BIN" bench steploop --steps 2 --rollouts-per-step 4 --json 2>&1)"
assert_eq 0 "$?" "bench steploop exits 0" || printf '%s\n' "$out"
assert_eq "true true true true stream" "$(printf '%s\n' "$out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read().splitlines()[-1])
print(" ".join(str(r["ok"]).lower() for r in d["rounds"]) + " " + d["reports"])')" \
  "every steploop round's run succeeded"
assert_eq "ok" "$(printf '%s\n' "$out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read().splitlines()[-1])
rtt = d["bare_rpc_rtt_us"]
bad = [r for r in d["rounds"] if rtt <= 0 or
       abs(r["x_rtt_per_worker"] - r["cpu_us_per_step"] / rtt / (r["inference_workers"] + 1)) >
       0.001 + 0.005 * r["x_rtt_per_worker"]]  # the round trip is printed to 0.1 us
print("ok" if not bad else bad)')" "steploop: CPU per worker in round trips of the same run"

out="$("$RLORCH_BIN" bench steploop --steps 2 --rollouts-per-step 4 --max-workers 8 --unary-reports --json 2>&1)"
assert_eq "unary:true true" "$(printf '%s\n' "$out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read().splitlines()[-1])
print(d["reports"] + ":" + " ".join(str(r["ok"]).lower() for r in d["rounds"]))')" \
  "steploop --unary-reports: acks and reports as Report calls, every round succeeds" ||
  printf '%s\n' "$out"

out="$("$RLORCH_BIN" bench steploop --steps 1 --rollouts-per-step 2 --max-workers 20 --json 2>/dev/null)"
assert_eq "1:true 8:true 20:true" "$(printf '%s\n' "$out" | python3 -c '
import json, sys
print(" ".join("%d:%s" % (r["inference_workers"], str(r["ok"]).lower())
               for r in json.loads(sys.stdin.read().splitlines()[-1])["rounds"]))')" \
  "steploop: the rounds below --max-workers, then --max-workers"
err="$("$RLORCH_BIN" bench steploop --max-workers 10001 2>&1 >/dev/null)"
assert_eq 2 "$?" "steploop: --max-workers over 10000 is refused"
assert_contains "$err" "--max-workers" "the refusal names the flag"

out="$("$RLORCH_BIN" bench dispatch --steps 3 --rollouts-per-step 8 --json 2>&1)"
assert_eq 0 "$?" "bench dispatch exits 0" || printf '%s\n' "$out"
assert_eq "3 3 3 3" "$(printf '%s\n' "$out" | python3 -c '
import json, sys
print(" ".join(str(r["steps"]) for r in json.loads(sys.stdin.read().splitlines()[-1])["rounds"]))')" \
  "every dispatch round (async 0..3) ran its 3 steps"

# An odd size (tails in the lanes and in the thread split) on 3 threads.
out="$("$RLORCH_BIN" bench adamw --params 100003 --threads 3 --reps 2 --json 2>&1)"
assert_eq 0 "$?" "bench adamw exits 0" || printf '%s\n' "$out"
assert_eq "true 3 ok" "$(printf '%s\n' "$out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read().splitlines()[-1])
times = [d[c][k] for c in ("wall", "cpu") for k in ("step_plain_s", "step_shadow_s", "cast_pass_s")]
print(str(d["shadow_equals_cast"]).lower(), d["threads"], "ok" if all(t > 0 for t in times) else times)')" \
  "bench adamw: the shadow equals the engine cast, three timings in both clocks"
assert_exit 2 "$RLORCH_BIN" bench adamw --params 0
assert_contains "$LAST_OUTPUT" "rlorch bench adamw: --params" "a zero --params is named"
# A preset's tensors as the trainer's spans (two decoder layers keep it small):
# the trainer counts the same parameters.
out="$("$RLORCH_BIN" bench adamw --preset 100m --layers 2 --threads 2 --reps 1 --json 2>&1)"
assert_eq 0 "$?" "bench adamw --preset exits 0" || printf '%s\n' "$out"
assert_contains "$out" '"preset":"100m","params":37162752,' "the preset's parameters, as the trainer's"
assert_contains "$out" '"shadow_equals_cast":true' "bench adamw --preset: the shadow equals the engine cast"
assert_exit 2 "$RLORCH_BIN" bench adamw --preset 100m --params 5
assert_contains "$LAST_OUTPUT" "give --params or --preset, not both" "--params and --preset together are refused"
assert_exit 2 "$RLORCH_BIN" bench adamw --layers 2
assert_contains "$LAST_OUTPUT" "rlorch bench adamw: --layers: needs --preset" "--layers alone is refused"

finish
