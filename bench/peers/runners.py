"""Per-tool runners: the command that runs a fixed-concurrency streaming workload (fixed prompt and output
lengths), and the parser that turns the tool's own per-request output into `ClientReq`s.

Each peer runs from its own virtual environment under bench/.peers-venv/<tool> (see install.py), with its
documented CLI. Every runner gets the same Job: server URL, model name, tokenizer directory, concurrency,
number of requests, prompt and output tokens, and an empty output directory.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from measure import ClientReq

ROOT = Path(__file__).resolve().parents[2]
VENVS = ROOT / "bench" / ".peers-venv"


@dataclass
class Job:
    base_url: str
    model: str
    tokenizer: Path
    concurrency: int
    requests: int
    prompt_tokens: int
    output_tokens: int
    out: Path


class Runner:
    name = ""
    # whether the tool records per-chunk arrivals (else only TTFT accuracy can be scored)
    per_chunk = True

    def venv_bin(self, exe: str) -> Path:
        return VENVS / self.name / "bin" / exe

    def available(self) -> str | None:
        """None when runnable; else why not (shown in the results)."""
        return None

    def command(self, job: Job) -> list[str]:
        raise NotImplementedError

    def parse(self, job: Job, stdout: str) -> list[ClientReq]:
        raise NotImplementedError

    def version(self) -> str:
        import subprocess

        py = self.venv_bin("python")
        if not py.exists():
            return "not installed"
        pkg = {"genai-bench": "genai-bench"}.get(self.name, self.name)
        r = subprocess.run(
            [str(py), "-c", f"import importlib.metadata as m; print(m.version({pkg!r}))"],
            capture_output=True,
            text=True,
        )
        return r.stdout.strip() or "unknown"


class Servesweep(Runner):
    name = "servesweep"

    def command(self, job: Job) -> list[str]:
        exe = Path(sys.executable).parent / "servesweep"
        return [
            str(exe),
            "load",
            "--base-url",
            job.base_url,
            "--model",
            job.model,
            "--concurrency",
            str(job.concurrency),
            "--prompt-tokens",
            str(job.prompt_tokens),
            "--output-tokens",
            str(job.output_tokens),
            "--requests",
            str(job.requests),
            "--tokenizer",
            str(job.tokenizer),
            "--out",
            str(job.out),
            "--json",
        ]

    def parse(self, job: Job, stdout: str) -> list[ClientReq]:
        from servesweep.records import read_parquet

        doc = json.loads(stdout[stdout.index("{") :])
        pid = doc["points"][0]["point_id"]
        rows = read_parquet(Path(doc["run_dir"]) / pid / "records.parquet").to_pylist()
        out = []
        for r in rows:
            if r.get("error_class") or not r.get("chunk_ns"):
                continue
            sent = r["sent_ns"]
            out.append(
                ClientReq(
                    ttft_s=(r["first_token_ns"] - sent) / 1e9,
                    offsets_s=[(t - sent) / 1e9 for t in r["chunk_ns"]],
                    request_id=r["request_id"],
                    abs_chunk_ns=list(r["chunk_ns"]),
                )
            )
        return out

    def version(self) -> str:
        import importlib.metadata as m

        return m.version("servesweep")


def _cumsum(ttft: float, itls: list[float]) -> list[float]:
    out = [ttft]
    for g in itls:
        out.append(out[-1] + g)
    return out


class SglangBench(Runner):
    """`python -m sglang.benchmark.serving` (the `sglang` package's bench_serving), installed --no-deps."""

    name = "sglang"

    def command(self, job: Job) -> list[str]:
        return [
            str(self.venv_bin("python")),
            "-m",
            "sglang.benchmark.serving",
            "--backend",
            "sglang-oai-chat",
            "--base-url",
            job.base_url,
            "--model",
            job.model,
            "--tokenizer",
            str(job.tokenizer),
            "--dataset-name",
            "random",
            "--random-input-len",
            str(job.prompt_tokens),
            "--random-output-len",
            str(job.output_tokens),
            "--random-range-ratio",
            "1",
            "--num-prompts",
            str(job.requests),
            "--max-concurrency",
            str(job.concurrency),
            "--request-rate",
            "inf",
            "--output-file",
            str(job.out / "sglang.jsonl"),
            "--output-details",
            "--disable-tqdm",
        ]

    def parse(self, job: Job, stdout: str) -> list[ClientReq]:
        lines = (job.out / "sglang.jsonl").read_text().splitlines()
        d = json.loads(lines[-1])
        out = []
        for ttft, itls, err in zip(
            d["ttfts"], d["itls"], d.get("errors") or [""] * len(d["ttfts"]), strict=False
        ):
            if err or not ttft:
                continue
            out.append(ClientReq(ttft_s=ttft, offsets_s=_cumsum(ttft, itls)))
        return out


class VllmBench(Runner):
    """`vllm bench serve`, installed --no-deps (it needs torch and the vllm package to import)."""

    name = "vllm"

    def command(self, job: Job) -> list[str]:
        return [
            str(self.venv_bin("vllm")),
            "bench",
            "serve",
            "--backend",
            "openai-chat",
            "--base-url",
            job.base_url,
            "--endpoint",
            "/v1/chat/completions",
            "--model",
            job.model,
            "--tokenizer",
            str(job.tokenizer),
            "--dataset-name",
            "random",
            "--random-input-len",
            str(job.prompt_tokens),
            "--random-output-len",
            str(job.output_tokens),
            "--random-range-ratio",
            "0",
            "--ignore-eos",
            "--num-prompts",
            str(job.requests),
            "--max-concurrency",
            str(job.concurrency),
            "--save-result",
            "--save-detailed",
            "--result-dir",
            str(job.out),
            "--result-filename",
            "vllm.json",
            "--disable-tqdm",
        ]

    def parse(self, job: Job, stdout: str) -> list[ClientReq]:
        d = json.loads((job.out / "vllm.json").read_text())
        out = []
        errs = d.get("errors") or [""] * len(d["ttfts"])
        for ttft, itls, err in zip(d["ttfts"], d["itls"], errs, strict=False):
            if err or not ttft:
                continue
            out.append(ClientReq(ttft_s=ttft, offsets_s=_cumsum(ttft, itls)))
        return out


RUNNERS: dict[str, Runner] = {r.name: r for r in (Servesweep(), SglangBench(), VllmBench())}
