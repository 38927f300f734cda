"""The CPU matmul peak: measured without touching the RNG, cached per machine, never fatal."""

from __future__ import annotations

import os
from dataclasses import replace

import orjson
import pytest

torch = pytest.importorskip("torch")

from stepscope.capture import cpu_peak  # noqa: E402
from stepscope.record.run import CpuPeak  # noqa: E402


def test_measurement_is_plausible_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    peak = cpu_peak.measure_cpu_matmul_peak(repetitions=3, max_s=0.05)
    assert torch.equal(torch.get_rng_state(), state)
    assert 1e8 < peak.flops_median <= peak.flops_best < 1e14
    assert peak.repetitions >= 3 and peak.threads == torch.get_num_threads()
    assert peak.source == "measured" and peak.measured_wall_ns > 0


def test_cache_path_follows_xdg_cache_home(cache_home, monkeypatch):
    assert cpu_peak.cache_path() == cache_home / "stepscope" / "cpu_peak.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cpu_peak.cache_path() == cpu_peak.Path(os.path.expanduser("~")) / ".cache" / "stepscope" / "cpu_peak.json"


def test_first_call_measures_and_caches_then_the_cache_answers(cache_home, monkeypatch):
    calls = []
    real = cpu_peak.measure_cpu_matmul_peak

    def counting(*args, **kwargs):
        calls.append(1)
        measured = real(repetitions=3, max_s=0.05)
        # a real measurement, made steady: one disturbed by other work is measured again by design
        # (test_a_disturbed_cached_peak_is_measured_again_until_a_steady_measurement_settles_it)
        return replace(measured, flops_median=max(measured.flops_median, 0.9 * measured.flops_best), core_wait_share=0.0)

    monkeypatch.setattr(cpu_peak, "measure_cpu_matmul_peak", counting)
    first = cpu_peak.peak_at_torch_import(lambda cause, text: pytest.fail(text))
    second = cpu_peak.peak_at_torch_import(lambda cause, text: pytest.fail(text))
    assert len(calls) == 1
    assert first.source == "measured" and second.source == "cache"
    assert second.flops_best == first.flops_best and second.flops_median == first.flops_median
    document = orjson.loads(cpu_peak.cache_path().read_bytes())
    (entry,) = document["entries"].values()
    assert entry["spread"] == pytest.approx(first.spread)


def test_the_best_rate_ever_seen_wins(cache_home):
    threads = torch.get_num_threads()
    cpu_peak.store_peak(CpuPeak(flops_best=2e9, flops_median=1e9, threads=threads))
    cpu_peak.store_peak(CpuPeak(flops_best=1e9, flops_median=1e9, threads=threads))  # worse: ignored
    assert cpu_peak.cached_peak(threads).flops_best == 2e9
    cpu_peak.store_peak(CpuPeak(flops_best=3e9, flops_median=2.5e9, threads=threads))
    assert cpu_peak.cached_peak(threads).flops_median == 2.5e9


def test_key_depends_on_threads_and_thread_environment(cache_home, monkeypatch):
    cpu_peak.store_peak(CpuPeak(flops_best=2e9, flops_median=1e9, threads=2))
    assert cpu_peak.cached_peak(2) is not None
    assert cpu_peak.cached_peak(1) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert cpu_peak.cached_peak(2) is None


def test_unwritable_cache_is_one_warning_and_the_measurement_is_kept(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr(cpu_peak, "measure_cpu_matmul_peak",
                        lambda dtype="fp32": CpuPeak(flops_best=2e9, flops_median=1e9, threads=1, dtype=dtype))
    warned = []
    peak = cpu_peak.peak_at_torch_import(lambda cause, text: warned.append((cause, text)))
    assert peak is not None and peak.flops_best == 2e9
    assert [cause for cause, _ in warned] == ["cpu-peak-cache"]


def test_damaged_cache_reads_as_empty(cache_home):
    path = cpu_peak.cache_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"{not json")
    assert cpu_peak.cached_peak(1) is None
    cpu_peak.store_peak(CpuPeak(flops_best=2e9, flops_median=1e9, threads=1))
    assert cpu_peak.cached_peak(1).flops_best == 2e9


@pytest.mark.parametrize("cached, measured, kept", [
    # a faster steady measurement replaces the disturbed entry (median 40 % of its best)
    ((3e10, 1.2e10), (2e11, 1.9e11), (2e11, 1.9e11)),
    # a slower steady one keeps the disturbed entry's best and settles its spread
    ((3e11, 1e11), (2.5e11, 2.4e11), (3e11, 2.4e11)),
])
def test_a_disturbed_cached_peak_is_measured_again_until_a_steady_measurement_settles_it(
        cache_home, monkeypatch, cached, measured, kept):
    cpu_peak.store_peak(CpuPeak(flops_best=cached[0], flops_median=cached[1], repetitions=7, threads=1))
    monkeypatch.setattr(cpu_peak, "current_threads", lambda: 1)
    monkeypatch.setattr(cpu_peak, "measure_cpu_matmul_peak", lambda dtype="fp32": CpuPeak(
        flops_best=measured[0], flops_median=measured[1], threads=1, dtype=dtype, core_wait_share=0.01))
    peak = cpu_peak.peak_at_torch_import(lambda *args: None)
    assert (peak.flops_best, peak.flops_median) == kept and peak.source == "measured"
    entry = cpu_peak.cached_peak(1)
    assert (entry.flops_best, entry.flops_median) == kept
    monkeypatch.setattr(cpu_peak, "measure_cpu_matmul_peak", lambda dtype="fp32": pytest.fail("measured again"))
    assert cpu_peak.peak_at_torch_import(lambda *args: None).source == "cache"  # steady now: trusted


def test_a_steadier_median_never_lowers_the_best(cache_home):
    cpu_peak.store_peak(CpuPeak(flops_best=3e11, flops_median=1e11, repetitions=7, threads=1))
    cpu_peak.store_peak(CpuPeak(flops_best=2e11, flops_median=1.9e11, repetitions=7, threads=1))
    entry = cpu_peak.cached_peak(1)
    assert (entry.flops_best, entry.flops_median) == (3e11, 1.9e11)


def test_a_measurement_beside_busy_processes_says_its_threads_lacked_cores(children):
    """Processes spinning on every core take about half of them from the matmul threads: the rates
    alone can look steady (every repetition equally slow), the threads' wait for a core says it."""
    import subprocess
    import sys

    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    children.extend(busy)
    peak = cpu_peak.measure_cpu_matmul_peak(repetitions=7, max_s=1.0)
    assert peak.core_wait_share is not None and peak.core_wait_share > cpu_peak.CROWDED_WAIT_SHARE, peak


@pytest.mark.parametrize("wait, measured_again", [(0.45, True), (None, True), (0.03, False)])
def test_a_cached_peak_whose_threads_lacked_cores_is_measured_again(cache_home, monkeypatch, wait, measured_again):
    """Steady but crowded (22 GFLOP/s for two threads that reach 79 alone): measured again at the next
    run, the better best kept; an entry kept before shares were is measured once more."""
    cpu_peak.store_peak(CpuPeak(flops_best=2.2e10, flops_median=2.0e10, repetitions=7, threads=1, core_wait_share=wait))
    monkeypatch.setattr(cpu_peak, "current_threads", lambda: 1)
    monkeypatch.setattr(cpu_peak, "measure_cpu_matmul_peak", lambda dtype="fp32": CpuPeak(
        flops_best=7.9e10, flops_median=7.5e10, threads=1, dtype=dtype, core_wait_share=0.01))
    peak = cpu_peak.peak_at_torch_import(lambda *args: None)
    assert (peak.source == "measured") is measured_again
    expected = (7.9e10, 0.01) if measured_again else (2.2e10, 0.03)
    assert (peak.flops_best, peak.core_wait_share) == expected
    entry = cpu_peak.cached_peak(1)
    assert (entry.flops_best, entry.core_wait_share) == expected


def test_a_machine_that_is_always_crowded_measures_a_few_times_then_keeps_the_best(cache_home, monkeypatch):
    """Each crowded measurement costs up to half a second at torch import: after three, the best of
    them is kept instead of measuring at every run."""
    rates = iter([2.0e10, 3.0e10, 2.5e10])
    calls = []

    def crowded(dtype="fp32"):
        calls.append(1)
        rate = next(rates)
        return CpuPeak(flops_best=rate, flops_median=0.9 * rate, threads=1, dtype=dtype, core_wait_share=0.5)

    monkeypatch.setattr(cpu_peak, "current_threads", lambda: 1)
    monkeypatch.setattr(cpu_peak, "measure_cpu_matmul_peak", crowded)
    sources = [cpu_peak.peak_at_torch_import(lambda *args: None).source for _ in range(5)]
    assert sources == ["measured"] * cpu_peak.MAX_CROWDED_TRIES + ["cache"] * 2 and len(calls) == 3
    assert cpu_peak.cached_peak(1).flops_best == 3.0e10
