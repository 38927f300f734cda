"""The scan of processes outside the training tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from stepscope.analysis.run.signals import foreign_processes
from stepscope.capture.foreign import ForeignScan, parse_stat


def test_parse_stat_handles_names_with_spaces_and_parentheses():
    raw = b"42 (my (odd) name) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 100 0 0"
    assert parse_stat(raw) == ("my (odd) name", 300, 1)
    assert parse_stat(b"garbage") is None


def _fake_proc(root, pid: int, name: str, ticks: int, ppid: int = 1) -> None:
    path = root / str(pid)
    path.mkdir(exist_ok=True)
    fields = ["S", str(ppid)] + ["0"] * 9 + [str(ticks), "0"] + ["0"] * 8
    (path / "stat").write_text(f"{pid} ({name}) {' '.join(fields)}")


def test_scan_names_the_busiest_processes_outside_the_tree(tmp_path):
    clock = [0]
    scan = ForeignScan(lambda: {10}, clock=lambda: clock[0], proc_root=str(tmp_path), every_s=2.0)
    _fake_proc(tmp_path, 10, "train", 0)
    _fake_proc(tmp_path, 20, "burner", 0)
    _fake_proc(tmp_path, 30, "idle", 0)
    assert scan.poll() == []  # the baseline
    clock[0] = int(1e9)
    assert scan.poll() == []  # not due yet
    clock[0] = int(2e9)
    tick = scan.tick_s
    _fake_proc(tmp_path, 10, "train", int(2 / tick))  # the tree: excluded
    _fake_proc(tmp_path, 20, "burner", int(1.8 / tick))  # 0.9 of a core over 2 s
    _fake_proc(tmp_path, 30, "idle", 0)
    (event,) = scan.poll()
    assert event["type"] == "foreign" and event["interval_s"] == 2.0
    assert event["procs"] == [[20, "burner", pytest.approx(0.9, abs=0.01)]]


def test_scan_sees_a_real_busy_process():
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        scan = ForeignScan(lambda: {os.getpid()}, every_s=0.5)
        scan.poll()
        found: list[int] = []
        deadline = time.monotonic() + 30
        # one scan is enough on a quiet machine; beside the test workers' own busy processes a
        # burner just started has once held less than MIN_CORES in its first 0.6 s
        while not found and time.monotonic() < deadline:
            time.sleep(0.6)
            (event,) = scan.poll()
            found = [pid for pid, _, _ in event["procs"] if pid == burner.pid]
        assert found
    finally:
        burner.kill()
        burner.wait()


def test_foreign_processes_average_over_the_window():
    scans = ((int(2e9), 2.0, ((20, "burner", 1.0), (30, "cron", 0.5))),
             (int(4e9), 2.0, ((20, "burner", 1.0),)),
             (int(9e9), 2.0, ((40, "later", 1.0),)))  # after the window
    assert foreign_processes(scans, 0, int(4e9)) == ((20, "burner", 1.0), (30, "cron", 0.25))
    assert foreign_processes((), 0, 1) == ()


def test_the_other_ranks_of_the_job_are_its_own_not_other_processes(tmp_path):
    """Under torchrun each rank's sampler sees the launcher's other children: they are the job."""
    clock = [0]
    scan = ForeignScan(lambda: {10}, clock=lambda: clock[0], proc_root=str(tmp_path), every_s=2.0, job_root=5)
    tree = {5: ("torchrun", 1), 10: ("rank0", 5), 11: ("rank1", 5), 12: ("rank1-worker", 11), 20: ("burner", 1)}
    for pid, (name, ppid) in tree.items():
        _fake_proc(tmp_path, pid, name, 0, ppid)
    scan.poll()
    clock[0] = int(2e9)
    busy = {5: 0.1, 10: 1.0, 11: 0.5, 12: 0.4, 20: 0.8}
    for pid, (name, ppid) in tree.items():
        _fake_proc(tmp_path, pid, name, int(busy[pid] * 2 / scan.tick_s), ppid)
    (event,) = scan.poll()
    assert event["procs"] == [[20, "burner", pytest.approx(0.8, abs=0.01)]]
    assert event["job_cores"] == pytest.approx(1.0, abs=0.02)  # launcher + the other rank + its worker
    assert event["others_cores"] == pytest.approx(0.8, abs=0.01)


def test_the_job_root_is_the_elastic_launcher(tmp_path):
    from stepscope.capture.foreign import job_root

    assert job_root(os.getpid(), {}) is None
    assert job_root(os.getpid(), {"TORCHELASTIC_RUN_ID": "abc"}) == os.getppid()
