"""SshLink: run the agent on a remote host over asyncssh, on the running loop.

Host keys are always verified against known_hosts. An unknown key is refused
with its fingerprint unless the caller explicitly accepts new keys; a changed
key is always refused. The agent files are uploaded by content hash, once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import shlex
import socket
import warnings
from pathlib import Path
from typing import Any

# cryptography >= 51 warns at asyncssh's import that DSA is deprecated: a line of library
# noise on the stderr of every command, before its own one-line message. Only that warning.
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh(\.|$)")

import asyncssh

from tui import trace

from . import hostpython
from .bundle import agent_bundle, default_agent_dir
from .errors import (
    AgentStartFailed,
    AuthFailed,
    ConfigError,
    HostKeyChanged,
    HostKeyUnknown,
    HostUnreachable,
    TransportError,
)
from .link import AgentStream
from .targets import parse_target


class SshLink:
    """The agent on `[user@]host[:port]` or an SSH config Host alias."""

    def __init__(
        self,
        target: str,
        *,
        ssh_config: str | os.PathLike[str] | None = None,
        known_hosts: str | os.PathLike[str] | None = None,
        accept_new_host_key: bool = False,
        python: str | None = None,
        cache_dir: str = ".cache/eagle3-tui",
        connect_timeout: float = 10,
        keepalive_interval: float = 15,
        runs_dir: str | None = None,
        agent_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        parsed = parse_target(target)
        if parsed.kind != "ssh":
            raise ConfigError(f"SshLink needs a remote target, not {target!r}")
        self.target = parsed
        self.ssh_config = str(ssh_config) if ssh_config else None
        self.known_hosts = str(known_hosts) if known_hosts else None
        self.accept_new_host_key = accept_new_host_key
        self.python = python  # None: the first of python3, python3.14 … python3.9 that is >= 3.9
        self.found: hostpython.Found | None = None  # the interpreter the agent runs on
        self.notice: str | None = None  # said once in the status bar (e.g. "no SFTP")
        # Paths relative to the remote home; a leading "~/" would not expand once quoted.
        self.cache_dir = cache_dir.removeprefix("~/")
        self.connect_timeout = connect_timeout
        self.keepalive_interval = keepalive_interval
        self.runs_dir = runs_dir
        self.agent_dir = Path(agent_dir) if agent_dir else default_agent_dir()
        self.uploads = 0  # how many times open() had to upload the agent (tests read it)
        self.remote_dir: str | None = None
        self._conn: asyncssh.SSHClientConnection | None = None
        self._where = "{}{}{}".format(
            f"{parsed.user}@" if parsed.user else "",
            parsed.host,
            f":{parsed.port}" if parsed.port else "",
        )

    def describe(self) -> str:
        return self._where

    # -- connecting -------------------------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "host": self.target.host,
            "port": self.target.port if self.target.port else (),
            "config": [self.ssh_config] if self.ssh_config else (),
            "connect_timeout": self.connect_timeout,
            "keepalive_interval": self.keepalive_interval,
        }
        if self.target.user:
            kw["username"] = self.target.user
        if self.known_hosts:
            kw["known_hosts"] = self.known_hosts
        return kw

    def _resolve(self, kw: dict[str, Any]) -> asyncssh.SSHClientConnectionOptions:
        """Apply the SSH config: the real host, port, user, known_hosts, keys."""
        if self.ssh_config and not os.path.isfile(self.ssh_config):
            raise ConfigError(f"ssh config {self.ssh_config} does not exist")
        try:
            opts = asyncssh.SSHClientConnectionOptions(**kw)
        except (ValueError, OSError, asyncssh.Error) as exc:
            raise ConfigError(f"ssh options for {self.target.host}: {exc}") from None
        if opts.known_hosts is None:
            # Host key checking is never silently disabled (see DESIGN.md).
            raise ConfigError(
                f"the SSH config disables known_hosts for {self.target.host}; refusing to connect"
            )
        self._where = f"{opts.username}@{opts.host}:{opts.port}"
        return opts

    def _with_known_hosts(
        self, kw: dict[str, Any], opts: asyncssh.SSHClientConnectionOptions
    ) -> dict[str, Any]:
        """kw with the known_hosts files that exist (none existing: trust nothing)."""
        existing = [f for f in self._known_hosts_files(opts) if os.path.isfile(f)]
        # asyncssh fails on a missing file; an empty list of trusted keys is the truth.
        return {**kw, "known_hosts": _read_known_hosts(existing) if existing else b""}

    async def _connect(self) -> asyncssh.SSHClientConnection:
        kw = self._connect_kwargs()
        opts = self._resolve(kw)
        try:
            return await self._try_connect(self._with_known_hosts(kw, opts), opts)
        except asyncssh.HostKeyNotVerifiable:
            await self._handle_host_key(kw, opts)  # raises, or trusts the new key
        try:
            return await self._try_connect(self._with_known_hosts(kw, opts), opts)
        except asyncssh.HostKeyNotVerifiable:
            raise HostKeyChanged(
                f"host key of {self._where} changed while connecting; refusing"
            ) from None

    async def _try_connect(
        self, kw: dict[str, Any], opts: asyncssh.SSHClientConnectionOptions
    ) -> asyncssh.SSHClientConnection:
        host, port = opts.host, opts.port
        try:
            # The SSH config as `_resolve` read it (config=None: not parsed again; a
            # fleet's config of 256 Host blocks made the two parses a quarter of its start).
            return await asyncssh.connect(**{**kw, "config": None}, options=opts)
        except asyncssh.HostKeyNotVerifiable:
            raise
        except asyncssh.PermissionDenied:
            raise AuthFailed(
                f"authentication failed for {self._where} (tried: {_identities(opts)})"
            ) from None
        except asyncio.TimeoutError:
            raise HostUnreachable(
                f"timed out connecting to {host}:{port} after {self.connect_timeout:g} s"
            ) from None
        except socket.gaierror as exc:
            raise HostUnreachable(f"cannot resolve {host}: {exc.strerror}") from None
        except ConnectionRefusedError:
            raise HostUnreachable(f"connection refused by {host}:{port}") from None
        except OSError as exc:
            raise HostUnreachable(
                f"cannot connect to {host}:{port}: {exc.strerror or exc}"
            ) from None
        except asyncssh.DisconnectError as exc:
            raise HostUnreachable(f"{host}:{port} closed the connection: {exc.reason}") from None
        except (ValueError, asyncssh.Error) as exc:
            raise ConfigError(f"cannot connect to {self._where}: {exc}") from None

    def _known_hosts_files(self, opts: asyncssh.SSHClientConnectionOptions) -> list[str]:
        """The known_hosts files that are checked, the first one gets new keys."""
        if self.known_hosts:
            return [self.known_hosts]
        configured = opts.known_hosts
        if isinstance(configured, (list, tuple)) and configured:
            return [os.path.expanduser(str(p)) for p in configured]
        return [os.path.expanduser("~/.ssh/known_hosts")]

    async def _handle_host_key(
        self, kw: dict[str, Any], opts: asyncssh.SSHClientConnectionOptions
    ) -> None:
        """Tell unknown from changed; trust an unknown key only when asked to."""
        files = self._known_hosts_files(opts)
        name = opts.host_key_alias or opts.host
        port = opts.port
        existing = [f for f in files if os.path.isfile(f)]
        host_keys: list[Any] = []
        known: list[Any] = []
        revoked: list[Any] = []
        if existing:
            try:
                matched = asyncssh.read_known_hosts(existing).match(
                    name, name, port if port != 22 else None
                )
            except (ValueError, OSError) as exc:
                raise ConfigError(f"cannot read known_hosts {existing[0]}: {exc}") from None
            host_keys = list(matched[0])
            known, revoked = host_keys + list(matched[1]), list(matched[2])
        # Ask for a key of a type we already know, so "changed" means changed.
        algs = [a.decode() for k in host_keys for a in k.sig_algorithms]
        try:
            key = await asyncio.wait_for(
                asyncssh.get_server_host_key(
                    opts.host, port, config=kw["config"], server_host_key_algs=algs or ()
                ),
                self.connect_timeout,
            )
        except (OSError, asyncio.TimeoutError, asyncssh.Error) as exc:
            raise HostUnreachable(
                f"cannot fetch the host key of {opts.host}:{port}: {exc}"
            ) from None
        if key is None:
            raise HostKeyUnknown(f"{opts.host}:{port} presented no host key; refusing")
        alg, fp = key.get_algorithm(), key.get_fingerprint("sha256")
        if known or key in revoked:
            raise HostKeyChanged(
                f"HOST KEY CHANGED for {opts.host}:{port}: it now presents {alg} {fp}, "
                f"which does not match {existing[0]}; possible man-in-the-middle; refusing"
            )
        if not self.accept_new_host_key:
            raise HostKeyUnknown(
                f"unknown host key for {opts.host}:{port}: {alg} {fp}; "
                "re-run with --accept-new-host-key to trust it"
            )
        _append_known_host(files[0], name, port, key)

    # -- host Python, agent upload and start ------------------------------------

    def _asked(self) -> str | None:
        """The interpreter to ask for: the one found before, else `[host] python`, else None."""
        return self.found.path if self.found else self.python

    async def _probe_or_start(
        self, conn: asyncssh.SSHClientConnection, rdir: str, args: list[str]
    ) -> tuple[hostpython.Found, asyncssh.SSHClientProcess[bytes] | None]:
        """One exec: the host's interpreter, and the agent already running on it when
        `rdir` holds a complete upload (else None: upload, then start it)."""
        proc = await conn.create_process(hostpython.start_command(self._asked(), rdir, args), encoding=None)
        lines: list[str] = []
        untrusted: list[str] = []  # the agent dir is not ours alone: `ls -ld` of the path

        async def until_marker() -> bool:
            while raw := await proc.stdout.readline():
                line: str = raw.decode(errors="replace").rstrip("\n")
                if line in (hostpython.STARTED, hostpython.PROBED):
                    return line == hostpython.STARTED
                if line == hostpython.UNTRUSTED:
                    rest = (await proc.stdout.read()).decode(errors="replace").splitlines()
                    untrusted.extend(rest[:1] or [""])
                    return False
                lines.append(line)
            return False  # the shell ended early: what it printed is all there is

        try:
            started = await asyncio.wait_for(until_marker(), self.connect_timeout)
            trace.mark("host python probed")
        except asyncio.TimeoutError:
            proc.close()
            raise AgentStartFailed(
                f"the host Python probe on {self._where} did not answer within {self.connect_timeout:g} s"
            ) from None
        if untrusted:
            proc.close()
            raise AgentStartFailed(hostpython.untrusted_error(self._where, rdir, untrusted))
        if self.found is None:
            try:
                self.found = hostpython.choose(
                    hostpython.parse_probe("\n".join(lines), self.python), self.python, self._where)
            except hostpython.HostPythonError:
                proc.close()
                raise
        if not started:
            proc.close()
        return self.found, proc if started else None

    async def _upload(self, conn: asyncssh.SSHClientConnection, python: str,
                      files: dict[str, bytes], sha: str, rdir: str) -> None:
        """Put the agent files in `rdir` (`<cache_dir>/agent-<sha12>`), `.complete` last.

        SFTP first; a host that refuses the SFTP subsystem gets them over an exec channel.
        """
        try:
            async with conn.start_sftp_client() as sftp:
                subdirs = {name.rpartition("/")[0] for name in files}  # "", "remote", "remote/run", …
                for sub in sorted(subdirs):
                    await sftp.makedirs(f"{rdir}/{sub}".rstrip("/"), attrs=asyncssh.SFTPAttrs(permissions=0o700),
                                        exist_ok=True)
                mine = asyncssh.SFTPAttrs(permissions=0o600)  # never writable by group or others
                for fname, data in files.items():
                    async with sftp.open(f"{rdir}/{fname}", "wb", mine) as f:
                        await f.write(data)
                # Written last: a half-finished upload has no marker and is redone.
                async with sftp.open(f"{rdir}/.complete", "wb", mine) as f:
                    await f.write(sha.encode() + b"\n")
        except asyncssh.ChannelOpenError as exc:
            sftp_error = exc.reason or str(exc)
            self.notice = f"SFTP unavailable on {self._where} ({sftp_error}); agent sent over exec"
            await self._upload_exec(conn, python, files, sha, rdir, sftp_error)
        except (OSError, asyncssh.Error) as exc:
            raise AgentStartFailed(
                f"cannot upload the agent to {self._where}:{rdir}: {exc}"
            ) from None
        self.uploads += 1
        # The upload went into a directory someone else might have made: check it now.
        res = await conn.run(shlex.join(["sh", "-c", hostpython.trust_check(rdir) + "echo ok"]),
                             check=False, timeout=self.connect_timeout)
        out = str(res.stdout or "").splitlines()
        if hostpython.UNTRUSTED in out:
            raise AgentStartFailed(hostpython.untrusted_error(
                self._where, rdir, out[out.index(hostpython.UNTRUSTED) + 1:][:1]))

    async def _upload_exec(self, conn: asyncssh.SSHClientConnection, python: str,
                           files: dict[str, bytes], sha: str, rdir: str, sftp_error: str) -> None:
        """The agent files as JSON on the stdin of the host's Python, checked by sha256."""
        payload = json.dumps({name: (base64.b64encode(data).decode(), hashlib.sha256(data).hexdigest())
                              for name, data in files.items()})
        try:
            res = await conn.run(shlex.join([python, "-c", hostpython.UPLOAD, rdir, sha]),
                                 input=payload, check=False, timeout=60)
            ok = res.exit_status == 0 and str(res.stdout).startswith("ok")
            why = (str(res.stderr or "").strip().splitlines() or [f"exit status {res.exit_status}"])[-1]
        except (OSError, asyncssh.Error, asyncio.TimeoutError) as exc:
            ok, why = False, str(exc) or type(exc).__name__
        if not ok:
            raise AgentStartFailed(
                f"cannot upload the agent to {self._where}:{rdir}: SFTP refused ({sftp_error}), "
                f"and the exec fallback failed ({why})"
            )

    async def open(self) -> AgentStream:
        await self.close()
        trace.mark("ssh connecting")
        conn = await self._connect()
        self._conn = conn
        trace.mark("ssh authenticated")
        files, sha = agent_bundle(self.agent_dir)
        rdir = f"{self.cache_dir}/agent-{sha[:12]}"
        args = ["--runs-dir", self.runs_dir] if self.runs_dir else []
        try:
            found, proc = await self._probe_or_start(conn, rdir, args)
            python = found.path
            if proc is None:  # first contact with this agent version: upload, then start
                await self._upload(conn, python, files, sha, rdir)
                trace.mark("agent uploaded")
                proc = await conn.create_process(
                    hostpython.start_after_upload(found, self.python, rdir, args), encoding=None)
            self.remote_dir = rdir
        except TransportError:
            await self.close()
            raise
        except (OSError, asyncssh.Error) as exc:
            await self.close()
            raise AgentStartFailed(f"cannot start the agent on {self._where}: {exc}") from None

        async def wait_exit() -> int | None:
            await proc.wait_closed()
            return proc.exit_status

        return AgentStream(
            proc.stdout,
            proc.stdin,
            proc.stderr,
            where=self._where,
            python=python,
            wait_exit=wait_exit,
            close=proc.close,
            io_errors=(OSError, asyncssh.Error),
        )

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.wait_closed(), 3.0)


# Parsed known_hosts files by (path, mtime_ns, size, inode) of each: a fleet's hosts share
# one reading (asyncssh decoded every key of the file again for each connect: 14 % of the
# client's CPU to a 256-host fleet's first frame); any change to a file reads it again.
_KNOWN_HOSTS: dict[tuple[tuple[str, int, int, int], ...], asyncssh.SSHKnownHosts] = {}


def _read_known_hosts(files: list[str]) -> asyncssh.SSHKnownHosts | list[str]:
    """The known_hosts `files` parsed, shared while none of them changes; the paths
    themselves when one cannot be read or parsed (asyncssh then says why, as before)."""
    try:
        stamp = tuple((f, st.st_mtime_ns, st.st_size, st.st_ino) for f in files for st in [os.stat(f)])
        known = _KNOWN_HOSTS.get(stamp)
        if known is None:
            known = asyncssh.read_known_hosts(files)
            if len(_KNOWN_HOSTS) >= 16:  # hosts with files of their own: keep the last few
                del _KNOWN_HOSTS[next(iter(_KNOWN_HOSTS))]
            _KNOWN_HOSTS[stamp] = known
        return known
    except (OSError, ValueError):
        return files


_DEFAULT_KEY_FILES = ("id_ed25519_sk", "id_ecdsa_sk", "id_ed448", "id_ed25519", "id_ecdsa", "id_rsa", "id_dsa")


def _identities(opts: asyncssh.SSHClientConnectionOptions) -> str:
    """The key files offered (the SSH config's IdentityFile, else OpenSSH's defaults in
    ~/.ssh that exist) and the agent, for AuthFailed: a file says where to look, a key's
    comment ("me@laptop") does not."""
    config = getattr(opts, "config", None)
    configured = [str(f) for f in (config.get("IdentityFile", ()) if config is not None else ()) or ()]
    files = configured or [os.path.join("~", ".ssh", name) for name in _DEFAULT_KEY_FILES]
    home = os.path.expanduser("~")
    names = []
    for f in files:
        path = os.path.expanduser(f)
        if os.path.isfile(path):
            names.append("~" + path[len(home):] if home != "/" and path.startswith(home + os.sep) else path)
    if not names and opts.client_keys:  # keys given some other way: name them as we can
        names = [pair.get_comment() or pair.get_algorithm() for pair in opts.client_keys]
    if opts.agent_path:
        names.append("ssh-agent keys")
    return ", ".join(names) or "no key files in ~/.ssh and no ssh-agent"


def _append_known_host(path: str, host: str, port: int, key: asyncssh.SSHKey) -> None:
    """Append one OpenSSH known_hosts line; the file is created 0600."""
    pattern = host if port == 22 else f"[{host}]:{port}"
    alg, blob = key.export_public_key("openssh").decode().split()[:2]
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a+b") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(f.tell() - 1)
            needs_nl = f.read(1) != b"\n"
        else:
            needs_nl = False
        f.write((("\n" if needs_nl else "") + f"{pattern} {alg} {blob}\n").encode())
