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
# Then a rank killed mid-plan and started again on its checkpoint, and the
# tiling errors Register names (an overlap, a gap, a shape mismatch, ...).
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

# ---- a rank lost mid-plan ---------------------------------------------------------------
# Two ranks, each with its own checkpoint directory. Rank 1 is killed
# (SIGKILL) once the plan of step 3 is built, i.e. after both ranks trained
# step 3 and saved it: the plan is aborted, the run waits naming the rank
# missing, and rank 1 started again on its checkpoint holds the version
# rank 0 holds, so step 3 is planned again. No step is lost or recorded
# twice; every broadcast is verified.
KSTEPS=6
start_rank() { # R LOG
  "$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --name "trainer-kill-$1" --preset 100m \
    --layers 2 --device -1 --threads 1 --rank "$1" --ranks 2 --checkpoint-dir "$TEST_TMP/ckpt-$1" \
    --log-level info >"$TEST_TMP/trainer.kill.$2.log" 2>&1 &
  RANK_PID=$!
  track_pid $RANK_PID
}
serve_start || { finish; exit 1; }
start_rank 0 0
R0=$RANK_PID
start_rank 1 1
R1=$RANK_PID
for r in 0 1; do
  "$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --name "inference-kill-$r" --device -1 \
    --log-level info --latency-ms-mean 20 --latency-ms-std 5 >"$TEST_TMP/inference.kill.$r.log" 2>&1 &
  track_pid $!
done
wait_until 60 live_count_is 4
RUN="$(ctl --json start-run --name group-kill --preset 100m --steps $KSTEPS --rollouts-per-step 8 \
  --group-size 2 --max-async-level 1 | json_get id)"
assert_ne "" "$RUN" "kill: the run starts"
wait_log 120 "event=plan_built run=$RUN plan=$RUN/step-3 "
assert_eq 0 "$?" "kill: the daemon built the plan of step 3"
kill -KILL "$R1"
wait "$R1" 2>/dev/null
waiting() { [[ "$(ctl --json get-run "$RUN" | json_get message)" == *"rank 1 missing"* ]]; }
wait_until 30 waiting
assert_eq 0 "$?" "kill: the run waits, saying rank 1 is missing: $(ctl --json get-run "$RUN" | json_get message)"
assert_contains "$(grep "event=broadcast_aborted run=$RUN plan=$RUN/step-3" "$SERVE_LOG")" \
  "participant_lost" "kill: the pending plan of step 3 is aborted: its participant is lost"
start_rank 1 2
wait_log 60 "event=checkpoint_restored .* run=$RUN policy_version=4 " "$TEST_TMP/trainer.kill.2.log"
assert_eq 0 "$?" "kill: rank 1 restarts from its checkpoint, holding step 3's version"
timeout 240 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" watch-run "$RUN" >/dev/null
out="$(ctl --json get-run "$RUN")"
assert_eq RUN_STATE_SUCCEEDED "$(json_get state "$out")" "kill: the run succeeds: $(json_get message "$out")"
assert_eq ok "$(steps_once "$RUN" "$KSTEPS")" \
  "kill: steps 0..$((KSTEPS - 1)) recorded once each, versions continuous, all verified"
kill -TERM "$R0" "$RANK_PID" 2>/dev/null
wait "$R0" "$RANK_PID" 2>/dev/null

# ---- tiling errors at Register ------------------------------------------------------------
# Raw registrations of ranks (no agent): each group size is a group of its own.
W=/rlorch.v1.Worker
reg() { # RANK RANKS TENSORS-JSON
  grpc_call --method $W/Register --json "{\"role\":\"WORKER_ROLE_TRAINER\",\"name\":\"raw-$2-$1\",\
\"capabilities\":{\"trainer_rank\":$1,\"trainer_ranks\":$2},\"manifest\":{\"tensors\":$3}}"
}
sh() { # NAME OFFSET COUNT [SHAPE]: a tensor part, fp32 stored, bf16 on the wire
  printf '{"name":"%s","storage_dtype":1,"wire_dtype":2,"shape":%s,"residency":3,"shard_offset":%s,"shard_elems":%s}' \
    "$1" "${4:-[4,4]}" "$2" "$3"
}
assert_status OK "$(reg 0 2 "[$(sh w 0 10)]")" "rank 0 of 2 holding [0, 10) registers"
assert_status_details INVALID_ARGUMENT \
  "manifest of trainer rank 1 of 2: tensor 'w': rank 0 holds [0, 10) and rank 1 holds [8, 16): they overlap" \
  "$(reg 1 2 "[$(sh w 8 8)]")" "an overlap with a registered rank is refused, naming the tensor and both ranks"
assert_status OK "$(reg 0 3 "[$(sh w 0 5)]")" "rank 0 of 3 holding [0, 5) registers"
assert_status OK "$(reg 2 3 "[$(sh w 10 6)]")" "rank 2 of 3 holding [10, 16) registers: the group is not whole yet"
assert_status_details INVALID_ARGUMENT \
  "manifest of trainer rank 1 of 3: tensor 'w': elements [8, 10) of 16 are held by no rank (between rank 1 and rank 2)" \
  "$(reg 1 3 "[$(sh w 5 3)]")" "the last rank's Register shows a gap, naming the tensor, the range and the ranks around it"
assert_status OK "$(reg 0 4 "[$(sh w 0 4)]")" "rank 0 of 4 registers"
assert_status_details INVALID_ARGUMENT "manifest of trainer rank 1 of 4: tensor 'w': rank 0 and rank 1 disagree on shape" \
  "$(reg 1 4 "[$(sh w 4 4 '[2,8]')]")" "a shape other than a registered rank's is refused, naming both ranks"
assert_status_details INVALID_ARGUMENT "manifest of trainer rank 1 of 5: source rank 1: tensor #0 'w': shard [12, +8) outside its 16 elements" \
  "$(reg 1 5 "[$(sh w 12 8)]")" "a part past the tensor's end is refused"
assert_status_details INVALID_ARGUMENT "capabilities.trainer_rank: 2 is not below trainer_ranks 2" \
  "$(reg 2 2 "[$(sh w 0 8)]")" "a rank past its group is refused"
assert_status_details INVALID_ARGUMENT "capabilities.trainer_ranks: 1025 is over the limit of 1024" \
  "$(reg 0 1025 "[$(sh w 0 8)]")" "a group over 1024 ranks is refused"
workers="$(grpc_call --method /rlorch.v1.Control/ListWorkers --json '{}')"
assert_eq 4 "$(json_get message.workers "$workers" | python3 -c '
import json, sys
print(sum(1 for w in json.load(sys.stdin) if w.get("name", "").startswith("raw-")))')" \
  "only the 4 registrations that passed left workers behind"
assert_status_details INVALID_ARGUMENT "manifest: tensor 'w' is a shard (elements [0, 8) of 16), but a trainer of 1 rank sends whole tensors" \
  "$(reg 0 0 "[$(sh w 0 8)]")" "a lone trainer's shard is refused"

serve_stop

# ---- restarts at Register --------------------------------------------------------------------
# A rank that registers again while its old registration is still live (a
# hung or cut-off process: no stream closed, no heartbeat timeout yet). Raw
# registrations send no heartbeat: a daemon that waits long for one keeps
# them live throughout.
RLORCH_WORKER_TIMEOUT_MS=120000 serve_start || { finish; exit 1; }
regn() { # NAME RANK RANKS TENSORS-JSON
  grpc_call --method $W/Register --json "{\"role\":\"WORKER_ROLE_TRAINER\",\"name\":\"$1\",\
\"capabilities\":{\"trainer_rank\":$2,\"trainer_ranks\":$3},\"manifest\":{\"tensors\":$4}}"
}
states() { # NAME: the states of the workers of that name, oldest first
  grpc_call --method /rlorch.v1.Control/ListWorkers --json '{}' | json_get message.workers | python3 -c '
import json, sys
ws = sorted((w for w in json.load(sys.stdin) if w.get("name") == sys.argv[1]), key=lambda w: int(w["id"][2:]))
print(" ".join(w.get("state", "?").replace("WORKER_STATE_", "") for w in ws))' "$1"
}
# (b) the same rank, the same layout, under its name: it replaces the old
# registration at once, checked against its real peer.
assert_status OK "$(regn b-0 0 6 "[$(sh w 0 8)]")" "restart: rank 0 of 6 (b-0) registers"
assert_status OK "$(regn b-1 1 6 "[$(sh w 8 2)]")" "restart: rank 1 of 6 (b-1) registers"
assert_status OK "$(regn b-1 1 6 "[$(sh w 8 2)]")" \
  "restart: rank 1 registers again under its name while its old registration is live"
assert_eq "LOST REGISTERED" "$(states b-1)" "restart: the old registration of b-1 is lost, the new one holds rank 1"
assert_contains "$(grep 'event=worker_lost .* name=b-1 ' "$SERVE_LOG")" "registered again under its name, as w-" \
  "restart: the daemon logs why the old registration was lost"
assert_eq "REGISTERED" "$(states b-0)" "restart: its peer rank 0 stays"
# Another process on a live rank is a conflict, refused by name (the agent
# retries: it takes the rank once the holder is lost).
assert_status_details ALREADY_EXISTS \
  "capabilities.trainer_rank: rank 1 of 6 is held by live trainer b-1 (w-" \
  "$(regn b-other 1 6 "[$(sh w 8 2)]")" "restart: a second live trainer on rank 1 is refused, naming the holder"
# (a) every rank restarts with another layout while the old ranks are live:
# rank 0's new part overlaps only old rank 1's. The old group is lost, the
# new ranks are checked against each other.
assert_status OK "$(regn a-0 0 7 "[$(sh w 0 8)]")" "new layout: old rank 0 of 7 registers"
assert_status OK "$(regn a-1 1 7 "[$(sh w 8 4)]")" "new layout: old rank 1 of 7 registers"
assert_status OK "$(regn a-0 0 7 "[$(sh w 0 10)]")" \
  "new layout: rank 0 restarted with [0, 10) registers, though old rank 1 holds [8, 12)"
assert_eq "LOST REGISTERED" "$(states a-0)" "new layout: rank 0's old registration is lost"
assert_eq "LOST" "$(states a-1)" "new layout: the old group's rank 1 is lost with it"
assert_contains "$(grep 'event=worker_lost .* name=a-1 ' "$SERVE_LOG")" \
  "its trainer group of 7 ranks restarts: rank 0 (a-0) registered again as w-" "new layout: named in the log"
assert_status_details INVALID_ARGUMENT "manifest of trainer rank 1 of 7: tensor 'w': rank 0 holds [0, 10) and rank 1 holds [8, 12): they overlap" \
  "$(regn a-1 1 7 "[$(sh w 8 4)]")" "new layout: old rank 1 back with the old layout is refused against the new rank 0"
assert_eq "LOST" "$(states a-1)" "new layout: a refused registration adds nothing"
assert_status OK "$(regn a-1 1 7 "[$(sh w 10 2)]")" "new layout: rank 1 restarted with [10, 12) registers"
assert_eq "LOST REGISTERED" "$(states a-0)" "new layout: the new rank 0 stays"
assert_status_details INVALID_ARGUMENT "manifest of trainer rank 2 of 7: tensor 'w': rank 1 holds [10, 12) and rank 2 holds [11, 13): they overlap" \
  "$(regn a-2 2 7 "[$(sh w 11 2)]")" "new layout: a genuine overlap among the new ranks is still refused"
# (c) a second group of the same size: its ranks are refused by name where
# the first holds them, and by tensor where it does not.
assert_status OK "$(regn c1-0 0 8 "[$(sh w 0 8)]")" "two groups: group 1's rank 0 of 8 registers"
assert_status_details ALREADY_EXISTS "rank 0 of 8 is held by live trainer c1-0" \
  "$(regn c2-0 0 8 "[$(sh w 0 4 '[2,8]')]")" "two groups: group 2's rank 0 is refused, naming group 1's"
assert_status_details INVALID_ARGUMENT "manifest of trainer rank 1 of 8: tensor 'w': rank 0 and rank 1 disagree on shape" \
  "$(regn c2-1 1 8 "[$(sh w 4 4 '[2,8]')]")" "two groups: group 2's rank 1 of another model is refused by tensor"

# ---- a rank's manifest at StepDone ---------------------------------------------------------
out="$(regn sd-0 0 9 "[$(sh w 0 2),$(sh u 0 0 '[8]')]")"
assert_status OK "$out" "step: rank 0 of 9 registers"
SD="$(json_get message.worker_id "$out")"
step_done() { # WORKER TENSORS-JSON
  grpc_call --method $W/Report --json "{\"worker_id\":\"$1\",\"step_done\":{\"step\":0,\"manifest\":{\"tensors\":$2}}}"
}
sd_version() {
  grpc_call --method /rlorch.v1.Control/ListWorkers --json '{}' | json_get message.workers | python3 -c '
import json, sys
print([w.get("policy_version", 0) for w in json.load(sys.stdin) if w["id"] == sys.argv[1]][0])' "$1"
}
assert_status_details INVALID_ARGUMENT \
  "step_done.manifest of trainer rank 0 of 9 (sd-0): tensor 'w': elements [0, 4), registered [0, 2); a rank keeps the layout it registered with" \
  "$(step_done "$SD" "[$(sh w 0 4),$(sh u 0 0 '[8]')]")" "step: a rank whose range changed is refused, naming the tensor and both ranges"
assert_status_details INVALID_ARGUMENT "tensor 'u': shape [4, 2], registered [8]" \
  "$(step_done "$SD" "[$(sh w 0 2),$(sh u 0 0 '[4,2]')]")" "step: a shape change is refused, naming the tensor and both shapes"
assert_status_details INVALID_ARGUMENT "tensor #1 is 'v', registered as 'u'" \
  "$(step_done "$SD" "[$(sh w 0 2),$(sh v 0 0 '[8]')]")" "step: another tensor is refused by index and both names"
assert_status_details INVALID_ARGUMENT "1 tensors, registered with 2" \
  "$(step_done "$SD" "[$(sh w 0 2)]")" "step: a tensor left out is refused"
assert_eq 0 "$(sd_version "$SD")" "step: no refused step was counted (policy_version 0)"
assert_status OK "$(step_done "$SD" "[$(sh w 0 2 | sed 's/"residency":3/"residency":2/'),$(sh u 0 8 '[8]')]")" \
  "step: the same layout with another residency (the whole tensor as [0, 8)) is taken"
assert_eq 1 "$(sd_version "$SD")" "step: the step taken counts (policy_version 1)"
out="$(regn sd-lone 0 0 "[$(sh w 0 0)]")"
assert_status OK "$out" "step: a lone trainer registers whole tensors"
assert_status_details INVALID_ARGUMENT "step_done.manifest: tensor 'w' is a shard (elements [0, 8) of 16), but a trainer of 1 rank sends whole tensors" \
  "$(step_done "$(json_get message.worker_id "$out")" "[$(sh w 0 8)]")" "step: a lone trainer's step manifest holds no shard either"
assert_status OK "$(step_done "$(json_get message.worker_id "$out")" "[$(sh w 0 0 '[2,8]')]")" \
  "step: a lone trainer's tensors may change shape between steps (the next plan is built from them)"
serve_stop

# ---- bad ranks are named ------------------------------------------------------------
assert_exit 2 "$RLORCH_BIN" trainer --orchestrator 127.0.0.1:1 --rank 2 --ranks 2
assert_contains "$LAST_OUTPUT" "--rank: 2 is not below --ranks 2" "a rank past the group is named"
assert_exit 2 env RLORCH_RANKS=x "$RLORCH_BIN" trainer --orchestrator 127.0.0.1:1
assert_contains "$LAST_OUTPUT" "RLORCH_RANKS" "a bad RLORCH_RANKS is named"
# Rank 1's checkpoint (the kill test's) of parts of rank 0's sizes: rank 0
# refuses it at start, naming both.
assert_exit 1 "$RLORCH_BIN" trainer --orchestrator 127.0.0.1:1 --preset 100m --layers 2 --device -1 \
  --threads 1 --rank 0 --ranks 2 --checkpoint-dir "$TEST_TMP/ckpt-1"
assert_contains "$LAST_OUTPUT" "ckpt-1/trainer.ckpt holds rank 1 of 2; this trainer is rank 0 of 2" \
  "another rank's checkpoint is refused at start, naming what it holds and what was asked"

finish
