"""The advisor (tui/state/advice.py): stale and doomed live runs, from real log analyses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tui.protocol.records import RunRecord
from tui.services.inspect import inspect_log
from tui.state.advice import Advice, RunSummary, advise, format_minutes, summarize
from tui.state.loganalysis.fold import LogAnalysis, finish_lines, split_lines, step

LOGS = Path(__file__).parent / "fixtures" / "logs"
SET = "speculators-0.3.0-vllm-0.16"
ORDER = ["v1", "v2", "v3", "v4", "v5"]
T0 = 1_764_460_000.0
MIN = 60.0


def ps(state: str) -> dict[str, Any]:
    """A patch_state as the client records it at launch ("v4", or "pristine" without version)."""
    return {"set": SET, "state": state, "version": state if state.startswith("v") else None}


def record(run_id: str, patch: str, state: str = "exited", launched: float = T0,
           ended: float | None = None, exit_code: int | None = 1) -> dict[str, Any]:
    return {"run_id": run_id, "name": "extract", "state": state, "patch_state": ps(patch),
            "launched_at": launched, "ended_at": ended, "exit_code": exit_code,
            "log": f"/runs/{run_id}/output.log"}


def rec(*args: Any, **kw: Any) -> RunRecord:
    """`record` as the client reads it."""
    return RunRecord.parse(record(*args, **kw))


def fixture(name: str) -> dict[str, Any]:
    return inspect_log((LOGS / name).read_bytes())


def fold_until(name: str, marker: str) -> LogAnalysis:
    """The live analysis of a fixture log cut after the first line containing marker."""
    data = (LOGS / name).read_bytes()
    cut = data.index(marker.encode())
    data = data[: data.index(b"\n", cut) + 1]
    lines, partial = split_lines(b"", data)
    a = LogAnalysis()
    for n, line in enumerate([*lines, *finish_lines(partial)], 1):
        a = step(a, line, n)
    return a


def live(patch: str, minutes: float, run_id: str = "live") -> RunRecord:
    return RunRecord.parse(record(run_id, patch, state="running", launched=T0 + 100 * MIN - minutes * MIN,
                                ended=None, exit_code=None))


NOW = T0 + 100 * MIN
# the previous v4 run: loaded for ~20 min, then failed with the State error at 21 min
FAILED_V4 = summarize(rec("run7", "v4", launched=T0, ended=T0 + 21 * MIN),
                      fixture("vllm016_tp8_sample_tokens.log"))
LOADING_7MIN = fold_until("vllm016_tp8_sample_tokens.log", "23/64")


def test_summary_of_the_failed_v4_run() -> None:
    s = FAILED_V4
    assert (s.run_id, s.patch_state, s.patch_set, s.outcome) == ("run7", "v4", SET, "failed")
    assert s.failure_id == "sample-tokens-state" and s.failed_after_load is True
    assert s.fail_seconds == 21 * MIN
    assert s.load_seconds == 1226.1  # "Model loading took … 1226.1 seconds" in that log


def test_stale_when_a_newer_version_is_applied() -> None:
    adv = advise(live("v4", 7), LOADING_7MIN, {}, "v5", ORDER, NOW, patch_set=SET)
    assert isinstance(adv, Advice) and adv.level == "stale"
    # the live bar says 12:55 left: that is what killing saves
    assert adv.saves_seconds == 12 * 60 + 55
    assert adv.text == ("Run live was launched with v4; v5 is applied now — it will not pick up "
                        "the fix. Kill now and relaunch (saves ~13 min of loading).")
    assert adv.like_run is None


def test_stale_from_pristine_and_estimated_from_earlier_loads() -> None:
    adv = advise(live("pristine", 5), LogAnalysis(phase="starting"), [FAILED_V4], "v1", ORDER, NOW)
    assert adv is not None and adv.level == "stale"
    assert adv.saves_seconds is not None and abs(adv.saves_seconds - (1226.1 - 5 * MIN)) < 1e-6
    assert "launched with pristine; v1 is applied now" in adv.text


def test_stale_names_the_earlier_failure_when_doomed_too() -> None:
    adv = advise(live("v4", 7), LOADING_7MIN, {"run7": FAILED_V4}, "v5", ORDER, NOW)
    assert adv is not None and adv.level == "stale" and adv.like_run == "run7"
    assert "Run run7 with v4 failed after loading (execute_model() without sample_tokens()" in adv.text


def test_doomed_like_the_earlier_run_with_the_same_patch() -> None:
    adv = advise(live("v4", 7), LOADING_7MIN, {"run7": FAILED_V4}, "v4", ORDER, NOW)
    assert adv is not None and adv.level == "doomed" and adv.like_run == "run7"
    assert adv.saves_seconds == 14 * MIN
    assert adv.text.startswith("Run live (v4) likely fails like run run7 after loading (")
    assert adv.text.endswith("; kill now saves ~14 min.")
    assert "\n" not in adv.text


def test_doomed_past_the_failure_point_says_so() -> None:
    adv = advise(live("v4", 25), LogAnalysis(phase="extracting"), [FAILED_V4], None, ORDER, NOW)
    assert adv is not None and adv.level == "doomed" and adv.saves_seconds == 0.0
    assert "is past the point where run run7 failed after loading" in adv.text
    assert "at 21 min" in adv.text


def test_not_doomed_by_a_failure_before_loading() -> None:
    early = summarize(rec("run5", "v4", ended=T0 + 2 * MIN), fixture("vllm016_encoder_decoder.log"))
    assert early.outcome == "failed" and early.failed_after_load is False
    assert advise(live("v4", 7), LOADING_7MIN, [early], "v4", ORDER, NOW) is None


def test_not_doomed_by_another_patch_state() -> None:
    v3 = summarize(rec("run6", "v3", ended=T0 + 20 * MIN), fixture("vllm016_tensor_bool.log"))
    assert v3.failed_after_load is True
    assert advise(live("v4", 7), LOADING_7MIN, [v3], "v4", ORDER, NOW) is None
    assert advise(live("v3", 7), LOADING_7MIN, [v3], "v3", ORDER, NOW) is not None


def test_none_when_everything_is_current() -> None:
    ok = summarize(rec("run8", "v5", ended=T0 + 30 * MIN, exit_code=0),
                   fixture("transformers_extract_ok.log"))
    assert ok.outcome == "finished" and ok.failure_id is None
    assert advise(live("v5", 7), LOADING_7MIN, [ok, FAILED_V4], "v5", ORDER, NOW) is None


def test_none_for_unknown_states_ended_runs_and_itself() -> None:
    hand = RunRecord.parse({**record("live", "v4", state="running", launched=NOW - 7 * MIN),
                          "patch_state": {"set": SET, "state": "unknown", "version": None}})
    assert advise(hand, LOADING_7MIN, [FAILED_V4], "v5", ORDER, NOW) is None
    ended = RunRecord.parse(record("live", "v4", ended=NOW))
    assert advise(ended, LOADING_7MIN, [FAILED_V4], "v5", ORDER, NOW) is None
    # the live run's own summary is not evidence against itself
    own = summarize(rec("live", "v4", ended=T0 + 21 * MIN), fixture("vllm016_tp8_sample_tokens.log"))
    assert advise(live("v4", 7), LOADING_7MIN, [own], "v4", ORDER, NOW) is None
    # another patch set's v4 is another code base
    assert advise(live("v4", 7), LOADING_7MIN, [FAILED_V4], "v4", ORDER, NOW, patch_set="other") is None


def test_a_live_run_that_already_failed_is_not_doomed_again() -> None:
    failed_now = fold_until("vllm016_tp8_sample_tokens.log", "RuntimeError: State error")
    assert failed_now.root_cause is not None
    assert advise(live("v4", 21), failed_now, [FAILED_V4], "v4", ORDER, NOW) is None


def test_summaries_of_killed_and_position_estimates() -> None:
    killed = summarize(rec("k", "v4", state="killed", ended=T0 + 3 * MIN),
                       fixture("vllm016_loading_live.log"))
    assert (killed.outcome, killed.failure_id, killed.fail_seconds) == ("killed", None, None)
    # with no load duration in the log, the position of the loaded line estimates it
    prefixes = fixture("vllm082_old_prefixes.log")
    prefixes = {**prefixes, "timeline": [], "shards": None}
    s = summarize(rec("p", "v4", ended=T0 + 180), prefixes)
    assert s.failed_after_load is True  # worker-died has no after_load: the line order decides
    assert s.load_seconds == 180 * prefixes["loaded_at_line"] / prefixes["lines"]
    assert summarize(rec("p", "v4", ended=T0 + 180), prefixes, whole=False).load_seconds is None


def test_format_minutes() -> None:
    assert [format_minutes(s) for s in (0, 29, 31, 14 * 60, 89 * 60, 90 * 60, 125 * 60)] == [
        "<1 min", "<1 min", "1 min", "14 min", "89 min", "1 h 30 min", "2 h 05 min"]


@settings(max_examples=200, deadline=None)
@given(fail_min=st.floats(1, 300), live_min=st.floats(0, 400))
def test_doomed_saving_is_the_time_left_to_the_failure(fail_min: float, live_min: float) -> None:
    earlier = RunSummary("run7", "v4", "failed", "sample-tokens-state", "State error",
                         True, None, fail_min * MIN, SET, T0)
    adv = advise(live("v4", live_min), LogAnalysis(phase="loading"), [earlier], "v4", ORDER, NOW)
    assert adv is not None and adv.level == "doomed" and adv.like_run == "run7"
    assert adv.saves_seconds is not None
    assert abs(adv.saves_seconds - max(fail_min - live_min, 0) * MIN) < 1e-6
    assert "\n" not in adv.text
    assert advise(live("v4", live_min), LogAnalysis(phase="loading"), [earlier], "v4", ORDER, NOW) == adv


@settings(max_examples=100, deadline=None)
@given(launched=st.sampled_from(["pristine", *ORDER]), applied=st.sampled_from(["pristine", *ORDER]))
def test_stale_exactly_when_the_host_is_ahead(launched: str, applied: str) -> None:
    rank = ["pristine", *ORDER].index
    adv = advise(live(launched, 3), LogAnalysis(phase="loading"), [], applied, ORDER, NOW)
    assert (adv is not None) == (rank(launched) < rank(applied))
    if adv is not None:
        assert adv.level == "stale" and f"launched with {launched}; {applied} is applied" in adv.text


def test_a_run_we_killed_is_not_a_failure() -> None:
    """SIGINT makes Python print a KeyboardInterrupt traceback; that is our kill, not a
    failure, and must never make the next run with the same patch look doomed."""
    log = (
        b"(Worker_TP0 pid=7) \rLoading safetensors checkpoint shards: 100% Completed | 64/64 [20:00<00:00, 18.75s/it]\n"
        b"INFO 11-30 02:20:00 [default_loader.py:293] Loading weights took 1200.00 seconds\n"
        b"Traceback (most recent call last):\n"
        b'  File "/srv/extract.py", line 9, in <module>\n'
        b"    time.sleep(60)\n"
        b"KeyboardInterrupt\n"
    )
    record = {"run_id": "r1", "state": "killed", "launched_at": 0.0, "ended_at": 1300.0,
              "patch_state": {"set": "s", "state": "v4", "version": "v4"}}
    summary = summarize(RunRecord.parse(record), inspect_log(log))
    assert summary.outcome == "killed"
    live = RunRecord.parse({"run_id": "r2", "state": "running", "launched_at": 1400.0,
                          "patch_state": {"set": "s", "state": "v4", "version": "v4"}})
    assert advise(live, None, {"r1": summary}, "v4", ["v1", "v2", "v3", "v4", "v5"], 1500.0, patch_set="s") is None
