"""EAGLE-3 hidden-state extraction job: one shippable file, run with the host's Python.

    python extract.py --backend hf|vllm --model DIR --data FILE.jsonl --out DIR
                      [--layers 2,16,29,31] [--raw] [--batch-size N] [--max-seq-len N]
                      [--device cpu|cuda] [--dtype float32|bfloat16] [--tp N]
                      [--preflight] [--shard-delay S]

Input: JSON lines, each {"input_ids": [...]} (optionally with "loss_mask"), or
{"text": "..."}, or {"conversations"|"messages": [{"role", "content"}, ...]}. Text and
chat lines are tokenized with the model's tokenizer and chat template; for chat, the
loss mask marks the tokens of assistant turns.

Layers: layer L means the output of decoder layer L (0-based) *before* the final norm,
the same tensor speculators' worker captures (hidden_states + residual). Default is
speculators 0.3.0's choice: [2, n // 2, n - 3, n - 1] for an n-layer model. An EAGLE-3
drafter trains on exactly 3 aux layers plus the last one (n - 1); any other choice is
refused unless --raw is given.

Output in --out: speculators 0.3.0's own training-data format, which its
scripts/train.py reads as it is (--data-path OUT):
  data_{i}.pt   one per input line, i from 0 in input order; plain torch.save of
      {"input_ids": int64 [seq], "hidden_states": [the layers ascending, each
       [seq, hidden], each on its own storage], "loss_mask": int64 [seq] (the input's,
       else all ones)}
  token_freq.pth  {token id: count} of the tokens whose loss_mask is 1, for
      speculators' scripts/build_vocab_mapping.py --token-freq-path (not named *pt:
      speculators' loader takes every file whose name ends in "pt")
  data_config.json  model, layers, dtype, counts and the file schema (written last:
      its presence = done)
Every file is written to a temp name that does not end in "pt" (data_7.tmp-PID),
fsynced, then renamed. No timestamps anywhere, so a killed-and-resumed run is
byte-identical to an uninterrupted one; a rerun skips batches whose files are all
complete and match the input. Batches group sequences of similar length (less padding);
the files keep the input order. On CUDA the copies to pinned host memory run on a side
stream, overlapped with the next batch's forward, and a pool of writer threads saves
the files.

Progress goes to stdout (flushed), in exactly these forms (the TUI's parser reads them):
  [extract] batch 3/9 | seqs 6/18 | tokens 1536/4608 | 980.3 tok/s | elapsed 0:00:02 | eta 0:00:03
  [extract] batch 3/16 skipped (already done)
  [extract] done: 128 sequences, 32768 tokens in 0:00:21 (1560.2 tok/s) -> /path/data_config.json
The tok/s of the done line counts this run's extracted tokens over the wall time from
the first batch to the last file on disk. The hf backend reports shard loading on
stderr in vLLM's bar format, one line per shard, then `Loading weights took X.XX
seconds`. `--shard-delay S` sleeps S seconds per shard: a demo aid only, so the bar can
be watched on a tiny model.

--backend vllm drives speculators' VllmHiddenStatesGenerator (tensor parallel, --tp).
--preflight checks in seconds, without loading weights, that the installed vLLM and the
speculators generator file fit together; the vllm backend runs it before loading too.

Exit codes: 0 ok, 1 preflight failed, 2 bad input or missing dependency (one line on
stderr), 3 extraction failed.
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import json
import os
import re
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

PREFIX = "[extract]"
BAR_DESC = "Loading safetensors checkpoint shards"
SAMPLE_FILE = "data_%d.pt"
TOKEN_FREQ_FILE = "token_freq.pth"
CONFIG_FILE = "data_config.json"
TMP_RE = re.compile(r"\.tmp-\d+$")
# speculators 0.3.0 batches at most this many sequences and this many tokens
# (max(8192, max_model_len)); more would make vLLM chunk the prefill, which 0.3.0's
# generator silently corrupts (speculators #279).
VLLM_MAX_SEQS = 32
VLLM_MIN_BATCH_TOKENS = 8192
# Batches whose files may still be in the writers' hands; bounds pinned host memory.
IN_FLIGHT = 4


class Fail(Exception):
    """A fatal problem: its message is the one line printed on stderr; `code` the exit."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


# ----------------------------------------------------------------------------- formats


def hms(seconds: float) -> str:
    """0:00:04 — elapsed/eta in the progress lines."""
    s = max(0, int(round(seconds)))
    return "%d:%02d:%02d" % (s // 3600, s // 60 % 60, s % 60)


def tqdm_interval(seconds: float) -> str:
    """MM:SS, or H:MM:SS past an hour — tqdm's format_interval, as vLLM's bar shows it."""
    s = max(0, int(seconds))
    h, m, sec = s // 3600, s // 60 % 60, s % 60
    return "%d:%02d:%02d" % (h, m, sec) if h else "%02d:%02d" % (m, sec)


def shard_bar(n: int, total: int, elapsed: float) -> str:
    """One line of vLLM's shard bar: `<desc>:  37% Completed | 24/64 [00:07<00:12,  3.21it/s]`."""
    pct = 100.0 * n / total if total else 100.0
    rate = n / elapsed if n and elapsed > 0 else None
    if rate is None:
        remaining, rate_s = "?", "?it/s"
    else:
        remaining = tqdm_interval((total - n) / rate)
        rate_s = "%5.2fs/it" % (1.0 / rate) if rate < 1.0 else "%5.2fit/s" % rate
    return "%s: %3.0f%% Completed | %d/%d [%s<%s, %s]" % (
        BAR_DESC, pct, n, total, tqdm_interval(elapsed), remaining, rate_s)


def say(line: str) -> None:
    """A progress line on stdout, flushed so a tailing log sees it at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def note(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


# ----------------------------------------------------------------------------- files


def tmp_path(final: Path) -> Path:
    """data_7.pt -> data_7.tmp-PID: no name ending in "pt" while incomplete (speculators'
    loader takes every such name), and torch.save names the archive inside after the part
    before the last dot, "data_7", as it does for data_7.pt."""
    return final.with_name("%s.tmp-%d" % (final.name.split(".")[0], os.getpid()))


def fsync_path(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temp file in the same directory, fsync, then os.replace."""
    tmp = tmp_path(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)  # make the rename itself durable


def lock_out_dir(out: Path) -> Any:
    """Hold an exclusive lock on OUT for the whole run; remove temp files of dead runs."""
    out.mkdir(parents=True, exist_ok=True)
    fh = open(out / ".extract.lock", "a")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise Fail("another extract.py is writing to %s (lock held)" % out) from None
    for p in out.iterdir():
        if TMP_RE.search(p.name):
            p.unlink()  # left by a killed run; we hold the lock, so nobody is writing it
    return fh


# ----------------------------------------------------------------------------- input


class Sample:
    """One sequence: token ids and an optional loss mask (1 = train on this token)."""

    __slots__ = ("ids", "mask")

    def __init__(self, ids: List[int], mask: Optional[List[int]]) -> None:
        self.ids = ids
        self.mask = mask


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
                           % (where, _one_line(exc))) from None
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
                raise Fail("%s: not valid JSON (%s)" % (where, _one_line(exc))) from None
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
def plan_batches(samples: Sequence[Sample], batch_size: int,
                 max_tokens: Optional[int]) -> List[List[int]]:
    """Batches of sample indexes, at most batch_size sequences / max_tokens tokens each,
    longest sequences first so that each batch holds similar lengths (little padding, and
    an out-of-memory shows at once). Deterministic: a resumed run makes the same batches."""
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i].ids), i))
    out: List[List[int]] = []
    cur: List[int] = []
    tokens = 0
    for i in order:
        n = len(samples[i].ids)
        if cur and (len(cur) >= batch_size or (max_tokens is not None and tokens + n > max_tokens)):
            out.append(cur)
            cur, tokens = [], 0
        cur.append(i)
        tokens += n
    out.append(cur)
    return out


# ----------------------------------------------------------------------------- model config


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
        raise Fail("%s: unreadable: %s" % (cfg_path, _one_line(exc))) from None
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


# ----------------------------------------------------------------------------- backends


class HfBackend:
    """transformers model, weights loaded shard by shard; decoder-layer outputs via hooks."""

    def __init__(self, model_dir: Path, layers: List[int], device: str, dtype: str,
                 shard_delay: float) -> None:
        import torch

        self.torch = torch
        self.model_dir = model_dir
        self.layers = layers
        self.device = device
        self.dtype = getattr(torch, dtype)
        self.shard_delay = shard_delay
        self.model: Any = None

    def shard_files(self) -> List[Path]:
        index = self.model_dir / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise Fail("%s: unreadable: %s" % (index, _one_line(exc))) from None
            names = sorted(set(weight_map.values()))
        elif (self.model_dir / "model.safetensors").is_file():
            names = ["model.safetensors"]
        else:
            raise Fail("%s has no model.safetensors[.index.json]" % self.model_dir)
        files = [self.model_dir / n for n in names]
        for f in files:
            if not f.is_file():
                raise Fail("checkpoint shard missing: %s" % f)
        return files

    def load(self) -> None:
        torch = self.torch
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoModelForCausalLM

        files = self.shard_files()
        config = AutoConfig.from_pretrained(str(self.model_dir))
        with torch.device(self.device):
            model = AutoModelForCausalLM.from_config(config)
        model.to(dtype=self.dtype)
        model.eval()
        wanted = {name for name, _ in model.named_parameters()}
        loaded: set = set()
        unexpected: set = set()
        t0 = time.monotonic()
        note(shard_bar(0, len(files), 0.0))
        for i, path in enumerate(files, 1):
            state = load_file(str(path), device="cpu")
            result = model.load_state_dict(state, strict=False)
            unexpected.update(result.unexpected_keys)
            loaded.update(k for k in state if k not in result.unexpected_keys)
            del state
            if self.shard_delay > 0:
                time.sleep(self.shard_delay)
            note(shard_bar(i, len(files), time.monotonic() - t0))
        missing = sorted(wanted - loaded)
        if missing:
            raise Fail("checkpoint lacks %d parameter(s) of the model, e.g. %s"
                       % (len(missing), missing[0]))
        if unexpected:
            note("%s warning: %d checkpoint tensor(s) unused by the model, e.g. %s"
                 % (PREFIX, len(unexpected), sorted(unexpected)[0]))
        note("Loading weights took %.2f seconds" % (time.monotonic() - t0))
        self.model = model
    def _decoder_layers(self) -> Any:
        base = getattr(self.model, "model", None) or self.model.get_decoder()
        layers = getattr(base, "layers", None)
        if layers is None:
            raise Fail("cannot find the decoder layers of %s" % type(self.model).__name__)
        return base, layers

    def _hook(self) -> None:
        """Forward hooks that keep each chosen decoder layer's output (pre-norm)."""
        self._base, decoder_layers = self._decoder_layers()
        self._captured: Dict[int, Any] = {}
        for L in self.layers:
            def hook(_mod: Any, _inp: Any, out: Any, L: int = L) -> None:
                self._captured[L] = out[0] if isinstance(out, tuple) else out
            decoder_layers[L].register_forward_hook(hook)
        if self.device == "cuda":
            self._copy_stream = self.torch.cuda.Stream()

    def extract(self, batch: Sequence[Sample]) -> Tuple[List[List[Any]], Any]:
        """Per sequence, its layers' [seq, hidden] tensors on the host, each on its own
        storage; plus a CUDA event the host copies complete at (None on CPU)."""
        torch = self.torch
        if not hasattr(self, "_base"):
            self._hook()
        lens = [len(s.ids) for s in batch]
        width = max(lens)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        for row, s in enumerate(batch):
            ids[row, : len(s.ids)] = torch.tensor(s.ids, dtype=torch.long)
        attn = None
        if min(lens) < width:  # right padding: real tokens keep positions 0..n-1
            attn = (torch.arange(width)[None, :] < torch.tensor(lens)[:, None]).long()
            attn = attn.to(self.device)
        self._captured.clear()
        with torch.inference_mode():
            self._base(input_ids=ids.to(self.device), attention_mask=attn, use_cache=False)
        hs = [self._captured.pop(L) for L in self.layers]
        if self.device != "cuda":
            return [[h[row, :n].to(self.dtype).clone() for h in hs]
                    for row, n in enumerate(lens)], None
        # Copy to pinned host memory on a side stream, so the next batch's forward runs
        # while these copies and the writers work.
        side = self._copy_stream
        side.wait_stream(torch.cuda.current_stream())
        out = []
        with torch.cuda.stream(side):
            for row, n in enumerate(lens):
                per = []
                for h in hs:
                    dst = torch.empty((n, h.shape[-1]), dtype=self.dtype, pin_memory=True)
                    dst.copy_(h[row, :n], non_blocking=True)
                    per.append(dst)
                out.append(per)
            for h in hs:
                h.record_stream(side)  # the allocator must not reuse it before the copy
            done = torch.cuda.Event()
            done.record(side)
        return out, done


class VllmBackend:
    """speculators 0.3.0's VllmHiddenStatesGenerator, with its results checked for shape."""

    def __init__(self, model_dir: Path, layers: List[int], hidden: int, dtype: str, tp: int,
                 max_seq_len: int) -> None:
        import torch

        self.torch = torch
        self.model_dir = model_dir
        self.layers = layers
        self.hidden = hidden
        self.dtype = getattr(torch, dtype)
        self.tp = tp
        self.max_seq_len = max_seq_len
        self.gen: Any = None

    def load(self) -> None:
        try:
            from speculators.data_generation.vllm_hidden_states_generator import (
                VllmHiddenStatesGenerator,
            )
        except ImportError as exc:
            raise Fail("the vllm backend needs speculators and vllm: %s" % _one_line(exc)) from None
        # generate() truncates prompts to max_model_len - 1; +1 keeps ours whole.
        self.gen = VllmHiddenStatesGenerator(
            model_path=str(self.model_dir),
            layer_ids=list(self.layers),
            max_model_len=self.max_seq_len + 1,
            tensor_parallel_size=self.tp,
        )
    def extract(self, batch: Sequence[Sample]) -> Tuple[List[List[Any]], Any]:
        results = self.gen.generate([list(s.ids) for s in batch])
        if len(results) != len(batch):
            raise Fail("generator returned %d results for %d sequences"
                       % (len(results), len(batch)), 3)
        out = []
        for j, (res, s) in enumerate(zip(results, batch)):
            got_ids = res["input_ids"].tolist()
            hs = res["hidden_states"]
            # A reply-shape mismatch (the `[0]` of 0.3.0 on vLLM >= 0.11.1) yields token
            # rows instead of layers: refuse it rather than write wrong training data.
            if got_ids != list(s.ids):
                raise Fail("generator result %d is not aligned with its input ids" % j, 3)
            if len(hs) != len(self.layers) or any(
                    tuple(h.shape) != (len(s.ids), self.hidden) for h in hs):
                shapes = [tuple(h.shape) for h in hs][:3]
                raise Fail("generator result %d has layer shapes %s, expected %d x (%d, %d)"
                           % (j, shapes, len(self.layers), len(s.ids), self.hidden), 3)
            # The generator returns each layer cloned to the host (its own storage).
            out.append([_own_storage(h.to("cpu", self.dtype)) for h in hs])
        return out, None


# ----------------------------------------------------------------------------- preflight


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return "%s: %s" % (type(exc).__name__, text[0]) if text else type(exc).__name__


def preflight(generator_file: Optional[str]) -> int:
    """The checks live in preflight.py, shipped beside this file (remote/*.py)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import preflight as checks

    return checks.preflight(generator_file)


# ----------------------------------------------------------------------------- the run


def _own_storage(t: Any) -> Any:
    """`t` alone on its storage: torch.save writes a view's whole storage, and the loader
    estimates each sample's length from its file size."""
    t = t.contiguous()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()
    return t


def _mask(s: Sample) -> List[int]:
    return s.mask if s.mask is not None else [1] * len(s.ids)


def _sample_ok(path: Path, s: Sample, n_layers: int, hidden: int, dtype: Any) -> bool:
    """Is the existing data_{i}.pt complete and made from exactly this sequence?"""
    import torch

    try:
        d = torch.load(str(path), mmap=True, weights_only=True, map_location="cpu")
        if not isinstance(d, dict) or list(d) != ["input_ids", "hidden_states", "loss_mask"]:
            return False
        ids, hs, mask = d["input_ids"], d["hidden_states"], d["loss_mask"]
        n = len(s.ids)
        return (ids.dtype == torch.int64 and ids.tolist() == s.ids
                and mask.dtype == torch.int64 and mask.tolist() == _mask(s)
                and isinstance(hs, list) and len(hs) == n_layers
                and all(h.dtype == dtype and tuple(h.shape) == (n, hidden) for h in hs))
    except Exception:  # unreadable or foreign: recompute it
        return False


def _skip_crc32(torch: Any) -> None:
    """torch.save computes a CRC32 of every record while holding the GIL, which halves
    what the writer threads can save together; torch.load never checks it (torch >= 2.6
    has the switch; older versions keep computing it)."""
    try:
        import torch.utils.serialization as ser

        ser.config.save.compute_crc32 = False
    except (ImportError, AttributeError):
        pass


def _write_sample(path: Path, s: Sample, hidden_states: List[Any], ready: Any) -> None:
    """One data_{i}.pt, as speculators' own generator saves it; runs in a writer thread."""
    import torch

    if ready is not None:
        ready.synchronize()  # the copies to these host tensors are done
    tmp = tmp_path(path)
    torch.save({"input_ids": torch.tensor(s.ids, dtype=torch.int64),
                "hidden_states": hidden_states,
                "loss_mask": torch.tensor(_mask(s), dtype=torch.int64)}, str(tmp))
    fsync_path(tmp)
    os.replace(tmp, path)


def _save_token_freq(path: Path, samples: Sequence[Sample]) -> int:
    """{token id: count} over the tokens whose loss_mask is 1, as speculators'
    save_token_frequency_distribution writes it; keys ascending (byte-stable)."""
    import torch

    counts: collections.Counter[int] = collections.Counter()
    for s in samples:
        counts.update(t for t, m in zip(s.ids, _mask(s)) if m)
    tmp = tmp_path(path)
    torch.save({t: counts[t] for t in sorted(counts)}, str(tmp))
    fsync_path(tmp)
    os.replace(tmp, path)
    return sum(counts.values())


def _data_config(args: argparse.Namespace, model_dir: Path, cfg: Dict[str, Any],
                 layers: List[int], dtype_name: str, samples: Sequence[Sample],
                 truncated: int, masked_tokens: int) -> Dict[str, Any]:
    """What speculators' generator writes as data_config.json, in its layout where the
    fields are the same (no timestamp: the output must be byte-identical across runs)."""
    hidden = cfg["hidden_size"]
    return {
        "version": "2.0",
        "generator": "eagle3-tui remote/extract.py --backend %s" % args.backend,
        "model": {"target_model_path": str(model_dir), "tensor_parallel_size": args.tp,
                  "hidden_size": hidden, "num_hidden_layers": cfg["num_hidden_layers"]},
        "data": {"train_data_path": str(Path(args.data).resolve()),
                 "seq_length": args.max_seq_len, "num_samples": len(samples),
                 "num_tokens": sum(len(s.ids) for s in samples), "truncated": truncated,
                 "loss_mask_from_input": any(s.mask is not None for s in samples)},
        "hidden_states": {"layer_ids": layers, "dtype": dtype_name,
                          "trainable": not args.raw or (
                              len(layers) == 4 and layers[-1] == cfg["num_hidden_layers"] - 1),
                          "description": "decoder-layer outputs before the final norm "
                                         "(hidden + residual): aux layers, then the last"},
        "token_freq": {"file": TOKEN_FREQ_FILE, "masked_tokens": masked_tokens},
        "format": {
            "file_pattern": "data_{idx}.pt",
            "data_format_version": 1,
            "schema": {
                "input_ids": {"dtype": "torch.long", "shape": "[seq_len]"},
                "hidden_states": {"dtype": "list[torch.%s]" % dtype_name,
                                  "shape": "list of [seq_len, %d]" % hidden,
                                  "num_tensors": len(layers)},
                "loss_mask": {"dtype": "torch.long", "shape": "[seq_len]",
                              "description": "1 for tokens to train on (all ones when the "
                                             "input has no loss_mask)"},
            },
        },
    }


def run(args: argparse.Namespace) -> int:
    model_dir = Path(args.model).resolve()
    cfg = read_model_config(model_dir)
    num_layers, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    layers = choose_layers(args.layers, num_layers, args.raw)
    max_seq_len = args.max_seq_len
    samples, truncated = read_dataset(Path(args.data), model_dir, max_seq_len)
    vocab = cfg.get("vocab_size")
    if isinstance(vocab, int):
        for n, s in enumerate(samples, 1):
            big = max(s.ids)
            if big >= vocab:
                raise Fail("%s: sequence %d has token id %d >= vocab size %d"
                           % (Path(args.data).name, n, big, vocab))
    if truncated:
        note("%s %d sequence(s) truncated to --max-seq-len %d" % (PREFIX, truncated, max_seq_len))
    max_tokens = None
    if args.backend == "vllm":
        if args.batch_size > VLLM_MAX_SEQS:
            raise Fail("--batch-size must be <= %d with the vllm backend" % VLLM_MAX_SEQS)
        max_tokens = max(VLLM_MIN_BATCH_TOKENS, max_seq_len + 1)
    plan = plan_batches(samples, args.batch_size, max_tokens)

    out = Path(args.out).resolve()
    lock = lock_out_dir(out)  # noqa: F841  (held until exit)
    try:
        import torch
    except ImportError as exc:
        raise Fail("the %s backend needs torch: %s" % (args.backend, _one_line(exc))) from None
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device == "cuda" or args.backend == "vllm"
    dtype_name = args.dtype or ("bfloat16" if on_gpu else "float32")
    dtype = getattr(torch, dtype_name)

    files = [out / (SAMPLE_FILE % i) for i in range(len(samples))]
    have = {i for i, f in enumerate(files)
            if f.is_file() and _sample_ok(f, samples[i], len(layers), hidden, dtype)}
    todo = {b for b, idx in enumerate(plan) if any(i not in have for i in idx)}
    backend: Any = None
    if todo:
        if args.backend == "hf":
            try:
                import safetensors  # noqa: F401
                import transformers  # noqa: F401
            except ImportError:
                raise Fail("the hf backend needs transformers and safetensors: "
                           "pip install transformers safetensors") from None
            if device == "cuda" and not torch.cuda.is_available():
                raise Fail("--device cuda, but torch sees no CUDA device")
            backend = HfBackend(model_dir, layers, device, dtype_name, args.shard_delay)
        else:
            if not args.skip_preflight and preflight(args.generator_file) != 0:
                return 1
            backend = VllmBackend(model_dir, layers, hidden, dtype_name, args.tp, max_seq_len)
        backend.load()

    total_seqs, total_tokens = len(samples), sum(len(s.ids) for s in samples)
    done = {"seqs": 0, "tokens": 0, "work": 0}
    t_start = time.monotonic()
    n = len(plan)
    # (batch number, its writes); lines are printed in batch order as writes complete.
    pending: Deque[Tuple[int, List[Future]]] = collections.deque()

    def finish_oldest() -> None:
        b, futures = pending.popleft()
        for f in futures:
            try:
                f.result()
            except OSError as exc:
                raise Fail("cannot write %s: %s" % (out, _one_line(exc)), 3) from None
        idx = plan[b]
        tokens = sum(len(samples[i].ids) for i in idx)
        done["seqs"] += len(idx)
        done["tokens"] += tokens
        if b not in todo:
            say("%s batch %d/%d skipped (already done)" % (PREFIX, b + 1, n))
            return
        done["work"] += tokens
        elapsed = time.monotonic() - t_start
        rate = done["work"] / elapsed if elapsed > 0 else 0.0
        eta = (total_tokens - done["tokens"]) / rate if rate > 0 else 0.0
        say("%s batch %d/%d | seqs %d/%d | tokens %d/%d | %.1f tok/s | elapsed %s | eta %s" % (
            PREFIX, b + 1, n, done["seqs"], total_seqs, done["tokens"], total_tokens, rate,
            hms(elapsed), hms(eta)))

    _skip_crc32(torch)
    # Threads blocked in fsync or on a CUDA event hold no GIL: more of them than cores.
    pool = ThreadPoolExecutor(max_workers=max(4, min(32, 2 * (os.cpu_count() or 2))))
    try:
        for b, idx in enumerate(plan):
            futures: List[Future] = []
            if b in todo:
                per_sample, ready = backend.extract([samples[i] for i in idx])
                futures = [pool.submit(_write_sample, files[i], samples[i], hs, ready)
                           for i, hs in zip(idx, per_sample) if i not in have]
            pending.append((b, futures))
            while pending and (len(pending) > IN_FLIGHT
                               or all(f.done() for f in pending[0][1])):
                finish_oldest()
        while pending:
            finish_oldest()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    fsync_path(out)  # the renames of the sample files
    masked = _save_token_freq(out / TOKEN_FREQ_FILE, samples)
    config = _data_config(args, model_dir, cfg, layers, dtype_name, samples, truncated, masked)
    config_path = out / CONFIG_FILE
    atomic_write(config_path, (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())
    elapsed = time.monotonic() - t_start
    rate = done["work"] / elapsed if elapsed > 0 else 0.0
    say("%s done: %d sequences, %d tokens in %s (%.1f tok/s) -> %s"
        % (PREFIX, total_seqs, total_tokens, hms(elapsed), rate, config_path))
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr and exit 2."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        note("%s error: %s (see --help)" % (PREFIX, message))
        sys.exit(2)


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = _Parser(prog="extract.py", description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    p.add_argument("--model", help="model directory (config.json + safetensors)")
    p.add_argument("--data", help="input JSONL")
    p.add_argument("--out", help="output directory")
    p.add_argument("--layers", help="comma-separated layer ids (default: speculators' choice)")
    p.add_argument("--raw", action="store_true",
                   help="write the layers asked for even if they cannot train an EAGLE-3 "
                        "drafter (which needs 3 aux layers + the last)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per forward pass")
    p.add_argument("--max-seq-len", type=int, default=2048, help="truncate longer sequences")
    p.add_argument("--device", choices=("cpu", "cuda"), help="hf backend (default: cuda if any)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="output (and hf compute) dtype; default float32 on CPU, else bfloat16")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel size (vllm backend)")
    p.add_argument("--preflight", action="store_true",
                   help="only check that vLLM and speculators fit together; load nothing")
    p.add_argument("--skip-preflight", action="store_true",
                   help="vllm backend: do not run the preflight checks before loading")
    p.add_argument("--generator-file",
                   help="speculators generator source to check (default: the installed one)")
    p.add_argument("--shard-delay", type=float, default=0.0,
                   help="demo aid: sleep this many seconds per shard while loading (hf)")
    args = p.parse_args(argv)
    if not args.preflight:
        for name in ("model", "data", "out"):
            if not getattr(args, name):
                p.error("--%s is required" % name)
    for name in ("batch_size", "max_seq_len", "tp"):
        if getattr(args, name) < 1:
            p.error("--%s must be at least 1" % name.replace("_", "-"))
    if args.shard_delay < 0:
        p.error("--shard-delay must not be negative")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    try:
        if args.preflight:
            return preflight(args.generator_file)
        return run(args)
    except Fail as exc:
        note("%s error: %s" % (PREFIX, exc))
        return exc.code
    except KeyboardInterrupt:
        note("%s interrupted" % PREFIX)
        return 130


if __name__ == "__main__":
    sys.exit(main())
