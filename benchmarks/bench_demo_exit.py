"""What the interpreter's final collections cost a ``stepscope demo`` (why ``demo`` freezes its objects
out of them once its run has ended).

Runs ``stepscope demo SCENARIO --no-summary`` ``--rounds`` times, alternating in every round the demo as
shipped and the same code with the freeze replaced by nothing (the baseline, through the same console
entry). Prints the median wall time of each and their ratio.

    python benchmarks/bench_demo_exit.py [--scenario oversubscribed] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
#: The console entry, with the demo's freeze left in place or replaced by nothing.
ENTRY = """
import sys
if sys.argv.pop(1) == "baseline":
    import stepscope.cli.demo_cmd as demo
    demo._out_of_the_final_collections = lambda: None
from stepscope.cli.entry import console_main
sys.argv = ["stepscope", *sys.argv[1:]]
console_main()
"""
STATES = ("baseline", "frozen")


def _wall(state: str, scenario: str, work: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", ENTRY, state, "demo", scenario, "--no-summary", "--force", "-o",
                    str(work / state)], env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="oversubscribed", help="zoo scenario (default oversubscribed)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    sys.path.insert(0, str(SRC))
    from stepscope.zoo import SCENARIOS

    if args.scenario not in SCENARIOS or SCENARIOS[args.scenario].nproc > 1:
        parser.error(f"--scenario: {args.scenario!r} is not a single-process zoo scenario (stepscope demo --list)")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(SRC), env.get("PYTHONPATH"))))
    with tempfile.TemporaryDirectory(prefix="bench-demo-exit-") as tmp:
        work = Path(tmp)
        _wall("frozen", args.scenario, work, env)  # the machine's caches (CPU peak, operator price), once
        walls: dict[str, list[float]] = {state: [] for state in STATES}
        for _ in range(args.rounds):
            for state in STATES:
                walls[state].append(_wall(state, args.scenario, work, env))
    medians = {state: statistics.median(values) for state, values in walls.items()}
    for state in STATES:
        print(f"{state:9s} median {medians[state]:.2f} s  ({', '.join(f'{value:.2f}' for value in walls[state])})")
    print(f"stepscope demo {args.scenario}: {medians['baseline']:.2f} s -> {medians['frozen']:.2f} s "
          f"({medians['baseline'] / medians['frozen']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
