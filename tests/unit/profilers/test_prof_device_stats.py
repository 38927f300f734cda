"""Device statistics: real CPU stats; GPU paths through fakes of exactly the NVML/torch.cuda calls."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from stepscope.errors import UsageError
from stepscope.profilers import DeviceStatsMonitor, format_device_stats
from stepscope.profilers.device_stats import CPU_KEYS, GPU_KEYS

MIB = 1024 * 1024


def test_cpu_stats_on_the_cpu():
    stats = DeviceStatsMonitor(device="cpu").stats()
    assert set(stats) == set(CPU_KEYS)
    assert all(0.0 <= value <= 100.0 for value in stats.values())


@pytest.mark.parametrize(("cpu_stats", "expected"), [(None, set(CPU_KEYS)), (True, set(CPU_KEYS)), (False, set())])
def test_cpu_stats_flag_on_the_cpu(cpu_stats, expected):
    assert set(DeviceStatsMonitor(cpu_stats=cpu_stats).stats("cpu")) == expected


def test_filter_keys_and_unknown_keys():
    monitor = DeviceStatsMonitor(filter_keys={"cpu_percent", "gpu_utilization_percent"})
    assert set(monitor.stats("cpu")) == {"cpu_percent"}
    assert monitor.unknown_filter_keys("cpu") == {"gpu_utilization_percent"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"cpu_stats": "yes"}, "cpu_stats must be None, True or False"),
     ({"allocator_stats": 1}, "allocator_stats must be True or False"),
     ({"filter_keys": "cpu_percent"}, "filter_keys must be a collection")],
)  # fmt: skip
def test_invalid_arguments(kwargs, message):
    with pytest.raises(UsageError, match=message):
        DeviceStatsMonitor(**kwargs)


def test_invalid_device():
    with pytest.raises(UsageError, match="device must be 'cpu', 'cuda' or 'cuda:N'"):
        DeviceStatsMonitor().stats("tpu:0")


# -- GPU through fakes ----------------------------------------------------------------------------
class FakeNvml(types.ModuleType):
    """The pynvml functions the monitor calls, for two physical GPUs."""

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.initialised = 0
        self.devices = {
            0: {"gpu": 10, "memory": 5, "used": 1024 * MIB, "total": 8192 * MIB},
            1: {"gpu": 87, "memory": 40, "used": 6144 * MIB, "total": 8192 * MIB},
        }
        self.uuids = {"GPU-abc": 1}

    def nvmlInit(self):  # noqa: N802 - pynvml's names
        self.initialised += 1

    def nvmlDeviceGetHandleByIndex(self, index):  # noqa: N802
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid):  # noqa: N802
        return self.uuids[uuid]

    def nvmlDeviceGetUtilizationRates(self, handle):  # noqa: N802
        device = self.devices[handle]
        return types.SimpleNamespace(gpu=device["gpu"], memory=device["memory"])

    def nvmlDeviceGetMemoryInfo(self, handle):  # noqa: N802
        device = self.devices[handle]
        return types.SimpleNamespace(used=device["used"], total=device["total"], free=device["total"] - device["used"])


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's memory functions for a GPU this machine does not have."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda index: 100 * MIB * (index + 1))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index: 200 * MIB * (index + 1))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda index: 150 * MIB * (index + 1))
    monkeypatch.setattr(
        torch.cuda, "memory_stats", lambda index: {"allocated_bytes.all.freed": 7, "num_alloc_retries": 0}
    )
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture
def fake_nvml(monkeypatch):
    module = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


def test_readable_gpu_stats(fake_cuda, fake_nvml):
    monitor = DeviceStatsMonitor()  # picks the (fake) current CUDA device
    stats = monitor.stats()
    assert set(stats) == set(GPU_KEYS)
    assert stats["gpu_utilization_percent"] == 10.0 and stats["gpu_memory_busy_percent"] == 5.0
    assert stats["gpu_memory_used_mib"] == 1024.0 and stats["gpu_memory_total_mib"] == 8192.0
    assert stats["gpu_memory_used_percent"] == 12.5
    assert (stats["torch_allocated_mib"], stats["torch_reserved_mib"], stats["torch_peak_allocated_mib"]) == (100.0, 200.0, 150.0)
    monitor.stats()
    assert fake_nvml.initialised == 1  # NVML is initialised once


def test_gpu_stats_with_cpu_and_allocator_stats(fake_cuda, fake_nvml):
    stats = DeviceStatsMonitor(cpu_stats=True, allocator_stats=True).stats("cuda:1")
    assert set(stats) == set(GPU_KEYS) | set(CPU_KEYS) | {"allocated_bytes.all.freed", "num_alloc_retries"}
    assert stats["gpu_utilization_percent"] == 87.0 and stats["torch_allocated_mib"] == 200.0


@pytest.mark.parametrize(("visible", "expected_util"), [("1,0", 87.0), ("GPU-abc", 87.0), ("0", 10.0)])
def test_cuda_visible_devices_maps_to_the_physical_gpu(fake_cuda, fake_nvml, monkeypatch, visible, expected_util):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert DeviceStatsMonitor().stats("cuda:0")["gpu_utilization_percent"] == expected_util


def test_without_nvml_torch_stats_remain_and_one_warning_says_why(fake_cuda, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monitor = DeviceStatsMonitor()
    with pytest.warns(RuntimeWarning, match="GPU utilization unavailable"):
        stats = monitor.stats()
    assert set(stats) == {"torch_allocated_mib", "torch_reserved_mib", "torch_peak_allocated_mib"}
    monitor.stats()  # no second warning (pytest's filter would show it; checked by count below)
    assert monitor._warned == {"nvml"}


def test_a_failing_source_never_raises(fake_cuda, fake_nvml, monkeypatch):
    def broken(index):
        raise RuntimeError("driver went away")

    monkeypatch.setattr(torch.cuda, "memory_allocated", broken)
    with pytest.warns(RuntimeWarning, match="gpu statistics unavailable: driver went away"):
        assert DeviceStatsMonitor().stats() == {}


def test_format_device_stats_is_one_readable_line(fake_cuda, fake_nvml):
    line = format_device_stats(DeviceStatsMonitor(cpu_stats=True).stats("cuda:1"))
    assert line.startswith("GPU 87 % | GPU memory ")
    assert "torch allocated " in line and "| CPU " in line and "| RAM " in line
    assert format_device_stats({}) == "no device statistics"
