#!/usr/bin/env bash
# A run's spec drives the run or is refused by name: the configured
# max_async_level reaches a run that leaves it out (0 stays 0), and a preset or
# offload state the trainer does not hold is refused at StartRun, or keeps a
# later run waiting with the reason, instead of being accepted and ignored.
source "$(dirname "$0")/lib.sh"
need_cmd python3

RLORCH_MAX_ASYNC_LEVEL=3 serve_start || { finish; exit 1; }

# run_field RUN_ID PATH: one field of GetRun's JSON.
run_field() { ctl --json get-run "$1" | json_get "$2"; }
stop() { ctl stop-run "$1" --reason "test" >/dev/null; }

# ---- max_async_level: left out -> the configured default; 0 is a value ----------------
out="$(ctl --json start-run --name dflt)"
run="$(json_get id "$out")"
assert_eq 3 "$(json_get spec.max_async_level "$out")" \
  "a spec without max_async_level takes the configured one (3)"
stop "$run"
out="$(ctl --json start-run --name zero --max-async-level 0)"
run="$(json_get id "$out")"
assert_eq 0 "$(json_get spec.max_async_level "$out")" "--max-async-level 0 stays 0 (on-policy)"
stop "$run"

# ---- a trainer that joins later and does not fit: the run waits and says why ----------
out="$(ctl --json start-run --name later --preset 1b --steps 1)"
run="$(json_get id "$out")"
"$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --name trainer-0 --preset 100m --layers 2 \
  --offload none --log-level warn >"$TEST_TMP/trainer.log" 2>&1 &
track_pid $!
wait_until 30 bash -c "\"$RLORCH_BIN\" ctl --target $GRPC_ADDR --json get-run $run | grep -q 'asks for 1b'"
assert_eq 0 "$?" "a later trainer with another preset is not admitted"
msg="$(run_field "$run" message)"
assert_contains "$msg" "preset: the run asks for 1b, trainer trainer-0 holds 100m (start it with --preset 1b)" \
  "the run's message names the field, the trainer and the fix"
assert_eq RUN_STATE_PENDING "$(run_field "$run" state)" "the run keeps waiting"
stop "$run"

# ---- StartRun against the registered trainer: refused by name ------------------------
out="$(ctl start-run --preset 1b 2>&1)"
assert_eq 1 "$?" "start-run --preset 1b fails against a 100m trainer"
assert_contains "$out" "FAILED_PRECONDITION: preset: the run asks for 1b, trainer trainer-0 holds 100m" \
  "the refusal names the preset"
out="$(ctl start-run --preset 100m --offload params 2>&1)"
assert_eq 1 "$?" "start-run --offload params fails against a trainer that runs with none"
assert_contains "$out" "FAILED_PRECONDITION: offload: the run asks for params, trainer trainer-0 runs with none (start it with --offload params)" \
  "the refusal names the offload state"

# ---- a spec that leaves them out records what the trainer holds, and runs -------------
"$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --name inference-0 --log-level warn \
  >"$TEST_TMP/inference.log" 2>&1 &
track_pid $!
out="$(ctl --json start-run --name fits --steps 1 --rollouts-per-step 2)"
run="$(json_get id "$out")"
events="$(timeout 120 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --json watch-run "$run")"
assert_eq 0 "$?" "the run ends"
assert_eq RUN_STATE_SUCCEEDED "$(run_field "$run" state)" "the run succeeds"
assert_eq 100m "$(run_field "$run" spec.preset)" "the run records the trainer's preset"
assert_eq OFFLOAD_NONE "$(run_field "$run" spec.offload)" "the run records the trainer's offload"
assert_ne "" "$events" "WatchRun showed the run"

finish
