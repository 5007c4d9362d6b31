"""`servesweep trace`: convert a public trace into the native format, print its statistics
(servesweep.workload.trace.stats), cut a window of it, write a generated one (`synth`)."""

from __future__ import annotations

import json

import click

from servesweep.cli.base import Group
from servesweep.exit_codes import BadOption, CommandError
from servesweep.workload.trace.cache import parse_tokens
from servesweep.workload.trace.model import Trace, TraceError
from servesweep.workload.trace.readers import FORMATS, read_trace
from servesweep.workload.trace.stats import trace_stats
from servesweep.workload.trace.window import window

_FROM = click.option(
    "--from",
    "fmt",
    type=click.Choice(FORMATS),
    default="auto",
    show_default=True,
    help="The input trace's format.",
)
_BLOCK = click.option(
    "--block-size",
    type=click.IntRange(min=1),
    default=None,
    help="Tokens per hash block [Mooncake 512, Bailian 16].",
)


def _read(path: str, fmt: str, block_size: int | None) -> Trace:
    try:
        return read_trace(path, fmt, block_size=block_size)
    except (TraceError, ValueError) as e:
        raise CommandError(str(e)) from None


def _seconds(v: str | None, name: str) -> float | None:
    from servesweep.config.point import parse_seconds

    if v is None:
        return None
    try:
        return parse_seconds(v)
    except ValueError as e:
        raise BadOption(str(e), name) from None


@click.group(name="trace", cls=Group)
def command():
    """Request traces: convert, stats, sample (docs/workloads.md, "Trace replay")."""


@command.command("convert")
@click.argument("src", type=click.Path(dir_okay=False))
@click.argument("dst", type=click.Path(dir_okay=False))
@_FROM
@_BLOCK
def convert(src, dst, fmt, block_size):
    """Read SRC (Mooncake, Azure, Bailian, sessions) and write it to DST in the native JSONL format."""
    t = _read(src, fmt, block_size)
    t.save(dst)
    click.echo(f"wrote {len(t.requests)} requests ({t.source}, blocks of {t.block_size} tokens) to {dst}")


@command.command("sample")
@click.argument("src", type=click.Path(dir_okay=False))
@click.argument("dst", type=click.Path(dir_okay=False))
@_FROM
@_BLOCK
@click.option(
    "--start", default="0", show_default=True, help="Window start from the trace's start (e.g. 10m)."
)
@click.option("--duration", default=None, help="Window length (e.g. 5m) [to the end].")
@click.option(
    "--sample",
    "fraction",
    type=float,
    default=1.0,
    show_default=True,
    help="Fraction of requests (whole sessions) kept.",
)
@click.option("--seed", type=int, default=0, show_default=True)
def sample(src, dst, fmt, block_size, start, duration, fraction, seed):
    """Cut a window of SRC (start, duration, a sampled fraction) into DST (native JSONL, timed from the window)."""
    t = _read(src, fmt, block_size)
    try:
        w = window(t, _seconds(start, "--start") or 0.0, _seconds(duration, "--duration"), fraction, seed)
    except ValueError as e:
        raise CommandError(str(e)) from None
    w.save(dst)
    click.echo(f"wrote {len(w.requests)} of {len(t.requests)} requests to {dst}")


@command.command("synth")
@click.argument("dst", type=click.Path(dir_okay=False))
@click.option(
    "--format",
    "out_fmt",
    type=click.Choice(("native", "mooncake", "azure", "bailian", "sessions")),
    default="mooncake",
    show_default=True,
    help="The file format written.",
)
@click.option("--requests", "n", type=click.IntRange(min=1), default=40, show_default=True)
@click.option(
    "--groups", type=click.IntRange(min=1), default=4, show_default=True, help="Groups sharing a prefix."
)
@click.option(
    "--prefix-blocks", type=click.IntRange(min=0), default=2, show_default=True, help="Blocks a group shares."
)
@click.option(
    "--own-blocks",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Full blocks of each request's own.",
)
@click.option("--block-size", type=click.IntRange(min=1), default=512, show_default=True)
@click.option(
    "--rate", type=float, default=10.0, show_default=True, help="Requests per second (evenly spaced)."
)
@click.option("--output-tokens", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def synth_cmd(dst, out_fmt, n, groups, prefix_blocks, own_blocks, block_size, rate, output_tokens, seed):
    """Write a small generated trace with known sharing (prints its ideal hit rate); for trying a replay.

    `--format sessions` writes agentic sessions instead: REQUESTS turns over GROUPS sessions, each turn repeating
    its previous turn's full blocks."""
    from pathlib import Path

    from servesweep.workload.trace import synth

    if not rate > 0:
        raise BadOption("expected a positive rate", "--rate")
    if out_fmt == "sessions":
        s = synth.session_requests(groups, max(1, n // groups), first_blocks=max(1, prefix_blocks),
                                   grow_blocks=max(1, own_blocks), block_size=block_size,
                                   output_length=output_tokens)  # fmt: skip
    else:
        s = synth.shared_prefix_requests(n, groups=groups, prefix_blocks=prefix_blocks, own_blocks=own_blocks,
                                         block_size=block_size, rate_rps=rate, output_length=output_tokens,
                                         seed=seed)  # fmt: skip
    path = Path(dst)
    if out_fmt == "native":
        s.trace.save(path)
    else:
        {"mooncake": synth.write_mooncake, "azure": synth.write_azure, "bailian": synth.write_bailian,
         "sessions": synth.write_sessions}[out_fmt](path, s.trace)  # fmt: skip
    hit = (
        "0.0% (the Azure format has no block ids)"
        if out_fmt == "azure"
        else f"{100 * s.expected_hit_ratio:.1f}%"
    )
    click.echo(f"wrote {len(s.trace.requests)} requests ({out_fmt}) to {dst}; ideal hit rate {hit}")


@command.command("stats")
@click.argument("src", type=click.Path(dir_okay=False))
@_FROM
@_BLOCK
@click.option(
    "--cache-tokens", default="inf", show_default=True, help="Prefix cache size in tokens (500k, 2M, inf)."
)
@click.option("--bucket", default="60s", show_default=True, help="Width of the request-rate buckets.")
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON.")
def stats(src, fmt, block_size, cache_tokens, bucket, as_json):
    """Request rate over time, length distributions and the ideal prefix-cache hit rate of a trace."""
    t = _read(src, fmt, block_size)
    try:
        cache = parse_tokens(cache_tokens)
    except ValueError as e:
        raise BadOption(str(e), "--cache-tokens") from None
    width = _seconds(bucket, "--bucket")
    if not width or width <= 0:
        raise BadOption("expected a positive duration", "--bucket")
    s = trace_stats(t, cache, width)
    if as_json:
        click.echo(json.dumps(s))
        return
    click.echo(
        f"trace: {t.source}  requests {s['requests']}  duration {s['duration_s']:.1f} s  "
        f"mean rate {s['rate_rps']:.2f} req/s  blocks of {t.block_size} tokens"
    )
    if s["sessions"]:
        click.echo(f"sessions: {s['sessions']}  turns per session p50 {s['turns_p50']} max {s['turns_max']}")
    for name in ("input_length", "output_length"):
        d = s[name]
        click.echo(
            f"{name:>14}: mean {d['mean']:.0f}  p50 {d['p50']:.0f}  p90 {d['p90']:.0f}  p99 {d['p99']:.0f}  "
            f"max {d['max']}  total {d['total']}"
        )
    click.echo(
        f"ideal prefix-cache hit rate: {100 * s['ideal_hit_ratio']:.1f}% at {s['cache']}"
        + (f" ({100 * s['ideal_hit_ratio_unlimited']:.1f}% unlimited)" if cache is not None else "")
    )
    click.echo(f"request rate per {width:g} s (req/s):")
    peak = max(s["rate_over_time"], default=0) or 1
    for k, r in enumerate(s["rate_over_time"]):
        click.echo(f"  {k * width:>8.0f} s  {r:8.2f}  {'#' * round(40 * r / peak)}")
