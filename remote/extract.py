"""EAGLE-3 hidden-state extraction job: one shippable file, run with the host's Python.

    python extract.py --backend hf|vllm --model DIR --data FILE.jsonl --out DIR
                      [--layers 2,16,29,31] [--batch-size N] [--max-seq-len N]
                      [--device cpu|cuda] [--dtype float32|bfloat16] [--tp N]
                      [--preflight] [--shard-delay S]

Input: JSON lines, each {"input_ids": [...]} (optionally with "loss_mask"), or
{"text": "..."}, or {"conversations"|"messages": [{"role", "content"}, ...]}. Text and
chat lines are tokenized with the model's tokenizer and chat template; for chat, the
loss mask marks the tokens of assistant turns.

Layers: layer L means the output of decoder layer L (0-based) *before* the final norm,
the same tensor speculators' worker captures (hidden_states + residual). Default is
speculators 0.3.0's choice: [2, n // 2, n - 3, n - 1] for an n-layer model.

Output in --out (every file written atomically: temp file, fsync, os.replace):
  batch-00000.safetensors  one per batch (consecutive sequences, deterministic):
      hidden_states  [layers, tokens, hidden]  the batch's sequences concatenated
      input_ids      [tokens]  int64
      seq_lens       [sequences] int64
      loss_mask      [tokens]  uint8, only when some input line has one
  index.json  layers, hidden size, dtype, and per batch its file, first sequence,
              sequence/token counts and sha256 (written last: its presence = done).
No timestamps anywhere, so a killed-and-resumed run is byte-identical to an
uninterrupted one. A rerun skips batches whose file is complete and matches.

Progress goes to stdout (flushed), in exactly these forms (the TUI's parser reads them):
  [extract] batch 3/9 | seqs 6/18 | tokens 1536/4608 | 980.3 tok/s | elapsed 0:00:02 | eta 0:00:03
  [extract] batch 3/16 skipped (already done)
  [extract] done: 128 sequences, 32768 tokens in 0:00:21 (1560.2 tok/s) -> /path/index.json
The hf backend reports shard loading on stderr in vLLM's bar format, one line per shard,
then `Loading weights took X.XX seconds`. `--shard-delay S` sleeps S seconds per shard:
a demo aid only, so the bar can be watched on a tiny model.

--backend vllm drives speculators' VllmHiddenStatesGenerator (tensor parallel, --tp).
--preflight checks in seconds, without loading weights, that the installed vLLM and the
speculators generator file fit together; the vllm backend runs it before loading too.

Exit codes: 0 ok, 1 preflight failed, 2 bad input or missing dependency (one line on
stderr), 3 extraction failed.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

PREFIX = "[extract]"
BAR_DESC = "Loading safetensors checkpoint shards"
INDEX_FORMAT = "eagle3-tui-hidden-states/1"
# speculators 0.3.0 batches at most this many sequences and this many tokens
# (max(8192, max_model_len)); more would make vLLM chunk the prefill, which 0.3.0's
# generator silently corrupts (speculators #279).
VLLM_MAX_SEQS = 32
VLLM_MIN_BATCH_TOKENS = 8192


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


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temp file in the same directory, fsync, then os.replace."""
    tmp = path.with_name(".%s.tmp-%d" % (path.name, os.getpid()))
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(str(path.parent), os.O_RDONLY)
    try:
        os.fsync(dfd)  # make the rename itself durable
    finally:
        os.close(dfd)


def lock_out_dir(out: Path) -> Any:
    """Hold an exclusive lock on OUT for the whole run; remove temp files of dead runs."""
    out.mkdir(parents=True, exist_ok=True)
    fh = open(out / ".extract.lock", "a")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise Fail("another extract.py is writing to %s (lock held)" % out) from None
    for p in out.iterdir():
        if p.name.startswith(".") and ".tmp-" in p.name:
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
                 max_tokens: Optional[int]) -> List[Tuple[int, int]]:
    """Consecutive [start, end) runs of at most batch_size sequences / max_tokens tokens."""
    out: List[Tuple[int, int]] = []
    start, tokens = 0, 0
    for i, s in enumerate(samples):
        over = max_tokens is not None and tokens + len(s.ids) > max_tokens
        full = i - start >= batch_size or over
        if full and i > start:
            out.append((start, i))
            start, tokens = i, 0
        tokens += len(s.ids)
    out.append((start, len(samples)))
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


def choose_layers(spec: Optional[str], num_layers: int) -> List[int]:
    """--layers, or speculators 0.3.0's default [2, n//2, n-3, n-1] clamped and deduped."""
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
        return layers
    picked: List[int] = []
    for L in (2, num_layers // 2, num_layers - 3, num_layers - 1):
        L = min(max(L, 0), num_layers - 1)
        if L not in picked:
            picked.append(L)
    return picked


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

    def extract(self, batch: Sequence[Sample]) -> Any:
        """[layers, tokens, hidden] for the batch's sequences, concatenated in order."""
        torch = self.torch
        base, decoder_layers = self._decoder_layers()
        lens = [len(s.ids) for s in batch]
        width = max(lens)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        for row, s in enumerate(batch):
            ids[row, : len(s.ids)] = torch.tensor(s.ids, dtype=torch.long)
            attn[row, : len(s.ids)] = 1  # right padding: real tokens keep positions 0..n-1
        captured: Dict[int, Any] = {}
        hooks = []
        for L in self.layers:
            def hook(_mod: Any, _inp: Any, out: Any, L: int = L) -> None:
                captured[L] = out[0] if isinstance(out, tuple) else out
            hooks.append(decoder_layers[L].register_forward_hook(hook))
        try:
            with torch.inference_mode():
                base(input_ids=ids.to(self.device), attention_mask=attn.to(self.device),
                     use_cache=False)
        finally:
            for h in hooks:
                h.remove()
        per_layer = []
        for L in self.layers:
            h = captured[L]
            per_layer.append(torch.cat([h[row, :n] for row, n in enumerate(lens)], dim=0))
        return torch.stack(per_layer, dim=0).to("cpu", self.dtype).contiguous()


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

    def extract(self, batch: Sequence[Sample]) -> Any:
        torch = self.torch
        results = self.gen.generate([list(s.ids) for s in batch])
        if len(results) != len(batch):
            raise Fail("generator returned %d results for %d sequences"
                       % (len(results), len(batch)), 3)
        per_seq = []
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
            per_seq.append(torch.stack([h.to("cpu") for h in hs], dim=0))
        return torch.cat(per_seq, dim=1).to(self.dtype).contiguous()


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


def _batch_matches(path: Path, batch: Sequence[Sample], n_layers: int, hidden: int,
                   dtype: Any, with_mask: bool) -> bool:
    """Is the existing batch file complete and made from exactly this batch?"""
    import torch
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            want = {"hidden_states", "input_ids", "seq_lens"}
            if with_mask:
                want.add("loss_mask")
            if keys != want:
                return False
            tokens = sum(len(s.ids) for s in batch)
            hs = f.get_slice("hidden_states")
            if list(hs.get_shape()) != [n_layers, tokens, hidden]:
                return False
            if f.get_tensor("seq_lens").tolist() != [len(s.ids) for s in batch]:
                return False
            if f.get_tensor("input_ids").tolist() != [t for s in batch for t in s.ids]:
                return False
            if with_mask and f.get_tensor("loss_mask").tolist() != _mask_list(batch):
                return False
            return f.get_slice("hidden_states").get_dtype() == _st_dtype(dtype, torch)
    except Exception:  # unreadable or foreign: recompute it
        return False


def _st_dtype(dtype: Any, torch: Any) -> str:
    return {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}[dtype]


def _mask_list(batch: Sequence[Sample]) -> List[int]:
    return [v for s in batch for v in (s.mask if s.mask is not None else [1] * len(s.ids))]


def _serialize(hidden: Any, batch: Sequence[Sample], with_mask: bool) -> bytes:
    import torch
    from safetensors.torch import save

    tensors = {
        "hidden_states": hidden,
        "input_ids": torch.tensor([t for s in batch for t in s.ids], dtype=torch.int64),
        "seq_lens": torch.tensor([len(s.ids) for s in batch], dtype=torch.int64),
    }
    if with_mask:
        tensors["loss_mask"] = torch.tensor(_mask_list(batch), dtype=torch.uint8)
    # One metadata key only: safetensors keeps __metadata__ in a hash map whose order
    # varies between processes, and the output must be byte-identical across runs.
    return save(tensors, metadata={"format": "pt"})


def run(args: argparse.Namespace) -> int:
    model_dir = Path(args.model).resolve()
    cfg = read_model_config(model_dir)
    num_layers, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    layers = choose_layers(args.layers, num_layers)
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
    with_mask = any(s.mask is not None for s in samples)

    out = Path(args.out).resolve()
    lock = lock_out_dir(out)  # noqa: F841  (held until exit)
    try:
        import safetensors  # noqa: F401
        import torch
    except ImportError as exc:
        raise Fail("the %s backend needs torch and safetensors: %s"
                   % (args.backend, _one_line(exc))) from None
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device == "cuda" or args.backend == "vllm"
    dtype_name = args.dtype or ("bfloat16" if on_gpu else "float32")
    dtype = getattr(torch, dtype_name)

    files = [out / ("batch-%05d.safetensors" % i) for i in range(len(plan))]
    todo = [i for i, (a, b) in enumerate(plan) if not (
        files[i].is_file()
        and _batch_matches(files[i], samples[a:b], len(layers), hidden, dtype, with_mask))]
    backend: Any = None
    if todo:
        if args.backend == "hf":
            try:
                import transformers  # noqa: F401
            except ImportError:
                raise Fail("the hf backend needs transformers: pip install transformers") from None
            if device == "cuda" and not torch.cuda.is_available():
                raise Fail("--device cuda, but torch sees no CUDA device")
            backend = HfBackend(model_dir, layers, device, dtype_name, args.shard_delay)
        else:
            if not args.skip_preflight and preflight(args.generator_file) != 0:
                return 1
            backend = VllmBackend(model_dir, layers, hidden, dtype_name, args.tp, max_seq_len)
        backend.load()

    total_seqs, total_tokens = len(samples), sum(len(s.ids) for s in samples)
    done_seqs = done_tokens = work_tokens = 0
    work_time = 0.0
    t_start = time.monotonic()
    entries = []
    n = len(plan)
    for i, (a, b) in enumerate(plan):
        batch = samples[a:b]
        tokens = sum(len(s.ids) for s in batch)
        if i not in todo:
            say("%s batch %d/%d skipped (already done)" % (PREFIX, i + 1, n))
            data = files[i].read_bytes()
        else:
            t0 = time.monotonic()
            hs = backend.extract(batch)
            data = _serialize(hs, batch, with_mask)
            atomic_write(files[i], data)
            work_time += time.monotonic() - t0
            work_tokens += tokens
        done_seqs += len(batch)
        done_tokens += tokens
        entries.append({"file": files[i].name, "first_sequence": a, "sequences": len(batch),
                        "tokens": tokens, "sha256": hashlib.sha256(data).hexdigest()})
        if i in todo:
            rate = work_tokens / work_time if work_time > 0 else 0.0
            eta = (total_tokens - done_tokens) / rate if rate > 0 else 0.0
            say("%s batch %d/%d | seqs %d/%d | tokens %d/%d | %.1f tok/s | elapsed %s | eta %s" % (
                PREFIX, i + 1, n, done_seqs, total_seqs, done_tokens, total_tokens, rate,
                hms(time.monotonic() - t_start), hms(eta)))
    index = {
        "format": INDEX_FORMAT,
        "backend": args.backend,
        "model": str(model_dir),
        "data": str(Path(args.data).resolve()),
        "layers": layers,
        "num_hidden_layers": num_layers,
        "hidden_size": hidden,
        "dtype": dtype_name,
        "batch_size": args.batch_size,
        "max_seq_len": max_seq_len,
        "truncated": truncated,
        "sequences": total_seqs,
        "tokens": total_tokens,
        "loss_mask": with_mask,
        "tensors": {"hidden_states": "[layers, tokens, hidden]", "input_ids": "[tokens] int64",
                    "seq_lens": "[sequences] int64",
                    **({"loss_mask": "[tokens] uint8"} if with_mask else {})},
        "batches": entries,
    }
    index_path = out / "index.json"
    atomic_write(index_path, (json.dumps(index, indent=1, sort_keys=True) + "\n").encode())
    elapsed = time.monotonic() - t_start
    rate = work_tokens / work_time if work_time > 0 else 0.0
    say("%s done: %d sequences, %d tokens in %s (%.1f tok/s) -> %s"
        % (PREFIX, total_seqs, total_tokens, hms(elapsed), rate, index_path))
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
    p.add_argument("--batch-size", type=int, default=8, help="sequences per output file")
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
