"""Faults injected into real runs (the fast part of ``benchmarks/fault_campaign.py``): SIGKILL inside
a write and ENOSPC/EIO at a write site. After each, nothing is lost that was whole, nothing half
written sits under a final name, no process of the run is left, the run index is intact and a
following run into the same directory works.

The runs are real ``stepscope run`` processes (torch, two DataLoader workers, the sampler, a
torch.profiler window, ``--html``), forked from a warm interpreter (``support.popen``); the faults
come from ``benchmarks/fault_hook/sitecustomize.py`` on their ``PYTHONPATH``, which that interpreter
loaded at its start and which reads each run's settings from its environment."""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path

import pytest
from support import popen

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import fault_campaign  # noqa: E402


def _campaign(work: Path) -> fault_campaign.Campaign:
    campaign = fault_campaign.Campaign(work, seed=33, follow_every=1)
    campaign.script.write_text(fault_campaign.TRAIN_BY_HAND)  # what the run writes is tested, not torch.optim
    campaign.checkpoint_s = "0.2"  # a checkpoint within the steps, however fast the machine runs them
    return campaign


@pytest.fixture(scope="session")
def script_alone(tmp_path_factory):
    """The training script run alone, once for the test session (on first use, by whichever
    xdist worker needs it first): its stdout and exit status, which no failed write may change.
    Every campaign here runs the same script with the same arguments (``fault_campaign.STEPS``),
    so one run answers for all of them."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this session's, all workers'

    def measure() -> dict:
        result = shared / "faults-script-alone.json"
        with open(shared / "faults-script-alone.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not result.exists():
                work = shared / "faults-script-alone"
                work.mkdir(exist_ok=True)
                alone = _campaign(work)
                alone.measure_script()
                result.write_text(json.dumps({key: alone.baseline[key] for key in ("stdout", "code")}))
        return json.loads(result.read_text())

    return measure


@pytest.fixture
def campaign(tmp_path, script_alone):
    campaign = _campaign(tmp_path)
    campaign.popen = popen
    # measure_script (measure_baseline's first part too) takes the session's one run of the script
    campaign.measure_script = lambda: campaign.baseline.update(script_alone())
    return campaign


def _temporaries(run_dir: Path) -> list[str]:
    return [path.name for path in (*run_dir.iterdir(), *(run_dir / "traces").glob("*")) if path.name.endswith(".tmp")]


def test_killed_while_writing_the_record_the_checkpoint_is_reported_and_the_next_run_works(campaign):
    result = campaign.kill_in_write("record", "mid", "tree")
    assert result.killed and not result.problems, result
    assert result.outcome == "readable-partial" and result.orphans == 0 and result.index_ok
    assert result.follow == "ok"  # refused without --force (the checkpoint is a run to keep), then forced
    assert _temporaries(Path(result.run_dir)) == []  # the killed write's temporary went with the old run


def test_the_training_process_killed_after_its_report_was_written_whole_leaves_no_half_file(campaign):
    campaign.follow_every = 0
    result = campaign.kill_in_write("report", "full", "script")
    assert result.killed and not result.problems, result
    run_dir = Path(result.run_dir)
    assert not (run_dir / "report.json").exists()  # synced under its temporary name, never renamed
    assert (run_dir / "record.rank0.json.gz").exists() and result.orphans == 0


def test_a_full_disk_at_the_record_keeps_the_script_and_the_checkpoint(campaign):
    campaign.measure_script()
    result = campaign.fail_write("record", "ENOSPC")
    assert not result.problems, result  # same exit status and stdout, one line naming the record
    assert "record.rank0.json.gz" in result.detail and "No space left on device" in result.detail
    run_dir = Path(result.run_dir)
    assert not (run_dir / "record.rank0.json.gz").exists() and _temporaries(run_dir) == []
    assert (run_dir / "record.rank0.partial.json.gz").exists()  # the last checkpoint is the record left
    assert result.outcome == "readable-partial"


@pytest.mark.parametrize("site", ["trace", "html"])
def test_an_io_error_while_exporting_says_one_line_and_leaves_no_half_file(campaign, site):
    campaign.measure_script()
    result = campaign.fail_write(site, "EIO")
    assert not result.problems, result
    assert ".tmp" not in result.detail  # the line names the file that was not written
    run_dir = Path(result.run_dir)
    assert _temporaries(run_dir) == []
    if site == "trace":
        assert list((run_dir / "traces").glob("*.json")) == []
    else:
        assert not (run_dir / "report.html").exists()
    assert result.outcome == "clean"


def test_a_disk_that_fills_during_the_run_keeps_the_record_and_leaves_no_temporary(campaign):
    """A real full disk (a tmpfs the record, samples and report.json fit on with 16 KiB to spare,
    sized from a clean run on this machine): torch's trace export (~140 KiB) fails half-way. Its
    half-written temporary used to stay and hold the space, so the record — written after it — was
    lost too; the trace's line said "No such file or directory"."""
    campaign.follow_every = 0
    campaign.measure_baseline()
    result = campaign.full_disk(campaign.disk_for_all_but_the_trace_kb())
    if result is None:
        pytest.skip("no tmpfs can be mounted here (it needs root)")
    assert not result.problems, result  # same exit status and stdout, no temporaries, index intact
    assert "record.rank0.json.gz" in result.detail and "traces/" not in result.detail, result.detail
    assert result.outcome in ("clean", "readable-partial") and result.orphans == 0


def test_a_rank_killed_from_outside_leaves_the_job_s_merged_report_and_no_process(tmp_path):
    """Rank 0 of a two-rank torchrun job SIGKILLed at step 6 (as the OOM killer does): rank 1 ends,
    writes the job's merged report naming rank 0, its step and SIGKILL, and nothing of the
    job is left (``benchmarks/fault_jobs.py`` draws many such kills)."""
    import fault_jobs

    campaign = fault_jobs.JobCampaign(tmp_path, seed=33)

    result = campaign.kill_rank(0, 5)
    assert not result.problems, result
    assert result.outcome == "merged" and result.failure in ("rank 0 first, step 6, SIGKILL",
                                                            "rank 0 first, step 7, SIGKILL")  # killed after step 6's work
    assert result.orphans == 0 and result.index_ok


@pytest.mark.parametrize("args", [["--kills", "0"], ["--work", "FILE"], ["--seed", "x"]])
def test_the_job_campaign_s_bad_arguments_are_one_error_line_and_exit_2(tmp_path, args):
    import subprocess

    (tmp_path / "FILE").write_text("x")
    args = [str(tmp_path / "FILE") if item == "FILE" else item for item in args]
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fault_jobs.py"), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("fault_jobs.py: error:")
