"""A training run that has diverged, told from its look-alikes, one log line at a time.

One fold, ``fold(state, line, line_no)``, read by both sides so they agree on every line:
the host's pace (remote/run/pace.py, in the supervisor shim, with no client connected: what
``[watch] on_diverge`` acts on) and the client's log analysis (tui/state/logparse.py:
the failure, its root cause quoted). A verdict is one of these, each with the line that
began it:

- ``training-diverged``: ``NAN_STREAK`` metric lines in a row whose training loss or grad
  norm is non-finite, under any name (``{'loss': nan}``, ``loss=nan`` in a tqdm postfix,
  ``'loss': tensor(nan, device='cuda:0')``, ``kd_loss: inf``, ``grad norm: nan``, "loss
  is nan"); a finite one in between starts the count again (one overflow that the loss
  scaler skips prints one NaN line, and recovers);
- ``loss-nan-stopped``: the trainer itself says it stops on a non-finite loss ("Loss is
  nan, stopping training", Keras' "Invalid loss, terminating training", Megatron's
  "found NaN in local grad norm", autograd's anomaly check); ``loss-scale-minimum``:
  it stops because the loss scale cannot go lower (fairseq's "Minimum loss scale
  reached", DeepSpeed's "Current loss scale already at minimum");
- ``loss-scale-underflow``: a dynamic loss scale lowered below 1 (apex's "reducing loss
  scale to 0.0": below 1 the unscaled gradients themselves overflow fp16), or
  ``OVERFLOW_STREAK`` skip-step overflows of one rank with no finite training loss
  between: from the largest initial scale in use (2**32, DeepSpeed's
  ``initial_scale_power`` at most 32) that many halvings leave a scale of at most 1.

Not divergence (the traps): NaN/inf in evaluation metrics only (``eval_loss``,
``val/loss``, ``test_loss``), a few overflows that recover, a warning about NaN inputs
(no loss or grad norm is named), a ``train_runtime`` summary's mean loss.

Linear and bounded: every regex runs on the first ``SCAN`` characters of a line, with no
nested or adjacent overlapping quantifiers; a cheap substring test first. The state is an
immutable tuple: the client's analysis keeps it in a frozen record. Stdlib only, 3.9+.
"""

import re
from typing import Any, Dict, NamedTuple, Optional, Tuple

NAN_STREAK = 3
OVERFLOW_STREAK = 32
SCAN = 2048  # characters of a line examined
KEEP = 500  # characters of the quoted line

# key: value pairs whose key names a loss or a grad norm ("[Loss] nan" and
# "----loss----:" too); the value may be a tensor repr
_PAIR = re.compile(
    r"""(?i)(?<![\w/.])['"]?(?P<key>[a-z][\w/.-]{0,48})['"\]]?(?:\s{0,3}[:=]\s{0,3}|\s{1,3})(?:tensor\()?['"]?"""
    r"""(?P<val>[-+]?(?:nan|inf(?:inity)?|\d{1,30}(?:\.\d{0,30})?(?:e[-+]?\d{1,4})?|\.\d{1,30}))(?![\w.])""")
# multi-word metric names made one key ("grad norm: nan", "lm loss: inf")
_WORDS = re.compile(r"(?i)\b(grad(?:ient)?|lm|total|train|training|global) (norm|loss)\b")
_NORM_KEYS = ("grad_norm", "gnorm", "grad-norm", "gradnorm", "gradient_norm", "grad_norm_total", "total_norm")
_EVAL_PARTS = frozenset(("val", "eval", "test", "valid", "validation", "dev", "evaluation"))
_PARTS = re.compile(r"[/_.-]")
# "loss is nan" said in words (a bad line), and the trainer's own stop
_SAID = re.compile(r"(?i)\bloss (?:is|was|became|becomes) (?:nan|inf|-inf)\b")
_STOP = re.compile(
    r"(?i)\bloss (?:is|was|became) (?:nan|inf|-inf)\b[,.;:]? {0,3}(?:stopping|terminating|aborting|exiting)"
    r"|invalid loss, terminating training|(?P<min>minimum loss scale reached|current loss scale already at minimum)"
    r"|found nan in (?:local )?grad(?:ient)? norm|returned nan values in its \d{1,3}(?:st|nd|rd|th) output")
# a dynamic loss scale lowered: apex, DeepSpeed, fairseq, Megatron
_SCALE = re.compile(
    r"(?i)(?:reducing (?:loss scale )?to|setting loss scale to|loss scale (?:reduced|decreased|lowered) to"
    r"|reducing dynamic loss scale from [\d.e+-]{1,24} to):?\s{0,3}(?P<v>\d{1,30}(?:\.\d{0,30})?(?:e[-+]?\d{1,4})?)")
# one skipped step: DeepSpeed, apex, fairseq, Megatron/NeMo
_OVERFLOW = re.compile(
    r"(?i)overflow!? (?:rank (?P<rank>\d{1,6}) )?skipping step|gradient overflow|grad overflow on iteration"
    r"|overflow detected\. skipping|found inf or nan in grad")
PATTERNS = (_PAIR, _WORDS, _SAID, _STOP, _SCALE, _OVERFLOW)  # every regex here (tests check them linear)
_STOP_WORDS = ("stopping", "terminat", "aborting", "exiting", "minimum", "found nan", "returned nan")
_CHEAP = ("nan", "inf", "overflow", "scale", "invalid loss")  # in the lower-cased line, "info" taken out
_SUMMARY = ("train_runtime",)  # HF Trainer's closing summary: its train_loss is the run's mean


class State(NamedTuple):
    """What the fold remembers between lines."""

    bad: int = 0  # metric lines in a row with a non-finite training loss / grad norm
    bad_first: Optional[Tuple[int, str]] = None  # (line_no, line) where that run began
    over: int = 0  # skip-step overflows since the last finite training loss
    over_first: Optional[Tuple[int, str]] = None
    over_rank: Optional[str] = None  # the rank whose overflows count (each rank prints its own)
    verdict: Optional[Tuple[str, str, int, str]] = None  # (id, why, line_no, line), once diverged
    loss_bad_at: Optional[int] = None  # the last line whose training loss itself was non-finite

    def to_dict(self) -> Optional[Dict[str, Any]]:
        """The verdict as JSON ({"id", "why", "line_no", "line"}), or None."""
        if self.verdict is None:
            return None
        sid, why, line_no, line = self.verdict
        return {"id": sid, "why": why, "line_no": line_no, "line": line}


def _training_key(key: str) -> Optional[str]:
    """"loss" | "norm" for a training loss / grad norm key, else None."""
    k = key.lower()
    parts = _PARTS.split(k)
    if any(p in _EVAL_PARTS for p in parts) or k.startswith(("val", "eval")):
        return None
    if k in _NORM_KEYS or k.endswith(("/grad_norm", "/gnorm")):
        return "norm"
    return "loss" if "loss" in k else None


def look(line: str, want_good: bool = True) -> Tuple[str, str]:
    """What one line says: ("stop" | "minimum", why), ("scale", why) a scale below 1, ("overflow",
    rank or ""), ("bad-loss" | "bad", what) a non-finite loss / only a non-finite grad
    norm, ("good", "") a finite training loss or grad norm (looked
    for only when ``want_good``), or ("", "") for nothing."""
    text = line[:SCAN]
    low = text.lower()
    if "info" in low:
        low = low.replace("info", "")
    if not any(w in low for w in _CHEAP) and not (want_good and ("loss" in low or "norm" in low)):
        return "", ""
    m = _STOP.search(text) if any(w in low for w in _STOP_WORDS) else None
    if m:
        return ("minimum" if m.group("min") else "stop"), "the trainer stopped: %s" % m.group(0)
    m = _SCALE.search(text) if "scale" in low else None
    if m:
        try:
            v = float(m.group("v"))
        except ValueError:
            v = 1.0
        if v < 1.0:
            return "scale", "the loss scale fell to %s" % m.group("v")
    m = _OVERFLOW.search(text) if "overflow" in low or "inf or nan" in low else None
    if m:
        return "overflow", m.group("rank") or ""
    if any(s in text for s in _SUMMARY):
        return "", ""
    if "loss" not in low and "norm" not in low:
        return "", ""
    said = _SAID.search(text)
    text = _WORDS.sub(lambda w: w.group(1) + "_" + w.group(2), text) if " " in text else text
    bad, good = [], False
    for p in _PAIR.finditer(text):
        kind = _training_key(p.group("key"))
        if kind is None:
            continue
        val = p.group("val").lower().lstrip("+-")
        if val.startswith(("nan", "inf")):
            bad.append("%s%s %s" % ("" if kind == "loss" else "~", p.group("key"), p.group("val")))
        else:
            good = True
    if not bad and said:
        bad.append("loss is non-finite")
    if bad:  # "bad-loss" when the loss itself is non-finite (not only a grad norm)
        kind = "bad-loss" if any(not b.startswith("~") for b in bad) else "bad"
        return kind, ", ".join(b.lstrip("~") for b in bad[:3])
    return ("good", "") if good else ("", "")


def fold(state: State, line: str, line_no: int) -> State:
    """``state`` after one line; the same object when the line changes nothing."""
    if state.verdict is not None:
        return state
    kind, what = look(line, bool(state.bad or state.over))
    if not kind:
        return state
    quoted = line[:KEEP]
    if kind in ("stop", "scale", "minimum"):
        sid = {"stop": "loss-nan-stopped", "scale": "loss-scale-underflow", "minimum": "loss-scale-minimum"}[kind]
        bad_at = line_no if kind == "stop" and "loss" in what.lower() else state.loss_bad_at
        return state._replace(verdict=(sid, what, line_no, quoted), loss_bad_at=bad_at)
    if kind == "overflow":
        if state.over_rank is not None and what != state.over_rank:
            return state  # another rank's line for the same step
        first = state.over_first if state.over_first is not None and state.over else (line_no, quoted)
        over = state.over + 1
        if over >= OVERFLOW_STREAK:
            why = "%d skipped steps in a row (fp16 overflow), no finite loss between" % over
            return state._replace(over=over, over_first=first,
                                  verdict=("loss-scale-underflow", why, first[0], first[1]))
        return state._replace(over=over, over_first=first, over_rank=what)
    if kind in ("bad", "bad-loss"):
        if kind == "bad-loss":
            state = state._replace(loss_bad_at=line_no)
        first = state.bad_first if state.bad_first is not None and state.bad else (line_no, quoted)
        bad = state.bad + 1
        if bad >= NAN_STREAK:
            why = "non-finite on %d metric lines in a row (%s)" % (bad, what)
            return state._replace(bad=bad, bad_first=first, verdict=("training-diverged", why, first[0], first[1]))
        return state._replace(bad=bad, bad_first=first)
    if state.bad or state.over:  # a finite training loss / grad norm: both counts start again
        return State()
    return state
