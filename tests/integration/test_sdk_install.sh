#!/usr/bin/env bash
# `cmake --install` of the embedding SDK into a temporary prefix: the library
# (librlorch.so.1, exporting exactly the functions rlorch.h declares), its one
# header (self-contained, C and C++, nothing of gRPC or protobuf-c in it) and
# rlorch.pc; a program compiled against the installed copy with
# `pkg-config --cflags --libs rlorch` builds, loads that copy and runs against
# a real orchestrator (tests/sdk/sdk_errors.c, every bad input refused).
source "$(dirname "$0")/lib.sh"
need_cmd cmake pkg-config cc nm objdump || finish

prefix="$TEST_TMP/prefix"
out="$(cmake --install "$RLORCH_BUILD_DIR" --prefix "$prefix" 2>&1)"
assert_eq 0 "$?" "cmake --install into a temporary prefix" || { echo "$out"; finish; }
pc="$(find "$prefix" -name rlorch.pc)"
assert_ne "" "$pc" "rlorch.pc is installed"
libdir="$(dirname "$(dirname "$pc")")"
assert_eq "$prefix/include/rlorch/rlorch.h" "$(find "$prefix/include" -type f)" \
  "rlorch.h is the one header installed"
assert_eq "librlorch.so.1" "$(objdump -p "$libdir/librlorch.so" | awk '$1 == "SONAME" {print $2}')" \
  "the library's SONAME is librlorch.so.1"
assert_eq "librlorch.so.1" "$(readlink "$libdir/librlorch.so")" "librlorch.so links to librlorch.so.1"

# Exactly what the header declares is exported: no gRPC, protobuf-c or internals.
declared="$(grep -oE '\brlorch_[a-z_]+\(' "$prefix/include/rlorch/rlorch.h" | tr -d '(' | sort -u)"
exported="$(nm -D --defined-only "$libdir/librlorch.so" | awk '$2 == "T" {sub(/@.*/, "", $3); print $3}' | sort -u)"
assert_eq "$declared" "$exported" "the exported symbols are the header's $(wc -l <<<"$declared") functions"
assert_not_contains "$(cat "$prefix/include/rlorch/rlorch.h")" "protobuf" "the header names no protobuf-c type"
assert_not_contains "$(grep -i '#include' "$prefix/include/rlorch/rlorch.h")" "grpc" "the header includes nothing of gRPC"

export PKG_CONFIG_PATH="$libdir/pkgconfig"
flags="$(pkg-config --cflags --libs rlorch)"
# A sanitized build's library needs its runtime loaded first: programs built
# against it here are sanitized alike.
san=()
[[ -n "${RLORCH_SANITIZE:-}" ]] && san=("-fsanitize=$RLORCH_SANITIZE")
# rlorch.pc finds its prefix from where it lies (${pcfiledir}): the paths
# it gives lead to this prefix, wherever that is.
inc="$(pkg-config --cflags-only-I rlorch | sed 's/^ *-I//; s/ *$//')"
assert_eq "$(cd "$prefix/include" && pwd -P)" "$(cd "$inc" 2>/dev/null && pwd -P)" \
  "pkg-config gives the installed include directory"
assert_contains "$flags" "-lrlorch" "pkg-config gives -lrlorch"
assert_eq "$(grep -o 'project(rlorch VERSION [0-9.]*' "$RLORCH_SOURCE_DIR/CMakeLists.txt" | awk '{print $3}')" \
  "$(pkg-config --modversion rlorch)" "rlorch.pc carries the project's version"

# The header alone compiles, strictly, as C and as C++.
printf '#include <rlorch/rlorch.h>\nint main(void) { return rlorch_version(0) >= RLORCH_API_VERSION ? 0 : 1; }\n' \
  >"$TEST_TMP/alone.c"
out="$(cc -std=c99 -Wall -Wextra -Wpedantic -Werror "$TEST_TMP/alone.c" -o "$TEST_TMP/alone" "${san[@]}" $flags 2>&1)"
assert_eq 0 "$?" "a C99 program with -Wpedantic -Werror builds against the installed copy" || echo "$out"
LD_LIBRARY_PATH="$libdir" "$TEST_TMP/alone"
assert_eq 0 "$?" "it runs: the library's API version is at least the header's"
if command -v c++ >/dev/null 2>&1; then
  cp "$TEST_TMP/alone.c" "$TEST_TMP/alone.cc"
  out="$(c++ -Wall -Wextra -Werror "$TEST_TMP/alone.cc" -o "$TEST_TMP/alone-cxx" "${san[@]}" $flags 2>&1)"
  assert_eq 0 "$?" "the header compiles as C++" || echo "$out"
else
  skip "no C++ compiler: the header's C++ guard is not compiled"
fi

# A real program, built only from the installed copy, against a real orchestrator.
mkdir -p "$TEST_TMP/src"
cp "$RLORCH_SOURCE_DIR/tests/sdk/sdk_errors.c" "$RLORCH_SOURCE_DIR/tests/sdk/sdk_model.h" "$TEST_TMP/src/"
out="$(cc -std=gnu11 -Wall -Wextra -Werror "$TEST_TMP/src/sdk_errors.c" -o "$TEST_TMP/sdk_errors" \
  "${san[@]}" $(pkg-config --cflags --libs rlorch) -lm 2>&1)"
assert_eq 0 "$?" "sdk_errors builds with \`pkg-config --cflags --libs rlorch\`" || { echo "$out"; finish; }
assert_contains "$(LD_LIBRARY_PATH="$libdir" ldd "$TEST_TMP/sdk_errors")" "$libdir/librlorch.so.1" \
  "it loads the installed librlorch.so.1"
printf 'sdk-install-token\n' >"$TEST_TMP/token"
chmod 600 "$TEST_TMP/token"
serve_start --token-file "$TEST_TMP/token" || finish
out="$(LD_LIBRARY_PATH="$libdir" "$TEST_TMP/sdk_errors" "$GRPC_ADDR" "127.0.0.1:$(free_port)" "$TEST_TMP/token" 2>&1)"
assert_eq 0 "$?" "it runs against rlorch serve: every check passes" || echo "$out"
assert_contains "$out" "ok   start with the token: RLORCH_OK" "the installed library registers with the orchestrator"
serve_stop
finish
