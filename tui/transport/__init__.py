"""Transport: start the agent locally or over SSH and speak its protocol.

Nothing above this package knows which link it has: build one with
`make_link(target, ...)` and wrap it in an `AgentClient`.
"""

from __future__ import annotations

from tui.protocol.stream import LinkStatus

from .api import AgentApi
from .client import AgentClient, AgentRequestError
from .errors import (
    AgentStartFailed,
    AuthFailed,
    ConfigError,
    HostKeyChanged,
    HostKeyUnknown,
    HostUnreachable,
    LinkLost,
    TransportError,
)
from .link import AgentStream, Link
from .links import make_link
from .local import LocalLink
from .targets import Target, parse_target


def __getattr__(name: str) -> object:
    # SshLink pulls in asyncssh; import it only when asked for.
    if name == "SshLink":
        from .ssh import SshLink

        return SshLink
    raise AttributeError(name)


__all__ = [
    "AgentApi",
    "AgentClient",
    "AgentRequestError",
    "AgentStartFailed",
    "AgentStream",
    "AuthFailed",
    "ConfigError",
    "HostKeyChanged",
    "HostKeyUnknown",
    "HostUnreachable",
    "Link",
    "LinkLost",
    "LinkStatus",
    "LocalLink",
    "SshLink",
    "Target",
    "TransportError",
    "make_link",
    "parse_target",
]
