"""Answer checks: is a response degenerate text, does it state the needle, do two decodings agree.

A server can stream garbage fast: a model the server version mishandles writes "lambda lambda lambda …", a
wrong RoPE or context setting loses the long prompt, a broken speculative build changes greedy answers. These
functions read response texts only; they are pure (no IO, no Locust, no gevent) and cheap, so they run on every
response, off the timing path. docs/answers.md holds the definitions, the thresholds and how they were tuned.

Degeneration measures of one text (`measures`), computed on words (`\\w+`, lowercased) and tokens (words and
runs of punctuation; whitespace separates them):
- `top_word_share`: share of the most frequent word among the words (a single-token loop drives it to 1).
- `top_3gram_share`: share of the most frequent word 3-gram (a short cycle or a repeated line drives it up).
- `compression_ratio`: UTF-8 bytes / zlib bytes (level 9). Prose compresses 2-4x, code up to ~8x, loops far more.
- `repeated_line_share`: share of the text in lines or sentences that occur ≥ SEGMENT_MIN_REPS times.
- `loop_tokens`, `loop_period`, `loop_share`: the longest stretch of tokens made of one unit of 1..256 tokens
  repeated back to back (a word, a 3-token cycle, a sentence, a paragraph), its unit length and its share of
  all tokens.
- `char_loop`, `char_loop_share`: the same on characters, units of 1..16 characters: catches floods that have
  no words (whitespace, "!!!!", "aaaa" inside one word).

`degenerate(text)` returns (verdict, reasons, measures). A text is degenerate when any of these holds
(thresholds below; each was set between the worst healthy value and the weakest loop of the tuning corpus):
- loop: a unit repeated ≥ LOOP_MIN_REPS times back to back covers ≥ LOOP_MIN_SHARE of the tokens;
- char loop: a unit of ≤ 16 chars repeated back to back covers ≥ CHAR_LOOP_MIN_SHARE of the chars and is at
  least CHAR_LOOP_MIN_CHARS long;
- repeated lines: ≥ REPEATED_LINE_MAX of the text is lines or sentences (of ≥ SEGMENT_MIN_WORDS words, list
  numbering ignored) that occur ≥ SEGMENT_MIN_REPS times: loops with a counter ("1. X", "2. X", …) or sentences
  cycling in a new order, which are not periodic token by token;
- top word: the most frequent word is ≥ TOP_WORD_MAX of the words;
- top 3-gram: the most frequent word 3-gram is ≥ TOP_3GRAM_MAX of the 3-grams;
- compression: the text compresses ≥ COMPRESSION_MAX times (texts of ≥ COMPRESSION_MIN_BYTES bytes): a backstop
  for repetition none of the above sees; healthy code compresses up to 7.8x, so it is set high.
A text with fewer than MIN_WORDS words and fewer than MIN_CHARS characters is never degenerate: "The code is
4812." carries no evidence either way.

Measured error rates (tests/results/test_answers.py builds the corpus; docs/answers.md has the per-measure
figures): false positives 0 of 43 healthy answers written like a model's (prose, code, tables, lists, numbers,
short answers, reasoning, a song and a villanelle with refrains), 0 of the 79 topics of the Python reference
manual (28 to 7,000 words) and 0 of 3,000 windows of standard-library code (2,500 of 300 words, 500 of 1,500;
generated configuration data, _sysconfigdata, left out: 7 of its windows are flagged, one word being 40 % of
them); false negatives 0 of 182 degenerate texts (12 loop units, a counted line and cycling sentences, each
after 4 healthy openings covering 35/50/75 % of the text, or alone). Loops covering under ~25-30 % of a text
are not flagged, by design. Cost: ~3 ms per 1,000 tokens on one core (numpy), so run it off the timing path.

Needle scoring: servesweep's prompts hide " The access code for the {adjective} {noun} is {word}-{NNNN}." and
end with "Question: What is the access code for the {adjective} {noun}? Answer with the code only."
(workload/prompts.py `_needle`). `score_needle(answer, "falcon-4812")` is True when the final answer (reasoning
removed: `<think>…</think>` blocks, or everything before a lone `</think>`) states that code, in any case, with
any dash, a space or nothing between word and digits, in markdown or quotes, and no other word-NNNN code comes
before it. The server's separate `reasoning_content` is not an answer: pass `content` only.
"""

from __future__ import annotations

import re
import unicodedata
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

# ---------------------------------------------------------------- thresholds (docs/answers.md, "Thresholds")

MIN_WORDS = 20  # below this many words (and MIN_CHARS chars) a text is never degenerate: too little evidence
MIN_CHARS = 200
LOOP_MAX_PERIOD = 256  # tokens in the longest repeated unit searched for (a paragraph)
LOOP_MIN_REPS = 4  # a unit must come back to back at least this many times to be a loop
LOOP_MIN_SHARE = 0.30  # ... and cover this share of the tokens
CHAR_LOOP_MAX_PERIOD = 16
CHAR_LOOP_MIN_CHARS = 64
CHAR_LOOP_MIN_SHARE = 0.30
TOP_WORD_MAX = 0.30
REPEATED_LINE_MAX = 0.30
SEGMENT_MIN_WORDS = 5
SEGMENT_MIN_REPS = 5
TOP_3GRAM_MAX = 0.12
COMPRESSION_MAX = 10.0
COMPRESSION_MIN_BYTES = 400

_WORD = re.compile(r"\w+")
_TOKEN = re.compile(r"\w+|[^\w\s]+")
_LIST_MARK = re.compile(r"^\s*(?:[-*•·>#]+|\(?\w{1,3}[.):])?\s*")  # "- ", "12. ", "(a) ", "Q3: "
_SEGMENT = re.compile(r"\n|(?<=[.!?])\s+")  # lines, and sentences inside them


# ---------------------------------------------------------------- measures of one text


def _longest_periodic_run(ids: np.ndarray, max_period: int) -> tuple[int, int]:
    """(length, period) of the longest stretch of `ids` where ids[i] == ids[i + period] throughout.

    A stretch of length L with period p is a unit of p items repeated L/p times back to back. For each period,
    the longest run of matches ids[i] == ids[i+p] is the longest gap between mismatches; the stretch is that run
    plus the one unit it was compared against, kept when it holds two whole units. The shortest period wins a
    tie. A period whose matches are too few to beat the best so far is skipped before its runs are measured.
    """
    n = len(ids)
    best_len, best_p = 0, 0
    for p in range(1, min(max_period, n // 2) + 1):
        eq = ids[p:] == ids[:-p]
        if np.count_nonzero(eq) < max(p, best_len - p + 1):
            continue
        miss = np.flatnonzero(~eq)
        bounds = np.concatenate(([-1], miss, [len(eq)]))
        run = int(np.diff(bounds).max()) - 1
        if run >= p and run + p > best_len:
            best_len, best_p = run + p, p
    return best_len, best_p


def _ids(items: Sequence[str]) -> np.ndarray:
    """Items as integers, equal items equal ids (their hashes: 64-bit, so unequal items collide ~never)."""
    return np.fromiter(map(hash, items), dtype=np.int64, count=len(items))


def _repeated_line_share(text: str) -> float:
    """Share of the text's characters in segments (lines, and sentences inside lines) that occur
    ≥ SEGMENT_MIN_REPS times, compared without their list mark and case ("3. The answer is X." = "7. the answer
    is x."). Segments of fewer than SEGMENT_MIN_WORDS words do not count ("else:", "return None", a short
    refrain repeat in healthy text)."""
    counts: Counter[str] = Counter()
    lines = []
    for line in _SEGMENT.split(text):
        key = _LIST_MARK.sub("", line, count=1).strip().lower()
        lines.append((key, len(line)))
        if len(_WORD.findall(key)) >= SEGMENT_MIN_WORDS:
            counts[key] += 1
    total = sum(n for _, n in lines)
    rep = sum(n for key, n in lines if counts.get(key, 0) >= SEGMENT_MIN_REPS)
    return rep / total if total else 0.0


def measures(text: str) -> dict:
    """The degeneration measures of one response text (module docstring); all plain numbers."""
    words = [w.lower() for w in _WORD.findall(text)]
    tokens = _TOKEN.findall(text)
    raw = text.encode("utf-8", "surrogatepass")
    m: dict = {"words": len(words), "tokens": len(tokens), "chars": len(text)}
    m["top_word_share"] = Counter(words).most_common(1)[0][1] / len(words) if words else 0.0
    grams = list(zip(words, words[1:], words[2:], strict=False))
    m["top_3gram_share"] = Counter(grams).most_common(1)[0][1] / len(grams) if grams else 0.0
    m["compression_ratio"] = len(raw) / len(zlib.compress(raw, 9)) if raw else 0.0
    loop, period = _longest_periodic_run(_ids(tokens), LOOP_MAX_PERIOD)
    m["loop_tokens"], m["loop_period"] = loop, period
    m["loop_share"] = loop / len(tokens) if tokens else 0.0
    m["loop_reps"] = loop / period if period else 0.0
    m["repeated_line_share"] = _repeated_line_share(text)
    chars = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    m["char_loop"], m["char_loop_period"] = _longest_periodic_run(chars, CHAR_LOOP_MAX_PERIOD)
    m["char_loop_share"] = m["char_loop"] / len(text) if text else 0.0
    return m


def degenerate(text: str) -> tuple[bool, list[str], dict]:
    """(is the text degenerate, the reasons, its measures). Reasons name the thresholds crossed, with values."""
    m = measures(text)
    if m["words"] < MIN_WORDS and m["chars"] < MIN_CHARS:
        return False, [], m
    reasons = []
    if m["loop_reps"] >= LOOP_MIN_REPS and m["loop_share"] >= LOOP_MIN_SHARE:
        reasons.append(
            f"loop: a {m['loop_period']}-token unit repeated {m['loop_reps']:.0f}x covers "
            f"{m['loop_share']:.0%} of the tokens"
        )
    if m["char_loop"] >= CHAR_LOOP_MIN_CHARS and m["char_loop_share"] >= CHAR_LOOP_MIN_SHARE:
        reasons.append(
            f"char loop: a {m['char_loop_period']}-char unit repeated over {m['char_loop']} chars "
            f"({m['char_loop_share']:.0%})"
        )
    if m["repeated_line_share"] >= REPEATED_LINE_MAX:
        reasons.append(
            f"repeated lines: {m['repeated_line_share']:.0%} of the text is lines seen ≥ {LOOP_MIN_REPS}x"
        )
    if m["words"] >= MIN_WORDS and m["top_word_share"] >= TOP_WORD_MAX:
        reasons.append(f"top word: {m['top_word_share']:.0%} of the words are one word")
    if m["words"] >= MIN_WORDS and m["top_3gram_share"] >= TOP_3GRAM_MAX:
        reasons.append(f"top 3-gram: {m['top_3gram_share']:.0%} of the 3-grams are one 3-gram")
    if len(text.encode("utf-8", "surrogatepass")) >= COMPRESSION_MIN_BYTES and (
        m["compression_ratio"] >= COMPRESSION_MAX
    ):
        reasons.append(f"compression: the text compresses {m['compression_ratio']:.1f}x")
    return bool(reasons), reasons, m


def degenerate_rate(texts: Iterable[str]) -> float:
    """Share of degenerate texts (NaN for none): the per-point `degenerate_rate` of the summary and the gate."""
    flags = [degenerate(t)[0] for t in texts]
    return sum(flags) / len(flags) if flags else float("nan")


# ---------------------------------------------------------------- needle scoring

_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)
_DASHES = dict.fromkeys(map(ord, "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe58\ufe63\uff0d"), "-")
_ANY_CODE = re.compile(r"(?<![\w-])([a-z]+)-(\d+)(?![\w-])")


def final_answer(text: str) -> str:
    """The answer part of a response: `<think>…</think>` blocks removed (an unclosed one runs to the end), and
    everything up to a lone `</think>` (chat templates that open the block in the prompt, as Qwen3's do)."""
    text = _THINK_BLOCK.sub(" ", text)
    _, sep, after = text.rpartition("</think>")
    return after if sep else text


def _normalise(text: str) -> str:
    """NFKC, one kind of dash, lowercase, markdown and quote marks removed (they wrap a code, never change it)."""
    text = unicodedata.normalize("NFKC", text).translate(_DASHES).lower()
    return re.sub(r"[*_`\"'“”‘’«»]", " ", text)


def score_needle(answer_text: str, expected: str) -> bool:
    """Whether a response states the needle `expected` ("falcon-4812") as its answer (module docstring).

    The code may be written "Falcon-4812", "falcon – 4812", "falcon 4812", "falcon4812", "**falcon-4812**."; a
    different word-NNNN code stated before it makes the answer wrong ("river-1234, or maybe falcon-4812")."""
    word, _, digits = expected.strip().lower().partition("-")
    if not word or not digits:
        raise ValueError(f"needle answer {expected!r} is not WORD-DIGITS")
    text = _normalise(final_answer(answer_text))
    hit = re.search(rf"(?<![\w-]){re.escape(word)}\s*-?\s*{re.escape(digits)}(?![\w-])", text)
    if not hit:
        return False
    return all(w == word and d == digits for w, d in _ANY_CODE.findall(text[: hit.start()]))


def needle_accuracy(pairs: Iterable[tuple[str, str]]) -> float:
    """Share of (answer_text, expected) pairs whose answer states the needle (NaN for none); per prompt length."""
    scores = [score_needle(a, e) for a, e in pairs]
    return sum(scores) / len(scores) if scores else float("nan")


# ---------------------------------------------------------------- speculative vs autoregressive


def _comparable(text: str) -> list[str]:
    """A greedy answer as words for comparison: NFKC, whitespace runs collapsed (servers differ in trailing
    whitespace and detokenisation of spaces, not in content); case and punctuation kept: they are the answer."""
    return unicodedata.normalize("NFKC", text).split()


def answer_mismatch_rate(
    spec_answers: Sequence[str] | Mapping[str, str], ar_answers: Sequence[str] | Mapping[str, str]
) -> dict:
    """Compare the greedy answers of a speculative bundle with the autoregressive bundle's, prompt by prompt.

    Lists are paired by position; mappings (prompt id -> text) on their common keys. Returns `n`,
    `mismatch_rate` (share of pairs whose normalised texts differ), `exact_match_rate` (1 − that), and
    `prefix_agreement` (mean over pairs of common-prefix words / words of the longer text; 1 for equal texts):
    a lossless method matches up to numerics, so a mismatch rate of more than a few % is a broken build.
    """
    if isinstance(spec_answers, Mapping) and isinstance(ar_answers, Mapping):
        keys = sorted(set(spec_answers) & set(ar_answers))
        pairs = [(spec_answers[k], ar_answers[k]) for k in keys]
    elif isinstance(spec_answers, Mapping) or isinstance(ar_answers, Mapping):
        raise TypeError("pass two sequences or two mappings")
    else:
        if len(spec_answers) != len(ar_answers):
            raise ValueError(
                f"{len(spec_answers)} speculative answers for {len(ar_answers)} autoregressive ones"
            )
        pairs = list(zip(spec_answers, ar_answers, strict=True))
    if not pairs:
        nan = float("nan")
        return {"n": 0, "mismatch_rate": nan, "exact_match_rate": nan, "prefix_agreement": nan}
    exact, prefix = 0, 0.0
    for s, a in pairs:
        sw, aw = _comparable(s), _comparable(a)
        exact += sw == aw
        common = 0
        for x, y in zip(sw, aw, strict=False):
            if x != y:
                break
            common += 1
        prefix += common / max(len(sw), len(aw)) if (sw or aw) else 1.0
    n = len(pairs)
    return {
        "n": n,
        "mismatch_rate": 1 - exact / n,
        "exact_match_rate": exact / n,
        "prefix_agreement": prefix / n,
    }
