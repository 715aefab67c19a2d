"""Build the link for a target string: a LocalLink for `local`, else an SshLink."""

from __future__ import annotations

from typing import Any

from .link import Link
from .local import LocalLink
from .targets import parse_target


def make_link(
    target: str,
    *,
    ssh_config: str | None = None,
    accept_new_host_key: bool = False,
    python: str | None = None,
    runs_dir: str | None = None,
    **ssh_options: Any,
) -> Link:
    """A LocalLink for "local", else an SshLink (extra keywords go to SshLink)."""
    parsed = parse_target(target)
    if parsed.kind == "local":
        return LocalLink(**({"python": python} if python else {}), runs_dir=runs_dir)
    from .ssh import SshLink  # imported only for an SSH target: it pulls in asyncssh

    return SshLink(
        target,
        ssh_config=ssh_config,
        accept_new_host_key=accept_new_host_key,
        python=python,
        runs_dir=runs_dir,
        **ssh_options,
    )
