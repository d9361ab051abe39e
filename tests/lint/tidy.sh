#!/usr/bin/env bash
# Static analysis gate: clang-tidy's clang-analyzer-* checks over the C
# sources of rpc/, orchestrator/ and workers/, as compiled in BUILD_DIR
# (its compile_commands.json; a clang build, so that every flag is one
# clang understands).
#
#   tests/lint/tidy.sh BUILD_DIR [EXCLUDE_FILE]
#
# Fails when any finding is left. A finding that is a false positive is
# explained where it is, in a NOLINT comment at its line. EXCLUDE_FILE
# (default tests/lint/tidy-exclude.txt) lists findings that are known and
# not yet fixed, one "PATH CHECK" a line (# starts a comment): they are
# printed and do not fail the gate. An entry that matches nothing fails it,
# so the list cannot go stale.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: tests/lint/tidy.sh BUILD_DIR [EXCLUDE_FILE]}
exclude=${2:-tests/lint/tidy-exclude.txt}
tidy=${CLANG_TIDY:-clang-tidy-14}
jobs=${JOBS:-$(nproc)}
db="$build/compile_commands.json"
[ -f "$db" ] || { echo "tidy: no $db (configure with CMake first)" >&2; exit 2; }
command -v "$tidy" >/dev/null || { echo "tidy: $tidy not found" >&2; exit 2; }

# The sources the database compiles, relative to the tree.
mapfile -t files < <(python3 - "$db" <<'PY'
import json, os, sys
root = os.getcwd()
seen = set()
for e in json.load(open(sys.argv[1])):
    f = os.path.relpath(os.path.join(e["directory"], e["file"]), root)
    if f.endswith(".c") and f.split("/")[0] in ("rpc", "orchestrator", "workers") and f not in seen:
        seen.add(f)
        print(f)
PY
)
[ ${#files[@]} -gt 0 ] || { echo "tidy: no sources of rpc/, orchestrator/ or workers/ in $db" >&2; exit 2; }

out=$(mktemp)
trap 'rm -f "$out"' EXIT
# The headers of these directories are analysed where they are included.
# DeprecatedOrUnsafeBufferHandling is off: it asks for the C11 Annex K
# functions (memcpy_s, snprintf_s), which glibc does not have, at every
# memcpy, memset and snprintf.
checks='-*,clang-analyzer-*,-clang-analyzer-security.insecureAPI.DeprecatedOrUnsafeBufferHandling'
printf '%s\n' "${files[@]}" |
  xargs -P "$jobs" -n 1 "$tidy" -p "$build" --quiet --checks="$checks" \
        --header-filter='^'"$PWD"'/(rpc|orchestrator|workers)/' >"$out" 2>/dev/null || true

# A file clang-tidy could not compile was not analysed: that fails the gate.
if grep -q ': error: ' "$out"; then
  grep ': error: ' "$out" | sed 's|^'"$PWD"'/||' | sort -u | sed 's/^/tidy: /'
  echo "tidy: clang-tidy could not compile some files (above)"
  exit 1
fi

# One line per finding: PATH:LINE:COL CHECK message.
findings=$(sed -n 's|^'"$PWD"'/\(.*\):\([0-9]*\):\([0-9]*\): warning: \(.*\) \[\(clang-analyzer-[^]]*\)\]$|\1:\2:\3 \5 \4|p' "$out" |
           sort -u)
excl=$( { [ -f "$exclude" ] && sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$exclude"; } || true)

left=0 stale=0
while read -r path check; do
  [ -n "$path" ] || continue
  if ! grep -q "^$path:[0-9]*:[0-9]* $check " <<<"$findings"; then
    echo "tidy: stale exclusion (no such finding): $path $check"
    stale=$((stale + 1))
  fi
done <<<"$excl"
while read -r loc check msg; do
  [ -n "$loc" ] || continue
  if grep -qx "${loc%%:*} $check" <<<"$(sed 's/[[:space:]]\+/ /g' <<<"$excl")"; then
    echo "tidy: excluded: $loc $check $msg"
  else
    echo "tidy: $loc: $msg [$check]"
    left=$((left + 1))
  fi
done <<<"$findings"
echo "tidy: ${#files[@]} files, $left findings, $stale stale exclusions"
[ "$left" -eq 0 ] && [ "$stale" -eq 0 ]
