#!/usr/bin/env bash
# The Python package (workers/python/rlorch) end to end, on the host
# transport: a real `rlorch serve`, a Python trainer (a small torch policy,
# its fp32 parameters the manifest, a real optimizer step a batch) and two
# Python inference engines with their own bf16 torch models, received into in
# place: one by the trainer's names, one with q/k/v and gate/up fused and its
# names mapped (tests/python). Over a run of a few steps every step must be
# verified by the orchestrator, after every broadcast each engine's
# parameters must equal the trainer's weights of that version cast to bf16
# (torch.equal, tensor by tensor), and every batch must hold the rollouts the
# engines made (token ids, logprobs, rewards). Then a run of a LoRA subset
# (only the adapters are sent, the rest stays as it was), and the bad-input
# paths (tests/python/py_errors.py): each an RlorchError with its message.
# First, the package's declarations against the header (tests/python/py_abi.py),
# and last, the installed package finding the library of its prefix.
#
# Python: Debian's python3 with python3-numpy and python3-torch (the package
# itself needs only the standard library's ctypes)
# (RLORCH_PYTHON, from CMake, says which; `make deps` installs them).
source "$(dirname "$0")/lib.sh"

PY="${RLORCH_PYTHON:-/usr/bin/python3}"
if ! "$PY" -c 'import ctypes, numpy, torch' 2>"$TEST_TMP/py-import.err"; then
  fail "$PY lacks ctypes, numpy or torch (python3-numpy python3-torch): $(tail -n 1 "$TEST_TMP/py-import.err")"
  finish
fi
export PYTHONPATH="$RLORCH_SOURCE_DIR/workers/python:$RLORCH_SOURCE_DIR/tests/python"
export RLORCH_LIBRARY="$RLORCH_BUILD_DIR/lib/librlorch.so.1"
export PYTHONDONTWRITEBYTECODE=1
asan_for_python
STEPS=3
PER_STEP=8

on_exit "logs_on_failure 60 'serve.*.log' 'py-*.out' 'py-*.err'"

# start_py NAME SCRIPT ARGS...: a Python program in the background, its
# output in py-NAME.out and py-NAME.err; its pid in LAST_PID.
start_py() {
  local name=$1 script=$2
  shift 2
  "$PY" "$RLORCH_SOURCE_DIR/tests/python/$script" "$@" \
    >"$TEST_TMP/py-$name.out" 2>"$TEST_TMP/py-$name.err" &
  LAST_PID=$!
  track_pid $LAST_PID
}

# stop_all PIDS...: SIGTERM, and each exits 0 once it stopped its worker.
stop_all() {
  local pid
  for pid in "$@"; do kill -TERM "$pid"; done
  for pid in "$@"; do
    timeout 30 tail --pid="$pid" -f /dev/null
    wait "$pid"
    assert_eq 0 "$?" "a Python SDK program exits 0 after SIGTERM (pid $pid)"
  done
}

# ---- the declarations: ctypes compiles nothing against the header ----------------
if need_cmd cc; then
  out="$("$PY" "$RLORCH_SOURCE_DIR/tests/python/py_abi.py" "$RLORCH_SOURCE_DIR/include" cc 2>&1)"
  assert_eq 0 "$?" "the package's declarations are rlorch.h's: functions, struct layouts, constants" ||
    echo "$out"
fi

# ---- a full run: a trainer, a plain engine and a fused, renamed one -----------------
serve_start || finish
W="$TEST_TMP/weights"
mkdir -p "$W"
start_py trainer py_trainer.py "$GRPC_ADDR" py-trainer "$W"
TR=$LAST_PID
start_py inference-0 py_inference.py "$GRPC_ADDR" py-inference-0 "$W" --bad-reports --raise-in-callback
I0=$LAST_PID
start_py inference-1 py_inference.py "$GRPC_ADDR" py-inference-1 "$W" --fused
I1=$LAST_PID
wait_until 60 live_count_is 3
assert_eq 0 "$?" "the Python trainer and both Python engines attach"

out="$(grpc_call --method /rlorch.v1.Control/StartRun \
  --json "{\"name\":\"py\",\"steps\":$STEPS,\"rollouts_per_step\":$PER_STEP,\"group_size\":2,\"max_async_level\":1}")"
assert_status OK "$out" "a run on the Python workers starts"
run="$(json_get message.id "$out")"
timeout 240 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --json watch-run "$run" >"$TEST_TMP/events.jsonl"
assert_eq 0 "$?" "WatchRun ends with OK when the run ends"
assert_eq RUN_STATE_SUCCEEDED "$(ctl --json get-run "$run" | json_get state)" "the run succeeds"
assert_eq ok "$(host_steps_ok "$TEST_TMP/events.jsonl" $STEPS $PER_STEP)" \
  "all $STEPS steps verified: 2 receivers, host transport, $PER_STEP rollouts, versions 1..$STEPS"

tr="$(cat "$TEST_TMP/py-trainer.out")"
assert_contains "$tr" "manifest tensors=17 layers=[0, 1]" "the trainer's manifest: its 17 parameters, layers from their names"
assert_eq "$STEPS" "$(grep -c '^step=[0-9]* done' <<<"$tr")" "the trainer took $STEPS optimizer steps"
assert_eq "$STEPS" "$(grep -Ec "^batch step=[0-9]+ rollouts=$PER_STEP checked=$PER_STEP bad=0 by=" <<<"$tr")" \
  "every batch held the $PER_STEP rollouts the engines made: token ids, logprobs, rewards, versions"
by="$(grep -o 'by=[^ ]*' <<<"$tr" | cut -d= -f2 | tr ',' '\n' | sort -u | paste -sd,)"
assert_eq "py-inference-0,py-inference-1" "$by" "the batches carry both engines' rollouts"
assert_not_contains "$tr" "FAIL" "the trainer found nothing wrong"
for i in 0 1; do
  o="$(cat "$TEST_TMP/py-inference-$i.out")"
  n="$(grep -Ec '^broadcast ok=1 version=[0-9]+ compared=17 changed=17 bad=0 ' <<<"$o")"
  assert_eq 1 "$((n >= STEPS))" "inference-$i: $n broadcasts, after each all 17 parameters equal the trainer's in bf16, all changed"
  assert_contains "$o" "broadcast ok=1 version=$STEPS compared=17 changed=17 bad=0 policy_version=$STEPS" \
    "inference-$i holds version $STEPS in its own parameters"
  assert_not_contains "$o" "FAIL" "inference-$i found nothing wrong"
done
m1="$(grep '^manifest ' "$TEST_TMP/py-inference-1.out")"
for l in 0 1; do
  assert_contains "$m1" "layers.$l.attn.q.weight,layers.$l.attn.k.weight,layers.$l.attn.v.weight,layers.$l.attn.o.weight" \
    "the fused engine exposes layer $l's qkv parameter as the trainer's q, k and v"
  assert_contains "$m1" "layers.$l.mlp.gate.weight,layers.$l.mlp.up.weight,layers.$l.mlp.down.weight" \
    "and its gate_up parameter as gate and up"
done
assert_not_contains "$m1" "model." "the fused engine's names are mapped to the trainer's"
o0="$(cat "$TEST_TMP/py-inference-0.out")"
for what in "one rollout short" "a positive logprob" "logprobs of another length" "a NaN reward" "no reward" \
  "an empty completion" "a negative token id" "an unknown finish reason" "a version the worker does not hold" \
  "report_step on an inference worker" "fetch_batch on an inference worker"; do
  assert_contains "$o0" "ok $what: RLORCH_E_" "a bad report raises RlorchError with its code and message: $what"
done
e0="$(cat "$TEST_TMP/py-inference-0.err")"
assert_contains "$e0" "on_broadcast_before(version=1) raised; the broadcast goes on" \
  "an exception in a broadcast callback is logged"
assert_contains "$e0" "RuntimeError: a deliberate error in on_broadcast_before" "with its traceback"
assert_contains "$e0" "INFO rlorch registered worker_id=" "library events reach logging.getLogger('rlorch')"
stop_all $TR $I0 $I1
assert_contains "$(cat "$TEST_TMP/py-trainer.out")" "stopped failures=0" "the trainer stopped cleanly"
for i in 0 1; do
  assert_contains "$(cat "$TEST_TMP/py-inference-$i.out")" "broadcasts_failed=0 failures=0" \
    "inference-$i stopped cleanly, no broadcast failed"
done
assert_eq 0 "$(cat "$TEST_TMP"/py-*.err | grep '^ERROR rlorch ' | grep -vc 'on_broadcast_before(version=1) raised')" \
  "nothing but the deliberate callback error was logged as an error"
serve_stop

# ---- a LoRA subset: only the adapters are sent ---------------------------------------
serve_start || finish
W="$TEST_TMP/weights-lora"
mkdir -p "$W"
start_py lora-trainer py_trainer.py "$GRPC_ADDR" py-lora-trainer "$W" --lora
TR=$LAST_PID
start_py lora-inference-0 py_inference.py "$GRPC_ADDR" py-lora-inference-0 "$W" --lora
I0=$LAST_PID
start_py lora-inference-1 py_inference.py "$GRPC_ADDR" py-lora-inference-1 "$W" --lora
I1=$LAST_PID
wait_until 60 live_count_is 3
assert_eq 0 "$?" "the LoRA trainer and engines attach"
out="$(grpc_call --method /rlorch.v1.Control/StartRun \
  --json '{"name":"py-lora","steps":2,"rollouts_per_step":4,"group_size":2,"max_async_level":1}')"
run="$(json_get message.id "$out")"
timeout 240 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --json watch-run "$run" >"$TEST_TMP/events-lora.jsonl"
assert_eq RUN_STATE_SUCCEEDED "$(ctl --json get-run "$run" | json_get state)" "the LoRA run succeeds"
assert_eq ok "$(host_steps_ok "$TEST_TMP/events-lora.jsonl" 2 4)" "both LoRA steps verified by 2 receivers"
assert_contains "$(cat "$TEST_TMP/py-lora-trainer.out")" "manifest tensors=4 layers=[0, 1]" \
  "the LoRA manifest holds the 4 adapter tensors only"
for i in 0 1; do
  o="$(cat "$TEST_TMP/py-lora-inference-$i.out")"
  # 21 parameters: the 4 adapters equal the trainer's in bf16 and changed,
  # the 17 base ones are as loaded.
  assert_contains "$o" "broadcast ok=1 version=2 compared=21 changed=4 bad=0 policy_version=2" \
    "lora-inference-$i: the adapters hold version 2, the base weights are untouched"
  assert_not_contains "$o" "FAIL" "lora-inference-$i found nothing wrong"
done
assert_not_contains "$(cat "$TEST_TMP/py-lora-trainer.out")" "FAIL" "the LoRA trainer found nothing wrong"
stop_all $TR $I0 $I1
serve_stop

# ---- installed: the package finds the library of its own prefix --------------------
prefix="$TEST_TMP/prefix"
out="$(cmake --install "$RLORCH_BUILD_DIR" --prefix "$prefix" 2>&1)"
assert_eq 0 "$?" "cmake --install into a temporary prefix" || echo "$out"
assert_eq 0 "$(find "$prefix" -name __pycache__ | wc -l)" "no bytecode cache is installed"
out="$(cd "$TEST_TMP" && env -u RLORCH_LIBRARY PYTHONPATH="$prefix/lib/python3/dist-packages" "$PY" -c '
import rlorch, sys
print(rlorch.__file__)
print(rlorch.library_path())
try:
    rlorch.Worker("inference", "127.0.0.1:1", max_concurrent_requests=2000)
except rlorch.RlorchError as e:
    print(e)' 2>&1)"
assert_contains "$(sed -n 1p <<<"$out")" "$prefix/lib/python3/dist-packages/rlorch/" "the installed package is the one imported"
assert_contains "$(sed -n 2p <<<"$out")" "$prefix/lib" "it loads the installed librlorch.so.1, not the build tree's"
assert_contains "$out" "RLORCH_E_INVALID: options.max_concurrent_requests: 2000 is outside 1..1024" \
  "and calls into it"

# ---- bad input: every failure an RlorchError with its message -----------------------
printf 'py-test-token\n' >"$TEST_TMP/token"
serve_start --token-file "$TEST_TMP/token" || finish
dead="127.0.0.1:$(free_port)"
out="$(timeout 120 "$PY" "$RLORCH_SOURCE_DIR/tests/python/py_errors.py" "$GRPC_ADDR" "$dead" "$TEST_TMP/token" 2>"$TEST_TMP/py-errors.err")"
rc=$?
printf '%s\n' "$out" | grep -E '^(ok|FAIL)' | sed 's/^/  py_errors: /'
assert_eq 0 "$rc" "py_errors: every bad input raised RlorchError with its code and message"
assert_contains "$out" " 0 failed" "py_errors reports no failure"
# awk without the ASan runtime asan_for_python preloads: Debian's mawk reads
# past a buffer (memcmp) on long log lines, and ASan aborts it.
assert_eq 1 "$(env -u LD_PRELOAD awk '/registered .*name=py-errors-left-running/ {r = 1} r && /worker_stopped status=0/ {n++} END {print n + 0}' \
  "$TEST_TMP/py-errors.err")" "a worker left running is stopped and freed by the package at exit"
serve_stop
finish
