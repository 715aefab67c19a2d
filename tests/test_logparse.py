"""Tests for the pure log parsers: line assembly, prefixes, progress, the fold, signatures."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tui.state.loganalysis.fold import LogAnalysis, is_stalled, step
from tui.state.loganalysis.lineshapes import (
    parse_extract_progress,
    parse_shard_progress,
    split_prefix,
)
from tui.state.loganalysis.signatures import SignatureError, SignatureSet, load_signatures
from tui.state.logbytes import MAX_PARTIAL, finish_lines, live_segment, split_lines

FIXTURES = Path(__file__).parent / "fixtures" / "logs"


def fold(data: bytes, sigs: SignatureSet | None = None) -> LogAnalysis:
    lines, partial = split_lines(b"", data)
    a = LogAnalysis(signatures=sigs)
    for i, line in enumerate(lines + finish_lines(partial), 1):
        a = step(a, line, i)
    return a


# --- line assembly -------------------------------------------------------------------


def test_worker_prefix_before_cr_is_kept_and_crlf_is_a_line_end() -> None:
    raw = (
        b"(Worker_TP0 pid=1234) \rLoading safetensors checkpoint shards:  37% Completed"
        b" | 24/64 [07:12<12:01, 18.0s/it]\n"
        b"(Worker_TP0 pid=1234) \n"
        b"(Worker_TP0 pid=1234) ERROR 11-29 12:00:01 [multiproc_executor.py:863] a\r\n"
        b"(Worker_TP0 pid=1234) ERROR 11-29 12:00:01 [multiproc_executor.py:863]   b\n"
    )
    lines, partial = split_lines(b"", raw)
    assert partial == b""
    assert lines == [
        ("(Worker_TP0 pid=1234) Loading safetensors checkpoint shards:  37% Completed"
        " | 24/64 [07:12<12:01, 18.0s/it]"),
        "(Worker_TP0 pid=1234) ",
        "(Worker_TP0 pid=1234) ERROR 11-29 12:00:01 [multiproc_executor.py:863] a",
        "(Worker_TP0 pid=1234) ERROR 11-29 12:00:01 [multiproc_executor.py:863]   b",
    ]


def test_tqdm_padding_before_cr_and_redraws_without_newline() -> None:
    # tqdm pads a shorter redraw to the old length; with a format ending in "\n" the
    # padding lands at the start of the next physical line, before its "\r".
    raw = b"(Worker_TP0 pid=9)    \rLoading pt checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.00it/s]\n"
    lines, _ = split_lines(b"", raw)
    assert lines[0].startswith("(Worker_TP0 pid=9) Loading pt checkpoint shards:  50%")
    lines, _ = split_lines(b"", b"\rA: 1%\rA: 2%\rA: 3%   \r\n")
    assert lines == ["A: 3%   "]


def test_ansi_colour_is_stripped() -> None:
    raw = (
        b"\x1b[1;36m(VllmWorker rank=0 pid=4001)\x1b[0;0m \x1b[32mINFO\x1b[0m "
        b"\x1b[90m03-25 21:10:00\x1b[0m \x1b[90m[x.py:1]\x1b[0m hello\n"
    )
    (line,), _ = split_lines(b"", raw)
    assert line == "(VllmWorker rank=0 pid=4001) INFO 03-25 21:10:00 [x.py:1] hello"
    pre = split_prefix(line)
    assert (pre.worker, pre.level, pre.source, pre.message) == ("rank=0", "INFO", "x.py:1", "hello")


def test_multibyte_char_split_across_chunks_is_not_replaced() -> None:
    text = "bar █▊ ok\n".encode()
    for cut in range(len(text) + 1):
        lines1, partial = split_lines(b"", text[:cut])
        lines2, partial = split_lines(partial, text[cut:])
        assert lines1 + lines2 == ["bar █▊ ok"], cut


def test_live_segment_shows_the_latest_redraw_with_its_prefix() -> None:
    data = (FIXTURES / "vllm016_loading_live.log").read_bytes()
    _lines, partial = split_lines(b"", data)
    live = live_segment(partial)
    assert live.startswith("(Worker_TP0 pid=7000) Loading safetensors checkpoint shards:  39%")
    assert parse_shard_progress(live).done == 25  # type: ignore[union-attr]
    # an incomplete UTF-8 character at the end is left out, not shown as U+FFFD
    assert live_segment(b"\rx: 1%\rx: 2% \xe2\x96") == "x: 2% "
    assert live_segment(b"") == ""


def test_runaway_line_is_emitted_at_the_cap() -> None:
    lines, partial = split_lines(b"", b"x" * (MAX_PARTIAL + 1))
    assert len(lines) == 1 and partial == b""


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=400), st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_split_lines_is_chunking_invariant(data: bytes, cuts: list[int]) -> None:
    whole, rest = split_lines(b"", data)
    whole += finish_lines(rest)
    points = sorted({min(c, len(data)) for c in cuts})
    got: list[str] = []
    partial = b""
    prev = 0
    for p in points + [len(data)]:
        lines, partial = split_lines(partial, data[prev:p])
        got += lines
        prev = p
    got += finish_lines(partial)
    assert got == whole


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300))
def test_parsers_never_raise_on_bytes(data: bytes) -> None:
    lines, partial = split_lines(b"", data)
    live_segment(partial)
    a = LogAnalysis()
    for i, line in enumerate(lines + finish_lines(partial), 1):
        a = step(a, line, i, float(i))
    is_stalled(a, 1e9)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=120), max_size=20))
def test_step_never_raises_on_text(lines: list[str]) -> None:
    prefixes = ["", "(Worker_TP0 pid=1) ", "ERROR 11-29 12:00:01 [x.py:1] ", "Traceback (most recent call last):"]
    a = LogAnalysis()
    for i, line in enumerate(lines, 1):
        a = step(a, prefixes[i % 4] + line, i, float(i))
    assert a.phase in ("starting", "loading", "loaded", "extracting", "finished", "failed")


def test_linear_time_on_a_huge_line_and_many_short_lines() -> None:
    one_mb = b"Loading x: 5% " * 75_000 + b"\r" + b"y" * 100 + b"\n"
    start = time.perf_counter()
    partial = b""
    lines: list[str] = []
    for i in range(0, len(one_mb), 65536):
        got, partial = split_lines(partial, one_mb[i : i + 65536])
        lines += got
    a = LogAnalysis()
    for line in lines:
        a = step(a, line, 1)
    assert time.perf_counter() - start < 5.0

    short = b"".join(b"INFO 11-29 12:00:01 [x.py:1] line %d\n" % i for i in range(100_000))
    start = time.perf_counter()
    partial, a, n = b"", LogAnalysis(), 0
    for i in range(0, len(short), 262144):
        got, partial = split_lines(partial, short[i : i + 262144])
        for line in got:
            n += 1
            a = step(a, line, n)
    assert n == 100_000
    assert time.perf_counter() - start < 5.0


# --- prefixes and progress -----------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "worker", "level", "source", "message"),
    [
        ("(VllmWorker rank=1 pid=7) INFO 11-29 12:00:01 [loader.py:123] hi", "rank=1", "INFO", "loader.py:123", "hi"),
        ("(VllmWorker TP3 pid=7) INFO 11-29 12:00:01 loader.py:123] hi", "TP3", "INFO", "loader.py:123", "hi"),
        ("(Worker_TP0 pid=7) ERROR 11-29 12:00:01 [m.py:863]   File \"x\"", "TP0", "ERROR", "m.py:863", '  File "x"'),
        ("(Worker_DP0_TP0_EP0 pid=7) hi", "DP0_TP0_EP0", None, None, "hi"),
        ("(VllmWorkerProcess pid=77) WARNING 01-02 03:04:05 [a/b.py:9] w", "pid=77", "WARNING", "a/b.py:9", "w"),
        ("(EngineCore_DP0 pid=7) DEBUG 11-29 12:00:01 [v1/engine/core.py:1] d", "EngineCore_DP0", "DEBUG",
         "v1/engine/core.py:1", "d"),
        ("INFO 11-29 12:00:01 loader.py:123] plain", None, "INFO", "loader.py:123", "plain"),
        ("just text (not a prefix pid=1)", None, None, None, "just text (not a prefix pid=1)"),
    ],
)
def test_split_prefix_forms(line: str, worker: str | None, level: str | None, source: str | None, message: str) -> None:
    pre = split_prefix(line)
    assert (pre.worker, pre.level, pre.source, pre.message) == (worker, level, source, message)


@pytest.mark.parametrize(
    ("line", "desc", "done", "total", "elapsed", "remaining", "rate", "worker"),
    [
        ("Loading safetensors checkpoint shards:  37% Completed | 24/64 [07:12<12:01, 18.0s/it]",
         "Loading safetensors checkpoint shards", 24, 64, 432.0, 721.0, 1 / 18.0, None),
        ("(Worker_TP0 pid=1) Loading safetensors checkpoint shards (eager):   0% Completed | 0/64 [00:00<?, ?it/s]",
         "Loading safetensors checkpoint shards (eager)", 0, 64, 0.0, None, None, "TP0"),
        ("(VllmWorker TP3 pid=2) Loading np_cache checkpoint shards: 100% Completed | 4/4 [1:02:03<00:00,  2.27it/s]",
         "Loading np_cache checkpoint shards", 4, 4, 3723.0, 0.0, 2.27, "TP3"),
        ("Loading pt checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.52it/s]",
         "Loading pt checkpoint shards", 1, 2, 1.0, 1.0, 1.52, None),
        ("(VllmWorker rank=1 pid=3) Multi-thread loading shards:  25% Completed | 1/4 [00:28<01:25, 28.49s/it]",
         "Multi-thread loading shards", 1, 4, 28.0, 85.0, 1 / 28.49, "rank=1"),
        ("Multi-thread loading pt checkpoint shards:  25% Completed | 1/4 [00:28<01:25, 28.49s/it]",
         "Multi-thread loading pt checkpoint shards", 1, 4, 28.0, 85.0, 1 / 28.49, None),
        ("(VllmWorkerProcess pid=5) Loading safetensors using Runai Model Streamer:  10% Completed"
         " | 100/1000 [00:10<01:30, 10.00it/s]",
         "Loading safetensors using Runai Model Streamer", 100, 1000, 10.0, 90.0, 10.0, "pid=5"),
        ("(EngineCore_DP0 pid=6) Loading safetensors using Fastsafetensor loader:  50% Completed"
         " | 2/4 [00:04<00:04,  2.00s/it]",
         "Loading safetensors using Fastsafetensor loader", 2, 4, 4.0, 4.0, 0.5, "EngineCore_DP0"),
        ("Loading checkpoint shards:  38%|███▊      | 24/64 [00:07<00:12,  3.21it/s]",
         "Loading checkpoint shards", 24, 64, 7.0, 12.0, 3.21, None),
        ("(Worker_TP0 pid=1) Loading checkpoint shards: 100%|██████████| 2/2 [00:00<00:00,  1.2kit/s]",
         "Loading checkpoint shards", 2, 2, 0.0, 0.0, 1200.0, "TP0"),
    ],
)
def test_parse_shard_progress(line: str, desc: str, done: int, total: int, elapsed: float,
                              remaining: float | None, rate: float | None, worker: str | None) -> None:
    sp = parse_shard_progress(line)
    assert sp is not None
    assert (sp.desc, sp.done, sp.total, sp.elapsed_s, sp.remaining_s, sp.worker) == (
        desc, done, total, elapsed, remaining, worker)
    assert sp.percent == pytest.approx(100 * done / total)
    assert sp.rate_it_s == (pytest.approx(rate) if rate is not None else None)


@pytest.mark.parametrize(
    "line",
    [
        "Processed prompts:  50%|█████     | 2/4 [00:01<00:01,  1.5it/s]",  # not a shard bar
        "Capturing CUDA graphs:  10%|█         | 5/50 [00:01<00:09,  5.0it/s]",
        "Loading safetensors checkpoint shards: 37% done",
        "GPU memory 37% used",
    ],
)
def test_other_lines_are_not_shard_progress(line: str) -> None:
    assert parse_shard_progress(line) is None


def test_parse_extract_progress_forms() -> None:
    p = parse_extract_progress(
        "[extract] batch 3/16 | seqs 24/128 | tokens 6144/32768 | 1520.3 tok/s | elapsed 0:00:04 | eta 0:00:17")
    assert p is not None
    assert (p.batch, p.batches, p.seqs, p.seqs_total, p.tokens, p.tokens_total) == (3, 16, 24, 128, 6144, 32768)
    assert (p.tok_s, p.elapsed_s, p.eta_s, p.done) == (1520.3, 4.0, 17.0, False)
    s = parse_extract_progress("[extract] batch 3/16 skipped (already done)")
    assert s is not None and (s.batch, s.batches, s.skipped, s.seqs) == (3, 16, True, None)
    d = parse_extract_progress(
        "[extract] done: 128 sequences, 32768 tokens in 0:00:21 (1560.2 tok/s) -> /path/index.json")
    assert d is not None
    assert (d.done, d.seqs, d.tokens, d.elapsed_s, d.tok_s, d.output) == (
        True, 128, 32768, 21.0, 1560.2, "/path/index.json")
    assert parse_extract_progress("[extract] something else") is None
    assert parse_extract_progress("no marker") is None


# --- the fold -------------------------------------------------------------------------


def test_users_failure_sequence_root_cause_is_the_workers_state_error() -> None:
    a = fold((FIXTURES / "vllm016_tp8_sample_tokens.log").read_bytes())
    assert a.phase == "failed"
    assert a.root_cause is not None
    assert (a.root_cause.id, a.root_cause.worker) == ("sample-tokens-state", "TP0")
    assert "State error" in a.root_cause.line
    assert a.root_cause.fix == {"patch": "speculators-0.3.0-vllm-0.16", "version": "v5"}
    workers = {f.worker for f in a.failures if f.id == "sample-tokens-state"}
    assert workers == {f"TP{r}" for r in range(8)} | {None}  # every rank, and the parent
    assert a.loaded_at_line is not None and a.root_cause.line_no > a.loaded_at_line
    assert a.shard is not None and (a.shard.done, a.shard.total, a.shard.worker) == (64, 64, "TP0")
    labels = [label for _, label in a.milestones]
    assert "Asynchronous scheduling enabled" in labels
    assert "Model loaded: 67.43 GiB in 1226.1 s" in labels
    assert not any(f.id == "python-traceback" for f in a.failures)


@pytest.mark.parametrize(
    ("name", "root_id", "phase"),
    [
        ("vllm016_block_hasher.log", "block-hasher-assert", "failed"),
        ("vllm016_tensor_bool.log", "tensor-bool-ambiguous", "failed"),
        ("vllm016_encoder_decoder.log", "scheduler-config-encoder-decoder", "failed"),
        ("vllm082_old_prefixes.log", "worker-died", "failed"),
        ("vllm_prefix_zoo.log", "cuda-oom", "failed"),
        ("transformers_extract_ok.log", None, "finished"),
        ("vllm016_loading_live.log", None, "loading"),
    ],
)
def test_fixture_root_causes(name: str, root_id: str | None, phase: str) -> None:
    a = fold((FIXTURES / name).read_bytes())
    assert a.phase == phase
    assert (a.root_cause.id if a.root_cause else None) == root_id


def test_wrappers_never_win_over_the_error_they_repeat() -> None:
    a = fold((FIXTURES / "vllm_prefix_zoo.log").read_bytes())
    ids = [f.id for f in a.failures]
    assert ids.index("workerproc-failed-start") < ids.index("cuda-oom")  # wrapper came first
    assert a.root_cause is not None and a.root_cause.worker == "DP0_TP0_EP0"
    assert a.root_cause.id == "cuda-oom"


def test_generic_traceback_only_when_nothing_specific_matched() -> None:
    log = (
        b"Traceback (most recent call last):\n"
        b'  File "x.py", line 1, in <module>\n'
        b"KeyError: 'layer_ids'\n"
        b"some later output\n"
    )
    a = fold(log)
    assert a.root_cause is not None
    assert (a.root_cause.id, a.root_cause.line, a.root_cause.line_no) == (
        "python-traceback", "KeyError: 'layer_ids'", 3)
    # an unrelated interleaved line inside a worker traceback does not end it
    log2 = (
        b"(Worker_TP1 pid=2) ERROR 11-29 12:00:01 [m.py:1] Traceback (most recent call last):\r\n"
        b"(Worker_TP1 pid=2) ERROR 11-29 12:00:01 [m.py:1]   File \"w.py\", line 3, in f\r\n"
        b"foreign progress output here\n"
        b"(Worker_TP1 pid=2) ERROR 11-29 12:00:01 [m.py:1] ValueError: bad shape\n"
    )
    a2 = fold(log2)
    assert a2.root_cause is not None
    assert (a2.root_cause.id, a2.root_cause.worker, a2.root_cause.line_no) == ("python-traceback", "TP1", 4)


def test_quiet_levels_are_not_failures_and_quiet_lines_return_the_same_object() -> None:
    a = LogAnalysis()
    b = step(a, "WARNING 11-29 12:00:01 [x.py:1] CUDA out of memory, retrying smaller", 1)
    c = step(b, "just some output", 2)
    assert b is a and c is a
    d = step(c, "ERROR 11-29 12:00:01 [x.py:1] torch.OutOfMemoryError: CUDA out of memory.", 3)
    assert d.root_cause is not None and d.root_cause.id == "cuda-oom"


def test_failures_are_bounded_and_deduplicated() -> None:
    a = LogAnalysis()
    for i in range(1, 5000):
        a = step(a, f"(Worker_TP{i % 300} pid={i}) ERROR 11-29 12:00:01 [x.py:1] NCCL error: unhandled", i)
    assert len(a.failures) <= 200
    assert len({(f.id, f.worker) for f in a.failures}) == len(a.failures)


def test_is_stalled_uses_the_median_shard_interval() -> None:
    bar = "(Worker_TP0 pid=1) Loading safetensors checkpoint shards:  {p}% Completed | {n}/64 [00:00<?, 20.00s/it]"
    a = LogAnalysis()
    for n in range(6):
        a = step(a, bar.format(p=n, n=n), n + 1, 1000.0 + 20.0 * n)  # one shard every 20 s
    assert a.phase == "loading" and a.last_progress_t == 1100.0
    assert not is_stalled(a, now=1100.0 + 59.0)  # the 60 s floor
    assert not is_stalled(a, now=1100.0 + 59.0, min_s=0)  # < 3 × 20 s
    assert is_stalled(a, now=1100.0 + 61.0, min_s=0)
    assert is_stalled(a, now=1100.0 + 61.0)
    done = step(a, "INFO 11-29 12:00:01 [default_loader.py:294] Loading weights took 120.00 seconds", 9, 1200.0)
    assert done.phase == "loaded" and not is_stalled(done, now=1e9)


# --- signatures -----------------------------------------------------------------------

REQUIRED_IDS = {
    "sample-tokens-state", "tensor-bool-ambiguous", "block-hasher-assert",
    "scheduler-config-encoder-decoder", "kv-cache-specs-typeerror", "scheduler-block-size",
    "get-input-embeddings", "cuda-oom", "nccl-error", "nccl-timeout", "workerproc-failed-start",
    "workerproc-hit-exception", "engine-core-failed", "rpc-timeout", "worker-died",
    "executor-failed", "worker-failed-wrapper", "no-space", "module-not-found", "python-traceback",
}


@pytest.mark.parametrize(
    ("line", "sig_id"),
    [
        ("TypeError: get_kv_cache_config_from_groups() got an unexpected keyword argument 'kv_cache_specs'",
         "kv-cache-specs-typeerror"),
        ("TypeError: Scheduler.__init__() missing 1 required positional argument: 'block_size'",
         "scheduler-block-size"),
        ("AttributeError: 'DeepseekV3Model' object has no attribute 'get_input_embeddings'", "get-input-embeddings"),
        ("[rank3]:[E1129 12:00:01.000 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation timeout:"
         " WorkNCCL(SeqNum=5)", "nccl-timeout"),
        ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275",
         "nccl-error"),
        ("TimeoutError: RPC call to execute_model timed out.", "rpc-timeout"),
        ("ERROR 11-29 12:00:01 [core.py:1006] EngineCore failed to start.", "engine-core-failed"),
        ("OSError: [Errno 28] No space left on device", "no-space"),
        ("ModuleNotFoundError: No module named 'speculators'", "module-not-found"),
        ("RuntimeError: Worker failed with error 'boom', please check the stack trace above for the root cause",
         "worker-failed-wrapper"),
        ("[preflight] FAIL sample_tokens: MultiprocExecutor has no sample_tokens", "preflight-failed"),
        ("[extract] error: --model is required (see --help)", "extract-error"),
    ],
)
def test_builtin_signatures_match(line: str, sig_id: str) -> None:
    a = step(LogAnalysis(), line, 1)
    assert [f.id for f in a.failures] == [sig_id]


def test_builtin_signatures_have_required_ids_and_title_templates() -> None:
    sigs = load_signatures(user_file=None)
    assert REQUIRED_IDS <= {s.id for s in sigs}
    a = step(LogAnalysis(), "ERROR 11-29 12:00:01 [m.py:248] Worker proc VllmWorker-3 died unexpectedly,"
             " shutting down executor.", 1)
    assert a.failures[0].title == "Worker VllmWorker-3 died unexpectedly"


def test_user_file_overrides_and_extends(tmp_path: Path) -> None:
    user = tmp_path / "signatures.toml"
    user.write_text(
        '[[signature]]\nid = "cuda-oom"\ntitle = "Out of GPU memory (site rule)"\n\n'
        '[[signature]]\nid = "site-quota"\npatterns = ["Disk quota exceeded"]\ntitle = "Quota"\n'
        'fix = { action = "kill" }\n'
    )
    sigs = load_signatures(user_file=user)
    by_id = {s.id: s for s in sigs}
    assert by_id["cuda-oom"].title == "Out of GPU memory (site rule)"
    assert by_id["cuda-oom"].patterns  # untouched fields kept
    assert sigs[0].id == "site-quota"  # new ids are tried first
    a = fold(b"OSError: Disk quota exceeded\n", SignatureSet.build(sigs))
    assert a.root_cause is not None and a.root_cause.fix == {"action": "kill"}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[[signature]]\nid = "x"\npatterns = ["("]\ntitle = "t"\n', "key 'patterns': bad regex"),
        ('[[signature]]\nid = "x"\npatterns = ["a"]\ntitle = "t"\ncolour = 1\n', "key 'colour': unknown"),
        ('[[signature]]\nid = "x"\npatterns = "a"\ntitle = "t"\n', "key 'patterns': must be a list"),
        ('[[signature]]\nid = "x"\npatterns = ["a"]\n', "key 'title': required"),
        ('[[signature]]\nid = "x"\npatterns = ["a"]\ntitle = "t"\nwrapper = "yes"\n', "key 'wrapper'"),
        ('[[signature]]\nid = "x"\npatterns = ["a"]\ntitle = "t"\nfix = 3\n', "key 'fix'"),
        ('[[signature]]\npatterns = ["a"]\n', "key 'id'"),
        ("[[signature]\n", "not valid TOML"),
        ('[other]\nx = 1\n', "key 'other'"),
    ],
)
def test_malformed_user_file_gives_one_line_naming_file_and_key(tmp_path: Path, text: str, needle: str) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(SignatureError) as exc:
        load_signatures([bad], user_file=None)
    msg = str(exc.value)
    assert "\n" not in msg and str(bad) in msg and needle in msg
    errors: list[str] = []
    sigs = load_signatures([bad], user_file=None, errors=errors)
    assert errors == [msg] and REQUIRED_IDS <= {s.id for s in sigs}
