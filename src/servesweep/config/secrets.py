"""Where an API key comes from: an environment variable, a file of its own, or an Ansible Vault file.

The key itself never goes into an experiment file, a command line or an artifact; only the NAME of a variable or
the PATH of a file does. Every failure here is a SecretError that names the experiment key and the file, and says
nothing of the key's content.

How the key travels: a front door (`servesweep load`, `servesweep run`) reads it once from its source and holds it
in this process (`hold_key`, never in os.environ); its points name KEY_ENV, and `child_env` gives a Locust child
that one variable in the environment it is started with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servesweep.config.point import LoadPoint

import os
import stat
from pathlib import Path

# The standard variable ansible-vault and ansible-playbook read a vault password file from.
VAULT_PASSWORD_ENV = "ANSIBLE_VAULT_PASSWORD_FILE"
# The one name the API key travels under to a Locust process (its environment) and that the points of a front door
# name as their api_key_env.
KEY_ENV = "SERVESWEEP_API_KEY"
# The key a front door read, held in this process only (not in os.environ: every child would inherit it).
_held: dict[str, str] = {}


class SecretError(ValueError):
    """A key or password that cannot be read; the message names where it was looked for, never its value."""


def read_key_file(path: str | os.PathLike, *, what: str = "API key file") -> str:
    """The key a file holds (its content, surrounding whitespace stripped).

    Refused, as ssh refuses a private key, when the group or others may read or write it (chmod 600), when it is
    not a regular file, or when it is empty."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except FileNotFoundError:
        raise SecretError(f"{what} {p}: no such file") from None
    except OSError as e:
        raise SecretError(f"{what} {p}: cannot read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise SecretError(f"{what} {p}: not a regular file")
    if st.st_mode & 0o077:
        raise SecretError(
            f"{what} {p}: permissions {stat.S_IMODE(st.st_mode):04o} are too open (group or others may access it); "
            f"run: chmod 600 {p}"
        )
    try:
        key = p.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        raise SecretError(f"{what} {p}: not UTF-8 text") from None
    except OSError as e:
        raise SecretError(f"{what} {p}: cannot read: {e.strerror}") from None
    return _one_line(key, f"{what} {p}: the file")


def _one_line(key: str, where: str) -> str:
    """A key is one non-empty line (a file's or a vault's content, already stripped)."""
    if not key:
        raise SecretError(f"{where} is empty")
    if "\n" in key or "\r" in key:
        raise SecretError(f"{where} holds more than one line; a key is one line")
    return key


def vault_password_file(explicit: str | os.PathLike | None) -> Path:
    """The vault password file: the one given, else $ANSIBLE_VAULT_PASSWORD_FILE."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get(VAULT_PASSWORD_ENV)
    if env:
        return Path(env).expanduser()
    raise SecretError(
        f"no vault password: set launcher.vault_password_file or the environment variable {VAULT_PASSWORD_ENV}"
    )


def read_vault_key(path: str | os.PathLike, password_file: str | os.PathLike | None = None) -> str:
    """Decrypt an Ansible Vault file in-process (ansible-core's VaultLib) and return the key it holds (stripped).

    The password comes from `password_file` (else $ANSIBLE_VAULT_PASSWORD_FILE); that file must be private too.
    The vault file may be a whole encrypted file (`ansible-vault encrypt`) holding just the key."""
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import VaultLib, VaultSecret, is_encrypted

    p = Path(path).expanduser()
    pw_path = vault_password_file(password_file)
    password = read_key_file(pw_path, what="vault password file")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise SecretError(f"vault file {p}: no such file") from None
    except OSError as e:
        raise SecretError(f"vault file {p}: cannot read: {e.strerror}") from None
    if not is_encrypted(data):
        raise SecretError(
            f"vault file {p}: not an Ansible Vault file (expected $ANSIBLE_VAULT;... at its start)"
        )
    vault = VaultLib([("default", VaultSecret(password.encode()))])
    try:
        plain = vault.decrypt(data)
    except AnsibleError:
        # Ansible's message may quote the file; it never holds the password, but keep ours short and certain
        raise SecretError(
            f"vault file {p}: cannot decrypt it with the password from {pw_path} (wrong password?)"
        ) from None
    try:
        key = plain.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise SecretError(f"vault file {p}: the decrypted content is not UTF-8 text") from None
    return _one_line(key, f"vault file {p}: the decrypted content")


def resolve_api_key(
    *,
    env: str | None = None,
    file: str | os.PathLike | None = None,
    vault: str | os.PathLike | None = None,
    vault_password_file: str | os.PathLike | None = None,
    prefix: str = "launcher.",
) -> str | None:
    """The API key from at most one source (None when none is given). `prefix` names the keys in messages
    (`launcher.api_key_file`), so an error says which setting of which file is wrong."""
    given = [n for n, v in (("api_key_env", env), ("api_key_file", file), ("api_key_vault", vault)) if v]
    if len(given) > 1:
        raise SecretError(f"give at most one of {', '.join(prefix + g for g in given)}")
    try:
        if env:
            key = os.environ.get(env, "")
            if not key:
                raise SecretError(f"the environment variable {env} is not set (or empty)")
            return key
        if file:
            return read_key_file(file)
        if vault:
            return read_vault_key(vault, vault_password_file)
    except SecretError as e:
        raise SecretError(f"{prefix}{given[0]}: {e}") from None
    return None


def hold_key(key: str | None) -> str | None:
    """Hold the key a front door read under KEY_ENV, in this process only; returns the name its points give as
    api_key_env (None without a key)."""
    if not key:
        _held.pop(KEY_ENV, None)
        return None
    _held[KEY_ENV] = key
    return KEY_ENV


def drop_key() -> None:
    _held.pop(KEY_ENV, None)


def env_key(name: str) -> str | None:
    """The key under a variable NAME: the one this process holds, else its environment's (None: unset or empty)."""
    return _held.get(name) or os.environ.get(name) or None


def api_key_for(point: LoadPoint) -> str | None:
    """The API key of the variable the point names (never from the point itself)."""
    name = point.api_key_env
    if name is None:
        return None
    key = env_key(name)
    if not key:
        raise ValueError(f"api_key_env: the environment variable {name} is not set or empty")
    return key


def child_env(point: LoadPoint, base: dict[str, str] | None = None) -> tuple[LoadPoint, dict[str, str]]:
    """The point a Locust child gets and the environment to start it with: the point's key under KEY_ENV, the one
    name (and the point says so); no key: KEY_ENV is left out, so an inherited one cannot leak into the run."""
    env = dict(os.environ if base is None else base)
    env.pop(KEY_ENV, None)
    key = api_key_for(point)
    if key is None:
        return point, env
    env[KEY_ENV] = key
    return point.model_copy(update={"api_key_env": KEY_ENV}), env
