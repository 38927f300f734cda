"""What forking the end-to-end tests' processes from a warm interpreter (``tests/zygote.py``) saves.

Runs the given test files in one pytest process ``--rounds`` times, alternating in every round the
cold baseline (``STEPSCOPE_TESTS_COLD=1``: every process started as before) and the warm forks. Prints
the median wall time and CPU (pytest and every process it reaped) of each and their ratios; a round
whose tests fail stops the benchmark. ``--baseline cold-children`` compares instead with the
processes served warm but the Python processes they start (torchrun's ranks, ``stepscope try``'s
trials) started cold (``STEPSCOPE_TESTS_COLD_CHILDREN=1``: as before their template);
``--baseline bare-server`` with servers that import torch and dynamo but none of stepscope's own
modules (``STEPSCOPE_TESTS_BARE_SERVER=1``: as before ``zygote.STEPSCOPE_RUN_MODULES``).

    python benchmarks/bench_warm_tests.py [--rounds 3] [--baseline cold|cold-children|bare-server] [FILE ...]
    (default: tests/cli/test_run_cmd.py)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATES = ("cold", "warm")


#: The baseline's switch (the warm state sets both to 0).
BASELINES = {"cold": "STEPSCOPE_TESTS_COLD", "cold-children": "STEPSCOPE_TESTS_COLD_CHILDREN",
             "bare-server": "STEPSCOPE_TESTS_BARE_SERVER"}


def _one(state: str, files: list[str], baseline: str = "cold") -> tuple[float, float]:
    """(wall s, CPU s of pytest and its reaped descendants) of one pytest run of ``files``."""
    env = {**os.environ, **{name: "0" for name in BASELINES.values()}}
    if state == "cold":
        env[BASELINES[baseline]] = "1"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", *files],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"bench_warm_tests: the {state} run failed:\n{done.stdout[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", default=["tests/cli/test_run_cmd.py"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", choices=sorted(BASELINES), default="cold")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    missing = [name for name in args.files if not (ROOT / name).is_file()]
    if missing:
        parser.error(f"no such test file: {', '.join(missing)} (paths are relative to the repository)")
    results: dict[str, list[tuple[float, float]]] = {state: [] for state in STATES}
    for round_index in range(args.rounds):
        for state in STATES if round_index % 2 == 0 else STATES[::-1]:
            results[state].append(_one(state, args.files, args.baseline))
            label = args.baseline if state == "cold" else state
            print(f"round {round_index + 1} {label}: {results[state][-1][0]:.1f} s wall, "
                  f"{results[state][-1][1]:.1f} s CPU", flush=True)
    wall = {state: statistics.median(item[0] for item in results[state]) for state in STATES}
    cpu = {state: statistics.median(item[1] for item in results[state]) for state in STATES}
    name = args.baseline
    print(f"median wall: {name} {wall['cold']:.1f} s, warm {wall['warm']:.1f} s ({wall['cold'] / wall['warm']:.2f}x)")
    print(f"median CPU:  {name} {cpu['cold']:.1f} s, warm {cpu['warm']:.1f} s ({cpu['cold'] / cpu['warm']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
