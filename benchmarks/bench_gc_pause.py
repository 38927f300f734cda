"""What the cycle collector costs a trace's decode in a process that holds many objects, and what
pausing it meanwhile (``stepscope.heap.no_cycle_scans``, as ``load_trace`` does) saves.

The process first imports what a notebook or a test worker holds (torch, and Lightning and
Hugging Face where installed), then decodes ``--trace`` with ``load_trace`` in alternating rounds:
as shipped (the collector paused during the decode), and with the pause switched off (the decode
as it was before, the baseline). Both decode paths are timed: the typed one (msgspec, the default)
and the dict one (orjson, the fallback). Prints the median of each and the ratio.

    python benchmarks/bench_gc_pause.py [--trace FILE] [--rounds 3] [--no-libraries]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED_TRACE = HERE.parents[1] / "shared" / "traces" / "hta" / "mtia_trace_single_rank" / "mtia_rank_0.json.gz"
LOCAL_TRACE = (HERE.parent / "tests" / "data" / "traces" / "reference" / "kineto_tb_plugin" / "samples"
               / "resnet50_num_workers_0" / "worker0.1623143089861.pt.trace.json.gz")


def _hold_libraries() -> list[str]:
    """Import what a notebook or a test worker typically holds; the names of those imported."""
    held = []
    for name in ("torch", "torch._dynamo", "lightning", "transformers"):
        try:
            __import__(name)
        except ImportError:
            continue
        held.append(name)
    return held


def _timed(path: str, typed_path: bool, pause: bool) -> tuple[float, int]:
    from stepscope.traces import load, typed

    saved_available, saved_pause = typed.AVAILABLE, load.no_cycle_scans
    typed.AVAILABLE = saved_available and typed_path
    if not pause:
        load.no_cycle_scans = contextlib.nullcontext  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        trace = load.load_trace(path)
        took = time.perf_counter() - start
    finally:
        typed.AVAILABLE, load.no_cycle_scans = saved_available, saved_pause
    json_bytes = trace.json_bytes
    del trace
    gc.collect()
    return took, json_bytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_gc_pause.py", description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=None,
                        help="a Kineto trace (default: the 87 MB MTIA reference trace of ../shared/traces, "
                             "else the ResNet-50 trace in tests/data)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--no-libraries", action="store_true", help="decode in a bare process (no imports first)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    path = args.trace or (SHARED_TRACE if SHARED_TRACE.exists() else LOCAL_TRACE)
    if not path.is_file():
        parser.error(f"{path}: no such trace file; pass --trace FILE")
    sys.path.insert(0, str(HERE.parent / "src"))
    from stepscope.traces import typed

    held = [] if args.no_libraries else _hold_libraries()
    _, json_bytes = _timed(str(path), True, True)  # the file in the page cache, the decoders imported
    print(f"{path.name}: {json_bytes / 1e6:.0f} MB of JSON; the process holds {len(gc.get_objects()):,} "
          f"objects ({', '.join(held) or 'no libraries'} imported)")
    paths = [("typed", True)] if typed.AVAILABLE else []
    paths.append(("dict", False))
    times: dict[tuple[str, bool], list[float]] = {}
    for _ in range(args.rounds):
        for name, typed_path in paths:
            for pause in (False, True):
                times.setdefault((name, pause), []).append(_timed(str(path), typed_path, pause)[0])
    for name, _ in paths:
        collecting, paused = (statistics.median(times[(name, pause)]) for pause in (False, True))
        print(f"  {name:<5} decode  collector on {collecting:.2f} s   paused {paused:.2f} s   "
              f"ratio {collecting / paused:.2f}x (median of {args.rounds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
