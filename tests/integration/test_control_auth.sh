#!/usr/bin/env bash
# Bearer-token authentication of `rlorch serve --token-file`: Control (and Worker)
# methods refuse a missing or wrong token with UNAUTHENTICATED, accept the right
# one; health needs none; `rlorch ctl --token-file` sends it. serve, ctl and the
# agents read the file with one reader, so white space around the token is
# trimmed alike; the agents and ctl take the address and the token file from
# RLORCH_ORCHESTRATOR and RLORCH_TOKEN_FILE too.
source "$(dirname "$0")/lib.sh"

need_cmd node || finish
TOKEN="s3cret-$RANDOM-$RANDOM"
printf '%s\n' "$TOKEN" >"$TEST_TMP/token"
printf 'not-the-token\n' >"$TEST_TMP/wrong"
# The same token with white space on both sides, as editors and `echo` leave it.
printf ' \t %s \r\n\n' "$TOKEN" >"$TEST_TMP/padded"
: >"$TEST_TMP/empty"
chmod 600 "$TEST_TMP/token"

# An unreadable or empty token file is a configuration error naming the field.
assert_exit 2 "$RLORCH_BIN" serve --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --data-dir "$TEST_TMP/d0" --token-file "$TEST_TMP/no-such-file"
assert_contains "$LAST_OUTPUT" "rlorch serve: --token-file: cannot read" "a missing token file names --token-file"
assert_exit 2 "$RLORCH_BIN" serve --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --data-dir "$TEST_TMP/d0" --token-file "$TEST_TMP/empty"
assert_contains "$LAST_OUTPUT" "is empty" "an empty token file is refused"

# The server reads the padded file: clients that send the bare token must pass.
serve_start --token-file "$TEST_TMP/padded" || finish
assert_contains "$(cat "$SERVE_LOG")" "auth=bearer" "the log says bearer auth is on"
assert_not_contains "$(cat "$SERVE_LOG")" "$TOKEN" "the token never appears in the log"

C=/rlorch.v1.Control

# ---- health needs no token ----------------------------------------------------------

out="$(grpc_call --health "")"
assert_status OK "$out" "Health/Check without a token: OK"
assert_eq SERVING "$(json_get message.status "$out")" "Health/Check without a token: SERVING"
out="$(grpc_call --health-watch rlorch.v1.Control --max-messages 1)"
assert_eq SERVING "$(json_get message.status "$out")" "Health/Watch without a token: SERVING"
assert_eq SERVING "$(ctl health)" "ctl health without --token-file works"

# ---- no token / wrong token ----------------------------------------------------------

for m in "StartRun {}" "StopRun {\"run_id\":\"run-1\"}" "GetRun {\"run_id\":\"run-1\"}" \
  "ListRuns {}" "ListWorkers {}" "WatchRun {\"run_id\":\"run-1\"}" \
  "SetBroadcastPolicy {\"run_id\":\"run-1\",\"policy\":1}" "GetTopology {}"; do
  name=${m%% *} req=${m#* }
  out="$(grpc_call --method "$C/$name" --json "$req" --deadline-ms 5000)"
  assert_status_details UNAUTHENTICATED "missing bearer token" "$out" "$name without a token: UNAUTHENTICATED"
  out="$(grpc_call --method "$C/$name" --json "$req" --token wrong --deadline-ms 5000)"
  assert_status_details UNAUTHENTICATED "invalid bearer token" "$out" "$name with a wrong token: UNAUTHENTICATED"
done
out="$(grpc_call --method /rlorch.v1.Worker/Register --json '{"role":1}' --deadline-ms 5000)"
assert_status_details UNAUTHENTICATED "missing bearer token" "$out" "Worker/Register without a token"
out="$(grpc_call --method /rlorch.v1.Worker/FetchBatch --json '{"worker_id":"w-1"}' --deadline-ms 5000)"
assert_status_details UNAUTHENTICATED "missing bearer token" "$out" "Worker/FetchBatch without a token"
out="$(grpc_call --method /rlorch.v1.Worker/FetchBatch --json '{"worker_id":"w-1"}' --token wrong --deadline-ms 5000)"
assert_status_details UNAUTHENTICATED "invalid bearer token" "$out" "Worker/FetchBatch with a wrong token"
# Near misses of the right token.
out="$(grpc_call --method $C/ListRuns --json '{}' --token "${TOKEN}x")"
assert_status UNAUTHENTICATED "$out" "a token with an extra byte: UNAUTHENTICATED"
out="$(grpc_call --method $C/ListRuns --json '{}' --token "${TOKEN:0:${#TOKEN}-1}")"
assert_status UNAUTHENTICATED "$out" "a token missing its last byte: UNAUTHENTICATED"
out="$(grpc_call --method $C/ListRuns --json '{}' --metadata "authorization=Basic $TOKEN")"
assert_status UNAUTHENTICATED "$out" "the token under another scheme: UNAUTHENTICATED"
out="$(grpc_call --method $C/ListRuns --json '{}' --metadata "authorization=$TOKEN")"
assert_status UNAUTHENTICATED "$out" "the token without a scheme: UNAUTHENTICATED"
# Auth comes before decoding: garbage without a token says nothing about the schema.
out="$(grpc_call --method $C/GetRun --raw-hex 0a40ff)"
assert_status_details UNAUTHENTICATED "missing bearer token" "$out" "an undecodable request without a token"

assert_exit 1 ctl list-runs
assert_contains "$LAST_OUTPUT" "UNAUTHENTICATED: missing bearer token" "ctl without --token-file"
assert_exit 1 ctl --token-file "$TEST_TMP/wrong" list-runs
assert_contains "$LAST_OUTPUT" "UNAUTHENTICATED: invalid bearer token" "ctl with a wrong token file"
assert_exit 2 ctl --token-file "$TEST_TMP/no-such-file" list-runs
assert_contains "$LAST_OUTPUT" "--token-file" "ctl names --token-file when it cannot read it"
assert_exit 2 ctl --token-file "$TEST_TMP/empty" list-runs
assert_contains "$LAST_OUTPUT" "is empty" "ctl refuses an empty token file"

# ---- right token ---------------------------------------------------------------------

out="$(grpc_call --method $C/ListRuns --json '{}' --token "$TOKEN")"
assert_status OK "$out" "ListRuns with the right token: OK"
assert_eq 0 "$(json_get message.runs "$out" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" \
  "no run was created by the refused StartRun calls"
out="$(ctl --token-file "$TEST_TMP/token" --json start-run --name authed)"
assert_eq 0 "$?" "ctl --token-file start-run exits 0"
RUN="$(json_get id "$out")"
assert_eq authed "$(json_get spec.name "$out")" "ctl --token-file start-run created the run"
out="$(grpc_call --method $C/GetRun --json "{\"run_id\":\"$RUN\"}" --token "$TOKEN")"
assert_eq "$RUN" "$(json_get message.id "$out")" "GetRun with the right token"
out="$(grpc_call --method $C/WatchRun --json "{\"run_id\":\"$RUN\"}" --token "$TOKEN" --max-messages 1)"
assert_eq "$RUN" "$(json_get message.run.id "$out")" "WatchRun with the right token streams"
out="$(ctl --token-file "$TEST_TMP/padded" list-runs)"
assert_eq 0 "$?" "ctl with a token file padded by white space is accepted by serve with the same file"
assert_contains "$out" "$RUN" "ctl --token-file padded lists the run"
out="$(ctl --token-file "$TEST_TMP/token" stop-run "$RUN")"
assert_contains "$out" "stopped" "ctl --token-file stop-run"
out="$(RLORCH_TARGET="$GRPC_ADDR" "$RLORCH_BIN" ctl --token-file "$TEST_TMP/token" list-runs)"
assert_contains "$out" "$RUN" "ctl reads the target from RLORCH_TARGET"

# Refused calls are counted as such.
assert_eq 8 "$(rpc_count $C/ListRuns UNAUTHENTICATED)" "ListRuns UNAUTHENTICATED counted 8 times"
assert_eq 2 "$(rpc_count $C/StartRun UNAUTHENTICATED)" "StartRun UNAUTHENTICATED counted twice"
assert_eq 200 "$(http_code GET /metrics)" "/metrics needs no token"

assert_eq SERVING "$(ctl health)" "still SERVING after the refused calls"

# ---- ctl and an agent configured by the environment only ----------------------------

out="$(RLORCH_ORCHESTRATOR="$GRPC_ADDR" RLORCH_TOKEN_FILE="$TEST_TMP/padded" "$RLORCH_BIN" ctl list-runs)"
assert_contains "$out" "$RUN" "ctl takes RLORCH_ORCHESTRATOR and RLORCH_TOKEN_FILE"
assert_exit 2 env RLORCH_TOKEN_FILE="$TEST_TMP/no-such-file" "$RLORCH_BIN" ctl --target "$GRPC_ADDR" list-runs
assert_contains "$LAST_OUTPUT" "rlorch ctl: RLORCH_TOKEN_FILE: cannot read" "ctl names the variable of a bad token file"
assert_exit 2 env RLORCH_ORCHESTRATOR="$GRPC_ADDR" RLORCH_TOKEN_FILE="$TEST_TMP/empty" "$RLORCH_BIN" inference
assert_contains "$LAST_OUTPUT" "rlorch inference: RLORCH_TOKEN_FILE:" "an agent names the variable of a bad token file"
assert_contains "$LAST_OUTPUT" "is empty" "an agent refuses an empty token file"

RLORCH_ORCHESTRATOR="$GRPC_ADDR" RLORCH_TOKEN_FILE="$TEST_TMP/padded" RLORCH_NAME=env-agent \
  RLORCH_DEVICE=-1 RLORCH_LOG_LEVEL=warn "$RLORCH_BIN" inference >"$TEST_TMP/agent.log" 2>&1 &
AGENT_PID=$!
track_pid "$AGENT_PID"
wait_until 30 bash -c "\"$RLORCH_BIN\" ctl --target $GRPC_ADDR --token-file $TEST_TMP/token list-workers | grep -q env-agent"
assert_eq 0 "$?" "an inference agent configured only by RLORCH_* registers with the token" || cat "$TEST_TMP/agent.log"
kill -TERM "$AGENT_PID"
wait "$AGENT_PID"
assert_eq 0 "$?" "the agent exits 0 on SIGTERM"
assert_not_contains "$(cat "$TEST_TMP/agent.log")" "UNAUTHENTICATED" "the agent was never refused"

serve_stop
finish
