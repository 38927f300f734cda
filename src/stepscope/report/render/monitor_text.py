"""The screen of ``stepscope monitor``: one :class:`~stepscope.report.command_views.MonitorView` as rich
(:func:`screen`, which the live view refreshes; :func:`render` prints one frame).

Formatting only: every number comes from the view.
"""

from __future__ import annotations

import math
from typing import Literal

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from stepscope.report.command_views import DeviceRow, MonitorEnded, MonitorView
from stepscope.report.render.output import Output
from stepscope.text import printable
from stepscope.units import format_bytes, format_ratio

_CORES_PER_COLUMN = 16
_BAR_WIDTH = 24


#: A bar's colour by the level the view gives it.
_STYLES = {"high": "red", "busy": "yellow", "low": "green"}


def render(view: MonitorView, out: Output) -> list[str]:
    Console(file=out.stream).print(screen(view))
    return []


def render_ended(view: MonitorEnded, out: Output) -> list[str]:
    Console(file=out.stream).print(f"process {view.pid} has ended")
    return []


class LiveScreen:
    """The live view: ``sampling...`` until the first frame, then each :meth:`show`n frame in place
    (the whole screen on a terminal, given back as it was on exit)."""

    def __init__(self, out: Output) -> None:
        console = Console(file=out.stream)
        self._live = Live(Text("sampling..."), console=console, screen=console.is_terminal, auto_refresh=False,
                          redirect_stdout=False, redirect_stderr=False)

    def __enter__(self) -> LiveScreen:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__(None, None, None)

    def show(self, view: MonitorView) -> None:
        self._live.update(screen(view), refresh=True)


def title(view: MonitorView) -> str:
    scope = f"process {view.pid} and its children" if view.pid is not None else "whole machine"
    return f"stepscope monitor — {view.hostname} — {scope} — every {view.interval_s:g} s"


def screen(frame: MonitorView) -> RenderableType:
    """The whole screen: CPU per core, memory, disks and network, GPUs, processes."""
    parts: list[RenderableType] = [Text(title(frame), style="bold")]
    parts += [_cpu(frame), _memory(frame), _io(frame)]
    if frame.gpus:
        parts.append(_gpus(frame))
    parts.append(_processes(frame))
    parts += [Text(f"note: {printable(note)}", style="dim") for note in frame.notes]
    if frame.live:
        parts.append(Text("q or Ctrl-C to quit", style="dim"))
    return Group(*parts)


def _bar(share: float | None, level: str, width: int = _BAR_WIDTH) -> ProgressBar:
    completed = 0.0 if share is None else max(0.0, min(share, 1.0)) * 100
    style = _STYLES[level]
    return ProgressBar(total=100, completed=completed, width=width, complete_style=style, finished_style=style)


def _cpu(frame: MonitorView) -> Table:
    columns = max(1, math.ceil(len(frame.core_utils) / _CORES_PER_COLUMN))
    table = Table.grid(padding=(0, 1))
    for _ in range(columns):
        table.add_column(justify="right", style="cyan", no_wrap=True)
        table.add_column(no_wrap=True)
        table.add_column(justify="right", no_wrap=True)
    rows = math.ceil(len(frame.core_utils) / columns) if frame.core_utils else 0
    for row in range(rows):
        cells: list[RenderableType] = []
        for column in range(columns):
            core = column * rows + row
            if core < len(frame.core_utils):
                share = frame.core_utils[core]
                cells += [f"cpu{core}", _bar(share, frame.core_levels[core]), format_ratio(share)]
            else:
                cells += ["", "", ""]
        table.add_row(*cells)
    summary = Text(f"CPU {format_ratio(frame.cpu_util)}  iowait {format_ratio(frame.iowait_share)}")
    if frame.load1 is not None:
        summary.append(f"  load {frame.load1:.2f}")
    if frame.runnable_threads is not None:
        summary.append(f"  runnable {frame.runnable_threads}")
    return _single(summary, table)


def _single(*parts: RenderableType) -> Table:
    grid = Table.grid()
    grid.add_row(Group(*parts))
    return grid


def _memory(frame: MonitorView) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="cyan", no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    used = f"{format_bytes(frame.mem_used_bytes)} / {format_bytes(frame.mem_total_bytes)} used"
    grid.add_row("mem", _bar(frame.mem_used_share, frame.mem_level), f"{used}, {format_bytes(frame.mem_cached_bytes)} cache")
    if frame.swap_used_share is not None:
        swap = f"{format_bytes(frame.swap_used_bytes)} / {format_bytes(frame.swap_total_bytes)}"
        if frame.swap_in_bytes_per_s or frame.swap_out_bytes_per_s:
            swap += f", in {_rate(frame.swap_in_bytes_per_s)} out {_rate(frame.swap_out_bytes_per_s)}"
        grid.add_row("swap", _bar(frame.swap_used_share, frame.swap_level), swap)
    return grid


def _io(frame: MonitorView) -> Table:
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    table.add_column("device", style="cyan", no_wrap=True)
    table.add_column("read / recv", justify="right")
    table.add_column("write / sent", justify="right")
    for device in frame.devices:
        table.add_row(Text(f"{device.kind} {printable(device.name)}"), *_pair(device))
    return table


def _pair(device: DeviceRow) -> tuple[str, str]:
    return _rate(device.read_bytes_per_s), _rate(device.write_bytes_per_s)


def _gpus(frame: MonitorView) -> Table:
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    for name in ("gpu", "name", "util", "", "memory", "SM clock", "power", "temp", "PCIe tx/rx"):
        table.add_column(name, no_wrap=True, justify="left" if name in ("name", "") else "right")
    for gpu in frame.gpus:
        memory = "-" if gpu.memory_used_bytes is None else (
            f"{format_bytes(gpu.memory_used_bytes)} / {format_bytes(gpu.memory_total_bytes)}")
        pcie = "-" if gpu.pcie_tx_bytes_per_s is None else (
            f"{_rate(gpu.pcie_tx_bytes_per_s)} / {_rate(gpu.pcie_rx_bytes_per_s)}")
        table.add_row(
            str(gpu.index), Text(printable(gpu.name)), format_ratio(gpu.util), _bar(gpu.util, gpu.util_level, 16), memory,
            "-" if gpu.sm_clock_mhz is None else f"{gpu.sm_clock_mhz} MHz",
            "-" if gpu.power_w is None else f"{gpu.power_w:.0f} W",
            "-" if gpu.temperature_c is None else f"{gpu.temperature_c} °C", pcie,
        )
    return table


def _processes(frame: MonitorView) -> Table:
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold", expand=True)
    with_roles = frame.with_roles  # a process tree, not the machine
    columns: list[tuple[str, Literal["left", "right"], int]] = [("pid", "right", 7), ("user", "left", 8), ("role", "left", 6), ("S", "left", 1), ("CPU", "right", 6),
               ("RSS", "right", 9), ("thr", "right", 3), ("GPU mem", "right", 9)]
    for name, justify, width in columns:
        if name != "role" or with_roles:
            table.add_column(name, justify=justify, no_wrap=True, min_width=width)
    table.add_column("command", no_wrap=True, overflow="ellipsis", ratio=1)
    for row in frame.processes:
        cells = [str(row.pid), row.user, row.role, row.state, format_ratio(row.cpu_util),
                 format_bytes(row.rss_bytes), "-" if row.threads is None else str(row.threads),
                 format_bytes(row.gpu_memory_bytes) if row.gpu_memory_bytes else ""]
        if not with_roles:
            del cells[2]
        table.add_row(*(Text(printable(cell)) for cell in cells), Text(printable(row.command)))  # Text: no markup
    return table


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{format_bytes(value)}/s"
