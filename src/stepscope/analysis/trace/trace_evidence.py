"""All trace views for one or several ranks, and the evidence they hand to the diagnosis engine.

Public API::

    analysis = analyze_traces("trace_dir_or_file", group_by_shape=False, progress=None)
    analysis.ranks            # tuple[RankAnalysis, ...], sorted by rank
    analysis.evidence(rank)   # TraceEvidence for the diagnosis rules
    analysis.to_dict()        # the JSON document of ``stepscope analyze --format json``
                              # (schema in docs/analyze-json.md)

``analyze_traces`` accepts a file, a directory of per-rank files, or a list of files; it raises
:class:`~stepscope.errors.InputError` for unusable input. Each rank is decoded, analysed and its
event table released before the next is loaded, so memory holds one rank's columns at a time.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.analysis.evidence import TraceEvidence
from stepscope.analysis.trace.kernel_types import KernelTypeBreakdown, kernel_type_breakdown
from stepscope.analysis.trace.rank_analysis import RankAnalysis, analyze_rank, rank_evidence
from stepscope.analysis.trace.stragglers import RankComparison, compare_ranks
from stepscope.errors import UsageError
from stepscope.traces.load import discover_traces, load_trace

SCHEMA = "stepscope.analyze/1"


@dataclass(frozen=True)
class TraceAnalysis:
    ranks: tuple[RankAnalysis, ...]
    kernel_types: KernelTypeBreakdown
    comparison: RankComparison
    evidences: tuple[TraceEvidence, ...] = ()  # one per rank, in the order of ``ranks``, computed once

    def rank(self, rank: int | None = None) -> RankAnalysis:
        if rank is None:
            return self.ranks[0]
        for item in self.ranks:
            if item.rank == rank:
                return item
        known = ", ".join(str(r.rank) for r in self.ranks)
        raise UsageError(f"no trace for rank {rank} (ranks found: {known})")

    def evidence(self, rank: int | None = None) -> TraceEvidence:
        item = self.rank(rank)
        return self.evidences[self.ranks.index(item)] if self.evidences else rank_evidence(item)

    def to_dict(self, full: bool = True) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "ranks": [r.to_dict(full=full) for r in self.ranks],
            "kernel_types": self.kernel_types.to_dict(),
            "comparison": self.comparison.to_dict(),
        }


def analyze_traces(
    path_or_paths: str | Path | Sequence[str | Path],
    *,
    group_by_shape: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> TraceAnalysis:
    if isinstance(path_or_paths, (str, Path)):
        paths = discover_traces(path_or_paths)
    else:
        paths = [p for item in path_or_paths for p in discover_traces(item)]
    results: list[RankAnalysis] = []
    seen: dict[int, str] = {}
    for index, path in enumerate(paths):
        callback = None if progress is None else (lambda done, total, p=path: progress(p, done, total))
        collecting = gc.isenabled()
        gc.disable()  # decoding allocates millions of short-lived acyclic objects: no cycle scans meanwhile
        try:
            trace = load_trace(path, rank=index, progress=callback)
        finally:
            if collecting:
                gc.enable()
        if trace.rank in seen and len(paths) > 1:
            from stepscope.errors import InputError

            raise InputError(
                trace.path,
                f"rank {trace.rank} (from {trace.rank_source}) is also claimed by {seen[trace.rank]}; "
                "pass traces of one job, one file per rank",
            )
        seen[trace.rank] = trace.path
        results.append(analyze_rank(trace, group_by_shape=group_by_shape))
        del trace
    results.sort(key=lambda r: r.rank)
    kinds = kernel_type_breakdown([r.kernel_type_sums for r in results])
    comparison = compare_ranks([r.summary for r in results])
    return TraceAnalysis(tuple(results), kinds, comparison, tuple(rank_evidence(item) for item in results))
