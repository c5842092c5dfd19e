#!/usr/bin/env bash
# The GPU run rehearsed on this CPU with the GPU machine's software stack (issue 19):  make gpu-rehearsal
#   1. a venv holding only packages the image holds that the run needs, at the image's versions where
#      scripts/gpu-image-packages.txt gives one (jax/jaxlib 0.11.2 for CPU, numpy 2.5.2, ...), else constraints.txt's;
#      every distribution in it must be one the image lists. The project is NOT installed in it (the machine runs the
#      repository from PYTHONPATH). Cached by a hash of its inputs under $GEMMA4_BENCH_CACHE (else
#      $XDG_CACHE_HOME/gemma4-bench, else ~/.cache/gemma4-bench)/gpu-rehearsal/.
#   2. the carried wheels (scripts/gpu-wheels.sh), installed by scripts/gpu-run.sh --wheels as on the machine;
#   3. scripts/gpu-run.sh OUT --tiny --wheels DIR --quant none --quant ple4,int8_lm_head to the end: exit 0, summary
#      last, two valid run folders (dense and the published configuration, quantized on load on jax 0.11.2);
#   4. `bench serve` on loopback with the tiny checkpoint: /health ready, one completion, then stopped.
# Proves: every module the run and serve import is in the image or carried, and the code runs on jax 0.11.2 and the
# image's numpy/tokenizers/huggingface_hub. Cannot prove: anything about CUDA, the GPU plan, kernel names, timings.
# Exit 0 when all of it passed, else 1 with the failing step's log on stderr.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

# What the run and `bench serve` import from the image (bench/ and model/; pytest for running tests there), their
# own needs come with them. Left out: flax (pyproject names it, nothing imports it), torch and transformers (GBs; only
# the reference-fixture script uses them), xprof (not on the image; optional wheel).
NEEDS=(jax jaxlib numpy ml-dtypes safetensors tokenizers huggingface-hub typer click rich pandas matplotlib
       prometheus-client httpx pytest)

cache=${GEMMA4_BENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gemma4-bench}/gpu-rehearsal
py=$(scripts/find-python.sh)
pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[[ $pyver == 3.12 ]] || echo "gpu-rehearsal: warning: $py is Python $pyver; the GPU machine's is 3.12.3" >&2
key=$( { cat scripts/gpu-image-packages.txt constraints.txt scripts/gpu-rehearsal.sh scripts/gpu_image.py \
             scripts/gpu-wheels.sh; echo "$pyver ${NEEDS[*]}"; } | sha256sum | cut -c1-16)
venv=$cache/venv-$key wheels=$cache/wheels-$key
t0=$SECONDS
step() { echo "gpu-rehearsal: $* ($((SECONDS - t0)) s)"; }

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-rehearsal.XXXXXX")
serve_pid=""
cleanup() { [[ -z $serve_pid ]] || kill "$serve_pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "gpu-rehearsal: FAILED: $1" >&2; [[ -z ${2:-} || ! -f $2 ]] || tail -n 40 "$2" >&2; exit 1; }

if [[ -f $venv/.ok ]]; then
  step "venv cached: $venv"
else
  step "building the venv $venv with $py"
  mkdir -p "$cache"
  find "$cache" -maxdepth 1 -name 'venv-*' ! -name "venv-$key" -exec rm -rf {} +  # older inputs' venvs
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$py" scripts/gpu_image.py constraints >"$work/constraints.txt"
  mapfile -t specs < <("$py" scripts/gpu_image.py pins "${NEEDS[@]}")
  (( ${#specs[@]} == ${#NEEDS[@]} )) || fail "could not pin ${NEEDS[*]} (error above)"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
      -c "$work/constraints.txt" "${specs[@]}" >"$work/pip.log" 2>&1 || fail "pip install into the venv" "$work/pip.log"
  # What our pins pull in but the image lacks (typer 0.29 needs pydantic, dateutil 4 tzdata) goes: the image
  # runs without them, or with pydantic from the carried wheels, and so must the rehearsal.
  mapfile -t extra < <("$py" scripts/gpu_image.py extras "$venv/bin/python") || fail "could not list the venv"
  if (( ${#extra[@]} )); then
    step "removing from the venv what the image lacks: ${extra[*]}"
    "$venv/bin/python" -m pip uninstall --quiet --yes "${extra[@]}" >>"$work/pip.log" 2>&1 \
      || fail "pip uninstall ${extra[*]}" "$work/pip.log"
  fi
  "$py" scripts/gpu_image.py check-venv "$venv/bin/python" || fail "the venv holds packages the image lacks"
  touch "$venv/.ok"
fi
"$venv/bin/python" -c 'import jax, numpy; print("gpu-rehearsal: venv has jax", jax.__version__, "numpy", numpy.__version__)'

if [[ -f $wheels/.ok ]]; then
  step "wheels cached: $wheels"
else
  find "$cache" -maxdepth 1 -name 'wheels-*' ! -name "wheels-$key" -exec rm -rf {} +
  PYTHON=$venv/bin/python scripts/gpu-wheels.sh "$wheels" >"$work/wheels.log" 2>&1 \
    || fail "scripts/gpu-wheels.sh $wheels" "$work/wheels.log"
  cat "$work/wheels.log"
  touch "$wheels/.ok"
fi

# As on the machine: its interpreter, nothing of ours installed, a bare cache, no GPU.
export PYTHON=$venv/bin/python GEMMA4_BENCH_CACHE=$work/cache JAX_PLATFORMS=cpu
out=$work/out
step "scripts/gpu-run.sh OUT --tiny --wheels DIR"
rc=0
scripts/gpu-run.sh "$out" --tiny --wheels "$wheels" --budget-s 200 --inputs 41 --max-new-tokens 8 --repeats 1 \
  --steps 5 --quant none --quant ple4,int8_lm_head --pack "$work/pack" >"$work/gpu-run.out" 2>&1 || rc=$?
(( rc == 0 )) || fail "scripts/gpu-run.sh exited $rc" "$work/gpu-run.out"
last=$(tail -n 1 "$work/gpu-run.out")
[[ $last == "gpu-run: exit 0"* ]] || fail "the summary is not the last output (last line: $last)" "$work/gpu-run.out"
export PYTHONPATH=$repo:$out/site
nruns=0
for run in "$out"/runs/*/; do
  "$PYTHON" -m bench runs validate "$run" >"$work/validate.log" 2>&1 || fail "bench runs validate $run" "$work/validate.log"
  nruns=$((nruns + 1))
done
(( nruns == 2 )) || fail "gpu-run left $nruns run folder(s) under $out/runs, expected 2 (--quant none, --quant ple4,int8_lm_head)"
grep -q '"quantization": "int8_lm_head,ple4"' "$out"/runs/*-tiny-int8_lm_head.ple4-*/manifest.json \
  || fail "no run folder of --quant ple4,int8_lm_head under $out/runs" "$work/gpu-run.out"
step "gpu-run passed: exit 0, $nruns valid run folder(s)"

port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
step "bench serve on 127.0.0.1:$port (tiny checkpoint)"
timeout 150 "$PYTHON" -m bench serve --checkpoint builtin:tiny --host 127.0.0.1 --port "$port" \
  --warmup-shapes 8:4 >"$work/serve.log" 2>&1 &
serve_pid=$!
"$PYTHON" - "$port" "$serve_pid" >"$work/client.log" 2>&1 <<'EOF' || { tail -n 20 "$work/serve.log" >&2; fail "bench serve: the client check failed" "$work/client.log"; }
import json, os, sys, time, urllib.error, urllib.request
port, pid = sys.argv[1], int(sys.argv[2])
base = f"http://127.0.0.1:{port}"
deadline = time.monotonic() + 120
while True:  # /health: connection refused while starting, 503 while loading, 200 when warmed up
    try:
        with urllib.request.urlopen(base + "/health", timeout=5) as r:
            if r.status == 200:
                break
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit("bench serve exited before /health was ready")
    if time.monotonic() > deadline:
        sys.exit("bench serve: /health not ready within 120 s")
    time.sleep(0.5)
with urllib.request.urlopen(base + "/v1/models", timeout=10) as r:
    model = json.load(r)["data"][0]["id"]
payload = {"model": model, "prompt": "Hello", "max_tokens": 4, "ignore_eos": True}
req = urllib.request.Request(base + "/v1/completions", method="POST", headers={"Content-Type": "application/json"},
                             data=json.dumps(payload).encode())
try:
    with urllib.request.urlopen(req, timeout=60) as r:
        body = json.load(r)
except urllib.error.HTTPError as exc:
    sys.exit(f"POST /v1/completions {payload}: HTTP {exc.code}: {exc.read().decode()[:500]}")
assert body["choices"] and body["usage"]["completion_tokens"] == 4, body
print("completion ok:", body["usage"])
EOF
kill "$serve_pid" 2>/dev/null || true
wait "$serve_pid" 2>/dev/null || true
serve_pid=""
step "bench serve passed: $(tail -n 1 "$work/client.log")"
step "rehearsal passed"
