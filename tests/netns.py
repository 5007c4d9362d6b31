"""Hosts in network namespaces for multi-host tests: real TCP between real addresses, Debian's sshd per host.

`hosts(["master", "w1", ...], ssh=["w1", ...])` (a context manager) builds, for one test:
- a "switch" namespace holding a Linux bridge, and per host a namespace joined to it by a veth pair, with an
  address in 10.201.0.0/24 (only inside these namespaces: this machine's own network is never touched);
- for the hosts in `ssh`, sshd on the host's address (port 22) with a throwaway host key, root login by a
  throwaway key pair, its own host name (a UTS namespace, so records' host:pid name the host), sftp for Ansible;
- `inventory_vars(via)`: what an Ansible inventory needs to reach those sshds from this namespace: SSH through a
  ProxyCommand that relays from inside the namespace `via` (the controller sits on that host, as it would in a lab).
Faults, for the tests of a night across machines: `net.cut(a, b)` drops every packet between two hosts (a blackhole
route on each side: no reset, no ICMP, as a dead switch port or a firewall would) and `net.heal(a, b)` lifts it;
`net.kill_host(name)` takes the host's link down and SIGKILLs every process in its namespace (its sshd too): a power
loss, no connection closed;
`net.revive(name)` brings the link up and, for an ssh host, starts its sshd again.
Teardown always runs: every process in the namespaces is killed (by its pid, from `ip netns pids`), then the
namespaces (and with them the veths and the bridge) are deleted.

`python netns.py relay HOST PORT [DROP_FILE]` is that ProxyCommand relay (stdin/stdout <-> TCP). With DROP_FILE
(`inventory_vars(via, drop=...)`) it numbers the connections it is asked for and closes those the file lists (e.g.
"2,5") at once, before reaching the host: a connection lost while it is made, as a flaky link or an sshd past its
MaxStartups does it (ssh exits 255). NETNS_SSH_DEBUG (environment): ssh options added to every connection, e.g.
" -o LogLevel=DEBUG1 -E /tmp/ssh.log", to see why one failed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.201.0"
SSHD = "/usr/sbin/sshd"


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


@dataclass
class Host:
    name: str
    ns: str
    addr: str

    def prefix(self, hostname: bool = True) -> list[str]:
        """Run a command inside this host: its network namespace and, by default, its own host name."""
        p = ["ip", "netns", "exec", self.ns]
        if hostname:
            p += ["unshare", "--uts", "sh", "-c", f'hostname {self.name} && exec "$@"', "sh"]
        return p


@dataclass
class Net:
    tmp: Path  # keys, sshd configs and logs
    prefix: str
    hosts: dict[str, Host] = field(default_factory=dict)
    procs: list[subprocess.Popen] = field(default_factory=list)
    key: Path | None = None  # private key that logs in as root on every sshd

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def popen(self, host: str, argv: list[str], log: Path, **kw) -> subprocess.Popen:
        """Start argv inside `host` in its own process group, output to `log`; killed at teardown."""
        with open(log, "ab") as f:
            p = subprocess.Popen(
                [*self.hosts[host].prefix(), *argv],
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                **kw,
            )
        self.procs.append(p)
        return p

    def run(self, host: str, argv: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.hosts[host].prefix(), *argv], capture_output=True, text=True, timeout=timeout, **kw
        )

    def wait_http(self, via: str, url: str, timeout: float = 30) -> None:
        """Wait until GET url answers 200, trying from inside `via` (one process, bounded)."""
        code = (
            "import sys,time,urllib.request\n"
            f"end=time.monotonic()+{timeout}\n"
            "while True:\n"
            "    try:\n"
            f"        urllib.request.urlopen({url!r},timeout=2).close(); sys.exit(0)\n"
            "    except Exception as e:\n"
            "        if time.monotonic()>end: sys.exit(f'{e}')\n"
            "        time.sleep(0.05)\n"
        )
        r = self.run(via, [sys.executable, "-I", "-S", "-c", code], timeout=timeout + 10)
        if r.returncode != 0:
            raise RuntimeError(
                f"{url} did not answer 200 from {via} within {timeout:g} s: {r.stderr.strip()}"
            )

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between hosts a and b, both ways (connections stay open, nothing answers)."""
        _ip("-n", self.hosts[a].ns, "route", "add", "blackhole", f"{self.hosts[b].addr}/32")
        _ip("-n", self.hosts[b].ns, "route", "add", "blackhole", f"{self.hosts[a].addr}/32")

    def heal(self, a: str, b: str) -> None:
        _ip("-n", self.hosts[a].ns, "route", "del", "blackhole", f"{self.hosts[b].addr}/32")
        _ip("-n", self.hosts[b].ns, "route", "del", "blackhole", f"{self.hosts[a].addr}/32")

    def kill_host(self, name: str) -> list[int]:
        """The host dies: SIGKILL every process in its namespace (by pid, from `ip netns pids`), link down.
        Returns the pids killed."""
        ns = self.hosts[name].ns
        _ip("-n", ns, "link", "set", "eth0", "down")
        r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=20)
        pids = [int(p) for p in r.stdout.split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def revive(self, name: str) -> None:
        """The host is back: link up (its address and subnet route return with it), its sshd started again."""
        h = self.hosts[name]
        _ip("-n", h.ns, "link", "set", "eth0", "up")
        if (self.tmp / f"sshd-{name}.conf").is_file():
            _start_sshd(self, h)
            _wait_port(self, next(iter(self.hosts)), h.addr, 22)

    def inventory_vars(self, via: str, drop: Path | None = None, control_master: bool = True) -> str:
        """INI `[group:vars]` lines for ssh to these hosts from this machine, relayed from inside `via`. `drop`: a
        file naming the connections (1, 2, ...) the relay closes as they are made. `control_master`: one shared
        connection per host (else every task connects anew). Modules are pipelined by servesweep's own default
        (driver/ansible.py PIPELINING), not by these lines: the tests run what a user's inventory gets."""
        relay = f"ip netns exec {self.hosts[via].ns} {sys.executable} -I -S {Path(__file__).resolve()} relay %h %p"
        if drop is not None:
            relay += f" {drop}"
        shared = f"-o ControlMaster=auto -o ControlPersist=30s -o ControlPath={self.tmp}/cp-%C"
        return (
            "ansible_user=root\n"
            f"ansible_ssh_private_key_file={self.key}\n"
            "ansible_python_interpreter=/usr/bin/python3\n"
            f'ansible_ssh_common_args=\'-o ProxyCommand="{relay}" -o UserKnownHostsFile=/dev/null '
            # a host that dies without closing its connections (kill_host): the shared connection notices in 9 s
            "-o ServerAliveInterval=3 -o ServerAliveCountMax=3 "
            "-o StrictHostKeyChecking=no -o LogLevel=ERROR" + os.environ.get("NETNS_SSH_DEBUG", "") + "'\n"
            # A control path of our own (short: unix socket paths are limited) so runs never share masters
            f"ansible_ssh_args='{shared if control_master else '-o ControlMaster=no -o ControlPath=none'}'\n"
        )


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "servesweep-test", "-f", str(path)],
        check=True,
        timeout=30,
    )


def _start_sshd(net: Net, h: Host) -> None:
    hostkey = net.tmp / f"hostkey-{h.name}"
    if not hostkey.is_file():
        _keygen(hostkey)
    cfg = net.tmp / f"sshd-{h.name}.conf"
    cfg.write_text(
        f"ListenAddress {h.addr}:22\n"
        f"HostKey {hostkey}\n"
        f"AuthorizedKeysFile {net.tmp}/authorized_keys\n"
        "PidFile none\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "PrintMotd no\n"
        "UseDNS no\n"
        "MaxStartups 50\n"
        "MaxSessions 50\n"
        "Subsystem sftp internal-sftp\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    net.popen(h.name, [SSHD, "-D", "-e", "-f", str(cfg)], net.tmp / f"sshd-{h.name}.log")


def _wait_port(net: Net, via: str, addr: str, port: int, timeout: float = 20) -> None:
    """Wait until addr:port accepts TCP, trying from inside `via` (one process, bounded)."""
    code = (
        "import socket,sys,time\n"
        f"end=time.monotonic()+{timeout}\n"
        "while True:\n"
        "    try:\n"
        f"        socket.create_connection(({addr!r},{port}),timeout=1).close(); sys.exit(0)\n"
        "    except OSError as e:\n"
        "        if time.monotonic()>end: sys.exit(f'not listening: {e}')\n"
        "        time.sleep(0.05)\n"
    )
    r = net.run(via, [sys.executable, "-I", "-S", "-c", code], timeout=timeout + 10)
    if r.returncode != 0:
        raise RuntimeError(f"{addr}:{port} not reachable from {via} within {timeout:g} s: {r.stderr.strip()}")


@contextlib.contextmanager
def hosts(names: list[str], ssh: list[str] = ()) -> Iterator[Net]:
    """Namespaces for `names` (addresses 10.201.0.1, .2, ... in order), sshd on those in `ssh`."""
    if os.geteuid() != 0:
        raise RuntimeError("network namespaces need root (ip netns add)")
    for tool in ("ip", "unshare", "ssh-keygen", SSHD):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is missing: apt-get install iproute2 openssh-server openssh-client")
    tmp = Path(tempfile.mkdtemp(prefix="ssn"))  # short: it holds ssh control sockets
    net = Net(tmp=tmp, prefix=f"ssw{os.getpid()}x{int(time.time() * 1000) % 100000}")
    made: list[str] = []
    try:
        sw = f"{net.prefix}-sw"
        _ip("netns", "add", sw)
        made.append(sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        for i, name in enumerate(names, start=1):
            h = Host(name=name, ns=f"{net.prefix}-{name}", addr=f"{SUBNET}.{i}")
            _ip("netns", "add", h.ns)
            made.append(h.ns)
            _ip("-n", sw, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", h.ns)
            _ip("-n", sw, "link", "set", f"v{i}", "master", "br0", "up")
            _ip("-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", "eth0")
            _ip("-n", h.ns, "link", "set", "eth0", "up")
            _ip("-n", h.ns, "link", "set", "lo", "up")
            net.hosts[name] = h
        if ssh:
            net.key = tmp / "id_ed25519"
            _keygen(net.key)
            (tmp / "authorized_keys").write_text((tmp / "id_ed25519.pub").read_text())
            for name in ssh:
                _start_sshd(net, net.hosts[name])
            via = names[0]
            for name in ssh:
                _wait_port(net, via, net.hosts[name].addr, 22)
        yield net
    finally:
        _teardown(net, made)


def _teardown(net: Net, made: list[str]) -> None:
    for p in net.procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
    # Everything else still inside the namespaces was started by this test (sshd sessions, relays, workers)
    for ns in made:
        r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=20)
        for pid in r.stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
    for p in net.procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(5)
    for ns in reversed(made):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
    shutil.rmtree(net.tmp, ignore_errors=True)


def relay(host: str, port: int, drop: str | None = None) -> None:
    """stdin -> TCP host:port -> stdout, until both directions end (an ssh ProxyCommand); `drop`: see the module."""
    if drop is not None and _numbered_connection(Path(drop)) in _dropped(Path(drop)):
        sys.exit(1)
    s = socket.create_connection((host, port), timeout=10)
    s.settimeout(None)

    def up() -> None:
        while data := os.read(0, 65536):
            s.sendall(data)
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_WR)

    threading.Thread(target=up, daemon=True).start()
    while data := s.recv(65536):
        os.write(1, data)


def _dropped(drop: Path) -> set[int]:
    return {int(n) for n in drop.read_text().replace(",", " ").split()}


def _numbered_connection(drop: Path) -> int:
    """This connection's number (1, 2, ...), counted in DROP_FILE.count under a lock (ssh connects in parallel)."""
    import fcntl

    with open(drop.with_name(drop.name + ".count"), "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = len(f.read()) + 1
        f.write(".")
        return n


if __name__ == "__main__":
    if len(sys.argv) in (4, 5) and sys.argv[1] == "relay":
        relay(sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) == 5 else None)
    else:
        sys.exit("usage: netns.py relay HOST PORT [DROP_FILE]")
