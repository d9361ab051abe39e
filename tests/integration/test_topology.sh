#!/usr/bin/env bash
# Where workers run, as they report it at registration (Capabilities.topology)
# and `rlorch ctl list-workers` shows it: a trainer started with --node a
# --nics 2 --nic-gbits 100 is on node "a" with exactly two NICs of 100 Gb/s
# and says both were configured; an inference worker with --node b keeps the
# NICs it detected (the loopback never among them) and says only the node was
# configured; one set through the environment (RLORCH_NODE, RLORCH_NIC_GBITS)
# has every detected NIC at that speed; a Python worker (the package's
# node, nics, nic_gbits keywords) reports what it was given. Each prints what
# it uses in one log line at start (without a GPU, no measured host-to-device
# rate: h2d_gbps=-). Bad values are refused before anything
# starts, naming the flag or variable.
source "$(dirname "$0")/lib.sh"
need_cmd python3

on_exit "logs_on_failure 40 'serve.*.log' 'agent-*.log'"

# topo NAME: the topology worker NAME registered, as `ctl --json list-workers` gives it.
topo() {
  ctl --json list-workers | python3 -c '
import json, sys
for w in json.load(sys.stdin).get("workers", []):
    if w["name"] == sys.argv[1]:
        print(json.dumps(w["capabilities"]["topology"], sort_keys=True))' "$1"
}

# field JSON PATH: one field of a topology (json_get, whose strings print raw).
field() { json_get "$2" "$1"; }

serve_start || finish
start_agent trainer topo-trainer --node a --nics 2 --nic-gbits 100
start_agent inference topo-inference --node b
RLORCH_NODE=c RLORCH_NIC_GBITS=40 start_agent inference topo-env
# The Python package on the same library (numpy is all it needs), run by the
# interpreter CMake found (RLORCH_PYTHON), as test_python does.
PY="${RLORCH_PYTHON:-python3}"
workers=3
if "$PY" -c 'import ctypes, numpy' 2>/dev/null; then
  asan_for_python
  PYTHONPATH="$RLORCH_SOURCE_DIR/workers/python" RLORCH_LIBRARY="$RLORCH_BUILD_DIR/lib/librlorch.so.1" \
    "$PY" -c '
import sys, time, rlorch
w = rlorch.Worker("inference", sys.argv[1], name="topo-py", node="py", nics=1, nic_gbits=400)
w.start()
while True:
    time.sleep(1)' "$GRPC_ADDR" >"$TEST_TMP/agent-topo-py.log" 2>&1 &
  track_pid $!
  workers=4
else
  skip "$PY lacks ctypes or numpy: no Python worker"
fi
wait_until 60 live_count_is $workers
assert_eq 0 "$?" "the $workers workers attach"

# ---- the trainer: node and NICs configured --------------------------------------------
t="$(topo topo-trainer)"
assert_eq a "$(field "$t" node)" "the trainer is on node a"
assert_eq '[{"gbits": 100, "name": "nic0", "numa_node": -1, "rdma": false}, {"gbits": 100, "name": "nic1", "numa_node": -1, "rdma": false}]' \
  "$(python3 -c 'import json,sys; print(json.dumps([{k: v for k, v in n.items() if k != "mtu"} for n in json.loads(sys.argv[1])["nics"]], sort_keys=True))' "$t")" \
  "its NICs are exactly nic0 and nic1 of 100 Gb/s"
assert_eq '["node", "nics"]' "$(field "$t" configured)" "it names node and nics as configured"
assert_eq "" "$(field "$t" gpu_pci_bus_id)" "without a GPU it names no PCI bus id"
assert_eq "[]" "$(field "$t" nvlink_peers)" "nor NVLink peers"
numa="$(field "$t" numa_node)"
assert_eq 1 "$((numa >= -1))" "its NUMA node is a node or -1 (unknown): $numa"

# ---- the inference worker: the node configured, the NICs detected ----------------------
i="$(topo topo-inference)"
assert_eq b "$(field "$i" node)" "the inference worker is on node b"
assert_eq '["node"]' "$(field "$i" configured)" "it names only the node as configured"
check="$(python3 - "$i" <<'PY'
import json, os, sys
t = json.loads(sys.argv[1])
bad = []
for n in t["nics"]:
    if n["name"] == "lo": bad.append("the loopback is listed")
    if n["name"].startswith("nic") and n["name"][3:].isdigit(): bad.append(f"{n['name']}: a configured name")
    if not os.path.isdir(f"/sys/class/net/{n['name']}"): bad.append(f"{n['name']}: not an interface here")
    if n["gbits"] < 0: bad.append(f"{n['name']}: {n['gbits']} Gb/s")
    try: mtu = int(open(f"/sys/class/net/{n['name']}/mtu").read())
    except (OSError, ValueError): mtu = 0
    if n.get("mtu", 0) != mtu: bad.append(f"{n['name']}: MTU {n.get('mtu', 0)}, sysfs says {mtu}")
print("; ".join(bad) or "ok")
PY
)"
assert_eq ok "$check" "its NICs are this machine's interfaces with their MTU, the loopback not among them"
mtus="$(python3 -c 'import json,sys; print(sorted({n.get("mtu", 0) for n in json.loads(sys.argv[1])["nics"]}))' "$t")"
want="$(python3 -c 'import json,sys; print([max([n.get("mtu", 0) for n in json.loads(sys.argv[1])["nics"]] or [0])])' "$i")"
assert_eq "$want" "$mtus" "the trainer's configured NICs take the largest MTU of the detected ones"
nics_i="$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])["nics"]))' "$i")"

# ---- the environment: a speed for every detected NIC -----------------------------------
e="$(topo topo-env)"
assert_eq c "$(field "$e" node)" "RLORCH_NODE names the node"
assert_eq '["node", "nics.gbits"]' "$(field "$e" configured)" "the speed alone is named nics.gbits"
speeds="$(python3 -c 'import json,sys; print(sorted({float(n["gbits"]) for n in json.loads(sys.argv[1])["nics"]}))' "$e")"
nics_e="$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])["nics"]))' "$e")"
assert_eq "$nics_i" "$nics_e" "it lists the NICs the other worker of this machine detected"
if ((nics_e > 0)); then
  assert_eq "[40.0]" "$speeds" "every detected NIC is at the 40 Gb/s set"
else
  assert_contains "$(cat "$TEST_TMP/agent-topo-env.log")" "nic_gbits 40: no NIC detected to set it on" \
    "without a detected NIC the speed set is said to apply to none"
fi

# ---- the Python worker: its keywords ----------------------------------------------------
if ((workers == 4)); then
  p="$(topo topo-py)"
  assert_eq py "$(field "$p" node)" "the Python worker is on node py"
  assert_eq '[{"gbits": 400, "name": "nic0", "numa_node": -1, "rdma": false}]' \
    "$(python3 -c 'import json,sys; print(json.dumps([{k: v for k, v in n.items() if k != "mtu"} for n in json.loads(sys.argv[1])["nics"]], sort_keys=True))' "$p")" \
    "its one NIC is of 400 Gb/s"
  assert_eq '["node", "nics"]' "$(field "$p" configured)" "it names node and nics as configured"
fi

# ---- what each says at start, and the table --------------------------------------------
assert_contains "$(grep 'event=topology' "$TEST_TMP/agent-topo-trainer.log")" \
  'node="a" numa_node=' "the trainer logs its topology at start"
assert_contains "$(grep 'event=topology' "$TEST_TMP/agent-topo-trainer.log")" \
  'nics=2x100G nic_list="nic0:100G:numa?,nic1:100G:numa?" configured="node,nics"' \
  "the line names its NICs and what was configured"
assert_contains "$(grep 'event=topology' "$TEST_TMP/agent-topo-trainer.log")" \
  'nvlink_peers=0 h2d_gbps=- mtu=' "without a GPU no host-to-device rate is measured, and the line says so"
assert_eq 0 "$(field "$t" h2d_gbps)" "nor reported"
assert_contains "$(grep 'event=topology' "$TEST_TMP/agent-topo-inference.log")" \
  'node="b"' "the inference worker logs its topology at start"
table="$(ctl list-workers)"
assert_contains "$(head -n 1 <<<"$table")" "NODE             NICS" "the table has NODE and NICS columns"
row="$(grep ' topo-trainer ' <<<"$table")"
assert_eq "a 2x100G" "$(awk '{print $5, $6}' <<<"$row")" "the trainer's row: node a, 2x100G"
row="$(grep ' topo-inference ' <<<"$table")"
assert_eq b "$(awk '{print $5}' <<<"$row")" "the inference worker's row: node b"
serve_stop

# ---- bad values: refused at once, naming the flag ---------------------------------------
# refused ROLE NEEDLE ARGS...: the agent exits 2 within 10 s and its message names NEEDLE.
refused() {
  local role=$1 needle=$2 out rc
  shift 2
  out="$(timeout 10 "$RLORCH_BIN" "$role" --orchestrator 127.0.0.1:1 "$@" 2>&1)"
  rc=$?
  assert_eq 2 "$rc" "rlorch $role $* exits 2" &&
    assert_contains "$out" "$needle" "rlorch $role $*: the message names $needle"
}
refused trainer "rlorch trainer: --nics:" --nics 0 --nic-gbits 100
refused trainer "rlorch trainer: --nics:" --nics 33 --nic-gbits 100
refused trainer "rlorch trainer: --nics: 3 NICs without nic_gbits" --nics 3
refused trainer "rlorch trainer: --nic-gbits:" --nic-gbits 0
refused inference "rlorch inference: --nic-gbits:" --nic-gbits -1
refused inference "rlorch inference: --nic-gbits:" --nic-gbits 20000
refused inference "rlorch inference: --nic-gbits:" --nic-gbits fast
refused inference "rlorch inference: --node:" --node ""
refused trainer "rlorch trainer: --node: 130 bytes, more than 127" --node "$(printf 'n%.0s' {1..130})"
refused inference "rlorch inference: --node:" --node "rack 1"
RLORCH_NICS=2 refused inference "rlorch inference: RLORCH_NICS: 2 NICs without nic_gbits"

finish
