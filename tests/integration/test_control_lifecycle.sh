#!/usr/bin/env bash
# Life cycle of `rlorch serve`: bad configuration, a taken port, `rlorch version`,
# graceful shutdown with open streams (health Watch sees NOT_SERVING, WatchRun
# ends UNAVAILABLE, exit 0, the log says shutdown), and runs surviving a restart
# (a crashed daemon's pending run is marked failed on the next start).
source "$(dirname "$0")/lib.sh"

need_cmd node || finish
C=/rlorch.v1.Control

# ---- rlorch version -------------------------------------------------------------------

out="$("$RLORCH_BIN" version)"
assert_eq 0 "$?" "rlorch version exits 0"
info="$(find "$RLORCH_BUILD_DIR" -maxdepth 3 -name build_info.h -print -quit)"
if [[ -n "$info" ]]; then
  ver="$(sed -n 's/^#define RLORCH_VERSION "\(.*\)"/\1/p' "$info")"
  cuda="$(sed -n 's/^#define RLORCH_CUDA_BUILT "\(.*\)"/\1/p' "$info")"
  san="$(sed -n 's/^#define RLORCH_SANITIZE "\(.*\)"/\1/p' "$info")"
  assert_contains "$(head -n 1 <<<"$out")" "rlorch $ver (" "version prints the built version $ver"
  [[ "$cuda" == ON ]] && want=yes || want=no
  assert_contains "$out" "built in:   CUDA $want," "version says CUDA $want, as configured"
  if [[ -n "$san" ]]; then
    assert_contains "$(head -n 1 <<<"$out")" "sanitize=$san" "version names the sanitizers"
  else
    assert_not_contains "$(head -n 1 <<<"$out")" "sanitize=" "version names no sanitizer"
  fi
else
  fail "build_info.h not found under $RLORCH_BUILD_DIR"
fi
for lib in "libuv libuv" "SQLite sqlite3" "protobuf-c libprotobuf-c" "gRPC\\ core grpc"; do
  label=${lib% *} pc=${lib##* }
  label=${label//\\/}
  if v="$(pkg-config --modversion "$pc" 2>/dev/null)"; then
    assert_contains "$out" "$label $v" "version names $label $v"
  else
    skip "pkg-config does not know $pc"
  fi
done
assert_contains "$out" "transport:" "version says which transport this host offers"
assert_exit 0 "$RLORCH_BIN" --help
assert_contains "$LAST_OUTPUT" "version" "rlorch --help lists version"

# ---- bad configuration: exit 2 naming the field ----------------------------------------

serve_bad() { # WHAT NEEDLE ARGS...
  local what=$1 needle=$2
  shift 2
  if assert_exit 2 "$RLORCH_BIN" serve --data-dir "$TEST_TMP/never" "$@"; then
    assert_contains "$LAST_OUTPUT" "$needle" "$what names the field"
  fi
}
serve_bad "--listen garbage" 'rlorch serve: --listen: invalid address "garbage"' --listen garbage
serve_bad "--listen with port 70000" 'rlorch serve: --listen: invalid address' --listen 127.0.0.1:70000
serve_bad "--metrics-listen garbage" 'rlorch serve: --metrics-listen: invalid address' --metrics-listen :x:
serve_bad "--listen without a value" 'rlorch serve: --listen: missing value' --listen
serve_bad "an unknown flag" 'rlorch serve: --frobnicate: unknown flag' --frobnicate
serve_bad "--log-level loud" 'rlorch serve: --log-level: invalid value "loud"' --log-level loud
printf 'listen: 127.0.0.1:0\nlog_level: info\nbogus_key: 1\n' >"$TEST_TMP/badkey.yaml"
serve_bad "a config file with an unknown key" 'badkey.yaml:3: unknown key "bogus_key"' \
  --config "$TEST_TMP/badkey.yaml"
printf 'listen: 127.0.0.1:0\nmax_message_bytes: lots\n' >"$TEST_TMP/badval.yaml"
serve_bad "a config file with a bad value" 'badval.yaml:2: max_message_bytes: not a byte count: "lots"' \
  --config "$TEST_TMP/badval.yaml"
serve_bad "a missing config file" 'nope.yaml: cannot open' --config "$TEST_TMP/nope.yaml"
assert_exit 2 env RLORCH_MAX_ASYNC_LEVEL=abc "$RLORCH_BIN" serve --data-dir "$TEST_TMP/never"
assert_contains "$LAST_OUTPUT" 'rlorch serve: RLORCH_MAX_ASYNC_LEVEL: not an integer: "abc"' \
  "a bad environment variable is named"
assert_exit 2 env RLORCH_MAX_MESSAGE_BYTES=10 "$RLORCH_BIN" serve --data-dir "$TEST_TMP/never"
assert_contains "$LAST_OUTPUT" 'RLORCH_MAX_MESSAGE_BYTES' "a too small message limit is named"
if [[ ! -e "$TEST_TMP/never" ]]; then pass "bad configuration creates no data directory"; else fail "bad configuration created the data directory"; fi
assert_exit 0 "$RLORCH_BIN" serve --listen 127.0.0.1:1234 --print-config
assert_eq 'listen: "127.0.0.1:1234"' "$(grep '^listen:' <<<"$LAST_OUTPUT")" \
  "--print-config shows the flag's value"

# ---- the first daemon; a second one on the same port fails ------------------------------

serve_start || finish
FIRST_DATA="$SERVE_DATA_DIR"
other="$(free_port)"
assert_exit 1 "$RLORCH_BIN" serve --listen "$GRPC_ADDR" --metrics-listen "127.0.0.1:$other" \
  --data-dir "$TEST_TMP/second"
assert_contains "$LAST_OUTPUT" "grpc_listen_failed" "a taken gRPC port is reported as grpc_listen_failed"
assert_contains "$LAST_OUTPUT" "addr=$GRPC_ADDR" "the message names the taken address"
other="$(free_port)"
assert_exit 1 "$RLORCH_BIN" serve --listen "127.0.0.1:$other" --metrics-listen "$METRICS_ADDR" \
  --data-dir "$TEST_TMP/third"
assert_contains "$LAST_OUTPUT" "http_listen_failed" "a taken HTTP port is reported as http_listen_failed"
assert_contains "$LAST_OUTPUT" "addr=$METRICS_ADDR" "the message names the taken HTTP address"
assert_eq SERVING "$(ctl health)" "the first daemon still serves"

# ---- runs survive a graceful restart -----------------------------------------------------

out="$(ctl --json start-run --name kept --steps 3)"
RUN1="$(json_get id "$out")"
assert_ne "" "$RUN1" "a run before the restart"
out="$(ctl --json stop-run "$RUN1" --reason "before restart")"
assert_eq RUN_STATE_STOPPED "$(json_get state "$out")" "the run is stopped before the restart"
out="$(ctl --json start-run --name active)"
RUN2="$(json_get id "$out")"

# ---- SIGTERM with open streams -----------------------------------------------------------

HW="$TEST_TMP/health-watch.out"
W1="$TEST_TMP/watch1.out"
W2="$TEST_TMP/watch2.out"
W3="$TEST_TMP/watch3.out"
grpc_call --health-watch "" >"$HW" 2>&1 &
HW_PID=$!
grpc_call --method $C/WatchRun --json "{\"run_id\":\"$RUN2\",\"from_step\":-1}" >"$W1" 2>&1 &
W1_PID=$!
grpc_call --method $C/WatchRun --json "{\"run_id\":\"$RUN2\"}" >"$W2" 2>&1 &
W2_PID=$!
ctl watch-run "$RUN2" >"$W3" 2>&1 &
W3_PID=$!
for p in $HW_PID $W1_PID $W2_PID $W3_PID; do track_pid "$p"; done
wait_until 10 grep -q SERVING "$HW"
wait_until 10 grep -q '"seq":"1"' "$W1"
wait_until 10 grep -q '"seq":"1"' "$W2"
wait_until 10 grep -q pending "$W3"
sleep 0.3
t0=$SECONDS
serve_stop
if ((SECONDS - t0 <= 3)); then pass "serve exits within 3 s of SIGTERM"; else fail "serve took $((SECONDS - t0)) s to exit"; fi
wait "$HW_PID" "$W1_PID" "$W2_PID"
wait "$W3_PID"
W3_RC=$?
log="$(cat "$SERVE_LOG")"
assert_contains "$log" "event=shutdown reason=SIGTERM" "the log says shutdown on SIGTERM"
assert_contains "$log" "event=stopped exit_code=0" "the log says stopped with exit code 0"

hw="$(cat "$HW")"
assert_eq '{"message":{"status":"SERVING"}}' "$(sed -n 1p "$HW")" "Health/Watch first sees SERVING"
assert_eq '{"message":{"status":"NOT_SERVING"}}' "$(sed -n 2p "$HW")" "Health/Watch then sees NOT_SERVING"
assert_status_details UNAVAILABLE "server shutting down" "$hw" "Health/Watch ends UNAVAILABLE"
for f in "$W1" "$W2"; do
  w="$(cat "$f")"
  assert_contains "$w" 'the orchestrator shut down at step 0: the run resumes when it starts again' \
    "WatchRun ($(basename "$f")) was told the run pauses with the daemon"
  assert_not_contains "$w" '"state":"RUN_STATE_STOPPED"' "WatchRun ($(basename "$f")): the run was not stopped"
  assert_status_details UNAVAILABLE "server shutting down" "$w" "WatchRun ($(basename "$f")) ends UNAVAILABLE on SIGTERM"
done
assert_contains "$(cat "$W3")" "UNAVAILABLE" "ctl watch-run reports UNAVAILABLE on SIGTERM"
assert_eq 1 "$W3_RC" "ctl watch-run exits 1 when the daemon goes away"

# ---- restart on the same data directory ----------------------------------------------------

serve_start --data-dir "$FIRST_DATA" || finish
out="$(ctl --json get-run "$RUN1")"
assert_eq RUN_STATE_STOPPED "$(json_get state "$out")" "the stopped run is still there after a restart"
assert_eq "stop requested: before restart" "$(json_get message "$out")" "its stop reason survived"
assert_eq kept "$(json_get spec.name "$out")" "its spec survived"
# SIGTERM does not end the active run: the next daemon resumes it.
out="$(ctl --json get-run "$RUN2")"
assert_eq RUN_STATE_PENDING "$(json_get state "$out")" "the run active at SIGTERM is resumed"
assert_eq 1 "$(json_get resumes "$out")" "as its first resume"
assert_contains "$(json_get message "$out")" "resumed at step 0 after an orchestrator restart" \
  "and says so"
out="$(ctl --json stop-run "$RUN2" --reason "after the restart")"
wait_until 10 bash -c "\"$RLORCH_BIN\" ctl --target $GRPC_ADDR --json get-run $RUN2 | grep -q RUN_STATE_STOPPED"
assert_eq 0 "$?" "the resumed run stops when asked"

# A crash (SIGKILL) leaves a pending run behind; the next start resumes it
# (tests/integration/test_resume.sh runs one through a crash).
out="$(ctl --json start-run --name crashed)"
RUN3="$(json_get id "$out")"
assert_ne "$RUN2" "$RUN3" "a new run gets a new id after the restart"
assert_eq RUN_STATE_PENDING "$(ctl --json get-run "$RUN3" | json_get state)" "the new run is pending"
serve_kill
serve_start --data-dir "$FIRST_DATA" || finish
out="$(ctl --json get-run "$RUN3")"
assert_eq RUN_STATE_PENDING "$(json_get state "$out")" "a pending run left by a crash is resumed"
assert_contains "$(json_get message "$out")" "resumed at step 0 after an orchestrator restart" \
  "and says it was resumed"
assert_eq 1 "$(json_get resumes "$out")" "its resumes are counted"
assert_contains "$(cat "$SERVE_LOG")" "event=run_resumed run=$RUN3" "the restart logs the resumed run"
ctl stop-run "$RUN3" --reason "not needed" >/dev/null
wait_until 10 bash -c "\"$RLORCH_BIN\" ctl --target $GRPC_ADDR --json get-run $RUN3 | grep -q RUN_STATE_STOPPED"
assert_eq 0 "$?" "the resumed run stops like any other"
out="$(ctl --json list-runs)"
assert_eq "$RUN3 $RUN2 $RUN1" "$(python3 -c 'import json,sys; print(" ".join(r["id"] for r in json.load(sys.stdin)["runs"]))' <<<"$out")" \
  "all three runs are listed after the restarts"
out="$(ctl --json start-run --name after)"
assert_eq RUN_STATE_PENDING "$(json_get state "$out")" "a new run can start after the resumed one"
assert_eq 200 "$(http_code GET /readyz)" "/readyz is 200 after the restart"
serve_stop
finish
