#!/usr/bin/env bash
# Rollout data end to end: the run's prompts (a JSONL file, read in order and
# again from the top, or synthetic from a seed) reach the engines with the
# sampling parameters, every rollout of a group answers the group's prompt,
# batches are whole groups; bad prompt sources and sampling parameters are
# refused by name; slow requests are hedged on another worker; an answer with
# another prompt or too few rollouts is refused, counted and its group sent
# again; the generation metrics add up. Checked from the per-step JSONL logs
# (DATA_DIR/rollouts/RUN/step-N.jsonl) and /metrics.
source "$(dirname "$0")/lib.sh"
need_cmd node python3 || { finish; exit 1; }

C=/rlorch.v1.Control
W=/rlorch.v1.Worker

# ---- helpers ---------------------------------------------------------------------

# trainer_agent; inference_agent NAME [ARGS...]: rlorch's own agents against
# the running daemon, stopped on exit (or when the daemon shuts down).
trainer_agent() {
  "$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --preset 100m --layers 2 --log-level warn \
    >"$TEST_TMP/trainer.$__LIB_SERVE_SEQ.log" 2>&1 &
  track_pid $!
}
inference_agent() { # NAME [ARGS...]
  local name=$1
  shift
  "$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --name "$name" --log-level warn "$@" \
    >"$TEST_TMP/$name.$__LIB_SERVE_SEQ.log" 2>&1 &
  track_pid $!
}

# start_run CTL_ARGS...: starts a run with ctl and prints its id.
start_run() {
  ctl --json start-run "$@" | json_get id
}

# run_end RUN: waits (at most 120 s) for the run to end and prints its state.
run_end() {
  timeout 120 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" watch-run "$1" >/dev/null 2>&1
  ctl --json get-run "$1" | json_get state
}

# checks WHAT N PY_ARGS...: runs the log checker (below); each "ok TEXT" or
# "FAIL TEXT" line it prints is an assertion, and exactly N must have run.
checks() {
  local what=$1 want=$2 out line
  shift 2
  out="$(python3 "$TEST_TMP/check.py" "$@" 2>&1)"
  while IFS= read -r line; do
    case "$line" in
      "ok "*) pass "$what: ${line#ok }" ;;
      "FAIL "*) fail "$what: ${line#FAIL }" ;;
    esac
  done <<<"$out"
  assert_eq "$want" "$(grep -cE '^(ok|FAIL) ' <<<"$out")" "$what: every check ran" ||
    printf '%s\n' "$out"
}

# py_value PY_ARGS...: one value the checker prints ("value X").
py_value() {
  python3 "$TEST_TMP/check.py" "$@" 2>/dev/null | sed -n 's/^value //p'
}

# The checker: reads the step logs of one run, RUN_DIR/step-*.jsonl.
cat >"$TEST_TMP/check.py" <<'PY'
import glob, json, os, sys

def check(ok, what):
    print(("ok " if ok else "FAIL ") + what)

def steps(d):
    out = {}
    for f in glob.glob(os.path.join(d, "step-*.jsonl")):
        out[int(os.path.basename(f)[5:-6])] = [json.loads(l) for l in open(f) if l.strip()]
    return out

def groups(st):
    g = {}
    for s, rs in st.items():
        for r in rs:
            g.setdefault(int(r["group_id"]), []).append((s, r))
    return g

def whole_groups(st, size, nsteps, per_step):
    """Every step has its batch; every group is whole, in one step only."""
    check(sorted(st) == list(range(nsteps)), f"{nsteps} step logs ({sorted(st)})")
    check(all(len(rs) == per_step for rs in st.values()),
          f"every step holds {per_step} rollouts ({[len(rs) for rs in st.values()]})")
    g = groups(st)
    bad = {k: len(v) for k, v in g.items() if len(v) != size or len({s for s, _ in v}) != 1}
    check(not bad and 0 not in g, f"every group_id appears exactly {size} times, in one step "
          f"({len(g)} groups; off: {bad})")
    same = all(len({tuple(r["prompt_token_ids"]) for _, r in v}) == 1 for v in g.values())
    check(same, "all rollouts of a group share its prompt")
    return g

mode, d = sys.argv[1], sys.argv[2]
st = steps(d)
if mode == "file":  # RUN_DIR PROMPTS_JSONL GROUP_SIZE STEPS PER_STEP
    prompts = [json.loads(l)["prompt_token_ids"] for l in open(sys.argv[3]) if l.strip()]
    size, nsteps, per_step = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    g = whole_groups(st, size, nsteps, per_step)
    rs = [r for v in st.values() for r in v]
    check(rs and all(r["prompt_token_ids"] in prompts for r in rs),
          "every rollout's prompt_token_ids is one of the file's prompts")
    # Group k is the k-th dispatched first, which draws the file's next line:
    # line (k - 1) mod lines + 1, wrapping at the end of the file.
    off = {k: v[0][1]["prompt_token_ids"] for k, v in g.items()
           if v[0][1]["prompt_token_ids"] != prompts[(k - 1) % len(prompts)]}
    check(not off, f"group k has line (k-1) mod {len(prompts)} + 1 of the file (off: {off})")
    check(1 in g, "group 1 (the first dispatch: line 1) is in a batch")
    print(f"value {max(g) if g else 0}")
elif mode == "synthetic":  # RUN_DIR TOKENS VOCAB
    n, vocab = int(sys.argv[3]), int(sys.argv[4])
    rs = [r for v in st.values() for r in v]
    check(rs and all(len(r["prompt_token_ids"]) == n and max(r["prompt_token_ids"]) < vocab
                     for r in rs), f"every prompt has {n} token ids below {vocab} ({len(rs)} rollouts)")
    g = groups(st)
    check(1 in g, "group 1 is in a batch")
    print("value " + json.dumps(g[1][0][1]["prompt_token_ids"] if 1 in g else None))
elif mode == "max_tokens":  # RUN_DIR N
    n = int(sys.argv[3])
    rs = [r for v in st.values() for r in v]
    check(rs and all(len(r["completion_token_ids"]) <= n for r in rs),
          f"every completion has at most {n} tokens ({sorted({len(r['completion_token_ids']) for r in rs})})")
    # The agent draws about 256 tokens a completion (std 64): all are cut.
    check(all(r["finish_reason"] == "FINISH_REASON_LENGTH" and len(r["completion_token_ids"]) == n
              and len(r["completion_logprobs"]) == n for r in rs),
          f"each was cut at {n} tokens, finish_reason LENGTH, one logprob a token")
    g = groups(st)
    check(g and all(len({tuple(r["completion_token_ids"]) for _, r in v}) == len(v) for v in g.values()),
          "at temperature 1 the completions of a group differ")
elif mode == "greedy":  # RUN_DIR
    g = groups(st)
    check(g and all(len({tuple(r["completion_token_ids"]) for _, r in v}) == 1 for v in g.values()),
          f"at temperature 0 the completions of each group are identical ({len(g)} groups)")
    rs = [r for v in st.values() for r in v]
    check(rs and all(p == 0 for r in rs for p in r["completion_logprobs"]),
          "and every greedy token has logprob 0")
elif mode == "whole":  # RUN_DIR GROUP_SIZE STEPS PER_STEP
    whole_groups(st, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
elif mode == "tokens":  # RUN_DIR: completion tokens of the logged batches
    print("value %d" % sum(len(r["completion_token_ids"]) for v in st.values() for r in v))
PY

# gt X Y: 1 when the number X is greater than Y.
gt() { python3 -c 'import sys; print(int(float(sys.argv[1]) > float(sys.argv[2])))' "$1" "$2"; }
ge() { python3 -c 'import sys; print(int(float(sys.argv[1]) >= float(sys.argv[2])))' "$1" "$2"; }

# A metric's series exists on /metrics (its value may be 0).
metric_present() {
  http_get /metrics | awk -v s="$1" 'index($0, s " ") == 1 { found = 1 } END { exit !found }'
}

# ---- 1. JSONL prompts, end to end, and 7. the metrics of that run ------------------
PROMPTS="$TEST_TMP/prompts.jsonl"
cat >"$PROMPTS" <<'EOF'
{"prompt_token_ids": [11, 12, 13]}
{"prompt_token_ids": [21, 22], "metadata": "answer: 42"}

{"prompt_token_ids": [31]}
{"prompt_token_ids": [41, 42, 43, 44], "source": "keys other than the two are ignored"}
{"prompt_token_ids": [51, 52, 53, 54, 55]}
EOF
serve_start || { finish; exit 1; }
trainer_agent
inference_agent inf-a
inference_agent inf-b
run="$(start_run --prompts "$PROMPTS" --group-size 2 --rollouts-per-step 4 --steps 3)"
assert_eq RUN_STATE_SUCCEEDED "$(run_end "$run")" "a run on JSONL prompts succeeds" || serve_log_tail
rundir="$SERVE_DATA_DIR/rollouts/$run"
checks "jsonl" 7 file "$rundir" "$PROMPTS" 2 3 4
spec="$(ctl --json get-run "$run")"
assert_eq "$PROMPTS" "$(json_get spec.prompts.jsonl_path "$spec")" "the run records its prompts file"
assert_eq 2 "$(json_get spec.group_size "$spec")" "and its group size"

# 7. The generation metrics of that run.
tokens="$(metric_value rlorch_generated_tokens_total)"
logged="$(py_value tokens "$rundir")"
assert_eq 1 "$(gt "$tokens" 0)" "rlorch_generated_tokens_total > 0 ($tokens)"
assert_eq 1 "$(ge "$tokens" "${logged:-1e99}")" \
  "rlorch_generated_tokens_total ($tokens) >= the completion tokens of the logged batches ($logged)"
assert_eq 1 "$(gt "$(metric_value rlorch_rollout_request_duration_seconds_count)" 0)" \
  "rlorch_rollout_request_duration_seconds_count > 0"
assert_eq 1 "$(gt "$(metric_value rlorch_last_broadcast_timestamp_seconds)" 0)" \
  "rlorch_last_broadcast_timestamp_seconds > 0"
assert_eq 1 "$(gt "$(metric_value rlorch_last_step_timestamp_seconds)" 0)" \
  "rlorch_last_step_timestamp_seconds > 0"
# Acks and broadcast reports come on each agent's report stream: 3 steps of 3
# participants, an ack and a report each, counted one by one.
streamed="$(rpc_count /rlorch.v1.Worker/ReportStream OK)"
assert_eq 1 "$(ge "${streamed:-0}" 18)" "at least 18 reports came on ReportStream ($streamed)"
# Per-worker figures come with heartbeats (once a second) and reach /metrics
# at the daemon's next sweep.
worker_tokens() { metric_value "rlorch_worker_generated_tokens_total{worker=\"$1\"}"; }
worker_counted() { [[ "$(gt "$(worker_tokens "$1")" 0)" == 1 ]]; }
for w in inf-a inf-b; do
  wait_until 10 worker_counted "$w"
  assert_eq 1 "$(gt "$(worker_tokens "$w")" 0)" "rlorch_worker_generated_tokens_total{worker=\"$w\"} > 0"
  metric_present "rlorch_worker_requests_active{worker=\"$w\"}"
  assert_eq 0 $? "rlorch_worker_requests_active{worker=\"$w\"} is exported"
done
metric_present rlorch_rollouts_in_flight
assert_eq 0 $? "rlorch_rollouts_in_flight is exported"
if command -v promtool >/dev/null 2>&1; then
  out="$(http_get /metrics | promtool check metrics 2>&1)"
  assert_eq 0 $? "promtool check metrics passes after a run" || printf '%s\n' "$out"
  assert_eq "" "$out" "promtool check metrics has nothing to say"
else
  skip "promtool not installed"
fi

# A file of 2 lines, 6 groups: read again from the top, twice.
SMALL="$TEST_TMP/small.jsonl"
printf '{"prompt_token_ids": [7, 7]}\n{"prompt_token_ids": [8]}\n' >"$SMALL"
run="$(start_run --prompts "$SMALL" --group-size 2 --rollouts-per-step 4 --steps 3)"
assert_eq RUN_STATE_SUCCEEDED "$(run_end "$run")" "a run with more groups than lines succeeds"
checks "2-line file" 7 file "$SERVE_DATA_DIR/rollouts/$run" "$SMALL" 2 3 4
top="$(py_value file "$SERVE_DATA_DIR/rollouts/$run" "$SMALL" 2 3 4)"
assert_eq 1 "$(gt "${top:-0}" 4)" "groups past the second epoch were batched (up to group $top)"
assert_contains "$(ctl --json get-run "$run" | json_get message)" "3 steps done" "and it ends as any run"
assert_not_contains "$(cat "$SERVE_LOG")" "level=error" "the daemon logged no error in these runs"
serve_stop

# ---- 2. refusals ---------------------------------------------------------------------
# StartRun checks the spec and opens the prompt source before a run exists:
# each mistake is INVALID_ARGUMENT naming the field, the path, the line.
RLORCH_MAX_TOKENS=100 serve_start || { finish; exit 1; }
refused() { # MESSAGE CTL_ARGS...
  local want=$1
  shift
  assert_exit 1 ctl start-run "$@"
  assert_eq "rlorch ctl: $C/StartRun: INVALID_ARGUMENT: $want" "$LAST_OUTPUT" "refused: $want"
}
refused_js() { # MESSAGE RUNSPEC_JSON
  local out
  out="$(grpc_call --method $C/StartRun --json "$2")"
  assert_status INVALID_ARGUMENT "$out" "StartRun $2 is INVALID_ARGUMENT"
  assert_eq "$1" "$(json_get status.details "$out")" "refused: $1"
}
refused "prompts.jsonl_path: $TEST_TMP/none.jsonl: No such file or directory" \
  --prompts "$TEST_TMP/none.jsonl"
printf '{"prompt_token_ids": "1 2 3"}\n{"prompt_token_ids": [1]}\n' >"$TEST_TMP/bad1.jsonl"
refused "prompts.jsonl_path: $TEST_TMP/bad1.jsonl:1: prompt_token_ids: a string, not an array" \
  --prompts "$TEST_TMP/bad1.jsonl"
printf '{"tokens": [1]}\n' >"$TEST_TMP/bad1b.jsonl"
refused "prompts.jsonl_path: $TEST_TMP/bad1b.jsonl:1: prompt_token_ids: missing" \
  --prompts "$TEST_TMP/bad1b.jsonl"
refused "rollouts_per_step: 6 is not a multiple of group_size (4)" --group-size 4 --rollouts-per-step 6
refused "sampling.max_tokens: 101 is over the limit of 100 (max_tokens)" --max-tokens 101
# ctl bounds temperature and top_p itself; the API gets them as sent.
assert_exit 2 ctl start-run --temperature 101
assert_contains "$LAST_OUTPUT" "--temperature" "ctl names --temperature"
assert_exit 2 ctl start-run --top-p 1.5
assert_contains "$LAST_OUTPUT" "--top-p" "ctl names --top-p"
refused_js "sampling.temperature: 101 is not in [0, 100]" '{"sampling":{"temperature":101}}'
refused_js "sampling.temperature: -0.5 is not in [0, 100]" '{"sampling":{"temperature":-0.5}}'
refused_js "sampling.top_p: 1.5 is not in [0, 1]" '{"sampling":{"temperature":1,"top_p":1.5}}'
refused_js "prompts.synthetic.vocab_size: 1 is too small (at least 2)" \
  '{"prompts":{"synthetic":{"vocab_size":1}}}'
refused_js "prompts.jsonl_path: empty" '{"prompts":{"jsonl_path":""}}'
assert_eq '[]' "$(ctl --json list-runs | python3 -c 'import json,sys; print(json.load(sys.stdin).get("runs", []))')" \
  "no refused spec left a run behind"

# A bad line further down passes StartRun and fails the run when it is reached.
BAD3="$TEST_TMP/bad3.jsonl"
printf '{"prompt_token_ids": [1]}\n{"prompt_token_ids": [2]}\n{"prompt_token_ids": [3, -5]}\n' >"$BAD3"
trainer_agent
inference_agent inf-c --tokens-mean 16 --tokens-std 4
run="$(start_run --prompts "$BAD3" --group-size 1 --rollouts-per-step 2 --steps 3)"
assert_ne "" "$run" "a file whose third line is bad starts a run"
assert_eq RUN_STATE_FAILED "$(run_end "$run")" "which fails when the third line is drawn"
assert_eq "prompts: $BAD3:3: prompt_token_ids[1]: -5 is not a token id (an integer in [0, 4294967295])" \
  "$(ctl --json get-run "$run" | json_get message)" "Run.message names the file, line 3 and the key"

# ---- 3. synthetic prompts --------------------------------------------------------------
first=()
for seed in 7 7 8; do
  run="$(start_run --synthetic-prompt-tokens 5 --prompt-seed "$seed" --group-size 2 \
    --rollouts-per-step 4 --steps 1)"
  assert_eq RUN_STATE_SUCCEEDED "$(run_end "$run")" "a run on synthetic prompts (seed $seed) succeeds"
  checks "synthetic seed $seed" 2 synthetic "$SERVE_DATA_DIR/rollouts/$run" 5 32000
  first+=("$(py_value synthetic "$SERVE_DATA_DIR/rollouts/$run" 5 32000)")
done
assert_ne "null" "${first[0]}" "the first prompt is known"
assert_eq "${first[0]}" "${first[1]}" "the same seed gives the same first prompt (${first[0]})"
assert_ne "${first[0]}" "${first[2]}" "another seed gives another (${first[2]})"

# ---- 4. sampling reaches the engine -------------------------------------------------
run="$(start_run --max-tokens 3 --group-size 2 --rollouts-per-step 4 --steps 2)"
assert_eq RUN_STATE_SUCCEEDED "$(run_end "$run")" "a run with --max-tokens 3 succeeds"
checks "max_tokens 3" 3 max_tokens "$SERVE_DATA_DIR/rollouts/$run" 3
run="$(start_run --temperature 0 --max-tokens 8 --group-size 4 --rollouts-per-step 8 --steps 2)"
assert_eq RUN_STATE_SUCCEEDED "$(run_end "$run")" "a run with --temperature 0 succeeds"
assert_eq 0 "$(ctl --json get-run "$run" | json_get spec.sampling.temperature)" "it records temperature 0"
checks "temperature 0" 2 greedy "$SERVE_DATA_DIR/rollouts/$run"
serve_stop

# ---- 5. hedging: a slow worker's requests go to the fast one too ----------------------
serve_start || { finish; exit 1; }
trainer_agent
inference_agent fast --tokens-mean 16 --tokens-std 4
# 1.5 s per completion: every request it gets outlives the request timeout.
inference_agent slow --tokens-mean 16 --tokens-std 4 --latency-ms-mean 1500 --latency-ms-std 0
# Both attached before the run starts, so that the slow one gets requests from the first.
ready_inference() {
  ctl --json list-workers | python3 -c '
import json, sys
ws = json.load(sys.stdin).get("workers", [])
sys.exit(sum(w["role"] == "WORKER_ROLE_INFERENCE" and w["state"] == "WORKER_STATE_READY" for w in ws) != 2)'
}
wait_until 20 ready_inference
assert_eq 0 $? "the fast and the slow inference worker are attached"
run="$(start_run --request-timeout-ms 200 --group-size 2 --rollouts-per-step 4 --steps 3)"
assert_eq RUN_STATE_SUCCEEDED "$(run_end "$run")" "a run with a slow worker and a request timeout succeeds"
assert_eq 1 "$(gt "$(metric_value 'rlorch_rollout_requests_total{outcome="resent"}')" 0)" \
  "slow requests were sent again (outcome resent > 0)"
assert_eq 1 "$(gt "$(metric_value 'rlorch_rollout_requests_total{outcome="cancelled"}')" 0)" \
  "and the slow worker's copies cancelled (outcome cancelled > 0)"
checks "hedged" 4 whole "$SERVE_DATA_DIR/rollouts/$run" 2 3 4
serve_stop

# ---- 6. an engine's wrong answers: refused, counted, the group sent again ------------
# The inference worker is the grpc-js client, answering by hand. It sends no
# heartbeats: a long worker timeout keeps it (and the trainer) known.
RLORCH_WORKER_TIMEOUT_MS=600000 serve_start || { finish; exit 1; }
out="$(grpc_call --method $W/Register --json '{"role":"WORKER_ROLE_TRAINER","name":"t-js",
  "manifest":{"tensors":[{"name":"w","storage_dtype":"DTYPE_FP32","wire_dtype":"DTYPE_BF16",
  "shape":[1],"residency":"RESIDENCY_HOST_PAGEABLE"}]},"data_address":"127.0.0.1:9"}')"
tid="$(json_get message.worker_id "$out")"
node "$NODE_CLIENT" --target "$GRPC_ADDR" --method $W/Attach --json "{\"worker_id\":\"$tid\"}" \
  --stream >"$TEST_TMP/t-js.jsonl" 2>&1 &
track_pid $!
out="$(grpc_call --method $W/Register --json '{"role":"WORKER_ROLE_INFERENCE","name":"i-js"}')"
iid="$(json_get message.worker_id "$out")"
node "$NODE_CLIENT" --target "$GRPC_ADDR" --method $W/Attach --json "{\"worker_id\":\"$iid\"}" \
  --stream >"$TEST_TMP/i-js.jsonl" 2>&1 &
track_pid $!
# One group of 2, one request at a time: every rollout command is for it.
out="$(grpc_call --method $C/StartRun \
  --json '{"steps":1,"rollouts_per_step":2,"group_size":2,"max_requests_per_worker":1}')"
assert_status OK "$out" "a run of one group of 2 starts"
# request N: the N-th rollout command on i-js's stream, as "request_id group_id prompt_json".
request() {
  python3 - "$TEST_TMP/i-js.jsonl" "$1" <<'PY'
import json, sys
cmds = [json.loads(l)["message"]["rollout"] for l in open(sys.argv[1])
        if l.startswith('{"message"') and json.loads(l)["message"].get("rollout")]
n = int(sys.argv[2])
if len(cmds) >= n:
    c = cmds[n - 1]
    print(c["request_id"], c["group_id"], json.dumps(c["prompt_token_ids"], separators=(",", ":")))
PY
}
has_request() { [[ -n "$(request "$1")" ]]; }
answer() { # REQUEST_ID ROLLOUTS_JSON
  grpc_call --method $W/Report --json "{\"worker_id\":\"$iid\",\"rollouts\":{\"request_id\":${1:-0},\"rollouts\":[$2]}}"
}
rollout() { # ID GROUP [PROMPT_JSON]
  printf '{"id":%s,"group_id":%s,"prompt_token_ids":%s,"completion_token_ids":[5,6],
    "completion_logprobs":[-0.5,-0.25],"rewards":[1],"finish_reason":"FINISH_REASON_STOP"}' \
    "$1" "$2" "${3:-[]}"
}
wait_until 30 has_request 1
read -r rq1 g1 p1 <<<"$(request 1)"
assert_ne "" "$g1" "i-js gets a rollout request (group $g1, prompt $p1)"
other="$(python3 -c 'import json,sys; p=json.loads(sys.argv[1]); p[0]+=1; print(json.dumps(p))' "${p1:-[0]}")"
out="$(answer "$rq1" "$(rollout 1 "$g1" "$other"),$(rollout 2 "$g1" "$p1")")"
assert_status INVALID_ARGUMENT "$out" "an answer with another prompt is INVALID_ARGUMENT"
assert_eq "rollouts[0].prompt_token_ids: not the prompt of group $g1 (16 tokens); leave it empty or send the request's" \
  "$(json_get status.details "$out")" "naming rollouts[0].prompt_token_ids"
assert_eq 1 "$(metric_value 'rlorch_rollouts_malformed_total{reason="mismatch"}')" "counted as mismatch"
wait_until 10 has_request 2
read -r rq2 g2 p2 <<<"$(request 2)"
assert_eq "$g1 $p1" "$g2 $p2" "the refused group is sent again, with its prompt"
assert_eq 1 "$((${rq2:-0} > rq1))" "in a new request ($rq2)"
out="$(answer "$rq2" "$(rollout 3 "$g2")")"
assert_status INVALID_ARGUMENT "$out" "a short answer (1 rollout of 2) is INVALID_ARGUMENT"
assert_eq "worker i-js: request $rq2 asked for 2 rollouts, got 1" "$(json_get status.details "$out")" \
  "naming the count"
assert_eq 2 "$(metric_value 'rlorch_rollouts_malformed_total{reason="mismatch"}')" "counted as mismatch too"
wait_until 10 has_request 3
read -r rq3 g3 p3 <<<"$(request 3)"
assert_eq "$g1 $p1" "$g3 $p3" "the group is sent a third time"
# Refused by the checks that come before the scheduler: the same.
out="$(answer "$rq3" "$(rollout 6 "$g3" | sed 's/-0.5,-0.25/-0.5/'),$(rollout 7 "$g3")")"
assert_status INVALID_ARGUMENT "$out" "an answer with a logprob missing is INVALID_ARGUMENT"
assert_eq "rollouts[0].completion_logprobs: 1 values for 2 completion tokens" \
  "$(json_get status.details "$out")" "naming rollouts[0].completion_logprobs"
assert_eq 1 "$(metric_value 'rlorch_rollouts_malformed_total{reason="logprob_count"}')" \
  "counted as logprob_count"
wait_until 10 has_request 4
read -r rq4 g4 p4 <<<"$(request 4)"
assert_eq "$g1 $p1" "$g4 $p4" "the group is sent a fourth time"
# A whole answer, prompts left out: the orchestrator fills them in.
out="$(answer "$rq4" "$(rollout 4 "$g4"),$(rollout 5 "$g4" "$p4")")"
assert_status OK "$out" "the whole answer is accepted"
wait_until 10 grep -q '"train"' "$TEST_TMP/t-js.jsonl"
assert_eq 0 $? "and makes the batch of step 0"
out="$(grpc_call --method $W/FetchBatch --json "{\"worker_id\":\"$tid\",\"step\":0}")"
assert_eq "4 $p1 5 $p1" "$(python3 -c '
import json, sys
rs = [r for l in sys.stdin if l.startswith("{\"message\"") for r in json.loads(l)["message"]["rollouts"]]
print(" ".join(r["id"] + " " + json.dumps(r["prompt_token_ids"], separators=(",", ":")) for r in rs))' <<<"$out")" \
  "the trainer gets both rollouts with the group's prompt"
serve_stop

# ---- 8. rlorch run: groups and a prompts file -----------------------------------------
out="$("$RLORCH_BIN" run --steps 2 --group-size 4 --inference-workers 1 --layers 2 \
  --data-dir "$TEST_TMP/run-g4" --log-level warn 2>&1)"
assert_eq 0 $? "rlorch run --group-size 4 exits 0" || printf '%s\n' "$out"
assert_contains "$out" "summary: run run-1 succeeded" "and the run succeeds"
checks "run --group-size 4" 4 whole "$TEST_TMP/run-g4/rollouts/run-1" 4 2 8
# Its default group size is 4 as well.
out="$("$RLORCH_BIN" run --steps 2 --prompts "$PROMPTS" --inference-workers 1 --layers 2 \
  --data-dir "$TEST_TMP/run-p" --log-level warn 2>&1)"
assert_eq 0 $? "rlorch run --prompts FILE exits 0" || printf '%s\n' "$out"
assert_contains "$out" "summary: run run-1 succeeded" "and the run succeeds"
checks "run --prompts" 7 file "$TEST_TMP/run-p/rollouts/run-1" "$PROMPTS" 4 2 8

finish
