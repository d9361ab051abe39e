#!/usr/bin/env bash
# The embedding SDK end to end, on the host transport: a real `rlorch serve`,
# one trainer and two inference workers that are programs of their own using
# nothing but rlorch.h and librlorch.so (tests/sdk). Over a run of a few steps
# every step must be verified (the orchestrator compares the receivers'
# checksums with the trainer's), every receiver's own bf16 buffers must hold
# the trainer's fp32 weights of that version cast to bf16 (the program checks
# each element), the trainer's batches must hold the rollouts the inference
# programs made (token ids, logprobs, rewards), and all three must stop cleanly
# on SIGTERM. The workers re-register by themselves after an orchestrator
# restart; an answer held across one is not sent; an abort reaches the engine
# that holds the request. Then the bad-input paths (tests/sdk/sdk_errors.c),
# each code and message.
source "$(dirname "$0")/lib.sh"
need_cmd python3 node

BIN="$RLORCH_BUILD_DIR/tests"
for p in sdk_trainer sdk_inference sdk_errors; do
  [[ -x "$BIN/$p" ]] || { fail "$BIN/$p is not built"; finish; }
done
STEPS=3
PER_STEP=8

on_exit "logs_on_failure 60 'serve.*.log' 'sdk-*.out' 'sdk-*.err'"

serve_start || finish

"$BIN/sdk_trainer" "$GRPC_ADDR" sdk-trainer 127.0.0.1:0 \
  >"$TEST_TMP/sdk-trainer.out" 2>"$TEST_TMP/sdk-trainer.err" &
TRAINER_PID=$!
track_pid $TRAINER_PID
"$BIN/sdk_inference" "$GRPC_ADDR" sdk-inference-0 --bad-reports \
  >"$TEST_TMP/sdk-inference-0.out" 2>"$TEST_TMP/sdk-inference-0.err" &
INF0=$!
track_pid $INF0
"$BIN/sdk_inference" "$GRPC_ADDR" sdk-inference-1 --on-bind \
  >"$TEST_TMP/sdk-inference-1.out" 2>"$TEST_TMP/sdk-inference-1.err" &
INF1=$!
track_pid $INF1

wait_until 30 live_count_is 3
assert_eq 0 "$?" "the SDK trainer and both SDK inference workers attach"

# Groups of two, so every request is a group the trainer can recognise.
out="$(grpc_call --method /rlorch.v1.Control/StartRun \
  --json "{\"name\":\"sdk\",\"steps\":$STEPS,\"rollouts_per_step\":$PER_STEP,\"group_size\":2,\"max_async_level\":1}")"
assert_status OK "$out" "a run on the SDK workers starts"
run="$(json_get message.id "$out")"
events="$(timeout 180 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --json watch-run "$run")"
assert_eq 0 "$?" "WatchRun ends with OK when the run ends"
printf '%s\n' "$events" >"$TEST_TMP/events.jsonl"
assert_eq RUN_STATE_SUCCEEDED "$(ctl --json get-run "$run" | json_get state)" "the run succeeds"

verdict="$(host_steps_ok "$TEST_TMP/events.jsonl" "$STEPS" "$PER_STEP")"
assert_eq ok "$verdict" "all $STEPS steps verified: 2 receivers, host transport, $PER_STEP rollouts, versions 1..$STEPS"

# What the programs checked themselves.
tr="$(cat "$TEST_TMP/sdk-trainer.out")"
assert_eq "$STEPS" "$(grep -c '^step=[0-9]* done' <<<"$tr")" "the trainer reported $STEPS steps"
assert_eq "$STEPS" "$(grep -Ec "^batch step=[0-9]+ rollouts=$PER_STEP checked=$PER_STEP bad=0" <<<"$tr")" \
  "every batch held the $PER_STEP rollouts the inference programs made, token ids, logprobs and rewards"
assert_contains "$tr" "first=g=" "batch rollouts carry their inference worker's metadata"
for i in 0 1; do
  o="$(cat "$TEST_TMP/sdk-inference-$i.out")"
  # One broadcast a step: a receiver joins holding version 0.
  n="$(grep -Ec '^broadcast ok=1 version=[0-9]+ elements=[0-9]+ bad=0$' <<<"$o")"
  assert_eq 1 "$(( n >= STEPS ))" "inference-$i: $n broadcasts, each buffer element equal to the trainer's weights in bf16"
  assert_contains "$o" "broadcast ok=1 version=$STEPS elements=8185 bad=0" \
    "inference-$i holds version $STEPS, all 8185 elements checked"
  assert_not_contains "$o" "FAIL" "inference-$i found nothing wrong"
done
# inference-1 started with no tensors: on_bind placed every plan's.
o1="$(cat "$TEST_TMP/sdk-inference-1.out")"
assert_eq "$(grep -Ec '^broadcast ok=' <<<"$o1")" "$(grep -Ec '^bind version=[0-9]+ tensors=3$' <<<"$o1")" \
  "inference-1: on_bind placed the plan's 3 tensors before each of its broadcasts"
o0="$(cat "$TEST_TMP/sdk-inference-0.out")"
for what in "one rollout short" "a positive logprob" "a NaN reward" "no reward" "an empty completion" \
  "a version the worker does not hold" "report_step on an inference worker" "fetch_batch on an inference worker"; do
  assert_contains "$o0" "ok $what: RLORCH_E_" "bad report refused with its code and message: $what"
done
assert_not_contains "$tr" "FAIL" "the trainer found nothing wrong"
batch_from="$(grep -c 'by=' "$TEST_TMP/sdk-trainer.out")"
assert_ne 0 "$batch_from" "the trainer's batch lines name their inference worker"

# The orchestrator dies and comes back: the library reconnects and registers
# again by itself, and the same programs serve a second run.
serve_kill
serve_restart || finish
wait_until 60 live_count_is 3
assert_eq 0 "$?" "after an orchestrator restart all three SDK workers are attached again"
out="$(ctl --json start-run --name sdk-2 --steps 2 --rollouts-per-step 4)"
run2="$(json_get id "$out")"
timeout 180 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --json watch-run "$run2" >"$TEST_TMP/events2.jsonl"
assert_eq RUN_STATE_SUCCEEDED "$(ctl --json get-run "$run2" | json_get state)" "the second run succeeds"
assert_eq 2 "$(grep -c '"weights_verified":true' "$TEST_TMP/events2.jsonl")" "both of its steps are verified"
assert_eq "$((STEPS + 2))" "$(grep -c '^step=[0-9]* done' "$TEST_TMP/sdk-trainer.out")" \
  "the trainer reported $((STEPS + 2)) steps in all"

# Clean shutdown: SIGTERM, each program stops its worker, drains and exits 0.
for pid in $TRAINER_PID $INF0 $INF1; do kill -TERM "$pid"; done
for name in trainer:$TRAINER_PID inference-0:$INF0 inference-1:$INF1; do
  pid=${name#*:}
  timeout 20 tail --pid="$pid" -f /dev/null
  wait "$pid"
  assert_eq 0 "$?" "sdk ${name%%:*} exits 0 after SIGTERM"
done
assert_contains "$(cat "$TEST_TMP/sdk-trainer.out")" "stopped failures=0" "the trainer stopped cleanly"
for i in 0 1; do
  assert_contains "$(cat "$TEST_TMP/sdk-inference-$i.out")" "broadcasts_failed=0 failures=0" \
    "inference-$i stopped cleanly, no broadcast failed"
done
assert_not_contains "$(cat "$TEST_TMP"/sdk-*.err)" "level=3" "no library error was logged"
serve_stop

# ---- a request held across an orchestrator restart --------------------------------
# The orchestrator numbers requests per registration: an answer to a request
# of the previous one must not reach the new one, where its id may name
# another request. A slow engine (10 s a request) holds its requests while the
# orchestrator restarts; the library refuses to send them afterwards.
serve_start || finish
"$BIN/sdk_trainer" "$GRPC_ADDR" sdk-trainer-3 127.0.0.1:0 \
  >"$TEST_TMP/sdk-trainer-3.out" 2>"$TEST_TMP/sdk-trainer-3.err" &
T3=$!
track_pid $T3
"$BIN/sdk_inference" "$GRPC_ADDR" sdk-slow --delay-ms 10000 \
  >"$TEST_TMP/sdk-slow.out" 2>"$TEST_TMP/sdk-slow.err" &
SLOW=$!
track_pid $SLOW
ctl start-run --name sdk-3 --steps 1 --rollouts-per-step 2 >/dev/null
wait_until 30 grep -q '^held request_id=' "$TEST_TMP/sdk-slow.out"
assert_eq 0 "$?" "the slow engine holds a request"
serve_kill
serve_restart || finish
wait_until 40 grep -q "^stale request_id=" "$TEST_TMP/sdk-slow.out"
assert_eq 0 "$?" "its answer after the restart is refused by the library, not sent"
assert_contains "$(cat "$TEST_TMP/sdk-slow.out")" "the request is gone, nothing was sent" \
  "the refusal says why"
assert_eq 0 "$(http_get /metrics | awk '/^rlorch_rollouts_malformed_total/ {s += $NF} END {print s + 0}')" \
  "the new orchestrator got no stale rollout"
kill -TERM $T3 $SLOW
for pid in $T3 $SLOW; do
  timeout 20 tail --pid="$pid" -f /dev/null
  wait "$pid"
  assert_eq 0 "$?" "an SDK program exits 0 after SIGTERM (pid $pid)"
done
serve_stop

# ---- an abort reaches the engine ---------------------------------------------------
# A slow engine alone gets the run's request and holds it; a fast one joins.
# Past request_timeout_ms the orchestrator sends the request to the fast one
# too, keeps its answer and aborts the slow one's: the library hands the
# abort to the engine (RLORCH_CMD_ABORT), which then sends nothing.
serve_start || finish
"$BIN/sdk_trainer" "$GRPC_ADDR" sdk-trainer-4 127.0.0.1:0 \
  >"$TEST_TMP/sdk-trainer-4.out" 2>"$TEST_TMP/sdk-trainer-4.err" &
T4=$!
track_pid $T4
"$BIN/sdk_inference" "$GRPC_ADDR" sdk-slow-4 --delay-ms 20000 \
  >"$TEST_TMP/sdk-slow-4.out" 2>"$TEST_TMP/sdk-slow-4.err" &
SLOW4=$!
track_pid $SLOW4
out="$(grpc_call --method /rlorch.v1.Control/StartRun \
  --json '{"name":"sdk-4","steps":1,"rollouts_per_step":2,"group_size":2,"request_timeout_ms":300}')"
run4="$(json_get message.id "$out")"
wait_until 30 grep -q '^held request_id=' "$TEST_TMP/sdk-slow-4.out"
assert_eq 0 "$?" "the slow engine holds the run's request"
"$BIN/sdk_inference" "$GRPC_ADDR" sdk-fast-4 >"$TEST_TMP/sdk-fast-4.out" 2>"$TEST_TMP/sdk-fast-4.err" &
FAST4=$!
track_pid $FAST4
timeout 60 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" watch-run "$run4" >/dev/null
assert_eq RUN_STATE_SUCCEEDED "$(ctl --json get-run "$run4" | json_get state)" \
  "the run succeeds on the fast engine's answer"
wait_until 10 grep -q '^abort request_id=[0-9]* held=1' "$TEST_TMP/sdk-slow-4.out"
assert_eq 0 "$?" "the slow engine got RLORCH_CMD_ABORT for the request it held"
kill -TERM $T4 $SLOW4 $FAST4
for pid in $T4 $SLOW4 $FAST4; do
  timeout 20 tail --pid="$pid" -f /dev/null
  wait "$pid"
  assert_eq 0 "$?" "an SDK program exits 0 after SIGTERM (pid $pid)"
done
assert_contains "$(cat "$TEST_TMP/sdk-slow-4.out")" "aborted_held=1 " "the aborted request was never answered"
serve_stop

# ---- bad input: every failure a code and a message -------------------------------
printf 'sdk-test-token\n' >"$TEST_TMP/token"
serve_start --token-file "$TEST_TMP/token" || finish
dead="127.0.0.1:$(free_port)"
out="$("$BIN/sdk_errors" "$GRPC_ADDR" "$dead" "$TEST_TMP/token" 2>&1)"
rc=$?
printf '%s\n' "$out" | grep -E '^(ok|FAIL)' | sed 's/^/  sdk_errors: /'
assert_eq 0 "$rc" "sdk_errors: every bad input refused with its code and message"
assert_contains "$out" " 0 failed" "sdk_errors reports no failure"
serve_stop
finish
