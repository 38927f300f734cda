"""The DataLoader's pace, from its workers' own time per batch (``record.facts.worker_batches``).

A worker makes one batch at a time; ``num_workers`` of them in turn deliver one batch every
``time per batch / num_workers``. Over the steady window that is a floor under the step: the
training loop cannot take batches faster than the workers make them, whatever is taken off the
training thread. The floor counts the workers' time on a CPU and off it (reads, sleeps, locks),
not their waits for a core — the part that less work in the training thread could give back.

So a change that only shortens the training thread's own work (fewer operators, less Python, no
GC pauses) can save at most ``1 - floor / step`` of the steady step: the rest becomes waiting for
data. A change to the loader itself (more workers, faster reads) lowers the floor instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import TYPE_CHECKING

import numpy as np

from stepscope.analysis.run.steady import SteadyState

if TYPE_CHECKING:  # annotations: a trace's evidence is built without the run record's classes
    from stepscope.record.run import LoaderInfo, RunRecord

#: Timed batches the steady window must hold for a floor (fewer say too little about a pace).
MIN_BATCHES = 5
#: The loader sets the pace when its floor and the step's data wait together come within this
#: share of the step (the training thread's own work is about as long as the workers' per step).
PACE_MARGIN = 0.1


@dataclass(frozen=True)
class LoaderFloor:
    """The main loader's workers over the steady window (times per batch, one worker's, means)."""

    loader_id: int
    workers: int
    batches: int  # timed batches that ended in the window
    wall_s: float
    cpu_s: float
    runq_s: float  # waiting for a core (0 where not measured)
    blocked_s: float  # off CPU, not waiting for a core: reads, sleeps, locks
    #: per step: (wall - runq) × batches per step / workers, and that as a share of the mean step
    floor_s: float
    share: float
    step_s: float  # the mean steady step the share is of
    #: the pace the workers kept, their waits for a core included (wall × batches per step / workers),
    #: as a share of the mean step: what the step waited for, where the floor is what it could get to
    pace_share: float
    #: share of the window the workers spent making batches (1.0: always busy)
    busy: float
    runq_measured: bool

    def sets_the_pace(self, wait_share: float) -> bool:
        """Whether the step waits for the workers' own pace: the training thread's own work per step
        (the step less its data wait) is no longer than the floor, within :data:`PACE_MARGIN`."""
        return self.paced_wait(wait_share) > 0.0

    def paced_wait(self, wait_share: float) -> float:
        """The part of the step's data wait that the workers' pace explains: what the pace they kept
        (:attr:`pace_share`, their waits for a core included: those are the step's too) exceeds the
        step's own work by (the step less its wait), with :data:`PACE_MARGIN` for the steps' spread,
        at most the wait. The rest of the wait is the training process's own time inside ``next()``
        (receiving and unpacking batches, or waiting for a core meanwhile)."""
        return min(wait_share, max(0.0, self.pace_share + wait_share + PACE_MARGIN - 1.0))

    @property
    def waiting_fraction(self) -> float:
        """Share of a worker's time per batch spent waiting for a core (0 where not measured)."""
        return self.runq_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def blocked_fraction(self) -> float:
        """Share of a worker's time per batch spent off CPU, not waiting for a core (reads, sleeps, locks)."""
        return self.blocked_s / self.wall_s if self.wall_s > 0 else 0.0

    def blocked_share(self) -> float:
        """The workers' time off CPU per step, as a share of the step: what faster reads take away."""
        made = self.wall_s - self.runq_s
        return self.share * self.blocked_s / made if made > 0 else 0.0

    def describe(self) -> str:
        """``1 worker took 28.2 ms per batch (26.0 ms of it off CPU, 1.05 ms waiting for a core),
        busy 84% of the time``: what the workers measured, as findings quote it."""
        waiting = f", {self.runq_s * 1e3:.3g} ms waiting for a core" if self.runq_measured else ""
        return (f"{self.workers} worker{'s' if self.workers > 1 else ''} took {self.wall_s * 1e3:.3g} ms per batch "
                f"({self.blocked_s * 1e3:.3g} ms of it off CPU{waiting}), busy {100 * self.busy:.0f}% of the time")

    def pace(self) -> str:
        """``1 worker took … busy 84% of the time: a batch every 0.323 ms against the 4.21 ms step``:
        what the workers measured and the pace it sets, as findings that say the workers keep pace
        quote it."""
        return f"{self.describe()}: a batch every {self.floor_s * 1e3:.3g} ms against the {self.step_s * 1e3:.3g} ms step"

    @property
    def ceiling(self) -> float:
        """What shortening the training thread's own work can save at most (share of the step)."""
        return max(0.0, 1.0 - self.share)

    @property
    def ceiling_low(self) -> float:
        """The lower end of :attr:`ceiling`: the floor is the workers' mean pace, and the steps spread
        about it by up to :data:`PACE_MARGIN` of the step (the margin :meth:`paced_wait` allows the
        other way), so a step shortened to the floor may wait for data that much sooner."""
        return max(0.0, self.ceiling - PACE_MARGIN)


def loader_floor(record: RunRecord, steady: SteadyState | None, loader: LoaderInfo | None) -> LoaderFloor | None:
    """The :class:`LoaderFloor` of ``loader`` (the one the steps waited for most); None without
    timed worker batches in the steady window, or without workers."""
    timed = record.facts.worker_batches
    if timed is None or steady is None or loader is None or loader.num_workers < 1 or not loader.worker_pids:
        return None
    steps = record.steps
    mask = steady.mask
    if not mask.any():
        return None
    starts = steps.start_ns[mask]
    window_start, window_end = int(starts.min()), int((starts + steps.duration_ns[mask]).max())
    pid = np.asarray(timed.pid, dtype=np.int64)
    end = np.asarray(timed.end_ns, dtype=np.int64)
    chosen = np.isin(pid, np.asarray(loader.worker_pids, dtype=np.int64)) & (end >= window_start) & (end <= window_end)
    count = int(chosen.sum())
    if count < MIN_BATCHES:
        return None
    wall = np.asarray(timed.wall_ns, dtype=np.float64)[chosen]
    cpu = np.minimum(np.asarray(timed.cpu_ns, dtype=np.float64)[chosen], wall)
    runq_raw = np.asarray(timed.runq_ns, dtype=np.float64)[chosen]
    runq_measured = bool((runq_raw >= 0).all())
    runq = np.clip(runq_raw, 0.0, wall - cpu) if runq_measured else np.zeros_like(wall)
    workers = int(loader.num_workers)
    step_mean_ns = steady.step_time_mean_s * 1e9
    span_ns = max(1.0, float(window_end - window_start))
    per_step = steady.batches_per_step / workers
    floor_ns = float((wall - runq).mean()) * per_step
    return LoaderFloor(
        loader_id=loader.loader_id, workers=workers, batches=count,
        wall_s=float(wall.mean()) / 1e9, cpu_s=float(cpu.mean()) / 1e9, runq_s=float(runq.mean()) / 1e9,
        blocked_s=float((wall - cpu - runq).mean()) / 1e9,
        floor_s=floor_ns / 1e9, share=floor_ns / step_mean_ns if step_mean_ns > 0 else 0.0,
        step_s=steady.step_time_mean_s,
        pace_share=float(wall.mean()) * per_step / step_mean_ns if step_mean_ns > 0 else 0.0,
        busy=min(1.0, float(wall.sum()) / (workers * span_ns)), runq_measured=runq_measured,
    )
