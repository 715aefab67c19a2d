"""The user's own small state, kept between commands: `$XDG_STATE_HOME/eagle3-tui`
(default `~/.local/state/eagle3-tui`), a 0700 directory. It holds one thing now: where
the last `eagle3-tui demo` was built, so that `runs` can point to the demo's runs from
any directory. Best effort: a state that cannot be written or read is no state."""

from __future__ import annotations

import os
from pathlib import Path

DEMO_FILE = "demo-dir"  # one line: the demo's directory (absolute)


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or ""
    return (Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state") / "eagle3-tui"


def remember_demo(root: Path) -> None:
    """Note `root` as the demo's directory (0600 in a 0700 dir, whatever the umask)."""
    d = state_dir()
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = d / f".{DEMO_FILE}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(str(root.resolve()) + "\n")
        os.replace(tmp, d / DEMO_FILE)
    except OSError:
        pass


def remembered_demo() -> Path | None:
    """The demo's directory as last noted, while it still holds the demo's eagle3.toml."""
    try:
        with open(state_dir() / DEMO_FILE, encoding="utf-8") as f:
            line = f.readline(4096).strip()  # a path, never a whole file
    except (OSError, UnicodeDecodeError):
        return None
    root = Path(line)
    return root if line and root.is_absolute() and (root / "eagle3.toml").is_file() else None
