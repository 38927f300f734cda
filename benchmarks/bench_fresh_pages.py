"""Benchmark: what touching memory costs on this machine, pages the kernel just freed against pages it
handed back to the hypervisor.

On a virtual machine whose balloon driver reports free pages (``virtio_balloon`` with free page
reporting, as on Firecracker), a page that stayed free for a moment is returned to the host; the
next process that touches it waits while the host backs it again, in the guest's kernel (system
time), when it zeroes the page. Every large trace analysed here allocates hundreds of MB to GB of
new memory, so its wall time on such a machine carries this cost per MB, and a smaller footprint is
also a faster run there. This script measures it: a child process fills ``--mb`` MB of new memory
(numpy), right after the previous child freed the same amount (``hot``) and after ``--idle``
seconds of quiet (``after idle``); alternating, ``--rounds`` times each.

Each child runs twice more with numpy's transparent huge-page advice switched off
(``NUMPY_MADVISE_HUGEPAGE=0``; numpy asks the kernel for huge pages on every large array by default).
Where the kernel's huge-page ``defrag`` setting is ``madvise`` (the usual default), a fault in an
advised range may compact memory to find a 2 MB page, which a virtual machine pays for too.

Usage::

    python benchmarks/bench_fresh_pages.py [--mb 200] [--rounds 3] [--idle 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

_CHILD = "import numpy as np; a = np.ones({count}); a[::512] += 1"


def _balloon_reports() -> str:
    """Whether the kernel reports free pages to the host (``page_reporting`` loaded, its order)."""
    order = "/sys/module/page_reporting/parameters/page_reporting_order"
    if not os.path.exists(order):
        return "no free page reporting module"
    with open(order) as fh:
        return f"free page reporting loaded (order {fh.read().strip()})"


def _huge_pages() -> str:
    """The kernel's transparent huge-page settings (enabled, defrag), as it shows them."""
    settings = []
    for name in ("enabled", "defrag"):
        try:
            with open(f"/sys/kernel/mm/transparent_hugepage/{name}") as fh:
                settings.append(f"{name} {fh.read().strip()}")
        except OSError:
            settings.append(f"{name} unknown")
    return "transparent huge pages: " + ", ".join(settings)


def _one(mb: float, huge: bool = True) -> tuple[float, float, float]:
    """Wall, user and system seconds of a child that fills ``mb`` MB of new memory (with numpy's
    huge-page advice, or without)."""
    count = int(mb * 2**20 / 8)
    env = {**os.environ, "NUMPY_MADVISE_HUGEPAGE": "1" if huge else "0"}
    started = time.perf_counter()
    before = os.times()
    subprocess.run([sys.executable, "-c", _CHILD.format(count=count)], check=True, env=env)
    after = os.times()
    return (time.perf_counter() - started, after.children_user - before.children_user,
            after.children_system - before.children_system)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=200.0, help="MB of new memory each child fills")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of quiet before an 'after idle' child")
    args = parser.parse_args()
    _one(1)  # numpy's import in the page cache
    _one(args.mb)
    rows: dict[str, list[tuple[float, float, float]]] = {
        "hot": [], "after idle": [], "hot, no huge-page advice": [], "after idle, no huge-page advice": []}
    for _ in range(args.rounds):
        for huge, suffix in ((True, ""), (False, ", no huge-page advice")):
            rows["hot" + suffix].append(_one(args.mb, huge))  # right after the previous child freed as much
            time.sleep(args.idle)
            rows["after idle" + suffix].append(_one(args.mb, huge))
    print(f"{_balloon_reports()}; {_huge_pages()}; {args.mb:.0f} MB of new memory per child, "
          f"{args.rounds} rounds, idle {args.idle:.0f} s")
    print("| pages | wall (median) | system CPU (median) | system ms per MB |")
    print("| --- | ---: | ---: | ---: |")
    for label, samples in rows.items():
        wall = statistics.median(s[0] for s in samples)
        system = statistics.median(s[2] for s in samples)
        print(f"| {label} | {wall:.2f} s | {system:.2f} s | {1000 * system / args.mb:.1f} |")


if __name__ == "__main__":
    main()
