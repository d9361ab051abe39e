#!/usr/bin/env bash
# The RL example (examples/rl) as its proof: a real `rlorch serve`, one
# PyTorch trainer and two PyTorch inference workers on the rlorch package,
# the reverse-digits task on the host transport.
#
# - Over STEPS steps the mean reward rises from chance (1/12) to at least
#   RISE_TO (measured: 0.09 over the first 10 steps, 0.90-0.99 over the last 10).
# - The control run, whose inference workers receive the broadcast but go on
#   generating with their initial weights, stays below NEAR_CHANCE: the rise
#   comes from the weights the broadcast delivers.
# - Every step of both runs is verified by both receivers (weights_verified,
#   the orchestrator comparing their checksums with the trainer's).
# - The trainer recomputes the logprobs of every sampled token with that
#   rollout's version of its weights cast to bf16; the largest gap from the
#   inference workers' logprobs stays within LOGPROB_TOL (measured: 0 to
#   5e-7; the fp32 weights of the same version differ by up to 0.07-0.17).
#   In the control run the same check finds the workers do not hold the
#   version they report (measured: 0.77-1.05), so it is a check that can fail.
# - run.py names a missing rlorch, refuses bad flags, passes on the
#   orchestrator's refusal, and ends a run that outlasts --timeout or loses
#   a process.
source "$(dirname "$0")/lib.sh"

EXAMPLE="$RLORCH_SOURCE_DIR/examples/rl"
STEPS=60
RISE_TO=0.6
NEAR_CHANCE=0.2
LOGPROB_TOL=0.01

# Python: Debian's python3 with python3-numpy and python3-torch (the package
# itself needs only the standard library's ctypes)
# (RLORCH_PYTHON, from CMake, says which; `make deps` installs them), as
# test_python runs it.
PY="${RLORCH_PYTHON:-/usr/bin/python3}"
if ! "$PY" -c 'import ctypes, numpy, torch' 2>"$TEST_TMP/py-import.err"; then
  fail "$PY lacks ctypes, numpy or torch (python3-numpy python3-torch): $(tail -n 1 "$TEST_TMP/py-import.err")"
  finish
fi
export RLORCH_LIBRARY="$RLORCH_BUILD_DIR/lib/librlorch.so.1"
export PYTHONDONTWRITEBYTECODE=1
asan_for_python

# ---- the task's pieces, without a transport --------------------------------------
out="$(cd "$EXAMPLE" && "$PY" - 2>&1 <<'PY'
import json, torch
import policy as P
assert P.reward([3, 2, 1], [3, 2, 1]) == 1.0
assert abs(P.reward([3, 0, 1], [3, 2, 1]) - 2 / 3) < 1e-9
assert P.reward([], [3, 2, 1]) == 0.0
line = json.loads(P.make_prompts(1, seed=5)[0])
ids, ans = line["prompt_token_ids"], P.answer_of(line["metadata"].encode())
assert ids[0] == P.BOS and ids[-1] == P.SEP and ans == list(reversed(ids[1:-1])), (ids, ans)
for bad in (b'{"answer": [1, 2]}', b'{"answer": [1, 2, 10]}', b'{}', b'not json'):
    try:
        P.answer_of(bad)
    except (ValueError, KeyError) as e:
        print("refused", bad, e)
    else:
        raise SystemExit(f"metadata {bad!r} accepted")
adv = P.group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5, 0.2, 0.2]), torch.tensor([0, 0, 1, 1, 2, 2]))
assert torch.allclose(adv, torch.tensor([1.0, -1.0, 0, 0, 0, 0]), atol=1e-4), adv
print("task ok")
PY
)"
assert_contains "$out" "task ok" "the checker scores by position, prompts carry their answer, GRPO advantages per group"
assert_eq 4 "$(grep -c '^refused' <<<"$out")" "malformed reference answers are refused with a message"

assert_exit 2 "$PY" "$EXAMPLE/run.py" --rlorch "$TEST_TMP/no-such-rlorch"
assert_contains "$LAST_OUTPUT" "not an executable" "run.py names a missing rlorch program"
assert_exit 2 "$PY" "$EXAMPLE/run.py" --rlorch "$RLORCH_BIN" --temperature 0
assert_contains "$LAST_OUTPUT" "--temperature 0.0: the trainer's loss needs" "run.py refuses greedy sampling, naming the flag"
# The orchestrator's refusal of a run spec reaches the user with its reason.
assert_exit 1 "$PY" "$EXAMPLE/run.py" --rlorch "$RLORCH_BIN" --rollouts-per-step 12 --group-size 8
assert_contains "$LAST_OUTPUT" "rlorch ctl start-run: exit" "run.py reports a refused run spec"
assert_contains "$LAST_OUTPUT" "multiple" "... with the orchestrator's reason (rollouts per step, a multiple of the group size)"
# A run that outlasts --timeout ends: the launcher stops it and every process.
assert_exit 1 "$PY" "$EXAMPLE/run.py" --rlorch "$RLORCH_BIN" --steps 1000 --timeout 4
assert_contains "$LAST_OUTPUT" "the run took more than 4 s" "run.py ends a run that outlasts --timeout, saying so"

# A process of the run that dies ends the run with its name, rather than a
# wait for a trainer that will not come back.
"$PY" "$EXAMPLE/run.py" --rlorch "$RLORCH_BIN" --steps 1000 --data-dir "$TEST_TMP/kill" \
  >"$TEST_TMP/kill.out" 2>&1 &
KILL_RUN=$!
track_pid $KILL_RUN
# shellcheck disable=SC2317  # called through wait_until
three_steps() {
  local f="$TEST_TMP/kill/trainer-steps.jsonl"
  [[ -f "$f" ]] && (($(wc -l <"$f") >= 3))
}
wait_until 60 three_steps
assert_eq 0 "$?" "the run to be killed takes 3 steps"
kill -KILL "$(awk '$1 == "trainer" {print $2}' "$TEST_TMP/kill/pids")"
timeout 60 tail --pid="$KILL_RUN" -f /dev/null
wait "$KILL_RUN"
assert_eq 1 "$?" "run.py exits 1 when its trainer is killed mid-run"
assert_contains "$(cat "$TEST_TMP/kill.out")" "trainer exited with status -9 during the run" \
  "... naming the process and its status"

# ---- the run and its control -------------------------------------------------------
t0=$SECONDS
"$PY" "$EXAMPLE/run.py" --rlorch "$RLORCH_BIN" --steps "$STEPS" --logprob-tolerance "$LOGPROB_TOL" \
  --data-dir "$TEST_TMP/rl" --summary "$TEST_TMP/rl.json" 2>&1 | tee "$TEST_TMP/rl.out"
assert_eq 0 "${PIPESTATUS[0]}" "the example run succeeds: every step verified, logprobs within $LOGPROB_TOL, clean exits"
t1=$SECONDS
"$PY" "$EXAMPLE/run.py" --rlorch "$RLORCH_BIN" --steps "$STEPS" --control \
  --data-dir "$TEST_TMP/control" --summary "$TEST_TMP/control.json" 2>&1 | tee "$TEST_TMP/control.out"
assert_eq 0 "${PIPESTATUS[0]}" "the control run succeeds: every step verified, clean exits"
echo "runs: $((t1 - t0)) s with the broadcast, $((SECONDS - t1)) s the control"

verdict="$("$PY" - "$TEST_TMP/rl.json" "$TEST_TMP/control.json" "$STEPS" "$RISE_TO" "$NEAR_CHANCE" "$LOGPROB_TOL" <<'PY'
import json, sys
rl, ctl = (json.load(open(p)) for p in sys.argv[1:3])
steps, rise, near, tol = int(sys.argv[3]), *map(float, sys.argv[4:7])
for name, r in (("run", rl), ("control", ctl)):
    s = r.get("steps", [])
    print(f"{name}: reward first {r.get('first_mean')} last {r.get('last_mean')} "
          f"(window {r.get('window')}), logprob gap {r.get('logprob_gap_max')}, "
          f"fp32 gap {r.get('logprob_gap_fp32_max')}, run {r.get('run_seconds')} s")
    print(f"{name}_steps", len(s))
    print(f"{name}_verified", all(x["weights_verified"] and x["receivers"] == 2 for x in s) and len(s) == steps)
    print(f"{name}_versions", all(x["policy_version"] == x["step"] + 1 for x in s))
    print(f"{name}_start_near_chance", (r.get("first_mean") or 1) < near)
print("rl_rises", (rl.get("last_mean") or 0) >= rise)
print("control_stays", (ctl.get("last_mean") or 1) < near and max(x["reward_mean"] for x in ctl["steps"]) < near)
print("rl_logprobs_match", rl.get("logprob_gap_max") is not None and rl["logprob_gap_max"] <= tol)
print("control_logprobs_differ", (ctl.get("logprob_gap_max") or 0) > 10 * tol)
print("fp32_differs", (rl.get("logprob_gap_fp32_max") or 0) > 0)
PY
)"
echo "$verdict"
for name in run control; do
  assert_contains "$verdict" "${name}_steps $STEPS" "$name: $STEPS step records"
  assert_contains "$verdict" "${name}_verified True" "$name: every step's broadcast verified by both receivers"
  assert_contains "$verdict" "${name}_versions True" "$name: step n commits version n + 1"
  assert_contains "$verdict" "${name}_start_near_chance True" "$name: the first steps' reward is near chance (< $NEAR_CHANCE)"
done
assert_contains "$verdict" "rl_rises True" "with the broadcast the reward rises to $RISE_TO or more"
assert_contains "$verdict" "control_stays True" "without it (the control run) every step stays below $NEAR_CHANCE"
assert_contains "$verdict" "rl_logprobs_match True" "the trainer's bf16 recompute matches the inference logprobs within $LOGPROB_TOL"
assert_contains "$verdict" "control_logprobs_differ True" "the recompute finds the control workers' weights are not the version they report"
assert_contains "$verdict" "fp32_differs True" "the fp32 weights of a version give other logprobs than its bf16 cast (the check sees the rounding)"
finish
