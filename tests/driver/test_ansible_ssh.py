"""SSH to a host of a matrix, the connection lost as it is made: Ansible retries it, the playbook succeeds; the
user's own ANSIBLE_SSH_RETRIES wins (0: the host is reported unreachable, by name). Real sshd in a network namespace,
the connection dropped by the ProxyCommand relay (tests/netns.py `drop`) as a flaky link would. A host that never
answers at all: its workers are lost, the stop goes on."""

from __future__ import annotations

from pathlib import Path

import netns
import pyarrow as pa
import pytest

from servesweep.driver.ansible import run_playbook
from servesweep.driver.workers import RemoteWorkers, WorkerState, account

pytestmark = pytest.mark.timeout(300)


def _stop_workers(inv: str, tmp: Path, ident: str):
    return run_playbook(
        "locust_workers.yml",
        inventory=inv,
        extravars={"locust_worker_state": "stopped", "locust_worker_results_dir": str(tmp / "res" / ident)},
        artifact_dir=tmp / "a",
        ident=ident,
    )


def _connections(drop: Path) -> int:
    count = drop.with_name(drop.name + ".count")
    return len(count.read_text()) if count.exists() else 0


def _relayed(net, tmp: Path) -> tuple[str, Path]:
    """An inventory of host h1 reached through the relay that counts (and drops) connections, and the relay's drop
    file (empty: none dropped): every SSH operation connects anew, so the count is the play's connections."""
    drop = tmp / "drop"
    drop.write_text("")
    inv = (
        f"[loadgen]\nh1 ansible_host={net['h1'].addr}\n"
        f"[loadgen:vars]\nlocust_worker_dir={tmp}/h1\n"
        + net.inventory_vars("ctl", drop=drop, control_master=False)
    )
    return inv, drop


def test_an_ssh_connection_lost_as_it_is_made_is_retried_and_the_play_goes_on(tmp_path, monkeypatch):
    monkeypatch.delenv("ANSIBLE_SSH_RETRIES", raising=False)
    with netns.hosts(["ctl", "h1"], ssh=["h1"]) as net:
        inv, drop = _relayed(net, tmp_path)
        clean = _stop_workers(inv, tmp_path, "clean")
        assert clean.ok, clean.error()
        n = _connections(drop)
        assert n >= 2, f"the play made {n} SSH connection(s); the test needs a first and a later one"

        # the next run loses its first connection and its last one as they are made
        drop.write_text(f"{n + 1},{2 * n + 1}")
        flaky = _stop_workers(inv, tmp_path, "flaky")
        assert flaky.ok, flaky.error()
        assert _connections(drop) == 2 * n + 2  # each lost connection made once more, nothing else repeated
        assert "UNREACHABLE" not in (flaky.artifact_dir / "stdout").read_text()

        # the user's own setting is kept: no retries, and the lost connection fails the host, named
        monkeypatch.setenv("ANSIBLE_SSH_RETRIES", "0")
        drop.write_text(f"{2 * n + 3}")
        strict = _stop_workers(inv, tmp_path, "strict")
        assert not strict.ok
        assert strict.error().startswith("h1: ") and "ssh" in strict.error().lower(), strict.error()


def test_a_module_task_takes_one_ssh_connection_pipelined_unless_the_user_turns_it_off(tmp_path, monkeypatch):
    """Each module task is pipelined (one SSH connection: the module on the interpreter's stdin) instead of Ansible's
    default of a connection each to make a temporary folder, copy the module, run it and remove the folder: a night's
    matrix makes thousands. The user's own ANSIBLE_PIPELINING=False still wins (sudoers with `requiretty`)."""
    monkeypatch.delenv("ANSIBLE_PIPELINING", raising=False)
    with netns.hosts(["ctl", "h1"], ssh=["h1"]) as net:
        inv, drop = _relayed(net, tmp_path)
        piped = _stop_workers(inv, tmp_path, "piped")
        assert piped.ok, piped.error()
        n_piped = _connections(drop)

        monkeypatch.setenv("ANSIBLE_PIPELINING", "False")
        drop.with_name(drop.name + ".count").unlink()  # counted afresh
        plain = _stop_workers(inv, tmp_path, "plain")
        assert plain.ok, plain.error()
        n_plain = _connections(drop)
        assert n_plain >= 2 * n_piped, f"SSH connections: pipelined {n_piped}, not pipelined {n_plain}"  # 4, 21


def test_a_host_that_never_answers_the_stop_loses_its_workers_and_fails_nothing(tmp_path, monkeypatch):
    """A worker host that died without closing anything: each SSH attempt waits for a banner that never comes (about
    50 s to be called unreachable with Ansible's retries), so the stop task runs past its timeout instead. The stop
    must count that host's workers as lost, named with the time it waited, and the point degraded with what reached
    the master kept, not raise (CI saw it raise once under load: the dead host's retries outlasted the 40 s task).
    Its SSH and the relay it was waiting on do not outlive the stop."""
    monkeypatch.delenv("ANSIBLE_SSH_RETRIES", raising=False)
    relay_pid = tmp_path / "relay.pid"
    # the host's "network": a relay that records its pid and never passes a byte
    relay = tmp_path / "relay.sh"
    relay.write_text(f"#!/bin/sh\necho $$ > {relay_pid}\nexec sleep 60\n")
    relay.chmod(0o755)
    inv = (
        "[loadgen]\n"
        f"h9 ansible_host=192.0.2.9 locust_worker_dir={tmp_path}/h9\n"
        "[loadgen:vars]\n"
        "ansible_user=root\nansible_python_interpreter=/usr/bin/python3\n"
        f"ansible_ssh_common_args='-o ProxyCommand=\"{relay}\" -o StrictHostKeyChecking=no "
        "-o UserKnownHostsFile=/dev/null -o ControlMaster=no -o ControlPath=none'\n"
    )
    started = [
        WorkerState(host="h9", hostname="h9", index=i, pid=100 + i, exit_code=None, stopped_by_role=False,
                    status=None, log=None)
        for i in range(2)
    ]
    workers = RemoteWorkers(
        inventory=inv,
        group="loadgen",
        run_dir=tmp_path / "run",
        # the role's stop is bounded by 1 s and the task by 1 s more: far less than reaching a dead host takes
        extravars={"locust_worker_stop_timeout": 1, "locust_worker_task_grace": 1,
                   "locust_worker_results_dir": str(tmp_path / "run" / "workers")},
        expected=2,
        started=started,
    )
    states = workers.stop(timeout_s=120)  # before the fix: RemoteWorkersError "... Timed out after 2 second(s)."

    assert [(w.host, w.exit_code) for w in states] == [("h9", None), ("h9", None)]
    assert all(w.note == "was lost: its host h9 did not answer the stop within 2 s (it died, or dropped off the "
               "network)" for w in states), [w.note for w in states]
    none = pa.table({"worker": pa.array([], pa.string()), "warmup": pa.array([], pa.bool_())})
    acc = account(states, none)
    assert acc["degraded"], acc

    pid = int(relay_pid.read_text())
    alive = Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    assert not alive, f"the relay {pid} SSH was waiting on outlived the stop"
