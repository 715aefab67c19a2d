"""The link interface and the agent's byte stream.

A *link* knows how to start the agent somewhere and hand back an `AgentStream`
(newline-framed bytes in both directions). `AgentClient` speaks the protocol over
any link; `LocalLink` (local.py) runs the agent as a child process of this one,
`SshLink` (ssh.py) runs it on a remote host over asyncssh.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable
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
