"""``stepscope report`` on the saved runs and ``stepscope analyze`` on the vendored reference traces,
byte for byte against ``tests/data/golden/reports/``: terminal text, JSON and HTML (its stylesheet
aside). The files were written by the renderers before
they stopped computing (the CPU mean, the critical path's shown shares and their order, the largest
table rows now come from the view); ``STEPSCOPE_WRITE_GOLDEN=1`` rewrites them after a change that
is meant to show."""

from __future__ import annotations

import os
import subprocess
import sys
import re
from pathlib import Path

import pytest

from stepscope.cli.main import main

DATA = Path(__file__).resolve().parents[2] / "data"
GOLDEN = DATA / "golden" / "reports"
WRITE = os.environ.get("STEPSCOPE_WRITE_GOLDEN") == "1"
RUNS = sorted(path.name for path in (DATA / "runs").iterdir() if path.is_dir())
#: every Kineto trace of the vendored reference set (an execution trace, ``*_et.json.gz``, is not one)
TRACES = sorted(str(path.relative_to(DATA / "traces" / "reference")) for path in
                (DATA / "traces" / "reference" / "hta").rglob("*.json.gz") if not path.name.endswith("_et.json.gz"))


@pytest.fixture(autouse=True)
def fixed_terminal(monkeypatch):
    """A fixed width and zone, and paths relative to ``tests/data`` (a checkout's own path would
    change where a long name is cut)."""
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.chdir(DATA)


def _stable(text: str, *paths: Path) -> str:
    """The output without what differs between checkouts: the stylesheet, this checkout's paths."""
    text = re.sub(r"<style>.*?</style>", "<style/>", text, flags=re.S)
    for path in paths:
        text = text.replace(str(path), "<DATA>")
    return text


def check(name: str, text: str) -> None:
    path = GOLDEN / name
    if WRITE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), name


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


@pytest.mark.parametrize("run", RUNS)
def test_report_of_a_saved_run(run, capsys, tmp_path):
    run_dir = Path("runs") / run
    for fmt in ("text", "json"):
        assert main(["report", str(run_dir), "--format", fmt, "--jobs", "1"]) == 0
        check(f"run-{run}.{fmt}", _stable(capsys.readouterr().out, DATA))
    page = tmp_path / "report.html"
    assert main(["report", str(run_dir), "--jobs", "1", "--html", "-o", str(page)]) == 0
    check(f"run-{run}.html", _stable(page.read_text(encoding="utf-8"), DATA, tmp_path))
    capsys.readouterr()


@pytest.mark.parametrize("trace", TRACES)
def test_analyze_of_a_reference_trace(trace, capsys, tmp_path):
    path = Path("traces") / "reference" / trace
    for fmt in ("text", "json"):
        assert main(["analyze", str(path), "--format", fmt, "--no-progress", "--jobs", "1"]) in (0, 3)
        check(f"trace-{_slug(trace)}.{fmt}", _stable(capsys.readouterr().out, DATA))
    page = tmp_path / "trace.html"
    assert main(["analyze", str(path), "--no-progress", "--jobs", "1", "--html", "-o", str(page)]) in (0, 3)
    check(f"trace-{_slug(trace)}.html", _stable(page.read_text(encoding="utf-8"), DATA, tmp_path))
    capsys.readouterr()


def test_reporting_a_run_without_trials_does_not_load_the_trials_modules():
    """`stepscope.verify` and `stepscope.whatif` (18.5 ms of import) are for runs with trials only."""
    code = ("import sys\nfrom stepscope.pipeline.diagnose import diagnose\nfrom stepscope.pipeline.inputs import load_run\n"
            f"report = diagnose(load_run({str(DATA / 'runs' / 'straggler-two-ranks')!r}))\n"
            "print(report.findings[0].family, sorted(m for m in ('stepscope.verify', 'stepscope.whatif') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["straggler", "[]"]


@pytest.mark.parametrize("name", [TRACES[0], "hta/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz"])
def test_analyzing_a_trace_does_not_load_what_only_a_run_record_needs(name):
    """`analyze` of a trace imports none of the run-record analyses (thread account, code locations,
    compile summary, GC pauses, input profile, stalls, the steady window, the sampler's signals and
    timelines, the job's rank table: ~30 dataclasses), nor the run record's classes (a trace's
    evidence holds an empty ``CaptureFacts`` without its parts: 23 dataclasses), nor the run's views
    and their builders (the run summary, job, machine and chart views: 26 dataclasses), nor
    ``numpy.ma`` (a plain ``np.unique`` or ``np.isin`` loads it: ~10 ms; the second trace's critical
    path reached it), nor ``logging`` (only a failing rule logs), nor rich's emoji table (no
    ``:name:`` code is replaced)."""
    run_only = ("account", "code_locations", "compile_summary", "gc_pauses", "input_profile", "ranks", "signals",
                "stalls", "timelines", "window")
    trace = DATA / "traces" / "reference" / name
    code = ("import io, sys\nfrom stepscope.cli.main import main\n"
            f"assert main(['analyze', {str(trace)!r}, '--no-progress', '-o', '/dev/null']) in (0, 3)\n"
            f"print(sorted(m for m in {run_only!r} if 'stepscope.analysis.run.' + m in sys.modules),"
            " 'stepscope.record.samples' in sys.modules, 'stepscope.record.run' in sys.modules,"
            " 'stepscope.record.fact_parts' in sys.modules, 'numpy.ma' in sys.modules,"
            " 'stepscope.report.run_view' in sys.modules, 'stepscope.pipeline.views' in sys.modules,"
            " 'rich._emoji_codes' in sys.modules, 'logging' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]"] + ["False"] * 8
