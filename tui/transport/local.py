"""The link interface, the agent byte stream, and the local link.

A *link* knows how to start the agent somewhere and hand back an `AgentStream`
(newline-framed bytes in both directions). `AgentClient` speaks the protocol over
any link; `LocalLink` runs the agent as a child process of this one, `SshLink`
(ssh.py) runs it on a remote host over asyncssh.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hashlib
import importlib.metadata
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from .errors import AgentStartFailed, LinkLost, TransportError

STDERR_TAIL_BYTES = 4096


# The longest agent line: a 16 MiB file_read answer is ~22 MiB of base64 in JSON.
MAX_LINE = 32 * 1024 * 1024

class Link(Protocol):
    """Something that can start an agent and hand back its byte stream."""

    async def open(self) -> AgentStream:
        """Start the agent (connecting first if needed) and return its stream."""
        ...

    async def close(self) -> None:
        """Stop the agent and release the connection; safe to call twice."""
        ...

    def describe(self) -> str:
        """Where the agent runs, for humans: "local" or "root@gpu-box:22"."""
        ...


def default_agent_dir() -> Path:
    """The directory of the `remote` package (repo checkout or installed wheel)."""
    import remote  # the host-side package ships with the client as data

    return Path(remote.__file__).resolve().parent


# nvidia-ml-py's own `pynvml` module travels with the agent under this name: a login's
# python3 rarely has it (vLLM installs it into its own venv), and without it the agent
# reads GPUs by starting nvidia-smi twice a snapshot. The host's own pynvml comes first.
UPLOADED_PYNVML = "uploaded_pynvml.py"


@functools.lru_cache(maxsize=1)
def client_pynvml() -> bytes | None:
    """The client's installed nvidia-ml-py `pynvml.py` (pure Python over the driver's
    libnvidia-ml.so.1), or None where it is not installed."""
    try:
        path = importlib.metadata.distribution("nvidia-ml-py").locate_file("pynvml.py")
        return Path(str(path)).read_bytes()
    except (importlib.metadata.PackageNotFoundError, OSError):
        return None


# The upload keeps the package's shape: `remote/*.py` under the agent directory, so the
# host imports the siblings as `remote.x`, as the tests and the client do.
AGENT_PACKAGE = "remote"
AGENT_MAIN = f"{AGENT_PACKAGE}/agent.py"  # started as a file, relative to the agent directory


def agent_files(agent_dir: Path) -> dict[str, bytes]:
    """Every `*.py` of the agent package by its path in the upload (`remote/agent.py`),
    and nvidia-ml-py's pynvml beside the package (part of the content hash: another
    nvidia-ml-py is another agent version)."""
    files = {f"{AGENT_PACKAGE}/{p.name}": p.read_bytes() for p in sorted(agent_dir.glob("*.py"))}
    if AGENT_MAIN not in files:
        raise AgentStartFailed(f"no agent.py in {agent_dir}")
    nvml = client_pynvml()
    if nvml is not None:
        files[UPLOADED_PYNVML] = nvml
    return files


def agent_sha(files: dict[str, bytes]) -> str:
    """sha256 over the sorted (name, content) pairs, as in docs/architecture.md."""
    h = hashlib.sha256()
    for name in sorted(files):
        # Length-prefix each part so ("ab", "c") and ("a", "bc") hash differently.
        for part in (name.encode(), files[name]):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
    return h.hexdigest()


_bundles: dict[Path, tuple[tuple[tuple[str, int, int], ...], dict[str, bytes], str]] = {}


def agent_bundle(agent_dir: Path) -> tuple[dict[str, bytes], str]:
    """`agent_files` and their `agent_sha`, read and hashed again only when a file of
    the package changed (name, size or mtime): a fleet starts hundreds of agents from
    the same files (nvidia-ml-py's is read once per process, as `client_pynvml` is)."""
    key = tuple((f.name, st.st_size, st.st_mtime_ns) for f in sorted(agent_dir.glob("*.py")) for st in [f.stat()])
    hit = _bundles.get(agent_dir)
    if hit is None or hit[0] != key:
        files = agent_files(agent_dir)
        hit = _bundles[agent_dir] = (key, files, agent_sha(files))
    return hit[1], hit[2]


class AgentStream:
    """The agent's stdin/stdout as lines of bytes, with exit diagnosis at EOF.

    `readline()` returns one line including its newline. At EOF it raises:
    `AgentStartFailed` when the agent died before saying anything (its
    interpreter missing, or a crash at import), `LinkLost` otherwise.
    """

    def __init__(
        self,
        reader: Any,
        writer: Any,
        stderr: Any,
        *,
        where: str,
        python: str,
        wait_exit: Callable[[], Awaitable[int | None]],
        close: Callable[[], None],
        io_errors: tuple[type[BaseException], ...] = (OSError,),
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._where = where
        self._python = python
        self._wait_exit = wait_exit
        self._close = close
        self._io_errors = io_errors
        self._lines = 0
        self._stderr = collections.deque[bytes]()
        self._stderr_size = 0
        # Drain stderr all the time: an unread pipe (or SSH channel window) would
        # eventually block the agent's stdout too.
        self._stderr_task = asyncio.ensure_future(self._pump_stderr(stderr))

    async def _pump_stderr(self, stderr: Any) -> None:
        with contextlib.suppress(Exception):
            while chunk := await stderr.read(4096):
                self._stderr.append(chunk)
                self._stderr_size += len(chunk)
                while self._stderr_size > STDERR_TAIL_BYTES and len(self._stderr) > 1:
                    self._stderr_size -= len(self._stderr.popleft())

    def stderr_tail(self) -> str:
        """The last few KiB the agent wrote to stderr, decoded leniently."""
        return b"".join(self._stderr).decode("utf-8", "replace")

    def _last_stderr_line(self) -> str:
        lines = [ln.strip() for ln in self.stderr_tail().splitlines() if ln.strip()]
        return lines[-1] if lines else ""

    async def readline(self) -> bytes:
        """One line from the agent; raises LinkLost/AgentStartFailed at EOF."""
        try:
            line: bytes = await self._reader.readline()
        except self._io_errors as exc:
            raise LinkLost(f"link to {self._where} lost: {exc}") from None
        if line.endswith(b"\n"):
            self._lines += 1
            return line
        raise await self._eof_error()

    async def _eof_error(self) -> TransportError:
        code: int | None = None
        with contextlib.suppress(Exception):
            code = await asyncio.wait_for(self._wait_exit(), 3.0)
        # Give the stderr pump a moment to collect the agent's last words.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._stderr_task), 1.0)
        err = self._last_stderr_line()
        if self._lines == 0:
            if code == 127 or "not found" in err or "No such file" in err:
                return AgentStartFailed(
                    f"{self._python} not found on {self._where} (set [host] python in eagle3.toml)"
                )
            detail = err or "no output"
            return AgentStartFailed(
                f"agent on {self._where} exited at start (code {code}): {detail}"
            )
        if code is None:
            return LinkLost(f"link to {self._where} lost")
        return LinkLost(
            f"agent on {self._where} exited (code {code})" + (f": {err}" if err else "")
        )

    def write(self, data: bytes) -> None:
        """Queue bytes for the agent's stdin."""
        try:
            self._writer.write(data)
        except self._io_errors as exc:
            raise LinkLost(f"link to {self._where} lost: {exc}") from None

    async def drain(self) -> None:
        """Wait until the written bytes are on their way."""
        try:
            await self._writer.drain()
        except self._io_errors as exc:
            raise LinkLost(f"link to {self._where} lost: {exc}") from None

    def close(self) -> None:
        """Stop the agent (its stdin closes, so it exits)."""
        self._stderr_task.cancel()
        with contextlib.suppress(Exception):
            self._close()


class LocalLink:
    """Runs the agent as a child process: `[python, -u, agent.py]`."""

    def __init__(
        self,
        python: str = sys.executable,
        agent_dir: str | Path | None = None,
        runs_dir: str | None = None,
    ) -> None:
        self.python = python
        self.agent_dir = Path(agent_dir) if agent_dir else default_agent_dir()
        self.runs_dir = runs_dir
        self._checked = False
        self._proc: asyncio.subprocess.Process | None = None

    def describe(self) -> str:
        return "local"

    def argv(self) -> list[str]:
        """The agent command line."""
        argv = [self.python, "-u", str(self.agent_dir / "agent.py")]
        if self.runs_dir:
            argv += ["--runs-dir", str(self.runs_dir)]
        return argv

    async def _check_python(self) -> None:
        """A configured interpreter must be >= 3.9 (this one is: the client needs 3.10)."""
        from . import hostpython

        if self.python == sys.executable or self._checked:
            return
        try:
            proc = await asyncio.create_subprocess_exec(
                self.python, "-c", hostpython.PROBE, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
            out, _ = await proc.communicate()
        except OSError:
            out = b""
        found = hostpython.parse_probe(out.decode(errors="replace"), self.python)
        if found:  # one that does not run at all fails at the start, with its own message
            hostpython.choose(found, self.python, "local")
        self._checked = True

    async def open(self) -> AgentStream:
        await self.close()
        agent_files(self.agent_dir)  # fail early, with a clear message, if agent.py is missing
        await self._check_python()
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                # Log chunks are up to 256 KiB base64 (~350 KB per line).
                limit=MAX_LINE,
            )
        except FileNotFoundError:
            raise AgentStartFailed(
                f"{self.python} not found on local (set [host] python in eagle3.toml)"
            ) from None
        except OSError as exc:
            raise AgentStartFailed(f"cannot start {self.python}: {exc}") from None
        self._proc = proc

        def kill() -> None:
            # Closing stdin asks the agent to exit; the kill makes sure it does.
            if proc.stdin:
                proc.stdin.close()
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()

        return AgentStream(
            proc.stdout,
            proc.stdin,
            proc.stderr,
            where="local",
            python=self.python,
            wait_exit=proc.wait,
            close=kill,
            io_errors=(OSError,),
        )

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        if proc.stdin:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 2.0)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
