"""A small word-level tokenizer directory that every tool here can load offline.

The peers size prompts with `transformers.AutoTokenizer` and this machine has no model hub, so the harness builds
one Hugging Face tokenizer (`tokenizer.json` + `tokenizer_config.json`) from the words of servesweep's own filler
text plus generic words, and gives the SAME directory to the emulator (`--tokenizer-path`), to servesweep
(`--tokenizer`) and to each peer: all sides then count prompt tokens alike. Word-level, so decode(encode(x)) keeps
the token count (peers that sample random ids and decode them get back what they asked for).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

SPECIALS = ["[UNK]", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _filler_words() -> list[str]:
    import servesweep

    data = json.loads((Path(servesweep.__file__).parent / "data" / "filler.json").read_text())
    words: set[str] = set()

    def walk(x) -> None:
        if isinstance(x, str):
            words.update(re.findall(r"\w+|[^\w\s]", x))
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(data)
    return sorted(words)


def build(path: Path, extra_words: int = 8000) -> Path:
    """Write the tokenizer into `path` (idempotent) and return it."""
    path = Path(path)
    if (path / "tokenizer.json").is_file() and (path / "tokenizer_config.json").is_file():
        return path
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    vocab: dict[str, int] = {}
    for w in [*SPECIALS, *map(str, range(10)), *_filler_words(), *(f"w{i}" for i in range(extra_words))]:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIALS)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "unk_token": "[UNK]",
                "bos_token": "<s>",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "model_max_length": 1_000_000,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=1,
        )
    )
    (path / "special_tokens_map.json").write_text(
        json.dumps({"unk_token": "[UNK]", "bos_token": "<s>", "eos_token": "<|im_end|>"})
    )
    return path
