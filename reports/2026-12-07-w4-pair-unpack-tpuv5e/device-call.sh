#!/bin/bash
# Last call of the session: the pair/hybrid w4 kernel (worktree w4-pair) copied over model/, a kernel probe, then
# sweeps back to back at 41 tokens, host loop, into /tmp/qruns (scripts/tpu-quant-archive.sh).
T0=$(date +%s); B=570
left() { echo $(( B - ($(date +%s) - T0) )); }
cp -r .carry-pair/model/. model/ && cp .carry-pair/w4_hybrid_tpu.py scripts/probes/ && cp .carry-pair/tpu-quant-archive.sh scripts/
grep -n "^VPU_COL_SHARE" model/kernels/fit_tpu.py
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-tpu/*.whl || exit 1
mkdir -p /tmp/qruns/logs
PYTHONUNBUFFERED=1 PYTHONPATH=$PYTHONPATH:$PWD timeout 70 python3 scripts/probes/w4_hybrid_tpu.py --cols 0,512,768,1024 --budget-s 55 --out /tmp/qruns/logs > /tmp/qruns/logs/hybrid-probe.log 2>&1
echo "probe rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "GB/s" /tmp/qruns/logs/hybrid-probe.log
arch() { bash scripts/tpu-quant-archive.sh "$@" --loops host --wheels none --budget-s $(left); }
export PYTHONPATH=$PYTHONPATH:$PWD:/tmp/site
arch none w4
g0=$(grep -h 'valid; gauge' /tmp/qruns/logs/sweep-w4-41.log | sed 's/.*gauge \([0-9.]*\).*/\1/')
sed -i 's/^VPU_COL_SHARE = 0.0/VPU_COL_SHARE = 0.375/' model/kernels/fit_tpu.py
mv /tmp/qruns/logs/sweep-w4-41.log /tmp/qruns/logs/sweep-w4-pair-41.log
arch w4
g1=$(grep -h 'valid; gauge' /tmp/qruns/logs/sweep-w4-41.log | sed 's/.*gauge \([0-9.]*\).*/\1/')
echo "w4 pair $g0 hybrid .375 $g1"
python3 -c "import sys; sys.exit(0 if float('${g1:-0}') > float('${g0:-0}') else 1)" || sed -i 's/^VPU_COL_SHARE = 0.375/VPU_COL_SHARE = 0.0/' model/kernels/fit_tpu.py
grep -n "^VPU_COL_SHARE" model/kernels/fit_tpu.py
arch w4,ple4,int8_lm_head w8 ple4,int8_lm_head ple4 int8_lm_head ple8
