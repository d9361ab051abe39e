#!/usr/bin/env bash
# A trainer of several ranks on the host transport: 2, then 4 `rlorch
# trainer --rank r --ranks N` processes and two inference agents run a few
# steps. Each rank registers its part of every tensor, fetches its share of
# each batch and sends its part of each broadcast; every step is verified
# (each receiver's checksum of every source's part equals that source's) and
# recorded with sources = N. Each run is the first of a fresh daemon (run-1:
# the same step seeds), so the receivers of every group hold, step by step,
# exactly the weights a lone trainer's receivers hold: whole tensors, the
# union of the ranks' parts, each rank's AdamW step that of a lone trainer.
source "$(dirname "$0")/lib.sh"
need_cmd python3

export RLORCH_HEARTBEAT_INTERVAL_MS=200 RLORCH_WORKER_TIMEOUT_MS=3000
on_exit agent_logs_on_failure
STEPS=3

# sources_ok EVENTS N: "ok" when the STEPS step records in EVENTS each say
# sources = N (a lone trainer's record may leave it out: 1).
sources_ok() {
  python3 - "$1" "$2" "$STEPS" <<'PY'
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"step":{' in l]
bad = [f"step {i}: sources {s.get('sources')}" for i, s in enumerate(steps)
       if s.get("sources", 1) != int(sys.argv[2])]
if len(steps) != int(sys.argv[3]): bad.append(f"{len(steps)} steps")
print("; ".join(bad) or "ok")
PY
}

# group_run N TAG: a run of STEPS steps with N trainer ranks (1: a lone
# trainer, started without --rank/--ranks), on a daemon of its own.
group_run() {
  local n=$1 tag=$2 r pids=() flags run out total
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
  for r in 0 1; do
    "$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --name "inference-$tag-$r" --device -1 \
      --log-level info --latency-ms-mean 20 --latency-ms-std 5 >"$TEST_TMP/inference.$tag.$r.log" 2>&1 &
    pids+=($!)
    track_pid $!
  done
  wait_until 60 live_count_is $((n + 2))
  assert_eq 0 "$?" "$n ranks: every trainer rank and both receivers attach"
  run="$(ctl --json start-run --name "group-$tag" --preset 100m --steps $STEPS \
    --rollouts-per-step 8 --group-size 2 --max-async-level 1 | json_get id)"
  assert_eq run-1 "$run" "$n ranks: the run starts, the daemon's first"
  timeout 240 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --json watch-run "$run" >"$TEST_TMP/events.$tag"
  out="$(ctl --json get-run "$run")"
  assert_eq RUN_STATE_SUCCEEDED "$(json_get state "$out")" \
    "$n ranks: the run succeeds: $(json_get message "$out")"
  assert_eq "$STEPS" "$(json_get steps_done "$out")" "$n ranks: all $STEPS steps done"
  assert_eq ok "$(host_steps_ok "$TEST_TMP/events.$tag" $STEPS 8)" \
    "$n ranks: every step verified by 2 receivers on the host transport"
  assert_eq ok "$(sources_ok "$TEST_TMP/events.$tag" "$n")" "$n ranks: every step record says sources=$n"
  assert_eq "$STEPS" "$(grep -c "event=step run=$run .* verified=1 sources=$n" "$SERVE_LOG")" \
    "$n ranks: the step log lines say verified=1 sources=$n"
  if ((n > 1)); then
    for ((r = 0; r < n; r++)); do
      assert_eq "$STEPS" "$(grep "event=batch_fetched" "$SERVE_LOG" | grep -c " rank=$r ranks=$n ")" \
        "$n ranks: rank $r fetched its share of each batch (rank=$r ranks=$n)"
    done
    # 4 groups of 2 split over the ranks: the shares add up to each batch.
    total="$(grep "event=batch_fetched" "$SERVE_LOG" | grep "ranks=$n " |
      grep -oE 'rollouts=[0-9]+' | awk -F= '{s += $2} END {print s}')"
    assert_eq $((STEPS * 8)) "$total" "$n ranks: the shares add up to the batches"
  fi
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  serve_stop
}

# received TAG R: "plan checksum" of receiver R's whole weights after each step.
received() {
  grep -oE 'event=broadcast_done plan_id=run-1/step-[0-9]+ .*checksum=[0-9a-f]+' \
    "$TEST_TMP/inference.$1.$2.log" | sed -E 's/event=broadcast_done plan_id=([^ ]*) .*checksum=/\1 /'
}

group_run 1 one
group_run 2 two
group_run 4 four
ref="$(received one 0)"
assert_eq "$STEPS" "$(wc -l <<<"$ref")" "the lone trainer's receiver logged a checksum per step"
assert_eq "$STEPS" "$(awk '{print $2}' <<<"$ref" | sort -u | wc -l)" "each step changed the weights"
for tag in two four; do
  for r in 0 1; do
    assert_eq "$ref" "$(received $tag $r)" \
      "$tag ranks: receiver $r holds, after each step, the weights a lone trainer's receivers hold"
  done
done

# ---- bad ranks are named ------------------------------------------------------------
assert_exit 2 "$RLORCH_BIN" trainer --orchestrator 127.0.0.1:1 --rank 2 --ranks 2
assert_contains "$LAST_OUTPUT" "--rank: 2 is not below --ranks 2" "a rank past the group is named"
assert_exit 2 env RLORCH_RANKS=x "$RLORCH_BIN" trainer --orchestrator 127.0.0.1:1
assert_contains "$LAST_OUTPUT" "RLORCH_RANKS" "a bad RLORCH_RANKS is named"

finish
