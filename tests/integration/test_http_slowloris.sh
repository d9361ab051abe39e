#!/usr/bin/env bash
# Health probes get through an HTTP port that slow clients hold full. A
# slowloris client opens http_max_connections connections, sends each the
# start of a request, trickles a byte into every one and opens a new one for
# each the server closes; meanwhile 64 /healthz probes must all answer 200,
# /readyz must answer, /metrics answers 200 or a clean 503. Once it stops
# opening new ones, the server closes every slow connection by the request
# deadline (http_timeout_ms), telling each 408. The figures are printed.
source "$(dirname "$0")/lib.sh"

need_cmd curl || finish
CAP=256
TIMEOUT_MS=3000
RLORCH_HTTP_MAX_CONNECTIONS=$CAP RLORCH_HTTP_TIMEOUT_MS=$TIMEOUT_MS serve_start || finish

# The slow client: runs until $TEST_TMP/stop exists (it stops opening new
# connections then, and waits for the server to close the rest), then writes
# its figures to $TEST_TMP/slow.out.
python3 - "$METRICS_ADDR" "$CAP" "$TEST_TMP" "$TIMEOUT_MS" <<'EOF' &
import os, selectors, socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
cap, tmp, timeout = int(sys.argv[2]), sys.argv[3], int(sys.argv[4]) / 1e3
sel = selectors.DefaultSelector()
conns = {}  # socket -> [opened at, bytes the server sent]
opened = refused = told_408 = 0
lifetimes = []

def open_one():
    global opened
    s = socket.create_connection((host, int(port)))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    s.setblocking(False)
    conns[s] = [time.monotonic(), b""]
    sel.register(s, selectors.EVENT_READ)
    opened += 1

for _ in range(cap):
    open_one()
open(os.path.join(tmp, "slow.ready"), "w").write("%d\n" % len(conns))
dropped, stopping, last, last_open = 0, False, time.monotonic(), time.monotonic()
deadline = None
while conns or not stopping:
    now = time.monotonic()
    if not stopping and os.path.exists(os.path.join(tmp, "stop")):
        stopping, deadline = True, now + 30
    if deadline and now > deadline:
        break
    for key, _ in sel.select(timeout=0.05):
        s = key.fileobj
        try:
            data = s.recv(4096)
        except OSError:
            data = b""
        if data:
            conns[s][1] += data
            continue
        t0, got = conns.pop(s)
        sel.unregister(s)
        s.close()
        lifetimes.append(time.monotonic() - t0)
        told_408 += got.startswith(b"HTTP/1.1 408 ")
        refused += got.startswith(b"HTTP/1.1 503 ")
        dropped += 1
    # Every 50 ms a new connection for each one closed; every 200 ms a byte
    # into each open one.
    if time.monotonic() - last_open >= 0.05:
        last_open = time.monotonic()
        while dropped and not stopping:
            open_one()
            dropped -= 1
    if time.monotonic() - last >= 0.2:
        last = time.monotonic()
        for s in list(conns):
            try:
                s.send(b"a")
            except OSError:
                pass
with open(os.path.join(tmp, "slow.out"), "w") as f:
    early = sum(1 for t in lifetimes if t < timeout * 2 / 3)  # pushed out, not timed out
    f.write("%d %d %d %d %.0f %d %d\n" % (opened, len(lifetimes), told_408, refused,
                                         max(lifetimes) * 1e3 if lifetimes else 0, len(conns), early))
EOF
SLOW_PID=$!
track_pid "$SLOW_PID"
wait_until 20 test -s "$TEST_TMP/slow.ready"
assert_eq "$CAP" "$(cat "$TEST_TMP/slow.ready" 2>/dev/null)" "the slow client holds $CAP connections, the cap"
sleep 0.5

ok=0 worst=0
for i in $(seq 1 64); do
  t0=$(date +%s%N)
  code="$(curl -s -o "$TEST_TMP/probe.body" -w '%{http_code}' --max-time 5 "http://$METRICS_ADDR/healthz")"
  ms=$((($(date +%s%N) - t0) / 1000000))
  ((ms > worst)) && worst=$ms
  [[ "$code" == 200 && "$(cat "$TEST_TMP/probe.body")" == ok ]] && ok=$((ok + 1))
done
echo "# 64 /healthz probes against $CAP slow connections: $ok answered 200, the slowest in $worst ms"
assert_eq 64 "$ok" "every /healthz probe answered 200 while slow clients held the cap"
code="$(curl -s -o "$TEST_TMP/ready.body" -w '%{http_code}' --max-time 5 "http://$METRICS_ADDR/readyz")"
assert_eq 1 "$([[ ( "$code" == 200 && "$(cat "$TEST_TMP/ready.body")" == ready ) ||
  ( "$code" == 503 && "$(cat "$TEST_TMP/ready.body")" == "not ready: "* ) ]] && echo 1 || echo 0)" \
  "/readyz answers ($code $(head -c 60 "$TEST_TMP/ready.body"))"
code="$(curl -s -o "$TEST_TMP/metrics.body" -w '%{http_code}' --max-time 5 "http://$METRICS_ADDR/metrics")"
if [[ "$code" == 200 ]]; then
  assert_contains "$(cat "$TEST_TMP/metrics.body")" "rlorch_build_info" "/metrics answers whole"
else
  assert_eq "503 too many clients" "$code $(cat "$TEST_TMP/metrics.body")" "/metrics, if refused, is a clean 503"
fi
out="$(grpc_call --health "" --deadline-ms 5000)"
assert_eq SERVING "$(json_get message.status "$out")" "the gRPC health check is not affected"

# Stop opening new connections; the server closes the rest by the deadline.
touch "$TEST_TMP/stop"
wait "$SLOW_PID"
read -r opened closed told refused longest left early <"$TEST_TMP/slow.out"
echo "# the slow client opened $opened connections; the server closed $closed (told 408: $told," \
  "503: $refused; $early pushed out for a newcomer), the longest after $longest ms; $left still open"
assert_eq 0 "$left" "the server closed every slow connection"
assert_eq "$opened" "$closed" "every one the slow client opened was closed by the server"
assert_eq 1 $((longest <= TIMEOUT_MS + 1500)) \
  "none lived past the request deadline of $TIMEOUT_MS ms by more than 1.5 s ($longest ms)"
assert_eq 1 $((told + refused == closed)) "each was told why: 408 (or 503 at the cap) ($told + $refused of $closed)"
assert_eq 1 $((early >= 1)) "probes took the place of slow connections ($early pushed out before the deadline)"
code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://$METRICS_ADDR/healthz")"
assert_eq 200 "$code" "/healthz answers after"
serve_stop
finish
