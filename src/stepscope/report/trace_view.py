"""Terminal rendering of ``stepscope analyze`` results with rich.

Contract: :func:`render_trace_report` turns the :class:`~stepscope.report.model.Report` of a trace
analysis (its :class:`~stepscope.analysis.trace.trace_evidence.TraceAnalysis` and each rank's
findings) into rich renderables. It formats numbers only; every value comes from the
analysis. Strings from traces (operator and kernel names, paths) are wrapped in ``Text`` so rich
never interprets them as markup.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from stepscope.diagnosis.findings import Finding
from stepscope.report.model import Report
from stepscope.report.terminal import finding_block
from stepscope.text import printable
from stepscope.units import format_bytes, format_duration, format_ratio

_CATEGORIES = ("Kernel", "Memcpy", "Memset", "Communication", "Runtime", "DataLoader", "CPU Exec", "Other")


def _us(value: float | None) -> str:
    return format_duration(None if value is None else value / 1e6)


def _short(name: str, width: int = 70) -> Text:
    name = printable(name)
    return Text(name if len(name) <= width else name[: width - 1] + "…")


def _overview(rank: Any) -> RenderableType:
    steps = rank.steps
    table = Table()
    table.add_column("Category")
    table.add_column("Time", justify="right")
    table.add_column("Share", justify="right")
    for category in _CATEGORIES:
        table.add_row(category, _us(steps.mean_us.get(category)), format_ratio(steps.share(category)))
    table.add_row("Step", _us(steps.mean_us.get("Total")), "", style="bold")
    return Group(Text(f"Step time breakdown, mean of {len(steps.step_names)} step(s)", style="italic"), table)


def _gpu(rank: Any) -> RenderableType | None:
    lines = []
    for d in rank.devices:
        lines.append(
            f"GPU {d.device}: utilization {format_ratio(d.utilization)}, est. SM efficiency "
            f"{format_ratio(d.sm_efficiency)}, est. achieved occupancy {format_ratio(d.achieved_occupancy)}, "
            f"Tensor Core kernel time {format_ratio(d.tc_share)}"
        )
    t = rank.temporal
    if t is not None:
        lines.append(
            f"GPU time (HTA): idle {format_ratio(t.idle_share)}, compute {format_ratio(t.compute_share)}, "
            f"non-compute {format_ratio(t.non_compute_share)} of {_us(t.kernel_time_us)}"
        )
        shares = rank.idle.shares()
        if shares is not None:
            parts = ", ".join(f"{k.replace('_', ' ')} {format_ratio(v)}" for k, v in shares.items())
            lines.append(f"Idle gaps per stream: {parts}")
    if rank.overlap.overlap_share is not None:
        lines.append(f"Communication hidden under computation: {format_ratio(rank.overlap.overlap_share)}")
    launches = rank.launches.summary()
    if launches.get("count"):
        lines.append(
            f"Launches: {launches['count']}, median launch delay {_us(launches['launch_delay_us']['p50'])}, "
            f"{launches['short_gpu_kernels']} kernels shorter than their launch call, "
            f"{launches['runtime_outliers']} launch calls > 50 µs, {launches['launch_delay_outliers']} delays > 100 µs"
        )
    if rank.python is not None:
        p = rank.python
        lines.append(
            f"Host thread time: Python {format_ratio(p.share('python'))}, ATen ops {format_ratio(p.share('aten'))}, "
            f"runtime {format_ratio(p.share('runtime'))}"
        )
    for d in rank.memory.devices:
        lines.append(f"Memory {d.device}: peak allocated {format_bytes(d.peak_allocated_bytes)} at {_us(d.peak_at_us)}")
    return Text("\n".join(printable(line) for line in lines)) if lines else None


def _operators(rank: Any, top: int) -> Table | None:
    rows = rank.operators.rows[:top]
    if not rows:
        return None
    table = Table(title="Top operators", title_justify="left")
    table.add_column("Operator", no_wrap=True, overflow="ellipsis", max_width=20)
    for col in ("Calls", "Dev self", "Dev tot", "Host self", "Host tot"):
        table.add_column(col, justify="right", no_wrap=True, min_width=max(len(col), 7))
    for r in rows:
        name = r.name + (f" {r.input_shape}" if r.input_shape else "")
        table.add_row(
            _short(name), str(r.calls), _us(r.device_self_us), _us(r.device_total_us), _us(r.host_self_us), _us(r.host_total_us)
        )
    return table


def _kernels(rank: Any, top: int) -> Table | None:
    rows = rank.kernels.rows[:top]
    if not rows:
        return None
    table = Table(title="Top kernels", title_justify="left")
    table.add_column("Kernel", no_wrap=True, overflow="ellipsis", max_width=20)
    for col in ("Calls", "Total", "Mean", "Blk/SM", "Occ.", "TC"):
        table.add_column(col, justify="right", no_wrap=True, min_width=len(col) if col == "TC" else max(len(col), 7))
    for r in rows:
        table.add_row(
            _short(r.name), str(r.calls), _us(r.total_us), _us(r.mean_us), f"{r.blocks_per_sm:.2f}",
            f"{r.occupancy_pct:.1f}%", "yes" if r.tensor_cores else "",
        )
    return table


def _findings(findings: tuple[Finding, ...]) -> RenderableType:
    if not findings:
        return Text("No findings from the trace evidence.")
    return Group(*(finding_block(finding, index) for index, finding in enumerate(findings, 1)))


def render_trace_report(report: Report, top: int = 10) -> Iterator[RenderableType]:
    """The views of each rank the report covers, its findings, and the rank comparison."""
    analysis = report.trace_analysis
    if analysis is None:
        return
    findings = {part.rank: part.diagnosis.findings for part in report.ranks}
    shown = [r for r in analysis.ranks if r.rank in findings]
    for rank in shown:
        title = Text(f"rank {rank.rank} ({rank.rank_source}) — {printable(rank.path)}")
        body: list[RenderableType] = [_overview(rank)]
        for part in (_gpu(rank), _operators(rank, top), _kernels(rank, top)):
            if part is not None:
                body.append(part)
        if rank.steps.notes or rank.warnings:
            body.append(Text("\n".join(f"note: {printable(n)}" for n in (*rank.steps.notes, *rank.warnings)), style="yellow"))
        body.append(Panel(_findings(findings.get(rank.rank, ())), title="Findings", title_align="left"))
        yield Rule(title, align="left")
        yield Group(*body)
    if len(analysis.ranks) > 1:
        table = Table(title="Ranks", title_justify="left")
        for col in ("Rank", "Step time", "GPU idle", "GPU compute"):
            table.add_column(col, justify="right")
        for s in analysis.comparison.ranks:
            table.add_row(str(s.rank), _us(s.step_time_us), format_ratio(s.idle_share), format_ratio(s.compute_share))
        yield table
        stragglers = analysis.comparison.stragglers
        yield Text(
            "Straggler candidates: " + (", ".join(f"rank {r}" for r in stragglers) if stragglers else "none")
        )
