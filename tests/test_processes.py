"""servesweep.processes: a process group started here, waited for and stopped, and the parent watch (issue 29): a
group started for servesweep's own use (an emulator, a CPU SGLang server) does not outlive the process that started
it, even when that process is SIGKILLed; a group started without the watch (Locust, `observe up`'s Prometheus) does,
and is stopped later by its record alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from servesweep.processes import WATCH_GRACE_S, NotReady, group_members, start_group, stop_group, wait_ready

PY = sys.executable
# a leader that starts a second process of its group and sleeps; IGNORE_TERM=1: both ignore SIGTERM
SLEEPER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    if os.environ.get("IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("started", child.pid, flush=True)
    time.sleep(600)
    """
)


def _wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout} s")


def _two_members(ref: dict) -> list:
    return _wait_for(
        lambda: len(group_members(ref)) == 2 and group_members(ref), 20, "the group has 2 processes"
    )


def _parent(tmp: Path, *, watch: bool, ignore_term: bool = False) -> tuple[subprocess.Popen, dict]:
    """A Python process that starts SLEEPER as a group (from a thread that then ends), writes the group's ref and
    sleeps: the test SIGKILLs it."""
    out = tmp / "ref.json"
    script = textwrap.dedent(
        f"""
        import json, os, sys, threading, time
        from servesweep.processes import start_group
        env = {{**os.environ, "IGNORE_TERM": "{int(ignore_term)}"}}
        box = []
        t = threading.Thread(target=lambda: box.append(start_group(
            [sys.executable, "-c", {SLEEPER!r}], env=env, log_path={str(tmp / "group.log")!r}, kind="test",
            watch_parent={watch})))
        t.start(); t.join()  # the starting thread is gone: the group must not care
        open({str(out)!r}, "w").write(json.dumps(box[0].ref))
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([PY, "-c", script], start_new_session=True)
    ref = _wait_for(lambda: out.exists() and out.stat().st_size and json.loads(out.read_text()), 30, "a ref")
    return parent, ref


def test_a_watched_group_ends_when_its_parent_is_sigkilled(tmp_path):
    parent, ref = _parent(tmp_path, watch=True)
    try:
        members = _two_members(ref)
        time.sleep(1.5)  # the thread that started it ended long ago: the group lives on with its parent
        assert len(group_members(ref)) == 2 and parent.poll() is None
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        _wait_for(lambda: not group_members(ref), 5, "the group is gone after its parent's SIGKILL")
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in members)
    finally:
        stop_group(ref, 0)
        parent.kill()


def test_a_watched_group_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    parent, ref = _parent(tmp_path, watch=True, ignore_term=True)
    try:
        _two_members(ref)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        time.sleep(1.0)
        assert len(group_members(ref)) == 2  # SIGTERM is ignored: still up within the grace
        _wait_for(lambda: not group_members(ref), WATCH_GRACE_S + 5, "SIGKILL after the grace")
    finally:
        stop_group(ref, 0)
        parent.kill()


def test_an_unwatched_group_outlives_its_parent_and_is_stopped_by_its_record(tmp_path):
    """What a resumed run does with the Locust group of a SIGKILLed run: the record alone finds and stops it."""
    parent, ref = _parent(tmp_path, watch=False)
    try:
        _two_members(ref)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        time.sleep(1.5)
        assert len(group_members(ref)) == 2
        assert stop_group(ref, 5.0) is None  # not this process's child: no exit status to give
        assert group_members(ref) == []
    finally:
        stop_group(ref, 0)
        parent.kill()


def test_stop_group_sigterms_then_sigkills_only_its_own_group(tmp_path):
    bystander = subprocess.Popen([PY, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        polite = start_group([PY, "-c", SLEEPER], log_path=tmp_path / "polite.log")
        stubborn = start_group([PY, "-c", SLEEPER], env={**os.environ, "IGNORE_TERM": "1"},
                               log_path=tmp_path / "stubborn.log")  # fmt: skip
        _two_members(polite.ref)
        _two_members(stubborn.ref)
        t0 = time.monotonic()
        assert stop_group(polite, 5.0) == -signal.SIGTERM
        assert time.monotonic() - t0 < 4 and group_members(polite.ref) == []
        t0 = time.monotonic()
        assert stop_group(stubborn, 1.0) == -signal.SIGKILL
        assert 1.0 <= time.monotonic() - t0 < 6 and group_members(stubborn.ref) == []
        assert bystander.poll() is None  # another session, not recorded: untouched
        assert stop_group(polite, 5.0) == -signal.SIGTERM  # a second stop does nothing and says the same
    finally:
        bystander.kill()
        bystander.wait()


def test_wait_ready_names_what_did_not_come_up_with_its_log(tmp_path):
    crash = start_group([PY, "-c", "import sys; print('no model weights here'); sys.exit(3)"],
                        log_path=tmp_path / "crash.log")  # fmt: skip
    with pytest.raises(NotReady) as e:
        wait_ready(crash, lambda: False, 30, "the test server", detail=": crash")
    msg = str(e.value)
    assert msg.startswith("the test server exited with code 3 before getting ready: crash"), msg
    assert "crash.log (tail)" in msg and "no model weights here" in msg, msg

    slow = start_group([PY, "-c", SLEEPER], log_path=tmp_path / "slow.log")
    _two_members(slow.ref)
    with pytest.raises(NotReady, match=r"^the slow server not ready within 0.5 s"):
        wait_ready(slow, lambda: False, 0.5, "the slow server")
    assert group_members(slow.ref) == [] and not slow.alive()  # stopped before the error went up

    ok = start_group([PY, "-c", "import time; time.sleep(600)"], log_path=tmp_path / "ok.log")
    try:
        calls = []
        assert wait_ready(ok, lambda: calls.append(1) or len(calls) >= 3, 10, "ok", poll_s=0.01) < 5
        assert ok.alive()
    finally:
        stop_group(ok, 5.0)


def test_an_emulator_started_by_a_sigkilled_process_does_not_outlive_it(tmp_path):
    """The orphan seen in practice: emulators a SIGKILLed pytest session had started (tests/inlocust's sim_fast)."""
    out = tmp_path / "sim.json"
    script = textwrap.dedent(
        f"""
        import json, time
        from servesweep.sim.launch import start_sim
        sim = start_sim(["--model-path", "Qwen/Qwen3.6-27B"], log_path={str(tmp_path / "sim.log")!r})
        open({str(out)!r}, "w").write(json.dumps({{"ref": sim.group.ref, "url": sim.base_url}}))
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([PY, "-c", script], start_new_session=True)
    try:
        got = _wait_for(
            lambda: out.exists() and out.stat().st_size and json.loads(out.read_text()), 120, "sim up"
        )
        ref = got["ref"]
        assert group_members(ref), "the emulator runs"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        _wait_for(lambda: not group_members(ref), 8, "the emulator is gone after its parent's SIGKILL")
    finally:
        parent.kill()
        if out.exists() and out.stat().st_size:
            stop_group(json.loads(out.read_text())["ref"], 0)
