"""Three-way measurement check on the real SGLang server (issue 28): the same prompts measured by servesweep, by
SGLang's own ``bench_serving`` and by the server's own histograms.

    .venv/bin/python bench/bench_sglang_three_way.py [--concurrency 1,4] [--output-tokens 64] [--rounds 1]

What it does, per round and concurrency C (closed loop, C streams, the same N requests each way):

1. ``POST /flush_cache`` (retried while the server is busy): every client starts on an empty radix cache; each
   prompt differs from its first user token on (servesweep's nonce), so nothing but the chat template's few leading
   tokens can hit the cache inside a run (the server's ``cached_tokens_total`` increase is reported).
2. ``servesweep load --base-url URL --concurrency C --requests N --prompt-tokens P --output-tokens O --tokenizer
   MODEL`` while /metrics is polled every ``--poll`` s; the server's figures for this client are the increase from
   the last poll that ended before the first measured request was sent (``records.parquet`` ``sent_ns``, same
   host and monotonic clock) to a poll after the load ended, so servesweep's probes (template overhead, per-chunk
   usage) stay out of them.
3. ``POST /flush_cache``; ``python -m sglang.bench_serving --backend sglang-oai-chat --dataset-name custom
   --dataset-path FILE --num-prompts N --sharegpt-output-len O --max-concurrency C --request-rate inf
   --warmup-requests 0`` from SGLang's own venv, FILE being the same pool written by ``servesweep prompts --export
   sglang`` (same tokenizer, seed, length and template overhead as the load's pool; only the nonce digits
   differ). The server's figures: increase from a poll before it started to one after it ended (no warmup
   request, so nothing else reached the server); /metrics is polled during it too, so both clients run beside the
   same poller.

Server histograms: ``sglang:time_to_first_token_seconds``, ``sglang:inter_token_latency_seconds`` and
``sglang:e2e_request_latency_seconds`` summed over their label sets; quantiles by linear interpolation inside a
bucket (Prometheus ``histogram_quantile``), means exact (``_sum / _count``). The server is started with finer
buckets than its defaults (``--bucket-*``, each list a superset of SGLang's default bounds), so the table shows
both: the fine buckets, and the same counts folded back onto SGLang's default bounds (what a default server says).

The server: ``--base-url`` to use a running one (then the bucket columns are whatever it has), else this script
starts SGLang on the CPU itself (``SGLANG_USE_CPU_ENGINE=1 python -m sglang.launch_server --device cpu
--attention-backend torch_native ...``) with the tiny offline model (``--model-path``, else built here) and stops
it (SIGTERM to its process group, SIGKILL after 30 s) whatever happens. Writes ``OUT/three_way.json`` (every
figure) and ``OUT/three_way.md`` (the tables) and prints them; ``--report OUT/three_way.json`` prints them again.

bench_serving (sglang 0.5.23) imports Hugging Face ``datasets`` at start-up for its MMMU loader only; the CPU tier's
venv has none, so a one-function stand-in module goes first on bench_serving's PYTHONPATH (``--dataset-name custom``
never calls it). Figures and their explanations: BENCHMARKS.md, "Three-way check on real SGLang".
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVESWEEP = ROOT / ".venv" / "bin" / "servesweep"
# SGLang's venv: $SERVESWEEP_CACHE_DIR/sglang-cpu/venv (servesweep.sglang.cpu.env; the Makefile's cache dir,
# ROOT/.cache, when the variable is unset)
SGLANG_VENV = (
    Path(os.environ.get("SERVESWEEP_CACHE_DIR") or ROOT / ".cache").expanduser() / "sglang-cpu" / "venv"
)
STAND_IN = ROOT / "src" / "servesweep" / "sglang" / "cpu" / "stand_in"

# SGLang 0.5.23's default bounds (srt/observability/metrics_collector.py, TokenizerMetricsCollector).
DEFAULT_TTFT = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
DEFAULT_E2E = DEFAULT_TTFT + [600, 1200, 1800, 2400]
DEFAULT_ITL = [
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
]


def _fine(step: float, upto: float, defaults: list[float]) -> list[float]:
    """Bounds every `step` up to `upto`, plus SGLang's defaults (so the counts fold back onto the defaults)."""
    n = int(round(upto / step))
    return sorted({round(step * i, 6) for i in range(1, n + 1)} | set(defaults))


FINE_TTFT = _fine(0.005, 0.4, DEFAULT_TTFT)  # 5 ms to 400 ms
FINE_ITL = _fine(0.0005, 0.04, DEFAULT_ITL)  # 0.5 ms to 40 ms
FINE_E2E = _fine(0.025, 4.0, DEFAULT_E2E)  # 25 ms to 4 s

HISTS = {
    "ttft": "sglang:time_to_first_token_seconds",
    "itl": "sglang:inter_token_latency_seconds",
    "e2e": "sglang:e2e_request_latency_seconds",
}
COUNTERS = {
    "requests": "sglang:num_requests_total",
    "prompt_tokens": "sglang:prompt_tokens_total",
    "generation_tokens": "sglang:generation_tokens_total",
    "cached_tokens": "sglang:cached_tokens_total",
}
GAUGES = {"gen_throughput": "sglang:gen_throughput", "running": "sglang:num_running_reqs"}
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LE = re.compile(r'le="([^"]+)"')


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# /metrics


def parse_metrics(text: str) -> dict:
    """The families this check reads, summed over label sets: {"hist": {name: {le: count}, name_sum, name_count},
    "counter": {name: value}, "gauge": {name: value}}."""
    out: dict = {
        "hist": {k: {} for k in HISTS},
        "sum": dict.fromkeys(HISTS, 0.0),
        "count": dict.fromkeys(HISTS, 0.0),
        "counter": dict.fromkeys(COUNTERS, 0.0),
        "gauge": dict.fromkeys(GAUGES, 0.0),
    }
    hist_by_name = {v: k for k, v in HISTS.items()}
    ctr_by_name = {v: k for k, v in COUNTERS.items()}
    gauge_by_name = {v: k for k, v in GAUGES.items()}
    for line in text.splitlines():
        if not line.startswith("sglang:"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        for suffix, slot in (("_bucket", "hist"), ("_sum", "sum"), ("_count", "count")):
            if name.endswith(suffix) and name[: -len(suffix)] in hist_by_name:
                key = hist_by_name[name[: -len(suffix)]]
                if slot == "hist":
                    le = _LE.search(labels)
                    bound = math.inf if le.group(1) == "+Inf" else float(le.group(1))
                    out["hist"][key][bound] = out["hist"][key].get(bound, 0.0) + value
                else:
                    out[slot][key] += value
                break
        else:
            if name in ctr_by_name:
                out["counter"][ctr_by_name[name]] += value
            elif name in gauge_by_name:
                out["gauge"][gauge_by_name[name]] += value
    return out


def delta(after: dict, before: dict) -> dict:
    d: dict = {"hist": {}, "sum": {}, "count": {}, "counter": {}}
    for k in HISTS:
        d["hist"][k] = {
            b: after["hist"][k].get(b, 0.0) - before["hist"][k].get(b, 0.0) for b in after["hist"][k]
        }
        d["sum"][k] = after["sum"][k] - before["sum"][k]
        d["count"][k] = after["count"][k] - before["count"][k]
    for k in COUNTERS:
        d["counter"][k] = after["counter"][k] - before["counter"][k]
    return d


def fold(cum: dict[float, float], bounds: list[float]) -> dict[float, float]:
    """Cumulative counts on `bounds` (a subset of the histogram's own bounds) and +Inf."""
    out = {}
    for b in [*bounds, math.inf]:
        if b not in cum:
            raise ValueError(f"bound {b} not among the server's buckets")
        out[b] = cum[b]
    return out


def hist_quantile(q: float, cum: dict[float, float]) -> float | None:
    """Prometheus histogram_quantile: linear interpolation inside the bucket holding rank q x count (lower bound
    0 for the first bucket; the highest finite bound when the rank falls in +Inf)."""
    bounds = sorted(cum)
    total = cum[math.inf]
    if total <= 0:
        return None
    rank = q * total
    prev_b, prev_c = 0.0, 0.0
    for b in bounds:
        c = cum[b]
        if c >= rank:
            if math.isinf(b):
                return prev_b
            if c == prev_c:
                return b
            return prev_b + (b - prev_b) * (rank - prev_c) / (c - prev_c)
        prev_b, prev_c = b, c
    return prev_b


class Poller:
    """GET /metrics every `interval` s in a thread; each sample: (start ns, end ns, parsed) on CLOCK_MONOTONIC."""

    def __init__(self, base_url: str, interval: float) -> None:
        self.url = base_url + "/metrics"
        self.interval = interval
        self.samples: list[tuple[int, int, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> tuple[int, int, dict]:
        t0 = time.monotonic_ns()
        with urllib.request.urlopen(self.url, timeout=10) as r:
            text = r.read().decode()
        s = (t0, time.monotonic_ns(), parse_metrics(text))
        self.samples.append(s)
        return s

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(15)


# ---------------------------------------------------------------------------------------------------------------
# server


def http_json(url: str, method: str = "GET", timeout: float = 10) -> tuple[int, str]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def flush_cache(base_url: str) -> None:
    """POST /flush_cache until it answers 200 (SGLang answers 400 while requests are still running)."""
    for _ in range(40):
        status, body = http_json(base_url + "/flush_cache", "POST")
        if status == 200:
            return
        time.sleep(0.5)
    raise RuntimeError(f"/flush_cache never answered 200 (last: {status} {body[:200]})")


BUILD_MODEL = r"""
import json, random, sys
from pathlib import Path
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
import torch
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
rng = random.Random(0)
words = ["the", "model", "server", "token", "cache", "batch", "prefill", "decode", "stream", "latency", "queue",
         "request", "prompt", "answer", "kernel", "memory", "python", "metric", "bucket", "client", "window",
         "sample", "value", "record", "engine", "number", "alpha", "beta", "gamma", "delta", "seven", "eleven"]
text = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 20))) + rng.choice([".", "!", "?", ","])
        + " " + str(rng.randint(0, 99999)) for _ in range(4000)]
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=430, special_tokens=specials,
                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tmpl = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                               pad_token="<|endoftext|>", unk_token=None)
fast.chat_template = tmpl
fast.save_pretrained(out)
cfg = Qwen2Config(vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                  tie_word_embeddings=True, eos_token_id=fast.eos_token_id, bos_token_id=None,
                  pad_token_id=fast.pad_token_id, torch_dtype="bfloat16")
torch.manual_seed(0)
Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
print(len(fast))
"""

STAND_IN_INIT = '''"""Pure-torch stand-in for the CPU build of sgl_kernel (bench fallback; see servesweep.sglang.cpu)."""
import torch


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len=None):
    pt = 0
    for i in range(req_pool_indices.shape[0]):
        s, e = int(start_offset[i]), int(end_offset[i])
        n = e - s
        req_to_token[int(req_pool_indices[i]), s:e] = out_cache_loc[pt:pt + n]
        pt += n


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*a, **k):
        raise NotImplementedError(f"sgl_kernel stand-in: {name} is not implemented")

    return missing
'''


def sglang_python() -> Path:
    py = SGLANG_VENV / "bin" / "python"
    if not py.exists():
        raise SystemExit(f"{py}: SGLang's venv is missing (servesweep sglang-cpu install)")
    return py


BUILDER = ROOT / "src" / "servesweep" / "sglang" / "cpu" / "build_model.py"


def build_model(path: Path) -> None:
    """servesweep's tiny-model builder (servesweep.sglang.cpu) when present, else the fallback above."""
    log(f"building the tiny offline model in {path}")
    code = [str(BUILDER)] if BUILDER.exists() else ["-c", BUILD_MODEL]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run([str(sglang_python()), *code, str(path)], check=True, timeout=300, env=env)


def stand_in_dir(work: Path) -> Path:
    """servesweep's sgl_kernel stand-in when present (A1's package), else a copy of the fallback above."""
    if (STAND_IN / "sgl_kernel" / "__init__.py").exists():
        return STAND_IN
    d = work / "stand_in"
    (d / "sgl_kernel").mkdir(parents=True, exist_ok=True)
    (d / "sgl_kernel" / "__init__.py").write_text(STAND_IN_INIT)
    return d


def server_argv(model: Path, port: int, extra: list[str]) -> list[str]:
    return [
        str(sglang_python()),
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model),
        "--device",
        "cpu",
        "--attention-backend",
        "torch_native",
        "--cuda-graph-backend-decode",
        "disabled",
        "--cuda-graph-backend-prefill",
        "disabled",
        "--mem-fraction-static",
        "0.1",
        "--max-total-tokens",
        "16384",
        "--context-length",
        "4096",
        "--enable-metrics",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--bucket-time-to-first-token",
        *map(str, FINE_TTFT),
        "--bucket-inter-token-latency",
        *map(str, FINE_ITL),
        "--bucket-e2e-request-latency",
        *map(str, FINE_E2E),
        *extra,
    ]


@contextlib.contextmanager
def sglang_server(model: Path, port: int, work: Path, extra: list[str]):
    argv = server_argv(model, port, extra)
    env = {
        **os.environ,
        "SGLANG_USE_CPU_ENGINE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(stand_in_dir(work)), os.environ.get("PYTHONPATH", "")]),
    }
    logf = open(work / "server.log", "wb")  # noqa: SIM115 (closed below)
    log(f"starting SGLang: {' '.join(argv[:24])} ... (log {work / 'server.log'})")
    proc = subprocess.Popen(argv, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"SGLang exited with {proc.returncode}; see {work / 'server.log'}")
            with contextlib.suppress(OSError):
                if http_json(base + "/health", timeout=5)[0] == 200:
                    break
            if time.monotonic() - t0 > 240:
                raise RuntimeError("SGLang not healthy after 240 s")
            time.sleep(1)
        log(f"SGLang ready in {time.monotonic() - t0:.1f} s (pid {proc.pid})")
        yield base, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        # children left in the group (scheduler, detokenizer) after the launcher exits
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        logf.close()
        log("SGLang stopped")


# ---------------------------------------------------------------------------------------------------------------
# clients


def pct(values: list[float], q: float) -> float | None:
    """numpy's default (linear) percentile, as servesweep and bench_serving compute theirs."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def run_servesweep(base: str, c: int, n: int, a: argparse.Namespace, out: Path, poller: Poller) -> dict:
    cmd = [
        str(SERVESWEEP),
        "load",
        "--base-url",
        base,
        "--concurrency",
        str(c),
        "--requests",
        str(n),
        "--prompt-tokens",
        str(a.prompt_tokens),
        "--output-tokens",
        str(a.output_tokens),
        "--tokenizer",
        str(a.model_path),
        "--seed",
        str(a.seed),
        "--out",
        str(out),
        "--json",
        # bench_serving sends temperature 0 (greedy): the same sampling for both clients
        "--extra-body",
        '{"temperature": 0}',
    ]
    log("servesweep: " + " ".join(cmd))
    t = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    wall = time.monotonic() - t
    if r.returncode not in (0, 1):
        raise RuntimeError(f"servesweep load exited {r.returncode}: {r.stderr[-2000:]}")
    doc = json.loads(r.stdout)
    s = doc["points"][0]
    import pyarrow.parquet as pq

    tab = pq.read_table(Path(doc["run_dir"]) / s["point_id"] / "records.parquet").to_pylist()
    ok = [x for x in tab if not x["warmup"] and x["error_class"] is None]
    first_sent = min(x["sent_ns"] for x in tab if not x["warmup"])
    chunks = [len(x["chunk_ns"] or []) for x in ok]
    toks = [t for x in ok for t in (x["chunk_tokens"] or [])]
    firsts = [x["chunk_tokens"][0] for x in ok if x["chunk_tokens"]]
    return {
        "cmd": cmd,
        "wall_s": wall,
        "first_sent_ns": first_sent,
        "summary": s,
        "ok": len(ok),
        "chunks_per_request_mean": statistics.mean(chunks) if chunks else None,
        # tokens per token-bearing chunk (per-chunk usage): > 1 where the server held text back
        "chunk_tokens_hist": {str(k): toks.count(k) for k in sorted(set(toks))},
        "first_chunk_tokens_gt1_share": sum(1 for t in firsts if t > 1) / len(firsts) if firsts else None,
        "completion_tokens_mean": statistics.mean(x["completion_tokens"] for x in ok) if ok else None,
        "prompt_tokens_mean": statistics.mean(x["prompt_tokens"] for x in ok) if ok else None,
        "template_overhead": s["point"]["template_overhead"],
        "model": s["point"]["model"],
        "continuous_usage": s["point"]["continuous_usage"],
    }


def export_prompts(n: int, overhead: int, a: argparse.Namespace, path: Path) -> list[str]:
    cmd = [
        str(SERVESWEEP),
        "prompts",
        "--prompt-tokens",
        str(a.prompt_tokens),
        "-n",
        str(n),
        "--tokenizer",
        str(a.model_path),
        "--seed",
        str(a.seed),
        "--template-overhead",
        str(overhead),
        "--export",
        "sglang",
        "--out",
        str(path),
    ]
    log("export: " + " ".join(cmd))
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return cmd


# SGLang's bench_serving imports `datasets` (Hugging Face) at start-up for its MMMU loader only
# (sglang/benchmark/datasets/mmmu.py); the CPU tier's venv does not install it, and the custom dataset never calls
# it. A module of that name whose one function refuses is put first on bench_serving's PYTHONPATH.
DATASETS_STUB = '''"""Stand-in for Hugging Face `datasets` (bench/bench_sglang_three_way.py): bench_serving imports it, never
calls it for --dataset-name custom."""


def load_dataset(*args, **kwargs):
    raise RuntimeError("datasets stand-in: load_dataset is not available (install datasets for hub datasets)")
'''


def bench_env(out: Path) -> dict[str, str]:
    d = out / "bench_stub"
    (d / "datasets").mkdir(parents=True, exist_ok=True)
    (d / "datasets" / "__init__.py").write_text(DATASETS_STUB)
    return {**os.environ, "PYTHONPATH": str(d), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def run_bench_serving(
    base: str,
    model: str,
    c: int,
    n: int,
    dataset: Path,
    a: argparse.Namespace,
    out: Path,
    extra_body: str = "",
) -> dict:
    res = out / f"bench_c{c}.jsonl"
    res.unlink(missing_ok=True)
    cmd = [
        str(sglang_python()),
        "-m",
        "sglang.bench_serving",
        "--backend",
        "sglang-oai-chat",
        "--base-url",
        base,
        "--model",
        model,
        "--tokenizer",
        str(a.model_path),
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(dataset),
        "--num-prompts",
        str(n),
        "--sharegpt-output-len",
        str(a.output_tokens),
        "--max-concurrency",
        str(c),
        "--request-rate",
        "inf",
        "--warmup-requests",
        "0",
        "--seed",
        str(a.seed),
        "--output-file",
        str(res),
        "--output-details",
        "--disable-tqdm",
        *(["--extra-request-body", extra_body] if extra_body else []),
    ]
    log("bench_serving: " + " ".join(cmd))
    t = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=bench_env(out))
    wall = time.monotonic() - t
    (out / f"bench_c{c}.log").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"bench_serving exited {r.returncode}: {(r.stdout + r.stderr)[-3000:]}")
    d = json.loads(res.read_text().splitlines()[-1])
    itls = [v * 1000 for req in d.get("itls", []) for v in req]
    ttfts = [v * 1000 for v in d.get("ttfts", [])]
    return {
        "cmd": cmd,
        "wall_s": wall,
        "result": {
            k: v
            for k, v in d.items()
            if k
            not in ("itls", "ttfts", "generated_texts", "errors", "input_lens", "output_lens", "server_info")
        },
        "itl_ms_from_details": {"p50": pct(itls, 0.5), "p99": pct(itls, 0.99), "n": len(itls)},
        "ttft_ms_from_details": {"p50": pct(ttfts, 0.5), "p99": pct(ttfts, 0.99), "n": len(ttfts)},
        "chunks_per_request_mean": (len(itls) / len(ttfts) + 1) if ttfts else None,
        "input_lens_mean": statistics.mean(d["input_lens"]) if d.get("input_lens") else None,
        "output_lens_mean": statistics.mean(d["output_lens"]) if d.get("output_lens") else None,
        "server_info_version": (d.get("server_info") or {}).get("version"),
    }


def server_view(before: tuple, after: tuple, during: list[tuple], fine: bool, conc: int) -> dict:
    d = delta(after[2], before[2])
    v: dict = {"window_polls_s": (after[0] - before[1]) / 1e9}
    for k, default in (("ttft", DEFAULT_TTFT), ("itl", DEFAULT_ITL), ("e2e", DEFAULT_E2E)):
        cum = d["hist"][k]
        n = d["count"][k]
        row = {"n": n, "mean_ms": 1000 * d["sum"][k] / n if n else None}
        for q in (0.5, 0.9, 0.99):
            x = hist_quantile(q, cum)
            row[f"p{int(q * 100)}_ms"] = None if x is None else 1000 * x
        if fine:
            dflt = fold(cum, default)
            for q in (0.5, 0.99):
                x = hist_quantile(q, dflt)
                row[f"p{int(q * 100)}_default_buckets_ms"] = None if x is None else 1000 * x
        v[k] = row
    c = d["counter"]
    v.update({k: c[k] for k in COUNTERS})
    v["prompt_tokens_per_request"] = c["prompt_tokens"] / c["requests"] if c["requests"] else None
    v["generation_tokens_per_request"] = c["generation_tokens"] / c["requests"] if c["requests"] else None
    e2e_sum = d["sum"]["e2e"]
    v["output_tok_s_busy"] = c["generation_tokens"] / (e2e_sum / conc) if e2e_sum > 0 else None
    gt = [s[2]["gauge"]["gen_throughput"] for s in during if before[1] <= s[0] and s[1] <= after[0]]
    gt = [x for x in gt if x > 0]
    v["gen_throughput_gauge_mean"] = statistics.mean(gt) if gt else None
    v["gen_throughput_gauge_samples"] = len(gt)
    return v


def servesweep_step(base: str, c: int, n: int, a, out: Path, fine: bool, ctx: dict, res: dict) -> None:
    """Flush, servesweep load under the poller; the server's view from the last poll before its first send."""
    flush_cache(base)
    with Poller(base, a.poll) as pol:
        ss = run_servesweep(base, c, n, a, out / "servesweep", pol)
        time.sleep(2 * a.poll)
    after = pol.sample()
    pre = [s for s in pol.samples if s[1] < ss["first_sent_ns"]]
    if not pre:
        raise RuntimeError("no /metrics poll ended before servesweep's first request")
    res["ss"], res["sv_ss"] = ss, server_view(pre[-1], after, pol.samples, fine, c)
    ctx.setdefault("overhead", ss["template_overhead"])
    ctx.setdefault("model", ss["model"])


def bench_step(base: str, c: int, n: int, a, out: Path, fine: bool, ctx: dict, res: dict) -> None:
    """Export the pool (once per size), flush, bench_serving under the poller; the server's view from a poll
    before it started."""
    if "overhead" not in ctx:
        raise RuntimeError("bench_serving cannot run before servesweep has probed the template overhead")
    if n not in ctx["exported"]:
        ctx["exported"][n] = out / f"prompts_n{n}.jsonl"
        ctx["export_cmds"][n] = export_prompts(n, ctx["overhead"], a, ctx["exported"][n])
    flush_cache(base)
    with Poller(base, a.poll) as pol:
        before = pol.sample()
        bs = run_bench_serving(base, ctx["model"], c, n, ctx["exported"][n], a, out)
        time.sleep(2 * a.poll)
    after = pol.sample()
    res["bs"], res["sv_bs"] = bs, server_view(before, after, pol.samples, fine, c)


# ---------------------------------------------------------------------------------------------------------------
# table


def _f(x, nd=1) -> str:
    return "—" if x is None else f"{x:,.{nd}f}"


COLUMNS = (
    "round",
    "C",
    "measured by",
    "TTFT p50",
    "TTFT p99",
    "TTFT mean",
    "ITL p50 per chunk",
    "ITL p50 per token",
    "ITL mean per token",
    "E2E p50",
    "E2E mean",
    "output tok/s",
    "prompt tok/req",
    "chunks/req",
)


def table(rows: list[dict]) -> str:
    """The agreement table (ms unless noted); server rows: fine buckets, [SGLang's default buckets]."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]

    def add(*cells) -> None:
        lines.append("| " + " | ".join(cells) + " |")

    for r in rows:
        rnd, c, ss, bs = str(r["round"]), str(r["c"]), r["servesweep"], r["bench"]
        sm = ss["summary"]
        add(
            rnd,
            c,
            "servesweep",
            _f(sm["ttft_ms"]["p50"]),
            _f(sm["ttft_ms"]["p99"]),
            _f(sm["ttft_ms"]["mean"]),
            _f(sm["itl_ms"]["p50"], 2),
            _f(sm["itl_per_token_ms"]["p50"], 2),
            _f(sm["itl_per_token_ms"]["mean"], 2),
            _f(sm["e2e_ms"]["p50"]),
            _f(sm["e2e_ms"]["mean"]),
            _f(sm["output_tokens_per_s"]),
            _f(ss["prompt_tokens_mean"]) + " (usage)",
            _f(ss["chunks_per_request_mean"]),
        )
        for label, sv in (
            ("server, during servesweep", r["server_ss"]),
            ("server, during bench_serving", r["server_bench"]),
        ):
            t, i, e = sv["ttft"], sv["itl"], sv["e2e"]

            def both(row, key, nd=1):
                x = _f(row[f"{key}_ms"], nd)
                return x + (
                    f" [{_f(row[f'{key}_default_buckets_ms'], nd)}]"
                    if f"{key}_default_buckets_ms" in row
                    else ""
                )

            add(
                rnd,
                c,
                label,
                both(t, "p50"),
                both(t, "p99"),
                _f(t["mean_ms"]),
                "—",
                both(i, "p50", 2),
                _f(i["mean_ms"], 2),
                both(e, "p50"),
                _f(e["mean_ms"]),
                _f(sv["output_tok_s_busy"]) + " (Σtok/(Σe2e/C))",
                _f(sv["prompt_tokens_per_request"]),
                "—",
            )
        b = bs["result"]
        add(
            rnd,
            c,
            "bench_serving",
            _f(b["median_ttft_ms"]),
            _f(b["p99_ttft_ms"]),
            _f(b["mean_ttft_ms"]),
            _f(b["median_itl_ms"], 2),
            "—",
            "—",
            _f(b["median_e2e_latency_ms"]),
            _f(b["mean_e2e_latency_ms"]),
            _f(b["output_throughput"]),
            _f(b["total_input_tokens"] / b["completed"]) + " (its own count)",
            _f(bs["chunks_per_request_mean"]),
        )
    return "\n".join(lines) + "\n"


def offsets(rows: list[dict]) -> str:
    """Within one client run, client against server on the same requests: mean differences (client − server, ms),
    per-token ITL means (client / server), and what shapes the per-chunk figures."""
    lines = [
        "| round | C | client | TTFT mean: client − server | E2E mean: client − server | "
        "ITL mean per token: client / server | tokens per chunk | zero ITL gaps | first chunk > 1 token |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ss, sm, sv = r["servesweep"], r["servesweep"]["summary"], r["server_ss"]
        tpc = (ss["completion_tokens_mean"] or 0) / ss["chunks_per_request_mean"]
        lines.append(
            f"| {r['round']} | {r['c']} | servesweep | {_f(sm['ttft_ms']['mean'] - sv['ttft']['mean_ms'])} | "
            f"{_f(sm['e2e_ms']['mean'] - sv['e2e']['mean_ms'])} | "
            f"{_f(sm['itl_per_token_ms']['mean'] / sv['itl']['mean_ms'], 3)} | {_f(tpc, 3)} | "
            f"{_f(100 * (sm.get('itl_zero_gap_share') or 0))} % | "
            f"{_f(100 * (ss['first_chunk_tokens_gt1_share'] or 0))} % |"
        )
        bs, b, sv = r["bench"], r["bench"]["result"], r["server_bench"]
        n_itl = bs["itl_ms_from_details"]["n"]
        per_token = b["mean_itl_ms"] * n_itl / (sv["generation_tokens"] - sv["requests"]) if n_itl else None
        lines.append(
            f"| {r['round']} | {r['c']} | bench_serving | {_f(b['mean_ttft_ms'] - sv['ttft']['mean_ms'])} | "
            f"{_f(b['mean_e2e_latency_ms'] - sv['e2e']['mean_ms'])} | "
            f"{_f(per_token / sv['itl']['mean_ms'] if per_token else None, 3)} | "
            f"{_f(b['total_output_tokens'] / b['completed'] / bs['chunks_per_request_mean'], 3)} | — | — |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", help="a running SGLang server (else one is started here)")
    p.add_argument("--model-path", type=Path, help="the model directory (else the tiny model is built here)")
    p.add_argument("--port", type=int, default=31877)
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--requests", type=int, default=0, help="requests per client run (0: max(48, 24 x C))")
    p.add_argument("--prompt-tokens", type=int, default=1000)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--poll", type=float, default=0.25, help="seconds between /metrics polls")
    p.add_argument("--server-args", default="", help="more launch_server flags (a started server only)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument(
        "--report", type=Path, help="print the tables of a three_way.json / .partial.json, run nothing"
    )
    a = p.parse_args(argv)
    if a.report:
        doc = json.loads(a.report.read_text())
        rows = doc["rows"] if isinstance(doc, dict) else doc
        print(table(rows) + "\n" + offsets(rows))
        return 0
    # SIGTERM (timeout, kill) unwinds like Ctrl-C, so the server started here is always stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = a.out or Path(tempfile.mkdtemp(prefix="three-way-"))
    out.mkdir(parents=True, exist_ok=True)
    if a.model_path is None:
        if a.base_url:
            raise SystemExit("--model-path: the model directory of the running server (its tokenizer)")
        a.model_path = out / "tiny-model"
        if not (a.model_path / "config.json").exists():
            build_model(a.model_path)
    levels = [int(x) for x in a.concurrency.split(",")]
    started = dt.datetime.now(dt.UTC)
    with contextlib.ExitStack() as stack:
        if a.base_url:
            base, fine = a.base_url.rstrip("/"), False
        else:
            base, _ = stack.enter_context(sglang_server(a.model_path, a.port, out, a.server_args.split()))
            fine = True
        info = json.loads(http_json(base + "/get_server_info")[1])
        rows = []
        ctx: dict = {"exported": {}, "export_cmds": {}}
        for rnd in range(a.rounds):
            for c in levels:
                n = a.requests or max(48, 24 * c)
                log(f"round {rnd + 1}, concurrency {c}, {n} requests")
                res: dict = {}
                # odd rounds: servesweep first; even rounds: bench_serving first (the first round needs the
                # servesweep run's probed template overhead for the export)
                order = ["servesweep", "bench_serving"]
                if rnd % 2 == 1:
                    order.reverse()
                for who in order:
                    step = servesweep_step if who == "servesweep" else bench_step
                    step(base, c, n, a, out, fine, ctx, res)
                ss, sv_ss, bs, sv_bs = res["ss"], res["sv_ss"], res["bs"], res["sv_bs"]
                rows.append(
                    {
                        "round": rnd + 1,
                        "order": order,
                        "c": c,
                        "n": n,
                        "servesweep": ss,
                        "bench": bs,
                        "server_ss": sv_ss,
                        "server_bench": sv_bs,
                    }
                )
                (out / "three_way.partial.json").write_text(json.dumps(rows, indent=2, default=str))
                (out / "three_way.md").write_text(table(rows) + "\n" + offsets(rows))
                for who, sv in (("servesweep", sv_ss), ("bench_serving", sv_bs)):
                    if sv["requests"] != n:
                        log(f"WARNING: the server counted {sv['requests']} requests in {who}'s run, not {n}")
    versions = {
        "sglang_server": info.get("version"),
        "servesweep_commit": subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "python_servesweep": sys.version.split()[0],
    }
    with contextlib.suppress(Exception):
        versions["sglang_venv"] = subprocess.run(
            [
                str(sglang_python()),
                "-c",
                "import sglang, torch, transformers, aiohttp; print(sglang.__version__, "
                "torch.__version__, transformers.__version__, aiohttp.__version__)",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout.strip()
    doc = {
        "started_utc": started.isoformat(timespec="seconds"),
        "argv": sys.argv,
        "versions": versions,
        "server_args": {
            k: info.get(k)
            for k in (
                "max_running_requests",
                "chunked_prefill_size",
                "max_total_tokens",
                "attention_backend",
                "stream_interval",
                "schedule_policy",
                "device",
            )
        },
        "fine_buckets": fine,
        "export_cmds": ctx["export_cmds"],
        "load_average_end": os.getloadavg(),
        "rows": rows,
    }
    (out / "three_way.json").write_text(json.dumps(doc, indent=2, default=str))
    md = table(rows) + "\n" + offsets(rows)
    (out / "three_way.md").write_text(md)
    print(md)
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
