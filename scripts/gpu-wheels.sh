#!/usr/bin/env bash
# The wheels the GPU machine's image lacks, downloaded here (where pip reaches PyPI) to travel with a device call.
#   scripts/gpu-wheels.sh DIR [--with-xprof]
# DIR's *.whl files are replaced by exactly this set, for CPython 3.12 on manylinux x86-64, one version each,
# pinned by constraints.txt, fetched with --no-deps (every need is named below and checked against
# scripts/gpu-image-packages.txt). Prints each wheel and the total, and fails when the wheels pass WHEELS_LIMIT_MIB
# or the wheels plus this checkout (what a call sends) pass TRAVEL_LIMIT_MIB; a call may carry 64 MiB in all.
# On the machine: scripts/gpu-run.sh OUTDIR --wheels DIR ... installs them (docs/devices/gpu.md).
# $PYTHON: the interpreter whose pip downloads (default python3; any version, the target is given explicitly).
set -euo pipefail

WHEELS_LIMIT_MIB=40
TRAVEL_LIMIT_MIB=60

# What `bench serve` imports and the image lacks, with every need of theirs that the image lacks. The prepared run
# needs pydantic too where typer >= 0.22 (ours is; the image's version was not read): typer imports it when it
# parses options. typing-extensions: the image has one, at a version nobody has read, and pydantic/pydantic-core
# need >= 4.16, so ours travels (it shadows the image's for our processes only).
SERVE=(fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn opentelemetry-api
       typing-extensions)
# --with-xprof: the trace viewer (`xprof --logdir ...`) and what it imports at start. Left out on purpose, although
# xprof names them: duckdb (25 MB; one CLI tool imports it), google-cloud-storage and gcsfs (imported only in
# try-blocks, for gs:// paths), fire (the xprof CLI tools only).
XPROF=(xprof gviz-api cheroot jaraco-functools more-itertools)
XPROF_LEFT_OUT=duckdb,google-cloud-storage,gcsfs,fire

usage() { echo "usage: scripts/gpu-wheels.sh DIR [--with-xprof]" >&2; exit 2; }
die() { echo "error: $*" >&2; exit "${2:-1}"; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-python3}
dir="" xprof=0
for arg in "$@"; do
  case $arg in
    --with-xprof) xprof=1 ;;
    -*) echo "error: unknown option $arg" >&2; usage ;;
    *) [[ -z $dir ]] || { echo "error: one DIR only (got $dir and $arg)" >&2; usage; }; dir=$arg ;;
  esac
done
[[ -n $dir ]] || usage
command -v "$py" >/dev/null 2>&1 || die "no $py on PATH (set PYTHON=/path/to/python3)" 2

names=("${SERVE[@]}")
(( xprof )) && names+=("${XPROF[@]}")
mapfile -t specs < <("$py" "$repo/scripts/gpu_image.py" pins "${names[@]}") || exit 2
[[ ${#specs[@]} -eq ${#names[@]} ]] || die "could not pin every wheel" 2

mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.download.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "gpu-wheels: downloading ${#specs[@]} wheels for CPython 3.12 manylinux x86-64 into $dir"
# pip matches each manylinux tag exactly: these cover what our pins publish (see .library/device/README.md).
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$tag")
done
if ! "$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${platforms[@]}" --dest "$tmp" "${specs[@]}" 2> >(grep -v 'is ignored: it is neither' >&2); then
  die "pip download failed for: ${specs[*]}"
fi
find "$dir" -maxdepth 1 -name '*.whl' -delete
mv "$tmp"/*.whl "$dir"/

left_out=""
(( xprof )) && left_out=$XPROF_LEFT_OUT
"$py" "$repo/scripts/gpu_image.py" check-wheels "$dir" "$left_out" || die "the wheels in $dir would not install or import there"

wheel_bytes=$(find "$dir" -maxdepth 1 -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
tree_bytes=$("$py" "$repo/scripts/gpu_image.py" travel-bytes)
mib() { awk -v b="$1" 'BEGIN {printf "%.2f", b / 1048576}'; }
echo "gpu-wheels: wheels $(mib "$wheel_bytes") MiB (limit $WHEELS_LIMIT_MIB); with this checkout" \
     "($(mib "$tree_bytes") MiB) a call sends $(mib $((wheel_bytes + tree_bytes))) MiB (limit $TRAVEL_LIMIT_MIB of 64)"
if (( wheel_bytes > WHEELS_LIMIT_MIB * 1048576 )); then
  die "the wheels ($(mib "$wheel_bytes") MiB) pass the $WHEELS_LIMIT_MIB MiB limit"
fi
if (( wheel_bytes + tree_bytes > TRAVEL_LIMIT_MIB * 1048576 )); then
  die "checkout + wheels ($(mib $((wheel_bytes + tree_bytes))) MiB) pass $TRAVEL_LIMIT_MIB MiB: a device call could not send\
 them; the checkout's largest files are archived traces (git ls-files runs | xargs du -b | sort -n | tail)"
fi
