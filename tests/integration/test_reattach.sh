#!/usr/bin/env bash
# A worker the orchestrator declared lost (its heartbeats stopped while the
# process was stopped) registers again when it resumes and re-opens its
# command stream under the new id, so it serves the next run.
source "$(dirname "$0")/lib.sh"
need_cmd python3

RLORCH_HEARTBEAT_INTERVAL_MS=100 RLORCH_WORKER_TIMEOUT_MS=600 serve_start || { finish; exit 1; }
"$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --name inf-a --log-level info \
  >"$TEST_TMP/inference.log" 2>&1 &
inf=$!
track_pid "$inf"

is_one() { [[ "$(live_workers inf-a)" == 1 ]]; }
wait_until 20 is_one
assert_eq 1 "$(live_workers inf-a)" "the agent registers and attaches"

kill -STOP "$inf"
sleep 1.5
kill -CONT "$inf"
lost_and_back() {
  ctl --json list-workers | python3 -c '
import json, sys
ws = [w for w in json.load(sys.stdin).get("workers", []) if w.get("name") == "inf-a"]
lost = sum(1 for w in ws if w.get("state") == "WORKER_STATE_LOST")
ready = sum(1 for w in ws if w.get("state") in ("WORKER_STATE_READY", "WORKER_STATE_BUSY"))
sys.exit(0 if lost >= 1 and ready == 1 else 1)'
}
wait_until 20 lost_and_back
assert_eq 0 "$(lost_and_back && echo 0 || echo 1)" \
  "after the stop it was lost, registered again and is attached under its new id"

# And it serves: a run with it and a trainer succeeds.
"$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --preset 100m --layers 2 --log-level warn \
  >"$TEST_TMP/trainer.log" 2>&1 &
track_pid $!
run="$(ctl --json start-run --steps 1 --rollouts-per-step 2 | json_get id)"
timeout 120 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" watch-run "$run" >/dev/null
assert_eq RUN_STATE_SUCCEEDED "$(ctl --json get-run "$run" | json_get state)" \
  "a run on the re-attached worker succeeds"

finish
