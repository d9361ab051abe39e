#!/bin/sh
# runtime-packages.sh BINARY: the packages that hold the shared libraries BINARY
# loads (ldd's list: what it links and what those link), one a line, sorted.
# The images' build stages run it on the rlorch they built, and their runtime
# stages install what it printed, so that a runtime stage has exactly the
# libraries of that build, on Debian 12 and on the CUDA image's Ubuntu alike
# (deploy/Dockerfile, deploy/Dockerfile.cuda). The CUDA driver (libcuda.so.1)
# is not among them: the CUDA runtime loads it at run time, from the host.
# Exit 1, naming the library, when one is not found or no package holds it.
# UNPACKAGED, when set, is a path prefix whose libraries come from outside the
# package manager on purpose (a CUDA toolkit unpacked under /usr/local/cuda on
# a build machine, whose image gets them from its base): they are named on
# stderr and not counted.
set -eu
if [ $# -ne 1 ]; then
  echo "usage: runtime-packages.sh BINARY" >&2
  exit 2
fi
# ldd itself fails on a file that is not a dynamic executable.
libs=$(ldd "$1") || exit 1

# dpkg records a path as its package installed it; with a merged /usr the
# loader may find the same file under /lib or /usr/lib.
owner() {
  for p in "$1" "$(readlink -f "$1")"; do
    for q in "$p" "/usr$p" "${p#/usr}"; do
      o=$(dpkg-query -S "$q" 2>/dev/null) && { printf '%s\n' "${o%%:*}"; return 0; }
    done
  done
  return 1
}

missing=$(printf '%s\n' "$libs" | awk '$2 == "=>" && $3 == "not" { print $1 }')
if [ -n "$missing" ]; then
  echo "runtime-packages.sh: $1: not found: $(echo $missing)" >&2
  exit 1
fi
status=0
pkgs=""
for path in $(printf '%s\n' "$libs" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
  if pkg=$(owner "$path"); then
    pkgs="$pkgs $pkg"
  elif [ -n "${UNPACKAGED:-}" ] && [ "${path#"$UNPACKAGED"}" != "$path" ]; then
    echo "runtime-packages.sh: $1: $path is outside the package manager (UNPACKAGED=$UNPACKAGED)" >&2
  else
    echo "runtime-packages.sh: $1: $path belongs to no package" >&2
    status=1
  fi
done
[ "$status" = 0 ] || exit 1
printf '%s\n' $pkgs | sort -u
