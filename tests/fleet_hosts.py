"""A fleet of SSH host aliases on 127.0.0.1, for the fleet tests and bench/bench_fleet.py.

`FleetHosts(root).add_sshd(sshd, n)` adds `n` aliases (h01, h02, …) onto one real sshd
(many aliases share a server: each alias is its own SSH connection and agent);
`add_refusing()` an alias onto a port nobody listens on, `add_unknown_key(sshd)` one
onto an sshd whose key is not in the fleet's known_hosts, `add_silent()` one onto a
socket that accepts and never says a word, `add_late(sshd)` one onto a port that a
test later forwards to `sshd`. `write()` writes the ssh config (for `-F`)
and the known_hosts file it names.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Iterator

import pytest

from tests.sshd import Sshd, free_port


class Silent:
    """A TCP port that completes the handshake (the kernel's backlog) and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = int(self.sock.getsockname()[1])

    def close(self) -> None:
        self.sock.close()


class FleetHosts:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.aliases: list[str] = []
        self._blocks: list[str] = []
        self._known: list[str] = []
        self.silent: list[Silent] = []

    @property
    def ssh_config(self) -> Path:
        return self.root / "fleet_ssh_config"

    @property
    def known_hosts(self) -> Path:
        return self.root / "fleet_known_hosts"

    def _alias(self, name: str | None, port: int, sshd: Sshd | None) -> str:
        name = name or f"h{len(self.aliases) + 1:02d}"
        lines = [f"Host {name}", "    HostName 127.0.0.1", f"    Port {port}"]
        if sshd is not None:
            lines += [f"    User {sshd.user}", f"    IdentityFile {sshd.client_key}", "    IdentitiesOnly yes"]
        lines += [f"    UserKnownHostsFile {self.known_hosts}", "    StrictHostKeyChecking yes",
                  "    BatchMode yes", ""]
        self._blocks.append("\n".join(lines))
        self.aliases.append(name)
        return name

    def add_sshd(self, sshd: Sshd, n: int = 1) -> list[str]:
        line = sshd.host_key_line()
        if line not in self._known:
            self._known.append(line)
        return [self._alias(None, sshd.port, sshd) for _ in range(n)]

    def add_refusing(self, name: str = "refusing") -> str:
        return self._alias(name, free_port(), None)  # free a moment ago: nothing listens

    def add_unknown_key(self, sshd: Sshd, name: str = "newkey") -> str:
        return self._alias(name, sshd.port, sshd)  # its key never goes into known_hosts

    def add_silent(self, name: str = "silent") -> str:
        s = Silent()
        self.silent.append(s)
        return self._alias(name, s.port, None)

    def add_late(self, sshd: Sshd, name: str = "late") -> int:
        """An alias onto a port nobody listens on yet, trusted with ``sshd``'s key: a test
        later forwards that port to ``sshd`` (a host that comes back). Returns the port."""
        port = free_port()
        self._known.append(sshd.host_key_line().replace(f"]:{sshd.port} ", f"]:{port} ", 1))
        self._alias(name, port, sshd)
        return port

    def write(self) -> Path:
        self.known_hosts.write_text("".join(k + "\n" for k in self._known))
        self.ssh_config.write_text("\n".join(self._blocks))
        return self.ssh_config

    def close(self) -> None:
        for s in self.silent:
            s.close()


@pytest.fixture
def fleet_hosts(sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FleetHosts]:
    """Three aliases onto the test sshd, then a refusing, an unknown-key and a silent one."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # only the test's own key is offered
    other = Sshd(tmp_path / "other").start()  # its key is never trusted
    hosts = FleetHosts(tmp_path / "fleet")
    hosts.add_sshd(sshd, 3)
    hosts.add_refusing()
    hosts.add_unknown_key(other)
    hosts.add_silent()
    hosts.write()
    yield hosts
    hosts.close()
    other.stop()
