"""Host and GPU readings for the agent's snapshots: /proc basics, then NVML (cached
handles), else nvidia-smi, else none with a reason. Standard library only;
`pynvml` is used when importable.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from remote.base.wire import one_line


def host_info() -> Dict[str, Any]:
    """hostname, load, cpu_count, mem_total/mem_available (bytes), uptime (s)."""
    info: Dict[str, Any] = {"hostname": socket.gethostname(), "load": None,
                            "cpu_count": os.cpu_count(), "mem_total": None,
                            "mem_available": None, "uptime": None}
    try:
        with open("/proc/loadavg") as f:
            info["load"] = [float(x) for x in f.read().split()[:3]]
        with open("/proc/uptime") as f:
            info["uptime"] = float(f.read().split()[0])
        with open("/proc/meminfo") as f:
            head = f.read(512)  # MemTotal and MemAvailable are the first and third lines
        for key, field in (("MemTotal:", "mem_total"), ("MemAvailable:", "mem_available")):
            at = head.find(key)
            if at >= 0:
                info[field] = int(head[at + len(key):].split(None, 1)[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return info


def _nvml_call(fn: Callable[..., Any], *args: Any) -> Any:
    """One NVML reading, or None if that reading fails (never 0, never a crash)."""
    try:
        return fn(*args)
    except Exception:  # NVMLError and its many subclasses, or AttributeError on old pynvml
        return None


def _smi_value(text: str, scale: float = 1.0, as_int: bool = False) -> Any:
    text = text.strip()
    if not text or text.startswith("[") or text.upper() in ("N/A", "NOT SUPPORTED"):
        return None
    try:
        value = float(text) * scale
    except ValueError:
        return None
    return int(round(value)) if as_int else value


class SmiFailed(RuntimeError):
    """nvidia-smi exited non-zero; the text is its last line (its own reason)."""


class Gpus:
    """The GPU source: NVML (cached handles), else nvidia-smi, else none with a reason."""

    SMI_GPU = "index,name,uuid,memory.used,memory.total,utilization.gpu,temperature.gpu," \
              "power.draw,power.limit"

    def __init__(self) -> None:
        self.source: Optional[str] = None
        self.source_detail = ""  # where NVML's bindings came from, when not the host's
        self.error: Optional[str] = None
        self.lock = threading.Lock()  # the kill worker reads GPUs too
        self._nv: Any = None
        self._handles: List[Any] = []
        self._static: List[Dict[str, Any]] = []
        self._smi: Optional[str] = None
        self._mem_v2: Optional[bool] = None  # NVML v2 memory info: untried, works, or not
        forced = os.environ.get("EAGLE3_TUI_GPU_SOURCE", "").strip().lower()
        if forced == "none":
            self.error = "GPU source disabled (EAGLE3_TUI_GPU_SOURCE=none)"
            return
        if forced not in ("", "nvml", "nvidia-smi"):
            self.error = "unknown EAGLE3_TUI_GPU_SOURCE %r (use none, nvml or nvidia-smi)" % forced
            return
        reasons = []
        if forced in ("", "nvml"):
            reason = self._init_nvml()
            if reason is None:
                self.source = "nvml"
                return
            reasons.append(reason)
        if forced in ("", "nvidia-smi"):
            self._smi = shutil.which("nvidia-smi")
            if self._smi:
                self.source = "nvidia-smi"
                return
            reasons.append("nvidia-smi not found")
        self.error = "; ".join(reasons)

    def _init_nvml(self) -> Optional[str]:
        try:
            import pynvml  # type: ignore  # the host's own (a vLLM venv has one)
        except Exception:
            try:  # nvidia-ml-py's pynvml, uploaded with the agent by the client
                import uploaded_pynvml as pynvml  # type: ignore
            except Exception:
                return "pynvml not installed"
            self.source_detail = "nvidia-ml-py's pynvml, uploaded with the agent"
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:
            return "pynvml: %s" % (str(exc) or type(exc).__name__)
        self._nv, self._handles = pynvml, handles
        for i, h in enumerate(handles):
            name = _nvml_call(pynvml.nvmlDeviceGetName, h)
            uuid = _nvml_call(pynvml.nvmlDeviceGetUUID, h)
            self._static.append({"index": i,
                                 "name": name.decode() if isinstance(name, bytes) else name,
                                 "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid})
        return None

    def read(self) -> Tuple[List[Dict[str, Any]], Optional[str]]:
        """(gpus, error) in protocol shape; gpus is [] when there is no source."""
        with self.lock:
            if self.source == "nvml":
                return [self._read_nvml(i, h) for i, h in enumerate(self._handles)], None
            if self.source == "nvidia-smi":
                try:
                    return self._read_smi(), None
                except SmiFailed as exc:  # its own words: "NVIDIA-SMI has failed because …"
                    return [], "nvidia-smi failed: %s" % exc
                except Exception as exc:  # a timeout, an exec error
                    return [], "nvidia-smi failed: %s" % one_line(exc)
            return [], self.error

    def proof(self) -> List[Dict[str, Any]]:
        """A reading for a kill's GPU-free proof (kill.GpuQuery): the GPUs, or RuntimeError
        with the source's one-line error when the reading failed. Never ``[]`` for a
        failure: no card listed would read as "none holds the run", a vacuous proof."""
        gpus, error = self.read()
        if error is not None:
            raise RuntimeError(error)
        return gpus

    def _read_nvml(self, i: int, h: Any) -> Dict[str, Any]:
        nv = self._nv
        gpu = dict(self._static[i])
        mem = self._memory(h)
        util = _nvml_call(nv.nvmlDeviceGetUtilizationRates, h)
        power = _nvml_call(nv.nvmlDeviceGetPowerUsage, h)
        limit = _nvml_call(nv.nvmlDeviceGetEnforcedPowerLimit, h)
        gpu.update({
            "mem_used": getattr(mem, "used", None), "mem_total": getattr(mem, "total", None),
            "util": getattr(util, "gpu", None),
            "temp": _nvml_call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
            "power": power / 1000.0 if power is not None else None,
            "power_limit": limit / 1000.0 if limit is not None else None,
        })
        procs: Dict[int, Optional[int]] = {}
        for fn_name in ("nvmlDeviceGetComputeRunningProcesses",
                        "nvmlDeviceGetGraphicsRunningProcesses"):
            for p in _nvml_call(getattr(nv, fn_name), h) or []:
                used = getattr(p, "usedGpuMemory", None)
                prev = procs.get(p.pid)
                procs[p.pid] = used if prev is None else max(prev, used or 0)
        gpu["processes"] = [{"pid": pid, "mem": mem_} for pid, mem_ in sorted(procs.items())]
        return gpu

    def _memory(self, h: Any) -> Any:
        """Memory info as nvidia-smi reports it: the v2 call, whose `used` leaves out what
        the driver reserves (v1 counts ~600 MiB on an idle H200), where the driver and
        nvidia-ml-py have it; else the first call."""
        nv = self._nv
        version = getattr(nv, "nvmlMemory_v2", None)
        if version is not None and self._mem_v2 is not False:
            mem = _nvml_call(nv.nvmlDeviceGetMemoryInfo, h, version)  # TypeError: old pynvml
            if mem is not None or self._mem_v2:
                self._mem_v2 = True
                return mem
            self._mem_v2 = False
        return _nvml_call(nv.nvmlDeviceGetMemoryInfo, h)

    def _smi_run(self, query: str) -> List[List[str]]:
        out = subprocess.run([self._smi or "nvidia-smi", query, "--format=csv,noheader,nounits"],
                             capture_output=True, timeout=10, check=False)
        if out.returncode != 0:
            lines = (out.stderr or out.stdout).decode("utf-8", "replace").strip().splitlines()
            raise SmiFailed(" ".join(lines[-1].split())[:300] if lines else "exit %d" % out.returncode)
        return [[f.strip() for f in line.split(",")]
                for line in out.stdout.decode("utf-8", "replace").splitlines() if line.strip()]

    def _read_smi(self) -> List[Dict[str, Any]]:
        mib = 1024.0 * 1024.0
        gpus, by_uuid = [], {}
        for f in self._smi_run("--query-gpu=" + self.SMI_GPU):
            if len(f) < 9:
                continue
            gpu = {"index": _smi_value(f[0], as_int=True), "name": f[1] or None,
                   "uuid": f[2] or None, "mem_used": _smi_value(f[3], mib, True),
                   "mem_total": _smi_value(f[4], mib, True), "util": _smi_value(f[5], as_int=True),
                   "temp": _smi_value(f[6], as_int=True), "power": _smi_value(f[7]),
                   "power_limit": _smi_value(f[8]), "processes": []}
            gpus.append(gpu)
            by_uuid[gpu["uuid"]] = gpu
        for f in self._smi_run("--query-compute-apps=gpu_uuid,pid,used_memory"):
            if len(f) >= 3 and f[0] in by_uuid and f[1].isdigit():
                by_uuid[f[0]]["processes"].append({"pid": int(f[1]),
                                                   "mem": _smi_value(f[2], mib, True)})
        return gpus
