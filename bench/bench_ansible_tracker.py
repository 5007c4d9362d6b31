"""The cost of one sample of a playbook's processes (driver/ansible.py `_Tracker.sample`, run at every ansible
event, about 100 per playbook, on the controller that also runs Locust).

Three ways, measured in one run, alternating: psutil's children() per level, which scans the whole process table
each call (three scans per sample); one read of /proc/<pid>/stat per process on the machine per sample
(`_ppid_table`, the fallback); the children files of the tree's processes only (/proc/<pid>/task/<tid>/children,
what `_ProcessTable` reads where the kernel has them).
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


def table_sample(me: psutil.Process) -> None:
    kids = ansible._ProcessTable(children_files=False)
    for top in kids.children(me.pid):
        kids.children(top.pid)
        ansible._descendants(kids, top)


def files_sample(me: psutil.Process) -> None:
    kids = ansible._ProcessTable(children_files=True)
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
        old, table, files = [], [], []
        for _ in range(a.rounds):
            for fn, out in ((old_sample, old), (table_sample, table), (files_sample, files)):
                t = time.process_time()
                for _ in range(a.samples):
                    fn(me)
                out.append((time.process_time() - t) / a.samples * 1000)
        print(f"processes on the machine: {len(psutil.pids())}; trees: {a.trees}; samples per round: {a.samples}")
        print(f"old (3 psutil scans): CPU ms per sample, rounds {[round(x, 2) for x in old]}")
        print(f"1 /proc pass:         CPU ms per sample, rounds {[round(x, 2) for x in table]}")
        print(f"children files:       CPU ms per sample, rounds {[round(x, 2) for x in files]}")
        m_old, m_table, m_files = (statistics.median(x) for x in (old, table, files))
        print(f"ratio of medians: old/files {m_old / m_files:.1f}x, table/files {m_table / m_files:.1f}x")
    finally:
        for p in procs:  # the shell and its sleep: each tree is a process group of its own
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


if __name__ == "__main__":
    main()
