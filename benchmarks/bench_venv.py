"""What ``make venv`` costs, against pip installing the same packages.

Each round creates two fresh virtual environments from this checkout, in alternating order:

- *pip installs*: ``pip install --no-compile TORCH_PIN -e ".[dev]"`` after upgrading pip (the
  Makefile's recipe before uv installed the packages);
- *make venv*: the Makefile's recipe as it is (``make venv VENV=DIR``): pip chooses the torch wheel
  (``pip download``), uv installs it with everything else.

Neither compiles the installed modules: the tests and ``make demo`` write the bytecode of what they
import, when they first import it. Prints each one's wall time per round, their medians and the
ratio. Both read the same package index and local wheels; uv's cache is emptied before each
*make venv* (``UV_CACHE_DIR`` in a fresh directory), as on a fresh machine, so its ratio is not a
warm cache's. ``--then-demo`` times each recipe followed by the built-in demo in its venv (``make
demo``'s own recipe after *make venv*): the README's first command.

    python benchmarks/bench_venv.py [--rounds 1] [--then-demo]
"""

from __future__ import annotations

import argparse
import os
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


def _pip_installs(venv: Path, python: str) -> None:
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "--no-compile", _torch_pin(), "-e", ".[dev]"], cwd=ROOT, check=True)


def _make_venv(venv: Path, python: str) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-venv-uv-cache-") as cache:
        subprocess.run(["make", "-s", "venv", f"VENV={venv}", f"PYTHON={python}"], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL, env={**os.environ, "UV_CACHE_DIR": cache})


def _demo(name: str, venv: Path, python: str) -> None:
    if name == "make venv":
        command = ["make", "-s", "demo", f"VENV={venv}", f"PYTHON={python}"]
    else:
        command = [str(venv / "bin" / "stepscope"), "demo"]
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


RECIPES = {"pip installs": _pip_installs, "make venv": _make_venv}


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
    print(f"ratio pip installs / make venv: {medians['pip installs'] / medians['make venv']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
