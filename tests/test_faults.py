"""A screen that stays right after faults (issue 13), against the real agent, real
processes and a real sshd.

- a kill whose link drops between the request and its reply ends as killed,
  "confirmed after reconnect" (an in-process asyncssh server runs the real agent and
  cuts the connection right after forwarding the kill request);
- a stalled link (a TCP relay in front of the real sshd stops forwarding without
  closing) shows "stale for N s" within 3 s at a 1 s interval, then "lost" once the
  SSH keepalive fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Callable

import asyncssh
import pytest

from tests import checkout
from tests.sshd import Sshd
from tests.test_cli_e2e import alive  # a live, non-zombie pid
from tui.services import actions as services
from tui.services.config import parse_config
from tui.transport import AgentClient, LocalLink
from tui.transport.ssh import SshLink
from tui.views.app import make_app
from tui.views.screens.confirm import ConfirmScreen
from tui.views.widgets.status import StatusBar

STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # only SIGTERM ends it: the kill takes a grace
os.write(1, b"ready %d\\n" % os.getpid())
while True:
    time.sleep(0.2)
"""


async def until(pilot: Any, cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


class CutOnKill:
    """asyncssh server running each command (the real agent) as a subprocess. It
    forwards the client's first kill request to the agent and then aborts the
    connection, before any reply. The agent is left to finish (as sshd leaves it: its
    stdin closes, it completes the kill and exits). Sessions that start the agent are
    counted (the client's host-Python probe execs the agent in its own session once
    the agent is uploaded, so a command naming agent/main.py may be either)."""

    def __init__(self) -> None:
        self.sessions = 0
        self.cut = False
        self.agents: list[asyncio.subprocess.Process] = []

    async def handle(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        agent = await asyncio.create_subprocess_exec(
            *shlex.split(process.command or ""),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )
        self.agents.append(agent)
        assert agent.stdin and agent.stdout
        dropped = asyncio.Event()

        async def pump_in() -> None:
            with contextlib.suppress(Exception):
                while data := await process.stdin.read(65536):
                    agent.stdin.write(data)
                    await agent.stdin.drain()
                    if not self.cut and b'"op":"kill"' in data:
                        self.cut = True
                        dropped.set()
                        process.channel.get_connection().abort()
                        break
            agent.stdin.close()

        feeder = asyncio.create_task(pump_in())
        hello = False
        try:
            while chunk := await agent.stdout.read(65536):
                if not hello and b'"type":"hello"' in chunk:
                    hello = True
                    self.sessions += 1  # a session the agent runs in
                if dropped.is_set():
                    continue  # the link is gone: the agent's lines go nowhere
                with contextlib.suppress(Exception):
                    process.stdout.write(chunk)
        finally:
            feeder.cancel()
            await agent.wait()  # never killed: it ends by itself once the kill is done
            with contextlib.suppress(Exception):
                process.exit(0)


@pytest.fixture
async def cut_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[CutOnKill, Path, Path]]:
    # The in-process server's SFTP and commands run in this process's cwd: a client's
    # relative paths (the default agent cache, .cache/eagle3-tui) land in tmp_path.
    monkeypatch.chdir(tmp_path)
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    user_key = asyncssh.generate_private_key("ssh-ed25519")
    user_key.write_private_key(str(tmp_path / "id_user"))
    handler = CutOnKill()
    acceptor = await asyncssh.create_server(
        asyncssh.SSHServer, "127.0.0.1", 0, server_host_keys=[host_key],
        authorized_client_keys=asyncssh.import_authorized_keys(user_key.export_public_key().decode()),
        process_factory=handler.handle, encoding=None, sftp_factory=True,
    )
    port = acceptor.sockets[0].getsockname()[1]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {' '.join(host_key.export_public_key().decode().split()[:2])}\n")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host cutty\n  HostName 127.0.0.1\n  Port {port}\n  User tester\n"
                   f"  IdentityFile {tmp_path / 'id_user'}\n")
    yield handler, cfg, known
    acceptor.close()
    await acceptor.wait_closed()
    for agent in handler.agents:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()


def job_config(tmp_path: Path, interval: float = 0.5, keepalive: float = 15.0) -> Any:
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    return parse_config(
        f'[host]\nruns_dir = "{tmp_path / "runs"}"\npython = "{sys.executable}"\ninterval = {interval}\n'
        f"keepalive = {keepalive}\n"
        f'[run]\nname = "faulty"\ncommand = ["{sys.executable}", "{script}"]\ncwd = "{tmp_path}"\n'
        "graces = [0.5, 2]\ngpu_wait = 0\n"
    )


async def launch_run(cfg: Any) -> dict[str, Any]:
    """A live run of the config, launched through the real agent's launch path."""
    client = AgentClient(LocalLink(runs_dir=cfg.host.runs_dir), reconnect=False)
    await client.start()
    try:
        rec = (await services.launch(client, cfg)).record
    finally:
        await client.close()
    log = Path(rec["log"])
    for _ in range(100):
        if log.exists() and b"ready" in log.read_bytes():
            break
        await asyncio.sleep(0.05)
    return rec


async def test_kill_whose_link_drops_ends_killed_confirmed_after_reconnect(
    cut_server: tuple[CutOnKill, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handler, ssh_cfg, known = cut_server
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    cfg = job_config(tmp_path)
    run = await launch_run(cfg)
    assert alive(run["pid"])
    link = SshLink("cutty", ssh_config=ssh_cfg, known_hosts=known, python=sys.executable,
                   cache_dir=str(tmp_path / "cache"), connect_timeout=5, runs_dir=cfg.host.runs_dir)
    app = make_app(AgentClient(link, backoff=(0.2, 0.5)), cfg, "cutty")
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: any(r.run_id == run["run_id"] and r.alive for r in app.dashboard.state.runs),
                    15, "the run")
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 5, "the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: handler.cut, 10, "the cut")
        shown: list[str] = []  # every banner from the cut to the verdict

        def banner() -> str:
            text = str(app.query_one("#banner").render())
            if not shown or shown[-1] != text:
                shown.append(text)
            return text

        try:
            await until(pilot, lambda: "(confirmed after reconnect)" in banner(), 30, "the confirmed outcome")
        finally:
            print("banners:", shown)
        assert f"run {run['run_id']} killed" in shown[-1], shown
        assert not any("failed" in text for text in shown), shown  # never shown as failed
        assert any("asking the host after reconnect" in text for text in shown), shown
        await until(pilot, lambda: any(r.run_id == run["run_id"] and r.state == "killed"
                                       for r in app.dashboard.state.runs),
                    10, "the run listed as killed")
    assert not alive(run["pid"])
    assert handler.sessions >= 2


class Relay:
    """A TCP relay in front of sshd that can stop forwarding without closing anything,
    as a frozen host or a black-holed route does."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    await self.flowing.wait()  # stalled: hold the bytes, close nothing
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    async def close(self) -> None:
        self.flowing.set()
        if self.server is not None:
            self.server.close()


async def test_stalled_link_is_stale_within_3s_then_lost(tmp_path: Path, sshd: Sshd,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    relay = Relay(sshd.port)
    await relay.start()
    known = tmp_path / "known_hosts"
    alg, blob = sshd.host_key.with_suffix(".pub").read_text().split()[:2]
    known.write_text(f"[127.0.0.1]:{relay.port} {alg} {blob}\n")
    ssh_cfg = tmp_path / "ssh_config"
    ssh_cfg.write_text(f"Host relayed\n  HostName 127.0.0.1\n  Port {relay.port}\n  User {sshd.user}\n"
                       f"  IdentityFile {sshd.client_key}\n  IdentitiesOnly yes\n")
    cfg = job_config(tmp_path, interval=1.0, keepalive=1.0)
    link = SshLink("relayed", ssh_config=ssh_cfg, known_hosts=known, python=sys.executable,
                   cache_dir=str(tmp_path / "cache"), connect_timeout=3, keepalive_interval=1.0,
                   runs_dir=cfg.host.runs_dir)
    app = make_app(AgentClient(link, backoff=(0.5,)), cfg, "relayed")
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            bar = app.query_one(StatusBar)
            await until(pilot, lambda: app.dashboard.state.seq >= 2, 20, "snapshots")
            assert "● connected" in str(bar.render())
            relay.flowing.clear()
            t0 = time.monotonic()
            await until(pilot, lambda: "stale for" in str(bar.render()), 5, "stale")
            seen_after = time.monotonic() - t0
            print(f"stale shown {seen_after:.2f} s after the relay stopped forwarding")
            assert seen_after <= 4.0, seen_after  # 2 intervals + 1 s after the last message (~3.05 s idle), + load
            assert "stale for" in str(app.query_one("#banner").render())
            await until(pilot, lambda: app.dashboard.state.link.state != "connected", 15, "the keepalive to fail")
            print(f"lost after {time.monotonic() - t0:.2f} s (keepalive 1 s)")
            assert "lost" in str(bar.render()) or "reconnecting" in str(bar.render())
            assert "lost" in str(app.query_one("#banner").render())
            relay.flowing.set()  # the host thaws: the client reconnects on its own
            await until(pilot, lambda: app.dashboard.state.link.state == "connected", 30, "the reconnect")
    finally:
        await relay.close()


async def test_cli_kill_whose_link_drops_is_confirmed_after_reconnect(
    cut_server: tuple[CutOnKill, Path, Path], tmp_path: Path
) -> None:
    handler, ssh_cfg, known = cut_server
    ssh_cfg.write_text(ssh_cfg.read_text() + f"  UserKnownHostsFile {known}\n")
    cfg = job_config(tmp_path)
    run = await launch_run(cfg)
    toml = tmp_path / "eagle3.toml"
    toml.write_text(
        f'[host]\nruns_dir = "{cfg.host.runs_dir}"\npython = "{sys.executable}"\n'
        f'[run]\nname = "faulty"\ncommand = {json.dumps(list(cfg.run.command))}\ncwd = "{tmp_path}"\n'
        "graces = [0.5, 2]\ngpu_wait = 0\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    env = checkout.env(env)
    res = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tui.cli", "-F", str(ssh_cfg), "kill", "cutty", run["run_id"], "--yes"],
        cwd=tmp_path, capture_output=True, text=True, timeout=90, env=env,
    )
    assert handler.cut, res
    assert res.returncode == 0, res.stderr
    first = res.stdout.splitlines()[0]
    assert first.startswith(f"run {run['run_id']} killed") and first.endswith("(confirmed after reconnect)"), res.stdout
    assert "link lost" in res.stderr
    assert not alive(run["pid"])
