"""The reducer's promises that fresh bugs broke unnoticed (issue 41): a log chunk that
partly repeats what was shown (a replay after a reconnect, any overlap) shows each byte
once, in order; a kill that left processes alive, or could not free the run's GPUs, is
an error toast, never an "information" one.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tui import protocol as p
from tui.protocol.ops import KillReport
from tui.state import view
from tui.state.events import ActionEnded, ActionStarted
from tui.state.model import AppState
from tui.state.reducer import apply

STREAM = b"".join(b"line %03d of the run: \xc3\xa9 \xff\n" % i for i in range(40)) + b"a partial line"


def _chunk(offset: int, end: int, inode: int = 1) -> p.LogData:
    return p.LogData("log", "/x.log", inode, offset, STREAM[offset:end])


def _whole() -> AppState:
    return apply(AppState(), _chunk(0, len(STREAM)), 0.0)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(STREAM)), st.integers(0, len(STREAM))), min_size=1, max_size=12))
def test_chunks_that_overlap_what_was_shown_show_every_byte_once(spans: list[tuple[int, int]]) -> None:
    """Each chunk starts anywhere at or before the byte the client has (a replay from an
    older resume point, the agent's re-read after a reconnect) and ends anywhere after
    its start: what is shown is the stream's prefix up to the furthest end, each line once."""
    state, have = AppState(), 0
    for a, b in spans:
        start = min(a, have)  # never a gap: the agent always resumes at or before the client's offset
        end = max(start, b)
        state = apply(state, _chunk(start, end), 0.0)
        have = max(have, end)
        assert state.log.offset == have
    state = apply(state, _chunk(min(have, len(STREAM) - 5), len(STREAM)), 0.0)  # then the rest, overlapping
    whole = _whole()
    assert state.log.lines == whole.log.lines and state.log.live == whole.log.live
    assert state.log.analysis == whole.log.analysis  # no line analysed twice or skipped


def test_a_replay_that_straddles_the_resume_point_keeps_only_the_new_bytes() -> None:
    """The plain case, by hand: the client has 10 lines, the agent replays lines 8-12."""
    ten = STREAM.index(b"line 010")
    state = apply(AppState(), _chunk(0, ten), 0.0)
    state = apply(state, _chunk(STREAM.index(b"line 008"), STREAM.index(b"line 013")), 0.0)
    assert [ln[:8] for ln in state.log.lines] == [f"line {i:03d}" for i in range(13)]
    assert state.log.offset == STREAM.index(b"line 013")


def _kill(ok: bool, remaining: list[int], gpus_free: bool | None) -> KillReport:
    return KillReport.parse({"run_id": "r1", "ok": ok, "remaining": remaining, "gpus_free": gpus_free,
                             "elapsed": 12.0, "stages": [{"signal": "SIGKILL", "at": 2.0, "sent_to": [5]}],
                             "gpus": []})


def _ended(report: KillReport | None, call_ok: bool = True, error: str | None = None) -> AppState:
    s = apply(AppState(), ActionStarted("a1", "kill", "r1"), 1.0)
    return apply(s, ActionEnded("a1", call_ok, report, error), 2.0)


def test_a_kill_that_left_processes_alive_is_an_error_toast() -> None:
    for report in (_kill(False, [5], None), _kill(False, [5], True), _kill(False, [5], False)):
        s = _ended(report)
        serial, severity, text = s.notices[-1]
        assert severity == "error", (report, s.notices)
        assert "5" in text and "killed, GPUs free" not in text, text
        assert s.action("a1").state == "ok"  # type: ignore[union-attr]  # the call itself answered


def test_a_kill_whose_gpus_stayed_held_is_an_error_toast_and_a_clean_one_is_not() -> None:
    assert _ended(_kill(True, [], False)).notices[-1][1] == "error"
    assert _ended(_kill(False, [], False)).notices[-1][1] == "error"
    assert _ended(None, call_ok=False, error="link lost").notices[-1][1] == "error"
    for free in (True, None):  # freed, or no GPU source to tell: the processes are gone
        s = _ended(_kill(True, [], free))
        assert s.notices[-1][1] == "information", s.notices
        assert s.notices[-1][2] == view.action_text(s.action("a1"))  # type: ignore[arg-type]


def test_past_the_kept_lines_the_newest_stay_numbered_as_in_the_file() -> None:
    """The tail keeps LOG_LINES lines: past the cap, the newest, numbered as in the file,
    through overlapping replays too."""
    from tui.state.model import LOG_LINES

    n = LOG_LINES * 2 + 500
    data = b"".join(b"row %d\n" % i for i in range(1, n + 1))
    state, at = AppState(), 0
    while at < len(data):
        end = min(len(data), at + 7_001)
        state = apply(state, p.LogData("log", "/x.log", 1, max(0, at - 333), data[max(0, at - 333):end]), 0.0)
        at = end
    log = state.log
    assert len(log.lines) == LOG_LINES and log.total_lines == n
    assert log.first_line_no == n - LOG_LINES + 1 and log.lines[0] == f"row {n - LOG_LINES + 1}"
    assert log.lines[-1] == f"row {n}"


def test_a_truncated_log_read_again_from_its_start_is_not_taken_for_a_replay() -> None:
    """A sequence: lines, a truncation, the new stream from byte 0 (below the old offset):
    the new bytes are shown, numbered from 1, never dropped as already seen."""
    state = apply(AppState(), _chunk(0, 400), 0.0)
    state = apply(state, p.LogReset("log", "/x.log", "truncated", 1, 0), 0.0)
    state = apply(state, p.LogData("log", "/x.log", 1, 0, b"fresh one\nfresh two\n"), 0.0)
    assert state.log.lines[-2:] == ("fresh one", "fresh two") and state.log.total_lines == 2
    assert state.log.offset == len(b"fresh one\nfresh two\n")


def test_past_the_kept_notices_the_newest_stay_in_order() -> None:
    from tui.state.events import Notice
    from tui.state.reducer import NOTICES_KEPT

    s = AppState()
    for i in range(NOTICES_KEPT + 7):
        s = apply(s, Notice("warning" if i % 2 else "information", f"n{i}"), float(i))
    assert [t for _, _, t in s.notices] == [f"n{i}" for i in range(7, NOTICES_KEPT + 7)]
    assert [serial for serial, _, _ in s.notices] == list(range(8, NOTICES_KEPT + 8))


def test_a_followed_jobs_nodes_are_each_shown_and_a_nameless_one_is_dropped() -> None:
    """A Slurm job on several nodes: the snapshot's job_nodes become the state's, each
    with where its view comes from or why there is none; one without a name is dropped."""
    from tests.replay import snapshot

    nodes = [{"node": "gpu-node3", "via": "srun step 12.1 on gpu-node3"},
             {"node": "gpu-node4", "error": "its agent did not start"}, {"via": "no name"}]
    s = apply(AppState(), snapshot(1, job_nodes=nodes), 1.0)
    assert [(n.node, n.via, n.error) for n in s.job_nodes] == [
        ("gpu-node3", "srun step 12.1 on gpu-node3", None), ("gpu-node4", None, "its agent did not start")]


def test_the_hostname_is_the_snapshots_when_it_has_one_else_the_hellos() -> None:
    from tests.replay import hello, snapshot

    s = apply(AppState(), hello(hostname="login-1"), 1.0)
    assert s.hostname == "login-1"
    s = apply(s, snapshot(1, host={"hostname": "gpu-node3"}), 2.0)
    assert s.hostname == "gpu-node3"
    s = apply(s, snapshot(1, seq=1, host={"load": [1.0, 1.0, 1.0]}), 3.0)  # a snapshot without one
    assert s.hostname == "gpu-node3"
    assert apply(AppState(), snapshot(1, host={"hostname": "gpu-node5"}), 1.0).hostname == "gpu-node5"


def test_kill_progress_goes_to_the_kill_of_its_run_and_nowhere_else() -> None:
    """A sequence: a kill of r1 ended, a kill of r2 in flight, a launch in flight; a late
    progress of r1's kill changes nothing shown, r2's goes to r2's kill."""
    s = apply(AppState(), ActionStarted("k1", "kill", "r1"), 1.0)
    s = apply(s, ActionEnded("k1", True, _kill(True, [], True)), 2.0)
    s = apply(s, ActionStarted("k2", "kill", "r2"), 3.0)
    s = apply(s, ActionStarted("l1", "launch", "r1"), 3.5)
    late = apply(s, p.KillProgress(9, "r1", "SIGKILL", (5,), (), 1.0), 4.0)
    assert late.actions == s.actions  # neither the ended kill, nor r2's, nor the launch
    s = apply(s, p.KillProgress(10, "r2", "SIGTERM", (6,), (), 1.0), 4.0)
    assert s.action("k2").progress.stage == "SIGTERM"  # type: ignore[union-attr]
    assert s.action("k1").progress is None and s.action("l1").progress is None  # type: ignore[union-attr]


def test_a_process_row_without_an_integer_pid_is_dropped_not_shown() -> None:
    """Host rows are data: a process whose pid is not a plain integer (a string, null,
    a boolean, a float) names no process the dashboard could act on (`k` kills by pid):
    it is left out; the well-formed rows around it are shown. From the host's JSON, through
    the parser, into the state."""
    rows: list[object] = [{"pid": "6"}, {"pid": 5, "ppid": 1, "cmdline": ["python", "train.py"]}, {"pid": None},
                          {"pid": True}, {"pid": 7.0}, "a row that is text", None, {"pid": 8, "cmdline": ["x"]}]
    snap = p.parse_message({"type": "snapshot", "seq": 0, "time": 1.0, "host": {"hostname": "gpu-box"},
                            "gpus": [], "processes": rows, "runs": []})
    state = apply(AppState(), snap, 0.0)
    assert [proc.pid for proc in state.processes] == [5, 8]


def test_after_a_rotation_the_progress_panel_reads_the_new_stream() -> None:
    """A log rotated (or truncated) under the dashboard: the new file is read from byte 0,
    so nothing older is awaited; the progress panel's analysis is the new stream's at
    once, never left waiting for older bytes of a file that is gone."""
    state = apply(AppState(), _chunk(0, 400), 0.0)
    for reason in ("rotated", "truncated"):
        state = apply(state, p.LogReset("log", "/x.log", reason, 2, 0), 0.0)
        state = apply(state, p.LogData("log", "/x.log", 2, 0, b"Epoch 1: 100%|##| 10/10 [00:01<00:00, loss=0.5]\n"),
                      0.0)
        assert not state.log.catching_up, reason
        assert state.log.shown_analysis is not None and state.log.shown_analysis == state.log.analysis, reason
