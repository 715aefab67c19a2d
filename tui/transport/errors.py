"""Transport errors: one-line messages, classified as permanent or retryable.

`AgentClient` retries retryable errors with backoff and gives up at once on
permanent ones (a wrong key does not get better by trying again).
"""

from __future__ import annotations

from tui.protocol.hosttext import clean


class TransportError(Exception):
    """A link failure with a one-line message; `permanent` errors are not retried."""

    permanent: bool = False

    def __init__(self, message: str, *, permanent: bool | None = None) -> None:
        # Keep str() one line: the UI and the CLI print it as is. It often quotes the
        # host (its Python's stderr, the server's banner): sanitized like all host text.
        super().__init__(" ".join(clean(str(message)).split()))
        if permanent is not None:
            self.permanent = permanent


class HostUnreachable(TransportError):
    """Connection refused, DNS failure or timeout: the host may come back."""

    permanent = False


class AuthFailed(TransportError):
    """The server rejected every identity offered."""

    permanent = True


class HostKeyUnknown(TransportError):
    """The host's key is not in known_hosts; the user must decide to trust it."""

    permanent = True


class HostKeyChanged(TransportError):
    """The host's key differs from the one in known_hosts: possible interception."""

    permanent = True


class AgentStartFailed(TransportError):
    """The agent could not be started on the host (no Python, upload failed, ...)."""

    permanent = True


class LinkLost(TransportError):
    """An established link dropped; reconnecting may help."""

    permanent = False


class ConfigError(TransportError):
    """The SSH config or the target string is unusable."""

    permanent = True
