"""Fixed cost of ``stepscope run`` over ``python`` on a short torch script.

``python tiny.py``, ``stepscope run tiny.py`` (every capture feature on: sampler, stack sampling,
GC timing, report.json and the summary) and ``stepscope run --no-monitor tiny.py`` run
interleaved, ``--pairs`` rounds, the order alternating. Prints each one's wall time and CPU time
(the process and its children), min and median, and what stepscope adds: the difference of the
minimums (the least disturbed runs) and the median of the per-round differences. On a shared
machine whose bare runs vary by a second, the minimum is the steadier figure.

The package's modules are byte-compiled first (``compileall``), as an installed package is: a
checkout run with ``PYTHONDONTWRITEBYTECODE=1`` would otherwise compile stepscope's sources on
every start and measure the compiler. The CPU-peak cache is warmed by one run before timing
(a user's first run on a machine measures it once; ``docs/machine.md``).

    python benchmarks/bench_startup.py [--pairs 10]
"""

from __future__ import annotations

import argparse
import compileall
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

TINY = textwrap.dedent("""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
""")


def timed(command: list[str], cwd: Path) -> tuple[float, float]:
    """(wall s, CPU s of the process and its children: the sidecar, DataLoader workers)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return elapsed, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    args = parser.parse_args()
    import stepscope

    compileall.compile_dir(str(Path(stepscope.__file__).parent), quiet=1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "tiny.py").write_text(TINY)
        variants = {"python tiny.py": [sys.executable, "tiny.py"],
                    "stepscope run tiny.py": [sys.executable, "-m", "stepscope", "run", "--force", "-o", "a",
                                              "tiny.py"],
                    "stepscope run --no-monitor tiny.py": [sys.executable, "-m", "stepscope", "run", "--no-monitor",
                                                           "--force", "-o", "b", "tiny.py"]}
        for command in variants.values():
            timed(command, work)  # CPU-peak cache, page cache
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
        for index in range(args.pairs):  # interleaved, the order alternating
            for name in (list(variants) if index % 2 == 0 else list(reversed(variants))):
                results[name].append(timed(variants[name], work))
    bare = results["python tiny.py"]
    for name, runs in results.items():
        walls, cpus = [run[0] for run in runs], [run[1] for run in runs]
        line = (f"{name:36s} wall min {min(walls):.2f} s, median {statistics.median(walls):.2f} s; "
                f"CPU min {min(cpus):.2f} s, median {statistics.median(cpus):.2f} s")
        if runs is not bare:
            differences = [run[0] - base[0] for run, base in zip(runs, bare)]
            line += (f"  => {min(walls) - min(run[0] for run in bare):+.2f} s (min), "
                     f"{statistics.median(differences):+.2f} s (median of pair differences)")
        print(line)


if __name__ == "__main__":
    main()
