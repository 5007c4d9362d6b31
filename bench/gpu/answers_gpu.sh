#!/usr/bin/env bash
# Issue 24's GPU check, "Answers of a random-weight model" (docs/gpu-validation.md): the random-weight Qwen3 1.9 B
# (Qwen3.6 vocabulary) served by `transformers serve --continuous-batching` on the H200, read by servesweep's
# answer checks, in one command:
#   1. `servesweep load` against a server started here: 3k-token prompts, concurrency 4, 128 output tokens,
#      --no-ignore-eos (transformers serve answers 422 to ignore_eos), 12 requests: the load figures and the
#      point's degenerate_rate (the parent judges the records' response_text);
#   2. the needle probes directly (matrix/answer_probes.py run_probes, via bench/gpu/answer_samples.py --probe)
#      against the same server, 3k and 30k prompts: a fallback should step 3 not finish;
#   3. `servesweep run` on bench/gpu/experiment.yaml cut to one configuration (max batch tokens 8192) and two
#      points (3k x 4, 30k x 1, 128 output tokens), probes on (the default) with answers.max_tokens 128: the run
#      folder's answers/<config>.json, each point's needle_accuracy and degenerate_rate, the report's Answers.
# Leaves at most 8 files in $OUT: run.log, load-summary.json, probes-direct.json, answers.json, summaries.json,
# report.md, samples.json, results.tar.gz.
#
# On the workstation first: bench/gpu/fetch_wheels.sh (.whl/) and bench/gpu/fetch_peer.sh (.peer/: orjson and
# tenacity, which .whl/ may lack); then with the device tool, carry [".whl", ".peer"]:
#   DEADLINE_S=540 timeout 590 bench/gpu/answers_gpu.sh
# DRY=1 runs the same steps here against the emulator (needs .venv; no wheels, no GPU).
set -uo pipefail
OUT=${OUT:-/tmp/answers-gpu-out}
W=/tmp/servesweep-gpu
R=$W/answers
PORT=8011
URL=http://127.0.0.1:$PORT
M=$W/model
HERE=bench/gpu
DEADLINE_S=${DEADLINE_S:-540}
DRY=${DRY:-0}
. $HERE/serve_lib.sh
serve_begin
extra=()  # orjson and tenacity from .peer/ where .whl/ lacks them
if [ "$DRY" != 1 ]; then
  for w in .peer/whl/orjson-*.whl .peer/whl/tenacity-*.whl; do
    n=$(basename "$w" | cut -d- -f1)
    ls .whl/"$n"-*.whl > /dev/null 2>&1 || extra+=("$w")
  done
fi
serve_python "${extra[@]}" || exit 1
if [ "$DRY" != 1 ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c "import torch, transformers, tenacity, orjson, servesweep; print('torch', torch.__version__, 'transformers', transformers.__version__)" || exit 1
fi
serve_model || exit 1
serve_start || exit 1
echo "--- one greedy non-streaming answer (the probes' request shape), 40 tokens:"
curl -s -m 60 -H 'Content-Type: application/json' "$URL/v1/chat/completions" -d \
  "{\"model\":\"$M\",\"messages\":[{\"role\":\"user\",\"content\":\"What is the capital of France?\"}],\"max_tokens\":40,\"temperature\":0,\"stream\":false}" \
  | head -c 1500
echo

step "servesweep load: 3k prompts, concurrency 4, 128 output tokens, 12 requests, no ignore_eos"
timeout 150 $PY -m servesweep.cli load --base-url "$URL" --model "$M" --concurrency 4 --requests 12 \
  --prompt-tokens 3000 --output-tokens 128 --no-ignore-eos --seed 0 --out "$R/load"
echo "servesweep load exited $?"
S=$(ls "$R"/load/*/c4/summary.json 2>/dev/null | head -1)
[ -n "$S" ] && cp "$S" "$OUT/load-summary.json" && $PY - "$S" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("load:", round(d["output_tokens_per_s"], 1), "output tok/s; TTFT p50", round(d["ttft_ms"]["p50"], 1), "ms;",
      "degenerate_rate", d.get("degenerate_rate"), d.get("degeneration"))
EOF

step "needle probes directly (answer_probes.run_probes): 3 prompts each at 3k and 30k, greedy, max_tokens 128"
EXP=$R/experiment-answers.yaml
vargs=(name=gpu-h200-answers 'server.axes.cb_max_batch_tokens=[8192]' 'load.concurrency=[1,4]'
  'load.prompt_tokens=[3000,30000]' load.output_tokens=128
  'exclude=[{"prompt_tokens":3000,"concurrency":1},{"prompt_tokens":30000,"concurrency":4}]'
  'answers={"max_tokens":128}' budget.wall_time=5m)
if [ "$DRY" = 1 ]; then
  cmd='["{python}", "-m", "servesweep.sim", "--model-path", "{model_path}", "--host", "{host}", "--port", "{port}",
        "--sim-gpu", "H200", "--sim-load-time", "1", "--sim-calibration", "speedup=20"]'
  vargs+=("launcher.command=$cmd" "launcher.python=\"$PY\"" 'server.base={}'
    'server.axes={"chunked_prefill_size":[8192]}' --rename-flag cb_max_batch_tokens=chunked_prefill_size)
fi
$PY $HERE/variant.py $HERE/experiment.yaml "$EXP" "${vargs[@]}" || exit 1
timeout 120 $PY $HERE/answer_samples.py --probe "$EXP" "$URL" 3000=128 30000=128 > "$OUT/probes-direct.json"
echo "probes exited $?"
$PY -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d['lengths']))" "$OUT/probes-direct.json"

serve_stop
[ "$DRY" = 1 ] || nvidia-smi --query-gpu=memory.used --format=csv,noheader

step "servesweep run $EXP (probes on by default)"
left=$((DEADLINE_S - ($(date +%s) - t0) - 45))
timeout -s TERM -k 30 "$left" $PY -m servesweep.cli run "$EXP" --out "$R/runs"
echo "servesweep run exited $?"
RUN=$(ls -td "$R"/runs/*/ 2>/dev/null | head -1)
RUN=${RUN%/}

step "report and files"
if [ -n "$RUN" ]; then
  timeout 40 $PY -m servesweep.cli report "$RUN" 2>&1 | grep -v -i "warning\|ax.legend"
  cp "$RUN/report.md" "$OUT/" 2>/dev/null
  $PY - "$RUN" "$OUT" <<'EOF'
import json, sys
from pathlib import Path
run, out = Path(sys.argv[1]), Path(sys.argv[2])
answers = {f.name: json.loads(f.read_text()) for f in sorted((run / "answers").glob("*.json"))}
(out / "answers.json").write_text(json.dumps(answers, indent=1, ensure_ascii=False))
sums = {str(f.relative_to(run)): json.loads(f.read_text()) for f in sorted(run.rglob("summary.json"))}
(out / "summaries.json").write_text(json.dumps(sums, indent=1))
for k, d in sums.items():
    print(k, round(d.get("output_tokens_per_s") or 0, 1), "tok/s; TTFT p50", round((d.get("ttft_ms") or {}).get("p50") or 0),
          "ms; degenerate_rate", d.get("degenerate_rate"), "; needle_accuracy", d.get("needle_accuracy"))
for name, a in answers.items():
    print(name, json.dumps(a.get("lengths")))
EOF
fi
$PY $HERE/answer_samples.py "$R/load" ${RUN:+"$RUN"} --per-point 4 > "$OUT/samples.json"
tar -czf "$OUT/results.tar.gz" -C "$R" --exclude=locust-report.html --exclude=job_events --exclude=.work \
  --exclude=report.html .
ls -la "$OUT"
step "done"
