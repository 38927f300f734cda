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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepscope import heap
from stepscope.analysis.evidence import TraceEvidence
from stepscope.analysis.trace.critical_path import DEFAULT_PATH_STEPS
from stepscope.analysis.trace.kernel_types import KernelTypeBreakdown, kernel_type_breakdown
from stepscope.analysis.trace.rank_analysis import RankAnalysis, analyze_rank, rank_evidence
from stepscope.analysis.trace.stragglers import RankComparison, compare_ranks
from stepscope.errors import UsageError
from stepscope.traces.load import discover_traces, load_trace

if TYPE_CHECKING:  # the executors are imported where ranks are mapped: one trace needs none (~25 ms)
    from concurrent.futures import Executor

SCHEMA = "stepscope.analyze/1"


@dataclass(frozen=True)
class TraceAnalysis:
    """The analysis of a set of rank traces: each rank's views, the kernel types over all, the ranks compared."""

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
    jobs: int = 1,
    executor: Executor | None = None,
    path_steps: int = DEFAULT_PATH_STEPS,
) -> TraceAnalysis:
    """Analyse every rank's trace; ranks in parallel with ``jobs`` > 1 or an ``executor``.

    The work is a map and a reduce: each trace is decoded and reduced to its :class:`RankAnalysis`
    (views, tables, the per-rank summary) where it runs, its event columns released there; the
    job-level parts (kernel-type breakdown, rank comparison, stragglers) are computed here from
    those results. ``jobs`` > 1 runs the map on that many local processes (one trace per process at
    a time, so memory is bounded by ``jobs`` ranks' columns); for a single trace it decodes a large
    uncompressed file in byte ranges on that many processes (:mod:`stepscope.traces.split_load`)
    and computes part of a large trace's views in a forked child
    (:mod:`stepscope.analysis.trace.beside`). ``executor`` is any
    :class:`concurrent.futures.Executor` — e.g. a Dask cluster's ``Client.get_executor()`` — whose
    workers can import stepscope. The result does not depend on how the map ran. ``progress`` is
    called with a file's decode progress (bytes) in one process, and with (file, ranks done, ranks)
    once per finished rank otherwise. ``path_steps``: the steps whose critical path is computed
    (0: every step; see :func:`~stepscope.analysis.trace.critical_path.path_summary`)."""
    if isinstance(path_or_paths, (str, Path)):
        paths = discover_traces(path_or_paths)
    else:
        paths = [p for item in path_or_paths for p in discover_traces(item)]
    if executor is not None or (jobs > 1 and len(paths) > 1):
        results = _map_ranks(paths, group_by_shape, progress, jobs, executor, path_steps)
    else:
        results = []
        for index, path in enumerate(paths):
            callback = None if progress is None else (lambda done, total, p=path: progress(p, done, total))
            results.append(_analyze_one(path, index, group_by_shape, callback, path_steps,
                                        workers=jobs if len(paths) == 1 else 1))
    seen: dict[int, str] = {}
    for item in results:
        if item.rank in seen and len(paths) > 1:
            from stepscope.errors import InputError

            raise InputError(
                item.path,
                f"rank {item.rank} (from {item.rank_source}) is also claimed by {seen[item.rank]}; "
                "pass traces of one job, one file per rank",
            )
        seen[item.rank] = item.path
    results.sort(key=lambda r: r.rank)
    kinds = kernel_type_breakdown([r.kernel_type_sums for r in results])
    comparison = compare_ranks([r.summary for r in results])
    return TraceAnalysis(tuple(results), kinds, comparison, tuple(rank_evidence(item) for item in results))


def _analyze_one(path: str | Path, index: int, group_by_shape: bool,
                 progress: Callable[[int, int], None] | None = None,
                 path_steps: int = DEFAULT_PATH_STEPS, workers: int = 1) -> RankAnalysis:
    """The map step: one trace file to its rank's analysis (the event table is freed on return).
    Decoding allocates millions of short-lived acyclic objects, and the critical path a graph of
    hundreds of thousands of tuples: no cycle scans meanwhile (they cost the path ~25%). The event
    table and the views cached on it form cycles: one collection of the youngest generation at the
    end frees them at once (everything allocated meanwhile is in it: 2 ms where a full collection,
    which also scans every imported module's objects, takes 7-9 ms)."""
    try:
        with heap.no_cycle_scans(collect_young=True):
            trace = load_trace(path, rank=index, progress=progress, workers=workers)
            result = analyze_rank(trace, group_by_shape=group_by_shape, path_steps=path_steps, workers=workers)
            del trace
    finally:
        heap.trim()  # the next rank in this process starts from the pages this one freed
    return result


@dataclass(frozen=True)
class _Failed:
    """A user-facing error raised in a worker, carried back as plain strings (exception classes
    with their own ``__init__`` do not always survive pickling)."""

    path: str
    message: str


def _analyze_remote(path: str, index: int, group_by_shape: bool, max_bytes: int,
                    path_steps: int = DEFAULT_PATH_STEPS) -> RankAnalysis | _Failed:
    from stepscope import limits
    from stepscope.errors import InputError, StepscopeError

    try:
        with limits.configured(max_bytes):  # the caller's --max-bytes, also on a worker that did not inherit it
            return _analyze_one(path, index, group_by_shape, path_steps=path_steps)
    except InputError as exc:
        return _Failed(exc.path, str(exc))
    except StepscopeError as exc:
        return _Failed(path, str(exc))


def _map_ranks(paths: Sequence[str | Path], group_by_shape: bool, progress: Callable[[str, int, int], None] | None,
               jobs: int, executor: Executor | None, path_steps: int = DEFAULT_PATH_STEPS) -> list[RankAnalysis]:
    from concurrent.futures import as_completed

    from stepscope import limits
    from stepscope.errors import StepscopeError
    from stepscope.executors import local_executor

    limit = limits.max_bytes()
    own = None
    if executor is None:
        own = executor = local_executor(min(jobs, len(paths)))
    try:
        futures = {executor.submit(_analyze_remote, str(path), index, group_by_shape, limit, path_steps): str(path)
                   for index, path in enumerate(paths)}
        results: list[RankAnalysis] = []
        for done, future in enumerate(as_completed(futures), 1):
            outcome = future.result()
            if isinstance(outcome, _Failed):
                for other in futures:
                    other.cancel()
                raise StepscopeError(outcome.message)
            results.append(outcome)
            if progress is not None:
                progress(futures[future], done, len(paths))
        return results
    finally:
        if own is not None:
            own.shutdown(wait=True, cancel_futures=True)


def default_jobs(ranks: int) -> int:
    """Local processes for ``ranks`` traces: one per usable core, at most one per trace."""
    from stepscope.executors import usable_cores

    return max(1, min(usable_cores(), ranks))
