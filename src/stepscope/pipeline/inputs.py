"""What a diagnosis reads, loaded once: :class:`JobInputs`.

The pipeline's only reading I/O is here. Three ways in, one result:

- :func:`load_run` — a run directory written by ``stepscope run`` (every rank's record with its
  samples and its ``--trace`` window, the ranks that left no record and why, the trials of a
  ``--verify``), or a single record file;
- :func:`inputs_after_run` — the end of a run: the rank's own record, already in memory, with its
  samples; rank 0 of a job waits (bounded) for the other ranks' records and reads them;
- :func:`load_traces` — torch.profiler traces alone (``stepscope analyze``).

A damaged piece of a job costs only itself: a rank whose record cannot be read is a missing rank
with the reason, a samples file that cannot be read leaves that rank without samples, a window
trace that cannot be analysed leaves that rank without trace evidence — each with a note the report
shows. A run of one rank is read strictly (a damaged record or samples file is an
:class:`~stepscope.errors.InputError`: one line, exit 2), except at the end of the run itself,
where the summary is worth more than the samples.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from stepscope.errors import InputError, StepscopeError
from stepscope.record import layout

if TYPE_CHECKING:  # the trace analysis is imported where a trace is read (start-up of `run`), the run
    # record's classes where one is read
    from stepscope.record.run import RunRecord
    from concurrent.futures import Executor

    from stepscope.analysis.bundle import RankBasis
    from stepscope.analysis.run.ranks import MissingRank
    from stepscope.analysis.trace.trace_evidence import TraceAnalysis
    from stepscope.verify import Verification

#: How long rank 0 waits for the other ranks' records after its own (``STEPSCOPE_JOB_WAIT_S``).
DEFAULT_WAIT_S = 60.0
#: How long the merging rank still waits for the other ranks once a signal asks it to end.
HURRY_WAIT_S = 5.0

Source = Literal["run", "trace"]


@dataclass(frozen=True)
class JobInputs:
    """Everything one diagnosis reads, loaded once.

    ``records`` holds every readable rank's record (samples attached), sorted by rank; ``windows``
    the trace views of each rank's ``stepscope run --trace`` window; ``traces`` the analysed traces
    of ``stepscope analyze``; ``missing`` the ranks of the job without a readable record.
    """

    source: Source
    records: tuple[RunRecord, ...] = ()
    windows: dict[int, TraceAnalysis] = field(default_factory=dict)
    traces: TraceAnalysis | None = None
    missing: tuple[MissingRank, ...] = ()
    notes: tuple[str, ...] = ()
    run_dir: Path | None = None
    verification: Verification | None = None
    #: each rank's :class:`~stepscope.analysis.bundle.RankBasis`, when the per-rank map computed it
    #: beside the record (the ranks of a job read in worker processes); the pipeline computes the rest
    bases: dict[int, RankBasis] = field(default_factory=dict)

    @property
    def ranks(self) -> tuple[int, ...]:
        if self.source == "trace":
            return tuple(item.rank for item in self.traces.ranks) if self.traces is not None else ()
        return tuple(record.meta.rank for record in self.records)

    @property
    def world_size(self) -> int:
        declared = max((record.meta.world_size for record in self.records), default=1)
        return max(declared, len(self.records) + len(self.missing))

    @property
    def is_job(self) -> bool:
        """Several ranks to merge: more than one record, or ranks of the job that left none."""
        return len(self.records) > 1 or bool(self.missing)

    def record(self, rank: int) -> RunRecord:
        return next(item for item in self.records if item.meta.rank == rank)


# -- a run directory -------------------------------------------------------------------------------
def load_run(path: str | Path, *, with_windows: bool = True, jobs: int | None = None) -> JobInputs:
    """Every rank of the run at ``path`` (a run directory, or one record file: that record alone).

    The ranks of a job are read in ``jobs`` worker processes (default: one per usable core, at most
    one per rank; 1: in this process), each rank's record, samples, ``--trace`` window and
    :class:`~stepscope.analysis.bundle.RankBasis` in one task: a worker holds one rank at a time.

    Raises:
        InputError: no record at all, or the one record file named is unreadable.
    """
    from stepscope.record.store import load_record, resolve_record_path

    target = Path(path)
    if not target.is_dir():
        record_file = resolve_record_path(target)
        record = load_record(record_file)  # a damaged samples file is an InputError, as the record's
        return _finish(JobInputs("run", (record,), run_dir=record_file.parent), with_windows)
    ranks = layout.record_ranks(target)
    if len(ranks) <= 1:
        record = load_record(resolve_record_path(target))  # the one-line errors: no record, damaged files
        return _finish(JobInputs("run", (record,), run_dir=target), with_windows)
    read = _read_ranks(target, ranks, with_windows, jobs)
    if not read.records:
        reasons = "; ".join(f"rank {item.rank}: {item.reason}" for item in read.unreadable)
        raise InputError(target, f"no rank record could be read ({reasons})")
    return _finish(JobInputs("run", tuple(read.records), notes=tuple(read.notes), run_dir=target,
                             missing=tuple(read.unreadable), windows=read.windows, bases=read.bases), with_windows)


def inputs_after_run(record: RunRecord, run_dir: str | Path, *, wait_s: float | None = None,
                     merge: bool | None = None, hurry: Callable[[], bool] | None = None) -> JobInputs:
    """The inputs at the end of a run: this rank's record (in memory) with its samples; for the rank
    that merges a job (``merge``; default: rank 0), after waiting (bounded, :data:`DEFAULT_WAIT_S`)
    for the other ranks, theirs too (``hurry``: see :func:`wait_for_ranks`)."""
    directory = Path(run_dir)
    record, notes = _with_samples(record, directory)
    merges = record.meta.rank == 0 if merge is None else merge
    if record.meta.world_size <= 1 or not merges:  # its own report: the others may still run
        return _finish(JobInputs("run", (record,), notes=tuple(notes), run_dir=directory), True, job=False)
    wait_for_ranks(directory, record.meta.world_size, wait_s, hurry=hurry)
    others = [rank for rank in layout.record_ranks(directory) if rank != record.meta.rank]
    read = _read_ranks(directory, others, True, 1)  # in the user's process: no worker processes
    ordered = tuple(sorted([record, *read.records], key=lambda item: item.meta.rank))
    return _finish(JobInputs("run", ordered, notes=(*notes, *read.notes), run_dir=directory,
                             missing=tuple(read.unreadable), windows=read.windows, bases=read.bases), True)


@dataclass
class _Read:
    """The ranks of a job, read: records (with samples), unreadable ranks, notes, and what the map
    computed beside each record (its ``--trace`` window's views, its basis)."""

    records: list[RunRecord] = field(default_factory=list)
    unreadable: list[MissingRank] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    windows: dict[int, TraceAnalysis] = field(default_factory=dict)
    bases: dict[int, RankBasis] = field(default_factory=dict)


@dataclass(frozen=True)
class _RankRead:
    """One rank, read by a worker: its basis (which holds the record), or why it could not be read."""

    rank: int
    basis: RankBasis | None = None
    reason: str = ""
    notes: tuple[str, ...] = ()
    window: TraceAnalysis | None = None


def _read_rank(run_dir: str, rank: int, *, with_windows: bool, max_bytes: int) -> _RankRead:
    """The map step of a job's report: one rank's record, samples, window views and basis."""
    from stepscope import limits
    from stepscope.analysis.bundle import rank_basis
    from stepscope.record.store import load_record

    directory = Path(run_dir)
    with limits.configured(max_bytes):  # the caller's --max-bytes, also in a worker that did not inherit it
        try:
            record = load_record(directory, rank, with_samples=False)
        except Exception as exc:  # noqa: BLE001 - one damaged rank must not cost the others
            return _RankRead(rank, reason=f"record unreadable ({exc})")
        record, said = _with_samples(record, directory)
        window, note = window_views(record, directory) if with_windows else (None, None)
        return _RankRead(rank, rank_basis(record), notes=(*said, *([note] if note else [])), window=window)


def _read_ranks(run_dir: Path, ranks: Sequence[int], with_windows: bool, jobs: int | None) -> _Read:
    """Every rank of ``ranks`` read by :func:`_read_rank`: in worker processes when ``jobs`` (default:
    one per usable core, at most one per rank) is above 1, else here; the results in rank order."""
    from stepscope import limits
    from stepscope.analysis.trace.trace_evidence import default_jobs
    from stepscope.executors import local_executor

    workers = default_jobs(len(ranks)) if jobs is None else max(1, min(jobs, len(ranks)))
    read_one = partial(_read_rank, str(run_dir), with_windows=with_windows, max_bytes=limits.max_bytes())
    if workers > 1:
        with local_executor(workers) as executor:
            results = list(executor.map(read_one, ranks))
    else:
        results = [read_one(rank) for rank in ranks]
    from stepscope.analysis.run.ranks import MissingRank

    read = _Read()
    for item in results:
        if item.basis is None:
            read.unreadable.append(MissingRank(item.rank, item.reason))
            continue
        read.records.append(item.basis.record)
        read.bases[item.rank] = item.basis
        if item.window is not None:
            read.windows[item.rank] = item.window
        read.notes += [f"rank {item.rank}: {text}" for text in item.notes]  # a job's ranks: each note says whose
    return read


def _with_samples(record: RunRecord, run_dir: Path) -> tuple[RunRecord, list[str]]:
    from stepscope.record.store import attach_samples

    try:
        return attach_samples(record, run_dir), []
    except Exception as exc:  # noqa: BLE001 - a damaged samples file must not cost the report
        return record, [f"the sampler's samples could not be read ({exc}); the report has no machine metrics"]


def _finish(inputs: JobInputs, with_windows: bool, job: bool = True) -> JobInputs:
    """Add the ranks' profiler windows, the ranks that left no record (``job``), and ``--verify``'s trials."""
    run_dir = inputs.run_dir
    windows: dict[int, TraceAnalysis] = dict(inputs.windows)
    notes = list(inputs.notes)
    if with_windows and run_dir is not None:
        for record in inputs.records:
            if record.meta.rank in inputs.bases:  # read by the map, its window with it
                continue
            analysis, note = window_views(record, run_dir)
            if analysis is not None:
                windows[record.meta.rank] = analysis
            if note:
                notes.append(note if len(inputs.records) == 1 else f"rank {record.meta.rank}: {note}")
    missing = list(inputs.missing)
    if job and run_dir is not None and run_dir.is_dir():
        present = {record.meta.rank for record in inputs.records} | {item.rank for item in missing}
        declared = max((record.meta.world_size for record in inputs.records), default=1)
        names = {child.name for child in run_dir.iterdir()}  # one listing, not three stats per declared rank
        missing += [missing_rank(run_dir, rank, names) for rank in range(declared) if rank not in present]
    verification = None
    if run_dir is not None and (run_dir / layout.VERIFICATION_FILE).is_file():  # the trials' module only for them
        from stepscope import verify

        verification = verify.load(run_dir)
    return replace(inputs, windows=windows, notes=tuple(notes), verification=verification,
                   missing=tuple(sorted(missing, key=lambda item: item.rank)))


def window_views(record: RunRecord, run_dir: Path) -> tuple[TraceAnalysis | None, str | None]:
    """The trace views of the run's last torch.profiler window (``stepscope run --trace``), or a note."""
    windows = [window for window in record.profiler_windows if window.trace_path]
    if not windows:
        return None, None
    path = run_dir / str(windows[-1].trace_path)
    try:
        from stepscope.analysis.trace.trace_evidence import analyze_traces

        return analyze_traces(path), None
    except (StepscopeError, OSError) as exc:
        return None, f"profiler window trace not analyzed: {exc}"


def window_trace_path(record: RunRecord, run_dir: Path | None) -> Path | None:
    """The file of the run's last profiler window, when it has one."""
    windows = [window for window in record.profiler_windows if window.trace_path]
    return run_dir / str(windows[-1].trace_path) if windows and run_dir is not None else None


# -- the ranks of a job ----------------------------------------------------------------------------
def job_wait_s() -> float:
    """How long rank 0 waits for the other ranks' records (``STEPSCOPE_JOB_WAIT_S``, default 60 s)."""
    try:
        return float(os.environ.get("STEPSCOPE_JOB_WAIT_S", DEFAULT_WAIT_S))
    except ValueError:
        return DEFAULT_WAIT_S


def wait_for_ranks(run_dir: str | Path, world_size: int, timeout_s: float | None = None,
                   poll_s: float = 0.2, hurry: Callable[[], bool] | None = None) -> list[int]:
    """Wait until every rank below ``world_size`` has a record, or has ended without one, or the
    timeout passes; returns the ranks that have a record. Once ``hurry()`` says so (a signal came:
    the launcher tears the job down, or Ctrl-C), the wait lasts at most :data:`HURRY_WAIT_S` more,
    time enough for ranks torn down with this one to save their records."""
    if timeout_s is None:
        timeout_s = job_wait_s()
    path = Path(run_dir)
    deadline = time.monotonic() + max(0.0, timeout_s)
    hurried = False
    while True:
        if hurry is not None and not hurried and hurry():
            hurried = True
            deadline = min(deadline, time.monotonic() + HURRY_WAIT_S)
        present = layout.record_ranks(path)
        pending = [rank for rank in range(world_size)
                   if rank not in present and layout.rank_may_still_write(path, rank)]
        if not pending or time.monotonic() >= deadline:
            return present
        time.sleep(poll_s)


def missing_rank(run_dir: Path, rank: int, names: set[str] | None = None) -> MissingRank:
    """A rank without a record, and what its other files say (``names``: the directory's file
    names, when the caller listed it once)."""
    from stepscope.analysis.run.ranks import MissingRank

    def exists(path: Path) -> bool:
        return path.name in names if names is not None else path.exists()

    samples = layout.samples_path(run_dir, rank)
    if exists(layout.partial_record_path(run_dir, rank)):
        ran, last = _samples_span(samples) if exists(samples) else (None, None)
        seen = f" after {ran:.1f} s" if ran is not None else ""
        return MissingRank(rank, f"no record: the process was killed{seen}; its last checkpoint is kept "
                                 f"(stepscope report {run_dir} --rank {rank} reads it)", ran, last)
    if exists(samples):
        ran, last = _samples_span(samples)
        seen = f"; its samples file shows it ran {ran:.1f} s" if ran is not None else "; its samples file is empty"
        return MissingRank(rank, f"no record: the process crashed or was killed before writing it{seen}", ran, last)
    if exists(layout.lock_path(run_dir, rank)):
        return MissingRank(rank, "no record and no samples: it started capture, then ended before sampling")
    return MissingRank(rank, "no files at all: the rank never started capture (or wrote elsewhere)", started=False)


def _samples_span(path: Path) -> tuple[float | None, int | None]:
    """How long the samples file saw the process run (seconds), and its last sample (wall clock, ns)."""
    try:
        from stepscope.record.samples import load_samples

        samples = load_samples(path)
    except Exception:  # noqa: BLE001 - unreadable: say nothing about its length
        return None, None
    stamps = samples.ts_ns
    if len(stamps) < 1:
        return None, None
    last = int(stamps[-1]) + samples.meta.start_wall_ns - samples.meta.start_ns if samples.meta.start_wall_ns else None
    return float(stamps[-1] - stamps[0]) / 1e9, last


def is_job_dir(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds (or should hold) several ranks' records."""
    path = Path(run_dir)
    if not path.is_dir():
        return False
    ranks = layout.record_ranks(path)
    if len(ranks) > 1:
        return True
    if not ranks:
        return False
    from stepscope.record.store import load_record

    try:
        return load_record(path, ranks[0], with_samples=False).meta.world_size > 1
    except Exception:  # noqa: BLE001
        return False


# -- traces alone ----------------------------------------------------------------------------------
def load_traces(path: str | Path | Sequence[str | Path], *, group_by_shape: bool = False,
                progress: Callable[[str, int, int], None] | None = None, jobs: int = 1,
                executor: Executor | None = None, path_steps: int | None = None) -> JobInputs:
    """torch.profiler traces (a file, a directory of per-rank files, or a list), analysed; ranks in
    parallel on ``jobs`` local processes or on ``executor`` (see ``analyze_traces``)."""
    from stepscope.analysis.trace.trace_evidence import analyze_traces

    from stepscope.analysis.trace.critical_path import DEFAULT_PATH_STEPS

    steps = DEFAULT_PATH_STEPS if path_steps is None else path_steps
    return JobInputs("trace", traces=analyze_traces(path, group_by_shape=group_by_shape, progress=progress,
                                                    jobs=jobs, executor=executor, path_steps=steps))


__all__ = ["DEFAULT_WAIT_S", "JobInputs", "inputs_after_run", "is_job_dir", "job_wait_s", "load_run", "load_traces",
           "missing_rank", "wait_for_ranks", "window_trace_path", "window_views"]
