#!/bin/sh
# rlorch-agent-probe ready|alive: the Kubernetes exec probe of a worker agent
# (`rlorch trainer`, `rlorch inference`). The agents serve nothing a kubelet
# could ask, so this asks the orchestrator, which hears every agent's
# heartbeats: the agent named RLORCH_NAME is healthy when the orchestrator lists
# a worker of that name whose command stream is open and whose heartbeats
# arrive (state READY or BUSY). It reaches the orchestrator as the agent does:
# `rlorch ctl` reads the same RLORCH_ORCHESTRATOR, RLORCH_TOKEN_FILE and
# RLORCH_TLS_* variables.
#
#   ready  exit 0 when such a worker is listed, 1 otherwise, and 1 when the
#          orchestrator does not answer (the agent is not serving then).
#   alive  exit 1 only when the orchestrator answers and lists no such worker;
#          0 when it does not answer: an orchestrator that is down or
#          restarting says nothing about the agent, and a restart of the agent
#          would throw away what it holds (the trainer's weights and optimizer
#          state) while the orchestrator would resume with it.
#   exit 2 on a usage error or without RLORCH_NAME.
#
# One ListWorkers call, which returns every worker: N agents probing every P
# seconds cost the orchestrator N/P calls a second of N workers each.
set -u

mode=${1:-}
case "$mode" in
  ready | alive) ;;
  *)
    echo "usage: rlorch-agent-probe ready|alive" >&2
    exit 2
    ;;
esac
name=${RLORCH_NAME:-}
if [ -z "$name" ]; then
  echo "rlorch-agent-probe: RLORCH_NAME is not set: give the agent a name (the pod's) to look for" >&2
  exit 2
fi

if ! out=$(rlorch ctl --json --timeout "${RLORCH_PROBE_TIMEOUT_S:-5}" list-workers 2>&1); then
  if [ "$mode" = alive ]; then
    echo "orchestrator not answering, which says nothing about worker $name: $out"
    exit 0
  fi
  echo "orchestrator not answering: $out"
  exit 1
fi

# ctl --json prints each worker with its fields in field order:
# {"id":"w-1","role":"...","state":"WORKER_STATE_READY","name":"NAME",...}
states=$(printf '%s\n' "$out" |
  grep -o '"id":"[^"]*","role":"[A-Z_]*","state":"WORKER_STATE_[A-Z]*","name":"[^"]*"' |
  sed 's/^"id":"\([^"]*\)","role":"[A-Z_]*","state":"WORKER_STATE_\([A-Z]*\)","name":"\(.*\)"$/\2 \1 \3/' |
  awk -v n="$name" '{ st = $1; id = $2; $1 = ""; $2 = ""; sub(/^  /, ""); if ($0 == n) print st, id }')
live=$(printf '%s\n' "$states" | awk '$1 == "READY" || $1 == "BUSY" { print $2; exit }')
if [ -n "$live" ]; then
  echo "worker $name is $live, $(printf '%s\n' "$states" | awk -v id="$live" '$2 == id { print $1 }')"
  exit 0
fi
if [ -n "$states" ]; then
  echo "worker $name is listed but not live: $(printf '%s' "$states" | tr '\n' ' ')"
else
  echo "the orchestrator lists no worker named $name"
fi
exit 1
