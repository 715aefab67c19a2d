"""The fleet: its rows (pure), the hosts file, and starting many hosts with a bound,
against real sshds (a refusing port, an unknown host key, a silent socket)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fleet_hosts import FleetHosts, fleet_hosts  # noqa: F401 (a fixture)
from tests.replay import make_snapshot
from tui import protocol as p
from tui.protocol.stream import LinkStatus
from tui.services.config import parse_config
from tui.services.hostfeed import HostFeed
from tui.state import fleet
from tui.state.model import AppState
from tui.state.reducer import apply
from tui.transport import (
    AgentApi,
    AgentClient,
    ConfigError,
    HostKeyUnknown,
    HostUnreachable,
    TransportError,
)
from tui.transport.fleet import parse_hosts, read_hosts_file, unique
from tui.transport.ssh import SshLink

GiB = 2**30
NOW = 1_764_460_000.0


def hello() -> p.Hello:
    return p.Hello(protocol=1, agent_version="0.1.0", agent_sha="ab" * 32, hostname="box", python="3.12",
                   pid=1, time=NOW, gpu_source="nvml", gpu_error=None, capabilities=())


def run(rid: str, state: str, exit_code: int | None = None, t: float = NOW - 100) -> dict[str, Any]:
    return {"run_id": rid, "name": "x", "state": state, "argv": ["python", "x.py"], "pid": 10,
            "launched_at": t, "ended_at": None, "exit_code": exit_code, "signal": None,
            "patch_state": None, "external": False, "log": None}


def snap_state(gpus: list[dict[str, Any]], runs: list[dict[str, Any]]) -> AppState:
    st = apply(AppState(target="h"), hello(), NOW)
    snap = make_snapshot(seq=1, time=NOW, host={"hostname": "box"}, gpus=gpus, processes=[], runs=runs,
                         gpu_source="nvml", gpu_error=None)
    return apply(st, snap, NOW)


def gpu(i: int, used: int, util: float, procs: int = 0) -> dict[str, Any]:
    return {"index": i, "name": "H200", "mem_used": used, "mem_total": 140 * GiB, "util": util,
            "processes": [{"pid": 100 + k, "mem": GiB} for k in range(procs)]}


def test_row_counts_busy_gpus_memory_runs_and_failures() -> None:
    st = snap_state(
        [gpu(0, 70 * GiB, 97, procs=1), gpu(1, 1 * GiB, 0), gpu(2, 2 * GiB, 50)],
        [run("20261130-010000-aaaa", "running"), run("20261130-000000-bbbb", "exited", 1, NOW - 900),
         run("20261129-000000-cccc", "exited", 0, NOW - 9000)],
    )
    row = fleet.host_row("h", st, NOW)
    assert (row.link, row.link_text) == ("ok", "ok")
    assert (row.gpus_busy, row.gpus_total) == (2, 3)  # a process on 0, 50 % on 2; 1 is idle
    assert row.mem_used == 73 * GiB and row.mem_total == 420 * GiB
    assert (row.live, row.runs, row.failures) == (1, 3, 1)
    assert row.run_text.startswith("20261130-010000-aaaa")  # the newest live run is followed
    assert row.failure_text == "failed 1 (000000-bbbb)"  # the newest failure, its id's unique tail
    assert fleet.cells(row)[2:5] == ("2/3", "73.0/420.0", "1 live / 3")


def test_link_states_before_and_after_data() -> None:
    assert fleet.host_row("h", AppState(), NOW).link == "connecting"
    row = fleet.host_row("h", AppState(), NOW, error="h: connection refused")
    retrying = fleet.host_row("h", AppState(), NOW, error="h: connection refused", retry_at=NOW + 9.6)
    assert (retrying.link, retrying.link_text) == ("error", "retry in 10s: h: connection refused")
    assert (row.link, row.link_text, row.gpus_total) == ("error", "h: connection refused", None)
    assert fleet.cells(row)[2] == "-"
    st = snap_state([], [])
    assert fleet.host_row("h", st, NOW + 1).link == "ok"
    stale = fleet.host_row("h", st, NOW + 10)  # 2 intervals + 1 s without a message
    assert stale.link == "stale" and stale.link_text.startswith("stale for")
    lost = apply(st, LinkStatus("reconnecting", 2, "x"), NOW)
    assert fleet.host_row("h", lost, NOW).link == "lost"


def test_sort_cycles_and_orders() -> None:
    def row(host: str, link: str, busy: int, mem: int, live: int, failures: int) -> fleet.HostRow:
        return fleet.HostRow(host, link, link, busy, 8, mem, 8 * GiB, live, live, "", failures, "", "")

    rows = [row("b", "ok", 1, 5, 0, 0), row("a", "error", 0, 0, 0, 0), row("c", "stale", 8, 9, 2, 1)]
    assert [r.host for r in fleet.sort_rows(rows, "host")] == ["a", "b", "c"]
    assert [r.host for r in fleet.sort_rows(rows, "link")] == ["a", "c", "b"]
    assert [r.host for r in fleet.sort_rows(rows, "gpus")] == ["c", "b", "a"]
    assert [r.host for r in fleet.sort_rows(rows, "failures")] == ["c", "a", "b"]
    key, seen = "host", []
    for _ in fleet.SORT_KEYS:
        seen.append(key)
        key = fleet.next_sort(key)
    assert key == "host" and tuple(seen) == fleet.SORT_KEYS
    with pytest.raises(ValueError):
        fleet.sort_rows(rows, "nope")


def test_hosts_file(tmp_path: Path) -> None:
    f = tmp_path / "hosts"
    f.write_text("# the extraction nodes\nnode1\n\n  root@node2:2222  # second\nnode1\n")
    assert unique(read_hosts_file(f)) == ["node1", "root@node2:2222"]
    f.write_text("node1\nbad host\n")
    with pytest.raises(ConfigError, match=r"hosts:2: bad host"):
        read_hosts_file(f)
    f.write_text("# nothing\n")
    with pytest.raises(ConfigError, match="no hosts"):
        read_hosts_file(f)
    with pytest.raises(ConfigError, match="missing"):
        read_hosts_file(tmp_path / "missing")
    assert parse_hosts("a\n#b\nc") == ["a", "c"]


async def connect_all(clients: dict[str, Any], limit: int,
                      on_done: Any = None) -> dict[str, BaseException | None]:
    """Every host's `HostFeed.connect` under one gate of `limit` slots, as the fleet
    screen starts its feeds: host -> None (connected) or the error it failed with."""
    cfg = parse_config("")
    gate = asyncio.Semaphore(limit)
    results: dict[str, BaseException | None] = {}

    async def one(host: str, client: Any) -> None:
        error: BaseException | None = None
        try:
            await HostFeed(client, cfg, host).connect(gate)
        except (TransportError, OSError, asyncio.TimeoutError) as exc:
            error = exc
        results[host] = error
        if on_done is not None:
            on_done(host, error)

    await asyncio.gather(*(one(h, c) for h, c in clients.items()))
    return results


class _Gated(AgentApi):
    """A stand-in client (no link) that records how many starts overlap."""

    active = 0
    peak = 0

    async def start(self) -> p.Hello:
        _Gated.active += 1
        _Gated.peak = max(_Gated.peak, _Gated.active)
        await asyncio.sleep(0.02)
        _Gated.active -= 1
        return hello()

    async def call_with_progress(self, op: str, on_event: Any, **args: Any) -> dict[str, Any]:
        return {}


async def test_the_connect_gate_holds_at_most_limit_in_flight() -> None:
    _Gated.active = _Gated.peak = 0
    done = await connect_all({f"h{i}": _Gated() for i in range(20)}, limit=3)
    assert _Gated.peak == 3 and len(done) == 20 and all(v is None for v in done.values())


@pytest.mark.ssh
async def test_silent_refusing_and_unknown_key_hosts_never_delay_the_others(
    fleet_hosts: FleetHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    timeout = 6.0
    clients = {
        a: AgentClient(SshLink(a, ssh_config=fleet_hosts.ssh_config, python=sys.executable,
                               cache_dir=str(tmp_path / "cache"), connect_timeout=timeout,
                               runs_dir=str(tmp_path / "runs")), reconnect=False)
        for a in ["silent", *fleet_hosts.aliases[:-1]]  # the silent host first in line
    }
    t0 = time.monotonic()
    settled: dict[str, float] = {}

    def done(host: str, error: BaseException | None) -> None:
        settled[host] = time.monotonic() - t0

    try:
        # Two slots: the silent host holds one for its whole timeout; the rest share the other.
        results = await connect_all(clients, limit=2, on_done=done)
    finally:
        await asyncio.gather(*(c.close() for c in clients.values()))
    assert [results[h] for h in ("h01", "h02", "h03")] == [None, None, None]
    assert isinstance(results["refusing"], HostUnreachable)
    assert isinstance(results["newkey"], HostKeyUnknown)
    assert isinstance(results["silent"], HostUnreachable) and "\n" not in str(results["silent"])
    fast = max(settled[h] for h in ("h01", "h02", "h03", "refusing", "newkey"))
    assert fast < timeout - 1, settled  # nobody waited for the silent host
    assert settled["silent"] >= timeout - 0.5, settled


def test_plain_text_fleet_and_runs_across_hosts() -> None:
    ok = snap_state([gpu(0, 70 * GiB, 97, procs=1)], [run("20261130-010000-aaaa", "running")])
    rows = [fleet.host_row("node1", ok, NOW), fleet.host_row("node2", AppState(), NOW, error="node2: refused")]
    text = fleet.format_table(rows).splitlines()
    assert text[0].split() == ["HOST", "LINK", "GPUS", "MEM", "GiB", "RUNS", "RUN", "FAILURES"]
    assert text[1].startswith("node1") and "1/1" in text[1] and "20261130-010000-aaaa running" in text[1]
    assert text[2].startswith("node2") and "node2: refused" in text[2]
    runs = fleet.format_runs({"node1": ok, "node2": AppState()}, NOW).splitlines()
    assert runs[0].split()[:3] == ["HOST", "RUN", "STATE"]
    assert len(runs) == 2 and runs[1].split()[:4] == ["*", "node1", "20261130-010000-aaaa", "running"]
    assert fleet.format_runs({"node2": AppState()}, NOW) == "no runs"


def test_config_hosts_list_fleet_table_and_hosts_file(tmp_path: Path) -> None:
    from tui.cli.fleet import hosts_of
    from tui.services.config import ConfigError as ConfigFileError
    from tui.services.config import load_config, parse_config

    cfg = parse_config('hosts = ["a", "b"]\n[fleet]\nhosts = ["c"]\nconnect_limit = 4\n')
    assert cfg.fleet.hosts == ("a", "b", "c") and cfg.fleet.connect_limit == 4
    (tmp_path / "nodes.txt").write_text("# nodes\nd\ne\n")
    (tmp_path / "eagle3.toml").write_text('[fleet]\nhosts = ["a"]\nhosts_file = "nodes.txt"\n')
    cfg = load_config(tmp_path / "eagle3.toml")
    assert hosts_of(cfg, (), None) == ["a", "d", "e"]  # the file is relative to eagle3.toml
    assert hosts_of(cfg, ("x", "a"), None) == ["x", "a"]  # the command line wins
    (tmp_path / "more").write_text("y\nx\n")
    assert hosts_of(cfg, ("x",), str(tmp_path / "more")) == ["x", "y"]
    for bad, why in [('hosts = "a"\n', "hosts: must be a list"), ("[fleet]\nconnect_limit = 0\n", "connect_limit"),
                     ('[fleet]\nhosts = [""]\n', "fleet.hosts")]:
        with pytest.raises(ConfigFileError, match=why):
            parse_config(bad)


def test_state_groups_free_sort_filter_and_summary() -> None:
    def row(host: str, link: str = "ok", busy: int | None = 0, total: int | None = 8, live: int = 0,
            failures: int = 0, stalled: str = "", run_text: str = "") -> fleet.HostRow:
        return fleet.HostRow(host, link, link, busy, total, None, None, live, live, run_text, failures, "", stalled)

    rows = [row("quiet"), row("busy", busy=6, live=1, run_text="20261130-aaaa extracting 3/16"),
            row("broken", busy=2, failures=2), row("down", "error", None, None), row("stuck", busy=8, live=1,
            stalled="stalled"), row("new", "connecting", None, None), row("idle0", busy=1)]
    assert [fleet.host_state(r) for r in rows] == ["idle", "running", "failed", "unreachable", "stalled",
                                                   "connecting", "running"]
    # free GPUs, most first; hosts not seen yet last
    assert [r.host for r in fleet.sort_rows(rows, "free")] == ["quiet", "idle0", "broken", "busy", "stuck",
                                                               "down", "new"]
    # grouped: failed, unreachable, stalled, running, idle, connecting; the sort inside each
    assert [r.host for r in fleet.arrange(rows, "host")] == ["broken", "down", "stuck", "busy", "idle0",
                                                             "quiet", "new"]
    assert [r.host for r in fleet.arrange(rows, "host", group=False)] == sorted(r.host for r in rows)
    # the filter: host name, state word or run, every word, any case
    assert [r.host for r in fleet.arrange(rows, "host", text="IDLE")] == ["idle0", "quiet"]  # name, state
    assert [r.host for r in fleet.arrange(rows, "host", text="running idle")] == ["idle0"]
    assert [r.host for r in fleet.arrange(rows, "host", text="extracting 3/16")] == ["busy"]
    assert [r.host for r in fleet.arrange(rows, "host", text="unreachable")] == ["down"]
    assert [r.host for r in fleet.arrange(rows, "free", text="  ")] == [r.host for r in fleet.arrange(rows, "free")]
    assert fleet.arrange(rows, "host", text="[b]") == []  # no markup, no regex: plain words
    assert fleet.summary(rows) == "7 hosts · 17/40 GPUs busy · 2 failures · 1 unreachable · 1 connecting"
    assert fleet.summary(rows[:1]) == "1 host · 0/8 GPUs busy · 0 failures · 0 unreachable"


def test_refresh_scales_with_the_fleet() -> None:
    # each host's snapshots: [host] interval up to 10 hosts, 6 s past 100, a line between
    assert [fleet.snapshot_interval(n, 1.0) for n in (1, 10, 55, 100, 256)] == [1.0, 1.0, 3.5, 6.0, 6.0]
    assert fleet.snapshot_interval(256, 10.0) == 10.0  # never faster than the host's own
    # repaints: 0.1 s up to 10 hosts, 2 s past 100
    assert [fleet.repaint_period(n) for n in (2, 10, 100, 300)] == [0.1, 0.1, 2.0, 2.0]


@pytest.mark.ssh
async def test_a_host_connects_with_one_read_of_the_ssh_config(
    fleet_hosts: FleetHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every host of a fleet reads the whole SSH config (asyncssh parses it per host):
    # once per connect, not a second time inside asyncssh.connect; the alias still
    # resolves through it (its port, user, key and known_hosts).
    import asyncssh.config

    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    parses: list[str] = []
    real_parse = asyncssh.config.SSHConfig.parse

    def counted(self: Any, path: Any) -> None:
        parses.append(str(path))
        real_parse(self, path)

    monkeypatch.setattr(asyncssh.config.SSHConfig, "parse", counted)
    client = AgentClient(SshLink("h01", ssh_config=fleet_hosts.ssh_config, python=sys.executable,
                                 cache_dir=str(tmp_path / "cache"), runs_dir=str(tmp_path / "runs")),
                         reconnect=False)
    try:
        hello = await client.start()
    finally:
        await client.close()
    assert hello.hostname
    assert parses == [str(fleet_hosts.ssh_config)]


@pytest.mark.ssh
async def test_hosts_share_one_reading_of_known_hosts_until_it_changes(
    fleet_hosts: FleetHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fleet's hosts read the known_hosts file once between them (not every key decoded
    # again per connect), and a change to the file is honoured at the next connect: a key
    # taken out of it is no longer trusted.
    import asyncssh

    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    reads: list[Any] = []
    real_read = asyncssh.read_known_hosts

    def counted(files: Any) -> Any:
        reads.append(files)
        return real_read(files)

    monkeypatch.setattr(asyncssh, "read_known_hosts", counted)

    def client(alias: str) -> AgentClient:
        return AgentClient(SshLink(alias, ssh_config=fleet_hosts.ssh_config, python=sys.executable,
                                   cache_dir=str(tmp_path / "cache"), runs_dir=str(tmp_path / "runs")),
                           reconnect=False)

    for alias in ("h01", "h02", "h03"):
        c = client(alias)
        try:
            await c.start()
        finally:
            await c.close()
    assert len(reads) == 1
    fleet_hosts.known_hosts.write_text("")  # the user removes the host's key
    c = client("h01")
    with pytest.raises(HostKeyUnknown):
        await c.start()
    await c.close()


# ---- targets are the user's text: the HOST column shows them sanitized (issue 35, item 8)

# A user part may hold anything but spaces: a terminal reset, OSC 52 (the clipboard), an
# 8-bit CSI, a bidi override. Port 1 on localhost refuses at once: each host fails fast.
HOSTILE_TARGETS = ["a\x1bc@127.0.0.1:1", "b\x1b]52;c;aGk=\x07@127.0.0.1:1", "c\x9b2J@127.0.0.1:1",
                   "d\u202e@127.0.0.1:1"]
SHOWN = ["a@127.0.0.1:1", "b@127.0.0.1:1", "c@127.0.0.1:1", "d@127.0.0.1:1"]
_RAW = ("\x1b", "\x9b", "\u202e", "\x07")


def test_status_and_runs_refuse_hostile_targets_in_one_clean_line(tmp_path: Path) -> None:
    """A target whose user carries control bytes: no user name has them, so it is refused
    before anything connects, its bytes escaped, exit 2: a hosts file in one line naming
    its first bad line; `[fleet] hosts` and the command line in each host's row, the other
    hosts still asked. (Before, such targets were tried and printed through the sanitizer.)"""
    import subprocess

    from tests import checkout

    hosts = tmp_path / "hosts"
    hosts.write_text("".join(t + "\n" for t in ["ok@127.0.0.1:1", *HOSTILE_TARGETS]), encoding="utf-8")
    cfg = tmp_path / "eagle3.toml"
    cfg.write_text("[fleet]\nhosts = [" + ", ".join(json.dumps(t) for t in HOSTILE_TARGETS) + "]\n",
                   encoding="utf-8")  # TOML's \uXXXX escapes, as JSON writes them

    def e3(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tui.cli", "--config", str(cfg), *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, env=checkout.env())

    for args in (["status", "--hosts-file", str(hosts)], ["status"], ["status", *HOSTILE_TARGETS[:2]],
                 ["runs", "--hosts-file", str(hosts)]):
        r = e3(*args)
        assert r.returncode == 2, (args, r.stderr)
        for stream in (r.stdout, r.stderr):
            assert not any(c in stream for c in _RAW), (args, stream)
        if "--hosts-file" not in args:  # `[fleet] hosts`, the command line: each host's row says why
            rows = r.stdout.splitlines()[1:]
            assert [ln.split()[0] for ln in rows] == SHOWN[:len(rows)] and len(rows) >= 2, r.stdout
            assert all("bad user in target" in ln for ln in rows), r.stdout
            continue
        assert r.stdout == "" and len(r.stderr.splitlines()) == 1, (args, r.stdout, r.stderr)  # a hosts file:
        assert f"{hosts}:2: bad user in target" in r.stderr, r.stderr  # refused at its first bad line


def test_the_fleet_tables_show_a_hostile_target_through_the_sanitizer() -> None:
    rows = [fleet.host_row(t, AppState(), NOW, error="refused") for t in HOSTILE_TARGETS]
    assert [ln.split()[0] for ln in fleet.format_table(rows).splitlines()[1:]] == SHOWN
    assert rows[0].host == HOSTILE_TARGETS[0]  # the row keeps the target it connects to
    ok = snap_state([gpu(0, GiB, 50)], [run("20261130-010000-aaaa", "running")])
    runs = fleet.format_runs({HOSTILE_TARGETS[1]: ok}, NOW).splitlines()
    assert runs[1].split()[1] == SHOWN[1]


def test_the_fleet_app_refuses_a_hostile_target_in_one_clean_line() -> None:
    """The fleet screen is built from parsed targets: a hostile one never becomes a
    client, and the refusal's words carry none of its bytes raw."""
    from tui.services.actions import new_client
    from tui.transport.errors import ConfigError

    cfg = parse_config("[host]\nconnect_timeout = 5\n")
    for target in HOSTILE_TARGETS:
        with pytest.raises(ConfigError) as info:
            new_client(target, cfg, reconnect=False)
        assert not any(c in str(info.value) for c in _RAW) and "\n" not in str(info.value)
