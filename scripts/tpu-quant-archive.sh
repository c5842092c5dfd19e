#!/usr/bin/env bash
# Issue 43's archive on a lent TPU: the quantization sets on E2B shapes with dummy weights made on the device
# (--checkpoint random:e2b), one build, back to back, within a developer's device time.
#   scripts/tpu-quant-archive.sh STEP... [--budget-s 540] [--wheels .whl-tpu] [--runs DIR] [--loops both]
# STEPs, run in the order given, each skipped (and said so) once the budget would be passed:
#   sets41    every set at 41 input tokens, --loops (default both)  (8 sweeps)
#   sets3593  every set at 3593 input tokens, host loop            (8 sweeps)
#   core      none, w4, ple4,int8_lm_head at 41 (both loops) and 3593 (host): the figures issue 43 sets goals on
#   batch     batches 8, 32, 128 at 41 tokens for none, w8, w4     (3 sweeps)
#   profile   a profile of w4 and of the published pair at 41 tokens
#   SET       one set's sweep at 41 tokens (--loops), e.g. w8 or w4,ple4,int8_lm_head
# Run from the repository root on the TPU machine (device tool: carry [".whl-tpu"], timeout_s <= 600). Each call
# ends with the run folders and logs (traces left out) packed into $OUT/runs-<time>.tgz (one file: the device tool
# brings back at most 8): unpack the folders into runs/ here.
#
# Device time: compiling is what costs. On the lent v5e (jax 0.10.2) the first request of a set compiles its
# prefill and decode programs (about 60 s for one input size; the dummy weights are drawn in 12-36 s on top). The
# XLA compilation cache lives in the repository root (.xla-cache, git-ignored), which the device tool keeps between
# calls while the machine stays warm (100 s after a call), so split the archive over several calls back to back:
# a set measured again, or a step that repeats a set's shapes, restores its programs instead of compiling them.
# The cache does not come back here (75-144 MiB): a machine given back loses it.
set -uo pipefail
budget=540 wheels=.whl-tpu runs=/tmp/qruns loops=both steps=()
while (( $# )); do
  case $1 in
    --budget-s) budget=$2; shift 2 ;;
    --wheels) wheels=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --loops) loops=$2; shift 2 ;;
    -*) echo "error: unknown option $1 (expected --budget-s N, --wheels DIR, --runs DIR, --loops host|device|both)" >&2; exit 2 ;;
    *) steps+=("$1"); shift ;;
  esac
done
(( ${#steps[@]} )) || { echo "usage: scripts/tpu-quant-archive.sh STEP... [--budget-s N] (steps: see the header)" >&2; exit 2; }
if [[ -d $wheels ]]; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site "$wheels"/*.whl || { echo "error: installing $wheels failed" >&2; exit 1; }
  export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD:/tmp/site
fi
export PYTHONUNBUFFERED=1 GEMMA4_BENCH_RANDOM_PRNG=${GEMMA4_BENCH_RANDOM_PRNG:-rbg}
out=${OUT:-/tmp/qout}; logs=$runs/logs; mkdir -p "$out" "$logs" .xla-cache
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }
SETS=(none w8 w4 ple8 ple4 int8_lm_head ple4,int8_lm_head w4,ple4,int8_lm_head)

# sweep NAME NEED_S ARGS...: one sweep into $runs when at least NEED_S seconds are left, bounded by what is left.
sweep() {
  local name=$1 need=$2; shift 2
  local t; t=$(left)
  if (( t < need )); then echo "skip $name: $t s left, needs about $need s"; return; fi
  timeout $(( t - 10 )) python3 -m bench sweep --checkpoint random:e2b --repeats 3 --max-new-tokens 64 \
    --runs-dir "$runs" --name "tpu-quant-$name" --compile-cache "$PWD/.xla-cache" "$@" > "$logs/sweep-$name.log" 2>&1
  echo "$name rc=$? at $(( $(date +%s) - t0 )) s: $(grep -h 'valid; gauge' "$logs/sweep-$name.log" | sed 's/.*input tokens/  /' | tr '\n' ' ')"
}
slug() { echo "${1//,/-}"; }

for step in "${steps[@]}"; do
  case $step in
    sets41) for q in "${SETS[@]}"; do sweep "$(slug "$q")-41" 100 --quant "$q" --inputs 41 --decode-loop "$loops"; done ;;
    sets3593) for q in "${SETS[@]}"; do sweep "$(slug "$q")-3593" 100 --quant "$q" --inputs 3593 --decode-loop host; done ;;
    core) for q in none w4 ple4,int8_lm_head; do
            sweep "$(slug "$q")-41" 100 --quant "$q" --inputs 41 --decode-loop both
            sweep "$(slug "$q")-3593" 90 --quant "$q" --inputs 3593 --decode-loop host
          done ;;
    batch) for q in none w8 w4; do sweep "$(slug "$q")-b" 150 --quant "$q" --inputs 41 --batch 8,32,128 --decode-loop host; done ;;
    profile) for q in w4 ple4,int8_lm_head; do
               t=$(left); if (( t < 100 )); then echo "skip profile $q: $t s left"; continue; fi
               timeout $(( t - 10 )) python3 -m bench profile --checkpoint random:e2b --quant "$q" --steps 20 \
                 --runs-dir "$runs" --name "tpu-quant-$(slug "$q")-profile" --compile-cache "$PWD/.xla-cache" \
                 > "$logs/profile-$(slug "$q").log" 2>&1
               echo "profile $q rc=$? at $(( $(date +%s) - t0 )) s"
             done ;;
    -*|'') echo "error: bad step '$step'" >&2; exit 2 ;;
    *) sweep "$(slug "$step")-41" 100 --quant "$step" --inputs 41 --decode-loop "$loops" ;;
  esac
done
stamp=$(date +%H%M%S)
(cd "$(dirname "$runs")" && tar czf "$out/runs-$stamp.tgz" --exclude='*.xplane.pb' --exclude='*.trace.json.gz' \
  "$(basename "$runs")") && echo "packed $out/runs-$stamp.tgz ($(( $(date +%s) - t0 )) s)"
