#!/usr/bin/env bash
# What `make demo` runs: the quick-start matrix (examples/quickstart.yaml) against the SGLang emulator, which the
# sglang_server Ansible role starts and restarts on this machine with the process launcher: 2 server configurations
# (autoregressive, MTP) x 3 concurrencies x 2 prompt lengths. It plans, runs every point, prints the results table,
# and writes the HTML/Markdown report. A few minutes; no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
OUT="${OUT:-runs}"
"$VENV/bin/servesweep" plan examples/quickstart.yaml
exec "$VENV/bin/servesweep" run examples/quickstart.yaml --out "$OUT" "$@"
