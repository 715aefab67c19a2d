"""Target strings: `local`, `[user@]host[:port]` or an SSH config Host alias."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ConfigError

_HOST_RE = re.compile(r"^[A-Za-z0-9_.%:\-]+$")


@dataclass(frozen=True)
class Target:
    """A parsed target. `port` is None when not given (the SSH config decides)."""

    kind: str  # "local" | "ssh"
    user: str | None = None
    host: str | None = None
    port: int | None = None


def parse_target(s: str) -> Target:
    """Parse `local`, `[user@]host[:port]`, `[user@][v6addr]:port` or an alias."""
    text = (s or "").strip()
    if text == "local":
        return Target("local")
    if not text:
        raise ConfigError("empty target: use local, [user@]host[:port] or an SSH Host alias")
    user: str | None = None
    rest = text
    if "@" in rest:
        user, rest = rest.rsplit("@", 1)
        # No user name starts with '-' (useradd refuses one); a tool given `user@host`
        # as argv would take it for an option.
        if not user or user.startswith("-") or any(c.isspace() or not c.isprintable() for c in user):
            raise ConfigError(f"bad user in target {text!r}")
    port_text: str | None = None
    if rest.startswith("["):  # [2001:db8::1]:2222
        end = rest.find("]")
        if end < 0:
            raise ConfigError(f"unclosed '[' in target {text!r}")
        host, tail = rest[1:end], rest[end + 1 :]
        if tail:
            if not tail.startswith(":"):
                raise ConfigError(f"bad target {text!r}: expected ':PORT' after ']'")
            port_text = tail[1:]
    elif rest.count(":") == 1:
        host, port_text = rest.split(":")
    else:
        host = rest  # a bare IPv6 address has several colons and no port
    # A leading '-' could be taken for an option by tools that get the host as argv.
    if not host or host.startswith("-") or not _HOST_RE.match(host):
        raise ConfigError(f"bad host in target {text!r}")
    port: int | None = None
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigError(f"bad port in target {text!r}: {port_text!r}")
        port = int(port_text)
    return Target("ssh", user, host, port)
