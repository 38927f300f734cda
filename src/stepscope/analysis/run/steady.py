"""Step statistics: warm-up detection, steady state, throughput, phase shares — computed once.

:func:`steady_state` is the only place that decides which steps are warm-up, which are excluded,
and what the phase shares of the steady state are; the diagnosis rules and every renderer read its
:class:`SteadyState`.

Warm-up (algorithm, :func:`warmup_count`): the first step always pays for set-up (lazy
initialisation, allocator growth, worker start-up), so with 3+ steps it is warm-up. Further
leading steps count as warm-up while they are slower than :data:`WARMUP_FACTOR` × the median of
the second half of the run, up to :data:`WARMUP_MAX_SHARE` of all steps. Steps excluded on
purpose (the FLOP-counted step) are left out of the steady state as well.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from stepscope.record.phases import PHASES

if TYPE_CHECKING:  # annotations: a trace's evidence is built without the run record's classes
    from stepscope.record.run import RunRecord, StepTable

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


def steady_mask(record: RunRecord, warmup: int | None = None) -> np.ndarray:
    """Boolean mask of steady-state steps (after warm-up, without excluded steps)."""
    steps = record.steps
    mask = np.zeros(len(steps), dtype=bool)
    mask[warmup_count(steps.duration_ns) if warmup is None else warmup:] = True
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

    def to_dict(self) -> dict[str, Any]:
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
    samples_per_s = _samples_per_s(steps, total)
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


def _samples_per_s(steps: StepTable, total_s: float) -> float | None:
    """Samples per second, when every step that fetched a batch knows its samples.

    A step that fetched no batch holds none (a loader that prefetches one batch ahead, as
    Accelerate's does, fetches the next step's batch in the current step), so it adds 0; without
    any batch at all there is nothing to count.
    """
    fetched = steps.batches > 0
    if total_s <= 0 or not fetched.any() or (steps.samples[fetched] < 0).any():
        return None
    return float(steps.samples[fetched].sum()) / total_s


#: The phases in which the model itself runs (the step's compute).
MODEL_PHASES = ("forward", "backward", "optimizer")

#: Percentile of steady step times taken as the undisturbed step (used against a best-case peak).
FAST_PERCENTILE = 10
#: A step that waited for data less than this share of its time did not wait for the loader.
UNWAITED_BELOW = 0.05


@dataclass(frozen=True)
class SteadyState:
    """What the steady-state steps say, computed once per record.

    Shares are sums over steady steps divided by their total time (the share of *time*, which is
    what fixing the phase would save). ``fetch_wait_p10``/``p90`` are the 10th/90th percentiles of
    the per-step fetch-wait share: the spread a threshold decision must respect.
    """

    step_count: int
    steady_count: int
    warmup_steps: int
    excluded: tuple[int, ...]
    mask: np.ndarray = field(repr=False)
    steady: StepStats
    warmup: StepStats
    total_s: float
    step_time_s: float  # median steady step
    step_time_mean_s: float
    step_time_fast_s: float  # FAST_PERCENTILE of steady steps: the step undisturbed
    shares: dict[str, float]  # phase -> share of steady time (PHASES)
    loader_init_share: float
    fetch_wait_share: float  # data wait minus worker start-up
    fetch_wait_p10: float
    fetch_wait_p90: float
    batches_per_step: float
    samples_per_step: int | None  # the mode of samples per step (the batch size actually used)
    #: p10 and p90 of the steady steps' device time (CUDA events), when every steady step has one:
    #: on a GPU the host's step boundaries jitter with the launch queue (on an H200, host steps of
    #: 1.8 ms beside 12.2 ms ones while the device took 12.2 ms each), the device's do not
    device_step_p10_s: float | None = None
    device_step_p90_s: float | None = None
    #: phases capture could measure in this run; the others read "not measured", never 0 %: data
    #: wait needs a DataLoader (or a wrapped iterable), forward a module call, backward a
    #: backward(), optimizer a torch.optim step. "other" is always measured.
    measured_phases: tuple[str, ...] = PHASES
    #: share of the steady time in steps that waited for data less than :data:`UNWAITED_BELOW` of
    #: their own time: where the loader was not the pace (1.0 without a loader)
    unwaited_share: float = 1.0

    @property
    def data_wait_share(self) -> float:
        return self.shares.get("data_wait", 0.0)

    @property
    def compute_share(self) -> float:
        """forward + backward + optimizer: time the model itself runs."""
        return sum(self.shares.get(name, 0.0) for name in MODEL_PHASES)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("mask")
        data["excluded"] = list(self.excluded)
        return data


def model_split_by_device(steps: StepTable) -> StepTable:
    """The steps with the model's time (forward + backward + optimizer, host clock) split between
    those phases as the device spent it, where CUDA events timed them.

    On a GPU the host only launches work: it runs ahead and then blocks wherever the launch queue
    fills or a sync waits — for a matmul-bound step on an H200, inside the optimizer (host: forward
    0.50, backward 1.25, optimizer 9.87 ms; device: 3.20, 5.67, 3.00 ms). The step's time and the
    model's share of it stay the host's; which model phase it went to is the device's. Steps
    without device times (CPU runs, steps before CUDA was in use) are unchanged."""
    if not steps.has_device_time:
        return steps
    device = np.stack([steps.column(f"device_{name}_ns") for name in MODEL_PHASES]).astype(np.float64)
    host = np.stack([steps.phase(name) for name in MODEL_PHASES]).astype(np.float64)
    timed = (device >= 0).all(axis=0) & (device.sum(axis=0) > 0)
    if not timed.any():
        return steps
    split = np.rint(host.sum(axis=0) * device / np.where(timed, device.sum(axis=0), 1.0)).astype(np.int64)
    columns = steps.columns()
    for row, name in enumerate(MODEL_PHASES):
        columns[f"{name}_ns"] = np.where(timed, split[row], columns[f"{name}_ns"])
    return type(steps).from_columns(columns)


def steady_state(record: RunRecord) -> SteadyState | None:
    """The :class:`SteadyState` of a record; None without steps. The model's phases are split as
    the device spent them where CUDA events timed them (:func:`model_split_by_device`)."""
    steps = model_split_by_device(record.steps)
    if len(steps) == 0:
        return None
    warm = warmup_count(steps.duration_ns)
    mask = steady_mask(record, warm)
    warm_mask = np.zeros(len(steps), dtype=bool)
    warm_mask[:warm] = True
    steady = step_stats(steps.select(mask))
    durations = steps.duration_ns[mask].astype(np.float64)
    total_ns = float(durations.sum())
    shares = steady.phase_shares
    init_share = steady.loader_init_share
    fetch = (steps.data_wait_ns[mask] - steps.loader_init_ns[mask]).astype(np.float64)
    per_step = fetch / np.maximum(durations, 1.0)
    batches = steps.batches[mask]
    device = steps.device_ns[mask]
    timed = len(device) > 0 and bool((device > 0).all())
    return SteadyState(
        step_count=len(steps),
        steady_count=int(mask.sum()),
        warmup_steps=warm,
        excluded=tuple(excluded_steps(record)),
        mask=mask,
        steady=steady,
        warmup=step_stats(steps.select(warm_mask)),
        total_s=total_ns / 1e9,
        step_time_s=float(np.median(durations)) / 1e9,
        step_time_mean_s=float(durations.mean()) / 1e9,
        step_time_fast_s=float(np.percentile(durations, FAST_PERCENTILE)) / 1e9,
        shares=shares,
        loader_init_share=init_share,
        fetch_wait_share=max(0.0, shares["data_wait"] - init_share),
        fetch_wait_p10=float(np.percentile(per_step, 10)),
        fetch_wait_p90=float(np.percentile(per_step, 90)),
        batches_per_step=float(batches.mean()) if len(batches) and batches.mean() > 0 else 1.0,
        samples_per_step=_mode_samples(steps.samples[mask]),
        device_step_p10_s=float(np.percentile(device, 10)) / 1e9 if timed else None,
        device_step_p90_s=float(np.percentile(device, 90)) / 1e9 if timed else None,
        measured_phases=measured_phases(record),
        unwaited_share=float(durations[per_step < UNWAITED_BELOW].sum() / total_ns) if total_ns > 0 else 1.0,
    )


def measured_phases(record: RunRecord) -> tuple[str, ...]:
    """Phases that were measured: a phase with time in any step, data wait when a loader was seen
    or batches were counted, and "other" always (see :attr:`SteadyState.measured_phases`)."""
    steps = record.steps
    measured = {"other"}
    for phase in PHASES:
        if len(steps) and (steps.phase(phase) > 0).any():
            measured.add(phase)
    if record.loaders or (len(steps) and (steps.batches > 0).any()):
        measured.add("data_wait")
    return tuple(phase for phase in PHASES if phase in measured)


def _mode_samples(samples: np.ndarray) -> int | None:
    """The most frequent positive samples-per-step (the batch size used, not the largest)."""
    known = samples[samples > 0]
    if len(known) == 0:
        return None
    values, counts = np.unique(known, return_counts=True)
    return int(values[int(np.argmax(counts))])
