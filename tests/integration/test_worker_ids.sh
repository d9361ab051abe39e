#!/usr/bin/env bash
# Worker ids and the worker table: ids are never handed out twice by the
# daemons of one data_dir (after a restart an old id reaches no new worker,
# it is told it is unknown); a registration flood without a token fills the
# table only while its workers live: once they are lost (and, after
# lost_worker_retention_s, removed) real agents register again.
source "$(dirname "$0")/lib.sh"
need_cmd python3

W=/rlorch.v1.Worker
reg_json() { printf '{"role":"WORKER_ROLE_INFERENCE","name":"%s"}' "$1"; }
register() { grpc_call --method $W/Register --json "$(reg_json "$1")"; }
heartbeat() { grpc_call --method $W/Report --json "{\"worker_id\":\"$1\",\"heartbeat\":{}}"; }
worker_names() {
  ctl --json list-workers | python3 -c '
import json, sys
print(" ".join(sorted(w["name"] for w in json.load(sys.stdin).get("workers", []))))'
}

# ---- ids across a restart ---------------------------------------------------------------
serve_start || { finish; exit 1; }
DATA=$SERVE_DATA_DIR
old_id="$(register before | json_get message.worker_id)"
assert_eq w-1 "$old_id" "the first worker is w-1"
assert_eq true "$(heartbeat "$old_id" | json_get message.known)" "it is known"
serve_stop
serve_start --data-dir "$DATA" || { finish; exit 1; }
new_id="$(register after | json_get message.worker_id)"
assert_eq w-2 "$new_id" "after a restart the next worker is w-2, not w-1 again"
out="$(heartbeat "$old_id")"
assert_status OK "$out" "a heartbeat under the old id is answered"
assert_eq false "$(json_get message.known "$out" || echo false)" "and says the old id is unknown"
out="$(grpc_call --method $W/Attach --json "{\"worker_id\":\"$old_id\"}" --stream --deadline-ms 3000)"
assert_status NOT_FOUND "$out" "an Attach under the old id opens no worker's stream"
serve_stop

# ---- a flood of registrations ----------------------------------------------------------
CAP=10
# The flood's registrations go ten at a time and live (unheard from) for 8 s:
# the table is full for a while, however slowly this machine starts them.
RLORCH_MAX_WORKERS=$CAP RLORCH_LOST_WORKER_RETENTION_S=2 RLORCH_HEARTBEAT_INTERVAL_MS=100 \
  RLORCH_WORKER_TIMEOUT_MS=8000 serve_start || { finish; exit 1; }
export -f register reg_json grpc_call
export NODE_CLIENT GRPC_ADDR W
seq 1 $((3 * CAP)) | xargs -P $CAP -I{} bash -c 'register flood-{} | tail -n 1' \
  >"$TEST_TMP/flood.txt"
refused="$(grep -c RESOURCE_EXHAUSTED "$TEST_TMP/flood.txt")"
assert_eq 1 "$((refused > 0))" "the flood filled the table ($refused of $((3 * CAP)) refused)"
assert_contains "$(grep RESOURCE_EXHAUSTED "$TEST_TMP/flood.txt" | head -n 1)" \
  "too many workers: $CAP are registered and alive (max_workers)" "the refusal names the cap"
"$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --name real-agent --log-level info \
  >"$TEST_TMP/inference.log" 2>&1 &
track_pid $!
has_real() { [[ " $(worker_names) " == *" real-agent "* ]]; }
wait_until 30 has_real
assert_eq 0 "$?" "a real agent registers once the flood is lost"
only_real() { [[ "$(worker_names)" == real-agent ]]; }
wait_until 30 only_real
assert_eq real-agent "$(worker_names)" "the lost flood is removed after lost_worker_retention_s"
assert_contains "$(cat "$SERVE_LOG")" "event=worker_removed" "each removal is logged"
assert_eq 0 "$(metric_value 'rlorch_workers{role="inference",state="lost"}')" \
  "no lost worker is left in the gauge"
live="$(metric_value 'rlorch_workers{role="inference",state="ready"}')"
busy="$(metric_value 'rlorch_workers{role="inference",state="busy"}')"
assert_eq 1 "$((${live%.*} + ${busy%.*}))" "the real agent is the one live worker"
serve_stop

finish
