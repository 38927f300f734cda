"""Periodic stalls: slow steps that recur every N steps, and whether a neighbour caused them.

Detection (steady-state steps; warm-up and the FLOP-counted step excluded), per phase column
(``data_wait`` less worker start-up, ``loader_init``, ``forward``, ``backward``, ``optimizer``,
``other``) — a stall shows in the phase that stalls, far more crisply than in noisy step totals:

1. the phase's baseline is its median; a step *stalls* in it when the phase exceeds both
   :data:`STALL_FACTOR` × baseline and baseline + :data:`STALL_MIN_EXCESS_S`, and the excess is at
   least :data:`STALL_MIN_STEP_SHARE` of the median step;
2. at least :data:`MIN_STALLS` stalls, in at most :data:`MAX_SLOW_SHARE` of the steps (otherwise
   the "stall" is the normal step);
3. the period is the most common gap between consecutive stalls; at least :data:`REGULARITY` of
   the gaps must be within one step of it — *exactly* it in the model's own phases
   (:data:`STEP_LOCKED`: an evaluation pass or an accumulation boundary every N steps comes every N
   steps, while a timer or another process lands 6, 7, 6, 8 steps apart) — and at least
   :data:`COVERAGE` of the stalls the period predicts over the steady state must be there (a few
   aligned noise spikes are not a period);
4. the cost is the stalls' excess over the baseline divided by all steady time;
5. the phase with the costliest periodic stall wins. A data-wait period up to ``num_workers`` is
   skipped: workers deliver batches in turn (or in bursts), so a starved pipeline waits every few
   batches — the input pipeline's pattern, not a stall. Where the workers restart every epoch, the
   data wait of the steps that start an epoch is left out (:func:`without_epoch_starts`): it is the
   epoch boundary's.

**Who stalled the step.** A loop's own periodic work (a checkpoint, an evaluation, a log flush)
runs on the training tree's CPU or waits on the disk. A neighbour's periodic burst — a monitoring
agent, another job's timer, the hypervisor serving another guest — takes the cores away from the
training tree instead, and it recurs in *seconds*, not in steps (so the step gaps alternate, 6, 7,
6, …). The sampler measures, per interval, the cores busy outside the training tree (machine busy
less the tree's processes, plus hypervisor steal); :func:`outside_cores_per_step` spreads that over
the steps. When the stalled steps ran beside markedly more outside CPU than the other steps, that
CPU accounts for most of the stall (:data:`NEIGHBOUR_EXPLAINS`), and step durations follow it over
the whole steady state (:data:`NEIGHBOUR_CORRELATION`), the stall is the neighbour's
(:attr:`PeriodicStall.neighbour`): the foreign-load rule reports it and the periodic-stall rule,
whose prescriptions (asynchronous checkpoints, less logging) would be wrong, stands down.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from stepscope.analysis.run.signals import counter_deltas
from stepscope.record.run import PHASES, LoaderInfo, RunRecord, StepTable
from stepscope.record.samples import Samples

#: A slow step takes at least this multiple of the median step (Nsight's gpu_gaps and XProf's
#: step-time variance views flag outliers against the typical step; 2× is clearly not noise).
STALL_FACTOR = 2.0
#: …and at least this much longer than the median (ignores jitter on sub-millisecond steps).
STALL_MIN_EXCESS_S = 0.005
#: …and the excess is at least this share of the median step (a stall is felt in the step).
STALL_MIN_STEP_SHARE = 0.1
#: Fewer slow steps than this are not a pattern.
MIN_STALLS = 3
#: More slow steps than this share are the normal step, not a stall.
MAX_SLOW_SHARE = 0.4
#: Share of gaps between slow steps within ±1 of the period.
REGULARITY = 0.6
#: Stalls costing less than this share of the run are not reported, as the loop's or a neighbour's
#: (the severity scale's LOW).
MIN_COST = 0.01
#: Phases whose periodic extra work comes from the loop's step count, so its gaps are exact; in the
#: others (data, worker start-up, "other" with its time-based checkpoints and logs) a step's jitter
#: is allowed.
STEP_LOCKED = frozenset({"forward", "backward", "optimizer", "communication"})
#: Share of the stalls a period predicts over the steady state that must be observed.
COVERAGE = 0.5
#: Cores busy outside the training tree during the stalled steps, above the other steps' median,
#: that can be a neighbour's burst (clock-tick accounting jitters by less; a burst of a second's
#: tenth spread over 100 ms sample intervals and 150 ms steps reads as a fraction of a core).
NEIGHBOUR_MIN_CORES = 0.15
#: Correlation, over the steady steps, between a step's duration and the outside CPU beside it:
#: a neighbour slows every step it overlaps, so the two move together (a checkpoint's stalls do not
#: follow the outside CPU: ~0 in the zoo's checkpoint-stall run, 0.85 beside a periodic burst).
NEIGHBOUR_CORRELATION = 0.5
#: Share of the stall's lost time that the outside CPU accounts for (its core-seconds during the
#: stalled steps over the cores the tree normally uses), for the stall to be the neighbour's.
NEIGHBOUR_EXPLAINS = 0.5


@dataclass(frozen=True)
class PeriodicStall:
    """The costliest periodic stall of a run (see the module docstring)."""

    phase: str
    period_steps: int
    slow_steps: tuple[int, ...]  # step indexes (of the whole run)
    regularity: float  # share of gaps within ±1 of the period
    excess_s: float  # summed excess of the phase over its median
    baseline_s: float
    limit_s: float
    cost_share: float  # excess over all steady time
    step_time_s: float  # median steady step
    wall_period_s: float | None  # median time between stalls
    #: cores busy outside the training tree (other processes + steal): stalled steps, other steps
    outside_cores_stalled: float | None = None
    outside_cores_normal: float | None = None
    #: share of the stalls' excess the outside CPU accounts for
    neighbour_share: float | None = None
    #: correlation of step duration and outside cores over the steady steps
    outside_correlation: float | None = None
    neighbour: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def count(self) -> int:
        return len(self.slow_steps)

    @property
    def stall_s(self) -> float:
        return self.excess_s / max(1, self.count)


def phase_columns(steps: StepTable, mask: np.ndarray) -> dict[str, np.ndarray]:
    """Steady-state phase columns in seconds, worker start-up split out of data wait."""
    columns = {name: steps.phase(name)[mask] / 1e9 for name in PHASES}
    columns["loader_init"] = steps.loader_init_ns[mask] / 1e9
    columns["data_wait"] = columns["data_wait"] - columns["loader_init"]
    return columns


@dataclass(frozen=True)
class PhaseStall:
    """A periodic stall in one phase column (see :func:`periodic_stall`)."""

    slow: np.ndarray  # positions in the column
    period: int
    regular: float
    excess_s: float
    baseline_s: float
    limit_s: float


def periodic_stall(values: np.ndarray, step_s: float, exact: bool = False) -> PhaseStall | None:
    """The periodic stall in one phase column (seconds), or None (see the module docstring);
    ``exact``: the gaps must equal the period rather than fall within a step of it."""
    baseline = float(np.median(values))
    limit = max(STALL_FACTOR * baseline, baseline + STALL_MIN_EXCESS_S,
                baseline + STALL_MIN_STEP_SHARE * step_s)
    slow = np.flatnonzero(values > limit)
    if len(slow) < MIN_STALLS or len(slow) > MAX_SLOW_SHARE * len(values):
        return None
    gaps = np.diff(slow)
    period, _ = Counter(gaps.tolist()).most_common(1)[0]
    regular = float(np.mean(np.abs(gaps - period) <= (0 if exact else 1)))
    if period < 2 or regular < REGULARITY or len(slow) < COVERAGE * len(values) / period:
        return None
    return PhaseStall(slow, int(period), regular, float((values[slow] - baseline).sum()), baseline, limit)


def find_periodic_stall(record: RunRecord, mask: np.ndarray, step_time_s: float, loader: LoaderInfo | None,
                        siblings: tuple[RunRecord, ...] = ()) -> PeriodicStall | None:
    """The costliest periodic stall over the steady steps ``mask``, with its neighbour test.

    ``siblings`` are the job's other ranks on this machine: their training trees are not outside
    the job, so their CPU (from their own samples, on the same clock) is taken out of the outside
    CPU; without their samples the neighbour test is not made (it would count them as neighbours).
    """
    steps = record.steps
    index = np.flatnonzero(mask)
    if len(index) < MIN_STALLS * 2:
        return None
    total_s = float(steps.duration_ns[index].sum()) / 1e9
    if total_s <= 0:
        return None
    round_robin = loader.num_workers if loader is not None and loader.num_workers > 1 else None
    columns = phase_columns(steps, mask)
    if loader is not None and loader.restarts_workers:
        columns["data_wait"] = without_epoch_starts(columns["data_wait"], steps.loader_init_ns[mask] > 0)
    found: dict[str, PhaseStall] = {}
    for phase, values in columns.items():
        stall = periodic_stall(values, step_time_s, exact=phase in STEP_LOCKED)
        if stall is None or (phase == "data_wait" and round_robin and stall.period <= round_robin):
            continue  # workers deliver in turn/bursts: the input pipeline's pattern, not a stall
        found[phase] = stall
    if not found:
        return None
    phase = max(found, key=lambda name: found[name].excess_s)
    stall = found[phase]
    slow = index[stall.slow]
    starts = steps.start_ns[slow]
    wall = float(np.median(np.diff(starts))) / 1e9 if len(starts) > 1 else None
    base = PeriodicStall(phase=phase, period_steps=stall.period, slow_steps=tuple(int(item) for item in slow),
                         regularity=stall.regular, excess_s=stall.excess_s, baseline_s=stall.baseline_s,
                         limit_s=stall.limit_s, cost_share=stall.excess_s / total_s, step_time_s=step_time_s,
                         wall_period_s=wall)
    return _with_neighbour_test(base, record, index, siblings)


def without_epoch_starts(data_wait: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The data-wait column with the epoch-start steps' wait set to the other steps' median, where the
    workers restart every epoch: that wait (their start-up's first batch, beyond ``__iter__``) is the
    epoch boundary's, priced by its own finding; a stall counted there would name a refilling data
    source for what is the restarts' cycle (short epochs make the starts recur every few steps, and
    the steps after a start, waiting for the new workers to catch up, fill in a shorter period)."""
    if not starts.any() or starts.all():
        return data_wait
    return np.where(starts, float(np.median(data_wait[~starts])), data_wait)


def _with_neighbour_test(stall: PeriodicStall, record: RunRecord, steady: np.ndarray,
                         siblings: tuple[RunRecord, ...] = ()) -> PeriodicStall:
    samples = record.samples
    if samples is None:
        return stall
    outside, tree = outside_cores_per_step(samples, record.steps)
    if outside is None or tree is None:
        return stall
    for sibling in siblings:
        sibling_tree = _tree_per_step(sibling.samples, record.steps) if sibling.samples is not None else None
        if sibling_tree is None:
            return replace(stall, notes=(*stall.notes, f"rank {sibling.meta.rank} shares this machine without "
                                         "samples: whose CPU stalled the steps is not known"))
        outside = np.maximum(outside - np.nan_to_num(sibling_tree), 0.0)
    slow = np.asarray(stall.slow_steps)
    normal = np.setdiff1d(steady, slow)
    stalled_out, normal_out = outside[slow], outside[normal]
    if np.isnan(stalled_out).all() or np.isnan(normal_out).all():
        return stall
    out_stalled = float(np.nanmean(stalled_out))
    out_normal = float(np.nanmedian(normal_out))
    tree_normal = float(np.nanmedian(tree[normal])) if not np.isnan(tree[normal]).all() else 0.0
    durations = record.steps.duration_ns[slow] / 1e9
    # core-seconds the outside took beyond its usual, in the stalled steps, over the cores the tree
    # usually runs on: the step time the tree lost to it, against the stalls' excess
    extra_core_s = float(np.nansum(np.maximum(stalled_out - out_normal, 0.0) * durations))
    lost_s = extra_core_s / max(tree_normal, 1.0)
    share = min(1.0, lost_s / stall.excess_s) if stall.excess_s > 0 else 0.0
    known = steady[~np.isnan(outside[steady])]
    follows = _correlation(record.steps.duration_ns[known].astype(np.float64), outside[known])
    neighbour = (out_stalled - out_normal >= NEIGHBOUR_MIN_CORES and share >= NEIGHBOUR_EXPLAINS
                 and follows is not None and follows >= NEIGHBOUR_CORRELATION)
    return replace(stall, outside_cores_stalled=round(out_stalled, 3), outside_cores_normal=round(out_normal, 3),
                   neighbour_share=round(share, 3),
                   outside_correlation=None if follows is None else round(follows, 3), neighbour=neighbour)


def _correlation(first: np.ndarray, second: np.ndarray) -> float | None:
    """Pearson correlation, None with fewer than 3 points or a constant series."""
    if len(first) < 3 or np.std(first) == 0 or np.std(second) == 0:
        return None
    return float(np.corrcoef(first, second)[0, 1])


def outside_cores_per_step(samples: Samples, steps: StepTable) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Per step, the mean cores busy outside the training tree (machine busy less the tree's
    processes, plus hypervisor steal) and the cores the tree itself used; NaN where no sample
    interval overlaps the step. ``(None, None)`` with too few samples."""
    ts = samples.ts_ns
    if len(ts) < 2 or not len(steps):
        return None, None
    outside, tree = _cores_per_interval(samples)
    return _per_step(ts, outside, steps), _per_step(ts, tree, steps)


def _cores_per_interval(samples: Samples) -> tuple[np.ndarray, np.ndarray]:
    """Cores busy outside the training tree and in it, per sample interval; computed once per
    samples (kept with them): every rank of a machine reads its siblings' tree onto its own steps."""
    cached: tuple[np.ndarray, np.ndarray] | None = samples.__dict__.get("_cores_per_interval")
    if cached is not None:
        return cached
    seconds = np.diff(samples.ts_ns) / 1e9
    ticks = float(samples.meta.clock_ticks_per_s or 100)
    busy = _summed_deltas(samples["cpu_user"]) + _summed_deltas(samples["cpu_system"])
    steal = _summed_deltas(samples["cpu_steal"])
    with np.errstate(invalid="ignore", divide="ignore"):
        machine = busy / ticks / seconds
        stolen = np.nan_to_num(steal / ticks / seconds, nan=0.0)
        tree = _tree_ticks(samples) / ticks / seconds
    found = (np.maximum(machine - tree, 0.0) + stolen, tree)
    samples.__dict__["_cores_per_interval"] = found  # a frozen dataclass: its own cache, written past __setattr__
    return found


def _tree_per_step(samples: Samples, steps: StepTable) -> np.ndarray | None:
    """The cores the training tree of ``samples`` used in each of ``steps`` (None with too few samples)."""
    if len(samples.ts_ns) < 2 or not len(steps):
        return None
    return _per_step(samples.ts_ns, _cores_per_interval(samples)[1], steps)


def _summed_deltas(counter: np.ndarray) -> np.ndarray:
    """Per-interval differences of a cumulative counter, summed over its items (NaN unknown)."""
    deltas = counter_deltas(counter)
    return deltas.sum(axis=1) if deltas.ndim == 2 else deltas


def _tree_ticks(samples: Samples) -> np.ndarray:
    """CPU ticks of the training tree's processes in each interval (a process counts in an
    interval when it was sampled at both of its ends)."""
    proc = samples.proc
    out = np.zeros(len(samples) - 1)
    if not len(proc["id"]):
        return out
    order = np.lexsort((proc["sample"], proc["id"]))
    ids, rows, ticks = proc["id"][order], proc["sample"][order], proc["cpu_ticks"][order]
    pair = (ids[1:] == ids[:-1]) & (rows[1:] == rows[:-1] + 1) & (ticks[1:] >= ticks[:-1]) & (ticks[:-1] >= 0)
    np.add.at(out, rows[:-1][pair], (ticks[1:] - ticks[:-1])[pair])
    return out


def _per_step(ts: np.ndarray, per_interval: np.ndarray, steps: StepTable) -> np.ndarray:
    """Time-weighted mean of an interval series (a rate, constant within each interval) over each
    step, from the cumulative integral: O(steps + samples). NaN where no known interval overlaps."""
    times = ts.astype(np.float64)
    dt = np.diff(times)
    valid = ~np.isnan(per_interval)
    area = np.concatenate([[0.0], np.cumsum(np.where(valid, per_interval, 0.0) * dt)])
    known = np.concatenate([[0.0], np.cumsum(np.where(valid, dt, 0.0))])
    start = steps.start_ns.astype(np.float64)
    end = start + steps.duration_ns
    covered = np.interp(end, times, known) - np.interp(start, times, known)
    with np.errstate(invalid="ignore", divide="ignore"):
        result: np.ndarray = np.where(covered > 0, (np.interp(end, times, area) - np.interp(start, times, area))
                                      / covered, np.nan)
    return result
