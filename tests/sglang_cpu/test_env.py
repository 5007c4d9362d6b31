"""SGLang's CPU venv: its stamp follows the pins, and a failed install says which step failed and leaves no
half-built venv behind (the lock and temp-folder rename, `servesweep.sglang.cpu.env`)."""

from __future__ import annotations

import pytest

import servesweep.sglang.cpu.env as cpu_env


def test_the_installed_venv_matches_the_pins_and_a_pin_change_rebuilds(sglang_cpu_env, tmp_path, monkeypatch):
    assert cpu_env.is_installed()
    assert cpu_env.stamp_path().read_text().strip() == cpu_env.pins_digest()
    changed = tmp_path / "requirements.txt"
    changed.write_text(cpu_env.REQUIREMENTS.read_text() + "einops==0.8.1\n")
    monkeypatch.setattr(cpu_env, "REQUIREMENTS", changed)
    assert not cpu_env.is_installed(), "a changed requirements file must invalidate the stamp"


def test_a_failed_install_names_the_step_and_leaves_no_venv(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESWEEP_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "requirements.txt"
    bad.write_text("this is not === a requirement\n")  # rejected by pip before it asks any index
    monkeypatch.setattr(cpu_env, "REQUIREMENTS", bad)
    with pytest.raises(cpu_env.InstallError) as e:
        cpu_env.ensure_installed(lambda _msg: None)
    assert "install requirements.txt" in str(e.value) and "this is not" in str(e.value)
    tier = tmp_path / "cache" / "sglang-cpu"
    assert sorted(p.name for p in tier.iterdir()) == [".install.lock"], "a half-built venv was left behind"
    assert not cpu_env.is_installed()
