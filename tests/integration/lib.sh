# Helpers for the integration tests (tests/integration/test_*.sh), sourced with
#
#   source "$(dirname "$0")/lib.sh"
#
# ctest sets RLORCH_BIN, RLORCH_SOURCE_DIR and RLORCH_BUILD_DIR; run by hand, they
# default to this checkout and its build/ directory.
#
# A test script calls assertions (each one records a pass or a failure and goes
# on), then `finish`, which prints "N passed, M failed" and exits non-zero when
# anything failed. A script that ends without `finish` (an error, an early exit)
# still prints the summary and fails. Everything a test starts with serve_start or
# track_pid is stopped and its temporary directory removed on exit.
#
# serve_start and track_pid must run in the test's own shell, not in $(...):
# the shell that starts a process is the only one that can wait for it.

# ---- locations -----------------------------------------------------------------

if [[ -z "${RLORCH_SOURCE_DIR:-}" ]]; then
  RLORCH_SOURCE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fi
: "${RLORCH_BUILD_DIR:=$RLORCH_SOURCE_DIR/build}"
: "${RLORCH_BIN:=$RLORCH_BUILD_DIR/rlorch}"
: "${SERVE_START_TIMEOUT_S:=20}"
: "${SERVE_STOP_TIMEOUT_S:=15}"
export RLORCH_BIN RLORCH_SOURCE_DIR RLORCH_BUILD_DIR
NODE_CLIENT="$RLORCH_SOURCE_DIR/tests/integration/node/client.js"
TEST_NAME="$(basename "${0%.sh}")"

# ---- bookkeeping ------------------------------------------------------------------

PASS_COUNT=0
FAIL_COUNT=0
__LIB_FINISHED=0
__LIB_PIDS=()
__LIB_ON_EXIT=()
__LIB_SERVE_SEQ=0

TEST_TMP="$(mktemp -d -t "rlorch-${TEST_NAME}.XXXXXX")" || {
  echo "cannot create a temporary directory" >&2
  exit 1
}
export TEST_TMP

pass() {
  PASS_COUNT=$((PASS_COUNT + 1))
  printf 'ok   - %s\n' "$*"
}

fail() {
  FAIL_COUNT=$((FAIL_COUNT + 1))
  printf 'FAIL - %s\n' "$*"
}

# A check that cannot run here (a missing tool); it counts neither way.
skip() {
  printf 'skip - %s\n' "$*"
}

finish() {
  __LIB_FINISHED=1
  printf '%d passed, %d failed\n' "$PASS_COUNT" "$FAIL_COUNT"
  if ((FAIL_COUNT > 0)); then exit 1; fi
  if ((PASS_COUNT == 0)); then
    echo "no assertion ran: nothing was tested"
    exit 1
  fi
  exit 0
}

# Registers a command run on exit, before the temporary directory goes.
on_exit() {
  __LIB_ON_EXIT+=("$*")
}

# Registers a background process started by the test, stopped on exit.
track_pid() {
  __LIB_PIDS+=("$1")
}

# stop_tracked: stops every process registered with track_pid now (SIGTERM,
# SIGKILL 5 s later), before what they use is taken away.
stop_tracked() {
  local pid
  for pid in "${__LIB_PIDS[@]}"; do __lib_stop_pid "$pid"; done
  __LIB_PIDS=()
}

# skip_all MESSAGE: the whole script cannot run here (exit 77, which ctest
# counts as skipped, not passed).
skip_all() {
  printf 'skip - %s\n' "$*"
  __LIB_FINISHED=1
  exit 77
}

__lib_stop_pid() {
  local pid=$1 i
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < 50; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  return 0
}

__lib_on_exit() {
  local rc=$? cmd pid
  trap - EXIT
  for cmd in "${__LIB_ON_EXIT[@]}"; do eval "$cmd"; done
  for pid in "${__LIB_PIDS[@]}"; do __lib_stop_pid "$pid"; done
  if [[ "${KEEP_TEST_TMP:-0}" == 1 || "$FAIL_COUNT" -gt 0 && "${KEEP_TEST_TMP_ON_FAIL:-0}" == 1 ]]; then
    echo "temporary files kept in $TEST_TMP"
  else
    rm -rf "$TEST_TMP"
  fi
  if ((__LIB_FINISHED == 0)); then
    printf '%d passed, %d failed (the script ended before finish, status %d)\n' \
      "$PASS_COUNT" "$((FAIL_COUNT + 1))" "$rc"
    exit 1
  fi
  exit "$rc"
}
trap __lib_on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- ports and processes --------------------------------------------------------

# Prints N (default 1) distinct free TCP ports on SERVE_HOST (default
# 127.0.0.1), space-separated. All are held open together while chosen, so
# they differ from each other.
free_port() {
  python3 - "${1:-1}" "${SERVE_HOST:-127.0.0.1}" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind((sys.argv[2], 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# wait_until SECONDS CMD...: runs CMD every 0.2 s until it succeeds; 1 on timeout.
wait_until() {
  local limit=$1 deadline
  shift
  deadline=$((SECONDS + limit))
  while ((SECONDS < deadline)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  "$@" >/dev/null 2>&1
}

# Shows the end of the running daemon's log (for a failure's context).
serve_log_tail() {
  [[ -n "${SERVE_LOG:-}" && -f "$SERVE_LOG" ]] || return 0
  echo "---- last lines of $SERVE_LOG"
  tail -n "${1:-30}" "$SERVE_LOG"
  echo "----"
}

__lib_serving() {
  local out
  out="$(node "$NODE_CLIENT" --target "$GRPC_ADDR" --health "" --deadline-ms 1000 2>&1)"
  [[ "$(json_get message.status <<<"$out" 2>/dev/null)" == SERVING ]]
}

# serve_start [ARGS...]: starts "$RLORCH_BIN" serve on free ports of SERVE_HOST
# (default loopback) with a fresh data directory, waits until the gRPC health
# check says SERVING, and exports SERVE_PID, GRPC_ADDR, METRICS_ADDR,
# SERVE_DATA_DIR and SERVE_LOG.
# Extra arguments go to serve after the defaults (so they may override them).
# Returns 1 (after recording a failure) when the daemon exits or is not serving
# within SERVE_START_TIMEOUT_S seconds.
serve_start() {
  local ports deadline
  ports="$(free_port 2)" || { fail "serve_start: no free port"; return 1; }
  __LIB_SERVE_SEQ=$((__LIB_SERVE_SEQ + 1))
  GRPC_ADDR="${SERVE_HOST:-127.0.0.1}:${ports%% *}"
  METRICS_ADDR="${SERVE_HOST:-127.0.0.1}:${ports##* }"
  SERVE_DATA_DIR="$TEST_TMP/data.$__LIB_SERVE_SEQ"
  SERVE_LOG="$TEST_TMP/serve.$__LIB_SERVE_SEQ.log"
  export GRPC_ADDR METRICS_ADDR SERVE_DATA_DIR SERVE_LOG
  mkdir -p -m 700 "$SERVE_DATA_DIR"
  "$RLORCH_BIN" serve --listen "$GRPC_ADDR" --metrics-listen "$METRICS_ADDR" \
    --data-dir "$SERVE_DATA_DIR" "$@" >"$SERVE_LOG" 2>&1 &
  SERVE_PID=$!
  export SERVE_PID
  track_pid "$SERVE_PID"
  __lib_wait_serving serve_start
}

# __lib_wait_serving WHO: waits until the daemon SERVE_PID is SERVING on
# GRPC_ADDR; records a failure naming WHO when it exits or times out.
__lib_wait_serving() {
  local deadline=$((SECONDS + SERVE_START_TIMEOUT_S))
  while ((SECONDS < deadline)); do
    if ! kill -0 "$SERVE_PID" 2>/dev/null; then
      wait "$SERVE_PID"
      fail "$1: rlorch serve exited with status $? before serving"
      serve_log_tail 30
      return 1
    fi
    __lib_serving && return 0
    sleep 0.2
  done
  fail "$1: rlorch serve not SERVING on $GRPC_ADDR within ${SERVE_START_TIMEOUT_S}s"
  serve_log_tail 30
  return 1
}

# serve_restart [ARGS...]: starts rlorch serve again, after serve_kill or
# serve_stop, on the addresses and the data directory of the last serve_start
# (so agents started against it find it again), with a log of its own in
# SERVE_LOG; waits until it is SERVING, as serve_start does.
serve_restart() {
  __LIB_SERVE_SEQ=$((__LIB_SERVE_SEQ + 1))
  SERVE_LOG="$TEST_TMP/serve.$__LIB_SERVE_SEQ.log"
  export SERVE_LOG
  "$RLORCH_BIN" serve --listen "$GRPC_ADDR" --metrics-listen "$METRICS_ADDR" \
    --data-dir "$SERVE_DATA_DIR" "$@" >"$SERVE_LOG" 2>&1 &
  SERVE_PID=$!
  export SERVE_PID
  track_pid "$SERVE_PID"
  __lib_wait_serving serve_restart
}

# serve_stop: SIGTERM to the daemon, waits for it, asserts that it exited 0.
serve_stop() {
  local rc i
  if [[ -z "${SERVE_PID:-}" ]]; then
    fail "serve_stop: no daemon was started"
    return 1
  fi
  kill -TERM "$SERVE_PID" 2>/dev/null
  for ((i = 0; i < SERVE_STOP_TIMEOUT_S * 10; i++)); do
    kill -0 "$SERVE_PID" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$SERVE_PID" 2>/dev/null; then
    fail "serve_stop: rlorch serve still running ${SERVE_STOP_TIMEOUT_S}s after SIGTERM"
    serve_log_tail 30
    kill -KILL "$SERVE_PID" 2>/dev/null
    wait "$SERVE_PID" 2>/dev/null
    SERVE_PID=
    return 1
  fi
  wait "$SERVE_PID"
  rc=$?
  SERVE_PID=
  assert_eq 0 "$rc" "rlorch serve exits 0 after SIGTERM" || { serve_log_tail 30; return 1; }
}

# ---- clients --------------------------------------------------------------------

# grpc_call ARGS...: the grpc-js client against the running daemon. Prints one
# JSON line per response message, then the status line. A later --target wins.
grpc_call() {
  node "$NODE_CLIENT" --target "$GRPC_ADDR" "$@"
}

# ctl ARGS...: the project's own CLI against the running daemon.
ctl() {
  "$RLORCH_BIN" ctl --target "$GRPC_ADDR" "$@"
}

# http_get PATH: GET on the daemon's HTTP endpoint; prints the body, fails on >= 400.
http_get() {
  curl -fsS --max-time 10 "http://$METRICS_ADDR$1"
}

# ---- JSON -----------------------------------------------------------------------

# json_get PATH [JSON]: prints the value at PATH ("message.runs.0.id", "status.name")
# from JSON, or from stdin. For several JSON lines (the client's output) the first
# line where PATH exists answers. Strings print raw, other values as JSON.
# Returns 1 when no line has PATH.
json_get() {
  local path=$1
  if (($# > 1)); then
    printf '%s\n' "$2" | __lib_json_get "$path"
  else
    __lib_json_get "$path"
  fi
}

__lib_json_get() {
  python3 -c '
import json, sys
path = [p for p in sys.argv[1].split(".") if p]
for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    try:
        v = json.loads(line)
    except ValueError:
        continue
    try:
        for p in path:
            v = v[int(p)] if isinstance(v, list) else v[p]
    except (KeyError, IndexError, ValueError, TypeError):
        continue
    print(v if isinstance(v, str) else json.dumps(v))
    sys.exit(0)
sys.exit(1)
' "$path"
}

# ---- assertions: each records a pass or a failure and returns 0 or 1 ---------

# assert_eq EXPECTED ACTUAL [WHAT]
assert_eq() {
  local what=${3:-"\"$2\" == \"$1\""}
  if [[ "$1" == "$2" ]]; then
    pass "$what"
  else
    fail "$what: expected \"$1\", got \"$2\""
    return 1
  fi
}

# assert_ne UNEXPECTED ACTUAL [WHAT]
assert_ne() {
  local what=${3:-"\"$2\" != \"$1\""}
  if [[ "$1" != "$2" ]]; then
    pass "$what"
  else
    fail "$what: got \"$2\""
    return 1
  fi
}

# assert_contains HAYSTACK NEEDLE [WHAT]
assert_contains() {
  local what=${3:-"output contains \"$2\""}
  if [[ "$1" == *"$2"* ]]; then
    pass "$what"
  else
    fail "$what: \"$2\" not found in: $(__lib_clip "$1")"
    return 1
  fi
}

# assert_not_contains HAYSTACK NEEDLE [WHAT]
assert_not_contains() {
  local what=${3:-"output does not contain \"$2\""}
  if [[ "$1" != *"$2"* ]]; then
    pass "$what"
  else
    fail "$what: found in: $(__lib_clip "$1")"
    return 1
  fi
}

# assert_status NAME OUTPUT [WHAT]: the grpc-js client's final status is NAME ("OK",
# "UNAUTHENTICATED", ...).
assert_status() {
  local got what=${3:-"gRPC status $1"}
  got="$(printf '%s\n' "$2" | tail -n 1 | json_get status.name 2>/dev/null)" || got="(no status line)"
  if [[ "$got" == "$1" ]]; then
    pass "$what"
  else
    fail "$what: status $got; output: $(__lib_clip "$2")"
    return 1
  fi
}

# assert_exit CODE CMD...: runs CMD (output kept in LAST_OUTPUT) and checks its status.
assert_exit() {
  local want=$1 rc
  shift
  LAST_OUTPUT="$("$@" 2>&1)"
  rc=$?
  if [[ "$rc" == "$want" ]]; then
    pass "exit $want: $*"
  else
    fail "exit $want: $*: got $rc; output: $(__lib_clip "$LAST_OUTPUT")"
    return 1
  fi
}

# need_cmd NAME: 0 when NAME is on PATH; otherwise records a failure.
need_cmd() {
  if command -v "$1" >/dev/null 2>&1; then return 0; fi
  fail "required command \"$1\" not found"
  return 1
}

__lib_clip() {
  local s=$1
  if ((${#s} > 2000)); then s="${s:0:2000}... (${#1} chars)"; fi
  printf '%s' "$s"
}

# ---- helpers for the control-plane tests ------------------------------------------

# http_code METHOD PATH: prints the HTTP status code the daemon's HTTP endpoint
# answers to METHOD on PATH ("000" when nothing answered).
http_code() {
  curl -s -o /dev/null -w '%{http_code}' --max-time 10 -X "$1" "http://$METRICS_ADDR$2"
}

# metric_value SERIES: prints the value of the sample SERIES on the live /metrics
# page, written exactly as exposed (name{label="v",...}); prints 0 when absent.
metric_value() {
  http_get /metrics | awk -v s="$1" '
    !found && substr($0, 1, 1) != "#" && index($0, s " ") == 1 { print $NF; found = 1 }
    END { if (!found) print 0 }'
}

# rpc_count METHOD CODE: rlorch_rpc_requests_total for one method and status name.
rpc_count() {
  metric_value "rlorch_rpc_requests_total{method=\"$1\",code=\"$2\"}"
}

# assert_status_details NAME SUBSTRING OUTPUT [WHAT]: the grpc-js client's final
# status is NAME and its details contain SUBSTRING (plain text without quotes or
# backslashes; matched against the status line as the client prints it).
assert_status_details() {
  local what=${4:-"gRPC status $1 with \"$2\""} last name=""
  last="$(printf '%s\n' "$3" | tail -n 1)"
  local re='^\{"status":\{"code":[0-9]+,"name":"([A-Z_]+)","details":'
  [[ "$last" =~ $re ]] && name="${BASH_REMATCH[1]}"
  if [[ "$name" == "$1" && "${last#*\"details\":}" == *"$2"* ]]; then
    pass "$what"
  else
    fail "$what: status ${name:-(no status line)}; output: $(__lib_clip "$3")"
    return 1
  fi
}

# serve_kill: SIGKILL to the daemon (a crash), waits for it.
serve_kill() {
  [[ -n "${SERVE_PID:-}" ]] || return 0
  kill -KILL "$SERVE_PID" 2>/dev/null
  wait "$SERVE_PID" 2>/dev/null
  SERVE_PID=
}

# ---- helpers for the tests that run agents ------------------------------------------

# wait_log SECONDS PATTERN [LOG]: polls LOG (default: the daemon's, SERVE_LOG)
# every 20 ms until a line matches PATTERN (grep -E): the moment to inject a
# fault is an event, not a guess. 1 on timeout.
wait_log() {
  local deadline=$((SECONDS + $1)) log=${3:-$SERVE_LOG}
  while ((SECONDS < deadline)); do
    grep -Eq "$2" "$log" 2>/dev/null && return 0
    sleep 0.02
  done
  return 1
}

# start_agent ROLE NAME ARGS...: `rlorch ROLE` (trainer or inference) of
# the daemon at GRPC_ADDR, named NAME, without a GPU, with ARGS after, in
# the background; its log in TEST_TMP/agent-NAME.log, its pid tracked and
# appended to AGENT_PIDS.
AGENT_PIDS=()
start_agent() {
  local role=$1 name=$2
  shift 2
  "$RLORCH_BIN" "$role" --orchestrator "$GRPC_ADDR" --name "$name" --device -1 "$@" \
    >"$TEST_TMP/agent-$name.log" 2>&1 &
  track_pid $!
  AGENT_PIDS+=($!)
}

# live_workers [NAME]: how many workers (named NAME, or all) the daemon lists
# as attached and alive (READY or BUSY).
live_workers() {
  ctl --json list-workers | python3 -c '
import json, sys
ws = json.load(sys.stdin).get("workers", [])
print(sum(1 for w in ws if (len(sys.argv) < 2 or w.get("name") == sys.argv[1])
          and w.get("state") in ("WORKER_STATE_READY", "WORKER_STATE_BUSY")))' "$@"
}

# live_count_is N: exactly N workers attached and alive (for wait_until).
live_count_is() { [[ "$(live_workers)" == "$1" ]]; }

# host_steps_ok EVENTS STEPS PER_STEP: "ok" when the WatchRun events in file
# EVENTS hold STEPS steps, each verified by 2 receivers on the host transport
# with PER_STEP rollouts and the next policy version; else what is wrong.
host_steps_ok() {
  python3 - "$@" <<'PY'
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"step":{' in l]
want, per = int(sys.argv[2]), int(sys.argv[3])
bad = []
for i, s in enumerate(steps):
    if not s.get("weights_verified"): bad.append(f"step {i} not verified")
    if s.get("receivers") != 2: bad.append(f"step {i}: {s.get('receivers')} receivers")
    if s.get("mode") != "BROADCAST_MODE_HOST": bad.append(f"step {i}: mode {s.get('mode')}")
    if s.get("rollouts_used") != per: bad.append(f"step {i}: {s.get('rollouts_used')} rollouts")
    if int(s.get("policy_version", 0)) != i + 1: bad.append(f"step {i}: version {s.get('policy_version')}")
if len(steps) != want: bad.append(f"{len(steps)} steps")
print("; ".join(bad) or "ok")
PY
}

# agent_logs_on_failure [LINES]: after a failure, the last LINES (default 60)
# of every daemon and agent log in TEST_TMP (serve.*.log, trainer*.log,
# inference.*.log); for on_exit.
agent_logs_on_failure() {
  logs_on_failure "${1:-60}" 'serve.*.log' 'trainer*.log' 'inference.*.log'
}

# logs_on_failure LINES GLOB...: after a failure, the last LINES of every file
# of TEST_TMP matching a GLOB, in order; for on_exit.
logs_on_failure() {
  ((FAIL_COUNT > 0)) || return 0
  local n=$1 g f
  shift
  for g in "$@"; do
    for f in "$TEST_TMP"/$g; do
      [[ -f "$f" ]] || continue
      echo "---- $(basename "$f") (last $n lines)"
      tail -n "$n" "$f"
    done
  done
  echo "----"
}

# steps_once RUN STEPS: "ok" when the finished run RUN recorded steps
# 0..STEPS-1 exactly once each, in order, step k publishing version k + 1,
# every broadcast verified (the stored records, as WatchRun replays them);
# else what is wrong.
steps_once() {
  ctl --json watch-run "$1" | python3 -c '
import json, sys
steps = [json.loads(l)["step"] for l in sys.stdin if "\"step\":{" in l]
want = int(sys.argv[1])
bad = []
if [int(s["step"]) for s in steps] != list(range(want)):
    bad.append("steps recorded: %s" % [s["step"] for s in steps])
for s in steps:
    if int(s["policy_version"]) != int(s["step"]) + 1:
        bad.append("step %s publishes version %s" % (s["step"], s["policy_version"]))
    if not s.get("weights_verified"):
        bad.append("step %s not verified" % s["step"])
print("; ".join(bad) if bad else "ok")' "$2"
}

# asan_for_python: in a sanitized build (RLORCH_SANITIZE names address), the
# ASan runtime is preloaded so that librlorch loads into an interpreter built
# without it, and leak reports go off (last in ASAN_OPTIONS, so that it wins
# over make test-asan's detect_leaks=1): the interpreter's own leaks at exit
# are not the library's, and the other tests report the daemon's.
asan_for_python() {
  [[ "${RLORCH_SANITIZE:-}" == *address* ]] || return 0
  LD_PRELOAD="$(gcc -print-file-name=libasan.so)"
  export LD_PRELOAD
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
}

# ---- hosts in network namespaces ----------------------------------------------------
#
# Several "hosts" on one machine (as root): network namespaces, each with its
# own address on 10.231.X.0/24, joined by a veth pair (MTU NETNS_MTU) to a
# bridge in the root namespace that holds 10.231.X.1 (where a daemon can
# listen), each link shaped in both directions: the namespace side's egress is
# the host's upload, the bridge side's its download. tbf sets the rate; netem,
# where the kernel has it, the latency. Every name starts with rlns and the test shell's pid, so
# tests running at once never share one, and what a run left behind when it
# died is found and removed by the next (netns_sweep).

NETNS_TAG="rlns$$"
# Ethernet's default: a TCP segment of 1448 bytes is a 1514-byte frame
# through a tbf (which counts frames), 95.6% goodput; the cost model counts
# it (link_nic_frame_bytes 14, docs/ARCHITECTURE.md "Cost model of a plan
# on a topology").
NETNS_MTU=1500
NETNS_NET=""   # 10.231.X once netns_net_create has run
NETNS_GW=""    # the bridge's address, 10.231.X.1
NETNS_NETEM="" # 1 when the kernel has netem (probed by netns_net_create), else 0
__LIB_NETNS_CLEANUP=0

# __lib_netns_remove own|dead: removes the veth pairs, namespaces and bridges
# named after this shell (own) or after a shell that has exited (dead). A
# veth goes first (its peer with it), then the namespace, then the bridge.
__lib_netns_remove() {
  local name names kind
  for kind in veth netns bridge; do
    case $kind in
      veth) names="$(ip -o link show type veth 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1)" ;;
      netns) names="$(ip netns list 2>/dev/null | awk '{print $1}')" ;;
      bridge) names="$(ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}')" ;;
    esac
    for name in $names; do
      [[ $name =~ ^rlns([0-9]+)(v[0-9]+|h[0-9]+|b)$ ]] || continue
      if [[ $1 == own ]]; then
        [[ ${BASH_REMATCH[1]} == "$$" ]] || continue
      else
        kill -0 "${BASH_REMATCH[1]}" 2>/dev/null && continue
      fi
      if [[ $kind != netns ]]; then
        ip link del "$name" 2>/dev/null
        continue
      fi
      # A process of this shell's that was not tracked goes with its host.
      [[ $1 == own ]] && ip netns pids "$name" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
      ip netns del "$name" 2>/dev/null
    done
  done
  return 0
}

# netns_sweep: removes what runs whose shell has exited left behind (a crash,
# a SIGKILL that skipped their cleanup).
netns_sweep() { __lib_netns_remove dead; }

# netns_net_create: the bridge, on the first 10.231.X.0/24 that no interface
# of the root namespace uses (chosen under a lock, so that two tests starting
# together do not take the same one); sets NETNS_NET, NETNS_GW and
# NETNS_NETEM. Removes leftovers first, and everything it makes on exit.
netns_net_create() {
  local lock fd x used br="${NETNS_TAG}b"
  if ((__LIB_NETNS_CLEANUP == 0)); then
    on_exit netns_teardown
    __LIB_NETNS_CLEANUP=1
  fi
  lock="$(dirname "$TEST_TMP")/rlorch-netns.lock"
  exec {fd}>>"$lock" || { fail "netns: cannot open the lock file $lock"; return 1; }
  if ! flock -w 30 "$fd"; then
    exec {fd}>&-
    fail "netns: $lock still locked after 30 s"
    return 1
  fi
  netns_sweep
  used=" $(ip -o -4 addr show | grep -oE 'inet 10\.231\.[0-9]+\.' | cut -d. -f3 | tr '\n' ' ')"
  for ((x = 0; x < 256; x++)); do [[ $used == *" $x "* ]] || break; done
  if ((x == 256)); then
    exec {fd}>&-
    fail "netns: every 10.231.X.0/24 is in use"
    return 1
  fi
  if ! { ip link add "$br" type bridge && ip addr add "10.231.$x.1/24" dev "$br" &&
         ip link set "$br" up; } 2>"$TEST_TMP/netns.err"; then
    exec {fd}>&-
    fail "netns: cannot make bridge $br on 10.231.$x.1/24: $(tail -n 1 "$TEST_TMP/netns.err")"
    return 1
  fi
  exec {fd}>&-
  NETNS_NET="10.231.$x"
  NETNS_GW="$NETNS_NET.1"
  if [[ -z $NETNS_NETEM ]]; then
    NETNS_NETEM=0
    tc qdisc add dev "$br" root netem delay 1ms 2>/dev/null && NETNS_NETEM=1
    tc qdisc del dev "$br" root 2>/dev/null
  fi
  return 0
}

# netns_name K, netns_addr K: host K's namespace and address. A process for
# the namespace starts as `ip netns exec "$(netns_name K)" CMD... &` (ip execs
# CMD, so $! is CMD's pid for track_pid; a shell function run with & would
# leave CMD behind its subshell).
netns_name() { printf '%s' "${NETNS_TAG}h$1"; }
netns_addr() { printf '%s' "$NETNS_NET.$((10 + $1))"; }

# __lib_netns_shape NS DEV MBIT DELAY_MS: DEV's egress (in namespace NS, or
# the root one when NS is empty) at MBIT Mbit/s, after DELAY_MS of netem
# delay when DELAY_MS is not 0 and the kernel has netem. The rate is tbf's
# (its tokens count every byte of a frame, headers included), with a bucket
# above one 64 KiB GSO packet and a queue of 20 ms at that rate.
__lib_netns_shape() {
  local tcn=(tc) parent=(root)
  [[ -n $1 ]] && tcn=(tc -n "$1")
  if [[ $4 != 0 && $NETNS_NETEM == 1 ]]; then
    "${tcn[@]}" qdisc add dev "$2" root handle 1: netem delay "${4}ms" limit 100000 || return 1
    parent=(parent 1:1)
  fi
  "${tcn[@]}" qdisc add dev "$2" "${parent[@]}" handle 10: tbf rate "${3}mbit" burst 256kb latency 20ms
}

# netns_host_add K MBIT DELAY_MS: host K (namespace netns_name K, address
# netns_addr K) on the bridge, its link shaped to MBIT Mbit/s and DELAY_MS
# each way (see __lib_netns_shape).
netns_host_add() {
  local ns out="${NETNS_TAG}v$1" in="${NETNS_TAG}n$1"
  ns="$(netns_name "$1")"
  if ! { ip netns add "$ns" &&
         ip link add "$out" mtu "$NETNS_MTU" type veth peer name "$in" mtu "$NETNS_MTU" netns "$ns" &&
         ip link set "$out" master "${NETNS_TAG}b" up &&
         ip -n "$ns" addr add "$(netns_addr "$1")/24" dev "$in" &&
         ip -n "$ns" link set "$in" up && ip -n "$ns" link set lo up &&
         __lib_netns_shape "$ns" "$in" "$2" "$3" && __lib_netns_shape "" "$out" "$2" "$3"; } \
       2>"$TEST_TMP/netns.err"; then
    fail "netns: cannot make host $1 ($ns, $(netns_addr "$1"), $2 Mbit/s, $3 ms): $(tail -n 1 "$TEST_TMP/netns.err")"
    return 1
  fi
}

# netns_link_bytes K up|down: bytes host K's shaped link has carried out of
# the host (up) or into it (down), as its tbf counted them (frames, headers
# included).
netns_link_bytes() {
  local tcn=(tc) dev="${NETNS_TAG}v$1"
  if [[ $2 == up ]]; then
    tcn=(tc -n "$(netns_name "$1")")
    dev="${NETNS_TAG}n$1"
  fi
  "${tcn[@]}" -j -s qdisc show dev "$dev" | python3 -c '
import json, sys
print(sum(q["bytes"] for q in json.load(sys.stdin) if q["kind"] == "tbf"))'
}

# netns_teardown: stops every tracked process (they may run in a namespace),
# then removes this shell's veth pairs, namespaces and bridge.
netns_teardown() {
  stop_tracked
  __lib_netns_remove own
  NETNS_NET=""
  NETNS_GW=""
}
