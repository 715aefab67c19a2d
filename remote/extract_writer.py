"""extract.py's output writer: a process of its own that writes the data_{i}.pt files
from host memory it shares with the job.

Writer threads inside the job's process cost the thread that launches the forwards the
GIL: every file is five system calls (open, writev, fsync, close, rename), each dropping
the GIL and taking it back, and with many short sequences (about 2,000 files/s on an
H200) the launching thread waited on those hand-offs more than the GPU waited on
nothing (bench/bench_writer_gil.py: ~460 us of launching lost per file; none with the
same writer in a process of its own). So the job copies each batch's layers into one
of a few slots of a shared memory file (memfd; on CUDA registered as pinned memory, so
the device-to-host copies stay asynchronous) and sends the writer process one small
message per batch, once the batch's copies are done: which slot, its shape, and per file
its name, token ids, loss mask and rows. No tensor is pickled. The writer process runs
extract_files.write_sample on a pool of threads, from views of the slot, and answers
once per batch. The job reuses a slot only after its batch's answer.

Run as a script by WriterProcess (python extract_writer.py CMD_FD RESULT_FD MEM_FD);
it ends at the job's end message, or at once where the job's end of the pipe closes
(the job died: its half-written temp files are removed by the next run). Stdlib only at
import for the job; the writer process imports torch."""

from __future__ import annotations

import mmap
import os
import queue
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

if __name__ == "__main__":  # run as the writer process: the job's modules sit beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from extract_common import Sample, one_line  # noqa: E402

ALIGN = 4096
# (file name, token ids, loss mask or None, row, first token, length) of one file
Job = Tuple[str, List[int], Optional[List[int]], int, int, int]


class HostSlots:
    """`slots` batches' worth of host memory in one shared memory file: per slot, per
    layer, room for `numel` elements of `dtype`. `buffers[slot][layer]` is a flat torch
    tensor over it."""

    def __init__(self, slots: int, layers: int, numel: int, dtype: str) -> None:
        import torch

        self.torch = torch
        self.dtype = dtype
        self.layers = layers
        item = getattr(torch, dtype).itemsize
        self.layer_stride = -(-max(1, numel) * item // ALIGN) * ALIGN
        self.slot_stride = layers * self.layer_stride
        self.size = slots * self.slot_stride
        if hasattr(os, "memfd_create"):
            self.fd = os.memfd_create("extract-out", os.MFD_CLOEXEC)
        else:  # not Linux: a deleted temp file, in the page cache
            self._file = tempfile.TemporaryFile()
            self.fd = self._file.fileno()
        os.ftruncate(self.fd, self.size)
        self._map = mmap.mmap(self.fd, self.size)
        self._whole = torch.frombuffer(self._map, dtype=torch.uint8)
        self.buffers = [[self._view(s, k).view(getattr(torch, dtype)) for k in range(layers)]
                        for s in range(slots)]
        self.pinned = False

    def _view(self, slot: int, layer: int) -> Any:
        start = slot * self.slot_stride + layer * self.layer_stride
        return self._whole[start:start + self.layer_stride]

    def pin(self) -> bool:
        """Register the memory with CUDA as pinned (page-locked): copies into it from the
        device then run asynchronously. False where CUDA refuses (the copies still work,
        but each waits for the GPU)."""
        cudart = self.torch.cuda.cudart()
        err = cudart.cudaHostRegister(self._whole.data_ptr(), self.size, 0)
        self.pinned = int(err) == 0
        return self.pinned

    def close(self) -> None:
        if self.pinned:
            self.torch.cuda.cudart().cudaHostUnregister(self._whole.data_ptr())
            self.pinned = False


class WriterProcess:
    """The job's side: starts the writer process over `slots`; submit() hands it a
    batch's files and returns a Future that completes when they are all on disk (or
    fails with OSError, the writer's one-line reason)."""

    def __init__(self, slots: HostSlots, hidden: int, threads: int) -> None:
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        script = os.path.abspath(__file__)
        self.proc = subprocess.Popen(
            [sys.executable, script, str(cmd_r), str(res_w), str(slots.fd)],
            pass_fds=(cmd_r, res_w, slots.fd), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(res_w)
        self._cmd = Connection(cmd_w, readable=False)
        self._res = Connection(res_r, writable=False)
        self._cmd.send({"size": slots.size, "dtype": slots.dtype, "layers": slots.layers,
                        "layer_stride": slots.layer_stride, "slot_stride": slots.slot_stride,
                        "hidden": hidden, "threads": threads})
        self._futures: Dict[int, Future] = {}
        self._lock = threading.Lock()
        self._count = 0
        self._outbox: "queue.Queue[Any]" = queue.Queue()
        self._sender = threading.Thread(target=self._send_loop, daemon=True)
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._sender.start()
        self._reader.start()

    def submit(self, slot: int, shape: Tuple[int, int], jobs: Sequence[Job],
               ready: Any) -> Future:
        """Hand over one batch: its layers are (or, once the CUDA event `ready` has
        completed, will be) in `slot`, each [rows, width, hidden] (`shape`)."""
        fut: Future = Future()
        with self._lock:
            key = self._count
            self._count += 1
            self._futures[key] = fut
        self._outbox.put(((key, slot, shape, list(jobs)), ready))
        return fut

    def _send_loop(self) -> None:
        """Waits for each batch's copies (the event is a blocking one: no GIL held, no
        spinning), then sends its message: one GIL hand-off a batch, not per file."""
        while True:
            item = self._outbox.get()
            if item is None:
                break
            msg, ready = item
            if ready is not None:
                ready.synchronize()
            try:
                self._cmd.send(msg)
            except OSError:
                break  # the writer process is gone; the reader fails the futures

    def _read_loop(self) -> None:
        while True:
            try:
                key, err = self._res.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                fut = self._futures.pop(key)
            if err is None:
                fut.set_result(None)
            else:
                fut.set_exception(OSError(err))
        code = self.proc.wait()
        with self._lock:
            left, self._futures = list(self._futures.values()), {}
        for fut in left:
            fut.set_exception(OSError("the writer process ended (exit code %s)" % code))

    def close(self, wait: bool = True) -> None:
        """Let the writer finish what it was given and end (wait), or end it now."""
        if wait:
            self._outbox.put(None)
            self._sender.join()
            try:
                self._cmd.send(None)
            except OSError:
                pass
        self._cmd.close()
        if wait:
            self._reader.join()
        else:
            self.proc.kill()
            self.proc.wait()


def write_run(tasks: List[Tuple[Path, Sample, List[Any]]]) -> None:
    """Some files of one batch, one after the other (a writer thread's task)."""
    from extract_files import write_sample

    for path, sample, hs in tasks:
        write_sample(path, sample, hs, None)


def serve(cmd: Connection, res: Connection, mem_fd: int) -> None:
    """The writer process: batches from `cmd`, one answer each on `res`, in order."""
    import torch
    from extract_files import skip_crc32

    skip_crc32(torch)
    cfg = cmd.recv()
    whole = torch.frombuffer(mmap.mmap(mem_fd, cfg["size"]), dtype=torch.uint8)
    dtype, hidden, threads = getattr(torch, cfg["dtype"]), cfg["hidden"], cfg["threads"]
    pool = ThreadPoolExecutor(max_workers=threads)
    answers: "queue.Queue[Any]" = queue.Queue()

    def answer_loop() -> None:
        while True:
            item = answers.get()
            if item is None:
                return
            key, futures = item
            err = None
            for f in futures:
                exc = f.exception()
                if exc is not None and err is None:
                    err = one_line(exc)
            res.send((key, err))

    answerer = threading.Thread(target=answer_loop)
    answerer.start()
    while True:
        try:
            msg = cmd.recv()
        except (EOFError, OSError):
            os._exit(1)  # the job died: stop writing at once
        if msg is None:
            break
        key, slot, (rows, width), jobs = msg
        n_el = rows * width * hidden * dtype.itemsize
        bufs = []
        for k in range(cfg["layers"]):
            start = slot * cfg["slot_stride"] + k * cfg["layer_stride"]
            bufs.append(whole[start:start + n_el].view(dtype).view(rows, width, hidden))
        tasks = [(Path(name), Sample(ids, mask), [b[row, a:a + n] for b in bufs])
                 for name, ids, mask, row, a, n in jobs]
        k = max(1, min(threads, len(tasks)))
        answers.put((key, [pool.submit(write_run, tasks[j * len(tasks) // k:
                                                        (j + 1) * len(tasks) // k])
                           for j in range(k)]))
    answers.put(None)
    answerer.join()
    pool.shutdown()


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1]), writable=False),
          Connection(int(sys.argv[2]), readable=False), int(sys.argv[3]))
