#!/usr/bin/env bash
# Resume after an orchestrator crash: serve, a trainer and two inference
# workers run 20 steps; the daemon is killed with SIGKILL mid-run, twice, and
# started again on the same data directory and addresses. The run resumes
# each time from its last committed step (the trainer kept its weights and
# optimizer state in its own process, the workers come back by themselves)
# and SUCCEEDS with steps 0..19 each recorded exactly once, policy versions
# continuous and every broadcast verified. The first crash comes right after
# a commit, while the trainer waits for rollouts: it holds the committed
# version, and the run first catches every inference worker up. The second
# comes during a step's broadcast: the trainer holds the next version, and
# that step's plan goes out again. Then a graceful restart (SIGTERM): the
# agents are not told to leave, the run is not stopped, and it resumes the
# same way. A restart while no run is active leaves the runs and step records
# as they were.
source "$(dirname "$0")/lib.sh"
need_cmd sqlite3 python3

STEPS=20
declare -a RESUME_LOGS RESUME_STEP
export RLORCH_HEARTBEAT_INTERVAL_MS=200 RLORCH_WORKER_TIMEOUT_MS=3000

on_exit agent_logs_on_failure 60

db() { sqlite3 "$SERVE_DATA_DIR/rlorch.db" "$@"; }

serve_start || { finish; exit 1; }
"$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --name trainer-0 --preset 100m --layers 2 \
  --log-level info >"$TEST_TMP/trainer.log" 2>&1 &
TRAINER_PID=$!
track_pid $TRAINER_PID
# Generation takes 400 ms: after a commit the trainer idles that long.
for i in 0 1; do
  "$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --name "inference-$i" --log-level info \
    --latency-ms-mean 400 --latency-ms-std 10 >"$TEST_TMP/inference.$i.log" 2>&1 &
  track_pid $!
done
RUN="$(ctl --json start-run --name resumed --preset 100m --steps $STEPS --rollouts-per-step 4 \
  --max-async-level 0 | json_get id)"
assert_ne "" "$RUN" "the run starts"

# ---- two crashes mid-run -----------------------------------------------------------------
CRASH_AT=("" "event=step run=$RUN step=5 " "event=plan_built run=$RUN plan=$RUN/step-12 ")
for crash in 1 2; do
  wait_log 120 "${CRASH_AT[crash]}"
  assert_eq 0 "$?" "crash $crash: the daemon logged ${CRASH_AT[crash]}"
  serve_kill
  before="$(db "SELECT count(*) FROM steps WHERE run_id='$RUN'")"
  serve_restart || { finish; exit 1; }
  out="$(ctl --json get-run "$RUN")"
  assert_eq "$crash" "$(json_get resumes "$out")" "crash $crash: the run was resumed, not failed"
  assert_eq 1 "$(($(json_get steps_done "$out") >= before))" \
    "crash $crash: it carries on after its $before committed steps"
  assert_contains "$(cat "$SERVE_LOG")" "event=run_resumed run=$RUN step=$before" \
    "crash $crash: the restart logs the resume"
  RESUME_LOGS[crash]=$SERVE_LOG
  RESUME_STEP[crash]=$before
done

# ---- a graceful restart (an upgrade, systemctl restart) --------------------------------
wait_log 120 "event=step run=$RUN step=16 "
assert_eq 0 "$?" "the run got to step 16"
serve_stop
agents_alive=0
for p in $(jobs -p); do kill -0 "$p" 2>/dev/null && agents_alive=$((agents_alive + 1)); done
assert_eq 3 "$agents_alive" "SIGTERM of the daemon sends no agent away"
assert_not_contains "$(cat "$TEST_TMP"/trainer.log "$TEST_TMP"/inference.*.log)" "event=shutdown" \
  "no agent was told to shut down"
assert_eq 2 "$(db "SELECT state FROM runs WHERE id='$RUN'")" \
  "the run is left RUNNING (2) in the store"
assert_contains "$(cat "$SERVE_LOG")" "event=run_paused run=$RUN" "the daemon logs the pause"
serve_restart || { finish; exit 1; }
assert_eq 3 "$(ctl --json get-run "$RUN" | json_get resumes)" "the run resumes after a graceful restart"

timeout 240 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" watch-run "$RUN" >/dev/null
out="$(ctl --json get-run "$RUN")"
assert_eq RUN_STATE_SUCCEEDED "$(json_get state "$out")" "the run succeeds: $(json_get message "$out")"
assert_eq "$STEPS" "$(json_get steps_done "$out")" "all $STEPS steps done"
assert_eq 1 "$(kill -0 $TRAINER_PID 2>/dev/null && echo 1)" \
  "the trainer process lived through the restarts (its weights are the run's)"

# Every step exactly once, versions continuous, every broadcast verified: the
# stored records, as WatchRun replays them for the finished run.
got="$(steps_once "$RUN" "$STEPS")"
assert_eq ok "$got" "steps 0..$((STEPS - 1)) recorded once each, versions 1..$STEPS, all verified"
assert_eq "$STEPS" "$(db "SELECT count(DISTINCT step) FROM steps WHERE run_id='$RUN'")" \
  "no step recorded twice"
# The first plan after each resume is named for it, so nothing sent before
# the crash is mistaken for it. After the first crash the trainer held the
# committed version: every inference worker is caught up before it makes a
# rollout. In the second it held the next one: the step it had trained is
# planned again, and no step is trained twice.
first="$(grep -m 1 -o "event=plan_built run=$RUN plan=[^ ]*" "${RESUME_LOGS[1]}")"
assert_contains "$first" "plan=$RUN/step-${RESUME_STEP[1]}-resume1-catchup" \
  "crash 1: the first plan is a catch-up ($first)"
assert_contains "$(cat "${RESUME_LOGS[1]}")" "event=caught_up run=$RUN plan=$RUN/step-${RESUME_STEP[1]}-resume1-catchup" \
  "crash 1: the workers were caught up"
first="$(grep -m 1 -o "event=plan_built run=$RUN plan=[^ ]*" "${RESUME_LOGS[2]}")"
if [[ "${RESUME_STEP[2]}" == 12 ]]; then
  assert_eq "event=plan_built run=$RUN plan=$RUN/step-12-resume2" "$first" \
    "crash 2: step 12, trained before the crash, is planned again first"
  assert_eq 1 "$(grep -c "event=step_done step=12 " "$TEST_TMP/trainer.log")" \
    "crash 2: and it was trained once"
else # its broadcast committed just before the kill: then it is a catch-up
  assert_contains "$first" "plan=$RUN/step-${RESUME_STEP[2]}-resume2-catchup" \
    "crash 2: the first plan after it is a catch-up ($first)"
fi
logs="$(cat "$TEST_TMP"/serve.*.log)"
assert_not_contains "$logs" "is newer than the published" "no worker was refused for its version"
assert_not_contains "$(cat "$TEST_TMP"/inference.*.log)" "attach_failed code=CANCELLED" \
  "the workers re-attached by themselves"

# ---- a restart while no run is active changes nothing ---------------------------------------
snapshot() { db "SELECT id, state, hex(msg) FROM runs ORDER BY seq; SELECT run_id, step, hex(msg) FROM steps ORDER BY run_id, step;"; }
before="$(snapshot)"
serve_kill
serve_restart || { finish; exit 1; }
assert_eq "$before" "$(snapshot)" "a crash and restart with no active run leaves runs and steps as they were"
assert_not_contains "$(cat "$SERVE_LOG")" "event=run_resumed" "and resumes nothing"
serve_stop

finish
