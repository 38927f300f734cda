"""A fake of exactly the NVML functions ``stepscope.capture.gpu`` calls.

Errors are pynvml's own ``NVMLError`` subclasses and constants are pynvml's values, so code that
handles the fake's errors handles the real ones. ``test_gpu.py`` checks that every function used by
``gpu.py`` is faked here and that each fake takes the same parameters as the real function.

Use::

    nvml = FakeNvml([FakeGpu(util=80, used=2 << 30)])
    monkeypatch.setattr(stepscope.capture.gpu, "load_nvml", lambda: nvml)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

NVMLError = pynvml.NVMLError
NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
NVML_PCIE_UTIL_TX_BYTES = pynvml.NVML_PCIE_UTIL_TX_BYTES
NVML_PCIE_UTIL_RX_BYTES = pynvml.NVML_PCIE_UTIL_RX_BYTES


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    uuid: str = "GPU-00000000-1111-2222-3333-444444444444"
    total: int = 141 << 30
    used: int = 1 << 30
    util: int = 50
    mem_util: int = 20
    sm_clock: int = 1980
    power_mw: int = 300_000
    temp: int = 45
    pcie_tx_kb: int = 1000
    pcie_rx_kb: int = 2000
    compute: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes or None)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code to raise


class FakeNvml:
    """Module-like object: pass it where ``pynvml`` would go."""

    NVMLError = NVMLError
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_PCIE_UTIL_TX_BYTES = NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = NVML_PCIE_UTIL_RX_BYTES

    def __init__(self, gpus: list[FakeGpu] | None = None, init_error: int | None = None):
        self.gpus = list(gpus or [])
        self.init_error = init_error
        self.initialized = False
        self.calls: Counter[str] = Counter()
        self.utilization_script: list[list[int]] | None = None  # per call: one value per GPU

    # -- the NVML surface ----------------------------------------------------------------------
    def nvmlInit(self):
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self):
        self.calls["nvmlShutdown"] += 1
        self._check()
        self.initialized = False

    def nvmlDeviceGetCount(self):
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return index

    def nvmlDeviceGetName(self, handle):
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle):
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        return SimpleNamespace(total=gpu.total, used=gpu.used, free=gpu.total - gpu.used)

    def nvmlDeviceGetUtilizationRates(self, handle):
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        util = gpu.util
        if self.utilization_script is not None:
            step = (self.calls["nvmlDeviceGetUtilizationRates"] - 1) // max(1, len(self.gpus))
            util = self.utilization_script[step % len(self.utilization_script)][handle]
        return SimpleNamespace(gpu=util, memory=gpu.mem_util)

    def nvmlDeviceGetClockInfo(self, handle, type):  # noqa: A002 - pynvml's parameter name
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        assert type == NVML_CLOCK_SM
        return gpu.sm_clock

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetTemperature(self, handle, sensor):
        gpu = self._gpu("nvmlDeviceGetTemperature", handle)
        assert sensor == NVML_TEMPERATURE_GPU
        return gpu.temp

    def nvmlDeviceGetPcieThroughput(self, device, counter):
        gpu = self._gpu("nvmlDeviceGetPcieThroughput", device)
        return gpu.pcie_tx_kb if counter == NVML_PCIE_UTIL_TX_BYTES else gpu.pcie_rx_kb

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        gpu = self._gpu("nvmlDeviceGetGraphicsRunningProcesses", handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.graphics]

    # -- helpers -------------------------------------------------------------------------------
    def _check(self):
        if not self.initialized:
            raise NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _enter(self, name):
        self.calls[name] += 1
        self._check()

    def _gpu(self, name, handle):
        self._enter(name)
        gpu = self.gpus[handle]
        if name in gpu.errors:
            raise NVMLError(gpu.errors[name])
        return gpu


#: Every NVML function the fake implements.
FAKED_FUNCTIONS = tuple(name for name in vars(FakeNvml) if name.startswith("nvml"))
