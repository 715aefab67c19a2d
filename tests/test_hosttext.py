"""Host text is data: the sanitizer, and every view and command fed hostile host text.

The views are fed through the replay client (a stand-in for the agent: hostile runs,
argv and logs at will, with no host to plant them on) and their screen is read back as
the compositor would write it to the terminal. The fuzz tests keep one app running
(in a thread of its own) and send each hypothesis example to it, so a few hundred
examples take seconds, not an app start each.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import json
import os
import re
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.replay import ReplayClient, resnap, snapshot
from tui import protocol as p
from tui.protocol.hosttext import clean, has_controls
from tui.protocol.records import RunRecord
from tui.services.config import parse_config
from tui.views.app import EagleApp, make_app, make_fleet_app
from tui.views.widgets.logtail import LogPane

CFG = parse_config('[run]\nname = "kimi"\ncommand = ["python", "02_extract.py"]\n')
LOG = "/srv/x.log"

# What must never reach the terminal from the host: a reset, the screen-filling test,
# cursor save/restore, keypad modes, charset switch, 8-bit CSI and OSC, OSC 52 (the
# clipboard), DCS, bidi overrides.
HOSTILE = ["\x1bc", "\x1b#8", "\x1b7", "\x1b8", "\x1b=", "\x1b>", "\x1b(B", "\x9b2J", "\x9d52;c;aGk=\x07",
           "\x1b]52;c;aGk=\x07", "\x1b]52;c;aGk=\x1b\\", "\x1bP1$r\x1b\\", "\x1b[2J", "\x1b[31m", "\u202e",
           "\u2066", "\x7f", "\x85", "\x00", "\x08", "\r", "\t", "\n", "[/oops]", "[/pwn]", "[bold]", "[", "]"]
FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
PAYLOADS = ("\x1bc", "\x1b#8", "\x9b", "\x9d", "\x1b]52", "\x1bP", "\u202e", "\u2066")


def hostile_text(max_size: int = 8) -> st.SearchStrategy[str]:
    """Arbitrary text with the hostile pieces mixed in."""
    return st.lists(st.one_of(st.text(max_size=6), st.sampled_from(HOSTILE)), max_size=max_size).map("".join)


def hostile_bytes() -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=40), hostile_text().map(lambda s: s.encode("utf-8", "surrogatepass")))


def screen_strips(app: EagleApp) -> list[str]:
    """The text of every line of the whole screen, as the compositor writes it (Textual's
    own escapes for colours and cursor moves are not in the segments' text)."""
    update = app.screen._compositor.render_update(full=True)  # what the driver would be sent
    return ["".join(seg.text for seg in strip) for strip in update.strips]


def terminal_output(app: EagleApp) -> str:
    """The whole screen as the terminal sequence Textual writes (its own escapes included)."""
    return app.screen._compositor.render_update(full=True).render_segments(app.console)


def assert_clean_screen(app: EagleApp) -> None:
    for line in screen_strips(app):
        bad = FORBIDDEN.search(line)
        assert bad is None, f"control {bad.group()!r} on screen: {line!r}"
    out = terminal_output(app)
    for payload in PAYLOADS:
        assert payload not in out, f"{payload!r} reached the terminal"


# ---- the sanitizer ----------------------------------------------------------------------
@pytest.mark.parametrize("raw,shown", [
    ("a\x1bcb", "ab"), ("a\x1b#8b", "ab"), ("\x1b7x\x1b8", "x"), ("\x1b=\x1b>ok", "ok"), ("\x1b(Bok", "ok"),
    ("\x9b2Jok", "ok"), ("\x9d52;c;aGk=\x07ok", "ok"), ("\x9d52;c;aGk=\x1b\\ok", "ok"),
    ("\x1b]52;c;aGk=\x1b\\ok", "ok"),
    ("\x1b]0;title\x07ok", "ok"), ("\x1bP1;2|x\x1b\\ok", "ok"), ("\x1b_apc\x9cok", "ok"),
    ("\x1b[38;2;1;2;3mok\x1b[0m", "ok"),
    ("a\u202eb\u2066c\u2069", "abc"), ("x\x7fy\x85z\x00", "xyz"), ("tab\there\nnl", "tab\there\nnl"), ("cr\rx", "crx"),
    (b"bad\xffbyte\x1b[31mred", "bad\ufffdbytered"), (b"\xc2\x9b2J\xc2\x9d52;x\x07ok", "ok"), ("\x1b", ""),
])
def test_clean_drops_every_escape_and_control(raw: str | bytes, shown: str) -> None:
    assert clean(raw) == shown


def test_clean_keeps_cr_for_the_line_assembler_and_makes_newlines_spaces_on_one_line() -> None:
    assert clean("a\rb\x1bc", cr=True) == "a\rb"
    assert clean("python -c 'import x\nx.run()'", newline=False) == "python -c 'import x x.run()'"


@pytest.mark.parametrize("raw,shown", [
    ("na\x98ive: the rest stays", "naive: the rest stays"),  # cp1252 "˜" read as Latin-1
    ("Ko\x9eenje \x9fber alles", "Koenje ber alles"), ("a\x98b\x98c\x9ed", "abcd"),
    ("\x98sos\x9cok", "ok"), ("\x9epm\x07ok", "ok"), ("\x9fapc\x1b\\ok", "ok"),  # terminated: all gone
    ("\x98x\x1b]52;c;aGk=\x07y", "xy"), ("\x98x\x9b2Jy", "xy"), ("\x9fx\x9d52;c;aGk=", "x"),
])
def test_an_unterminated_8bit_sos_pm_apc_loses_only_itself(raw: str, shown: str) -> None:
    """U+0098/U+009E/U+009F with no ST or BEL after it blanked the rest of its line (a
    cp1252 letter read as Latin-1 is one); now only the introducer goes. Still linear:
    a megabyte of them is cleaned in well under a second."""
    assert clean(raw) == shown
    for flood in ("\x98a" * 500_000, "\x9e" + "a" * 1_000_000, "\x9f\x1b" * 300_000, "\x98\x9d" * 300_000):
        t0 = time.perf_counter()
        clean(flood)
        assert time.perf_counter() - t0 < 1.0


def test_clean_makes_a_lone_surrogate_a_replacement_character() -> None:
    """A host path with byte 0xFF arrives as U+DCFF (surrogateescape, then JSON): no UTF-8
    encoder takes it, and Textual's web driver ended the browser session on it."""
    path = os.fsdecode(b"/data/odd\xffdir/train.log")
    assert clean(path) == "/data/odd\ufffddir/train.log" and has_controls(path)
    assert clean("a\ud800\x1b[2Jb\udfff", newline=False) == "a\ufffdb\ufffd"
    clean(path).encode("utf-8")


@settings(max_examples=300, deadline=None)
@given(st.one_of(hostile_text(20), st.text(), hostile_bytes()))
def test_clean_leaves_nothing_a_terminal_acts_on(raw: str | bytes) -> None:
    out = clean(raw)
    assert FORBIDDEN.search(out.replace("\t", "").replace("\n", "")) is None
    assert clean(out) == out


# ---- a broken or hostile agent's messages ------------------------------------------------
_SNAP_KEYS = ["pid", "ppid", "user", "state", "cpu", "rss", "cmdline", "why", "run_id", "index", "name", "mem_used",
              "mem_total", "util", "processes", "hostname", "load", "argv", "launched_at", "exit_code", "log", "env"]
_ANY = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=4)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3),
                                            st.dictionaries(st.sampled_from(_SNAP_KEYS), inner, max_size=4)),
                    max_leaves=10)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(["gpus", "processes", "runs", "host"]),
       value=st.one_of(_ANY, st.lists(st.dictionaries(st.sampled_from(_SNAP_KEYS), _ANY, max_size=6), max_size=3)),
       whole=st.booleans())
def test_a_malformed_snapshot_is_a_protocol_error_never_a_crash(field: str, value: Any, whole: bool) -> None:
    """A snapshot whose fields hold the wrong JSON types (`"gpus": 5`, `"host": [[]]`, a
    load of strings, a pid of `true`) raised TypeError, AttributeError or ValueError in the
    parser or the reducer, out of the link's read loop or the app. Now it is a
    ProtocolError (one error line) or it is applied with the bad fields left out."""
    from tui.state import reducer
    from tui.state.model import AppState

    base = snapshot(2, runs=[RUN])
    obj = json.loads(json.dumps({"type": "snapshot", **base.wire}))
    if whole or field == "host" or not obj[field]:
        obj[field] = value
    else:
        obj[field][0] = value
    try:
        msg = p.parse_message(json.loads(json.dumps(obj)))
    except p.ProtocolError:
        return
    reducer.apply(AppState(), msg, HOST_T)


# ---- markup in host text (finding 1) --------------------------------------------------
HOST_T = 1764460000.0  # the replayed host's clock (tests/replay.py): a run launched later is from the future
RUN = {"run_id": "20261130-015500-ab12", "name": "kimi", "state": "running", "argv": ["python", "02_extract.py"],
       "pid": 1000, "launched_at": HOST_T - 60, "log": LOG, "cwd": "/srv", "env": {}}
OOPS = b"ERROR 11-30 02:00:00 [core.py:1] Worker proc [/oops] died unexpectedly\n"


def subscribed(client: ReplayClient, sub: str | None) -> bool:
    """The client asked for the log `sub`: the agent sends a log's bytes only after that."""
    return sub is not None and any(op == "subscribe" and a.get("sub") == sub for op, a in client.requests)


async def until(pilot: Any, cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await pilot.pause(0.02)


async def test_markup_in_a_failure_and_in_an_argv_is_shown_as_text() -> None:
    """A `[/oops]` captured by a failure signature (runs table note, banner, toast) and a
    process whose argv holds `[/pwn]` raised MarkupError and ended the dashboard."""
    snap = snapshot(1, runs=[dict(RUN, state="exited", exit_code=1, ended_at=HOST_T)])
    snap = resnap(snap, processes=[dict(snap.wire["processes"][0],  # type: ignore[index,arg-type]
                                        cmdline=["python3", "-c", "import time; time.sleep(600)", "[/pwn]"])])
    client = ReplayClient([snap])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50), notifications=True) as pilot:
        # the agent sends a log's bytes only after the client subscribed to it
        await until(pilot, lambda: subscribed(client, app.dashboard.state.log.sub))
        client.push(p.LogData(sub=app.dashboard.state.log.sub, path=LOG, inode=7, offset=0, data=OOPS))
        await until(pilot, lambda: app.dashboard.state.log.offset == len(OOPS) and app.dashboard.state.seq == 0)
        await until(pilot, lambda: all(s in "\n".join(screen_strips(app))
                                       for s in ("[/pwn]", "Worker [/oops] died unexpectedly")))
        assert app.is_running


async def test_a_failing_run_with_markup_does_not_take_the_fleet_screen_down() -> None:
    """On the fleet screen a run's failure is a toast; `[/oops]` in it ended the app."""
    clients = {}
    for host in ("h1", "h2"):
        clients[host] = ReplayClient([snapshot(0, runs=[dict(RUN)]),
                                      p.LogData(sub="log1", path=LOG, inode=7, offset=0, data=OOPS),
                                      snapshot(0, seq=1, runs=[dict(RUN)])])
    app = make_fleet_app(clients, CFG, limit=4)  # type: ignore[arg-type]
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await until(pilot, lambda: len(app._notifications) >= 2)  # each host's failure, told once
        await pilot.pause(0.3)
        assert app.is_running
        assert any(": Worker [/oops] died unexpectedly" in line for line in screen_strips(app))  # a toast
        assert_clean_screen(app)


# ---- the fuzz: every view at several sizes -------------------------------------------
SIZES = [(80, 24), (100, 30), (120, 40), (160, 50), (250, 70)]


class AppThread:
    """One app under `run_test`, in a thread with its own loop; `call` runs a coroutine
    function with (app, pilot) there and returns its result."""

    def __init__(self, app: EagleApp, size: tuple[int, int]) -> None:
        self.app, self.size = app, size
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.done: asyncio.Future[None] | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._session())
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc
            self.ready.set()

    async def _session(self) -> None:
        async with self.app.run_test(size=self.size, notifications=True) as pilot:
            self.pilot = pilot
            self.context = contextvars.copy_context()  # the app's: widgets look it up
            self.done = self.loop.create_future()
            self.ready.set()
            await self.done

    def __enter__(self) -> AppThread:
        self.thread.start()
        self.ready.wait(60)
        if self.error is not None:
            raise self.error
        return self

    def call(self, fn: Callable[[EagleApp, Any], Coroutine[Any, Any, Any]], timeout: float = 30.0) -> Any:
        assert self.error is None, self.error
        result: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def start() -> None:
            task = self.loop.create_task(fn(self.app, self.pilot), context=self.context.copy())
            task.add_done_callback(lambda t: result.set_exception(t.exception()) if t.exception()
                                   else result.set_result(t.result()))

        self.loop.call_soon_threadsafe(start)
        return result.result(timeout)

    def __exit__(self, *exc: Any) -> None:
        if self.done is not None:
            self.loop.call_soon_threadsafe(self.done.set_result, None)
        self.thread.join(30)
        if self.error is not None and exc[0] is None:
            raise self.error


def hostile_snapshot(seq: int, run_id: str, name: str, argv: list[str], error: str, note: str,
                     host: str, gpu: str, state: str) -> p.Message:
    """A snapshot as the agent sends it (JSON through the protocol's parser)."""
    snap = snapshot(1, seq=seq, runs=[
        dict(RUN, run_id=run_id, name="kimi", argv=argv, state=state, error=error, log_note=note,
             launched_at=HOST_T - 60, exit_code=1 if state != "running" else None),
        dict(RUN, run_id=run_id + "x", name=name, argv=argv, state="exited", external=True, log=None,
             log_note=note, launched_at=HOST_T - 120),
    ])
    w: Any = snap.wire
    obj = {"type": "snapshot", **w, "processes": [dict(w["processes"][0], cmdline=argv, user=host, run_id=run_id)],
           "gpus": [dict(w["gpus"][0], name=gpu)], "host": dict(w["host"], hostname=host)}
    return p.parse_message(json.loads(json.dumps(obj)))


examples = {"dashboard": 0, "viewer": 0, "fleet": 0}


@pytest.fixture(scope="module")
def dashboards() -> Any:
    """One running dashboard per terminal size (a resize lays everything out again)."""
    with contextlib.ExitStack() as stack:
        apps = {}
        for size in SIZES:
            client = ReplayClient([snapshot(1, runs=[RUN])])
            th = stack.enter_context(AppThread(make_app(client, CFG, "gpu-box"), size))  # type: ignore[arg-type]
            th.client = client  # type: ignore[attr-defined]
            apps[size] = th
        yield apps


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(lines=st.lists(hostile_bytes(), min_size=1, max_size=6), argv=st.lists(hostile_text(), min_size=1, max_size=4),
       run_id=hostile_text(4), name=hostile_text(4), error=hostile_text(), note=hostile_text(), host=hostile_text(4),
       gpu=hostile_text(4), proc=hostile_text(4), state=st.sampled_from(["running", "failed", "exited"]),
       size=st.sampled_from(SIZES))
def test_fuzz_dashboard(dashboards: Any, lines: list[bytes], argv: list[str], run_id: str, name: str, error: str,
                        note: str, host: str, gpu: str, proc: str, state: str, size: tuple[int, int]) -> None:
    """Arbitrary host text as log lines, argv, run ids and names, errors, host and GPU
    names, and a failure's captured `{proc}` (runs table, banner, toast): the dashboard
    stays up and nothing of it that a terminal acts on reaches the screen."""
    examples["dashboard"] += 1
    seq = examples["dashboard"]  # every app sees rising numbers
    failure = (b"ERROR 11-30 02:00:00 [core.py:1] Worker proc "
               + proc.replace(" ", "_").encode("utf-8", "surrogatepass") + b" died unexpectedly")
    data = b"\n".join([*lines, failure]) + b"\n"

    dashboard = dashboards[size]

    async def step(app: EagleApp, pilot: Any) -> None:
        offset = app.dashboard.state.log.offset
        # the run, its log, the run again: the failure in the log is news (banner, toast)
        client = dashboard.client
        client.push(hostile_snapshot(2 * seq, f"r{seq}-{run_id}", name, argv, error, note, host, gpu, "running"))
        await until(pilot, lambda: app.dashboard.state.seq == 2 * seq
                    and subscribed(client, app.dashboard.state.log.sub))
        for event in [
            p.LogData(sub=app.dashboard.state.log.sub, path=LOG, inode=7, offset=offset, data=data),
            hostile_snapshot(2 * seq + 1, f"r{seq}-{run_id}", name, argv, error, note, host, gpu, state),
            p.AgentError(message=clean(error)),  # an agent's error line too
        ]:
            client.push(event)
        await until(pilot, lambda: app.dashboard.state.seq == 2 * seq + 1
                    and app.dashboard.state.log.offset >= offset + len(data))
        app.screen.query_one(LogPane).flush()  # the pane draws at most twice a second: now
        await pilot.pause()
        assert app.is_running
        assert_clean_screen(app)

    dashboard.call(step)


@pytest.fixture(scope="module")
def viewers() -> Any:
    """A dashboard per size, over which each example pushes a log viewer."""
    with contextlib.ExitStack() as stack:
        yield {size: stack.enter_context(AppThread(make_app(ReplayClient([]), CFG, "gpu-box"), size))  # type: ignore[arg-type]
               for size in SIZES[::2]}


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(lines=st.lists(hostile_bytes(), min_size=1, max_size=30), path=hostile_text(4),
       size=st.sampled_from(SIZES[::2]), errors_only=st.booleans())
def test_fuzz_log_viewer(viewers: Any, lines: list[bytes], path: str, size: tuple[int, int], errors_only: bool) -> None:
    """The log viewer over a hostile log whose path is hostile too (its status line)."""
    from tui.state.logpage.blocks import Chunk
    from tui.state.logpage.document import LogDocument
    from tui.views.screens.logviewer import LogViewerScreen

    examples["viewer"] += 1
    data = b"\n".join(lines) + b"\nERROR boom\n"

    async def fetch(offset: int, length: int) -> Chunk:  # stands in for the agent's read_range
        return Chunk(offset, data[offset:offset + length], len(data), 7)

    async def step(app: EagleApp, pilot: Any) -> None:
        screen = LogViewerScreen(client=None, path="/srv/" + path, doc=LogDocument(fetch), follow=False,
                                 index_lines=False)
        await app.push_screen(screen)
        await until(pilot, lambda: bool(screen.window))
        if errors_only:
            await pilot.press("e")
        await pilot.pause(0.05)
        assert app.is_running
        assert_clean_screen(app)
        app.pop_screen()
        await pilot.pause()

    viewers[size].call(step)


@pytest.fixture(scope="module")
def fleet() -> Any:
    clients = {h: ReplayClient([snapshot(0, runs=[RUN])]) for h in ("h1", "h2")}
    with AppThread(make_fleet_app(clients, CFG, limit=4), (120, 40)) as th:  # type: ignore[arg-type]
        th.clients = clients  # type: ignore[attr-defined]
        yield th


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(lines=st.lists(hostile_bytes(), max_size=4), run_id=hostile_text(4), name=hostile_text(4),
       proc=hostile_text(4), host=hostile_text(4), state=st.sampled_from(["running", "failed", "exited"]))
def test_fuzz_fleet(fleet: Any, lines: list[bytes], run_id: str, name: str, proc: str, host: str, state: str) -> None:
    """The fleet screen: its rows (run, phase, failures) and the failures' toasts."""
    examples["fleet"] += 1
    seq = examples["fleet"]
    failure = (b"ERROR 11-30 02:00:00 [core.py:1] Worker proc "
               + proc.replace(" ", "_").encode("utf-8", "surrogatepass") + b" died unexpectedly")
    data = b"\n".join([*lines, failure]) + b"\n"

    async def step(app: EagleApp, pilot: Any) -> None:
        feed = app.screen.feeds["h1"]
        offset = feed.state.log.offset
        client = fleet.clients["h1"]
        rid = f"r{seq}-{run_id}"
        client.push(hostile_snapshot(2 * seq, rid, name, ["python", proc], proc, name, host, host, "running"))
        try:
            await until(pilot, lambda: feed.state.seq == 2 * seq and subscribed(client, feed.state.log.sub))
        except AssertionError:
            raise AssertionError((feed.state.seq, 2 * seq, feed.state.log.sub, feed.state.log.path,
                                  client.requests[-4:]))
        client.push(p.LogData(sub=feed.state.log.sub, path=LOG, inode=7, offset=offset, data=data))
        client.push(hostile_snapshot(2 * seq + 1, rid, name, ["python", proc], proc, name, host, host, state))
        await until(pilot, lambda: feed.state.seq == 2 * seq + 1 and feed.state.log.offset >= offset + len(data))
        app.screen._repaint()  # the screen repaints a burst once per 0.1 s: now
        await pilot.pause()
        assert app.is_running
        assert_clean_screen(app)

    fleet.call(step)


# ---- the commands: inspect, status, runs, watch --------------------------------------
FORBIDDEN_OUT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # TAB, newline allowed


def hostile_run(run_id: str, name: str, argv: list[str], note: str, state: str) -> dict[str, Any]:
    return dict(RUN, run_id=run_id, name=name, argv=argv, state=state, error=note, log_note=note,
                exit_code=1 if state != "running" else None, slurm_state=note or None, job_id=name or None,
                nodes=note or None, slurm_reason=note or None, scheduler="slurm" if note else None)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(log=st.lists(hostile_bytes(), max_size=20), run_id=hostile_text(4), name=hostile_text(4),
       argv=st.lists(hostile_text(), max_size=3), note=hostile_text(), host=hostile_text(4),
       state=st.sampled_from(["running", "failed", "exited", "pending"]))
def test_fuzz_commands(tmp_path_factory: Any, log: list[bytes], run_id: str, name: str, argv: list[str],
                       note: str, host: str, state: str) -> None:
    """`inspect` of a hostile log, and `status` and `runs` over hostile records: nothing a
    terminal acts on in what they print."""
    from tui.cli.inspect import inspect
    from tui.cli.report import format_runs, format_status
    from tui.services.actions import state_of

    examples["commands"] = examples.get("commands", 0) + 1
    path = tmp_path_factory.mktemp("log") / "x.log"
    path.write_bytes(b"\n".join([*log, b"ERROR 11-30 02:00:00 [core.py:1] Worker proc "
                                 + name.encode("utf-8", "surrogatepass")
                                 + b" died unexpectedly"]).replace(b"\0", b"") + b"\n")
    result = CliRunner().invoke(inspect, [str(path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    runs = [hostile_run(run_id, name, argv, note, state), hostile_run(run_id + "2", note, argv, name, "exited")]
    snap = snapshot(1, runs=runs)
    w: Any = snap.wire
    snap = resnap(snap, seq=1, time=time.time(), host=dict(w["host"], hostname=host),
                  gpus=[dict(w["gpus"][0], name=host)], processes=[dict(w["processes"][0], cmdline=argv, why=[note])],
                  gpu_error=note)
    state_ = state_of(CFG, snap.runs, snap)
    for out in (result.output, format_status(state_), format_runs(state_)):
        bad = FORBIDDEN_OUT.search(out)
        assert bad is None, f"{bad.group()!r} in {out!r}"


# A timeline line or run record as a torn write or a hand edit leaves it: any JSON where a
# field was expected (`runs show`, `runs compare` and `replay` read copied run dirs too).
_JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=False),
                       hostile_text(3), st.sampled_from(["phase", "exit", "attempts", "loading", "lines"]))
_TL_KEYS = ["t", "e", "phase", "m", "s", "c", "g", "h", "code", "signal", "n", "restarts"]
_JSON = st.recursive(_JSON_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(_TL_KEYS), inner, max_size=3)), max_leaves=10)
_TL_LINE = st.dictionaries(st.sampled_from(_TL_KEYS), _JSON, max_size=5).map(lambda d: {"t": 1.0, **d})
_RECORD = st.dictionaries(st.sampled_from(["run_id", "state", "patch_state", "expected_load_s", "expected_load_runs",
                                           "attempts", "restarts", "argv", "env", "exit_code"]), _JSON, max_size=6)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(lines_a=st.lists(_TL_LINE, max_size=8), lines_b=st.lists(_TL_LINE, max_size=4), rec_a=_RECORD, rec_b=_RECORD)
@example(lines_a=[{"t": 0.5, "e": "phase", "phase": "extracting"}, {"t": 1.0, "m": [["x"], 1]},
                  {"t": 2.0, "m": [["x"], 5]},
                  {"t": 3.0, "e": "exit", "code": 0}], lines_b=[], rec_a={}, rec_b={"argv": 7, "attempts": 1.5})
def test_fuzz_runs_show_and_compare(lines_a: list[dict[str, Any]], lines_b: list[dict[str, Any]],
                                    rec_a: dict[str, Any], rec_b: dict[str, Any]) -> None:
    """`runs show` and `runs compare` over timelines and records whose fields hold any JSON
    (a progress mark `[["x"], 1]`, an argv that is a number, attempts that are a float):
    no exception, nothing a terminal acts on in what they print. A mark whose kind was a
    list ended both commands with a TypeError."""
    from tui.cli.report import format_compare, format_show
    from tui.services import timeline

    examples["runs show"] = examples.get("runs show", 0) + 1
    header = json.dumps({"v": 1, "t0": 1.0, "run": "r", "launched_at": 0.5})

    def summary(lines: list[dict[str, Any]], rec: dict[str, Any]) -> dict[str, Any]:
        data = "\n".join([header, *(json.dumps(ln) for ln in lines)]).encode()
        return timeline.summary(timeline.parse(data), RunRecord.parse(rec))

    a, b = summary(lines_a, rec_a), summary(lines_b, rec_b)
    out = format_show(a) + "\n" + format_compare(timeline.compare(a, b, RunRecord.parse(rec_a), RunRecord.parse(rec_b)))
    json.dumps(a)  # --json prints it
    bad = FORBIDDEN_OUT.search(out)
    assert bad is None, f"{bad.group()!r} in {out!r}"


async def test_fuzz_watch_lines() -> None:
    """`watch` over a run whose id, name, log and failure are hostile: each printed line."""
    from tui.cli.watch import follow
    from tui.services.notify import Notifier

    nasty = "".join(HOSTILE)
    run = dict(RUN, run_id="r1" + nasty, name="kimi", log=LOG + nasty)
    data = b"INFO start " + nasty.encode() + b"\nERROR 11-30 02:00:00 [core.py:1] Worker proc [/oops]" \
        + nasty.replace(" ", "").encode() + b" died unexpectedly\n"
    ended = dict(run, state="exited", exit_code=1, ended_at=time.time())
    client = ReplayClient([p.LogData(sub="watch", path=run["log"], inode=7, offset=0, data=data),
                           snapshot(0, runs=[run]), snapshot(0, seq=1, runs=[ended]), snapshot(0, seq=2, runs=[ended])],
                          answers={"runs": {"runs": [run]}})
    for as_json in (False, True):
        out = __import__("io").StringIO()
        await client.start()
        code = await follow(client, CFG, None, as_json, Notifier(), out)  # type: ignore[arg-type]
        text = out.getvalue()
        assert code == 1 and text, text
        assert FORBIDDEN_OUT.search(text) is None, text
        for line in text.splitlines() if as_json else ():
            json.loads(line)
        client = ReplayClient(client._initial, answers=client.answers)


def test_fuzz_ran(dashboards: Any) -> None:
    """How many examples each fuzz ran (the session's -s output shows it)."""
    print(f"\nhosttext fuzz examples: {examples}")
