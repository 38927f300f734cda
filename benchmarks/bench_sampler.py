"""Sampler overhead: its own CPU at 10 Hz, and the slow-down of a busy training-like loop beside it.

    python benchmarks/bench_sampler.py [--seconds 20] [--rounds 20] [--steps 100]

1. One full sample in-process (every counter of the machine and a 3-process tree), median µs,
   against psutil reading the same. At 10 Hz the sampler reads the slower counters at 2 Hz only.
   Then the part of it that reads each process's main-thread CPU (the threads a worker runs on):
   the same sampler with and without those reads, alternating blocks, median µs of each.
2. The sidecar's CPU over ``--seconds`` at 10 Hz while it follows a training-like process with two
   busy children: steady state (start-up excluded) and with its start-up, as a share of one core.
   Budget: ≤ 1% of one core.
3. A training-like loop (a small torch MLP, forward/backward/SGD, on all cores; numpy without torch)
   timed in blocks of ``--steps`` steps with the sidecar sampling or paused (SIGSTOP), alternating
   ABBA so drift cancels; prints the median ratio and its quartiles. Budget: no measurable slow-down.

Ratios against a baseline measured in the same run, because the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from stepscope.capture.sampler import SLOW_EVERY_S, SystemSampler, start_sidecar  # noqa: E402
from stepscope.record import layout  # noqa: E402
from stepscope.record.samples import load_samples  # noqa: E402

LOOP = textwrap.dedent("""
    import sys, time
    try:
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        data, target = torch.randn(64, 256), torch.randint(0, 10, (64,))

        def step():
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(data), target).backward()
            optimizer.step()
    except ImportError:
        import numpy as np
        left, right = np.random.rand(192, 192), np.random.rand(192, 192)

        def step():
            (left @ right).sum()
    for _ in range(50):
        step()
    print("ready", flush=True)
    for line in sys.stdin:
        steps = int(line)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        print(time.perf_counter() - start, flush=True)
""")

#: A parent with two children that wake 1000 times a second (the tree the sidecar follows).
BUSY_TREE = textwrap.dedent("""
    import subprocess, sys, time
    CHILD = "import time\\nwhile True: time.sleep(0.001)"
    children = [subprocess.Popen([sys.executable, "-c", CHILD]) for _ in range(2)]
    time.sleep(3600)
""")


@contextmanager
def busy_tree() -> Iterator[subprocess.Popen]:
    """:data:`BUSY_TREE` running (its children started), killed with its children on the way out."""
    tree = subprocess.Popen([sys.executable, "-c", BUSY_TREE])
    try:
        time.sleep(0.5)
        yield tree
    finally:
        for child in psutil.Process(tree.pid).children(recursive=True):
            child.kill()
        tree.kill()
        tree.wait()


def per_sample_cost(repeats: int = 300) -> tuple[float, float]:
    """Median µs of one stepscope sample and of the same reading through psutil."""
    with busy_tree() as tree:
        sampler = SystemSampler(tree.pid, gpu=None, interval_s=SLOW_EVERY_S)  # every counter, every sample
        ours = []
        for _ in range(repeats):
            start = time.perf_counter()
            sampler.sample()
            ours.append(time.perf_counter() - start)
        processes = [psutil.Process(tree.pid), *psutil.Process(tree.pid).children(recursive=True)]
        theirs = []
        for _ in range(repeats):
            start = time.perf_counter()
            psutil.cpu_times(percpu=True), psutil.virtual_memory(), psutil.swap_memory()
            psutil.disk_io_counters(perdisk=True), psutil.net_io_counters(pernic=True)
            psutil.Process(tree.pid).children(recursive=True)
            for process in processes:
                with process.oneshot():
                    process.cpu_times(), process.memory_info(), process.io_counters(), process.num_threads()
            theirs.append(time.perf_counter() - start)
        return statistics.median(ours) * 1e6, statistics.median(theirs) * 1e6


def leader_read_cost(blocks: int = 20, per_block: int = 30) -> tuple[float, float]:
    """Median µs of one full sample with and without the processes' main-thread reads, alternating
    blocks of the same sampler on the same tree."""
    with busy_tree() as tree:
        sampler = SystemSampler(tree.pid, gpu=None, interval_s=SLOW_EVERY_S)
        sampler.sample()  # the tree found, its files opened
        entries = list(sampler.tree.tracked.values())
        files = [entry.leader_file for entry in entries]
        assert all(handle is not None for handle in files), "no main-thread reads to measure"
        timed: dict[bool, list[float]] = {True: [], False: []}
        for block in range(blocks):
            reading = block % 2 == 0
            for entry, handle in zip(entries, files):
                entry.leader_file = handle if reading else None
            for _ in range(per_block):
                start = time.perf_counter()
                sampler.sample()
                timed[reading].append(time.perf_counter() - start)
        for entry, handle in zip(entries, files):
            entry.leader_file = handle
        sampler.close()
        return statistics.median(timed[True]) * 1e6, statistics.median(timed[False]) * 1e6


def sidecar_cpu(seconds: float) -> None:
    with busy_tree() as tree, tempfile.TemporaryDirectory() as run_dir:
        started = time.monotonic()
        sidecar = start_sidecar(Path(run_dir), tree.pid, rank=0, interval_s=0.1)
        process = psutil.Process(sidecar.pid)
        time.sleep(3.0)  # imports and first samples
        warm = process.cpu_times()
        warm_at = time.monotonic()
        time.sleep(seconds)
        end = process.cpu_times()
        end_at = time.monotonic()
        sidecar.stop()
        samples = load_samples(layout.samples_path(Path(run_dir), 0))
    steady = (end.user + end.system - warm.user - warm.system) / (end_at - warm_at)
    total = (end.user + end.system) / (end_at - started)
    print(f"sidecar at 10 Hz, {len(samples)} samples, {len(samples.processes)} processes followed:")
    print(f"  steady state: {steady * 100:.2f}% of one core  (budget 1%)")
    print(f"  with start-up ({warm.user + warm.system:.2f} s CPU to import and start): {total * 100:.2f}% "
          f"of one core over {end_at - started:.0f} s")


def loop_slowdown(rounds: int, steps: int) -> None:
    """Blocks of ``steps`` steps with the sidecar sampling or paused (SIGSTOP), in ABBA order.

    One sidecar for the whole measurement, paused and resumed between blocks, so its start-up
    (measured above) stays out and the blocks can be short and many.
    """
    loop = subprocess.Popen([sys.executable, "-c", LOOP], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert loop.stdout.readline().strip() == "ready"

    def block() -> float:
        loop.stdin.write(f"{steps}\n")
        loop.stdin.flush()
        return float(loop.stdout.readline())

    ratios, bare_times = [], []
    with tempfile.TemporaryDirectory() as run_dir:
        sidecar = start_sidecar(Path(run_dir), loop.pid, rank=0, interval_s=0.1)
        try:
            time.sleep(3.0)
            block()  # warm-up
            for round_index in range(rounds):
                times = {}
                for sampling in ((False, True) if round_index % 2 == 0 else (True, False)):  # ABBA
                    os.kill(sidecar.pid, signal.SIGCONT if sampling else signal.SIGSTOP)
                    time.sleep(0.05)
                    times[sampling] = block()
                ratios.append(times[True] / times[False])
                bare_times.append(times[False])
        finally:
            os.kill(sidecar.pid, signal.SIGCONT)
            sidecar.stop()
            loop.stdin.close()
            loop.wait()
        sampled = len(load_samples(layout.samples_path(Path(run_dir), 0)))
    print(f"training-like loop ({statistics.median(bare_times) * 1e3 / steps:.2f} ms/step bare, "
          f"{rounds} ABBA pairs of {steps} steps, {sampled} samples taken):")
    print(f"  with/without sidecar: median ratio {statistics.median(ratios):.3f} "
          f"(quartiles {_quartiles(ratios)})")


def _quartiles(values: list[float]) -> str:
    low, _, high = statistics.quantiles(values, n=4)
    return f"{low:.3f}-{high:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    ours, theirs = per_sample_cost()
    print(f"one full sample (machine + 3-process tree): stepscope /proc readers {ours:.0f} µs, "
          f"psutil {theirs:.0f} µs ({theirs / ours:.1f}x)")
    with_reads, without = leader_read_cost()
    print(f"  of which the 3 main-thread reads: {with_reads:.0f} µs with, {without:.0f} µs without "
          f"({with_reads / without:.3f}x)")
    sidecar_cpu(args.seconds)
    loop_slowdown(args.rounds, args.steps)


if __name__ == "__main__":
    main()
