#!/usr/bin/env bash
# Issue 43's archive on a lent TPU: the quantization sets on E2B shapes with dummy weights made on the device
# (--checkpoint random:e2b), one build, back to back, within a developer's device time.
#   scripts/tpu-quant-archive.sh STEP... [--budget-s 540] [--wheels .whl-tpu] [--runs DIR] [--loops both]
#                                [--kernel SPEC] [--dry-run]
# STEPs, run in the order given, each skipped (and said so) once the budget would be passed:
#   sets41    every set at 41 input tokens, --loops (default both)  (8 sweeps)
#   sets3593  every set at 3593 input tokens, host loop            (8 sweeps)
#   core      none, w4, ple4,int8_lm_head at 41 (both loops) and 3593 (host): the figures issue 43 sets goals on
#   batch     batches 8, 32, 128 at 41 tokens for none, w8, w4     (3 sweeps)
#   profile   a profile of w4 and of the published pair at 41 tokens; profile:SET one set's
#   policy    the TPU kernel's tiling policies A/B: w4 at 41 tokens, host loop, --kernel w4a16=pallas:fewest then
#             pallas:steps, alternating twice (4 sweeps, --no-step-logits: speed only); fit_tpu.TILING_POLICIES;
#             policy:A,B the same for policies A then B (e.g. policy:steps,fused)
#   policy1   one sweep of w4 at 41 tokens, host loop, under the policy --kernel does not name (fewest, or steps
#             when --kernel names no policy or fewest): the other side of the policy pair for a run under --kernel
#   tiling    scripts/probes/w4_tiling_tpu.py --resident: every (bn, bk), both policies' tilings and the resident
#             form per E2B w4 shape at one
#             row, with what is left of the budget (at most 200 s; skipped under 40 s); its JSON lands in
#             $runs/probes/ (so in the pack) and in $OUT
#   moe       scripts/probes/moe_w4_tpu.py: 26B-A4B's w4 experts through the expert kernel against the XLA routes at
#             1, 8 and 32 tokens (at most 150 s; skipped under 60 s); its results.json lands in $runs/probes/moe
#   family    issue 45: 26B-A4B (--checkpoint random:26b-a4b) with w4 at 41 tokens, host loop (w4 is the lightest set
#             the fit check takes on the v5e: 14.483 GB of weights as placed + 0.029 GB of KV of 15.218 usable;
#             w4,int8_lm_head places 15.222 GB, refused), a 20-step profile of it, then E4B (random:e4b) none and w8
#             at 41 tokens, host loop, each when the budget holds (26B-A4B first: about 240 s with its draw and
#             compiles, a guess; on 2026-12-08 its draw took 53 s)
#   SET       one set's sweep at 41 tokens (--loops), e.g. w8 or w4,ple4,int8_lm_head
# --kernel SPEC is passed to every sweep and profile of a set with w4 (e.g. w4a16=pallas:steps), but not to the
# policy steps' sweeps, which name their own.
# --dry-run prints each command instead of running it (no install, no device: a check of the arguments here).
# The next session's one call (600 s): `bash scripts/tpu-quant-archive.sh w4 policy tiling --loops host
# --budget-s 570`: w4 alone with the current packing (never yet run on a TPU) and its per-step accuracy record,
# the policy A/B (its first `fewest` sweep restores the w4 step's programs from the cache), the probe last with
# whatever time is left.
# Run from the repository root on the TPU machine (device tool: carry [".whl-tpu"], timeout_s <= 600). Each call
# ends with the run folders and logs (traces left out) packed into $OUT/runs-<time>.tgz (one file: the device tool
# brings back at most 8): unpack the folders into runs/ here.
#
# Device time: compiling is what costs. On the lent v5e (jax 0.10.2) the first request of a set compiles its
# prefill and decode programs (30-60 s for one input size, issue 43; the 2026-12-07 call measured three sets at 41
# tokens, host loop, in 496 s, about 165 s a set with the draw, the warm-up and the probes; the dummy weights are
# drawn in 12-36 s on top), and since 2026-12-07 each cell also compiles its per-step accuracy record (one causal
# pass, `Engine.step_summary`: untimed, after the timed repeats; `--no-step-logits` skips it). The
# XLA compilation cache lives in the repository root (.xla-cache, git-ignored), which the device tool keeps between
# calls while the machine stays warm (100 s after a call), so split the archive over several calls back to back:
# a set measured again, or a step that repeats a set's shapes, restores its programs instead of compiling them.
# The cache does not come back here (75-144 MiB): a machine given back loses it.
set -uo pipefail
budget=540 wheels=.whl-tpu runs=/tmp/qruns loops=both dry=0 steps=() kopt=()
while (( $# )); do
  case $1 in
    --budget-s) budget=$2; shift 2 ;;
    --wheels) wheels=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --loops) loops=$2; shift 2 ;;
    --kernel) kopt=(--kernel "$2"); shift 2 ;;
    --dry-run) dry=1; shift ;;
    -*) echo "error: unknown option $1 (expected --budget-s N, --wheels DIR, --runs DIR, --loops host|device|both, --kernel SPEC, --dry-run)" >&2; exit 2 ;;
    *) steps+=("$1"); shift ;;
  esac
done
(( ${#steps[@]} )) || { echo "usage: scripts/tpu-quant-archive.sh STEP... [--budget-s N] (steps: see the header)" >&2; exit 2; }
[[ $budget =~ ^[0-9]+$ ]] || { echo "error: --budget-s $budget: expected whole seconds, e.g. 570" >&2; exit 2; }
[[ $loops =~ ^(host|device|both)$ ]] || { echo "error: --loops $loops: expected host, device or both" >&2; exit 2; }
for step in "${steps[@]}"; do  # every step checked before any device time is spent
  [[ $step =~ ^(sets41|sets3593|core|batch|profile|profile:[a-z0-9_,]+|policy|policy:[a-z]+,[a-z]+|policy1|tiling|moe|[a-z0-9_,]+)$ && $step != -* ]] \
    || { echo "error: bad step '$step' (expected a step of the header or a --quant set, e.g. w8)" >&2; exit 2; }
done
# run CMD...: the command, or with --dry-run its line
run() { if (( dry )); then echo "+ $*"; else "$@"; fi; }
if (( dry )); then :
elif [[ -d $wheels ]]; then
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
  local t a q=""; t=$(left)
  for a in "$@"; do [[ $q == next ]] && q=$a; [[ $a == --quant ]] && q=next; done
  [[ $q == *w4* && " $* " != *" --kernel "* ]] && set -- "${kopt[@]}" "$@"  # --kernel only where w4 is
  if (( t < need )); then echo "skip $name: $t s left, needs about $need s"; return; fi
  run timeout $(( t - 10 )) python3 -m bench sweep --checkpoint "${ckpt:-random:e2b}" --repeats 3 --max-new-tokens 64 \
    --runs-dir "$runs" --name "tpu-quant-$name" --compile-cache "$PWD/.xla-cache" "$@" > "$logs/sweep-$name.log" 2>&1
  local rc=$?
  (( dry )) && { cat "$logs/sweep-$name.log"; return; }
  echo "$name rc=$rc at $(( $(date +%s) - t0 )) s: $(grep -h 'valid; gauge' "$logs/sweep-$name.log" | sed 's/.*input tokens/  /' | tr '\n' ' ')"
}
slug() { echo "${1//,/-}"; }
# profile SET: a 20-step profile of one set at 41 tokens when at least 100 s are left
profile() {
  local q=$1 t rc; t=$(left)
  if (( t < 100 )); then echo "skip profile $q: $t s left"; return; fi
  local model=${ckpt:-random:e2b}; local name; name=$([[ $model == random:e2b ]] || echo "${model#random:}-")$(slug "$q")
  run timeout $(( t - 10 )) python3 -m bench profile --checkpoint "$model" --quant "$q" --steps 20 \
    --runs-dir "$runs" --name "tpu-quant-$name-profile" --compile-cache "$PWD/.xla-cache" \
    $([[ $q == *w4* ]] && echo "${kopt[@]}") > "$logs/profile-$name.log" 2>&1
  rc=$?
  (( dry )) && cat "$logs/profile-$name.log"
  echo "profile $q rc=$rc at $(( $(date +%s) - t0 )) s"
}

for step in "${steps[@]}"; do
  case $step in
    sets41) for q in "${SETS[@]}"; do sweep "$(slug "$q")-41" 100 --quant "$q" --inputs 41 --decode-loop "$loops"; done ;;
    sets3593) for q in "${SETS[@]}"; do sweep "$(slug "$q")-3593" 100 --quant "$q" --inputs 3593 --decode-loop host; done ;;
    core) for q in none w4 ple4,int8_lm_head; do
            sweep "$(slug "$q")-41" 100 --quant "$q" --inputs 41 --decode-loop both
            sweep "$(slug "$q")-3593" 90 --quant "$q" --inputs 3593 --decode-loop host
          done ;;
    batch) for q in none w8 w4; do sweep "$(slug "$q")-b" 150 --quant "$q" --inputs 41 --batch 8,32,128 --decode-loop host; done ;;
    profile) for q in w4 ple4,int8_lm_head; do profile "$q"; done ;;
    profile:*) profile "${step#profile:}" ;;
    policy|policy:*) pair=fewest,steps; [[ $step == policy:* ]] && pair=${step#policy:}
            for round in 1 2; do  # first compile of each policy ~100 s; a repeat restores its programs
              for pol in ${pair/,/ }; do
                need=60; (( round == 1 )) && [[ $pol == "${pair#*,}" ]] && need=110
                sweep "w4-$pol-$round" $need --quant w4 --inputs 41 --decode-loop host --kernel "w4a16=pallas:$pol" \
                  --no-step-logits
              done
            done ;;
    policy1) other=fewest; [[ ${kopt[1]:-} == *:fewest || ${kopt[1]:-} != *:* ]] && other=steps
             sweep "w4-$other-1" 90 --quant w4 --inputs 41 --decode-loop host --kernel "w4a16=pallas:$other" --no-step-logits ;;
    family) ckpt=random:26b-a4b sweep 26b-a4b-w4-41 240 --quant w4 --inputs 41 --decode-loop host
            ckpt=random:26b-a4b profile w4
            for q in none w8; do ckpt=random:e4b sweep "e4b-$q-41" 110 --quant "$q" --inputs 41 --decode-loop host; done ;;
    moe) t=$(left); t=$(( t - 15 < 150 ? t - 15 : 150 ))
         if (( t < 60 )); then echo "skip moe: $t s left for the probe, needs at least 60 s"; continue; fi
         mkdir -p "$runs/probes/moe"
         run timeout "$t" python3 scripts/probes/moe_w4_tpu.py "$runs/probes/moe" > "$logs/probe-moe.log" 2>&1
         rc=$?
         (( dry )) && cat "$logs/probe-moe.log"
         echo "moe probe rc=$rc at $(( $(date +%s) - t0 )) s:"; tail -n 12 "$logs/probe-moe.log" ;;
    tiling) t=$(left); t=$(( t - 15 < 200 ? t - 15 : 200 ))
            if (( t < 40 )); then echo "skip tiling: $t s left for the probe, needs at least 40 s"; continue; fi
            mkdir -p "$runs/probes"
            run timeout $(( t + 30 )) python3 scripts/probes/w4_tiling_tpu.py --budget-s "$t" --out "$runs/probes" --resident \
              > "$logs/probe-tiling.log" 2>&1
            rc=$?
            (( dry )) && cat "$logs/probe-tiling.log"
            cp "$runs/probes/"w4_tiling_tpu_rows*.json "$out/" 2>/dev/null
            echo "tiling probe rc=$rc at $(( $(date +%s) - t0 )) s:"; sed -n '/^summary/,$p' "$logs/probe-tiling.log" ;;
    *) sweep "$(slug "$step")-41" 100 --quant "$step" --inputs 41 --decode-loop "$loops" ;;
  esac
done
stamp=$(date +%H%M%S)
(( dry )) && { echo "dry run: nothing packed"; exit 0; }
(cd "$(dirname "$runs")" && tar czf "$out/runs-$stamp.tgz" --exclude='*.xplane.pb' --exclude='*.trace.json.gz' \
  "$(basename "$runs")") && echo "packed $out/runs-$stamp.tgz ($(( $(date +%s) - t0 )) s)"
