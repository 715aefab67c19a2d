"""Every shim the real-vLLM tier needs, one per line, each with its reason. Imported by
tests/real_vllm_driver.py before anything else from vLLM; nothing else in vLLM is touched.
A GPU host runs the same vLLM code without these lines."""

from __future__ import annotations

import sys
import threading
import types
from collections import deque
from queue import Empty, Queue

sys.modules["vllm._C"] = types.ModuleType("vllm._C")  # compiled CUDA kernels: need libcudart

import torch  # noqa: E402
import vllm.platforms  # noqa: E402
from vllm.platforms.cuda import CudaPlatformBase  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402


class H200(CudaPlatformBase):
    """vLLM's CUDA platform; only its NVML device queries answer for a GPU that is not here."""

    get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(9, 0))  # NVML
    get_device_name = classmethod(lambda cls, device_id=0: "NVIDIA H200")  # NVML
    get_device_total_memory = classmethod(lambda cls, device_id=0: 141 << 30)  # NVML
    is_fully_connected = classmethod(lambda cls, ids: True)  # NVML NVLink query
    log_warnings = classmethod(lambda cls: None)  # NVML


vllm.platforms._current_platform = H200()  # platform detection probes NVML: no GPU here
import vllm.utils.torch_utils  # noqa: E402

vllm.utils.torch_utils._cuda_device_count_stateless = lambda *a: 8  # NVML device count
import vllm._custom_ops as ops  # noqa: E402

ops.cutlass_scaled_mm_supports_fp8 = lambda cap: False  # compiled kernel, asked at import
ops.cutlass_scaled_mm_supports_block_fp8 = lambda cap: False  # likewise
torch.cuda.mem_get_info = lambda *a: (16 << 30, 80 << 30)  # the generator sizes the KV cache from it
torch.cuda.empty_cache = lambda: None  # generate() calls it: needs a CUDA context

from vllm.distributed import parallel_state  # noqa: E402
from vllm.v1.executor import multiproc_executor as mpe  # noqa: E402

_rank = threading.local()  # each fake worker runs in a thread that sets its rank here


class _ThreadGroup:
    """A process group's rank and size, per thread: real groups need one process per rank
    and NCCL/gloo; the speculators extension reads only these four."""

    world_size = property(lambda self: self.size)
    rank_in_group = property(lambda self: getattr(_rank, "rank", 0) if self.size > 1 else 0)
    is_first_rank = property(lambda self: True)  # pipeline parallel size 1
    is_last_rank = property(lambda self: True)

    def __init__(self, size: int) -> None:
        self.size = size


class _Mq:
    """In-process stand-in for vLLM's shared-memory MessageQueue (needs /dev/shm + zmq
    sockets between processes); `enqueue` fans out to every reader."""

    def __init__(self, readers: int = 1) -> None:
        self.queues = [Queue() for _ in range(readers)]

    def enqueue(self, obj: object, timeout: float | None = None) -> None:
        for q in self.queues:
            q.put(obj)

    def reader(self, i: int) -> "_Mq":
        r = _Mq(0)
        r.queues = [self.queues[i]]
        return r

    def dequeue(self, timeout: float | None = None, cancel: object = None,
                indefinite: bool = False) -> object:
        try:
            return self.queues[0].get(timeout=None if indefinite else (timeout or 600))
        except Empty:
            raise TimeoutError from None


def _init_executor(self: mpe.MultiprocExecutor) -> None:
    """MultiprocExecutor._init_executor spawns one GPU process per rank (CUDA, NCCL, shm).
    Here each rank is a thread running the real WorkerProc.worker_busy_loop over the real
    WorkerWrapperBase (which mixes in the worker_extension_cls); the worker class is
    tests.real_vllm_worker.FakeWorker."""
    self.is_failed, self.failure_callback = False, None
    self.shutdown_event = threading.Event()
    tp, pp, pcp = self._get_parallel_sizes()
    parallel_state._TP = _ThreadGroup(tp)
    parallel_state._PP = _ThreadGroup(pp)
    self.vllm_config.parallel_config.worker_cls = "tests.real_vllm_worker.FakeWorker"
    from tests.real_vllm_worker import FakeWorker

    FakeWorker.__bases__ = FakeWorker.__bases__[:1]  # each real run is a fresh process
    self.rpc_broadcast_mq = _Mq(self.world_size)
    self.response_mqs, self.workers = [], []
    for rank in range(self.world_size):
        proc = object.__new__(mpe.WorkerProc)  # its __init__ sets up devices and sockets
        proc.rank, proc.use_async_scheduling = rank, False
        proc.rpc_broadcast_mq = self.rpc_broadcast_mq.reader(rank)
        proc.worker_response_mq = _Mq()
        wrapper = mpe.WorkerWrapperBase(rpc_rank=rank, global_rank=rank)
        kwargs = [{} for _ in range(self.world_size)]
        kwargs[rank] = {"vllm_config": self.vllm_config, "local_rank": rank, "rank": rank,
                        "distributed_init_method": "inproc://", "is_driver_worker": rank == 0}
        _rank.rank = rank
        wrapper.init_worker(kwargs)
        proc.worker = wrapper
        self.response_mqs.append(proc.worker_response_mq)
        self.workers.append(proc)
        threading.Thread(target=_serve, args=(proc, rank), daemon=True,
                         name=f"FakeWorker_TP{rank}").start()
    self.futures_queue = deque()
    self.output_rank = self._get_output_rank()


def _serve(proc: mpe.WorkerProc, rank: int) -> None:
    _rank.rank = rank
    proc.worker_busy_loop()


mpe.MultiprocExecutor._init_executor = _init_executor  # spawns GPU worker processes
mpe.MultiprocExecutor.shutdown = lambda self: None  # terminates those processes
