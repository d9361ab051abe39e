#!/usr/bin/env bash
# A stranger at the trainer's data port, mid-run: six connections that never
# send a byte, a hello of the first handshake and three of the current one
# presenting the plan being broadcast (its id and hash, read from the
# trainer's log: the strongest guess there is) with a proof made without the
# plan's secret (tests/faults/stranger.py). Each must get the root's
# challenge and nothing else (no plan id, no hash, no weights), and be
# closed within the handshake's bound; the run must go on at its pace and
# succeed. Detected: the longest any stranger's connection stayed open.
source "$(dirname "$0")/lib.sh"

STEPS=40
serve_start || { finish; exit 1; }
start_agents 2
start_run $STEPS
wait_commits 5 60
assert_eq 0 "$?" "the run commits its first steps"
addr="$(sed -n 's/.* event=trainer_ready .* data_address=\([^ ]*\) .*/\1/p' "$TEST_TMP/trainer.log")"
plan="$(grep " event=plan_acked " "$TEST_TMP/trainer.log" | tail -n 1)"
id="$(sed -n 's/.* plan_id=\([^ ]*\) .*/\1/p' <<<"$plan")"
hash="$(sed -n 's/.* hash=\([0-9a-f]*\).*/\1/p' <<<"$plan")"
assert_ne "" "$addr" "the trainer logs its data address ($addr)"
t_fault="$(now)"
out="$(timeout 90 python3 "$(dirname "$0")/stranger.py" "$addr" "$id" "$hash" 6)"
t_end="$(now)"
echo "# stranger: $out"

recovered=yes
assert_eq false "$(json_get leaked "$out")" "no reply to a stranger holds the plan's id or hash" || recovered=no
assert_eq 40 "$(json_get max_bytes "$out")" "a stranger gets the 40-byte challenge and nothing more" ||
  recovered=no
assert_eq false "$(json_get bad_challenge "$out")" "every connection got a protocol-2 challenge" ||
  recovered=no
assert_eq true "$(json_get all_closed "$out")" "the root closed every stranger's connection" || recovered=no
open_s="$(json_get max_open_s "$out")"
# The handshake's bound (2 s), after the plan in flight when it connected.
within "$open_s" 5
assert_eq 0 "$?" "within the handshake's bound (${open_s} s)" || recovered=no
wait_run_end 180
res="$(ctl --json get-run "$RUN")"
assert_eq RUN_STATE_SUCCEEDED "$(json_get state "$res")" "the run succeeds: $(json_get message "$res")" ||
  recovered=no
assert_not_contains "$(cat "$SERVE_LOG")" "event=broadcast_aborted" "no broadcast was aborted" || recovered=no
# The run's pace: commit gaps while the stranger was at it against before.
gaps="$(commit_gaps "$t_fault" "$t_end")"
read -r median longest ndur <<<"$gaps"
python3 -c "import sys; m, l = map(float, sys.argv[1:]); sys.exit(0 if 0 < l <= 3 * m + 1 else 1)" "$median" "$longest"
assert_eq 0 "$?" "the run kept its pace (longest gap ${longest} s while the stranger was at it, ${ndur} gaps; median ${median} s before)" ||
  recovered=no
back="$(log_time "$SERVE_LOG" " event=step run=$RUN " "$t_fault")"
read -r lost dup <<<"$(step_audit $STEPS)"
fault_row "trainer data-port stranger (6 silent, 4 forged hellos)" "$open_s" "$recovered" "$lost" "$dup" \
  "$(elapsed "$t_fault" "$back")" "each got only the 40-byte challenge; longest commit gap ${longest} s (median ${median} s)"
