#!/usr/bin/env bash
# The Control API of `rlorch serve`, driven with `rlorch ctl` and with the grpc-js
# client: every method with good input and with each error it documents.
source "$(dirname "$0")/lib.sh"

need_cmd node || finish
serve_start --log-level info || finish

C=/rlorch.v1.Control

# ---- health ------------------------------------------------------------------------

out="$(ctl health)"
assert_eq SERVING "$out" "ctl health prints SERVING"
out="$(ctl health rlorch.v1.Control)"
assert_eq SERVING "$out" "ctl health rlorch.v1.Control prints SERVING"
out="$(grpc_call --health rlorch.v1.Worker)"
assert_eq SERVING "$(json_get message.status "$out")" "grpc-js Health/Check rlorch.v1.Worker"
assert_status OK "$out"
out="$(grpc_call --health no.such.Service)"
assert_status_details NOT_FOUND "unknown service 'no.such.Service'" "$out" \
  "Health/Check of an unknown service: NOT_FOUND"
out="$(grpc_call --health-watch "" --max-messages 1)"
assert_eq SERVING "$(json_get message.status "$out")" "Health/Watch first sends SERVING"

# ---- empty store -------------------------------------------------------------------

out="$(grpc_call --method $C/ListRuns --json '{}')"
assert_status OK "$out" "ListRuns on an empty store"
assert_eq '[]' "$(json_get message.runs "$out")" "ListRuns on an empty store has no runs"
out="$(grpc_call --method $C/ListWorkers --json '{}')"
assert_status OK "$out" "ListWorkers without workers"
assert_eq '[]' "$(json_get message.workers "$out")" "ListWorkers without workers is empty"

# ---- StartRun: bad specs -> INVALID_ARGUMENT naming the field -----------------------

bad_spec() { # JSON FIELD-MESSAGE
  local o
  o="$(grpc_call --method $C/StartRun --json "$1")"
  assert_status_details INVALID_ARGUMENT "$2" "$o" "StartRun $1: INVALID_ARGUMENT \"$2\""
}
bad_spec '{"preset":"3t"}' "preset: unknown preset '3t'"
bad_spec '{"steps":4000000000}' "steps: 4000000000 is over the limit"
bad_spec '{"max_async_level":65}' "max_async_level: 65 is over the limit of 64"
bad_spec '{"rollouts_per_step":70000}' "rollouts_per_step: 70000 is over the limit"
bad_spec '{"max_requests_per_worker":1025}' "max_requests_per_worker: 1025 is over the limit of 1024"
bad_spec '{"policy":99}' "policy: unknown value 99"
bad_spec '{"offload":42}' "offload: unknown value 42"
bad_spec '{"staging_budget_bytes":"1000"}' "staging_budget_bytes: 1000 is below the minimum"
bad_spec '{"staging_budget_bytes":"18446744073709551615"}' \
  "staging_budget_bytes: 18446744073709551615 is over the limit of 1099511627776 (1 TiB)"
bad_spec '{"staging_budget_bytes":"1099511627777"}' "staging_budget_bytes: 1099511627777 is over the limit"
bad_spec '{"request_timeout_ms":4294967295}' "request_timeout_ms: 4294967295 is over the limit of 86400000 (a day)"
bad_spec '{"steps":4294967295}' "steps: 4294967295 is over the limit of 10000000"
bad_spec '{"max_async_level":4294967295}' "max_async_level: 4294967295 is over the limit of 64"
bad_spec '{"group_size":4294967295}' "group_size: 4294967295 is over the limit of 4096"
bad_spec '{"sampling":{"max_tokens":4294967295}}' "sampling.max_tokens: 4294967295 is over the limit"
bad_spec '{"sampling":{"stop_token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63,64,65]}}' \
  "sampling.stop_token_ids: 65 ids, more than 64"
bad_spec '{"prompts":{"synthetic":{"prompt_tokens":4294967295}}}' "prompts.synthetic.prompt_tokens: 4294967295 is more than max_prompt_tokens"
bad_spec "{\"name\":\"$(printf 'n%.0s' {1..129})\"}" "name: longer than 128 bytes"

assert_exit 1 ctl start-run --preset 3t
assert_contains "$LAST_OUTPUT" "INVALID_ARGUMENT: preset: unknown preset '3t'" \
  "ctl start-run --preset 3t names the field"
assert_exit 2 ctl start-run --policy sideways
assert_contains "$LAST_OUTPUT" "policy" "ctl rejects an unknown --policy name locally"

out="$(ctl --json list-runs)"
assert_eq 0 "$(python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("runs", [])))' <<<"$out")" \
  "no run was created by the rejected specs"

# ---- StartRun, GetRun, ListRuns --------------------------------------------------------

out="$(ctl --json start-run --name first --steps 5 --preset 100m --max-async-level 2)"
assert_eq 0 "$?" "ctl --json start-run exits 0"
RUN1="$(json_get id "$out")"
assert_ne "" "$RUN1" "StartRun returns a run id"
assert_eq first "$(json_get spec.name "$out")" "StartRun echoes the name"
assert_eq 5 "$(json_get spec.steps "$out")" "StartRun echoes the steps"
assert_eq 2 "$(json_get spec.max_async_level "$out")" "StartRun keeps max_async_level"
assert_eq RUN_STATE_PENDING "$(json_get state "$out")" "a new run without workers is PENDING"
assert_eq 8 "$(json_get spec.rollouts_per_step "$out")" "rollouts_per_step defaults to 8"
assert_eq 8 "$(json_get spec.max_requests_per_worker "$out")" "max_requests_per_worker defaults to 8"
assert_eq 268435456 "$(json_get spec.staging_budget_bytes "$out")" "staging budget defaults to 256 MiB"
assert_eq OFFLOAD_UNSPECIFIED "$(json_get spec.offload "$out")" "offload is left to the trainer"
assert_eq BROADCAST_MODE_AUTO "$(json_get policy "$out")" "policy defaults to AUTO"

out="$(grpc_call --method $C/StartRun --json '{"name":"second"}')"
assert_status_details FAILED_PRECONDITION "run '$RUN1' is active (RUN_STATE_PENDING); stop it first" \
  "$out" "a second StartRun while one is active: FAILED_PRECONDITION"

out="$(grpc_call --method $C/GetRun --json "{\"run_id\":\"$RUN1\"}")"
assert_status OK "$out" "GetRun of the new run"
assert_eq "$RUN1" "$(json_get message.id "$out")" "GetRun returns the asked run"
assert_eq "waiting for 1 trainer and at least 1 inference worker" "$(json_get message.message "$out")" \
  "a pending run says what it waits for"

out="$(grpc_call --method $C/GetRun --json '{"run_id":"run-nope"}')"
assert_status_details NOT_FOUND "run 'run-nope' not found" "$out" "GetRun of an unknown run: NOT_FOUND"
out="$(grpc_call --method $C/GetRun --json '{}')"
assert_status_details INVALID_ARGUMENT "run_id: required" "$out" "GetRun without run_id"
out="$(grpc_call --method $C/GetRun --json "{\"run_id\":\"$(printf 'x%.0s' {1..70})\"}")"
assert_status_details INVALID_ARGUMENT "run_id: longer than 63 bytes" "$out" "GetRun with a 70-byte id"
assert_exit 1 ctl get-run run-nope
assert_contains "$LAST_OUTPUT" "NOT_FOUND: run 'run-nope' not found" "ctl get-run of an unknown run"

out="$(grpc_call --method $C/ListRuns --json '{"state":"RUN_STATE_PENDING"}')"
assert_eq "$RUN1" "$(json_get message.runs.0.id "$out")" "ListRuns state=PENDING finds the run"
out="$(grpc_call --method $C/ListRuns --json '{"state":"RUN_STATE_FAILED"}')"
assert_eq '[]' "$(json_get message.runs "$out")" "ListRuns state=FAILED is empty"
out="$(grpc_call --method $C/ListRuns --json '{"state":77}')"
assert_status_details INVALID_ARGUMENT "state: unknown value 77" "$out" "ListRuns with an unknown state"
out="$(grpc_call --method $C/ListRuns --json '{"limit":10001}')"
assert_status_details INVALID_ARGUMENT "limit: 10001 is over the limit of 10000" "$out" \
  "ListRuns with an absurd limit"

# ---- SetBroadcastPolicy ----------------------------------------------------------------

out="$(grpc_call --method $C/SetBroadcastPolicy --json "{\"run_id\":\"$RUN1\",\"policy\":\"BROADCAST_MODE_STAGED\"}")"
assert_status OK "$out" "SetBroadcastPolicy STAGED on the pending run"
assert_eq BROADCAST_MODE_STAGED "$(json_get message.policy "$out")" "the run's policy is now STAGED"
out="$(grpc_call --method $C/SetBroadcastPolicy --json "{\"run_id\":\"$RUN1\",\"policy\":0}")"
assert_status_details INVALID_ARGUMENT "policy: want auto, direct, staged, host or colocated (got 0)" "$out" \
  "SetBroadcastPolicy UNSPECIFIED"
out="$(grpc_call --method $C/SetBroadcastPolicy --json "{\"run_id\":\"$RUN1\",\"policy\":31}")"
assert_status_details INVALID_ARGUMENT "(got 31)" "$out" "SetBroadcastPolicy with an unknown enum number"
out="$(grpc_call --method $C/SetBroadcastPolicy --json "{\"run_id\":\"$RUN1\",\"policy\":2147483647}")"
assert_status_details INVALID_ARGUMENT "policy: want auto, direct, staged, host or colocated (got 2147483647)" "$out" \
  "SetBroadcastPolicy with the largest enum number"
out="$(grpc_call --method $C/SetBroadcastPolicy --json "{\"run_id\":\"$RUN1\",\"policy\":-1}")"
assert_status_details INVALID_ARGUMENT "(got -1)" "$out" "SetBroadcastPolicy with a negative enum number"
out="$(grpc_call --method $C/SetBroadcastPolicy --json '{"run_id":"run-nope","policy":"BROADCAST_MODE_HOST"}')"
assert_status_details NOT_FOUND "run 'run-nope' not found" "$out" "SetBroadcastPolicy of an unknown run"
out="$(ctl set-policy "$RUN1" host)"
assert_eq 0 "$?" "ctl set-policy host exits 0"
assert_contains "$out" "host" "ctl set-policy prints the run with policy host"
out="$(ctl --json get-run "$RUN1")"
assert_eq BROADCAST_MODE_HOST "$(json_get policy "$out")" "GetRun shows the policy set by ctl"

# ---- ListWorkers -------------------------------------------------------------------------

out="$(grpc_call --method $C/ListWorkers --json "{\"run_id\":\"$RUN1\"}")"
assert_status OK "$out" "ListWorkers of the run"
out="$(grpc_call --method $C/ListWorkers --json '{"run_id":"run-nope"}')"
assert_status_details NOT_FOUND "run 'run-nope' not found" "$out" "ListWorkers of an unknown run"
out="$(ctl list-workers)"
assert_contains "$(head -n 1 <<<"$out")" "ROLE" "ctl list-workers prints a table header"

# ---- WatchRun on a live run ---------------------------------------------------------------

out="$(grpc_call --method $C/WatchRun --json "{\"run_id\":\"$RUN1\",\"from_step\":-1}" --max-messages 1)"
assert_eq "$RUN1" "$(json_get message.run.id "$out")" "WatchRun first sends the run"
assert_eq 1 "$(json_get message.seq "$out")" "WatchRun's first event has seq 1"
assert_eq RUN_STATE_PENDING "$(json_get message.run.state "$out")" "WatchRun shows the run PENDING"
out="$(grpc_call --method $C/WatchRun --json '{"run_id":"run-nope"}')"
assert_status_details NOT_FOUND "run 'run-nope' not found" "$out" "WatchRun of an unknown run"

# A watcher open while the run is stopped sees STOPPING/STOPPED and then OK "run ended".
WATCH_OUT="$TEST_TMP/watch.out"
grpc_call --method $C/WatchRun --json "{\"run_id\":\"$RUN1\",\"from_step\":-1}" >"$WATCH_OUT" 2>&1 &
WATCH_PID=$!
track_pid "$WATCH_PID"
wait_until 10 grep -q '"seq":"1"' "$WATCH_OUT"

# ---- StopRun --------------------------------------------------------------------------------

out="$(ctl --json stop-run "$RUN1" --reason "operator test")"
assert_eq 0 "$?" "ctl stop-run exits 0"
assert_eq RUN_STATE_STOPPED "$(json_get state "$out")" "StopRun of a pending run ends it STOPPED"
assert_contains "$(json_get message "$out")" "operator test" "StopRun records the reason"
wait "$WATCH_PID"
watch="$(cat "$WATCH_OUT")"
assert_status_details OK "run ended" "$watch" "an open WatchRun ends OK when the run ends"
assert_contains "$watch" '"state":"RUN_STATE_STOPPED"' "the open WatchRun saw the run STOPPED"

out="$(grpc_call --method $C/StopRun --json "{\"run_id\":\"$RUN1\"}")"
assert_status_details FAILED_PRECONDITION "run '$RUN1' already ended (RUN_STATE_STOPPED)" "$out" \
  "StopRun of an ended run: FAILED_PRECONDITION"
out="$(grpc_call --method $C/StopRun --json '{"run_id":"run-nope"}')"
assert_status_details NOT_FOUND "run 'run-nope' not found" "$out" "StopRun of an unknown run"
out="$(grpc_call --method $C/SetBroadcastPolicy --json "{\"run_id\":\"$RUN1\",\"policy\":\"BROADCAST_MODE_DIRECT\"}")"
assert_status_details FAILED_PRECONDITION "run '$RUN1' already ended" "$out" \
  "SetBroadcastPolicy of an ended run: FAILED_PRECONDITION"

out="$(grpc_call --method $C/WatchRun --json "{\"run_id\":\"$RUN1\",\"from_step\":-1}")"
assert_status_details OK "run ended" "$out" "WatchRun of an ended run sends it and ends OK"
assert_eq RUN_STATE_STOPPED "$(json_get message.run.state "$out")" "WatchRun of an ended run shows STOPPED"
out="$(ctl watch-run "$RUN1")"
assert_contains "$out" "stopped" "ctl watch-run of an ended run prints its state"

# ---- a second run once the first ended; listing order and tables --------------------------

out="$(grpc_call --method $C/StartRun --json '{"name":"second","preset":"1b","policy":"BROADCAST_MODE_DIRECT","offload":"OFFLOAD_NONE"}')"
assert_status OK "$out" "StartRun after the first run ended"
RUN2="$(json_get message.id "$out")"
assert_ne "$RUN1" "$RUN2" "the second run has its own id"
assert_eq OFFLOAD_NONE "$(json_get message.spec.offload "$out")" "StartRun keeps offload NONE"
out="$(ctl --json list-runs)"
assert_eq "$RUN2 $RUN1" "$(python3 -c 'import json,sys; print(" ".join(r["id"] for r in json.load(sys.stdin)["runs"]))' <<<"$out")" \
  "ctl --json list-runs parses and lists newest first"
out="$(ctl --json list-runs --limit 1)"
assert_eq 1 "$(python3 -c 'import json,sys; print(len(json.load(sys.stdin)["runs"]))' <<<"$out")" \
  "list-runs --limit 1 returns one run"
out="$(ctl --json list-runs --state RUN_STATE_STOPPED)"
assert_eq "$RUN1" "$(json_get runs.0.id "$out")" "list-runs --state filters"
out="$(ctl list-runs)"
assert_eq 3 "$(wc -l <<<"$out")" "ctl list-runs prints a header and one line per run"
assert_contains "$(head -n 1 <<<"$out")" "STATE" "the table has a STATE column"
assert_contains "$(grep "^$RUN1 " <<<"$out")" "stopped" "the table shows the first run stopped"
assert_contains "$(grep "^$RUN2 " <<<"$out")" "pending" "the table shows the second run pending"
for cmd in "get-run $RUN2" "list-workers" "list-runs"; do
  # shellcheck disable=SC2086
  out="$(ctl --json $cmd)"
  if python3 -c 'import json,sys; json.load(sys.stdin)' <<<"$out" 2>/dev/null; then
    pass "ctl --json $cmd prints valid JSON"
  else
    fail "ctl --json $cmd prints valid JSON: $out"
  fi
done

# ---- the daemon is still healthy --------------------------------------------------------

assert_eq SERVING "$(ctl health)" "still SERVING after all of the above"
serve_stop
finish
