"""Restarts decided on the host (remote/run/restartpolicy.py, remote/run/restart.py): the policy
compiled from eagle3.toml and the one signature table, the host's matcher against the client's, and real runs
launched through the real shim with no client connected until they end."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from remote.run import kill as killer
from remote.run import launch as launcher
from remote.run import rundir
from remote.run.restartpolicy import Matcher, decide, delay
from tests import need
from tui.services.config import parse_config
from tui.services.restartpolicy import compile_policy
from tui.state.loganalysis.fold import step
from tui.state.loganalysis.record import LogAnalysis
from tui.state.loganalysis.signatures import RESTART_CLASSES, load_signatures

REPO = Path(__file__).resolve().parent.parent
JOB = str(REPO / "tests" / "jobs" / "resumable_job.py")
FIXTURES = sorted(str(p) for p in (REPO / "tests/fixtures").rglob("*.log"))  # every real and shaped log
# Real lines for the signatures no fixture log holds (shapes from the issue threads the
# corpus README lists, and from test_logparse).
LINES = [
    "TypeError: Scheduler.__init__() missing 1 required positional argument: 'block_size'",
    "(Worker_TP0 pid=12) ERROR 11-29 12:00:01 [multiproc_executor.py:671] RuntimeError: Worker failed with error"
    " 'boom', please check the stack trace above for the root cause",
    "slurmstepd: error: *** JOB 4242 ON node3 CANCELLED AT 2026-12-01T03:12:44 DUE TO PREEMPTION ***",
    "ModuleNotFoundError: No module named 'speculators'",
    "RuntimeError: CUDA error: uncorrectable ECC error encountered",
    "[preflight] FAIL sample_tokens: MultiprocExecutor has no sample_tokens",
    "TypeError: get_kv_cache_config_from_groups() got an unexpected keyword argument 'kv_cache_specs'",
    "OSError: [Errno 28] No space left on device",
    "[extract] error: --model is required (see --help)",
    "AttributeError: 'DeepseekV3Model' object has no attribute 'get_input_embeddings'",
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275",
    "(VllmWorker rank=0 pid=81) ERROR 06-01 10:00:00 [multiproc_executor.py:470] WorkerProc failed to start.",
    "TimeoutError: RPC call to execute_model timed out.",
    "ERROR 07-01 10:00:00 [multiproc_executor.py:140] Worker proc VllmWorker-1 died unexpectedly,"
    " shutting down executor.",
]
POLICY = compile_policy(parse_config('[run]\nrestart = "on-failure"\n'))


def _fixture_lines() -> list[str]:
    out = list(LINES)
    for path in FIXTURES:
        out.extend(Path(path).read_text(errors="replace").splitlines())
    return out


def test_every_signature_has_a_restart_class() -> None:
    sigs = load_signatures(user_file=None)
    assert {s.id: s.restart for s in sigs if s.restart not in RESTART_CLASSES} == {}
    by_id = {s.id: s.restart for s in sigs}
    assert by_id["nccl-timeout"] == by_id["gpu-device-error"] == by_id["worker-died"] == "transient"
    assert by_id["module-not-found"] == by_id["cuda-oom"] == by_id["preflight-failed"] == "deterministic"
    assert by_id["python-traceback"] == "unclassified"


def test_host_matcher_agrees_with_the_client_on_every_fixture_line() -> None:
    """Each line alone, and each fixture log whole: the same root cause id both sides;
    and every signature of the table is named by at least one of these real lines or logs."""
    matcher = Matcher(POLICY)
    named, wrong = set(), []
    for line in _fixture_lines():
        client = step(LogAnalysis(), line, 1).root_cause
        host = matcher.root_cause([line])
        if (client and client.id) != (host and host["id"]):
            wrong.append((line[:120], client and client.id, host and host["id"]))
        if client:
            named.add(client.id)
    assert wrong == []
    for path in FIXTURES:  # whole logs: also what needs several lines (a NaN loss that persists)
        lines = Path(path).read_text(errors="replace").splitlines()
        a = LogAnalysis()
        for i, line in enumerate(lines, 1):
            a = step(a, line, i)
        host = matcher.root_cause(lines)
        assert (a.root_cause and a.root_cause.id) == (host and host["id"]), path
        if a.root_cause:
            named.add(a.root_cause.id)
    assert {s.id for s in load_signatures(user_file=None)} - named == set()


# ---------------------------------------------------------------- the classification, reviewed

# Real lines, each from the thread named beside it. Every one is a programming, build or
# launch error: it fails the same way on every attempt, so it is never restarted.
DETERMINISTIC = [
    ("cuda-unsupported", "https://github.com/vllm-project/vllm/issues/11485",
     "[rank0]: RuntimeError: CUDA error: no kernel image is available for execution on the device"),
    ("cuda-unsupported", "https://github.com/vllm-project/vllm/issues/14452",
     "ERROR 07-28 15:07:22 [core.py:632] RuntimeError: CUDA error: no kernel image is available"
     " for execution on the device"),
    ("cuda-unsupported", "https://github.com/billwuhao/ComfyUI_ACE-Step/issues/10",
     "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasGemmStridedBatchedEx(handle, opa, "
     "opb, (int)m, (int)n, (int)k, (void*)&falpha, a, CUDA_R_16BF, (int)lda, stridea, b, CUDA_R_16BF, (int)ldb, "
     "strideb, (void*)&fbeta, c, CUDA_R_16BF, (int)ldc, stridec, (int)num_batches, compute_type, "
     "CUBLAS_GEMM_DEFAULT_TENSOR_OP)`"),
    ("cuda-kernel-fault", "https://github.com/vllm-project/vllm/issues/11931",
     "ERROR 01-10 21:49:05 engine.py:366] Error in model execution: CUDA error: device-side assert triggered"),
    ("cuda-kernel-fault", "https://github.com/vllm-project/vllm/issues/24815",
     "(VllmWorker TP1 pid=409) ERROR 09-14 03:15:31 [multiproc_executor.py:596] RuntimeError: CUDA error: an "
     "illegal memory access was encountered"),
    ("cuda-kernel-fault", "https://github.com/vllm-project/vllm/issues/8177",
     "[rank0]:[E219 12:14:43.351647859 ProcessGroupNCCL.cpp:1595] [PG ID 2 PG GUID 3 Rank 0] Process group "
     "watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered"),
    ("cuda-invalid-device", "https://github.com/hpcaitech/Open-Sora/issues/40",
     "RuntimeError: CUDA error: invalid device ordinal"),
    ("nccl-invalid-usage", "https://github.com/csguoh/MambaIR/issues/39",
     "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1333, "
     "invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.18.6"),
    ("nccl-invalid-usage", "https://github.com/vllm-project/vllm/issues/7201",
     "RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)"),
    ("nccl-invalid-usage", "https://github.com/horovod/horovod/issues/3929",
     "[1,2]<stdout>:smc-gpu-03:29880:30398 [0] init.cc:497 NCCL WARN Duplicate GPU detected : rank 2 and rank 0 "
     "both on CUDA device 1000"),
]
# and the ones a fresh start gets past: restarted
TRANSIENT = [
    ("nccl-timeout", "https://github.com/hiyouga/LlamaFactory/issues/7396",
     "[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation "
     "timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) "
     "ran for 600060 milliseconds before timing out."),
    ("nccl-error", "https://github.com/pytorch/pytorch/issues/150916",
     "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely."),
    ("gpu-device-error", "tests/fixtures/logs/real_ecc_uncorrectable.log",
     "RuntimeError: CUDA error: uncorrectable ECC error encountered"),
]
# The sequence: an INFO line that says a step was retried after a watchdog
# timeout (Python logging's default "LEVEL:name:" shape, as torchelastic logs at
# https://github.com/shun-zheng/Doc2EDAG/issues/24; the watchdog's words from
# LlamaFactory 7396), then the real failure (https://github.com/carolchenyx/MGFN./issues/35).
RETRIED = ("INFO:torch.distributed.elastic.agent.server.api:[default] step 1580 retried after: [Rank 0] Watchdog "
           "caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, "
           "NumelOut=466119168, Timeout(ms)=600000) ran for 600060 milliseconds before timing out.")
OOM = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacty of "
       "6.00 GiB of which 0 bytes is free. Of the allocated memory 2.93 GiB is allocated by PyTorch, and 2.30 GiB is "
       "reserved by PyTorch but unallocated.")
WATCHDOG = TRANSIENT[0][2]


def _both(lines: list[str]) -> tuple[str | None, str | None]:
    """The root cause's id as the client's analysis and the host's matcher name it."""
    a = LogAnalysis()
    for i, line in enumerate(lines, 1):
        a = step(a, line, i)
    host = Matcher(POLICY).root_cause(lines)
    return (a.root_cause and a.root_cause.id), (host and host["id"])


@pytest.mark.parametrize("want,source,line", DETERMINISTIC + TRANSIENT,
                         ids=[f"{w}:{s.rsplit('/', 2)[-2]}" for w, s, _ in DETERMINISTIC + TRANSIENT])
def test_each_real_failure_is_classed_and_decided_alike_on_both_sides(want: str, source: str, line: str) -> None:
    assert _both([line]) == (want, want), source
    cause = Matcher(POLICY).root_cause([line])
    assert cause is not None
    restarted, why = decide(POLICY, [], {"exit_code": 1, "cause": cause, "ended_at": 0.0}, 0.0)
    if (want, source, line) in DETERMINISTIC:
        assert (restarted, why) == (False, f"not restarted: {cause['title']} ({want}) is deterministic")
    else:
        assert restarted and why == f"restarting: {cause['title']} ({want})"


def test_every_builtin_class_is_reviewed_with_its_reason() -> None:
    """Each built-in entry's `restart` line says why, in a comment (issue 35's review)."""
    import re

    text = (REPO / "tui" / "data" / "signatures.toml").read_text()
    lines = re.findall(r'^restart = .*$', text, re.M)
    assert len(lines) == len(load_signatures(user_file=None))
    assert [ln for ln in lines if not re.fullmatch(r'restart = "\w+"  # \S.{20,}', ln)] == []
    by_id = {s.id: s.restart for s in load_signatures(user_file=None)}
    assert by_id["cuda-error"] == "unclassified"  # the mixed rest: only after progress


def test_an_info_line_that_mentions_a_retry_never_outranks_the_real_failure() -> None:
    """An earlier INFO line saying a step was retried after a watchdog timeout made a
    later OutOfMemoryError an "NCCL timeout": restarted, a wasted load each time. The
    note is not a failure, in any quiet shape; the OOM is the root cause, deterministic."""
    for note in (RETRIED,
                 "2025-03-21 02:07:08,408 - INFO - trainer - retried after:"
                 " Watchdog caught collective operation timeout",
                 "WARNING:root:NCCL error in allreduce, retrying (1/3)",
                 "tj5-sc-ai-h800r-dev01:534:1763 [3] NCCL WARN NCCL error: unhandled system error, retrying"):
        assert _both([note, OOM]) == ("cuda-oom", "cuda-oom"), note
        assert _both([note]) == (None, None), note
    cause = Matcher(POLICY).root_cause([RETRIED, OOM])
    assert decide(POLICY, [], {"exit_code": 1, "cause": cause, "ended_at": 0.0}, 0.0) == (
        False, "not restarted: GPU out of memory (cuda-oom) is deterministic")
    # a failure that mentions a retry but stands at no quiet level is still a failure
    assert _both(["RuntimeError: NCCL error: unhandled system error after 3 retries"]) == ("nccl-error",) * 2
    assert _both(["ERROR 01-10 21:49:05 engine.py:366] retried twice: CUDA error: device-side assert "
                  "triggered"]) == ("cuda-kernel-fault",) * 2


def test_the_first_failure_of_the_best_rank_is_the_root_cause_not_the_last() -> None:
    """Two different failures of the same rank (both specific): the first is the cause,
    the later one its consequence (the ranks that waited on the one that died). Each
    order decides the other way, on both sides."""
    assert _both([OOM, WATCHDOG]) == ("cuda-oom", "cuda-oom")
    assert _both([WATCHDOG, OOM]) == ("nccl-timeout", "nccl-timeout")
    no_kernel = DETERMINISTIC[0][2]
    assert _both([no_kernel, WATCHDOG]) == ("cuda-unsupported", "cuda-unsupported")
    # a wrapper never outranks a specific failure, before or after it
    wrapper = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "
    assert _both([wrapper, OOM])[1] == _both([OOM, wrapper])[1] == "cuda-oom"


def test_the_host_matcher_is_stdlib_and_starts_afresh_at_an_attempt() -> None:
    matcher = Matcher(POLICY)
    lines = ["ModuleNotFoundError: No module named 'x'", "[eagle3-tui] attempt 2/4 starts",
             "[rank0]:[E1129 12:00:01.000 ProcessGroupNCCL.cpp:632] Watchdog caught collective operation timeout"]
    assert matcher.root_cause(lines)["id"] == "nccl-timeout"  # type: ignore[index]
    a = LogAnalysis()
    for i, line in enumerate(lines[:2], 1):
        a = step(a, line, i)
    assert a.root_cause is None  # the client's analysis starts afresh there too
    for name in ("restart.py", "restartpolicy.py"):
        src = (REPO / "remote" / "run" / name).read_text()
        assert "tui" not in {ln.split()[1].split(".")[0] for ln in src.splitlines()
                             if ln.startswith(("import ", "from "))}


def test_delay_doubles_up_to_the_cap() -> None:
    p = {"restart_delay": 30.0, "restart_delay_max": 100.0}
    assert [delay(p, n) for n in (1, 2, 3, 4)] == [30.0, 60.0, 100.0, 100.0]


def test_decide_rules() -> None:
    now = 1000.0
    nccl = {"id": "nccl-timeout", "title": "NCCL collective timed out", "class": "transient"}
    mod = {"id": "module-not-found", "title": "Import failed", "class": "deterministic"}
    other = {"id": "python-traceback", "title": "Python exception", "class": "unclassified"}

    def end(cause: dict | None, batch: int | None = None, **kw: object) -> dict:
        return {"exit_code": 1, "cause": cause, "progress": {"batch": batch}, "ended_at": now, **kw}

    assert decide(POLICY, [], end(nccl), now) == (True, "restarting: NCCL collective timed out (nccl-timeout)")
    assert decide(POLICY, [], end(mod), now)[1] == "not restarted: Import failed (module-not-found) is deterministic"
    assert decide(POLICY, [], end(other, None), now)[0] is False  # no progress at all
    assert decide(POLICY, [end(other, 5, restarted=True)], end(other, 9), now)[0] is True
    assert decide(POLICY, [end(other, 5, restarted=True)], end(other, 5), now)[0] is False
    assert decide(POLICY, [], end(nccl, killed=True), now) == (False, "killed")
    assert decide(POLICY, [], {"exit_code": 0, "cause": None}, now) == (False, "finished")
    three = [end(nccl, restarted=True, ended_at=now - 5000) for _ in range(3)]
    assert decide(POLICY, three, end(nccl), now)[1].startswith(
        "gave up: NCCL collective timed out (nccl-timeout) after 3")
    never = dict(POLICY, restart="never")
    assert decide(never, [], end(nccl), now) == (False, "not restarted: restart = never")
    assert decide(dict(never, on_hang="restart"), [], end(None, hung=True), now)[0] is True
    assert decide(dict(never, on_hang="kill"), [], end(None, hung=True), now) == (
        False, "hung: stopped (on_hang = kill)")


# ---------------------------------------------------------------- real runs


def _policy(toml: str) -> dict:
    policy = compile_policy(parse_config(toml))
    assert policy is not None
    return policy


def _launch(tmp_path: Path, mode: str, toml: str, n: int = 10) -> tuple[str, str, Path]:
    runs = str(tmp_path / "runs")
    out = tmp_path / "out"
    rec = launcher.launch(runs, "job", [sys.executable, JOB, str(out), str(n), mode], str(tmp_path), {},
                          restart=_policy(toml))
    return runs, rec["run_id"], out


def _record(runs: str, run_id: str) -> dict:
    rec = rundir.record(os.path.join(runs, run_id), __import__("remote.base.procfs").base.procfs.boot_time())
    assert rec is not None
    return rec


def _ended(runs: str, run_id: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = _record(runs, run_id)
        if rec["state"] != "running":
            return rec
        time.sleep(0.1)
    killer.kill(runs, run_id, graces=(0.5, 0.5), gpu_wait=0)
    raise AssertionError("the run did not end in %gs" % timeout)


FAST = '[run]\nrestart = "on-failure"\nrestart_delay = 0.2\nrestart_delay_max = 1\ngraces = [0.5, 0.5]\n'


def test_a_transient_death_twice_then_finished_every_sample_once(tmp_path: Path) -> None:
    runs, run_id, out = _launch(tmp_path, "transient2", FAST)
    rec = _ended(runs, run_id)
    assert (rec["state"], rec["exit_code"], rec["restarts"]) == ("exited", 0, 2)
    assert [a["restarted"] for a in rec["attempts"]] == [True, True, False]
    first = rec["attempts"][0]
    assert first["cause"]["id"] == "nccl-timeout" and first["exit_code"] == 1
    assert first["progress"]["batch"] == 3 and rec["attempts"][1]["progress"]["batch"] == 6
    assert first["why"] == "restarting: NCCL collective timed out (nccl-timeout)"
    assert rec["attempts"][2]["why"] == "finished" and rec["restart_at"] is None
    writes = (out / "writes.log").read_text().split()
    assert sorted(writes, key=int) == [str(i) for i in range(1, 11)]  # every sample exactly once
    log = Path(rec["log"]).read_text()
    assert "[eagle3-tui] attempt 2/4 starts" in log and "[eagle3-tui] attempt 3/4 starts" in log
    assert log.count("[extract] done:") == 1


def test_module_not_found_is_never_restarted(tmp_path: Path) -> None:
    runs, run_id, out = _launch(tmp_path, "module", FAST)
    rec = _ended(runs, run_id)
    assert (rec["state"], rec["exit_code"], rec["restarts"]) == ("exited", 1, 0)
    (only,) = rec["attempts"]
    assert only["cause"]["id"] == "module-not-found" and only["restarted"] is False
    assert rec["restart_note"] == "not restarted: Import failed (module-not-found) is deterministic"
    assert (out / "attempts").read_text() == "1"


def test_no_kernel_image_is_never_restarted(tmp_path: Path) -> None:
    """The reported waste: `no kernel image is available` restarted 3 times. Now the
    first attempt is the last, and the record says why."""
    runs, run_id, out = _launch(tmp_path, "nokernel", FAST)
    rec = _ended(runs, run_id)
    assert (rec["state"], rec["exit_code"], rec["restarts"]) == ("exited", 1, 0)
    (only,) = rec["attempts"]
    assert only["cause"]["id"] == "cuda-unsupported" and only["restarted"] is False
    assert rec["restart_note"].startswith("not restarted: ") and rec["restart_note"].endswith(
        "(cuda-unsupported) is deterministic")
    assert (out / "attempts").read_text() == "1"


def test_a_run_whose_attempts_a_sigkill_ends_ends_by_sigkill(tmp_path: Path) -> None:
    """Every attempt logs an NCCL timeout and is then killed by SIGKILL (a teardown by a
    signal, as the OOM killer's): restarted until the policy gives up, the run then ends as
    its last attempt did, by SIGKILL, as a run without restarts would -- not "exit 1", and
    no traceback of the supervisor in the run's log for the analysis to take as the cause."""
    runs, run_id, out = _launch(tmp_path, "sigkill", FAST)
    rec = _ended(runs, run_id)
    assert (rec["exit_code"], rec["signal"]) == (None, "SIGKILL"), rec
    assert [a["signal"] for a in rec["attempts"]] == ["SIGKILL"] * len(rec["attempts"]) and rec["restarts"] >= 1, rec
    assert rec["attempts"][-1]["restarted"] is False
    log = Path(rec["log"]).read_text()
    assert "Traceback" not in log and "OSError" not in log, log[-2000:]


def test_fail_then_fail_differently_restarts_once_then_stops_at_the_oom(tmp_path: Path) -> None:
    """Attempt 1 dies of an NCCL watchdog timeout (transient: restarted); attempt 2 logs
    an INFO line that a batch was retried after that timeout, then runs out of memory.
    Attempt 2's cause is the OOM (its own first real failure, not the INFO note and not
    attempt 1's timeout): deterministic, so no third attempt."""
    runs, run_id, out = _launch(tmp_path, "then_oom", FAST)
    rec = _ended(runs, run_id)
    assert (rec["state"], rec["exit_code"], rec["restarts"]) == ("exited", 1, 1)
    first, second = rec["attempts"]
    assert first["cause"]["id"] == "nccl-timeout" and first["restarted"] is True
    assert second["cause"]["id"] == "cuda-oom" and second["restarted"] is False
    assert second["cause"]["line"].startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert rec["restart_note"] == "not restarted: GPU out of memory (cuda-oom) is deterministic"
    assert (out / "attempts").read_text() == "2"


def test_kill_during_the_wait_wins(tmp_path: Path) -> None:
    runs, run_id, out = _launch(tmp_path, "always", '[run]\nrestart = "on-failure"\nrestart_delay = 600\n')
    deadline = time.monotonic() + 30
    while _record(runs, run_id).get("restart_at") is None:
        assert time.monotonic() < deadline, "no pending restart"
        time.sleep(0.1)
    waiting = _record(runs, run_id)
    assert waiting["state"] == "running" and waiting["restart_at"] > time.time() + 500
    assert rundir.prune_runs(runs, keep=0)["removed"] == []  # a waiting run is live: never pruned
    from tui.protocol.records import RunRecord
    from tui.services.actions import relaunch
    with pytest.raises(ValueError, match="is still running"):  # nor relaunched over
        __import__("asyncio").run(relaunch(None, parse_config(""), RunRecord.parse(waiting)))  # type: ignore[arg-type]
    report = killer.kill(runs, run_id, graces=(2.0, 2.0), gpu_wait=0)
    assert report["ok"]
    rec = _ended(runs, run_id, 10)
    assert rec["state"] == "killed" and rec["restarts"] == 0
    assert rec["attempts"][-1]["why"] == "killed while waiting to restart"
    time.sleep(1.0)
    assert (out / "attempts").read_text() == "1"  # nothing started later


def test_thrash_guard_gives_up(tmp_path: Path) -> None:
    toml = FAST + "max_restarts = 50\nthrash_failures = 3\nthrash_window = 60\n"
    runs, run_id, out = _launch(tmp_path, "always", toml)
    rec = _ended(runs, run_id)
    assert (rec["state"], rec["restarts"]) == ("exited", 2)
    assert rec["restart_note"] == "gave up: 3 failures within 1m (thrash guard)"
    assert (out / "attempts").read_text() == "3"


def test_unclassified_failure_restarts_only_while_it_progresses(tmp_path: Path) -> None:
    toml = FAST + "max_restarts = 20\nthrash_failures = 0\n"
    runs, run_id, out = _launch(tmp_path, "unknown", toml, n=3)
    rec = _ended(runs, run_id)
    # each attempt writes one new sample, then dies unclassified; the third finishes
    assert (rec["state"], rec["exit_code"], rec["restarts"]) == ("exited", 0, 2)
    assert rec["attempts"][0]["why"] == "restarting: Python exception (python-traceback), after progress to batch 1"
    assert sorted((out / "writes.log").read_text().split()) == ["1", "2", "3"]
    # attempt 2 gets no further than attempt 1's batch 1: not restarted again
    (tmp_path / "stuck").mkdir()
    runs, run_id, out = _launch(tmp_path / "stuck", "stuck", toml, n=3)
    rec = _ended(runs, run_id)
    assert (rec["state"], rec["exit_code"], rec["restarts"]) == ("exited", 1, 1)
    assert rec["restart_note"].endswith("and no progress beyond the previous attempt")


def test_a_hung_attempt_is_restarted_on_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EAGLE3_TUI_PACE_S", "0.2")  # the shim's pace looks (inherited by the shim)
    toml = '[run]\ngraces = [0.5, 0.5]\nrestart_delay = 0.2\n[watch]\non_hang = "restart"\nhang_s = 1.5\n'
    runs, run_id, out = _launch(tmp_path, "hang1", toml, n=5)
    rec = _ended(runs, run_id)
    assert (rec["state"], rec["exit_code"], rec["restarts"]) == ("exited", 0, 1)
    first = rec["attempts"][0]
    assert first["hung"] is True and first["why"] == "restarting: hung"
    assert sorted((out / "writes.log").read_text().split()) == ["1", "2", "3", "4", "5"]


# ---------------------------------------------------------------- what the client shows


def _attempt(n: int, **kw: object) -> dict:
    rec = {"n": n, "started_at": 100.0 * n, "ended_at": 100.0 * n + 50, "exit_code": 1, "restarted": True,
           "cause": {"id": "nccl-timeout", "title": "NCCL watchdog timeout", "class": "transient"},
           "progress": {"phase": "extracting", "step": "batch %d/4000" % (1200 + n), "batch": 1200 + n},
           "why": "restarting: NCCL watchdog timeout (nccl-timeout)"}
    rec.update(kw)
    return rec


def test_labels_of_a_waiting_and_a_restarted_run() -> None:
    from tui.protocol.records import RunRecord
    from tui.state import view

    waiting = RunRecord.parse({"run_id": "r", "state": "running", "restarts": 1, "max_restarts": 3,
                             "attempts": [_attempt(1, restart_at=1000.0)], "restart_at": 1000.0})
    assert view.state_label(waiting) == "waiting"
    assert view.restart_label(waiting, 975.0) == (
        "waiting to restart in 25s (restart 1 of 3) — last: NCCL watchdog timeout at batch 1,201/4,000")
    done = RunRecord.parse({"run_id": "r", "state": "exited", "exit_code": 0, "restarts": 2, "restart_note": "finished",
                          "attempts": [_attempt(1), _attempt(2, progress={"step": "batch 1203/4000"}),
                                       _attempt(3, exit_code=0, restarted=False, why="finished", cause=None)]})
    assert view.state_label(done) == "exited"
    assert view.restart_label(done, 0.0) == "restarted 2× — last: NCCL watchdog timeout at batch 1,203/4,000"
    row = view.run_row(done, "", 0.0)
    assert row.note == "restarted 2× — last: NCCL watchdog timeout at batch 1,203/4,000"
    plain = RunRecord.parse({"run_id": "p", "state": "exited", "exit_code": 1})
    assert view.restart_label(plain, 0.0) == ""


def test_notifications_once_per_attempt_with_the_attempt() -> None:
    from tui.protocol.records import RunRecord
    from tui.state.watch import WatchState, observe

    first = [_attempt(1, restart_at=200.0)]
    second = [_attempt(1), _attempt(2, restarted=False, why="gave up: 2 failures within 10m (thrash guard)")]
    ws = WatchState(run_id="r")
    for attempts in (first, first, second, second):
        run = RunRecord.parse({"run_id": "r", "state": "running", "restarts": 1, "attempts": attempts,
                             "restart_at": 200.0 if attempts is first else None})
        ws = observe(ws, run, None, 0, (), (), 150.0)
    kinds = [(e.kind, e.detail.get("attempt")) for e in ws.events]
    assert kinds == [("restarting", 1), ("gave up", 2)]
    assert ws.events[0].to_json()["attempt"] == 1
    assert ws.events[1].message == ("attempt 2 failed: NCCL watchdog timeout at batch 1,202/4,000;"
                                    " gave up: 2 failures within 10m (thrash guard)")


def test_a_real_extraction_restarted_twice_equals_an_uninterrupted_one(tmp_path: Path) -> None:
    """remote/extract.py on the tiny demo model (hf backend, CPU), killed twice after
    writing part of its files: the restarts skip the finished samples and the output
    is byte-identical to an uninterrupted run's."""
    import hashlib
    import json
    import subprocess

    need.module("torch", "pip install 'eagle3-tui[demo]'")  # a failure under ./tests/run and CI, never a silent skip
    from tui.services.demo import build_demo

    paths = build_demo(tmp_path / "demo", shards=2, layers=8, hidden=64, sequences=2, seq_len=8,
                       shard_delay=0.0, patches=False)
    data = tmp_path / "data.jsonl"
    lengths = [5, 17, 9, 33, 2, 12, 21, 7]
    data.write_text("".join(json.dumps({"input_ids": [(7 * i + 13 * t) % 1000 + 3 for t in range(n)]}) + "\n"
                            for i, n in enumerate(lengths)))
    extract = str(REPO / "remote" / "extract.py")
    args = ["--backend", "hf", "--model", str(paths.model), "--data", str(data), "--batch-size", "1",
            "--device", "cpu"]
    full, part = tmp_path / "full", tmp_path / "part"
    runs = str(tmp_path / "runs")
    rec = launcher.launch(runs, "extract", [sys.executable, str(REPO / "tests/jobs/flaky_extract.py"), extract,
                                            str(part), *args], str(tmp_path), {}, restart=_policy(FAST))
    ref = subprocess.run([sys.executable, extract, *args, "--out", str(full)], capture_output=True, text=True,
                         timeout=300)
    assert ref.returncode == 0, ref.stderr
    rec = _ended(runs, rec["run_id"], 300)
    assert (rec["state"], rec["exit_code"], rec["restarts"]) == ("exited", 0, 2)
    assert [a["cause"]["id"] for a in rec["attempts"][:2]] == ["nccl-timeout", "nccl-timeout"]
    log = Path(rec["log"]).read_text()
    assert "skipped (already done)" in log and log.count("[extract] done:") == 1

    def digests(d: Path) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}

    assert digests(part) == digests(full)


@pytest.mark.parametrize(("text", "error"), [
    ('[run]\nrestart = "always"', 'eagle3.toml: run.restart: must be "never" or "on-failure", not \'always\''),
    ("[run]\nmax_restarts = -1", "eagle3.toml: run.max_restarts: must be a whole number from 0 to 1000"),
    ('[run]\nrestart_delay = "30"', "eagle3.toml: run.restart_delay: must be a number of seconds, not str"),
    ("[run]\nrestart_delay = 60\nrestart_delay_max = 10",
     "eagle3.toml: run.restart_delay_max: must be at least run.restart_delay (60)"),
    ('[watch]\non_hang = "nap"', 'eagle3.toml: watch.on_hang: must be "notify", "kill" or "restart", not \'nap\''),
])
def test_policy_settings_are_checked_in_one_line(text: str, error: str) -> None:
    from tui.services.config import ConfigError

    with pytest.raises(ConfigError) as exc:
        parse_config(text)
    assert str(exc.value) == error


def test_no_policy_no_restart_in_the_request_and_a_bad_class_is_refused(tmp_path: Path) -> None:
    from tui.services.actions import restart_args
    from tui.state.loganalysis.signatures import SignatureError

    assert restart_args(parse_config("")) == {}
    assert restart_args(parse_config('[watch]\non_hang = "kill"'))["restart"]["restart"] == "never"
    bad = tmp_path / "sigs.toml"
    bad.write_text('[[signature]]\nid = "x"\ntitle = "X"\npatterns = ["x"]\nrestart = "sometimes"\n')
    with pytest.raises(SignatureError, match="key 'restart': must be one of transient, deterministic, unclassified"):
        load_signatures([bad], user_file=None)


def test_a_hung_attempt_is_stopped_with_on_hang_kill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EAGLE3_TUI_PACE_S", "0.2")
    toml = '[run]\ngraces = [0.5, 0.5]\nrestart = "on-failure"\n[watch]\non_hang = "kill"\nhang_s = 1.5\n'
    runs, run_id, out = _launch(tmp_path, "hang1", toml, n=5)
    rec = _ended(runs, run_id)
    assert (rec["state"], rec["restarts"]) == ("exited", 0) and rec["exit_code"] != 0
    assert rec["restart_note"] == "hung: stopped (on_hang = kill)"
    assert (out / "attempts").read_text() == "1"
    # the log says why, with the hang_s it was judged by (issue 41: a mutant said "for 0 s"),
    # as set: 1.5 s, not cut to "1 s"
    assert "attempt 1: hung (no CPU or GPU activity for 1.5s after the load): stopping it" in Path(
        rec["log"]).read_text()


def test_a_run_waiting_to_restart_is_neither_stalled_nor_hung() -> None:
    from tui.protocol.records import RunRecord
    from tui.state.watch import WatchState, assess, observe

    pace = {"source": "shim", "phase": "extracting", "step": "batch 3/10", "step_at": 0.0, "intervals": [1.0, 1.0],
            "idle_since": 0.0, "gpu": "none: no GPUs"}
    rec = {"run_id": "r", "state": "running", "pace": pace, "restarts": 1, "attempts": [_attempt(1)]}
    assert assess(RunRecord.parse(rec), None, 5000.0).condition == "hung"  # type: ignore[union-attr]
    waiting = RunRecord.parse(dict(rec, restart_at=6000.0))
    assert assess(waiting, None, 5000.0) is None
    ws = observe(WatchState(run_id="r"), waiting, None, 0, (), (), 5000.0)
    ws = observe(ws, waiting, None, 0, (), (), 5900.0)
    assert ws.condition == "ok" and [e.kind for e in ws.events] == ["restarting"]


def test_a_command_that_cannot_start_is_not_restarted(tmp_path: Path) -> None:
    runs = str(tmp_path / "runs")
    rec = launcher.launch(runs, "job", [str(tmp_path / "no-such-program")], str(tmp_path), {}, restart=_policy(FAST))
    rec = _ended(runs, rec["run_id"])
    assert (rec["state"], rec["exit_code"], rec["restarts"]) == ("exited", 127, 0)
    assert rec["restart_note"] == "not restarted: cannot start the command (cannot-start) is deterministic"


def test_leftovers_of_a_failed_attempt_are_gone_before_the_next_starts(tmp_path: Path) -> None:
    runs, run_id, out = _launch(tmp_path, "stray", FAST, n=3)
    rec = _ended(runs, run_id)
    assert (rec["state"], rec["exit_code"], rec["restarts"]) == ("exited", 0, 1)
    assert (out / "stray_seen").read_text() == "gone"
