"""The zoo beside other work, and the same scenario run again and again.

- Beside two CPU-burning processes, a scenario keeps its planted family on top or names the
  disturbance (``foreign_load`` with the burners' pids) — never a confident wrong verdict alone.
- Beside a neighbour that takes every core for 0.15 s every 0.9 s, the busy-model scenario's
  steps stall every ~7 steps: the stalls are the neighbour's (``foreign_load``), never a
  ``periodic_stall`` that sends the user after a checkpoint the loop does not have.
- The busy-model scenario (a model using every core, a light loader) is run three times (one of
  them the zoo test's run): the verdict and every finding at MEDIUM or above are the same in all
  three runs, and no run is told to add DataLoader workers or cut intra-op threads (both would
  slow it down).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from test_zoo import describe, run_demo

BURN = "import time\nend = time.time() + 600\nwhile time.time() < end: pass\n"
#: Two processes that take both cores for 0.15 s every 0.9 s (a monitoring agent, a neighbour's timer).
BURSTS = """
import os, time
os.fork()
start = time.perf_counter()
for k in range(1, 700):
    at = start + 0.9 * k
    while time.perf_counter() < at:
        time.sleep(0.005)
    while time.perf_counter() < at + 0.15:
        pass
"""
FOREIGN = "foreign_load"


def _medium_or_above(findings: list[dict]) -> set[tuple[str, str]]:
    return {(item["family"], item["severity"]) for item in findings
            if item["severity"] not in ("info", "low") and item["family"] != FOREIGN}


def _prescribed_settings(findings: list[dict]) -> set[str]:
    return {p["setting"] for item in findings for p in item["prescriptions"] if p["setting"]}


pytestmark = [pytest.mark.slow, pytest.mark.serial]


@pytest.mark.parametrize("name, planted", [("input-cpu", "input_pipeline"), ("busy-model", "healthy")])
def test_beside_two_busy_processes(tmp_path, name, planted):
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(2)]
    try:
        report = run_demo(name, tmp_path / "run")
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    findings = report["findings"]
    foreign = [item for item in findings if item["family"] == FOREIGN]
    assert foreign, f"two busy processes were not reported: {describe(findings)}"
    assert any(f"pid {burner.pid}" in item["title"] for burner in burners for item in foreign), describe(findings)
    assert findings[0]["family"] in (planted, FOREIGN), describe(findings, report)
    if planted == "healthy":  # a crowded machine never turns into "add workers"
        assert not _prescribed_settings(findings) & {"num_workers", "intra_op_threads"}, describe(findings)


def test_a_neighbours_periodic_bursts_are_not_the_loops_stall(tmp_path):
    bursts = subprocess.Popen([sys.executable, "-c", BURSTS], start_new_session=True)
    try:
        report = run_demo("busy-model", tmp_path / "run")
    finally:
        os.killpg(bursts.pid, signal.SIGKILL)
        bursts.wait()
    findings = report["findings"]
    assert not any(item["family"] == "periodic_stall" for item in findings), describe(findings, report)
    assert findings[0]["family"] in ("healthy", FOREIGN), describe(findings, report)
    stall = report["evidence"]["periodic_stall"]
    if stall is not None and stall["cost_share"] >= 0.01:  # the stalls were seen: they are the neighbour's
        assert any(item["rule_id"] == "foreign_load.neighbour_bursts" for item in findings), describe(findings, report)


def test_busy_model_verdict_is_stable_over_repeated_runs(tmp_path, zoo_run):
    reports = [zoo_run("busy-model").report] + [run_demo("busy-model", tmp_path / f"run{index}") for index in range(2)]
    quiet = [report for report in reports if not any(item["family"] == FOREIGN for item in report["findings"])]
    for report in reports:
        settings = _prescribed_settings(report["findings"])
        assert not settings & {"num_workers", "intra_op_threads"}, describe(report["findings"], report)
    assert len({frozenset(_medium_or_above(report["findings"])) for report in quiet}) <= 1, \
        [describe(report["findings"], report) for report in quiet]
    assert len({report["verdict"]["family"] for report in quiet}) <= 1
