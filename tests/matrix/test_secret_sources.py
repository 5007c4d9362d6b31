"""API keys from a 0600 file (launcher.api_key_file) and from an Ansible Vault file (launcher.api_key_vault, its
password from ANSIBLE_VAULT_PASSWORD_FILE or launcher.vault_password_file): a matrix runs with each against the
emulator started with the key (the SGLang path through `--config`, the generic path through {api_key_config}), the
server enforces it (401 without it), and neither the key nor the vault password appears in any file of the run, the
console output, the server's working files other than the 0600 secret files, or any process's command line. A bad
source (open permissions, wrong password, missing file) stops the run before any server starts, naming the key and
the file."""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support import SERVESWEEP
from test_reliability_server import cleanup, manifest, run_dir_of, write_experiment
from test_secrets import _scan_cmdlines, wait_probing_without_key

from servesweep.config.secrets import SecretError, read_key_file, read_vault_key, resolve_api_key

# A generic server that reads its key from an environment variable (launcher.server_api_key_env: the role's launch
# script loads it from the 0600 secret.key): the emulator, handed the variable's value through a here-document, so
# the key is on no command line here either.
GENERIC = (
    '["sh", "-c", "exec \\"$0\\" -m servesweep.sim \\"$@\\" --config /dev/fd/3 3<<EOF\\napi-key: $SS_TEST_KEY\\nEOF\\n", '
    '"{python}", "--model-path", "{model_path}", "--host", "{host}", "--port", "{port}", "--sim-load-time", "0.1"]'
)


def private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def make_vault(tmp: Path, key: str, password: str) -> tuple[Path, Path]:
    """A real vault file made by the ansible-vault CLI (the password from a file, never on its command line)."""
    pw = private(tmp / "vault-pass", password + "\n")
    vault = private(tmp / "key.vault", key + "\n")
    subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-vault"),
            "encrypt",
            "--vault-password-file",
            str(pw),
            str(vault),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert vault.read_text().startswith("$ANSIBLE_VAULT;") and key not in vault.read_text()
    return vault, pw


def experiment(tmp: Path, launcher_lines: str, *, generic: bool) -> Path:
    exp = write_experiment(tmp, retries=0, name="keys", needle_probes=True)
    text = (
        exp.read_text()
        .replace("concurrency: [1, 2]", "concurrency: [2]")
        .replace("output_tokens: 160", "output_tokens: 8")
    )
    text = text.replace("  sim_args:", launcher_lines + "  sim_args:")
    if generic:  # the same emulator, launched as a generic server through the template
        text = text.replace("sglang_version: 0.5.23\n", "").replace(
            "  emulator: true\n", f"  command: {GENERIC}\n  server_api_key_env: SS_TEST_KEY\n"
        )
        text = text.replace("  sim_args: {sim_load_time: 0.1}\n", f"  python: {sys.executable}\n")
    exp.write_text(text)
    return exp


def run_and_search(tmp: Path, exp: Path, key: str, password: str, env: dict[str, str]) -> dict:
    runs, srv = tmp / "runs", tmp / "srv"
    needles = [key.encode(), password.encode()]
    hits: list[str] = []
    scans: list[int] = []
    stop = threading.Event()
    scanners = [
        threading.Thread(target=_scan_cmdlines, args=(n, hits, stop, scans), daemon=True) for n in needles
    ]
    for t in scanners:
        t.start()
    proc = subprocess.Popen(
        [*SERVESWEEP, "run", str(exp), "--out", str(runs)],
        cwd=tmp,
        stdout=open(tmp / "run.log", "wb"),  # noqa: SIM115 - closed with the process
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1", **env),
    )
    run_dir, refused = None, None
    try:
        run_dir, refused = wait_probing_without_key(proc, runs)
        rc = proc.wait(timeout=60)
    finally:
        stop.set()
        for t in scanners:
            t.join(timeout=10)
        cleanup(proc, run_dir, srv)
    out = (tmp / "run.log").read_text()
    assert rc == 0, out[-3000:]
    m = manifest(run_dir)
    assert all(p["status"] == "done" for p in m["points"].values()), m["points"]
    assert all(json.loads((run_dir / p["dir"] / "summary.json").read_text())["requests"]["ok"] == 3 for p in m["points"].values())
    assert refused == 401, f"a request without the key got {refused}: the server did not enforce it"
    assert len(scans) > 20, "the process list was scanned while the run went"
    assert not hits, f"a secret is on a command line: {hits[0][:300]}"
    for n in needles:
        assert n.decode() not in out
        files = [f for f in run_dir.rglob("*") if f.is_file()]
        assert len(files) > 10 and any("ansible" in f.parts for f in files)
        leaked = [str(f) for f in files if n in f.read_bytes()]
        assert not leaked, leaked
    # on the server host: only 0600 files hold the key (the secret files; the server's own log, where SGLang and
    # the emulator log it at start); nothing there holds the vault password
    workdir = next(srv.iterdir())
    holders = sorted(f.name for f in workdir.rglob("*") if f.is_file() and key.encode() in f.read_bytes())
    assert holders and set(holders) <= {"secret.yaml", "secret.key", "secret.env", "server.log"}, holders
    for name in holders:
        assert stat.S_IMODE((workdir / name).stat().st_mode) == 0o600, name
    assert not [f for f in workdir.rglob("*") if f.is_file() and password.encode() in f.read_bytes()]
    return m


def test_a_key_from_a_0600_file_runs_the_matrix_and_leaks_nowhere(tmp_path):
    key = "sk-file-" + secrets.token_hex(16)
    keyfile = private(tmp_path / "api.key", f"  {key}\n\n")  # surrounding whitespace is not part of the key
    exp = experiment(tmp_path, f"  api_key_file: {keyfile.name}\n", generic=False)  # relative to the file
    run_and_search(tmp_path, exp, key, "no-password-here", {})


def test_a_key_from_an_ansible_vault_reaches_a_generic_server_through_its_env_and_leaks_nowhere(tmp_path):
    key = "sk-vault-" + secrets.token_hex(16)
    password = "pw-" + secrets.token_hex(12)
    vault, pw = make_vault(tmp_path, key, password)
    exp = experiment(tmp_path, f"  api_key_vault: {vault}\n", generic=True)
    m = run_and_search(tmp_path, exp, key, password, {"ANSIBLE_VAULT_PASSWORD_FILE": str(pw)})
    cid = next(iter(m["configs"]))
    info = json.loads((run_dir_of(tmp_path / "runs") / "servers" / cid / "server_info.json").read_text())
    assert info["server"] == "generic" and info["argv"][:2] == ["sh", "-c"]
    assert info["argv"][3:6] == [
        sys.executable,
        "--model-path",
        "Qwen/Qwen3.6-27B",
    ]  # the template's args, then the flags
    launch = (next((tmp_path / "srv").iterdir()) / "launch.sh").read_text()
    assert 'SS_TEST_KEY="$(cat ' in launch and "secret.key" in launch


def test_bad_key_sources_stop_the_run_before_any_server_starts(tmp_path):
    key = "sk-bad-" + secrets.token_hex(8)
    vault, pw = make_vault(tmp_path, key, "right-password")
    wrong = private(tmp_path / "wrong-pass", "wrong-password\n")
    loose = tmp_path / "loose.key"
    loose.write_text(key)
    loose.chmod(0o644)
    cases = [
        (
            f"  api_key_file: {loose}\n",
            {},
            f"launcher.api_key_file: API key file {loose}: permissions 0644 are too open",
        ),
        (
            f"  api_key_vault: {vault}\n  vault_password_file: {wrong}\n",
            {},
            f"launcher.api_key_vault: vault file {vault}: cannot decrypt it with the password from {wrong}",
        ),
        (
            f"  api_key_vault: {tmp_path / 'missing.vault'}\n",
            {"ANSIBLE_VAULT_PASSWORD_FILE": str(pw)},
            f"launcher.api_key_vault: vault file {tmp_path / 'missing.vault'}: no such file",
        ),
        (
            f"  api_key_vault: {vault}\n",
            {"ANSIBLE_VAULT_PASSWORD_FILE": ""},
            "launcher.api_key_vault: no vault password: set launcher.vault_password_file or the environment "
            "variable ANSIBLE_VAULT_PASSWORD_FILE",
        ),
    ]
    for lines, env, want in cases:
        exp = experiment(tmp_path, lines, generic=False)
        r = subprocess.run(
            [*SERVESWEEP, "run", str(exp), "--out", str(tmp_path / "runs")],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ, **env),
        )
        assert r.returncode == 2, r.stdout + r.stderr  # could not run (servesweep.exit_codes)
        assert want in " ".join(r.stderr.split()), r.stderr
        assert key not in r.stdout + r.stderr and "right-password" not in r.stdout + r.stderr
        assert not (tmp_path / "srv").exists() and not (tmp_path / "runs").exists()
    # two sources at once: an experiment error naming both
    exp = experiment(tmp_path, f"  api_key_file: {loose}\n  api_key_env: SOME_KEY\n", generic=False)
    r = subprocess.run([*SERVESWEEP, "run", str(exp)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "give at most one of launcher.api_key_env, launcher.api_key_file" in r.stderr


def test_read_key_file_and_vault_in_process(tmp_path):
    key = "sk-" + secrets.token_hex(8)
    assert read_key_file(private(tmp_path / "k", f"\t{key} \n")) == key
    with pytest.raises(SecretError, match="the file is empty"):
        read_key_file(private(tmp_path / "empty", " \n"))
    with pytest.raises(SecretError, match="not a regular file"):
        read_key_file(tmp_path)
    vault, pw = make_vault(tmp_path, key, "pw")
    assert read_vault_key(vault, pw) == key
    with pytest.raises(SecretError, match="not an Ansible Vault file"):
        read_vault_key(pw, pw)
    assert resolve_api_key() is None
