"""Cost of one ``with profiler.profile("x"):`` block, stepscope vs Lightning, in the same run.

Usage::

    python benchmarks/bench_profilers.py [--number 200000] [--rounds 7] [--json]

Each case times ``number`` empty ``with`` blocks; rounds of all cases are interleaved and the
minimum per case is kept (the machine is shared and noisy). Results are nanoseconds per block and
ratios: stepscope PassThrough against an empty ``with`` block (a pre-built
``contextlib.nullcontext()``), and each stepscope profiler against Lightning's class of the same
name when Lightning is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import time
from collections.abc import Callable

from stepscope.profilers import AdvancedProfiler, PassThroughProfiler, SimpleProfiler


def _loop_attribute(profiler, number: int) -> float:
    # `profiler.profile(...)` looked up on every iteration, as in Lightning's Trainer.
    start = time.perf_counter()
    for _ in range(number):
        with profiler.profile("x"):
            pass
    return time.perf_counter() - start


def _loop_empty_with(number: int) -> float:
    context = contextlib.nullcontext()
    start = time.perf_counter()
    for _ in range(number):
        with context:
            pass
    return time.perf_counter() - start


def _loop_new_nullcontext(number: int) -> float:
    nullcontext = contextlib.nullcontext
    start = time.perf_counter()
    for _ in range(number):
        with nullcontext():
            pass
    return time.perf_counter() - start


def build_cases(number: int) -> dict[str, Callable[[], float]]:
    cases: dict[str, Callable[[], float]] = {
        "empty with (pre-built nullcontext)": lambda: _loop_empty_with(number),
        "with nullcontext()": lambda: _loop_new_nullcontext(number),
        "stepscope PassThrough": lambda: _loop_attribute(PassThroughProfiler(), number),
        "stepscope Simple": lambda: _loop_attribute(SimpleProfiler(), number),
        "stepscope Advanced": lambda: _loop_attribute(AdvancedProfiler(), max(number // 10, 1)) * 10,
    }
    try:
        from lightning.pytorch import profilers as lightning_profilers
    except ImportError:
        return cases
    cases["Lightning PassThrough"] = lambda: _loop_attribute(lightning_profilers.PassThroughProfiler(), number)
    cases["Lightning Simple"] = lambda: _loop_attribute(lightning_profilers.SimpleProfiler(), number)
    cases["Lightning Advanced"] = lambda: _loop_attribute(lightning_profilers.AdvancedProfiler(), max(number // 10, 1)) * 10
    return cases


def measure(number: int, rounds: int) -> dict[str, float]:
    """Nanoseconds per ``with`` block, minimum over interleaved rounds."""
    cases = build_cases(number)
    best = {name: float("inf") for name in cases}
    for _ in range(rounds):
        for name, run in cases.items():
            gc.collect()
            gc.disable()
            try:
                best[name] = min(best[name], run() / number * 1e9)
            finally:
                gc.enable()
    return best


RATIOS = (
    ("stepscope PassThrough", "empty with (pre-built nullcontext)"),
    ("stepscope PassThrough", "with nullcontext()"),
    ("stepscope PassThrough", "Lightning PassThrough"),
    ("stepscope Simple", "Lightning Simple"),
    ("stepscope Advanced", "Lightning Advanced"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200_000, help="with-blocks per case and round")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds; the minimum is kept")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    results = measure(args.number, args.rounds)
    ratios = {f"{a} / {b}": results[a] / results[b] for a, b in RATIOS if a in results and b in results}
    if args.json:
        print(json.dumps({"ns_per_block": results, "ratios": ratios, "python": sys.version.split()[0]}, indent=2))
        return 0
    print(f"one `with profiler.profile('x'): pass`, ns (min of {args.rounds} rounds x {args.number})")
    for name, value in results.items():
        print(f"  {name:<38} {value:8.0f}")
    print("ratios")
    for name, value in ratios.items():
        print(f"  {name:<64} {value:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
