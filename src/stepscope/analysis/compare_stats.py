"""The statistics every comparison of stepscope uses: ``diff``, ``try``, ``tune-loader``, ``--verify``.

Two kinds of evidence, one verdict vocabulary (``faster``, ``slower``, ``within noise``,
``no noise bound``):

**Many steps of two runs** (:func:`compare_steps`, for ``stepscope diff``). The figure is a ratio
of sums over the steady steps — mean step time is Σ duration / n, a phase's mean Σ phase / n,
samples/s Σ samples / Σ duration — so it is what the length of training follows. Per-step times
are autocorrelated (a slow stretch while another process runs) and heavy-tailed, so the interval
of the relative difference ``B/A − 1`` is a **moving-block bootstrap** (blocks of ⌈n^⅓⌉ steps,
resampled independently in A and B, :data:`BOOTSTRAP_RESAMPLES` resamples, percentile interval
at :data:`CONFIDENCE`). Long runs are first reduced to at most :data:`MAX_POINTS` batch means
(consecutive steps summed), which keeps the cost bounded and respects the autocorrelation.

A bootstrap over one run's steps knows only that run's step-to-step noise, not the run-to-run
noise of a shared machine (another tenant, CPU placement and frequency, the page cache): identical
runs differ by far more than their step intervals say (on this project's 2-core machine by a
factor of up to 1.49, BENCHMARKS.md "False alarms of diff"). So a row is beyond noise only when its interval
excludes 0 **and** the difference exceeds a floor for the run-to-run noise (a factor: B/A beyond
``1 + floor`` or below ``1 / (1 + floor)``, so a step time and the throughput of the same two runs
agree): measured when it can
be — :func:`floor_from_history` over earlier identical runs in the run index — else
:data:`NOISE_FLOOR`, the worst case measured on the zoo; when other processes shared the machine
during either run, :data:`LOADED_FLOOR`, the worst case measured under load (a many-fold change is
still called, what load alone does is not). With fewer than :data:`MIN_STEPS` steady steps on
either side there is no interval: ``no noise bound``.

**The typical step** (:func:`compare_medians`): the median steady step of each run, with a
moving-block bootstrap interval of the medians, judged against the same floor. ``diff`` sets it
beside the mean to say whether a change comes from every step or from a few long ones.

**Several runs per side** (:func:`compare_runs`, ``diff A1 A2 … --vs B1 B2 …`` or a tagged
baseline history): one figure per run and Welch's t interval of the difference of the means; the
repeats measure the run-to-run noise, so the floor is only :data:`MEASURED_FLOOR`.

**A few repeated trials** (:func:`range_verdict`, for ``try`` and ``tune-loader``: 2–5 short runs
per setting). Too few for a bootstrap; the verdict is ``faster``/``slower`` when the ranges of the
per-trial figures do not overlap (with 3 trials each, two identical settings overlap with
probability 0.9: a false alarm at most 10 % of the time, less in practice since trials of one
setting are interleaved with the others').
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

FASTER, SLOWER, WITHIN_NOISE, NO_BOUND, FAILED = "faster", "slower", "within noise", "no noise bound", "failed"

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
MAX_POINTS = 2000
MIN_STEPS = 10
#: Smallest difference of a run figure called real when each side is one run and the run-to-run
#: noise of this workload is not known, as a factor (B/A beyond ×1.4 or ÷1.4): identical pairs of
#: zoo runs on a shared 2-core machine differed by a factor of up to 1.49 (p95 1.35, median 1.10;
#: BENCHMARKS.md "False alarms of diff"), and 1.4 gave 1/24 false alarms. Repeats
#: (``diff A1 A2 --vs B1 B2``) or a history of identical runs replace it by the noise they measure.
NOISE_FLOOR = 0.40
#: The floor when the run-to-run noise was measured (repeats, history): small effects stay unnamed.
MEASURED_FLOOR = 0.02
#: The largest factor between two runs of one setup measured beside other processes: ×2.87 (+187 %)
#: in the first study of 28 pairs, ×3.58 for ``healthy`` with a busy loop beside one run of the pair
#: (BENCHMARKS.md "Noise floor of diff: false alarms and power, quiet and loaded").
LOADED_NOISE = 3.58
#: The floor when other processes used more than a tenth of the cores during either run, as a
#: factor (B/A beyond ×5 or below ÷5): above the largest factor load alone made, so a loaded pair
#: is judged against the noise measured under load, not against no bound at all: a many-fold change
#: (a straggler removed: ÷17) is still called, a doubling is not.
LOADED_FLOOR = 4.0
#: Two-sided 97.5 % quantiles of Student's t for 1..30 degrees of freedom (beyond: 1.96 + 2.4/df).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)
#: Phases below this share of the step in both runs get no verdict of their own: a 0.1 ms phase
#: that doubled is "within noise" for the user even when the bootstrap can tell it apart.
MIN_SHARE = 0.02


@dataclass(frozen=True)
class Difference:
    """B against A for one figure: values, the relative difference and its interval, the verdict.

    ``higher_is_better`` says which way "faster" points (throughput) or not (times).
    """

    a: float | None
    b: float | None
    change: float | None  # b / a - 1
    low: float | None  # interval of the change
    high: float | None
    verdict: str
    higher_is_better: bool = False
    method: str = ""

    @property
    def worse_by(self) -> float | None:
        """How much worse B is than A, as a positive fraction (negative when B is better)."""
        if self.change is None:
            return None
        return -self.change if self.higher_is_better else self.change

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["worse_by"] = self.worse_by
        return data


def block_length(count: int) -> int:
    return max(1, int(math.ceil(count ** (1 / 3))))


def _batch_means(numerator: np.ndarray, denominator: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At most :data:`MAX_POINTS` points: consecutive steps summed (ratio of sums unchanged)."""
    count = len(numerator)
    if count <= MAX_POINTS:
        return numerator, denominator
    edges = np.linspace(0, count, MAX_POINTS + 1).astype(np.int64)
    return np.add.reduceat(numerator, edges[:-1]), np.add.reduceat(denominator, edges[:-1])


def _resampled_ratios(numerator: np.ndarray, denominator: np.ndarray, rng: np.random.Generator,
                      resamples: int) -> np.ndarray:
    """Moving-block bootstrap of Σ numerator / Σ denominator (one value per resample)."""
    numerator, denominator = _batch_means(numerator, denominator)
    count = len(numerator)
    block = block_length(count)
    blocks = math.ceil(count / block)
    starts = rng.integers(0, count - block + 1, size=(resamples, blocks))
    index = (starts[:, :, None] + np.arange(block)[None, None, :]).reshape(resamples, -1)[:, :count]
    sums_n = numerator[index].sum(axis=1)
    sums_d = denominator[index].sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios: np.ndarray = sums_n / sums_d
    return ratios


def compare_steps(numerator_a: np.ndarray, denominator_a: np.ndarray, numerator_b: np.ndarray,
                  denominator_b: np.ndarray, *, higher_is_better: bool = False, floor: float = NOISE_FLOOR,
                  resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> Difference:
    """B's Σ num / Σ den against A's, with a moving-block bootstrap interval (module docstring)."""
    num_a, den_a = np.asarray(numerator_a, dtype=np.float64), np.asarray(denominator_a, dtype=np.float64)
    num_b, den_b = np.asarray(numerator_b, dtype=np.float64), np.asarray(denominator_b, dtype=np.float64)
    method = f"moving-block bootstrap over steps ({resamples} resamples, {int(CONFIDENCE * 100)}% interval)"
    value_a = float(num_a.sum() / den_a.sum()) if len(num_a) and den_a.sum() > 0 else None
    value_b = float(num_b.sum() / den_b.sum()) if len(num_b) and den_b.sum() > 0 else None
    if value_a is None or value_b is None:
        return Difference(value_a, value_b, None, None, None, FAILED, higher_is_better, method)
    if value_a == 0:
        verdict = WITHIN_NOISE if value_b == 0 else NO_BOUND
        return Difference(value_a, value_b, None, None, None, verdict, higher_is_better, method)
    change = value_b / value_a - 1
    if min(len(num_a), len(num_b)) < MIN_STEPS:
        return Difference(value_a, value_b, change, None, None, NO_BOUND, higher_is_better, method)
    rng = np.random.default_rng(seed)
    ratios_a = _resampled_ratios(num_a, den_a, rng, resamples)
    ratios_b = _resampled_ratios(num_b, den_b, rng, resamples)
    with np.errstate(divide="ignore", invalid="ignore"):
        changes = ratios_b / ratios_a - 1
    changes = changes[np.isfinite(changes)]
    if not len(changes):
        return Difference(value_a, value_b, change, None, None, NO_BOUND, higher_is_better, method)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = (float(value) for value in np.percentile(changes, [tail, 100 - tail]))
    return Difference(value_a, value_b, change, low, high, interval_verdict(change, low, high, higher_is_better, floor),
                      higher_is_better, method)


#: The median's bootstrap: resamples, and the evenly spaced steps a long run is thinned to (the
#: median of 1000 of 100,000 steps is within a percentile of the whole's; a fifth of the cost).
MEDIAN_RESAMPLES = 1000
MEDIAN_POINTS = 1000


def compare_medians(values_a: np.ndarray, values_b: np.ndarray, *, floor: float = NOISE_FLOOR,
                    resamples: int = MEDIAN_RESAMPLES, seed: int = 0) -> Difference:
    """B's median step against A's: the typical step, which a few long steps do not move. The
    interval is a moving-block bootstrap of the medians (long runs thinned to :data:`MEDIAN_POINTS`
    evenly spaced steps first); the verdict is :func:`interval_verdict`'s with the same floor."""
    a, b = np.asarray(values_a, dtype=np.float64), np.asarray(values_b, dtype=np.float64)
    method = f"moving-block bootstrap of the median ({resamples} resamples, {int(CONFIDENCE * 100)}% interval)"
    if not len(a) or not len(b):
        return Difference(None, None, None, None, None, FAILED, False, method)
    median_a, median_b = float(np.median(a)), float(np.median(b))
    if median_a <= 0:
        return Difference(median_a, median_b, None, None, None, NO_BOUND, False, method)
    change = median_b / median_a - 1
    if min(len(a), len(b)) < MIN_STEPS:
        return Difference(median_a, median_b, change, None, None, NO_BOUND, False, method)
    rng = np.random.default_rng(seed)
    medians = [_resampled_medians(values, rng, resamples) for values in (a, b)]
    with np.errstate(divide="ignore", invalid="ignore"):
        changes = medians[1] / medians[0] - 1
    changes = changes[np.isfinite(changes)]
    if not len(changes):
        return Difference(median_a, median_b, change, None, None, NO_BOUND, False, method)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = (float(value) for value in np.percentile(changes, [tail, 100 - tail]))
    return Difference(median_a, median_b, change, low, high, interval_verdict(change, low, high, False, floor),
                      False, method)


def _resampled_medians(values: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    if len(values) > MEDIAN_POINTS:
        values = values[np.linspace(0, len(values) - 1, MEDIAN_POINTS).astype(np.int64)]
    count = len(values)
    block = block_length(count)
    blocks = math.ceil(count / block)
    starts = rng.integers(0, count - block + 1, size=(resamples, blocks))
    index = (starts[:, :, None] + np.arange(block)[None, None, :]).reshape(resamples, -1)[:, :count]
    medians: np.ndarray = np.median(values[index], axis=1)
    return medians


def beyond_floor(change: float, floor: float) -> bool:
    """Whether ``B/A = 1 + change`` is outside ``[1/(1+floor), 1+floor]``: the floor is a factor,
    so a step time 30 % shorter and a throughput 43 % higher (the same two runs) agree."""
    ratio = 1 + change
    return ratio <= 0 or abs(math.log(ratio)) >= math.log1p(floor) - 1e-12


def interval_verdict(change: float, low: float, high: float, higher_is_better: bool, floor: float = NOISE_FLOOR) -> str:
    """``faster``/``slower`` when the interval excludes 0 and the change passes the noise floor."""
    if (low <= 0 <= high) or not beyond_floor(change, floor):
        return WITHIN_NOISE
    better = change > 0 if higher_is_better else change < 0
    return FASTER if better else SLOWER


def t_quantile(df: float) -> float:
    """Student's t 97.5 % quantile (a table up to 30 degrees of freedom, fractional df rounded down)."""
    if math.isinf(df):
        return 1.96
    if df < 1:
        return math.inf
    index = int(df)
    return _T975[index - 1] if index <= len(_T975) else 1.96 + 2.4 / df


def compare_runs(values_a: Sequence[float], values_b: Sequence[float], *, higher_is_better: bool = False,
                 floor: float = MEASURED_FLOOR) -> Difference:
    """Several runs per side: one figure per run, Welch's t interval of the difference of the means,
    relative to A's mean (the run-to-run noise is measured by the repeats themselves). With one run
    on one side, the other side's variance stands for both (df = its runs − 1)."""
    a = np.asarray([value for value in values_a if value is not None and math.isfinite(value)], dtype=np.float64)
    b = np.asarray([value for value in values_b if value is not None and math.isfinite(value)], dtype=np.float64)
    method = f"t interval over runs ({len(a)} vs {len(b)}, 95%)"
    if not len(a) or not len(b):
        return Difference(None, None, None, None, None, FAILED, higher_is_better, method)
    mean_a, mean_b = float(a.mean()), float(b.mean())
    if mean_a == 0:
        return Difference(mean_a, mean_b, None, None, None, WITHIN_NOISE if mean_b == 0 else NO_BOUND,
                          higher_is_better, method)
    change = mean_b / mean_a - 1
    if len(a) < 2 and len(b) < 2:
        return Difference(mean_a, mean_b, change, None, None, NO_BOUND, higher_is_better, method)
    if len(a) < 2 or len(b) < 2:
        # one run on one side (a history of baselines against a new run): the repeated side's
        # run-to-run variance stands for both
        repeated = a if len(a) > 1 else b
        se = float(repeated.std(ddof=1)) * math.sqrt(1 / len(a) + 1 / len(b))
        df = float(len(repeated) - 1)
    else:
        var_a, var_b = float(a.var(ddof=1)) / len(a), float(b.var(ddof=1)) / len(b)
        se = math.sqrt(var_a + var_b)
        denominator = (var_a ** 2 / (len(a) - 1) if var_a else 0.0) + (var_b ** 2 / (len(b) - 1) if var_b else 0.0)
        df = (var_a + var_b) ** 2 / denominator if denominator else math.inf
    half = t_quantile(df) * se / abs(mean_a) if se else 0.0
    low, high = change - half, change + half
    return Difference(mean_a, mean_b, change, low, high, interval_verdict(change, low, high, higher_is_better, floor),
                      higher_is_better, method)


def floor_from_history(step_times: Sequence[float]) -> float | None:
    """The noise floor identical earlier runs measure: the 95 % bound of the difference of two runs
    (t × √2 × their coefficient of variation), never below :data:`MEASURED_FLOOR`; None with < 3 runs."""
    values = np.asarray([value for value in step_times if value and math.isfinite(value)], dtype=np.float64)
    if len(values) < 3 or values.mean() <= 0:
        return None
    cv = float(values.std(ddof=1) / values.mean())
    return max(MEASURED_FLOOR, t_quantile(len(values) - 1) * math.sqrt(2) * cv)


def range_verdict(values: Sequence[float], base_values: Sequence[float], *, higher_is_better: bool = True) -> str:
    """Trials: ``faster``/``slower`` when the ranges of per-trial figures do not overlap, else
    ``within noise``; ``no noise bound`` with a single trial on either side; ``failed`` without one."""
    if not values or not base_values:
        return FAILED
    if len(values) < 2 or len(base_values) < 2:
        return NO_BOUND
    if min(values) > max(base_values):
        return FASTER if higher_is_better else SLOWER
    if max(values) < min(base_values):
        return SLOWER if higher_is_better else FASTER
    return WITHIN_NOISE


def range_ratio(values: Sequence[float], base_values: Sequence[float]) -> tuple[float, float, float] | None:
    """Median ratio of per-trial figures and its bounds (min/max, max/min), or None."""
    if not values or not base_values or min(base_values) <= 0:
        return None
    median = float(np.median(values)) / float(np.median(base_values))
    return median, min(values) / max(base_values), max(values) / min(base_values)
