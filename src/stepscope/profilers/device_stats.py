"""Device statistics for plain loops (and the core of the Lightning callback).

Contract:
- :func:`cpu_stats` returns Lightning's CPU keys from psutil: ``cpu_percent`` (system-wide, since
  the previous call; the first call is 0.0), ``cpu_vm_percent``, ``cpu_swap_percent``.
- :func:`gpu_stats` returns a *readable* set for one CUDA device (what Lightning's
  DeviceStatsMonitor lacks, issues #18652/#9032): from NVML ``gpu_utilization_percent`` (share of
  the last sample period a kernel ran), ``gpu_memory_busy_percent`` (memory controller busy),
  ``gpu_memory_used_mib``, ``gpu_memory_total_mib``, ``gpu_memory_used_percent`` (all processes);
  from torch's allocator ``torch_allocated_mib``, ``torch_reserved_mib``,
  ``torch_peak_allocated_mib`` (this process). Without NVML the NVML keys are missing and one
  warning says why. NVML calls are cheap library calls (no nvidia-smi subprocess, issue #189).
- :func:`allocator_stats` is the full ``torch.cuda.memory_stats`` dictionary (Lightning's keys).
- :class:`DeviceStatsMonitor` combines them for one device: CPU stats when the device is the CPU
  (``cpu_stats=None``), always (``True``) or never (``False``); GPU stats on CUDA; the allocator
  dictionary with ``allocator_stats=True``; ``filter_keys`` keeps only the named keys.
  :func:`format_device_stats` renders one readable line. Nothing here raises into the training
  loop once constructed: a failing source is warned about once and skipped.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Iterable
from typing import Any

from stepscope.profilers._config import config_error
from stepscope.units import format_bytes

__all__ = ["DeviceStatsMonitor", "cpu_stats", "gpu_stats", "allocator_stats", "format_device_stats", "CPU_KEYS", "GPU_KEYS"]

CPU_KEYS = ("cpu_percent", "cpu_vm_percent", "cpu_swap_percent")
GPU_KEYS = (
    "gpu_utilization_percent", "gpu_memory_busy_percent", "gpu_memory_used_mib", "gpu_memory_total_mib",
    "gpu_memory_used_percent", "torch_allocated_mib", "torch_reserved_mib", "torch_peak_allocated_mib",
)  # fmt: skip
_MIB = 1024 * 1024


def cpu_stats() -> dict[str, float]:
    """System CPU and memory use (psutil), with Lightning's key names."""
    import psutil

    return {
        "cpu_percent": float(psutil.cpu_percent()),
        "cpu_vm_percent": float(psutil.virtual_memory().percent),
        "cpu_swap_percent": float(psutil.swap_memory().percent),
    }


def nvml_handle(nvml: Any, cuda_index: int) -> Any:
    """NVML handle of torch's CUDA device ``cuda_index``, honouring CUDA_VISIBLE_DEVICES."""
    visible = [item.strip() for item in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if item.strip()]
    if cuda_index < len(visible):
        entry = visible[cuda_index]
        if entry.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(entry))
        return nvml.nvmlDeviceGetHandleByUUID(entry)
    return nvml.nvmlDeviceGetHandleByIndex(cuda_index)


def nvml_stats(nvml: Any, cuda_index: int) -> dict[str, float]:
    handle = nvml_handle(nvml, cuda_index)
    rates = nvml.nvmlDeviceGetUtilizationRates(handle)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    return {
        "gpu_utilization_percent": float(rates.gpu),
        "gpu_memory_busy_percent": float(rates.memory),
        "gpu_memory_used_mib": memory.used / _MIB,
        "gpu_memory_total_mib": memory.total / _MIB,
        "gpu_memory_used_percent": 100.0 * memory.used / memory.total if memory.total else 0.0,
    }


def torch_memory_stats(cuda_index: int) -> dict[str, float]:
    import torch

    return {
        "torch_allocated_mib": torch.cuda.memory_allocated(cuda_index) / _MIB,
        "torch_reserved_mib": torch.cuda.memory_reserved(cuda_index) / _MIB,
        "torch_peak_allocated_mib": torch.cuda.max_memory_allocated(cuda_index) / _MIB,
    }


def gpu_stats(cuda_index: int, nvml: Any = None) -> dict[str, float]:
    """The readable GPU set (see the module contract); ``nvml`` is an initialised pynvml or None."""
    stats = nvml_stats(nvml, cuda_index) if nvml is not None else {}
    stats.update(torch_memory_stats(cuda_index))
    return stats


def allocator_stats(cuda_index: int) -> dict[str, float]:
    """Every counter of torch's CUDA caching allocator (what Lightning's monitor logs)."""
    import torch

    return {key: float(value) for key, value in torch.cuda.memory_stats(cuda_index).items()}


def format_device_stats(stats: dict[str, float]) -> str:
    """One readable line, e.g. ``GPU 87 % | GPU memory 12.0 GiB / 80.0 GiB | CPU 45 % | RAM 30 %``."""
    parts = []
    if "gpu_utilization_percent" in stats:
        parts.append(f"GPU {stats['gpu_utilization_percent']:.0f} %")
    if "gpu_memory_used_mib" in stats:
        used, total = stats["gpu_memory_used_mib"] * _MIB, stats.get("gpu_memory_total_mib", 0.0) * _MIB
        parts.append(f"GPU memory {format_bytes(used)} / {format_bytes(total)}")
    if "torch_allocated_mib" in stats:
        allocated, reserved = stats["torch_allocated_mib"] * _MIB, stats.get("torch_reserved_mib", 0.0) * _MIB
        parts.append(f"torch allocated {format_bytes(allocated)} (reserved {format_bytes(reserved)})")
    if "cpu_percent" in stats:
        parts.append(f"CPU {stats['cpu_percent']:.0f} %")
    if "cpu_vm_percent" in stats:
        parts.append(f"RAM {stats['cpu_vm_percent']:.0f} %")
    return " | ".join(parts) if parts else "no device statistics"


class DeviceStatsMonitor:
    """Device statistics on demand, for a plain loop.

    Example::

        monitor = DeviceStatsMonitor()            # the current CUDA device, else the CPU
        for step, batch in enumerate(loader):
            ...
            if step % 100 == 0:
                print(format_device_stats(monitor.stats()))

    Args:
        cpu_stats: None: CPU stats only when the device is the CPU; True: always; False: never.
        allocator_stats: add torch's full CUDA allocator dictionary (Lightning's keys).
        filter_keys: keep only these keys (names as listed in the module contract).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device``; None picks CUDA when
            available.
    """

    def __init__(
        self,
        cpu_stats: bool | None = None,
        allocator_stats: bool = False,
        filter_keys: Iterable[str] | None = None,
        device: Any = None,
    ) -> None:
        if cpu_stats is not None and not isinstance(cpu_stats, bool):
            raise config_error(f"DeviceStatsMonitor: cpu_stats must be None, True or False, got {cpu_stats!r}.")
        if not isinstance(allocator_stats, bool):
            raise config_error(f"DeviceStatsMonitor: allocator_stats must be True or False, got {allocator_stats!r}.")
        if isinstance(filter_keys, str):
            raise config_error("DeviceStatsMonitor: filter_keys must be a collection of key names, not one string.")
        self.cpu_stats = cpu_stats
        self.allocator_stats = allocator_stats
        self.filter_keys = frozenset(filter_keys) if filter_keys is not None else None
        self._device = device
        self._nvml: Any = None
        self._nvml_tried = False
        self._warned: set[str] = set()

    def resolve_device(self, device: Any = None) -> tuple[str, int]:
        """``("cpu", 0)`` or ``("cuda", index)`` for ``device`` (or the monitor's own)."""
        device = device if device is not None else self._device
        if device is None:
            import torch

            return ("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else ("cpu", 0)
        text = str(device)
        kind, _, index = text.partition(":")
        if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
            raise config_error(f"DeviceStatsMonitor: device must be 'cpu', 'cuda' or 'cuda:N', got {text!r}.")
        if kind == "cuda" and not index:
            import torch

            return "cuda", torch.cuda.current_device()
        return kind, int(index or 0)

    def stats(self, device: Any = None) -> dict[str, float]:
        """Collect the statistics now (see the module contract)."""
        kind, index = self.resolve_device(device)
        stats: dict[str, float] = {}
        if kind == "cuda":
            stats.update(self._guarded("gpu", lambda: gpu_stats(index, self._nvml_module())))
            if self.allocator_stats:
                stats.update(self._guarded("allocator", lambda: allocator_stats(index)))
        if self.cpu_stats or (self.cpu_stats is None and kind == "cpu"):
            stats.update(self._guarded("cpu", cpu_stats))
        if self.filter_keys is not None:
            stats = {key: value for key, value in stats.items() if key in self.filter_keys}
        return stats

    def unknown_filter_keys(self, device: Any = None) -> set[str]:
        """Keys of ``filter_keys`` that this device does not report."""
        if self.filter_keys is None:
            return set()
        saved, self.filter_keys = self.filter_keys, None
        try:
            available = set(self.stats(device))
        finally:
            self.filter_keys = saved
        return set(saved) - available

    def _nvml_module(self) -> Any:
        if not self._nvml_tried:
            self._nvml_tried = True
            try:
                nvml = importlib.import_module("pynvml")
                nvml.nvmlInit()
                self._nvml = nvml
            except Exception as exc:  # noqa: BLE001 - missing library or driver: degrade, say why
                self._warn_once("nvml", f"DeviceStatsMonitor: GPU utilization unavailable (NVML: {exc}).")
        return self._nvml

    def _guarded(self, source: str, collect: Any) -> dict[str, float]:
        try:
            return collect()
        except Exception as exc:  # noqa: BLE001 - statistics must never stop training
            self._warn_once(source, f"DeviceStatsMonitor: {source} statistics unavailable: {exc}")
            return {}

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_nvml=None, _nvml_tried=False)
        return state
