"""GPU profiles: memory as `nvidia-smi` reports it, HBM bandwidth, bf16 FLOP/s and the tensor-parallel link, by
name and alias (`get_gpu("h200")`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class GpuProfile:
    name: str
    memory_mib: int  # what `nvidia-smi --query-gpu=memory.total` reports; SGLang sizes defaults from it
    hbm_bandwidth: float  # bytes/s
    bf16_flops: float  # dense FLOP/s
    interconnect_bandwidth: float  # bytes/s per GPU for tensor-parallel all-reduce (NVLink or PCIe)
    interconnect_latency: float  # seconds per all-reduce call (launch + sync)

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MiB


GPU_PROFILES: dict[str, GpuProfile] = {
    "H200": GpuProfile("H200", 143771, 4.8e12, 989.5e12, 450e9, 12e-6),
    "H100": GpuProfile("H100", 81559, 3.35e12, 989.5e12, 450e9, 12e-6),
    "RTX PRO 6000 Blackwell": GpuProfile("RTX PRO 6000 Blackwell", 97887, 1.792e12, 503.8e12, 64e9, 18e-6),
    "RTX A6000": GpuProfile("RTX A6000", 49140, 768e9, 154.8e12, 25e9, 20e-6),
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
