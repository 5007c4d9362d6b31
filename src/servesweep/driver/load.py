"""`servesweep load`: one load point or a sweep (concurrency, rate) against a running server or the built-in
emulator, each point through `driver.point.run_point`, with a table at the end."""


import json
import math
import os
import re
import shlex
import signal
import sys
import time
from pathlib import Path

import click

from servesweep.config.point import LoadPoint
from servesweep.driver.point import STOP_SIGNALS, Interrupted, read_json, run_point
from servesweep.results.table import results_table, table_notes
from servesweep.target.probes import ProbeLog, resolve_point

DEFAULT_KEY_ENV = "OPENAI_API_KEY"
# where --api-key-file's key travels to the Locust child (its environment)
FILE_KEY_ENV = "SERVESWEEP_API_KEY"
DEFAULT_SIM_MODEL = "Qwen/Qwen3.6-27B"
DEFAULT_SIM_ARGS = f"--model-path {DEFAULT_SIM_MODEL} --enable-cache-report"


# ---------------------------------------------------------------- `servesweep load`

_DUR = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")


def parse_duration(text: str, what: str) -> float:
    m = _DUR.match(text or "")
    if not m:
        raise click.BadParameter(f"{text!r} is not a duration like 90s, 2m, 1.5h or 500ms", param_hint=what)
    v = float(m[1])
    return v * {"ms": 1e-3, "s": 1, "m": 60, "h": 3600, None: 1}[m[2]]


def parse_concurrency(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise click.BadParameter(
                f"{part!r} in {text!r} is not a positive integer", param_hint="--concurrency"
            )
        out.append(int(part))
    return out


def parse_rates(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            v = float("nan")
        if not (v > 0 and math.isfinite(v)):
            raise click.BadParameter(
                f"{part.strip()!r} in {text!r} is not a positive number of requests per second",
                param_hint="--rate",
            )
        out.append(v)
    return out


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--base-url", default=None, help="server root (http://HOST:PORT); omitted: start the emulator")
@click.option("--model", default=None, help="model name; default: the first of /v1/models")
@click.option(
    "--endpoint", type=click.Choice(["chat", "completions", "generate"]), default="chat", show_default=True
)
@click.option(
    "--concurrency", "concurrency_text", default="8", show_default=True, help="N or a sweep: 1,2,4,8"
)
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=2000, show_default=True)
@click.option("--output-tokens", type=click.IntRange(min=1), default=256, show_default=True)
@click.option(
    "--requests",
    type=click.IntRange(min=1),
    default=None,
    help="measured requests per point (default without --duration: max(8, 2 x concurrency); open loop: 10 s of "
    "arrivals, max(8, 10 x rate))",
)
@click.option(
    "--arrival",
    type=click.Choice(["closed", "constant", "poisson"]),
    default="closed",
    show_default=True,
    help="closed loop, or open-loop arrivals at --rate (concurrency: the cap of streams in flight)",
)
@click.option("--rate", "rate_text", default=None, help="open loop: requests/s, or a sweep: 1,2,4")
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Locust worker processes per point on this machine (0: one process)",
)
@click.option(
    "--worker-inventory",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="run the workers on the hosts of this Ansible inventory (the locust_worker role, over SSH)",
)
@click.option("--worker-group", default="loadgen", show_default=True, help="inventory group of worker hosts")
@click.option("--workers-per-host", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--master-host", default=None, help="address of this machine the worker hosts connect to")
@click.option("--master-port", type=click.IntRange(1, 65535), default=5557, show_default=True)
@click.option(
    "--api-key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="file holding the API key (mode 0600); it reaches Locust through its environment only",
)
@click.option(
    "--duration", default=None, help="measured time per point (e.g. 60s); streams still running finish"
)
@click.option(
    "--warmup", default="0s", show_default=True, help="requests scheduled in this first time are warmup"
)
@click.option("--tokenizer", default=None, help="tokenizer.json, model dir, or qwen3.6 (default)")
@click.option("--no-cache-bust", is_flag=True, help="let requests share prefixes (no per-request nonce)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--api-key-env",
    default=None,
    help=f"NAME of the env var holding the API key (default {DEFAULT_KEY_ENV} if set)",
)
@click.option("--first-token-timeout", default="900s", show_default=True)
@click.option("--stall-timeout", default="120s", show_default=True)
@click.option(
    "--slo", default=None, help="e.g. 'ttft_p99<=2s,itl_p99<=50ms' or per request 'ttft<=2s' (goodput)"
)
@click.option(
    "--sim-args",
    default=DEFAULT_SIM_ARGS,
    show_default=True,
    help="emulator flags when --base-url is omitted (a --model-path is added when missing)",
)
@click.option(
    "--out",
    "out_root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("runs"),
    show_default=True,
)
@click.option("--json", "as_json", is_flag=True, help="print the summaries as JSON instead of the table")
@click.option(
    "--no-ignore-eos", is_flag=True, help="leave ignore_eos out of the body (servers that reject it)"
)
@click.option(
    "--workload",
    type=click.Choice(["synthetic", "shared_prefix", "dataset", "agent"]),
    default="synthetic",
    show_default=True,
    help="what the requests are made of (docs/workloads.md)",
)
@click.option(
    "--output-dist", default=None, help="output lengths per prompt, e.g. lognormal:mean=512,sigma=0.5"
)
@click.option("--shared-prefix-tokens", type=click.IntRange(min=0), default=0, help="shared_prefix/agent")
@click.option("--num-groups", type=click.IntRange(min=1), default=1, show_default=True, help="shared_prefix")
@click.option("--dataset", default=None, help="dataset workload: a ShareGPT JSON or JSONL file")
@click.option("--dataset-min-tokens", type=click.IntRange(min=0), default=None)
@click.option("--dataset-max-tokens", type=click.IntRange(min=0), default=None)
@click.option("--thinking", type=click.Choice(["on", "off"]), default=None, help="chat_template_kwargs")
@click.option("--session-turns", type=click.IntRange(min=1), default=4, show_default=True, help="agent")
@click.option(
    "--tool-result-tokens", type=click.IntRange(min=0), default=500, show_default=True, help="agent"
)
@click.option("--think-time", default="0s", show_default=True, help="agent: pause between turns")
@click.option("--context-cap", type=click.IntRange(min=1), default=100_000, show_default=True, help="agent")
@click.option("--metrics-port", type=click.IntRange(min=0), default=0, help="serve live client metrics here")
@click.option(
    "--max-failure-rate",
    default=None,
    help="exit 3 when a point's failed share of measured requests is above this (0.05 or 5%); a point with 0 "
    "successes always does",
)
def command(max_failure_rate, **opts):
    """Run one load point or a sweep (concurrency and/or open-loop rate; one Locust run per point) and print the
    results table. Exit codes: docs/reports.md, "Exit codes"."""
    max_rate = parse_rate_limit(max_failure_rate, "--max-failure-rate")
    old_handlers = {}

    def on_signal(signum, frame):
        for sig in STOP_SIGNALS:  # once: a second signal must not break the stop that the first one began
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signum)

    for sig in STOP_SIGNALS:
        old_handlers[sig] = signal.signal(sig, on_signal)
    state: dict = {}
    try:
        _load(state, max_rate, **opts)
    except Interrupted as e:
        _interrupted(state, e)
    finally:
        for sig, h in old_handlers.items():
            signal.signal(sig, h)


def parse_rate_limit(text: str | None, what: str) -> float | None:
    """'5%' or '0.05' as a fraction in [0, 1]; None stays None."""
    if text is None:
        return None
    t = str(text).strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        v = float("nan")
    if not 0 <= v <= 1:
        raise click.BadParameter(f"{text!r} is not a share between 0 and 1 (or 0% and 100%)", param_hint=what)
    return v


def _interrupted(state: dict, e: Interrupted) -> None:
    """A signal stopped `servesweep load`: Locust is stopped already (run_point); keep what finished, list the
    partial records of the point it interrupted, say so, exit 128 + signum."""
    from servesweep.results.store import write_manifest

    err = click.get_text_stream("stderr")
    name = signal.Signals(e.signum).name
    run_dir, manifest, current = state.get("run_dir"), state.get("manifest"), state.get("current")
    lines = [f"servesweep load: stopped by {name}; the load generator is stopped"]
    if run_dir is not None and manifest is not None:
        manifest["status"] = "interrupted"
        manifest["interrupted"] = {"signal": name, "unix": time.time(), "point": current}
        done = [p["point_id"] for p in manifest["points"]]
        if current is not None:
            info = read_json(run_dir / current / "interrupted.json")
            if info is not None:
                manifest["points"].append(
                    {"point_id": current, "dir": current, "status": "interrupted", "partial": info}
                )
                if info.get("records"):
                    lines.append(
                        f"point {current} was interrupted: {info.get('rows')} finished requests in "
                        f"{run_dir / current / info['records']} (partial; see interrupted.json)"
                    )
        try:
            write_manifest(run_dir, manifest)
        except OSError:
            pass
        lines.append(f"finished points kept in {run_dir}: {', '.join(done) or 'none'}")
        left = [pid for pid in state.get("all_points", []) if pid not in done]
        if left:
            lines.append(f"not measured: {', '.join(left)} (run them again with servesweep load)")
    for line in lines:
        print(line, file=err, flush=True)
    sys.exit(128 + e.signum)


def _load(
    state: dict,
    max_rate: float | None,
    *,
    base_url,
    model,
    endpoint,
    concurrency_text,
    prompt_tokens,
    output_tokens,
    requests,
    arrival,
    rate_text,
    workers,
    worker_inventory,
    worker_group,
    workers_per_host,
    master_host,
    master_port,
    api_key_file,
    duration,
    warmup,
    tokenizer,
    no_cache_bust,
    seed,
    api_key_env,
    first_token_timeout,
    stall_timeout,
    slo,
    sim_args,
    out_root,
    as_json,
    no_ignore_eos,
    workload,
    output_dist,
    shared_prefix_tokens,
    num_groups,
    dataset,
    dataset_min_tokens,
    dataset_max_tokens,
    thinking,
    session_turns,
    tool_result_tokens,
    think_time,
    context_cap,
    metrics_port,
) -> None:
    """The body of `servesweep load`; `state` tells the signal path how far it got."""
    from contextlib import ExitStack

    from pydantic import ValidationError
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from servesweep.results.store import new_run, write_manifest
    from servesweep.config.slo import parse_slos

    err = Console(stderr=True)
    levels = parse_concurrency(concurrency_text)
    duration_s = parse_duration(duration, "--duration") if duration else None
    warmup_s = parse_duration(warmup, "--warmup")
    try:
        parse_slos(slo)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--slo") from None
    if arrival == "closed" and rate_text is not None:
        raise click.BadParameter("a rate needs --arrival constant or poisson", param_hint="--rate")
    if arrival != "closed" and rate_text is None:
        raise click.BadParameter(f"--arrival {arrival} needs --rate (requests/s)", param_hint="--rate")
    rates: list[float | None] = parse_rates(rate_text) if rate_text is not None else [None]
    if workers and requests is not None and requests < workers:
        raise click.BadParameter(
            f"--requests {requests} < --workers {workers}: each worker process needs a share of the budget",
            param_hint="--workers",
        )
    worker_hosts = None
    if worker_inventory is not None:
        if workers:
            raise click.BadParameter("give --workers or --worker-inventory, not both", param_hint="--workers")
        if not master_host:
            raise click.BadParameter(
                "worker hosts need the address they reach this machine at", param_hint="--master-host"
            )
        worker_hosts = {
            "inventory": str(worker_inventory),
            "group": worker_group,
            "per_host": workers_per_host,
            "master_host": master_host,
            "master_port": master_port,
        }
    elif master_host:
        raise click.BadParameter("--master-host is for --worker-inventory", param_hint="--master-host")
    if api_key_file is not None:
        if api_key_env is not None:
            raise click.BadParameter(
                "give --api-key-file or --api-key-env, not both", param_hint="--api-key-file"
            )
        from servesweep.config.secrets import SecretError, read_key_file

        try:
            key = read_key_file(api_key_file)
        except SecretError as e:
            raise click.BadParameter(str(e), param_hint="--api-key-file") from None
        # The key lives in this process's environment and the Locust child's, never on a command line.
        api_key_env = FILE_KEY_ENV
        os.environ[FILE_KEY_ENV] = key
    if api_key_env is None and os.environ.get(DEFAULT_KEY_ENV):
        api_key_env = DEFAULT_KEY_ENV
    if api_key_env is not None and not os.environ.get(api_key_env):
        raise click.BadParameter(f"environment variable {api_key_env} is not set", param_hint="--api-key-env")

    with ExitStack() as stack:
        if base_url is None:
            from servesweep.sim.launch import start_sim

            args = shlex.split(sim_args)
            if not any(a.startswith(("--model-path", "--model")) for a in args):
                args = ["--model-path", DEFAULT_SIM_MODEL, *args]
            sim = stack.enter_context(start_sim(args))
            base_url = sim.base_url
            err.print(
                f"[bold]no --base-url: started the SGLang emulator at {base_url}[/] (servesweep sim {shlex.join(args)})"
            )
        points = []
        for c, rate in [(c, r) for c in levels for r in rates]:
            n = requests
            if n is None and duration_s is None:
                # closed loop: two requests per user; open loop: 10 s of arrivals at the rate
                n = max(8, 2 * c, workers) if rate is None else max(8, math.ceil(10 * rate), workers)
            pid = f"c{c}" if rate is None else f"c{c}-{arrival}{rate:g}"
            try:
                points.append(
                    LoadPoint(
                        base_url=base_url,
                        model=model,
                        endpoint=endpoint,
                        concurrency=c,
                        arrival=arrival,
                        rate_rps=rate,
                        prompt_tokens=prompt_tokens,
                        output_tokens=output_tokens,
                        requests=n,
                        duration_s=duration_s,
                        warmup_s=warmup_s,
                        tokenizer=tokenizer,
                        cache_bust=not no_cache_bust,
                        seed=seed,
                        api_key_env=api_key_env,
                        first_token_s=parse_duration(first_token_timeout, "--first-token-timeout"),
                        stall_s=parse_duration(stall_timeout, "--stall-timeout"),
                        point_id=pid,
                        ignore_eos=not no_ignore_eos,
                        workload=workload,
                        output_dist=output_dist,
                        shared_prefix_tokens=shared_prefix_tokens,
                        num_groups=num_groups,
                        dataset=dataset,
                        dataset_min_tokens=dataset_min_tokens,
                        dataset_max_tokens=dataset_max_tokens,
                        thinking={"on": True, "off": False}.get(thinking),
                        session_turns=session_turns,
                        tool_result_tokens=tool_result_tokens,
                        think_time_s=parse_duration(think_time, "--think-time"),
                        context_cap_tokens=context_cap,
                    )
                )
            except ValidationError as e:
                raise click.UsageError(str(e)) from None
        # Probe the server once for the whole run; every point reuses what it found.
        probes = ProbeLog()
        try:
            first = resolve_point(points[0], probes)
        except (RuntimeError, ValueError, OSError) as e:
            raise click.ClickException(f"probing {base_url}: {e}") from None
        for note in probes.notes:
            err.print(f"[yellow]warning: {note}[/]")
        run_id, run_dir = new_run(out_root)
        from servesweep.results.manifest import OwnedProcesses

        owned = OwnedProcesses(run_dir)  # processes.json: the Locust groups this run starts, while they run
        state.update(run_dir=run_dir, all_points=[p.id for p in points])
        fixed = {k: getattr(first, k) for k in ("model", "template_overhead", "continuous_usage")}
        points = [p.model_copy(update=fixed) for p in points]
        err.print(
            f"model {first.model}; chat template overhead {first.template_overhead} tokens; "
            f"per-chunk usage {'yes' if first.continuous_usage else 'no'}; results in {run_dir}"
        )
        manifest = {
            "run_id": run_id,
            "kind": "load",
            "base_url": base_url,
            "points": [],
            "argv": sys.argv[1:],
            "probe_requests": probes.as_dict(),
        }
        write_manifest(run_dir, manifest)
        state["manifest"] = manifest
        summaries = []
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=err,
            transient=False,
            disable=as_json and not err.is_terminal,
        ) as prog:
            for p in points:
                total = p.requests if p.duration_s is None else p.warmup_s + p.duration_s
                what = f"concurrency {p.concurrency}" + (f", {p.rate_rps:g}/s" if p.rate_rps else "")
                task = prog.add_task(what, total=total, status="")

                def _update(d, p=p, task=task):
                    done = (
                        d["completed"]
                        if p.duration_s is None
                        else min(d["elapsed_s"], p.warmup_s + p.duration_s)
                    )
                    prog.update(task, completed=done, status=f"{d['completed']} done, {d['failed']} failed")

                state["current"] = p.id
                # the run's probes are counted with its first point; their notes go with every point
                pl = probes if p is points[0] else ProbeLog()
                pl.notes = list(probes.notes)
                try:
                    s = run_point(
                        p,
                        run_dir / p.id,
                        workers=workers,
                        progress=_update,
                        slos=slo,
                        metrics_port=metrics_port or None,
                        worker_hosts=worker_hosts,
                        owned=owned,
                        max_failure_rate=max_rate,
                        probes=pl,
                    )
                except (RuntimeError, ValueError, OSError) as e:
                    raise click.ClickException(f"point {p.id}: {e}") from None
                summaries.append(s)
                manifest["points"].append(
                    {"point_id": p.id, "dir": p.id, "concurrency": p.concurrency, "rate_rps": p.rate_rps}
                )
                write_manifest(run_dir, manifest)
                state["current"] = None
        manifest["finished_unix"] = time.time()
        write_manifest(run_dir, manifest)

    if as_json:
        click.echo(json.dumps({"run_id": run_id, "run_dir": str(run_dir), "points": summaries}, indent=2))
    else:
        out = Console() if sys.stdout.isatty() else Console(width=150)
        out.print(
            results_table(
                summaries, title=f"servesweep load — {prompt_tokens} prompt / {output_tokens} output tokens"
            )
        )
        out.print(f"results: {run_dir}")
    for line in table_notes(summaries):
        err.print(line)
    failed = [s["failure_check"]["message"] for s in summaries if not s["failure_check"]["pass"]]
    for msg in failed:
        err.print(f"[red]failed: {msg}[/]")
    slo_fail = [s for s in summaries if any(not c["pass"] for c in s.get("slos", []))]
    if slo_fail:
        err.print(f"[red]SLO breached at {', '.join(s['point_id'] for s in slo_fail)}[/]")
    if failed:
        sys.exit(3)  # docs/reports.md, "Exit codes": requests failed above the threshold
    if slo_fail:
        sys.exit(1)  # issue 8's exit codes: 0 pass, 1 breach, 2 could not run
