"""AgentClient: the agent protocol over any link, with reconnect and log resume.

The agent's ops are `AgentApi`'s typed methods; this class supplies their wire. One
reader task per connection turns agent lines into messages: results go to the
waiting request, everything else (and `LinkStatus` changes) to `events()`.
When the link drops, the client reconnects with backoff, re-sends the last
`configure` and re-subscribes every log from the byte after the last one that
passed through it, so the consumer sees each log byte exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from tui import trace
from tui.protocol import (
    PROTOCOL_VERSION,
    AgentError,
    Hello,
    KillProgress,
    LogData,
    LogReset,
    Message,
    ProtocolError,
    Result,
    encode_request,
    parse_line,
)
from tui.protocol.ops import Subscribed
from tui.protocol.stream import AgentEvent, LinkStatus

from .api import AgentApi, ProgressCallback
from .errors import AgentStartFailed, LinkLost, TransportError
from .link import AgentStream, Link

# Lines that are not JSON before the hello (a chatty ~/.bashrc) are skipped, up to this many.
MAX_NOISE_LINES = 50


class AgentRequestError(Exception):
    """The agent answered a request with ok: false; str() is its one-line error."""


class _End:
    """The end of the event stream: the client failed or was closed."""


_END = _End()


class _Events:
    """Async iterator over the client's queue; a plain coroutine per item, so it survives cancellation."""

    def __init__(self, queue: asyncio.Queue[AgentEvent | _End]) -> None:
        self._queue = queue

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> AgentEvent:
        item = await self._queue.get()
        if isinstance(item, _End):
            self._queue.put_nowait(_END)  # let any other iterator end too
            raise StopAsyncIteration
        return item


@dataclass
class _Sub:
    path: str
    offset: int
    inode: int | None


class AgentClient(AgentApi):
    """The agent's ops (`AgentApi`) and its events over one link; reconnects unless
    the error is permanent."""

    def __init__(
        self,
        link: Link,
        *,
        reconnect: bool = True,
        backoff: Sequence[float] = (0.5, 1, 2, 4, 8, 10),
        hello_timeout: float = 15,
        max_attempts: int | None = None,
    ) -> None:
        self.link = link
        self.reconnect = reconnect
        self.backoff = tuple(backoff) or (1.0,)
        self.hello_timeout = hello_timeout
        self.max_attempts = max_attempts  # None: keep trying (hosts reboot)
        self.hello: Hello | None = None
        self.status = LinkStatus("connecting")
        self._queue: asyncio.Queue[AgentEvent | _End] = asyncio.Queue()
        self._pending: dict[int, asyncio.Future[Result]] = {}
        self._progress: dict[int, ProgressCallback] = {}
        self._next_id = 1
        self._stream: AgentStream | None = None
        self._write_lock = asyncio.Lock()
        self._subs: dict[str, _Sub] = {}
        self._configure: tuple[float, str | None, str | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._starting: asyncio.Future[Hello] | None = None
        self._closed = False
        self._last_good = 0.0

    # -- public -------------------------------------------------------------------

    def fresh(self) -> AgentClient:
        """A new client over the same link and settings: a first connect that failed is
        not retried by ``start``; whoever wants to try again starts a fresh one."""
        return AgentClient(self.link, reconnect=self.reconnect, backoff=self.backoff,
                           hello_timeout=self.hello_timeout, max_attempts=self.max_attempts)

    async def start(self) -> Hello:
        """Connect and wait for the agent's hello. The first failure is raised, not retried.

        Calls after the first share its outcome, so a caller may start connecting early
        (the CLI, while Textual loads) and the dashboard's own call picks up the result.
        """
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        return await self._starting

    async def _start(self) -> Hello:
        self._set_status("connecting")
        try:
            stream, hello = await self._open()
        except TransportError as exc:
            self._set_status("failed", error=str(exc))
            self._queue.put_nowait(_END)
            raise
        self._attach(stream, hello)
        self._task = asyncio.create_task(self._supervise(stream))
        return hello

    async def call_with_progress(
        self, op: str, on_event: ProgressCallback | None, **args: Any
    ) -> dict[str, Any]:
        """Send one request and return its result; AgentRequestError or LinkLost otherwise.
        `on_event` gets each kill_progress tagged with the request's id."""
        return await self._call(op, args, on_event)

    # configure and subscriptions are also re-applied after a reconnect (even when the
    # link drops before the result); a refusal forgets them.

    async def configure(self, interval: float, match: str | None = None,
                        runs_dir: str | None = None) -> None:
        previous = self._configure
        self._configure = (interval, match, runs_dir)
        try:
            await super().configure(interval, match, runs_dir)
        except AgentRequestError:
            self._configure = previous
            raise

    async def subscribe(self, sub: str, path: str, offset: int = 0,
                        inode: int | None = None) -> Subscribed:
        entry = _Sub(path, offset, inode)
        self._subs[sub] = entry
        try:
            reply = await super().subscribe(sub, path, offset, inode)
        except AgentRequestError:
            if self._subs.get(sub) is entry:
                del self._subs[sub]
            raise
        if entry.inode is None and reply.inode is not None:
            entry.inode = reply.inode
        if entry.offset < 0:
            entry.offset = reply.offset  # a tail request, now pinned to a real offset
        return reply

    async def unsubscribe(self, sub: str) -> None:
        self._subs.pop(sub, None)
        await super().unsubscribe(sub)

    def events(self) -> AsyncIterator[AgentEvent]:
        """Protocol events and LinkStatus changes, until the client fails or is closed.

        Meant for one consumer. Cancelling a pending `__anext__` (wait_for with a
        timeout) loses no event and leaves the iterator usable.
        """
        return _Events(self._queue)

    async def close(self) -> None:
        """Stop the agent and the link; pending requests get LinkLost."""
        if self._closed:
            return
        self._closed = True
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()  # closed while still connecting
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._detach(LinkLost("client closed"))
        with contextlib.suppress(Exception):
            await self.link.close()
        self._set_status("closed")
        self._queue.put_nowait(_END)

    @property
    def connected(self) -> bool:
        """True while a stream to a live agent is attached."""
        return self._stream is not None

    def resume_points(self) -> dict[str, tuple[str, int, int | None]]:
        """Each subscription's (path, offset, inode) as it would be resumed now."""
        return {name: (s.path, s.offset, s.inode) for name, s in self._subs.items()}

    # -- connection lifecycle -----------------------------------------------------

    async def _open(self) -> tuple[AgentStream, Hello]:
        try:
            stream = await self.link.open()
        except TransportError:
            raise
        except Exception as exc:  # an unforeseen library error still becomes one line
            raise TransportError(
                f"cannot reach the agent on {self.link.describe()}: {type(exc).__name__}: {exc}"
            ) from exc
        try:
            hello = await asyncio.wait_for(self._read_hello(stream), self.hello_timeout)
        except asyncio.TimeoutError:
            stream.close()
            await self.link.close()
            raise AgentStartFailed(
                f"agent on {self.link.describe()} did not say hello within {self.hello_timeout:g} s",
                permanent=False,
            ) from None
        except BaseException:
            stream.close()
            await self.link.close()
            raise
        return stream, hello

    async def _read_hello(self, stream: AgentStream) -> Hello:
        for _ in range(MAX_NOISE_LINES):
            line = await stream.readline()
            try:
                msg = parse_line(line)
            except ProtocolError:
                continue
            if not isinstance(msg, Hello):
                raise AgentStartFailed(f"agent on {self.link.describe()} did not start with hello")
            if msg.protocol != PROTOCOL_VERSION:
                raise AgentStartFailed(
                    f"agent on {self.link.describe()} speaks protocol {msg.protocol}, "
                    f"this client speaks {PROTOCOL_VERSION}"
                )
            trace.mark("hello")
            return msg
        raise AgentStartFailed(f"agent on {self.link.describe()} printed no hello")

    def _attach(self, stream: AgentStream, hello: Hello) -> None:
        self._stream = stream
        self.hello = hello
        self._last_good = time.time()
        self._queue.put_nowait(hello)
        self._set_status("connected", since=self._last_good)

    def _detach(self, error: TransportError) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(LinkLost(str(error)))

    async def _supervise(self, stream: AgentStream) -> None:
        """Read until the link drops, then reconnect and restore, until told to stop."""
        restore: asyncio.Task[None] | None = None
        while True:
            error = await self._read_loop(stream)
            if restore is not None:
                restore.cancel()
            self._detach(error)
            await self.link.close()
            if self._closed:
                return
            if error.permanent or not self.reconnect:
                return self._fail(error)
            attempt = 0
            while True:
                attempt += 1
                if self.max_attempts is not None and attempt > self.max_attempts:
                    return self._fail(error)
                self._set_status("reconnecting", attempt, str(error), self._last_good)
                await asyncio.sleep(self.backoff[min(attempt - 1, len(self.backoff) - 1)])
                try:
                    stream, hello = await self._open()
                    break
                except TransportError as exc:
                    error = exc
                    if exc.permanent:
                        return self._fail(exc)
            self._attach(stream, hello)
            restore = asyncio.create_task(self._restore())

    def _fail(self, error: TransportError) -> None:
        self._set_status("failed", error=str(error), since=self._last_good)
        self._queue.put_nowait(_END)

    async def _restore(self) -> None:
        """Re-apply configure and every subscription from its resume point."""
        with contextlib.suppress(TransportError, AgentRequestError, ProtocolError):
            if self._configure is not None:
                await AgentApi.configure(self, *self._configure)
            for name, sub in list(self._subs.items()):
                reply = await AgentApi.subscribe(self, name, sub.path, sub.offset, sub.inode)
                if sub.inode is None and reply.inode is not None:
                    sub.inode = reply.inode

    async def _read_loop(self, stream: AgentStream) -> TransportError:
        while True:
            try:
                line = await stream.readline()
            except TransportError as exc:
                return exc
            except Exception as exc:  # an unexpected failure of the link is still a lost link
                return LinkLost(f"link to {self.link.describe()} lost: {exc}")
            self._last_good = time.time()
            try:
                msg = parse_line(line)
            except ProtocolError as exc:
                self._queue.put_nowait(AgentError(str(exc)))
                continue
            self._dispatch(msg)

    def _dispatch(self, msg: Message) -> None:
        if isinstance(msg, Result):
            fut = self._pending.pop(msg.id, None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
            return
        if isinstance(msg, LogData):
            sub = self._subs.get(msg.sub)
            if sub is not None:
                sub.offset, sub.inode = msg.end, msg.inode
        elif isinstance(msg, LogReset):
            sub = self._subs.get(msg.sub)
            if sub is not None:
                sub.offset, sub.inode = msg.offset, msg.inode
        elif isinstance(msg, KillProgress):
            callback = self._progress.get(msg.id)
            if callback is not None:
                try:
                    callback(msg)
                except Exception as exc:  # a UI callback bug must not kill the reader
                    self._queue.put_nowait(AgentError(f"progress callback failed: {exc}"))
        self._queue.put_nowait(msg)

    async def _call(
        self, op: str, args: dict[str, Any], on_event: ProgressCallback | None
    ) -> dict[str, Any]:
        stream = self._stream
        if stream is None:
            raise LinkLost(f"not connected to {self.link.describe()} ({self.status.state})")
        req_id = self._next_id
        self._next_id += 1
        fut: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = fut
        if on_event is not None:
            self._progress[req_id] = on_event
        try:
            async with self._write_lock:
                stream.write(encode_request(req_id, op, args))
                await stream.drain()
            msg = await fut
        finally:
            self._pending.pop(req_id, None)
            self._progress.pop(req_id, None)
        if not msg.ok:
            raise AgentRequestError(f"{op}: {msg.error or 'failed'}")
        return msg.result

    def _set_status(
        self, state: str, attempt: int = 0, error: str | None = None, since: float | None = None
    ) -> None:
        self.status = LinkStatus(state, attempt, error, self._last_good if since is None else since)
        self._queue.put_nowait(self.status)
