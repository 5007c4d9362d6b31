"""GPU telemetry on a real GPU (the H200 test machine): the role's NVML sampler (gpu_sampler.py) runs beside a
load; for each phase its energy counter is compared with the integral of its power samples and with nvidia-smi's
power readings over the same window, and joules per output token are measured for generation at several batch
sizes (a random-weight Qwen3-architecture model, transformers' generate: no server, no tokenizer needed).

Read only: no GPU setting is changed (the power limit is read, never set).

  python3 bench/gpu/bench_gpu_energy.py --out DIR [--matmul-s 20] [--batches 1,16,64] [--new-tokens 256]

Writes DIR/gpu_energy.json (every phase's figures) and DIR/samples.jsonl; prints one table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from servesweep.results.energy import gpu_energy  # noqa: E402  (stdlib only)

SAMPLER = ROOT / "ansible" / "roles" / "sglang_server" / "files" / "gpu_sampler.py"


def samples(url: str, since: float) -> list[dict]:
    with urllib.request.urlopen(f"{url}/samples?since={since}", timeout=10) as r:
        return json.loads(r.read())["samples"]


def smi_energy(rows: list[tuple[float, float]], a: float, b: float) -> float | None:
    """Trapezoid integral of nvidia-smi's power.draw readings over [a, b]."""
    pts = [(t, p) for t, p in rows if a <= t <= b]
    if len(pts) < 2:
        return None
    return (
        sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(pts, pts[1:], strict=False))
        + pts[0][1] * (pts[0][0] - a)
        + pts[-1][1] * (b - pts[-1][0])
    )


def _version(md, name: str) -> str:
    try:
        return md.version(name)
    except Exception:
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--matmul-s", type=float, default=20.0)
    ap.add_argument("--idle-s", type=float, default=6.0)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--interval", type=float, default=0.25)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = out / "sampler"
    r = subprocess.run(
        [
            sys.executable,
            str(SAMPLER),
            "--state",
            "started",
            "--workdir",
            str(work),
            "--source",
            "nvml",
            "--interval",
            str(a.interval),
            "--watch-pid",
            str(os.getpid()),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    print("sampler:", r.stdout.strip(), r.stderr.strip()[-500:], flush=True)
    info = json.loads(r.stdout)
    if not info.get("running"):
        return 1
    url = info["url"]
    smi_log = open(out / "nvidia-smi.csv", "w")
    smi = subprocess.Popen(
        [
            "nvidia-smi",
            "--query-gpu=timestamp,power.draw,clocks.sm,utilization.gpu",
            "--format=csv,noheader,nounits",
            "-lms",
            "200",
        ],
        stdout=smi_log,
    )
    smi_t: list[tuple[float, float]] = []

    import torch

    phases: list[dict] = []
    t_begin = time.time()

    def phase(name: str, fn, **extra) -> None:
        time.sleep(a.idle_s)  # idle before: the baseline
        t0 = time.time()
        res = fn() or {}
        torch.cuda.synchronize()
        t1 = time.time()
        phases.append({"phase": name, "start": t0, "end": t1, **extra, **res})
        print(f"{name}: {t1 - t0:.2f} s {res}", flush=True)

    dev = torch.device("cuda")
    mats = [torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) for _ in range(2)]

    def matmul():
        end = time.time() + a.matmul_s
        n = 0
        while time.time() < end:
            for _ in range(20):
                mats[0] @ mats[1]
            torch.cuda.synchronize()
            n += 20
        return {"matmuls": n, "tflops": 2 * 8192**3 * n / a.matmul_s / 1e12}

    phase("matmul_bf16_8192", matmul)
    mats.clear()
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        num_hidden_layers=28,
        hidden_size=2048,
        intermediate_size=6144,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    with torch.device(dev):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
    params = sum(p.numel() for p in model.parameters())
    prompt = 512
    for b in [int(v) for v in a.batches.split(",")]:
        ids = torch.randint(0, cfg.vocab_size, (b, prompt), device=dev)

        def gen(ids=ids, b=b):
            with torch.no_grad():
                o = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=a.new_tokens,
                    min_new_tokens=a.new_tokens,
                    do_sample=False,
                    pad_token_id=0,
                )
            return {"output_tokens": int((o.shape[1] - prompt) * b), "prompt_tokens": prompt * b}

        phase(f"generate_batch_{b}", gen, batch=b)
    time.sleep(2.0)
    smi.terminate()
    smi.wait()
    smi_log.close()
    for line in (out / "nvidia-smi.csv").read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            ts = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S")) + float(
                "0." + parts[0].split(".")[1]
            )
            smi_t.append((ts, float(parts[1])))
        except (ValueError, IndexError):
            pass
    got = samples(url, t_begin - 5)
    with open(out / "samples.jsonl", "w") as f:
        for s in got:
            f.write(json.dumps(s) + "\n")
    subprocess.run([sys.executable, str(SAMPLER), "--state", "stopped", "--workdir", str(work)], check=False)
    rows = []
    for p in phases:
        g = gpu_energy(got, p["start"], p["end"], idle_window_s=a.idle_s)[0]
        e = g["energy_j"]
        smi_j = smi_energy(smi_t, p["start"], p["end"])
        row = {
            **p,
            "energy_counter_j": e,
            "energy_integrated_j": g["energy_integrated_j"],
            "counter_vs_integrated_pct": g["counter_vs_integrated_pct"],
            "energy_nvidia_smi_j": smi_j,
            "counter_vs_nvidia_smi_pct": (smi_j - e) / e * 100 if smi_j and e else None,
            "idle_w": g["idle_w"],
            "energy_above_idle_j": g["energy_above_idle_j"],
            "power_avg_w": g["power_avg_w"],
            "power_peak_w": g["power_peak_w"],
            "util_mean_pct": g["util_mean_pct"],
            "sm_clock_min_mhz": g["sm_clock_min_mhz"],
            "sm_clock_mean_mhz": g["sm_clock_mean_mhz"],
            "temp_max_c": g["temp_max_c"],
            "throttle": g["throttle"],
            "power_capped_fraction": g["power_capped_fraction"],
            "power_limit_w": g["power_limit_w"],
            "samples": g["samples"],
        }
        if p.get("output_tokens"):
            row["joules_per_output_token"] = e / p["output_tokens"]
            row["joules_per_output_token_above_idle"] = (g["energy_above_idle_j"] or 0) / p["output_tokens"]
            row["joules_per_token"] = e / (p["output_tokens"] + p["prompt_tokens"])
            row["output_tokens_per_s"] = p["output_tokens"] / (p["end"] - p["start"])
        rows.append(row)
    import importlib.metadata as md

    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "sampler": info,
        "versions": {k: _version(md, k) for k in ("nvidia-ml-py", "torch", "transformers")},
        "gpu": got[-1]["gpus"][0]["name"] if got else "",
        "model_params": params,
        "phases": rows,
    }
    (out / "gpu_energy.json").write_text(json.dumps(doc, indent=1))
    for r_ in rows:
        print(
            json.dumps(
                {
                    k: (round(v, 3) if isinstance(v, float) else v)
                    for k, v in r_.items()
                    if k not in ("start", "end")
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
