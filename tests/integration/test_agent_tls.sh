#!/usr/bin/env bash
# Agents over TLS, with client certificates when the orchestrator asks for
# them (mutual TLS) and a bearer token: a trainer given everything by flags,
# an inference agent given everything by RLORCH_* variables, and ctl, run a
# run to its end. Agents without a certificate, with one the orchestrator's
# client CA did not sign, or trusting another CA never register.
source "$(dirname "$0")/lib.sh"
need_cmd openssl python3 curl || { finish; exit 1; }

P="$TEST_TMP/pki"
mkdir -p "$P"
mk() { openssl "$@" >/dev/null 2>&1; }
# The orchestrator's own certificate (self-signed: it is its clients' CA).
mk req -x509 -newkey rsa:2048 -nodes -subj /CN=localhost -days 1 \
  -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout "$P/server.key" -out "$P/server.pem"
# A CA for the workers, and a worker certificate it signed.
mk req -x509 -newkey rsa:2048 -nodes -subj /CN=workers-ca -days 1 -keyout "$P/ca.key" -out "$P/ca.pem"
mk req -newkey rsa:2048 -nodes -subj /CN=worker -keyout "$P/worker.key" -out "$P/worker.csr"
mk x509 -req -in "$P/worker.csr" -CA "$P/ca.pem" -CAkey "$P/ca.key" -CAcreateserial -days 1 \
  -out "$P/worker.pem"
# A certificate nobody the orchestrator trusts signed, and a CA that is not the orchestrator's.
mk req -x509 -newkey rsa:2048 -nodes -subj /CN=stranger -days 1 -keyout "$P/stranger.key" -out "$P/stranger.pem"
assert_eq 0 "$(test -s "$P/worker.pem" && test -s "$P/stranger.pem" && echo 0 || echo 1)" "test certificates made"
printf 'tls-token-%s\n' "$RANDOM$RANDOM" >"$TEST_TMP/token"
chmod 600 "$TEST_TMP/token" "$P"/*.key

read -r gport mport <<<"$(free_port 2)"
GRPC_ADDR="127.0.0.1:$gport"
METRICS_ADDR="127.0.0.1:$mport"
SERVE_LOG="$TEST_TMP/serve.log"
"$RLORCH_BIN" serve --listen "$GRPC_ADDR" --metrics-listen "$METRICS_ADDR" --data-dir "$TEST_TMP/data" \
  --token-file "$TEST_TMP/token" --tls-cert "$P/server.pem" --tls-key "$P/server.key" \
  --tls-client-ca "$P/ca.pem" >"$SERVE_LOG" 2>&1 &
track_pid $!
wait_until 20 http_get /healthz
assert_eq 0 "$?" "the orchestrator serves with mutual TLS"

tctl() {
  "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --token-file "$TEST_TMP/token" --tls-ca "$P/server.pem" \
    --tls-client-cert "$P/worker.pem" --tls-client-key "$P/worker.key" "$@"
}
# names_in STATE...: the names of the workers in those states, sorted, one line.
names_in() {
  tctl --json list-workers | python3 -c '
import json, sys
ws = json.load(sys.stdin).get("workers", [])
print(" ".join(sorted(w["name"] for w in ws if w["state"] in sys.argv[1:])))' "$@"
}

"$RLORCH_BIN" trainer --orchestrator "$GRPC_ADDR" --name tls-trainer --preset 100m --layers 2 \
  --token-file "$TEST_TMP/token" --tls-ca "$P/server.pem" --tls-client-cert "$P/worker.pem" \
  --tls-client-key "$P/worker.key" --log-level info >"$TEST_TMP/trainer.log" 2>&1 &
track_pid $!
RLORCH_ORCHESTRATOR="$GRPC_ADDR" RLORCH_TOKEN_FILE="$TEST_TMP/token" RLORCH_TLS_CA_FILE="$P/server.pem" \
  RLORCH_TLS_CLIENT_CERT_FILE="$P/worker.pem" RLORCH_TLS_CLIENT_KEY_FILE="$P/worker.key" \
  "$RLORCH_BIN" inference --name tls-inference --log-level info >"$TEST_TMP/inference.log" 2>&1 &
track_pid $!
both_ready() { [[ "$(names_in WORKER_STATE_READY WORKER_STATE_BUSY)" == "tls-inference tls-trainer" ]]; }
wait_until 30 both_ready
assert_eq "tls-inference tls-trainer" "$(names_in WORKER_STATE_READY WORKER_STATE_BUSY)" \
  "the agents register over mutual TLS (flags and RLORCH_* variables)"

run="$(tctl --json start-run --preset 100m --steps 2 --rollouts-per-step 2 | json_get id)"
timeout 120 "$RLORCH_BIN" ctl --target "$GRPC_ADDR" --token-file "$TEST_TMP/token" --tls-ca "$P/server.pem" \
  --tls-client-cert "$P/worker.pem" --tls-client-key "$P/worker.key" watch-run "$run" >/dev/null
assert_eq RUN_STATE_SUCCEEDED "$(tctl --json get-run "$run" | json_get state)" "a run over TLS succeeds"

# The refused ones: each tries for a few seconds and never gets a worker id.
start_bad() { # NAME ARGS...
  local name=$1
  shift
  "$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --token-file "$TEST_TMP/token" --name "$name" \
    --log-level info "$@" >"$TEST_TMP/$name.log" 2>&1 &
  track_pid $!
}
start_bad no-cert --tls-ca "$P/server.pem"
start_bad stranger-cert --tls-ca "$P/server.pem" --tls-client-cert "$P/stranger.pem" --tls-client-key "$P/stranger.key"
start_bad wrong-ca --tls-ca "$P/ca.pem" --tls-client-cert "$P/worker.pem" --tls-client-key "$P/worker.key"
start_bad plaintext
sleep 4
assert_eq "tls-inference tls-trainer" "$(names_in WORKER_STATE_REGISTERED WORKER_STATE_READY WORKER_STATE_BUSY WORKER_STATE_LOST)" \
  "no agent without the right certificates registered"
for n in no-cert stranger-cert wrong-ca plaintext; do
  assert_contains "$(cat "$TEST_TMP/$n.log")" "orchestrator_unreachable" "$n: the agent says it cannot reach the orchestrator"
  assert_not_contains "$(cat "$TEST_TMP/$n.log")" "event=registered" "$n: never registered"
done

# A client certificate without its key is a usage error naming the flag.
assert_exit 2 "$RLORCH_BIN" inference --orchestrator "$GRPC_ADDR" --tls-client-cert "$P/worker.pem"
assert_contains "$LAST_OUTPUT" "--tls-client-cert: set without --tls-client-key" "a certificate without its key is refused"

finish
