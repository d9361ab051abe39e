#!/usr/bin/env bash
# The layout the orchestrator chooses by its cost model, and what the step
# record says of it. Workers name their nodes and NICs (--node, --nics,
# --nic-gbits); everything runs on this machine's loopback, so only the
# choice and the records are checked here, not the timing (test_multihost
# holds the timing to the prediction on shaped links):
# - three receivers on node b, one NIC of 1 Gb/s a node, the receivers
#   listening for data: the model predicts relays (the trainer's NIC carries
#   the model once, not three times) and the plan has them: every step is
#   "host+relays", its choice names the direct fan-out's prediction beside,
#   every receiver is verified;
# - the same receivers without a data endpoint: no relay can be made, the
#   plan is the direct fan-out;
# - one receiver on each of three nodes: nothing to relay within a node;
# - a link of 1 Mb/s: the prediction, far above what the configured rate
#   allows, bounds the plan (its deadline and floor), and the plan_built log
#   line says so, so the slow link is not cut off as hung.
# Every step's record carries the prediction, its stages and the ratio.
source "$(dirname "$0")/lib.sh"
need_cmd python3

on_exit "logs_on_failure 40 'serve.*.log' 'agent-*.log'"

STEPS=2

# agent ROLE NAME ARGS...: an agent of the 100m preset cut to 2 layers.
agent() {
  local role=$1 name=$2
  shift 2
  start_agent "$role" "$name" --preset 100m --layers 2 "$@"
}

stop_agents() {
  local p
  for p in "${AGENT_PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${AGENT_PIDS[@]}"; do wait "$p" 2>/dev/null; done
  AGENT_PIDS=()
}

# run_case NAME RECEIVERS: a run of STEPS steps on the attached workers; the
# WatchRun events in TEST_TMP/NAME.jsonl.
run_case() {
  local name=$1 receivers=$2 out id
  wait_until 60 live_count_is $((receivers + 1))
  assert_eq 0 "$?" "[$name] the trainer and $receivers receivers attach" || return 1
  out="$(ctl --json start-run --name "$name" --preset 100m --steps "$STEPS" \
    --rollouts-per-step 4 --policy host)"
  id="$(json_get id "$out")"
  assert_ne "" "$id" "[$name] StartRun returns a run id" || return 1
  timeout 180 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --json watch-run "$id" >"$TEST_TMP/$name.jsonl"
  assert_eq 0 "$?" "[$name] the run ends"
}

# layouts NAME RECEIVERS: "LAYOUT|CHOICE" of every step when each is verified
# by every receiver and its prediction is whole; else what is wrong.
layouts() {
  python3 - "$TEST_TMP/$1.jsonl" "$STEPS" "$2" <<'PY'
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"step":{' in l]
want, receivers = int(sys.argv[2]), int(sys.argv[3])
bad, seen = [], set()
if len(steps) != want: bad.append(f"{len(steps)} steps")
for s in steps:
    i = s["step"]
    if not s["weights_verified"] or s["receivers"] != receivers:
        bad.append(f"step {i}: verified {s['weights_verified']}, {s['receivers']} receivers")
    p = s.get("prediction")
    if not p:
        bad.append(f"step {i}: no prediction ({s.get('prediction_note')})"); continue
    if not p["total_seconds"] > 0 or not p["stages"] or not p["bottleneck"]:
        bad.append(f"step {i}: empty prediction {p}")
    if abs(p["measured_over_predicted"] * p["total_seconds"] - s["total_seconds"]) > 1e-6 * s["total_seconds"]:
        bad.append(f"step {i}: the ratio is not measured over predicted")
    seen.add(p["layout"] + "|" + p["choice"].split(":")[0] + "|" + str(p["nodes"]))
print("; ".join(bad) if bad else " ".join(sorted(seen)))
PY
}

# ---- three receivers on one node, listening: relays --------------------------------
serve_start || finish
agent trainer t --node a --nics 1 --nic-gbits 1
for k in 1 2 3; do
  agent inference "b$k" --node b --nics 1 --nic-gbits 1 --data-listen 127.0.0.1:0
done
run_case relays 3
assert_eq "host+relays|host+relays|2" "$(layouts relays 3)" \
  "[relays] every step verified by the 3 receivers, in host+relays on 2 nodes"
choice="$(python3 -c '
import json, sys
s = [json.loads(l)["step"] for l in open(sys.argv[1]) if "\"step\":{" in l][0]
print(s["prediction"]["choice"])' "$TEST_TMP/relays.jsonl")"
assert_contains "$choice" "direct fan-out:" "[relays] the choice names the direct fan-out it beat"
python3 - "$choice" <<'PY'
import re, sys
a, b = (float(x) for x in re.findall(r"([0-9.]+) s", sys.argv[1])[:2])
sys.exit(0 if a < 0.9 * b else 1)
PY
assert_eq 0 "$?" "[relays] relays are predicted at least 10% faster: $choice"
stop_agents
serve_stop

# ---- the same receivers, none listening: the direct fan-out -----------------------
serve_start || finish
agent trainer t --node a --nics 1 --nic-gbits 1
for k in 1 2 3; do agent inference "b$k" --node b --nics 1 --nic-gbits 1; done
run_case direct 3
assert_eq "host|host|2" "$(layouts direct 3)" \
  "[direct] no receiver listens for data: the direct fan-out, every step verified"
stop_agents
serve_stop

# ---- one receiver a node: nothing to relay -----------------------------------------
serve_start || finish
agent trainer t --node a --nics 1 --nic-gbits 1
for k in 1 2 3; do
  agent inference "n$k" --node "n$k" --nics 1 --nic-gbits 1 --data-listen 127.0.0.1:0
done
run_case spread 3
assert_eq "host|host|4" "$(layouts spread 3)" "[spread] one receiver on each of 3 nodes: no relays"
stop_agents
serve_stop

# ---- a 1 Mb/s link: the prediction bounds the plan --------------------------------
serve_start || finish
agent trainer t --node a --nics 1 --nic-gbits 0.001
agent inference slow --node b --nics 1 --nic-gbits 0.001
wait_until 60 live_count_is 2
assert_eq 0 "$?" "[slow] the trainer and the receiver attach"
out="$(ctl --json start-run --name slow --preset 100m --steps 1 --rollouts-per-step 4 --policy host)"
wait_log 60 "event=plan_built"
assert_eq 0 "$?" "[slow] the plan is built"
line="$(grep 'event=plan_built' "$SERVE_LOG" | head -1)"
assert_contains "$line" "on the topology (nic at" "[slow] its bounds come from the prediction: $line"
python3 - "$line" <<'PY'
import re, sys
line = sys.argv[1]
ms = int(re.search(r"broadcast_ms=(\d+)", line).group(1))
pred = float(re.search(r"in ([0-9.e+]+) s on the topology", line).group(1))
# 2 layers of 100m in bf16 over 1 Mb/s: minutes; the bound is 4 x that + 7 s.
sys.exit(0 if pred > 60 and ms >= 4 * pred * 1000 else 1)
PY
assert_eq 0 "$?" "[slow] the broadcast bound is 4 x the prediction, far above the configured rate's"
ctl stop-run "$(json_get id "$out")" >/dev/null
stop_agents
finish
