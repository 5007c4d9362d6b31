"""servesweep against a real OpenAI-compatible GPU server (`transformers serve --continuous-batching`).

For each server setting (a restart axis: extra `transformers serve` flags) this starts the server in its own
process group, waits for /health, sends one warm-up request, probes the chat template's overhead once, then runs
the load axes (prompt tokens x concurrency, fixed output) point by point with servesweep's own load core
(`servesweep.driver.point_run.run_point`: a real headless Locust process per point). The run folder has the layout
`servesweep load` writes (manifest.json with a `points` list, one folder per point with records.parquet and
summary.json; each point labelled with its server setting as `config_id`), so `servesweep report` reads it.

The earlier driver, kept to reproduce the first runs (results/smoke-20261129T193520Z, results/full-20261129; figures in bench/gpu/RESULTS.md): it was
written when `servesweep load` could not leave `ignore_eos` out and the sglang_server role launched only SGLang.
Both work now; run_gpu.sh drives `servesweep run bench/gpu/experiment.yaml` instead (docs/gpu-validation.md).

Points whose KV cache would not fit (concurrency x (prompt + output) x KV bytes per token over --kv-budget-gb) are
recorded as infeasible with the reason, as the planner does; points that would start after --budget-s are recorded
as skipped. Every stop is bounded: the server is killed with its whole process group, also on Ctrl-C or a crash.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from servesweep.config.point import LoadPoint
from servesweep.driver.point_run import PointFailed, run_point
from servesweep.results.store import MANIFEST, new_run, write_json_atomic
from servesweep.target.probes import resolve_point


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, ValueError):
        return -1


class Server:
    """`transformers serve MODEL --continuous-batching FLAGS` on loopback, in its own session (process group)."""

    def __init__(self, python: str, model: str, flags: list[str], port: int, log: Path):
        self.argv = [
            python,
            "-c",
            # the module entry point skips the CLI's update check, which would try the network
            "from transformers.cli.transformers import app; app()",
            "serve",
            model,
            "--continuous-batching",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *flags,
        ]
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float) -> float:
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
        # GET /v1/models answers 500 (CacheNotFound) unless the hub cache folder exists.
        Path(os.path.expanduser("~/.cache/huggingface/hub")).mkdir(parents=True, exist_ok=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(self.log, "ab") as f:
            f.write(f"$ {shlex.join(self.argv)}\n".encode())
            f.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(
                    f"server exited with {self.proc.returncode} before /health; log ends:\n{tail}"
                )
            if http_status(self.url + "/health") == 200:
                return time.monotonic() - t0
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"server not healthy after {timeout_s:.0f} s (log: {self.log})")

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass


def chat(url: str, model: str, content: str, max_tokens: int, timeout: float = 600.0) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def accept_finish_without_done(point_dir: Path, summary: dict) -> dict:
    """Count as complete the streams that ended cleanly after a finish_reason chunk with usage but no `data: [DONE]`.

    `transformers serve` 5.17 closes its SSE stream after the chunk that carries `finish_reason` and `usage` and
    never sends the `[DONE]` sentinel, so servesweep's parser (strict, as it must be for SGLang) classifies every
    request `no_done`. Until the load core can be told which servers omit the sentinel, this rewrites exactly
    those records (finish_reason length/stop, usage present, HTTP 200) as successes, re-summarises the point with
    servesweep's own `summarize`, and says how many it changed in summary.json.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    from servesweep.results.records import read_parquet, write_parquet
    from servesweep.results.store import write_json_atomic
    from servesweep.results.summary import summarize

    path = point_dir / "records.parquet"
    table = read_parquet(path)
    err = table.column("error_class")
    fix = pc.and_(
        pc.and_(
            pc.equal(err, "no_done"), pc.is_in(table.column("finish_reason"), pa.array(["length", "stop"]))
        ),
        pc.and_(pc.is_valid(table.column("completion_tokens")), pc.equal(table.column("http_status"), 200)),
    )
    fix = pc.fill_null(fix, False)
    n = pc.sum(fix).as_py() or 0
    if not n:
        return summary
    idx = table.schema.get_field_index("error_class")
    table = table.set_column(idx, "error_class", pc.if_else(fix, pa.scalar(None, pa.string()), err))
    msg_idx = table.schema.get_field_index("error_message")
    table = table.set_column(
        msg_idx, "error_message", pc.if_else(fix, pa.scalar(None, pa.string()), table.column("error_message"))
    )
    write_parquet(table, path, metadata={"no_done_accepted": n})
    summary = {**summary, **summarize(table)}
    summary["no_done_accepted"] = int(n)
    write_json_atomic(point_dir / "summary.json", summary)
    return summary


def serves(url: str, model: str) -> bool:
    """Whether the server still completes a tiny request."""
    try:
        chat(url, model, "Are you alive?", 2, timeout=60)
        return True
    except (OSError, ValueError, urllib.error.URLError):
        return False


def requests_for(concurrency: int, prompt_tokens: int, args) -> int:
    """Measured requests per point: one full wave of the closed loop (each user one request), at least
    --min-requests; long prompts get fewer waves, since each costs a long prefill."""
    return max(concurrency, args.min_requests if prompt_tokens < 20_000 else 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="served model directory (the request's model name too)")
    ap.add_argument(
        "--setting",
        action="append",
        required=True,
        metavar="NAME=FLAGS",
        help="a server setting (restart axis): name and extra `transformers serve` flags, e.g. "
        "'mbt8k=--cb-max-batch-tokens 8192'; repeat for each",
    )
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--prompt-tokens", default="3000")
    ap.add_argument(
        "--cap",
        action="append",
        default=[],
        metavar="PROMPT=MAXCONC",
        help="run prompt length PROMPT only up to concurrency MAXCONC (e.g. 100000=1 in a smoke test)",
    )
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--min-requests", type=int, default=2)
    ap.add_argument(
        "--kv-bytes-per-token", type=int, default=2 * 28 * 8 * 128 * 2, help="bf16 K+V, all layers"
    )
    ap.add_argument("--kv-budget-gb", type=float, default=110.0)
    ap.add_argument("--budget-s", type=float, default=480.0, help="start no point after this many seconds")
    ap.add_argument("--startup-timeout-s", type=float, default=240.0)
    ap.add_argument("--server-python", default=sys.executable)
    ap.add_argument("--out", type=Path, default=Path("runs"))
    ap.add_argument("--tokenizer", default=None, help="client tokenizer; default servesweep's Qwen3.6")
    args = ap.parse_args()

    settings = []
    for s in args.setting:
        name, sep, flags = s.partition("=")
        if not sep or not name.strip():
            ap.error(f"--setting {s!r}: expected NAME=FLAGS")
        settings.append((name.strip(), shlex.split(flags)))
    levels = [int(x) for x in args.concurrency.split(",")]
    prompts = [int(x) for x in args.prompt_tokens.split(",")]
    caps = {}
    for c in args.cap:
        p_, sep, m_ = c.partition("=")
        if not sep or not p_.isdigit() or not m_.isdigit():
            ap.error(f"--cap {c!r}: expected PROMPT=MAXCONC, two integers")
        caps[int(p_)] = int(m_)

    t_start = time.monotonic()
    run_id, run_dir = new_run(args.out, "gpu")
    manifest: dict = {
        "run_id": run_id,
        "kind": "load",
        "server": "transformers serve --continuous-batching",
        "model_dir": args.model,
        "settings": {n: f for n, f in settings},
        "points": [],
        "not_run": [],
        "servers": {},
        "argv": sys.argv[1:],
    }
    write_json_atomic(run_dir / MANIFEST, manifest)
    print(f"run folder {run_dir}", flush=True)

    for name, flags in settings:
        port = free_port()
        server = Server(args.server_python, args.model, flags, port, run_dir / "servers" / f"{name}.log")
        info: dict = {"flags": flags, "port": port}
        manifest["servers"][name] = info
        try:
            if time.monotonic() - t_start > args.budget_s:
                raise RuntimeError("time budget spent before this setting started")
            info["ready_s"] = round(server.start(args.startup_timeout_s), 1)
            t = time.monotonic()
            w = chat(server.url, args.model, "Warm up the continuous batching manager.", 8)
            info["warmup_s"] = round(time.monotonic() - t, 2)
            info["warmup_usage"] = w.get("usage")
            print(f"[{name}] ready in {info['ready_s']} s, warm-up {info['warmup_s']} s", flush=True)
            probe = resolve_point(
                LoadPoint(
                    base_url=server.url,
                    model=args.model,
                    concurrency=1,
                    prompt_tokens=100,
                    output_tokens=1,
                    requests=1,
                    tokenizer=args.tokenizer,
                    ignore_eos=False,
                )
            )
            info["template_overhead"] = probe.template_overhead
            info["continuous_usage"] = probe.continuous_usage
            for p_tok in prompts:
                for c in (c for c in levels if c <= caps.get(p_tok, c)):
                    pid = f"{name}-p{p_tok}-c{c}"
                    need_gb = c * (p_tok + args.output_tokens) * args.kv_bytes_per_token / 1e9
                    if need_gb > args.kv_budget_gb:
                        reason = f"KV cache: {c} x {p_tok + args.output_tokens} tokens need {need_gb:.0f} GB > {args.kv_budget_gb:.0f} GB"
                        manifest["not_run"].append(
                            {"point_id": pid, "status": "infeasible", "reason": reason}
                        )
                        print(f"[{name}] {pid}: infeasible ({reason})", flush=True)
                        continue
                    if time.monotonic() - t_start > args.budget_s:
                        manifest["not_run"].append(
                            {"point_id": pid, "status": "skipped", "reason": "time budget"}
                        )
                        print(f"[{name}] {pid}: skipped (time budget)", flush=True)
                        continue
                    point = probe.model_copy(
                        update={
                            "concurrency": c,
                            "prompt_tokens": p_tok,
                            "output_tokens": args.output_tokens,
                            "requests": requests_for(c, p_tok, args),
                            "point_id": pid,
                            "labels": {"config_id": name, "server_flags": shlex.join(flags)},
                        }
                    )
                    try:
                        s = run_point(point, run_dir / pid)
                        s = accept_finish_without_done(run_dir / pid, s)
                    except PointFailed as e:
                        manifest["not_run"].append(
                            {"point_id": pid, "status": "failed", "reason": str(e)[:2000]}
                        )
                        print(f"[{name}] {pid}: FAILED {str(e)[:500]}", flush=True)
                        continue
                    manifest["points"].append(
                        {"point_id": pid, "dir": pid, "concurrency": c, "config_id": name}
                    )
                    write_json_atomic(run_dir / MANIFEST, manifest)
                    print(json.dumps(brief(pid, s)), flush=True)
                    if s["requests"]["ok"] == 0 and not serves(server.url, args.model):
                        # e.g. the CB worker died (CUDA OOM): /health still answers 200, every request fails.
                        # Restart so the next points measure a live server; the log keeps the crash.
                        event = f"after {pid}: the server no longer completes a request; restarted"
                        info.setdefault("restarts", []).append(event)
                        print(f"[{name}] {event}", flush=True)
                        server.stop()
                        server.start(args.startup_timeout_s)
                        chat(server.url, args.model, "Warm up the continuous batching manager.", 8)
        except (RuntimeError, OSError, urllib.error.URLError) as e:
            info["error"] = str(e)[:3000]
            print(f"[{name}] setting failed: {str(e)[:1500]}", flush=True)
        finally:
            server.stop()
            write_json_atomic(run_dir / MANIFEST, manifest)
    manifest["finished_s"] = round(time.monotonic() - t_start, 1)
    write_json_atomic(run_dir / MANIFEST, manifest)
    print(f"done in {manifest['finished_s']} s: {run_dir}", flush=True)
    return 0


def brief(pid: str, s: dict) -> dict:
    """One line per point for the log: what a person reads first."""

    def q(metric: str, key: str):
        st = s.get(metric)
        return None if st is None else round(st[key], 1)

    pt = s.get("prompt_tokens") or {}
    return {
        "point": pid,
        "ok": s["requests"]["ok"],
        "failures": s["failures"],
        "ttft_p50_ms": q("ttft_ms", "p50"),
        "ttft_p99_ms": q("ttft_ms", "p99"),
        "itl_p50_ms": q("itl_ms", "p50"),
        "out_tok_s": None if s.get("output_tokens_per_s") is None else round(s["output_tokens_per_s"], 1),
        "prompt_target": pt.get("target"),
        "prompt_server_mean": pt.get("mean"),
        "prompt_dev_pct": pt.get("mean_deviation_pct"),
        "completion_mean": q("completion_tokens", "mean"),
        "wall_s": round(s["wall_s"], 1),
        "no_done_accepted": s.get("no_done_accepted", 0),
    }


if __name__ == "__main__":
    sys.exit(main())
