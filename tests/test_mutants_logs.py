"""The client's log analysis (tui/state/logfailures.py): survivors of issue 41's mutation
sample. Workers' tracebacks interleave in one log; each worker's exception chain stays
its own whatever another worker prints between its lines."""

from __future__ import annotations

from tui.state.loganalysis.fold import step
from tui.state.loganalysis.record import LogAnalysis

W1 = "(VllmWorker rank=1 pid=82) ERROR 06-01 10:00:00 [multiproc_executor.py:470] "
W0 = "(VllmWorker rank=0 pid=81) ERROR 06-01 10:00:00 [multiproc_executor.py:470] "
CHAIN = [W1 + "Traceback (most recent call last):", W1 + '  File "y.py", line 2, in g',
         W1 + "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB.", W1,
         W1 + "During handling of the above exception, another exception occurred:"]
RAISED = W1 + "RuntimeError: CUDA error: an illegal memory access was encountered"


def _cause(lines: list[str]) -> tuple[str, int] | None:
    a = LogAnalysis()
    for i, line in enumerate(lines, 1):
        a = step(a, line, i)
    return (a.root_cause.id, a.root_cause.line_no) if a.root_cause else None


def test_another_workers_interrupt_leaves_a_workers_exception_chain_whole() -> None:
    """Rank 1 runs out of memory and, handling it, raises a CUDA fault: the raised
    exception is the cause. Rank 0's KeyboardInterrupt traceback printed in between
    (the launcher stopping the other ranks) ends rank 0's traceback, not rank 1's chain."""
    assert _cause([*CHAIN, RAISED]) == ("cuda-kernel-fault", 6)
    other = [W0 + "Traceback (most recent call last):", W0 + '  File "x.py", line 1, in f', W0 + "KeyboardInterrupt"]
    assert _cause([*CHAIN, *other, RAISED]) == ("cuda-kernel-fault", 9)


def test_a_traceback_ending_in_any_exception_name_is_the_cause() -> None:
    """A run that dies of a traceback whose exception is not named "...Error" (a
    StopIteration out of a data loader, a project's own `foo.Bar: boom`) died of it:
    the traceback's header opens it, its last line is the cause."""
    for last in ("StopIteration", "foo.Bar: boom", "KeyError: 'x'"):
        lines = ["Traceback (most recent call last):", '  File "train.py", line 9, in <module>', "    main()", last]
        assert _cause(lines) == ("python-traceback", 4), last


def _train(lines: list[str]):  # type: ignore[no-untyped-def]
    a = LogAnalysis()
    for i, line in enumerate(lines, 1):
        a = step(a, line, i)
    return a.train


def test_a_bars_description_step_is_the_step_not_its_total() -> None:
    """A trainer whose tqdm description says "step 3/10" (its bar counts batches): the
    progress panel shows step 3 of 10."""
    tp = _train(["Epoch 1 step 3/10:  30%|###       | 30/100 [00:03<00:07,  1.0it/s, loss=0.5]"])
    assert (tp.step, tp.total) == (3, 10)


def test_a_metrics_line_glued_after_a_bar_fills_only_what_the_bar_lacks() -> None:
    """A logger writing its metrics while tqdm redraws: the bar's own loss stands; what
    the bar does not give (its loss, the learning rate, the grad norm) comes from the
    glued line."""
    glued = "{'loss': 0.7, 'grad_norm': 1.5, 'learning_rate': 1e-05, 'epoch': 0.3}"
    bare = _train(["Training:  30%|###       | 30/100 [00:03<00:07,  1.0it/s]" + glued])
    assert (bare.step, bare.loss, bare.lr, bare.grad_norm) == (30, 0.7, 1e-05, 1.5)
    own = _train(["Training:  30%|###       | 30/100 [00:03<00:07,  1.0it/s, loss=0.5]" + glued])
    assert (own.step, own.loss, own.lr, own.grad_norm) == (30, 0.5, 1e-05, 1.5)


def test_the_loss_plot_keeps_every_point_up_to_its_cap_then_thins() -> None:
    """The loss history for the plot holds MAX_LOSSES points whole; one more halves it
    (every other point), so the plot spans the whole run in bounded memory, and its
    rightmost point is always the loss the panel shows (the newest)."""
    import json

    from tui.state.loganalysis.train import MAX_LOSSES

    lines = [json.dumps({"loss": 1.0 + i / 10000, "learning_rate": 0.001}) for i in range(3 * MAX_LOSSES)]
    assert _train(lines[:MAX_LOSSES]).losses == tuple(1.0 + i / 10000 for i in range(MAX_LOSSES))
    thinned = _train(lines[: MAX_LOSSES + 1]).losses
    assert thinned == tuple(1.0 + i / 10000 for i in range(0, MAX_LOSSES + 1, 2))  # every other point
    for n in (MAX_LOSSES + 2, MAX_LOSSES + 3, 2 * MAX_LOSSES, 3 * MAX_LOSSES):
        tp = _train(lines[:n])
        assert len(tp.losses) <= MAX_LOSSES and tp.losses[-1] == tp.loss == 1.0 + (n - 1) / 10000
        assert tp.losses[0] == 1.0  # the run's start stays on the plot


def test_a_line_without_a_learning_rate_keeps_the_one_shown() -> None:
    """The learning rate from the last metrics line stays on the panel through the lines
    that say something else (an epoch starting, the total of steps)."""
    import json

    metrics = json.dumps({"loss": 0.7, "learning_rate": 2e-05, "epoch": 1.0})
    for other in ("Training epoch 2/3 started", "  Total optimization steps = 1000"):
        assert _train([metrics, other]).lr == 2e-05, other


def test_the_runs_total_follows_once_its_first_epoch_completes() -> None:
    """A trainer that never prints its total of steps (speculators' own loop): once
    epoch 1 of 3 completes at step 40, the run's total is 120, so the panel shows a
    share and an ETA from then on."""
    lines = ["Training epoch 1/3 started", "Step 40 | loss: 0.5", "Training epoch 1/3 completed"]
    tp = _train(lines)
    assert (tp.step, tp.total) == (40, 120), (tp.step, tp.total)
