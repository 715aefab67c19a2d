"""More of the phase lines trainers print (issue 37), beside ``tui/state/loganalysis/train.py``'s
``_PHASE_LINES``: DeepSpeed's, Megatron's and sharded checkpoint saves (saving), and a
step limit reached (finished); and whether an evaluation bar is still open. Apart so the
two tables merge easily; linear (no nested
quantifiers), on the caller's capped line, behind a substring test.
"""

from __future__ import annotations

import re

__all__ = ["in_evaluation", "more_phase"]

_MORE_PHASES = re.compile(
    r"(?P<saving>Saving checkpoint shards|Writing checkpoint shards|Checkpoint \S{1,200} is about to be saved"
    r"|zero checkpoint saved|\bsaving checkpoint at iteration|Saving model checkpoint:)"
    r"|(?P<finished>\[after training is done\]|(?i:training complete)\b"
    r"|(?i:reached max[_ ]?(?:steps|iters?|iterations))"
    r"|max_(?:steps|iters?)(?: ?= ?\d{1,12})? reached|(?i:exiting) after \d{1,12} iterations)"
)
_MORE_WORDS = ("hards", "about to be saved", "checkpoint saved", "checkpoint at iteration", "checkpoint:",
               "after training", "omplete", "max", "xiting")


def more_phase(text: str) -> str | None:
    """ "saving" | "finished" when ``text`` says so in one of these phrasings, else None."""
    if not any(w in text for w in _MORE_WORDS):
        return None
    m = _MORE_PHASES.search(text)
    return m.lastgroup if m else None


def in_evaluation(eval_open: tuple[int, int, int] | None, step: int | None) -> bool:
    """An evaluation bar (``eval_open``: its n, its total, the training step when it
    began) is still short of its total, and the training bar (at ``step``) has not moved
    further than that evaluation's length since it began: Lightning's epoch bar counts
    the validation batches too, and redraws between the validation bar's lines (the
    caller asks only for such an epoch bar: HF Trainer's nameless bar moving again means
    its evaluation is over)."""
    return eval_open is not None and (step is None or step - eval_open[2] <= eval_open[1])
