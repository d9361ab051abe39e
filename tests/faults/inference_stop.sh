#!/usr/bin/env bash
# An inference worker stops answering: SIGSTOP as a broadcast to it begins
# (its process and sockets stay, nothing answers), SIGCONT after SECONDS.
#
#   inference_stop.sh 7    a heartbeat gap
#   inference_stop.sh 45   a hung worker
#
# It must be declared lost within the worker timeout, the run must go on
# without it (steps keep being committed while it is stopped), and once it
# resumes it must register again, re-attach and be caught up with the
# committed weights before it takes part again. The run is long and stopped
# (stop-run) a few steps after that; every step it committed is recorded
# once. Detected: from the stop to the daemon's worker_lost.
source "$(dirname "$0")/lib.sh"

STOP_S=${1:?usage: inference_stop.sh SECONDS}
TIMEOUT_S=$((RLORCH_WORKER_TIMEOUT_MS / 1000))

serve_start || { finish; exit 1; }
start_agents 2
VICTIM=${INF_PIDS[1]}
# Never leave a stopped process behind, whatever happens to the script.
on_exit 'kill -CONT "$VICTIM" 2>/dev/null'
start_run 100000
t_stop="$(signal_at_nth "$TEST_TMP/inference.1.log" "event=broadcast_start" 3 "$VICTIM" STOP)"
sleep "$STOP_S"
during="$(commits_after "$t_stop")"
t_cont="$(now)"
kill -CONT "$VICTIM"

recovered=yes
lost_at="$(log_time "$SERVE_LOG" " event=worker_lost .*name=inference-1 " "$t_stop")"
assert_ne "" "$lost_at" "the stopped worker is declared lost" || recovered=no
detect="$(elapsed "$t_stop" "$lost_at")"
within "$detect" $((TIMEOUT_S + 2))
assert_eq 0 "$?" "within the worker timeout (${detect} s, timeout ${TIMEOUT_S} s)" || recovered=no
assert_eq 1 "$((during >= 1))" "the run went on while it was stopped ($during commits in ${STOP_S} s)" ||
  recovered=no
back_at="$(log_time "$SERVE_LOG" " event=step run=$RUN " "$lost_at")"
# Beyond the detection, the step in progress and its re-plan, each about a
# step's time, and a few seconds (test_hung_worker's bound).
read -r median longest _ <<<"$(commit_gaps "$t_stop" "$t_cont")"
python3 -c "import sys; d, m, l = map(float, sys.argv[1:]); sys.exit(0 if 0 < l <= d + 3 * m + 3 else 1)" \
  "$detect" "$median" "$longest"
assert_eq 0 "$?" "no gap between commits much longer than the detection (${longest} s, steps of ${median} s)" ||
  recovered=no

# Back: registered again, attached, and given the committed weights by the
# first plan after that which includes it (a catch-up plan when no step can start, else
# the next step's own plan: either moves the whole weights), verified, before
# it serves rollouts (the scheduler's rule; docs/ARCHITECTURE.md).
__synced() {
  local reg id
  reg="$(log_time_last "$SERVE_LOG" " event=worker_registered .*name=inference-1 ")" || return 1
  # The first plan built after its registration that it completed (one that
  # ended after SIGCONT may be a plan from before its loss, re-planned since).
  id="$(python3 - "$SERVE_LOG" "$TEST_TMP/inference.1.log" "$reg" <<'PY'
import datetime, re, sys
def ts(line):
    m = re.match(r"ts=(\S+)Z ", line)
    return datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=datetime.timezone.utc).timestamp() if m else 0
serve, agent, reg = sys.argv[1], sys.argv[2], float(sys.argv[3])
built = {}
for line in open(serve, errors="replace"):
    m = re.search(r" event=plan_built run=\S+ plan=(\S+) ", line)
    if m and ts(line) > reg:
        built.setdefault(m.group(1), ts(line))
for line in open(agent, errors="replace"):
    m = re.search(r" event=broadcast_done plan_id=(\S+) ", line)
    if m and m.group(1) in built:
        print(m.group(1))
        break
PY
)"
  [[ -n "$id" ]] || return 1
  SYNC_PLAN=$id
  if [[ "$id" == *-catchup* ]]; then
    SYNC_AT="$(log_time "$SERVE_LOG" " event=caught_up run=$RUN plan=$id .*verified=1 ")"
  else
    id=${id#"$RUN"/step-}
    SYNC_AT="$(log_time "$SERVE_LOG" " event=step run=$RUN step=${id%%-*} .*verified=1")"
  fi
  [[ -n "$SYNC_AT" ]]
}
__reregistered() { (($(grep -c " event=registered " "$TEST_TMP/inference.1.log") >= 2)); }
wait_until 60 __reregistered
assert_eq 0 "$?" "after SIGCONT it registers again" || recovered=no
wait_until 60 __synced
__synced
assert_eq 0 "$?" "after SIGCONT it is given the committed weights (${SYNC_PLAN:-no plan}), verified" ||
  recovered=no
assert_eq 1 "$(live_workers inference-1)" "it is attached again" || recovered=no
reg_at="$(log_time "$SERVE_LOG" " event=worker_registered .*name=inference-1 " "$t_cont")"
assert_ne "" "$reg_at" "under a new registration" || recovered=no
wait_commits 3 60 "${SYNC_AT:-$t_cont}"
assert_eq 0 "$?" "steps go on after it rejoined" || recovered=no
how="a catch-up plan"
[[ "${SYNC_PLAN:-}" == *-catchup* ]] || how="the next step's plan (${SYNC_PLAN:-none})"

ctl stop-run "$RUN" >/dev/null
wait_run_end 60
assert_eq RUN_STATE_STOPPED "$(ctl --json get-run "$RUN" | json_get state)" "the run stops when told to" ||
  recovered=no
read -r lost dup <<<"$(step_audit)"
name="inference worker SIGSTOP ${STOP_S} s, SIGCONT"
fault_row "$name" "$detect" "$recovered" "$lost" "$dup" "$(elapsed "$t_stop" "$back_at")" \
  "$during commits while stopped (longest gap ${longest} s); synced by $how $(elapsed "$t_cont" "${SYNC_AT:-}") s after SIGCONT"
