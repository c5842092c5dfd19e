#!/usr/bin/env bash
# The prepared run rehearsed on this CPU with the lent TPU machine's software stack:  make tpu-rehearsal
#   1. a Python 3.11 venv holding only what the TPU image holds that the run needs: jax and jaxlib 0.10.2 (CPU
#      builds here; libtpu there), numpy, scipy, ml_dtypes, opt_einsum (.library's KINDS.md, `tpu-v5e`). The project
#      is not installed (the machine runs the repository from PYTHONPATH). Cached under $GEMMA4_BENCH_CACHE (else
#      $XDG_CACHE_HOME/gemma4-bench, else ~/.cache/gemma4-bench)/tpu-rehearsal/, by a hash of its inputs.
#   2. the wheels scripts/tpu-wheels.sh carries, installed by scripts/gpu-run.sh --wheels as on the machine;
#   3. scripts/gpu-run.sh OUT --tiny --wheels DIR to the end: exit 0, its summary, one valid run folder.
# Proves: every module the run imports is in the image or carried, and the code runs on Python 3.11 with jax 0.10.2.
# Cannot prove: anything about the TPU itself (its trace planes, timings, memory).
# $PYTHON311: a Python 3.11 interpreter (default python3.11). Exit 0 when all of it passed, else 1 with the log tail.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
IMAGE=(jax==0.10.2 jaxlib==0.10.2 numpy scipy ml_dtypes opt_einsum)
py=${PYTHON311:-python3.11}
if ! "$py" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
  echo "error: tpu-rehearsal needs Python 3.11 (the TPU image's); got '$py' ($("$py" -V 2>&1 || echo missing));" \
       "install one (e.g. pyenv install 3.11) or set PYTHON311=/path/to/python3.11" >&2
  exit 2
fi
cache=${GEMMA4_BENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gemma4-bench}/tpu-rehearsal
key=$( { cat scripts/tpu-wheels.txt scripts/tpu-wheels.sh; echo "${IMAGE[*]}"; } | sha256sum | cut -c1-16)
venv=$cache/venv-$key wheels=$cache/wheels-$key
work=$(mktemp -d "${TMPDIR:-/tmp}/tpu-rehearsal.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "tpu-rehearsal: FAILED: $1" >&2; [[ -z ${2:-} || ! -f $2 ]] || tail -n 40 "$2" >&2; exit 1; }
if [[ ! -x $venv/bin/python ]]; then
  echo "tpu-rehearsal: the image's stack in $venv"
  rm -rf "$venv"; mkdir -p "$cache"
  "$py" -m venv "$venv" || fail "python3.11 -m venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${IMAGE[@]}" >"$work/venv.log" 2>&1 \
    || fail "pip install ${IMAGE[*]}" "$work/venv.log"
fi
[[ -n $(find "$wheels" -maxdepth 1 -name '*.whl' 2>/dev/null) ]] || scripts/tpu-wheels.sh "$wheels" \
  || fail "scripts/tpu-wheels.sh"
echo "tpu-rehearsal: scripts/gpu-run.sh (tiny mode) with the carried wheels"
if ! PYTHON=$venv/bin/python scripts/gpu-run.sh "$work/out" --wheels "$wheels" --tiny --budget-s 300 \
      >"$work/run.log" 2>&1; then
  fail "scripts/gpu-run.sh exited non-zero" "$work/run.log"
fi
grep -q '^gpu-run: exit 0' "$work/run.log" || fail "no 'gpu-run: exit 0' line" "$work/run.log"
runs=("$work"/out/runs/*/)
(( ${#runs[@]} == 1 )) || fail "expected one run folder, found ${#runs[@]}" "$work/run.log"
PYTHONPATH=$repo:$work/out/site "$venv/bin/python" -m bench runs validate "${runs[0]}" >"$work/validate.log" 2>&1 \
  || fail "bench runs validate" "$work/validate.log"
tail -n 12 "$work/run.log"
echo "tpu-rehearsal: passed (Python 3.11, jax 0.10.2, the carried wheels; run folder valid)"
