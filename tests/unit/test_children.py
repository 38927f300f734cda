"""Children with a deadline, in their own process group: nothing of a child outlives its deadline,
its own end, or an interruption of stepscope (real processes, short deadlines)."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from stepscope import children

#: A child that starts a grandchild, writes both pids, ignores SIGTERM (so only SIGKILL ends it)
#: and never ends.
STUBBORN = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(sys.argv[1], "w") as out:
        out.write(f"{os.getpid()} {os.getpgid(0)} {grandchild.pid}")
    while True:
        time.sleep(0.1)
""")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def wait_for(path: Path, limit_s: float = 30.0) -> list[int]:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if path.exists() and path.read_text().strip():
            return [int(item) for item in path.read_text().split()]
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def test_a_child_past_its_deadline_is_stopped_with_its_whole_group(tmp_path):
    pids = tmp_path / "pids"
    started = time.monotonic()
    outcome = children.run([sys.executable, "-c", STUBBORN, str(pids)], deadline_s=3.0, grace_s=0.5)
    took = time.monotonic() - started
    leader, group, grandchild = wait_for(pids)
    assert outcome.timed_out and outcome.returncode is None
    assert outcome.describe() == "timed out after 3.0 s (stopped with its process group)"
    assert group == leader != os.getpgid(0)  # its own group
    assert took < 3.0 + 0.5 + 2.0, took  # SIGTERM ignored: SIGKILL after the grace period
    assert not alive(leader) and not alive(grandchild) and children.group_members(group) == []


def test_what_a_child_leaves_behind_when_it_ends_is_stopped(tmp_path):
    pids = tmp_path / "pids"
    script = ("import os, subprocess, sys; g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
              "open(sys.argv[1], 'w').write(f'{os.getpgid(0)} {g.pid}'); sys.exit(3)")
    outcome = children.run([sys.executable, "-c", script, str(pids)], deadline_s=30)
    group, grandchild = wait_for(pids)
    assert outcome.returncode == 3 and not outcome.timed_out and outcome.describe() == "exit 3"
    assert not alive(grandchild) and children.group_members(group) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_stepscope_stops_the_child_and_goes_on_as_stopped(tmp_path, signum):
    pids = tmp_path / "pids"
    before = signal.getsignal(signum)

    def terminate_once_started() -> None:
        wait_for(pids)
        os.kill(os.getpid(), signum)

    threading.Thread(target=terminate_once_started, daemon=True).start()
    with pytest.raises(children.Stopped) as raised, children.stop_on_signals():
        children.run([sys.executable, "-c", STUBBORN, str(pids)], deadline_s=60, grace_s=0.5)
    leader, group, grandchild = wait_for(pids)
    assert raised.value.signum == signum
    assert signal.getsignal(signum) == before  # the previous handler is back
    assert not alive(leader) and not alive(grandchild) and children.group_members(group) == []


def test_a_function_in_a_forked_child_returns_raises_or_times_out(tmp_path):
    outcome, value = children.call(lambda: (os.getpid() == os.getpgid(0), os.getpid()), deadline_s=30)
    (leads_its_group, pid), = [value]
    assert outcome.ok and leads_its_group and pid != os.getpid()

    def refuse() -> None:
        raise ValueError("no data here")

    with pytest.raises(ValueError, match="no data here"):
        children.call(refuse, deadline_s=30)

    marker = tmp_path / "pid"

    def hang() -> None:
        marker.write_text(str(os.getpid()))
        while True:
            time.sleep(0.1)

    started = time.monotonic()
    outcome, value = children.call(hang, deadline_s=1.0, grace_s=0.5)
    assert value is None and outcome.timed_out and time.monotonic() - started < 1.0 + 0.5 + 2.0
    assert not alive(int(marker.read_text()))
