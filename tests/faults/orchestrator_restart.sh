#!/usr/bin/env bash
# The orchestrator ends mid-run and is started again on the same data
# directory and addresses:
#
#   orchestrator_restart.sh kill   SIGKILL (a crash) as a step's plan is built
#   orchestrator_restart.sh term   SIGTERM (an upgrade, a systemctl restart)
#
# The agents stay up. The restarted daemon must resume the run from its last
# committed step (it does not fail it), the agents must come back by
# themselves, and the run must succeed with every step recorded once.
# Detected: from the signal to the restarted daemon's run_resumed.
source "$(dirname "$0")/lib.sh"

how=${1:?usage: orchestrator_restart.sh kill|term}
STEPS=16
AT=6 # the step whose plan is being built when the daemon goes

serve_start || { finish; exit 1; }
start_agents 2
start_run $STEPS
wait_log 120 "event=plan_built run=$RUN plan=$RUN/step-$AT "
assert_eq 0 "$?" "the run got to step $AT's plan"
FIRST_LOG=$SERVE_LOG
t_fault="$(now)"
case $how in
  kill) serve_kill; name="orchestrator kill -9, restart" ;;
  term) serve_stop; name="orchestrator SIGTERM, restart" ;;
  *) fail "unknown fault '$how'"; finish ;;
esac
assert_eq 3 "$(for p in "$TRAINER_PID" "${INF_PIDS[@]}"; do kill -0 "$p" 2>/dev/null && echo; done | wc -l)" \
  "the agents are still running"
serve_restart || { finish; exit 1; }

recovered=yes
resumed="$(log_time "$SERVE_LOG" " event=run_resumed run=$RUN ")"
assert_ne "" "$resumed" "the restarted daemon resumes the run" || recovered=no
wait_run_end 180
out="$(ctl --json get-run "$RUN")"
assert_eq RUN_STATE_SUCCEEDED "$(json_get state "$out")" "the run succeeds: $(json_get message "$out")" ||
  recovered=no
assert_eq 1 "$(json_get resumes "$out")" "it was resumed once" || recovered=no
assert_not_contains "$(cat "$TEST_TMP"/inference.*.log "$TEST_TMP/trainer.log")" "attach_failed code=CANCELLED" \
  "the agents re-attached by themselves" || recovered=no
back="$(log_time "$SERVE_LOG" " event=step run=$RUN ")"
before="$(grep -c " event=step run=$RUN " "$FIRST_LOG")"
# The step in progress goes out again under the resume's name (the trainer
# trained it: planned again), or, when its broadcast committed just before
# the daemon went, the workers are caught up first.
first="$(grep -m 1 -o " event=plan_built run=$RUN plan=[^ ]*" "$SERVE_LOG")"
assert_contains "$first" "plan=$RUN/step-$before-resume1" "the first plan after the restart is the resume's (${first##*=})" ||
  recovered=no
read -r lost dup <<<"$(step_audit $STEPS)"
fault_row "$name" "$(elapsed "$t_fault" "$resumed")" "$recovered" "$lost" "$dup" \
  "$(elapsed "$t_fault" "$back")" "resumed at step $before of $STEPS, first plan ${first##*/}"
