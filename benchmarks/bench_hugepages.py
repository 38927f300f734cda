"""Benchmark: ``stepscope analyze TRACE`` with numpy's transparent huge-page advice and without.

numpy advises the kernel to back every large array with 2 MB pages. Where the kernel's huge-page
``defrag`` setting is ``madvise`` (the usual default), a fault in an advised range may compact memory
to find such a page; on a virtual machine whose balloon reports free 2 MB blocks to the host, a freed
huge page also goes back to the host and the next one is backed anew. ``benchmarks/bench_fresh_pages.py``
measures the cost per MB; this script measures what it does to the command as typed: each round runs
``stepscope analyze TRACE`` (text output, whole process) with ``NUMPY_MADVISE_HUGEPAGE=1`` and with
``=0``, alternating which goes first, and checks that both print the same report. Prints each run's
wall, user and system seconds (the process and its children), the medians and the ratio.

Usage::

    python benchmarks/bench_hugepages.py TRACE [TRACE ...] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench_analyze import run_command, stepscope_command  # the command as typed, timed as every benchmark does

MODES = {"advised": "1", "not advised": "0"}


def _one(trace: Path, value: str, out: Path) -> tuple[float, float, float, bytes]:
    """Wall, user and system seconds of ``stepscope analyze TRACE`` with NUMPY_MADVISE_HUGEPAGE=value
    (the process and its children), and what it printed."""
    done = run_command([*stepscope_command(), "analyze", str(trace)], {"NUMPY_MADVISE_HUGEPAGE": value}, str(out))
    if done["exit"] != 0:
        tail = done["tail"].strip().splitlines()
        raise SystemExit(f"bench_hugepages.py: error: stepscope analyze {trace} exited {done['exit']}: "
                         f"{tail[-1] if tail else ''}")
    return done["wall_s"], done["user_s"], done["system_s"], out.read_bytes()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path, help="trace files to analyse")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per trace (default 3)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    for trace in args.traces:
        if not trace.is_file():
            parser.error(f"{trace}: no such file")
    with tempfile.TemporaryDirectory(prefix="bench-hugepages-") as scratch:
        for trace in args.traces:
            _measure(trace, args.rounds, Path(scratch) / "report.txt")
    return 0


def _measure(trace: Path, rounds: int, out: Path) -> None:
    _one(trace, "0", out)  # the file in the page cache, the modules' bytecode written
    times: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in MODES}
    for round_ in range(rounds):
        order = list(MODES) if round_ % 2 == 0 else list(reversed(MODES))
        outputs = {}
        for mode in order:
            wall, user, system, outputs[mode] = _one(trace, MODES[mode], out)
            times[mode].append((wall, user, system))
            print(f"{trace.name} round {round_ + 1}: {mode}: wall {wall:.2f} s, user {user:.2f} s, "
                  f"system {system:.2f} s", flush=True)
        if len(set(outputs.values())) != 1:
            raise SystemExit(f"bench_hugepages.py: error: the two runs of round {round_ + 1} printed "
                             f"different reports for {trace}")
    medians = {mode: [statistics.median(sample[i] for sample in rows) for i in range(3)]
               for mode, rows in times.items()}
    for mode, (wall, user, system) in medians.items():
        print(f"{trace.name}: {mode}: median wall {wall:.2f} s, user {user:.2f} s, system {system:.2f} s")
    print(f"{trace.name}: wall advised / not advised {medians['advised'][0] / medians['not advised'][0]:.2f}x; "
          f"system {medians['advised'][2] / max(medians['not advised'][2], 1e-9):.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
