# The steps bench/gpu's one-command GPU checks share, sourced by them (bash): the Python and the carried wheels, the
# random-weight model, the server (`transformers serve --continuous-batching`, or with DRY=1 the emulator here) and
# its stop. The sourcing script sets DRY, OUT, W (work folder), M (model folder), R (this check's folder), HERE, PORT,
# URL and DEADLINE_S; serve_start sets srv (the server's pid, its process group's leader).

# This check's folder made afresh, everything after printed to OUT/run.log too, and the clock step() and left()
# (seconds to DEADLINE_S) count from.
serve_begin() {
  rm -rf "$R"
  mkdir -p "$OUT" "$R" "$M"
  exec > >(tee -a "$OUT/run.log") 2>&1
  t0=$(date +%s)
}
step() { echo "== +$(($(date +%s) - t0))s $*"; }
left() { echo $((DEADLINE_S - ($(date +%s) - t0))); }

# PY and the environment; on the GPU machine the carried wheels (.whl/, and any wheel files given) into /tmp/site.
serve_python() {
  if [ "$DRY" = 1 ]; then
    PY=$PWD/.venv/bin/python
  else
    PY=python3
    step "install carried wheels"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl "$@" || return 1
    export PATH=/tmp/site/bin:$PATH
  fi
  export PYTHONPATH=/tmp/site:$PWD/src:$PWD/$HERE LC_ALL=C.UTF-8 LANG=C.UTF-8
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
  # transformers serve's GET /v1/models answers 500 (CacheNotFound) unless the hub cache folder exists
  mkdir -p ~/.cache/huggingface/hub
}

# The tokenizer and the model (Qwen3 architecture, random weights) unless a warm machine has them; with DRY=1 only
# the architecture's config.json (the emulator sizes its step model from it).
serve_model() {
  if [ "$DRY" = 1 ]; then
    [ -f "$M/config.json" ] || cat > "$M/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2048, "intermediate_size": 6144,
 "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
 "vocab_size": 248320, "max_position_embeddings": 131072, "rope_theta": 1000000.0, "tie_word_embeddings": true,
 "eos_token_id": 248046, "pad_token_id": 248044, "torch_dtype": "bfloat16"}
JSON
    step "emulator in place of transformers serve"
  elif [ -f "$M/config.json" ] && [ -f "$M/tokenizer.json" ]; then
    step "model and tokenizer already built (warm machine)"
  else
    step "tokenizer (Qwen3.6 vocabulary) and model (Qwen3 architecture, random weights)"
    $PY $HERE/build_tokenizer.py "$W/tokenizer" || return 1
    $PY $HERE/build_model.py "$W/tokenizer" "$M" || return 1
  fi
}

# Start the server on PORT (its log R/server.log) in a process group of its own and wait for /health (3 min).
serve_start() {
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
  serve_wait
}

# Wait for the server srv (logging to R/server.log) to answer /health at URL (3 min).
serve_wait() {
  for _ in $(seq 1 180); do
    curl -sf "$URL/health" > /dev/null && break
    kill -0 $srv 2>/dev/null || { echo "server died"; tail -30 "$R/server.log"; return 1; }
    sleep 1
  done
  step "server ready"
}

# Stop the server's process group (SIGTERM, up to 60 s, then SIGKILL) and keep its log's tail.
serve_stop() {
  step "stop the server"
  kill -- -$srv 2>/dev/null || kill $srv 2>/dev/null
  for _ in $(seq 1 60); do kill -0 $srv 2>/dev/null || break; sleep 1; done
  kill -0 $srv 2>/dev/null && { kill -9 -- -$srv 2>/dev/null; sleep 3; }
  tail -60 "$R/server.log" > "$R/server-log-tail.txt"
}
