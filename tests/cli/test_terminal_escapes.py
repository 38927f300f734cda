"""Paths with control characters in stepscope's own message lines: the "wrote …" lines of the
exports and every ``stepscope: error:`` line show them escaped (``\\x1b``), never raw — a crafted
directory name must not recolour or retitle the terminal."""

from __future__ import annotations

import importlib.util

import pytest
from html_records import synthetic_run

from stepscope.cli.main import main
from stepscope.record import layout
from stepscope.record.store import save_record

CRAFTED = "run\x1b]0;pwned\x07\x1b[31m\u202e"
HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


def _assert_escaped(text: str) -> None:
    for raw in ("\x1b", "\x07", "\u202e"):
        assert raw not in text, text
    assert "\\x1b]0;pwned\\x07\\x1b[31m\\u202e" in text, text


@pytest.fixture
def crafted_run(tmp_path):
    run = tmp_path / CRAFTED
    run.mkdir()
    save_record(synthetic_run(60, samples=False), layout.record_path(run, 0))
    return run


def test_report_export_lines_are_escaped(crafted_run, capsys):
    args = ["report", str(crafted_run), "--html", "--perfetto", str(crafted_run / "trace.json")]
    if HAS_TENSORBOARD:
        args += ["--tensorboard", str(crafted_run / "tb")]
    assert main(args) == 0
    err = capsys.readouterr().err
    wrote = [line for line in err.splitlines() if line.startswith("stepscope: wrote ")]
    assert len(wrote) == (3 if HAS_TENSORBOARD else 2), err
    for line in wrote:
        _assert_escaped(line)


def test_diff_and_runs_wrote_lines_are_escaped(crafted_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("STEPSCOPE_INDEX", "off")
    assert main(["diff", str(crafted_run), str(crafted_run), "--html", str(crafted_run / "diff.html")]) == 0
    wrote = [line for line in capsys.readouterr().err.splitlines() if line.startswith("stepscope: wrote ")]
    assert len(wrote) == 1
    _assert_escaped(wrote[0])
    assert main(["runs", "--index", str(tmp_path / "runs.sqlite"), "--plot", "step_time_s",
                 "--html", str(crafted_run / "plot.html")]) == 0
    wrote = [line for line in capsys.readouterr().err.splitlines() if line.startswith("stepscope: wrote ")]
    assert len(wrote) == 1
    _assert_escaped(wrote[0])


@pytest.mark.parametrize("command", [
    ["report", "{dir}/missing"],
    ["analyze", "{dir}/missing.json"],
    ["diff", "{dir}/a", "{dir}/b"],
    ["runs", "--index", "{dir}/x/runs.sqlite", "--reindex", "{dir}/nowhere"],
    ["report", "{dir}", "--html", "-o", "{dir}/no/such/dir/r.html"],
])
def test_error_lines_that_name_a_path_are_escaped(crafted_run, capsys, command):
    code = main([part.format(dir=crafted_run) for part in command])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("stepscope: error: ") and err.count("\n") == 1, err
    _assert_escaped(err)


def test_argparse_errors_are_escaped(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["runs", "x\x1b]0;pwned\x07\x1b[31m\u202e"])  # "unrecognized arguments: …" echoes it
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.startswith("stepscope: error: ") and err.count("\n") == 1
    assert "\x1b" not in err and "\\x1b]0;pwned" in err
