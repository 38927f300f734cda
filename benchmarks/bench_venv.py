"""What ``make venv`` costs, against pip compiling the installed packages itself.

Each round creates two fresh virtual environments from this checkout, in alternating order:

- *pip compiles*: ``pip install TORCH_PIN -e ".[dev]"``, pip writing each module's bytecode in turn
  (the Makefile's recipe before it compiled on every core);
- *make venv*: the Makefile's recipe as it is (``make venv VENV=DIR``). It now compiles nothing:
  the tests and ``make demo`` write the bytecode of what they import, when they first import it, so
  this ratio leaves out that later cost (the whole effect is a clean clone's ``.ci/run``, in
  BENCHMARKS.md "Test suite").

Prints each one's wall time per round, their medians and the ratio. Both read the same local
package index and wheel cache, so the difference is the install and the compilation.
``--then-demo`` times each recipe followed by the built-in demo in its venv (``make demo``'s own
recipe after *make venv*): the README's first command, the deferred compilation included.

    python benchmarks/bench_venv.py [--rounds 1] [--then-demo]
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _torch_pin() -> str:
    match = re.search(r"^TORCH_PIN \?= (\S+)$", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE)
    if match is None:
        raise SystemExit("bench_venv.py: error: no TORCH_PIN in the Makefile")
    return match.group(1)


def _pip_compiles(venv: Path, python: str) -> None:
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, _torch_pin(), "-e", ".[dev]"], cwd=ROOT, check=True)


def _make_venv(venv: Path, python: str) -> None:
    subprocess.run(["make", "-s", "venv", f"VENV={venv}", f"PYTHON={python}"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)


def _demo(name: str, venv: Path, python: str) -> None:
    if name == "make venv":
        command = ["make", "-s", "demo", f"VENV={venv}", f"PYTHON={python}"]
    else:
        command = [str(venv / "bin" / "stepscope"), "demo"]
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


RECIPES = {"pip compiles": _pip_compiles, "make venv": _make_venv}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds (default 1)")
    parser.add_argument("--then-demo", action="store_true", help="time each recipe followed by the built-in demo")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    python = getattr(sys, "_base_executable", sys.executable)  # the interpreter a fresh machine has
    times: dict[str, list[float]] = {name: [] for name in RECIPES}
    with tempfile.TemporaryDirectory(prefix="bench-venv-") as tmp:
        for round_ in range(args.rounds):
            names = list(RECIPES) if round_ % 2 == 0 else list(reversed(RECIPES))
            for name in names:
                venv = Path(tmp) / "venv"
                shutil.rmtree(venv, ignore_errors=True)
                start = time.perf_counter()
                RECIPES[name](venv, python)
                if args.then_demo:
                    _demo(name, venv, python)
                times[name].append(time.perf_counter() - start)
                print(f"round {round_ + 1}: {name} {times[name][-1]:.1f} s", flush=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, value in medians.items():
        print(f"{name}: median {value:.1f} s of {len(times[name])}")
    print(f"ratio pip compiles / make venv: {medians['pip compiles'] / medians['make venv']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
