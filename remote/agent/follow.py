"""Log following for the agent: inotify directory watches (ctypes) and one `Sub` per
subscription (docs/architecture.md "Log following"). Standard library only."""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import struct
import time
from typing import Any, Dict, Iterable, Optional, Set, Tuple

from remote.agent.fileops import NotRegularFile, open_regular
from remote.base.wire import b64, emit, one_line

CHUNK = 256 * 1024
PUMP_BUDGET = 16 * CHUNK  # per subscription per wake, so one huge backlog cannot starve the loop
# A log that keeps growing: its new bytes go at most this often, gathered in one message.
# A line after a quiet spell goes at once. At 20 lines/s that is 5 messages a second, not
# 20, and each message costs the client a wake-up, a parse and a pass of its reducer; the
# dashboard draws a busy log once or twice a second anyway (tui/views/widgets/logtail.py busy_slot).
GATHER_S = 0.2
IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_IGNORED = 0x8000
IN_MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE \
    | IN_DELETE


class Inotify:
    """Directory watches through libc via ctypes; `fd` is None when unavailable."""

    def __init__(self) -> None:
        self.fd: Optional[int] = None
        self.watches: Dict[str, int] = {}
        if os.environ.get("EAGLE3_TUI_NO_INOTIFY") == "1":
            return
        try:
            self.libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd >= 0:
            self.fd = fd

    def sync(self, dirs: Set[str]) -> None:
        """Watch exactly `dirs` (missing directories are retried on later calls)."""
        if self.fd is None:
            return
        for d in set(self.watches) - dirs:
            self.libc.inotify_rm_watch(self.fd, self.watches.pop(d))
        for d in dirs - set(self.watches):
            wd = self.libc.inotify_add_watch(self.fd, os.fsencode(d), IN_MASK)
            if wd >= 0:
                self.watches[d] = wd

    def drain(self) -> None:
        """Swallow pending events: any event means 'look at every subscription'. Only
        IN_IGNORED matters: the kernel dropped a watch (directory deleted), so forget it
        and let `sync` add it again once the directory is back."""
        if self.fd is None:
            return
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except OSError:
                return
            if not buf:
                return
            pos = 0
            while pos + 16 <= len(buf):
                wd, mask, _cookie, length = struct.unpack_from("iIII", buf, pos)
                pos += 16 + length
                if mask & IN_IGNORED:
                    for d, w in list(self.watches.items()):
                        if w == wd:
                            del self.watches[d]


def holds(subs: Iterable["Sub"], now: float) -> Tuple[float, bool]:
    """Seconds until the first held subscription may send again (inf: none is held), and
    whether every one is held (then a file event can wait for that moment: the agent's
    loop leaves the inotify fd alone until then, and reads the events it missed after)."""
    left = [s.held_until - now for s in subs]
    return min((t for t in left if t > 0), default=math.inf), bool(left) and min(left) > 0


class Sub:
    """One log subscription: (path, inode, offset) plus the open fd of that inode."""

    def __init__(self, name: str, path: str) -> None:
        self.name, self.path = name, path
        self.fd: Optional[int] = None
        self.ident: Optional[Tuple[int, int]] = None  # (st_dev, st_ino) of fd
        self.offset = 0
        self.missing = False  # a `missing` reset was sent and no file has appeared since
        self.warned = False
        self.held_until = 0.0  # monotonic: bytes sent less than GATHER_S ago; new ones wait until then

    @property
    def inode(self) -> Optional[int]:
        return self.ident[1] if self.ident else None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.fd, self.ident = None, None

    def reset(self, reason: str) -> None:
        """Start the stream again at offset 0 and tell the client why (a log_reset)."""
        self.offset = 0
        emit({"type": "log_reset", "sub": self.name, "path": self.path, "reason": reason,
              "inode": self.inode, "offset": 0})

    def _open(self) -> os.stat_result:
        fd, st = open_regular(self.path)  # never blocks on a FIFO put in the log's place
        self.close()
        self.fd, self.ident = fd, (st.st_dev, st.st_ino)
        return st

    def _send(self, limit: Optional[int]) -> bool:
        """Send [offset, size) of the open fd in chunks; True if more is left than `limit`."""
        assert self.fd is not None
        size = os.fstat(self.fd).st_size
        if size < self.offset:
            self.reset("truncated")
        sent = 0
        while self.offset < size and (limit is None or sent < limit):
            data = os.pread(self.fd, min(CHUNK, size - self.offset), self.offset)
            if not data:
                break
            emit({"type": "log", "sub": self.name, "path": self.path, "inode": self.inode,
                  "offset": self.offset, "b64": b64(data)})
            self.offset += len(data)
            sent += len(data)
        behind = self.offset < size
        if sent and limit is not None and not behind:  # a backlog goes on at once, budget by budget
            self.held_until = time.monotonic() + GATHER_S
        return behind

    def start(self, offset: int, inode: Optional[int]) -> Dict[str, Any]:
        """Open at subscribe time; resume at `offset` only if `inode` still matches."""
        try:
            st = self._open()
        except (FileNotFoundError, IsADirectoryError, NotRegularFile) as exc:  # a FIFO: as if missing, said once
            if not isinstance(exc, FileNotFoundError):
                self._warn(exc)
            self.missing = True
            return {"inode": None, "size": None, "offset": 0}
        if offset < 0:
            offset = self._tail_start(st.st_size + offset)
        self.offset = offset
        return {"inode": st.st_ino, "size": st.st_size, "offset": offset, "_rotated": inode is not None
                and inode != st.st_ino}

    def _tail_start(self, pos: int) -> int:
        """A negative offset asks for the tail: start at the first line break after
        `pos` (so the first line is whole), or at 0 when the file is shorter."""
        if pos <= 0 or self.fd is None:
            return 0
        head = os.pread(self.fd, 65536, pos - 1)
        cut = head.find(b"\n")
        return pos + cut if cut >= 0 else pos

    def pump(self) -> bool:
        """Follow the file once: resets as needed, then new bytes. True if behind.
        Nothing while held (the agent's loop wakes again at `held_until`)."""
        if time.monotonic() < self.held_until:
            return False
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            self._warn(exc)
            return False
        if st is None:
            if self.fd is not None:
                self._send(None)  # the old inode's unread tail first
                self.close()
            if not self.missing:
                self.missing = True
                self.reset("missing")
            return False
        try:
            if self.fd is None or (st.st_dev, st.st_ino) != self.ident:
                if self.fd is not None:
                    self._send(None)
                reason = "rotated" if self.fd is not None else "appeared"
                self._open()
                self.missing = False
                self.reset(reason)
            return self._send(PUMP_BUDGET)
        except FileNotFoundError:
            return False  # vanished between stat and open: the next wake sees it missing
        except OSError as exc:
            self._warn(exc)
            return False

    def _warn(self, exc: OSError) -> None:
        if not self.warned:
            self.warned = True
            emit({"type": "error", "message": "log %s: %s" % (self.path, one_line(exc))})
