#!/usr/bin/env bash
# Receivers that hold part of the model, on the host transport. Each run has
# three receivers: one whole `rlorch inference`, and a tensor-parallel engine
# of two (`rlorch inference --tp-rank 0|1 --tp-size 2`), each rank holding
# half of every 2-D tensor (rows and columns in turn) and the 1-D ones whole.
# (a) a lone trainer, (b) a group of two trainer ranks: every step is
# verified (each receiver's checksums over its own parts equal its sources'),
# and each tensor-parallel rank holds and receives fewer bytes than the whole
# receiver, the two together the whole model plus the replicated tensors.
# (c) the SDK through rlorch.h alone (tests/sdk): ranks of a tensor-parallel
# engine with options.parts, one placing its own tensors, one through
# on_bind, and a rank of an engine of three in Python (tests/python/py_parts.py,
# rlorch.Part), each checking every element it holds against the trainer's.
# (d) Register refuses bad parts, naming the field.
source "$(dirname "$0")/lib.sh"
need_cmd python3

export RLORCH_HEARTBEAT_INTERVAL_MS=200 RLORCH_WORKER_TIMEOUT_MS=3000
on_exit "agent_logs_on_failure; logs_on_failure 60 'sdk-*.out' 'sdk-*.err'"
STEPS=3

# views_ok EVENTS RECEIVERS: "ok" when the STEPS step records in EVENTS are
# each verified by RECEIVERS receivers on the host transport at the next
# policy version; else what is wrong.
views_ok() {
  python3 - "$1" "$2" "$STEPS" <<'PY'
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"step":{' in l]
bad = []
for i, s in enumerate(steps):
    if not s.get("weights_verified"): bad.append(f"step {i} not verified")
    if s.get("receivers") != int(sys.argv[2]): bad.append(f"step {i}: {s.get('receivers')} receivers")
    if s.get("mode") != "BROADCAST_MODE_HOST": bad.append(f"step {i}: mode {s.get('mode')}")
    if int(s.get("policy_version", 0)) != i + 1: bad.append(f"step {i}: version {s.get('policy_version')}")
if len(steps) != int(sys.argv[3]): bad.append(f"{len(steps)} steps")
print("; ".join(bad) or "ok")
PY
}

# buffer_bytes LOG: the bytes of the receive buffers the agent allocated.
buffer_bytes() { grep -oE 'event=receive_buffers .*bytes=[0-9]+' "$1" | head -1 | grep -oE 'bytes=[0-9]+' | cut -d= -f2; }

# views_run N TAG: a run of STEPS steps with N trainer ranks (1: a lone
# trainer) and the three receivers, on a daemon of its own.
views_run() {
  local n=$1 tag=$2 r pids=() flags run out whole tp0 tp1
  serve_start || return 1
  for ((r = 0; r < n; r++)); do
    flags=()
    ((n > 1)) && flags=(--rank "$r" --ranks "$n")
    "$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --name "trainer-$tag-$r" --preset 100m \
      --layers 2 --device -1 --threads 1 "${flags[@]}" --log-level info \
      >"$TEST_TMP/trainer.$tag.$r.log" 2>&1 &
    pids+=($!)
    track_pid $!
  done
  "$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --name "inference-$tag-whole" --device -1 \
    --log-level info --latency-ms-mean 20 --latency-ms-std 5 >"$TEST_TMP/inference.$tag.whole.log" 2>&1 &
  pids+=($!)
  track_pid $!
  for r in 0 1; do
    "$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --name "inference-$tag-tp$r" --device -1 \
      --tp-rank "$r" --tp-size 2 --preset 100m --layers 2 --log-level info --latency-ms-mean 20 \
      --latency-ms-std 5 >"$TEST_TMP/inference.$tag.tp$r.log" 2>&1 &
    pids+=($!)
    track_pid $!
  done
  wait_until 60 live_count_is $((n + 3))
  assert_eq 0 "$?" "$tag: every trainer rank, the whole receiver and both tensor-parallel ranks attach"
  for r in 0 1; do
    assert_contains "$(cat "$TEST_TMP/inference.$tag.tp$r.log")" "event=tp_parts tp_rank=$r tp_size=2 preset=100m" \
      "$tag: tensor-parallel rank $r logs the parts it holds"
  done
  run="$(ctl --json start-run --name "views-$tag" --preset 100m --steps $STEPS \
    --rollouts-per-step 8 --group-size 2 --max-async-level 1 | json_get id)"
  assert_ne "" "$run" "$tag: the run starts"
  timeout 240 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --json watch-run "$run" >"$TEST_TMP/events.$tag"
  out="$(ctl --json get-run "$run")"
  assert_eq RUN_STATE_SUCCEEDED "$(json_get state "$out")" "$tag: the run succeeds: $(json_get message "$out")"
  assert_eq ok "$(views_ok "$TEST_TMP/events.$tag" 3)" \
    "$tag: every step verified by the 3 receivers (2 of them holding parts) on the host transport"
  for who in whole tp0 tp1; do
    assert_eq "$STEPS" "$(grep -c "event=broadcast_done plan_id=$run/step-" "$TEST_TMP/inference.$tag.$who.log")" \
      "$tag: receiver $who took every step's broadcast"
  done
  whole="$(buffer_bytes "$TEST_TMP/inference.$tag.whole.log")"
  tp0="$(buffer_bytes "$TEST_TMP/inference.$tag.tp0.log")"
  tp1="$(buffer_bytes "$TEST_TMP/inference.$tag.tp1.log")"
  assert_eq 1 "$(( tp0 > 0 && tp0 < whole && tp1 > 0 && tp1 < whole ))" \
    "$tag: each tensor-parallel rank holds fewer bytes ($tp0, $tp1) than the whole receiver ($whole)"
  # Each 2-D tensor split between the two ranks, each 1-D one held by both.
  assert_eq 1 "$(( tp0 + tp1 > whole && tp0 + tp1 < whole * 11 / 10 ))" \
    "$tag: the two ranks together hold the model once, plus the replicated 1-D tensors ($((tp0 + tp1)) of $whole)"
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  for who in tp0 tp1; do
    assert_not_contains "$(cat "$TEST_TMP/inference.$tag.$who.log")" "level=error" \
      "$tag: tensor-parallel $who logged no error"
  done
  serve_stop
}

views_run 1 lone
views_run 2 group

# ---- (c) the SDK's receivers of parts ------------------------------------------------
BIN="$RLORCH_BUILD_DIR/tests"
for p in sdk_trainer sdk_inference; do
  [[ -x "$BIN/$p" ]] || { fail "$BIN/$p is not built"; finish; }
done
serve_start || finish
"$BIN/sdk_trainer" "$GRPC_ADDR" sdk-trainer 127.0.0.1:0 >"$TEST_TMP/sdk-trainer.out" 2>"$TEST_TMP/sdk-trainer.err" &
SDK_PIDS=($!)
track_pid $!
"$BIN/sdk_inference" "$GRPC_ADDR" sdk-whole >"$TEST_TMP/sdk-whole.out" 2>"$TEST_TMP/sdk-whole.err" &
SDK_PIDS+=($!)
track_pid $!
"$BIN/sdk_inference" "$GRPC_ADDR" sdk-tp0 --tp 0/2 >"$TEST_TMP/sdk-tp0.out" 2>"$TEST_TMP/sdk-tp0.err" &
SDK_PIDS+=($!)
track_pid $!
"$BIN/sdk_inference" "$GRPC_ADDR" sdk-tp1 --tp-bind 1/2 >"$TEST_TMP/sdk-tp1.out" 2>"$TEST_TMP/sdk-tp1.err" &
SDK_PIDS+=($!)
track_pid $!
PY="${RLORCH_PYTHON:-/usr/bin/python3}"
"$PY" -c 'import ctypes, numpy' 2>"$TEST_TMP/py-import.err" ||
  { fail "$PY lacks ctypes or numpy (python3-numpy): $(tail -n 1 "$TEST_TMP/py-import.err")"; finish; }
(
  export PYTHONPATH="$RLORCH_SOURCE_DIR/workers/python" RLORCH_LIBRARY="$RLORCH_BUILD_DIR/lib/librlorch.so.1"
  export PYTHONDONTWRITEBYTECODE=1
  asan_for_python
  exec "$PY" "$RLORCH_SOURCE_DIR/tests/python/py_parts.py" "$GRPC_ADDR" sdk-py 0/3
) >"$TEST_TMP/sdk-py.out" 2>"$TEST_TMP/sdk-py.err" &
SDK_PIDS+=($!)
track_pid $!
wait_until 30 live_count_is 5
assert_eq 0 "$?" "sdk: the trainer and four receivers attach"
out="$(grpc_call --method /rlorch.v1.Control/StartRun \
  --json "{\"name\":\"sdk-views\",\"steps\":$STEPS,\"rollouts_per_step\":8,\"group_size\":2,\"max_async_level\":1}")"
assert_status OK "$out" "sdk: a run starts"
run="$(json_get message.id "$out")"
timeout 180 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --json watch-run "$run" >"$TEST_TMP/events.sdk"
assert_eq RUN_STATE_SUCCEEDED "$(ctl --json get-run "$run" | json_get state)" "sdk: the run succeeds"
assert_eq ok "$(views_ok "$TEST_TMP/events.sdk" 4)" "sdk: every step verified by the 4 receivers"
# 8185 elements whole; rank 0 of 2 holds 129 of the embedding's 257 rows,
# rank 1 128, each 24 of the mlp weight's 48 columns, both the whole norm;
# rank 0 of 3 holds 86 rows and 16 columns.
for who in whole:8185 tp0:4601 tp1:4585 py:3401; do
  o="$(cat "$TEST_TMP/sdk-${who%%:*}.out")"
  assert_contains "$o" "broadcast ok=1 version=$STEPS elements=${who##*:} bad=0" \
    "sdk ${who%%:*}: holds version $STEPS, its ${who##*:} elements each equal to the trainer's"
  assert_not_contains "$o" "FAIL" "sdk ${who%%:*}: found nothing wrong"
done
o1="$(cat "$TEST_TMP/sdk-tp1.out")"
assert_eq "$(grep -Ec '^broadcast ok=' <<<"$o1")" "$(grep -Ec '^bind version=[0-9]+ tensors=3$' <<<"$o1")" \
  "sdk tp1: on_bind placed its 3 parts before each broadcast"
for p in "${SDK_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
for p in "${SDK_PIDS[@]}"; do
  wait "$p"
  assert_eq 0 "$?" "sdk: pid $p exits 0 after SIGTERM"
done
serve_stop

# ---- (d) bad parts at Register -------------------------------------------------------
serve_start || finish
reg() { # NAME PARTS-JSON
  grpc_call --method /rlorch.v1.Worker/Register --json "{\"role\":\"WORKER_ROLE_INFERENCE\",\"name\":\"$1\",\
\"capabilities\":{\"max_concurrent_requests\":4},\"parts\":$2}"
}
assert_status_details INVALID_ARGUMENT "parts[0] 'w'.count: 0; a slice holds at least one index" \
  "$(reg raw-0 '[{"name":"w","kind":"PART_KIND_SLICE","dim":0,"start":0,"count":0}]')" \
  "a slice of no index is refused, naming the part and the field"
assert_status_details INVALID_ARGUMENT "parts: tensor 'w' is listed twice" \
  "$(reg raw-1 '[{"name":"w","kind":"PART_KIND_NONE"},{"name":"w","kind":"PART_KIND_WHOLE"}]')" \
  "a tensor listed twice is refused, naming it"
assert_status_details INVALID_ARGUMENT "parts[0].name: empty" \
  "$(reg raw-2 '[{"name":"","kind":"PART_KIND_NONE"}]')" "a part without a name is refused"
assert_status_details INVALID_ARGUMENT "parts[0] 'w'.dim: 9" \
  "$(reg raw-3 '[{"name":"w","kind":"PART_KIND_SLICE","dim":9,"start":0,"count":1}]')" \
  "a slice along a dimension no tensor has is refused"
assert_status OK "$(reg raw-4 '[{"name":"w","kind":"PART_KIND_SLICE","dim":1,"start":0,"count":2}]')" \
  "good parts register"
# Against the lone trainer registered: a slice past its tensor's shape.
assert_status OK "$(grpc_call --method /rlorch.v1.Worker/Register --json '{"role":"WORKER_ROLE_TRAINER",
"name":"raw-trainer","manifest":{"tensors":[{"name":"w","storage_dtype":1,"wire_dtype":2,"shape":[4,4],"residency":3}]}}')" \
  "a trainer with tensor 'w' [4, 4] registers"
out="$(reg raw-5 '[{"name":"w","kind":"PART_KIND_SLICE","dim":1,"start":3,"count":2}]')"
assert_status_details INVALID_ARGUMENT "(against the manifest of trainer raw-trainer)" "$out" \
  "a slice past the trainer's tensor is refused, naming the trainer"
assert_contains "$out" "'w'" "the refusal names the tensor"
serve_stop

# ---- bad flags are named ---------------------------------------------------------------
assert_exit 2 "$RLORCH_BIN" inference --orchestrator 127.0.0.1:1 --tp-rank 2 --tp-size 2
assert_contains "$LAST_OUTPUT" "--tp-rank: 2 is not below --tp-size 2" "a rank past the engine is named"
assert_exit 2 "$RLORCH_BIN" inference --orchestrator 127.0.0.1:1 --tp-size 2 --preset 3b
assert_contains "$LAST_OUTPUT" "unknown preset \"3b\"" "an unknown preset of a tensor-parallel rank is named"

finish
