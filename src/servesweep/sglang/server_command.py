"""The server's command line, built in one place: SGLang's `launch_server`, the emulator, or a generic
OpenAI-compatible server's argv template with its placeholders filled in; then the flags spelled for the version.

The controller (matrix/orchestrator.py `role_vars`) hands the finished list to the sglang_server role as
`sglang_server_argv`; the role writes it into its launch script, unit or `docker run` and holds no argv logic of its
own. The API key is never a word of it: SGLang and the emulator get `--config <workdir>/secret.yaml` (a 0600 file the
role writes), a generic server `{api_key_file}` / `{api_key_config}` or an environment variable read from a file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from servesweep.sglang.flags import render_argv

# What a generic server's argv template may name; the key files are 0600 files on the server's host.
PLACEHOLDERS = ("python", "model_path", "host", "port", "served_model_name", "api_key_file", "api_key_config")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Inside a container the key files are mounted here (docker-run.sh.j2's -v).
CONTAINER_SECRETS = "/run/servesweep"

ServerKind = Literal["sglang", "emulator", "generic"]
LauncherKind = Literal["process", "systemd", "docker"]


@dataclass(frozen=True)
class ServerLaunch:
    """Everything the command line of one server start depends on."""

    kind: ServerKind
    launcher: LauncherKind
    python: str  # the interpreter on the server's host (SGLang, the emulator, `{python}`)
    model_path: str
    port: int
    bind: str  # the address the server listens on (a container listens on all: docker's -p decides who reaches it)
    workdir: str  # the role's folder on the host (the key files)
    version: str = ""  # SGLang's version: its flag spellings, the emulated version
    flags: Mapping[str, Any] = field(default_factory=dict)  # the configuration's flags, experiment names
    served_model_name: str = ""
    command: Sequence[str] = ()  # a generic server's argv template
    sim_gpu: str = ""
    sim_args: Mapping[str, Any] = field(default_factory=dict)  # the emulator's --sim-* options
    extra_spec_algorithms: Sequence[str] = ()  # speculative algorithms the emulated version should also accept
    api_key: bool = False  # whether the server is started with an API key (the word is never here)

    def argv(self) -> list[str]:
        """The full argv: entry point, model and address, flags, and `--config` for the key file."""
        host = "0.0.0.0" if self.launcher == "docker" else self.bind
        if self.kind == "generic":
            return self._generic(host) + render_argv(dict(self.flags), None)
        if self.kind == "emulator":
            words = [self.python, "-m", "servesweep.sim", "--sim-sglang-version", self.version]
            if self.sim_gpu:
                words += ["--sim-gpu", self.sim_gpu]
            if self.extra_spec_algorithms:
                words += ["--sim-extra-spec-algorithms", ",".join(self.extra_spec_algorithms)]
            if self.power_limited:
                # the power limit the role sets through the emulator's NVML stand-in (tasks/power_limit.yml)
                words += ["--sim-nvml-state", f"{self.workdir}/sim_nvml.json"]
            words += render_argv(dict(self.sim_args), None)
        else:
            words = ["python3" if self.launcher == "docker" else self.python, "-m", "sglang.launch_server"]
        words += ["--model-path", self.model_path, "--host", host, "--port", str(self.port)]
        if self.served_model_name:
            words += ["--served-model-name", self.served_model_name]
        words += render_argv(dict(self.flags), self.version)
        if self.api_key:
            words += ["--config", f"{self._secrets_dir}/secret.yaml"]
        return words

    @property
    def power_limited(self) -> bool:
        """Whether this configuration sets the GPUs' power limit (a host setting the role applies)."""
        return self.flags.get("gpu_power_limit_w") not in (None, "")

    @property
    def _secrets_dir(self) -> str:
        return CONTAINER_SECRETS if self.launcher == "docker" else self.workdir

    def _generic(self, host: str) -> list[str]:
        values = {
            "python": self.python,
            "model_path": self.model_path,
            "host": host,
            "port": str(self.port),
            "served_model_name": self.served_model_name or self.model_path,
            "api_key_file": f"{self._secrets_dir}/secret.key",
            "api_key_config": f"{self._secrets_dir}/secret.yaml",
        }

        def fill(m: re.Match[str]) -> str:
            if m.group(1) not in values:
                raise ValueError(
                    f"launcher.command: unknown placeholder {{{m.group(1)}}} in {m.string!r}; known: "
                    + " ".join(f"{{{p}}}" for p in PLACEHOLDERS)
                )
            return values[m.group(1)]

        if not self.command:
            raise ValueError("launcher.command is empty: a generic server needs its argv template")
        return [PLACEHOLDER.sub(fill, str(word)) for word in self.command]
