#!/usr/bin/env bash
# The wheels the lent TPU machine's image lacks for the prepared run, downloaded here to travel with a device call.
#   scripts/tpu-wheels.sh DIR
# DIR's *.whl files are replaced by exactly the pinned set in scripts/tpu-wheels.txt, for CPython 3.11 on manylinux
# x86-64, fetched with --no-deps (the list names every need). Prints the total and fails past WHEELS_LIMIT_MIB.
# On the machine: scripts/gpu-run.sh OUTDIR --wheels DIR ... installs them (docs/devices/tpu.md).
# $PYTHON: the interpreter whose pip downloads (default python3; any version, the target is given explicitly).
set -euo pipefail
WHEELS_LIMIT_MIB=20
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-python3}
[[ $# -eq 1 && $1 != -* ]] || { echo "usage: scripts/tpu-wheels.sh DIR" >&2; exit 2; }
dir=$1
command -v "$py" >/dev/null 2>&1 || { echo "error: no $py on PATH (set PYTHON=/path/to/python3)" >&2; exit 2; }
mapfile -t specs < <(grep -v '^#' "$repo/scripts/tpu-wheels.txt" | grep -v '^[[:space:]]*$')
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.download.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$tag")
done
echo "tpu-wheels: downloading ${#specs[@]} wheels for CPython 3.11 manylinux x86-64 into $dir"
if ! "$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
      "${platforms[@]}" --dest "$tmp" "${specs[@]}" 2> >(grep -v 'is ignored: it is neither' >&2); then
  echo "error: pip download failed for: ${specs[*]}" >&2; exit 1
fi
n=$(find "$tmp" -maxdepth 1 -name '*.whl' | wc -l)
(( n == ${#specs[@]} )) || { echo "error: got $n wheels for ${#specs[@]} pins" >&2; exit 1; }
find "$dir" -maxdepth 1 -name '*.whl' -delete
mv "$tmp"/*.whl "$dir"/
bytes=$(find "$dir" -maxdepth 1 -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
mib=$(awk -v b="$bytes" 'BEGIN {printf "%.2f", b / 1048576}')
echo "tpu-wheels: $n wheels, $mib MiB (limit $WHEELS_LIMIT_MIB)"
(( bytes <= WHEELS_LIMIT_MIB * 1048576 )) || { echo "error: the wheels pass $WHEELS_LIMIT_MIB MiB" >&2; exit 1; }
