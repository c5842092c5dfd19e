#!/bin/bash
# The one TPU call of 2026-12-07 (reports/2026-12-07-quant-tpuv5e-words-kernel): E2B dummy weights, the published pair,
# dense and w4 at 41 tokens, host loop, and the w4a16 probe. Run from the repository root on the TPU machine with
# .whl-tpu carried (scripts/tpu-wheels.sh); writes logs and runs.tgz into $OUT. Budget: 470 s of commands.
T0=$(date +%s); left() { echo $(( 470 - ($(date +%s) - T0) )); }
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-tpu/*.whl && export PYTHONPATH=$PYTHONPATH:$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1 GEMMA4_BENCH_RANDOM_PRNG=rbg
sw() { local q=$1 name=$2 t=$3; (( t > 40 )) || { echo "skip $name"; return; }
  timeout $t python3 -m bench sweep --checkpoint random:e2b --quant $q --inputs 41 --repeats 3 --max-new-tokens 64 \
    --decode-loop host --runs-dir /tmp/runs --name tpu-e2b-$name --compile-cache /tmp/xla > $OUT/sweep-$name.log 2>&1
  echo "$name rc=$? at $(( $(date +%s) - T0 )) s"; tar czf $OUT/runs.tgz -C /tmp runs 2>/dev/null; }
sw ple4,int8_lm_head published 170
t=$(left); t=$(( t - 100 )); (( t > 150 )) && t=150; sw none dense $t
t=$(left); (( t > 100 )) && { timeout 80 python3 scripts/probes/w4a16_tpu.py --quick > $OUT/w4probe.log 2>&1; echo "probe rc=$? at $(( $(date +%s) - T0 )) s"; }
sw w4 w4 $(( $(left) - 5 ))
tail -n 3 $OUT/sweep-*.log
