"""The run ledger (tui/services/ledger.py) against the real agent: real runs, real log files."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tui.protocol.records import RunRecord
from tui.services.config import load_config
from tui.services.hostfeed import FIRST_TAIL, HostFeed
from tui.services.ledger import READ_CHUNK, LedgerError, fetch_summaries, read_tail
from tui.state.events import LogOlder
from tui.transport import AgentApi, AgentClient, AgentRequestError

FIXTURE = Path(__file__).parent / "fixtures" / "logs" / "vllm016_tp8_sample_tokens.log"
PATCH = {"set": "speculators-0.3.0-vllm-0.16", "state": "v4", "version": "v4"}
# the run prints a file to stdout (its output.log) and exits with a code
PRINT_AND_EXIT = "import sys; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read()); sys.exit(int(sys.argv[2]))"


async def run_to_end(client: AgentClient, tmp_path: Path, name: str, log_source: Path,
                     code: int = 1, timeout: float = 20) -> dict[str, Any]:
    """Launch a real run that prints log_source and exits; its record once it has ended."""
    rec = await client.request("launch", name=name, argv=[sys.executable, "-c", PRINT_AND_EXIT,
                                                          str(log_source), str(code)],
                               cwd=str(tmp_path), env={}, patch_state=PATCH, log=None)
    deadline = time.monotonic() + timeout
    while True:
        runs = (await client.request("runs"))["runs"]
        mine = next(r for r in runs if r["run_id"] == rec["run_id"])
        if mine["state"] != "running":
            return mine
        assert time.monotonic() < deadline, f"run {name} never ended: {mine}"
        await asyncio.sleep(0.1)


async def test_failed_run_is_summarized_from_its_log(client: AgentClient, tmp_path: Path) -> None:
    rec = await run_to_end(client, tmp_path, "extract_test3", FIXTURE)
    assert rec["state"] == "exited" and rec["exit_code"] == 1
    assert Path(rec["log"]).read_bytes() == FIXTURE.read_bytes()
    got = await fetch_summaries(client, [RunRecord.parse(rec)], cache={})
    s = got[rec["run_id"]]
    assert (s.outcome, s.failure_id, s.failed_after_load) == ("failed", "sample-tokens-state", True)
    assert s.patch_state == "v4" and s.patch_set == PATCH["set"]
    assert s.fail_seconds == pytest.approx(rec["ended_at"] - rec["launched_at"])
    assert s.load_seconds == 1226.1


async def test_tail_read_cuts_at_a_line_and_spans_several_requests(client: AgentClient,
                                                                   tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    filler = b"".join(b"INFO 11-29 11:00:00 [x.py:1] warming up %07d\n" % i for i in range(150_000))
    big.write_bytes(filler + FIXTURE.read_bytes())
    size = big.stat().st_size
    assert size > 5 * 1024 * 1024  # several read_range requests (2 MiB each)
    data, whole = await read_tail(client, str(big), 5 * 1024 * 1024)
    assert not whole
    assert big.read_bytes().endswith(data) and size - len(data) > 0
    assert big.read_bytes()[size - len(data) - 1:size - len(data)] == b"\n"  # starts on a line
    assert len(data) > 5 * 1024 * 1024 - 200  # only the cut line was dropped
    data, whole = await read_tail(client, str(big), size)
    assert whole and data == big.read_bytes()


async def test_only_the_tail_of_a_long_log_is_needed(client: AgentClient, tmp_path: Path) -> None:
    rec = await run_to_end(client, tmp_path, "tail", FIXTURE)
    got = await fetch_summaries(client, [RunRecord.parse(rec)], tail_bytes=4096, cache={})
    s = got[rec["run_id"]]
    # the load milestones are out of reach, the failure and its after-load nature are not
    assert (s.failure_id, s.failed_after_load, s.load_seconds) == ("sample-tokens-state", True, None)


async def test_gone_logs_are_skipped_running_runs_ignored_ended_runs_cached(
        client: AgentClient, tmp_path: Path) -> None:
    ok = tmp_path / "ok.log"
    ok.write_bytes(b"INFO 11-29 12:00:01 [model.py:547] Resolved architecture: DeepseekV3ForCausalLM\n")
    first = await run_to_end(client, tmp_path, "first", FIXTURE)
    second = await run_to_end(client, tmp_path, "second", ok, code=0)
    gone = await run_to_end(client, tmp_path, "gone", FIXTURE)
    Path(gone["log"]).unlink()
    with pytest.raises(AgentRequestError, match="does not exist"):
        await client.request("read_range", path=gone["log"], offset=0, length=0)
    running = {**first, "run_id": "20990101-000000-beef", "state": "running", "ended_at": None}
    cache: dict[Any, Any] = {}
    every = [RunRecord.parse(r) for r in (first, second, gone, running)]
    got = await fetch_summaries(client, every, cache=cache)
    assert set(got) == {first["run_id"], second["run_id"]}
    assert got[second["run_id"]].outcome == "finished"
    # an ended run never changes: with its log gone now, the cached summary still answers
    Path(first["log"]).unlink()
    again = await fetch_summaries(client, every, cache=cache)
    assert again == got
    assert await fetch_summaries(client, every[:1], cache={}) == {}
    # limit keeps the newest runs
    newest = await fetch_summaries(client, every[:2], limit=1, cache=cache)
    assert list(newest) == [second["run_id"]]


class ReplacedMidRead(AgentApi):
    """The real client; right after the first read_range that returns bytes, the file at
    ``path`` is replaced by ``other`` (os.replace, as a log rotation or a relaunch that
    reuses the path does): the reader's next chunk comes from another file."""

    def __init__(self, client: AgentClient, path: Path, other: Path) -> None:
        self.client, self.path, self.other, self.done = client, path, other, False

    async def request(self, op: str, **args: Any) -> dict[str, Any]:
        r = await self.client.request(op, **args)
        if op == "read_range" and args.get("length") and not self.done:
            self.done = True
            os.replace(self.other, self.path)
        return r


def _two_logs(tmp_path: Path) -> tuple[Path, Path]:
    """A log of three read chunks and a same-size other file to replace it with."""
    log, other = tmp_path / "run.log", tmp_path / "other.log"
    log.write_bytes(b"".join(b"first file line %07d\n" % i for i in range(220_000)))
    other.write_bytes(b"".join(b"other file line %07d\n" % i for i in range(220_000)))
    assert log.stat().st_size > 2 * READ_CHUNK
    return log, other


async def test_a_log_replaced_while_the_ledger_reads_it_is_refused(client: AgentClient,
                                                                     tmp_path: Path) -> None:
    log, other = _two_logs(tmp_path)
    with pytest.raises(LedgerError, match="was replaced while being read"):
        await read_tail(ReplacedMidRead(client, log, other), str(log), log.stat().st_size)  # type: ignore[arg-type]


async def test_a_log_replaced_while_the_older_log_reader_reads_it_gives_nothing(
        client: AgentClient, tmp_path: Path) -> None:
    """The dashboard's reader of the bytes before the first tail: a file replaced under it
    yields none of them (never half of one file and half of another)."""
    log, other = _two_logs(tmp_path)
    cfg = tmp_path / "eagle3.toml"
    cfg.write_text(f'[host]\nruns_dir = "{tmp_path / "runs"}"\n')
    size, inode = log.stat().st_size, log.stat().st_ino
    feed = HostFeed(ReplacedMidRead(client, log, other), load_config(cfg), "local",  # type: ignore[arg-type]
                    tail_bytes=size + FIRST_TAIL)
    seen: list[Any] = []
    feed.apply = seen.append  # type: ignore[method-assign]
    await feed._read_older("s", str(log), inode, size)
    assert [(e.sub, e.data) for e in seen if isinstance(e, LogOlder)] == [("s", b"")]
    # the same read with nothing replaced (the log now holds the other bytes) gives them all
    seen.clear()
    feed.client = client
    await feed._read_older("s", str(log), log.stat().st_ino, size)
    assert [e.data for e in seen if isinstance(e, LogOlder)] == [log.read_bytes()]
