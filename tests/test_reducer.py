"""The pure reducer: snapshots become typed state; log chunks become lines exactly once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.replay import hello, resnap, snapshot
from tui import protocol as p
from tui.protocol.ops import KillReport, LaunchReply
from tui.state.model import HISTORY, AppState
from tui.state.reducer import apply


def feed(state: AppState, chunks: list[bytes], inode: int = 1) -> AppState:
    offset = state.log.offset
    for chunk in chunks:
        state = apply(state, p.LogData("log", "/x.log", inode, offset, chunk), 0.0)
        offset += len(chunk)
    return state


def test_snapshot_fields_and_missing_readings() -> None:
    snap = snapshot(2)
    raw = snap.wire["gpus"]
    assert isinstance(raw, list) and isinstance(raw[0], dict)
    gpus = [dict(raw[0], util=None, temp="hot"), raw[1]]
    st_ = apply(AppState(), resnap(snap, gpus=gpus), 10.0)
    assert st_.gpus[0].util is None and st_.gpus[0].temp is None  # N/A, never 0
    assert st_.gpus[1].util == 97
    assert st_.processes[0].gpu_mem == 81 * 2**30 - 2**29
    assert st_.host.hostname == "gpu-box" and st_.link.last_data is None  # not connected yet


def test_hello_connects_and_history_is_bounded() -> None:
    state = apply(AppState(), hello(), 1.0)
    assert state.link.state == "connected" and state.hostname == "gpu-box"
    for i in range(HISTORY + 20):
        state = apply(state, snapshot(1, seq=i), float(i))
    assert len(state.gpu_history[0]) == HISTORY and state.link.last_data == HISTORY + 19


STREAM = (
    b"INFO 11-30 02:00:00 [loader.py:1] Starting to load model\n"
    b"(Worker_TP0 pid=1) \rLoading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]\n"
    b"(Worker_TP0 pid=1) \rLoading safetensors checkpoint shards:  50% Completed | 2/4 [00:02<00:02,  1.00it/s]\n"
    b"caf\xc3\xa9 \xff\xfe bytes\r\n"
    b"no newline at the end"
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_chunking_gives_the_same_lines(cuts: list[int]) -> None:
    points = sorted(set(cuts) | {0, len(STREAM)})
    chunks = [STREAM[a:b] for a, b in zip(points, points[1:])]
    whole = feed(AppState(), [STREAM])
    split = feed(AppState(), chunks)
    assert split.log.lines == whole.log.lines
    assert split.log.offset == len(STREAM) and split.log.live == whole.log.live
    assert split.log.analysis.shards == whole.log.analysis.shards


def test_replayed_chunk_is_not_counted_twice() -> None:
    state = feed(AppState(), [b"a\nb\n", b"c\n"])
    again = apply(state, p.LogData("log", "/x.log", 1, 0, b"a\nb\n"), 0.0)
    assert again.log.lines == ("a", "b", "c") and again.log.offset == 6


def test_truncation_restarts_numbering_and_keeps_old_lines() -> None:
    state = feed(AppState(), [b"one\ntwo\n"])
    state = apply(state, p.LogReset("log", "/x.log", "truncated", 1, 0), 0.0)
    assert state.log.generation == 1 and state.log.total_lines == 0
    state = feed(state, [b"fresh\n"])
    assert state.log.lines[-1] == "fresh" and state.log.total_lines == 1
    assert "truncated" not in (state.log.note or "")  # the note clears once data flows


def test_chunks_of_a_previous_subscription_are_dropped() -> None:
    from dataclasses import replace

    from tui.state.model import LogTail

    state = replace(AppState(), log=LogTail(path="/new.log", sub="log2"))
    stale = apply(state, p.LogData("log1", "/old.log", 1, 0, b"old line\n"), 0.0)
    assert stale.log.lines == () and stale.log.path == "/new.log"
    fresh = apply(state, p.LogData("log2", "/new.log", 2, 0, b"new line\n"), 0.0)
    assert fresh.log.lines == ("new line",)


# ---- a big first tail is shown at once and analysed in slices afterwards -------------

def _long_failing_log() -> bytes:
    from pathlib import Path

    filler = b"".join(b"INFO 11-30 01:%02d:%02d [engine.py:1] filler line %d\n" % (i // 60 % 60, i % 60, i)
                      for i in range(6000))
    return filler + (Path(__file__).parent / "fixtures/logs/vllm016_tp8_sample_tokens.log").read_bytes()


def _feed_deferred(data: bytes, size: int = 256 * 1024) -> AppState:
    from tui.state.events import LogFollowed

    state = apply(AppState(), LogFollowed("/x.log", "log", defer=True), 0.0)
    return feed(state, [data[i:i + size] for i in range(0, len(data), size)])


def test_a_deferred_tail_shows_its_lines_first_and_ends_with_the_same_analysis() -> None:
    from tui.state.events import ANALYSE_SLICE, AnalyseLog

    data = _long_failing_log()
    whole = feed(AppState(), [data])
    state = _feed_deferred(data)
    assert state.log.lines == whole.log.lines and state.log.total_lines == whole.log.total_lines
    assert state.log.backlog and state.log.analysis.root_cause is None  # not analysed yet
    steps = 0
    while state.log.backlog:
        before = sum(len(c[2]) for c in state.log.backlog)
        state = apply(state, AnalyseLog("log"), 0.0)
        assert before - sum(len(c[2]) for c in state.log.backlog) == min(before, ANALYSE_SLICE)
        steps += 1
    assert steps == -(-whole.log.total_lines // ANALYSE_SLICE)
    assert state.log.analysis == whole.log.analysis  # root cause, shards, phase, line numbers
    assert state.log.analysis.root_cause.id == "sample-tokens-state"


def test_lines_after_a_backlog_wait_their_turn_and_a_restart_drops_it() -> None:
    from tui.state.events import AnalyseLog

    data = _long_failing_log()
    state = _feed_deferred(data[: len(data) // 2])
    state = feed(state, [data[len(data) // 2:]])  # a small chunk behind a backlog is queued
    whole = feed(AppState(), [data])
    stale = apply(state, AnalyseLog("another-sub"), 0.0)
    assert stale is state  # a slice for a log no longer followed does nothing
    while state.log.backlog:
        state = apply(state, AnalyseLog("log", 10_000), 0.0)
    assert state.log.analysis == whole.log.analysis
    state = _feed_deferred(data)
    state = apply(state, p.LogReset("log", "/x.log", "truncated", 1, 0), 0.0)
    assert state.log.backlog == () and state.log.analysis is None


def test_older_lines_fetched_later_come_first_in_the_analysis() -> None:
    from tui.state.events import AnalyseLog, LogFollowed, LogOlder
    from tui.state.loganalysis.fold import LogAnalysis

    data = _long_failing_log()
    start = data.index(b"\n", len(data) - 4000) + 1  # the first tail: the last ~4 KB, whole lines
    begin = 1000  # the older part starts mid-line: its first bytes are cut
    whole = feed(AppState(), [data[data.index(b"\n", begin) + 1:]])
    state = apply(AppState(), LogFollowed("/x.log", "log", defer=True, older=True), 0.0)
    state = apply(state, p.LogData("log", "/x.log", 1, start, data[start:]), 0.0)
    assert state.log.backlog and state.log.analysis == LogAnalysis()  # nothing before the older part
    assert apply(state, AnalyseLog("log"), 0.0) is state
    state = apply(state, LogOlder("log", data[begin:start], cut=True), 0.0)
    assert not state.log.older and state.log.prepended == whole.log.total_lines - data[start:].count(b"\n")
    assert state.log.total_lines == whole.log.total_lines and state.log.lines == whole.log.lines
    assert apply(state, LogOlder("log", b"late", cut=False), 0.0) is state  # only once
    while state.log.backlog:
        state = apply(state, AnalyseLog("log"), 0.0)
    assert state.log.analysis == whole.log.analysis


def test_small_chunks_of_a_deferred_log_are_analysed_at_once() -> None:
    state = _feed_deferred(b"INFO 11-30 02:00:00 [loader.py:1] Starting to load model\n")
    assert state.log.backlog == () and state.log.analysis is not None


# ---- actions through the reducer (issue 13) -----------------------------------------

def test_an_action_lost_with_the_link_ends_as_the_host_says_and_only_once() -> None:
    from tui.state import view
    from tui.state.events import ActionEnded, ActionStarted, ActionUnconfirmed

    report = KillReport.parse({"run_id": "r1", "ok": True, "gpus_free": True, "elapsed": 2.0, "stages": [],
                               "remaining": [], "gpus": []})
    s = apply(AppState(), ActionStarted("a1", "kill", "r1"), 1.0)
    assert s.busy is not None and s.kill is not None and s.kill.run_id == "r1"
    s = apply(s, p.KillProgress(9, "r1", "SIGTERM", (5,), (), 1.0), 2.0)
    assert s.action("a1").progress.stage == "SIGTERM"  # type: ignore[union-attr]
    s = apply(s, ActionUnconfirmed("a1", "link lost"), 3.0)
    assert s.action("a1").state == "unconfirmed" and s.busy is not None  # type: ignore[union-attr]
    assert "failed" not in view.banner(s, 3.0)[0]  # type: ignore[operator]
    s = apply(s, ActionEnded("a1", True, report, confirmed_after_reconnect=True), 4.0)
    act = s.action("a1")
    assert act is not None and act.state == "ok" and s.busy is None
    assert view.action_text(act) == "run r1 killed, GPUs free after 2.0 s (confirmed after reconnect)"
    assert s.notices[-1][2] == view.action_text(act)
    # A late second answer (the reply and the recheck both came back) changes nothing.
    assert apply(s, ActionEnded("a1", False, None, "link lost"), 5.0) == s


def test_ended_actions_are_kept_bounded_and_notices_numbered() -> None:
    from tui.state.events import ActionEnded, ActionStarted
    from tui.state.reducer import ACTIONS_KEPT

    s = AppState()
    for i in range(ACTIONS_KEPT + 5):
        s = apply(s, ActionStarted(f"a{i}", "launch"), float(i))
        s = apply(s, ActionEnded(f"a{i}", True, LaunchReply(f"r{i}", i, None, None)), float(i))
    assert len(s.actions) == ACTIONS_KEPT and s.actions[-1].action_id == f"a{ACTIONS_KEPT + 4}"
    assert s.notice_serial == ACTIONS_KEPT + 5 and s.notices[-1][0] == s.notice_serial
