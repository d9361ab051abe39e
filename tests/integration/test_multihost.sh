#!/usr/bin/env bash
# Multi-host runs on one machine, measured against the orchestrator's
# prediction. Each "host" is a network namespace with its own address, joined
# to a bridge in the root namespace by a veth pair shaped with tc in both
# directions (lib.sh, "hosts in network namespaces"): host 0 runs the trainer
# (host transport, listening on its own address), hosts 1..N-1 one or two
# inference workers (each listening on its host's address, so that it may
# relay), the daemon listens on the bridge's address. Every worker
# is told its place (--node, --nics, --nic-gbits: its link's shaped rate), so
# the orchestrator's cost model predicts every plan on the topology the
# workers reported; each step's record carries that prediction beside the
# measured time; a case's median step must be within 10% of it and every
# step within 20%, whatever layout
# the orchestrator chose (engine, or relays where two receivers share a
# host). Cases: 2 hosts, 4 hosts, 8 hosts with one receiver each, and 3 hosts
# with two receivers on host 1.
#
# The model is small (the 100m preset cut to 1 layer: 62 MB on the wire) and
# the links slow enough that a step's broadcast takes 2.5 to 7 s: the CPU's
# share of a step (the first bucket's cast, connections, the final ack, about
# 0.1 s, twice that when the two cores are busy elsewhere) stays a few
# percent, and the network, not the cores, sets the time. The whole test
# takes under two minutes. It prints a table, one row per case, with the
# busiest link's own time (its tbf's byte count over its rate) beside the
# measured time (docs/BENCHMARKS.md, "Multi-host runs in network namespaces").
# Needs root (namespaces, veth pairs, tc); exits 77 (skipped) otherwise.
source "$(dirname "$0")/lib.sh"
((EUID == 0)) || skip_all "needs root: network namespaces, veth pairs and tc qdiscs"
for c in ip tc flock python3; do need_cmd "$c" || finish; done

on_exit agent_logs_on_failure 40

LAYERS=1
STEPS=4
# A case's median step within TOLERANCE of the prediction, and every step,
# the first one too, within STEP_TOLERANCE: each plan opens fresh TCP
# connections, so the first step is no colder than the others, but on 2
# shared cores a single step of a relay (4 processes' CPU on the relay's
# host) was seen at 1.12 in a run whose median held at 1.05.
TOLERANCE=0.10
STEP_TOLERANCE=0.20
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

# case_run NAME DELAY_MS MBIT0 MBIT RECEIVERS...: host 0's link at MBIT0
# Mbit/s, every other host's at MBIT, DELAY_MS each way on every link;
# RECEIVERS[k-1] inference workers on host k; a run of STEPS steps; every
# check of the case, then its table row.
case_run() {
  local name=$1 delay=$2 mbit0=$3 mbit=$4
  shift 4
  local per_host=("$@") hosts=$(($# + 1)) nrecv=0 k i run out params wire bound events pids
  for i in "${per_host[@]}"; do nrecv=$((nrecv + i)); done

  netns_teardown # what an earlier case left when it failed half-way
  netns_net_create || return 1
  netns_host_add 0 "$mbit0" "$delay" || return 1
  for ((k = 1; k < hosts; k++)); do
    netns_host_add "$k" "$mbit" "$delay" || return 1
  done
  if [[ $delay != 0 && $NETNS_NETEM != 1 ]]; then
    skip "[$name] this kernel has no netem qdisc: the links add no latency (${delay} ms asked)"
    delay=0
  fi
  # A tc tbf counts a frame's Ethernet header (14 bytes), not the wire's
  # preamble, FCS and gap: the links' framing as the cost model takes it.
  # No broadcast_gbps_host for the slow links: a plan's bounds and floor
  # follow its prediction where that is the slower (docs/ARCHITECTURE.md,
  # "Bounded waits").
  SERVE_HOST=$NETNS_GW RLORCH_LINK_NIC_FRAME_BYTES=14 serve_start || return 1

  ip netns exec "$(netns_name 0)" "$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --name "$name-trainer" \
    --node host0 --nics 1 --nic-gbits "$(python3 -c "print($mbit0 / 1000)")" --preset 100m \
    --layers "$LAYERS" --device -1 --threads 1 --data-listen "$(netns_addr 0):0" --log-level info \
    >"$TEST_TMP/trainer.$name.log" 2>&1 &
  track_pid $!
  pids=($!)
  LOG_OF[$!]="$TEST_TMP/trainer.$name.log"
  for ((k = 1; k < hosts; k++)); do
    for ((i = 0; i < per_host[k - 1]; i++)); do
      ip netns exec "$(netns_name "$k")" "$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" \
        --name "$name-h$k-$i" --node "host$k" --nics 1 --nic-gbits "$(python3 -c "print($mbit / 1000)")" \
        --data-listen "$(netns_addr "$k"):0" --device -1 --log-level info \
        >"$TEST_TMP/inference.$name.h$k.$i.log" 2>&1 &
      track_pid $!
      pids+=($!)
      LOG_OF[$!]="$TEST_TMP/inference.$name.h$k.$i.log"
    done
  done
  out="$(attach_wait 60 $((nrecv + 1)) "${pids[@]}")"
  assert_eq ok "$out" "[$name] the trainer and $nrecv inference workers on $hosts hosts attach" || return 1

  params="$(grep -oE 'event=trainer_ready .* params=[0-9]+' "$TEST_TMP/trainer.$name.log" | grep -oE '[0-9]+$')"
  [[ -n $params ]] || { fail "[$name] the trainer's log gives no parameter count"; return 1; }
  wire=$((params * 2)) # bf16 on the wire
  # Every receiver's copy through the slowest link, four times over, plus a minute.
  bound="$(python3 -c "print(int(60 + $STEPS * 4 * $wire * $nrecv * 8 / (min($mbit0, $mbit) * 1e6)))")"
  run="$(ctl --json start-run --name "$name" --preset 100m --steps "$STEPS" --rollouts-per-step 4 \
    --max-async-level 1 | json_get id)"
  assert_ne "" "$run" "[$name] the run starts" || return 1
  events="$TEST_TMP/events.$name"
  # In the background, so that a SIGTERM to the test (a timeout) cleans up
  # at once: bash runs its traps only once a foreground command ends.
  timeout "$bound" "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --json watch-run "$run" >"$events" &
  track_pid $!
  wait $!
  assert_eq 0 "$?" "[$name] the run ends within ${bound} s"
  out="$(ctl --json get-run "$run")"
  assert_eq RUN_STATE_SUCCEEDED "$(json_get state "$out")" "[$name] the run succeeds: $(json_get message "$out")"

  # What each shaped link carried (its tbf's byte count): in copies of the
  # model per step, the layout that ran; over the link's rate, the least time
  # the network allowed, the baseline the table sets beside the measured time.
  local up0 down=()
  up0="$(netns_link_bytes 0 up)"
  for ((k = 1; k < hosts; k++)); do down+=("$(netns_link_bytes "$k" down)"); done

  python3 - "$events" name="$name" steps="$STEPS" receivers="$nrecv" warmup="$WARMUP" tol="$TOLERANCE" step_tol="$STEP_TOLERANCE" \
    hosts="$hosts" per_host="${per_host[*]}" mbit0="$mbit0" mbit="$mbit" delay="$delay" wire="$wire" \
    up0="$up0" down="${down[*]}" >"$TEST_TMP/verdict.$name" <<'PY'
import json, statistics, sys
a = dict(kv.split("=", 1) for kv in sys.argv[2:])
want, nrecv, warmup, tol = int(a["steps"]), int(a["receivers"]), int(a["warmup"]), float(a["tol"])
step_tol = float(a["step_tol"])
wire = int(a["wire"])
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"step":{' in l]
shape, timing = [], []
if len(steps) != want:
    shape.append(f"{len(steps)} steps recorded, {want} expected")
for s in steps:
    n = s["step"]
    if not s.get("weights_verified"): shape.append(f"step {n} not verified")
    if s.get("receivers") != nrecv: shape.append(f"step {n}: {s.get('receivers')} receivers, {nrecv} expected")
    if s.get("mode") != "BROADCAST_MODE_HOST": shape.append(f"step {n}: mode {s.get('mode')}")
checked = [s for s in steps if int(s["step"]) >= warmup]
predicted, layouts = [], set()
for s in checked:
    m = s.get("total_seconds", 0)
    p = s.get("prediction", {}).get("total_seconds", 0)
    if not p > 0:
        note = s.get("prediction_note") or "none given"
        timing.append(f"step {s['step']}: measured {m:.3f} s, no prediction (note: {note})")
        continue
    predicted.append(p)
    layouts.add(s["prediction"].get("layout") or "?")
    if abs(m / p - 1) > step_tol:
        timing.append(f"step {s['step']}: measured {m:.3f} s, predicted {p:.3f} s, ratio {m / p:.3f} "
                      f"(allowed {1 - step_tol:.2f} to {1 + step_tol:.2f} a step)")
ratios = sorted(s["total_seconds"] / s["prediction"]["total_seconds"] for s in checked
                if s.get("prediction", {}).get("total_seconds", 0) > 0)
if ratios and abs(statistics.median(ratios) - 1) > tol:
    timing.append(f"median ratio {statistics.median(ratios):.3f} over {len(ratios)} steps "
                  f"({', '.join(f'{r:.3f}' for r in ratios)}; allowed {1 - tol:.2f} to {1 + tol:.2f})")
# The layout the records name is the one the links carried: a host with a
# relay takes one copy of the model a step, any other one copy per receiver,
# and host 0 sends what they take (frames and the control traffic add under
# 10%).
up0, down = int(a["up0"]), [int(b) for b in a["down"].split()]
per_host = [int(x) for x in a["per_host"].split()]
relays = any("relays" in l for l in layouts)
carried = []
want_in = [1 if relays and n > 1 else n for n in per_host]
for what, got, copies in [("out of host 0", up0, sum(want_in))] + [
        (f"into host {k + 1}", b, want_in[k]) for k, b in enumerate(down)]:
    if not copies <= got / (want * wire) <= copies * 1.1:
        carried.append(f"{got / (want * wire):.2f} copies a step {what}, {copies} expected "
                       f"in layout {'/'.join(sorted(layouts)) or '?'}")
print("; ".join(shape) or "ok")
print("; ".join(timing) or "ok")
print("; ".join(carried) or "ok")
med = lambda v: statistics.median(v) if v else float("nan")
mm, pm = med([s.get("total_seconds", 0) for s in checked]), med(predicted)
busiest = max([up0 * 8 / (float(a["mbit0"]) * 1e6)] + [b * 8 / (float(a["mbit"]) * 1e6) for b in down]) / want
link = f"{a['mbit0']} Mbit/s" if a["mbit0"] == a["mbit"] else f"host 0: {a['mbit0']}, others {a['mbit']} Mbit/s"
copies = lambda b: f"{b / (want * wire):.2f}"
print(f"| {a['hosts']} | {a['per_host'].replace(' ', ' + ')} | {link}, {a['delay']} ms | {wire / 1e6:.1f} MB "
      f"| {pm:.3f} s | {mm:.3f} s | {mm / pm:.3f} | {'/'.join(sorted(layouts)) or '-'} "
      f"| {busiest:.3f} s | {mm / busiest:.3f} | {copies(up0)} / {', '.join(copies(b) for b in down)} |")
PY
  local verdict
  mapfile -t verdict <"$TEST_TMP/verdict.$name"
  assert_eq ok "${verdict[0]:-no verdict}" \
    "[$name] $STEPS steps, each verified by the $nrecv receivers on the host transport"
  if [[ -n ${RLORCH_SANITIZE:-} ]]; then
    skip "[$name] timing against the prediction: a sanitized build ($RLORCH_SANITIZE) times its instrumentation"
  else
    assert_eq ok "${verdict[1]:-no verdict}" \
      "[$name] the median step within $TOLERANCE of the prediction, every step within $STEP_TOLERANCE"
  fi
  assert_eq ok "${verdict[2]:-no verdict}" "[$name] the links carried the layout the records name"
  TABLE+=("${verdict[3]:-| $hosts | (no row) |}")

  serve_stop
  netns_teardown
}

TABLE=()
declare -A LOG_OF
#        name        delay host 0  others  receivers on hosts 1..N-1
case_run 2-hosts     2     200     200     1
case_run 4-hosts     1     500     500     1 1 1
case_run 8-hosts     0.5   500     500     1 1 1 1 1 1 1
# Two receivers share host 1's slow link: relays (one copy into the host,
# forwarded inside it) halve what the engine layout takes.
case_run 3-hosts-2+1 1     1000    200     2 1

echo "| hosts | receivers per host | links (each way) | wire bytes | predicted | measured | measured / predicted" \
  "| layout | busiest link | measured / busiest link | copies out of host 0 / into hosts 1.. per step |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${TABLE[@]}"
finish
