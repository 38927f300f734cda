"""The CPU peak's per-run probe: what it costs a run's start and how closely it tracks the full
measurement (``stepscope.capture.cpu_peak``).

Every run with a cached fp32 peak probes the cores at torch import; the probe's rate against the
probe taken with the cached best scales the peak the run is measured against. For that to hold,
the probe must follow the full measurement on a quiet machine: in alternating rounds, per thread
count, this times the full measurement (the baseline, ``CPU_PEAK_MATRIX``) and then the probe,
and prints the probe's wall time and its rate over the full measurement's. ``--size`` compares
another probe size.

    python benchmarks/bench_cpu_probe.py [--rounds 6] [--size 384] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--size", type=int, default=None, help="probe matrix side (default: the shipped one)")
    parser.add_argument("--threads", type=int, nargs="+", default=None, help="intra-op thread counts (default 1 and all)")
    args = parser.parse_args()

    import os

    import torch

    from stepscope.capture import cpu_peak

    size = args.size or cpu_peak.PROBE_MATRIX
    for threads in args.threads or sorted({1, os.cpu_count() or 1}):
        torch.set_num_threads(threads)
        ratios, walls, waits = [], [], []
        for _ in range(args.rounds):
            full = cpu_peak.measure_cpu_matmul_peak()
            started = time.perf_counter()
            probe = cpu_peak.measure_cpu_matmul_peak(repetitions=cpu_peak.PROBE_REPETITIONS, max_s=0.02, size=size)
            walls.append((time.perf_counter() - started) * 1e3)
            ratios.append(probe.flops_best / full.flops_best)
            waits.append(max(full.core_wait_share or 0.0, probe.core_wait_share or 0.0))
        print(f"threads {threads}, probe {size}²: wall {min(walls):.1f}-{max(walls):.1f} ms "
              f"(median {statistics.median(walls):.1f}); ratio probe/full {min(ratios):.2f}-{max(ratios):.2f} "
              f"(median {statistics.median(ratios):.2f}); largest wait for a core {max(waits):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
