"""`stepscope monitor`: one frame for scripts, the live view in a real terminal, bad input."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import psutil
import pytest
from fakes.fake_nvml import FakeGpu, FakeNvml

import stepscope.capture.gpu as gpu_layer
from stepscope.cli.main import main

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses Linux /proc and a pty")

ENTRY_POINTS = {
    "stepscope": [str(Path(sys.executable).with_name("stepscope"))],
    "python -m stepscope": [sys.executable, "-m", "stepscope"],
}


def run_cli(entry: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*ENTRY_POINTS[entry], *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse errors exit through the parser
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_once_json_prints_one_frame(entry):
    result = run_cli(entry, "monitor", "--once", "--json", "--interval", "0.3")
    assert result.returncode == 0, result.stderr
    frame = json.loads(result.stdout)
    assert len(frame["core_utils"]) == psutil.cpu_count()
    assert all(value is None or 0 <= value <= 1 for value in frame["core_utils"])
    assert frame["mem_total_bytes"] == psutil.virtual_memory().total
    assert 0.25 < frame["seconds"] < 2
    assert frame["processes"] and {"pid", "cpu_util", "rss_bytes", "command"} <= set(frame["processes"][0])
    assert isinstance(frame["disks"], list) and isinstance(frame["gpus"], list)


def test_once_renders_cpu_bars_and_processes(capsys):
    code, out, _ = run_main(capsys, "monitor", "--once", "--interval", "0.2")
    assert code == 0
    assert "cpu0" in out and "mem" in out and "command" in out


@pytest.mark.parametrize("args, message", [
    (["--pid", "999999999"], "no such process"),
    (["--pid", "0"], "no such process"),
    (["--interval", "0"], "positive"),
    (["--interval", "-1", "--once"], "positive"),
    (["--interval", "nan", "--once"], "positive"),
    (["--interval", "soon"], "invalid float value"),
    (["--json"], "--once"),
    (["--top", "0", "--once"], "--top"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    code, out, err = run_main(capsys, "monitor", *args)
    assert code == 2
    assert err.startswith("stepscope: error:") and message in err and err.count("\n") == 1
    assert out == ""


def test_missing_pid_from_the_command_line():
    result = run_cli("python -m stepscope", "monitor", "--pid", "999999999", "--once")
    assert result.returncode == 2 and result.stderr.startswith("stepscope: error: --pid 999999999")


def test_pid_focuses_on_one_process_tree_with_its_gpu_memory(capsys, monkeypatch, children):
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, time\n"
                               "subprocess.Popen(['sleep', '30'])\ntime.sleep(30)"])
    children.append(parent)
    time.sleep(0.5)
    nvml = FakeNvml([FakeGpu(util=77, compute=[(parent.pid, 3 << 30)])])
    monkeypatch.setattr(gpu_layer, "load_nvml", lambda: nvml)
    code, out, _ = run_main(capsys, "monitor", "--pid", str(parent.pid), "--once", "--json", "--interval", "0.2")
    assert code == 0
    frame = json.loads(out)
    rows = {row["pid"]: row for row in frame["processes"]}
    assert rows[parent.pid]["role"] == "main" and rows[parent.pid]["gpu_memory_bytes"] == 3 << 30
    (child,) = [row for pid, row in rows.items() if pid != parent.pid]
    assert child["name"] == "sleep" and child["role"] == "other" and child["ppid"] == parent.pid
    (gpu,) = frame["gpus"]
    assert gpu["util"] == pytest.approx(0.77) and gpu["power_w"] == pytest.approx(300.0)
    assert gpu["pcie_tx_bytes_per_s"] == 1000 * 1024
    for child_pid in [pid for pid in rows if pid != parent.pid]:
        os.kill(child_pid, signal.SIGKILL)


def test_pid_view_ends_with_the_process(children):
    target = subprocess.Popen(["sleep", "1"])
    children.append(target)
    result = subprocess.run([sys.executable, "-m", "stepscope", "monitor", "--pid", str(target.pid),
                             "--interval", "0.2"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    assert f"process {target.pid} has ended" in result.stdout


def spawn_in_terminal(*args: str) -> tuple[int, int]:
    """Start ``stepscope monitor`` in a new pseudo-terminal of 120x40; returns (pid, master fd)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: its controlling terminal is the pty
        os.execv(sys.executable, [sys.executable, "-m", "stepscope", "monitor", *args])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    return pid, fd


def read_until(fd: int, needle: bytes, timeout_s: float = 60) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout_s
    while needle not in data and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                data += os.read(fd, 65536)
            except OSError:
                break
    assert needle in data, data[-2000:]
    return data


def wait_exit(pid: int, fd: int, timeout_s: float = 15) -> tuple[int, bytes]:
    data = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            try:
                data += os.read(fd, 65536)
            except OSError:
                pass
        if done:
            os.close(fd)
            return os.waitstatus_to_exitcode(status), data
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("monitor did not quit")


@pytest.mark.parametrize("key", [b"q", b"\x03"], ids=["q", "ctrl-c"])
def test_live_view_quits_cleanly(key):
    pid, fd = spawn_in_terminal("--interval", "0.2")
    screen = read_until(fd, b"cpu0")
    assert b"\x1b[?1049h" in screen  # the alternate screen, like top
    os.write(fd, key)
    code, rest = wait_exit(pid, fd)
    assert code == 0
    assert b"\x1b[?1049l" in rest  # the terminal is given back
    assert b"Traceback" not in screen + rest
