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


def _one(mb: float) -> tuple[float, float, float]:
    """Wall, user and system seconds of a child that fills ``mb`` MB of new memory."""
    count = int(mb * 2**20 / 8)
    started = time.perf_counter()
    before = os.times()
    subprocess.run([sys.executable, "-c", _CHILD.format(count=count)], check=True)
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
    rows: dict[str, list[tuple[float, float, float]]] = {"hot": [], "after idle": []}
    for _ in range(args.rounds):
        rows["hot"].append(_one(args.mb))  # right after the previous child freed as much
        time.sleep(args.idle)
        rows["after idle"].append(_one(args.mb))
    print(f"{_balloon_reports()}; {args.mb:.0f} MB of new memory per child, {args.rounds} rounds, "
          f"idle {args.idle:.0f} s")
    print("| pages | wall (median) | system CPU (median) | system ms per MB |")
    print("| --- | ---: | ---: | ---: |")
    for label, samples in rows.items():
        wall = statistics.median(s[0] for s in samples)
        system = statistics.median(s[2] for s in samples)
        print(f"| {label} | {wall:.2f} s | {system:.2f} s | {1000 * system / args.mb:.1f} |")


if __name__ == "__main__":
    main()
