"""A thin layer over NVML (``nvidia-ml-py``, imported as ``pynvml``) for the sampler and CLI.

Only the NVML functions below are called, each in one place, so the fake used by the tests
(``tests/fakes/fake_nvml.py``) implements exactly this surface:

    nvmlInit, nvmlShutdown, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex, nvmlDeviceGetName,
    nvmlDeviceGetUUID, nvmlDeviceGetMemoryInfo, nvmlDeviceGetUtilizationRates,
    nvmlDeviceGetClockInfo, nvmlDeviceGetPowerUsage, nvmlDeviceGetTemperature,
    nvmlDeviceGetPcieThroughput, nvmlDeviceGetComputeRunningProcesses,
    nvmlDeviceGetGraphicsRunningProcesses

Failure policy: without NVML or a GPU, :func:`open_gpus` returns ``None`` and one note. An NVML
error on one reading (a metric the GPU does not support, a GPU that fell off the bus) leaves that
value at -1 and adds one note per (GPU, metric, error); the sampler never stops for it.

Cost: utilization and memory are read every sample. ``nvmlDeviceGetPcieThroughput`` measures over
20 ms inside the call, so PCIe is read for one GPU at a time, round-robin, about once per second
per GPU; clocks, power, temperature and per-process memory are read once per second.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

#: Sample keys of the per-GPU series, in the order of :meth:`GpuProbe.sample`.
GPU_SERIES = ("gpu_util", "gpu_mem_util", "gpu_mem_used_bytes", "gpu_sm_clock_mhz", "gpu_power_mw",
              "gpu_temp_c", "gpu_pcie_tx_bytes_per_s", "gpu_pcie_rx_bytes_per_s")


def load_nvml() -> Any:
    """The ``pynvml`` module, or raise ImportError. Tests replace this function with a fake."""
    import pynvml

    return pynvml


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str
    uuid: str
    memory_total_bytes: int


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU, as NVML reports it (pids of the host's namespace)."""

    gpu: int
    pid: int
    used_memory_bytes: int  # -1 when NVML cannot tell (e.g. without permission, on Windows WDDM)


def open_gpus(nvml: Any = None, *, visible: str | None = None, all_gpus: bool = False,
              slow_every: int = 10) -> tuple[GpuProbe | None, str | None]:
    """Initialise NVML and list the GPUs to sample.

    Args:
        nvml: the NVML module (``pynvml`` by default, a fake in tests).
        visible: a ``CUDA_VISIBLE_DEVICES`` value restricting the GPUs (indexes or UUID prefixes);
            ``None`` reads the environment.
        all_gpus: every GPU, whatever ``CUDA_VISIBLE_DEVICES`` says (``stepscope gpu-procs``).
        slow_every: samples between two readings of the slow metrics (see :class:`GpuProbe`).

    Returns:
        ``(probe, None)``, or ``(None, note)`` saying why there are no GPU metrics.
    """
    try:
        nvml = load_nvml() if nvml is None else nvml
    except ImportError:
        return None, "GPU metrics unavailable: nvidia-ml-py (pynvml) is not installed"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError, or OSError from a broken library
        return None, f"GPU metrics unavailable: NVML could not start ({_describe(exc)})"
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(nvml.nvmlDeviceGetCount())]
        devices = [_device(nvml, index, handle) for index, handle in enumerate(handles)]
    except Exception as exc:  # noqa: BLE001
        _shutdown(nvml)
        return None, f"GPU metrics unavailable: NVML could not list the GPUs ({_describe(exc)})"
    if all_gpus:
        chosen = list(range(len(devices)))
    else:
        chosen = _visible_indexes(devices, os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible)
    if not chosen:
        _shutdown(nvml)
        return None, "GPU metrics unavailable: NVML sees no GPU" + (" among CUDA_VISIBLE_DEVICES" if devices else "")
    return GpuProbe(nvml, [devices[i] for i in chosen], [handles[i] for i in chosen], slow_every), None


class GpuProbe:
    """Reads the chosen GPUs. Build it with :func:`open_gpus`; :meth:`close` shuts NVML down."""

    def __init__(self, nvml: Any, devices: list[GpuDevice], handles: list[Any], slow_every: int = 10):
        self.nvml = nvml
        self.devices = devices
        self.handles = handles
        self.slow_every = max(1, slow_every)  # samples between two readings of the slow metrics
        self._tick = 0
        self._noted: set[tuple[int, str, str]] = set()
        self.notes: list[str] = []  # new notes since the caller last emptied the list

    def info(self) -> list[dict[str, Any]]:
        return [device.__dict__.copy() for device in self.devices]

    def sample(self) -> dict[str, Any]:
        """One reading: the per-GPU series (-1 = not read or not available) and the processes."""
        slow = self._tick % self.slow_every == 0
        pcie_every = max(1, self.slow_every // len(self.devices))
        pcie_gpu = (self._tick // pcie_every) % len(self.devices) if self._tick % pcie_every == 0 else -1
        self._tick += 1
        series: dict[str, list[int]] = {name: [] for name in GPU_SERIES}
        processes: list[GpuProcess] = []
        for position, (device, handle) in enumerate(zip(self.devices, self.handles)):
            values = self._fast(device.index, handle)
            values += self._slow(device.index, handle) if slow else [-1, -1, -1]
            values += self._pcie(device.index, handle) if position == pcie_gpu else [-1, -1]
            for name, value in zip(GPU_SERIES, values):
                series[name].append(value)
            if slow:
                processes += self.processes_of(device.index, handle)
        return {**series, "gproc": {"gpu": [item.gpu for item in processes],
                                    "pid": [item.pid for item in processes],
                                    "mem_bytes": [item.used_memory_bytes for item in processes]},
                "gpu_procs_read": int(slow)}

    def processes_of(self, index: int, handle: Any) -> list[GpuProcess]:
        """Compute and graphics processes holding memory on one GPU (a pid listed in both counts once)."""
        found: dict[int, GpuProcess] = {}
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            for item in self._call(index, "processes", getter, handle) or ():
                used = getattr(item, "usedGpuMemory", None)
                used = int(used) if isinstance(used, int) and 0 <= used < 2**63 else -1
                found.setdefault(int(item.pid), GpuProcess(index, int(item.pid), used))
        return list(found.values())

    def all_processes(self) -> list[GpuProcess]:
        out = []
        for device, handle in zip(self.devices, self.handles):
            out += self.processes_of(device.index, handle)
        return out

    def close(self) -> None:
        _shutdown(self.nvml)

    # -- readings ---------------------------------------------------------------------------------
    def _fast(self, index: int, handle: Any) -> list[int]:
        rates = self._call(index, "utilization", "nvmlDeviceGetUtilizationRates", handle)
        memory = self._call(index, "memory", "nvmlDeviceGetMemoryInfo", handle)
        return [int(rates.gpu) if rates is not None else -1, int(rates.memory) if rates is not None else -1,
                int(memory.used) if memory is not None else -1]

    def _slow(self, index: int, handle: Any) -> list[int]:
        nvml = self.nvml
        clock = self._call(index, "SM clock", "nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_SM)
        power = self._call(index, "power", "nvmlDeviceGetPowerUsage", handle)
        temp = self._call(index, "temperature", "nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU)
        return [_int(clock), _int(power), _int(temp)]

    def _pcie(self, index: int, handle: Any) -> list[int]:
        nvml = self.nvml
        tx = self._call(index, "PCIe", "nvmlDeviceGetPcieThroughput", handle, nvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = self._call(index, "PCIe", "nvmlDeviceGetPcieThroughput", handle, nvml.NVML_PCIE_UTIL_RX_BYTES)
        return [_int(tx) * 1024 if tx is not None else -1, _int(rx) * 1024 if rx is not None else -1]  # KB/s

    def _call(self, index: int, metric: str, function: str, *args: Any) -> Any:
        """Call one NVML function; on any error note it once and return None."""
        try:
            return getattr(self.nvml, function)(*args)
        except Exception as exc:  # noqa: BLE001 - NVMLError subclasses, or anything a driver throws
            key = (index, metric, _describe(exc))
            if key not in self._noted:
                self._noted.add(key)
                self.notes.append(f"GPU {index}: {metric} unavailable from NVML ({key[2]}); recorded as missing")
            return None


# -- is an NVML pid really a GPU process here? (gpu-procs --kill) --------------------------------
#: Device files a process using an NVIDIA GPU holds open or mapped (/dev/nvidiactl, /dev/nvidia<N>,
#: /dev/nvidia-uvm, /dev/nvidia-caps/...).
GPU_DEVICE_PREFIXES: tuple[str, ...] = ("/dev/nvidia",)
#: ``readlink /proc/self/ns/pid`` in the initial (host) pid namespace: PROC_PID_INIT_INO, fixed by the kernel.
HOST_PID_NAMESPACE = "pid:[4026531836]"


def holds_gpu_device(pid: int, proc: str = "/proc") -> bool | None:
    """Whether the process has a GPU device file open (``/proc/<pid>/fd``) or mapped (``maps``).

    ``None`` when /proc cannot tell (the process is gone, or belongs to someone else without root).
    """
    fd_dir = f"{proc}/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        names = None
    for name in names or ():
        try:
            if os.readlink(f"{fd_dir}/{name}").startswith(GPU_DEVICE_PREFIXES):
                return True
        except OSError:
            continue
    try:
        with open(f"{proc}/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].strip().startswith(GPU_DEVICE_PREFIXES):
                    return True
    except OSError:
        return None if names is None else False
    return False if names is not None else None


def nvml_pid_problem(pid: int, proc: str = "/proc") -> str | None:
    """Why NVML's ``pid`` cannot be confirmed to name the same process here, or None when it can.

    NVML reports pids of the host's pid namespace. They name the same processes here only when this
    process runs in the host's namespace and reads the host's /proc: ``/proc/self/ns/pid`` is the
    initial namespace, and the ``NSpid`` of ``/proc/self`` (leftmost: the pid in the namespace of
    that /proc) is our own pid. Inside a container, a host pid may name another process, or none.
    """
    try:
        namespace = os.readlink(f"{proc}/self/ns/pid")
    except OSError:
        return "cannot read this process's pid namespace, so NVML's (host) pids cannot be matched"
    if namespace != HOST_PID_NAMESPACE:
        return ("stepscope runs in a pid namespace other than the host's (a container): NVML reports host "
                "pids, which cannot be matched to processes here; end it from the host")
    own, target = _nspid(proc, "self"), _nspid(proc, str(pid))
    if own is None or own[0] != os.getpid():
        return "this /proc belongs to another pid namespace, so NVML's (host) pids cannot be matched"
    if target is None or target[0] != pid:
        return "its pid namespace entry (NSpid) cannot be read or does not match NVML's pid"
    return None


def _nspid(proc: str, name: str) -> list[int] | None:
    try:
        with open(f"{proc}/{name}/status", encoding="utf-8", errors="replace") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return [int(item) for item in line.split()[1:]] or None
    except (OSError, ValueError):
        return None
    return None


def _device(nvml: Any, index: int, handle: Any) -> GpuDevice:
    return GpuDevice(index=index, name=_text(nvml.nvmlDeviceGetName(handle)),
                     uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                     memory_total_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total))


def _visible_indexes(devices: list[GpuDevice], visible: str | None) -> list[int]:
    """Indexes of ``devices`` selected by a CUDA_VISIBLE_DEVICES value (all when unset)."""
    if visible is None or visible.strip() == "":
        return list(range(len(devices))) if visible is None else []
    chosen = []
    for token in (item.strip() for item in visible.split(",")):
        if token.lstrip("-").isdigit():
            number = int(token)
            if number < 0 or number >= len(devices):
                break  # CUDA stops at the first invalid entry
            chosen.append(number)
        elif token.startswith("MIG-"):
            return list(range(len(devices)))  # a MIG instance: sample its parent among all GPUs
        else:
            matches = [device.index for device in devices if token and device.uuid.startswith(token)]
            if not matches:
                break
            chosen.append(matches[0])
    return list(dict.fromkeys(chosen))


def _describe(exc: BaseException) -> str:
    """NVML's own words ("NVML Shared Library Not Found", "Not Supported"), else the exception's name."""
    return str(exc).strip() or type(exc).__name__


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _int(value: Any) -> int:
    return int(value) if value is not None else -1


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - nothing to do about a failing shutdown
        pass
