"""Children that start and end between two samples are still the run's own CPU: the sampler finds
them in their parent's reaped-children CPU (cutime + cstime), without counting twice those it saw."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from stepscope.capture import procfs
from stepscope.capture.system import ProcessTree

pytestmark = pytest.mark.skipif(not procfs.available(), reason="needs /proc")

#: a parent that starts short-lived children, each burning ~0.2 s of CPU, then idles
PARENT = """
import os, sys, time
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        end = time.process_time() + 0.2
        while time.process_time() < end:
            pass
        os._exit(0)
    os.waitpid(pid, 0)
print("done", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _sample_until_done(tree: ProcessTree, parent: subprocess.Popen, every_s: float) -> None:
    while parent.poll() is None:
        tree.sample(time.monotonic_ns())
        time.sleep(every_s)


def test_children_no_sample_saw_are_counted_once_from_the_parents_reaped_cpu():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, "4", "5"], stdout=subprocess.PIPE, text=True)
    try:
        tree = ProcessTree(parent.pid, with_io=False)
        # one sample right away, then none until the children are gone: none of them is ever seen
        tree.sample(time.monotonic_ns())
        assert parent.stdout is not None and parent.stdout.readline() == "done\n"
        tree.sample(time.monotonic_ns())
    finally:
        parent.kill()
        parent.wait()
    seen_children = [entry for entry in tree.tracked.values() if entry.pid != parent.pid]
    assert not seen_children
    ticks_per_s = procfs.CLOCK_TICKS_PER_S
    assert tree.unseen_ticks / ticks_per_s == pytest.approx(0.8, abs=0.15)


def test_children_the_sampler_saw_are_not_counted_again():
    parent = subprocess.Popen([sys.executable, "-c", PARENT.replace("0.2", "0.6"), "1", "0.3"],
                              stdout=subprocess.DEVNULL)
    tree = ProcessTree(parent.pid, with_io=False)
    _sample_until_done(tree, parent, 0.05)  # a full scan finds the child while it burns
    counted = tree._credited_ticks / procfs.CLOCK_TICKS_PER_S
    assert counted > 0.3  # most of its CPU was in its own rows
    # what the rows did not hold (before its first reading) is all that is added
    assert tree.unseen_ticks / procfs.CLOCK_TICKS_PER_S == pytest.approx(0.6 - counted, abs=0.12)
