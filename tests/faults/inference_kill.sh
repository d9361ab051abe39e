#!/usr/bin/env bash
# An inference worker is killed (SIGKILL) as a broadcast to it begins. The
# daemon must notice (its broadcast fails, or its heartbeats stop), abort the
# plan and re-plan the step without it, and the run must succeed on the
# worker that is left with every step recorded once. Detected: from the kill
# to the daemon's first word of it (the aborted plan or the lost worker).
source "$(dirname "$0")/lib.sh"

STEPS=20
serve_start || { finish; exit 1; }
start_agents 2
start_run $STEPS
VICTIM=${INF_PIDS[1]}
# Before the signal: the daemon may hear of it within a millisecond.
t_kill="$(signal_at_nth "$TEST_TMP/inference.1.log" "event=broadcast_start" 3 "$VICTIM" KILL)"
wait "$VICTIM" 2>/dev/null

recovered=yes
seen="$(log_time "$SERVE_LOG" " event=(broadcast_aborted run=$RUN |worker_lost .*name=inference-1 )" "$t_kill")"
assert_ne "" "$seen" "the daemon noticed the killed worker" || recovered=no
lost_at="$(log_time "$SERVE_LOG" " event=worker_lost .*name=inference-1 " "$t_kill")"
assert_ne "" "$lost_at" "and declared it lost" || recovered=no
wait_run_end 180
out="$(ctl --json get-run "$RUN")"
assert_eq RUN_STATE_SUCCEEDED "$(json_get state "$out")" "the run succeeds: $(json_get message "$out")" ||
  recovered=no
replan="$(grep -cE " event=plan_built run=$RUN plan=\S+-r[0-9]+ .*participants=2 " "$SERVE_LOG")"
assert_eq 1 "$((replan >= 1))" "the step was re-planned without it" || recovered=no
back="$(log_time "$SERVE_LOG" " event=step run=$RUN " "$t_kill")"
aborted="$(grep -m 1 -o " event=broadcast_aborted run=$RUN [^\"]*" "$SERVE_LOG" | sed 's/.*kind=//')"
read -r lost dup <<<"$(step_audit $STEPS)"
fault_row "inference worker kill -9 mid-broadcast" "$(elapsed "$t_kill" "$seen")" "$recovered" "$lost" "$dup" \
  "$(elapsed "$t_kill" "$back")" "plan aborted (${aborted% reason=}), lost after $(elapsed "$t_kill" "$lost_at") s; re-planned on the other worker"
