#!/usr/bin/env bash
# Issue 22, "the GPU disagreement explained": servesweep and SGLang's bench_serving against one `transformers serve
# --continuous-batching` on the H200, with the same prompt pool (servesweep prompts --export sglang), 3,000-token
# prompts, 128 output tokens, concurrency 32 and 64, and a server-side record of every request (arrival, body read,
# every response chunk: bench/gpu/ttft_middleware.py). Runs, in this order, on one server:
#   ss32a sg32a ss32b sg32b (concurrency 32), sg64 ss64 (concurrency 64)
# (sg32r, not in the default list: bench_serving's own random-ids prompts, the first comparison)
# (ss: `servesweep load`, one wave of N users, --duration 2s; sg: bench_serving --max-concurrency N --num-prompts N
# --request-rate inf, its warm-up request included). Then bench/gpu/ttft_analyze.py joins the records.
#
# On the workstation first: bench/gpu/fetch_wheels.sh (.whl/) and bench/gpu/fetch_peer.sh (.peer/); then with the
# device tool, carry [".whl", ".peer"]:  timeout 580 bench/gpu/ttft_compare.sh
# Extra: RUNS="ss32a sg32a" to run a subset; SS_ARGS / SG_ARGS appended to every servesweep / bench_serving command.
set -uo pipefail
OUT=${OUT:-/tmp/ttft-out}
W=/tmp/servesweep-gpu
R=$W/ttft
PORT=8011
URL=http://127.0.0.1:$PORT
HERE=bench/gpu
RUNS=${RUNS:-"ss32a sg32a ss32b sg32b sg64 ss64"}
mkdir -p "$OUT" "$R"
exec > >(tee -a "$OUT/run.log") 2>&1
t0=$(date +%s)
. $HERE/serve_lib.sh  # step, serve_wait
mono() { python3 -c 'import time; print(time.monotonic_ns())'; }

step "install carried wheels"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .peer/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/site/bin:$PATH LC_ALL=C.UTF-8 LANG=C.UTF-8
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p ~/.cache/huggingface/hub
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, transformers, aiohttp; print('torch', torch.__version__, 'transformers', transformers.__version__, 'aiohttp', aiohttp.__version__)"

if [ -f "$W/model/config.json" ] && [ -f "$W/model/tokenizer.json" ]; then
  step "model and tokenizer already built (warm machine)"
else
  step "tokenizer and model"
  python3 $HERE/build_tokenizer.py "$W/tokenizer" || exit 1
  python3 $HERE/build_model.py "$W/tokenizer" "$W/model" || exit 1
fi

step "export the pools (servesweep prompts --export sglang): template overhead 8, as servesweep's probe measures"
# seed 1 for concurrency 32, seed 2 for 64 (servesweep load --seed the same); another nonce start per replay
for spec in "1 32 0 s1a" "1 32 1000 s1b" "2 64 0 s2"; do
  set -- $spec
  python3 -m servesweep.cli prompts --prompt-tokens 3000 -n "$2" --seed "$1" --template-overhead 8 \
    --export sglang --out "$R/pool-$4.jsonl" --nonce-start "$3" --json || exit 1
done

step "start transformers serve with the recording middleware"
rm -f "$R/server.jsonl" "$R/runs.jsonl"
TTFT_MW_LOG=$R/server.jsonl TTFT_MW_REWRITE=1 setsid python3 -c "import sys; sys.path.insert(0, '$HERE'); \
import ttft_middleware; ttft_middleware.install(); from transformers.cli.transformers import app; app()" \
  serve "$W/model" --host 127.0.0.1 --port $PORT --continuous-batching --cb-max-batch-tokens 8192 \
  --cb-max-memory-percent 0.6 --cb-use-cuda-graph > "$R/server.log" 2>&1 &
srv=$!
serve_wait || exit 1

step "what the server answers to each client's body as sent (X-MW-Raw: no rewrite)"
M=$W/model
for body in \
  "{\"model\":\"$M\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_completion_tokens\":4,\"stream\":true,\"temperature\":0.0,\"ignore_eos\":false}" \
  "{\"model\":\"$M\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_completion_tokens\":4,\"stream\":true,\"temperature\":0.0}" \
  "{\"model\":\"$M\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":4,\"stream\":true,\"stream_options\":{\"include_usage\":true,\"continuous_usage_stats\":true}}" \
  "{\"model\":\"$M\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":4,\"stream\":true,\"stream_options\":{\"include_usage\":true}}"; do
  echo "--- $body"
  curl -s -m 30 -H 'X-MW-Raw: 1' -H 'Content-Type: application/json' "$URL/v1/chat/completions" -d "$body" | head -c 600
  echo
done 2>&1 | tee "$R/probe.txt"
echo "--- max_completion_tokens 4, content chunks:" | tee -a "$R/probe.txt"
curl -s -m 90 -H 'X-MW-Raw: 1' -H 'Content-Type: application/json' "$URL/v1/chat/completions" -d \
  "{\"model\":\"$M\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_completion_tokens\":4,\"stream\":true}" \
  | grep -c '"content"' | tee -a "$R/probe.txt"

run_ss() {  # name concurrency seed
  local a=$(mono)
  timeout 200 python3 -m servesweep.cli load --base-url "$URL" --model "$M" --concurrency "$2" --duration 2s \
    --prompt-tokens 3000 --output-tokens 128 --no-ignore-eos --seed "$3" --out "$R/ss-$1" ${SS_ARGS:-} | tail -8
  echo "{\"name\":\"$1\",\"client\":\"servesweep\",\"concurrency\":$2,\"t0_ns\":$a,\"t1_ns\":$(mono),\"dir\":\"ss-$1\"}" >> "$R/runs.jsonl"
}
run_sg() {  # name concurrency pool (or "random": bench_serving's random-ids, the first comparison)
  local a=$(mono) data=(--dataset-name custom --dataset-path "$R/pool-$3.jsonl" --sharegpt-output-len 128)
  [ "$3" = random ] && data=(--dataset-name random-ids --random-input-len 3000 --random-output-len 128 --random-range-ratio 1)
  timeout 200 python3 $HERE/sglang_bench.py .peer --backend sglang-oai-chat --base-url "$URL" --model "$M" \
    --tokenizer "$M" "${data[@]}" --num-prompts "$2" --max-concurrency "$2" --request-rate inf --disable-ignore-eos --seed 1 \
    --output-file "$R/sg-$1.jsonl" --output-details --disable-tqdm ${SG_ARGS:-} 2>&1 | grep -v Warning | tail -40
  echo "{\"name\":\"$1\",\"client\":\"bench_serving\",\"concurrency\":$2,\"t0_ns\":$a,\"t1_ns\":$(mono),\"file\":\"sg-$1.jsonl\"}" >> "$R/runs.jsonl"
}
for r in $RUNS; do
  step "run $r"
  case $r in
  ss32a | ss32b) run_ss "$r" 32 1 ;;
  ss64) run_ss "$r" 64 2 ;;
  sg32a) run_sg "$r" 32 s1a ;;
  sg32b) run_sg "$r" 32 s1b ;;
  sg64) run_sg "$r" 64 s2 ;;
  sg32r) run_sg "$r" 32 random ;;
  esac
  sleep 3
done
kill $srv 2>/dev/null

step "analysis"
python3 $HERE/ttft_analyze.py "$R" | tee "$OUT/analysis.txt"
cp "$R/analysis.json" "$R/server.jsonl" "$R/probe.txt" "$OUT/" 2>/dev/null
tail -200 "$R/server.log" > "$OUT/server-log-tail.txt"
tar -czf "$OUT/ttft.tar.gz" -C "$W" --exclude='*.html' ttft
ls -la "$OUT"
step "done"
