"""Build the CPU tier's tiny model offline: `python build_model.py OUT_DIR`, run by SGLang's venv python.

Writes into OUT_DIR (which must not exist) a Hugging Face model folder SGLang loads with `--model-path`:
- a byte-level BPE tokenizer trained with `tokenizers` on generated English-like sentences (every byte is in the
  alphabet, so any text encodes), specials `<|endoftext|>` `<|im_start|>` `<|im_end|>`, EOS `<|im_end|>`, wrapped
  in `PreTrainedTokenizerFast` with a ChatML chat template (the Qwen layout servesweep's prompt pools assume);
- a `Qwen2ForCausalLM` with random weights (seed 0): 2 layers, hidden 128, intermediate 256, 4 heads, 2 KV heads,
  4096 positions, tied embeddings, `vocab_size` equal to the tokenizer's length so the model never samples an id
  the tokenizer cannot decode; bf16 safetensors (~1 MB).

Everything is deterministic, so the folder's name (a hash of this file and the pins, chosen by the caller) says
what is in it. No network: transformers is told to stay offline.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

VOCAB_SIZE = 512
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
WORDS = (
    "the a an of to and in is was for on with as by at from that this it be are or not have has had but which "
    "their they there were been one two three four five six seven eight nine ten time year day night people "
    "server request token model batch queue cache prefill decode latency throughput memory context length "
    "system user assistant answer question number code needle haystack secret find read write first last "
    "small large fast slow good new old long short high low open close start stop run test load point"
).split()


def corpus(n: int = 4000) -> list[str]:
    rng = random.Random(0)
    lines = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
        s = " ".join(words).capitalize()
        if rng.random() < 0.3:
            s += f" {rng.randint(0, 99999)}"
        lines.append(s + rng.choice([".", "?", "!", ","]))
    return lines


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None,
        unk_token=None, chat_template=CHAT_TEMPLATE, model_max_length=4096,
    )
    fast.save_pretrained(out)  # tokenizer.json, tokenizer_config.json, chat_template.jinja

    eos = fast.convert_tokens_to_ids("<|im_end|>")
    bos = fast.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True, rms_norm_eps=1e-6,
        rope_theta=10000.0, bos_token_id=bos, eos_token_id=eos, pad_token_id=bos,
    )
    config.dtype = torch.bfloat16
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    gen = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": bos, "do_sample": True}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python build_model.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    if out.exists():
        print(f"{out} exists; the caller builds into a fresh folder and renames it", file=sys.stderr)
        return 2
    out.mkdir(parents=True)
    build(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
