#!/usr/bin/env bash
# The data directory. One daemon per data_dir: a second `rlorch serve` on a
# live daemon's data_dir exits 1 naming the holder and the lock file, before
# it touches the database (the first daemon's active run is left alone); the
# lock goes with the process that held it, however it ended.
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

finish
