"""The machine's rows of the run summary, for empty, typical and pathological signals."""

from __future__ import annotations

from dataclasses import replace
from io import StringIO

import pytest
from rich.console import Console
from rich.table import Table

from records import make_record, report_of
from stepscope.analysis.evidence import MacroSignals, WorkerLoad
from stepscope.pipeline.views import machine_view
from stepscope.report.render.machine import machine_rows

TYPICAL = MacroSignals(
    sample_count=300, interval_s=0.1, cpu_count=8, cpu_util_mean=0.42, busiest_core_util=0.97,
    idlest_core_util=0.05, saturated_cores=1, iowait_share=0.01, runnable_threads_per_core=0.8,
    main_cpu_util=0.98, worker_count=4, workers=(WorkerLoad(1, "main", 0.98),), worker_cpu_util_mean=0.6,
    worker_saturation=0.0, thread_count_max=40, disk_read_bytes_per_s=2 << 20, disk_read_bytes_per_s_early=8 << 20,
    disk_read_bytes_per_s_late=1 << 10, page_cache_warming=True, memory_used_share_max=0.5,
    rss_growth_bytes_per_s=1000.0, swap_in_bytes_per_s=0.0, swap_out_bytes_per_s=0.0, net_bytes_per_s=100.0,
    gpu_count=2, gpu_util_mean=0.35, gpu_util_oscillation=0.8, gpu_memory_used_share_max=0.7,
)
PATHOLOGICAL = MacroSignals(
    sample_count=3, cpu_count=2, cpu_util_mean=1.0, busiest_core_util=1.0, idlest_core_util=1.0, saturated_cores=2,
    worker_count=8, worker_cpu_util_mean=1.0, worker_saturation=1.0, rss_growth_bytes_per_s=-5e6,
    swap_in_bytes_per_s=5e6, swap_out_bytes_per_s=7e6, notes=("GPU metrics unavailable: NVML could not start",),
)


SUMMARY = report_of(make_record(20)).summary


def render(signals: MacroSignals, gpu_run: bool = True) -> str:
    notes = signals.notes if gpu_run else ()
    grid = Table.grid(padding=(0, 2))
    grid.add_column()
    grid.add_column()
    for label, text in machine_rows(replace(SUMMARY, machine=machine_view(signals), machine_notes=notes)):
        grid.add_row(label, text)
    console = Console(file=StringIO(), width=100, color_system=None, _environ={})
    console.print(grid)
    return console.file.getvalue()


@pytest.mark.parametrize("signals, expected", [
    (MacroSignals(), ["no samples"]),
    (TYPICAL, ["8 cores: mean 42.0%", "busiest 97.0%", "1 saturated", "4 workers at a time", "40 threads max",
               "8.00 MiB/s → 1.00 KiB/s", "page cache warming", "2 GPUs: utilization mean 35.0%",
               "swing within a step 80.0%", "main RSS +1000 B/s"]),
    (PATHOLOGICAL, ["2 saturated", "(100.0% saturated)", "swap in 4.77 MiB/s", "main RSS -4.77 MiB/s",
                    "GPU metrics unavailable: NVML could not start"]),
])
def test_render_macro(signals, expected):
    text = render(signals)
    for fragment in expected:
        assert fragment in text, (fragment, text)
    assert len(text.splitlines()) <= 8


def test_steal_is_shown_on_a_virtual_machine_whose_host_takes_time():
    from dataclasses import replace

    assert "steal 12.0%" in render(replace(TYPICAL, steal_share=0.12))
    assert "steal" not in render(replace(TYPICAL, steal_share=0.004))  # accounting noise of a VM
    assert "steal" not in render(TYPICAL)


def test_a_run_without_gpu_gets_no_gpu_line_and_no_nvml_note():
    text = render(PATHOLOGICAL, gpu_run=False)
    assert "GPU" not in text and "NVML" not in text


def test_the_pipeline_keeps_nvml_notes_for_gpu_runs_only():
    from stepscope.analysis.bundle import RunEvidence
    from stepscope.pipeline.views import machine_notes
    from stepscope.record.run import DeviceInfo

    signals = replace(PATHOLOGICAL, notes=("GPU metrics unavailable: NVML could not start", "fewer samples"))
    assert machine_notes(RunEvidence(signals=signals)) == ("fewer samples",)
    gpu = DeviceInfo(kind="cuda", index=0, name="NVIDIA H100")
    assert len(machine_notes(RunEvidence(signals=signals, gpu=gpu))) == 2
