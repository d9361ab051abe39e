#!/usr/bin/env bash
# `rlorch sim` from the command line: the scenarios list, a small run's
# figures, the multiroot layout's prediction equal to the topology model's
# formula for that cluster, and every bad cluster file or flag refused with
# status 2 and a message naming the field or key.
source "$(dirname "$0")/lib.sh"

assert_exit 0 "$RLORCH_BIN" sim --scenarios
for s in 8b-1node 70b-4+4 1t-256-128-bf16; do
  assert_contains "$LAST_OUTPUT" "$s" "--scenarios lists $s"
done

# 2 trainer nodes -> 2 inference nodes, 70B in bf16 (141.2 GB), replicas of 8:
# each source sends its 1/16 to 2 nodes x 8 shares / 8 over its own 50 GB/s
# NIC: 141.2e9 / 16 x 2 / 50e9 = 0.353 s; each node takes 141.2 GB over 400
# GB/s: the same 0.353 s.
assert_exit 0 "$RLORCH_BIN" sim --model 70b --storage-dtype bf16 --nodes 4 --trainer-ranks 16 \
  --inference-workers 16 --replica-gpus 8 --steps 2 --rollout-ms 200 --train-ms 100
assert_contains "$LAST_OUTPUT" "2 steps committed" "every step committed"
assert_contains "$LAST_OUTPUT" "plan       host (the scheduler's choice)" "several sources: host"
assert_contains "$LAST_OUTPUT" "multiroot (replicas of 8)     0.353 s" "the model's multiroot time"
assert_contains "$LAST_OUTPUT" "chosen: multiroot, 0.353 s" "the faster layout is chosen"
assert_contains "$LAST_OUTPUT" "bare RPC round trips" "CPU per worker against an RPC round trip"
# The round trip is measured in the run, and the ratio is the CPU over it.
base=$(sed -n 's/^baseline   bare RPC round trip .*: \([0-9.]*\) us$/\1/p' <<<"$LAST_OUTPUT")
read -r us ratio rtt < <(sed -n 's/^per worker \([0-9.]*\) us a step = \([0-9.]*\) bare RPC round trips (\([0-9.]*\) us)$/\1 \2 \3/p' <<<"$LAST_OUTPUT")
if [ -z "$base" ] || [ -z "$ratio" ]; then
  fail "baseline or per-worker line missing"
elif ! awk -v b="$base" -v r="$rtt" 'BEGIN { exit !(b > 0 && b == r) }'; then
  fail "per-worker ratio against $rtt us, baseline $base us"
elif ! awk -v u="$us" -v r="$ratio" -v b="$base" 'BEGIN { d = u / b - r; exit !(d < 0.001 && d > -0.001) }'; then
  fail "per worker $us us / $base us is not $ratio"
else
  pass "the ratio is the CPU per worker over the round trip measured in the run ($base us)"
fi
assert_contains "$LAST_OUTPUT" "an empty interval (mean), one taken off each of" "the timer's own cost taken off"
assert_contains "$LAST_OUTPUT" "peak RSS" "memory"
assert_contains "$LAST_OUTPUT" "Perplexity" "anchors printed"

# A cluster file overrides the scenario; flags override the file.
printf '{"nodes": 3, "nics_per_node": 4, "nic_gbits": 200}\n' >"$TEST_TMP/c.json"
assert_exit 0 "$RLORCH_BIN" sim --scenario 8b-1node --cluster "$TEST_TMP/c.json" --nodes 2 --steps 1
assert_contains "$LAST_OUTPUT" "2 nodes x 8 GPUs (1 used); 4 x 200 Gb/s NICs" "file, then flags"

bad() { # bad NEEDLE ARGS...: status 2 and a message holding NEEDLE
  local needle=$1
  shift
  assert_exit 2 "$RLORCH_BIN" sim "$@"
  assert_contains "$LAST_OUTPUT" "$needle" "refused: $*"
}
printf '{"nodes": 2, "nic_gbit": 1}\n' >"$TEST_TMP/unknown.json"
bad "nic_gbit: unknown key" --cluster "$TEST_TMP/unknown.json"
printf '{"nodes": 0}\n' >"$TEST_TMP/zero.json"
bad "nodes: must be an integer >= 1" --cluster "$TEST_TMP/zero.json"
printf '{"nic_gbits": "fast"}\n' >"$TEST_TMP/type.json"
bad "nic_gbits: must be a number" --cluster "$TEST_TMP/type.json"
printf '{"nic_gbits": 0}\n' >"$TEST_TMP/rate.json"
bad "nic_gbits 0 must be > 0" --cluster "$TEST_TMP/rate.json"
printf '[1]\n' >"$TEST_TMP/array.json"
bad "must be a JSON object" --cluster "$TEST_TMP/array.json"
printf '{"nodes": 2,' >"$TEST_TMP/broken.json"
bad "broken.json:" --cluster "$TEST_TMP/broken.json"
bad "--cluster: unable to open" --cluster "$TEST_TMP/missing.json"
bad "--scenario: unknown scenario 'nope'" --scenario nope
bad "--model: unknown model '9b'" --model 9b
bad "give --model or --params" --model 8b --params 1000
bad "--inference-workers" --inference-workers 0
bad "--storage-dtype" --storage-dtype fp8
bad "rollouts_per_step: 8 is not a multiple of group_size 3" --group-size 3 --rollouts-per-step 8
bad "replica_gpus: 3 does not divide the 4 inference workers" --inference-workers 4 --replica-gpus 3
bad "nodes: 1 nodes of 8 GPUs hold 8 workers" --trainer-ranks 4 --inference-workers 8

finish
