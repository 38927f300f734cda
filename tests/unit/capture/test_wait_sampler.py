"""What the training thread sleeps in, sampled off the GIL by the C extension's thread: each kind of
wait is named, tagged with the recorder's open step and phase, and counted per step and phase."""

from __future__ import annotations

import os
import threading
import time
from array import array

import pytest

from stepscope.capture import account as account_module
from stepscope.capture.recorder import FASTREC, PHASE_NAMES
from stepscope.record.run import PHASES, WAIT_CLASSES

pytestmark = pytest.mark.skipif(FASTREC is None or not os.path.exists("/proc/self/task"),
                                reason="the wait sampler needs the C core and /proc")

INTERVAL_NS = 2_000_000


@pytest.fixture(autouse=True)
def sampler_free():
    """The one sampler of the process, taken back from a probe another test left open."""
    if account_module._WAIT_OWNER is not None:
        account_module._WAIT_OWNER.close()


def _classes(data: bytes) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in array("q", data):
        name = WAIT_CLASSES[value & 15]
        counts[name] = counts.get(name, 0) + 1
    return counts


def _sample(core, wait) -> dict[str, int]:
    FASTREC.wait_sampler_start(core, threading.get_native_id(), INTERVAL_NS, 10_000)
    try:
        wait()
    finally:
        data, ticks, dropped = FASTREC.wait_sampler_stop()
    assert ticks > 0 and dropped == 0
    return _classes(data)


def test_a_sleep_a_pipe_and_a_lock_are_told_apart():
    core = FASTREC.Core()
    slept = _sample(core, lambda: time.sleep(0.2))
    assert slept.get("sleep", 0) >= 0.8 * sum(slept.values()) and sum(slept.values()) >= 40

    read, write = os.pipe()
    timer = threading.Timer(0.2, lambda: os.write(write, b"x"))
    timer.start()
    piped = _sample(core, lambda: os.read(read, 1))
    timer.join()
    os.close(read), os.close(write)
    assert piped.get("pipe", 0) >= 0.8 * sum(piped.values()), piped

    held = threading.Lock()
    held.acquire()
    threading.Timer(0.2, held.release).start()
    locked = _sample(core, held.acquire)
    assert locked.get("lock", 0) >= 0.8 * sum(locked.values()), locked


def test_a_thread_waiting_for_the_gil_is_seen_asleep_on_a_lock_and_a_computing_one_not_at_all():
    stop = threading.Event()

    def spin() -> None:  # pure Python, never releasing the GIL by itself
        while not stop.is_set():
            pass

    core = FASTREC.Core()
    computing = _sample(core, lambda: sum(range(3_000_000)))  # alone: on CPU, no sample kept
    assert sum(computing.values()) <= 3, computing
    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        def compute_for(seconds: float) -> None:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                sum(range(1000))
        contended = _sample(core, lambda: compute_for(0.4))
    finally:
        stop.set()
        spinner.join()
    assert contended.get("lock", 0) >= 0.6 * sum(contended.values()) and contended.get("lock", 0) >= 20, contended


def test_samples_carry_the_open_step_and_phase():
    core = FASTREC.Core()
    data_wait = PHASE_NAMES.index("data_wait")
    FASTREC.wait_sampler_start(core, threading.get_native_id(), INTERVAL_NS, 10_000)
    try:
        core.enter(data_wait)
        time.sleep(0.1)
        core.leave(data_wait)
    finally:
        data, _, _ = FASTREC.wait_sampler_stop()
    counts = account_module._wait_counts(data)
    assert counts and all(step == 0 for step, _, _, _ in counts)
    by_phase = {PHASES[phase]: samples for _, phase, kind, samples in counts if WAIT_CLASSES[kind] == "sleep"}
    assert by_phase.get("data_wait", 0) >= 30, counts


def test_a_sampler_runs_once_and_stops_cleanly_even_after_a_fork():
    core = FASTREC.Core()
    FASTREC.wait_sampler_start(core, threading.get_native_id(), INTERVAL_NS, 100)
    try:
        with pytest.raises(RuntimeError, match="already runs"):
            FASTREC.wait_sampler_start(core, threading.get_native_id(), INTERVAL_NS, 100)
        pid = os.fork()
        if pid == 0:  # a DataLoader worker: it has no sampler thread and must not join one
            os._exit(0 if FASTREC.wait_sampler_stop()[1] == 0 else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        time.sleep(0.3)  # a full buffer drops, never overflows
    finally:
        data, _, dropped = FASTREC.wait_sampler_stop()
    assert len(data) == 100 * 8 and dropped > 0
    assert FASTREC.wait_sampler_stop() == (b"", 0, 0)
    with pytest.raises(TypeError):
        FASTREC.wait_sampler_start(object(), threading.get_native_id(), INTERVAL_NS, 100)
    with pytest.raises(ValueError):
        FASTREC.wait_sampler_start(core, threading.get_native_id(), 0, 100)
