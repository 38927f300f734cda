"""`stepscope gpu-procs`: real processes (active, orphaned, zombie, another user's) behind a fake NVML."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest
from fakes.fake_nvml import FakeGpu, FakeNvml

import stepscope.capture.gpu as gpu_layer
from stepscope.cli import gpu_procs_cmd
from stepscope.capture.gpu_procs import GpuProcessView, end_processes, stale_reason
from stepscope.cli.main import main

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="starts and inspects Linux processes")


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def orphan(uid: int | None = None, device: str | None = None) -> int:
    """A ``sleep`` whose parent and job leader have exited (what a dead job's worker looks like).

    With ``device``, the sleep holds that file open, as a CUDA process holds /dev/nvidia*.
    """
    stdin = f"<{device}" if device else "</dev/null"
    shell = subprocess.Popen(["sh", "-c", f"sleep 60 {stdin} >/dev/null 2>&1 & echo $!"], stdout=subprocess.PIPE,
                             start_new_session=True, preexec_fn=(lambda: os.setuid(uid)) if uid is not None else None)
    pid = int(shell.stdout.readline())
    shell.wait()
    shell.stdout.close()
    for _ in range(500):  # until the forked shell has redirected and exec'd sleep
        try:
            if psutil.Process(pid).cmdline()[:1] == ["sleep"] and (
                    device is None or os.readlink(f"/proc/{pid}/fd/0") == device):
                break
        except (psutil.Error, OSError):
            pass
        time.sleep(0.01)
    return pid


def free_pid() -> int:
    pid = 4_000_000
    while psutil.pid_exists(pid):
        pid -= 1
    return pid


@pytest.fixture
def device(monkeypatch):
    """A file standing for /dev/nvidia0 (readable by every user), and this pid namespace taken as the host's."""
    folder = tempfile.mkdtemp(prefix="stepscope-dev-")
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "nvidia0")
    with open(path, "wb"):
        pass
    os.chmod(path, 0o644)
    monkeypatch.setattr(gpu_layer, "GPU_DEVICE_PREFIXES", (os.path.join(folder, "nvidia"),))
    monkeypatch.setattr(gpu_layer, "HOST_PID_NAMESPACE", os.readlink("/proc/self/ns/pid"))
    yield path
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def scene(monkeypatch, device):
    """An active child, an orphan, a zombie and a pid from another namespace, all "on the GPU"."""
    with open(device, "rb") as held:
        active = subprocess.Popen(["sleep", "60"], stdin=held)
    zombie = subprocess.Popen(["true"])
    lost = orphan(device=device)
    for _ in range(100):  # until `true` has exited and waits to be reaped
        if psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.02)
    invisible = free_pid()
    nvml = FakeNvml([FakeGpu(compute=[(active.pid, 1 << 30), (lost, 2 << 30), (invisible, None)]),
                     FakeGpu(uuid="GPU-2", compute=[(zombie.pid, 512 << 20)], graphics=[(active.pid, 1 << 20)])])
    monkeypatch.setattr(gpu_layer, "load_nvml", lambda: nvml)
    pids = {"active": active.pid, "orphan": lost, "zombie": zombie.pid, "invisible": invisible}
    yield pids
    for pid in (active.pid, lost):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    active.wait()
    zombie.wait()


def test_without_nvml_it_says_no_gpu_is_visible_and_exits_0():
    result = subprocess.run([sys.executable, "-m", "stepscope", "gpu-procs"], capture_output=True, text=True,
                            timeout=60, stdin=subprocess.DEVNULL)
    if result.returncode == 0 and "No NVIDIA GPU" not in result.stdout:
        pytest.skip("this machine has an NVIDIA GPU")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("No NVIDIA GPU is visible here")


def test_lists_processes_and_which_look_stale(capsys, scene):
    code, out, _ = run_main(capsys, "gpu-procs", "--json")
    assert code == 0
    rows = {row["pid"]: row for row in json.loads(out)}
    active, lost = rows[scene["active"]], rows[scene["orphan"]]
    assert active["stale"] is None and active["gpus"] == [0, 1] and active["gpu_memory_bytes"] == (1 << 30) + (1 << 20)
    assert active["ppid"] == os.getpid() and active["command"] == "sleep 60" and active["user"]
    assert active["age_s"] >= 0
    assert "gone" in lost["stale"] and "idle" in lost["stale"] and lost["gpu_memory_bytes"] == 2 << 30
    assert rows[scene["zombie"]]["stale"].startswith("zombie")
    assert rows[scene["invisible"]]["visible"] is False and rows[scene["invisible"]]["stale"] is None


def test_table_output(capsys, scene):
    code, out, _ = run_main(capsys, "gpu-procs")
    assert code == 0
    assert "stale?" in out and "GPU mem" in out and str(scene["orphan"]) in out and "2.00 GiB" in out
    assert "[true]" in out  # a zombie's command, not read as markup


def test_kill_ends_only_your_stale_processes(capsys, scene):
    os.kill(scene["orphan"], signal.SIGSTOP)  # suspended too: SIGTERM must still get through
    code, out, _ = run_main(capsys, "gpu-procs", "--kill", "--yes")
    assert code == 0
    assert f"pid {scene['orphan']}: ended" in out
    assert not psutil.pid_exists(scene["orphan"]) or psutil.Process(scene["orphan"]).status() == psutil.STATUS_ZOMBIE
    assert psutil.Process(scene["active"]).is_running()
    assert f"left alone: pid {scene['zombie']} is a zombie" in out


def test_kill_leaves_alone_a_process_nvml_lists_that_holds_no_gpu_device(capsys, monkeypatch, device):
    idle = orphan()  # stale-looking, but never opened a GPU: NVML's list was wrong (or the pid reused)
    try:
        monkeypatch.setattr(gpu_layer, "load_nvml", lambda: FakeNvml([FakeGpu(compute=[(idle, 1 << 30)])]))
        code, out, _ = run_main(capsys, "gpu-procs", "--kill", "--yes")
        assert code == 0
        assert f"left alone: pid {idle}: holds no GPU device file" in out.replace("\n", " ")
        assert psutil.Process(idle).is_running() and psutil.Process(idle).status() != psutil.STATUS_ZOMBIE
    finally:
        os.kill(idle, signal.SIGKILL)


def test_kill_refuses_host_pids_it_cannot_match_from_a_container(capsys, monkeypatch, scene):
    monkeypatch.setattr(gpu_layer, "HOST_PID_NAMESPACE", "pid:[1]")  # as if this ran in a container
    code, out, _ = run_main(capsys, "gpu-procs", "--kill", "--yes")
    assert code == 0 and "Nothing to end" in out
    assert "pid namespace other than the host's" in out.replace("\n", " ")
    assert psutil.Process(scene["orphan"]).is_running()


def test_gpu_device_and_pid_namespace_checks_on_real_processes(device):
    with open(device, "rb") as held:
        holder = subprocess.Popen(["sleep", "60"], stdin=held)
    plain = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)
    try:
        assert gpu_layer.holds_gpu_device(holder.pid) is True
        assert gpu_layer.holds_gpu_device(plain.pid) is False
        assert gpu_layer.holds_gpu_device(free_pid()) is None
        assert gpu_layer.nvml_pid_problem(holder.pid) is None
        assert "NSpid" in gpu_layer.nvml_pid_problem(free_pid())
    finally:
        for process in (holder, plain):
            process.kill()
            process.wait()


def test_json_without_a_gpu_is_json():
    result = subprocess.run([sys.executable, "-m", "stepscope", "gpu-procs", "--json"], capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)
    if "No NVIDIA GPU" not in result.stderr and "no NVIDIA GPU" not in result.stderr:
        pytest.skip("this machine has an NVIDIA GPU")
    assert result.returncode == 0 and json.loads(result.stdout) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a process as another user")
def test_kill_never_touches_another_users_process(capsys, monkeypatch, device):
    theirs = orphan(uid=65534, device=device)
    try:
        nvml = FakeNvml([FakeGpu(compute=[(theirs, 1 << 30)])])
        monkeypatch.setattr(gpu_layer, "load_nvml", lambda: nvml)
        code, out, _ = run_main(capsys, "gpu-procs", "--kill", "--yes")
        assert code == 0
        assert f"left alone: pid {theirs} belongs to nobody" in out
        assert "Nothing to end" in out
        assert psutil.Process(theirs).is_running()
    finally:
        os.kill(theirs, signal.SIGKILL)


def test_kill_asks_first_and_no_means_no(capsys, scene, monkeypatch):
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr("builtins.input", lambda question: "n")
    code, out, _ = run_main(capsys, "gpu-procs", "--kill")
    assert code == 0 and "Nothing ended" in out
    assert psutil.Process(scene["orphan"]).is_running()
    monkeypatch.setattr("builtins.input", lambda question: "y")
    code, out, _ = run_main(capsys, "gpu-procs", "--kill")
    assert f"pid {scene['orphan']}: ended" in out


def test_kill_without_a_terminal_needs_yes(capsys, scene, monkeypatch):
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False, raising=False)
    code, _, err = run_main(capsys, "gpu-procs", "--kill")
    assert code == 2 and err.startswith("stepscope: error: --kill asks") and err.count("\n") == 1
    assert psutil.Process(scene["orphan"]).is_running()


def test_yes_alone_is_a_usage_error(capsys):
    code, _, err = run_main(capsys, "gpu-procs", "--yes")
    assert code == 2 and "--yes confirms --kill" in err


def test_a_reused_pid_is_left_alone():
    process = subprocess.Popen(["sleep", "60"])
    try:
        view = GpuProcessView(process.pid, 1, os.getuid(), "me", "sleep", (0,), 1, 1.0, "sleeping", "stale",
                              create_time=psutil.Process(process.pid).create_time() - 100)
        assert end_processes([view]) == [(process.pid, "reused")]
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()


def test_no_gpu_processes(capsys, monkeypatch):
    monkeypatch.setattr(gpu_layer, "load_nvml", lambda: FakeNvml([FakeGpu(), FakeGpu(uuid="GPU-2")]))
    code, out, _ = run_main(capsys, "gpu-procs")
    assert code == 0 and "No process holds memory on the 2 GPUs" in out


FACTS = {"state": "sleeping", "parent_alive": True, "parent_name": "bash", "parent_state": "sleeping",
         "group_leader_alive": True, "cpu_util": 0.0}


@pytest.mark.parametrize("change, expected", [
    ({}, None),
    ({"state": "zombie"}, "zombie"),
    ({"parent_alive": False, "group_leader_alive": False}, "parent gone; idle"),
    ({"parent_name": "systemd", "group_leader_alive": False}, "parent gone"),
    ({"parent_name": "init"}, None),  # a child of pid 1 whose job leader lives: a service, a container's workload
    ({"parent_name": "systemd", "parent_orphaned": True}, None),
    ({"parent_state": "zombie"}, "parent exited"),
    ({"group_leader_alive": False}, "job leader gone"),
    ({"group_leader_alive": False, "parent_orphaned": False}, None),  # parent has a live launcher
    ({"group_leader_alive": False, "cpu_util": 0.9}, None),  # busy: a nohup job, not a leftover
    ({"parent_name": "tini", "cpu_util": 0.01, "group_leader_alive": False}, "parent gone"),
])
def test_stale_reason(change, expected):
    reason = stale_reason(**{**FACTS, **change})
    assert (reason is None) if expected is None else reason.startswith(expected)


def test_module_is_registered():
    from stepscope.cli.main import COMMANDS

    assert COMMANDS["gpu-procs"] == "gpu_procs_cmd" and COMMANDS["monitor"] == "monitor_cmd"
    assert gpu_procs_cmd.add_parser


def test_command_lines_reach_the_terminal_escaped(capsys, monkeypatch):
    hostile = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "\x1b]0;pwned\x07\x1b[2J"])
    try:
        monkeypatch.setattr(gpu_layer, "load_nvml", lambda: FakeNvml([FakeGpu(compute=[(hostile.pid, 1 << 20)])]))
        for _ in range(200):  # until the child has exec'd python with its arguments
            if "pwned" in " ".join(psutil.Process(hostile.pid).cmdline()):
                break
            time.sleep(0.01)
        code, out, _ = run_main(capsys, "gpu-procs")
        assert code == 0 and "\x1b" not in out and "\\x1b]0;pwned\\x07" in "".join(out.split())  # folded cells
        code, out, _ = run_main(capsys, "gpu-procs", "--json")
        assert json.loads(out)[0]["command"].endswith("\x1b]0;pwned\x07\x1b[2J")  # raw in JSON
    finally:
        hostile.kill()
        hostile.wait()
