"""The process tree the playbook tracker reads (driver/ansible.py `_ProcessTable`): from the kernel's children
files of the tree's threads, the same tree as a pass over the whole process table finds, including a child forked by
a thread other than the main one (ansible-runner's pexpect reader and servesweep's lane threads start processes)."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import psutil

from servesweep.driver import ansible


def _tree(children_files: bool, root: int) -> set[int]:
    kids = ansible._ProcessTable(children_files=children_files)
    return {p.pid for p in ansible._descendants(kids, psutil.Process(root))}


def test_children_files_find_the_same_tree_as_the_process_table_with_a_thread_forked_child():
    assert ansible._CHILDREN_FILES, "this kernel has no /proc/<pid>/task/<tid>/children (the fallback is the table)"
    top = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & (sleep 30 & wait) & wait"], start_new_session=True)
    from_thread: list[subprocess.Popen] = []
    forked, done = threading.Event(), threading.Event()

    def fork_and_stay() -> None:  # the thread stays alive: when it ends, Linux moves its children to the main one
        from_thread.append(subprocess.Popen(["sleep", "30"]))
        forked.set()
        done.wait(30)

    t = threading.Thread(target=fork_and_stay)
    t.start()
    forked.wait(10)
    try:
        deadline = time.monotonic() + 10
        while len(psutil.Process(top.pid).children(recursive=True)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        expected = {p.pid for p in psutil.Process(top.pid).children(recursive=True)}
        assert len(expected) == 4, expected  # two sleeps, a subshell and its sleep
        assert _tree(True, top.pid) == _tree(False, top.pid) == expected
        mine = _tree(True, os.getpid())
        assert from_thread[0].pid in mine and top.pid in mine and expected <= mine
        assert _tree(False, os.getpid()) >= {from_thread[0].pid, top.pid}
    finally:
        done.set()
        t.join()
        os.killpg(top.pid, 9)
        from_thread[0].kill()
        top.wait()
        from_thread[0].wait()
