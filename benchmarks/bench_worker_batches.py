"""Cost of timing each DataLoader worker's batches (stepscope.capture.worker_batches), per batch.

A worker's fetch of a batch (32 items of a TensorDataset, default collate: the cheapest real batch,
where the timing's share is largest) is called bare and through the timing wrapper — as in a worker:
the wrapper reads the run-queue delay twice, the clocks four times and appends a line — in
alternating blocks in one process; each round gives the difference of the two blocks' mean time
per batch, adjacent in time, so the machine's drift cancels. Prints the median over rounds with its
interquartile range, and the bare batch's time to compare against.

    python benchmarks/bench_worker_batches.py [--rounds 9] [--batches 3000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batches", type=int, default=3000)
    args = parser.parse_args(argv)

    import torch
    from torch.utils.data import TensorDataset
    from torch.utils.data._utils.collate import default_collate
    from torch.utils.data._utils.fetch import _MapDatasetFetcher

    from stepscope.capture.worker_batches import MAX_LINES_PER_WORKER, WorkerBatchTimer

    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(4096, 64), torch.randn(4096, 1))
    fetcher = _MapDatasetFetcher(data, True, default_collate, False)
    bare_fetch = _MapDatasetFetcher.fetch
    indexes = [list(range(start, start + 32)) for start in range(0, 4096, 32)]
    with tempfile.TemporaryDirectory() as tmp:
        timer = WorkerBatchTimer(Path(tmp) / "worker_batches.txt")
        timed_fetch = timer.wrap(bare_fetch, lambda: True)  # as in a worker: get_worker_info() is set

        def block(fetch) -> float:
            timer._lines = 0  # a long run stops writing at MAX_LINES_PER_WORKER: measure the writing
            started = time.perf_counter()
            for index in range(args.batches):
                fetch(fetcher, indexes[index % len(indexes)])
            return (time.perf_counter() - started) / args.batches

        block(bare_fetch), block(timed_fetch)  # warm up both
        diffs, bares = [], []
        for _ in range(args.rounds):
            bare = block(bare_fetch)
            diffs.append(block(timed_fetch) - bare)
            bares.append(bare)
        assert timer._lines > 0 and not timer._off and args.batches <= MAX_LINES_PER_WORKER
    quartiles = statistics.quantiles(diffs, n=4)
    median = statistics.median(diffs)
    bare = statistics.median(bares)
    print(f"timing per batch: {median * 1e6:.1f} µs (IQR {quartiles[0] * 1e6:.1f}–{quartiles[2] * 1e6:.1f}) "
          f"against a bare batch of {bare * 1e6:.1f} µs: timed/bare ratio {(bare + median) / bare:.3f}; "
          f"{args.rounds} rounds of {args.batches} batches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
