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
    # whether the tool records every chunk's arrival (else only the first and last: "last chunk only")
    per_chunk = True
    # how its requests pair with ground truth: "pattern" always; "id" (X-Request-Id) or "response_id" if kept
    pair_by: tuple[str, ...] = ("pattern",)
    # no hub on this machine: fail fast instead of retrying the network
    env: dict[str, str] = {"HF_HUB_OFFLINE": "1"}  # noqa: RUF012 - read-only class default
    # where the tool's chunk arrival stamps come from (servesweep's records say it per request)
    clock = "user"

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
    pair_by = ("id", "pattern")
    clock = "per request: records' rx_clock"

    def load_args(self, job: Job) -> list[str]:
        """How many requests (or how long) the point runs: a request budget in one Locust process."""
        return ["--requests", str(job.requests)]

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
            *self.load_args(job),
            "--tokenizer",
            str(job.tokenizer),
            "--out",
            str(job.out),
            "--json",
        ]

    def parse(self, job: Job, stdout: str) -> list[ClientReq]:
        from servesweep.results.records import read_parquet

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
                    # kernel receive stamps (rxstamp) or user-space ones; records before rxstamp lack the columns
                    clock=r.get("rx_clock") or "user",
                    read_lag_ns=r.get("read_lag_ns"),
                    worker=r.get("worker"),
                )
            )
        return out

    def version(self) -> str:
        import importlib.metadata as m

        return m.version("servesweep")


class ServesweepIdle(Servesweep):
    """EXPERIMENT: servesweep with the proposed hot-path change (parse a finished stream only when the loop is
    idle), applied by bench/peers/servesweep_idle.py without editing src/. Not run unless asked for."""

    name = "servesweep-idle"

    def command(self, job: Job) -> list[str]:
        cmd = super().command(job)
        return [sys.executable, str(Path(__file__).with_name("servesweep_idle.py")), *cmd[1:]]


class ServesweepAt(Servesweep):
    """EXPERIMENT: servesweep from another commit (`run_all.py --baseline COMMIT`), its sources extracted beside the
    run and first on PYTHONPATH: what a change costs or gains, measured in the same run. Not run unless asked for."""

    name = "servesweep-base"

    def __init__(self) -> None:
        self.src: Path | None = None  # <extracted>/src, set by run_all
        self.commit = ""

    def available(self) -> str | None:
        return None if self.src else "needs --baseline COMMIT"

    def command(self, job: Job) -> list[str]:
        import os

        self.env = {
            **Runner.env,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(self.src), os.environ.get("PYTHONPATH")])),
        }
        cmd = super().command(job)
        return [sys.executable, "-m", "servesweep.cli", *cmd[1:]]

    def version(self) -> str:
        return f"commit {self.commit}" if self.commit else "not set"


class ServesweepWorkers(Servesweep):
    """servesweep with N Locust worker processes (`--workers N`, a timed point: Locust --processes) for figure 6."""

    def __init__(self, workers: int, duration_s: float = 12.0):
        self.workers = workers
        self.duration_s = duration_s
        self.name = f"servesweep-w{workers}"

    def load_args(self, job: Job) -> list[str]:
        return ["--workers", str(self.workers), "--duration", f"{self.duration_s:g}s"]

    def command(self, job: Job) -> list[str]:
        # Locust's master binds a fixed port (5557) for its local workers unless told otherwise, and servesweep
        # does not choose one: two multi-process runs on one host collide ("Address already in use"). Locust reads
        # its options from LOCUST_* variables, so this run gets a free port for master and workers alike.
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        self.env = {
            **Runner.env,
            "LOCUST_MASTER_BIND_PORT": port,
            "LOCUST_MASTER_NODE_PORT": port,
            "LOCUST_MASTER_BIND_HOST": "127.0.0.1",
        }
        return super().command(job)


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
            "random-ids",
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


class Guidellm(Runner):
    """`guidellm run` (0.8 CLI): concurrent profile, synthetic text, max_requests constraint, JSON output."""

    name = "guidellm"
    per_chunk = False  # keeps first and last token iteration times only
    pair_by = ("response_id", "pattern")

    def command(self, job: Job) -> list[str]:
        return [
            str(self.venv_bin("guidellm")),
            "run",
            "--backend",
            f"kind=openai_http,target={job.base_url},model={job.model}",
            "--profile",
            f"kind=concurrent,streams={job.concurrency}",
            "--constraint",
            f"kind=max_requests,count={job.requests}",
            "--data",
            f"kind=synthetic_text,prompt_tokens={job.prompt_tokens},output_tokens={job.output_tokens}",
            "--tokenizer",
            f"kind=hf_auto,model={job.tokenizer}",
            "--output",
            f"kind=json,path={job.out / 'guidellm.json'}",
            "--disable-console-interactive",
        ]

    def parse(self, job: Job, stdout: str) -> list[ClientReq]:
        d = json.loads((job.out / "guidellm.json").read_text())
        out = []
        for b in d["benchmarks"]:
            for r in b["requests"]["successful"]:
                t = r["info"]["timings"]
                first, last, start = (
                    t.get("first_token_iteration"),
                    t.get("last_token_iteration"),
                    t["request_start"],
                )
                if first is None or last is None:
                    continue
                out.append(
                    ClientReq(ttft_s=first - start, span_s=last - first, response_id=r.get("response_id"))
                )
        return out


class Aiperf(Runner):
    """`aiperf profile`: streaming chat, --concurrency, --request-count, synthetic ISL/OSL with zero stddev."""

    name = "aiperf"
    pair_by = ("id", "pattern")  # it sends X-Request-ID and exports it per request
    env = {}  # noqa: RUF012 - its tokenizer loader rejects a local path under HF_HUB_OFFLINE

    def command(self, job: Job) -> list[str]:
        return [
            str(self.venv_bin("aiperf")),
            "profile",
            "--model",
            job.model,
            "--url",
            job.base_url,
            "--endpoint-type",
            "chat",
            "--streaming",
            "--concurrency",
            str(job.concurrency),
            "--request-count",
            str(job.requests),
            "--isl",
            str(job.prompt_tokens),
            "--isl-stddev",
            "0",
            "--osl",
            str(job.output_tokens),
            "--extra-inputs",
            "ignore_eos:true",
            "--tokenizer",
            str(job.tokenizer),
            "--artifact-dir",
            str(job.out / "aiperf"),
        ]

    def parse(self, job: Job, stdout: str) -> list[ClientReq]:
        out = []
        for line in (job.out / "aiperf" / "profile_export.jsonl").read_text().splitlines():
            d = json.loads(line)
            m = d.get("metrics") or {}
            if d.get("error") or "time_to_first_token" not in m:
                continue
            ttft = m["time_to_first_token"]["value"] / 1e3
            icl = [v / 1e3 for v in (m.get("inter_chunk_latency") or {}).get("value") or []]
            out.append(
                ClientReq(
                    ttft_s=ttft, offsets_s=_cumsum(ttft, icl), request_id=d["metadata"].get("x_request_id")
                )
            )
        return out


class GenaiBench(Runner):
    """`genai-bench benchmark` (Locust inside): one concurrency level, scenario D(in,out), request cap."""

    name = "genai-bench"
    per_chunk = False  # keeps TTFT and the output span per request

    def command(self, job: Job) -> list[str]:
        return [
            str(self.venv_bin("genai-bench")),
            "benchmark",
            "--api-backend",
            "openai",
            "--api-base",
            job.base_url,
            "--api-key",
            "none",
            "--task",
            "text-to-text",
            "--api-model-name",
            job.model,
            "--model-tokenizer",
            str(job.tokenizer),
            "--num-concurrency",
            str(job.concurrency),
            "--traffic-scenario",
            f"D({job.prompt_tokens},{job.output_tokens})",
            "--max-requests-per-run",
            str(job.requests),
            "--max-time-per-run",
            "3",
            "--server-engine",
            "SGLang",
            "--server-gpu-type",
            "H200",
            "--server-gpu-count",
            "1",
            "--experiment-base-dir",
            str(job.out / "exp"),
            "--experiment-folder-name",
            "run",
        ]

    def parse(self, job: Job, stdout: str) -> list[ClientReq]:
        out = []
        for f in sorted((job.out / "exp" / "run").glob("D*.json")):
            for r in json.loads(f.read_text()).get("individual_request_metrics") or []:
                if r.get("error_code") or r.get("ttft") is None:
                    continue
                out.append(ClientReq(ttft_s=r["ttft"], span_s=r.get("output_latency")))
        return out


RUNNERS: dict[str, Runner] = {
    r.name: r for r in (Servesweep(), SglangBench(), VllmBench(), Guidellm(), Aiperf(), GenaiBench())
}
EXPERIMENTS: dict[str, Runner] = {r.name: r for r in (ServesweepIdle(), ServesweepAt())}
# figure 6: 1 vs 2 worker processes (run_all sets their duration)
WORKER_RUNNERS: dict[str, ServesweepWorkers] = {
    r.name: r for r in (ServesweepWorkers(1), ServesweepWorkers(2))
}
