"""Build a servable model directory with random weights: Qwen3 architecture, Qwen3.6 vocabulary.

No weights can be downloaded on the GPU machine, and servesweep measures the serving path, not answer quality, so
a randomly initialised Qwen3 model of realistic size (~1.9 B parameters by default: 28 layers, hidden 2048, 16
query / 8 KV heads of 128) exercises the same kernels, KV cache and batching as a trained one. Its vocabulary is the
Qwen3.6 one (248,320 rows) so the tokenizer built by build_tokenizer.py fits it; the tokenizer files are copied into
the model directory because `transformers serve` loads both from one path.

Usage: python build_model.py TOKENIZER_DIR OUT_DIR [--layers N] [--hidden N] [--device cuda|cpu]
Prints one JSON line (parameters, seconds).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=6144)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--max-positions", type=int, default=131072)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    if not (args.tokenizer_dir / "tokenizer.json").is_file():
        raise SystemExit(
            f"build_model: {args.tokenizer_dir}/tokenizer.json is missing (run build_tokenizer.py)"
        )

    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

    tcfg = json.loads((args.tokenizer_dir / "tokenizer_config.json").read_text())
    t0 = time.time()
    cfg = Qwen3Config(
        vocab_size=248320,  # Qwen3.5/3.6 embedding rows (the tokenizer's 248077 ids, padded)
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=args.max_positions,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=248046,  # <|im_end|>
        pad_token_id=248044,  # <|endoftext|>
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    n_params = sum(p.numel() for p in model.parameters())
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(args.out))
    # Sampling defaults would make output lengths random; the benchmark asks for fixed lengths (ignore_eos).
    GenerationConfig(eos_token_id=248046, pad_token_id=248044, do_sample=False).save_pretrained(str(args.out))
    for f in args.tokenizer_dir.iterdir():
        if f.is_file():
            shutil.copy2(f, args.out / f.name)
    print(
        json.dumps(
            {
                "dir": str(args.out),
                "parameters": n_params,
                "layers": args.layers,
                "hidden": args.hidden,
                "vocab_size": cfg.vocab_size,
                "tokenizer_eos": tcfg.get("eos_token"),
                "seconds": round(time.time() - t0, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
