#!/usr/bin/env bash
# Multi-host runs on one machine, measured against the orchestrator's
# prediction. Each "host" is a network namespace with its own address, joined
# to a bridge in the root namespace by a veth pair shaped with tc in both
# directions (lib.sh, "hosts in network namespaces"): host 0 runs the trainer
# (host transport, listening on its own address), hosts 1..N-1 one or two
# inference workers, the daemon listens on the bridge's address. Every worker
# is told its place (--node, --nics, --nic-gbits: its link's shaped rate), so
# the orchestrator's cost model predicts every plan on the topology the
# workers reported; each step's record carries that prediction beside the
# measured time, and every step must be within 10% of it, whatever layout
# the orchestrator chose (engine, or relays where two receivers share a
# host). Cases: 2 hosts, 4 hosts, 8 hosts with one receiver each, and 3 hosts
# with two receivers on host 1.
#
# The model is small (the 100m preset cut to 1 layer: 62 MB on the wire) and
# the links slow enough that the network, not two shared cores, bounds each
# step, and the whole test takes about two minutes. It prints one table row
# per case (docs/BENCHMARKS.md, "Multi-host runs in network namespaces").
# Needs root (namespaces, veth pairs, tc); exits 77 (skipped) otherwise.
source "$(dirname "$0")/lib.sh"
((EUID == 0)) || skip_all "needs root: network namespaces, veth pairs and tc qdiscs"
for c in ip tc flock python3; do need_cmd "$c" || finish; done

on_exit agent_logs_on_failure 40

LAYERS=1
STEPS=3
TOLERANCE=0.10
# Every step is checked, the first one too: each plan opens fresh TCP
# connections, so the first step starts no colder than the others.
WARMUP=0

# attach_wait SECONDS N PID...: "ok" once N workers are attached; else which
# of the PIDs exited (with its last log line), or that SECONDS passed.
attach_wait() {
  local deadline=$((SECONDS + $1)) n=$2 pid
  shift 2
  while ((SECONDS < deadline)); do
    live_count_is "$n" 2>/dev/null && { echo ok; return; }
    for pid in "$@"; do
      if ! kill -0 "$pid" 2>/dev/null; then
        echo "$(basename "${LOG_OF[$pid]}" .log) exited: $(tail -n 1 "${LOG_OF[$pid]}")"
        return
      fi
    done
    sleep 0.2
  done
  echo "$(live_workers) of $n attached after $1 s"
}

# case_run NAME MBIT DELAY_MS RECEIVERS...: hosts 0..N-1 on links of MBIT
# Mbit/s and DELAY_MS each way, RECEIVERS[k-1] inference workers on host k;
# a run of STEPS steps; every check of the case, then its table row.
case_run() {
  local name=$1 mbit=$2 delay=$3 gbits
  shift 3
  local per_host=("$@") hosts=$(($# + 1)) nrecv=0 k i run out params wire bound events pids
  gbits="$(python3 -c "print($mbit / 1000)")"
  for i in "${per_host[@]}"; do nrecv=$((nrecv + i)); done

  netns_teardown # what an earlier case left when it failed half-way
  netns_net_create || return 1
  for ((k = 0; k < hosts; k++)); do
    netns_host_add "$k" "$mbit" "$delay" || return 1
  done
  if [[ $delay != 0 && $NETNS_NETEM != 1 ]]; then
    skip "[$name] this kernel has no netem qdisc: the links add no latency (${delay} ms asked)"
    delay=0
  fi
  # The host transport's floor is the trainer's link: the operator of a slow
  # link tells the daemon its rate (GB/s), so that plan deadlines allow it.
  SERVE_HOST=$NETNS_GW RLORCH_BROADCAST_GBPS_HOST="$(python3 -c "print($mbit / 8000)")" serve_start ||
    return 1

  ip netns exec "$(netns_name 0)" "$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --name "$name-trainer" \
    --node host0 --nics 1 --nic-gbits "$gbits" --preset 100m --layers "$LAYERS" --device -1 \
    --threads 1 --data-listen "$(netns_addr 0):0" --log-level info >"$TEST_TMP/trainer.$name.log" 2>&1 &
  track_pid $!
  pids=($!)
  LOG_OF[$!]="$TEST_TMP/trainer.$name.log"
  for ((k = 1; k < hosts; k++)); do
    for ((i = 0; i < per_host[k - 1]; i++)); do
      ip netns exec "$(netns_name "$k")" "$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --name "$name-h$k-$i" \
        --node "host$k" --nics 1 --nic-gbits "$gbits" --device -1 --log-level info \
        >"$TEST_TMP/inference.$name.h$k.$i.log" 2>&1 &
      track_pid $!
      pids+=($!)
      LOG_OF[$!]="$TEST_TMP/inference.$name.h$k.$i.log"
    done
  done
  out="$(attach_wait 60 $((nrecv + 1)) "${pids[@]}")"
  assert_eq ok "$out" "[$name] the trainer and $nrecv inference workers on $hosts hosts attach" || return 1

  params="$(grep -oE 'event=trainer_ready .* params=[0-9]+' "$TEST_TMP/trainer.$name.log" | grep -oE '[0-9]+$')"
  wire=$((params * 2)) # bf16 on the wire
  # Every receiver's copy through the trainer's link, four times over, plus a minute.
  bound="$(python3 -c "print(int(60 + $STEPS * 4 * $wire * $nrecv * 8 / ($mbit * 1e6)))")"
  run="$(ctl --json start-run --name "$name" --preset 100m --steps "$STEPS" --rollouts-per-step 4 \
    --max-async-level 1 | json_get id)"
  assert_ne "" "$run" "[$name] the run starts" || return 1
  events="$TEST_TMP/events.$name"
  timeout "$bound" "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --json watch-run "$run" >"$events"
  assert_eq 0 "$?" "[$name] the run ends within ${bound} s"
  out="$(ctl --json get-run "$run")"
  assert_eq RUN_STATE_SUCCEEDED "$(json_get state "$out")" "[$name] the run succeeds: $(json_get message "$out")"

  # The bytes crossed the shaped links: at least one copy of the model per
  # step out of host 0 for each host with receivers (relays forward inside a
  # host only), and into each such host.
  local up0 down
  up0="$(netns_link_bytes 0 up)"
  assert_eq 1 "$((up0 >= STEPS * wire * (hosts - 1)))" \
    "[$name] host 0's shaped link carried every step's copies out ($up0 bytes)"
  local copies_in=()
  for ((k = 1; k < hosts; k++)); do
    down="$(netns_link_bytes "$k" down)"
    copies_in+=("$(python3 -c "print(f'{$down / ($STEPS * $wire):.2f}')")")
  done

  python3 - "$events" "$name" "$STEPS" "$nrecv" "$WARMUP" "$TOLERANCE" "$hosts" "${per_host[*]}" \
    "$mbit" "$delay" "$up0" "$wire" "${copies_in[*]}" >"$TEST_TMP/verdict.$name" <<'PY'
import json, statistics, sys
events, name, want, nrecv, warmup, tol = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]), float(sys.argv[6])
hosts, per_host, mbit, delay, up0, wire, copies_in = sys.argv[7:14]
steps = [json.loads(l)["step"] for l in open(events) if '"step":{' in l]
shape, timing = [], []
if len(steps) != want:
    shape.append(f"{len(steps)} steps recorded, {want} expected")
for s in steps:
    n = s["step"]
    if not s.get("weights_verified"): shape.append(f"step {n} not verified")
    if s.get("receivers") != nrecv: shape.append(f"step {n}: {s.get('receivers')} receivers, {nrecv} expected")
    if s.get("mode") != "BROADCAST_MODE_HOST": shape.append(f"step {n}: mode {s.get('mode')}")
checked = [s for s in steps if int(s["step"]) >= warmup]
measured, predicted, layouts = [], [], set()
for s in checked:
    m = s.get("total_seconds", 0)
    p = s.get("prediction", {}).get("total_seconds", 0)
    if not p > 0:
        note = s.get("prediction_note") or "none given"
        timing.append(f"step {s['step']}: measured {m:.3f} s, no prediction (note: {note})")
        continue
    measured.append(m)
    predicted.append(p)
    layouts.add(s["prediction"].get("layout") or "?")
    if abs(m / p - 1) > tol:
        timing.append(f"step {s['step']}: measured {m:.3f} s, predicted {p:.3f} s, ratio {m / p:.3f} "
                      f"(allowed {1 - tol:.2f} to {1 + tol:.2f})")
print("; ".join(shape) or "ok")
print("; ".join(timing) or "ok")
med = lambda v: statistics.median(v) if v else float("nan")
mm = med([s.get("total_seconds", 0) for s in checked])
pm = med(predicted)
copies_out = int(up0) / (want * int(wire))
print(f"| {hosts} | {per_host.replace(' ', ' + ')} | {int(mbit)} Mbit/s, {delay} ms | {int(wire) / 1e6:.1f} MB "
      f"| {pm:.3f} s | {mm:.3f} s | {mm / pm:.3f} | {'/'.join(sorted(layouts)) or '-'} "
      f"| {copies_out:.2f} | {copies_in.replace(' ', ', ')} |")
PY
  local verdict
  mapfile -t verdict <"$TEST_TMP/verdict.$name"
  assert_eq ok "${verdict[0]:-no verdict}" \
    "[$name] $STEPS steps, each verified by the $nrecv receivers on the host transport"
  if [[ -n ${RLORCH_SANITIZE:-} ]]; then
    skip "[$name] timing against the prediction: a sanitized build ($RLORCH_SANITIZE) times its instrumentation"
  else
    assert_eq ok "${verdict[1]:-no verdict}" \
      "[$name] every step from step $WARMUP within $TOLERANCE of the prediction"
  fi
  TABLE+=("${verdict[2]:-| $hosts | (no row) |}")

  serve_stop
  netns_teardown
}

TABLE=()
declare -A LOG_OF
case_run 2-hosts 300 1 1
case_run 4-hosts 400 1 1 1 1
case_run 8-hosts 1000 0.5 1 1 1 1 1 1 1
case_run 3-hosts-2+1 400 1 2 1

echo "| hosts | receivers per host | link (each way) | wire bytes | predicted | measured | ratio | layout | copies out of host 0 per step | copies into hosts 1.. per step |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${TABLE[@]}"
finish
