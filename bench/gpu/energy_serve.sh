#!/usr/bin/env bash
# Issue 31 on the H200: joules per token of a real served load. `transformers serve --continuous-batching` (the
# random-weight Qwen3 1.9 B of docs/gpu-validation.md) serves `servesweep load` at several concurrencies while the
# sglang_server role's NVML sampler (ansible/roles/sglang_server/files/gpu_sampler.py, --source nvml) runs beside
# it, watching the server's pid as the role does; SERVESWEEP_GPU_TELEMETRY points each load point at the sampler,
# so run_point writes the point's gpu.json (energy counter, integrated power, idle baseline, J per token).
# nvidia-smi logs power every 200 ms alongside; energy_serve_analyze.py compares, per point and over the point's
# own window, the counter with the sampler's integrated power and with nvidia-smi's, and prints the table.
#
# READ ONLY on the GPU: nothing here sets a GPU setting (the power limit is read by the sampler, never set).
#
# On the workstation: bench/gpu/fetch_wheels.sh (.whl/); then with the device tool, carry [".whl"]:
#   DEADLINE_S=480 timeout 570 bench/gpu/energy_serve.sh
# DRY=1 runs the same steps here against the emulator (its NVML-shaped /sim/gpu as the sampler's source).
# Settings (environment): CONC (1,8,32), DUR (40s per point), IDLE_S (12: idle before each point, the baseline),
# PROMPT (3000 tokens), OUTPUT (128 tokens). Leaves in $OUT: run.log, energy.json, energy.md, results.tar.gz.
set -uo pipefail
OUT=${OUT:-/tmp/energy-serve-out}
W=/tmp/servesweep-gpu
R=$W/energy
PORT=8012
URL=http://127.0.0.1:$PORT
M=$W/model
HERE=bench/gpu
DEADLINE_S=${DEADLINE_S:-480}
DRY=${DRY:-0}
CONC=${CONC:-1,8,32}
DUR=${DUR:-40s}
IDLE_S=${IDLE_S:-12}
PROMPT=${PROMPT:-3000}
OUTPUT=${OUTPUT:-128}
rm -rf "$R"
mkdir -p "$OUT" "$R" "$M"
exec > >(tee -a "$OUT/run.log") 2>&1
t0=$(date +%s)
step() { echo "== +$(($(date +%s) - t0))s $*"; }
left() { echo $((DEADLINE_S - ($(date +%s) - t0))); }

if [ "$DRY" = 1 ]; then
  PY=$PWD/.venv/bin/python
  [ -f "$M/config.json" ] || cat > "$M/config.json" <<'EOF'
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2048, "intermediate_size": 6144,
 "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
 "vocab_size": 248320, "max_position_embeddings": 131072, "rope_theta": 1000000.0, "tie_word_embeddings": true,
 "eos_token_id": 248046, "pad_token_id": 248044, "torch_dtype": "bfloat16"}
EOF
else
  PY=python3
  step "install carried wheels"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PATH=/tmp/site/bin:$PATH
fi
export PYTHONPATH=/tmp/site:$PWD/src LC_ALL=C.UTF-8 LANG=C.UTF-8
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p ~/.cache/huggingface/hub

if [ "$DRY" = 1 ]; then
  step "emulator in place of transformers serve"
else
  nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,power.min_limit,power.max_limit \
    --format=csv,noheader
  $PY -c "import torch, transformers, servesweep, pynvml; from importlib.metadata import version as v; print('torch', torch.__version__, 'transformers', transformers.__version__, 'nvidia-ml-py', v('nvidia-ml-py'), 'locust', v('locust'))" || exit 1
  if [ -f "$M/config.json" ] && [ -f "$M/tokenizer.json" ]; then
    step "model and tokenizer already built (warm machine)"
  else
    step "tokenizer (Qwen3.6 vocabulary) and model (Qwen3 architecture, random weights)"
    $PY $HERE/build_tokenizer.py "$W/tokenizer" || exit 1
    $PY $HERE/build_model.py "$W/tokenizer" "$M" || exit 1
  fi
fi

step "start the server"
if [ "$DRY" = 1 ]; then
  setsid $PY -m servesweep.sim --model-path "$M" --host 127.0.0.1 --port $PORT --sim-gpu H200 --sim-load-time 1 \
    --sim-calibration speedup=20 > "$R/server.log" 2>&1 &
else
  setsid $PY -c "from transformers.cli.transformers import app; app()" serve "$M" --host 127.0.0.1 --port $PORT \
    --continuous-batching --cb-max-batch-tokens 8192 --cb-max-memory-percent 0.6 --cb-use-cuda-graph \
    > "$R/server.log" 2>&1 &
fi
srv=$!
for i in $(seq 1 180); do
  curl -sf "$URL/health" > /dev/null && break
  kill -0 $srv 2>/dev/null || { echo "server died"; tail -30 "$R/server.log"; exit 1; }
  sleep 1
done
step "server ready"

step "the role's GPU sampler beside the server (NVML; 4 Hz; exits with the server's pid)"
if [ "$DRY" = 1 ]; then SRC=$URL/sim/gpu; else SRC=nvml; fi
$PY ansible/roles/sglang_server/files/gpu_sampler.py --state started --workdir "$R/sampler" --source "$SRC" \
  --interval 0.25 --watch-pid $srv | tee "$R/sampler.json"
SAMPLER=$($PY -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['url'] if d.get('running') else '')" "$R/sampler.json")
[ -n "$SAMPLER" ] || { echo "no sampler"; exit 1; }
curl -s "$SAMPLER/samples?since=$(($(date +%s) - 2))" | head -c 1500; echo

SMI_PID=
if [ "$DRY" != 1 ]; then
  # nvidia-smi's power readings every 200 ms; power.draw.instant too where the driver has it (R530+)
  Q=timestamp,power.draw,utilization.gpu,clocks.sm
  nvidia-smi --query-gpu=power.draw.instant --format=csv,noheader > /dev/null 2>&1 && Q=$Q,power.draw.instant
  echo "$Q" > "$R/nvidia-smi.csv"
  nvidia-smi --query-gpu=$Q --format=csv,noheader,nounits -lms 200 >> "$R/nvidia-smi.csv" 2>&1 &
  SMI_PID=$!
fi

step "warm-up (not measured): concurrency 4, 8 requests"
timeout 120 $PY -m servesweep.cli load --base-url "$URL" --model "$M" --concurrency 4 --requests 8 \
  --prompt-tokens "$PROMPT" --output-tokens "$OUTPUT" --no-ignore-eos --seed 99 --out "$R/warmup" > "$R/warmup.log" 2>&1
echo "warm-up exited $?"

for c in ${CONC//,/ }; do
  l=$(left)
  [ "$l" -gt 90 ] || { echo "deadline: concurrency $c and later skipped"; break; }
  step "idle ${IDLE_S}s (the baseline), then servesweep load: concurrency $c, $DUR, ${PROMPT}-token prompts, $OUTPUT output tokens"
  sleep "$IDLE_S"
  SERVESWEEP_GPU_TELEMETRY=$SAMPLER timeout $((l - 30)) $PY -m servesweep.cli load --base-url "$URL" --model "$M" \
    --concurrency "$c" --duration "$DUR" --prompt-tokens "$PROMPT" --output-tokens "$OUTPUT" --no-ignore-eos \
    --seed "$c" --out "$R/load-c$c"
  echo "servesweep load (concurrency $c) exited $?"
done
sleep 2
[ -n "$SMI_PID" ] && kill "$SMI_PID" 2>/dev/null

step "analysis: counter vs integrated power vs nvidia-smi, per point"
$PY $HERE/energy_serve_analyze.py "$R" --out "$OUT" --dry "$DRY"

step "stop the sampler and the server"
$PY ansible/roles/sglang_server/files/gpu_sampler.py --state stopped --workdir "$R/sampler"
kill -- -$srv 2>/dev/null || kill $srv 2>/dev/null
for i in $(seq 1 30); do kill -0 $srv 2>/dev/null || break; sleep 1; done
kill -0 $srv 2>/dev/null && kill -9 -- -$srv 2>/dev/null
tail -40 "$R/server.log" > "$R/server-log-tail.txt"
tar -czf "$OUT/results.tar.gz" -C "$R" --exclude=locust-report.html --exclude=server.log .
ls -la "$OUT"
step "done"
