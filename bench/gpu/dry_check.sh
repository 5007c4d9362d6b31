#!/usr/bin/env bash
# The GPU experiment (bench/gpu/experiment.yaml) run here, before GPU time is booked: the same file, the same
# generic launcher path (launcher.command through the sglang_server role, /health readiness, no verification,
# no cache flush, the exporter on), with the emulator in place of `transformers serve` and SGLang's
# chunked_prefill_size in place of transformers' cb_max_batch_tokens (the emulator speaks SGLang's flags only).
# Writes the model's config.json (the emulator sizes its step model from it; no weights) where the GPU run builds
# the model, so model.path stays as it is.
#
# Usage: bench/gpu/dry_check.sh [OUT_DIR]      (default /tmp/servesweep-gpu-dry; needs .venv)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-/tmp/servesweep-gpu-dry}
PY=$PWD/.venv/bin/python
mkdir -p "$OUT" /tmp/servesweep-gpu/model
if [ ! -f /tmp/servesweep-gpu/model/model.safetensors ]; then
  # the architecture build_model.py builds on the GPU (28 layers, hidden 2048, 16/8 heads of 128, 248,320 rows)
  cat > /tmp/servesweep-gpu/model/config.json <<'EOF'
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2048, "intermediate_size": 6144,
 "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
 "vocab_size": 248320, "max_position_embeddings": 131072, "rope_theta": 1000000.0, "tie_word_embeddings": true,
 "eos_token_id": 248046, "pad_token_id": 248044, "torch_dtype": "bfloat16"}
EOF
fi
cmd='["{python}", "-m", "servesweep.sim", "--model-path", "{model_path}", "--host", "{host}", "--port", "{port}",
      "--sim-gpu", "H200", "--sim-load-time", "1", "--sim-calibration", "speedup=20"]'
"$PY" bench/gpu/variant.py bench/gpu/experiment.yaml "$OUT/experiment-dry.yaml" name=gpu-h200-dry \
  "launcher.command=$cmd" "launcher.python=\"$PY\"" 'server.base={}' \
  --rename-flag cb_max_batch_tokens=chunked_prefill_size
"$PY" -m servesweep.cli plan "$OUT/experiment-dry.yaml" || true
"$PY" -m servesweep.cli run "$OUT/experiment-dry.yaml" --out "$OUT/runs"
