"""Training progress from one log line: the main training bar or step counter, the
latest training loss, learning rate, grad norm, throughput, epochs, and the phase words
a trainer prints (evaluating, saving, finished).

Written for the shapes trainers actually print, not for one trainer:

- tqdm bars anywhere in a line (``50/1000 [00:07<00:17,  2.94it/s, loss=9.1]``), with the
  description read for an epoch (``Epoch 3``), a step counter (``step 16/36``) or a loss
  (torchtune's ``1|5|Loss: 1.77``); evaluation bars (``Validating``, ``Evaluating``, …)
  are told apart from the training bar, and loaders' bars are not training at all;
- metric lines in any of the usual spellings: ``{'loss': 0.5, 'grad_norm': 1.2}``,
  ``loss=0.5``, ``loss: 0.5``, ``loss:0.5``, ``train_loss 5.7e-01``, with the step as
  ``step=N``, ``Step N |``, ``iteration N/T``, ``Epoch [e][n/T]`` or ``[e/E][n/T]``;
- the headline loss over its parts: ``loss`` (then ``train_loss``, ``total_loss``, …)
  wins over ``kd_loss``, ``loss_cls``, ``val_loss`` and the like.

``parse_train_line`` is pure and never raises; ``tui.state.loganalysis.fold`` folds its result
into ``LogAnalysis.train`` (see ``fold_train``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from remote.run import diverge
from tui.state.loganalysis.lineshapes import MAX_SCAN, parse_duration
from tui.state.loganalysis.trainphases import more_phase

__all__ = ["TrainLine", "TrainProgress", "arrival_rate", "parse_train_line"]

MAX_LOSSES = 512  # points of loss history kept for the plot (halved when full)

_NUM = r"[-+]?(?:\d{1,40}(?:\.\d{0,40})?|\.\d{1,40})(?:[eE][-+]?\d{1,4})?|[-+]?(?i:nan|inf(?:inity)?)"
# A tqdm bar: "{desc}: {pct}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}{, postfix}]"
# (the bar may be absent: "Epoch 0:  29% 1034/3597 [51:02<2:06:30,  2.96s/it]").
# Runs taken whole ("(?=(?P<x>…))(?P=x)", 3.10 has no possessive +): given back, 50 ms on an 8 KB line.
_BAR = re.compile(
    r"(?P<pct>\d{1,3})%(?:\|(?=(?P<bar>[^|\n]{0,400}))(?P=bar)\||\s)\s*(?P<n>\d{1,12})/(?P<total>\d{1,12})\s*"
    r"\[(?P<elapsed>(?:\d{1,6} days?, )?[\d:]{1,12})<(?P<remaining>(?:\d{1,6} days?, )?[\d:]{1,12}|\?),\s*"
    r"(?P<rate>[^,\]]{0,40})(?:,(?=(?P<postfix>[^\]]{0,2000}))(?P=postfix))?\]"  # each up to its "," or "]"
)
_RATE = re.compile(r"(?P<num>\d+(?:\.\d+)?)(?P<si>[kMG]?)(?P<unit>[A-Za-z]+)/(?P<per>[A-Za-z]+)")
# Bars that are not the training loop: loaders, downloads, dataset passes, inference.
_NOT_TRAIN = re.compile(
    r"(?i)shard|checkpoint|download|fetching|loading|map\b|tokeniz|filter|generat|"
    r"processed prompts|rollout|capturing|extract|convert|upload|writing|reading|preprocess"
)
_EVAL = re.compile(r"(?i)\b(?:val(?:id(?:at(?:e|ing|ion))?)?|eval(?:uat(?:e|ing|ion))?|test(?:ing)?|"
                   r"predict(?:ing|ion)?|detecting|computing|sanity)\b")
_TRAIN_DESC = re.compile(r"(?i)epoch|train|step|iter|loss|batch|fine.?tun|fit")
_BAR_UNITS_OK = ("it", "s", "step", "steps", "batch", "batches", "ba", "iter", "sample", "samples")

# A count written with thousands separators ("iter: 2,800", "Step 1,200/10,000").
_GROUPED = r"\d{1,3}(?:,\d{3}){1,6}(?![\d.]|,\d)"
# key/value pairs: {'loss': 0.5}, loss=0.5, loss: 0.5, loss:0.5, "train_loss 5.7e-01"
# (after the key one separator: ":" or "=" with blanks about it, or blanks alone; then an
# optional quote and "[" each with the blanks after it: no two blank runs side by side)
# (a key starts where its word starts: trying every letter of a long word cost 60 steps each)
_KV = re.compile(
    r"(?<![\w/.\-])(?P<key>[A-Za-z_][\w/.\-]{0,60})['\"]?(?:\s*[:=]|\s)\s*(?:['\"]\s*)?(?:\[\s*)?"
    r"(?P<val>" + _GROUPED + "|"
    + _NUM + r")(?![\w.])(?:\s*/\s*(?P<of>" + _GROUPED + r"|\d{1,15})\b)?"
)
# Cheap first test: a metrics line names a loss, a step, a learning rate or a grad norm.
_TRAIN_WORDS = re.compile(r"(?i)loss|step|iter|\blr\b|learning.rate|grad|epoch|update|\d/\d+ \[[=>.]")
_MULTIWORD = re.compile(r"(?i)\b(grad norm|learning rate|lm loss|total loss|train loss|global step)\b")
# "Epoch [7][5850/32025]", "Epoch(train) [1][250/735]", "[Train] Epoch: [1][371/4899]",
# "| [   2/   3][   500/  1000] |", "Train Epoch: 3 [400/2022 (20%)]"
_BRACKETS = re.compile(
    r"(?:(?i:epoch)(?:\(train\))?:?\s*)?\[\s*(?P<e>\d{1,12})(?:\s*/\s*(?P<es>\d{1,12}))?\s*\]\s*"
    r"\[\s*(?P<n>\d{1,12})\s*/\s*(?P<t>\d{1,12})\s*\]"
    r"|(?i:epoch):?\s*(?P<e2>\d{1,12})\s*\[\s*(?P<n2>\d{1,12})\s*/\s*(?P<t2>\d{1,12})\s*\("
)
# Keras: "1875/1875 [==============================] - 5s 2ms/step - loss: 0.2954"
_KERAS = re.compile(r"(?<!\d)(?P<n>\d{1,12})/(?P<t>\d{1,12}) \[[=>.]{3,}\]")
# ESPnet / FunASR: "1epoch:train:2501-2550batch:2550num_updates:"
_ESPNET = re.compile(r"(?<!\d)(?P<e>\d{1,12})epoch:train:\d{1,12}-(?P<n>\d{1,12})batch")
_TOTAL_STEPS = re.compile(r"(?i)Total (?:optimization|training) steps\s*=\s*(?P<t>[\d,]{1,20})(?![\d,])")
_EPOCHS_OF = re.compile(r"(?i)\bepochs?:?\s*(?P<e>\d{1,12})\s*/\s*(?P<es>\d{1,12})(?!\d)")

_NOT_TRAIN_KEYS = ("val", "eval", "test", "valid")
_LOSS_KEYS = ("loss", "train_loss", "train/loss", "training_loss", "train/loss_step", "train_loss_step",
              "reduced_train_loss", "total_loss", "losses/total_loss", "train/total_loss", "step_loss",
              "lm_loss", "avg_loss")
_STEP_KEYS = ("step", "global_step", "iteration", "iter", "num_updates", "steps", "train/step", "update")
_LR_KEYS = ("lr", "learning_rate", "train/lr", "train/learning_rate", "optim0_lr0", "lr0")
_GNORM_KEYS = ("grad_norm", "gnorm", "train/grad_norm", "grad-norm", "gradnorm")
_EPOCH_KEYS = ("epoch", "train/epoch")

# Lines trainers print when they change what they are doing.
_PHASE_LINES = re.compile(
    r"(?P<evaluating>(?<!\*)\*{3,} Running Evaluation \*{3,}|\bValidation epoch \d+/\d+ started|Running validation\b"
    r"|^Evaluating\b|^---- Evaluating)"
    r"|(?P<saving>Saving model checkpoint to|Started saving checkpoint|[Ss]aving (?:the )?(?:model )?checkpoint"
    r"|Saving model to)"
    r"|(?P<training>Finished saving checkpoint|(?<!\*)\*{3,} Running training \*{3,}"
    r"|Training epoch \d+/\d+ started|OVERFLOW! Rank \d+ Skipping step|Overflow detected\. Skipping step"
    r"|Grad overflow on iteration|Reducing dynamic loss scale)"
    r"|(?P<finished>Training completed\. |'train_runtime'|\btrain_runtime\b|`Trainer\.fit` stopped"
    r"|Training (?:is )?(?:complete|finished|done)\b)"
)
_PHASE_WORDS = ("Evaluat", "alidation", "aving", "Running", "raining", "train_runtime", "Trainer.fit",
                "verflow", "loss scale")
# Frames of a training loop (and autograd's backward, only ever called to train): a
# traceback through one died training, even when no progress line came before it.
_TRAIN_FRAME = re.compile(r'^\s*File ".*", line \d+, in (?:train_one_epoch|train_epoch|_train_epoch|'
                          r"training_step|train_step|_inner_training_loop|run_training_epoch|"
                          r"run_training_batch|_run_train|fit_loop|backward)$")
_SAVE_FRAME = re.compile(r'^\s*File ".*", line \d+, in (?:save|_save|save_checkpoint|_save_checkpoint|'
                         r"save_model|save_pretrained|_save_zero_checkpoint|save_state)$")
# speculators' trainer logs one flattened metrics dict per step ("train/loss_0=…,
# train/loss=…, epoch=0, lr=…"; the step goes only to its tensorboard/wandb backends)
_PER_STEP = re.compile(r"(?:^|[\s,])train/loss=")
# A step counter heading a line of its own, its metrics on the lines after it (Coqui and
# mozilla TTS: "   --> STEP: 10/13 -- GLOBAL_STEP: 25", then "| > loss: 35.6 (36.3)", …;
# "Step 10/13", "=> iteration 5/100"): the line starts with the counter.
_STEP_HEAD = re.compile(r"(?i)^[\s\-=>|*#]*(?:global[_ ])?(?:step|iteration|iter)s?\s*(?:[:=]\s*)?\d+\s*/\s*\d+\b")
_EPOCH_DONE = re.compile(r"Training epoch (?P<e>\d{1,12})/(?P<es>\d{1,12}) (?P<what>started|completed)")


@dataclass(frozen=True)
class TrainLine:
    """What one line says about training (every field optional)."""

    step: int | None = None
    total: int | None = None
    epoch: float | None = None
    epochs: int | None = None
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    rate: float | None = None  # items per second of the main bar
    rate_unit: str | None = None
    elapsed_s: float | None = None
    eta_s: float | None = None
    evaluating: bool = False  # an evaluation pass's bar
    desc: str | None = None  # the bar's description ("" for HF Trainer's nameless bar)
    per_step: bool = False  # a metrics record a trainer prints once per step, without the step
    epoch_done: int | None = None  # "Training epoch N/M completed"
    phase: str | None = None  # "evaluating" | "saving" | "training" | "finished" said in words
    metrics: bool = False  # a training metrics line or the training bar

    @property
    def progress(self) -> bool:
        return self.metrics and (self.step is not None or self.loss is not None)


@dataclass(frozen=True)
class TrainProgress:
    """Everything learned about the training loop so far."""

    step: int | None = None
    total: int | None = None
    epoch: float | None = None
    epochs: int | None = None
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    rate: float | None = None
    rate_unit: str | None = None
    elapsed_s: float | None = None
    eta_s: float | None = None
    losses: tuple[float, ...] = ()  # loss history, at most MAX_LOSSES (thinned by 2 when full)
    lines: int = 0  # metric lines seen (a step count for trainers that print no step)
    epochs_done: int | None = None
    bar: tuple[str, int] | None = None  # (description, total) of the main training bar
    div: diverge.State = diverge.State()  # the divergence check (remote/run/diverge.py, the host's too)
    # an evaluation bar short of its total: (its n, its total, the training step when it began)
    eval_open: tuple[int, int, int] | None = None
    seen: tuple[float, int] | None = None  # (arrival time, step) a rate is measured from
    rate_seen: bool = False  # the rate is measured from the steps' arrival, not printed

    @property
    def seen_training(self) -> bool:
        """Anything learned beyond the divergence check's state (a stop line alone is not)."""
        return replace(self, div=_NO_DIV) != _NOTHING

    @property
    def percent(self) -> float | None:
        if self.step is None or not self.total:
            return None
        return min(100.0, 100.0 * self.step / self.total)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; a non-finite loss is the string "nan" / "inf" / "-inf"."""
        return {
            "step": self.step,
            "total": self.total,
            "loss": _json_num(self.loss),
            "epoch": self.epoch,
            "epochs": self.epochs,
            "lr": self.lr,
            "grad_norm": _json_num(self.grad_norm),
            "rate": self.rate,
            "rate_unit": self.rate_unit,
            "elapsed_s": self.elapsed_s,
            "eta_s": self.eta_s,
            "losses": [_json_num(x) for x in self.losses],
        }


_NO_DIV = diverge.State()
_NOTHING = TrainProgress()


def _json_num(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _num(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _rate(text: str) -> tuple[float | None, str | None]:
    m = _RATE.fullmatch(text.strip())
    if not m:
        return None, None
    value = float(m["num"]) * {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9}[m["si"]]
    if m["per"] == "s":
        return value, m["unit"]
    if m["unit"] == "s" and value > 0:  # "18.0s/it": seconds per item
        return 1.0 / value, m["per"]
    return None, None


def _pairs(text: str) -> dict[str, tuple[float, int | None]]:
    """Lower-cased key -> (value, "/N" total if written). The first occurrence wins."""
    text = _MULTIWORD.sub(lambda m: m.group(1).replace(" ", "_"), text)
    out: dict[str, tuple[float, int | None]] = {}
    for m in _KV.finditer(text):
        key = m["key"].lower()
        val = _num(m["val"])
        if val is None or key in out:
            continue
        out[key] = (val, int(m["of"].replace(",", "")) if m["of"] else None)
    return out


def _headline_loss(pairs: dict[str, tuple[float, int | None]]) -> float | None:
    for k in _LOSS_KEYS:
        if k in pairs:
            return pairs[k][0]
    return None


def _first(pairs: dict[str, tuple[float, int | None]], keys: tuple[str, ...]) -> tuple[float, int | None] | None:
    """The first of ``keys`` present, preferring one written with its total ("iteration
    99/4999" over "global_step: 99"); then any namespaced spelling ("actor/lr")."""
    found = [pairs[k] for k in keys if k in pairs]
    for v in found:
        if v[1] is not None:
            return v
    if found:
        return found[0]
    for k, v in pairs.items():
        if "/" in k and k.rsplit("/", 1)[1] in keys and not k.startswith(_NOT_TRAIN_KEYS):
            return v
    return None


def _bar(text: str) -> TrainLine | None:
    """The last training or evaluation bar of a line (a line may hold several redraws)."""
    found: TrainLine | None = None
    start = 0
    for m in _BAR.finditer(text):
        desc = text[start : m.start()]
        start = m.end()
        # the description is what follows the previous bar's "]" (or a "#015"/"|" artefact)
        desc = re.split(r"\]|#015", desc)[-1].strip().rstrip(":").strip()
        rate, unit = _rate(m["rate"]) if m["rate"] else (None, None)
        if unit is not None and unit not in _BAR_UNITS_OK and not unit.startswith("epoch"):
            continue  # a download (B/s), a dataset map (examples/s), tokens
        if desc and _NOT_TRAIN.search(desc) and not re.search(r"(?i)\bepoch\b", desc):
            continue
        post = m["postfix"] or ""
        if desc and _EVAL.search(desc) and not re.search(r"(?i)\bepoch\b", desc):
            found = TrainLine(step=int(m["n"]), total=int(m["total"]), evaluating=True)
            continue
        if desc and not _TRAIN_DESC.search(desc) and not re.search(r"(?i)loss", post):
            continue  # some other named bar
        n = int(m["n"])
        total: int | None = int(m["total"])
        pairs = _pairs(desc + " " + post)
        epoch: float | None = None
        epochs: int | None = None
        if unit is not None and unit.startswith("epoch"):  # an outer bar counting epochs
            found = TrainLine(epoch=float(n), epochs=total, metrics=True,
                              phase="finished" if total and n >= total else None)
            continue
        tt = re.match(r"\s*(\d{1,12})\|(\d{1,12})\|Loss:\s*(" + _NUM + ")", desc)  # torchtune
        if tt:
            epoch, n = float(tt.group(1)), int(tt.group(2))
            total = total if total is not None and n <= total else None
            loss: float | None = _num(tt.group(3))
        else:
            loss = _headline_loss(pairs)
        em = re.search(r"(?i)\bepoch:?\s*(\d{1,12})(?!\d)(?:\s*/\s*(\d{1,12})(?!\d))?", desc)
        if em:
            epoch = float(em.group(1))
            epochs = int(em.group(2)) if em.group(2) else None
        sm = re.search(r"(?i)\bstep\s+(\d{1,12})\s*/\s*(\d{1,12})(?!\d)", desc)
        if sm:
            n, total = int(sm.group(1)), int(sm.group(2))
        lr = _first(pairs, _LR_KEYS)
        gn = _first(pairs, _GNORM_KEYS)
        found = TrainLine(
            step=n, total=total, epoch=epoch, epochs=epochs, loss=loss,
            lr=lr[0] if lr else None, grad_norm=gn[0] if gn else None,
            rate=rate, rate_unit=unit, elapsed_s=parse_duration(m["elapsed"]),
            eta_s=parse_duration(m["remaining"]), metrics=True, desc=desc,
        )
    return found


def _metrics(text: str) -> TrainLine | None:
    """A metrics line: a headline training loss, or a step with a learning rate / grad norm."""
    pairs = _pairs(text)
    if not pairs:
        return None
    if any(k.startswith(("eval_", "eval/", "val_", "val/", "test_")) for k in pairs) and not any(
            k in pairs for k in _LOSS_KEYS if k != "loss"):
        if "loss" not in pairs or any(k.startswith(("eval_", "eval/")) for k in pairs):
            return TrainLine(phase="evaluating")
    loss = _headline_loss(pairs)
    stepv = _first(pairs, _STEP_KEYS)
    lr = _first(pairs, _LR_KEYS)
    gn = _first(pairs, _GNORM_KEYS)
    counter = stepv is not None and stepv[1] is not None and loss is None and lr is None and gn is None
    if counter and not _STEP_HEAD.search(text):
        return None
    if loss is None and not counter and not (stepv is not None and (lr is not None or gn is not None)):
        if lr is not None and stepv is None and text[:12].isspace():
            # the tail of a record rich wrapped over several lines ("epoch=0, lr=0.003")
            return TrainLine(lr=lr[0])
        return None
    step = int(stepv[0]) if stepv is not None and stepv[0] >= 0 and float(stepv[0]).is_integer() else None
    total = stepv[1] if stepv is not None else None
    ep = _first(pairs, _EPOCH_KEYS)
    epoch = ep[0] if ep is not None and math.isfinite(ep[0]) else None
    epochs = ep[1] if ep is not None else None
    bm = _BRACKETS.search(text) or None
    if bm is not None:
        if bm["n"] is not None:
            epoch, step, total = float(bm["e"]), int(bm["n"]), int(bm["t"])
            epochs = int(bm["es"]) if bm["es"] else epochs
        else:
            epoch, step, total = float(bm["e2"]), int(bm["n2"]), int(bm["t2"])
    kb = _KERAS.search(text) if bm is None else None
    if kb is not None:
        step, total = int(kb["n"]), int(kb["t"])
    es = _ESPNET.search(text)
    if es is not None:
        epoch, step = float(es["e"]), int(es["n"])
    if epochs is None:
        eo = _EPOCHS_OF.search(text)
        if eo is not None:
            epochs = int(eo["es"])
    return TrainLine(step=step, total=total, epoch=epoch, epochs=epochs, loss=loss,
                     lr=lr[0] if lr else None, grad_norm=gn[0] if gn else None, metrics=True)


def parse_train_line(msg: str) -> TrainLine | None:
    """What ``msg`` (a line without its vLLM prefix) says about training, or None."""
    text = msg[:MAX_SCAN]
    if "#015" in text:  # carriage returns written out as text by some log collectors
        text = text.replace("#033[A", "")
    if "\\|" in text:  # pipes escaped by a markdown table
        text = text.replace("\\|", "|")
    phase = None
    if any(w in text for w in _PHASE_WORDS):
        pm = _PHASE_LINES.search(text)
        if pm:
            phase = pm.lastgroup
    if phase is None:
        phase = more_phase(text)
    tl = _bar(text) if "%" in text and "/" in text and "[" in text else None
    if tl is None and phase != "evaluating" and _TRAIN_WORDS.search(text):
        head = _BAR.search(text) if "%" in text else None
        tail = text[head.end():] if head is not None else text
        tl = _metrics(tail) if any(c.isdigit() for c in tail) else None
        if tl is not None and head is not None and tl.phase is None:
            tl = None if not tl.metrics else tl
    elif tl is not None and not tl.evaluating:
        # a bar with a metrics line glued after it (a logger writing while tqdm redraws)
        after = text[text.rfind("]") + 1:]
        extra = _metrics(after) if _TRAIN_WORDS.search(after) and any(c.isdigit() for c in after) else None
        if extra is not None and extra.metrics:
            tl = replace(tl, loss=tl.loss if tl.loss is not None else extra.loss,
                         lr=tl.lr if tl.lr is not None else extra.lr,
                         grad_norm=tl.grad_norm if tl.grad_norm is not None else extra.grad_norm)
    if phase is not None:
        if tl is None:
            tl = TrainLine(phase=phase)
        elif tl.phase is None:
            tl = replace(tl, phase=phase)
    if tl is None:
        ts = _TOTAL_STEPS.search(text)
        if ts:
            return TrainLine(total=int(ts["t"].replace(",", "")))
    ed = _EPOCH_DONE.search(text) if "Training epoch" in text else None
    if ed:
        done = int(ed["e"]) if ed["what"] == "completed" else None
        return TrainLine(epoch=float(ed["e"]), epochs=int(ed["es"]), epoch_done=done, phase="training")
    if tl is not None and tl.metrics and tl.step is None and _PER_STEP.search(text):
        tl = replace(tl, per_step=True)
    return tl


def is_save_frame(msg: str) -> bool:
    """A traceback frame inside a checkpoint save (``torch.save``, ``save_checkpoint``)."""
    return "File" in msg and _SAVE_FRAME.match(msg) is not None


def is_train_frame(msg: str) -> bool:
    """A traceback frame inside the training loop (``train_one_epoch``, ``backward``)."""
    return "File" in msg and _TRAIN_FRAME.match(msg) is not None


def second_bar(tp: TrainProgress | None, tl: TrainLine) -> TrainLine:
    """A nameless bar with a smaller total than the nameless training bar already seen is
    the evaluation loop's (HF Trainer draws both without a description)."""
    if (tp is not None and tp.bar is not None and tl.desc == "" and tp.bar[0] == "" and tl.total
            and tl.total < tp.bar[1] and tl.loss is None):
        return TrainLine(step=tl.step, total=tl.total, evaluating=True)
    return tl


def arrival_rate(tp: TrainProgress, t: float) -> TrainProgress:
    """For a trainer that prints no rate (speculators' prints none): steps per second from
    when the steps arrived, since the last step of the first lines that arrived together
    (the backlog read on attaching says nothing about the pace); a step counter that
    starts again (a new epoch) starts the measure again and keeps the last rate."""
    if tp.step is None or (tp.rate is not None and not tp.rate_seen):
        return tp
    if tp.seen is None or t <= tp.seen[0] or tp.step < tp.seen[1]:
        return replace(tp, seen=(t, tp.step))
    t0, s0 = tp.seen
    if tp.step == s0:
        return tp
    return replace(tp, rate=(tp.step - s0) / (t - t0), rate_unit="step", rate_seen=True)


def merge(tp: TrainProgress | None, tl: TrainLine, line_no: int, line: str) -> TrainProgress:
    """Fold one line's training facts into the progress so far."""
    tp = tp or TrainProgress()
    ch: dict[str, Any] = {}
    if tl.total is not None and tl.step is None and not tl.metrics:
        ch["total"] = tl.total  # "Total optimization steps = 1000"
    if tl.epochs is not None:
        ch["epochs"] = tl.epochs
    if tl.lr is not None and not tl.metrics:
        ch["lr"] = tl.lr
    if tl.epoch_done is not None:
        ch["epochs_done"] = tl.epoch_done
        if tp.step is not None and tl.epochs and tl.epoch_done > 0 and tp.total is None:
            # steps per epoch are known once one has run: the whole run's total follows
            ch["total"] = tp.step * tl.epochs // tl.epoch_done
    elif tl.epoch is not None and not tl.metrics:
        ch["epoch"] = tl.epoch  # "Training epoch 2/3 started"
    if tl.evaluating and tl.step is not None and tl.total:
        began = tp.eval_open[2] if tp.eval_open is not None else tp.step or 0
        ch["eval_open"] = (tl.step, tl.total, began) if tl.step < tl.total else None
    if tl.metrics and not tl.evaluating:
        if tl.desc is not None and tl.total is not None and tp.bar is None:
            ch["bar"] = (tl.desc, tl.total)
        if tl.step is not None:
            ch["step"] = tl.step
            if tl.total is not None:
                ch["total"] = tl.total
            elif tp.total is not None and tl.step > tp.total:
                ch["total"] = None
        elif tl.loss is not None:
            ch["lines"] = tp.lines + 1
            if tl.per_step:
                ch["step"] = (tp.step or 0) + 1
        if tl.epoch is not None and not tl.per_step:
            ch["epoch"] = tl.epoch
        for k in ("lr", "grad_norm", "rate", "rate_unit", "elapsed_s", "eta_s"):
            v = getattr(tl, k)
            if v is not None:
                ch[k] = v
        if tl.rate is not None:
            ch["rate_seen"] = False  # the trainer's own rate from now on
        if tl.loss is not None:
            ch["loss"] = tl.loss
            losses = tp.losses + (tl.loss,)
            if len(losses) > MAX_LOSSES:  # every other point, ending on the newest one
                losses = losses[(len(losses) - 1) % 2 :: 2]
            ch["losses"] = losses
    return replace(tp, **ch) if ch else tp
