"""What the C scanner (``stepscope.traces._scan``) saves a trace's decode, against the typed decode it
replaces (msgspec structs read into columns by ``_columns.c``), in the same process, alternating.

Each trace is loaded with ``load_trace(path, workers=1)`` (one process, the streaming decode) in
alternating rounds: with the scanner, then with ``typed.SCAN = None`` (the baseline: every batch
decoded by msgspec, as before the scanner). Prints each trace's median seconds, MB/s and the ratio,
and the share of batches the scanner read; the two tables are compared (rows, every column, the
symbols) and a difference fails the run.

    python benchmarks/bench_scan.py [--rounds 3] [--min-mb 15] [TRACE ...]

Without TRACE: every reference trace of at least ``--min-mb`` MB of JSON (``../shared/traces`` and
the vendored set).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _traces(min_mb: float) -> list[Path]:
    from benchmarks.bench_analyze import json_mb
    from tests.unit.analysis.reference_traces import _rel, _root, kineto_trace_names

    paths = [_root(_rel(name)) / _rel(name) for name in kineto_trace_names()]
    return [path for path in paths if path.is_file() and json_mb(path) >= min_mb]


def _load(path: Path, scan: bool) -> tuple[float, object, float]:
    """(seconds, the trace, the share of batches the scanner read)."""
    from stepscope.traces import typed
    from stepscope.traces.load import load_trace

    saved = typed.SCAN
    offered = [0, 0]

    class Counting:
        Scanner = saved.Scanner

        @staticmethod
        def parse(piece: bytearray) -> object:
            parsed = saved.parse(piece)
            offered[parsed is not None] += 1
            return parsed

    typed.SCAN = Counting if scan else None
    try:
        gc.collect()
        start = time.perf_counter()
        trace = load_trace(path, workers=1)
        took = time.perf_counter() - start
    finally:
        typed.SCAN = saved
    return took, trace, offered[1] / max(1, sum(offered))


def _same(a: object, b: object) -> bool:
    from tests.unit.traces.test_scan import _same_tables  # the suite's comparison: columns, symbols, memory, warnings

    try:
        _same_tables(a, b)
    except AssertionError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-mb", type=float, default=15.0)
    args = parser.parse_args(argv)
    from stepscope.traces import typed

    if typed.SCAN is None:
        print("the C scanner is not built (make venv)", file=sys.stderr)
        return 2
    traces = args.traces or _traces(args.min_mb)
    print(f"{'trace':58} {'MB':>7} {'scanner s':>9} {'typed s':>8} {'MB/s':>11} {'ratio':>6} {'read':>5}")
    ratios = []
    for path in traces:
        scanned, typed_only, shares = [], [], []
        for _ in range(args.rounds):
            took, trace_a, share = _load(path, True)
            scanned.append(took)
            shares.append(share)
            took, trace_b, _ = _load(path, False)
            typed_only.append(took)
            if not _same(trace_a, trace_b):
                print(f"{path}: the tables differ", file=sys.stderr)
                return 1
            mb = trace_a.json_bytes / 1e6  # type: ignore[attr-defined]
            del trace_a, trace_b
        a, b = statistics.median(scanned), statistics.median(typed_only)
        ratios.append(b / a)
        name = str(path)[-58:]
        print(f"{name:58} {mb:7.1f} {a:9.2f} {b:8.2f} {mb / a:5.0f}/{mb / b:<5.0f} {b / a:5.2f}x {min(shares):4.0%}")
    if ratios:
        print(f"ratios {min(ratios):.2f}-{max(ratios):.2f}x, median {statistics.median(ratios):.2f}x "
              f"({args.rounds} rounds, medians)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
