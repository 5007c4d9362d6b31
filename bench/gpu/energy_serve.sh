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
. $HERE/serve_lib.sh
serve_begin
serve_python || exit 1
if [ "$DRY" != 1 ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,power.min_limit,power.max_limit \
    --format=csv,noheader
  $PY -c "import torch, transformers, servesweep, pynvml; from importlib.metadata import version as v; print('torch', torch.__version__, 'transformers', transformers.__version__, 'nvidia-ml-py', v('nvidia-ml-py'), 'locust', v('locust'))" || exit 1
fi
serve_model || exit 1
serve_start || exit 1

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

step "stop the sampler"
$PY ansible/roles/sglang_server/files/gpu_sampler.py --state stopped --workdir "$R/sampler"
serve_stop
tar -czf "$OUT/results.tar.gz" -C "$R" --exclude=locust-report.html --exclude=server.log .
ls -la "$OUT"
step "done"
