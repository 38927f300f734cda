"""Benchmark: ``stepscope analyze TRACE`` with and without one of the analysis commands' memory settings.

The analysis commands set two things in their own processes (``stepscope.cli.main``), each of which
the environment can undo; each round of this script runs the command as typed with the setting and
with the environment undoing it, alternating which goes first, and checks that both print the same
report:

``--setting hugepages``
    numpy's transparent huge-page advice off (``NUMPY_MADVISE_HUGEPAGE=0``) against numpy's default
    (``=1``). Where the kernel's huge-page ``defrag`` setting is ``madvise`` (the usual default), a
    fault in an advised range may compact memory to find a 2 MB page; on a virtual machine whose
    balloon reports free 2 MB blocks to the host, a freed huge page also goes back to the host and
    the next one is backed anew (``benchmarks/bench_fresh_pages.py`` measures the cost per MB).
``--setting heap``
    freed arrays' pages reused by the C heap (``stepscope.heap.reuse_large_blocks``, where the
    memory left is ample) against glibc's defaults (``STEPSCOPE_REUSE_MEMORY=off``: an array above
    the mmap threshold gets a mapping of its own, unmapped when freed, so the next one faults in
    fresh pages for the kernel to zero).

Prints each run's wall, user and system seconds and minor page faults (the process and its
children), the medians and the ratios.

Usage::

    python benchmarks/bench_process_memory.py TRACE [TRACE ...] [--setting hugepages|heap] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench_analyze import run_command, stepscope_command  # the command as typed, timed as every benchmark does

#: For each setting: (label, environment) with the setting as typed first, undone second.
SETTINGS = {
    "hugepages": (("not advised", {"NUMPY_MADVISE_HUGEPAGE": "0"}), ("advised", {"NUMPY_MADVISE_HUGEPAGE": "1"})),
    "heap": (("reused", {}), ("glibc default", {"STEPSCOPE_REUSE_MEMORY": "off"})),
}
FIELDS = ("wall_s", "user_s", "system_s", "minor_faults")


def _one(trace: Path, env: dict[str, str], out: Path) -> tuple[dict, bytes]:
    """The times and faults of ``stepscope analyze TRACE`` with ``env`` added, and what it printed."""
    done = run_command([*stepscope_command(), "analyze", str(trace)], env, str(out))
    if done["exit"] != 0:
        tail = done["tail"].strip().splitlines()
        raise SystemExit(f"bench_process_memory.py: error: stepscope analyze {trace} exited {done['exit']}: "
                         f"{tail[-1] if tail else ''}")
    return done, out.read_bytes()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path, help="trace files to analyse")
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="heap", help="which setting (default heap)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per trace (default 3)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    for trace in args.traces:
        if not trace.is_file():
            parser.error(f"{trace}: no such file")
    with tempfile.TemporaryDirectory(prefix="bench-process-memory-") as scratch:
        for trace in args.traces:
            _measure(trace, SETTINGS[args.setting], args.rounds, Path(scratch) / "report.txt")
    return 0


def _measure(trace: Path, modes: tuple[tuple[str, dict[str, str]], ...], rounds: int, out: Path) -> None:
    _one(trace, modes[0][1], out)  # the file in the page cache, the modules' bytecode written
    runs: dict[str, list[dict]] = {label: [] for label, _ in modes}
    for round_ in range(rounds):
        outputs = set()
        for label, env in modes if round_ % 2 == 0 else reversed(modes):
            done, printed = _one(trace, env, out)
            outputs.add(printed)
            runs[label].append(done)
            print(f"{trace.name} round {round_ + 1}: {label}: wall {done['wall_s']:.2f} s, user {done['user_s']:.2f} s, "
                  f"system {done['system_s']:.2f} s, {done['minor_faults']:,} minor faults", flush=True)
        if len(outputs) != 1:
            raise SystemExit(f"bench_process_memory.py: error: the two runs of round {round_ + 1} printed "
                             f"different reports for {trace}")
    medians = {label: {key: statistics.median(done[key] for done in rows) for key in FIELDS}
               for label, rows in runs.items()}
    for label, median in medians.items():
        print(f"{trace.name}: {label}: median wall {median['wall_s']:.2f} s, user {median['user_s']:.2f} s, "
              f"system {median['system_s']:.2f} s, {median['minor_faults']:,.0f} minor faults")
    (typed, first), (undone, second) = ((label, medians[label]) for label, _ in modes)
    print(f"{trace.name}: wall {undone} / {typed} {second['wall_s'] / first['wall_s']:.2f}x; "
          f"system {second['system_s'] / max(first['system_s'], 1e-9):.2f}x; "
          f"minor faults {second['minor_faults'] / max(first['minor_faults'], 1):.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
