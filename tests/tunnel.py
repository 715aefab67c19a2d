"""A TCP tunnel between a page and `eagle3-tui serve` (an `ssh -L`) that can stall and die,
for the browser tests (tests/test_serve.py, tests/test_mutants_webserve.py)."""

from __future__ import annotations

import socket
import struct
import threading
import time


class Tunnel:
    """`freeze()`: it stops carrying the server's bytes to the page (a laptop asleep: the
    page reads nothing) while the page's still reach the server; `cut()`: every connection
    through it dropped at once, both ends with a reset (the tunnel died); new connections
    still pass. An end closed by its peer closes the other."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.frozen = threading.Event()
        self.socks: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            up = socket.socket()
            up.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a full tunnel stops the server soon
            up.connect(("127.0.0.1", self.upstream))
            with self.lock:
                self.socks += [down, up]
            threading.Thread(target=self._pump, args=(down, up, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, self.frozen), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, frozen: threading.Event | None) -> None:
        try:
            while True:
                while frozen is not None and frozen.is_set():
                    time.sleep(0.02)
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        src.close()
        dst.close()

    def freeze(self) -> None:
        self.frozen.set()

    def cut(self) -> None:
        with self.lock:
            socks, self.socks = self.socks, []
        for sock in socks:  # every reset armed first: a pump woken below closes both its ends
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RD)  # wakes its pump's recv(), and sends nothing
            except OSError:
                pass
            sock.close()  # the reset, now that no recv() holds the socket open
        self.frozen.clear()

    def close(self) -> None:
        self.listener.close()
        self.cut()
