#!/usr/bin/env python3
"""GPU telemetry beside the server: a small sampler the sglang_server role starts on the GPU host once the server is
ready, and that stops with it (docs/gpu-telemetry.md). Stdlib only, plus `pynvml` (nvidia-ml-py) where importable.

Sources (--source):
  nvml   NVML through pynvml: per GPU utilization, memory used/total, SM and memory clock, power draw, power limit,
         temperature, clock-event (throttle) reasons and the energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ
         since the driver loaded). A GPU without the counter gets the integral of its power draw instead, and its
         samples say so (energy_source "integrated_power"). Link traffic where NVML has it: PCIe and NVLink (all
         links) byte counters through nvmlDeviceGetFieldValues, and their rates between samples (*_bps);
         nvmlDeviceGetPcieThroughput's 20 ms rate where the PCIe counters are missing (hosts of up to two GPUs).
  URL    an NVML-shaped JSON document (the emulator's GET /sim/gpu): the same fields, read over HTTP.
  dcgm:URL  a dcgm-exporter's /metrics (e.g. dcgm:http://127.0.0.1:9400/metrics; the emulator's GET /sim/dcgm).
  auto   nvml when NVML answers, else --sim-url when given, else no source (the sampler does not start).
  --gpus I,J  only these GPUs (NVML index or UUID): the server's own where several share the host (packed runs).

  --state started   keep the sampler recorded in <workdir>/gpu_sampler.pid when it is alive and was started with
                    the same settings (the same server); otherwise stop it (if it is ours) and start a new one in its
                    own session: it samples every --interval seconds (default 0.5: 2 Hz), keeps the last
                    --keep-s seconds in memory, appends every sample to <workdir>/gpu_samples.jsonl (one rotation at
                    --max-file-mb, to .1), serves GET /metrics (Prometheus text), GET /samples?since=T&until=T (JSON,
                    wall-clock seconds) and GET /health on --bind:--port (0: a free port), and exits when the
                    --watch-pid process (the server's group leader) is gone, on SIGTERM, or when its source fails
                    for --max-failures samples in a row.
  --state stopped   stop the recorded sampler.
The pidfile holds "PID STARTTIME" (the process's start time in clock ticks since boot, /proc/PID/stat field 22): a
pid is signalled only while it still names the process that was recorded. Prints one JSON object (changed, running,
pid, url, source, gpus, samples_file, reason); exit 1 with "error" when a step failed.
"""

import argparse
import collections
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PIDFILE = "gpu_sampler.pid"
READYFILE = "gpu_sampler.ready"
SAMPLES = "gpu_samples.jsonl"
LOG = "gpu_sampler.log"
# NVML's clock-event reasons (nvml.h nvmlClocksEventReason*, formerly ClocksThrottleReason*)
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# the reasons that mean the GPU ran slower than its power limit allows (heat, HW slowdown, power brake); the power
# cap itself (0x4) is apart: servesweep_gpu_power_capped
THROTTLE_MASK = 0x8 | 0x20 | 0x40 | 0x80
POWER_CAP = 0x4
FIELDS = ("util_pct", "mem_util_pct", "mem_used_bytes", "mem_total_bytes", "sm_clock_mhz", "mem_clock_mhz",
          "power_w", "power_limit_w", "temp_c", "throttle_reasons", "energy_mj")
# link traffic, where NVML has it: byte counters since the driver loaded (the sampler turns two successive readings
# into the rates *_bps, bytes per second); a GPU or driver without them has None
LINK_COUNTERS = ("pcie_tx_bytes", "pcie_rx_bytes", "nvlink_tx_bytes", "nvlink_rx_bytes")
LINK_RATES = ("pcie_tx_bps", "pcie_rx_bps", "nvlink_tx_bps", "nvlink_rx_bps")
# nvml.h field ids (nvmlDeviceGetFieldValues): PCIe byte counters (NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES, R550+) and
# NVLink data throughput counters per link, in KiB (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX; scopeId = link)
FI_PCIE_TX, FI_PCIE_RX, FI_NVLINK_TX, FI_NVLINK_RX = 197, 198, 138, 139
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS
PCIE_UTIL_TX, PCIE_UTIL_RX = 0, 1  # NVML_PCIE_UTIL_TX/RX_BYTES, for nvmlDeviceGetPcieThroughput


def reason_names(mask):
    return [name for bit, name in REASONS.items() if mask & bit]


# ---------------------------------------------------------------- sources


class NvmlSource:
    name = "nvml"

    def __init__(self):
        import pynvml  # nvidia-ml-py

        self.nv = pynvml
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self.static = []
        for i, h in enumerate(self.handles):
            self.static.append({"index": i, "name": _text(self._call(pynvml.nvmlDeviceGetName, h)),
                                "uuid": _text(self._call(pynvml.nvmlDeviceGetUUID, h))})
        events = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._reasons = events or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        self.links = [self._link_fields(h) for h in self.handles]
        # nvmlDeviceGetPcieThroughput (KB/s over a 20 ms window, so ~20 ms a call) stands in for the PCIe counters
        # where the driver lacks them, only while its two calls per GPU cost under a tenth of a second in all
        self._pcie_poll = len(self.handles) * 2 * 0.02 <= 0.1 and hasattr(pynvml, "nvmlDeviceGetPcieThroughput")

    def _fields(self, h, ids):
        """[(field, scope), ...] -> the values NVML answers for (None for each it does not)."""
        get = getattr(self.nv, "nvmlDeviceGetFieldValues", None)
        if get is None or not ids:
            return [None] * len(ids)
        try:
            vals = get(h, ids)
        except Exception:  # NVMLError, or an old binding
            return [None] * len(ids)
        out = []
        for v in vals:
            if getattr(v, "nvmlReturn", 1) != 0:
                out.append(None)
                continue
            u = v.value
            out.append(getattr(u, "ullVal", None) if not isinstance(u, int) else u)
        return out

    def _link_fields(self, h):
        """Which link counters this GPU answers: {"pcie": [(id, scope)...], "nvlink_tx": [...], "nvlink_rx": [...]}."""
        pcie = [(FI_PCIE_TX, 0), (FI_PCIE_RX, 0)]
        tx = [(FI_NVLINK_TX, link) for link in range(NVLINK_MAX_LINKS)]
        rx = [(FI_NVLINK_RX, link) for link in range(NVLINK_MAX_LINKS)]
        got = self._fields(h, pcie + tx + rx)
        ok = [ids for ids, v in zip(pcie + tx + rx, got, strict=True) if v is not None]
        return {"pcie": pcie if all(p in ok for p in pcie) else [],
                "nvlink_tx": [i for i in tx if i in ok], "nvlink_rx": [i for i in rx if i in ok]}

    def _links(self, i, h):
        lf = self.links[i]
        ids = lf["pcie"] + lf["nvlink_tx"] + lf["nvlink_rx"]
        vals = self._fields(h, ids) if ids else []
        out = dict.fromkeys(LINK_COUNTERS)
        if lf["pcie"] and vals[0] is not None and vals[1] is not None:
            out["pcie_tx_bytes"], out["pcie_rx_bytes"] = int(vals[0]), int(vals[1])
        elif self._pcie_poll:  # KB/s now: a rate, no counter
            tx = self._call(self.nv.nvmlDeviceGetPcieThroughput, h, PCIE_UTIL_TX)
            rx = self._call(self.nv.nvmlDeviceGetPcieThroughput, h, PCIE_UTIL_RX)
            out["pcie_tx_bps"] = tx * 1000.0 if tx is not None else None
            out["pcie_rx_bps"] = rx * 1000.0 if rx is not None else None
        n = len(lf["pcie"])
        tx = vals[n:n + len(lf["nvlink_tx"])]
        rx = vals[n + len(lf["nvlink_tx"]):]
        if tx and all(v is not None for v in tx):
            out["nvlink_tx_bytes"] = int(sum(tx)) * 1024
        if rx and all(v is not None for v in rx):
            out["nvlink_rx_bytes"] = int(sum(rx)) * 1024
        return out

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self.nv.NVMLError:  # not supported on this GPU, or not now: that field is None
            return None

    def read(self):
        nv, c = self.nv, self._call
        out = []
        for i, h in enumerate(self.handles):
            st = self.static[i]
            util = c(nv.nvmlDeviceGetUtilizationRates, h)
            mem = c(nv.nvmlDeviceGetMemoryInfo, h)
            power = c(nv.nvmlDeviceGetPowerUsage, h)
            limit = c(nv.nvmlDeviceGetEnforcedPowerLimit, h)
            out.append({
                **st,
                "util_pct": util.gpu if util is not None else None,
                "mem_util_pct": util.memory if util is not None else None,
                "mem_used_bytes": mem.used if mem is not None else None,
                "mem_total_bytes": mem.total if mem is not None else None,
                "sm_clock_mhz": c(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                "mem_clock_mhz": c(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                "power_w": power / 1000.0 if power is not None else None,
                "power_limit_w": limit / 1000.0 if limit is not None else None,
                "temp_c": c(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                "throttle_reasons": c(self._reasons, h),
                "energy_mj": c(nv.nvmlDeviceGetTotalEnergyConsumption, h),
                **self._links(i, h),
            })
        return out

    def close(self):
        try:
            self.nv.nvmlShutdown()
        except Exception:
            pass


def _text(v):
    return v.decode() if isinstance(v, bytes) else (v or "")


class HttpSource:
    """An NVML-shaped JSON document: {"gpus": [{"index", "name", "uuid", <FIELDS>...}]} (the emulator's /sim/gpu)."""

    name = "sim"

    def __init__(self, url, timeout=2.0):
        self.url, self.timeout = url, timeout
        self.read()  # fails at start when nothing answers there

    def read(self):
        with urllib.request.urlopen(self.url, timeout=self.timeout) as r:
            doc = json.loads(r.read())
        return [{"index": int(g.get("index", i)), "name": str(g.get("name", "")), "uuid": str(g.get("uuid", "")),
                 **{k: g.get(k) for k in FIELDS + LINK_COUNTERS}} for i, g in enumerate(doc.get("gpus", []))]

    def close(self):
        pass


DCGM = {  # dcgm-exporter's metric -> (field, scale)
    "DCGM_FI_DEV_GPU_UTIL": ("util_pct", 1),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_util_pct", 1),
    "DCGM_FI_DEV_FB_USED": ("mem_used_bytes", 1 << 20),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", 1),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("power_limit_w", 1),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("throttle_reasons", 1),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("throttle_reasons", 1),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_mj", 1),
}
_LINE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


class DcgmSource:
    """A dcgm-exporter's /metrics (its metric names, labels gpu, UUID, modelName): the same fields as NVML's where
    the exporter's counters include them (FB_USED + FB_FREE = total; the clock-event reasons and the power limit
    are not in its default counters: None then)."""

    name = "dcgm"

    def __init__(self, url, timeout=2.0):
        self.url, self.timeout = url, timeout
        if not self.read():
            raise ValueError("no DCGM_FI_DEV_* series with a gpu label")

    def read(self):
        with urllib.request.urlopen(self.url, timeout=self.timeout) as r:
            text = r.read().decode("utf-8", "replace")
        gpus = {}
        for line in text.splitlines():
            m = _LINE.match(line)
            if m is None or (m.group(1) not in DCGM and m.group(1) != "DCGM_FI_DEV_FB_FREE"):
                continue
            labels = dict(_LABEL.findall(m.group(2) or ""))
            if "gpu" not in labels:
                continue
            g = gpus.setdefault(int(labels["gpu"]), {"index": int(labels["gpu"]), "uuid": labels.get("UUID", ""),
                                                     "name": labels.get("modelName", ""),
                                                     **{k: None for k in FIELDS}})
            v = float(m.group(3))
            if m.group(1) == "DCGM_FI_DEV_FB_FREE":
                g["_free"] = v * (1 << 20)
                continue
            field, scale = DCGM[m.group(1)]
            g[field] = int(v) if field in ("throttle_reasons", "energy_mj") else v * scale
        out = []
        for i in sorted(gpus):
            g = gpus[i]
            free = g.pop("_free", None)
            if free is not None and g["mem_used_bytes"] is not None:
                g["mem_total_bytes"] = g["mem_used_bytes"] + free
            out.append(g)
        return out

    def close(self):
        pass


def open_source(source, sim_url):
    """(source, None) or (None, why there is none)."""
    why = []
    if source in ("auto", "nvml"):
        try:
            s = NvmlSource()
            if s.handles:
                return s, None
            why.append("NVML answers but lists no GPU")
        except Exception as e:  # no pynvml, no driver
            why.append(f"no NVML ({type(e).__name__}: {e})"[:200])
        if source == "nvml":
            return None, "; ".join(why)
    if source.startswith("dcgm:"):
        try:
            return DcgmSource(source[len("dcgm:"):]), None
        except Exception as e:
            return None, f"{source}: {type(e).__name__}: {e}"[:200]
    url = sim_url if source == "auto" else source
    if url:
        try:
            return HttpSource(url), None
        except Exception as e:
            why.append(f"{url}: {type(e).__name__}: {e}"[:200])
    return None, "; ".join(why) or "no source"


# ---------------------------------------------------------------- the sampler


class Sampler:
    def __init__(self, src, interval_s, keep_s, path, max_file_bytes, gpus=""):
        self.src = src
        self.gpus = {w.strip() for w in gpus.split(",") if w.strip()}  # indexes or UUIDs; empty: all
        self.interval_s = interval_s
        self.buf = collections.deque(maxlen=max(16, int(math.ceil(keep_s / interval_s)) + 1))
        self.lock = threading.Lock()
        self.path = path
        self.max_file_bytes = max_file_bytes
        self.f = open(path, "a", encoding="utf-8")
        self.integrated_mj = {}  # index -> mJ, for GPUs without the energy counter
        self.last = None
        self.samples = 0
        self.failures = 0

    def sample(self):
        t = time.time()
        gpus = self.src.read()
        if self.gpus:  # the server's own GPUs (its placement), by NVML index or UUID
            gpus = [g for g in gpus if str(g["index"]) in self.gpus or g.get("uuid") in self.gpus]
        for g in gpus:
            if g.get("energy_mj") is None:
                g["energy_source"] = "integrated_power"
                prev = self.last and next((p for p in self.last["gpus"] if p["index"] == g["index"]), None)
                acc = self.integrated_mj.get(g["index"], 0.0)
                if prev is not None and g.get("power_w") is not None and prev.get("power_w") is not None:
                    acc += (g["power_w"] + prev["power_w"]) / 2 * (t - self.last["t"]) * 1000.0
                self.integrated_mj[g["index"]] = acc
                g["energy_mj"] = acc
            else:
                g["energy_source"] = "counter"
            prev = self.last and next((p for p in self.last["gpus"] if p["index"] == g["index"]), None)
            for counter, rate in zip(LINK_COUNTERS, LINK_RATES, strict=True):
                if g.get(counter) is None:
                    continue
                before = prev.get(counter) if prev else None
                dt = t - self.last["t"] if prev else 0.0
                # a counter that went back (driver reload, wrap) gives no rate for that interval
                g[rate] = (g[counter] - before) / dt if before is not None and dt > 0 and g[counter] >= before \
                    else g.get(rate)
        s = {"t": t, "gpus": gpus}
        line = json.dumps(s, separators=(",", ":"))
        with self.lock:
            self.buf.append((t, line))  # kept as text: a third of the memory of the dicts
            self.last = s
            self.samples += 1
        self.f.write(line + "\n")
        self.f.flush()
        if self.f.tell() > self.max_file_bytes:
            self.f.close()
            os.replace(self.path, self.path + ".1")
            self.f = open(self.path, "a", encoding="utf-8")
        return s

    def window(self, since, until):
        """The samples taken in [since, until], as JSON texts."""
        with self.lock:
            return [line for t, line in self.buf if since <= t <= until]

    def exposition(self):
        with self.lock:
            last, n = self.last, self.samples
        return exposition(last, n, self.src.name)


METRICS = (  # name, type, help, sample key, scale
    ("servesweep_gpu_utilization_ratio", "gauge", "GPU busy fraction (NVML utilization.gpu / 100)", "util_pct", 0.01),
    ("servesweep_gpu_memory_utilization_ratio", "gauge", "memory controller busy fraction (NVML utilization.memory)",
     "mem_util_pct", 0.01),
    ("servesweep_gpu_memory_used_bytes", "gauge", "GPU memory used", "mem_used_bytes", 1),
    ("servesweep_gpu_memory_total_bytes", "gauge", "GPU memory total", "mem_total_bytes", 1),
    ("servesweep_gpu_sm_clock_hertz", "gauge", "SM clock", "sm_clock_mhz", 1e6),
    ("servesweep_gpu_memory_clock_hertz", "gauge", "memory clock", "mem_clock_mhz", 1e6),
    ("servesweep_gpu_power_watts", "gauge", "power draw (NVML power usage)", "power_w", 1),
    ("servesweep_gpu_power_limit_watts", "gauge", "enforced power limit", "power_limit_w", 1),
    ("servesweep_gpu_temperature_celsius", "gauge", "GPU temperature", "temp_c", 1),
    ("servesweep_gpu_clock_event_reasons", "gauge", "NVML clock-event (throttle) reasons bitmask", "throttle_reasons",
     1),
    ("servesweep_gpu_energy_joules_total", "counter",
     "energy since the driver loaded (NVML counter), or the sampler's power integral where the counter is missing",
     "energy_mj", 1e-3),
    ("servesweep_gpu_pcie_transmit_bytes_total", "counter", "PCIe bytes sent by the GPU (NVML counter)",
     "pcie_tx_bytes", 1),
    ("servesweep_gpu_pcie_receive_bytes_total", "counter", "PCIe bytes received by the GPU (NVML counter)",
     "pcie_rx_bytes", 1),
    ("servesweep_gpu_nvlink_transmit_bytes_total", "counter", "NVLink data bytes sent, all links (NVML counter)",
     "nvlink_tx_bytes", 1),
    ("servesweep_gpu_nvlink_receive_bytes_total", "counter", "NVLink data bytes received, all links (NVML counter)",
     "nvlink_rx_bytes", 1),
    ("servesweep_gpu_pcie_transmit_bytes_per_second", "gauge", "PCIe send rate over the last sample interval",
     "pcie_tx_bps", 1),
    ("servesweep_gpu_pcie_receive_bytes_per_second", "gauge", "PCIe receive rate over the last sample interval",
     "pcie_rx_bps", 1),
    ("servesweep_gpu_nvlink_transmit_bytes_per_second", "gauge", "NVLink send rate over the last sample interval",
     "nvlink_tx_bps", 1),
    ("servesweep_gpu_nvlink_receive_bytes_per_second", "gauge", "NVLink receive rate over the last sample interval",
     "nvlink_rx_bps", 1),
)


def _num(v):
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _esc(v):
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(last, n, source):
    out = [f"# HELP servesweep_gpu_sampler_samples_total samples taken\n# TYPE servesweep_gpu_sampler_samples_total "
           f"counter\nservesweep_gpu_sampler_samples_total {n}\n"]
    if last is None:
        return "".join(out)
    out.append("# HELP servesweep_gpu_sampler_last_sample_timestamp_seconds when the last sample was taken\n"
               "# TYPE servesweep_gpu_sampler_last_sample_timestamp_seconds gauge\n"
               f"servesweep_gpu_sampler_last_sample_timestamp_seconds {last['t']:.3f}\n")
    gpus = [(f'gpu="{g["index"]}",uuid="{_esc(g["uuid"])}",name="{_esc(g["name"])}"', g) for g in last["gpus"]]
    for name, typ, help_, key, scale in METRICS:
        rows = [f"{name}{{{lab}}} {_num(g[key] * scale)}\n" for lab, g in gpus
                if g.get(key) is not None]
        if rows:
            out.append(f"# HELP {name} {help_}\n# TYPE {name} {typ}\n")
            out.extend(rows)
    out.append("# HELP servesweep_gpu_power_capped 1 while the power cap holds the clocks (sw_power_cap)\n"
               "# TYPE servesweep_gpu_power_capped gauge\n")
    out.extend(f"servesweep_gpu_power_capped{{{lab}}} {int(bool((g.get('throttle_reasons') or 0) & POWER_CAP))}\n"
               for lab, g in gpus)
    out.append("# HELP servesweep_gpu_throttled 1 while a thermal, HW slowdown or power brake reason is active\n"
               "# TYPE servesweep_gpu_throttled gauge\n")
    out.extend(f"servesweep_gpu_throttled{{{lab}}} {int(bool((g.get('throttle_reasons') or 0) & THROTTLE_MASK))}\n"
               for lab, g in gpus)
    out.append("# HELP servesweep_gpu_energy_source_info where each GPU's energy figure comes from\n"
               "# TYPE servesweep_gpu_energy_source_info gauge\n")
    out.extend(f'servesweep_gpu_energy_source_info{{{lab},source="{source}",energy_source="{g["energy_source"]}"}} 1\n'
               for lab, g in gpus)
    return "".join(out)


def serve(sampler, bind, port):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            u = urllib.parse.urlsplit(self.path)
            if u.path == "/metrics":
                body, ctype = sampler.exposition().encode(), "text/plain; version=0.0.4; charset=utf-8"
            elif u.path == "/samples":
                q = urllib.parse.parse_qs(u.query)
                try:
                    since = float(q.get("since", ["0"])[0])
                    until = float(q.get("until", ["inf"])[0])
                except ValueError:
                    self.send_error(400, "since/until: wall-clock seconds")
                    return
                head = json.dumps({"source": sampler.src.name, "interval_s": sampler.interval_s})[:-1]
                body = (head + ',"samples":[' + ",".join(sampler.window(since, until)) + "]}").encode()
                ctype = "application/json"
            elif u.path == "/health":
                body, ctype = b"ok", "text/plain"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer((bind, port), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, name="gpu-sampler-http", daemon=True).start()
    return httpd


# ---------------------------------------------------------------- processes


def start_time(pid):
    """The process's start time (clock ticks since boot), None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid, started):
    if pid <= 0:
        return False
    st = start_time(pid)
    if st is None:  # no /proc (not Linux): the pid alone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return started is None
    return started is None or st == started


def recorded(workdir):
    try:
        with open(os.path.join(workdir, PIDFILE)) as f:
            words = f.read().split()
        return int(words[0]), (int(words[1]) if len(words) > 1 else None)
    except (OSError, ValueError, IndexError):
        return None


def stop_recorded(workdir, timeout=10.0):
    """Stop the sampler recorded in the pidfile if it is still that process; True when one was stopped."""
    rec = recorded(workdir)
    stopped = False
    if rec is not None and alive(*rec):
        pid = rec[0]
        try:
            os.kill(pid, signal.SIGTERM)
            end = time.monotonic() + timeout
            while alive(*rec) and time.monotonic() < end:
                time.sleep(0.05)
            if alive(*rec):
                os.kill(pid, signal.SIGKILL)
            stopped = True
        except ProcessLookupError:
            pass
    for name in (PIDFILE, READYFILE):
        try:
            os.unlink(os.path.join(workdir, name))
        except FileNotFoundError:
            pass
    return stopped


def run(a):
    """The sampler process itself (--run)."""
    src, why = open_source(a.source, a.sim_url)
    if src is None:
        print(f"gpu_sampler: no source: {why}", file=sys.stderr)
        return 3
    watch = (a.watch_pid, start_time(a.watch_pid)) if a.watch_pid else None
    if watch is not None and not alive(*watch):
        print(f"gpu_sampler: the watched process {a.watch_pid} is gone", file=sys.stderr)
        return 4
    sampler = Sampler(src, a.interval, a.keep_s, os.path.join(a.workdir, SAMPLES), int(a.max_file_mb * 1e6),
                      a.gpus)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    httpd = serve(sampler, a.bind, a.port)
    sampler.sample()
    ready = os.path.join(a.workdir, READYFILE)
    with open(ready + ".tmp", "w") as f:
        json.dump({"port": httpd.server_address[1], "source": src.name, "gpus": len(sampler.last["gpus"]),
                   "energy_sources": sorted({g["energy_source"] for g in sampler.last["gpus"]}),
                   "config": config(a)}, f)
    os.replace(ready + ".tmp", ready)
    due = time.monotonic()
    reason = "stopped"
    while True:
        due = max(due + a.interval, time.monotonic())  # a slow read is not added to the next wait
        if stop.wait(max(0.0, due - time.monotonic())):
            break
        if watch is not None and not alive(*watch):
            reason = f"the server (pid {a.watch_pid}) is gone"
            break
        try:
            sampler.sample()
            sampler.failures = 0
        except Exception as e:
            sampler.failures += 1
            print(f"gpu_sampler: sample failed: {type(e).__name__}: {e}", file=sys.stderr)
            if sampler.failures >= a.max_failures:
                reason = f"{a.max_failures} samples failed in a row"
                break
    httpd.shutdown()
    sampler.f.close()
    src.close()
    rec = recorded(a.workdir)
    if rec is not None and rec[0] == os.getpid():
        for name in (PIDFILE, READYFILE):
            try:
                os.unlink(os.path.join(a.workdir, name))
            except FileNotFoundError:
                pass
    print(f"gpu_sampler: exit: {reason}", file=sys.stderr)
    return 0


def config(a):
    """What a running sampler must match to be kept by --state started (the role applied again, same server)."""
    return {k: getattr(a, k) for k in ("source", "sim_url", "interval", "keep_s", "bind", "port", "watch_pid",
                                       "max_file_mb", "max_failures", "gpus")}


def report(a, out, info):
    host = a.host if a.bind in ("0.0.0.0", "::", "") else a.bind
    out.update(running=True, url=f"http://{host}:{info['port']}", source=info["source"], gpus=info["gpus"],
               energy_sources=info["energy_sources"], samples_file=os.path.join(a.workdir, SAMPLES))


def keep_running(a, out):
    """The recorded sampler is alive, ready and started with these settings: keep it (its samples too)."""
    rec = recorded(a.workdir)
    if rec is None or not alive(*rec):
        return False
    try:
        with open(os.path.join(a.workdir, READYFILE)) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return False
    if info.get("config") != config(a):
        return False
    out["pid"] = str(rec[0])
    report(a, out, info)
    return True


def start(a, out):
    """Start the sampler in its own session from a copy of this file in the workdir (the role's copy is temporary),
    record it, wait until it has taken its first sample."""
    os.makedirs(a.workdir, exist_ok=True)
    src, why = open_source(a.source, a.sim_url)  # checked here, so that a host without GPUs starts nothing
    if src is None:
        out["reason"] = why
        return
    src.close()
    me = os.path.join(a.workdir, "gpu_sampler.py")
    if os.path.abspath(__file__) != os.path.abspath(me):
        shutil.copyfile(__file__, me)
    argv = [sys.executable, me, "--run", "--workdir", a.workdir, "--source", a.source, "--interval", str(a.interval),
            "--keep-s", str(a.keep_s), "--bind", a.bind, "--port", str(a.port), "--max-file-mb", str(a.max_file_mb),
            "--max-failures", str(a.max_failures), "--gpus", a.gpus]
    if a.sim_url:
        argv += ["--sim-url", a.sim_url]
    if a.watch_pid:
        argv += ["--watch-pid", str(a.watch_pid)]
    with open(os.path.join(a.workdir, LOG), "ab") as log:
        p = subprocess.Popen(argv, cwd=a.workdir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    st = None
    for _ in range(100):
        st = start_time(p.pid)
        if st is not None:
            break
        time.sleep(0.01)
    with open(os.path.join(a.workdir, PIDFILE), "w") as f:
        f.write(f"{p.pid} {st if st is not None else ''}\n".replace(" \n", "\n"))
    out.update(changed=True, pid=str(p.pid))
    ready = os.path.join(a.workdir, READYFILE)
    end = time.monotonic() + a.start_timeout
    while time.monotonic() < end:
        if os.path.exists(ready):
            with open(ready) as f:
                info = json.load(f)
            report(a, out, info)
            return
        rc = p.poll()
        if rc is not None:
            raise Failure(f"the sampler exited ({rc}) before its first sample; see {os.path.join(a.workdir, LOG)}")
        time.sleep(0.05)
    stop_recorded(a.workdir)
    raise Failure(f"the sampler took no sample within {a.start_timeout} s; see {os.path.join(a.workdir, LOG)}")


class Failure(Exception):
    pass


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--state", choices=["started", "stopped"])
    p.add_argument("--run", action="store_true", help="be the sampler (what --state started launches)")
    p.add_argument("--workdir", required=True)
    p.add_argument("--source", default="auto", help="auto, nvml, dcgm:URL, or the URL of an NVML-shaped document")
    p.add_argument("--sim-url", default="", help="auto's fallback without NVML (the emulator's /sim/gpu)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between samples (≤ 1)")
    p.add_argument("--keep-s", type=float, default=3600, help="seconds of samples kept in memory for /samples")
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1", help="the host name the URL names when binding all addresses")
    p.add_argument("--watch-pid", type=int, default=0, help="exit when this process is gone (the server)")
    p.add_argument("--gpus", default="", help="only these GPUs, by NVML index or UUID (the server's placement)")
    p.add_argument("--max-file-mb", type=float, default=256)
    p.add_argument("--max-failures", type=int, default=20)
    p.add_argument("--start-timeout", type=float, default=30)
    a = p.parse_args(argv)
    if not a.run and a.state is None:
        p.error("--state started|stopped (or --run)")
    if not 0 < a.interval <= 1:
        p.error("--interval: seconds in (0, 1] (at least one sample a second)")
    return a


def main(argv=None):
    a = parse(argv)
    if a.run:
        return run(a)
    out = {"changed": False, "running": False, "pid": "", "url": "", "source": "", "gpus": 0, "reason": ""}
    try:
        if not (a.state == "started" and keep_running(a, out)):
            out["changed"] = stop_recorded(a.workdir)
            if a.state == "started":
                start(a, out)
    except (Failure, OSError) as e:
        out["error"] = str(e)
        print(json.dumps(out))
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
