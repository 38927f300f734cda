"""Every hostile input in tests/data/hostile through the command line: exit 2, one line, no traceback.

Small files run in-process (fast); the generated bombs run in a subprocess that reports its own
peak memory, so a bound on memory is a bound on that process alone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import cli_env

from stepscope.cli.main import main

HOSTILE = Path(__file__).resolve().parents[2] / "data" / "hostile"
sys.path.insert(0, str(HOSTILE))
import generate  # noqa: E402

TRACES = sorted((HOSTILE / "traces").iterdir())
RUNS = sorted(path for path in (HOSTILE / "runs").iterdir() if path.is_dir())
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _run(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_line_error(code: int, err: str, where: str) -> None:
    assert code == 2, err
    assert err.startswith("stepscope: error: ") and err.count("\n") == 1, err
    assert where in err and "Traceback" not in err


@pytest.mark.parametrize("trace", TRACES, ids=lambda path: path.name)
def test_damaged_traces(capsys, trace):
    code, _, err = _run(capsys, "analyze", str(trace), "--no-progress")
    _one_line_error(code, err, str(trace))


@pytest.mark.parametrize("run_dir", RUNS, ids=lambda path: path.name)
def test_damaged_runs(capsys, run_dir):
    code, _, err = _run(capsys, "report", str(run_dir))
    _one_line_error(code, err, str(run_dir))


def test_valid_run_reports(capsys):
    code, _, err = _run(capsys, "report", str(HOSTILE / "valid_run"))
    assert code == 0, err


def test_max_bytes_option_sets_the_limit_for_that_command_only(capsys):
    code, _, err = _run(capsys, "report", str(HOSTILE / "valid_run"), "--max-bytes", "1K")
    _one_line_error(code, err, "exceeds the limit of 1 KiB")
    code, _, err = _run(capsys, "report", str(HOSTILE / "valid_run"))  # back to the default
    assert code == 0, err


def test_special_files_are_refused_not_read(capsys, tmp_path):
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        code, _, err = _run(capsys, "analyze", str(path))  # used to block on the FIFO, read /dev/zero forever
        _one_line_error(code, err, "not a regular file")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / "record.rank0.json.gz")
    code, _, err = _run(capsys, "report", str(run_dir))
    _one_line_error(code, err, "not a regular file")
    (run_dir / "record.rank0.json.gz").unlink()
    (run_dir / "record.rank0.json.gz").symlink_to("/dev/zero")
    code, _, err = _run(capsys, "report", str(run_dir))
    _one_line_error(code, err, "not a regular file")


def test_analyze_output_paths(capsys, tmp_path):
    trace = tmp_path / "t.json"
    trace.write_bytes((HOSTILE.parent / "traces" / "cpu_plain.pt.trace.json").read_bytes())
    before = trace.read_bytes()
    code, _, err = _run(capsys, "analyze", str(trace), "-o", str(trace))
    _one_line_error(code, err, "would be overwritten")
    code, _, err = _run(capsys, "analyze", str(tmp_path), "-o", str(tmp_path / "." / "t.json"))
    _one_line_error(code, err, "would be overwritten")
    assert trace.read_bytes() == before
    code, _, err = _run(capsys, "analyze", str(trace), "-o", str(tmp_path / "missing" / "out.txt"))
    _one_line_error(code, err, "cannot write the output file")
    code, _, err = _run(capsys, "analyze", str(trace), "--max-bytes", "lots")
    _one_line_error(code, err, "invalid size")


def test_escapes_never_reach_the_terminal(capsys):
    code, out, err = _run(capsys, "analyze", str(HOSTILE / "escapes" / "escape_names.json"), "--top", "5")
    assert code == 0, err
    assert "aten::mm\\x1b" in out and "gemm_kernel\\x1b" in out and not CONTROL.search(out + err)
    code, out, err = _run(capsys, "analyze", str(HOSTILE / "escapes" / "escape_names.json"), "--format", "json")
    assert code == 0 and json.loads(out) and "aten::mm\\u001b]0;pwned\\u0007" in out  # raw in JSON, JSON-escaped
    code, out, err = _run(capsys, "report", str(HOSTILE / "escapes" / "escape_run"))
    assert code == 0, err
    assert "DS\\x1b]0;pwned\\x07" in out + err and "note\\x1b]0;pwned" in out + err
    assert not CONTROL.search(out + err)


# The peak RSS of this process alone: VmHWM belongs to the address space exec created, whereas
# RUSAGE_SELF's ru_maxrss also keeps the high-water mark of the (large) pytest worker it was forked
# from. Processes it starts itself are counted through RUSAGE_CHILDREN.
_PEAK = ("import re, resource, sys\n"
         "from stepscope.cli.main import main\n"
         "code = main(sys.argv[2:])\n"
         "own = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
         "peak = max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
         "open(sys.argv[1], 'w').write(str(peak))\n"
         "sys.exit(code)\n")


def _generated():
    for name, make in generate.TRACES.items():
        yield name, (lambda out, make=make, name=name: ["analyze", str(make(out / name)), "--no-progress"])
    for name, make in generate.RUNS.items():
        yield name, (lambda out, make=make, name=name: ["report", str(make(out / name).parent)])
    for name, make in generate.RUNS_WITH_RECORD.items():
        record = HOSTILE / "valid_run" / "record.rank0.json.gz"
        yield name, (lambda out, make=make, name=name: ["report", str(make(out / name, record).parent)])


@pytest.mark.slow  # a subprocess per bomb; test_trace_limits.py covers the same limits in-process, fast
@pytest.mark.parametrize("name, build", list(_generated()), ids=[name for name, _ in _generated()])
def test_generated_bombs_with_the_default_limits(tmp_path, name, build):
    """5 GiB behind a few MB of gzip: refused within a minute, in well under 1 GiB (it was minutes, or MemoryError)."""
    args = build(tmp_path)
    peak_file = tmp_path / "peak"
    env = cli_env()
    env.pop("STEPSCOPE_MAX_BYTES", None)
    result = subprocess.run([sys.executable, "-c", _PEAK, str(peak_file), *args], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith("stepscope: error: ") and result.stderr.count("\n") == 1, result.stderr[-2000:]
    peak_kib = int(peak_file.read_text())
    assert peak_kib < 768 * 1024, peak_kib
