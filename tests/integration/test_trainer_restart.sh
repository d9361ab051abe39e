#!/usr/bin/env bash
# A trainer that restarts resumes from its own checkpoint: serve, a trainer
# with --checkpoint-dir and two inference workers run 12 steps; the trainer
# is killed with SIGKILL twice and started again on the same checkpoint
# directory. The first kill comes right after a commit (the checkpoint holds
# the committed version: the run carries on with a catch-up); the second
# during a step's broadcast (the checkpoint holds the version it trained:
# that step is planned again). The run SUCCEEDS with steps 0..11 each
# recorded once, versions continuous, every broadcast verified. Then a
# damaged checkpoint: the trainer refuses it, naming the file, and exits 1;
# a trainer of another preset refuses the checkpoint, naming both; and a
# trainer that cannot write its checkpoint exits 1 without reporting the step.
source "$(dirname "$0")/lib.sh"
need_cmd sqlite3 python3

STEPS=12
CKPT="$TEST_TMP/ckpt"
export RLORCH_HEARTBEAT_INTERVAL_MS=200 RLORCH_WORKER_TIMEOUT_MS=2000

on_exit agent_logs_on_failure

db() { sqlite3 "$SERVE_DATA_DIR/rlorch.db" "$@"; }

start_trainer() { # N [FLAGS...]: trainer.N.log
  local n=$1
  shift
  "$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --name trainer-0 --preset 100m --layers 2 \
    --checkpoint-dir "$CKPT" --log-level info "$@" >"$TEST_TMP/trainer.$n.log" 2>&1 &
  TRAINER_PID=$!
  track_pid $TRAINER_PID
}

serve_start || { finish; exit 1; }
start_trainer 0
for i in 0 1; do
  "$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --name "inference-$i" --log-level info \
    --latency-ms-mean 300 --latency-ms-std 10 >"$TEST_TMP/inference.$i.log" 2>&1 &
  track_pid $!
done
assert_eq 0 "$(wait_log 30 "event=checkpoint_none" "$TEST_TMP/trainer.0.log" && echo 0)" \
  "a trainer with an empty checkpoint directory starts from its seeded weights"
RUN="$(ctl --json start-run --name restarted --preset 100m --steps $STEPS --rollouts-per-step 4 \
  --max-async-level 0 | json_get id)"
assert_ne "" "$RUN" "the run starts"

KILL_AT=("" "event=step run=$RUN step=3 " "event=plan_built run=$RUN plan=$RUN/step-7 ")
for k in 1 2; do
  wait_log 120 "${KILL_AT[k]}"
  assert_eq 0 "$?" "kill $k: the daemon logged ${KILL_AT[k]}"
  kill -KILL "$TRAINER_PID"
  wait "$TRAINER_PID" 2>/dev/null
  saved="$(grep -o 'event=checkpoint_saved policy_version=[0-9]*' "$TEST_TMP/trainer.$((k - 1)).log" | tail -1)"
  start_trainer "$k"
  wait_log 60 "event=checkpoint_restored" "$TEST_TMP/trainer.$k.log"
  assert_eq 0 "$?" "kill $k: the new trainer restores the checkpoint"
  restored="$(grep -o 'event=checkpoint_restored dir=[^ ]* run=[^ ]* policy_version=[0-9]*' "$TEST_TMP/trainer.$k.log")"
  assert_contains "$restored" "run=$RUN policy_version=${saved##*=}" \
    "kill $k: at the version its predecessor saved last (${saved##*=})"
  wait_log 60 "event=registered .* policy_version=${saved##*=} run=$RUN" "$TEST_TMP/trainer.$k.log"
  assert_eq 0 "$?" "kill $k: and registers saying so"
done

timeout 240 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" watch-run "$RUN" >/dev/null
out="$(ctl --json get-run "$RUN")"
assert_eq RUN_STATE_SUCCEEDED "$(json_get state "$out")" "the run succeeds: $(json_get message "$out")"
assert_eq "$STEPS" "$(json_get steps_done "$out")" "all $STEPS steps done"
got="$(steps_once "$RUN" "$STEPS")"
assert_eq ok "$got" "steps 0..$((STEPS - 1)) recorded once each, versions 1..$STEPS, all verified"
assert_eq "$STEPS" "$(db "SELECT count(DISTINCT step) FROM steps WHERE run_id='$RUN'")" \
  "no step recorded twice"
assert_not_contains "$(cat "$SERVE_LOG")" "older than the committed" "no trainer was refused for its version"
kill -TERM "$TRAINER_PID"
wait "$TRAINER_PID"

# ---- checkpoints that are not this trainer's -------------------------------------------
python3 - "$CKPT/trainer.ckpt" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(4096)
    b = f.read(1)
    f.seek(4096)
    f.write(bytes([b[0] ^ 0x5A]))
PY
start_trainer bad
wait "$TRAINER_PID"
assert_eq 1 "$?" "a trainer with a damaged checkpoint exits 1"
assert_contains "$(cat "$TEST_TMP/trainer.bad.log")" "checkpoint $CKPT/trainer.ckpt: digest" \
  "naming the file and what is wrong"
assert_contains "$(cat "$TEST_TMP/trainer.bad.log")" "corrupted" "it says the file is corrupted"
"$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --name trainer-x --preset 100m --layers 1 \
  --checkpoint-dir "$CKPT" >"$TEST_TMP/trainer.other.log" 2>&1
assert_eq 1 "$?" "a trainer of another model exits 1 on the checkpoint"
assert_contains "$(cat "$TEST_TMP/trainer.other.log")" "2 layers" "naming what the checkpoint holds"

# ---- a checkpoint that cannot be written ---------------------------------------------------
# The trainer does not report a step it could not save: it exits 1 and the
# orchestrator loses it (the step is redone when a trainer attaches).
CKPT="$TEST_TMP/ckpt-lost"
start_trainer unwritable --name trainer-w
wait_log 30 "event=checkpoint_none" "$TEST_TMP/trainer.unwritable.log"
RUN2="$(ctl --json start-run --name unwritable --preset 100m --steps 4 --rollouts-per-step 4 \
  --max-async-level 0 | json_get id)"
wait_log 60 "event=checkpoint_saved policy_version=1 " "$TEST_TMP/trainer.unwritable.log"
assert_eq 0 "$?" "the trainer saves its first step"
rm -rf "$CKPT" && : >"$CKPT" # its directory is now a file
wait "$TRAINER_PID"
assert_eq 1 "$?" "a trainer that cannot write its checkpoint exits 1"
tlog="$(cat "$TEST_TMP/trainer.unwritable.log")"
assert_contains "$tlog" "event=fatal step=1 reason=\"checkpoint $CKPT/trainer.ckpt.tmp: create: Not a directory\"" \
  "naming the step and the file"
assert_not_contains "$tlog" "event=step_done step=1 " "and does not report that step"
wait_log 15 "event=worker_lost .*name=trainer-w "
assert_eq 0 "$?" "the orchestrator loses the trainer"
assert_eq 1 "$(json_get steps_done "$(ctl --json get-run "$RUN2")")" "the run holds the saved step only"
serve_stop
finish
