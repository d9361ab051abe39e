#!/usr/bin/env bash
# The RL step loop on the host transport: a real orchestrator, trainer and two
# inference workers. After every step each inference worker must hold exactly
# the trainer's weights cast to the wire dtype (checksums), and the step records
# in SQLite, the WatchRun stream and /metrics must agree; then the same loop
# with data_channel_tls on (transport host-tls).
source "$(dirname "$0")/lib.sh"
need_cmd sqlite3 python3 node promtool

# ready_workers: how many workers are attached (ready or busy).
ready_workers() {
  "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --json list-workers | python3 -c '
import json, sys
ws = json.load(sys.stdin).get("workers", [])
print(sum(w["state"] in ("WORKER_STATE_READY", "WORKER_STATE_BUSY") for w in ws))'
}
export -f ready_workers

# steps_done RUN_ID
steps_done() {
  "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --json get-run "$1" | python3 -c '
import json, sys
print(json.load(sys.stdin)["steps_done"])'
}
export -f steps_done

# AGENT_LOG_LEVEL (default warn) sets the agents' log level, e.g. info to debug.
# On any failure, show every process's log: a failure under load is rarely
# reproducible, so its first occurrence must carry the evidence.
dump_logs_on_failure() {
  ((FAIL_COUNT > 0)) || return 0
  local f
  for f in "$TEST_TMP"/serve.*.log "$TEST_TMP"/trainer.*.log "$TEST_TMP"/inference.*.log; do
    [[ -f "$f" ]] || continue
    echo "---- $(basename "$f") (last 200 lines)"
    tail -n 200 "$f"
  done
  echo "----"
}
on_exit dump_logs_on_failure

# A small model keeps the suite quick on 2 cores (and under the sanitizers).
LAYERS=2
STEPS=3
PER_STEP=4

start_workers() { # OFFLOAD
  "$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --name trainer-0 --preset 100m \
    --layers "$LAYERS" --offload "$1" --data-listen 0.0.0.0:0 --log-level "${AGENT_LOG_LEVEL:-warn}" \
    >"$TEST_TMP/trainer.$1.log" 2>&1 &
  TRAINER_PID=$!
  track_pid "$TRAINER_PID"
  for i in 0 1; do
    "$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --name "inference-$i" \
      --log-level "${AGENT_LOG_LEVEL:-warn}" >"$TEST_TMP/inference.$i.log" 2>&1 &
    INFERENCE_PIDS[i]=$!
    track_pid $!
  done
}

# run_and_check OFFLOAD: one run of $STEPS steps, then every cross-check.
run_and_check() {
  local offload=$1 out run_id events nsteps
  out="$(ctl --json start-run --name "loop-$offload" --preset 100m --steps "$STEPS" \
    --rollouts-per-step "$PER_STEP" --max-async-level 1 --offload "$offload")"
  run_id="$(json_get id "$out")"
  assert_ne "" "$run_id" "[$offload] StartRun returns a run id"
  events="$(timeout 180 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --json watch-run "$run_id")"
  assert_eq 0 "$?" "[$offload] WatchRun ends with OK when the run ends"
  printf '%s\n' "$events" >"$TEST_TMP/events.$offload.jsonl"

  # The stream: one step event per step, every one verified against the trainer.
  nsteps="$(python3 - "$TEST_TMP/events.$offload.jsonl" "$STEPS" "$PER_STEP" "${WANT_TRANSPORT:-host-tcp}" <<'PY'
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"step":{' in l]
want, per, want_transport = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
bad = []
for i, s in enumerate(steps):
    if int(s["step"]) != i: bad.append(f"step {i} numbered {s['step']}")
    if not s["weights_verified"]: bad.append(f"step {i} not verified")
    if s["receivers"] != 2: bad.append(f"step {i}: {s['receivers']} receivers")
    if s["mode"] != "BROADCAST_MODE_HOST": bad.append(f"step {i}: mode {s['mode']}")
    if s["transport"] != want_transport: bad.append(f"step {i}: transport {s['transport']}")
    if s["rollouts_used"] != per: bad.append(f"step {i}: {s['rollouts_used']} rollouts")
    if int(s["wire_bytes"]) <= 0 or s["total_seconds"] <= 0: bad.append(f"step {i}: no figures")
    if int(s["policy_version"]) != i + 1: bad.append(f"step {i}: version {s['policy_version']}")
    if not s["mode_reason"]: bad.append(f"step {i}: no mode reason")
    # The cost model predicted the plan on the workers' reported topology:
    # one node, the host transport, every stage named, the ratio the record's.
    p = s.get("prediction")
    if not p: bad.append(f"step {i}: no prediction ({s.get('prediction_note')})"); continue
    if p["layout"] != "host" or p["nodes"] != 1: bad.append(f"step {i}: predicted {p['layout']} on {p['nodes']} nodes")
    if not p["total_seconds"] > 0 or not p["stages"] or not p["bottleneck"]: bad.append(f"step {i}: empty prediction {p}")
    if any(not st["name"] or not st["where"] or st["seconds"] < 0 for st in p["stages"]): bad.append(f"step {i}: unnamed stage {p['stages']}")
    if max(st["seconds"] for st in p["stages"]) > p["total_seconds"] * (1 + 1e-9): bad.append(f"step {i}: a stage longer than the total")
    if abs(p["measured_over_predicted"] - s["total_seconds"] / p["total_seconds"]) > 1e-6 * p["measured_over_predicted"]:
        bad.append(f"step {i}: ratio {p['measured_over_predicted']} is not measured over predicted")
print(len(steps) if not bad and len(steps) == want else "; ".join(bad) or len(steps))
PY
)"
  assert_eq "$STEPS" "$nsteps" "[$offload] $STEPS verified host-transport steps on WatchRun"

  # The run as stored.
  out="$(ctl --json get-run "$run_id")"
  assert_eq RUN_STATE_SUCCEEDED "$(json_get state "$out")" "[$offload] run succeeded"
  assert_eq "$STEPS" "$(json_get steps_done "$out")" "[$offload] steps_done"
  assert_eq "$STEPS" "$(json_get policy_version "$out")" "[$offload] policy version"

  # SQLite holds the same records as the stream, field for field.
  local db="$SERVE_DATA_DIR/rlorch.db" rows diff
  rows="$(sqlite3 "$db" "SELECT step || ' ' || hex(msg) FROM steps WHERE run_id='$run_id' ORDER BY step")"
  assert_eq "$STEPS" "$(printf '%s\n' "$rows" | grep -c .)" "[$offload] $STEPS step rows in SQLite"
  diff="$(while read -r step hex; do
      node "$RLORCH_SOURCE_DIR/tests/integration/node/decode.js" rlorch.v1.StepRecord "$hex"
    done <<<"$rows" | python3 -c '
import json, sys
stored = [json.loads(l) for l in sys.stdin]
streamed = [json.loads(l)["step"] for l in open(sys.argv[1]) if "\"step\":{" in l]
keys = ["step", "mode", "wire_bytes", "pcie_bytes", "total_seconds", "wire_seconds",
        "cast_seconds", "h2d_seconds", "exposed_staging_seconds", "rollouts_used",
        "rollouts_dropped", "train_seconds", "weights_verified", "policy_version"]
bad = ["step %s %s: %s != %s" % (a["step"], k, a[k], b[k]) for a, b in zip(stored, streamed)
       for k in keys if str(a[k]) != str(b[k])]
print("; ".join(bad) if bad or len(stored) != len(streamed) else "same")
' "$TEST_TMP/events.$offload.jsonl")"
  assert_eq same "$diff" "[$offload] SQLite records equal the WatchRun records"
}

serve_start || { finish; exit 1; }

# ---- offload params: fp32 master weights in host memory ------------------------------
start_workers params
wait_until 30 bash -c '[ "$(ready_workers)" = 3 ]'
assert_eq 0 "$?" "three workers registered and attached"
# The trainer listens on every interface; peers are told the address it came from.
addr="$(ctl --json list-workers | python3 -c '
import json, sys
print([w["data_address"] for w in json.load(sys.stdin)["workers"] if w["name"] == "trainer-0"][0])')"
assert_contains "$addr" "127.0.0.1:" "an unspecified data address is replaced by the trainer's peer address"
run_and_check params

# /metrics agrees with the stream.
assert_eq "$STEPS" "$(metric_value 'rlorch_broadcast_duration_seconds_count{mode="host"}')" \
  "broadcast histogram counted every step"
assert_eq "$STEPS" "$(metric_value 'rlorch_step_duration_seconds_count')" "step histogram"
assert_eq "$((STEPS * PER_STEP))" "$(metric_value 'rlorch_rollouts_total{outcome="used"}')" \
  "used rollouts counted"
# Dispatch asks only for what the batches within the bound use, and the agents
# tag a rollout with a version no older than the one it was asked at: nothing
# goes stale when no worker is lost.
assert_eq 0 "$(metric_value 'rlorch_rollouts_total{outcome="dropped_stale"}')" \
  "no rollout dropped as stale"
assert_eq "$STEPS" "$(metric_value 'rlorch_policy_version')" "policy version gauge"
wire_total="$(python3 -c '
import json, sys
print(sum(int(json.loads(l)["step"]["wire_bytes"]) for l in open(sys.argv[1]) if "\"step\":{" in l))' \
  "$TEST_TMP/events.params.jsonl")"
assert_eq "$wire_total" "$(metric_value 'rlorch_broadcast_bytes_total{mode="host",link="wire"}' | python3 -c 'import sys; print(int(float(sys.stdin.read())))')" \
  "wire bytes counter equals the sum of the step records"
assert_eq "$STEPS" "$(metric_value rlorch_run_steps_done)" "steps-done gauge"
assert_eq "$STEPS" "$(metric_value rlorch_run_steps_target)" "the run's target steps"
last="$(metric_value rlorch_last_step_timestamp_seconds)"
assert_eq 1 "$(python3 -c "import sys, time; print(int(abs(time.time() - float(sys.argv[1])) < 600))" "$last")" \
  "the last step's time is now-ish ($last)"
age="$(metric_value 'rlorch_worker_heartbeat_age_seconds{worker="trainer-0",role="trainer"}')"
assert_eq 1 "$(python3 -c "import sys; print(int(0 <= float(sys.argv[1]) < 5))" "$age")" \
  "the trainer's heartbeat age is under the timeout ($age s)"
assert_contains "$(http_get /metrics)" 'rlorch_step_duration_seconds_bucket{le="3600"}' \
  "step histogram buckets reach hours"
assert_eq "" "$(http_get /metrics | promtool check metrics 2>&1)" "promtool check metrics is clean"

# ---- offload none: a new trainer that keeps everything "on device" ---------------------
kill -TERM "$TRAINER_PID"
wait "$TRAINER_PID"
assert_eq 0 "$?" "the trainer exits 0 on SIGTERM"
"$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --name trainer-1 --preset 100m \
  --layers "$LAYERS" --offload none --log-level "${AGENT_LOG_LEVEL:-warn}" >"$TEST_TMP/trainer.none.log" 2>&1 &
TRAINER_PID=$!
track_pid $!
wait_until 30 bash -c '[ "$(ready_workers)" = 3 ]'
assert_eq 0 "$?" "the new trainer is attached"
run_and_check none

# ---- a receiver killed mid-run: the run goes on with the other one ---------------------
out="$(ctl --json start-run --name loss --preset 100m --steps 40 --rollouts-per-step 2)"
run_id="$(json_get id "$out")"
wait_until 60 bash -c "[ \$(steps_done $run_id) -ge 1 ]"
# This test's own worker, by pid: other tests may run workers with the same name.
kill -KILL "${INFERENCE_PIDS[1]}"
wait_until 30 bash -c "\"$RLORCH_BIN\" ctl --target $GRPC_ADDR --json list-workers | grep -q WORKER_STATE_LOST"
assert_eq 0 "$?" "the killed worker is reported lost"
before="$(steps_done "$run_id")"
wait_until 60 bash -c "[ \$(steps_done $run_id) -gt $((before + 1)) ]"
assert_eq 0 "$?" "steps continue with the remaining inference worker"
out="$(ctl --json stop-run "$run_id" --reason "test done")"
wait_until 30 bash -c "\"$RLORCH_BIN\" ctl --target $GRPC_ADDR --json get-run $run_id | grep -q RUN_STATE_STOPPED"
assert_eq 0 "$?" "StopRun stops the run"

# ---- an override the workers cannot run fails the run, naming what is missing ----------
out="$(ctl --json start-run --name override --preset 100m --steps 2 --policy direct)"
run_id="$(json_get id "$out")"
wait_until 60 bash -c "\"$RLORCH_BIN\" ctl --target $GRPC_ADDR --json get-run $run_id | grep -q RUN_STATE_FAILED"
assert_eq 0 "$?" "a direct override on host-only workers fails the run"
msg="$(json_get message "$(ctl --json get-run "$run_id")")"
assert_contains "$msg" "direct" "the failure names the override"
assert_contains "$msg" "CUDA" "the failure names the missing capability"
assert_eq 0 "$(sqlite3 "$SERVE_DATA_DIR/rlorch.db" "SELECT count(*) FROM steps WHERE run_id='$run_id'")" \
  "no step is committed by a run that cannot broadcast"

serve_stop

# ---- data_channel_tls: the same loop with every data connection under TLS 1.3 ----------
kill -TERM "$TRAINER_PID" "${INFERENCE_PIDS[0]}" 2>/dev/null
wait "$TRAINER_PID" "${INFERENCE_PIDS[0]}" 2>/dev/null
RLORCH_DATA_CHANNEL_TLS=on serve_start || { finish; exit 1; }
start_workers params
wait_until 30 bash -c '[ "$(ready_workers)" = 3 ]'
assert_eq 0 "$?" "[tls] three workers registered and attached"
WANT_TRANSPORT=host-tls run_and_check params
serve_stop
finish
