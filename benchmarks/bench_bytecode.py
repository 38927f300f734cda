"""What a checkout without bytecode costs each ``stepscope`` process where ``PYTHONDONTWRITEBYTECODE``
is set (why ``make test`` runs ``make bytecode`` first).

A copy of ``src/`` runs ``stepscope run`` of a three-line torch script and ``stepscope report`` of
its run directory, ``--rounds`` times, alternating two states of the copy in every round: no
``__pycache__`` at all (each process compiles every module it imports, and writes nothing back),
and compiled by ``compileall`` (as an installed package is). Prints the median CPU time of each
command's process tree in both states and the difference.

    python benchmarks/bench_bytecode.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
SCRIPT = "import torch\nx = torch.zeros(3)\nprint((x + 1).sum().item())\n"


def _child_cpu(command: list[str], env: dict[str, str], cwd: Path) -> float:
    before = os.times()
    subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    after = os.times()
    return (after.children_user + after.children_system) - (before.children_user + before.children_system)


def _clear(tree: Path) -> None:
    for cache in list(tree.rglob("__pycache__")):
        shutil.rmtree(cache)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    with tempfile.TemporaryDirectory(prefix="bench-bytecode-") as tmp:
        work = Path(tmp)
        src = work / "src"
        shutil.copytree(SRC, src, ignore=shutil.ignore_patterns("__pycache__"))
        (work / "tiny.py").write_text(SCRIPT, encoding="utf-8")
        env = dict(os.environ, PYTHONPATH=str(src), PYTHONDONTWRITEBYTECODE="1")
        stepscope = [sys.executable, "-m", "stepscope"]
        subprocess.run([*stepscope, "run", "--no-summary", "-o", "first", "tiny.py"], env=env, cwd=work,
                       stdout=subprocess.DEVNULL, check=True)  # the machine's caches (CPU peak), once
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for state in ("source only", "compiled"):
                _clear(src)
                if state == "compiled":
                    compileall.compile_dir(str(src), quiet=1)
                commands = {"run": [*stepscope, "run", "--no-summary", "--force", "-o", "timed", "tiny.py"],
                            "report": [*stepscope, "report", "first"]}
                for name, command in commands.items():
                    times.setdefault((name, state), []).append(_child_cpu(command, env, work))
    print(f"CPU of each command's processes, median of {args.rounds} (PYTHONDONTWRITEBYTECODE=1):")
    for name in ("run", "report"):
        bare, compiled = (statistics.median(times[(name, state)]) for state in ("source only", "compiled"))
        print(f"  stepscope {name:<6}  source only {bare:.3f} s   compiled {compiled:.3f} s   "
              f"difference {bare - compiled:+.3f} s ({bare / compiled:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
