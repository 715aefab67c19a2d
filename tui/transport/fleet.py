"""Many hosts at once: the list of targets.

`parse_hosts` reads a hosts file (one target per line, `#` comments). Their agents are
started by each host's `HostFeed.connect` under one gate of `[fleet] connect_limit`
slots, so a host that is slow, refuses, or has an unknown host key
costs its own slot and its own one-line error, never the others' time.
"""

from __future__ import annotations

from pathlib import Path

from .errors import ConfigError
from .targets import parse_target


def parse_hosts(text: str, source: str = "hosts file") -> list[str]:
    """Targets from `text`: one per line; blank lines and `# …` comments skipped.
    A line that is not a target is a ConfigError naming its line."""
    hosts: list[str] = []
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            parse_target(line)
        except ConfigError as exc:
            raise ConfigError(f"{source}:{no}: {exc}") from None
        hosts.append(line)
    return hosts


def read_hosts_file(path: str | Path) -> list[str]:
    """The targets of a hosts file; a missing or empty file is a ConfigError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"hosts file {path}: {exc.strerror or exc}") from None
    hosts = parse_hosts(text, str(path))
    if not hosts:
        raise ConfigError(f"hosts file {path}: no hosts in it")
    return hosts


def unique(targets: list[str]) -> list[str]:
    """The targets in their order, each once."""
    return list(dict.fromkeys(targets))
