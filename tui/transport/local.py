"""The local link: the agent as a child process of this one (`LocalLink`), for `local`
targets and the tests. The link interface and the byte stream are in link.py, the files
it runs in bundle.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

from . import hostpython
from .bundle import AGENT_ENTRY, agent_files, default_agent_dir
from .errors import AgentStartFailed
from .link import MAX_LINE, AgentStream


class LocalLink:
    """Runs the agent as a child process: `[python, -u, agent/main.py]`."""

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
        argv = [self.python, "-u", str(self.agent_dir / AGENT_ENTRY)]
        if self.runs_dir:
            argv += ["--runs-dir", str(self.runs_dir)]
        return argv

    async def _check_python(self) -> None:
        """A configured interpreter must be >= 3.9 (this one is: the client needs 3.10)."""
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
        agent_files(self.agent_dir)  # fail early, with a clear message, if agent/main.py is missing
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
