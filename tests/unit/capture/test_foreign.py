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
    assert parse_stat(raw) == ("my (odd) name", 300)
    assert parse_stat(b"garbage") is None


def _fake_proc(root, pid: int, name: str, ticks: int) -> None:
    path = root / str(pid)
    path.mkdir(exist_ok=True)
    fields = ["S"] + ["0"] * 10 + [str(ticks), "0"] + ["0"] * 8
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
        time.sleep(0.6)
        (event,) = scan.poll()
        assert burner.pid in [pid for pid, _, _ in event["procs"]]
    finally:
        burner.kill()
        burner.wait()


def test_foreign_processes_average_over_the_window():
    scans = ((int(2e9), 2.0, ((20, "burner", 1.0), (30, "cron", 0.5))),
             (int(4e9), 2.0, ((20, "burner", 1.0),)),
             (int(9e9), 2.0, ((40, "later", 1.0),)))  # after the window
    assert foreign_processes(scans, 0, int(4e9)) == ((20, "burner", 1.0), (30, "cron", 0.25))
    assert foreign_processes((), 0, 1) == ()
