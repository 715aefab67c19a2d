"""remote/extraction/input.py's batch plan: longest first, and for the hf backend (`fill`)
every batch as large in padded tokens as the first, so short sequences come in fuller
batches; the output keeps the input's numbering whatever the batches (test_extract.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from remote.extraction.common import Sample
from remote.extraction.input import plan_batches


def _samples(lengths: list[int]) -> list[Sample]:
    return [Sample([3] * n, None) for n in lengths]


def test_short_sequences_fill_the_first_batch_size() -> None:
    lengths = [512, 64, 500, 64, 100, 64, 64, 300, 64]
    plan = plan_batches(_samples(lengths), 2, None, fill=True)
    # 2 x 512 padded tokens a batch: 512 500 | 300 100 64 (3 x 300) | 64 64 64 64
    assert plan == [[0, 2], [7, 4, 1], [3, 5, 6, 8]]
    # without fill: 2 sequences a batch, whatever their length
    assert plan_batches(_samples(lengths), 2, None) == [[0, 2], [7, 4], [1, 3], [5, 6], [8]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=60), st.integers(1, 6),
       st.sampled_from([None, 50, 120]))
def test_fill_plan(lengths: list[int], batch_size: int, max_tokens: int | None) -> None:
    samples = _samples(lengths)
    plan = plan_batches(samples, batch_size, max_tokens, fill=True)
    assert sorted(i for b in plan for i in b) == list(range(len(lengths)))
    flat = [i for b in plan for i in b]
    assert flat == sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    budget = batch_size * max(lengths)
    for b, nxt in zip(plan, plan[1:] + [None]):
        width = lengths[b[0]]  # the batch's longest: it is padded to this
        tokens = sum(lengths[i] for i in b)
        if len(b) > 1:
            assert len(b) * width <= budget
            assert max_tokens is None or tokens <= max_tokens
        if nxt is not None:  # cut only when the next sequence does not fit
            n = lengths[nxt[0]]
            assert (len(b) + 1) * width > budget or (
                max_tokens is not None and tokens + n > max_tokens)
    if len(set(lengths)) == 1:  # equal lengths: the same batches as without fill
        assert plan == plan_batches(samples, batch_size, max_tokens)
    assert plan == plan_batches(samples, batch_size, max_tokens, fill=True)
