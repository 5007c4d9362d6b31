"""Correct by construction on the emulator: two server configurations of one dry-run search whose only difference
is a doubled step time (`--sim-calibration speedup` 20 against 10: the step model divides every step's time by
it) get about half the capacity at a decode-speed SLO.

Why about half: with per_seq_s = 0.1 s each running sequence adds 100 ms to every step (÷ 20: 5 ms), against a
fixed part of ~16 ms (÷ 20: 0.8 ms: overhead and the weights' read). Measured on the emulator at 64-token prompts
and 8-token answers, TPOT p50 ≈ 0.8 + 5·c ms at speedup 20 and 1.6 + 10·c ms at speedup 10 (c = concurrency). At
`tpot_p50<=64ms` the true capacities are 12.6 and 6.2 (ratio 0.49, under 0.5 by the fixed part); the search lands
on whole concurrencies (12 and 6 here), one step either way on a near-threshold verdict, so the ratio lies in
5/13 = 0.38 .. 7/12 = 0.58: the test asserts 0.35-0.65."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import run_servesweep

# launcher.sim_args gives the calibration (so the dry run keeps the tiers as written: they are not scaled to its
# own speed-up); each bundle passes its own --sim-calibration as a flag, rendered after sim_args, so it wins
EXPERIMENT = """\
name: doubled-step-time
sglang_version: "0.5.23"
target: {inventory: local, host_group: gpu, port: 0}
model: {path: Qwen/Qwen3.6-27B}
launcher:
  kind: process
  emulator: true
  gpu: H200
  gpus_per_host: 1
  sim_args: {sim_calibration: "per_seq_s=0.1,speedup=20"}
server:
  base: {context_length: 4096}
  bundles:
    - {name: fast, flags: {sim_calibration: "per_seq_s=0.1,speedup=20"}}
    - {name: slow, flags: {sim_calibration: "per_seq_s=0.1,speedup=10"}}
load: {endpoint: chat, prompt_tokens: 64, output_tokens: 8, requests: 8}
search:
  axis: concurrency
  tiers:
    decode: [tpot_p50<=64ms]
  lower: 1
  upper: 32
  start: 8          # between the two capacities: each search brackets in two probes
  resolution: 1
"""


def _run_dry(exp: Path, out: Path) -> tuple[int, str]:
    """`servesweep run EXP --dry-run` in its own process group, so that a timeout reaches its emulators too."""
    return run_servesweep("run", str(exp), "--dry-run", "--out", str(out), timeout=180)


def _calibration(server_dir: Path) -> str:
    """The --sim-calibration the emulator ran with: the last one of its argv (argparse keeps the last)."""
    argv = json.loads((server_dir / "server_info.json").read_text())["argv"]
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--sim-calibration"][-1]


@pytest.mark.timeout(300)
def test_doubled_step_time_on_the_emulator_gets_about_half_the_capacity(tmp_path):
    exp = tmp_path / "doubled-step-time.yaml"
    exp.write_text(EXPERIMENT)
    rc, text = _run_dry(exp, tmp_path / "runs")
    assert rc == 0, text[-5000:]
    run_dir = next((tmp_path / "runs").iterdir())
    assert _calibration(run_dir / "servers" / "s01-fast") == "per_seq_s=0.1,speedup=20"
    assert _calibration(run_dir / "servers" / "s02-slow") == "per_seq_s=0.1,speedup=10"
    rows = {r["config"]: r for r in json.loads((run_dir / "capacity.json").read_text())["rows"]}
    assert set(rows) == {"s01-fast", "s02-slow"}
    for r in rows.values():
        assert r["stop"] == "resolution" and r["bracket"] == [r["capacity"], r["capacity"] + 1], r
        assert r["binding"] == "tpot_p50<=64ms"
    fast, slow = rows["s01-fast"]["capacity"], rows["s02-slow"]["capacity"]
    print(f"\ncapacity at tpot_p50<=64ms: step time ×1 {fast}, ×2 {slow} (ratio {slow / fast:.2f})")
    assert 10 <= fast <= 14, fast  # the true 12.6, one step either way
    assert 0.35 <= slow / fast <= 0.65, (fast, slow)
