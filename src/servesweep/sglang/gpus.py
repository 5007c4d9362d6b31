"""GPU profiles: memory as `nvidia-smi` reports it, HBM bandwidth, bf16 FLOP/s, the tensor-parallel link and the
power limits NVML allows, by name and alias (`get_gpu("h200")`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class PowerLimits:
    """The board power limits of a GPU model, as NVML reports them: the limit it boots with
    (nvmlDeviceGetPowerManagementDefaultLimit, the TDP or board power) and the range a limit may be set within
    (nvmlDeviceGetPowerManagementLimitConstraints; `nvidia-smi -pl` refuses values outside it)."""

    default_w: float
    min_w: float
    max_w: float
    source: str
    # The power model's two levels (the emulator's sim/power.py; the planner's estimate under a limit): a GPU a serving
    # process holds with no kernel running, and a fully compute-bound step at the clock the default limit allows.
    idle_w: float = 0.0
    load_w: float = 0.0

    def problem(self, watts: float) -> str | None:
        """Why `watts` cannot be this GPU's power limit, or None."""
        if not self.min_w <= watts <= self.max_w:
            return f"{watts:g} W is outside the allowed range {self.min_w:g}-{self.max_w:g} W"
        return None

    def cap_share(self, limit_w: float) -> float | None:
        """The share of the dynamic range (load - idle) a limit leaves a step (StepModel.set_power); None where it
        leaves all of it."""
        if limit_w >= self.load_w or self.load_w <= self.idle_w:
            return None
        return (limit_w - self.idle_w) / (self.load_w - self.idle_w)


@dataclass(frozen=True, slots=True)
class GpuProfile:
    name: str
    memory_mib: int  # what `nvidia-smi --query-gpu=memory.total` reports; SGLang sizes defaults from it
    hbm_bandwidth: float  # bytes/s
    bf16_flops: float  # dense FLOP/s
    interconnect_bandwidth: float  # bytes/s per GPU for tensor-parallel all-reduce (NVLink or PCIe)
    interconnect_latency: float  # seconds per all-reduce call (launch + sync)
    power: PowerLimits | None = None  # None: unknown, so no power limit can be planned for it

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MiB


_H200_POWER = PowerLimits(
    700.0,
    200.0,
    700.0,
    "measured: NVML on the H200 test machine (driver 580.159.04, 2026-12-02)",
    idle_w=120.0,
    load_w=700.0,
)
_H200 = GpuProfile("H200", 143771, 4.8e12, 989.5e12, 450e9, 12e-6, _H200_POWER)
# The H100 SXM is the same GH100 die on the same board as the H200 (bf16 FLOP/s, NVLink 4, all-reduce latency, the
# 200-700 W range): only its HBM (less, slower) and its idle draw differ.
_H100 = replace(
    _H200,
    name="H100",
    memory_mib=81559,
    hbm_bandwidth=3.35e12,
    power=replace(
        _H200_POWER,
        source="700 W TDP: NVIDIA H100 SXM datasheet; the 200 W floor assumed as H200's",
        idle_w=70.0,
    ),
)

GPU_PROFILES: dict[str, GpuProfile] = {
    "H200": _H200,
    "H100": _H100,
    "RTX PRO 6000 Blackwell": GpuProfile(
        "RTX PRO 6000 Blackwell",
        97887,
        1.792e12,
        503.8e12,
        64e9,
        18e-6,
        PowerLimits(
            600.0,
            150.0,
            600.0,
            "600 W TBP: NVIDIA RTX PRO 6000 Blackwell datasheet; the floor assumed",
            idle_w=30.0,
            load_w=600.0,
        ),
    ),
    "RTX A6000": GpuProfile(
        "RTX A6000",
        49140,
        768e9,
        154.8e12,
        25e9,
        20e-6,
        PowerLimits(
            300.0,
            100.0,
            300.0,
            "300 W board power: NVIDIA RTX A6000 datasheet; the floor assumed",
            idle_w=22.0,
            load_w=300.0,
        ),
    ),
}
_GPU_ALIASES = {
    "h200": "H200",
    "h200sxm": "H200",
    "h200141gb": "H200",
    "h100": "H100",
    "h100sxm": "H100",
    "h10080gb": "H100",
    "h100sxm80gb": "H100",
    "rtxpro6000blackwell": "RTX PRO 6000 Blackwell",
    "rtxpro6000": "RTX PRO 6000 Blackwell",
    "pro6000": "RTX PRO 6000 Blackwell",
    "rtxpro6000blackwellserveredition": "RTX PRO 6000 Blackwell",
    "rtxpro6000blackwellworkstationedition": "RTX PRO 6000 Blackwell",
    "rtx6000blackwell": "RTX PRO 6000 Blackwell",
    "rtxa6000": "RTX A6000",
    "a6000": "RTX A6000",
}


def get_gpu(name: str | None) -> GpuProfile:
    if name is None or name == "":
        return GPU_PROFILES["H200"]
    key = re.sub(r"[^a-z0-9]", "", name.lower()).removeprefix("nvidia")
    if key in _GPU_ALIASES:
        return GPU_PROFILES[_GPU_ALIASES[key]]
    raise ValueError(
        f"unknown GPU profile {name!r}; known: {', '.join(GPU_PROFILES)} "
        f"(aliases: {', '.join(sorted(_GPU_ALIASES))})"
    )


def power_limit_problem(gpu_name: str | None, watts: float) -> str | None:
    """Why `watts` cannot be set as the power limit of GPU `gpu_name` (a profile name or alias), or None: the planner's
    check of a `gpu_power_limit_w` axis value."""
    try:
        gpu = get_gpu(gpu_name)
    except ValueError as e:
        return str(e)
    if gpu.power is None:
        return f"no power limits known for {gpu.name}"
    why = gpu.power.problem(watts)
    return f"{gpu.name}: {why} (NVML's limit constraints; {gpu.power.source})" if why else None


# The server axis that sets the GPUs' power limit (W) before the server starts: a setting of the host, not a server
# flag (the sglang_server role applies it: tasks/power_limit.yml, files/gpu_power_limit.py; docs/gpu-telemetry.md)
POWER_LIMIT_AXIS = "gpu_power_limit_w"
