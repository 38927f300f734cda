"""The CPU "peak" of MFU: the float32 matmul rate this machine reaches, measured once and cached.

On a CPU-only run, MFU divides the achieved FLOP/s by what a large GEMM reaches on this machine
with torch's intra-op threads. Measuring that takes a fraction of a second of full-machine work, so:

1. A per-machine cache (``$XDG_CACHE_HOME/stepscope/cpu_peak.json``, default
   ``~/.cache/stepscope/``) keeps, per key — CPU model, logical cores, torch version, torch's
   intra-op threads, ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` — the best rate ever seen, the
   median of that measurement (its spread) and when it was taken. A cached entry costs one file read.
2. Without an entry, :func:`measure_cpu_matmul_peak` runs once, when the script imports torch
   (the moment capture installs its hooks, before the script's first step, so it never competes
   with the run and never lengthens the end of a run that is being interrupted): a warm-up call
   and then :data:`REPETITIONS` timed ``CPU_PEAK_MATRIX``² matmuls. The operands are filled
   deterministically, without touching torch's global random generator, so seeded scripts stay
   bit-identical.
3. A cache that cannot be read or written is a warning at most; the measurement is still used.
"""

from __future__ import annotations

from dataclasses import replace

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from stepscope.record.run import CpuPeak

#: Side of the square float32 matrices timed (large enough to be compute-bound on CPUs, small
#: enough that a repetition takes milliseconds on 2 cores).
CPU_PEAK_MATRIX = 512
#: Timed repetitions after the warm-up call (the best is the peak; the median shows the spread).
REPETITIONS = 7
#: Stop early once the repetitions took this long (a slow or overloaded machine).
MAX_MEASURE_S = 0.5
CACHE_FILE = "cpu_peak.json"
_ENV_KEYS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def cache_path() -> Path:
    """``$XDG_CACHE_HOME/stepscope/cpu_peak.json`` (``~/.cache/stepscope/`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stepscope" / CACHE_FILE


def machine_parts() -> list[str]:
    """What every per-machine measurement depends on: the CPU model, its cores, the torch build
    (the cache keys here and in :mod:`stepscope.capture.op_cost` start with them)."""
    from stepscope.capture.environment import cpu_model

    torch = sys.modules.get("torch")
    return [cpu_model(), f"cores={os.cpu_count() or 0}", f"torch={getattr(torch, '__version__', '?')}"]


def machine_key(threads: int, dtype: str = "fp32") -> str:
    """The cache key: what the measured rate depends on (and the dtype, when not float32)."""
    parts = [*machine_parts(), f"threads={threads}"]
    parts += [f"{name}={os.environ.get(name, '')}" for name in _ENV_KEYS]
    if dtype != "fp32":
        # "peak=2": measured as the faster of mm and linear (earlier entries timed mm alone)
        parts += [f"dtype={dtype}", "peak=2"]
    return "|".join(parts)


def measure_cpu_matmul_peak(repetitions: int = REPETITIONS, max_s: float = MAX_MEASURE_S,
                            dtype: str = "fp32") -> CpuPeak:
    """Time ``dtype`` (``"fp32"`` or ``"bf16"``) matmuls with torch's current intra-op threads (see
    the module docstring). The operands come from a deterministic fill, so the global RNG state is
    untouched.
    """
    import torch

    size = CPU_PEAK_MATRIX
    kind = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    with torch.no_grad():
        values = torch.arange(size * size, dtype=torch.float32).reshape(size, size)
        left = torch.sin(values).to(kind)
        right = torch.cos(values).to(kind)
        out = torch.empty(size, size, dtype=kind)
        # the same GEMM two ways: a plain mm, and linear (left @ right.T), which a model's layers
        # run; on a CPU without native bf16 a bf16 mm takes a slow reference path (1.1 GFLOP/s on a
        # 2-core EPYC) while linear goes to oneDNN (10 GFLOP/s): the peak is the faster of the two,
        # and a kernel 4x slower than the other after the first round is not timed again
        kernels = [lambda: torch.mm(left, right, out=out), lambda: torch.nn.functional.linear(left, right)]
        for kernel in kernels:
            kernel()  # warm-up: thread pool, caches, oneDNN primitives
        flops = 2.0 * size**3
        timings: list[list[float]] = [[] for _ in kernels]
        waited_begin, wall_begin = _run_queue_wait_ns(), time.perf_counter()
        deadline = wall_begin + max_s
        while len(timings[0]) < max(repetitions, 1):
            for index, kernel in enumerate(kernels):
                begin = time.perf_counter_ns()
                kernel()
                timings[index].append(flops / (max(time.perf_counter_ns() - begin, 1) / 1e9))
            if len(timings) > 1 and len(timings[0]) == 1:
                fastest = max(rates[0] for rates in timings)
                keep = [index for index, rates in enumerate(timings) if rates[0] * 4 >= fastest]
                kernels = [kernels[index] for index in keep]
                timings = [timings[index] for index in keep]
            if len(timings[0]) >= 3 and time.perf_counter() > deadline:
                break
        waited_end, wall_s = _run_queue_wait_ns(), time.perf_counter() - wall_begin
    rates = max(timings, key=max)
    threads = int(torch.get_num_threads())
    share = None
    if waited_begin is not None and waited_end is not None and wall_s > 0 and threads > 0:
        share = round(min(1.0, max(0, waited_end - waited_begin) / 1e9 / (wall_s * threads)), 3)
    return CpuPeak(flops_best=max(rates), flops_median=float(statistics.median(rates)), repetitions=len(rates),
                   threads=threads, source="measured", measured_wall_ns=time.time_ns(), dtype=dtype,
                   core_wait_share=share)


def _run_queue_wait_ns() -> int | None:
    """Nanoseconds the threads of this process have waited for a core, runnable but not running
    (``/proc/self/task/*/schedstat``), or None where the kernel does not say."""
    total, read = 0, False
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as fh:
                total += int(fh.read().split()[1])
            read = True
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile, or no schedstat
            continue
    return total if read else None


def read_cache(path: Path | None = None) -> dict[str, Any]:
    """The cache's entries (empty when missing or unreadable)."""
    try:
        data = orjson.loads((path or cache_path()).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    return entries if isinstance(entries, dict) else {}


def cached_peak(threads: int, path: Path | None = None, dtype: str = "fp32") -> CpuPeak | None:
    """The cached peak for this machine with ``threads`` intra-op threads, or None."""
    return _peak_of(read_cache(path).get(machine_key(threads, dtype)), threads, dtype)


def _peak_of(entry: Any, threads: int, dtype: str) -> CpuPeak | None:
    if not isinstance(entry, dict):
        return None
    try:
        return CpuPeak(flops_best=float(entry["flops_best"]), flops_median=float(entry["flops_median"]),
                       repetitions=int(entry.get("repetitions", 0)), threads=threads, source="cache",
                       measured_wall_ns=int(entry.get("measured_wall_ns", 0)), dtype=dtype,
                       core_wait_share=None if entry.get("core_wait_share") is None
                       else float(entry["core_wait_share"]))
    except (TypeError, KeyError, ValueError):
        return None


def store_peak(peak: CpuPeak, path: Path | None = None) -> None:
    """Merge ``peak`` into the cache: the best rate ever seen wins (with that measurement's median,
    or a steadier median given with the same best: see :func:`peak_at_torch_import`).

    Raises:
        OSError: the cache could not be written.
    """
    path = path or cache_path()
    key = machine_key(peak.threads or 0, peak.dtype)
    entries = read_cache(path)
    old = entries.get(key)
    tries = _crowded_tries(old)
    crowded = peak.core_wait_share is not None and peak.core_wait_share > CROWDED_WAIT_SHARE
    if isinstance(old, dict):
        old_best, old_median = float(old.get("flops_best", 0) or 0), float(old.get("flops_median", 0) or 0)
        old_wait = old.get("core_wait_share")
        if (old_best >= peak.flops_best and old_median >= peak.flops_median
                and _waited_less(old_wait, peak.core_wait_share) and not crowded):
            return
        median = max(old_median, peak.flops_median) if old_best >= peak.flops_best else peak.flops_median
        peak = replace(peak, flops_best=max(old_best, peak.flops_best), flops_median=median,
                       core_wait_share=_less_wait(peak.core_wait_share, old_wait))
    entries[key] = {"flops_best": peak.flops_best, "flops_median": peak.flops_median,
                    "spread": peak.spread, "repetitions": peak.repetitions, "threads": peak.threads,
                    "measured_wall_ns": peak.measured_wall_ns, "core_wait_share": peak.core_wait_share,
                    "crowded_tries": tries + crowded}
    write_cache(path, "stepscope.cpu_peak_cache", entries)


def _waited_less(wait: float | None, other: float | None) -> bool:
    """``wait`` <= ``other``, an unknown wait (an entry kept before waits were) the longest."""
    return other is None or (wait is not None and wait <= other)


def _less_wait(wait: float | None, other: float | None) -> float | None:
    """The shorter of two waits for a core (see :func:`_waited_less`)."""
    return wait if _waited_less(wait, other) else other


def write_cache(path: Path, kind: str, entries: dict[str, Any]) -> None:
    """Write a per-machine cache file (``{"kind", "entries"}``, read back by :func:`read_cache`) whole.

    Raises:
        OSError: it could not be written.
    """
    from stepscope.safe_write import atomic_write

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, orjson.dumps({"kind": kind, "entries": entries}, option=orjson.OPT_INDENT_2))


def current_threads() -> int:
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else 0


#: Matmul dtypes whose CPU peak is kept: float32, and bfloat16 for CPU autocast runs (MFU is
#: measured against the peak of the dtype that ran).
PEAK_DTYPES = ("fp32", "bf16")


#: A cached measurement whose median repetition reached less than this share of its best was taken
#: on a disturbed machine (other work took the cores between repetitions): it is measured again at
#: the next run, and the best of both is kept, until a steady measurement settles it.
STEADY_MEDIAN_SHARE = 0.7
#: A measurement whose threads waited for a core more than this share of their time (the run-queue
#: delay over the repetitions' wall time) was taken beside other work that held the cores the whole
#: time — steady, and low (two matmul threads measured 22 GFLOP/s beside three test processes, 88
#: alone): it is measured again at the next run, the best of both kept, as a disturbed one. (Not the
#: threads' CPU time: a bfloat16 matmul keeps two threads 67-72 % busy on an idle 2-core machine.)
CROWDED_WAIT_SHARE = 0.2
#: Crowded measurements after which the best of them is kept (each costs up to :data:`MAX_MEASURE_S`
#: at torch import: a machine that is always crowded pays it this many times, not every run).
MAX_CROWDED_TRIES = 3


def _crowded_tries(entry: Any) -> int:
    """How many crowded measurements a cache entry has merged."""
    try:
        return int(entry.get("crowded_tries", 0)) if isinstance(entry, dict) else 0
    except (TypeError, ValueError):
        return 0


def _settled(peak: CpuPeak, crowded_tries: int = 0) -> bool:
    """A cached peak that is not measured again: steady repetitions, and cores not held by others,
    or :data:`MAX_CROWDED_TRIES` crowded measurements already (an entry kept before waits were is
    measured once more, which gives it one)."""
    uncrowded = peak.core_wait_share is not None and peak.core_wait_share <= CROWDED_WAIT_SHARE
    return (peak.flops_median >= STEADY_MEDIAN_SHARE * peak.flops_best
            and (uncrowded or crowded_tries >= MAX_CROWDED_TRIES))


def peak_at_torch_import(warn: Any, dtype: str = "fp32") -> CpuPeak | None:
    """The cached peak, else a measurement (stored in the cache). ``warn(cause, text)`` on trouble.

    A cached peak that was measured on a disturbed machine (see :data:`STEADY_MEDIAN_SHARE` and
    :data:`CROWDED_WAIT_SHARE`) is measured again; the better of the two is used and kept."""
    threads = current_threads()
    entry = read_cache().get(machine_key(threads, dtype))
    cached = _peak_of(entry, threads, dtype)
    if cached is not None and _settled(cached, _crowded_tries(entry)):
        return cached
    try:
        peak = measure_cpu_matmul_peak(dtype=dtype)
    except Exception as exc:  # noqa: BLE001 - a missing peak only costs MFU
        warn(f"cpu-peak-{dtype}", f"CPU {dtype} matmul peak not measured ({type(exc).__name__}: {exc}); no CPU MFU")
        return cached
    if cached is not None:
        # the better best of both; the spread of the steadier measurement, so that one steady
        # measurement settles a disturbed entry (else each run would measure again)
        peak = replace(peak, flops_best=max(peak.flops_best, cached.flops_best),
                       flops_median=max(peak.flops_median, cached.flops_median),
                       core_wait_share=_less_wait(peak.core_wait_share, cached.core_wait_share))
    try:
        store_peak(peak)
    except OSError as exc:
        warn("cpu-peak-cache", f"CPU peak cache {cache_path()} not written ({exc.strerror or exc}); "
                               "the peak will be measured again next run")
    return peak


__all__ = ["CPU_PEAK_MATRIX", "PEAK_DTYPES", "cache_path", "cached_peak", "machine_key", "machine_parts",
           "measure_cpu_matmul_peak", "peak_at_torch_import", "read_cache", "store_peak", "write_cache"]
