"""Many hosts at once: the list of targets, and starting their agents in parallel.

`parse_hosts` reads a hosts file (one target per line, `#` comments); `start_all`
starts one `AgentClient` per host with at most `limit` connections in flight
(an `asyncio.Semaphore`), so a host that is slow, refuses, or has an unknown host
key costs its own slot and its own one-line error, never the others' time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Awaitable, Callable, Mapping

from .client import AgentClient
from .errors import ConfigError, TransportError
from .targets import parse_target

DEFAULT_LIMIT = 16  # connections in flight at once (`[fleet] connect_limit`)


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


async def start_bounded(client: AgentClient, gate: asyncio.Semaphore) -> None:
    """Start one client while holding a slot of `gate` (the hello is awaited inside)."""
    async with gate:
        await client.start()


async def start_all(
    clients: Mapping[str, AgentClient],
    limit: int = DEFAULT_LIMIT,
    on_done: Callable[[str, BaseException | None], Awaitable[None] | None] | None = None,
) -> dict[str, BaseException | None]:
    """Start every client, at most `limit` at a time. Returns host -> None (started) or
    the error it failed with; `on_done(host, error)` is called as each one settles."""
    if limit < 1:
        raise ConfigError(f"connect limit must be at least 1, not {limit}")
    gate = asyncio.Semaphore(limit)
    results: dict[str, BaseException | None] = {}

    async def one(host: str, client: AgentClient) -> None:
        error: BaseException | None = None
        try:
            await start_bounded(client, gate)
        except (TransportError, OSError, asyncio.TimeoutError) as exc:
            error = exc
        results[host] = error
        if on_done is not None:
            done = on_done(host, error)
            if done is not None:
                await done

    await asyncio.gather(*(one(h, c) for h, c in clients.items()))
    return results
