#!/usr/bin/env bash
# Bad input at the gRPC layer of `rlorch serve` (undecodable and oversized
# messages, unknown methods, deadlines), the server staying up through all of it,
# and the HTTP endpoint: /metrics (promtool-clean, rpc counters that count the
# calls made), /healthz, /readyz, 404 and 405.
source "$(dirname "$0")/lib.sh"

need_cmd node || finish
need_cmd curl || finish
# A small message limit so that an oversized request is cheap to send.
RLORCH_MAX_MESSAGE_BYTES=4KiB serve_start || finish

C=/rlorch.v1.Control

# ---- undecodable messages -----------------------------------------------------------

# 0x0a = field 1, length-delimited, then a length running past the end.
out="$(grpc_call --method $C/GetRun --raw-hex 0a40ff)"
assert_status_details INVALID_ARGUMENT "cannot decode rlorch.v1.GetRunRequest" "$out" \
  "GetRun with a truncated message: INVALID_ARGUMENT"
out="$(grpc_call --method $C/StartRun --raw-hex ffffffffffffffffffff01)"
assert_status_details INVALID_ARGUMENT "cannot decode rlorch.v1.RunSpec" "$out" \
  "StartRun with garbage bytes: INVALID_ARGUMENT"
out="$(grpc_call --method $C/WatchRun --raw-hex 0a05616263)"
assert_status_details INVALID_ARGUMENT "cannot decode rlorch.v1.WatchRunRequest" "$out" \
  "WatchRun with a truncated message: INVALID_ARGUMENT"
# Wire type 3 (start group) is not valid proto3.
out="$(grpc_call --method /rlorch.v1.Worker/Register --raw-hex 0b)"
assert_status_details INVALID_ARGUMENT "cannot decode rlorch.v1.RegisterRequest" "$out" \
  "Worker/Register with a group tag: INVALID_ARGUMENT"

# ---- unknown methods ---------------------------------------------------------------

out="$(grpc_call --method $C/DeleteEverything --raw-hex "")"
assert_status_details UNIMPLEMENTED "unknown method $C/DeleteEverything" "$out" \
  "an unknown Control method: UNIMPLEMENTED"
out="$(grpc_call --method /no.such.Service/Call --raw-hex 0a00)"
assert_status_details UNIMPLEMENTED "unknown method /no.such.Service/Call" "$out" \
  "an unknown service: UNIMPLEMENTED"

# ---- oversized messages --------------------------------------------------------------

out="$(grpc_call --method $C/GetRun --json '{}' --pad-field run_id --pad-bytes 8192)"
assert_status RESOURCE_EXHAUSTED "$out" "GetRun of 8 KiB over a 4 KiB limit: RESOURCE_EXHAUSTED"
out="$(grpc_call --method $C/StartRun --json '{}' --pad-field name --pad-bytes 100000)"
assert_status RESOURCE_EXHAUSTED "$out" "StartRun of 100 kB over a 4 KiB limit: RESOURCE_EXHAUSTED"
# Just under the limit the message arrives and is judged on its content.
out="$(grpc_call --method $C/StartRun --json '{}' --pad-field name --pad-bytes 3000)"
assert_status_details INVALID_ARGUMENT "name: longer than 128 bytes" "$out" \
  "StartRun of 3 kB under the limit reaches validation"

# ---- deadlines -------------------------------------------------------------------------

out="$(grpc_call --method $C/StartRun --json '{"name":"deadline"}')"
RUN="$(json_get message.id "$out")"
assert_ne "" "$RUN" "StartRun for the deadline checks"
t0=$SECONDS
out="$(grpc_call --method $C/WatchRun --json "{\"run_id\":\"$RUN\",\"from_step\":-1}" --deadline-ms 2000)"
assert_status DEADLINE_EXCEEDED "$out" "WatchRun with a 2 s deadline: DEADLINE_EXCEEDED"
assert_eq "$RUN" "$(json_get message.run.id "$out")" "the run arrived before the deadline"
# Generous: node itself starts slowly on a loaded machine; a stream the
# deadline did not end would run on for the whole test.
if ((SECONDS - t0 < 30)); then pass "the deadline ended the stream promptly"; else fail "WatchRun took $((SECONDS - t0)) s"; fi
out="$(grpc_call --method $C/WatchRun --json "{\"run_id\":\"$RUN\"}" --deadline-ms 1500)"
assert_status DEADLINE_EXCEEDED "$out" "a second WatchRun with a deadline: DEADLINE_EXCEEDED"
# Several streams cancelled by the client, then the server answers at once.
cancel_pids=()
for _ in 1 2 3; do
  grpc_call --method $C/WatchRun --json "{\"run_id\":\"$RUN\"}" --cancel-after-ms 1500 >/dev/null 2>&1 &
  cancel_pids+=($!)
  track_pid $!
done
wait "${cancel_pids[@]}"
out="$(grpc_call --method $C/GetRun --json "{\"run_id\":\"$RUN\"}" --deadline-ms 10000)"
assert_status OK "$out" "GetRun answers after expired and cancelled streams"
out="$(grpc_call --method $C/StopRun --json "{\"run_id\":\"$RUN\"}")"
assert_eq RUN_STATE_STOPPED "$(json_get message.state "$out")" "the run is stopped"

# ---- the server stays up through the barrage ---------------------------------------------

for hex in "" 00 0a 12 1a02 ffff 0a80808080808080808001 08ffffffffffffffffff01 2a01; do
  grpc_call --method $C/ListRuns --raw-hex "$hex" >>"$TEST_TMP/barrage.out" 2>&1
done
grep -o '"name":"[A-Z_]*"' "$TEST_TMP/barrage.out" | sort | uniq -c >"$TEST_TMP/barrage.codes"
assert_not_contains "$(cat "$TEST_TMP/barrage.out")" UNAVAILABLE "no barrage call found the server gone"
assert_not_contains "$(cat "$TEST_TMP/barrage.out")" INTERNAL "no barrage call was an INTERNAL error"
if kill -0 "$SERVE_PID" 2>/dev/null; then pass "serve is still running"; else fail "serve died"; fi
out="$(grpc_call --health "")"
assert_eq SERVING "$(json_get message.status "$out")" "health is SERVING after the barrage"
out="$(ctl --json list-runs)"
assert_eq "$RUN" "$(json_get runs.0.id "$out")" "a good call works after the barrage"

# ---- HTTP endpoint -------------------------------------------------------------------------

assert_eq 200 "$(http_code GET /healthz)" "GET /healthz: 200"
assert_eq 200 "$(http_code GET /readyz)" "GET /readyz: 200"
assert_eq 200 "$(http_code GET /metrics)" "GET /metrics: 200"
assert_eq 404 "$(http_code GET /no/such/path)" "GET of an unknown path: 404"
assert_eq 405 "$(http_code POST /metrics)" "POST /metrics: 405"
assert_eq 405 "$(http_code DELETE /healthz)" "DELETE /healthz: 405"
assert_eq ok "$(http_get /healthz)" "/healthz says ok"

METRICS="$(http_get /metrics)"
if command -v promtool >/dev/null 2>&1; then
  out="$(printf '%s\n' "$METRICS" | promtool check metrics 2>&1)"
  rc=$?
  assert_eq 0 "$rc" "promtool check metrics exits 0"
  assert_eq "" "$out" "promtool check metrics prints nothing"
else
  skip "promtool not installed"
fi
assert_contains "$METRICS" "# TYPE rlorch_rpc_requests_total counter" "rlorch_rpc_requests_total is a counter"
assert_contains "$METRICS" 'rlorch_runs{state="stopped"} 1' "rlorch_runs counts the stopped run"

# The counters count exactly the calls made above, by method and code.
assert_eq 1 "$(rpc_count $C/GetRun INVALID_ARGUMENT)" "GetRun INVALID_ARGUMENT counted once"
assert_eq 1 "$(rpc_count $C/GetRun RESOURCE_EXHAUSTED)" "GetRun RESOURCE_EXHAUSTED counted once"
assert_eq 1 "$(rpc_count $C/GetRun OK)" "GetRun OK counted once"
assert_eq 2 "$(rpc_count $C/StartRun INVALID_ARGUMENT)" "StartRun INVALID_ARGUMENT counted twice"
assert_eq 1 "$(rpc_count $C/StartRun RESOURCE_EXHAUSTED)" "StartRun RESOURCE_EXHAUSTED counted once"
assert_eq 1 "$(rpc_count $C/StartRun OK)" "StartRun OK counted once"
assert_eq 1 "$(rpc_count $C/StopRun OK)" "StopRun OK counted once"
assert_eq 2 "$(rpc_count $C/WatchRun DEADLINE_EXCEEDED)" "WatchRun DEADLINE_EXCEEDED counted twice"
assert_eq 3 "$(rpc_count $C/WatchRun CANCELLED)" "WatchRun CANCELLED counted three times"
assert_eq 1 "$(rpc_count $C/WatchRun INVALID_ARGUMENT)" "WatchRun INVALID_ARGUMENT counted once"
assert_eq 1 "$(rpc_count /rlorch.v1.Worker/Register INVALID_ARGUMENT)" "Register INVALID_ARGUMENT counted once"
assert_eq 2 "$(rpc_count unknown UNIMPLEMENTED)" "unknown methods counted under method=\"unknown\""
assert_not_contains "$METRICS" 'method="/no.such.Service' "a client-chosen method name is not a label"
assert_not_contains "$METRICS" 'DeleteEverything' "a client-chosen Control method name is not a label"
barrage_total=$(($(rpc_count $C/ListRuns OK) + $(rpc_count $C/ListRuns INVALID_ARGUMENT)))
assert_eq 10 "$barrage_total" "ListRuns counts the 9 barrage calls and the good one"
getrun_total=$(($(rpc_count $C/GetRun OK) + $(rpc_count $C/GetRun INVALID_ARGUMENT) + $(rpc_count $C/GetRun RESOURCE_EXHAUSTED)))
assert_eq "$getrun_total" "$(metric_value "rlorch_rpc_duration_seconds_count{method=\"$C/GetRun\"}")" \
  "the latency histogram counts as many GetRun calls as the counter"
serve_stop
finish
