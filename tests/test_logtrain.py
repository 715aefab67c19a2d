"""Training logs (issue 28): progress, loss, phases and training failures, line by line.

The corpus scores (tests/test_corpus_training.py) say how often the analysis is right on
real excerpts; these pin the behaviours one at a time, each on lines as trainers print
them, and the real speculators 0.3.0 training log (its own Trainer on the demo's
extraction output, tests/fixtures/logs/speculators030_train_cpu.log).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tui.services.inspect import format_report, inspect_log
from tui.state.loganalysis.fold import LogAnalysis, step
from tui.state.loganalysis.signatures import SignatureSet, load_signatures

FIXTURES = Path(__file__).parent / "fixtures" / "logs"


def fold(lines: list[str], signatures: SignatureSet | None = None) -> LogAnalysis:
    a = LogAnalysis(signatures=signatures)
    for i, line in enumerate(lines, 1):
        a = step(a, line, i, float(i))
    return a


def test_real_speculators_log_gives_step_total_loss_and_finished() -> None:
    r = inspect_log((FIXTURES / "speculators030_train_cpu.log").read_bytes())
    tr = r["train"]
    text = (FIXTURES / "speculators030_train_cpu.log").read_text()
    losses = [float(x.split("=")[1].rstrip(",")) for x in text.split() if x.startswith("train/loss=")]
    assert (tr["step"], tr["total"], tr["epochs"]) == (len(losses), 45, 3)
    assert tr["loss"] == losses[-1] and tr["losses"] == losses
    assert r["phase"] == "finished" and r["root_cause"] is None
    json.dumps(r, allow_nan=False)  # strictly valid JSON


def test_speculators_phases_in_order() -> None:
    lines = (FIXTURES / "speculators030_train_cpu.log").read_text().splitlines()
    seen = []
    a = LogAnalysis()
    for i, line in enumerate(lines, 1):
        a = step(a, line, i)
        if not seen or seen[-1] != a.phase:
            seen.append(a.phase)
    assert seen == ["starting"] + ["training", "evaluating", "saving"] * 3 + ["finished"]
    # total is unknown until the first epoch has run, then steps/epoch x epochs
    a = fold(lines[:100])
    assert a.train is not None and a.train.total is None and a.train.step > 0


def test_nan_loss_that_persists_is_a_failure_quoting_where_it_began() -> None:
    lines = [f"{{'loss': {x}, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.1}}"
             for x in ("2.1", "2.0", "nan", "nan", "nan")]
    a = fold(lines)
    assert a.root_cause is not None and a.root_cause.id == "training-diverged"
    assert a.root_cause.line_no == 3 and a.failed_in == "training"
    assert math.isnan(a.train.loss)
    assert inspect_log("\n".join(lines).encode())["train"]["loss"] == "nan"


def test_one_overflow_then_normal_steps_is_not_a_failure() -> None:
    lines = [
        "{'loss': 2.1, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.1}",
        "[2024-01-01 10:00:00,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! "
        "Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
        "{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.1}",
        "{'loss': 2.0, 'grad_norm': 0.9, 'learning_rate': 1e-05, 'epoch': 0.2}",
        "{'loss': nan, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.2}",
        "{'loss': nan, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.2}",
        "{'loss': 1.9, 'grad_norm': 0.9, 'learning_rate': 1e-05, 'epoch': 0.3}",
    ]
    a = fold(lines)
    assert a.root_cause is None and a.phase == "training" and a.train.loss == 1.9


def test_without_the_signature_a_persisting_nan_is_no_failure() -> None:
    sigs = SignatureSet.build([s for s in load_signatures(user_file=None) if s.id != "training-diverged"])
    a = fold(["epoch: 1 loss: nan"] * 5, sigs)
    assert a.root_cause is None and math.isnan(a.train.loss)


def test_traps_are_not_failures() -> None:
    lines = [
        "/usr/lib/python3/site-packages/transformers/trainer.py:1234: FutureWarning: `tokenizer` is "
        "deprecated and will be removed in version 5.0.0",
        "gpu-01:1234:1234 [0] NCCL INFO Channel 00/02 :    0   1   2   3",
        "gpu-01:1234:1290 [0] NCCL WARN NET/IB : No device found.",
        "[rank0]:[W1201 10:00:00.000 ProcessGroupNCCL.cpp:4561] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS=1 "
        "has no effect for point-to-point collectives.",
        " 10%|█         | 10/100 [00:10<01:30,  1.00it/s]",
    ]
    a = fold(lines)
    assert a.root_cause is None and a.phase == "training" and (a.train.step, a.train.total) == (10, 100)


def test_eval_bars_are_not_the_training_bar() -> None:
    a = fold([
        " 10%|█         | 100/1000 [01:40<15:00,  1.00it/s]",
        "{'loss': 1.5, 'grad_norm': 0.8, 'learning_rate': 2e-05, 'epoch': 0.1}",
        " 40%|████      | 20/50 [00:02<00:03,  9.50it/s]",  # HF's nameless evaluation bar
    ])
    assert (a.train.step, a.train.total) == (100, 1000) and a.phase == "evaluating"
    a = step(a, " 10%|█         | 101/1000 [01:41<15:00,  1.00it/s]", 4)
    assert (a.train.step, a.phase) == (101, "training")
    b = fold(["Epoch 1:  50%|█████     | 50/100 [00:10<00:10,  5.00it/s, v_num=0, train_loss=0.7]",
              "Validation DataLoader 0:  30%|███       | 3/10 [00:00<00:01,  9.00it/s]"])
    assert (b.train.step, b.train.total, b.train.epoch, b.phase) == (50, 100, 1.0, "evaluating")


def test_multi_rank_lines_read_as_one_run_and_the_first_rank_is_the_cause() -> None:
    a = fold([
        "[rank0]: Step 7 | loss:1.25 lr:2e-05",
        "[rank1]:[E1201 10:00:00.000 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
        "600001 milliseconds before timing out.",
        "[rank0]:[E1201 10:00:01.000 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
        "600002 milliseconds before timing out.",
    ])
    assert a.train.step == 7 and a.root_cause.id == "nccl-timeout" and "[Rank 1]" in a.root_cause.line
    assert a.failure_summary() == "died while training (step 7) after 1s"


def test_torchrun_wrapper_yields_to_the_failing_ranks_own_error() -> None:
    a = fold([
        "[rank3]: Traceback (most recent call last):",
        '[rank3]:   File "train.py", line 10, in <module>',
        "[rank3]:     loss.backward()",
        "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "E1201 10:00:00.000000 1 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) "
        "local_rank: 3 (pid: 42) of binary: /usr/bin/python",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    ])
    assert a.root_cause.id == "cuda-oom" and "Tried to allocate 2.00 GiB" in a.root_cause.line
    assert {f.id for f in a.failures} >= {"cuda-oom", "torchrun-child-failed"}


def test_saving_phase_from_a_save_frame_and_finished_from_hf_summary() -> None:
    a = fold([
        " 50%|█████     | 500/1000 [10:00<10:00,  1.00s/it]",
        "Traceback (most recent call last):",
        '  File "/x/torch/serialization.py", line 423, in save',
        "    _save(obj, opened_zipfile, pickle_module, pickle_protocol)",
        "OSError: [Errno 28] No space left on device",
    ])
    assert a.failed_in == "saving" and a.root_cause.id == "no-space"
    b = fold([" 100%|██████████| 1000/1000 [10:00<00:00,  1.00s/it]",
              "{'train_runtime': 600.0, 'train_samples_per_second': 3.2, 'train_loss': 1.1, 'epoch': 3.0}"])
    assert b.phase == "finished" and b.train.step == 1000


def test_a_traceback_through_the_training_loop_says_it_failed_training() -> None:
    """No progress line before the traceback: its frames are all that show where it died
    (a training-loop frame, or autograd's backward); a save frame deeper still wins."""
    head = ["Traceback (most recent call last):", '  File "train.py", line 266, in <module>', "    main(args)"]
    a = fold(head + ['  File "train.py", line 235, in main',
                     "    train_one_epoch(model, optimizer, scaler, data_loader, device, epoch, args)",
                     '  File "/w/engine.py", line 35, in train_one_epoch',
                     "    loss_dict = model(images, targets)",
                     "RuntimeError: NCCL communicator was aborted on rank 2."])
    assert a.failed_in == "training"
    b = fold(head + ['  File "/x/torch/_tensor.py", line 648, in backward', "    torch.autograd.backward(",
                     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.12 GiB."])
    assert b.failed_in == "training" and b.root_cause.id == "cuda-oom"
    c = fold(head + ['  File "/w/trainer.py", line 20, in train_step', "    step()",
                     '  File "/x/torch/serialization.py", line 423, in save', "    _save(obj)",
                     "OSError: [Errno 28] No space left on device"])
    assert c.failed_in == "saving"
    d = fold([" 10%|█         | 10/100 [00:10<01:30,  1.00it/s]", "***** Running Evaluation *****"] + head
             + ['  File "/w/trainer.py", line 20, in training_step', "    evaluate()",
                "RuntimeError: boom"])
    assert d.failed_in == "evaluating"  # already past training: a frame never moves it back
    e = fold(head + ['  File "/w/serve.py", line 20, in handle', "    run()", "RuntimeError: boom"])
    assert e.failed_in == "starting"
    f = fold(["[E ProcessGroupNCCL.cpp:587] [Rank 4] Watchdog caught collective operation timeout: "
              "WorkNCCL(OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1809150 milliseconds before timing out."]
             + head + ['  File "/w/engine.py", line 35, in train_one_epoch', "    loss_dict = model(images)",
                       "RuntimeError: NCCL communicator was aborted on rank 2."])
    assert f.failed_in == "training" and "[Rank 4] Watchdog" in f.root_cause.line  # its traceback tells where


def test_report_names_the_training_line() -> None:
    r = inspect_log(b"Step 3 | loss:0.5 lr:2e-05 tokens_per_second_per_gpu:100.0\n")
    assert "train: step 3" in format_report(r) and "loss 0.5" in format_report(r)
    assert r["train"]["lr"] == 2e-05 and r["phase"] == "training"
    assert inspect_log(b"INFO 12-01 10:00:00 [loader.py:1] Loading weights took 1.0 seconds\n")["train"] is None


@pytest.mark.parametrize("text, want", [
    # (lines in the shape each trainer prints, (step, total, loss))
    ("Epoch [1/10], Step [200/600], Loss: 0.1934", (200, 600, 0.1934)),
    (" [2025-01-01 10:00:00] iteration      100/   10000 | consumed samples:        12800 | learning rate: "
     "1.500000E-04 | global batch size:   128 | lm loss: 7.123456E+00 | loss scale: 1.0 | grad norm: 1.234 |",
     (100, 10000, 7.123456)),
    ("Training epoch 0, iteration 99/4999 | lr: 1.5e-05 | global_step: 99 | reduced_train_loss: 5.12",
     (99, 4999, 5.12)),
    ("[rank0]:[titan] 2025-01-01 10:00:00,000 - root - INFO - step:  10  loss:  7.8432  memory: 30.12GiB(31.70%)",
     (10, None, 7.8432)),
    ("1875/1875 [==============================] - 5s 2ms/step - loss: 0.2954 - accuracy: 0.9140",
     (1875, 1875, 0.2954)),
    ("Steps:  10%|█         | 100/1000 [01:00<09:00,  1.67it/s, loss=0.123, lr=0.0001]", (100, 1000, 0.123)),
    ("step:10 - actor/entropy:0.5 - actor/pg_loss:-0.01 - actor/lr:1e-06", (10, None, None)),
    # BasicSR / mmsr: the iteration with a thousands separator
    ("21-05-24 02:17:53.561 - INFO: <epoch: 32, iter:   3,000, lr:1.000e-04> l_g_pix: 1.7321e-03 "
     "l_d_real: 9.0599e-08", (3000, None, None)),
    ("Step 1,200/10,000 | loss: 0.52 | lr: 2e-05", (1200, 10000, 0.52)),
    # Coqui / mozilla TTS: the step heads its own line, the metrics follow on the next ones
    ("   --> STEP: 10/13 -- GLOBAL_STEP: 25", (10, 13, None)),
    ("{'loss': 0.5, 'grad_norm': 1.0, 'learning_rate': 2e-05, 'step': 12, 'epoch': 1.0}", (12, None, 0.5)),
    ("Epoch 0: 100%|██████████| 100/100 [00:12<00:00,  8.20it/s, v_num=3, train_loss_step=0.412, "
     "val_loss=0.455, train_loss_epoch=0.498]", (100, 100, 0.412)),
])
def test_trainer_line_shapes(text: str, want: tuple) -> None:
    tr = inspect_log(text.encode() + b"\n")["train"]
    assert (tr["step"], tr["total"], tr["loss"]) == want


def test_a_counter_alone_is_training_only_when_it_heads_its_line() -> None:
    for text in ("Warmup step 1/3", "INFO Downloading shard step 2/8", "Capturing batches (iteration 3/35)"):
        assert inspect_log(text.encode() + b"\n")["train"] is None, text


def test_watch_counts_training_steps_as_progress_and_calls_a_stopped_loop_stalled() -> None:
    from tui.protocol.records import RunRecord
    from tui.state.watch import WatchConfig, WatchState, observe

    run = RunRecord.parse({"run_id": "r1", "state": "running", "name": "train", "argv": ["train.py"]})
    cfg = WatchConfig(stall_training_s=60.0)
    ws = WatchState(config=cfg)
    lines = [f"Step {i} | loss:{2.0 - i / 100} lr:2e-05" for i in range(1, 30)]
    a = LogAnalysis()
    for i, line in enumerate(lines):  # a step every 10 s: progress, not a stall
        a = step(a, line, i + 1)
        ws = observe(ws, run, a, i + 1, (), (), 1000.0 + 10 * i)
    assert ws.condition == "ok" and ws.last_step == "step 29" and a.phase == "training"
    # the log keeps growing with a line that is no step (a warning), but the step stands still
    a = step(a, "UserWarning: something", 31)
    ws = observe(ws, run, a, 31, (), (), 1290.0)
    ws = observe(ws, run, a, 31, (), (), 1290.0 + 61)
    assert ws.condition == "stalled" and "step 29" in (ws.describe(1351.0) or "")


def test_host_pace_reads_training_steps(tmp_path: Path) -> None:
    import remote.run.pace as hostpace

    log = tmp_path / "output.log"
    log.write_text("Step 1 | loss:1.5 lr:2e-05\n")
    p = hostpace.Pace(str(log))
    p.update(100.0)
    with log.open("a") as f:
        f.write(" 30%|███       | 30/100 [00:30<01:10,  1.00it/s]\n")
    p.update(130.0)
    r = p.record()
    assert (r["phase"], r["step"], r["intervals"]) == ("training", "step 30/100", [30.0])
    with log.open("a") as f:  # an evaluation bar is no training step
        f.write("Validation DataLoader 0:  50%|█████     | 5/10 [00:01<00:01,  5.00it/s]\n")
    p.update(140.0)
    assert p.record()["step"] == "step 30/100"


def test_demo_train_needs_a_finished_extraction_and_says_so(tmp_path: Path) -> None:
    import sys

    from tui.services.demo import DemoError, build_demo
    from tui.services.demo_train import build_train

    paths = build_demo(tmp_path / "demo", shards=2, layers=2, hidden=16, sequences=2, seq_len=4,
                       shard_delay=0.0, patches=False)
    with pytest.raises(DemoError, match="no finished extraction"):
        build_train(paths, sys.executable)


def test_headless_prints_the_training_step_loss_and_phase() -> None:
    from tui.services.headless import train_line

    a = fold(["Epoch 1:  50%|█████     | 50/100 [00:10<00:10,  5.00it/s, loss=0.7]"])
    assert train_line(a.train, a.phase) == "[train] step 50/100  epoch 1  loss 0.7  (training)"


def test_a_trainer_that_prints_no_rate_gets_one_from_the_steps_arrival_and_an_eta() -> None:
    """speculators' trainer (and others) print no it/s: the rate comes from when the steps
    arrived, so the bar has a rate and an ETA like the shard bar. Lines that arrived
    together (the backlog read on attaching) never make a rate; a trainer's own rate
    always wins."""
    from tui.views.widgets.progress import train_line

    a = LogAnalysis()
    a = step(a, "***** Running training *****", 1, 100.0)
    a = step(a, "  Total optimization steps = 100", 2, 100.0)
    for n in range(1, 11):  # the backlog: ten steps at once, then one step every 2 s
        a = step(a, f"Step {n} | loss: 0.5", 2 + n, 100.0)
    assert a.train.rate is None
    for n in range(11, 21):
        a = step(a, f"Step {n} | loss: 0.5", 2 + n, 100.0 + 2 * (n - 10))
    assert a.train.step == 20 and a.train.rate == pytest.approx(0.5)
    text = train_line(a.train, 120).plain
    assert "2 s/step" in text and "ETA 2m40s" in text, text  # 80 steps at 2 s
    b = fold(["Epoch 1:   0%|          | 0/100 [00:00<?, ?it/s]",
              "Epoch 1:   1%|          | 1/100 [00:01<?, ?it/s]",
              "Epoch 1:  50%|█████     | 50/100 [00:10<00:10,  5.00it/s, loss=0.7]",
              "Epoch 1:  60%|██████    | 60/100 [00:12<00:08,  5.00it/s, loss=0.7]",
              "Epoch 1:  61%|██████    | 61/100 [00:12<?, ?it/s, loss=0.7]"])  # a redraw without one
    assert b.train.rate == 5.0 and b.train.rate_unit == "it"


def test_the_loss_plot_spans_the_whole_run_and_marks_a_nan() -> None:
    """The progress panel's loss row: every point of the run folded into the cells (the
    mean of each cell's share), a NaN/inf as a red ✗, the range beside it."""
    from tui.views.widgets.progress import loss_line, loss_plot
    from tui.views.widgets.render import BLOCKS

    plot = loss_plot((4.0, 4.0, 2.0, 2.0, float("nan"), 1.0, 1.0, 1.0), 4).plain
    assert plot == BLOCKS[-1] + BLOCKS[2] + "✗" + BLOCKS[0], plot  # 4, 2 (a third up), nan+1, 1
    a = fold([f"Step {n} | loss: {10.0 / n:.3f}" for n in range(1, 201)])
    row = loss_line(a.train, 80).plain
    assert row.startswith("loss  0.05") and row.rstrip().endswith("0.05…10"), row
    assert len(a.train.losses) == 200 and row.count(BLOCKS[-1]) >= 1  # the run's start is in it


def test_a_new_run_never_shows_the_previous_runs_analysis() -> None:
    """Between a new run's launch (the dashboard selects it) and the first bytes of its own
    log, the followed log is still the previous run's: its finished training (step 24/24,
    its loss plot) must not be drawn under the new run's name (seen on `demo --train`)."""
    from dataclasses import replace

    from tui.protocol.records import RunRecord
    from tui.state import view
    from tui.state.model import AppState, LogTail

    old = fold(["Step 24/24 | loss: 0.03", "Training completed. Do not forget to share your model"])
    assert old.phase == "finished"
    state = AppState(log=LogTail(path="/runs/a/output.log", analysis=old))
    new = RunRecord.parse({"run_id": "b", "name": "t", "state": "running", "argv": ["x"], "pid": 2,
                         "launched_at": 1.0, "log": "/runs/b/output.log", "cwd": "/", "env": {}})
    assert view.phase(state, new, 2.0) is None
    assert view.analysis_of(state, new) is None
    same = replace(state, log=replace(state.log, path="/runs/b/output.log"))
    assert view.phase(same, new, 2.0) == "finished" and view.analysis_of(same, new) is old


@pytest.mark.parametrize("text,want", [
    # (a training log line, the loss the host's pace keeps: 4 significant digits)
    ("{'loss': 2.34567, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.1}", 2.346),
    ("                    train/cond_acc_2=0.00e+00, train/loss=4.30e-04,", 0.00043),
    ("Steps:  10%|█         | 100/1000 [01:00<09:00,  1.67it/s, loss=0.123, lr=0.0001]", 0.123),
    ("Epoch 0: 100%|██████████| 100/100 [00:12<00:00,  8.20it/s, v_num=3, train_loss_step=0.412, "
     "val_loss=0.455, train_loss_epoch=0.498]", 0.412),
    (" iteration      100/   10000 | learning rate: 1.500000E-04 | lm loss: 7.123456E+00 | loss scale: 1.0 |",
     7.123),
    ("Epoch [1/10], Step [200/600], Loss: 0.1934", 0.1934),
    ("train/loss_0=0.006, train/loss=nan, epoch=0, lr=0.003", "nan"),
    ("step=5 loss=tensor(2.5000, device='cuda:0') lr=1e-05", 2.5),
    # not a step's training loss: evaluation, a loss's parts, HF's closing mean
    ("{'eval_loss': 7.777, 'eval_runtime': 0.51, 'epoch': 1.0}", None),
    ("                    val/loss_epoch=2.68e-04, epoch=0", None),
    ("[21:36:26] INFO     train/loss_0=0.006,                           trainer.py:190", None),
    ("{'train_runtime': 4.9, 'train_steps_per_second': 8.2, 'train_loss': 8.888, 'epoch': 2.0}", None),
])
def test_host_pace_keeps_the_training_loss(tmp_path: Path, text: str, want: object) -> None:
    import remote.run.pace as hostpace

    log = tmp_path / "output.log"
    log.write_text("Step 1 | loss:1.5 lr:2e-05\n")
    p = hostpace.Pace(str(log))
    p.update(100.0)
    assert p.record()["loss"] == 1.5
    with log.open("a") as f:
        f.write(text + "\n")
    p.update(110.0)
    assert p.record()["loss"] == (1.5 if want is None else want), p.record()
    json.dumps(p.record(), allow_nan=False)  # pace.json stays strict JSON


def test_host_pace_gives_a_loss_the_step_before_it_and_a_new_attempt_none(tmp_path: Path) -> None:
    import remote.run.pace as hostpace

    log = tmp_path / "output.log"
    log.write_text(" 40%|████      | 40/100 [00:04<00:06,  9.50it/s]\n{'loss': 1.25, 'epoch': 0.4}\n")
    p = hostpace.Pace(str(log))
    p.update(100.0)
    assert (p.loss, p.loss_step) == (1.25, 40)
    with log.open("a") as f:
        f.write("[eagle3-tui] attempt 2/3 starts\n")
    p.update(110.0)
    assert (p.loss, p.loss_step) == (None, None)


# --- phases for the passes a run spends hours in (issue 37) ---------------------------------

LIGHTNING_TRAIN = "Epoch 1:  {}%|█████     | {}/100 [00:10<00:10,  5.00it/s, loss=0.5, v_num=1]"
LIGHTNING_VAL = "Validation DataLoader 0:  {}%|████      | {}/20 [00:01<00:02,  6.00it/s]"


def test_a_validation_bar_interleaved_with_the_epoch_bar_is_evaluating_until_it_completes() -> None:
    lines = [LIGHTNING_TRAIN.format(50, 50), LIGHTNING_VAL.format(40, 8), LIGHTNING_TRAIN.format(58, 58),
             LIGHTNING_VAL.format(45, 9), LIGHTNING_TRAIN.format(59, 59)]
    a = fold(lines)
    assert a.phase == "evaluating" and a.train.step == 59
    a = step(a, LIGHTNING_VAL.format(100, 20), 6)
    a = step(a, LIGHTNING_TRAIN.format(60, 60), 7)
    assert a.phase == "training"  # the validation bar reached its total: back to training


def test_checkpoint_shard_saves_are_saving_not_a_load() -> None:
    a = fold(["{'loss': 1.2, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 0.5}",
              "Saving checkpoint shards:  25%|██▌       | 1/4 [00:30<01:30, 30.0s/it]",
              "Saving checkpoint shards:  50%|█████     | 2/4 [01:00<01:00, 30.0s/it]"])
    assert a.phase == "saving" and a.shard is None
    ds = fold(["{'loss': 1.2, 'epoch': 0.5}", "[2024-01-01 10:00:00,000] [INFO] [logging.py:96:log_dist] "
               "[Rank 0] [Torch] Checkpoint global_step500 is about to be saved!"])
    assert ds.phase == "saving"


@pytest.mark.parametrize("last", ["Reached max_iters = 1000, stopping", "max_steps=1000 reached",
                                  "[after training is done] datetime: 2024-01-01 10:00:00"])
def test_a_trainer_without_a_total_that_stops_at_its_limit_finished_where_it_was(last: str) -> None:
    a = fold(["iter 980 | loss 2.10 | lr 1e-4", "iter 1000 | loss 2.00 | lr 1e-4", last])
    assert a.phase == "finished" and a.train.step == 1000 and a.train.loss == 2.0
    r = inspect_log("\n".join(["iter 980 | loss 2.10 | lr 1e-4", "iter 1000 | loss 2.00 | lr 1e-4", last]).encode())
    assert r["phase"] == "finished" and r["train"]["step"] == 1000
