#!/usr/bin/env bash
# The deployment files are valid and agree with the program: Prometheus rules
# (syntax and alert unit tests), the example configuration (accepted by
# `rlorch serve --print-config`), the dashboard (only metrics the daemon
# exports), the systemd units, the Kubernetes manifests and the image's
# runtime packages.
source "$(dirname "$0")/lib.sh"

DEPLOY="$RLORCH_SOURCE_DIR/deploy"

# Metric names the daemon exports (docs/OPERATIONS.md has the table).
METRICS="rlorch_build_info rlorch_rpc_requests_total rlorch_rpc_duration_seconds
rlorch_event_loop_lag_seconds rlorch_runs rlorch_step_duration_seconds
rlorch_broadcast_duration_seconds rlorch_staging_seconds rlorch_broadcast_bytes_total
rlorch_broadcast_throughput_bytes_per_second rlorch_policy_version rlorch_async_level
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
max_message_bytes max_rollout_bytes batch_chunk_bytes rollout_buffer_bytes rollout_log shutdown_grace_s heartbeat_interval_ms worker_timeout_ms max_workers lost_worker_retention_s http_timeout_ms
http_max_connections default_policy max_async_level rollouts_per_step max_requests_per_worker
group_size prompts_file max_prompt_tokens max_tokens temperature request_timeout_ms staging_budget_bytes
broadcast_gbps_host broadcast_gbps_staged broadcast_gbps_direct broadcast_safety broadcast_slack_ms
data_channel_tls"
# The list is the program's: the keys --print-config prints, all of them.
assert_eq "$(tr ' ' '\n' <<<"$keys" | sed '/^$/d' | sort | tr '\n' ' ')" \
  "$("$RLORCH_BIN" serve --print-config | sed -n 's/^\([a-z_]*\):.*/\1/p' | sort | tr '\n' ' ')" \
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
  "$DEPLOY/k8s/configmap.yaml" |
  sed "s#^token_file:.*#token_file: \"$TEST_TMP/token\"#" >"$TEST_TMP/configmap.yaml"
assert_exit 0 "$RLORCH_BIN" serve --config "$TEST_TMP/configmap.yaml" --print-config
missing=""
for k in $keys; do
  grep -Eq "^#? ?$k:" "$TEST_TMP/configmap.yaml" || missing="$missing $k"
done
assert_eq "" "$missing" "deploy/k8s/configmap.yaml lists every configuration key"
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

# ---- Kubernetes manifests -----------------------------------------------------------
if command -v kubectl >/dev/null 2>&1 && python3 -c 'import yaml' 2>/dev/null; then
  if assert_exit 0 kubectl kustomize "$DEPLOY/k8s"; then
    printf '%s\n' "$LAST_OUTPUT" >"$TEST_TMP/k8s.yaml"
    k8s_out="$(python3 - "$TEST_TMP/k8s.yaml" <<'EOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
kinds = sorted(d["kind"] for d in docs)
print("kinds", " ".join(kinds))
for d in docs:
    if d["metadata"].get("namespace"):
        print("namespaced", d["kind"])
dep = next(d for d in docs if d["kind"] == "Deployment")
spec = dep["spec"]
print("replicas", spec["replicas"], "strategy", spec["strategy"]["type"])
pod = spec["template"]["spec"]
c = pod["containers"][0]
print("liveness", c["livenessProbe"]["grpc"]["port"], "readiness", c["readinessProbe"]["grpc"]["port"])
print("nonroot", pod["securityContext"]["runAsNonRoot"], "rofs", c["securityContext"]["readOnlyRootFilesystem"])
print("ports", " ".join(sorted(str(p["containerPort"]) for p in c["ports"])))
EOF
)"
    assert_contains "$k8s_out" "ConfigMap DaemonSet Deployment PersistentVolumeClaim Secret Service ServiceMonitor StatefulSet" "all manifests render"
    assert_not_contains "$k8s_out" "namespaced" "the manifests set no namespace"
    assert_contains "$k8s_out" "replicas 1 strategy Recreate" "one serve replica, Recreate"
    assert_contains "$k8s_out" "liveness 7070 readiness 7070" "gRPC probes on 7070"
    assert_contains "$k8s_out" "nonroot True rofs True" "non-root, read-only root file system"
    assert_contains "$k8s_out" "ports 7070 9464" "gRPC and metrics ports"
  fi
else
  skip "kubectl or PyYAML not installed: the Kubernetes manifests are not rendered"
fi

# ---- container image: the runtime stage installs what the binary links ----------
if command -v readelf >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1; then
  runtime_pkgs="$(awk '/^FROM/{n++} n==2' "$DEPLOY/Dockerfile" | tr ' \\' '\n\n' | grep -E '^lib[a-z0-9.+-]+$')"
  lddout="$(ldd "$RLORCH_BIN" 2>/dev/null)"
  # The listed packages and everything they depend on (apt installs those too);
  # a build without --as-needed links transitive libraries directly.
  closure="$(python3 - $runtime_pkgs <<'PY'
import re, subprocess, sys
seen, todo = set(), list(sys.argv[1:])
while todo:
    p = todo.pop()
    if p in seen:
        continue
    seen.add(p)
    r = subprocess.run(["dpkg-query", "-W", "-f=${Depends}", p], capture_output=True, text=True)
    for alt in r.stdout.split(","):
        name = re.split(r"[ :(|]", alt.strip())[0]
        if name:
            todo.append(name)
print("\n".join(sorted(seen)))
PY
)"
  missing=""
  for lib in $(readelf -d "$RLORCH_BIN" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'); do
    case "$lib" in libasan* | libubsan* | libcuda* | libnccl* | libc.so* | libm.so* | \
      libgcc_s* | libstdc++* | ld-linux* | libpthread* | libdl*) continue ;; esac
    p="$(awk -v l="$lib" '$1 == l {print $3}' <<<"$lddout")"
    [[ -n "$p" ]] || { missing="$missing $lib(unresolved)"; continue; }
    pkg="$(dpkg -S "$(readlink -f "$p")" 2>/dev/null || dpkg -S "$p" 2>/dev/null)"
    pkg="${pkg%%:*}"
    [[ -n "$pkg" ]] || continue # not from a Debian package (a local CUDA toolkit)
    grep -qx "$pkg" <<<"$closure" || missing="$missing $lib($pkg)"
  done
  assert_eq "" "$missing" "the image's runtime stage installs every library rlorch links"
else
  skip "readelf or dpkg missing: the image's runtime packages are not checked"
fi
df="$(cat "$DEPLOY/Dockerfile")"
assert_contains "$df" "EXPOSE 7070 9464" "the image exposes the gRPC and metrics ports"
assert_contains "$df" "/healthz" "the image's HEALTHCHECK uses /healthz"
assert_contains "$df" 'ENTRYPOINT ["/usr/local/bin/rlorch", "serve"]' "the image runs rlorch serve"
assert_not_contains "$(grep '^USER' "$DEPLOY/Dockerfile")" "root" "the image runs as a non-root user"

finish
