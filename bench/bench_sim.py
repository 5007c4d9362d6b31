"""How much the emulator carries on ONE core, and how late its chunk writes are against the engine's schedule.

    .venv/bin/python bench/bench_sim.py [--streams 1000] [--lateness-streams 500] [--tokens 300] [--net veth] [--floor]

The emulator runs pinned to core 0 (`taskset -c 0`) with ground truth on; this script is the client, pinned to
core 1: raw asyncio sockets that only drain bytes (no SSE parsing), so the client is not the bottleneck. Figures:
- throughput run: N concurrent streams (all open at once), tokens/s the emulator emitted (from its ground truth:
  tokens of all chunks over first-to-last write), chunks/s, and whether all streams completed;
- lateness run: M streams; per chunk, write time minus the engine's scheduled emission time (`sched_ns`), p50/p99/max;
- both: the emulator's CPU seconds (user/system, from /proc) per chunk and as a share of the wall time: on a shared
  machine a share well below 1 means the emulator waited for the core, not for its own work.
The model is Llama-3.1-8B on the H200 profile; `--speedup` divides step times so the engine asks for more tokens/s
than the target (the emulator must keep up).

Where the client's kernel work lands (a benchmark-setup fact, not the emulator's): on loopback the receiving side's
TCP processing (and the wake-up of the client) runs inside the emulator's `write`, on the emulator's core. A client on
another machine costs the sender nothing of that. `--net veth` (root) puts the emulator and the client in two
network namespaces joined by a veth pair, a stand-in for a NIC, with Receive Packet Steering on the client's end
sending its receive processing to the client's core. `--floor` measures the kernel's part alone: bursts of one small
`os.write` per socket (the emulator's chunk size) from core 0, the receiver on core 1 or on core 0, over loopback
and over veth with and without RPS.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from servesweep.sim.launch import start_sim

END = b"0\r\n\r\n"


class Drain(asyncio.Protocol):
    def __init__(self, done: asyncio.Future):
        self.done = done
        self.nbytes = 0
        self.tail = b""

    def data_received(self, data):
        self.nbytes += len(data)
        self.tail = (self.tail + data)[-8:]
        if self.tail.endswith(END) and not self.done.done():
            self.done.set_result(self.nbytes)

    def connection_lost(self, exc):
        if not self.done.done():
            self.done.set_result(-self.nbytes)


async def drive(host: str, port: int, n: int, tokens: int, prompt_words: int) -> tuple[int, float]:
    loop = asyncio.get_running_loop()
    prompt = " ".join(["alpha"] * prompt_words)
    futs = []
    transports = []
    # open every connection first, then send all requests at once: N concurrent streams
    for i in range(n):
        done = loop.create_future()
        tr, _ = await loop.create_connection(lambda d=done: Drain(d), host, port)
        body = json.dumps(
            {
                "model": "m",
                "messages": [{"role": "user", "content": f"{i} {prompt}"}],
                "max_tokens": tokens,
                "ignore_eos": True,
                "stream": True,
            }
        ).encode()
        req = (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        futs.append(done)
        transports.append((tr, req))
    t0 = time.monotonic()
    for tr, req in transports:
        tr.write(req)
    res = await asyncio.gather(*futs)
    for tr, _ in transports:
        tr.close()
    ok = sum(1 for r in res if r > 0)
    return ok, time.monotonic() - t0


def run_point(
    n: int, tokens: int, speedup: float, prompt_words: int, prefix: list[str], net: dict | None = None
) -> dict:
    gt = Path(tempfile.mkdtemp(prefix="bench-sim-")) / "gt.jsonl"
    args = [
        "--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--max-running-requests", str(max(n, 64)),
        "--sim-calibration", f"speedup={speedup}", "--log-level", "warning",
    ]  # fmt: skip
    where = {}
    if net is not None:  # the emulator in the server namespace, reached over the veth pair
        prefix = ["ip", "netns", "exec", net["srv_ns"], *prefix]
        where = {"host": net["srv_ip"], "port": 8000}  # a fresh namespace: every port is free
    with start_sim(args, ground_truth=gt, prefix=prefix, **where) as sim:
        import uvloop

        cpu0 = proc_cpu(sim.pid)
        ok, wall = uvloop.run(drive(sim.host, sim.port, n, tokens, prompt_words))
        cpu1 = proc_cpu(sim.pid)
        time.sleep(1.5)  # ground truth is flushed every second
        lines = sim.read_ground_truth()
    writes = [c[0] for ln in lines for c in ln["chunks"]]
    toks = sum(c[1] for ln in lines for c in ln["chunks"])
    span = (max(writes) - min(writes)) / 1e9 if writes else float("nan")
    late = [
        (c[0] - s) / 1e6
        for ln in lines
        if ln.get("sched_ns")
        for c, s in zip(ln["chunks"], ln["sched_ns"], strict=False)
        if s is not None
    ]
    late.sort()
    last: dict[int, int] = {}  # step (its scheduled time) -> its last write
    for ln in lines:
        for c, st in zip(ln["chunks"], ln.get("sched_ns") or (), strict=False):
            if c[0] > last.get(st, 0):
                last[st] = c[0]
    bursts = sorted((w - st) / 1e6 for st, w in last.items())

    def pct(p):
        return late[min(len(late) - 1, int(p * len(late)))] if late else float("nan")

    user, sys_ = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    return {
        "streams": n,
        "emulator_cpu_s": {
            "user": round(user, 2),
            "sys": round(sys_, 2),
            "of_wall": round((user + sys_) / wall, 2),
        },
        "cpu_us_per_chunk": round(1e6 * (user + sys_) / max(1, len(writes)), 2),
        "tokens_per_cpu_s": round(toks / (user + sys_))
        if user + sys_
        else None,  # what one dedicated core carries
        "completed": ok,
        "tokens": toks,
        "chunks": len(writes),
        "span_s": round(span, 3),
        "tokens_per_s": round(toks / span) if span else None,
        "chunks_per_s": round(len(writes) / span) if span else None,
        "client_wall_s": round(wall, 3),
        "lateness_ms_p50": round(pct(0.50), 3),
        "lateness_ms_p99": round(pct(0.99), 3),
        "lateness_ms_max": round(late[-1], 3) if late else None,
        "step_last_write_ms_p50": round(bursts[len(bursts) // 2], 3) if bursts else None,
    }


def proc_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process, from /proc (Linux)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(f[11]) / tick, int(f[12]) / tick


def ready_time(prefix: list[str]) -> float:
    """Seconds from launching `python -m servesweep.sim` (default load time) to /health 200."""
    t0 = time.monotonic()
    with start_sim(["--model-path", "meta-llama/Llama-3.1-8B-Instruct"], prefix=prefix):
        return time.monotonic() - t0


# ------------------------------------------------------------------ network namespaces (--net veth)


def _sh(*cmd: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")


@contextlib.contextmanager
def veth_pair(client_cpu: int, rps: bool = True):
    """Two network namespaces joined by a veth pair; RPS on the client's end steers its receive work to client_cpu.

    Needs root (CAP_NET_ADMIN). Everything is removed on exit (deleting a namespace deletes its veth end).
    """
    tag = f"{os.getpid() % 100000}"
    srv, cli = f"ssbench-srv-{tag}", f"ssbench-cli-{tag}"
    dev_s, dev_c = f"ssbs{tag}", f"ssbc{tag}"
    third = os.getpid() % 250 + 1
    srv_ip, cli_ip = f"10.213.{third}.1", f"10.213.{third}.2"
    try:
        _sh("ip", "netns", "add", srv)
        _sh("ip", "netns", "add", cli)
        _sh("ip", "link", "add", dev_s, "netns", srv, "type", "veth", "peer", "name", dev_c, "netns", cli)
        for ns, dev, ip in ((srv, dev_s, srv_ip), (cli, dev_c, cli_ip)):
            _sh("ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", dev)
            _sh("ip", "-n", ns, "link", "set", dev, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        mask = format(1 << client_cpu, "x") if rps else "0"
        _sh(
            "ip",
            "netns",
            "exec",
            cli,
            "sh",
            "-c",
            f"echo {mask} > /sys/class/net/{dev_c}/queues/rx-0/rps_cpus",
        )
        yield {"srv_ns": srv, "cli_ns": cli, "srv_ip": srv_ip, "cli_ip": cli_ip, "rps": rps}
    finally:
        for ns in (srv, cli):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# ------------------------------------------------------------------ kernel floor (--floor)


def _floor_receiver(port_file: str, host: str, conns: int) -> None:
    """Accept `conns` connections and drain them until all close (runs as its own process)."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((host, 0))
    ls.listen(4096)
    Path(port_file + ".tmp").write_text(str(ls.getsockname()[1]))
    os.rename(port_file + ".tmp", port_file)
    sel = selectors.EpollSelector()
    for _ in range(conns):
        c, _ = ls.accept()
        c.setblocking(False)
        sel.register(c, selectors.EVENT_READ)
    left = conns
    while left:
        for key, _ in sel.select():
            try:
                d = key.fileobj.recv(65536)
            except BlockingIOError:
                continue
            if not d:
                sel.unregister(key.fileobj)
                key.fileobj.close()
                left -= 1


def _floor_sender(host: str, port: int, conns: int, size: int, bursts: int, interval: float) -> dict:
    """Bursts of one `os.write` of `size` bytes per connection (TCP_NODELAY, as the emulator): per-write cost."""
    import resource

    socks = []
    for _ in range(conns):
        so = socket.create_connection((host, port))
        so.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(so)
    fds = [so.fileno() for so in socks]
    buf = b"x" * size
    w = os.write
    time.sleep(0.2)
    durs = []
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    nxt = time.perf_counter()
    for _ in range(bursts):
        nxt += interval
        t0 = time.perf_counter_ns()
        for fd in fds:
            w(fd, buf)
        durs.append(time.perf_counter_ns() - t0)
        time.sleep(max(0.0, nxt - time.perf_counter()))
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    for so in socks:
        so.close()
    durs.sort()
    n = conns * bursts
    return {
        "us_per_write_p50": round(durs[len(durs) // 2] / conns / 1e3, 2),
        "burst_ms_p50": round(durs[len(durs) // 2] / 1e6, 2),
        "burst_ms_p99": round(durs[int(0.99 * len(durs))] / 1e6, 2),
        "user_us_per_write": round((r1.ru_utime - r0.ru_utime) / n * 1e6, 2),
        "sys_us_per_write": round((r1.ru_stime - r0.ru_stime) / n * 1e6, 2),
    }


def floor_point(
    recv_cpu: int, net: dict | None, conns: int, rt: int = 0, size: int = 260, bursts: int = 150
) -> dict:
    """One kernel-floor point: a sender on core 0 (SCHED_FIFO `rt` when given) writes, a receiver on `recv_cpu`
    drains."""
    chrt = ["chrt", "-f", str(rt)] if rt else []
    port_file = tempfile.mktemp(prefix="bench-sim-floor-")
    host = net["cli_ip"] if net else "127.0.0.1"
    pre = ["ip", "netns", "exec", net["cli_ns"]] if net else []
    code = f"import bench_sim; bench_sim._floor_receiver({port_file!r}, {host!r}, {conns})"
    rx = subprocess.Popen(
        [*pre, "taskset", "-c", str(recv_cpu), sys.executable, "-c", code],
        cwd=str(Path(__file__).parent),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(port_file):
            if rx.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("floor receiver did not start")
            time.sleep(0.02)
        port = int(Path(port_file).read_text())
        if net:  # the sender must sit in the server namespace: a child process does
            code = (
                f"import bench_sim, json, os; os.sched_setaffinity(0, {{0}}); "
                f"print(json.dumps(bench_sim._floor_sender({host!r}, {port}, {conns}, {size}, {bursts}, 0.02)))"
            )
            out = subprocess.run(
                ["ip", "netns", "exec", net["srv_ns"], *chrt, sys.executable, "-c", code],
                cwd=str(Path(__file__).parent),
                capture_output=True,
                text=True,
                timeout=120,
            )
            if out.returncode:
                raise RuntimeError(f"floor sender failed: {out.stderr[-2000:]}")
            res = json.loads(out.stdout)
        else:
            aff = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {0})
            if rt:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(rt))
            try:
                res = _floor_sender(host, port, conns, size, bursts, 0.02)
            finally:
                if rt:
                    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
                os.sched_setaffinity(0, aff)
        rx.wait(30)
        return res
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rx.pid, 9)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(port_file)


def floor(conns: int, rt: int = 0) -> dict:
    out = {
        "loopback, receiver on core 1": floor_point(1, None, conns, rt),
        "loopback, receiver on core 0 (same core)": floor_point(0, None, conns, rt),
    }
    with veth_pair(1, rps=False) as net:
        out["veth, receiver on core 1, no RPS"] = floor_point(1, net, conns, rt)
    with veth_pair(1, rps=True) as net:
        out["veth, receiver on core 1, RPS to core 1"] = floor_point(1, net, conns, rt)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--lateness-streams", type=int, default=500)
    ap.add_argument("--tokens", type=int, default=300, help="output tokens per stream")
    ap.add_argument("--prompt-words", type=int, default=20)
    ap.add_argument("--speedup", type=float, default=3.0, help="divides the engine's step times")
    ap.add_argument("--lateness-speedup", type=float, default=1.0)
    ap.add_argument(
        "--nice", type=int, default=0, help="run the emulator at this nice level (negative: root only)"
    )
    ap.add_argument(
        "--rt",
        type=int,
        default=0,
        help="run the emulator SCHED_FIFO at this priority (root): on a shared machine, the figure of a core of its own",
    )
    ap.add_argument(
        "--net",
        choices=("loopback", "veth"),
        default="loopback",
        help="veth: emulator and client in two network namespaces, RPS on the client's end (root)",
    )
    ap.add_argument("--no-rps", action="store_true", help="with --net veth: leave RPS off")
    ap.add_argument("--floor", action="store_true", help="also measure the kernel's cost of one small write")
    ap.add_argument("--skip-throughput", action="store_true", help="only ready time and the lateness run")
    ap.add_argument("--_client-in", dest="client_in", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.net == "veth" and a.client_in is None:
        # this script is the client: run it again inside the client namespace (ip netns exec needs root)
        if os.geteuid() != 0:
            print("--net veth needs root (it creates network namespaces and a veth pair)", file=sys.stderr)
            return 2
        with veth_pair(1, rps=not a.no_rps) as net:
            argv = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--_client-in", json.dumps(net)]
            return subprocess.call(["ip", "netns", "exec", net["cli_ns"], *argv])
    net = json.loads(a.client_in) if a.client_in else None
    prefix = ["taskset", "-c", "0"]
    if a.nice:
        prefix = ["nice", "-n", str(a.nice), *prefix]
    if a.rt:
        prefix = ["chrt", "-f", str(a.rt), *prefix]
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})
    out = {
        "net": a.net + ("" if a.net == "loopback" else (", RPS to core 1" if net["rps"] else ", no RPS")),
        "emulator_sched": f"SCHED_FIFO {a.rt}" if a.rt else f"nice {a.nice}",
        "ready_s": round(ready_time(prefix), 3) if net is None else None,
        "loadavg_before": os.getloadavg()[0],
    }
    if not a.skip_throughput:
        out["throughput"] = run_point(a.streams, a.tokens, a.speedup, a.prompt_words, prefix, net)
    out["lateness"] = run_point(a.lateness_streams, a.tokens, a.lateness_speedup, a.prompt_words, prefix, net)
    if a.floor and net is None:
        out["kernel_floor"] = floor(a.lateness_streams, a.rt)
    out["loadavg_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
