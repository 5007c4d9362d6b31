"""Answer checks (issue 24): degeneration verdicts and their error rates on a tuning corpus, needle scoring,
and the per-point aggregates.

The corpus: healthy answers written the way a chat model answers (prose, code, lists, numbers, short answers,
reasoning, poems with refrains, tables), the Python reference manual's topics (pydoc_data: 79 real texts of 28 to
7,000 words, prose with code) and 300-word windows of the standard library's source (code and docstrings); and
degenerate texts built from healthy openings followed by the loops models fall into (one token, a 3-token cycle,
a sentence, a paragraph, one character, whitespace floods, a numbered line, sentences cycling in a new order
each round), the loop covering 35 % to 100 % of the text. docs/answers.md reports the same figures.
"""

from __future__ import annotations

import math
import pydoc_data.topics
import random
import sysconfig
from pathlib import Path

import pytest

from servesweep.results import answer_checks as answers
from servesweep.results.answer_checks import (
    answer_mismatch_rate,
    degenerate,
    degenerate_rate,
    final_answer,
    measures,
    needle_accuracy,
    score_needle,
)

# ---------------------------------------------------------------- the corpus

HEALTHY = [
    "The code is 4812.",
    "falcon-4812",
    "Yes.",
    "No, that is not correct.",
    """<think>The question asks for the access code of the amber archive. The text says it is falcon-4812.</think>

falcon-4812""",
    "42",
    "Paris is the capital of France.",
    """1. Preheat the oven.
2. Mix the flour.
3. Bake for 20 minutes.""",
    """The main difference between a process and a thread is what they share. A process has its own address space, file descriptors and signal handlers, so two processes cannot read each other's memory unless they set up shared memory explicitly. Threads of one process share the address space and most kernel resources, which makes communication cheap but also means that a bug in one thread can corrupt data used by another.

In practice, this shapes how servers are written. A web server that forks a worker per connection gets isolation for free: a crash in one worker does not take down the rest. A threaded server uses less memory per connection and can share caches, but it needs locks around shared state. Python adds a twist with the global interpreter lock, which lets only one thread execute bytecode at a time, so CPU-bound work usually goes to processes while I/O-bound work is fine with threads or an event loop.""",
    """Here is a function that returns the n-th Fibonacci number iteratively:

```python
def fib(n: int) -> int:
    if n < 0:
        raise ValueError("n must be non-negative")
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
```

It runs in O(n) time and O(1) memory. For very large n you can use matrix exponentiation or the fast-doubling identities, which bring the time down to O(log n) multiplications:

```python
def fib_fast(n: int) -> int:
    def pair(k):
        if k == 0:
            return 0, 1
        a, b = pair(k // 2)
        c = a * (2 * b - a)
        d = a * a + b * b
        return (d, c + d) if k % 2 else (c, d)
    return pair(n)[0]
```""",
    """| Model | Parameters | Context | Throughput (tok/s) |
|---|---|---|---|
| Small | 1.5B | 32k | 5,400 |
| Medium | 8B | 128k | 2,100 |
| Large | 27B | 256k | 780 |
| XL | 70B | 128k | 310 |

The throughput column was measured at batch size 32 with 1,024 output tokens on a single H100. Larger models trade speed for quality; the 27B model is the usual sweet spot for long-context work.""",
    """Let me work through this step by step.

First, the train leaves at 9:40 and travels 180 km at 120 km/h, so the trip takes 1.5 hours and it arrives at 11:10. Second, the connecting bus leaves every 25 minutes starting at 10:00, which gives departures at 10:00, 10:25, 10:50, 11:15 and 11:40. The first bus after 11:10 is the 11:15 one. Third, the bus ride is 35 minutes, so the arrival is 11:50.

Wait, I should check whether the walk from the station to the bus stop matters. The problem says it takes 4 minutes, so the traveller reaches the stop at 11:14, still in time for the 11:15 bus.

So the final answer is 11:50.""",
    """Sure! Here are ten ideas for a rainy weekend:

- Bake bread from scratch and try a new shape.
- Start a jigsaw puzzle with at least 1,000 pieces.
- Watch a film trilogy you have never seen.
- Reorganise a bookshelf by colour.
- Write letters to two old friends.
- Learn three chords on a ukulele.
- Cook a dish from a cuisine you rarely eat.
- Play a long board game such as Terraforming Mars.
- Visit a museum you keep meaning to see.
- Sort your photos from last year into albums.""",
    '{"name": "servesweep", "version": "0.4.2", "dependencies": {"locust": ">=2.44", "numpy": ">=1.26"}, "scripts": {"servesweep": "servesweep.cli:main"}, "license": "Apache-2.0", "authors": [{"name": "A. Engineer", "email": "a@example.com"}]}',
    "To solve 3x + 7 = 22, subtract 7 from both sides to get 3x = 15, then divide both sides by 3 to get x = 5. You can check the result by substituting it back: 3 * 5 + 7 = 15 + 7 = 22, which matches the right-hand side.",
    """SELECT c.customer_id,
       c.name,
       COUNT(o.order_id) AS orders,
       SUM(o.total) AS revenue
FROM customers AS c
LEFT JOIN orders AS o ON o.customer_id = c.customer_id
WHERE o.created_at >= DATE '2024-01-01'
GROUP BY c.customer_id, c.name
HAVING SUM(o.total) > 1000
ORDER BY revenue DESC
LIMIT 20;

This query lists the twenty customers with the highest revenue since the start of 2024, keeping only those above 1,000. The LEFT JOIN keeps customers without orders, but the WHERE clause on o.created_at filters them out again; move that condition into the ON clause if you want them listed with zero orders.""",
    "Photosynthesis happens in two stages. In the light-dependent reactions, chlorophyll in the thylakoid membranes absorbs photons, splits water into oxygen, protons and electrons, and uses the electron flow to make ATP and NADPH. In the Calvin cycle, which runs in the stroma, the enzyme RuBisCO fixes carbon dioxide onto a five-carbon sugar; ATP and NADPH then reduce the products to glyceraldehyde-3-phosphate, some of which leaves the cycle to build glucose while the rest regenerates the starting sugar.",
    "The access code for the amber archive is falcon-4812.",
    """Roses are red,
Violets are blue,
Sugar is sweet,
And so are you.

This is the classic form; people often change the last two lines for jokes, for example "I wrote a compiler, and it compiles too." """,
    """Quarterly revenue, in millions of dollars:

Q1 2023: 12.4
Q2 2023: 13.1
Q3 2023: 12.9
Q4 2023: 15.6
Q1 2024: 14.2
Q2 2024: 16.8
Q3 2024: 17.3
Q4 2024: 19.9

Revenue grew 60.5% from Q1 2023 to Q4 2024, with the strongest quarter-on-quarter jump (+20.9%) in Q4 2023.""",
    """import numpy as np

def softmax(x, axis=-1):
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)

def attention(q, k, v, mask=None):
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    return softmax(scores) @ v

q = np.random.randn(2, 4, 8)
k = np.random.randn(2, 6, 8)
v = np.random.randn(2, 6, 8)
print(attention(q, k, v).shape)  # (2, 4, 8)""",
    "I'm sorry, but I can't help with that request. If you are locked out of your own account, the service's official recovery page is the safest way back in.",
    "En résumé, la méthode consiste à diviser le problème en sous-problèmes plus petits, à les résoudre récursivement, puis à combiner leurs solutions. C'est le principe de « diviser pour régner », utilisé par le tri fusion et par l'algorithme de Karatsuba pour la multiplication.",
    """Step 1: Install the package with `pip install servesweep`.
Step 2: Start the emulator with `servesweep sim --port 30000`.
Step 3: Run a load test with `servesweep load --base-url http://127.0.0.1:30000 --concurrency 1,2,4`.
Step 4: Open the report in `runs/<id>/report.html` and compare the TTFT percentiles.
Step 5: Repeat with a different `--tp` value and run `servesweep compare` on the two folders.""",
    """def test_parse_fault():
    assert parse_fault("429") == Fault("429")
    assert parse_fault("stall:2.5") == Fault("stall", 2.5)
    assert parse_fault("disconnect") == Fault("disconnect", 2.0)
    assert parse_fault("malformed:3") == Fault("malformed", 3.0)
    assert parse_fault("slow_first_byte:0.5") == Fault("slow_first_byte", 0.5)
    with pytest.raises(ValueError, match="unknown fault kind"):
        parse_fault("explode")
    with pytest.raises(ValueError, match="takes no argument"):
        parse_fault("500:1")""",
    """<think>
The user wants the sum of the first 100 positive integers. Gauss's trick: pair 1 with 100, 2 with 99, and so on. Each pair sums to 101 and there are 50 pairs, so the sum is 5050. Let me double check with the formula n(n+1)/2 = 100 * 101 / 2 = 5050. Yes.
</think>

The sum of the integers from 1 to 100 is **5050**. Pairing the numbers from both ends gives 50 pairs that each add up to 101, and 50 × 101 = 5050.""",
    "A hash map stores key-value pairs in an array of buckets. To insert a key, the map computes hash(key) modulo the number of buckets and places the pair in that bucket; collisions are handled by chaining (a small list per bucket) or by open addressing (probing the next free slot). Lookups repeat the same computation, so they take constant time on average. When the load factor, the ratio of stored pairs to buckets, passes a threshold such as 0.75, the map allocates a larger array and rehashes every key, which keeps the chains short. The worst case is linear time, when many keys collide, which is why languages randomise their string hashes to resist deliberate collision attacks.",
    """Chorus:
We keep on running through the night,
We keep on running toward the light.

Verse 2:
The city sleeps, the engines hum,
We count the miles until they're done.

Chorus:
We keep on running through the night,
We keep on running toward the light.

Bridge:
And if the road should fall apart,
We'll find the map inside the heart.""",
    """Dear Ms. Alvarez,

Thank you for your letter of 3 March and for the detailed notes on the draft contract. We have accepted your changes to clauses 4.2 and 7.1. On clause 9, we propose a 60-day notice period instead of 30, since our suppliers need two months to adjust their schedules. Please let me know whether this works for your team; if it does, we can sign the final version next week.

Kind regards,
Daniel Okafor""",
    "The answer is B. Option A confuses correlation with causation, option C assumes the sample is representative when the survey only reached people who answered their phones, and option D ignores the confounding effect of age. Only B identifies the flaw the question is pointing at: the study never controlled for income.",
    "Primes below 100: 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97. There are 25 of them.",
    """fn main() {
    let words = vec!["apple", "banana", "cherry"];
    let lengths: Vec<usize> = words.iter().map(|w| w.len()).collect();
    let total: usize = lengths.iter().sum();
    println!("{:?} -> {}", lengths, total);
    for (i, w) in words.iter().enumerate() {
        if w.starts_with('b') {
            println!("{} starts with b at index {}", w, i);
        }
    }
}""",
    "Good question. The short version: yes, you can run the 27B model on two RTX A6000 cards with tensor parallelism 2, but the context you can serve depends on the memory left after the weights. At bf16 the weights take about 54 GB, so each card holds 27 GB of weights and has roughly 15 GB for the KV cache at a memory fraction of 0.9. With a hybrid-attention model only a quarter of the layers keep a full KV cache, which is what makes 100k-token prompts fit at all. If you need more concurrency, an FP8 checkpoint halves the weight memory and doubles the room for the cache.",
    """Monday: chest and triceps, 45 minutes.
Tuesday: 5 km run at an easy pace.
Wednesday: back and biceps, 45 minutes.
Thursday: rest or a long walk.
Friday: legs and core, 50 minutes.
Saturday: intervals, 8 x 400 m with 90 s rest.
Sunday: rest.""",
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and arrows of outrageous fortune, or to take arms against a sea of troubles and by opposing end them.",
    """apiVersion: apps/v1
kind: Deployment
metadata:
  name: sglang
  labels:
    app: sglang
spec:
  replicas: 1
  selector:
    matchLabels:
      app: sglang
  template:
    metadata:
      labels:
        app: sglang
    spec:
      containers:
        - name: server
          image: lmsysorg/sglang:v0.5.11
          args: ["--model-path", "Qwen/Qwen3.6-27B", "--tp", "2", "--port", "30000"]
          resources:
            limits:
              nvidia.com/gpu: 2""",
    "The mitochondrion is often called the powerhouse of the cell. It converts energy from nutrients into ATP through oxidative phosphorylation. It has its own DNA, inherited from the mother, and divides independently of the cell. Its inner membrane is folded into cristae, which increase the surface area available for the electron transport chain.",
    """Okay, so the user is asking about the access code. Let me look at the document again. There is a sentence about the amber archive somewhere in the middle: "The access code for the amber archive is falcon-4812." There is nothing else about codes. So the answer should be just the code.

falcon-4812""",
    'def test_round_trip(self):\n    result = decode(encode(b"abc"))\n    self.assertEqual(result, expected_value)\n    result = decode(encode(b"xyz"))\n    self.assertEqual(result, expected_value)\n    result = decode(encode(b""))\n    self.assertEqual(result, expected_value)\n    result = decode(encode(b"\\x00\\x01"))\n    self.assertEqual(result, expected_value)',
    """The lamps are lit along the harbour wall,
and ships come home before the evening tide.
We wait for those who do not hear the call.

The gulls grow quiet as the shadows fall,
the nets are mended and the boats are dried;
the lamps are lit along the harbour wall.

A child runs down the stones and starts to call
a name the wind has carried far and wide.
We wait for those who do not hear the call.

The tide will turn, the harbour bells will toll,
the lamps are lit along the harbour wall,
we wait for those who do not hear the call.""",
    """| Feature | Free | Pro | Enterprise |
|---|---|---|---|
| Projects | 3 | Unlimited | Unlimited |
| Storage | 1 GB | 100 GB | 1 TB |
| SSO | No | No | Yes |
| Audit log | No | Yes | Yes |
| Support | Community | Email | 24/7 phone |
| API access | Yes | Yes | Yes |
| Custom roles | No | No | Yes |

---

## Which plan should you choose?

If you are a single developer, the Free plan covers most needs. Teams that share projects usually outgrow it within a month, mainly because of the storage limit.

---

## Notes

Prices exclude VAT. Annual billing saves two months.""",
    """<think>
Let me check the document for the code. Searching... the cobalt vault is mentioned in paragraph 3, but that sentence is about its opening hours. Let me check again. In paragraph 7: "The access code for the cobalt vault is river-2231." Let me check that this is the vault the question asks about: the question says cobalt vault. Yes. Let me check there is no second code for it: no.
</think>
river-2231""",
    """id,name,score
1,alice,93
2,bob,87
3,carol,91
4,dave,78
5,erin,88
6,frank,95
7,grace,82
8,heidi,90
9,ivan,85
10,judy,97
11,mallory,64
12,oscar,79""",
]

PARA = (
    "The server keeps a cache of recent prefixes so that repeated system prompts do not need a new prefill. "
    "When the cache is full, the least recently used entries are evicted first, and a request that hits the "
    "cache starts decoding sooner. This is why a benchmark must vary its prompts."
)
LOOP_UNITS = {
    "token": " lambda",
    "token_glued": "lambda",
    "cycle3": " of the model",
    "sentence": " The access code is falcon-4812.",
    "paragraph": "\n\n" + PARA,
    "long_paragraph": "\n\n" + " ".join([PARA, HEALTHY[22], HEALTHY[13]]),
    "char": "a",
    "bang": "!",
    "newlines": "\n",
    "spaces": " ",
    "alternating": " Wait, let me check that again. The code is falcon-4812. Hmm, let me verify it once more.",
    "code_line": "\n    x = x + 1",
}
CYCLING = [
    " The cache is warm.",
    " Requests arrive in bursts at noon.",
    " Each worker keeps its own queue of prompts.",
]
OPENINGS = ["", HEALTHY[8], HEALTHY[9], HEALTHY[11], HEALTHY[27]]  # none, prose, code, reasoning, a song
COVERS = (0.35, 0.5, 0.75)


def _numbered(chars: int) -> str:
    """The same line with a counter: not periodic token by token, caught as repeated lines."""
    n = max(5, chars // 48)
    return "".join(f"\n{i}. The answer is that the code is falcon-4812." for i in range(1, n + 1))


def _cycling(chars: int) -> str:
    """Three sentences in a new order each round: repetition that is not a loop."""
    rng, out = random.Random(chars), []
    while len("".join(out)) < chars:
        out += rng.sample(CYCLING, 3)
    return "".join(out)


def degenerate_corpus() -> list[tuple[str, str]]:
    """(label, text): each loop after each opening, covering 35/50/75 % of the text, or all of it alone."""
    out = []
    makers = {k: (lambda chars, u=u: u * max(4, int(chars / len(u)) + 1)) for k, u in LOOP_UNITS.items()}
    makers |= {"numbered": _numbered, "cycling": _cycling}
    for kind, make in makers.items():
        for opening in OPENINGS:
            for cover in COVERS if opening else (1.0,):
                chars = max(len(opening) * cover / (1 - cover), 600) if opening else 2000
                out.append((f"{kind}/{len(opening)}/{cover}", opening + make(int(chars))))
    return out


def reference_texts() -> list[str]:
    """The Python reference manual's topics: real technical prose with code, 28 to 7,000 words each."""
    return [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)]


def stdlib_windows(n: int = 300, words: int = 300, seed: int = 1) -> list[tuple[str, str]]:
    """(file, text): windows of whole lines of the standard library's top-level modules, seeded. Generated
    configuration data (_sysconfigdata*: compiler flags, one word 40 % of the text) is left out: it is not text a
    model writes, and the top-word check rightly calls it repetitive."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if not p.name.startswith("_sysconfigdata"))
    rng, out = random.Random(seed), []
    while len(out) < n:
        lines = rng.choice(files).read_text(errors="replace").splitlines(keepends=True)
        if len(lines) < 50:
            continue
        i, chunk, w = rng.randrange(len(lines)), [], 0
        while i < len(lines) and w < words:
            chunk.append(lines[i])
            w += len(lines[i].split())
            i += 1
        if w >= 100:
            out.append((lines[0][:40], "".join(chunk)))
    return out


# ---------------------------------------------------------------- verdicts and error rates


def _flagged(texts):
    return [(label, degenerate(t)[1]) for label, t in texts if degenerate(t)[0]]


@pytest.mark.fast
def test_healthy_answers_are_never_degenerate():
    assert _flagged(enumerate(HEALTHY)) == []


@pytest.mark.fast
def test_reference_manual_is_never_degenerate():
    assert _flagged(enumerate(reference_texts())) == []


@pytest.mark.fast
def test_stdlib_code_false_positive_rate():
    """0 of 300 windows flagged here (and 0 of 2,500 at tuning time); allow one in case another Python's stdlib
    has a data table."""
    windows = stdlib_windows()
    assert len(_flagged(windows)) <= 1, _flagged(windows)


@pytest.mark.fast
def test_degenerate_corpus_is_always_caught():
    corpus = degenerate_corpus()
    assert len(corpus) == 14 * (1 + 4 * len(COVERS))
    missed = [label for label, t in corpus if not degenerate(t)[0]]
    assert missed == []


@pytest.mark.parametrize(
    "text",
    [
        "lambda " * 15,  # a loop, but under MIN_WORDS words: too little evidence either way
        "The code is 4812." + "\n" * 100,
        " " * 150,
        "yes yes yes yes yes yes yes yes yes yes",
        "",
    ],
)
@pytest.mark.fast
def test_short_texts_are_never_degenerate(text):
    assert degenerate(text)[0] is False


@pytest.mark.fast
def test_each_reason_names_its_measure():
    loop = "The answer is" + " lambda" * 200
    ok, reasons, m = degenerate(loop)
    assert ok and any(r.startswith("loop: a 1-token unit") for r in reasons)
    assert m["loop_period"] == 1 and m["loop_tokens"] == 200
    flood = HEALTHY[8] + "\n" * 2000
    ok, reasons, m = degenerate(flood)
    assert ok and [r.split(":")[0] for r in reasons] == ["char loop"]
    ok, reasons, _ = degenerate(HEALTHY[8] + _numbered(1200))
    assert ok and [r.split(":")[0] for r in reasons] == ["repeated lines"]


@pytest.mark.fast
def test_measures_on_known_texts():
    m = measures("a b c " * 50)
    assert (
        m["loop_period"] == 3 and m["loop_tokens"] == 150 and m["top_3gram_share"] == pytest.approx(50 / 148)
    )
    assert m["top_word_share"] == pytest.approx(1 / 3)
    assert measures("")["words"] == 0 and measures("")["compression_ratio"] == 0.0
    assert measures("x" * 4000)["compression_ratio"] > 50


def test_thresholds_have_margin_on_healthy_text():
    """Each measure's worst healthy value in the corpus stays clear of its threshold (the figures in
    docs/answers.md, "Thresholds")."""
    texts = HEALTHY + reference_texts() + [t for _, t in stdlib_windows(150, seed=2)]
    ms = [measures(t) for t in texts if measures(t)["words"] >= answers.MIN_WORDS]
    assert max(m["top_word_share"] for m in ms) < answers.TOP_WORD_MAX
    assert max(m["top_3gram_share"] for m in ms) < answers.TOP_3GRAM_MAX
    assert max(m["compression_ratio"] for m in ms) < answers.COMPRESSION_MAX
    assert max(m["repeated_line_share"] for m in ms) < answers.REPEATED_LINE_MAX
    assert max(m["char_loop_share"] for m in ms) < answers.CHAR_LOOP_MIN_SHARE
    looped = [m["loop_share"] for m in ms if m["loop_reps"] >= answers.LOOP_MIN_REPS]
    assert max(looped) < answers.LOOP_MIN_SHARE


@pytest.mark.fast
def test_degenerate_rate():
    assert degenerate_rate([HEALTHY[8], HEALTHY[9], "The answer is" + " lambda" * 300, HEALTHY[11]]) == 0.25
    assert math.isnan(degenerate_rate([]))


# ---------------------------------------------------------------- needle scoring


@pytest.mark.parametrize(
    "answer",
    [
        "falcon-4812",
        "falcon-4812\n",
        "Falcon-4812.",
        "FALCON-4812",
        "**falcon-4812**",
        "`falcon-4812`",
        '"falcon-4812"',
        "The access code for the amber archive is falcon-4812.",
        "falcon – 4812",
        "falcon\u20114812",
        "falcon 4812",
        "falcon4812",
        "<think>The text says the amber archive's code is falcon-4812. Let me answer.</think>\n\nfalcon-4812",
        "<think>\nIs it river-1234? No, that is the cobalt vault.\n</think>\nfalcon-4812",
        "Okay, the document says so.\n</think>\n\nThe code is falcon-4812.",  # the template opened <think>
        "Answer: falcon-4812 (stated in the fourth paragraph).",
        "falcon-4812 falcon-4812 falcon-4812",
    ],
)
@pytest.mark.fast
def test_needle_right(answer):
    assert score_needle(answer, "falcon-4812")


@pytest.mark.parametrize(
    "answer",
    [
        "",
        "4812",
        "falcon",
        "falcon-4813",
        "falcon-48120",
        "falcon-4812-b",
        "xfalcon-4812",
        "river-4812",
        "I could not find an access code for the amber archive.",
        "river-1234. Or perhaps falcon-4812.",  # another code first
        "<think>The code is falcon-4812.</think>\n\nriver-1234",  # right in the reasoning, wrong in the answer
        "<think>The code is falcon-4812, I think, but let me re-read the whole document",  # never answered
        "lambda lambda lambda lambda",
    ],
)
@pytest.mark.fast
def test_needle_wrong(answer):
    assert not score_needle(answer, "falcon-4812")


@pytest.mark.fast
def test_needle_expected_must_be_a_code():
    with pytest.raises(ValueError, match="WORD-DIGITS"):
        score_needle("falcon-4812", "falcon")


@pytest.mark.fast
def test_final_answer_strips_reasoning():
    assert final_answer("<think>a</think>b<think>c</think>d").split() == ["b", "d"]
    assert final_answer("reasoning</think>answer") == "answer"
    assert final_answer("no reasoning") == "no reasoning"


@pytest.mark.fast
def test_needle_accuracy():
    pairs = [
        ("falcon-4812", "falcon-4812"),
        ("river-1234", "river-1234"),
        ("lambda", "willow-1000"),
        ("", "a-1"),
    ]
    assert needle_accuracy(pairs) == 0.5
    assert math.isnan(needle_accuracy([]))


# ---------------------------------------------------------------- speculative vs autoregressive


@pytest.mark.fast
def test_answer_mismatch_rate_lists():
    ar = ["falcon-4812 The code is stated once.", "river-1234 It is in the middle.", "a b c d"]
    spec = ["falcon-4812  The code is stated once.\n", "river-1234 It is near the end.", "a b c d"]
    r = answer_mismatch_rate(spec, ar)
    assert r["n"] == 3
    assert r["mismatch_rate"] == pytest.approx(1 / 3) and r["exact_match_rate"] == pytest.approx(2 / 3)
    assert r["prefix_agreement"] == pytest.approx((1 + 3 / 6 + 1) / 3)


@pytest.mark.fast
def test_answer_mismatch_rate_mappings_and_errors():
    r = answer_mismatch_rate({"p1": "x y", "p2": "x", "p3": "z"}, {"p1": "x y", "p2": "y", "p9": "q"})
    assert r["n"] == 2 and r["mismatch_rate"] == 0.5 and r["prefix_agreement"] == 0.5
    assert answer_mismatch_rate(["", ""], ["", ""])["prefix_agreement"] == 1.0
    assert math.isnan(answer_mismatch_rate([], [])["mismatch_rate"])
    with pytest.raises(ValueError):
        answer_mismatch_rate(["a"], ["a", "b"])
    with pytest.raises(TypeError):
        answer_mismatch_rate({"a": "x"}, ["x"])
