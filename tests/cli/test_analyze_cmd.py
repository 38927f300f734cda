"""`stepscope analyze`: text and JSON output, findings, bad input (one line, exit 2)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from stepscope.cli.main import main
from stepscope.diagnosis import engine
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
TRAIN = DATA / "cpu_train.pt.trace.json.gz"


def _rule(context):
    share = context.trace.shares.cpu_exec
    return Finding(
        rule_id="test.cpu_exec", family="compute", title="Host [bold]CPU[/bold] execution dominates",
        severity=Severity.MEDIUM, impact=share, confidence=0.8,
        evidence=(Evidence("cpu_exec_share", round(share, 3), 0.5, source="trace"),),
        prescriptions=(Prescription(action="Move the model to a GPU", why="the step is CPU-bound"),),
    )


@pytest.fixture
def one_rule(monkeypatch):
    monkeypatch.setattr(engine, "RULES", (_rule,))


def test_text_output_with_findings(capsys, one_rule):
    assert main(["analyze", str(TRAIN), "--top", "3"]) == 0
    out = capsys.readouterr().out
    for text in ("Verdict", "Step time breakdown", "DataLoader", "CPU Exec", "Top operators"):
        assert text in out
    assert "Host [bold]CPU[/bold] execution dominates" in out  # trace/rule text is never markup
    assert "Move the model to a GPU" in out


def test_json_output(capsys, one_rule, tmp_path):
    assert main(["analyze", str(TRAIN), "--format", "json", "--group-by-shape"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["kind"], doc["source"]) == ("stepscope.report", "trace")  # the envelope report.json has
    assert doc["findings"][0]["rule_id"] == "test.cpu_exec" and doc["diagnosis"]["complete"] is True
    assert doc["trace_analysis"]["schema"] == "stepscope.analyze/1"
    (views,) = doc["trace_analysis"]["ranks"]
    assert set(views["overview"]["mean_share"]) >= {"Kernel", "DataLoader", "CPU Exec", "Other"}
    assert views["operators"]["grouped_by_shape"] is True
    assert views["temporal"] is None and views["comm_overlap"]["overlap_share"] is None
    (rank,) = doc["ranks"]
    assert rank["trace"]["steps"] == 4
    assert rank["findings"][0]["rule_id"] == "test.cpu_exec"
    out = tmp_path / "analysis.json"
    assert main(["analyze", str(TRAIN), "--format", "json", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["ranks"][0]["rank"] == 0


def test_directory_and_rank_selection(capsys, tmp_path):
    doc = json.loads(gzip.decompress(TRAIN.read_bytes()))
    for rank in (0, 1):
        doc["distributedInfo"] = {"rank": rank, "world_size": 2}
        (tmp_path / f"w{rank}.json").write_text(json.dumps(doc))
    assert main(["analyze", str(tmp_path), "--format", "json", "--rank", "1"]) == 0
    parsed = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in parsed["ranks"]] == [1]
    assert [r["rank"] for r in parsed["trace_analysis"]["ranks"]] == [1]
    assert len(parsed["trace_analysis"]["comparison"]["ranks"]) == 2
    assert main(["analyze", str(tmp_path)]) == 0
    assert "Straggler candidates" in capsys.readouterr().out
    assert main(["analyze", str(tmp_path), "--rank", "7"]) == 2
    assert "no trace for rank 7" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content", [b"", b"{not json", b'{"a": 1}', b"\x1f\x8bnot gzip", b'{"traceEvents": [{"ph": "X", "ts": 1']
)
def test_bad_input_is_one_line_exit_2(capsys, tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stepscope: error: ") and str(path) in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_empty_directory_and_missing_path(capsys, tmp_path):
    assert main(["analyze", str(tmp_path)]) == 2
    assert "no .json" in capsys.readouterr().err
    assert main(["analyze", str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_ranks_on_worker_processes_print_the_same_document(capsys, tmp_path):
    doc = json.loads(gzip.decompress(TRAIN.read_bytes()))
    for rank in range(3):
        doc["distributedInfo"] = {"rank": rank, "world_size": 3}
        (tmp_path / f"w{rank}.json").write_text(json.dumps(doc))
    outputs = []
    for jobs in ("1", "3"):
        assert main(["analyze", str(tmp_path), "--format", "json", "--jobs", jobs]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1] and len(outputs[0]["trace_analysis"]["ranks"]) == 3
    assert main(["analyze", str(tmp_path), "--jobs", "0"]) == 2
    assert "--jobs must be >= 1" in capsys.readouterr().err


def test_unreachable_dask_scheduler_is_one_line_exit_2(tmp_path):
    """In a process of its own: Dask leaves its IO loop's thread in the process that tried to connect,
    and a process with another thread never forks (tests of the forked children would see no fork)."""
    pytest.importorskip("distributed", reason="Dask's distributed is the optional engine (stepscope[dask])")
    from support import run_cli

    done = run_cli(["analyze", str(TRAIN), "--dask", "tcp://127.0.0.1:9"], tmp_path)
    assert done.returncode == 2
    err = done.stderr
    assert err.startswith("stepscope: error: cannot reach the Dask scheduler at tcp://127.0.0.1:9")
    assert len(err.strip().splitlines()) == 1


def test_dask_without_the_extra_is_one_line_exit_2(capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "distributed", None)  # as if stepscope[dask] were not installed
    assert main(["analyze", str(TRAIN), "--dask", "local"]) == 2
    err = capsys.readouterr().err
    assert err == "stepscope: error: --dask needs Dask's distributed scheduler: pip install 'stepscope[dask]'\n"


def test_the_progress_bar_draws_without_a_thread(monkeypatch):
    """The bar is drawn from the load's callback: no drawing thread, so the load's workers and the
    views' child can be forked (beside.py refuses to fork beside another thread)."""
    import argparse
    import io
    import sys
    import threading

    from stepscope.cli import analyze_cmd

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Tty()
    monkeypatch.setattr(sys, "stderr", screen)
    progress, callback = analyze_cmd._progress(argparse.Namespace(no_progress=False))
    total = analyze_cmd.PROGRESS_MIN_BYTES
    before = threading.active_count()
    try:
        callback("a.json", total // 2, total)
        assert threading.active_count() == before
        callback("a.json", total, total)
        assert "loading a.json" in screen.getvalue() and "33.6/33.6 MB" in screen.getvalue()
    finally:
        progress.stop()
    assert threading.active_count() == before


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_reader_that_goes_away_ends_the_output_quietly(fmt):
    """``stepscope analyze TRACE | head``: the reader is gone before the first line is written (it
    closed the pipe at once), so that write fails; the process ends with the status the shell reports
    for a process ended by SIGPIPE (141) and nothing on stderr: no traceback, no second error at exit."""
    import subprocess
    import sys

    from support import cli_env

    proc = subprocess.Popen([sys.executable, "-m", "stepscope", "analyze", str(TRAIN), "--format", fmt],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == "", err


@pytest.mark.parametrize("entry", ["module", "console"])
def test_the_console_script_ends_analyze_without_teardown_and_loses_no_output(tmp_path, entry):
    """`analyze` ends by os._exit once its output is flushed (stepscope.cli.main.QUICK_EXIT_COMMANDS):
    the text redirected to a file is the whole text `-o` writes, the status is the command's, and a
    user mistake still ends in one line and exit 2."""
    import subprocess
    import sys

    from support import CONSOLE_SCRIPT, cli_env, run_cli

    to_file = tmp_path / "written.txt"
    done = run_cli(["analyze", str(TRAIN), "-o", str(to_file)], tmp_path, entry=entry)
    assert done.returncode == 0, done.stderr
    prefix = [sys.executable, "-m", "stepscope"] if entry == "module" else [str(CONSOLE_SCRIPT)]
    redirected = tmp_path / "redirected.txt"
    with redirected.open("w") as out:
        code = subprocess.run([*prefix, "analyze", str(TRAIN)], stdout=out, stderr=subprocess.PIPE, text=True,
                              env=cli_env(), timeout=240)
    assert code.returncode == 0 and code.stderr == "", code.stderr
    assert redirected.read_text() == to_file.read_text() and "Verdict" in to_file.read_text()
    missing = run_cli(["analyze", str(tmp_path / "missing.json")], tmp_path, entry=entry)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "missing.json" in missing.stderr


def test_only_commands_that_run_no_user_code_end_without_teardown():
    from stepscope.cli import main as cli

    assert "run" not in cli.QUICK_EXIT_COMMANDS and "try" not in cli.QUICK_EXIT_COMMANDS
    assert cli.QUICK_EXIT_COMMANDS <= set(cli.COMMANDS)
    assert main(["analyze", str(TRAIN), "--top", "1"]) == 0 and cli.exits_quickly()
    assert main(["demo", "--list"]) == 0 and not cli.exits_quickly()
