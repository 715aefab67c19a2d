"""Run the real host agent (remote/agent/main.py) as a subprocess and talk to it. For tests.

    with AgentProc(env={"EAGLE3_TUI_GPU_SOURCE": "none"}) as agent:
        hello = agent.hello                      # the first line, already parsed
        snap = agent.call("snapshot")            # result payload; raises AgentCallError if ok:false
        mark = agent.mark()                      # remember where the event stream is now
        agent.call("configure", {"interval": 0.2})
        agent.wait_for(lambda m: m["type"] == "snapshot", since=mark)
        agent.close_stdin(); assert agent.wait_exit() == 0

Every message the agent prints is kept, in order, in `agent.messages` (dicts). Waits
take a deadline and raise TimeoutError naming what was awaited, with the agent's
stderr tail, so a hung test fails with a reason instead of hanging.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

AGENT = Path(__file__).resolve().parent.parent / "remote" / "agent" / "main.py"

Message = dict[str, Any]


class AgentCallError(RuntimeError):
    """The agent answered a request with ok:false; `str()` is its one-line error."""


class AgentProc:
    """One agent subprocess: JSON lines in, JSON lines out (collected by a thread)."""

    def __init__(self, env: dict[str, str] | None = None, args: list[str] | None = None,
                 agent: Path | str = AGENT, python: str = sys.executable,
                 hello_timeout: float = 15.0) -> None:
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen([python, "-u", str(agent), *(args or [])],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=full_env)
        self.messages: list[Message] = []
        self.bad_lines: list[bytes] = []  # stdout lines that were not JSON (should stay empty)
        self.stderr = b""
        self._cond = threading.Condition()
        self._eof = False
        self._next_id = 1
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        try:
            self.hello = self.wait_for(lambda m: m.get("type") == "hello", timeout=hello_timeout,
                                       what="hello")
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise

    # -- plumbing

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                with self._cond:
                    self.bad_lines.append(line)
                continue
            with self._cond:
                self.messages.append(msg)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for chunk in iter(lambda: self.proc.stderr.read1(65536), b""):  # type: ignore[union-attr]
            self.stderr += chunk

    # -- public

    def send_raw(self, line: bytes) -> None:
        """Write raw bytes to the agent's stdin (add the newline yourself)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line)
        self.proc.stdin.flush()

    def send(self, op: str, args: dict[str, Any] | None = None) -> int:
        """Send one request; returns its id (await it with `result(id)`)."""
        rid = self._next_id
        self._next_id += 1
        self.send_raw((json.dumps({"id": rid, "op": op, "args": args or {}}) + "\n").encode())
        return rid

    def result(self, rid: int, timeout: float = 15.0) -> Message:
        """The whole `result` message for request `rid` (ok true or false)."""
        return self.wait_for(lambda m: m.get("type") == "result" and m.get("id") == rid,
                             timeout=timeout, what="result of request %d" % rid)

    def call(self, op: str, args: dict[str, Any] | None = None, timeout: float = 15.0) -> Any:
        """Send a request and return its result payload; AgentCallError on ok:false."""
        msg = self.result(self.send(op, args), timeout=timeout)
        if not msg.get("ok"):
            raise AgentCallError(msg.get("error"))
        return msg.get("result")

    def mark(self) -> int:
        """Index of the next message; pass it as `since=` to ignore older messages."""
        with self._cond:
            return len(self.messages)

    def wait_for(self, pred: Callable[[Message], bool], timeout: float = 15.0, since: int = 0,
                 what: str = "matching message") -> Message:
        """First message at index >= `since` satisfying `pred`; TimeoutError past the deadline."""
        deadline = time.monotonic() + timeout
        i = since
        with self._cond:
            while True:
                while i < len(self.messages):
                    if pred(self.messages[i]):
                        return self.messages[i]
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0 or self._eof:
                    state = "agent exited" if self._eof else "timed out after %.1f s" % timeout
                    tail = self.stderr[-600:].decode("utf-8", "replace")
                    raise TimeoutError("waiting for %s: %s; stderr: %s" % (what, state, tail))
                self._cond.wait(left)

    def since(self, mark: int) -> list[Message]:
        """A copy of the messages received from index `mark` on."""
        with self._cond:
            return list(self.messages[mark:])

    def close_stdin(self) -> None:
        """Send EOF: the agent should exit 0 promptly."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def wait_exit(self, timeout: float = 10.0) -> int:
        """Wait for the agent process to end; its exit status."""
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """Close stdin, then kill the agent if it has not exited within 5 s."""
        try:
            self.close_stdin()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> AgentProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
