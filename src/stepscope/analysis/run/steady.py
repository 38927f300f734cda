"""Step statistics: warm-up detection, steady state, throughput, phase shares.

Warm-up (algorithm, :func:`warmup_count`): the first step always pays for set-up (lazy
initialisation, allocator growth, worker start-up), so with 3+ steps it is warm-up. Further
leading steps count as warm-up while they are slower than :data:`WARMUP_FACTOR` × the median of
the second half of the run, up to :data:`WARMUP_MAX_SHARE` of all steps. Steps excluded on
purpose (the FLOP-counted step) are left out of the steady state as well.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from stepscope.record.run import PHASES, RunRecord, StepTable

WARMUP_FACTOR = 1.5
WARMUP_MAX_SHARE = 0.2


def warmup_count(duration_ns: np.ndarray) -> int:
    """How many leading steps are warm-up (see module docstring)."""
    count = len(duration_ns)
    if count < 3:
        return 0
    reference = float(np.median(duration_ns[count // 2:]))
    limit = max(1, int(count * WARMUP_MAX_SHARE))
    warm = 1
    while warm < limit and duration_ns[warm] > WARMUP_FACTOR * reference:
        warm += 1
    return warm


def excluded_steps(record: RunRecord) -> list[int]:
    """Steps deliberately disturbed by measurement: the FLOP-counted step, torch.profiler windows."""
    count = len(record.steps)
    compute = record.facts.compute
    excluded = {compute.step_index} if compute is not None else set()
    for window in record.profiler_windows:
        excluded.update(range(window.first_step, window.last_step + 1))
    return sorted(step for step in excluded if 0 <= step < count)


def steady_mask(record: RunRecord) -> np.ndarray:
    """Boolean mask of steady-state steps (after warm-up, without excluded steps)."""
    steps = record.steps
    mask = np.zeros(len(steps), dtype=bool)
    mask[warmup_count(steps.duration_ns):] = True
    mask[excluded_steps(record)] = False
    if len(steps) and not mask.any():  # too few steps: use what there is
        mask[:] = True
    return mask


@dataclass(frozen=True)
class StepStats:
    """Timing statistics of a set of steps (seconds, ratios)."""

    count: int
    total_s: float
    mean_s: float | None
    median_s: float | None
    p90_s: float | None
    max_s: float | None
    min_s: float | None
    steps_per_s: float | None
    samples_per_s: float | None
    phase_shares: dict[str, float]
    phase_mean_s: dict[str, float]
    loader_init_share: float

    def to_dict(self) -> dict:
        return asdict(self)


def step_stats(steps: StepTable) -> StepStats:
    """Statistics over ``steps`` (phase shares are of the summed step time)."""
    count = len(steps)
    if count == 0:
        return StepStats(0, 0.0, None, None, None, None, None, None, None,
                         {phase: 0.0 for phase in PHASES}, {phase: 0.0 for phase in PHASES}, 0.0)
    seconds = steps.duration_ns / 1e9
    total = float(seconds.sum())
    phase_totals = {phase: float(steps.phase(phase).sum()) / 1e9 for phase in PHASES}
    samples = steps.samples
    samples_per_s = float(samples.sum()) / total if total > 0 and (samples >= 0).all() else None
    return StepStats(
        count=count,
        total_s=total,
        mean_s=float(seconds.mean()),
        median_s=float(np.median(seconds)),
        p90_s=float(np.percentile(seconds, 90)),
        max_s=float(seconds.max()),
        min_s=float(seconds.min()),
        steps_per_s=count / total if total > 0 else None,
        samples_per_s=samples_per_s,
        phase_shares={phase: (value / total if total > 0 else 0.0) for phase, value in phase_totals.items()},
        phase_mean_s={phase: value / count for phase, value in phase_totals.items()},
        loader_init_share=float(steps.loader_init_ns.sum()) / 1e9 / total if total > 0 else 0.0,
    )
