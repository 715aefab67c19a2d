"""Tests for the post-mortem: ``inspect_log`` (streamed) and ``format_report``."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import checkout
from tui.services.inspect import format_report, inspect_log

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
KEYS = {"train", "phase", "shards", "extract", "failures", "root_cause", "timeline", "lines", "loaded_at_line",
        "stage", "failed_in", "failed_stage", "failed_after_s", "summary", "loads", "diverged"}


def chunks(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.log")))
def test_every_fixture_gives_the_same_json_whole_or_chunked(name: str) -> None:
    data = (FIXTURES / name).read_bytes()
    whole = inspect_log(data)
    assert set(whole) == KEYS
    assert whole["lines"] == data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    for size in (1, 7, 4096):
        assert inspect_log(chunks(data, size)) == whole
    json.dumps(whole)  # JSON-ready
    for f in whole["failures"]:
        assert {"id", "title", "explanation", "fix", "line_no", "line"} <= set(f)
        raw = data.split(b"\n")[f["line_no"] - 1].decode(errors="replace").rstrip("\r")
        assert raw.endswith(f["line"][-20:])  # line_no is 1-based and points at the line


def test_sample_tokens_post_mortem() -> None:
    r = inspect_log((FIXTURES / "vllm016_tp8_sample_tokens.log").read_bytes())
    assert r["phase"] == "failed"
    assert r["shards"] == {
        "desc": "Loading safetensors checkpoint shards", "done": 64, "total": 64, "percent": 100.0,
        "rate_it_s": pytest.approx(1 / 18.98, rel=1e-3), "eta_s": 0.0, "elapsed_s": 1215.0, "worker": "TP0",
    }
    assert r["extract"] is None
    rc = r["root_cause"]
    assert rc["id"] == "sample-tokens-state" and rc["worker"] == "TP0"
    assert rc["line"].startswith("(Worker_TP0 pid=257800) ERROR ")
    assert rc["line_no"] > r["loaded_at_line"]
    assert r["failures"][0]["id"] == "workerproc-hit-exception"  # the wrapper came first but lost
    timeline = [m["label"] for m in r["timeline"]]
    assert timeline[0] == "Resolved architecture DeepseekV3ForCausalLM"
    assert "All 64 shards loaded" in timeline
    text = format_report(r)
    assert f"root cause (line {rc['line_no']} [TP0])" in text
    assert "push patch speculators-0.3.0-vllm-0.16 v5" in text


def test_finished_extraction() -> None:
    r = inspect_log((FIXTURES / "transformers_extract_ok.log").read_bytes())
    assert r["phase"] == "finished" and r["root_cause"] is None and r["failures"] == []
    assert r["extract"] == {
        "batch": 3, "batches": 3, "seqs": 24, "seqs_total": 24, "tokens": 6144, "tokens_total": 6144,
        "tok_s": 1560.2, "elapsed_s": 4.0, "eta_s": 0.0, "done": True, "output": "/tmp/out/index.json",
    }
    assert r["shards"]["done"] == 2 and r["shards"]["worker"] is None
    assert "extract: done" in format_report(r)


def test_loading_log_reports_the_unterminated_bar_as_the_last_line() -> None:
    r = inspect_log((FIXTURES / "vllm016_loading_live.log").read_bytes())
    assert r["phase"] == "loading"
    assert (r["shards"]["done"], r["shards"]["elapsed_s"], r["shards"]["eta_s"]) == (25, 3890.0, 6066.0)


def test_streams_in_constant_memory() -> None:
    unit = (FIXTURES / "vllm016_tp8_sample_tokens.log").read_bytes()
    repeats = 120  # about 4 MB in all

    def gen() -> Iterator[bytes]:
        for _ in range(repeats):
            yield from chunks(unit, 65536)

    tracemalloc.start()
    try:
        r = inspect_log(gen())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r["lines"] == unit.count(b"\n") * repeats
    assert peak < 1_500_000, peak  # far below the 4 MB that streamed through
    assert len(r["failures"]) <= 200


def test_cli_inspect_json_on_a_real_file() -> None:
    path = FIXTURES / "vllm016_block_hasher.log"
    proc = subprocess.run(
        [sys.executable, "-c", "from tui.cli import main; main()", "inspect", str(path), "--json"],
        check=False, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parent.parent, env=checkout.env(),
    )
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["root_cause"]["id"] == "block-hasher-assert" and r["phase"] == "failed"
