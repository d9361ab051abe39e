#!/usr/bin/env bash
# The fault suite: each scenario injects one fault by hand into a real
# `rlorch serve` and real agents on the host transport (tests/faults/*.sh),
# one after the other, and writes its row of the fault table. Prints the
# table (markdown) at the end and writes it to RLORCH_BUILD_DIR/faults/table.md;
# fails when any scenario failed its expectations (recovered, no step lost,
# none duplicated, and its own checks). ctest runs it as faults.suite.
#
#   tests/faults/suite.sh [SCENARIO...]     (default: all, in the order below)
#
# A scenario's whole output is shown when it fails, and kept in
# RLORCH_BUILD_DIR/faults/SCENARIO.log either way.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
: "${RLORCH_SOURCE_DIR:=$(cd "$here/../.." && pwd)}"
: "${RLORCH_BUILD_DIR:=$RLORCH_SOURCE_DIR/build}"
export RLORCH_SOURCE_DIR RLORCH_BUILD_DIR

# name: the script and its arguments.
declare -A SCENARIO=(
  [orchestrator-kill]="orchestrator_restart.sh kill"
  [orchestrator-term]="orchestrator_restart.sh term"
  [heartbeat-gap]="inference_stop.sh 7"
  [hung-worker]="inference_stop.sh 45"
  [inference-kill]="inference_kill.sh"
  [data-port-stranger]="data_stranger.sh"
  [registration-flood]="registration_flood.sh"
  [second-daemon]="second_daemon.sh"
)
ORDER=(orchestrator-kill orchestrator-term heartbeat-gap hung-worker inference-kill data-port-stranger
  registration-flood second-daemon)
(($# > 0)) && ORDER=("$@")

out="$RLORCH_BUILD_DIR/faults"
mkdir -p "$out"
rows="$(mktemp -t rlorch-faults-rows.XXXXXX)" || exit 1
trap 'rm -f "$rows"' EXIT
failed=()
t0=$SECONDS
for name in "${ORDER[@]}"; do
  if [[ -z "${SCENARIO[$name]:-}" ]]; then
    echo "unknown scenario '$name' (known: ${!SCENARIO[*]})"
    failed+=("$name")
    continue
  fi
  read -r -a cmd <<<"${SCENARIO[$name]}"
  start=$SECONDS
  before="$(wc -l <"$rows")"
  FAULT_ROWS="$rows" bash "$here/${cmd[0]}" "${cmd[@]:1}" >"$out/$name.log" 2>&1
  rc=$?
  if ((rc != 0)) || (($(wc -l <"$rows") == before)); then
    failed+=("$name")
    echo "==== $name: FAILED (exit $rc, $((SECONDS - start)) s); its output:"
    cat "$out/$name.log"
    # A scenario that ended before its row still gets one, so the table shows it.
    if (($(wc -l <"$rows") == before)); then
      printf '%s\t-\tno\t-\t-\t-\tended before its row (exit %s)\tFAIL\n' "$name" "$rc" >>"$rows"
    fi
  else
    echo "==== $name: ok ($((SECONDS - start)) s)"
    grep -E '^(ok|skip) ' "$out/$name.log" | sed 's/^/  /'
  fi
done

{
  echo "| scenario | detected in (s) | recovered | steps lost | steps duplicated | next commit (s) | verdict | what was measured |"
  echo "|---|---:|---|---:|---:|---:|---|---|"
  while IFS=$'\t' read -r n d r l u b note v; do
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$n" "$d" "$r" "$l" "$u" "$b" "$v" "$note"
  done <"$rows"
} >"$out/table.md"
echo
cat "$out/table.md"
echo
echo "fault suite: ${#ORDER[@]} scenario(s) in $((SECONDS - t0)) s, ${#failed[@]} failed${failed[*]:+: ${failed[*]}}; table in $out/table.md"
((${#failed[@]} == 0))
