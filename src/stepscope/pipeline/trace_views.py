"""The trace views of the :class:`~stepscope.report.model.Report`: each traced rank's category
shares, idle and launch statistics, operator and kernel pages and critical path, computed from its
analysis (``stepscope analyze``'s traces, or a run's profiler window). The run's sections are
:mod:`stepscope.pipeline.views`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepscope.report.model import (CriticalPathView, LaunchSummary, PathSegmentRow, PathStretches, TABLE_ROWS,
                                    TraceRankView, TraceViews)

if TYPE_CHECKING:
    from stepscope.analysis.trace.critical_path import PathSummary
    from stepscope.analysis.trace.rank_analysis import RankAnalysis
    from stepscope.analysis.trace.trace_evidence import TraceAnalysis


def trace_views(analysis: TraceAnalysis, from_window: bool) -> TraceViews:
    comparison = tuple((item.rank, item.step_time_us, item.idle_share, item.compute_share)
                       for item in analysis.comparison.ranks)
    return TraceViews(tuple(trace_rank_view(item) for item in analysis.ranks), comparison,
                      analysis.comparison.stragglers, from_window, analysis)


def trace_rank_view(item: RankAnalysis) -> TraceRankView:
    from stepscope.analysis.trace.step_breakdown import CATEGORIES

    steps = item.steps
    temporal = item.temporal
    python = item.python
    launches = item.launches
    summary = launches.summary() if launches.count else None
    return TraceRankView(
        rank=item.rank, path=item.path, rank_source=item.rank_source, device_name=item.device_name,
        categories=tuple((category, steps.mean_us.get(category), steps.share(category)) for category in CATEGORIES),
        step_time_us=steps.mean_us.get("Total"),
        per_step_us=tuple((name, {key: value for key, value in values.items() if key != "Total"})
                          for name, values in zip(steps.step_names, steps.per_step_us)),
        devices=item.devices,
        temporal=None if temporal is None else (temporal.idle_share, temporal.compute_share,
                                                temporal.non_compute_share, temporal.kernel_time_us),
        idle_streams=item.idle.shares() if temporal is not None else None,
        comm_overlap=item.overlap.overlap_share,
        launches=None if summary is None else LaunchSummary(
            count=int(summary["count"]), delay_p50_us=float(summary["launch_delay_us"]["p50"]),
            short_kernels=int(summary["short_gpu_kernels"]), runtime_outliers=int(summary["runtime_outliers"]),
            delay_outliers=int(summary["launch_delay_outliers"])),
        host=None if python is None else {part: python.share(part) for part in ("python", "aten", "runtime")},
        memory=item.memory.devices, allocators=item.memory.top_operators,
        operators=item.operators.rows, operators_by_shape=item.operators.grouped_by_shape,
        kernels=item.kernels.rows, notes=(*steps.notes, *item.warnings), critical=critical_path_view(item.critical),
        operators_shown=_largest(item.operators.rows, "host_total_us"), kernels_shown=_largest(item.kernels.rows, "total_us"))


def critical_path_view(path: PathSummary | None) -> CriticalPathView | None:
    """The critical path as the views show it: its shares worth showing (in display order and
    largest first), its longest segments and the drawn step's stretches, each bound kind labelled."""
    if path is None:
        return None
    shares = tuple((kind, path.label(kind), share) for kind, share in path.shown_shares().items())
    return CriticalPathView(
        steps=len(path.steps), length_us=path.length_us, per_step_us=path.per_step_us,
        labels={kind: path.label(kind) for kind in path.KINDS}, shares=shares,
        shares_ranked=tuple(sorted(shares, key=lambda row: (row[2], row[0]), reverse=True)),
        after_sync_us=path.after_sync_us, after_sync_share=path.after_sync_share, syncs=path.syncs,
        notes=path.notes,
        segments=tuple(PathSegmentRow(item.name, item.stream, path.label(item.bound), item.why,
                                      item.per_step_us, item.share, item.count) for item in path.segments),
        shown_step=path.shown_step,
        stretches=_stretches(path))


def _stretches(path: PathSummary) -> PathStretches:
    """The drawn step's path as the view's stretches: the summary's columns, rows only when read."""
    spans = path.spans
    kinds = spans.KINDS
    return PathStretches(spans.strings, spans.name, kinds, tuple(path.label(kind) for kind in kinds), spans.bound,
                         spans.ts_us, spans.end_us, spans.pid, spans.tid, spans.stream)


def _largest(rows: tuple[Any, ...], key: str) -> tuple[Any, ...]:
    """A table's rows as a page holds them: all, or the TABLE_ROWS largest by ``key``."""
    if len(rows) <= TABLE_ROWS:
        return rows
    return tuple(sorted(rows, key=lambda row: -getattr(row, key))[:TABLE_ROWS])
