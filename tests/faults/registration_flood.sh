#!/usr/bin/env bash
# 4,200 registrations without a token and without a run (tests/faults/flood.js),
# more than the worker table holds (max_workers, 4,096 by default); none of
# them ever sends a heartbeat. The table fills (the excess is refused with
# RESOURCE_EXHAUSTED naming the cap) only while they live: once they are
# lost, real agents register, attach and run a run, and the lost
# registrations are removed after lost_worker_retention_s. Detected: from
# the flood's first call to the daemon's loss of the last of its workers.
source "$(dirname "$0")/lib.sh"
need_cmd node || { finish; exit 1; }

N=4200
STEPS=5
# Alive for 10 s unheard from: the table stays full however slowly the
# flood arrives; removed 2 s after they are lost.
RLORCH_WORKER_TIMEOUT_MS=10000 RLORCH_LOST_WORKER_RETENTION_S=2 serve_start || { finish; exit 1; }
t_fault="$(now)"
out="$(timeout 120 node "$(dirname "$0")/flood.js" "$GRPC_ADDR" $N 64)"
echo "# flood: $out"
ok="$(json_get codes.OK "$out")"
refused="$(json_get codes.RESOURCE_EXHAUSTED "$out")"
assert_eq 4096 "$ok" "the table took max_workers (4096) registrations"
assert_eq $((N - 4096)) "${refused:-0}" "the rest were refused"
assert_contains "$(json_get first_refusal "$out")" "too many workers: 4096 are registered and alive (max_workers)" \
  "the refusal names the cap"

recovered=yes
# Real agents, started while the table is full: they are refused and retry.
start_agents 1
assert_contains "$(cat "$TEST_TMP/trainer.log" "$TEST_TMP/inference.0.log")" "RESOURCE_EXHAUSTED" \
  "the agents were refused while the flood lived" || recovered=no
# They registered once the live workers fell below the cap; the rest of the
# flood is lost soon after.
__flood_lost() { [[ "$(grep -c " event=worker_lost .*name=flood-" "$SERVE_LOG")" == 4096 ]]; }
wait_until 30 __flood_lost
assert_eq 4096 "$(grep -c " event=worker_lost .*name=flood-" "$SERVE_LOG")" "every flood registration is lost" ||
  recovered=no
lost_at="$(log_time_last "$SERVE_LOG" " event=worker_lost .*name=flood-")"
start_run $STEPS
wait_run_end 120
res="$(ctl --json get-run "$RUN")"
assert_eq RUN_STATE_SUCCEEDED "$(json_get state "$res")" "a run on the real agents succeeds: $(json_get message "$res")" ||
  recovered=no
flood_listed() { ctl --json list-workers | grep -o '"name":"flood-' | wc -l; }
__only_real() { [[ "$(flood_listed)" == 0 ]]; }
wait_until 30 __only_real
assert_eq 0 "$(flood_listed)" "the lost flood is removed from the table" || recovered=no
assert_eq 4096 "$(grep -c " event=worker_removed .*name=flood-" "$SERVE_LOG")" "each removal is logged" ||
  recovered=no
reg_at="$(log_time "$SERVE_LOG" " event=worker_registered .*name=inference-0 ")"
rss_kb="$(ps -o rss= -p "$SERVE_PID" | tr -d ' ')"
back="$(log_time "$SERVE_LOG" " event=step run=$RUN ")"
read -r lost dup <<<"$(step_audit $STEPS)"
fault_row "4,200 registrations, no run" "$(elapsed "$t_fault" "$lost_at")" "$recovered" "$lost" "$dup" \
  "$(elapsed "$t_fault" "$back")" "$ok taken, ${refused:-0} refused (cap 4096); agents refused while it lived, registered $(elapsed "$t_fault" "$reg_at") s after it began; daemon RSS $((rss_kb / 1024)) MB"
