"""The comparison statistics shared by diff, try and tune-loader."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope.analysis.compare_stats import (FASTER, NO_BOUND, SLOWER, WITHIN_NOISE, block_length, compare_runs,
                                              compare_steps, floor_from_history, interval_verdict, range_ratio,
                                              range_verdict, t_quantile)


def _steps(mean: float, count: int, seed: int, spread: float = 0.1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return mean * (1 + spread * rng.standard_normal(count)).clip(0.5)


def _time(a: np.ndarray, b: np.ndarray, **kwargs):
    return compare_steps(a, np.ones(len(a)), b, np.ones(len(b)), **kwargs)


def test_two_samples_of_one_distribution_are_within_noise():
    for seed in range(20):
        diff = _time(_steps(0.01, 200, seed), _steps(0.01, 200, seed + 100))
        assert diff.verdict == WITHIN_NOISE, (seed, diff)
        assert diff.low is not None and diff.high is not None and diff.low <= diff.change <= diff.high


def test_a_real_slow_down_is_slower_with_an_interval_around_it():
    diff = _time(_steps(0.01, 300, 1), _steps(0.013, 300, 2), floor=0.05)
    assert diff.verdict == SLOWER
    assert _time(_steps(0.01, 300, 1), _steps(0.013, 300, 2)).verdict == WITHIN_NOISE  # below the default ×1.4
    assert diff.change == pytest.approx(0.3, abs=0.03)
    assert diff.low < 0.3 < diff.high and diff.low > 0.2
    assert diff.worse_by == pytest.approx(diff.change)


def test_throughput_is_higher_is_better():
    a, b = _steps(0.01, 300, 1), _steps(0.006, 300, 2)
    diff = compare_steps(np.ones(len(a)), a, np.ones(len(b)), b, higher_is_better=True)
    assert diff.verdict == FASTER and diff.change > 0.3 and diff.worse_by < 0


def test_a_change_below_the_noise_floor_is_within_noise_even_when_the_interval_excludes_zero():
    a, b = np.full(500, 0.0100), np.full(500, 0.0103)  # +3%, no spread at all
    diff = _time(a, b)
    assert diff.low > 0 and diff.verdict == WITHIN_NOISE
    assert _time(a, b, floor=0.01).verdict == SLOWER


def test_autocorrelated_steps_get_a_wider_interval_than_independent_ones():
    rng = np.random.default_rng(3)
    slow_stretches = np.repeat(0.01 * (1 + 0.2 * rng.standard_normal(20)), 20)  # 20-step stretches
    shuffled = rng.permutation(slow_stretches)
    wide = _time(slow_stretches, slow_stretches[::-1].copy())
    narrow = _time(shuffled, rng.permutation(shuffled))
    assert (wide.high - wide.low) > 1.5 * (narrow.high - narrow.low)


def test_few_steps_have_no_noise_bound_and_empty_runs_fail():
    assert _time(np.full(5, 0.01), np.full(5, 0.02)).verdict == NO_BOUND
    assert _time(np.array([]), np.full(20, 0.01)).verdict == "failed"


def test_long_runs_are_bounded_by_batch_means():
    a, b = _steps(0.01, 200_000, 1), _steps(0.01, 200_000, 2)
    diff = _time(a, b, resamples=200)
    assert diff.verdict == WITHIN_NOISE
    assert block_length(2000) == 13


def test_interval_verdict_and_range_verdict():
    assert interval_verdict(-0.2, -0.3, -0.1, False, floor=0.05) == FASTER
    assert interval_verdict(-0.2, -0.3, -0.1, False) == WITHIN_NOISE  # below the default floor
    assert interval_verdict(-0.2, -0.3, 0.1, False) == WITHIN_NOISE
    assert range_verdict([10, 11, 12], [5, 6, 7]) == FASTER
    assert range_verdict([10, 11, 12], [5, 6, 7], higher_is_better=False) == SLOWER
    assert range_verdict([10, 11], [10.5, 12]) == WITHIN_NOISE
    assert range_verdict([10], [5, 6]) == NO_BOUND
    assert range_verdict([], [5]) == "failed"
    assert range_ratio([10, 12], [5, 6]) == pytest.approx((11 / 5.5, 10 / 6, 12 / 5))


def test_repeats_measure_the_run_to_run_noise():
    noisy_a, noisy_b = [30.0, 36.0, 33.0], [35.0, 31.0, 34.0]  # identical setups, ±10 % between runs
    same = compare_runs(noisy_a, noisy_b)
    assert same.verdict == WITHIN_NOISE and same.low < 0 < same.high
    steady_a, steady_b = [30.0, 30.3, 29.8, 30.1], [33.0, 33.2, 32.9, 33.1]  # +10 %, runs agree to 1 %
    slower = compare_runs(steady_a, steady_b)
    assert slower.verdict == SLOWER and 0.08 < slower.low < 0.10 < slower.high < 0.12
    # a history of baselines against one new run: the baselines' spread stands for both sides
    one = compare_runs(steady_a, [36.0])
    assert one.verdict == SLOWER and one.method.startswith("t interval over runs (4 vs 1")
    assert compare_runs([30.0], [36.0]).verdict == NO_BOUND
    assert t_quantile(1) == 12.706 and t_quantile(float("inf")) == 1.96 and 1.96 < t_quantile(100) < 2.0


def test_floor_from_history():
    assert floor_from_history([1.0, 1.0]) is None
    assert floor_from_history([1.0, 1.0, 1.0]) == 0.02
    floor = floor_from_history([1.0, 1.1, 0.9, 1.05, 0.95])
    assert floor == pytest.approx(2.776 * 2 ** 0.5 * 0.0790569, rel=1e-3)  # t(4) × √2 × cv


def test_the_floor_is_a_factor_so_time_and_throughput_agree():
    from stepscope.analysis.compare_stats import beyond_floor

    assert beyond_floor(0.40, 0.40) and beyond_floor(1 / 1.4 - 1, 0.40)  # ×1.4 and ÷1.4
    assert not beyond_floor(0.39, 0.40) and not beyond_floor(-0.28, 0.40)
    a, b = _steps(0.01, 300, 1), _steps(0.01 / 1.6, 300, 2)
    time_row = _time(a, b)
    rate_row = compare_steps(np.ones(len(a)), a, np.ones(len(b)), b, higher_is_better=True)
    assert time_row.verdict == rate_row.verdict == FASTER


def test_the_median_ignores_a_few_long_steps_and_sees_every_step_slower():
    from stepscope.analysis.compare_stats import compare_medians

    rng = np.random.default_rng(0)
    a = 0.088 * (1 + 0.02 * rng.standard_normal(200))
    b = 0.088 * (1 + 0.02 * rng.standard_normal(200))
    b[[40, 90, 140, 190]] = 3.4  # four recompilations: the mean nearly doubles
    median = compare_medians(a, b, floor=0.02)
    assert median.verdict == WITHIN_NOISE and abs(median.change) < 0.01 and b.mean() / a.mean() > 1.7
    slower = compare_medians(a, a * 1.3, floor=0.02)
    assert slower.verdict == SLOWER and slower.low > 0.2
    assert compare_medians(a[:5], b[:5]).verdict == NO_BOUND
