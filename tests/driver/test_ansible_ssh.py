"""SSH to a host of a matrix, the connection lost as it is made: Ansible retries it, the playbook succeeds; the
user's own ANSIBLE_SSH_RETRIES wins (0: the host is reported unreachable, by name). Real sshd in a network namespace,
the connection dropped by the ProxyCommand relay (tests/netns.py `drop`) as a flaky link would."""

from __future__ import annotations

from pathlib import Path

import netns
import pytest

from servesweep.driver.ansible import run_playbook

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


def test_an_ssh_connection_lost_as_it_is_made_is_retried_and_the_play_goes_on(tmp_path, monkeypatch):
    monkeypatch.delenv("ANSIBLE_SSH_RETRIES", raising=False)
    drop = tmp_path / "drop"
    drop.write_text("")
    with netns.hosts(["ctl", "h1"], ssh=["h1"]) as net:
        inv = (
            f"[loadgen]\nh1 ansible_host={net['h1'].addr}\n"
            f"[loadgen:vars]\nlocust_worker_dir={tmp_path}/h1\n"
            + net.inventory_vars("ctl", drop=drop, control_master=False)  # every task connects anew
        )
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
