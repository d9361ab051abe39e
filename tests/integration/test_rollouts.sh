#!/usr/bin/env bash
# Rollout reports are checked whole before the scheduler sees them: a malformed
# one gets INVALID_ARGUMENT naming the field, an oversized one RESOURCE_EXHAUSTED
# naming the limit, each counted by reason in the metrics; the report is
# refused whole and the orchestrator keeps serving. rlorch's own inference
# agent sends rollouts of the real shape, which pass.
source "$(dirname "$0")/lib.sh"
need_cmd node python3

RLORCH_MAX_ROLLOUT_BYTES=300 serve_start || { finish; exit 1; }
W=/rlorch.v1.Worker

out="$(grpc_call --method $W/Register --json '{"role":"WORKER_ROLE_INFERENCE","name":"probe"}')"
assert_status OK "$out" "an inference worker registers"
id="$(json_get message.worker_id "$out")"

# report KIND_JSON: a Report of rollouts for request 1 from the probe worker.
report() {
  grpc_call --method $W/Report --json "{\"worker_id\":\"$id\",\"rollouts\":{\"request_id\":1,\"rollouts\":[$1]}}"
}
bad() { # ROLLOUT_JSON STATUS DETAILS
  local o
  o="$(report "$1")"
  assert_status_details "$2" "$3" "$o" "$2: $3"
}

ok='"id":1,"completion_token_ids":[5,6,7],"completion_logprobs":[-0.1,-0.2,-0.3],"rewards":[1]'
bad "{\"id\":1,\"completion_token_ids\":[5,6,7],\"completion_logprobs\":[-0.1,-0.2]}" \
  INVALID_ARGUMENT "rollouts[0].completion_logprobs: 2 values for 3 completion tokens"
bad "{$ok},{\"id\":2,\"completion_token_ids\":[5],\"rewards\":[1e999]}" \
  INVALID_ARGUMENT "rollouts[1].rewards[0]: inf is not a finite number"
bad "{\"id\":1,\"completion_token_ids\":[5,6],\"tokens\":3}" \
  INVALID_ARGUMENT "rollouts[0].tokens: 3 for 2 completion_token_ids"
bad "{\"id\":1,\"completion_token_ids\":[5],\"completion_logprobs\":[0.5]}" \
  INVALID_ARGUMENT "rollouts[0].completion_logprobs[0]: 0.5 is not a log-probability"
big="$(python3 -c 'print(",".join(["70000"] * 100))')"
bad "{\"id\":1,\"completion_token_ids\":[$big]}" \
  RESOURCE_EXHAUSTED "bytes is over max_rollout_bytes (300)"
# A well-formed report passes the checks; with no run there is no request 1.
o="$(report "{$ok}")"
assert_status OK "$o" "a well-formed report from a worker outside a run is answered"

assert_eq 1 "$(metric_value 'rlorch_rollouts_malformed_total{reason="logprob_count"}')" "logprob_count counted"
assert_eq 2 "$(metric_value 'rlorch_rollouts_malformed_total{reason="not_finite"}')" "not_finite counted"
assert_eq 1 "$(metric_value 'rlorch_rollouts_malformed_total{reason="token_count"}')" "token_count counted"
assert_eq 1 "$(metric_value 'rlorch_rollouts_malformed_total{reason="too_large"}')" "too_large counted"
assert_eq 0 "$(metric_value 'rlorch_rollouts_malformed_total{reason="finish_reason"}')" "finish_reason zero"
serve_stop

# rlorch's own agents: shaped rollouts within the default limit, used by a run.
serve_start || { finish; exit 1; }
"$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --preset 100m --layers 2 --log-level warn \
  >"$TEST_TMP/trainer.log" 2>&1 &
track_pid $!
"$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --log-level warn >"$TEST_TMP/inference.log" 2>&1 &
track_pid $!
out="$(ctl --json start-run --steps 2 --rollouts-per-step 4)"
run="$(json_get id "$out")"
timeout 120 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" watch-run "$run" >/dev/null
assert_eq RUN_STATE_SUCCEEDED "$(ctl --json get-run "$run" | json_get state)" "a run on shaped rollouts succeeds"
assert_eq 8 "$(metric_value 'rlorch_rollouts_total{outcome="used"}')" "its 8 rollouts were used"
assert_eq 0 "$(http_get /metrics | awk '/^rlorch_rollouts_malformed_total/ {s += $NF} END {print s + 0}')" \
  "none of the agent's rollouts was refused"
# Each step's batch is kept as JSONL under the data dir, one rollout a line.
for s in 0 1; do
  f="$SERVE_DATA_DIR/rollouts/$run/step-$s.jsonl"
  assert_eq 4 "$(python3 -c '
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
print(sum(1 for r in rs if r["completion_token_ids"] and r["rewards"]))' "$f" 2>&1)" \
    "step $s: its 4 rollouts are in $(basename "$f"), whole"
done
serve_stop

# rollout_log false: nothing is written.
RLORCH_ROLLOUT_LOG=false serve_start || { finish; exit 1; }
"$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --preset 100m --layers 2 --log-level warn \
  >"$TEST_TMP/trainer3.log" 2>&1 &
track_pid $!
"$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --log-level warn >"$TEST_TMP/inference3.log" 2>&1 &
track_pid $!
out="$(ctl --json start-run --steps 1 --rollouts-per-step 2)"
run="$(json_get id "$out")"
timeout 120 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" watch-run "$run" >/dev/null
assert_eq RUN_STATE_SUCCEEDED "$(ctl --json get-run "$run" | json_get state)" "the run succeeds"
assert_eq 0 "$(ls "$SERVE_DATA_DIR/rollouts/$run" 2>/dev/null | wc -l)" "rollout_log false writes no batch"

serve_stop

# ---- the batch reaches the trainer whole --------------------------------------------
# The trainer here is the grpc-js client: it reads its first command, the train
# step, and shows what a trainer of its own would get. A tiny buffer budget
# holds dispatch back on the way, which must cost nothing.
RLORCH_ROLLOUT_BUFFER_BYTES=1024 serve_start || { finish; exit 1; }
out="$(grpc_call --method $W/Register --json '{"role":"WORKER_ROLE_TRAINER","name":"t-js",
  "manifest":{"tensors":[{"name":"w","storage_dtype":"DTYPE_FP32","wire_dtype":"DTYPE_BF16",
  "shape":[1],"residency":"RESIDENCY_HOST_PAGEABLE"}]},"data_address":"127.0.0.1:9"}')"
assert_status OK "$out" "a trainer registers through grpc-js"
tid="$(json_get message.worker_id "$out")"
timeout 60 node "$NODE_CLIENT" --target "$GRPC_ADDR" --method $W/Attach \
  --json "{\"worker_id\":\"$tid\"}" --stream --max-messages 1 >"$TEST_TMP/train.jsonl" 2>&1 &
attach=$!
"$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --log-level warn >"$TEST_TMP/inference2.log" 2>&1 &
track_pid $!
out="$(ctl --json start-run --steps 1 --rollouts-per-step 6)"
wait "$attach"
python3 - "$TEST_TMP/train.jsonl" >"$TEST_TMP/batch.txt" <<'PY'
import json, sys
cmd = json.loads(open(sys.argv[1]).readline())["message"]
t = cmd["train"]
rs = t["rollouts"]
ok = len(rs) == len(t["rollout_ids"]) == 6
ok = ok and [r["id"] for r in rs] == t["rollout_ids"]
ok = ok and all(len(r["completion_token_ids"]) == len(r["completion_logprobs"]) > 0 for r in rs)
ok = ok and all(len(r["prompt_token_ids"]) > 0 and len(r["rewards"]) == 1 for r in rs)
ok = ok and all(r["finish_reason"] == "FINISH_REASON_STOP" and r["group_id"] != "0" for r in rs)
print("ok" if ok else "bad: " + json.dumps(t)[:400])
PY
assert_eq ok "$(cat "$TEST_TMP/batch.txt")" "the train step carries its 6 rollouts whole, in order"
assert_contains "$(cat "$SERVE_LOG")" "event=dispatch_held" "a full buffer held dispatch back"
assert_eq 0 "$(metric_value 'rlorch_rollouts_total{outcome="dropped_stale"}')" "and dropped nothing"

finish
