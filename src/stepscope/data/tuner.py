"""`tune_loader`: measure DataLoader settings and keep the fastest, within a time budget.

Why measure: the best ``num_workers`` depends on the machine, the dataset and the other processes
(Lightning's maintainers declined a heuristic for that reason); "more workers" is not "faster".

The loader is measured alone — no model runs — so the figure is the most samples/s it can feed.
One *trial* builds the loader for a setting and
1. times ``iter()`` up to the first batch (worker start-up: *first batch*);
2. reads ``batches`` more batches (more if needed to time at least ``min_time_s``) and reports
   samples/s over those after the first ``min(batches // 2, num_workers × prefetch_factor)``
   (which were prepared during start-up);
3. starts a second pass and times its first batch (*restart*: what each new epoch costs; near zero
   with ``persistent_workers``), then shuts the workers down.

The search does not walk the grid:
1. measure the current setting (what the factory returns);
2. climb ``num_workers`` along 0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64 (up to ``max_workers``)
   from the best so far, until two steps in a row gain no more than ``min_gain`` (one flat step is
   forgiven: 0 → 1 worker only moves the loading out of the process); if no step up gained, walk
   down while the speed holds within ``min_gain`` (fewer workers for the same speed);
3. at the best worker count try, one at a time, keeping what gains more than ``min_gain``:
   ``prefetch_factor`` 4 then 8, ``persistent_workers`` (kept when the restart is at least halved
   and the speed holds), ``pin_memory`` (only when CUDA is available: it costs nothing to skip on
   CPU), and the batch size ×2 and ÷2 when the factory takes ``batch_size``;
4. measure the best two settings again; their spread is the noise figure, and the runner-up
   replaces the best only when its mean is higher by ``min_gain`` and its trials are faster beyond
   the spread (:func:`stepscope.analysis.compare_stats.range_verdict`, the rule ``stepscope try``
   uses).
A trial that would overrun ``budget_s`` (estimated from the slowest trial so far) is not started.

Each trial — the factory's call included — runs in a forked child that leads its own process group
(:func:`stepscope.children.call`), with the time left in the budget as its deadline (at least
:data:`MIN_TRIAL_DEADLINE_S`): a factory, dataset or worker that hangs is stopped with every
process of its trial at the deadline and reported as timed out, and the search ends there. The
parent process never calls the factory or touches CUDA. Ctrl-C (or a
:class:`stepscope.children.Stopped` signal) stops the trial under way the same way: the trials
measured so far are kept (:attr:`TuneResult.stopped_by`).

A factory that takes the knobs as keyword arguments (or ``**kwargs``) is called with them; otherwise
the loader it returns is rebuilt with the same dataset, sampler and collate function.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepscope import children
from stepscope.analysis.compare_stats import FASTER, range_verdict
from stepscope.errors import UsageError
from stepscope.executors import usable_cores

WORKER_LADDER = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
KNOBS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "batch_size")
DEFAULT_MIN_GAIN = 0.05
DEFAULT_MIN_TIME_S = 0.5
#: The shortest deadline a trial gets, however little of the budget is left (seconds): a tiny
#: budget still lets the first trial finish.
MIN_TRIAL_DEADLINE_S = 2.0
#: Worker counts tried past one that did not gain before the climb stops (1 → 0 vs 1 is often flat:
#: one worker only moves the loading out of the training process; 2 then doubles it).
CLIMB_PATIENCE = 1


@dataclass(frozen=True)
class LoaderSetting:
    """The DataLoader knobs the tuner varies (``prefetch_factor`` is None without workers)."""

    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    persistent_workers: bool
    batch_size: int | None

    def with_workers(self, workers: int) -> LoaderSetting:
        if workers == 0:
            return dataclasses.replace(self, num_workers=0, prefetch_factor=None, persistent_workers=False)
        return dataclasses.replace(self, num_workers=workers, prefetch_factor=self.prefetch_factor or 2)

    def describe(self) -> str:
        parts = [f"num_workers={self.num_workers}"]
        if self.num_workers:
            parts += [f"prefetch_factor={self.prefetch_factor}", f"persistent_workers={self.persistent_workers}"]
        parts.append(f"pin_memory={self.pin_memory}")
        if self.batch_size is not None:
            parts.append(f"batch_size={self.batch_size}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Trial:
    """One measurement of one setting; ``error`` is set (and the rates are 0) when loading failed."""

    stage: str
    setting: LoaderSetting
    samples_per_s: float
    first_batch_s: float
    restart_s: float
    batches: int
    wall_s: float
    error: str | None = None


@dataclass(frozen=True)
class TuneResult:
    """What :func:`tune_loader` measured and chose."""

    baseline: LoaderSetting
    best: LoaderSetting
    trials: tuple[Trial, ...]
    baseline_rate: float
    best_rate: float
    noise: float | None  # largest relative spread between repeats of one setting
    cpu_count: int
    intra_op_threads: int
    budget_s: float
    elapsed_s: float
    budget_exhausted: bool
    cuda: bool
    notes: tuple[str, ...] = ()
    stopped_by: str | None = None  # the signal that stopped the search (SIGINT: Ctrl-C)

    @property
    def speedup(self) -> float:
        return self.best_rate / self.baseline_rate if self.baseline_rate > 0 else float("nan")

    @property
    def suggested_threads(self) -> int:
        """Intra-op threads that leave a core to each worker of the best setting."""
        return max(1, self.cpu_count - self.best.num_workers)

    @property
    def oversubscribed(self) -> bool:
        """Workers plus the training process's intra-op threads exceed the cores."""
        return self.best.num_workers + self.intra_op_threads > self.cpu_count


@dataclass
class _Search:
    factory: Callable[..., Any]
    accepted: set[str]
    current: LoaderSetting | None
    batches: int
    budget_s: float
    min_gain: float
    min_time_s: float
    started: float = field(default_factory=time.perf_counter)
    trials: list[Trial] = field(default_factory=list)
    exhausted: bool = False
    cuda: bool = False

    def rate(self, setting: LoaderSetting) -> float:
        rates = [t.samples_per_s for t in self.trials if t.setting == setting and t.error is None]
        return sum(rates) / len(rates) if rates else 0.0

    def measured(self, setting: LoaderSetting) -> bool:
        return any(t.setting == setting for t in self.trials)

    def deadline(self) -> float:
        return max(MIN_TRIAL_DEADLINE_S, self.budget_s - (time.perf_counter() - self.started))

    def first(self, progress: Callable[[Trial], None] | None) -> Trial:
        """The factory's own setting: the child calls the factory, reads the setting, measures it."""
        factory, batches, min_time_s = self.factory, self.batches, self.min_time_s

        def trial() -> tuple[LoaderSetting, bool, Trial]:
            import torch

            built = LoaderFactory(factory)
            return built.current, torch.cuda.is_available(), measure(built, built.current, batches, "current",
                                                                     min_time_s)

        deadline = self.deadline()
        outcome, value = children.call(trial, deadline_s=deadline)
        if value is None:
            raise UsageError(f"the factory's own DataLoader setting did not finish a trial within the budget of "
                             f"{self.budget_s:g} s: {outcome.describe()}"
                             + (" — a factory, dataset or worker that hangs?" if outcome.timed_out else ""))
        self.current, self.cuda, first = value
        self.trials.append(first)
        if progress is not None:
            progress(first)
        return first

    def try_setting(self, stage: str, setting: LoaderSetting, progress: Callable[[Trial], None] | None) -> bool:
        """Measure ``setting`` unless the budget forbids; False when it was not measured."""
        elapsed = time.perf_counter() - self.started
        slowest = max((t.wall_s for t in self.trials), default=0.0)
        if self.exhausted or (self.trials and elapsed + slowest > self.budget_s):
            self.exhausted = True
            return False
        factory, accepted, current = self.factory, self.accepted, self.current
        batches, min_time_s = self.batches, self.min_time_s
        assert current is not None

        def trial() -> Trial:
            return measure(LoaderFactory(factory, accepted=accepted, current=current), setting, batches, stage,
                           min_time_s)

        outcome, value = children.call(trial, deadline_s=self.deadline())
        if value is None:  # timed out, or the child died (a worker's segfault took it along)
            value = Trial(stage, setting, 0.0, 0.0, 0.0, 0, outcome.elapsed_s, error=outcome.describe())
            self.exhausted = self.exhausted or outcome.timed_out  # the budget is spent: no more trials
        self.trials.append(value)
        if progress is not None:
            progress(value)
        return True

    def gains(self, candidate: LoaderSetting, best: LoaderSetting) -> bool:
        return self.rate(candidate) > self.rate(best) * (1 + self.min_gain)


def tune_loader(factory: Callable[..., Any], *, budget_s: float = 60.0, batches: int = 40,
                max_workers: int | None = None, min_gain: float = DEFAULT_MIN_GAIN,
                min_time_s: float = DEFAULT_MIN_TIME_S, progress: Callable[[Trial], None] | None = None) -> TuneResult:
    """Search DataLoader settings for the highest samples/s (see the module docstring).

    Args:
        factory: returns a ``torch.utils.data.DataLoader``; may take knobs as keyword arguments.
        budget_s: wall-clock budget for all trials: each trial's deadline is what is left of it.
        batches: batches read per trial.
        max_workers: highest ``num_workers`` tried (default: twice the usable cores, at most 64).
        min_gain: relative gain a change must bring to be kept.
        min_time_s: a trial reads past ``batches`` until its timed part lasts this long (short
            measurements are noise on a busy machine).
        progress: called after each trial.

    Raises:
        UsageError: the factory is not callable, raises, returns no DataLoader, or its own setting
            cannot load a batch (or does not within the budget).
        KeyboardInterrupt: interrupted before the first trial was measured.
    """
    import torch

    if batches < 2 or budget_s <= 0:
        raise UsageError(f"batches must be at least 2 and the budget positive (got {batches}, {budget_s})")
    if not callable(factory):
        raise UsageError(f"{factory!r} is not a function returning a DataLoader")
    cores = usable_cores()
    limit = max_workers if max_workers is not None else min(64, 2 * cores)
    search = _Search(factory, _accepted_knobs(factory), None, batches, budget_s, min_gain, min_time_s)
    first = search.first(progress)
    if first.error is not None:
        raise UsageError(f"the factory's own DataLoader setting failed to load: {first.error}")
    assert search.current is not None
    baseline = best = search.current
    stopped: str | None = None
    try:
        best = _climb_workers(search, baseline, limit, progress)
        best = _secondary_knobs(search, best, search.cuda, progress)
        noise, best = _repeat_best_two(search, best, progress)
    except KeyboardInterrupt as exc:  # the trial under way is stopped with its group: keep the rest
        stopped = children.signal_name(children.stopped_by(exc))
        best, noise = _best_so_far(search, baseline), None
    notes = []
    if stopped is not None:
        notes.append(f"stopped by {'Ctrl-C' if stopped == 'SIGINT' else stopped} after {len(search.trials)} trials: "
                     "what was measured is kept")
    timed_out = [t for t in search.trials if t.error and t.error.startswith("timed out")]
    if timed_out:
        notes.append(f"{len(timed_out)} trial(s) timed out and were stopped with their workers "
                     f"({timed_out[0].setting.describe()}): a setting that hangs, or too small a budget")
    if not search.cuda:
        notes.append("pin_memory not tried: no CUDA device (pinning only speeds host-to-GPU copies)")
    if noise is not None and noise > min_gain:
        notes.append(f"repeats of one setting differ by {noise:.0%}, more than the {min_gain:.0%} a change must "
                     "gain: choices closer than that are noise (a busy machine?); raise --batches or rerun")
    if "batch_size" not in search.accepted:
        notes.append("batch size not tried: the factory takes no batch_size argument")
    return TuneResult(baseline=baseline, best=best, trials=tuple(search.trials), baseline_rate=search.rate(baseline),
                      best_rate=search.rate(best), noise=noise, cpu_count=cores,
                      intra_op_threads=torch.get_num_threads(), budget_s=budget_s,
                      elapsed_s=time.perf_counter() - search.started, budget_exhausted=search.exhausted,
                      cuda=search.cuda, notes=tuple(notes), stopped_by=stopped)


def _best_so_far(search: _Search, baseline: LoaderSetting) -> LoaderSetting:
    """A search cut short: the fastest setting measured, when it beats the current one by the gain."""
    measured = {t.setting for t in search.trials if t.error is None}
    fastest = max(measured, key=search.rate, default=baseline)
    return fastest if search.gains(fastest, baseline) else baseline


def _climb_workers(search: _Search, best: LoaderSetting, limit: int, progress) -> LoaderSetting:
    start, misses = best, 0
    for workers in [w for w in WORKER_LADDER if best.num_workers < w <= limit]:
        candidate = best.with_workers(workers)
        if not search.try_setting("workers", candidate, progress):
            return best
        if search.gains(candidate, best):
            best, misses = candidate, 0
        elif (misses := misses + 1) > CLIMB_PATIENCE:
            break
    if best != start:
        return best
    for workers in reversed([w for w in WORKER_LADDER if w < best.num_workers]):
        candidate = best.with_workers(workers)
        if not search.try_setting("workers", candidate, progress):
            return best
        if search.rate(candidate) < search.rate(best) * (1 - search.min_gain):
            break
        best = candidate
    return best


def _secondary_knobs(search: _Search, best: LoaderSetting, cuda: bool, progress) -> LoaderSetting:
    replace = dataclasses.replace
    if best.num_workers:
        for factor in (4, 8):
            candidate = replace(best, prefetch_factor=factor)
            if factor <= (best.prefetch_factor or 0) or search.measured(candidate):
                continue
            if not search.try_setting("prefetch", candidate, progress) or not search.gains(candidate, best):
                break
            best = candidate
        candidate = replace(best, persistent_workers=not best.persistent_workers)
        if search.try_setting("persistent", candidate, progress) and _persistent_helps(search, candidate, best):
            best = candidate
    if cuda:
        candidate = replace(best, pin_memory=not best.pin_memory)
        if search.try_setting("pin_memory", candidate, progress) and search.gains(candidate, best):
            best = candidate
    if "batch_size" in search.accepted and best.batch_size:
        for size in (best.batch_size * 2, max(1, best.batch_size // 2)):
            candidate = replace(best, batch_size=size)
            if size == best.batch_size or search.measured(candidate):
                continue
            if search.try_setting("batch_size", candidate, progress) and search.gains(candidate, best):
                best = candidate
                break
    return best


def _persistent_helps(search: _Search, candidate: LoaderSetting, best: LoaderSetting) -> bool:
    """Persistent workers trade memory for restarts: keep them when restarts halve and speed holds."""
    def restart(setting: LoaderSetting) -> float:
        times = [t.restart_s for t in search.trials if t.setting == setting and t.error is None]
        return min(times, default=0.0)

    holds = search.rate(candidate) >= search.rate(best) * (1 - search.min_gain)
    if candidate.persistent_workers:
        return holds and restart(candidate) < 0.5 * restart(best)
    return search.gains(candidate, best)


def _repeat_best_two(search: _Search, best: LoaderSetting, progress) -> tuple[float | None, LoaderSetting]:
    ranked = sorted({t.setting for t in search.trials if t.error is None}, key=search.rate, reverse=True)
    others = [setting for setting in ranked if setting != best]
    contenders = [best] + others[:1]
    for setting in contenders:
        search.try_setting("repeat", setting, progress)
    spreads = []
    for setting in contenders:
        rates = [t.samples_per_s for t in search.trials if t.setting == setting and t.error is None]
        if len(rates) > 1 and max(rates) > 0:
            spreads.append((max(rates) - min(rates)) / max(rates))
    if len(contenders) == 2 and search.rate(contenders[1]) > search.rate(best) * (1 + search.min_gain):
        trial_rates = [[t.samples_per_s for t in search.trials if t.setting == setting and t.error is None]
                       for setting in contenders]
        # the runner-up takes over only when its trials beat the best's beyond their spread
        if range_verdict(trial_rates[1], trial_rates[0], higher_is_better=True) == FASTER:
            best = contenders[1]
    return (max(spreads) if spreads else None), best


class LoaderFactory:
    """Builds the loader for a setting, through the factory's keyword arguments or by rebuilding.

    Raises:
        UsageError: the factory is not callable, raises, or returns something other than a DataLoader.
    """

    def __init__(self, factory: Callable[..., Any], *, accepted: set[str] | None = None,
                 current: LoaderSetting | None = None):
        """``current``: the factory's own setting when known (the factory is then not called here)."""
        if not callable(factory):
            raise UsageError(f"{factory!r} is not a function returning a DataLoader")
        self.factory = factory
        self.accepted = _accepted_knobs(factory) if accepted is None else accepted
        if current is not None:
            self.current = current
            return
        loader = self.call()
        self.current = LoaderSetting(
            num_workers=loader.num_workers, prefetch_factor=loader.prefetch_factor if loader.num_workers else None,
            pin_memory=bool(loader.pin_memory), persistent_workers=bool(loader.persistent_workers),
            batch_size=loader.batch_size)

    def call(self, **overrides: Any):
        from torch.utils.data import DataLoader

        name = getattr(self.factory, "__qualname__", repr(self.factory))
        try:
            loader = self.factory(**overrides)
        except Exception as exc:  # the user's code: any failure is a usage error, reported in one line
            raise UsageError(f"the factory {name}() raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(loader, DataLoader):
            raise UsageError(f"the factory {name}() returned a {type(loader).__name__}, not a DataLoader")
        return loader

    def build(self, setting: LoaderSetting):
        knobs = {"num_workers": setting.num_workers, "prefetch_factor": setting.prefetch_factor,
                 "pin_memory": setting.pin_memory, "persistent_workers": setting.persistent_workers,
                 "batch_size": setting.batch_size}
        given = {name: value for name, value in knobs.items() if name in self.accepted}
        if setting.batch_size is None or setting.batch_size == self.current.batch_size:
            given.pop("batch_size", None)
        loader = self.call(**given)
        if all(name in self.accepted for name in KNOBS[:4]):
            return loader
        return rebuild(loader, setting)


def _accepted_knobs(factory: Callable[..., Any]) -> set[str]:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return set()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return set(KNOBS)
    return {p.name for p in parameters if p.name in KNOBS and p.kind is not inspect.Parameter.POSITIONAL_ONLY}


def rebuild(loader: Any, setting: LoaderSetting):
    """A DataLoader like ``loader`` (dataset, sampling, collate, worker set-up) with ``setting``'s knobs."""
    from torch.utils.data import DataLoader, IterableDataset

    kwargs: dict[str, Any] = dict(
        collate_fn=loader.collate_fn, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context, generator=loader.generator,
        pin_memory_device=getattr(loader, "pin_memory_device", ""), num_workers=setting.num_workers,
        pin_memory=setting.pin_memory, persistent_workers=setting.persistent_workers and setting.num_workers > 0)
    if setting.num_workers:
        kwargs["prefetch_factor"] = setting.prefetch_factor
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    if loader.batch_size is not None:
        kwargs.update(batch_size=setting.batch_size or loader.batch_size, drop_last=loader.drop_last)
        if not isinstance(loader.dataset, IterableDataset):
            kwargs["sampler"] = loader.sampler
    elif loader.batch_sampler is not None:
        kwargs["batch_sampler"] = loader.batch_sampler
    else:
        kwargs["batch_size"] = None
        if not isinstance(loader.dataset, IterableDataset):
            kwargs["sampler"] = loader.sampler
    return DataLoader(loader.dataset, **kwargs)


def measure(factory: LoaderFactory, setting: LoaderSetting, batches: int, stage: str,
            min_time_s: float = 0.0) -> Trial:
    """One trial (see the module docstring); loading errors are recorded, not raised."""
    started = time.perf_counter()
    with warnings.catch_warnings():  # trying more workers than torch suggests is the point here
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        return _measure(factory, setting, batches, stage, min_time_s, started)


def _measure(factory: LoaderFactory, setting: LoaderSetting, batches: int, stage: str, min_time_s: float,
             started: float) -> Trial:
    loader = factory.build(setting)
    try:
        first_s, rate, count = _first_pass(loader, setting, batches, min_time_s)
        restart_started = time.perf_counter()
        iterator = iter(loader)
        next(iterator, None)
        restart_s = time.perf_counter() - restart_started
        del iterator
    except Exception as exc:  # a setting that cannot load (e.g. unpicklable under spawn) is a result
        _shutdown(loader)
        return Trial(stage, setting, 0.0, 0.0, 0.0, 0, time.perf_counter() - started,
                     error=f"{type(exc).__name__}: {exc}")
    _shutdown(loader)
    return Trial(stage, setting, rate, first_s, restart_s, count, time.perf_counter() - started)


def _first_pass(loader: Any, setting: LoaderSetting, batches: int, min_time_s: float) -> tuple[float, float, int]:
    started = time.perf_counter()
    iterator = iter(loader)
    try:
        next(iterator)
    except StopIteration:
        raise UsageError("the DataLoader yielded no batch") from None
    first_s = time.perf_counter() - started
    ready = min(batches // 2, setting.num_workers * (setting.prefetch_factor or 0))
    for done in range(ready):  # prepared during start-up: not a measure of the steady rate
        if next(iterator, None) is None:
            raise UsageError(f"the DataLoader yielded only {done + 1} batches; give fewer --batches")
    timed_from = time.perf_counter()
    samples, count = 0, 0
    for batch in iterator:
        samples += batch_length(batch)
        count += 1
        if count >= batches - ready and time.perf_counter() - timed_from >= min_time_s:
            break
    del iterator
    if count == 0:
        raise UsageError(f"the DataLoader yielded only {ready + 1} batches; give fewer --batches")
    return first_s, samples / (time.perf_counter() - timed_from), ready + 1 + count


def _shutdown(loader: Any) -> None:
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    loader._iterator = None


def batch_length(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (1 when there is none)."""
    if hasattr(batch, "shape") and len(batch.shape):
        return int(batch.shape[0])
    if isinstance(batch, dict) and batch:
        return batch_length(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        return batch_length(first) if hasattr(first, "shape") or isinstance(first, (dict, list, tuple)) else len(batch)
    return 1


