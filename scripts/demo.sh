#!/usr/bin/env bash
# What `make demo` runs: a concurrency sweep against the SGLang emulator (started and stopped by servesweep itself),
# 2k-token prompts, 128 output tokens, 2 x concurrency requests per point (at least 8). About a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
OUT="${OUT:-runs}"
exec "$VENV/bin/servesweep" load \
  --sim-args "--model-path Qwen/Qwen3.6-27B --enable-cache-report" \
  --concurrency 1,2,4,8 \
  --prompt-tokens 2000 \
  --output-tokens 128 \
  --out "$OUT" \
  "$@"
