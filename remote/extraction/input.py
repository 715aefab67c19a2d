"""extract.py's input side: the JSONL dataset (token ids, text or chat, tokenized with
the model's own tokenizer), the batch plan, the model's config.json and the layer
choice. Stdlib only at import; transformers is imported only for text or chat lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from remote.base.wire import one_line
from remote.extraction.common import Fail, Sample


def _int_list(value: Any, where: str, key: str) -> List[int]:
    if not isinstance(value, list) or not value:
        raise Fail("%s: %r must be a non-empty list of integers" % (where, key))
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise Fail("%s: %r must hold non-negative integers, found %r" % (where, key, v))
    return value


def _messages(value: Any, where: str) -> List[Dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise Fail("%s: conversation must be a non-empty list of {role, content}" % where)
    out = []
    for m in value:
        if not isinstance(m, dict):
            raise Fail("%s: each turn must be an object with role and content" % where)
        # ShareGPT style {"from": "human", "value": ...} is common in EAGLE datasets.
        role = m.get("role", m.get("from"))
        content = m.get("content", m.get("value"))
        role = {"human": "user", "gpt": "assistant"}.get(str(role), role)
        if not isinstance(role, str) or not isinstance(content, str):
            raise Fail("%s: each turn needs string role and content" % where)
        out.append({"role": role, "content": content})
    return out


class Tokenizing:
    """Lazily loads the model's tokenizer, only when a text or chat line needs it."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self._tok: Any = None

    def tok(self, where: str) -> Any:
        if self._tok is None:
            try:
                from transformers import AutoTokenizer
            except ImportError:
                raise Fail("text/chat input needs transformers: pip install transformers") from None
            try:
                self._tok = AutoTokenizer.from_pretrained(str(self.model_dir))
            except Exception as exc:  # any loader fault is a user-facing one-liner
                raise Fail("%s: text input needs the model's tokenizer, which did not load: %s"
                           % (where, one_line(exc))) from None
        return self._tok

    def encode(self, text: str) -> List[int]:
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    def text(self, value: str, where: str) -> Sample:
        tok = self.tok(where)
        ids = list(tok(value)["input_ids"])
        return Sample(ids, None)

    def chat(self, msgs: List[Dict[str, str]], where: str) -> Sample:
        tok = self.tok(where)
        if not getattr(tok, "chat_template", None):
            raise Fail("%s: chat input needs a chat template, and the tokenizer has none" % where)

        def render(part: List[Dict[str, str]], gen: bool) -> str:
            return tok.apply_chat_template(part, tokenize=False, add_generation_prompt=gen)

        full = render(msgs, False)
        ids = self.encode(full)
        if not any(m["role"] == "assistant" for m in msgs):
            return Sample(ids, None)
        mask = [0] * len(ids)
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            # The assistant's tokens are those between the prompt up to this turn (with
            # the generation header) and the conversation through this turn.
            start = len(self.encode(render(msgs[:i], True))) if i else 0
            end = len(self.encode(render(msgs[: i + 1], False)))
            for t in range(start, min(end, len(ids))):
                mask[t] = 1
        return Sample(ids, mask)


def read_dataset(path: Path, model_dir: Path,
                 max_seq_len: Optional[int]) -> Tuple[List[Sample], int]:
    """Parse the JSONL file; returns the samples and how many were truncated."""
    if not path.is_file():
        raise Fail("data file not found: %s" % path)
    tk = Tokenizing(model_dir)
    samples: List[Sample] = []
    truncated = 0
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            where = "%s line %d" % (path.name, n)
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                raise Fail("%s: not valid JSON (%s)" % (where, one_line(exc))) from None
            if not isinstance(obj, dict):
                raise Fail("%s: expected a JSON object" % where)
            if "input_ids" in obj:
                ids = _int_list(obj["input_ids"], where, "input_ids")
                mask = None
                if obj.get("loss_mask") is not None:
                    mask = _int_list(obj["loss_mask"], where, "loss_mask")
                    if len(mask) != len(ids) or any(v not in (0, 1) for v in mask):
                        raise Fail("%s: loss_mask must be 0/1 values, one per input id" % where)
                s = Sample(list(ids), list(mask) if mask else None)
            elif "text" in obj:
                if not isinstance(obj["text"], str) or not obj["text"]:
                    raise Fail("%s: 'text' must be a non-empty string" % where)
                s = tk.text(obj["text"], where)
            elif "conversations" in obj or "messages" in obj:
                key = "conversations" if "conversations" in obj else "messages"
                s = tk.chat(_messages(obj[key], where), where)
            else:
                raise Fail("%s: needs one of input_ids, text, conversations, messages" % where)
            if not s.ids:
                raise Fail("%s: tokenizes to zero tokens" % where)
            if max_seq_len is not None and len(s.ids) > max_seq_len:
                truncated += 1
                s.ids = s.ids[:max_seq_len]
                s.mask = s.mask[:max_seq_len] if s.mask else None
            samples.append(s)
    if not samples:
        raise Fail("%s: no sequences" % path)
    return samples, truncated


def plan_batches(samples: Sequence[Sample], batch_size: int, max_tokens: Optional[int],
                 fill: bool = False) -> List[List[int]]:
    """Batches of sample indexes, longest sequences first so that each batch holds similar
    lengths (little padding, and an out-of-memory shows at once); at most max_tokens
    tokens each. Without `fill`, at most batch_size sequences each. With `fill` (the hf
    backend, which pads each batch to its longest sequence), every batch holds as many
    sequences as fit the first batch's padded size, batch_size x the longest sequence:
    shorter sequences come in more of them, so each forward is as large as the first
    (short ones in batches of batch_size would leave the GPU idle between small
    forwards). Equal lengths give the same batches either way. Deterministic: a resumed
    run makes the same batches; the output files keep the input's numbering."""
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i].ids), i))
    budget = batch_size * len(samples[order[0]].ids) if order else 0
    out: List[List[int]] = []
    cur: List[int] = []
    tokens = width = 0
    for i in order:
        n = len(samples[i].ids)
        if cur:
            if fill:
                full = (len(cur) + 1) * width > budget
            else:
                full = len(cur) >= batch_size
            if full or (max_tokens is not None and tokens + n > max_tokens):
                out.append(cur)
                cur, tokens = [], 0
        if not cur:
            width = n  # the batch's longest: it is padded to this
        cur.append(i)
        tokens += n
    out.append(cur)
    return out


def read_model_config(model_dir: Path) -> Dict[str, Any]:
    """config.json as a dict (text_config merged in for multimodal wrappers)."""
    if not model_dir.is_dir():
        raise Fail("model directory not found: %s" % model_dir)
    cfg_path = model_dir / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise Fail("%s has no config.json" % model_dir) from None
    except (OSError, ValueError) as exc:
        raise Fail("%s: unreadable: %s" % (cfg_path, one_line(exc))) from None
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = dict(cfg, **cfg["text_config"])
    for key in ("num_hidden_layers", "hidden_size"):
        if not isinstance(cfg.get(key), int):
            raise Fail("%s: no integer %s" % (cfg_path, key))
    return cfg


def choose_layers(spec: Optional[str], num_layers: int, raw: bool) -> List[int]:
    """--layers, or speculators 0.3.0's default [2, n//2, n-3, n-1], ascending. Unless
    `raw`, refuse a choice an EAGLE-3 drafter cannot train on: 3 aux layers + the last."""
    if spec:
        try:
            layers = [int(x) for x in spec.split(",") if x.strip()]
        except ValueError:
            raise Fail("--layers must be comma-separated integers, got %r" % spec) from None
        for L in layers:
            if not 0 <= L < num_layers:
                raise Fail("--layers: %d is out of range [0, %d]" % (L, num_layers - 1))
        if not layers or len(set(layers)) != len(layers):
            raise Fail("--layers must name distinct layers")
        what = "--layers %s" % ",".join(str(L) for L in layers)
    else:
        default = [2, num_layers // 2, num_layers - 3, num_layers - 1]
        layers = sorted({min(max(L, 0), num_layers - 1) for L in default})
        what = "this %d-layer model's default layers %s" % (num_layers, default)
    layers = sorted(layers)
    last = num_layers - 1
    if not raw and (len(layers) != 4 or layers[-1] != last):
        raise Fail("%s cannot train an EAGLE-3 drafter, which needs 3 aux layers and the "
                   "last layer (%d), 4 distinct; --raw writes other layers anyway" % (what, last))
    return layers

