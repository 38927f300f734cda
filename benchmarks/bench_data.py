"""DataLoader toolkit against the usual hand-written idioms, on a generated multi-GB JSONL file.

    python benchmarks/bench_data.py [--gb 2] [--slots 8,32] [--rounds 3] [--dir DIR]

Generates ``--gb`` GB of JSONL (``{"id": n, "tokens": [...]}``, 50–300 tokens a line) in a temporary
directory (deleted at the end), then measures, as ratios within this run:

1. **Sharded reading**, one process out of ``--slots`` (ranks × workers): the hand-written iterable dataset
   reads every line and keeps those with ``line_number % slots == slot``; ``ShardedJsonl`` reads only
   that process's byte ranges. Samples/s of that process and bytes it reads; both decode with orjson,
   so the ratio is the sharding alone. The file is in the page cache for both (read once before).
2. **Bucket sampler start-up** (until the first batch of indices): the hand-written sampler computes every
   sample's length by decoding the whole file at each start (measured once: it is the slow part of
   the run); ``IndexedJsonl`` + ``BucketBatchSampler`` load the cached line index and size index
   (``np.load``) and bucket. The one-time cost of building both caches is shown apart.

Medians over ``--rounds``; the machine is shared, so only ratios within one run mean anything.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from stepscope.data import BucketBatchSampler, IndexedJsonl, ShardedJsonl  # noqa: E402

POOL = 4096


def generate(path: Path, gigabytes: float, seed: int = 0) -> int:
    """Write about ``gigabytes`` GB; returns the number of lines."""
    rng = random.Random(seed)
    pool = [orjson.dumps([rng.randrange(50_000) for _ in range(rng.randint(50, 300))]) for _ in range(POOL)]
    target, written, lines = int(gigabytes * 1e9), 0, 0
    with open(path, "wb", buffering=16 << 20) as out:
        while written < target:
            block = b"".join(b'{"id":%d,"tokens":%s}\n' % (lines + k, pool[(lines + k) * 7919 % POOL])
                             for k in range(10_000))
            out.write(block)
            written += len(block)
            lines += 10_000
    return lines


class ModuloShardedJsonl:
    """The hand-written idiom: every process reads every line and keeps those whose number is its own."""

    def __init__(self, path: Path, slot: int, slots: int):
        self.path, self.slot, self.slots = path, slot, slots

    def __iter__(self):
        with open(self.path, "rb") as handle:
            for number, line in enumerate(handle):
                if number % self.slots == self.slot:
                    yield orjson.loads(line)


def full_pass_bucket_start(path: Path, batch_size: int) -> list[int]:
    """The hand-written bucket sampler, up to its first batch: decode every sample for its length, sort, cut."""
    with open(path, "rb") as handle:
        lengths = [len(orjson.loads(line)["tokens"]) for line in handle]
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    random.shuffle(batches)
    return batches[0]


def our_bucket_start(path: Path, batch_size: int) -> list[int]:
    """Open the dataset, load the cached sizes, bucket, and draw the first batch."""
    dataset = IndexedJsonl(path)
    sizes = dataset.sizes(lambda sample: len(sample["tokens"]), size_key="tokens")
    return next(iter(BucketBatchSampler(sizes, batch_size, num_buckets=16)))


def timed(function, *args) -> tuple[float, object]:
    started = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - started, result


def count(iterable) -> int:
    return sum(1 for _ in iterable)


def compare_sharding(path: Path, size: int, slots: int, rounds: int) -> None:
    modulo_times, our_times = [], []
    ours = ShardedJsonl(path, rank=0, world_size=1, worker_id=0, num_workers=slots)
    our_bytes = sum(r.end - r.start for r in ours.ranges_for(0, slots))
    for _ in range(rounds):
        modulo_s, modulo_n = timed(count, ModuloShardedJsonl(path, 0, slots))
        our_s, our_n = timed(count, ours)
        modulo_times.append(modulo_s)
        our_times.append(our_s)
    modulo_s, our_s = statistics.median(modulo_times), statistics.median(our_times)
    print(f"\n1. sharded reading, process 0 of {slots} (median of {rounds})")
    print(f"   hand-written (line_number % {slots}): {modulo_n:,} samples in {modulo_s:.2f} s = "
          f"{modulo_n / modulo_s:,.0f}/s, reads {size / 1e9:.2f} GB")
    print(f"   ShardedJsonl (byte ranges):  {our_n:,} samples in {our_s:.2f} s = {our_n / our_s:,.0f}/s, "
          f"reads {our_bytes / 1e9:.3f} GB")
    print(f"   → throughput ×{(our_n / our_s) / (modulo_n / modulo_s):.1f}, bytes read ÷{size / our_bytes:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0)
    parser.add_argument("--slots", default="8,32", help="ranks × workers sharing the file (comma-separated)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to generate the file (default: the temp dir)")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="stepscope-bench-data-", dir=args.dir))
    try:
        run(directory / "corpus.jsonl", args)
    finally:
        shutil.rmtree(directory)


def run(path: Path, args: argparse.Namespace) -> None:
    seconds, lines = timed(generate, path, args.gb)
    size = path.stat().st_size
    print(f"generated {size / 1e9:.2f} GB, {lines:,} lines in {seconds:.1f} s ({path.parent}, deleted at the end)")
    count(open(path, "rb"))  # page cache warm for both sides

    for slots in (int(part) for part in args.slots.split(",")):
        compare_sharding(path, size, slots, args.rounds)

    build_s, _ = timed(our_bucket_start, path, 64)  # builds and caches the line index and the sizes
    modulo_start = timed(full_pass_bucket_start, path, 64)[0]  # a minute per 2 GB: once
    our_start = statistics.median(timed(our_bucket_start, path, 64)[0] for _ in range(args.rounds))
    print(f"\n2. bucket sampler start-up, {lines:,} samples (hand-written once, ours median of {args.rounds})")
    print(f"   hand-written (decode every sample at each start): {modulo_start:.2f} s")
    print(f"   IndexedJsonl + BucketBatchSampler, cached index and sizes: {our_start * 1000:.0f} ms")
    print(f"   → start-up ×{modulo_start / our_start:.0f} faster; one-time build of both caches: {build_s:.2f} s")


if __name__ == "__main__":
    main()
