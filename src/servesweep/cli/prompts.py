"""`servesweep prompts`: build (and cache) a prompt pool or check a dataset ahead of a run, and show what it holds
(servesweep.workload.prompts, .datasets, .export)."""

from __future__ import annotations

import json

import click

from servesweep.cli.base import Command
from servesweep.exit_codes import BadOption, CommandError, UsageError
from servesweep.workload.pool import ENDPOINTS, NONCE_SLOT, PromptPool
from servesweep.workload.prompts import DEFAULT_CACHE_DIR, build_pool, verify_pool


@click.command(name="prompts", cls=Command)
@click.option("--prompt-tokens", type=int, help="Exact prompt length, as the server counts it.")
@click.option("-n", "--num-prompts", type=int, default=None, help="Prompts in the pool [64; a dataset: all].")
@click.option(
    "--tokenizer", default=None, help="tokenizer.json or model directory (default: built-in Qwen3.6)."
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--endpoint", type=click.Choice(ENDPOINTS), default="chat", show_default=True)
@click.option(
    "--template-overhead", type=int, default=None, help="Tokens the server's template adds (probe)."
)
@click.option("--no-cache-bust", is_flag=True, help="No per-request nonce slot.")
@click.option("--shared-prefix-tokens", type=int, default=0, show_default=True)
@click.option("--num-groups", type=int, default=1, show_default=True)
@click.option("--dataset", type=click.Path(dir_okay=False), default=None, help="ShareGPT JSON or JSONL file.")
@click.option("--min-prompt-tokens", type=int, default=None, help="Dataset length filter.")
@click.option("--max-prompt-tokens", type=int, default=None, help="Dataset length filter.")
@click.option("--cache-dir", default=str(DEFAULT_CACHE_DIR), show_default=True)
@click.option("--show", type=int, default=None, help="Print prompt I (its nonce slot as <NONCE>).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--verify",
    is_flag=True,
    help="Count every prompt in full (a build counts the first ones) and fail if any is off.",
)
@click.option(
    "--export",
    "export_fmt",
    type=click.Choice(("sglang", "vllm")),
    default=None,
    help="Write the pool as SGLang bench_serving's or vLLM's custom dataset (JSONL) to --out.",
)
@click.option(
    "--out", "export_out", type=click.Path(dir_okay=False), default=None, help="File --export writes."
)
@click.option("--nonce-start", type=int, default=0, show_default=True, help="--export: first nonce written.")
def command(
    prompt_tokens,
    num_prompts,
    tokenizer,
    seed,
    endpoint,
    template_overhead,
    no_cache_bust,
    shared_prefix_tokens,
    num_groups,
    dataset,
    min_prompt_tokens,
    max_prompt_tokens,
    cache_dir,
    show,
    as_json,
    verify,
    export_fmt=None,
    export_out=None,
    nonce_start=0,
):
    """Build (and cache) a prompt pool, or load a dataset, and print what it holds.

    Run it on each load host before a long matrix to warm the pool cache, or to check a dataset file.
    """
    import statistics
    import time

    t0 = time.perf_counter()
    try:
        pool = _command_pool(
            prompt_tokens=prompt_tokens,
            num_prompts=num_prompts,
            tokenizer=tokenizer,
            seed=seed,
            endpoint=endpoint,
            template_overhead=template_overhead,
            cache_bust=not no_cache_bust,
            shared_prefix_tokens=shared_prefix_tokens,
            num_groups=num_groups,
            dataset=dataset,
            min_prompt_tokens=min_prompt_tokens,
            max_prompt_tokens=max_prompt_tokens,
            cache_dir=cache_dir,
        )
    except (ValueError, RuntimeError) as e:
        raise CommandError(str(e)) from None
    lengths = [p.tokens for p in pool]
    summary = pool.meta() | {
        "seconds": round(time.perf_counter() - t0, 3),
        "tokens_min": min(lengths),
        "tokens_median": statistics.median(lengths),
        "tokens_max": max(lengths),
    }
    if verify:
        summary |= _command_verify(pool, template_overhead)
    if show is not None:
        _command_show(pool, show)
    if export_fmt or export_out:
        summary |= _command_export(pool, export_fmt, export_out, nonce_start)
    if as_json:
        click.echo(json.dumps(summary))
    else:
        for k, v in summary.items():
            click.echo(f"{k:>22}: {v}")


def _command_pool(*, dataset, num_prompts, prompt_tokens, cache_dir, **kw) -> PromptPool:
    """`servesweep prompts`' pool: the dataset's prompts, or a synthetic pool built (or read) under `cache_dir`."""
    common = {k: kw[k] for k in ("tokenizer", "seed", "endpoint", "template_overhead", "cache_bust")}
    if dataset:
        from servesweep.workload.datasets import load_dataset

        return load_dataset(
            dataset,
            n=num_prompts,
            min_prompt_tokens=kw["min_prompt_tokens"],
            max_prompt_tokens=kw["max_prompt_tokens"],
            **common,
        )
    if prompt_tokens is None:
        raise UsageError("give --prompt-tokens N (or --dataset FILE)")
    return build_pool(
        prompt_tokens,
        num_prompts or 64,
        shared_prefix_tokens=kw["shared_prefix_tokens"],
        num_groups=kw["num_groups"],
        cache_dir=cache_dir or None,
        **common,
    )


def _command_verify(pool: PromptPool, template_overhead: int | None) -> dict:
    """`--verify`: every prompt counted in full; an error naming the first ones off."""
    import time

    t1 = time.perf_counter()
    off = verify_pool(pool, template_overhead)
    if off:
        shown = ", ".join(f"prompt {i}: {c} tokens, not {pool[i].tokens}" for i, c in list(off.items())[:5])
        raise CommandError(f"{len(off)} of {len(pool)} prompts are off: {shown}")
    return {"verified_prompts": len(pool), "verify_seconds": round(time.perf_counter() - t1, 3)}


def _command_export(pool: PromptPool, fmt: str | None, out: str | None, nonce_start: int) -> dict:
    """`--export FORMAT --out FILE`: the pool as a peer's custom dataset (servesweep.workload.export)."""
    from servesweep.workload.export import export_pool, peer_hint

    if not fmt or not out:
        raise UsageError("--export FORMAT and --out FILE go together")
    try:
        n = export_pool(pool, fmt, out, nonce_start)
    except ValueError as e:
        raise CommandError(str(e)) from None
    click.echo(f"wrote {n} prompts to {out}; replay: {peer_hint(fmt, out)}", err=True)
    return {"exported": n, "export_format": fmt, "export_path": str(out)}


def _command_show(pool: PromptPool, show: int) -> None:
    """`--show I`: prompt I with its nonce slot as <NONCE>, and its needle's answer."""
    if not 0 <= show < len(pool):
        raise BadOption(f"{show}: the pool holds prompts 0..{len(pool) - 1}", "--show")
    p = pool[show]
    text = json.dumps(p.messages, indent=1, ensure_ascii=False) if p.messages is not None else p.text
    click.echo((text or "").replace(NONCE_SLOT, "<NONCE>"))
    if p.answer:
        click.echo(f"\n[needle answer: {p.answer}]")
