"""Per-rank numbers of a job: one row per rank for the merged report, plus the ranks that left no record.

Durations are per-step means of each rank's steady state (rank clocks are not compared, only
durations and shares). ``compute`` is forward + backward + optimizer; ``communication`` is the
exposed wait in collectives (the ``communication`` phase) and ``overlapped`` the collective time
hidden under backward.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from stepscope.analysis.bundle import RunEvidence
from stepscope.record import layout


@dataclass(frozen=True)
class RankRow:
    rank: int
    node: int
    hostname: str
    steps: int
    step_time_s: float | None
    data_wait_s: float | None
    compute_s: float | None
    communication_s: float | None  # exposed (the step waits)
    overlapped_s: float | None  # ran under backward
    cpu_util: float | None  # main process, share of one core
    rss_bytes: int | None  # main process, peak over the run
    exit_code: int | None
    top_finding: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MissingRank:
    """A rank of the job without a record, and what its other files say."""

    rank: int
    reason: str
    ran_s: float | None = None  # how long its sampler saw it run
    last_seen_wall_ns: int | None = None  # its sampler's last sample (wall clock): about when it ended
    started: bool = True  # it started capture (its lock or other files are there)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class JobFailure:
    """The rank of a job that failed first: when (its step), how (exit code, exception, signal).

    ``step`` counts from 1: the step the rank was in when it failed (``steps_completed`` + 1); for a
    rank that left no record it is the step the ranks that failed after it were in (``inferred``).
    """

    rank: int
    how: str  # "exception", "exit", "os._exit", "signal", "killed" (no record: nothing it could catch)
    exit_code: int | None  # as the launcher sees it: negative for a signal (-9: SIGKILL)
    signal: str | None
    exception: str | None
    step: int | None
    steps_completed: int | None
    inferred: bool  # the step is the other ranks' (this rank left no record)
    then: tuple[int, ...]  # the ranks that failed after it, in order
    text: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: The note capture adds when the script ends the process with ``os._exit(n)`` (capture/session.py).
OS_EXIT_NOTE = "the script ended the process with os._exit("


def first_failure(records: list[Any], missing: list[MissingRank]) -> JobFailure | None:
    """The rank that failed first, among ranks whose record says they failed (a non-zero exit, an
    exception, a signal) and ranks that left no record after starting (killed outright: SIGKILL,
    the OOM killer, or a native crash). Ordered by when each ended (wall clock: each record's end,
    a missing rank's last sample); a rank without a time comes first (the others' failures are
    normally its consequence). None when no rank failed."""
    ends: list[tuple[int, int, dict[str, Any]]] = []  # (order key, rank, facts)
    for record in records:
        meta = record.meta
        if not (meta.exit_code or meta.exception is not None or meta.interrupted_by is not None):
            continue
        facts: dict[str, Any] = {"steps": len(record.steps), "exception": meta.exception, "signal": meta.interrupted_by,
                                 "exit_code": meta.exit_code}
        if meta.interrupted_by is not None:
            facts["how"] = "signal"
            number = _signal_number(meta.interrupted_by)
            facts["exit_code"] = -number if number else meta.exit_code
        elif meta.exception is not None:
            facts["how"] = "exception"
        elif any(str(note).startswith(OS_EXIT_NOTE) for note in record.warnings):
            facts["how"] = "os._exit"
        else:
            facts["how"] = "exit"
        ends.append((meta.end_wall_ns or 0, meta.rank, facts))
    for item in missing:
        if not item.started:
            continue
        ends.append((item.last_seen_wall_ns or 0, item.rank,
                     {"how": "killed", "steps": None, "exception": None, "signal": "SIGKILL", "exit_code": -9}))
    if not ends:
        return None
    ends.sort(key=lambda end: (end[0], end[1]))
    _, rank, facts = ends[0]
    later = ends[1:]
    completed, inferred = facts["steps"], False
    if completed is None:
        counts = [other["steps"] for _, _, other in later if other["steps"] is not None]
        completed, inferred = (min(counts), True) if counts else (None, False)
    step = completed + 1 if completed is not None else None
    failure = JobFailure(rank=rank, how=facts["how"], exit_code=facts["exit_code"], signal=facts["signal"],
                         exception=facts["exception"], step=step, steps_completed=completed, inferred=inferred,
                         then=tuple(other_rank for _, other_rank, _ in later), text="")
    return replace(failure, text=failure_text(failure))


def failure_text(failure: JobFailure) -> str:
    """One line: which rank failed first, in which step, how."""
    if failure.how == "exception":
        how = f"{failure.exception} raised (exit {failure.exit_code})"
    elif failure.how == "os._exit":
        how = f"os._exit({failure.exit_code})"
    elif failure.how == "exit":
        how = f"exit {failure.exit_code}"
    elif failure.how == "signal":
        how = f"killed by {failure.signal} (exit {failure.exit_code})"
    else:
        how = ("killed by SIGKILL (exit -9): it ended without a record and without an exception, an exit or a "
               "signal it could catch (kill -9, the OOM killer; or a native crash)")
    if failure.step is None:
        where = "in an unknown step"
    elif failure.inferred:
        where = f"in step {failure.step} (the step the ranks that failed after it were in)"
    else:
        where = f"in step {failure.step} ({failure.steps_completed} steps completed)"
    after = f"; then rank{'s' if len(failure.then) > 1 else ''} {', '.join(map(str, failure.then))}" \
        if failure.then else ""
    return f"rank {failure.rank} failed first, {where}: {how}{after}"


def _signal_number(name: str) -> int | None:
    import signal

    number = getattr(signal, name, None)
    return int(number) if number is not None else None


@dataclass(frozen=True)
class RankSpread:
    """How far the ranks' step times and own work are apart."""

    step_time_min_s: float
    step_time_max_s: float
    step_time_spread: float  # (max - min) / min
    slowest_rank: int
    fastest_rank: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rank_row(evidence: RunEvidence, top_finding: str | None = None) -> RankRow:
    record = evidence.record
    assert record is not None
    steady = evidence.steady
    signals = evidence.signals

    def per_step(*phases: str) -> float | None:
        if steady is None:
            return None
        return sum(steady.shares.get(phase, 0.0) for phase in phases) * steady.step_time_mean_s

    rss = None
    if signals is not None:
        mains = [load.rss_bytes for load in signals.workers if load.role == "main" and load.rss_bytes]
        rss = max(mains) if mains else None
    comm = evidence.comm
    return RankRow(
        rank=record.meta.rank, node=record.meta.node_rank, hostname=record.meta.hostname,
        steps=len(record.steps), step_time_s=steady.step_time_mean_s if steady is not None else None,
        data_wait_s=per_step("data_wait"), compute_s=per_step("forward", "backward", "optimizer"),
        communication_s=per_step("communication"),
        overlapped_s=comm.overlapped_s if comm is not None else (0.0 if steady is not None else None),
        cpu_util=signals.main_cpu_util if signals is not None else None, rss_bytes=rss,
        exit_code=record.meta.exit_code, top_finding=top_finding,
    )


def rank_spread(rows: list[RankRow]) -> RankSpread | None:
    timed = [row for row in rows if row.step_time_s]
    if len(timed) < 2:
        return None
    times = np.array([row.step_time_s for row in timed], dtype=float)
    own = np.array([(row.step_time_s or 0.0) - (row.communication_s or 0.0) for row in timed])
    slow, fast = int(np.argmax(own)), int(np.argmin(own))
    low, high = float(times.min()), float(times.max())
    return RankSpread(low, high, (high - low) / low if low > 0 else 0.0, timed[slow].rank, timed[fast].rank)


def missing_ranks(run_dir: str | Path, present: list[int], world_size: int) -> list[MissingRank]:
    """Ranks below ``world_size`` without a record, each with what its files say."""
    out = []
    for rank in range(world_size):
        if rank in present:
            continue
        out.append(_missing(Path(run_dir), rank))
    return out


def _missing(run_dir: Path, rank: int) -> MissingRank:
    samples = layout.samples_path(run_dir, rank)
    if samples.exists():
        ran = _samples_span_s(samples)
        seen = f"; its samples file shows it ran {ran:.1f} s" if ran is not None else "; its samples file is empty"
        return MissingRank(rank, f"no record: the process crashed or was killed before writing it{seen}", ran)
    if layout.lock_path(run_dir, rank).exists():
        return MissingRank(rank, "no record and no samples: it started capture, then ended before sampling")
    return MissingRank(rank, "no files at all: the rank never started capture (or wrote elsewhere)")


def _samples_span_s(path: Path) -> float | None:
    try:
        from stepscope.record.samples import load_samples

        samples = load_samples(path)
        stamps = samples.ts_ns
    except Exception:  # noqa: BLE001 - unreadable: say nothing about its length
        return None
    if len(stamps) < 1:
        return None
    return float(stamps[-1] - stamps[0]) / 1e9
