"""Issue 15 parser behaviours: exception lines without a header, the quoted cause,
lifecycle phases with the phase a run died in, and the target model's progress."""

from __future__ import annotations

from pathlib import Path

from tui.state.loganalysis.fold import LogAnalysis, finish_lines, split_lines, step

HELDOUT = Path(__file__).parent / "fixtures" / "heldout"
CORPUS = Path(__file__).parent / "fixtures" / "corpus"


def fold(text: str, t0: float | None = None) -> LogAnalysis:
    lines, partial = split_lines(b"", text.encode())
    a = LogAnalysis()
    for i, line in enumerate(lines + finish_lines(partial), 1):
        a = step(a, line, i, None if t0 is None else t0 + i)
    return a


def test_the_cause_is_the_raised_exception_line_not_the_raise_frame() -> None:
    a = fold((HELDOUT / "vllm6732_v053_nccl_error.log").read_text())
    assert a.root_cause is not None and a.root_cause.id == "nccl-error"
    assert a.root_cause.line.endswith(
        "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)")
    log = (
        'Traceback (most recent call last):\n'
        '  File "w.py", line 9, in _dummy_sampler_run\n'
        '    raise RuntimeError("CUDA out of memory occurred when warming up sampler")\n'
        'RuntimeError: CUDA out of memory occurred when warming up sampler\n'
    )
    b = fold(log)
    assert b.root_cause is not None and (b.root_cause.id, b.root_cause.line_no) == ("cuda-oom", 4)
    assert (b.failed_in, b.failed_stage) == ("loaded", "warm-up")


def test_a_bare_exception_line_is_a_failure_and_warnings_are_not() -> None:
    a = fold("ValueError: To serve at least one request with the model's max seq len (1048576), blah\n")
    assert a.phase == "failed" and a.root_cause is not None and a.root_cause.id == "kv-cache-too-small"
    assert fold("/x/hub.py:124: FutureWarning: Using `TRANSFORMERS_CACHE` is deprecated\n").root_cause is None
    assert fold("UserWarning: TORCH_CUDA_ARCH_LIST is not set\n").root_cause is None
    assert fold("Error in preprocessing prompt inputs\n").root_cause is None


def test_the_last_exception_of_a_chain_is_the_cause() -> None:
    log = (
        "ray.exceptions.RayTaskError(ActorDiedError): ray::TaskRunner.run() (pid=1)\n"
        '  File "main_ppo.py", line 215, in run\n'
        "    trainer.fit()\n"
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
        "\tclass_name: WorkerDict\n"
    )
    a = fold(log)
    assert a.root_cause is not None and a.root_cause.line_no == 4 and a.root_cause.id == "ray-actor-died"
    # a later, less specific exception of the chain does not displace a specific one
    log2 = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n"
        "\n"
        "The above exception was the direct cause of the following exception:\n"
        "\n"
        "KeyError: 'x'\n"
    )
    b = fold(log2)
    assert b.root_cause is not None and (b.root_cause.id, b.root_cause.line_no) == ("cuda-oom", 1)


def test_engine_death_while_serving_names_the_phase_and_the_time_there() -> None:
    log = (
        "INFO 11-29 10:00:00 [default_loader.py:1] Loading weights took 60.00 seconds\n"
        "(APIServer pid=1) INFO 11-29 10:01:00 [launcher.py:1] Uvicorn running on http://0.0.0.0:8000\n"
        '(APIServer pid=1) INFO:     127.0.0.1:1 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
        "(APIServer pid=1) ERROR 11-29 12:15:00 [serving_chat.py:9] ValueError: This model's maximum context length"
        " is 8192 tokens.\n"
        "(EngineCore_DP0 pid=2) ERROR 11-29 12:15:30 [core.py:1] EngineCore encountered a fatal error.\n"
        "(APIServer pid=1) ERROR 11-29 12:15:31 [serving_chat.py:9] vllm.v1.engine.exceptions.EngineDeadError:"
        " EngineCore encountered an issue.\n"
    )
    a = fold(log)
    assert a.phase == "failed" and a.failed_in == "serving"
    assert {f.id for f in a.failures} == {"engine-dead"}  # the request's own 400 is not a failure
    assert a.failed_after_s == 2 * 3600 + 14 * 60 + 30
    assert a.failure_summary() == "died while serving after 134m"
    # a request error alone keeps the run serving
    ok = fold(log.split("(EngineCore_DP0")[0])
    assert (ok.phase, ok.root_cause) == ("serving", None)


def test_phase_durations_use_arrival_time_without_log_timestamps() -> None:
    a = fold("Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.00it/s]\n"
             "some output\nRuntimeError: boom\n", t0=1000.0)
    assert (a.failed_in, a.failed_after_s) == ("loading", 2.0)
    assert a.failure_summary() == "died while loading (shard 1/2) after 2s"


def test_stages_after_the_load() -> None:
    a = fold("Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:01<00:00,  1.00it/s]\n"
             "(Worker_TP0 pid=1) INFO 11-29 10:00:00 [gpu_model_runner.py:1] Capturing CUDA graphs"
             " (mixed prefill-decode, PIECEWISE)\n")
    assert (a.phase, a.stage) == ("loaded", "graph capture")
    b = fold("(Worker_TP0 pid=1) INFO 11-29 10:00:00 [gpu_worker.py:1] Available KV cache memory: 18.83 GiB\n")
    assert (b.phase, b.stage) == ("loaded", "profiling")


def test_the_target_models_bar_is_kept_when_other_loaders_report() -> None:
    a = fold((CORPUS / "vllmascend2667_eagle_drafter_pt.log").read_text())
    assert a.shard is not None and (a.shard.desc, a.shard.done, a.shard.total) == (
        "Loading safetensors checkpoint shards", 4, 4)
    assert [(sp.desc, sp.done, sp.total) for sp in a.loads.values()] == [("Loading pt checkpoint shards", 1, 1)]
    bar = ("(Worker_TP0 pid=1) Loading safetensors checkpoint shards: {p}% Completed"
           " | {n}/{t} [00:01<00:01,  1.00it/s]\n")
    reread = fold(bar.format(p=50, n=1, t=2) + bar.format(p=100, n=2, t=2) + bar.format(p=0, n=0, t=1))
    assert reread.shard is not None and (reread.shard.done, reread.shard.total) == (2, 2)
    assert reread.phase == "loaded" and len(reread.loads) == 1
