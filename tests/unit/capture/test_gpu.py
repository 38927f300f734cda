"""The NVML layer, through a fake of the NVML functions it calls (no GPU on this machine)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pynvml
import pytest
from fakes.fake_nvml import FAKED_FUNCTIONS, FakeGpu, FakeNvml

import stepscope.capture.gpu as gpu_layer
from stepscope.capture.gpu import GPU_SERIES, _visible_indexes, open_gpus


def probe_for(*gpus: FakeGpu, slow_every: int = 1):
    probe, note = open_gpus(FakeNvml(list(gpus)), all_gpus=True, slow_every=slow_every)
    assert note is None
    return probe


def test_the_fake_covers_every_nvml_call_of_the_layer_with_the_real_signatures():
    source = Path(gpu_layer.__file__).read_text()
    called = set(re.findall(r"\b(nvml[A-Z]\w+)\b", source)) - {"nvmlError"}
    assert called <= set(FAKED_FUNCTIONS), called - set(FAKED_FUNCTIONS)
    for name in FAKED_FUNCTIONS:
        real = list(inspect.signature(getattr(pynvml, name)).parameters)
        fake = list(inspect.signature(getattr(FakeNvml, name)).parameters)[1:]  # without self
        assert fake == real, name


def test_values_flow_into_a_sample():
    probe = probe_for(FakeGpu(util=87, mem_util=33, used=5 << 30, compute=[(1234, 3 << 30)], graphics=[(99, None)]))
    sample = probe.sample()
    assert sample["gpu_util"] == [87] and sample["gpu_mem_util"] == [33]
    assert sample["gpu_mem_used_bytes"] == [5 << 30]
    assert sample["gpu_sm_clock_mhz"] == [1980] and sample["gpu_power_mw"] == [300_000] and sample["gpu_temp_c"] == [45]
    assert sample["gpu_pcie_tx_bytes_per_s"] == [1000 * 1024] and sample["gpu_pcie_rx_bytes_per_s"] == [2000 * 1024]
    assert sample["gproc"] == {"gpu": [0, 0], "pid": [1234, 99], "mem_bytes": [3 << 30, -1]}
    assert sample["gpu_procs_read"] == 1
    (info,) = probe.info()
    assert info == {"index": 0, "name": "NVIDIA H200", "uuid": FakeGpu().uuid, "memory_total_bytes": 141 << 30}


def test_slow_metrics_once_per_period_and_pcie_round_robin():
    nvml = FakeNvml([FakeGpu(), FakeGpu(uuid="GPU-2")])
    probe, _ = open_gpus(nvml, all_gpus=True, slow_every=4)
    samples = [probe.sample() for _ in range(8)]
    assert [sample["gpu_power_mw"][0] for sample in samples] == [300_000, -1, -1, -1] * 2
    assert [sample["gpu_procs_read"] for sample in samples] == [1, 0, 0, 0] * 2
    pcie = [tuple(value >= 0 for value in sample["gpu_pcie_tx_bytes_per_s"]) for sample in samples]
    assert pcie == [(True, False), (False, False), (False, True), (False, False)] * 2  # one GPU at a time
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 16  # fast metrics: every sample, every GPU


def test_unsupported_metric_is_missing_and_noted_once():
    probe = probe_for(FakeGpu(errors={"nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NOT_SUPPORTED}))
    samples = [probe.sample() for _ in range(5)]
    assert all(sample["gpu_power_mw"] == [-1] for sample in samples)
    assert all(sample["gpu_util"] == [50] for sample in samples)
    assert len(probe.notes) == 1 and "power" in probe.notes[0] and "Not Supported" in probe.notes[0]


def test_a_lost_gpu_is_survived():
    nvml = FakeNvml([FakeGpu(), FakeGpu(uuid="GPU-2")])
    probe, _ = open_gpus(nvml, all_gpus=True, slow_every=1)
    probe.sample()
    for name in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetComputeRunningProcesses"):
        nvml.gpus[1].errors[name] = pynvml.NVML_ERROR_GPU_IS_LOST
    sample = probe.sample()
    assert sample["gpu_util"] == [50, -1] and sample["gpu_mem_used_bytes"][1] == -1
    assert any("GPU 1" in note and "lost" in note for note in probe.notes)


def test_an_unexpected_exception_from_nvml_is_survived():
    nvml = FakeNvml([FakeGpu()])
    probe, _ = open_gpus(nvml, all_gpus=True)

    def broken(handle):
        raise OSError("driver went away")

    nvml.nvmlDeviceGetUtilizationRates = broken
    assert probe.sample()["gpu_util"] == [-1]
    assert "driver went away" in probe.notes[0]


@pytest.mark.parametrize("nvml, expected", [
    (FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND), "NVML Shared Library Not Found"),
    (FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED), "Driver Not Loaded"),
    (FakeNvml([]), "sees no GPU"),
])
def test_no_nvml_or_no_gpu_is_one_note(nvml, expected):
    probe, note = open_gpus(nvml)
    assert probe is None and expected in note


def test_missing_pynvml_is_one_note(monkeypatch):
    def missing():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(gpu_layer, "load_nvml", missing)
    probe, note = open_gpus()
    assert probe is None and "not installed" in note


def test_real_nvml_on_this_machine_says_why_there_is_no_gpu():
    probe, note = open_gpus()
    if probe is not None:
        probe.close()
        pytest.skip("this machine has an NVIDIA GPU")
    assert note.startswith("GPU metrics unavailable")


def test_close_shuts_nvml_down():
    nvml = FakeNvml([FakeGpu()])
    probe, _ = open_gpus(nvml, all_gpus=True)
    probe.close()
    assert nvml.calls["nvmlShutdown"] == 1 and not nvml.initialized


def test_processes_listed_in_both_lists_count_once():
    probe = probe_for(FakeGpu(compute=[(7, 100)], graphics=[(7, 100), (8, 5)]))
    assert [(item.pid, item.used_memory_bytes) for item in probe.all_processes()] == [(7, 100), (8, 5)]


@pytest.mark.parametrize("visible, expected", [
    (None, [0, 1, 2]),
    ("", []),
    ("1", [1]),
    ("2,0", [2, 0]),
    ("0,7,1", [0]),  # CUDA stops at the first invalid entry
    ("GPU-bbb", [1]),
    ("MIG-xyz", [0, 1, 2]),
])
def test_cuda_visible_devices(visible, expected):
    uuids = ("GPU-aaa", "GPU-bbb1", "GPU-ccc")
    devices = [gpu_layer.GpuDevice(index, "g", uuid, 1) for index, uuid in enumerate(uuids)]
    assert _visible_indexes(devices, visible) == expected


def test_series_names_are_sample_columns():
    from stepscope.record.samples import SERIES_COLUMNS

    assert set(GPU_SERIES) <= set(SERIES_COLUMNS)
