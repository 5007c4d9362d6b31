#!/usr/bin/env bash
# Issue 33's shared one-user stream, on a real GPU server: at concurrency 1, does a prompt's stream of short answers
# stand for its long answers (same TTFT; TPOT only as much slower as the longer context makes it)? `transformers
# serve --continuous-batching` (the random-weight Qwen3 1.9 B of docs/gpu-validation.md, autoregressive: no
# speculative decoding here) serves `servesweep load` at concurrency 1: N requests of PROMPT-token prompts with SHORT
# output tokens, then N with LONG; one_user_analyze.py compares them, and within the long answers each request's
# decode over its first SHORT tokens against its whole answer.
#
# On the workstation: bench/gpu/fetch_wheels.sh (.whl/); then with the device tool, carry [".whl"]:
#   DEADLINE_S=540 timeout 590 bench/gpu/one_user.sh
# DRY=1 runs the same steps here against the emulator. Settings: PROMPT (30000), SHORT (256), LONG (2048), N (4:
# on an H100 a 30k prompt's 2048-token answer takes ~97 s at 47 ms a token, so 6 did not fit 540 s on 2026-12-05;
# the analysis reads an interrupted point's finished requests all the same).
# Leaves in $OUT: run.log, one_user.json, results.tar.gz. READ ONLY on the GPU: no GPU setting is changed.
set -uo pipefail
OUT=${OUT:-/tmp/one-user-out}
W=/tmp/servesweep-gpu
R=$W/one-user
PORT=8013
URL=http://127.0.0.1:$PORT
M=$W/model
HERE=bench/gpu
DEADLINE_S=${DEADLINE_S:-540}
DRY=${DRY:-0}
PROMPT=${PROMPT:-30000}
SHORT=${SHORT:-256}
LONG=${LONG:-2048}
N=${N:-4}
. $HERE/serve_lib.sh
serve_begin
serve_python || exit 1
[ "$DRY" = 1 ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
serve_model || exit 1
serve_start || exit 1

step "warm-up (not measured): 2 requests, ${PROMPT}-token prompts, 64 output tokens"
timeout 120 $PY -m servesweep.cli load --base-url "$URL" --model "$M" --concurrency 1 --requests 2 \
  --prompt-tokens "$PROMPT" --output-tokens 64 --no-ignore-eos --seed 99 --out "$R/warmup" > "$R/warmup.log" 2>&1
echo "warm-up exited $?"

for o in "$SHORT" "$LONG"; do
  l=$(left)
  [ "$l" -gt 60 ] || { echo "deadline: $o-token answers skipped"; break; }
  step "servesweep load: concurrency 1, $N requests, ${PROMPT}-token prompts, $o output tokens"
  timeout $((l - 30)) $PY -m servesweep.cli load --base-url "$URL" --model "$M" --concurrency 1 --requests "$N" \
    --prompt-tokens "$PROMPT" --output-tokens "$o" --no-ignore-eos --seed "$o" --out "$R/o$o"
  echo "servesweep load ($o output tokens) exited $?"
done

step "analysis"
$PY $HERE/one_user_analyze.py "$R" --short "$SHORT" --long "$LONG" --out "$OUT"

serve_stop
tar -czf "$OUT/results.tar.gz" -C "$R" --exclude=locust-report.html --exclude=server.log .
ls -la "$OUT"
step "done"
