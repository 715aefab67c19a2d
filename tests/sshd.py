"""A real OpenSSH sshd on 127.0.0.1 with throw-away keys, for tests and benchmarks.

    with Sshd() as sshd:
        sshd.target        # "root@127.0.0.1:PORT"
        sshd.known_hosts   # a known_hosts file that trusts this server's key
        sshd.ssh_config    # client config with `Host gpubox` (sshd.alias)

Everything lives in one temp dir; nothing under ~/.ssh is touched.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def sshd_missing() -> str | None:
    """Why a real sshd cannot run here, or None when it can."""
    if not os.path.exists(SSHD):
        return f"{SSHD} not found (apt-get install openssh-server)"
    if not shutil.which("ssh-keygen"):
        return "ssh-keygen not found (apt-get install openssh-client)"
    return None


def privsep_dir(path: str = "/run/sshd") -> None:
    """sshd run as root refuses a privilege-separation directory that group or others
    may write. The tests run under umask 002 (conftest), so a directory made here, or
    left by an older run of them on a machine whose /run was emptied by a reboot, needs
    its mode set: mkdir's mode is masked by the umask."""
    os.makedirs(path, exist_ok=True)
    mode = os.stat(path).st_mode & 0o7777
    if mode & 0o022:
        os.chmod(path, mode & ~0o022)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path, comment: str) -> str:
    """Make an ed25519 key pair at `path`; return the public key line."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path.with_suffix(".pub").read_text().strip()


class Sshd:
    """Start `sshd -D -e -f CFG` on a free loopback port; stop() or use as a context manager."""

    alias = "gpubox"

    def __init__(self, root: str | os.PathLike[str] | None = None, *, sftp: bool = True,
                 env: dict[str, str] | None = None) -> None:
        """`sftp=False` leaves out the SFTP subsystem (as hardened hosts do); `env` is
        set in every session (SetEnv), e.g. a PATH that puts a fake `python3` first."""
        self._own_root = root is None
        self.sftp = sftp
        self.env = env or {}
        self.root = Path(root or tempfile.mkdtemp(prefix="eagle3-sshd-"))
        self.host = "127.0.0.1"
        self.user = getpass.getuser()
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.agent_proc: subprocess.Popen[bytes] | None = None

    # Paths of the throw-away material.
    @property
    def host_key(self) -> Path:
        return self.root / "ssh_host_ed25519_key"

    @property
    def client_key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.root / "ssh_config"

    @property
    def log(self) -> Path:
        return self.root / "sshd.log"

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def host_key_line(self) -> str:
        """The known_hosts line for this server, `[127.0.0.1]:PORT ssh-ed25519 AAAA…`."""
        alg, blob = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"[{self.host}]:{self.port} {alg} {blob}"

    def start(self, timeout: float = 10.0) -> Sshd:
        reason = sshd_missing()
        if reason:
            raise RuntimeError(reason)
        if os.geteuid() == 0:  # as root, sshd insists on its privilege-separation directory,
            privsep_dir()  # owned by root and writable by root alone
        self.root.mkdir(parents=True, exist_ok=True)
        keygen(self.host_key, "eagle3-test-host")
        user_pub = keygen(self.client_key, "eagle3-test-user")
        (self.root / "authorized_keys").write_text(user_pub + "\n")
        self.port = free_port()
        cfg = self.root / "sshd_config"
        cfg.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    f"ListenAddress {self.host}",
                    f"HostKey {self.host_key}",
                    f"PidFile {self.root / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "StrictModes no",
                    "UsePAM no",
                    *(["Subsystem sftp internal-sftp"] if self.sftp else []),
                    *([f"SetEnv {' '.join(f'{k}={v}' for k, v in self.env.items())}"]
                      if self.env else []),
                    "MaxStartups 100",
                    "LogLevel INFO",
                    "",
                ]
            )
        )
        self.known_hosts.write_text(self.host_key_line() + "\n")
        self.ssh_config.write_text(
            "\n".join(
                [
                    f"Host {self.alias}",
                    f"    HostName {self.host}",
                    f"    Port {self.port}",
                    f"    User {self.user}",
                    f"    IdentityFile {self.client_key}",
                    "    IdentitiesOnly yes",
                    f"    UserKnownHostsFile {self.known_hosts}",
                    "    StrictHostKeyChecking yes",
                    "    BatchMode yes",
                    "",
                ]
            )
        )
        log = open(self.log, "wb")
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(cfg)], stdout=log, stderr=log, stdin=subprocess.DEVNULL
        )
        log.close()
        deadline = time.monotonic() + timeout
        while b"Server listening" not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                out = self.log.read_text(errors="replace").strip().splitlines()
                self.stop()
                raise RuntimeError(f"sshd did not start: {out[-1] if out else 'no output'}")
            time.sleep(0.02)
        return self

    def start_ssh_agent(self, timeout: float = 10.0) -> str:
        """Run an ssh-agent holding the client key; return its socket (for SSH_AUTH_SOCK)."""
        sock = self.root / "agent.sock"
        if self.agent_proc is None:
            self.agent_proc = subprocess.Popen(
                ["ssh-agent", "-D", "-a", str(sock)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + timeout
            while not sock.exists():
                if self.agent_proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("ssh-agent did not start")
                time.sleep(0.02)
            env = dict(os.environ, SSH_AUTH_SOCK=str(sock))
            subprocess.run(
                ["ssh-add", "-q", str(self.client_key)], env=env, check=True, capture_output=True
            )
        return str(sock)

    def stop(self) -> None:
        for name in ("proc", "agent_proc"):
            proc = getattr(self, name)
            setattr(self, name, None)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Sshd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
