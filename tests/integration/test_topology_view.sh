#!/usr/bin/env bash
# The run's topology as the orchestrator sees it (Control/GetTopology,
# `rlorch ctl topology`): the live workers grouped into nodes by the function
# that builds every plan's topology. Agents on configured nodes a and b, and
# three workers registered through the Worker API on node c with GPUs (two
# on one GPU) and measured host-to-device rates but no NIC: the exact
# grouping, each node's NICs (c's assumed: rlorch serve's link_nics x
# link_nic_gbits, said in the note), c's GPUs in the model's order, the
# slowest measured rate taken, the link figures as configured; the table and
# --json; an unknown run refused with NOT_FOUND naming it, a bad run id with
# INVALID_ARGUMENT; a lost worker left out; the workers of the active run.
source "$(dirname "$0")/lib.sh"
need_cmd python3
need_cmd node

on_exit "logs_on_failure 40 'serve.*.log' 'agent-*.log'"

C=/rlorch.v1.Control

# register NAME GPU H2D: an inference worker on node c registered through the
# Worker API (no command stream: it stays REGISTERED), GPU bus id GPU, NUMA
# node 1, H2D GB/s measured, no NIC.
register() {
  grpc_call --method /rlorch.v1.Worker/Register --json "{\"role\":\"WORKER_ROLE_INFERENCE\",
    \"name\":\"$1\",\"capabilities\":{\"host_id\":\"boot-c\",\"cuda_devices\":1,
    \"topology\":{\"node\":\"c\",\"numa_node\":1,\"gpu_pci_bus_id\":\"$2\",\"h2d_gbps\":$3}}}"
}

# A worker outside a run is lost after worker_timeout_ms without a heartbeat:
# long enough here for the registered ones to stay live through the checks.
RLORCH_WORKER_TIMEOUT_MS=600000 RLORCH_LINK_NICS=4 RLORCH_LINK_NIC_GBITS=50 \
  RLORCH_LINK_H2D_GBPS=12 serve_start || finish

# ---- no worker: no node, the configured links --------------------------------------------
out="$(grpc_call --method $C/GetTopology --json '{}')"
assert_status OK "$out" "GetTopology without workers"
assert_eq '[]' "$(json_get message.nodes "$out")" "no worker: no node"
assert_eq 4 "$(json_get message.links.nics "$out")" "links.nics is link_nics"
assert_eq 50 "$(json_get message.links.nic_gbits "$out")" "links.nic_gbits is link_nic_gbits"
assert_eq 12 "$(json_get message.h2d_gbps "$out")" "no measured rate: link_h2d_gbps"
assert_eq false "$(json_get message.h2d_measured "$out")" "and it says none was measured"

# One at a time, so that the nodes come in a known order (the first
# registration of each).
start_agent trainer tv-trainer --layers 1 --node a --nics 2 --nic-gbits 100
wait_until 60 live_count_is 1
start_agent inference tv-a --node a --nics 1 --nic-gbits 10
wait_until 60 live_count_is 2
start_agent inference tv-b1 --node b --nics 1 --nic-gbits 400
wait_until 60 live_count_is 3
start_agent inference tv-b2 --node b --nics 1 --nic-gbits 400
wait_until 60 live_count_is 4
assert_eq 0 "$?" "the four agents attach"
for w in "c1 0000:3b:00.0 30" "c2 0000:3b:00.0 20" "c3 0000:5e:00.0 25"; do
  read -r name gpu h2d <<<"$w"
  assert_status OK "$(register "$name" "$gpu" "$h2d")" "$name registers on node c"
done

# ---- the grouping, exactly ---------------------------------------------------------------
out="$(grpc_call --method $C/GetTopology --json '{}')"
assert_status OK "$out" "GetTopology of every live worker"
check="$(json_get message "$out" | python3 -c '
import json, sys
t = json.load(sys.stdin)
def node(n):
    ws = [(w["name"], w["role"], w["host"], w.get("gpu_pci_bus_id", ""), w["gpu"], w["numa_node"],
           w["h2d_gbps"]) for w in n["workers"]]
    return (n["name"], n["nics"], n["nic_gbits"], n["nics_assumed"], n["gpus"], ws)
for n in t["nodes"]:
    print(node(n))
print("h2d", t["h2d_gbps"], t["h2d_measured"])
print("note", t["note"])
print("ids", len({w["id"] for n in t["nodes"] for w in n["workers"]}))
')"
want="('a', 2, 100, False, [], [('tv-trainer', 'WORKER_ROLE_TRAINER', True, '', 0, NUMA, 0), ('tv-a', 'WORKER_ROLE_INFERENCE', True, '', 0, NUMA, 0)])
('b', 1, 400, False, [], [('tv-b1', 'WORKER_ROLE_INFERENCE', True, '', 0, NUMA, 0), ('tv-b2', 'WORKER_ROLE_INFERENCE', True, '', 0, NUMA, 0)])
('c', 4, 50, True, ['0000:3b:00.0', '0000:5e:00.0'], [('c1', 'WORKER_ROLE_INFERENCE', False, '0000:3b:00.0', 0, 1, 30), ('c2', 'WORKER_ROLE_INFERENCE', False, '0000:3b:00.0', 0, 1, 20), ('c3', 'WORKER_ROLE_INFERENCE', False, '0000:5e:00.0', 1, 1, 25)])
h2d 20 True
note node c reports no NIC speed: 4 x 50 Gb/s assumed; node c: MTU unknown, 1500 assumed
ids 7"
# The agents' NUMA node is this machine's (or -1): taken from what they reported.
numa="$(ctl --json list-workers | python3 -c '
import json, sys
print(sorted({w["capabilities"]["topology"]["numa_node"] for w in json.load(sys.stdin)["workers"]
              if w["name"].startswith("tv-")}))')"
assert_eq 1 "$(python3 -c 'import sys; print(len(eval(sys.argv[1])))' "$numa")" \
  "the four agents report one NUMA node: $numa"
want="${want//NUMA/$(python3 -c 'import sys; print(eval(sys.argv[1])[0])' "$numa")}"
assert_eq "$want" "$check" \
  "nodes a, b, c in registration order: a's NICs the best reported (2x100G), c's assumed, its GPUs once each, workers on one GPU sharing it, the slowest measured h2d"

# ---- the table, and --json ---------------------------------------------------------------
table="$(ctl topology)"
assert_eq 0 "$?" "ctl topology exits 0"
assert_eq "NODE NICS WORKERS GPUS" "$(head -n 1 <<<"$table" | xargs)" "the table's header"
assert_eq "a 2x100G 2 0|b 1x400G 2 0|c 4x50G(assumed) 3 2" \
  "$(grep -E '^[a-c] ' <<<"$table" | awk '{print $1, $2, $3, $4}' | paste -sd '|')" \
  "a row per node: NODE, NICS, WORKERS, GPUS"
assert_eq "c1 gpu0 0000:3b:00.0 1 30.0|c2 gpu0 0000:3b:00.0 1 20.0|c3 gpu1 0000:5e:00.0 1 25.0" \
  "$(sed -n '/^c /,/^[^ ]/p' <<<"$table" | grep '^  w-' | awk '{print $3, $4, $5, $6, $7}' | paste -sd '|')" \
  "c's workers under it: their GPU places, bus ids, NUMA node and measured h2d"
assert_eq "tv-trainer trainer host" "$(grep ' tv-trainer ' <<<"$table" | awk '{print $3, $2, $4}')" \
  "a worker without a GPU is a host place"
assert_contains "$table" "h2d: 20 GB/s, the slowest a worker measured" "the table says the h2d taken"
assert_contains "$table" "a node without a NIC speed: 4 x 50 Gb/s" "and the NICs assumed where none is reported"
assert_contains "$table" "note: node c reports no NIC speed: 4 x 50 Gb/s assumed" "and the note"
json="$(ctl --json topology)"
assert_eq "$(json_get message "$out" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin), sort_keys=True))')" \
  "$(python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1]), sort_keys=True))' "$json")" \
  "ctl --json topology prints the response"

# ---- bad runs ------------------------------------------------------------------------------
out="$(grpc_call --method $C/GetTopology --json '{"run_id":"run-nope"}')"
assert_status_details NOT_FOUND "run 'run-nope' not found" "$out" "GetTopology of an unknown run: NOT_FOUND"
out="$(grpc_call --method $C/GetTopology --json "{\"run_id\":\"$(printf 'r%.0s' {1..64})\"}")"
assert_status_details INVALID_ARGUMENT "run_id: longer than 63 bytes" "$out" \
  "GetTopology of a too long run id: INVALID_ARGUMENT"
assert_exit 1 ctl topology --run run-nope
assert_contains "$LAST_OUTPUT" "GetTopology: NOT_FOUND: run 'run-nope' not found" "ctl topology --run of an unknown run"
serve_stop

# ---- a lost worker is left out; a run's workers ---------------------------------------------
RLORCH_WORKER_TIMEOUT_MS=3000 RLORCH_LINK_H2D_GBPS=12 serve_start || finish
assert_status OK "$(register gone 0000:3b:00.0 20)" "a worker registers and sends no heartbeat"
lost() { [[ "$(ctl --json list-workers | json_get workers.0.state)" == WORKER_STATE_LOST ]]; }
wait_until 30 lost
assert_eq 0 "$?" "it is lost after worker_timeout_ms"
out="$(grpc_call --method $C/GetTopology --json '{}')"
assert_eq '[]' "$(json_get message.nodes "$out")" "a lost worker is on no node"
assert_eq 12 "$(json_get message.h2d_gbps "$out")" "nor is its measured rate taken"

# nodes_of JSON: "node:worker,worker node:worker" of a GetTopology response.
nodes_of() {
  json_get message "$1" | python3 -c '
import json, sys
t = json.load(sys.stdin)
print(" ".join(n["name"] + ":" + ",".join(w["name"] for w in n["workers"]) for n in t["nodes"]))'
}
start_agent trainer tv-run-t --layers 1 --node a --nics 1 --nic-gbits 100
wait_until 60 live_count_is 1
start_agent inference tv-run-i --node b --nics 1 --nic-gbits 100
wait_until 60 live_count_is 2
run="$(ctl --json start-run --name tv --preset 100m --steps 0 --rollouts-per-step 2 | json_get id)"
in_run() { [[ "$(ctl --json list-workers --run "$run" | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("workers", [])))')" == 2 ]]; }
wait_until 60 in_run
assert_eq 0 "$?" "both agents join run $run"
out="$(grpc_call --method $C/GetTopology --json "{\"run_id\":\"$run\"}")"
assert_status OK "$out" "GetTopology of the active run"
assert_eq "a:tv-run-t b:tv-run-i" "$(nodes_of "$out")" "the run's workers on their nodes, the lost one not among them"
ctl stop-run "$run" >/dev/null
serve_stop

finish
