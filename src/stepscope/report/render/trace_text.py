"""The terminal view of ``stepscope analyze``: the verdict first, then each rank's trace views.

Formatting only: every share and count comes from the report's
:class:`~stepscope.report.model.TraceViews`. Strings from traces (operator and kernel names,
paths) are escaped and wrapped in ``Text`` so rich never reads them as markup. In a terminal long
names are cut to the width; in a file or a pipe they are printed whole.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from stepscope.report.model import Report, TraceRankView, TraceViews
from stepscope.report.render.output import Output
from stepscope.report.render.terminal import console_for, finding_block, print_wide
from stepscope.text import printable
from stepscope.units import format_bytes, format_duration, format_ratio

#: Characters of an operator or kernel name in a terminal (names are whole in a file or a pipe).
NAME_WIDTH = 48


def _us(value: float | None) -> str:
    return format_duration(None if value is None else value / 1e6)


def _name(name: str, cut: bool) -> Text:
    name = printable(name)
    return Text(name if not cut or len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…")


def _overview(rank: TraceRankView) -> RenderableType:
    table = Table()
    table.add_column("Category")
    table.add_column("Time", justify="right")
    table.add_column("Share", justify="right")
    for category, mean_us, share in rank.categories:
        table.add_row(category, _us(mean_us), format_ratio(share))
    table.add_row("Step", _us(rank.step_time_us), "", style="bold")
    return Group(Text(f"Step time breakdown, mean of {len(rank.per_step_us)} step(s)", style="italic"), table)


def _gpu(rank: TraceRankView) -> RenderableType | None:
    lines = []
    for device in rank.devices:
        lines.append(f"GPU {device.device}: utilization {format_ratio(device.utilization)}, est. SM efficiency "
                     f"{format_ratio(device.sm_efficiency)}, est. achieved occupancy "
                     f"{format_ratio(device.achieved_occupancy)}, Tensor Core kernel time {format_ratio(device.tc_share)}")
    if rank.temporal is not None:
        idle, compute, non_compute, kernel_time_us = rank.temporal
        lines.append(f"GPU time (HTA): idle {format_ratio(idle)}, compute {format_ratio(compute)}, "
                     f"non-compute {format_ratio(non_compute)} of {_us(kernel_time_us)}")
        if rank.idle_streams is not None:
            parts = ", ".join(f"{key.replace('_', ' ')} {format_ratio(value)}" for key, value in rank.idle_streams.items())
            lines.append(f"Idle gaps per stream: {parts}")
    if rank.comm_overlap is not None:
        lines.append(f"Communication hidden under computation: {format_ratio(rank.comm_overlap)}")
    launches = rank.launches
    if launches is not None:
        lines.append(f"Launches: {launches.count}, median launch delay {_us(launches.delay_p50_us)}, "
                     f"{launches.short_kernels} kernels shorter than their launch call, "
                     f"{launches.runtime_outliers} launch calls > 50 µs, {launches.delay_outliers} delays > 100 µs")
    if rank.host is not None:
        lines.append(f"Host thread time: Python {format_ratio(rank.host['python'])}, ATen ops "
                     f"{format_ratio(rank.host['aten'])}, runtime {format_ratio(rank.host['runtime'])}")
    for memory in rank.memory:
        lines.append(f"Memory {memory.device}: peak allocated {format_bytes(memory.peak_allocated_bytes)} "
                     f"at {_us(memory.peak_at_us)}")
    return Text("\n".join(printable(line) for line in lines)) if lines else None


def _critical(rank: TraceRankView, top: int, cut: bool) -> RenderableType | None:
    """What bounds the steps: the critical path's shares and its longest segments."""

    path = rank.critical
    if path is None or path.length_us <= 0:
        return None
    steps = path.steps
    head = Text(f"What bounds the step: its critical path ({steps} step{'s' if steps != 1 else ''}, "
                f"{_us(path.per_step_us)} per step)", style="italic")
    lines = ["  " + " · ".join(f"{label} {format_ratio(share)}" for _, label, share in path.shares_ranked)]
    if path.after_sync_us > 0:
        lines.append(f"  device idle while the path is on the host after a sync: {format_ratio(path.after_sync_share)}")
    for sync in path.syncs[:3]:
        lines.append(f"  the path waited: {printable(sync)}")
    for note in path.notes:
        lines.append(f"  note: {printable(note)}")
    table = Table(title="Top critical-path segments", title_justify="left")
    for column, width in (("Time/step", 9), ("Share", 6), ("Count", 5), ("Where", 9)):
        table.add_column(column, justify="right", no_wrap=True, min_width=width)
    table.add_column("Bound by", no_wrap=True, min_width=max(len(label) for label in path.labels.values()))
    table.add_column("Segment", overflow="fold")  # a long kernel name folds: every column stays readable
    for segment in path.segments[:top]:
        table.add_row(_us(segment.per_step_us), format_ratio(segment.share), str(segment.count),
                      "CPU" if segment.stream < 0 else f"stream {segment.stream}", segment.label,
                      _name(segment.name, cut))
    return Group(head, Text("\n".join(lines)), table)


def _operators(rank: TraceRankView, top: int, cut: bool) -> Table | None:
    rows = rank.operators[:top]
    if not rows:
        return None
    table = Table(title="Top operators", title_justify="left")
    table.add_column("Operator", no_wrap=True)
    for column in ("Calls", "Dev self", "Dev tot", "Host self", "Host tot"):
        table.add_column(column, justify="right", no_wrap=True, min_width=max(len(column), 7))
    for row in rows:
        name = row.name + (f" {row.input_shape}" if row.input_shape else "")
        table.add_row(_name(name, cut), str(row.calls), _us(row.device_self_us), _us(row.device_total_us),
                      _us(row.host_self_us), _us(row.host_total_us))
    return table


def _kernels(rank: TraceRankView, top: int, cut: bool) -> Table | None:
    rows = rank.kernels[:top]
    if not rows:
        return None
    table = Table(title="Top kernels", title_justify="left")
    table.add_column("Kernel", no_wrap=True)
    for column in ("Calls", "Total", "Mean", "Blk/SM", "Occ.", "TC"):
        table.add_column(column, justify="right", no_wrap=True,
                         min_width=len(column) if column == "TC" else max(len(column), 7))
    for row in rows:
        table.add_row(_name(row.name, cut), str(row.calls), _us(row.total_us), _us(row.mean_us),
                      f"{row.blocks_per_sm:.2f}", f"{row.occupancy_pct:.1f}%", "yes" if row.tensor_cores else "")
    return table


def _verdict(report: Report) -> RenderableType:
    if not report.findings:
        return Text("No findings from the trace evidence.")
    return Group(*(finding_block(finding, number) for number, finding in enumerate(report.findings, 1)))


def renderables(report: Report, top: int = 10, cut: bool = True) -> list[RenderableType]:
    """The verdict, each rank's views, and the rank comparison."""
    views: TraceViews | None = report.traces
    if views is None:
        return []
    parts: list[RenderableType] = [Rule(Text("Verdict"), align="left"), _verdict(report)]
    for rank in views.ranks:
        title = Text(f"rank {rank.rank} ({rank.rank_source}) — {printable(rank.path)}")
        body: list[RenderableType] = [_overview(rank)]
        for part in (_critical(rank, top, cut), _gpu(rank), _operators(rank, top, cut), _kernels(rank, top, cut)):
            if part is not None:
                body.append(part)
        if rank.notes:
            body.append(Text("\n".join(f"note: {printable(note)}" for note in rank.notes), style="yellow"))
        parts += [Rule(title, align="left"), Group(*body)]
    if len(views.ranks) > 1:
        table = Table(title="Ranks", title_justify="left")
        for column in ("Rank", "Step time", "GPU idle", "GPU compute"):
            table.add_column(column, justify="right")
        for rank_id, step_us, idle, compute in views.comparison:
            table.add_row(str(rank_id), _us(step_us), format_ratio(idle), format_ratio(compute))
        parts.append(table)
        stragglers = views.stragglers
        parts.append(Text("Straggler candidates: " + (", ".join(f"rank {r}" for r in stragglers) if stragglers else "none")))
    for message in report.warnings:
        parts.append(Text(f"warning: {printable(message)}", style="yellow"))
    return parts


def render(report: Report, out: Output) -> list[str]:
    console = console_for(out)
    for part in renderables(report, out.top, cut=console.is_terminal):
        print_wide(console, part)
    return []
