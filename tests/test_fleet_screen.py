"""The fleet screen and the CLI's fleet twins against real sshds: three good hosts, one
refusing port, one unknown host key and one silent socket (accepts, never answers)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests import checkout
from tests.fleet_hosts import FleetHosts, fleet_hosts  # noqa: F401 (a fixture)
from tui.services import actions as services
from tui.services.actions import new_client
from tui.services.config import parse_config
from tui.views.app import make_fleet_app
from tui.views.screens.dashboard import DashboardScreen
from tui.views.screens.fleet import FleetScreen

pytestmark = pytest.mark.ssh
ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 4.0  # [host] connect_timeout: how long the silent host holds its slot


def config_text(tmp: Path) -> str:
    return (f'[host]\npython = "{sys.executable}"\nruns_dir = "{tmp / "runs"}"\n'
            f"connect_timeout = {TIMEOUT}\ninterval = 0.5\n"
            f'[run]\nname = "fleet"\ncommand = ["{sys.executable}", "-c", "import time; time.sleep(60)"]\n'
            f'cwd = "{tmp}"\ngraces = [0.5, 0.5]\ngpu_wait = 0\n')


async def until(pilot: Any, cond: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


async def test_fleet_rows_sort_and_enter_esc(fleet_hosts: FleetHosts, tmp_path: Path) -> None:
    cfg = parse_config(config_text(tmp_path))
    order = ["silent", "refusing", "newkey", "h01", "h02", "h03"]  # the silent host first in line
    clients = {h: new_client(h, cfg, ssh_config=str(fleet_hosts.ssh_config)) for h in order}
    app = make_fleet_app(clients, cfg, limit=2)  # the silent host holds one of two slots
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, FleetScreen)

        def link(host: str) -> str:
            return next(r.link for r in screen.rows if r.host == host)

        t0 = time.monotonic()
        await until(pilot, lambda: all(link(h) == "ok" for h in ("h01", "h02", "h03")), "the good hosts")
        assert link("silent") == "connecting" and time.monotonic() - t0 < TIMEOUT  # not held up by it
        await until(pilot, lambda: screen.first_full_frame is not None, "every row settled")
        rows = {r.host: r for r in screen.rows}
        assert rows["refusing"].link == "error" and "\n" not in rows["refusing"].link_text
        assert rows["newkey"].link == "error" and "host key" in rows["newkey"].link_text.lower()
        assert rows["silent"].link == "error"
        assert rows["h01"].gpus_total is not None and rows["h01"].hostname
        # grouped by state, by host name within: the unreachable hosts, then the idle ones
        assert [r.host for r in screen.rows] == ["newkey", "refusing", "silent", "h01", "h02", "h03"]
        assert "6 hosts · " in str(screen.query_one("#fleet-title").render())
        await pilot.press("g")  # grouping off: by host name alone
        assert [r.host for r in screen.rows] == sorted(order)
        await pilot.press("s")  # by link: the hosts that need a look first
        assert screen.sort_key == "link" and [r.link for r in screen.rows][:3] == ["error"] * 3
        table = screen.query_one("#fleet")
        # enter on a failed host says why and stays
        table.move_cursor(row=[r.host for r in screen.rows].index("refusing"))
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert app.screen is screen
        # enter on a good host opens its dashboard over the same feed; esc comes back
        table.move_cursor(row=[r.host for r in screen.rows].index("h02"))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen), "h02's dashboard")
        dash = app.screen
        assert dash.state.target == "h02" and dash.feed is screen.feeds["h02"]
        seq = dash.state.seq
        await until(pilot, lambda: dash.state.seq > seq, "a snapshot on the dashboard")
        assert "h02" in str(dash.query_one("#status").render()) or dash.state.hostname
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen, "back to the fleet")
        assert screen.feeds["h02"].client.connected  # esc leaves the host connected
        await pilot.press("q")


async def test_the_fleet_refreshes_at_its_pace_and_the_host_on_screen_at_the_dashboards(
        fleet_hosts: FleetHosts, tmp_path: Path) -> None:
    # [fleet] interval for every row; the host opened with enter at [host] interval (its
    # agent configured again: snapshots come faster), and back to the fleet's on esc
    cfg = parse_config(config_text(tmp_path) + "[fleet]\ninterval = 3.0\n")
    clients = {h: new_client(h, cfg, ssh_config=str(fleet_hosts.ssh_config)) for h in ("h01", "h02")}
    app = make_fleet_app(clients, cfg, limit=2)
    async with app.run_test(size=(120, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        await until(pilot, lambda: screen.first_full_frame is not None, "every row settled")
        feed = screen.feeds["h01"]
        assert {f.cfg.host.interval for f in screen.feeds.values()} == {3.0}
        assert feed.state.settings.interval == 3.0  # "stale" is judged at the same pace

        async def snapshots_in(seconds: float) -> int:
            seq = feed.state.seq
            await pilot.pause(seconds)
            return feed.state.seq - seq

        table = screen.query_one("#fleet")
        table.move_cursor(row=[r.host for r in screen.rows].index("h01"))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen), "h01's dashboard")
        await until(pilot, lambda: feed.cfg.host.interval == 0.5, "h01 at [host] interval")
        assert feed.state.settings.interval == 0.5 and screen.feeds["h02"].cfg.host.interval == 3.0
        await pilot.pause(0.6)  # the agent's clock restarts at configure
        assert await snapshots_in(3.0) >= 4  # every 0.5 s (a loaded machine may lose some)
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen and feed.cfg.host.interval == 3.0, "h01 at the fleet's pace")
        await pilot.pause(0.6)
        assert await snapshots_in(3.0) <= 2
        await pilot.press("q")


def e3(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=checkout.env())


def test_status_json_and_runs_across_hosts(fleet_hosts: FleetHosts, tmp_path: Path) -> None:
    cfg = tmp_path / "eagle3.toml"
    cfg.write_text(config_text(tmp_path))
    pre = ["--config", str(cfg), "-F", str(fleet_hosts.ssh_config)]
    ok = e3(*pre, "status", "--json", "h01", "h02", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    hosts = json.loads(ok.stdout)
    assert [h["host"] for h in hosts] == ["h01", "h02"] and all(h["ok"] for h in hosts)
    assert all("gpus" in h["snapshot"] and h["summary"]["link"] == "ok" for h in hosts)
    bad = e3(*pre, "status", "--json", "h01", "refusing", "newkey", cwd=tmp_path)
    assert bad.returncode == 3, bad.stderr
    by = {h["host"]: h for h in json.loads(bad.stdout)}
    assert by["h01"]["ok"] and not by["refusing"]["ok"] and not by["newkey"]["ok"]
    assert by["refusing"]["exit"] == 3 and "\n" not in by["refusing"]["error"]
    assert "host key" in by["newkey"]["error"].lower()
    # the same through a hosts file, as a table
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text("# extraction nodes\nh01\nh03  # the third\n")
    text = e3(*pre, "status", "--hosts-file", str(hosts_file), cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith("HOST") and [ln.split()[0] for ln in lines[1:]] == ["h01", "h03"]
    table = e3(*pre, "status", "h02", "refusing", cwd=tmp_path)
    assert table.returncode == 3 and table.stderr.startswith("eagle3-tui: refusing: ")
    refused = table.stdout.splitlines()[2].split()
    assert refused[0] == "refusing" and refused[-2:] == ["-", "-"]  # no GPUs or runs known
    launched = e3(*pre, "launch", "h01", "--json", cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr
    run_id = json.loads(launched.stdout)["run_id"]
    try:
        runs = e3(*pre, "runs", "h01", "refusing", cwd=tmp_path)
        assert runs.returncode == 3
        assert runs.stderr.startswith("eagle3-tui: refusing: ") and len(runs.stderr.strip().splitlines()) == 1
        head, *rows = runs.stdout.splitlines()
        assert head.split()[:3] == ["HOST", "RUN", "STATE"]
        assert [r.split()[:4] for r in rows] == [["*", "h01", run_id, "running"]]
        both = json.loads(e3(*pre, "runs", "--json", "h01", "h02", cwd=tmp_path).stdout)
        # h01 and h02 are aliases of one machine with one runs dir: both list the run
        assert [(h["host"], [r["run_id"] for r in h["runs"]]) for h in both] == [("h01", [run_id]), ("h02", [run_id])]
    finally:
        assert e3(*pre, "kill", "h01", run_id, "--yes", cwd=tmp_path).returncode == 0


async def test_a_run_failing_on_a_host_not_on_screen_is_told_once_per_host(fleet_hosts: FleetHosts,
                                                                            tmp_path: Path) -> None:
    # The fleet screen is the only one shown; a run launched on the hosts' shared runs dir
    # then fails. Each host's failure goes to the [notify] hook once (h01 and h02 are
    # aliases of one machine: both see the run), and a host's dashboard opened after it
    # does not tell it again.
    hook_log = tmp_path / "hook.jsonl"
    hook = [sys.executable, "-c",
            f"import sys; open({str(hook_log)!r}, 'a').write(sys.stdin.read().strip() + '\\n')"]
    text = config_text(tmp_path).replace(
        'command = ["' + sys.executable + '", "-c", "import time; time.sleep(60)"]',
        'command = ["' + sys.executable + '", "-c", "import time; time.sleep(2); raise SystemExit(3)"]')
    text += f"[notify]\ncommand = {json.dumps(hook)}\n"
    cfg = parse_config(text)
    assert "SystemExit(3)" in " ".join(cfg.run.command) and cfg.notify.command
    clients = {h: new_client(h, cfg, ssh_config=str(fleet_hosts.ssh_config)) for h in ("h01", "h02")}
    app = make_fleet_app(clients, cfg, limit=2)

    def told() -> list[dict[str, Any]]:
        return [json.loads(ln) for ln in hook_log.read_text().splitlines()] if hook_log.exists() else []

    async with app.run_test(size=(120, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        await until(pilot, lambda: screen.first_full_frame is not None, "every row settled")
        launcher = new_client("local", cfg, reconnect=False)
        await launcher.start()
        try:
            run_id = (await services.launch(launcher, cfg)).run_id
        finally:
            await launcher.close()
        await until(pilot, lambda: len(told()) >= 2, "the hook told of both hosts", timeout=30)
        assert sorted((e["host"], e["event"], e["run_id"]) for e in told()) == [
            ("h01", "failed", run_id), ("h02", "failed", run_id)]
        table = screen.query_one("#fleet")
        table.move_cursor(row=[r.host for r in screen.rows].index("h01"))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen), "h01's dashboard")
        await pilot.pause(1.5)  # a few snapshots on the dashboard
        assert len(told()) == 2
        await pilot.press("q")


async def test_a_host_down_at_start_is_tried_again_and_fills_in_when_it_answers(
        fleet_hosts: FleetHosts, sshd: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from tui.views.screens import fleet as fleet_screen

    port = fleet_hosts.add_late(sshd)
    fleet_hosts.write()
    monkeypatch.setattr(fleet_screen, "RETRY_S", (0.5,))
    cfg = parse_config(config_text(tmp_path))
    clients = {h: new_client(h, cfg, ssh_config=str(fleet_hosts.ssh_config)) for h in ("h01", "late", "newkey")}
    app = make_fleet_app(clients, cfg, limit=3)

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", sshd.port)

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
            w.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer), return_exceptions=True)

    async with app.run_test(size=(120, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, FleetScreen)

        def row(host: str) -> Any:
            return next(r for r in screen.rows if r.host == host)

        await until(pilot, lambda: row("late").link_text.startswith("retry in "), "the late host's retry")
        assert row("late").link == "error" and "refused" in row("late").link_text
        await until(pilot, lambda: row("newkey").link == "error", "the unknown key's error")
        server = await asyncio.start_server(forward, "127.0.0.1", port)  # the host comes back
        try:
            await until(pilot, lambda: row("late").link == "ok" and row("late").gpus_total is not None,
                        "the late host filled in", timeout=30)
            assert screen.feeds["late"].error is None
            assert "retry" not in row("newkey").link_text  # a key nobody trusts is not retried
            await pilot.press("q")
        finally:
            server.close()
