#!/usr/bin/env bash
# Runs the libFuzzer harnesses of a build configured with RLORCH_FUZZ=ON.
#
#   tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]
#
# Each target (default: all) fuzzes for SECONDS from its seeds in
# tests/fuzz/corpus/TARGET, copied into BUILD_DIR/fuzz/work/TARGET (the
# seeds themselves are never written), with the dictionary
# tests/fuzz/dict/TARGET.dict when there is one; JOBS targets at a time
# (default: the number of CPUs). Each prints one line of libFuzzer's final
# figures: executions, executions per second, coverage (cov: edges, ft:
# features), corpus size and crashes. Any crash, leak, sanitizer report,
# timeout or failed property fails the run: the input is kept as
# BUILD_DIR/fuzz/artifacts/TARGET-*, and `BUILD_DIR/fuzz/fuzz_TARGET FILE`
# replays it. The harnesses talk to nothing but themselves over loopback.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]}
seconds=${2:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]}
shift 2
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(rpc plan http config prompts data_root data_receiver)
jobs=${JOBS:-$(nproc)}
out="$build/fuzz"
mkdir -p "$out/artifacts" "$out/logs"

# Inputs longer than this are not tried: each limit sits above the sizes at
# which the target's own limits start to refuse.
max_len() {
  case $1 in
    http) echo 16384 ;;
    config | prompts) echo 8192 ;;
    *) echo 4096 ;;
  esac
}

run_one() {
  local t=$1 bin="$out/fuzz_$1" work="$out/work/$1" log="$out/logs/$1.log"
  [ -x "$bin" ] || { echo "fuzz $t: no $bin (cmake --build $build --target fuzz)"; return 1; }
  rm -rf "$work"
  mkdir -p "$work"
  cp tests/fuzz/corpus/"$t"/* "$work"/
  local dict=()
  [ -f tests/fuzz/dict/"$t".dict ] && dict=(-dict=tests/fuzz/dict/"$t".dict)
  local rc=0
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$(max_len "$t")" \
    -print_final_stats=1 -artifact_prefix="$out/artifacts/$t-" "${dict[@]}" "$work" \
    </dev/null >"$log" 2>&1 || rc=$?
  local execs speed cov ft corp crashes=0
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  read -r cov ft corp < <(grep -a ' cov: ' "$log" | tail -1 |
    sed -E 's/.* cov: ([0-9]+) ft: ([0-9]+) corp: ([0-9]+\/[0-9]+[a-zA-Z]*).*/\1 \2 \3/') || true
  [ $rc -eq 0 ] || crashes=1
  printf 'fuzz %-14s %ss  execs %-10s exec/s %-7s cov %-5s ft %-6s corpus %-12s crashes %s\n' \
    "$t" "$seconds" "${execs:-?}" "${speed:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes"
  if [ $rc -ne 0 ]; then
    echo "fuzz $t: FAILED (exit $rc); log $log, last lines:"
    grep -av '^#[0-9]' "$log" | tail -40 | sed 's/^/  /'
    return 1
  fi
}
export -f run_one max_len
export out seconds

printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one {}'
