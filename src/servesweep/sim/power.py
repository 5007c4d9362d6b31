"""The emulator's GPU power model and its NVML-shaped stand-ins: `GET /sim/gpu` (read by the sampler of
ansible/roles/sglang_server/files/gpu_sampler.py where there is no NVIDIA driver) and `SimNvml` (the NVML calls the
role's power-limit script makes, over a state file the emulator reads: files/gpu_power_limit.py); docs/gpu-telemetry.md.

Model, per GPU of the server (tp x dp x pp of them, all alike: the engine is one fluid model of its ranks):
    utilization u = the engine's busy share of the last ~1 s (Engine.c_busy_s: clock seconds spent in steps)
    power P = idle_w + u * s * (load_w - idle_w), capped at the power limit, where s is the busy steps' mean power
        share from the step model (StepModel.acct; 1 without it): a step draws (1 - a) * mem_share + a * r^3 of the
        dynamic range, a its compute share, r its SM clock ratio (sglang/stepmodel.py)
    energy counter (mJ) = the exact integral of P between reads (each read advances it), as NVML's counter does
SM clock: boost_mhz while no cap binds; capped_mhz x the steps' mean clock ratio while most busy time ran at the
cap (the H200 was measured at a mean 1,482 MHz, 98 % utilization, at its 700 W limit under a bf16 matmul).
Temperature: 30 degrees C plus 45 at the TDP. Throttle fault (`--sim-gpu-throttle power|thermal`, or POST /sim/gpu
{"throttle": ...}): the matching NVML clock-event reason is set while the GPU is busy, the SM clock falls to 60 % of
boost, and a thermal one reads 90 degrees C (the fault flags telemetry; it does not slow the steps).

The power limit (`--sim-gpu-power-limit W`, POST /sim/gpu {"power_limit_w": W}, or the NVML stand-in's state file,
`--sim-nvml-state PATH`, that `SimNvml.nvmlDeviceSetPowerManagementLimit` writes): the step model prices every step
under it (StepModel.set_power): a compute-bound step whose power would pass the limit runs at the SM clock that
fits, r = ((limit - idle) / (load - idle))^(1/3) for a fully compute-bound one (H200: 0.94 at 600 W, 0.83 at 450 W,
0.68 at 300 W), and its compute time grows by 1/r; a memory-bound decode step draws mem_share (0.30) of the range
and slows only once the limit leaves less than that. Sources: CMOS dynamic power C V^2 f with the voltage following
the clock on the DVFS curve (so ~f^3; Mei, Wang and Chu, "A survey and measurement study of GPU DVFS on energy
conservation", Digital Communications and Networks 3(2), 2017, measure GPU power rising faster than linearly with
the core clock); HBM bandwidth does not follow the SM clock, so memory-bound decode keeps its speed under a cap
while compute-bound prefill loses it (Patel et al., "Characterizing Power Management Opportunities for LLMs in the
Cloud", ASPLOS 2024: the prompt phase is sensitive to power/frequency caps, the token phase far less); mem_share
from the H200 serving run of BENCHMARKS.md (280 W at 90 % utilization over a 126 W idle, memory-bound decode).

load_w is the draw of a fully compute-bound step at the clock the step model's calibration assumes (the default
limit, where the H200 sits at its 700 W cap under a matmul); real serving draws less: the step model's power share.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from servesweep.sglang.gpus import PowerLimits, get_gpu

if TYPE_CHECKING:
    from servesweep.sglang.stepmodel import StepModel

# NVML clock-event reasons (nvml.h)
SW_POWER_CAP = 0x4
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
GPU_IDLE = 0x1
THROTTLES = {"power": SW_POWER_CAP, "thermal": HW_THERMAL_SLOWDOWN}
WINDOW_S = 1.0  # the averaging window of power and utilization, like NVML's ~1 s power average


@dataclass(frozen=True, slots=True)
class PowerProfile:
    name: (
        str  # the GPU profile's name (servesweep.sglang.gpus): its power limits, idle_w and load_w live there
    )
    boost_mhz: int
    capped_mhz: int  # a fully compute-bound step at the default limit
    mem_clock_mhz: int
    source: str

    @property
    def limits(self) -> PowerLimits:
        lim = get_gpu(self.name).power
        assert lim is not None, f"{self.name}: no power limits in its GPU profile"
        return lim

    @property
    def idle_w(self) -> float:
        return self.limits.idle_w

    @property
    def load_w(self) -> float:
        """A fully compute-bound step at the default limit's clock."""
        return self.limits.load_w

    @property
    def tdp_w(self) -> float:
        """The default power limit (the limit the GPU boots with)."""
        return self.limits.default_w

    @property
    def min_limit_w(self) -> float:
        return self.limits.min_w

    @property
    def max_limit_w(self) -> float:
        return self.limits.max_w

    def cap_share(self, limit_w: float) -> float | None:
        """The share of the dynamic range (load - idle) a limit leaves; None where it leaves all of it."""
        return self.limits.cap_share(limit_w)


POWER_PROFILES: dict[str, PowerProfile] = {
    # idle: a serving process holds a CUDA context and most of the memory, which the idle draw shows (BENCHMARKS.md)
    "H200": PowerProfile(
        "H200",
        1980,
        1480,
        3201,
        "measured on the H200 test machine: idle 78-86 W with no process on the GPU (2026-12-02, 2026-12-04) and "
        "118-126 W between loads while a process held its CUDA context (2026-12-04, BENCHMARKS.md 'GPU telemetry'); "
        "685 W average, SM clock 1,380-1,665 MHz (mean 1,482) under a bf16 matmul at the 700 W limit; memory clock "
        "3,201 MHz; serving (transformers serve, memory-/launch-bound decode) 280 W at 90 % utilization; allowed "
        "limits 200-700 W (NVML); 700 W TDP: NVIDIA H200 SXM datasheet",
    ),
    "H100": PowerProfile(
        "H100",
        1980,
        1755,
        2619,
        "700 W TDP: NVIDIA H100 SXM datasheet; idle and capped clock assumed (not measured here)",
    ),
    "RTX PRO 6000 Blackwell": PowerProfile(
        "RTX PRO 6000 Blackwell",
        2617,
        2280,
        14001,
        "600 W TBP: NVIDIA RTX PRO 6000 Blackwell datasheet; idle, clocks and limit range assumed",
    ),
    "RTX A6000": PowerProfile(
        "RTX A6000",
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
    """The stand-in NVML of an emulated server: `read()` returns NVML's fields per GPU; thread-safe. `model`: the
    engine's step model (its power shares, clock ratios and cap time; without it a busy GPU draws load_w);
    `nvml_state`: the SimNvml state file whose power limits (of GPUs 0..n-1, the lowest) this server runs under,
    re-read when it changes, as a GPU obeys `nvidia-smi -pl` at run time."""

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
        model: StepModel | None = None,
        nvml_state: str | Path | None = None,
    ):
        self.profile = power_profile(gpu_name)
        self.n = max(1, int(n_gpus))
        self._busy_s = busy_s
        self._clock = clock
        self.model = model
        self.mem_total = int(memory_total_bytes)
        self.mem_used = int(memory_used_bytes)
        self.power_limit_w = self.profile.tdp_w
        self.throttle: str | None = None
        self.nvml = SimNvml(nvml_state, gpu_name) if nvml_state else None
        self._state_seen: float | None = None
        self._sync_state()
        self.configure(power_limit_w=power_limit_w, throttle=throttle)
        self._lock = threading.Lock()
        self._t = clock()
        self._busy = busy_s()
        self._acct = self._model_acct()
        self._share = 1.0 if model is None else 0.0  # the busy steps' mean power share, kept between steps
        self._energy_j = 0.0  # per GPU, since the meter started (NVML: since the driver loaded)
        self._snaps: deque[tuple[float, float, float, tuple[float, ...]]] = deque(
            [(self._t, self._busy, 0.0, self._acct)]
        )

    def _model_acct(self) -> tuple[float, ...]:
        return tuple(self.model.track_power()) if self.model is not None else (0.0, 0.0, 0.0, 0.0)

    def _set_limit(self, watts: float) -> None:
        self.power_limit_w = float(watts)
        if self.model is not None:
            self.model.set_power(self.profile.cap_share(self.power_limit_w))

    def watch_state(self, every_s: float = 0.25) -> None:
        """Follow the stand-in's state file from a daemon thread too, so that a limit set while the server runs
        slows its steps even when nobody reads /sim/gpu (as a GPU obeys `nvidia-smi -pl` at run time)."""
        if self.nvml is None:
            return

        def loop() -> None:
            while True:
                time.sleep(every_s)
                with self._lock:
                    self._sync_state()

        threading.Thread(target=loop, name="sim-nvml-state", daemon=True).start()

    def sync_state(self) -> None:
        with self._lock:
            self._sync_state()

    def _sync_state(self) -> None:
        """Follow the NVML stand-in's state file: the lowest limit of this server's GPUs."""
        if self.nvml is None:
            return
        seen = self.nvml.mtime()
        if seen == self._state_seen:
            return
        self._state_seen = seen
        limits = self.nvml.limits_w()
        self._set_limit(min(limits.get(i, self.profile.tdp_w) for i in range(self.n)))

    def configure(self, *, power_limit_w: float | None = None, throttle: str | None = None) -> None:
        p = self.profile
        if power_limit_w is not None:
            if p.limits.problem(float(power_limit_w)) is not None:
                raise ValueError(
                    f"power limit {power_limit_w:g} W is outside {p.name}'s range "
                    f"{p.min_limit_w:g}-{p.max_limit_w:g} W"
                )
            self._set_limit(float(power_limit_w))
        if throttle is not None:
            if throttle not in ("none", *THROTTLES):
                raise ValueError(f"throttle {throttle!r}: none, {', '.join(THROTTLES)}")
            self.throttle = None if throttle == "none" else throttle

    def _advance(self, now: float) -> None:
        busy = self._busy_s()
        dt = now - self._t
        if dt > 0:
            u = min(1.0, max(0.0, (busy - self._busy) / dt))
            acct = self._model_acct()
            priced = acct[0] - self._acct[0]
            if priced > 0:
                self._share = (acct[1] - self._acct[1]) / priced
            p = self.profile
            power = p.idle_w + u * self._share * (p.load_w - p.idle_w)
            self._energy_j += min(self.power_limit_w, power) * dt
            self._t, self._busy, self._acct = now, busy, acct
            self._snaps.append((now, busy, self._energy_j, acct))
            while len(self._snaps) > 2 and self._snaps[1][0] <= now - WINDOW_S:
                self._snaps.popleft()

    def read(self) -> dict:
        p = self.profile
        with self._lock:
            self._sync_state()
            now = self._clock()
            self._advance(now)
            t0, b0, e0, a0 = self._snaps[0]
            span = now - t0
            if span > 1e-6:
                util = min(1.0, max(0.0, (self._busy - b0) / span))
                power = (self._energy_j - e0) / span
            else:
                util, power = 0.0, p.idle_w
            energy_mj = int(self._energy_j * 1000)
            a1 = self._acct
        priced = a1[0] - a0[0]
        reasons = GPU_IDLE if util <= 0.0 else 0
        sm = p.boost_mhz if util > 0 else 345  # an idle Hopper parks its SM clock low
        if self.model is not None:
            # most of the window's busy time ran at the cap: capped, at the steps' mean clock ratio
            if util > 0 and priced > 0 and (a1[3] - a0[3]) >= 0.5 * priced:
                reasons |= SW_POWER_CAP
                sm = round(p.capped_mhz * (a1[2] - a0[2]) / priced)
        elif util > 0 and demand_w(p, util) >= 0.98 * self.power_limit_w:
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
                "uuid": sim_uuid(i),
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


def sim_uuid(index: int) -> str:
    return f"GPU-00000000-5e5e-0000-0000-{index:012d}"


# ---------------------------------------------------------------------------------------------------------------
# The NVML stand-in of an emulated host: the calls the sglang_server role's power-limit script makes
# (files/gpu_power_limit.py --nvml sim:STATE), over a state file that the emulator's GpuMeter follows.

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4


class NVMLError(Exception):
    """pynvml's NVMLError: `value` is NVML's return code."""

    def __init__(self, value: int):
        self.value = value
        names = {2: "Invalid Argument", 3: "Not Supported", 4: "Insufficient Permissions"}
        super().__init__(names.get(value, f"NVML error {value}"))


class SimNvml:
    """pynvml's power-limit calls for an emulated host of `count` GPUs of `gpu_name` (handles are indexes). The
    state file holds {"gpu", "count", "limits_mw": {index: mW}, "deny_set": bool}; a missing file is a host whose
    GPUs boot at their default limit. `deny_set` makes every set fail as an unprivileged user's does
    (NVML_ERROR_NO_PERMISSION). Limits outside the GPU profile's range are refused (NVML_ERROR_INVALID_ARGUMENT);
    accepted ones are stored in whole watts, as the H200's driver reports them."""

    SIM = True  # no nvidia-smi behind it
    NVMLError = NVMLError
    NVML_ERROR_INVALID_ARGUMENT = NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION

    def __init__(self, path: str | Path, gpu_name: str | None = None, count: int = 8):
        self.path = Path(path)
        doc = self._load()
        self.gpu = get_gpu(doc.get("gpu") or gpu_name)
        self.count = int(doc.get("count") or count)
        lim = self.gpu.power
        if lim is None:
            raise ValueError(f"{self.gpu.name}: no power limits in its GPU profile")
        self.lim = lim

    def _load(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, doc: dict) -> None:
        tmp = self.path.with_name(self.path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(doc, sort_keys=True))
        os.replace(tmp, self.path)

    def mtime(self) -> float | None:
        try:
            return self.path.stat().st_mtime_ns / 1e9
        except OSError:
            return None

    def limits_w(self) -> dict[int, float]:
        got = {int(k): v / 1000.0 for k, v in (self._load().get("limits_mw") or {}).items()}
        return {i: got.get(i, self.lim.default_w) for i in range(self.count)}

    def _h(self, h: int) -> int:
        if not 0 <= int(h) < self.count:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return int(h)

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return self._h(i)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> int:
        u = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i in range(self.count):
            if sim_uuid(i) == u:
                return i
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetName(self, h: int) -> str:
        return f"NVIDIA {self.gpu.name} (servesweep sim)"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return sim_uuid(self._h(h))

    def nvmlDeviceGetPowerManagementLimit(self, h: int) -> int:
        return round(self.limits_w()[self._h(h)] * 1000)

    nvmlDeviceGetEnforcedPowerLimit = nvmlDeviceGetPowerManagementLimit

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: int) -> int:
        self._h(h)
        return round(self.lim.default_w * 1000)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: int) -> tuple[int, int]:
        self._h(h)
        return round(self.lim.min_w * 1000), round(self.lim.max_w * 1000)

    def nvmlDeviceSetPowerManagementLimit(self, h: int, limit_mw: int) -> None:
        i = self._h(h)
        doc = self._load()
        if doc.get("deny_set"):
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        if not self.lim.min_w * 1000 <= limit_mw <= self.lim.max_w * 1000:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        doc.setdefault("gpu", self.gpu.name)
        doc.setdefault("count", self.count)
        doc.setdefault("limits_mw", {})[str(i)] = round(limit_mw / 1000) * 1000
        self._save(doc)


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
