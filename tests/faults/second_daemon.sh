#!/usr/bin/env bash
# A second `rlorch serve` on a live daemon's data directory, mid-run. It
# must exit 1 naming the holder of the data directory's lock, before it
# touches the database; the first daemon's run must go on and succeed with
# every step recorded once. Detected: how long the second daemon took to
# exit.
source "$(dirname "$0")/lib.sh"

STEPS=30
serve_start || { finish; exit 1; }
start_agents 2
start_run $STEPS
wait_commits 5 60
assert_eq 0 "$?" "the run commits its first steps"
read -r p1 p2 <<<"$(free_port 2)"
t_fault="$(now)"
second="$(timeout 30 "$RLORCH_BIN" serve --listen "127.0.0.1:$p1" --metrics-listen "127.0.0.1:$p2" \
  --data-dir "$SERVE_DATA_DIR" 2>&1)"
rc=$?
t_exit="$(now)"

recovered=yes
assert_eq 1 "$rc" "the second daemon exits 1" || recovered=no
assert_contains "$second" "event=data_dir_locked" "it says the data directory is locked" || recovered=no
assert_contains "$second" "pid $SERVE_PID" "it names the holder ($SERVE_PID)" || recovered=no
assert_contains "$second" "$SERVE_DATA_DIR/LOCK" "and its lock file" || recovered=no
assert_not_contains "$second" "event=listening" "it never served" || recovered=no
wait_run_end 180
res="$(ctl --json get-run "$RUN")"
assert_eq RUN_STATE_SUCCEEDED "$(json_get state "$res")" "the first daemon's run succeeds: $(json_get message "$res")" ||
  recovered=no
assert_eq 0 "$(json_get resumes "$res")" "and was never interrupted" || recovered=no
back="$(log_time "$SERVE_LOG" " event=step run=$RUN " "$t_fault")"
read -r lost dup <<<"$(step_audit $STEPS)"
fault_row "second daemon on a live data dir" "$(elapsed "$t_fault" "$t_exit")" "$recovered" "$lost" "$dup" \
  "$(elapsed "$t_fault" "$back")" "exit $rc, naming the holder's pid and lock file; the run went on, never resumed"
