#!/usr/bin/env bash
# The deployment files are valid and agree with the program: Prometheus rules
# (syntax and alert unit tests), the example configuration (accepted by
# `rlorch serve --print-config`), the dashboard (only metrics the daemon
# exports), the systemd units against the agents' observed exit statuses, the
# agents' Kubernetes probe against a real daemon and agent, the Kubernetes
# manifests as `kubectl kustomize` renders them, and both Dockerfiles, read
# without Docker against the tree, the Makefile and Debian 12's archive.
source "$(dirname "$0")/lib.sh"

DEPLOY="$RLORCH_SOURCE_DIR/deploy"

# Metric names the daemon exports (docs/OPERATIONS.md has the table).
METRICS="rlorch_build_info rlorch_rpc_requests_total rlorch_rpc_duration_seconds
rlorch_event_loop_lag_seconds rlorch_runs rlorch_step_duration_seconds
rlorch_broadcast_duration_seconds rlorch_staging_seconds rlorch_broadcast_bytes_total
rlorch_broadcast_throughput_bytes_per_second rlorch_broadcast_predicted_seconds
rlorch_broadcast_model_ratio rlorch_policy_version rlorch_async_level
rlorch_rollouts_total rlorch_workers rlorch_generated_tokens_total rlorch_worker_generated_tokens_total
rlorch_rollouts_in_flight rlorch_rollout_request_duration_seconds rlorch_rollout_requests_total
rlorch_rollouts_malformed_total"

# ---- Prometheus rules --------------------------------------------------------------
if need_cmd promtool; then
  assert_exit 0 promtool check rules "$DEPLOY/prometheus/rlorch-rules.yaml"
  assert_exit 0 promtool test rules "$DEPLOY/prometheus/rlorch-rules.test.yaml"
fi

# ---- example configuration ----------------------------------------------------------
out="$("$RLORCH_BIN" serve --config "$DEPLOY/config/rlorch.yaml" --print-config 2>&1)"
rc=$?
assert_eq 0 "$rc" "serve --print-config accepts deploy/config/rlorch.yaml" || echo "$out"
assert_contains "$out" "0.0.0.0:7070" "the printed configuration has the file's listen address"
assert_contains "$out" "/var/lib/rlorch" "the printed configuration has the file's data_dir"
# What --print-config prints is a configuration it accepts back, unchanged.
if ((rc == 0)); then
  printf '%s\n' "$out" >"$TEST_TMP/printed.yaml"
  again="$("$RLORCH_BIN" serve --config "$TEST_TMP/printed.yaml" --print-config 2>&1)"
  assert_eq "$out" "$again" "--print-config output round-trips"
else
  fail "--print-config output round-trips: nothing was printed to read back"
fi

# Every key of the example is documented in the file and in docs/OPERATIONS.md.
keys="listen metrics_listen data_dir token_file tls_cert_file tls_key_file tls_client_ca_file log_level log_format
max_message_bytes max_manifest_tensors max_tensor_bytes max_manifest_bytes max_rollout_bytes batch_chunk_bytes rollout_buffer_bytes rollout_log shutdown_grace_s heartbeat_interval_ms worker_timeout_ms max_workers lost_worker_retention_s http_timeout_ms
http_max_connections default_policy max_async_level rollouts_per_step max_requests_per_worker
group_size prompts_file max_prompt_tokens max_tokens temperature request_timeout_ms staging_budget_bytes
broadcast_gbps_host broadcast_gbps_staged broadcast_gbps_direct broadcast_safety broadcast_slack_ms
link_h2d_gbps link_nvlink_gbps link_d2d_gbps link_cast_gbps link_tcp_stream_gbps link_tls_stream_gbps link_tcp_send_gbps
link_host_gbps link_host_cast_gbps link_pageable_gbps link_hop_latency_us link_nics link_nic_gbits link_nic_frame_bytes data_channel_tls"
# The list is the program's: the keys --print-config prints, all of them.
assert_eq "$(tr ' ' '\n' <<<"$keys" | sed '/^$/d' | sort | tr '\n' ' ')" \
  "$("$RLORCH_BIN" serve --print-config | sed -n 's/^\([a-z0-9_]*\):.*/\1/p' | sort | tr '\n' ' ')" \
  "the key list is every key rlorch serve has"
missing=""
for k in $keys; do
  grep -Eq "^#? ?$k:" "$DEPLOY/config/rlorch.yaml" || missing="$missing $k"
done
assert_eq "" "$missing" "deploy/config/rlorch.yaml lists every configuration key"
missing=""
for k in $keys; do
  grep -qs "\`$k\`" "$RLORCH_SOURCE_DIR/docs/OPERATIONS.md" || missing="$missing $k"
done
assert_eq "" "$missing" "docs/OPERATIONS.md documents every configuration key"

# The ConfigMap's configuration is accepted too (its token file exists only in
# the pod, so point it at a temporary one).
printf 'not-a-real-token\n' >"$TEST_TMP/token"
awk '/^  rlorch.yaml: \|/{on=1; next} on && /^    /{sub(/^    /, ""); print; next} on{on=0}' \
  "$DEPLOY/k8s/base/configmap.yaml" |
  sed "s#^token_file:.*#token_file: \"$TEST_TMP/token\"#" >"$TEST_TMP/configmap.yaml"
assert_exit 0 "$RLORCH_BIN" serve --config "$TEST_TMP/configmap.yaml" --print-config
missing=""
for k in $keys; do
  grep -Eq "^#? ?$k:" "$TEST_TMP/configmap.yaml" || missing="$missing $k"
done
assert_eq "" "$missing" "deploy/k8s/base/configmap.yaml lists every configuration key"
assert_contains "$LAST_OUTPUT" "0.0.0.0:9464" "the ConfigMap's metrics_listen is read"
assert_not_contains "$LAST_OUTPUT" "not-a-real-token" "--print-config never prints the token"

# A broken file is refused with status 2, so the checks above can fail.
printf 'listen: "0.0.0.0:7070"\nno_such_key: 1\n' >"$TEST_TMP/bad.yaml"
assert_exit 2 "$RLORCH_BIN" serve --config "$TEST_TMP/bad.yaml" --print-config
assert_contains "$LAST_OUTPUT" "no_such_key" "the error names the unknown key"

# ---- docs/OPERATIONS.md: each command's table is its --help -------------------------
# Every command rlorch lists (rlorch --help, rlorch ctl --help, rlorch bench
# --help) has a "#### `rlorch CMD`" section whose table rows are its --help
# entries, in order: arguments, flags, the variable of each. serve's table
# groups its keys with notes of its own, so there each flag and key must be
# present.
doc_out="$(python3 - "$RLORCH_BIN" "$RLORCH_SOURCE_DIR/docs/OPERATIONS.md" <<'EOF'
import re, subprocess, sys

binary, doc = sys.argv[1], sys.argv[2]

def help_of(cmd):
    return subprocess.run([binary] + cmd.split() + ["--help"], capture_output=True,
                          text=True).stdout

def parse(text):
    """A --help text's entries [section, spec, help] and each flag's or key's variable."""
    entries, env, sect = [], {}, None
    for line in text.splitlines():
        if not line.strip():
            sect = None if sect == "env" else sect
            continue
        if not line.startswith(" "):
            sect = ("args" if line.startswith("arguments:") else
                    "flags" if line.startswith("flags:") else
                    "keys" if line.startswith("settings without a flag") else
                    "env" if line.startswith("environment") else None)
            continue
        if sect == "env":
            f = line.split()
            also = re.search(r"\(also (\S+)\)", line)
            if len(f) >= 3 and not f[2].startswith("("):  # serve: VARIABLE KEY FLAG
                env[f[1]] = (f[0], None)
                if f[2] != "-":
                    env[f[2]] = (f[0], None)
            else:
                env[f[1]] = (f[0], also.group(1) if also else None)
        elif sect in ("args", "flags", "keys"):
            if line.startswith("    "):  # the help of an entry too wide for its column
                entries[-1][2] = (entries[-1][2] + " " + line.strip()).strip()
            elif len(line) > 29 and line[28] == " " and line[29] != " ":
                entries.append([sect, line[:29].strip(), line[29:].strip()])
            else:
                entries.append([sect, line.strip(), ""])
    return entries, env

def rows(cmd):
    entries, env = parse(help_of(cmd))
    out = []
    for sect, spec, h in entries:
        name = spec.split()[0].rstrip(",")
        if name == "--help":
            continue
        h = h.replace("|", "\\|")
        var, also = env.get(name, (None, None))
        col = (f"`{var}`" + (f" (also {also})" if also else "")) if var else "—"
        if sect == "args":
            out.append(f"| `{spec}` (argument) | — | {h} |")
        elif sect == "keys":
            out.append(f"| `{spec}` (file and environment) | {col} | {h} |")
        else:
            out.append(f"| `{spec}` | {col} | {h} |")
    return out

def listed(cmd, section):
    names, on = [], False
    for line in help_of(cmd).splitlines():
        if line.startswith(section):
            on = True
        elif on and line.startswith("  ") and line.split():
            names.append(line.split()[0])
        elif on and not line.startswith(" "):
            on = False
    return names

tables, cur = {}, None
for line in open(doc):
    m = re.match(r"#### `rlorch (.+)`$", line.strip())
    if m:
        cur = m.group(1)
        tables[cur] = []
    elif line.startswith("#"):
        cur = None
    elif cur and line.startswith("| `"):
        tables[cur].append(line.rstrip("\n"))

commands = listed("", "commands:") + ["ctl " + c for c in listed("ctl", "commands")]
commands += ["bench " + c for c in listed("bench", "benchmarks:")]
print(f"commands {len(commands)}")
for cmd in commands:
    if cmd not in tables:
        print(f"FAIL rlorch {cmd} has a section in docs/OPERATIONS.md")
        continue
    if cmd == "bench":  # a list of the benchmarks: no settings of its own
        continue
    want, have = rows(cmd), tables[cmd]
    if not want:
        print(f"FAIL rlorch {cmd} --help lists no entry")
    elif cmd == "serve":
        names = {r.split("`")[1].split()[0] for r in have}
        missing = [r.split("`")[1].split()[0] for r in want
                   if r.split("`")[1].split()[0] not in names]
        print(("ok " if not missing else "FAIL ") + "the rlorch serve table has every flag and key"
              + (f" (missing: {' '.join(missing)})" if missing else ""))
    elif have == want:
        print(f"ok the rlorch {cmd} table is its --help")
    else:
        diff = [f"docs: {r}" for r in have if r not in want] + [f"--help: {r}" for r in want if r not in have]
        print(f"FAIL the rlorch {cmd} table is its --help: " + ("; ".join(diff) or "another order"))
EOF
)"
ncmd="$(sed -n 's/^commands //p' <<<"$doc_out")"
assert_eq 1 "$((${ncmd:-0} > 10))" "rlorch lists its commands ($ncmd)" || printf '%s\n' "$doc_out"
while IFS= read -r line; do
  case "$line" in
    "ok "*) pass "${line#ok }" ;;
    "FAIL "*) fail "${line#FAIL }" ;;
  esac
done <<<"$doc_out"
assert_eq "$((ncmd - 1))" "$(grep -cE '^(ok|FAIL) ' <<<"$doc_out")" "every command's table was checked"

# ---- Grafana dashboard --------------------------------------------------------------
dash_out="$(python3 - "$DEPLOY/grafana/rlorch.json" $METRICS <<'EOF'
import json, re, sys
path, known = sys.argv[1], set(sys.argv[2:])
try:
    dash = json.load(open(path))
except ValueError as e:
    print(f"does not parse: {e}")
    sys.exit(1)
exprs = []
def walk(panels):
    for p in panels:
        walk(p.get("panels", []))
        if p.get("type") == "row":
            continue
        targets = p.get("targets") or []
        if not targets:
            print(f"panel {p.get('title')!r} has no query")
        exprs.extend(t.get("expr", "") for t in targets)
walk(dash.get("panels", []))
for v in dash.get("templating", {}).get("list", []):
    q = v.get("query")
    exprs.append(q.get("query", "") if isinstance(q, dict) else str(q or ""))
used, bad = set(), set()
for e in exprs:
    for name in re.findall(r"\b(rlorch_[a-z0-9_]+)", e):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name in known:
            used.add(name)
        elif base in known:
            used.add(base)
        else:
            bad.add(name)
for b in sorted(bad):
    print(f"unknown metric {b}")
for m in sorted(known - used):
    print(f"metric {m} has no panel")
print(f"{len(exprs)} queries")
EOF
)"
assert_contains "$dash_out" "queries" "deploy/grafana/rlorch.json parses"
assert_not_contains "$dash_out" "unknown metric" "the dashboard queries only exported metrics"
assert_not_contains "$dash_out" "has no panel" "every exported metric has a panel"
assert_not_contains "$dash_out" "has no query" "every panel has a query"

# ---- systemd units ------------------------------------------------------------------
if command -v systemd-analyze >/dev/null 2>&1; then
  # verify wants the binary the unit runs: point ExecStart at the one built here,
  # and give the templates an instance name.
  units="$TEST_TMP/units"
  mkdir -p "$units"
  for f in "$DEPLOY"/systemd/*.service; do
    n="$(basename "$f")"
    sed "s#/usr/local/bin/rlorch#$RLORCH_BIN#" "$f" >"$units/${n/@./@0.}"
  done
  vout="$(cd "$units" && SYSTEMD_LOG_LEVEL=info systemd-analyze verify ./*.service 2>&1)"
  rc=$?
  assert_eq 0 "$rc" "systemd-analyze verify passes" || echo "$vout"
  # Unknown keys and bad values are only warnings: none may name our units.
  assert_not_contains "$vout" "rlorch-" "systemd-analyze has no warning about the units"
  for f in "$DEPLOY"/systemd/*.service; do
    grep -q '^Type=exec$' "$f" && grep -q '^Restart=on-failure$' "$f"
    assert_eq 0 $? "$(basename "$f"): Type=exec and Restart=on-failure"
  done
else
  skip "systemd-analyze not installed: the systemd units are not verified"
fi

# ---- agents: exit statuses against the units, the Kubernetes probe ---------------
# What the agents do is observed here, on a daemon with a short heartbeat
# timeout: the exit status of each way an agent ends, that an orchestrator
# restart ends none, and what deploy/agent-probe.sh (the pods' exec probe) says
# in each state. The units' Restart= and RestartPreventExitStatus= must then
# restart a failed agent and leave one stopped on purpose or misconfigured.
probe_bin="$TEST_TMP/probe-bin"
mkdir -p "$probe_bin"
ln -s "$RLORCH_BIN" "$probe_bin/rlorch"
probe() { # probe MODE NAME: the probe's exit status, its output in PROBE_OUT
  PROBE_OUT="$(PATH="$probe_bin:$PATH" RLORCH_ORCHESTRATOR="$GRPC_ADDR" RLORCH_NAME="$2" \
    RLORCH_TOKEN_FILE="$TEST_TMP/agent-token" sh "$DEPLOY/agent-probe.sh" "$1" 2>&1)"
}
probe_is() { # probe_is MODE NAME STATUS
  probe "$1" "$2"
  [[ $? == "$3" ]]
}
printf 'deploy-test-token-%s\n' "$$" >"$TEST_TMP/agent-token"
chmod 600 "$TEST_TMP/agent-token"
printf 'a-wrong-token\n' >"$TEST_TMP/wrong-token"
declare -A agent_exit=()

env -u RLORCH_ORCHESTRATOR timeout 30 "$RLORCH_BIN" inference >"$TEST_TMP/noaddr.log" 2>&1
agent_exit[config]=$?
assert_contains "$(cat "$TEST_TMP/noaddr.log")" "RLORCH_ORCHESTRATOR" "an agent without an orchestrator address says which setting is missing"
PROBE_OUT="$(RLORCH_NAME= sh "$DEPLOY/agent-probe.sh" ready 2>&1)"
assert_eq 2 $? "the probe without RLORCH_NAME exits 2"
assert_contains "$PROBE_OUT" "RLORCH_NAME" "the probe names the missing RLORCH_NAME"
PROBE_OUT="$(sh "$DEPLOY/agent-probe.sh" 2>&1)"
assert_eq 2 $? "the probe without a mode exits 2"

# The trainer's exit statuses too. Started before its orchestrator (as a
# unit may be), it waits for it without a limit; SIGTERM ends that wait.
RLORCH_ORCHESTRATOR="127.0.0.1:$(free_port 1)" \
  "$RLORCH_BIN" trainer --name "probe-trainer-$$" --layers 1 >"$TEST_TMP/trainer-waiting.log" 2>&1 &
trainer_pid=$!
track_pid "$trainer_pid"
wait_log 30 "event=orchestrator_unreachable" "$TEST_TMP/trainer-waiting.log"
assert_eq 0 $? "a trainer with no orchestrator yet keeps trying to register"
sleep 1
kill -0 "$trainer_pid" 2>/dev/null
assert_eq 0 $? "and keeps waiting (no registration timeout)"
kill -TERM "$trainer_pid"
if ! wait_until 15 sh -c "[ ! -e /proc/$trainer_pid ] || grep -q '^State:.*Z' /proc/$trainer_pid/status"; then
  fail "the waiting trainer exits within 15 s of SIGTERM"
else
  wait "$trainer_pid"
  agent_exit[trainer-sigterm]=$?
fi
assert_contains "$(cat "$TEST_TMP/trainer-waiting.log")" "event=exit status=0" "the trainer logs its exit status"

export RLORCH_HEARTBEAT_INTERVAL_MS=200 RLORCH_WORKER_TIMEOUT_MS=1000
if serve_start --token-file "$TEST_TMP/agent-token"; then
  RLORCH_ORCHESTRATOR="$GRPC_ADDR" RLORCH_TOKEN_FILE="$TEST_TMP/wrong-token" \
    timeout 30 "$RLORCH_BIN" trainer --name "probe-trainer-$$-refused" --layers 1 \
    >"$TEST_TMP/trainer-refused.log" 2>&1
  agent_exit[trainer-refused]=$?
  assert_contains "$(cat "$TEST_TMP/trainer-refused.log")" "register_refused" "a trainer with a wrong token is refused"

  name="probe-inference-$$"
  probe ready "$name"
  assert_eq 1 $? "probe ready: 1 while the orchestrator lists no such worker"
  assert_contains "$PROBE_OUT" "no worker named $name" "probe ready says that no worker has the name"
  probe alive "$name"
  assert_eq 1 $? "probe alive: 1 while the orchestrator answers and lists no such worker"

  RLORCH_ORCHESTRATOR="$GRPC_ADDR" RLORCH_TOKEN_FILE="$TEST_TMP/wrong-token" \
    timeout 30 "$RLORCH_BIN" inference --name "$name-refused" >"$TEST_TMP/refused.log" 2>&1
  agent_exit[refused]=$?

  RLORCH_ORCHESTRATOR="$GRPC_ADDR" RLORCH_TOKEN_FILE="$TEST_TMP/agent-token" \
    "$RLORCH_BIN" inference --name "$name" >"$TEST_TMP/agent.log" 2>&1 &
  agent_pid=$!
  track_pid "$agent_pid"
  wait_until 15 probe_is ready "$name" 0
  probe ready "$name"
  assert_eq 0 $? "probe ready: 0 once the agent has registered and opened its stream" || echo "$PROBE_OUT"
  probe alive "$name"
  assert_eq 0 $? "probe alive: 0 for a live agent"

  # A stopped process sends no heartbeat: lost after 1 s, then both probes fail.
  kill -STOP "$agent_pid"
  wait_until 10 probe_is ready "$name" 1
  probe ready "$name"
  assert_eq 1 $? "probe ready: 1 for an agent the orchestrator has lost"
  assert_contains "$PROBE_OUT" "not live: LOST" "the probe says the worker is lost"
  probe alive "$name"
  assert_eq 1 $? "probe alive: 1 for a lost agent while the orchestrator answers"
  kill -CONT "$agent_pid"
  wait_until 15 probe_is ready "$name" 0
  probe ready "$name"
  assert_eq 0 $? "probe ready: 0 again once the agent has registered again" || echo "$PROBE_OUT"

  # An orchestrator restart: the agent stays, the liveness probe passes while
  # the orchestrator is away, and the agent comes back by itself.
  serve_stop
  probe ready "$name"
  assert_eq 1 $? "probe ready: 1 while the orchestrator is down"
  probe alive "$name"
  assert_eq 0 $? "probe alive: 0 while the orchestrator is down (nothing known against the agent)"
  assert_contains "$PROBE_OUT" "not answering" "probe alive says the orchestrator does not answer"
  sleep 1
  kill -0 "$agent_pid" 2>/dev/null
  assert_eq 0 $? "the agent keeps running while the orchestrator is down"
  if serve_restart --token-file "$TEST_TMP/agent-token"; then
    wait_until 20 probe_is ready "$name" 0
    probe ready "$name"
    assert_eq 0 $? "after an orchestrator restart the agent is registered again by itself" || echo "$PROBE_OUT"
  fi
  kill -TERM "$agent_pid"
  # Ended: gone, or a zombie waiting for the wait below.
  ended="[ ! -e /proc/$agent_pid ] || grep -q '^State:.*Z' /proc/$agent_pid/status"
  if ! wait_until 15 sh -c "$ended"; then
    fail "the agent exits within 15 s of SIGTERM"
  else
    wait "$agent_pid"
    agent_exit[sigterm]=$?
  fi
  serve_stop
fi
unset RLORCH_HEARTBEAT_INTERVAL_MS RLORCH_WORKER_TIMEOUT_MS
assert_contains "$(cat "$TEST_TMP/refused.log" 2>/dev/null)" "register_refused" "an agent with a wrong token is refused"

# The units against those statuses: what systemd does with each (Restart=
# on-failure restarts on a non-zero status unless RestartPreventExitStatus
# names it; always restarts on every one).
for f in "$DEPLOY"/systemd/rlorch-trainer@.service "$DEPLOY"/systemd/rlorch-inference@.service; do
  u="$(basename "$f")"
  restart="$(sed -n 's/^Restart=//p' "$f")"
  prevent=" $(sed -n 's/^RestartPreventExitStatus=//p' "$f" | tr '\n' ' ') "
  restarts() { # restarts STATUS: yes or no, for this unit
    local s=$1
    [[ "$prevent" == *" $s "* ]] && { echo no; return; }
    case "$restart" in
      always) echo yes ;;
      on-failure) ((s != 0)) && echo yes || echo no ;;
      *) echo "unsupported Restart=$restart" ;;
    esac
  }
  assert_eq "1 yes" "${agent_exit[refused]:-?} $(restarts "${agent_exit[refused]:-1}")" \
    "$u: an agent that fails (registration refused) exits 1 and is restarted"
  assert_eq "0 no" "${agent_exit[sigterm]:-?} $(restarts "${agent_exit[sigterm]:-0}")" \
    "$u: an agent stopped with SIGTERM exits 0 and stays stopped"
  assert_eq "2 no" "${agent_exit[config]:-?} $(restarts "${agent_exit[config]:-2}")" \
    "$u: a misconfigured agent exits 2 and is not restarted"
done
u=rlorch-trainer@.service
assert_eq "1 0" "${agent_exit[trainer-refused]:-?} ${agent_exit[trainer-sigterm]:-?}" \
  "$u: the trainer itself exits 1 when refused, 0 on SIGTERM while it waits for its orchestrator"

# ---- Kubernetes manifests -----------------------------------------------------------
# Rendered with `kubectl kustomize` (Debian 12's kubectl 1.20 or a newer one):
# the default kustomization and the Prometheus Operator overlay, then checked
# object by object.
version="$("$RLORCH_BIN" version | sed -n '1s/^rlorch \([^ ]*\).*/\1/p')"
if command -v kubectl >/dev/null 2>&1 && python3 -c 'import yaml' 2>/dev/null; then
  kubectl kustomize "$DEPLOY/k8s" >"$TEST_TMP/k8s.yaml" 2>"$TEST_TMP/k8s.err"
  assert_eq 0 $? "kubectl kustomize deploy/k8s renders" || cat "$TEST_TMP/k8s.err"
  kubectl kustomize "$DEPLOY/k8s/overlays/prometheus-operator" >"$TEST_TMP/k8s-po.yaml" 2>"$TEST_TMP/k8s-po.err"
  assert_eq 0 $? "kubectl kustomize deploy/k8s/overlays/prometheus-operator renders" || cat "$TEST_TMP/k8s-po.err"
  k8s_out="$(python3 - "$TEST_TMP/k8s.yaml" "$TEST_TMP/k8s-po.yaml" "$DEPLOY" "$version" <<'EOF'
import os, re, sys, yaml

default_path, overlay_path, deploy, version = sys.argv[1:5]

said = set()
def say(ok, what):
    line = ("ok " if ok else "FAIL ") + what
    if line not in said:
        said.add(line)
        print(line)

def load(path, what):
    try:
        docs = [d for d in yaml.safe_load_all(open(path)) if d is not None]
    except yaml.YAMLError as e:
        say(False, f"{what}: every object parses ({e})")
        return []
    bad = [d for d in docs if not isinstance(d, dict) or not d.get("kind")
           or not (d.get("metadata") or {}).get("name")]
    say(not bad and docs, f"{what}: {len(docs)} objects parse, each with a kind and a name")
    return docs

# What each image installs, read from its Dockerfile: `install ... /out/PATH`.
def installed(dockerfile):
    text = open(os.path.join(deploy, dockerfile)).read()
    return set(re.findall(r"install -D -m \d+ \S+ /out(/\S+)", text))
images = {"rlorch": installed("Dockerfile"), "rlorch-cuda": installed("Dockerfile.cuda")}

def labels_match(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())

def check(docs, what):
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
        say(not d["metadata"].get("namespace"), f"{what}: {d['kind']}/{d['metadata']['name']} sets no namespace")
    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    names = {k: {d["metadata"]["name"] for d in v} for k, v in by_kind.items()}
    workloads = [d for k in ("Deployment", "StatefulSet", "DaemonSet") for d in by_kind.get(k, [])]
    say(len(workloads) == 3, f"{what}: the orchestrator Deployment and the two agent workloads render")

    # Workloads: selectors, pods, containers.
    pods = []
    for w in workloads:
        wn = f"{w['kind']}/{w['metadata']['name']}"
        tmpl = w["spec"]["template"]
        sel = w["spec"]["selector"]["matchLabels"]
        say(labels_match(sel, tmpl["metadata"]["labels"]), f"{what}: {wn}: its selector matches its pod labels")
        pods.append((wn, tmpl["metadata"]["labels"], tmpl["spec"]))
        if w["kind"] == "StatefulSet":
            svc = services.get(w["spec"]["serviceName"])
            say(svc is not None and svc["spec"].get("clusterIP") == "None",
                f"{what}: {wn}: its serviceName {w['spec']['serviceName']} is a headless Service")
        spec = tmpl["spec"]
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        for v in vols.values():
            if "configMap" in v:
                say(v["configMap"]["name"] in names.get("ConfigMap", set()), f"{what}: {wn}: ConfigMap {v['configMap']['name']} is defined")
            if "persistentVolumeClaim" in v:
                c = v["persistentVolumeClaim"]["claimName"]
                say(c in names.get("PersistentVolumeClaim", set()), f"{what}: {wn}: PVC {c} is defined")
            if "secret" in v:
                # The token Secret alone is made out of band (never shipped).
                say(v["secret"]["secretName"] == "rlorch-token" and "Secret" not in by_kind,
                    f"{what}: {wn}: its Secret is rlorch-token, which the operator creates")
        for c in spec["containers"]:
            cn = f"{wn}/{c['name']}"
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            for kind in ("livenessProbe", "readinessProbe"):
                p = c.get(kind)
                say(bool(p), f"{what}: {cn} has a {kind}")
                if not p:
                    continue
                if "grpc" in p or "httpGet" in p or "tcpSocket" in p:
                    port = (p.get("grpc") or p.get("httpGet") or p.get("tcpSocket"))["port"]
                    say(port in ports or port in ports.values(), f"{what}: {cn}: {kind} port {port} is a container port")
            res = c.get("resources") or {}
            req, lim = res.get("requests") or {}, res.get("limits") or {}
            say(all(k in req for k in ("cpu", "memory")) and all(k in lim for k in ("cpu", "memory")),
                f"{what}: {cn}: CPU and memory requests and limits")
            for m in c.get("volumeMounts", []):
                say(m["name"] in vols, f"{what}: {cn}: volume {m['name']} is defined")
            # Images: one of the two, at the version built here; GPUs only with CUDA.
            image, _, tag = c["image"].partition(":")
            gpu = "nvidia.com/gpu" in lim
            say(image in images and tag == version, f"{what}: {cn}: image {c['image']} is rlorch or rlorch-cuda at {version}")
            say(image == ("rlorch-cuda" if gpu else "rlorch"),
                f"{what}: {cn}: {'requests a GPU and runs' if gpu else 'requests no GPU and runs'} {image}")
            # What runs in the container is installed by that image's Dockerfile.
            execs = [c["command"][0]] if c.get("command") else ["/usr/local/bin/rlorch"]
            execs += [c[k]["exec"]["command"][0] for k in ("startupProbe", "livenessProbe", "readinessProbe")
                      if c.get(k, {}).get("exec")]
            for e in execs:
                say(e in images.get(image, set()), f"{what}: {cn}: {e} is installed in the {image} image")
            run_as = (c.get("securityContext") or {}).get("runAsUser") or spec["securityContext"]["runAsUser"]
            say(run_as == 10001 and spec["securityContext"].get("runAsNonRoot") is True,
                f"{what}: {cn}: runs as the images' user 10001, non-root")
            say(c["securityContext"].get("readOnlyRootFilesystem") is True, f"{what}: {cn}: read-only root file system")
            # Every Service an address names exists, with that port.
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            for k, v in env.items():
                m = re.fullmatch(r"(?:dns:///)?([a-z0-9-]+)(?:\.[a-z0-9.-]+)?:(\d+)", v or "")
                if not m or m.group(1) in ("0", "127"):
                    continue
                s = services.get(m.group(1))
                say(s is not None and int(m.group(2)) in [p["port"] for p in s["spec"]["ports"]],
                    f"{what}: {cn}: {k}={v} names a Service {m.group(1)} with port {m.group(2)}")
            for k in ("RLORCH_TOKEN_FILE",):
                if k in env:
                    say(any(env[k].startswith(m["mountPath"] + "/") for m in c.get("volumeMounts", [])
                            if "secret" in vols.get(m["name"], {})), f"{what}: {cn}: {k} lies in the mounted Secret")
            if c.get("command", [None])[-1] in ("trainer", "inference"):
                say("RLORCH_NAME" in {e["name"] for e in c.get("env", [])}, f"{what}: {cn}: RLORCH_NAME is set for the probe")

    # Services select pods, and their target ports are those pods' ports.
    for sn, s in services.items():
        chosen = [(wn, spec) for wn, labels, spec in pods if labels_match(s["spec"]["selector"], labels)]
        say(len(chosen) == 1, f"{what}: Service {sn} selects the pods of one workload ({', '.join(w for w, _ in chosen) or 'none'})")
        for p in s["spec"]["ports"]:
            tp = p.get("targetPort", p["port"])
            ok = any(tp in [q.get("name") for c in spec["containers"] for q in c.get("ports", [])] or
                     tp in [q["containerPort"] for c in spec["containers"] for q in c.get("ports", [])]
                     for _, spec in chosen)
            say(bool(chosen) and ok, f"{what}: Service {sn}: port {p['name']} targets a container port ({tp})")

    # The ConfigMap's token_file is where the Deployment mounts the Secret.
    for cm in by_kind.get("ConfigMap", []):
        conf = yaml.safe_load(cm["data"]["rlorch.yaml"])
        dep = next(d for d in by_kind["Deployment"])
        c = dep["spec"]["template"]["spec"]["containers"][0]
        vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        say(any(conf.get("token_file", "").startswith(m["mountPath"] + "/") for m in c["volumeMounts"]
                if "secret" in vols.get(m["name"], {})), f"{what}: the ConfigMap's token_file lies in the mounted Secret")
    return by_kind, services

default = load(default_path, "default")
for d in default:
    if d["kind"] == "Deployment" and d["metadata"]["name"] == "rlorch":
        say(d["spec"]["replicas"] == 1 and d["spec"]["strategy"]["type"] == "Recreate",
            "default: one rlorch serve replica, Recreate (one SQLite writer)")
overlay = load(overlay_path, "prometheus-operator")
kinds, _ = check(default, "default")
say("Secret" not in kinds, "default: no Secret is applied (no known token ships)")
say(not any(k in kinds for k in ("ServiceMonitor", "PrometheusRule")), "default: no Prometheus Operator object")
for d in default + overlay:
    if d["kind"] == "Secret":
        say(not (d.get("data") or d.get("stringData")), f"Secret {d['metadata']['name']} holds no literal token")
# The overlay: the default objects unchanged, plus the operator's two.
po = ("ServiceMonitor", "PrometheusRule")
key = lambda d: (d["kind"], d["metadata"]["name"])
rest = sorted((d for d in overlay if d["kind"] not in po), key=key)
say(rest == sorted(default, key=key), "prometheus-operator: the default objects, unchanged")
kinds = {}
for d in overlay:
    kinds.setdefault(d["kind"], []).append(d)
say(all(len(kinds.get(k, [])) == 1 for k in po), "prometheus-operator: one ServiceMonitor and one PrometheusRule")
services = {s["metadata"]["name"]: s for s in kinds.get("Service", [])}
for sm in kinds.get("ServiceMonitor", []):
    sel = sm["spec"]["selector"]["matchLabels"]
    chosen = [s for s in services.values() if labels_match(sel, s["metadata"].get("labels", {}))]
    say([s["metadata"]["name"] for s in chosen] == ["rlorch"],
        "prometheus-operator: the ServiceMonitor selects the Service rlorch alone (job label rlorch, as the rules expect)")
    for ep in sm["spec"]["endpoints"]:
        say(bool(chosen) and ep["port"] in [p["name"] for p in chosen[0]["spec"]["ports"]],
            f"prometheus-operator: the ServiceMonitor's port {ep['port']} is a port of that Service")
rules = yaml.safe_load(open(os.path.join(deploy, "prometheus", "rlorch-rules.yaml")))
for pr in kinds.get("PrometheusRule", []):
    same = pr["spec"]["groups"] == rules["groups"]
    say(same, "prometheus-operator: the PrometheusRule's groups are deploy/prometheus/rlorch-rules.yaml's"
        + ("" if same else " (regenerate spec: as prometheusrule.yaml's header says)"))
EOF
)"
  assert_contains "$k8s_out" "ok " "the rendered manifests were checked" || printf '%s\n' "$k8s_out"
  while IFS= read -r line; do
    case "$line" in
      "ok "*) pass "${line#ok }" ;;
      "FAIL "*) fail "${line#FAIL }" ;;
      *) [[ -n "$line" ]] && fail "manifest check: $line" ;;
    esac
  done <<<"$k8s_out"
  # No kustomization applies the example Secret.
  assert_eq "" "$(find "$DEPLOY/k8s" -name kustomization.yaml -exec grep -v '^ *#' {} + | grep secret.example)" \
    "no kustomization names secret.example.yaml"
else
  skip "kubectl or PyYAML not installed: the Kubernetes manifests are not rendered"
fi

# ---- container images ---------------------------------------------------------------
# Docker is not needed: each Dockerfile is read as Docker would read it and
# checked against the tree, the Makefile and Debian 12's archive.
#  - every RUN parses as a shell command line;
#  - every COPY source exists and the Dockerfile's .dockerignore keeps it;
#    every --from names an earlier stage;
#  - every ARG a FROM uses has a default before the first FROM, and every ARG
#    a stage's RUN uses is declared in that stage (Docker's scoping);
#  - the build stage installs the Makefile's build packages (make deps-build)
#    and runs the Makefile's build (make -o deps build), with CUDA off for
#    deploy/Dockerfile and on for deploy/Dockerfile.cuda;
#  - every package an apt-get install names exists in Debian 12, or is pinned
#    to a version of NVIDIA's repository built for the image's CUDA version;
#  - the runtime stage installs what deploy/runtime-packages.sh found in the
#    build stage.
make_build_pkgs="$(make -s --no-print-directory -C "$RLORCH_SOURCE_DIR" \
  --eval='print-%: ; @echo $($*)' print-DEB_BUILD_PKGS)"
assert_contains "$make_build_pkgs" "libgrpc-dev" "the Makefile lists its build packages (DEB_BUILD_PKGS)"
archive_ok=0
if apt-cache policy 2>/dev/null | grep -q 'bookworm'; then archive_ok=1; fi
df_out="$(python3 - "$RLORCH_SOURCE_DIR" "$archive_ok" "$make_build_pkgs" <<'EOF'
import fnmatch, os, re, shlex, subprocess, sys

root, archive_ok, build_pkgs = sys.argv[1], sys.argv[2] == "1", sys.argv[3].split()

said = set()
def say(ok, what):
    line = ("ok " if ok else "FAIL ") + what
    if line not in said:
        said.add(line)
        print(line)

def in_debian(pkg, cache={}):
    if pkg not in cache:
        r = subprocess.run(["apt-cache", "show", "--no-all-versions", pkg], capture_output=True, text=True)
        cache[pkg] = r.returncode == 0 and "Package: " + pkg in r.stdout
    return cache[pkg]

def instructions(path):
    """(instruction, arguments) pairs, continuation lines joined, comments dropped."""
    out, cur = [], ""
    for line in open(path):
        s = line.rstrip("\n")
        if not cur and (not s.strip() or s.lstrip().startswith("#")):
            continue
        if cur and s.lstrip().startswith("#"):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        cur += s
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    return out

for name, cuda in (("Dockerfile", False), ("Dockerfile.cuda", True)):
    path = os.path.join(root, "deploy", name)
    ins = instructions(path)
    ignore = [l.strip() for l in open(path + ".dockerignore") if l.strip() and not l.startswith("#")]
    pre_args, stages, cur = {}, [], None
    for word, rest in ins:
        if word == "ARG" and cur is None:
            k, _, v = rest.partition("=")
            pre_args[k] = v
        elif word == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            cur = {"from": m.group(1), "name": m.group(2), "args": set(), "run": [], "copy": [], "ins": []}
            stages.append(cur)
        elif cur is not None:
            cur["ins"].append((word, rest))
            if word == "ARG":
                cur["args"].add(rest.partition("=")[0])
            elif word == "RUN":
                cur["run"].append(rest)
            elif word == "COPY":
                cur["copy"].append(rest)
    say(len(stages) == 2 and stages[0]["name"] == "build", f"{name}: a build stage and a runtime stage")
    if len(stages) != 2:
        continue
    build, runtime = stages

    # ARGs: those of FROM have defaults up front; those of RUN are in scope.
    for st in stages:
        for a in re.findall(r"\$\{?([A-Z_]+)\}?", st["from"]):
            say(pre_args.get(a, "") != "", f"{name}: FROM {st['from']}: {a} has a default before the first FROM")
        for r in st["run"]:
            for a in set(re.findall(r"\$\{([A-Z_]+)\}", r)) & set(pre_args):
                say(a in st["args"], f"{name}: {st['name'] or 'runtime'} stage: ARG {a} is declared in the stage that uses it")

    # Every RUN is a command line /bin/sh can parse.
    for st in stages:
        for r in st["run"]:
            chk = subprocess.run(["sh", "-n", "-c", r], capture_output=True, text=True)
            say(chk.returncode == 0, f"{name}: RUN {' '.join(r.split())[:40]}...: sh parses it" + (f" ({chk.stderr.strip()})" if chk.returncode else ""))

    # COPY sources exist in the context and are not ignored.
    names = [s["name"] for s in stages if s["name"]]
    for st in stages:
        for c in st["copy"]:
            words = shlex.split(c)
            frm = [w.split("=", 1)[1] for w in words if w.startswith("--from=")]
            srcs = [w for w in words if not w.startswith("--")][:-1]
            if frm:
                say(frm[0] in names[: stages.index(st)], f"{name}: COPY --from={frm[0]} names an earlier stage")
                continue
            for s in srcs:
                p = os.path.normpath(os.path.join(root, s))
                ignored = s != "." and any(fnmatch.fnmatch(s, pat) or fnmatch.fnmatch(s.split("/")[0], pat) for pat in ignore)
                say(os.path.exists(p) and not ignored, f"{name}: COPY {s}: exists and is not .dockerignored")
    for f in ("deploy/agent-probe.sh", "deploy/runtime-packages.sh", "deploy/config/rlorch.yaml"):
        for r in build["run"]:
            if f in r:
                say(os.path.exists(os.path.join(root, f)), f"{name}: {f}, which the build stage uses, exists")
                break

    # The Makefile's packages and build; CUDA as the image says.
    brun = " && ".join(build["run"])
    say("make deps-build" in brun, f"{name}: the build stage installs the Makefile's build packages (make deps-build)")
    at = lambda pred: next((i for i, x in enumerate(build["ins"]) if pred(*x)), None)
    cp = at(lambda w, r: w == "COPY" and r.split()[0] == "Makefile")
    dr = at(lambda w, r: w == "RUN" and "make deps-build" in r)
    say(cp is not None and dr is not None and cp < dr, f"{name}: the Makefile is copied before make deps-build runs")
    m = re.search(r"make -o deps build (.*?)(?: &&|$)", brun)
    say(bool(m), f"{name}: the build stage runs the Makefile's build (make -o deps build)")
    if m:
        flag = "-DRLORCH_WITH_CUDA=" + ("ON" if cuda else "OFF")
        say(flag in m.group(1), f"{name}: the build has {flag}")
    say("runtime-packages.sh build-image/rlorch >/out/usr/share/rlorch/runtime-packages" in brun,
        f"{name}: the build stage lists the packages of the libraries it loads")
    rrun = " && ".join(runtime["run"])
    say("/usr/share/rlorch/runtime-packages" in rrun and "rlorch version" in rrun,
        f"{name}: the runtime stage installs those packages and runs rlorch version")
    say(any(w == "USER" and r.startswith("10001") for w, r in runtime["ins"]), f"{name}: runs as uid 10001")

    # Packages named by apt-get install: Debian 12's, or NVIDIA's pinned ones.
    cuda_mm = ".".join(pre_args.get("CUDA_VERSION", "").split(".")[:2])
    for st in stages:
        for r in st["run"]:
            for seg in re.split(r"&&|;|\|", r):
                words = seg.split()
                if "apt-get" not in words or "install" not in words:
                    continue
                for w in words[words.index("install") + 1:]:
                    w = w.strip('"')
                    if w.startswith("-") or w.startswith("$"):
                        continue
                    pkg, _, ver = w.partition("=")
                    if ver:
                        val = pre_args.get(re.sub(r"[${}]", "", ver), ver)
                        say(cuda and val.endswith("+cuda" + cuda_mm),
                            f"{name}: {pkg}={val} is NVIDIA's build for CUDA {cuda_mm}")
                    elif archive_ok:
                        say(in_debian(pkg), f"{name}: package {pkg} is in Debian 12")
    if archive_ok:
        missing = [p for p in build_pkgs if not in_debian(p)]
        say(not missing, f"{name}: the Makefile's build packages are in Debian 12" + (f" (not: {missing})" if missing else ""))
if not archive_ok:
    print("SKIP apt has no Debian 12 package lists (apt-get update): package names are not checked")
EOF
)"
assert_contains "$df_out" "ok " "the Dockerfiles were checked" || printf '%s\n' "$df_out"
while IFS= read -r line; do
  case "$line" in
    "ok "*) pass "${line#ok }" ;;
    "FAIL "*) fail "${line#FAIL }" ;;
    "SKIP "*) skip "${line#SKIP }" ;;
    *) [[ -n "$line" ]] && fail "Dockerfile check: $line" ;;
  esac
done <<<"$df_out"

# The build packages are enough: each dependency CMakeLists.txt requires comes
# from one of them (its pkg-config file, header, library or program).
if command -v dpkg-query >/dev/null 2>&1 && command -v pkg-config >/dev/null 2>&1; then
  need_missing=""
  while read -r kind what; do
    case "$kind" in
      pkg) f="$(pkg-config --variable=pcfiledir "$what")/$what.pc" ;;
      header) f="$(find /usr/include -maxdepth 2 -name "$what" -print -quit)" ;;
      lib) f="$(find /usr/lib /lib -maxdepth 2 -name "lib$what.so" -print -quit)" ;;
      prog) f="$(command -v "$what")" ;;
    esac
    pkg=""
    [[ -n "$f" ]] && pkg="$(dpkg-query -S "$f" 2>/dev/null || dpkg-query -S "$(readlink -f "$f")" 2>/dev/null)"
    pkg="${pkg%%:*}"
    [[ " $make_build_pkgs " == *" $pkg "* ]] || need_missing="$need_missing $kind:$what($pkg)"
  done < <(sed -n -e 's/^pkg_check_modules([A-Z]* REQUIRED IMPORTED_TARGET \([^)]*\))$/pkg \1/p' \
    -e 's/^find_path([A-Z_]* \([^ ]*\) REQUIRED)$/header \1/p' \
    -e 's/^find_library([A-Z_]* \([^ ]*\) REQUIRED)$/lib \1/p' \
    -e 's/^find_program([A-Z_]* \([^ ]*\) REQUIRED)$/prog \1/p' "$RLORCH_SOURCE_DIR/CMakeLists.txt")
  assert_eq "" "$need_missing" "every dependency CMakeLists.txt requires comes from a package of DEB_BUILD_PKGS"
fi

# deploy/runtime-packages.sh, as the build stages run it: every library this
# build loads belongs to a package it prints, and one that belongs to none (a
# copy outside every package) is an error naming it.
# A build against a CUDA toolkit unpacked under /usr/local/cuda (not a package)
# links its runtime from there: the images take it from their CUDA base.
unpackaged=""
ldd "$RLORCH_BIN" | grep -q '=> /usr/local/cuda/' && unpackaged=/usr/local/cuda/
rp_out="$(UNPACKAGED=$unpackaged sh "$DEPLOY/runtime-packages.sh" "$RLORCH_BIN" 2>/dev/null)"
assert_eq 0 $? "runtime-packages.sh lists the packages of rlorch's libraries" || echo "$rp_out"
missing=""
for lib in $(ldd "$RLORCH_BIN" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'); do
  [[ -n "$unpackaged" && "$lib" == "$unpackaged"* ]] && continue
  pkg="$(dpkg-query -S "$(readlink -f "$lib")" 2>/dev/null || dpkg-query -S "$lib" 2>/dev/null)"
  grep -qx "${pkg%%:*}" <<<"$rp_out" || missing="$missing $lib"
done
assert_eq "" "$missing" "every library rlorch loads is in a listed package"
assert_contains "$rp_out" "libgrpc29" "the list names gRPC's package"
mkdir -p "$TEST_TMP/stray-lib"
cp "$(ldd "$RLORCH_BIN" | awk '$1 == "libjansson.so.4" {print $3}')" "$TEST_TMP/stray-lib/"
rp_bad="$(LD_LIBRARY_PATH="$TEST_TMP/stray-lib" UNPACKAGED=$unpackaged sh "$DEPLOY/runtime-packages.sh" "$RLORCH_BIN" 2>&1)"
assert_eq 1 $? "runtime-packages.sh fails on a library no package holds"
assert_contains "$rp_bad" "$TEST_TMP/stray-lib/libjansson.so.4 belongs to no package" "and names it"
assert_exit 1 sh "$DEPLOY/runtime-packages.sh" "$DEPLOY/agent-probe.sh"

df="$(cat "$DEPLOY/Dockerfile")"
assert_contains "$df" "EXPOSE 7070 9464" "the image exposes the gRPC and metrics ports"
assert_contains "$df" "/healthz" "the image's HEALTHCHECK uses /healthz"
assert_contains "$df" 'ENTRYPOINT ["/usr/local/bin/rlorch", "serve"]' "the image runs rlorch serve"
assert_contains "$(cat "$DEPLOY/Dockerfile.cuda")" 'NVIDIA_DRIVER_CAPABILITIES=compute,utility' \
  "the CUDA image asks the container toolkit for the driver's compute library"
for f in Dockerfile Dockerfile.cuda; do
  assert_not_contains "$(grep '^USER' "$DEPLOY/$f")" "root" "$f runs as a non-root user"
done

finish
