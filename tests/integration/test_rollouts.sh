#!/usr/bin/env bash
# Rollout reports are checked whole before the scheduler sees them: a malformed
# one gets INVALID_ARGUMENT naming the field, an oversized one RESOURCE_EXHAUSTED
# naming the limit, each counted by reason in the metrics; the report is
# refused whole and the orchestrator keeps serving. rlorch's own inference
# agent sends rollouts of the real shape, which pass.
source "$(dirname "$0")/lib.sh"
need_cmd node python3

# The probe sends no heartbeats: a long worker timeout keeps it known however
# slowly the checks run (under the sanitizers, on a loaded machine).
RLORCH_MAX_ROLLOUT_BYTES=300 RLORCH_WORKER_TIMEOUT_MS=600000 serve_start || { finish; exit 1; }
W=/rlorch.v1.Worker

out="$(grpc_call --method $W/Register --json '{"role":"WORKER_ROLE_INFERENCE","name":"probe"}')"
assert_status OK "$out" "an inference worker registers"
id="$(json_get message.worker_id "$out")"

# report KIND_JSON: a Report of rollouts for request 1 from the probe worker.
report() {
  grpc_call --method $W/Report --json "{\"worker_id\":\"$id\",\"rollouts\":{\"request_id\":1,\"rollouts\":[$1]}}"
}
bad() { # ROLLOUT_JSON STATUS DETAILS
  local o
  o="$(report "$1")"
  assert_status_details "$2" "$3" "$o" "$2: $3"
}

ok='"id":1,"completion_token_ids":[5,6,7],"completion_logprobs":[-0.1,-0.2,-0.3],"rewards":[1]'
bad "{\"id\":1,\"completion_token_ids\":[5,6,7],\"completion_logprobs\":[-0.1,-0.2]}" \
  INVALID_ARGUMENT "rollouts[0].completion_logprobs: 2 values for 3 completion tokens"
bad "{$ok},{\"id\":2,\"completion_token_ids\":[5],\"rewards\":[1e999]}" \
  INVALID_ARGUMENT "rollouts[1].rewards[0]: inf is not a finite number"
bad "{\"id\":1,\"completion_token_ids\":[5,6],\"tokens\":3}" \
  INVALID_ARGUMENT "rollouts[0].tokens: 3 for 2 completion_token_ids"
bad "{\"id\":1,\"completion_token_ids\":[5],\"completion_logprobs\":[0.5]}" \
  INVALID_ARGUMENT "rollouts[0].completion_logprobs[0]: 0.5 is not a log-probability"
big="$(python3 -c 'print(",".join(["70000"] * 100))')"
bad "{\"id\":1,\"completion_token_ids\":[$big]}" \
  RESOURCE_EXHAUSTED "bytes is over max_rollout_bytes (300)"
# A well-formed report passes the checks; with no run there is no request 1.
o="$(report "{$ok}")"
assert_status OK "$o" "a well-formed report from a worker outside a run is answered"

assert_eq 1 "$(metric_value 'rlorch_rollouts_malformed_total{reason="logprob_count"}')" "logprob_count counted"
assert_eq 2 "$(metric_value 'rlorch_rollouts_malformed_total{reason="not_finite"}')" "not_finite counted"
assert_eq 1 "$(metric_value 'rlorch_rollouts_malformed_total{reason="token_count"}')" "token_count counted"
assert_eq 1 "$(metric_value 'rlorch_rollouts_malformed_total{reason="too_large"}')" "too_large counted"
assert_eq 0 "$(metric_value 'rlorch_rollouts_malformed_total{reason="finish_reason"}')" "finish_reason zero"
serve_stop

# rlorch's own agents: shaped rollouts within the default limit, used by a run.
serve_start || { finish; exit 1; }
"$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --preset 100m --layers 2 --log-level warn \
  >"$TEST_TMP/trainer.log" 2>&1 &
track_pid $!
"$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --log-level warn >"$TEST_TMP/inference.log" 2>&1 &
track_pid $!
out="$(ctl --json start-run --steps 2 --rollouts-per-step 4)"
run="$(json_get id "$out")"
timeout 120 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" watch-run "$run" >/dev/null
assert_eq RUN_STATE_SUCCEEDED "$(ctl --json get-run "$run" | json_get state)" "a run on shaped rollouts succeeds"
assert_eq 8 "$(metric_value 'rlorch_rollouts_total{outcome="used"}')" "its 8 rollouts were used"
assert_eq 0 "$(http_get /metrics | awk '/^rlorch_rollouts_malformed_total/ {s += $NF} END {print s + 0}')" \
  "none of the agent's rollouts was refused"
# The trainer fetched each step's batch itself, whole (it checks order and
# count against the train step and logs an error otherwise).
assert_eq 2 "$(rpc_count /rlorch.v1.Worker/FetchBatch OK)" "the trainer fetched both batches"
assert_eq 1 "$(python3 -c 'import sys; print(int(float(sys.argv[1]) > 0))' \
  "$(metric_value rlorch_batch_fetch_bytes_total)")" "the fetched bytes are counted"
assert_not_contains "$(cat "$TEST_TMP/trainer.log")" "batch_fetch_failed" "no fetch failed"
# Each step's batch is kept as JSONL under the data dir, one rollout a line.
for s in 0 1; do
  f="$SERVE_DATA_DIR/rollouts/$run/step-$s.jsonl"
  assert_eq 4 "$(python3 -c '
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
print(sum(1 for r in rs if r["completion_token_ids"] and r["rewards"]))' "$f" 2>&1)" \
    "step $s: its 4 rollouts are in $(basename "$f"), whole"
done
serve_stop

# rollout_log false: nothing is written.
RLORCH_ROLLOUT_LOG=false serve_start || { finish; exit 1; }
"$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --preset 100m --layers 2 --log-level warn \
  >"$TEST_TMP/trainer3.log" 2>&1 &
track_pid $!
"$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --log-level warn >"$TEST_TMP/inference3.log" 2>&1 &
track_pid $!
out="$(ctl --json start-run --steps 1 --rollouts-per-step 2)"
run="$(json_get id "$out")"
timeout 120 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" watch-run "$run" >/dev/null
assert_eq RUN_STATE_SUCCEEDED "$(ctl --json get-run "$run" | json_get state)" "the run succeeds"
assert_eq 0 "$(ls "$SERVE_DATA_DIR/rollouts/$run" 2>/dev/null | wc -l)" "rollout_log false writes no batch"

serve_stop

# ---- the trainer fetches its batch: FetchBatch, whole and in shares -----------------
# The trainer here is the grpc-js client: it attaches, reads its train step and
# fetches the batch as a trainer of its own would. Chunks of 4 KiB make every
# stream several messages; a tiny buffer budget holds dispatch back on the way,
# which must cost nothing. This trainer sends no heartbeats: a long worker
# timeout keeps it in the run.
RLORCH_ROLLOUT_BUFFER_BYTES=1024 RLORCH_BATCH_CHUNK_BYTES=4096 RLORCH_WORKER_TIMEOUT_MS=600000 \
  serve_start || { finish; exit 1; }
trainer_json() { # NAME
  printf '{"role":"WORKER_ROLE_TRAINER","name":"%s","manifest":{"tensors":[{"name":"w",
    "storage_dtype":"DTYPE_FP32","wire_dtype":"DTYPE_BF16","shape":[1],
    "residency":"RESIDENCY_HOST_PAGEABLE"}]},"data_address":"127.0.0.1:9"}' "$1"
}
out="$(grpc_call --method $W/Register --json "$(trainer_json t-js)")"
assert_status OK "$out" "a trainer registers through grpc-js"
tid="$(json_get message.worker_id "$out")"
# The command stream stays open while the trainer fetches: closing it would
# make the trainer lost, and its batch released.
node "$NODE_CLIENT" --target "$GRPC_ADDR" --method $W/Attach --json "{\"worker_id\":\"$tid\"}" \
  --stream >"$TEST_TMP/train.jsonl" 2>&1 &
attach=$!
track_pid $attach
# Rollouts of about 1.7 KB: two to a chunk.
"$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --log-level warn --tokens-std 16 \
  >"$TEST_TMP/inference2.log" 2>&1 &
track_pid $!
# Three groups of four (group_size through the API: ctl has no flag for it),
# all requested at once: the budget holds further dispatch back before the
# first report is in.
out="$(grpc_call --method /rlorch.v1.Control/StartRun \
  --json '{"steps":1,"rollouts_per_step":12,"group_size":4,"max_requests_per_worker":12}')"
assert_status OK "$out" "a run of three groups of four starts"
wait_until 60 grep -q '"train"' "$TEST_TMP/train.jsonl"
assert_eq 0 "$?" "the trainer gets its train step"

fetch() { # STEP RANK RANKS [WORKER_ID] [CLIENT ARGS...]
  local step=$1 rank=$2 ranks=$3 id=${4:-$tid}
  shift $(($# < 4 ? $# : 4))
  grpc_call --method $W/FetchBatch --json \
    "{\"worker_id\":\"$id\",\"step\":$step,\"rank\":$rank,\"ranks\":$ranks}" "$@"
}
fetch 0 0 1 >"$TEST_TMP/fetch.whole.jsonl"
fetch 0 0 2 >"$TEST_TMP/fetch.rank0.jsonl"
fetch 0 1 2 >"$TEST_TMP/fetch.rank1.jsonl"
checks="$(python3 - "$TEST_TMP" 4096 <<'PY'
import json, math, sys
d, chunk = sys.argv[1], int(sys.argv[2])
def lines(name):
    return [json.loads(l) for l in open(f"{d}/{name}") if l.strip().startswith("{")]
def check(ok, what):
    print(("ok " if ok else "FAIL ") + what)
t = next(l["message"]["train"] for l in lines("train.jsonl") if "message" in l and l["message"].get("train"))
ids = [int(i) for i in t["rollout_ids"]]
check(int(t["step"]) == 0 and len(ids) == 12 and t["groups"] == 3 and t["group_size"] == 4
      and int(t["batch_bytes"]) > 0, "the train step names 12 rollouts in 3 groups of 4, and their size")
def stream(name):
    ls = lines(name)
    msgs = [l["message"] for l in ls if "message" in l]
    st = ls[-1].get("status", {}) if ls else {}
    return msgs, st, [r for m in msgs for r in m["rollouts"]]
msgs, st, rs = stream("fetch.whole.jsonl")
check(st.get("name") == "OK", "ranks 1: the stream ends OK")
check(msgs and msgs[0]["share_rollouts"] == 12 and msgs[0]["share_groups"] == 3
      and all(m["share_rollouts"] == 0 for m in msgs[1:]), "ranks 1: the first message says 12 rollouts in 3 groups")
check([int(r["id"]) for r in rs] == ids, "ranks 1: the rollouts are the train step's, in its order")
check(all(len(r["completion_token_ids"]) == len(r["completion_logprobs"]) > 0 and len(r["prompt_token_ids"]) > 0
          and len(r["rewards"]) == 1 and r["finish_reason"] == "FINISH_REASON_STOP" and r["group_id"] != "0"
          for r in rs), "ranks 1: every rollout is whole")
need = math.ceil(int(t["batch_bytes"]) / chunk)
check(2 <= need <= len(msgs) < len(rs), f"ranks 1: {len(msgs)} messages of several rollouts, none over {chunk} bytes "
      f"(at least {need} for {t['batch_bytes']} bytes)")
m0, st0, r0 = stream("fetch.rank0.jsonl")
m1, st1, r1 = stream("fetch.rank1.jsonl")
check(st0.get("name") == "OK" and st1.get("name") == "OK", "ranks 2: both streams end OK")
check(m0 and m0[0]["share_rollouts"] == 4 and m0[0]["share_groups"] == 1 and [int(r["id"]) for r in r0] == ids[:4],
      "ranks 2: rank 0 gets group 0 of 3 (G*r/ranks .. G*(r+1)/ranks), its 4 rollouts in order")
check(m1 and m1[0]["share_rollouts"] == 8 and m1[0]["share_groups"] == 2 and [int(r["id"]) for r in r1] == ids[4:],
      "ranks 2: rank 1 gets groups 1 and 2, their 8 rollouts in order")
a, b = [int(r["id"]) for r in r0], [int(r["id"]) for r in r1]
check(not set(a) & set(b) and a + b == ids, "ranks 2: the shares are disjoint and their union is the batch, in order")
print("bytes " + t["batch_bytes"])
PY
)"
while IFS= read -r line; do
  case "$line" in
    "ok "*) pass "${line#ok }" ;;
    "FAIL "*) fail "${line#FAIL }" ;;
  esac
done <<<"$checks"
assert_eq 10 "$(grep -cE '^(ok|FAIL) ' <<<"$checks")" "every batch check ran"
bytes="$(sed -n 's/^bytes //p' <<<"$checks")"
if [[ -n "$bytes" ]]; then
  int_metric() { metric_value "$1" | python3 -c 'import sys; print(int(float(sys.stdin.read())))'; }
  assert_eq "$((2 * bytes))" "$(int_metric rlorch_batch_fetch_bytes_total)" \
    "the fetched-bytes counter says twice the batch (whole once, then in two shares)"
  # Held for the trainer, the batch still counts against the buffer budget.
  assert_eq 1 "$(($(int_metric rlorch_rollout_buffer_bytes) >= bytes))" \
    "the held batch's $bytes bytes count in rlorch_rollout_buffer_bytes"
else
  fail "the train step's batch_bytes is known"
fi
assert_eq 3 "$(rpc_count /rlorch.v1.Worker/FetchBatch OK)" "three fetches counted OK"

# Refusals, each with its status and a message naming what is wrong.
iid="$(ctl --json list-workers | python3 -c '
import json, sys
print([w["id"] for w in json.load(sys.stdin)["workers"] if w["role"] == "WORKER_ROLE_INFERENCE"][0])')"
o="$(fetch 1 0 1)"
assert_status_details FAILED_PRECONDITION "step 1's batch is not held (the trainer is executing step 0)" "$o" \
  "another step's batch is refused"
o="$(fetch 0 2 2)"
assert_status_details INVALID_ARGUMENT "rank: 2 is not below ranks 2" "$o" "a rank not below ranks is refused"
o="$(fetch 0 1 0)"
assert_status_details INVALID_ARGUMENT "rank: 1 is not below ranks 1 (ranks 0 is 1: the whole batch)" "$o" \
  "ranks 0 means one rank"
o="$(fetch 0 0 1 "$iid")"
assert_status_details FAILED_PRECONDITION "worker $iid (" "$o" "an inference worker's fetch names it"
assert_status_details FAILED_PRECONDITION "is not the trainer of the active run" "$o" \
  "and says it is not the run's trainer"
o="$(fetch 0 0 1 w-999)"
assert_status_details NOT_FOUND "worker_id: w-999 is not registered" "$o" "an unknown worker is refused"
assert_contains "$(cat "$SERVE_LOG")" "event=dispatch_held" "a full buffer held dispatch back"
assert_eq 0 "$(metric_value 'rlorch_rollouts_total{outcome="dropped_stale"}')" "and dropped nothing"
assert_eq 1 "$(kill -0 $attach 2>/dev/null && echo 1)" "the trainer's command stream is still open"
# StepDone releases the batch: its rollouts leave the store.
o="$(grpc_call --method $W/Report --json "{\"worker_id\":\"$tid\",\"step_done\":{\"step\":0}}")"
assert_status OK "$o" "the trainer reports step 0 done"
o="$(fetch 0 0 1)"
assert_status_details FAILED_PRECONDITION "step 0's batch is not held (no step is being trained)" "$o" \
  "a done step's batch is no longer served"
assert_eq 0 "$(metric_value rlorch_rollout_buffer_bytes)" "its rollouts are freed"
serve_stop

# ---- a batch released mid-stream ends the stream, saying why ---------------------------
# 400 rollouts, about 700 KB: far more than HTTP/2 flow control lets out to a
# reader that pauses, so the stream is still going when the trainer is lost.
RLORCH_BATCH_CHUNK_BYTES=4096 RLORCH_WORKER_TIMEOUT_MS=600000 serve_start || { finish; exit 1; }
out="$(grpc_call --method $W/Register --json "$(trainer_json t-js2)")"
tid="$(json_get message.worker_id "$out")"
node "$NODE_CLIENT" --target "$GRPC_ADDR" --method $W/Attach --json "{\"worker_id\":\"$tid\"}" \
  --stream >"$TEST_TMP/train2.jsonl" 2>&1 &
attach=$!
track_pid $attach
"$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --log-level warn --tokens-std 16 \
  >"$TEST_TMP/inference4.log" 2>&1 &
track_pid $!
out="$(ctl --json start-run --steps 1 --rollouts-per-step 400)"
run="$(json_get id "$out")"
wait_until 60 grep -q '"train"' "$TEST_TMP/train2.jsonl"
assert_eq 0 "$?" "the trainer gets its train step of 400 rollouts"
fetch 0 0 1 "$tid" --read-delay-ms 3000 >"$TEST_TMP/fetch.cut.jsonl" 2>&1 &
reader=$!
track_pid $reader
wait_until 20 grep -q '"message"' "$TEST_TMP/fetch.cut.jsonl"
kill -TERM $attach # the trainer's command stream closes: it is lost, its batch released
wait $reader
o="$(cat "$TEST_TMP/fetch.cut.jsonl")"
assert_status_details ABORTED "step 0's batch is no longer held (the trainer was lost)" "$o" \
  "the stream ends ABORTED, saying why"
got="$(grep -o '"id":"[0-9]*"' "$TEST_TMP/fetch.cut.jsonl" | wc -l)"
assert_eq 1 "$((got > 0 && got < 400))" "it was cut short ($got of 400 rollouts)"
assert_contains "$(cat "$SERVE_LOG")" "event=batch_fetch_failed" "the daemon logs the cut stream"
assert_eq SERVING "$(json_get message.status "$(grpc_call --health "")")" "and goes on serving"
# With no run active a trainer's fetch is refused.
ctl stop-run "$run" >/dev/null
wait_until 30 bash -c "\"$RLORCH_BIN\" ctl --target $GRPC_ADDR --json get-run $run | grep -q RUN_STATE_STOPPED"
out="$(grpc_call --method $W/Register --json "$(trainer_json t-js3)")"
o="$(fetch 0 0 1 "$(json_get message.worker_id "$out")")"
assert_status_details FAILED_PRECONDITION "no active run" "$o" "a fetch without an active run is refused"
serve_stop

finish
