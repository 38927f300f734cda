"""The machine's rows of the run summary: what the sampler saw (``RunSummary.machine``).

:func:`machine_rows` returns ``(label, text)`` rows — CPU, processes, disk, memory, and GPU when
there was one — and the notes worth a line. It only formats the fields of the summary's
:class:`~stepscope.report.model.MachineView` (whose levels — a saturated core, a starved GPU — are
judged there); a field that was not measured reads "-" or is left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from stepscope.text import printable
from stepscope.units import format_bytes, format_ratio

if TYPE_CHECKING:  # the run's views annotate only: a trace's report builds none
    from stepscope.report.run_view import MachineView, RunSummary


def machine_rows(summary: RunSummary) -> list[tuple[str, Text]]:
    """The machine's rows of the summary (none without a sampler)."""
    signals = summary.machine
    if signals is None:
        return []
    rows: list[tuple[str, Text]] = []
    if signals.sample_count < 2:
        rows.append(("Machine", Text("no samples (the sampler did not run or stopped at once)", style="dim")))
    else:
        rows += [("CPU", _cpu(signals)), ("Processes", _processes(signals)), ("Disk", _disk(signals)),
                 ("Memory", _memory(signals))]
        if signals.gpu_count:
            rows.append(("GPU", _gpu(signals)))
    rows += [("note", Text(printable(note), style="dim")) for note in summary.machine_notes]
    return rows


def _cpu(signals: MachineView) -> Text:
    text = Text(f"{signals.cpu_count or '?'} cores: mean {format_ratio(signals.cpu_util_mean)}, ")
    text.append("busiest ")
    text.append(format_ratio(signals.busiest_core_util), style="red" if signals.busiest_core_saturated else "")
    text.append(f", idlest {format_ratio(signals.idlest_core_util)}")
    if signals.saturated_cores:
        text.append(f", {signals.saturated_cores} saturated", style="red")
    text.append(f"; iowait {format_ratio(signals.iowait_share)}")
    if signals.steal_shown:
        text.append(f"; steal {format_ratio(signals.steal_share)}", style="yellow")
    if signals.runnable_threads_per_core is not None:
        text.append(f"; {signals.runnable_threads_per_core:.2f} runnable/core")
    return text


def _processes(signals: MachineView) -> Text:
    text = Text(f"main {format_ratio(signals.main_cpu_util)} of a core")
    if signals.worker_count:
        text.append(f"; {signals.worker_count} workers at a time, mean ")
        text.append(format_ratio(signals.worker_cpu_util_mean), style="red" if signals.workers_saturated else "")
        if signals.worker_saturation:
            text.append(f" ({format_ratio(signals.worker_saturation)} saturated)", style="red")
    else:
        text.append("; no DataLoader workers")
    if signals.thread_count_max is not None:
        text.append(f"; {signals.thread_count_max} threads max")
    return text


def _disk(signals: MachineView) -> Text:
    text = Text(f"read {_rate(signals.disk_read_bytes_per_s)}")
    if signals.disk_read_bytes_per_s_early is not None:
        text.append(f", {_rate(signals.disk_read_bytes_per_s_early)} → {_rate(signals.disk_read_bytes_per_s_late)}"
                    " from first to last third")
    if signals.page_cache_warming:
        text.append(" (page cache warming)", style="yellow")
    if signals.net_bytes_per_s is not None:
        text.append(f"; net {_rate(signals.net_bytes_per_s)}")
    return text


def _memory(signals: MachineView) -> Text:
    text = Text(f"used up to {format_ratio(signals.memory_used_share_max)}")
    if signals.rss_growth_bytes_per_s is not None:
        sign = "+" if signals.rss_growth_bytes_per_s >= 0 else "-"
        what = "main heap" if signals.rss_growth_basis == "anonymous" else "main RSS"
        text.append(f"; {what} {sign}{_rate(abs(signals.rss_growth_bytes_per_s))}")
    swap_in, swap_out = signals.swap_in_bytes_per_s, signals.swap_out_bytes_per_s
    if swap_in or swap_out:
        text.append(f"; swap in {_rate(swap_in)}, out {_rate(swap_out)}", style="red")
    return text


def _gpu(signals: MachineView) -> Text:
    if not signals.gpu_count:
        return Text("no GPU metrics", style="dim")
    text = Text(f"{signals.gpu_count} GPU{'s' if signals.gpu_count > 1 else ''}: utilization mean ")
    text.append(format_ratio(signals.gpu_util_mean), style="red" if signals.gpu_starved else "")
    text.append(f", swing within a step {format_ratio(signals.gpu_util_oscillation)}")
    text.append(f"; memory up to {format_ratio(signals.gpu_memory_used_share_max)}")
    return text


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{format_bytes(value)}/s"
