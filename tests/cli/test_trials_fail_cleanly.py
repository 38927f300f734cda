"""`stepscope try` trials that fail, hang, or are interrupted: a failed trial is never a measurement
and says how it failed; a hung one is stopped at its deadline with its whole process group; a
SIGTERM stops the trial under way and keeps what was measured. No process of a trial remains."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import cli_env, popen, write_script

from stepscope.children import group_members
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity

FAILS = """
    print("loading the data")
    raise RuntimeError("dataset path not set")
"""

#: Starts a process of its own, writes its pid, its group and that process's pid, never ends.
HANGS = """
    import os, subprocess, sys, time

    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open("pids.txt", "a") as out:
        out.write(f"{os.getpid()} {os.getpgid(0)} {helper.pid}\\n")
    while True:
        time.sleep(1)
"""


def _written(path) -> bool:
    """The trial has written its line (the file exists from its open, before the write)."""
    return path.exists() and path.read_text().endswith("\n")


# The training scripts below update their weights by hand: what is tested is how trials are stopped,
# and torch.optim's first step imports the compiler (~1 s of CPU in every trial that trains).

#: Trains normally, except with DataLoader workers: they start, then the script hangs.
HANGS_WITH_WORKERS = """
    import os
    import time

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.arange(512.0).unsqueeze(1)), batch_size=8, num_workers=0)
    if loader.num_workers:
        batches = iter(loader)
        next(batches)
        with open("hung.txt", "w") as out:
            out.write(f"{os.getpgid(0)}\\n")
        while True:
            time.sleep(1)
    model = torch.nn.Linear(1, 1)
    for epoch in range(10):
        for (x,) in loader:
            model.zero_grad()
            model(x).sum().backward()
            with torch.no_grad():
                for weight in model.parameters():
                    weight -= 0.01 * weight.grad
"""


def saved_diagnosis(directory: Path) -> Path:
    """A run's report.json whose one finding prescribes two workers (``try --from`` takes it)."""
    workers = Prescription("DataLoader(num_workers=2)", "why", "num_workers", 0, 2, expected_gain=0.5,
                           set={"dataloader.num_workers": 2})
    finding = Finding("input_pipeline.loader_cpu_bound", "input_pipeline", "the step waits for data",
                      Severity.HIGH, 0.5, 0.9, (Evidence("x", 1.0),), (workers,))
    directory.mkdir()
    (directory / "report.json").write_text(json.dumps({"findings": [finding.to_dict()], "run": {"wall_s": 1.0}}))
    return directory


def stepscope(args: list[str], cwd: Path, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "stepscope", *args], cwd=cwd, env=cli_env(),
                            capture_output=True, text=True, timeout=timeout)
    return result, time.monotonic() - started


def live(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_try_where_every_trial_fails_says_how_and_where_the_logs_are(tmp_path):
    write_script(tmp_path, "train.py", FAILS)
    saved_diagnosis(tmp_path / "saved")
    result, _ = stepscope(["try", "--from", "saved", "--steps", "5", "--repeats", "2", "-o", "out", "train.py"],
                          tmp_path, timeout=120)
    out = result.stdout
    assert result.returncode == 1, result.stderr  # nothing was measured: the command failed
    assert "beyond noise" not in out, out  # nothing was measured, so nothing was compared
    assert "best: none — all 4 trials failed, nothing was measured: exit 1: RuntimeError: dataset path not set" in out
    assert "logs in out/logs" in out and (tmp_path / "out" / "logs" / "r1-baseline.log").is_file()
    assert "failed: exit 1: RuntimeError: dataset path not set (log: out/logs/r1-baseline.log)" in result.stderr
    document = json.loads((tmp_path / "out" / "whatif.json").read_text())
    assert [row["verdict"] for row in document["comparisons"]] == ["failed", "failed"]
    assert document["best"] is None and len(document["failures"]) == 4
    assert document["failures"][0]["error"] == "exit 1: RuntimeError: dataset path not set"


def test_try_stops_a_hung_trial_at_its_deadline_with_its_process_group(tmp_path):
    write_script(tmp_path, "train.py", HANGS)
    saved_diagnosis(tmp_path / "saved")
    result, took = stepscope(["try", "--from", "saved", "--steps", "5", "--repeats", "1", "--timeout-s", "2",
                              "-o", "out", "train.py"], tmp_path, timeout=120)
    assert result.returncode == 1, result.stderr  # every trial timed out: nothing was measured
    assert "timed out after 2.0 s (stopped with its process group)" in result.stdout
    assert took < 2 * (2 + 3) + 10, took  # two trials, each its deadline (+ the grace period), + start-up
    rows = [[int(item) for item in line.split()] for line in (tmp_path / "pids.txt").read_text().splitlines()]
    assert len(rows) == 2
    time.sleep(0.2)
    for pid, group, helper in rows:
        assert pid == group and not live(pid) and not live(helper) and group_members(group) == []


@pytest.mark.slow
def test_sigterm_to_try_stops_the_trial_group_and_keeps_what_was_measured(tmp_path):
    write_script(tmp_path, "train.py", HANGS_WITH_WORKERS)
    saved_diagnosis(tmp_path / "saved")
    process = popen([sys.executable, "-m", "stepscope", "try", "--from", "saved", "--steps", "12", "--repeats", "2",
                     "--timeout-s", "120", "-o", "out", "train.py"], tmp_path, cli_env(),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hung = tmp_path / "hung.txt"
    try:
        end = time.monotonic() + 90
        while not _written(hung) and time.monotonic() < end and process.poll() is None:
            time.sleep(0.1)
        assert _written(hung), process.communicate(timeout=30)
        group = int(hung.read_text())
        assert len(group_members(group)) >= 3  # the trial and its two DataLoader workers
        os.kill(process.pid, signal.SIGTERM)
        started = time.monotonic()
        out, err = process.communicate(timeout=30)
        took = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGTERM, err
    assert took < 3 + 5, took  # SIGTERM to the trial's group, SIGKILL after the grace period at most
    time.sleep(0.2)
    assert group_members(group) == []
    document = json.loads((tmp_path / "out" / "whatif.json").read_text())
    baseline = document["comparisons"][0]
    assert baseline["runs"] == 1 and baseline["failed"] == 0 and baseline["step_time_s"] > 0
    assert "trials stopped by SIGTERM after 1: what was measured is kept" in document["notes"]
    assert "trials stopped by SIGTERM" in out


#: A data-bound script (so `run --verify` tries DataLoader workers) that hangs once workers run.
DATA_BOUND_HANGS_WITH_WORKERS = """
    import os
    import time

    import torch
    from torch.utils.data import DataLoader, Dataset


    class Slow(Dataset):
        def __len__(self):
            return 4096

        def __getitem__(self, index):
            time.sleep(0.001)
            return torch.randn(16)


    loader = DataLoader(Slow(), batch_size=8)
    if loader.num_workers:
        batches = iter(loader)
        next(batches)
        with open("hung.txt", "w") as out:
            out.write(f"{os.getpgid(0)}\\n")
        while True:
            time.sleep(1)
    model = torch.nn.Linear(16, 1)
    for step, x in enumerate(loader):
        model.zero_grad()
        model(x).sum().backward()
        with torch.no_grad():
            for weight in model.parameters():
                weight -= 0.01 * weight.grad
        if step == 60:
            break
"""


@pytest.mark.slow
def test_sigterm_during_run_verify_stops_the_trial_group_and_saves_what_was_measured(tmp_path):
    write_script(tmp_path, "train.py", DATA_BOUND_HANGS_WITH_WORKERS)
    # the budget only has to let the trials start (the run is stopped in its second trial, which
    # hangs): 40 s refused to start where one trial was estimated at 13 s (two rounds of two trials)
    process = popen([sys.executable, "-m", "stepscope", "run", "--verify", "--verify-budget", "120", "-o", "run",
                     "train.py"], tmp_path, cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hung = tmp_path / "hung.txt"
    try:
        end = time.monotonic() + 120
        while not _written(hung) and time.monotonic() < end and process.poll() is None:
            time.sleep(0.1)
        assert _written(hung), process.communicate(timeout=30)
        group = int(hung.read_text())
        assert len(group_members(group)) >= 2  # the trial and its DataLoader workers
        os.kill(process.pid, signal.SIGTERM)
        started = time.monotonic()
        out, err = process.communicate(timeout=30)
        took = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGTERM, err
    assert took < 3 + 5, took
    time.sleep(0.2)
    assert group_members(group) == []
    verification = json.loads((tmp_path / "run" / "verification.json").read_text())
    assert verification["stopped_by"] == "SIGTERM" and verification["interrupted"] is True
    assert verification["trials"][0]["runs"] == 1 and verification["trials"][0]["failed"] == 0
    assert "trials stopped by SIGTERM after 1: what was measured is kept" in verification["notes"]
    assert json.loads((tmp_path / "run" / "report.json").read_text())["verification"] == verification
