"""extract.py's transformers backend: the model built from its config and loaded shard
by shard (vLLM's bar on stderr), forward hooks on the chosen decoder layers, and on CUDA
each batch's layers copied to pinned host memory on a side stream while the next batch
runs. Stdlib only at import; torch and transformers are imported when it is used."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from remote.base.wire import one_line
from remote.extraction.common import PREFIX, Fail, Sample, note, shard_bar


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
        # Elements of every pinned host buffer: all of one size, so that torch's host
        # allocator (which keeps freed buffers by size, rounded up to a power of two)
        # reuses them for batches of any width instead of pinning new memory.
        self._host_numel = 0

    def shard_files(self) -> List[Path]:
        index = self.model_dir / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise Fail("%s: unreadable: %s" % (index, one_line(exc))) from None
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

    def warm_up(self, batch: Sequence[Sample], buffer_sets: int) -> None:
        """On CUDA, one untimed pass over `batch` (the first batch: the longest) and
        `buffer_sets` batches' worth of pinned host buffers put in torch's host cache: a
        fresh process's first batches otherwise pay for CUDA library start-up and
        cudaHostAlloc inside the measured run."""
        torch = self.torch
        if self.device != "cuda":
            return
        t0 = time.monotonic()
        out, done = self.extract(batch)
        done.synchronize()
        shape = (len(batch), max(len(s.ids) for s in batch), out[0][0].shape[-1])
        del out
        self._host_numel = max(self._host_numel, shape[0] * shape[1] * shape[2])
        spare = [torch.empty(self._host_numel, dtype=self.dtype, pin_memory=True)
                 for _ in range(buffer_sets * len(self.layers))]
        del spare  # back to the host allocator's cache, reused by the batches
        torch.cuda.synchronize()
        note("%s warm-up pass (batch of %d x %d tokens) took %.2f seconds"
             % (PREFIX, shape[0], shape[1], time.monotonic() - t0))

    def _to_device(self, t: Any) -> Any:
        """On CUDA through pinned memory without blocking: a pageable copy waits for the
        GPU to finish everything queued, so the CPU could not queue the next batch."""
        if self.device != "cuda":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    def _mask(self, lens: List[int], width: int) -> Any:
        """The batch's attention mask, already 4-D [batch, 1, query, key] (causal, and
        right padding masked out), built on the device from the lengths. transformers
        takes a 4-D mask as it is; from a 2-D mask or none it would read the GPU's data
        back to decide its mask (the packed-sequence check on position_ids, the
        all-ones test on the padding mask): a sync per batch. Only for the sdpa and
        eager attentions; others get the 2-D mask (or none without padding)."""
        torch = self.torch
        impl = getattr(self.model.config, "_attn_implementation", None)
        if impl not in ("sdpa", "eager"):
            if min(lens) == width:
                return None
            pad = (torch.arange(width)[None, :] < torch.tensor(lens)[:, None]).long()
            return self._to_device(pad)
        n = self._to_device(torch.tensor(lens, dtype=torch.long))
        pos = torch.arange(width, device=self.device)
        causal = pos[None, :] <= pos[:, None]  # [query, key]
        keep = causal[None, None] & (pos[None, :] < n[:, None])[:, None, None, :]
        if impl == "sdpa":
            return keep
        return torch.zeros(keep.shape, dtype=self.dtype, device=self.device).masked_fill(
            ~keep, torch.finfo(self.dtype).min)

    def extract(self, batch: Sequence[Sample]) -> Tuple[List[List[Any]], Any]:
        """Per sequence, its layers' [seq, hidden] contiguous tensors on the host; plus a
        CUDA event the host copies complete at (None on CPU). The batch is padded on the
        right to its longest sequence."""
        torch = self.torch
        lens = [len(s.ids) for s in batch]
        width = max(lens)
        ids = torch.tensor([s.ids + [0] * (width - len(s.ids)) for s in batch],
                           dtype=torch.long)
        hs = self.forward(self._to_device(ids), self._mask(lens, width))
        return self.to_host(hs, [(row, 0, n) for row, n in enumerate(lens)])

    def forward(self, ids: Any, mask: Any, position_ids: Any = None) -> List[Any]:
        """The chosen layers' outputs [rows, width, hidden] of one forward pass of `ids`
        (on the device) with the attention `mask` (see _mask)."""
        torch = self.torch
        if not hasattr(self, "_base"):
            self._hook()
        self._captured.clear()
        with torch.inference_mode():
            self._base(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                       use_cache=False)
        return [self._captured.pop(L) for L in self.layers]

    def to_host(self, hs: List[Any],
                spans: Sequence[Tuple[int, int, int]]) -> Tuple[List[List[Any]], Any]:
        """Per (row, start, length) span, its layers' [length, hidden] rows of `hs`, on
        the host; plus a CUDA event the host copies complete at (None on CPU)."""
        torch = self.torch
        if self.device != "cuda":
            return [[h[row, a:a + n].to(self.dtype).clone() for h in hs]
                    for row, a, n in spans], None
        # Each layer's whole batch in one copy to pinned host memory, on a side stream, so
        # the next batch's forward runs while the copies and the writers work; each
        # sequence's rows of it are a contiguous view, written from there (no clones).
        side = self._copy_stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            bufs = []
            self._host_numel = max(self._host_numel, hs[0].numel())
            for h in hs:
                buf = torch.empty(self._host_numel, dtype=self.dtype, pin_memory=True)
                buf = buf[:h.numel()].view(h.shape)
                buf.copy_(h, non_blocking=True)
                h.record_stream(side)  # the allocator must not reuse it before the copy
                bufs.append(buf)
            # Blocking: the writer threads that wait for it sleep; CUDA's default with
            # more cores than GPUs is to spin, and a batch's writers would spin on every
            # core while the main thread launches the next forward.
            done = torch.cuda.Event(blocking=True)
            done.record(side)
        out = [[buf[row, a:a + n] for buf in bufs] for row, a, n in spans]
        return out, done
