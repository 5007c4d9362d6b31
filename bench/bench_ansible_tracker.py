"""The cost of one sample of a playbook's processes (driver/ansible.py `_Tracker.sample`, run at every ansible
event, about 100 per playbook, on the controller that also runs Locust).

Before: psutil's children() per level, which scans the whole process table each call (three scans per sample).
After: one read of /proc/<pid>/stat per process per sample (`_ppid_table`), psutil objects only for the tree.
Both measured in one run, alternating, on the same process trees: N small trees (a shell with a child, like an
ansible task worker and its module) below this process, with the machine's other processes around them.

    .venv/bin/python bench/bench_ansible_tracker.py --trees 3 --samples 200 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import time

import psutil

from servesweep.driver import ansible


def old_sample(me: psutil.Process) -> None:
    for top in me.children():
        top.children(recursive=True)
        top.children()


def new_sample(me: psutil.Process) -> None:
    kids = ansible._ProcessTable()
    for top in kids.children(me.pid):
        kids.children(top.pid)
        ansible._descendants(kids, top)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", type=int, default=3)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    me = psutil.Process()
    procs = [subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True) for _ in range(a.trees)]
    time.sleep(0.3)
    try:
        old, new = [], []
        for _ in range(a.rounds):
            for fn, out in ((old_sample, old), (new_sample, new)):
                t = time.process_time()
                for _ in range(a.samples):
                    fn(me)
                out.append((time.process_time() - t) / a.samples * 1000)
        print(f"processes on the machine: {len(psutil.pids())}; trees: {a.trees}; samples per round: {a.samples}")
        print(f"old (3 psutil scans): CPU ms per sample, rounds {[round(x, 2) for x in old]}")
        print(f"new (1 /proc pass):   CPU ms per sample, rounds {[round(x, 2) for x in new]}")
        print(f"ratio of medians: {statistics.median(old) / statistics.median(new):.1f}x")
    finally:
        for p in procs:  # the shell and its sleep: each tree is a process group of its own
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


if __name__ == "__main__":
    main()
