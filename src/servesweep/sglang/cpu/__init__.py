"""Real SGLang on a CPU: its own virtual environment, a tiny offline model, and a launcher (the real-SGLang tier).

`servesweep sglang-cpu install|model|serve` (module `cli`); `docs/sglang-cpu.md` says what the tier is and is not.

Modules and files:
- `env`: where the tier lives (`$SERVESWEEP_CACHE_DIR/sglang-cpu`), the pins' stamp, the locked build of SGLang's
  venv (`requirements.txt` + `SGLANG_PIN`), the tiny model's folder (`ensure_model`)
- `requirements.txt`: SGLang 0.5.23's import-time dependencies with its own pins (sglang itself: --no-deps)
- `build_model.py`: run by SGLang's venv python; trains the byte-level BPE tokenizer and writes the random Qwen2
- `local_server`: the flags every CPU server gets (`BASE_FLAGS`), its environment (`server_env`), `start_server`
- `stand_in/sgl_kernel/`: the pure-torch stand-in for SGLang's CPU kernel package (put on the server's PYTHONPATH)
- `cli`: the `servesweep sglang-cpu` command

Imports nothing of servesweep outside `servesweep.sglang` but `servesweep.files` (the layer below).
"""
