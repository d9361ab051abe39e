#!/usr/bin/env bash
# `rlorch run`, the main job: orchestrator + trainer + inference workers as
# children, one line per step, a summary, a clean stop (also on Ctrl-C).
source "$(dirname "$0")/lib.sh"

# ---- a short run ends with a summary and exit 0 ---------------------------------
# The step count comes from the environment. The other variables belong to the
# children's commands (serve would refuse the token file, the agents the device):
# run hands its children flags and an environment without RLORCH_*, so they
# change nothing.
out="$(RLORCH_STEPS=2 RLORCH_TOKEN_FILE="$TEST_TMP/no-such-token" RLORCH_DEVICE=not-a-device \
  RLORCH_MAX_MESSAGE_BYTES=1 "$RLORCH_BIN" run --inference-workers 1 --layers 2 \
  --data-dir "$TEST_TMP/run1" --log-level warn 2>&1)"
assert_eq 0 "$?" "rlorch run exits 0 after a successful run" || printf '%s\n' "$out"
assert_contains "$out" "HOST TCP ONLY" "says loudly that the host transport is used"
assert_contains "$out" "metrics:    http://127.0.0.1:" "prints where /metrics is served"
assert_eq 2 "$(printf '%s\n' "$out" | grep -cE '^ +[0-9]+ +[0-9]+ +[0-9]+ .* host ')" \
  "one line per step"
assert_contains "$out" "summary: run run-1 succeeded" "summary names the run and its end"
assert_contains "$out" "receivers verified           2 of 2 steps" "every step verified"
assert_contains "$out" "16 used, 0 dropped as stale" "only what the batches use is generated"
assert_eq 0 "$(pgrep -f -- "$TEST_TMP/run1" | wc -l)" "no child process is left behind"
assert_eq 1 "$(ls "$TEST_TMP/run1/logs" | grep -c '^serve.log$')" "child logs are kept"

# ---- Ctrl-C stops every process cleanly -------------------------------------------
"$RLORCH_BIN" run --steps 100000 --inference-workers 2 --layers 2 \
  --data-dir "$TEST_TMP/run2" --log-level warn >"$TEST_TMP/run2.out" 2>&1 &
pid=$!
track_pid "$pid"
wait_until 60 grep -qE '^ +1 +[0-9]+ ' "$TEST_TMP/run2.out"
assert_eq 0 "$?" "the long run makes progress"
kill -INT "$pid"
t0=$SECONDS
wait "$pid"
rc=$?
assert_eq 130 "$rc" "Ctrl-C ends rlorch run with status 130"
assert_eq 1 "$((SECONDS - t0 < 20))" "it stops within 20 s"
assert_contains "$(cat "$TEST_TMP/run2.out")" "stopped" "the run is reported stopped"
assert_eq 0 "$(pgrep -f -- "$TEST_TMP/run2" | wc -l)" "no child process is left behind"
for f in "$TEST_TMP"/run2/logs/*.log; do
  name="$(basename "$f" .log)"
  assert_not_contains "$(cat "$f")" "level=error" "$name logged no error"
done

# ---- params+optimizer: the bf16 shadow sends the same weights -----------------------
# With the optimizer on the CPU the trainer sends the bf16 shadow its AdamW
# step writes; with --bf16-shadow off it casts the fp32 master instead. Same
# seed, same steps: the receivers verify every step either way, and the
# trainer's checksums (XXH3 of the wire bytes) are the same step by step.
for shadow in on off; do
  out="$("$RLORCH_BIN" run --offload params+optimizer --bf16-shadow "$shadow" --steps 3 \
    --inference-workers 2 --layers 2 --data-dir "$TEST_TMP/shadow-$shadow" --log-level info 2>&1)"
  assert_eq 0 "$?" "params+optimizer with the shadow $shadow: exits 0" || printf '%s\n' "$out"
  assert_contains "$out" "receivers verified           3 of 3 steps" \
    "params+optimizer with the shadow $shadow: every step verified"
done
tlog_on="$TEST_TMP/shadow-on/logs/trainer-0.log" tlog_off="$TEST_TMP/shadow-off/logs/trainer-0.log"
assert_contains "$(grep 'event=trainer_ready' "$tlog_on")" "bf16_shadow=host-" \
  "the trainer sends the shadow from host memory"
assert_contains "$(grep 'event=trainer_ready' "$tlog_on")" "weights=host-pageable" \
  "with the shadow the fp32 master is not pinned"
assert_contains "$(grep 'event=trainer_ready' "$tlog_off")" "bf16_shadow=off" \
  "--bf16-shadow off sends the master"
sums_on="$(grep -oE 'event=(trainer_ready|step_done) .*checksum=[0-9a-f]+' "$tlog_on" | sed 's/.*checksum=//')"
sums_off="$(grep -oE 'event=(trainer_ready|step_done) .*checksum=[0-9a-f]+' "$tlog_off" | sed 's/.*checksum=//')"
assert_eq 4 "$(wc -l <<<"$sums_on")" "a checksum at start and after each of the 3 steps"
assert_eq "$sums_off" "$sums_on" "the same weights checksums with the shadow on and off"
assert_eq 4 "$(sort -u <<<"$sums_on" | wc -l)" "each step changed the weights"

# ---- bad flags are named, exit 2 --------------------------------------------------
assert_exit 2 "$RLORCH_BIN" run --steps x
assert_contains "$LAST_OUTPUT" "rlorch run: --steps: not an integer" "a bad --steps is named"
assert_exit 2 env RLORCH_STEPS=x "$RLORCH_BIN" run
assert_contains "$LAST_OUTPUT" "rlorch run: RLORCH_STEPS: not an integer" "a bad RLORCH_STEPS is named"
assert_exit 2 "$RLORCH_BIN" run --preset 3t
assert_contains "$LAST_OUTPUT" "--preset" "an unknown preset is named"
assert_exit 2 "$RLORCH_BIN" run --offload gpu
assert_contains "$LAST_OUTPUT" "--offload" "a bad --offload is named"
assert_exit 2 "$RLORCH_BIN" run --bf16-shadow maybe
assert_contains "$LAST_OUTPUT" "rlorch run: --bf16-shadow: invalid value \"maybe\" (want on|off)" \
  "a bad --bf16-shadow is named"
assert_exit 2 "$RLORCH_BIN" run --inference-workers 0
assert_contains "$LAST_OUTPUT" "--inference-workers" "zero inference workers is refused"
assert_exit 2 "$RLORCH_BIN" run --max-requests-per-worker 0
assert_contains "$LAST_OUTPUT" "--max-requests-per-worker" "a zero request limit is named"
assert_exit 2 env RLORCH_MAX_REQUESTS_PER_WORKER=2000 "$RLORCH_BIN" run
assert_contains "$LAST_OUTPUT" "RLORCH_MAX_REQUESTS_PER_WORKER" "an oversized limit from the environment is named"

finish
