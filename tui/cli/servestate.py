"""What `eagle3-tui serve` keeps between runs and tells later commands: its URL and token.

- The running servers: one file per server (`PORT.json`: URL, pid, targets, start) in a
  directory only this user can enter (0700; each file 0600), so `serve --url` prints a
  running server's URL again, token and all, to this user alone; a server removes its
  file when it stops, and `--url` drops those whose process is gone.
- A fixed token, from `EAGLE3_TUI_SERVE_TOKEN` or `--token-file` (a file only its owner
  can read), so bookmarks, open tabs and tunnels survive a restart.
- `--open`: the browser is given a 0600 file that redirects to the URL, never the URL
  itself (a browser's command line is readable by every user of the host).
"""

from __future__ import annotations

import html
import json
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path

TOKEN_ENV = "EAGLE3_TUI_SERVE_TOKEN"
TOKEN_SHAPE = re.compile(r"[A-Za-z0-9._~-]{16,256}")  # URL-safe, and a WebSocket subprotocol token


class StateError(Exception):
    """One line for the user (a token or state directory that cannot be used)."""


def state_dir() -> Path:
    """`$XDG_STATE_HOME/eagle3-tui/serve` (else ~/.local/state/…), made 0700 and checked:
    ours, and no one else's to enter."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    path = base / "eagle3-tui" / "serve"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise StateError(f"cannot use {path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise StateError(f"{path} is not a directory of this user's: remove it")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours: close it before anything secret goes in
    return path


def write_private(path: Path, text: str) -> None:
    """`text` into `path`, 0600, never through a link; replaced whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


@dataclass(frozen=True)
class Running:
    url: str
    pid: int
    port: int
    targets: tuple[str, ...]
    started: float
    read_only: bool


def record(port: int, url: str, targets: list[str], read_only: bool) -> Path:
    """This server, for `serve --url`; the path to remove when it stops."""
    path = state_dir() / f"{port}.json"
    write_private(path, json.dumps({"url": url, "pid": os.getpid(), "port": port, "targets": targets,
                                    "started": time.time(), "read_only": read_only}))
    return path


def running() -> list[Running]:
    """The servers still running, oldest first (files of ended ones are removed)."""
    found = []
    for path in sorted(state_dir().glob("*.json")):
        try:
            obj = json.loads(path.read_text())
            server = Running(str(obj["url"]), int(obj["pid"]), int(obj["port"]),
                             tuple(str(t) for t in obj["targets"]), float(obj["started"]), bool(obj["read_only"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not alive(server.pid):
            path.unlink(missing_ok=True)
            continue
        found.append(server)
    return sorted(found, key=lambda s: s.started)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fixed_token(token_file: str | None) -> str | None:
    """The token the user fixed (`--token-file`, else `EAGLE3_TUI_SERVE_TOKEN`), or None."""
    if token_file:
        try:
            st = os.stat(token_file)
            text = Path(token_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise StateError(f"cannot read --token-file {token_file}: "
                             f"{getattr(exc, 'strerror', None) or exc}") from None
        if st.st_mode & 0o077:
            raise StateError(f"--token-file {token_file} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}): "
                             f"chmod 600 {token_file}")
        where = f"--token-file {token_file}"
    else:
        text = os.environ.get(TOKEN_ENV, "").strip()
        if not text:
            return None
        where = TOKEN_ENV
    if not TOKEN_SHAPE.fullmatch(text):
        raise StateError(f"{where}: a token is 16 to 256 characters of A-Z a-z 0-9 . _ ~ - "
                         f"(make one: python3 -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return text


def opener(url: str) -> Path:
    """A 0600 page that sends the browser on to `url`: what `--open` gives the browser."""
    path = state_dir() / "open.html"
    link = html.escape(url)
    write_private(path, f'<!DOCTYPE html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={link}">'
                        f'<a href="{link}">eagle3-tui</a>\n')
    return path
