# Helpers for the fault scenarios (tests/faults/*.sh), on top of the
# integration tests' lib.sh, sourced with
#
#   source "$(dirname "$0")/lib.sh"
#
# A scenario injects one fault by hand into a real `rlorch serve` and real
# agents, asserts what must hold, and ends with fault_row, which writes its
# row of the fault table (tests/faults/suite.sh collects them) and calls
# finish. Every figure in a row is measured: times from the daemon's log
# timestamps against the moment the fault was injected, steps lost and
# duplicated from the run's step records in the store (WatchRun's replay)
# against the commits every daemon logged.
source "$(dirname "${BASH_SOURCE[0]}")/../integration/lib.sh"
need_cmd python3 || { finish; exit 1; }

# The short heartbeat and loss settings of the integration tests: a stopped
# worker is lost 3 s after its last heartbeat. A scenario may override them.
: "${RLORCH_HEARTBEAT_INTERVAL_MS:=200}" "${RLORCH_WORKER_TIMEOUT_MS:=3000}"
export RLORCH_HEARTBEAT_INTERVAL_MS RLORCH_WORKER_TIMEOUT_MS
# The small preset, cut to two layers: a step's broadcast is 74 MB.
FAULT_PRESET=(--preset 100m --layers 2)

on_exit agent_logs_on_failure 60

# now: the Unix time, to the millisecond (what log_time compares with).
now() {
  local t
  t="$(date +%s.%N)"
  printf '%s\n' "${t:0:14}"
}

# signal_at_nth LOG PATTERN N PID SIG: sends SIG to PID the moment LOG holds
# its N-th line containing PATTERN (a fixed string), polling every 0.5 ms: a
# broadcast lasts a tenth of a second here, so a coarser wait would signal
# after it. Prints the Unix time taken just before the signal.
signal_at_nth() {
  timeout 120 python3 - "$@" <<'PY'
import os, signal, sys, time
log, pat, n, pid, sig = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
seen = 0
while not os.path.exists(log):
    time.sleep(0.0005)
with open(log) as f:
    while seen < n:
        line = f.readline()
        if not line:
            time.sleep(0.0005)
            continue
        seen += pat in line
t = time.time()
os.kill(pid, getattr(signal, "SIG" + sig))
print(f"{t:.3f}", flush=True)
PY
}

# log_time LOG PATTERN [AFTER]: the Unix time of the first line of LOG that
# matches PATTERN (a Python regular expression) and was logged after AFTER
# (a Unix time, default 0); 1 when there is none. log_time_last: the last.
log_time() { __faults_log_time first "$@"; }
log_time_last() { __faults_log_time last "$@"; }
__faults_log_time() {
  python3 - "$@" <<'PY'
import datetime, re, sys
which, log, pat = sys.argv[1], sys.argv[2], re.compile(sys.argv[3])
after = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
found = None
for line in open(log, errors="replace"):
    m = re.match(r"ts=(\S+)Z ", line)
    if not m or not pat.search(line):
        continue
    t = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=datetime.timezone.utc).timestamp()
    if t > after:
        found = t
        if which == "first":
            break
if found is None:
    sys.exit(1)
print(f"{found:.3f}")
PY
}

# elapsed FROM TO: TO - FROM in seconds, to the millisecond ("-" when either is empty).
elapsed() {
  if [[ -z "$1" || -z "$2" ]]; then echo -; return; fi
  python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.3f}')" "$1" "$2"
}

# within VALUE LIMIT: 0 when VALUE is a number with 0 <= VALUE <= LIMIT.
within() {
  python3 -c "import sys; v = float(sys.argv[1]); sys.exit(0 if 0 <= v <= float(sys.argv[2]) else 1)" \
    "$1" "$2" 2>/dev/null
}

# start_agents N [ARGS...]: a trainer (trainer-0) and N inference agents
# (inference-0..), logs in TEST_TMP, against the running daemon; ARGS go to
# the inference agents. Sets TRAINER_PID and INF_PIDS; waits until all of
# them are attached.
start_agents() {
  local n=$1 i
  shift
  "$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --name trainer-0 "${FAULT_PRESET[@]}" \
    --log-level "${FAULT_AGENT_LOG_LEVEL:-info}" >"$TEST_TMP/trainer.log" 2>&1 &
  TRAINER_PID=$!
  track_pid "$TRAINER_PID"
  INF_PIDS=()
  for ((i = 0; i < n; i++)); do
    "$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --name "inference-$i" --log-level "${FAULT_AGENT_LOG_LEVEL:-info}" \
      "$@" >"$TEST_TMP/inference.$i.log" 2>&1 &
    INF_PIDS[i]=$!
    track_pid $!
  done
  __faults_all_live() { [[ "$(live_workers)" == $((n + 1)) ]]; }
  wait_until 30 __faults_all_live
  assert_eq $((n + 1)) "$(live_workers)" "the trainer and $n inference agent(s) attached"
}

# start_run STEPS [ARGS...]: starts a run of STEPS steps on the small preset;
# sets RUN.
start_run() {
  local steps=$1
  shift
  RUN="$(ctl --json start-run --name faults "${FAULT_PRESET[@]:0:2}" --steps "$steps" \
    --rollouts-per-step 2 "$@" | json_get id)"
  assert_ne "" "$RUN" "the run starts"
}

# wait_commits N SECONDS [AFTER]: waits until the daemon's log holds N step
# commits of RUN (after the Unix time AFTER, default 0); 1 on timeout.
wait_commits() {
  local n=$1 limit=$2 after=${3:-0}
  __faults_commits() {
    [[ "$(commits_after "$after")" -ge "$n" ]]
  }
  wait_until "$limit" __faults_commits
}

# commits_after AFTER: how many step commits of RUN the daemon's current log
# holds after the Unix time AFTER.
commits_after() {
  python3 - "$SERVE_LOG" "$RUN" "$1" <<'PY'
import datetime, re, sys
log, run, after = sys.argv[1], sys.argv[2], float(sys.argv[3])
n = 0
for line in open(log, errors="replace"):
    m = re.match(r"ts=(\S+)Z ", line)
    if m and "event=step " in line and f" run={run} " in line:
        t = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(
            tzinfo=datetime.timezone.utc).timestamp()
        n += t > after
print(n)
PY
}

# commit_gaps FROM TO: prints "MEDIAN LONGEST N" for RUN's commits in the
# daemon's current log: the median gap between consecutive commits before
# the Unix time FROM, and the longest and the number of the gaps that overlap
# FROM..TO (-1 where there is none).
commit_gaps() {
  python3 - "$SERVE_LOG" "$RUN" "$1" "$2" <<'PY'
import datetime, re, sys
log, run, t0, t1 = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
ts = []
for line in open(log, errors="replace"):
    m = re.match(r"ts=(\S+)Z ", line)
    if m and " event=step " in line and f" run={run} " in line:
        ts.append(datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(
            tzinfo=datetime.timezone.utc).timestamp())
before = sorted(b - a for a, b in zip(ts, ts[1:]) if b <= t0)
during = [b - a for a, b in zip(ts, ts[1:]) if b > t0 and a < t1]
print(f"{before[len(before) // 2] if before else -1:.2f} {max(during) if during else -1:.2f} {len(during)}")
PY
}

# wait_run_end SECONDS: waits until RUN has ended (watch-run returns); prints
# nothing, 1 on timeout.
wait_run_end() {
  timeout "$1" "$RLORCH_BIN" ctl --target "$GRPC_ADDR" watch-run "$RUN" >/dev/null 2>&1
}

# step_audit [STEPS]: prints "LOST DUPLICATED" for RUN, measured: its step
# records as the store replays them (ctl watch-run on the ended run) against
# the steps every daemon log of this scenario says it committed, and against
# 0..STEPS-1 (default: the run's steps_done). Lost: steps committed (logged,
# or below steps_done) with no record, or policy versions skipped.
# Duplicated: steps with two records, steps committed twice (in one log or
# across restarts), or policy versions published twice. Each is the largest
# of its counts.
step_audit() {
  local steps=${1:-$(ctl --json get-run "$RUN" | json_get steps_done)}
  ctl --json watch-run "$RUN" >"$TEST_TMP/replay.jsonl" 2>&1
  python3 - "$TEST_TMP/replay.jsonl" "$RUN" "${steps:-0}" "$TEST_TMP"/serve.*.log <<'PY'
import collections, json, re, sys
replay, run, want, logs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
records = []
for line in open(replay):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if "step" in m and m["step"].get("run_id") == run:
        records.append((int(m["step"]["step"]), int(m["step"]["policy_version"])))
logged = collections.Counter()
for log in logs:
    for line in open(log, errors="replace"):
        m = re.search(r" event=step run=(\S+) step=(\d+) ", line)
        if m and m.group(1) == run:
            logged[int(m.group(2))] += 1
have = collections.Counter(s for s, _ in records)
versions = collections.Counter(v for _, v in records)
committed = set(logged) | set(range(want))
# Each kind of evidence counts steps; a step missing from the records is also
# a version missing, so the largest count is the number of steps.
lost = max(len(committed - set(have)),
           len(set(range(1, max(versions) + 1)) - set(versions)) if versions else 0)
dup = max(sum(c - 1 for c in have.values()), sum(c - 1 for c in logged.values()),
          sum(c - 1 for c in versions.values()))
print(lost, dup)
PY
}

# fault_row NAME DETECTED RECOVERED LOST DUPLICATED BACK NOTE: the scenario's
# row. DETECTED and BACK are seconds from the fault to its detection and to
# the next step committed after it; RECOVERED is yes or no. Asserts the
# row's expectations (recovered, nothing lost, nothing duplicated), writes
# the row to FAULT_ROWS (when the suite set it) and finishes the scenario.
fault_row() {
  local name=$1 detect=$2 recovered=$3 lost=$4 dup=$5 back=$6 note=$7 verdict
  assert_eq yes "$recovered" "$name: recovered"
  assert_eq 0 "$lost" "$name: no step lost"
  assert_eq 0 "$dup" "$name: no step duplicated"
  verdict=pass
  ((FAIL_COUNT == 0)) || verdict=FAIL
  printf '# row: %s | detected in %s s | recovered %s | lost %s | duplicated %s | next commit %s s | %s | %s\n' \
    "$name" "$detect" "$recovered" "$lost" "$dup" "$back" "$note" "$verdict"
  if [[ -n "${FAULT_ROWS:-}" ]]; then
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$detect" "$recovered" "$lost" "$dup" "$back" \
      "$note" "$verdict" >>"$FAULT_ROWS"
  fi
  finish
}
