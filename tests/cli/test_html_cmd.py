"""``--html``, ``--perfetto`` and ``--tensorboard`` on ``stepscope run``, ``report`` and ``analyze``."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from stepscope.record import layout
from stepscope.record.store import save_record
from support import REPO_ROOT, run_cli, write_script

TRACES = REPO_ROOT / "tests" / "data" / "traces"
HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """A short demo run with a profiler window, written with --html (and --tensorboard when possible)."""
    folder = tmp_path_factory.mktemp("demo")
    args = ["demo", "input-cpu", "--steps", "16", "--trace", "--html", "--no-summary", "-o", str(folder / "run")]
    if HAS_TENSORBOARD:
        args += ["--tensorboard", str(folder / "tb")]
    result = run_cli(args, folder)
    assert result.returncode == 0, result.stderr
    return folder, result


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("stepscope: error: "), result.stderr
    return lines[0]


def test_run_html_writes_the_page_beside_the_record(demo_run):
    folder, result = demo_run
    page = (folder / "run" / "report.html").read_text()
    assert "wrote" in result.stderr and "report.html" in result.stderr
    assert 'id="verdict"' in page and 'id="steps"' in page and 'data-table="ops-r0"' in page  # the window's views


@pytest.mark.skipif(not HAS_TENSORBOARD, reason="the tensorboard package is not installed")
def test_run_tensorboard_writes_an_event_file(demo_run):
    folder, result = demo_run
    assert list((folder / "tb").glob("events.out.tfevents.*"))
    assert "TensorBoard scalars" in result.stderr


def test_report_html_and_perfetto(demo_run, entry, tmp_path):
    folder, _ = demo_run
    result = run_cli(["report", str(folder / "run"), "--html", "-o", str(tmp_path / "r.html"),
                      "--perfetto", str(tmp_path / "p.json")], tmp_path, entry=entry)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    trace = json.loads((tmp_path / "p.json").read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert "ProfilerStep#1" in names and "step 0" in names  # Kineto events beside the steps
    assert trace["otherData"]["kineto_alignment"]["0"]["profiler_step_residual_ns"] is not None


def test_analyze_html(tmp_path, entry):
    result = run_cli(["analyze", str(TRACES / "cpu_train.pt.trace.json.gz"), "--html", "-o", str(tmp_path / "a.html")],
                     tmp_path, entry=entry)
    assert result.returncode == 0, result.stderr
    page = (tmp_path / "a.html").read_text()
    assert 'data-table="ops-r0"' in page and "Overview" in page


def test_analyze_html_default_name_is_beside_the_trace(tmp_path):
    trace = tmp_path / "cpu_plain.pt.trace.json"
    trace.write_bytes((TRACES / "cpu_plain.pt.trace.json").read_bytes())
    result = run_cli(["analyze", str(trace), "--html"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "cpu_plain.pt.trace.html").exists()


def two_ranks(folder: Path) -> Path:
    from html_records import synthetic_run

    folder.mkdir(parents=True)
    for rank in (0, 1):
        record = synthetic_run(120, rank=rank, world_size=2, samples=False, seed=rank, slow=1.0 + rank)
        save_record(record, layout.record_path(folder, rank))
    return folder


def test_multi_rank_report_html_and_perfetto(tmp_path):
    run = two_ranks(tmp_path / "job")
    result = run_cli(["report", str(run), "--html", "--perfetto", str(tmp_path / "job.json")], tmp_path)
    assert result.returncode == 0, result.stderr
    page = (run / "report.html").read_text()
    assert 'id="ranks"' in page and "rank 1" in page
    trace = json.loads((tmp_path / "job.json").read_text())
    assert {event["pid"] for event in trace["traceEvents"] if event.get("cat") == "stepscope"} == {0, 1}


@pytest.mark.parametrize("case", ["input", "missing-dir", "directory", "no-html", "same-file"])
def test_bad_outputs_are_one_line_errors(demo_run, tmp_path, case):
    folder, _ = demo_run
    run = folder / "run"
    args = {
        "input": ["report", str(run), "--html", "-o", str(run / "record.rank0.json.gz")],
        "missing-dir": ["report", str(run), "--html", "-o", str(tmp_path / "nowhere" / "r.html")],
        "directory": ["report", str(run), "--html", "-o", str(tmp_path)],
        "no-html": ["report", str(run), "-o", str(tmp_path / "r.html")],
        "same-file": ["report", str(run), "--html", "-o", str(tmp_path / "x"), "--perfetto", str(tmp_path / "x")],
    }[case]
    before = (run / "record.rank0.json.gz").read_bytes()
    one_error_line(run_cli(args, tmp_path))
    assert (run / "record.rank0.json.gz").read_bytes() == before


def test_analyze_html_onto_its_input_is_refused(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_bytes((TRACES / "cpu_plain.pt.trace.json").read_bytes())
    assert "input" in one_error_line(run_cli(["analyze", str(trace), "--html", "-o", str(trace)], tmp_path))
    assert trace.read_bytes() == (TRACES / "cpu_plain.pt.trace.json").read_bytes()


def without_tensorboard(folder: Path) -> dict[str, str]:
    """An environment where ``import tensorboard`` fails."""
    blocker = folder / "blocker" / "tensorboard"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('tensorboard blocked for this test')\n")
    return {"PYTHONPATH": str(folder / "blocker") + os.pathsep + str(REPO_ROOT / "src")}


def test_report_tensorboard_without_the_package(demo_run, tmp_path):
    folder, _ = demo_run
    result = run_cli(["report", str(folder / "run"), "--tensorboard", str(tmp_path / "tb")], tmp_path,
                     env=without_tensorboard(tmp_path))
    assert "pip install tensorboard" in one_error_line(result)
    assert not (tmp_path / "tb").exists()


def test_run_tensorboard_without_the_package_stops_before_the_script(tmp_path):
    script = write_script(tmp_path, "train.py", "open('ran', 'w').close()\n")
    result = run_cli(["run", "--tensorboard", str(tmp_path / "tb"), str(script)], tmp_path,
                     env=without_tensorboard(tmp_path))
    assert "pip install tensorboard" in one_error_line(result)
    assert not (tmp_path / "ran").exists()


def test_report_json_is_unchanged_by_the_window_views(demo_run):
    folder, _ = demo_run
    report = json.loads((folder / "run" / "report.json").read_text())
    assert report["trace_analysis"] is None and report["trace"] is not None
