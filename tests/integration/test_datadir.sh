#!/usr/bin/env bash
# The data directory. One daemon per data_dir: a second `rlorch serve` on a
# live daemon's data_dir exits 1 naming the holder and the lock file, before
# it touches the database (the first daemon's active run is left alone); the
# lock goes with the process that held it, however it ended. What the daemon
# creates there is private (0700 directories, 0600 files) whatever the umask,
# and a token file others can read draws a warning naming it.
source "$(dirname "$0")/lib.sh"
need_cmd python3

serve_start || { finish; exit 1; }
FIRST_PID=$SERVE_PID
DATA=$SERVE_DATA_DIR
run="$(ctl --json start-run --name held | json_get id)"
before="$(ctl --json get-run "$run")"
assert_eq RUN_STATE_PENDING "$(json_get state "$before")" "the first daemon's run is pending"
assert_contains "$(cat "$DATA/LOCK")" "pid=$FIRST_PID " "the lock file names its holder"

read -r p1 p2 <<<"$(free_port 2)"
second="$(timeout 20 "$RLORCH_BIN" serve --listen "127.0.0.1:$p1" --metrics-listen "127.0.0.1:$p2" \
  --data-dir "$DATA" 2>&1)"
rc=$?
assert_eq 1 "$rc" "a second serve on the same data_dir exits 1"
assert_contains "$second" "event=data_dir_locked" "it logs why"
assert_contains "$second" "pid $FIRST_PID" "it names the holder's pid"
assert_contains "$second" "$DATA/LOCK" "it names the lock file"
assert_not_contains "$second" "event=listening" "it never started serving"

after="$(ctl --json get-run "$run")"
assert_eq RUN_STATE_PENDING "$(json_get state "$after")" "the first daemon's run is untouched"
assert_eq "$(json_get message "$before")" "$(json_get message "$after")" "its message too"
assert_eq "$(json_get updated_unix_ms "$before")" "$(json_get updated_unix_ms "$after")" \
  "and it was not written"
assert_eq SERVING "$(json_get message.status "$(grpc_call --health "")")" "the first daemon serves on"

# kill -9 leaves no stale lock: the kernel drops it with the process.
serve_kill
serve_start --data-dir "$DATA" || { finish; exit 1; }
assert_contains "$(cat "$DATA/LOCK")" "pid=$SERVE_PID " "a new daemon takes the lock after a crash"
serve_stop

# ---- what the daemon creates is private --------------------------------------------------
mode() { stat -c %a "$1" 2>/dev/null || echo missing; }
umask 000 # what the daemon would otherwise inherit at its widest
printf 'a-token-others-can-read\n' >"$TEST_TMP/token.open"
chmod 644 "$TEST_TMP/token.open"
NEW="$TEST_TMP/fresh/data" # a data_dir the daemon itself creates
mkdir -p "$TEST_TMP/fresh"
serve_start --data-dir "$NEW" --token-file "$TEST_TMP/token.open" || { finish; exit 1; }
umask 022
assert_contains "$(cat "$SERVE_LOG")" "event=token_file_readable path=\"$TEST_TMP/token.open\" mode=0644" \
  "a token file others can read is logged by name and mode"
tctl() { "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --token-file "$TEST_TMP/token.open" "$@"; }
"$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --token-file "$TEST_TMP/token.open" --preset 100m \
  --layers 2 --log-level warn >"$TEST_TMP/trainer.log" 2>&1 &
track_pid $!
"$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --token-file "$TEST_TMP/token.open" \
  --log-level warn >"$TEST_TMP/inference.log" 2>&1 &
track_pid $!
run="$(tctl --json start-run --steps 1 --rollouts-per-step 2 | json_get id)"
timeout 120 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --token-file "$TEST_TMP/token.open" \
  watch-run "$run" >/dev/null
assert_eq RUN_STATE_SUCCEEDED "$(tctl --json get-run "$run" | json_get state)" "a run wrote its files"
assert_eq 700 "$(mode "$NEW")" "the data_dir it created is 0700"
assert_eq 600 "$(mode "$NEW/LOCK")" "LOCK is 0600"
for f in rlorch.db rlorch.db-wal rlorch.db-shm; do
  assert_eq 600 "$(mode "$NEW/$f")" "$f is 0600"
done
assert_eq 700 "$(mode "$NEW/rollouts")" "rollouts/ is 0700"
assert_eq 700 "$(mode "$NEW/rollouts/$run")" "rollouts/$run/ is 0700"
assert_eq 600 "$(mode "$NEW/rollouts/$run/step-0.jsonl")" "the rollout log is 0600"
serve_stop

# A private token file draws no warning.
cp "$TEST_TMP/token.open" "$TEST_TMP/token.private"
chmod 600 "$TEST_TMP/token.private"
serve_start --token-file "$TEST_TMP/token.private" || { finish; exit 1; }
assert_not_contains "$(cat "$SERVE_LOG")" "token_file_readable" "a 0600 token file is not logged"
serve_stop

finish
