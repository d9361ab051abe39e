#!/usr/bin/env bash
# Manifests are checked at Register and in step reports, by the rules of the
# broadcast engine and the limits of the configuration (max_manifest_tensors,
# max_tensor_bytes, max_manifest_bytes): every refusal is INVALID_ARGUMENT
# naming the field, the tensor and the rule, and nothing is registered. A
# manifest of 10^6 tensors is refused for its count before it is decoded,
# without the daemon's memory growing; with the limits raised it is handled
# in bounded time and memory, and a duplicate name at its very end is found.
# The figures (Register latency, the daemon's RSS, the longest /healthz wait
# while the call ran) are printed.
source "$(dirname "$0")/lib.sh"

need_cmd node || finish
need_cmd curl || finish
W=/rlorch.v1.Worker
# Under the sanitizers everything is several times slower, and freed memory
# waits in ASan's quarantine (256 MiB) before it is reused or returned: the
# time bounds are ten times wider and the memory figures only printed.
SLOW=1
MEMORY_CHECKED=1
if [[ "$("$RLORCH_BIN" version | head -n 1)" == *sanitize=* ]]; then
  SLOW=10
  MEMORY_CHECKED=0
fi

# memory_bound OK WHAT: asserts OK (1 or 0) where memory figures are checked.
memory_bound() {
  if ((MEMORY_CHECKED)); then assert_eq 1 "$1" "$2"; else skip "$2 (sanitizer build: printed only)"; fi
}

# ---- helpers -------------------------------------------------------------------------

# encode_register FILE N [DUP]: a RegisterRequest of a trainer whose manifest
# has N tensors (fp32 stored, bf16 on the wire, 64x64, host memory), written
# in protobuf's encoding (worker.proto and broadcast.proto field numbers);
# with DUP the last tensor takes the first one's name.
encode_register() {
  python3 - "$@" <<'EOF'
import sys

def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7f
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)

def ld(field, payload):  # a length-delimited field
    return varint(field << 3 | 2) + varint(len(payload)) + payload

def vi(field, v):  # a varint field
    return varint(field << 3) + varint(v)

path, n, dup = sys.argv[1], int(sys.argv[2]), len(sys.argv) > 3
# TensorSpec: name 1, layer 2, storage_dtype 3, wire_dtype 4, shape 5 (packed), residency 6
rest = vi(3, 1) + vi(4, 2) + ld(5, varint(64) + varint(64)) + vi(6, 3)
specs = []
for i in range(n):
    name = b"layers.%d.t%d.weight" % (i // 16, i % 16)
    if dup and i == n - 1:
        name = b"layers.0.t0.weight"
    specs.append(ld(1, ld(1, name) + vi(2, i // 16) + rest))  # WeightManifest.tensors = 1
manifest = b"".join(specs)
# RegisterRequest: role 1 (TRAINER = 1), name 2, manifest 4
msg = vi(1, 1) + ld(2, b"big-trainer") + ld(4, manifest)
open(path, "wb").write(msg)
EOF
}

# kb FIELD: the daemon's VmRSS or VmHWM in KiB.
kb() { awk -v f="$1:" '$1 == f { print $2 }' "/proc/$SERVE_PID/status"; }

# probe_start: GET /healthz every 10 ms until probe_stop, which tells the
# longest answer in ms (how long the event loop stalled at most meanwhile).
probe_start() {
  rm -f "$TEST_TMP/probe.stop" "$TEST_TMP/probe.max"
  python3 - "$METRICS_ADDR" "$TEST_TMP/probe.stop" "$TEST_TMP/probe.max" <<'EOF' &
import http.client, os, sys, time
host, port = sys.argv[1].rsplit(":", 1)
worst, failed = 0.0, 0
while not os.path.exists(sys.argv[2]):
    t0 = time.monotonic()
    try:
        c = http.client.HTTPConnection(host, int(port), timeout=30)
        c.request("GET", "/healthz")
        ok = c.getresponse().status == 200
        c.close()
    except OSError:
        ok = False
    failed += not ok
    worst = max(worst, (time.monotonic() - t0) * 1e3)
    time.sleep(0.01)
open(sys.argv[3], "w").write("%.0f %d\n" % (worst, failed))
EOF
  PROBE_PID=$!
  track_pid "$PROBE_PID"
  sleep 0.3
}
# Sets STALL and PROBE_FAILED; runs in the test's shell (the one that can wait).
probe_stop() {
  touch "$TEST_TMP/probe.stop"
  wait "$PROBE_PID" 2>/dev/null
  read -r STALL PROBE_FAILED <"$TEST_TMP/probe.max" || { STALL="?"; PROBE_FAILED="?"; }
}

# big_register FILE WHAT: Register with FILE while the prober runs; sets OUT,
# MS (the call's latency), RSS0/RSS1 (KiB before and after), HWM1 (the peak
# after) and STALL (the longest /healthz answer meanwhile, ms); prints them.
big_register() {
  RSS0=$(kb VmRSS)
  probe_start
  OUT="$(grpc_call --method $W/Register --raw-file "$1" --timing --deadline-ms 120000)"
  probe_stop
  RSS1=$(kb VmRSS)
  HWM1=$(kb VmHWM)
  MS="$(json_get elapsed_ms "$OUT" | cut -d. -f1)"
  printf '# %s: Register %s ms, RSS %d -> %d MiB (peak %d MiB), longest /healthz %s ms (%s failed)\n' \
    "$2" "$MS" $((RSS0 / 1024)) $((RSS1 / 1024)) $((HWM1 / 1024)) "$STALL" "$PROBE_FAILED"
}

register() { # JSON: Register with a JSON request
  grpc_call --method $W/Register --json "$1"
}

bad_manifest() { # JSON-OF-TENSORS MESSAGE
  local o
  o="$(register "{\"role\":\"WORKER_ROLE_TRAINER\",\"name\":\"t\",\"manifest\":{\"tensors\":$1}}")"
  assert_status_details INVALID_ARGUMENT "$2" "$o" "Register refused: $2"
}

# A tensor: NAME [STORAGE WIRE SHAPE RESIDENCY]
tj() { printf '{"name":"%s","storage_dtype":%s,"wire_dtype":%s,"shape":%s,"residency":%s}' \
  "$1" "${2:-1}" "${3:-2}" "${4:-[4,4]}" "${5:-3}"; }

# ---- every rule at Register ------------------------------------------------------------

RLORCH_MAX_MESSAGE_BYTES=128MiB serve_start || finish

bad_manifest "[$(tj a),$(tj b "" "" "[4,0]")]" "manifest: tensor #1 'b': shape[1]: 0, every dimension is at least 1"
bad_manifest "[$(tj a),$(tj b),$(tj a)]" "manifest: tensors #0 and #2: duplicate name 'a'"
bad_manifest "[$(tj a 99)]" "manifest: tensor #0 'a': storage_dtype: unknown value 99"
bad_manifest "[$(tj a 1 99)]" "manifest: tensor #0 'a': wire_dtype: unknown value 99"
bad_manifest "[$(tj a 2 1)]" "manifest: tensor #0 'a': wire_dtype: no cast from bf16 to fp32"
bad_manifest "[$(tj a 1 2 '[4]' 9)]" "manifest: tensor #0 'a': residency: unknown value 9"
bad_manifest "[$(tj a),$(tj '')]" "manifest: tensor #1: name: empty"
long="$(printf 'n%.0s' {1..130})"
bad_manifest "[$(tj "$long")]" "manifest: tensor #0 'nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn...': name: 130 bytes, longer than 127"
bad_manifest "[$(tj 'a\u0001b')]" "manifest: tensor #0: name: control character 0x01 at byte 1"
bad_manifest "[$(tj a 1 2 '[1,1,1,1,1,1,1,1,1]')]" "manifest: tensor #0 'a': shape: 9 dimensions, want 1..8"
bad_manifest "[$(tj a 1 2 '[]')]" "manifest: tensor #0 'a': shape: 0 dimensions, want 1..8"
bad_manifest "[$(tj a 1 2 '["4294967296","4294967296"]')]" \
  "manifest: tensor #0 'a': shape: the element count overflows 64 bits"
bad_manifest "[$(tj a 1 2 '["4611686018427387904"]')]" \
  "manifest: tensor #0 'a': size: 4611686018427387904 elements of 4 bytes overflow 64 bits"
# 2^38 fp32 elements are 2^40 bytes: the largest tensor by default; one more element is over.
bad_manifest "[$(tj a 1 2 '["274877906945"]')]" \
  "manifest: tensor #0 'a': size: 1099511627780 bytes is over the limit of 1099511627776 (max_tensor_bytes)"
seventeen="$(for i in $(seq 0 16); do printf '%s,' "$(tj "t$i" 1 2 '["274877906944"]')"; done)"
bad_manifest "[${seventeen%,}]" \
  "manifest: the tensors' sizes summed pass the limit of 17592186044416 bytes (max_manifest_bytes) at tensor #16 't16'"
out="$(register '{"role":"WORKER_ROLE_TRAINER","name":"t","manifest":{"preset":"100m","offload":7,"tensors":[]}}')"
assert_status_details INVALID_ARGUMENT "manifest: a trainer must send one" "$out" "a trainer without tensors is refused"
out="$(register "{\"role\":\"WORKER_ROLE_TRAINER\",\"name\":\"t\",\"manifest\":{\"offload\":7,\"tensors\":[$(tj a)]}}")"
assert_status_details INVALID_ARGUMENT "manifest: offload: unknown value 7" "$out" "an unknown offload is refused"
# An inference worker's manifest, when it sends one, follows the same rules.
out="$(register "{\"role\":\"WORKER_ROLE_INFERENCE\",\"name\":\"i\",\"manifest\":{\"tensors\":[$(tj a),$(tj a)]}}")"
assert_status_details INVALID_ARGUMENT "manifest: tensors #0 and #1: duplicate name 'a'" "$out" \
  "an inference worker's manifest is checked too"
out="$(grpc_call --method /rlorch.v1.Control/ListWorkers --json '{}')"
assert_eq '[]' "$(json_get message.workers "$out")" "no refused registration left a worker behind"

# A good trainer, then a step report whose manifest breaks a rule: the report is refused whole.
out="$(register "{\"role\":\"WORKER_ROLE_TRAINER\",\"name\":\"t\",\"manifest\":{\"tensors\":[$(tj a),$(tj b)]}}")"
assert_status OK "$out" "a good manifest registers"
TRAINER="$(json_get message.worker_id "$out")"
out="$(grpc_call --method $W/Report --json "{\"worker_id\":\"$TRAINER\",\"step_done\":{\"step\":0,\"manifest\":{\"tensors\":[$(tj a),$(tj b 1 2 '[0]')]}}}")"
assert_status_details INVALID_ARGUMENT "step_done.manifest: tensor #1 'b': shape[0]: 0, every dimension is at least 1" \
  "$out" "a step report's manifest is checked"
out="$(grpc_call --method /rlorch.v1.Control/ListWorkers --json '{}')"
assert_eq 0 "$(json_get message.workers.0.policy_version "$out")" "the refused step report changed nothing"

# The encoder below writes what the schema says: a small manifest of it
# registers, and one with a duplicate name is refused naming both tensors.
encode_register "$TEST_TMP/small.bin" 40 dup
out="$(grpc_call --method $W/Register --raw-file "$TEST_TMP/small.bin")"
assert_status_details INVALID_ARGUMENT "manifest: tensors #0 and #39: duplicate name 'layers.0.t0.weight'" "$out" \
  "the encoded request's tensors are read as the schema says"

# ---- 10^6 tensors: refused for the count, before decoding -----------------------------------

N=1000000
encode_register "$TEST_TMP/big.bin" $N
encode_register "$TEST_TMP/big-dup.bin" $N dup
MSG_KB=$(( $(stat -c %s "$TEST_TMP/big.bin") / 1024 ))
echo "# a RegisterRequest of $N tensors is $((MSG_KB / 1024)) MiB"
big_register "$TEST_TMP/big.bin" "10^6 tensors, default limits"
assert_status_details INVALID_ARGUMENT "manifest: 1000000 tensors is over the limit of 131072 (max_manifest_tensors)" \
  "$OUT" "a manifest of 10^6 tensors is refused for its count"
# Refused for the price of reading the message: its bytes are held (by gRPC,
# then as one buffer) and nothing is decoded. The kernel's and gRPC's own
# buffers make the peak a few times the message; what remains after is near
# nothing.
assert_eq 1 $((MS < 5000 * SLOW)) "refused within $((5 * SLOW)) s ($MS ms)"
memory_bound $((RSS1 - RSS0 < 32 * 1024)) "the daemon's RSS did not grow (by $(((RSS1 - RSS0) / 1024)) MiB)"
memory_bound $((HWM1 - RSS0 < 4 * MSG_KB + 32 * 1024)) \
  "its peak stayed within a few times the message ($(((HWM1 - RSS0) / 1024)) MiB over the start)"
assert_eq 0 "$PROBE_FAILED" "/healthz answered throughout"
serve_stop

# ---- 10^6 tensors with the limits raised: bounded time and memory --------------------------

RLORCH_MAX_MESSAGE_BYTES=128MiB RLORCH_MAX_MANIFEST_TENSORS=1048576 serve_start || finish
big_register "$TEST_TMP/big-dup.bin" "10^6 tensors, a duplicate name at the end"
assert_status_details INVALID_ARGUMENT \
  "manifest: tensors #0 and #999999: duplicate name 'layers.0.t0.weight'" "$OUT" \
  "the duplicate at the end of 10^6 tensors is found"
assert_eq 1 $((MS < 10000 * SLOW)) "found within $((10 * SLOW)) s ($MS ms)"
big_register "$TEST_TMP/big.bin" "10^6 tensors, limits raised"
assert_status OK "$OUT" "a manifest of 10^6 tensors registers with the limits raised"
assert_eq 1 $((MS < 10000 * SLOW)) "registered within $((10 * SLOW)) s ($MS ms)"
# The decoded manifest is kept as it was decoded (a tree of 10^6 specs, about
# 100 bytes a tensor), not copied: anything near the 1 GB the daemon once
# took is a regression.
memory_bound $((HWM1 < 400 * 1024)) "the daemon's peak RSS stayed under 400 MiB ($((HWM1 / 1024)) MiB)"
assert_eq 0 "$PROBE_FAILED" "/healthz answered throughout"
out="$(grpc_call --method /rlorch.v1.Control/ListWorkers --json '{}' --timing)"
assert_eq big-trainer "$(json_get message.workers.0.name "$out")" "the big trainer is listed"
assert_eq 1 "$(($(json_get elapsed_ms "$out" | cut -d. -f1) < 2000 * SLOW))" "and the daemon answers promptly after"
serve_stop

# ---- the count limit, at Register and in step reports ----------------------------------------

RLORCH_MAX_MANIFEST_TENSORS=2 serve_start || finish
out="$(register "{\"role\":\"WORKER_ROLE_TRAINER\",\"name\":\"t\",\"manifest\":{\"tensors\":[$(tj a),$(tj b),$(tj c)]}}")"
assert_status_details INVALID_ARGUMENT "manifest: 3 tensors is over the limit of 2 (max_manifest_tensors)" "$out" \
  "Register over a lowered max_manifest_tensors"
out="$(register "{\"role\":\"WORKER_ROLE_TRAINER\",\"name\":\"t\",\"manifest\":{\"tensors\":[$(tj a),$(tj b)]}}")"
assert_status OK "$out" "Register at max_manifest_tensors"
TRAINER="$(json_get message.worker_id "$out")"
out="$(grpc_call --method $W/Report --json "{\"worker_id\":\"$TRAINER\",\"step_done\":{\"step\":0,\"manifest\":{\"tensors\":[$(tj a),$(tj b),$(tj c)]}}}")"
assert_status_details INVALID_ARGUMENT "step_done.manifest: 3 tensors is over the limit of 2 (max_manifest_tensors)" \
  "$out" "a step report over max_manifest_tensors"
serve_stop

finish
