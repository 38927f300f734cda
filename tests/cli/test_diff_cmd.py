"""`stepscope diff` and `stepscope runs` on recorded runs: exit codes, the gate, JSON, one-line errors."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from stepscope.cli.main import main
from stepscope.record.run import RunRecord
from stepscope.record.store import save_record
from records import noisy_record

TRACE = "tests/data/traces/reference/hta/trace_compare/base/base.json.gz"


def _record(count: int, compute_ns: float, seed: int) -> RunRecord:
    return noisy_record(count, 100_000, compute_ns, seed, spread=0.05, wait_spread=0.0, other_ns=50_000)


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPSCOPE_INDEX", str(tmp_path / "index.sqlite"))
    for name, compute, seed in (("a", 5e6, 1), ("a2", 5e6, 2), ("slow", 10e6, 3)):
        (tmp_path / name).mkdir()
        save_record(_record(120, compute, seed), tmp_path / name / "record.rank0.json.gz")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_exit_codes_of_the_gate(runs, capsys):
    assert main(["diff", "a", "slow", "--fail-if-slower", "10"]) == 3
    assert "gate: FAILED" in capsys.readouterr().out
    assert main(["diff", "slow", "a", "--fail-if-slower", "10"]) == 0  # faster: passes
    capsys.readouterr()
    assert main(["diff", "a", "a2", "--fail-if-slower", "5", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gate"]["status"] == "passed" and data["rows"][0]["verdict"] == "within noise"
    assert main(["diff", "a", "slow", "--fail-if-slower", "150"]) == 0  # slower, but within the allowance
    assert main(["diff", "a", "slow", "--fail-if-slower", "10", "--noise-floor", "200"]) == 0  # within a wide floor


def test_repeats_and_json(runs, capsys):
    assert main(["diff", "a", "a2", "--vs", "slow", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["runs"] == {"a": 2, "b": 1} and data["rows"][0]["method"].startswith("t interval over runs")
    assert data["rows"][0]["change"] > 0.8


@pytest.mark.parametrize("args, message", [
    (["diff", "a"], "give two paths"),
    (["diff", "a", "nope"], "no such file or directory"),
    (["diff", "a", TRACE], "cannot compare a run with a trace"),
    (["diff", "--vs", "a"], "--vs needs A's runs"),
    (["diff", "a", "slow", "--iterations", "x:y"], "--iterations takes step numbers"),
    (["diff", "a", "slow", "--fail-if-slower", "-1"], "--fail-if-slower is a percentage"),
    (["diff", "--baseline", "nosuchtag", "a"], "no run tagged 'nosuchtag'"),
    (["runs", "--since", "yesterday"], "--since takes a date"),
    (["runs", "--html", "x.html"], "--html draws the --plot METRIC"),
    (["runs", "--reindex", "no-such-dir"], "not a directory"),
    (["runs", "--limit", "0"], "--limit must be >= 1"),
    (["run", "--tag", "a,b", "train.py"], "--tag must be a name"),
    (["diff", "a", "slow", "--noise-floor", "-5"], "--noise-floor is a percentage"),
])
def test_user_mistakes_are_one_line_errors(runs, capsys, args, message):
    import shutil
    from pathlib import Path

    trace = Path(__file__).resolve().parents[2] / TRACE
    if TRACE in args:
        Path("t").mkdir()
        shutil.copy(trace, "t/base.json.gz")
        args = [item if item != TRACE else "t/base.json.gz" for item in args]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stepscope: error:") and message in err[0], err


def test_a_run_compared_with_itself_is_said_to_be_the_same_run(runs, capsys):
    assert main(["diff", "a", "./a", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["same_run"] is True and data["notes"][0].startswith("A and B are the same run (a): every change "
                                                                    "is zero by construction")
    assert {row["verdict"] for row in data["rows"]} == {"same run"}  # not "within noise"
    assert main(["diff", "a", "a"]) == 0
    out = capsys.readouterr().out
    assert "A and B are the same run: nothing was compared" in out and "no difference beyond noise" not in out
    assert main(["diff", "a", "a2", "--vs", "a", "--format", "json"]) == 0  # a repeat on both sides
    data = json.loads(capsys.readouterr().out)
    assert data["same_run"] is False and data["notes"][0].startswith("1 run(s) on both sides (a)")
    assert main(["diff", "a", "a2", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["same_run"] is False and not any("same run" in note for note in data["notes"])


@pytest.mark.parametrize("case, message", [
    ("empty", "x: not a run directory (no record.rank<R>.json.gz) and it holds no profiler trace; pass "
              "directories written by 'stepscope run', or two traces"),
    ("record gone", "x: not a run directory (its record is missing); it holds profiler traces: "
                    "'stepscope analyze x/traces' reads them"),
    ("traces", "x: not a run directory (no record.rank<R>.json.gz); it holds profiler traces: "
               "'stepscope analyze x' reads them"),
    ("killed", "x: not a finished run: it holds only the last checkpoint of a run that was killed "
               "(record.rank0.partial.json.gz); 'stepscope report x' reads it"),
])
def test_a_directory_without_its_record_says_what_it_holds(runs, capsys, case, message):
    import shutil
    from pathlib import Path

    trace = Path(__file__).resolve().parents[2] / TRACE
    folder = Path("x")
    folder.mkdir()
    if case == "record gone":
        (folder / "traces").mkdir()
        shutil.copy(trace, folder / "traces" / "base.json.gz")
        shutil.copy("a/record.rank0.json.gz", folder / "samples.rank0.jsonl.gz")
        (folder / "report.json").write_text("{}")
    elif case == "traces":
        shutil.copy(trace, folder / "base.json.gz")
    elif case == "killed":
        shutil.copy("a/record.rank0.json.gz", folder / "record.rank0.partial.json.gz")
    for args in (["diff", "a", "x"], ["diff", "x", "a"]):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"stepscope: error: {message}") and err.count("\n") == 1, err


def test_the_gate_refuses_traces(tmp_path, capsys):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "tests/data/traces/reference/hta/trace_compare"
    assert main(["diff", str(root / "base"), str(root / "test"), "--fail-if-slower", "5"]) == 2
    assert "one trace per side has no noise bound" in capsys.readouterr().err
    assert main(["diff", str(root / "base"), str(root / "test"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "stepscope.trace_diff"


def test_runs_lists_and_plots_the_index(runs, capsys, tmp_path):
    from stepscope.record.run_index import add_run

    for index, name in enumerate(("a", "a2", "slow")):
        add_run({"run_dir": str(runs / name), "started_at": 1000.0 + index, "script": "train.py", "argv": "",
                 "tags": json.dumps(["base"] if name != "slow" else []), "steps": 120,
                 "step_time_s": 0.01 * (1 + index)})
    assert main(["runs"]) == 0
    out = capsys.readouterr().out
    assert out.count("train.py") == 3 and "3 run(s)" in out
    assert main(["runs", "--tag", "base", "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == 2
    assert main(["runs", "--plot", "step_time_s", "--html", str(tmp_path / "p.html")]) == 0
    assert "step_time_s over 3 run(s)" in capsys.readouterr().out
    assert (tmp_path / "p.html").read_text().count("<circle") == 3


@pytest.mark.parametrize("fmt, golden", [("text", "trace_compare.txt"), ("json", "trace_compare.json")])
def test_the_trace_diff_prints_what_it_printed_before_the_view(fmt, golden):
    """The trace diff through the pipeline's view and the render table prints, byte for byte, what
    the diff printed before (tests/data/golden_diff: made with the code before the redesign)."""
    from support import REPO_ROOT, run_cli

    result = run_cli(["diff", TRACE, "tests/data/traces/reference/hta/trace_compare/test/test.json.gz",
                      "--format", fmt], REPO_ROOT, env={"STEPSCOPE_INDEX": "off"})
    assert result.returncode == 0, result.stderr
    assert result.stdout == (REPO_ROOT / "tests/data/golden_diff" / golden).read_text(encoding="utf-8")
