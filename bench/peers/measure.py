"""What every client run is measured with: the client tree's CPU time, and its timings against ground truth.

CPU: a thread samples user+sys of the client's whole process tree (psutil) every 100 ms. The per-chunk cost is
taken over the STEADY window only: the span in which at least 90 % of the target streams were open at the
emulator (from its ground truth), so imports, data generation, ramp-up and drain do not count. CPU in the window
is interpolated between samples; chunks in the window are the emulator's writes there.

Timing accuracy: each client request is paired with the emulator's record of it.
- servesweep sends `X-Request-Id`, so its records pair exactly by id ("by id").
- The peers send no id and save no response id, so a peer's request is paired with the ground-truth request of the
  same chunk count whose chunk pattern (arrival offsets from the first chunk) is closest ("by pattern"). Closest
  means the error is a LOWER bound for the peer; servesweep is scored both ways so the two can be compared.
Per-chunk error: |(a_k - a_0) - (w_k - w_0)|, arrival of chunk k after the first chunk at the client against the
write of chunk k after the first write at the emulator (all tools record offsets; not all record absolute times).
For servesweep also the absolute |a_k - w_k| on the shared monotonic clock. TTFT error: client TTFT minus the
emulator's (first write - request received), which holds the request upload and the emulator's read.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import psutil


class TreeCpu:
    """Samples user+sys CPU seconds of a process and all its descendants, with monotonic time stamps.

    Also keeps each process's own series and its depth in the tree (0: the command, 1: its children, ...), so a
    multi-process client's CPU splits into e.g. Locust master and workers (figure 6)."""

    def __init__(self, pid: int, every_s: float = 0.1):
        self.pid = pid
        self.every_s = every_s
        self.samples: list[tuple[int, float]] = []  # (monotonic_ns, cpu_s)
        self._stop = threading.Event()
        self._seen: dict[int, float] = {}  # last CPU of each process, kept after it exits
        self.depth: dict[int, int] = {}  # pid -> depth below the root
        self.per_pid: dict[int, list[tuple[int, float]]] = {}  # pid -> (monotonic_ns, its cpu_s)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> TreeCpu:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _sample(self) -> None:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = []
        now = time.monotonic_ns()
        for p in procs:
            try:
                t = p.cpu_times()
                if p.pid not in self.depth:
                    up = [q.pid for q in p.parents()]
                    self.depth[p.pid] = up.index(self.pid) + 1 if self.pid in up else 0
                # a child's own time, plus its reaped children's; kept by pid so an exited process still counts
                self._seen[p.pid] = max(
                    self._seen.get(p.pid, 0.0), t.user + t.system + t.children_user + t.children_system
                )
                self.per_pid.setdefault(p.pid, []).append((now, t.user + t.system))
            except psutil.Error:
                pass
        self.samples.append((now, sum(self._seen.values())))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.every_s)
        self._sample()

    def cpu_between(self, t0_ns: int, t1_ns: int) -> float:
        return _interp_between(self.samples, t0_ns, t1_ns)

    def cpu_by_depth(self, t0_ns: int, t1_ns: int) -> dict[int, float]:
        """Own CPU seconds of the processes at each depth of the tree in [t0, t1] (a process sampled only once
        or outside the window counts 0)."""
        out: dict[int, float] = {}
        for pid, series in self.per_pid.items():
            d = self.depth.get(pid, 0)
            out[d] = out.get(d, 0.0) + (_interp_between(series, t0_ns, t1_ns) if len(series) > 1 else 0.0)
        return out

    def total(self) -> float:
        return self.samples[-1][1] if self.samples else 0.0


def _interp_between(samples: list[tuple[int, float]], t0_ns: int, t1_ns: int) -> float:
    ts = np.array([s[0] for s in samples], dtype=np.float64)
    cs = np.array([s[1] for s in samples], dtype=np.float64)
    return float(np.interp(t1_ns, ts, cs) - np.interp(t0_ns, ts, cs))


@dataclass
class ClientReq:
    """One request as a client tool saw it: TTFT (s) and chunk arrival offsets after the send (s), if kept."""

    ttft_s: float
    offsets_s: list[float] | None = None  # arrival of each token chunk, seconds after the send
    request_id: str | None = None
    abs_chunk_ns: list[int] | None = None  # arrivals on the monotonic clock, when the tool keeps them
    response_id: str | None = None  # the server's response id, when the tool saves it
    span_s: float | None = None  # last chunk - first chunk, for tools that keep only those two arrivals
    clock: str | None = None  # servesweep: 'kernel' (SO_TIMESTAMPNS receive stamps) or 'user'
    read_lag_ns: int | None = (
        None  # servesweep: how far its reader lagged the kernel stamp (max over the request)
    )
    worker: str | None = None  # servesweep: the Locust process (host:pid) that sent it


@dataclass
class Accuracy:
    ttft_err_ms: list[float] = field(default_factory=list)
    chunk_err_ms: list[float] = field(default_factory=list)  # relative to the first chunk, absolute value
    abs_chunk_err_ms: list[float] = field(default_factory=list)  # servesweep only: |arrival - write|
    abs_first_err_ms: list[float] = field(default_factory=list)  # the same, first chunk of each request only
    abs_later_err_ms: list[float] = field(default_factory=list)  # the same, every chunk after the first
    paired: int = 0
    unpaired: int = 0


def steady_window(gt: list[dict], streams: int, frac: float = 0.9) -> tuple[int, int] | None:
    """[t0, t1] in which at least frac*streams requests were open at the emulator, from its ground truth."""
    ev = []
    for d in gt:
        if d.get("chunks"):
            ev.append((d["recv_ns"], 1))
            ev.append((d["end_ns"], -1))
    ev.sort()
    open_, start, best = 0, None, None
    need = max(1, int(frac * streams))
    for t, k in ev:
        open_ += k
        if open_ >= need and start is None:
            start = t
        elif open_ < need and start is not None:
            if best is None or t - start > best[1] - best[0]:
                best = (start, t)
            start = None
    return best


def max_open(gt: list[dict]) -> int:
    """Most requests open at once at the emulator (did the tool reach its target concurrency?)."""
    ev = sorted([(d["recv_ns"], 1) for d in gt] + [(d["end_ns"], -1) for d in gt])
    n = best = 0
    for _, k in ev:
        n += k
        best = max(best, n)
    return best


def chunks_between(gt: list[dict], t0: int, t1: int) -> int:
    n = 0
    for d in gt:
        w = np.fromiter((c[0] for c in d.get("chunks") or ()), dtype=np.int64)
        n += int(np.count_nonzero((w >= t0) & (w < t1)))
    return n


def gt_gaps_ms(gt: list[dict]) -> np.ndarray:
    out = [np.diff([c[0] for c in d["chunks"]]) for d in gt if len(d.get("chunks") or ()) > 1]
    return np.concatenate(out) / 1e6 if out else np.zeros(0)


def _gt_ttft_s(g: dict) -> float:
    return (g["chunks"][0][0] - g["recv_ns"]) / 1e9


def accuracy(client: list[ClientReq], gt: list[dict], by: str) -> Accuracy:
    """Pair client requests with ground truth (`by` = "id" or "pattern") and collect the errors."""
    acc = Accuracy()
    good = [g for g in gt if g.get("chunks") and g.get("status", 200) == 200]
    if by in ("id", "response_id"):
        key = "id" if by == "id" else "response_id"
        index = {g.get(key): g for g in good}
        for c in client:
            g = index.get((c.request_id if by == "id" else c.response_id) or "")
            if g is not None and c.offsets_s is None and c.span_s is not None:
                _add(acc, c, g, exact=True)
                continue
            if g is None or c.offsets_s is None or len(c.offsets_s) != len(g["chunks"]):
                acc.unpaired += 1
                continue
            _add(acc, c, g, exact=True)
        return acc
    # by pattern: group ground truth by chunk count; compare offsets at up to 64 spread indices
    groups: dict[int, tuple[list[dict], np.ndarray, np.ndarray]] = {}
    for g in good:
        groups.setdefault(len(g["chunks"]), ([], None, None))[0].append(g)
    for n, (gs, _, _) in list(groups.items()):
        idx = np.unique(np.linspace(0, n - 1, min(n, 64)).astype(int))
        mat = np.array([[(g["chunks"][i][0] - g["chunks"][0][0]) / 1e9 for i in idx] for g in gs])
        groups[n] = (gs, idx, mat)
    spans = np.array([(g["chunks"][-1][0] - g["chunks"][0][0]) / 1e9 for g in good])
    for c in client:
        if c.offsets_s is None and c.span_s is not None and len(good):
            _add(acc, c, good[int(np.argmin(np.abs(spans - c.span_s)))])  # span-only tools: closest span
            continue
        if c.offsets_s is None or len(c.offsets_s) not in groups:
            acc.unpaired += 1
            continue
        gs, idx, mat = groups[len(c.offsets_s)]
        off = np.asarray(c.offsets_s)
        rel = (off - off[0])[idx]
        best = int(np.argmin(np.abs(mat - rel).sum(axis=1)))
        _add(acc, c, gs[best])
    return acc


def _add(acc: Accuracy, c: ClientReq, g: dict, exact: bool = False) -> None:
    w = np.array([ch[0] for ch in g["chunks"]], dtype=np.int64)
    acc.ttft_err_ms.append((c.ttft_s - _gt_ttft_s(g)) * 1e3)
    acc.paired += 1
    if c.offsets_s is None:  # only the last chunk's arrival is known
        if c.span_s is not None:
            acc.chunk_err_ms.append(abs(c.span_s - (w[-1] - w[0]) / 1e9) * 1e3)
        return
    off = np.asarray(c.offsets_s, dtype=np.float64)
    rel_c = off - off[0]
    rel_w = (w - w[0]) / 1e9
    acc.chunk_err_ms.extend(np.abs(rel_c[1:] - rel_w[1:]) * 1e3)
    if exact and c.abs_chunk_ns is not None:  # absolute error only means something for the true pairing
        e = np.abs(np.asarray(c.abs_chunk_ns, dtype=np.int64) - w) / 1e6
        acc.abs_chunk_err_ms.extend(e)
        # a late first stamp shifts every offset of its request: say which chunks carry the error
        acc.abs_first_err_ms.append(float(e[0]))
        acc.abs_later_err_ms.extend(e[1:])


def pct(xs, qs=(50, 99)) -> dict[str, float | None]:
    a = np.abs(np.asarray(xs, dtype=np.float64))
    if a.size == 0:
        return {f"p{q}": None for q in qs}
    return {f"p{q}": round(float(np.percentile(a, q)), 3) for q in qs}


def pin_available() -> bool:
    return (os.cpu_count() or 1) >= 2 and os.path.exists("/usr/bin/taskset")


def read_gt(path) -> list[dict]:
    from servesweep.sim.groundtruth import read_ground_truth

    return read_ground_truth(path)
