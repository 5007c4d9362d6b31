"""The emulator's GPU power model and its NVML-shaped stand-in (`GET /sim/gpu`, read by the sampler of
ansible/roles/sglang_server/files/gpu_sampler.py where there is no NVIDIA driver; docs/gpu-telemetry.md).

Model, per GPU of the server (tp x dp x pp of them, all alike: the engine is one fluid model of its ranks):
    utilization u = the engine's busy share of the last ~1 s (Engine.c_busy_s: clock seconds spent in steps)
    power P = idle_w + u * (load_w - idle_w), capped at the power limit (default: the TDP)
    energy counter (mJ) = the exact integral of P between reads (each read advances it), as NVML's counter does
SM clock: boost_mhz, capped_mhz while the power cap binds (demand at or above 98% of the limit: the H200 was
measured at a mean 1,482 MHz, 98% utilization, at its 700 W limit) and under a throttle fault. Temperature: 30 degrees C plus 45 at
the TDP. Throttle fault (`--sim-gpu-throttle power|thermal`, or POST /sim/gpu {"throttle": ...}): the matching
NVML clock-event reason is set while the GPU is busy, the SM clock falls to throttled_ratio of boost, and a thermal
one reads 90 degrees C. The step time is not changed by the cap or a fault (a documented gap).

load_w is the power at 100% utilization; real serving (memory-bound decode) draws less than a compute-bound matmul
at the same NVML utilization, so these figures are an upper bound until fitted to a measured server.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

# NVML clock-event reasons (nvml.h)
SW_POWER_CAP = 0x4
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
GPU_IDLE = 0x1
THROTTLES = {"power": SW_POWER_CAP, "thermal": HW_THERMAL_SLOWDOWN}
WINDOW_S = 1.0  # the averaging window of power and utilization, like NVML's ~1 s power average


@dataclass(frozen=True, slots=True)
class PowerProfile:
    name: str  # the GPU profile's name (servesweep.sglang.gpus)
    idle_w: float
    load_w: float  # at 100% utilization
    tdp_w: float  # the default power limit
    min_limit_w: float  # the range NVML allows (nvmlDeviceGetPowerManagementLimitConstraints)
    max_limit_w: float
    boost_mhz: int
    capped_mhz: int  # at the power cap
    mem_clock_mhz: int
    source: str


POWER_PROFILES: dict[str, PowerProfile] = {
    # idle: a serving process holds a CUDA context and most of the memory, which the idle draw shows (BENCHMARKS.md)
    "H200": PowerProfile(
        "H200",
        120.0,
        700.0,
        700.0,
        200.0,
        700.0,
        1980,
        1480,
        3201,
        "measured on the H200 test machine: idle 78-86 W with no process on the GPU (2026-12-02, 2026-12-04) and "
        "118-123 W between loads while a process held its CUDA context (2026-12-04, BENCHMARKS.md 'GPU telemetry'); "
        "685 W average, SM clock 1,380-1,665 MHz (mean 1,482) under a bf16 matmul at the 700 W limit; memory clock "
        "3,201 MHz; allowed limits 200-700 W (NVML); 700 W TDP: NVIDIA H200 SXM datasheet",
    ),
    "H100": PowerProfile(
        "H100",
        70.0,
        700.0,
        700.0,
        200.0,
        700.0,
        1980,
        1755,
        2619,
        "700 W TDP: NVIDIA H100 SXM datasheet; idle and capped clock assumed (not measured here)",
    ),
    "RTX PRO 6000 Blackwell": PowerProfile(
        "RTX PRO 6000 Blackwell",
        30.0,
        600.0,
        600.0,
        150.0,
        600.0,
        2617,
        2280,
        14001,
        "600 W TBP: NVIDIA RTX PRO 6000 Blackwell datasheet; idle, clocks and limit range assumed",
    ),
    "RTX A6000": PowerProfile(
        "RTX A6000",
        22.0,
        300.0,
        300.0,
        100.0,
        300.0,
        1800,
        1560,
        8001,
        "300 W board power: NVIDIA RTX A6000 datasheet; idle, clocks and limit range assumed",
    ),
}


def power_profile(gpu_name: str) -> PowerProfile:
    try:
        return POWER_PROFILES[gpu_name]
    except KeyError:
        raise ValueError(
            f"no power profile for GPU {gpu_name!r}; known: {', '.join(POWER_PROFILES)}"
        ) from None


def demand_w(p: PowerProfile, util: float) -> float:
    """The model's power at utilization util (0..1), before the power limit."""
    return p.idle_w + min(1.0, max(0.0, util)) * (p.load_w - p.idle_w)


class GpuMeter:
    """The stand-in NVML of an emulated server: `read()` returns NVML's fields per GPU; thread-safe."""

    def __init__(
        self,
        gpu_name: str,
        n_gpus: int,
        busy_s: Callable[[], float],
        *,
        memory_total_bytes: int,
        memory_used_bytes: int,
        power_limit_w: float | None = None,
        throttle: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.profile = power_profile(gpu_name)
        self.n = max(1, int(n_gpus))
        self._busy_s = busy_s
        self._clock = clock
        self.mem_total = int(memory_total_bytes)
        self.mem_used = int(memory_used_bytes)
        self.power_limit_w = self.profile.tdp_w
        self.throttle: str | None = None
        self.configure(power_limit_w=power_limit_w, throttle=throttle)
        self._lock = threading.Lock()
        self._t = clock()
        self._busy = busy_s()
        self._energy_j = 0.0  # per GPU, since the meter started (NVML: since the driver loaded)
        self._snaps: deque[tuple[float, float, float]] = deque([(self._t, self._busy, 0.0)])

    def configure(self, *, power_limit_w: float | None = None, throttle: str | None = None) -> None:
        p = self.profile
        if power_limit_w is not None:
            if not p.min_limit_w <= power_limit_w <= p.max_limit_w:
                raise ValueError(
                    f"power limit {power_limit_w:g} W is outside {p.name}'s range {p.min_limit_w:g}-{p.max_limit_w:g} W"
                )
            self.power_limit_w = float(power_limit_w)
        if throttle is not None:
            if throttle not in ("none", *THROTTLES):
                raise ValueError(f"throttle {throttle!r}: none, {', '.join(THROTTLES)}")
            self.throttle = None if throttle == "none" else throttle

    def _advance(self, now: float) -> None:
        busy = self._busy_s()
        dt = now - self._t
        if dt > 0:
            u = min(1.0, max(0.0, (busy - self._busy) / dt))
            self._energy_j += min(self.power_limit_w, demand_w(self.profile, u)) * dt
            self._t, self._busy = now, busy
            self._snaps.append((now, busy, self._energy_j))
            while len(self._snaps) > 2 and self._snaps[1][0] <= now - WINDOW_S:
                self._snaps.popleft()

    def read(self) -> dict:
        p = self.profile
        with self._lock:
            now = self._clock()
            self._advance(now)
            t0, b0, e0 = self._snaps[0]
            span = now - t0
            if span > 1e-6:
                util = min(1.0, max(0.0, (self._busy - b0) / span))
                power = (self._energy_j - e0) / span
            else:
                util, power = 0.0, p.idle_w
            energy_mj = int(self._energy_j * 1000)
        reasons = GPU_IDLE if util <= 0.0 else 0
        sm = p.boost_mhz if util > 0 else 345  # an idle Hopper parks its SM clock low
        if util > 0 and demand_w(p, util) >= 0.98 * self.power_limit_w:
            reasons |= SW_POWER_CAP
            sm = p.capped_mhz
        temp = 30.0 + 45.0 * power / p.tdp_w
        if self.throttle is not None and util > 0:
            reasons |= THROTTLES[self.throttle]
            sm = int(p.boost_mhz * 0.6)
            if self.throttle == "thermal":
                temp = 90.0
        gpus = [
            {
                "index": i,
                "name": f"NVIDIA {p.name} (servesweep sim)",
                "uuid": f"GPU-00000000-5e5e-0000-0000-{i:012d}",
                "util_pct": round(util * 100),
                "mem_util_pct": round(util * 60),
                "mem_used_bytes": self.mem_used,
                "mem_total_bytes": self.mem_total,
                "sm_clock_mhz": sm,
                "mem_clock_mhz": p.mem_clock_mhz,
                "power_w": round(power, 3),
                "power_limit_w": self.power_limit_w,
                "temp_c": round(temp),
                "throttle_reasons": reasons,
                "energy_mj": energy_mj,
            }
            for i in range(self.n)
        ]
        return {"source": "servesweep sim power model (sim/power.py)", "profile": p.source, "gpus": gpus}


# dcgm-exporter's names for NVML's fields (its etc/default-counters.csv, plus the clock-event reasons and the power
# limit, which a user adds to the counters file): name -> (field, divisor, help)
DCGM_FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", 1, "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "mem_clock_mhz", 1, "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "temp_c", 1, "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w", 1, "Power draw (in W)."),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "power_limit_w", 1, "Power management limit (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "energy_mj", 1, "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_GPU_UTIL", "util_pct", 1, "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "mem_util_pct", 1, "Memory utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "mem_used_bytes", 1 << 20, "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "throttle_reasons", 1, "Current clock throttle reasons."),
)


def dcgm_text(doc: dict, hostname: str = "servesweep-sim") -> str:
    """`GpuMeter.read()`'s document as a dcgm-exporter's /metrics (GET /sim/dcgm): its metric names and labels."""
    out = []
    for name, field, div, help_ in DCGM_FIELDS:
        out.append(f"# HELP {name} {help_}\n# TYPE {name} {'counter' if field == 'energy_mj' else 'gauge'}\n")
        for g in doc["gpus"]:
            v = g[field] / div
            val = str(int(v)) if float(v).is_integer() else repr(float(v))
            out.append(
                f'{name}{{gpu="{g["index"]}",UUID="{g["uuid"]}",device="nvidia{g["index"]}",'
                f'modelName="{g["name"]}",Hostname="{hostname}"}} {val}\n'
            )
    name = "DCGM_FI_DEV_FB_FREE"
    out.append(f"# HELP {name} Framebuffer memory free (in MiB).\n# TYPE {name} gauge\n")
    for g in doc["gpus"]:
        free = (g["mem_total_bytes"] - g["mem_used_bytes"]) >> 20
        out.append(
            f'{name}{{gpu="{g["index"]}",UUID="{g["uuid"]}",device="nvidia{g["index"]}",'
            f'modelName="{g["name"]}",Hostname="{hostname}"}} {free}\n'
        )
    return "".join(out)
