"""The in-process stack sampler: samples, phases, interning, worker files and their merge."""

from __future__ import annotations

import pickle
import sys
import threading
import time

import numpy as np
import pytest

from stepscope.capture import cputimer, stacks
from stepscope.capture.recorder import FORWARD, StepRecorder
from stepscope.capture.stacks import StackSampler, StackTable, WorkerStackStart, _WorkerFile
from stepscope.capture.warn import WarningSink
from stepscope.record.run import PHASES, STACK_ROLES, StepTable


def busy_for(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        sum(i * i for i in range(2000))  # the sampled line


def test_samples_name_the_running_function_and_the_recorder_phase():
    recorder = StepRecorder()
    recorder._phase = FORWARD
    sampler = StackSampler(recorder, 200).start()
    try:
        busy_for(0.3)
    finally:
        sampler.stop()
    samples = sampler.freeze(StepTable.empty())
    samples.check()
    assert len(samples) >= 10
    functions = {samples.frames[stack[-1]].function for stack in samples.stacks}
    assert any(name.startswith("busy_for") for name in functions), functions
    assert set(samples.phase.tolist()) == {PHASES.index("forward")}
    assert set(samples.role.tolist()) == {STACK_ROLES.index("main")}
    assert (samples.step == -1).all()  # no committed steps
    assert samples.mechanism == (stacks.MECHANISM_WALL if cputimer.available() else stacks.MECHANISM)
    assert samples.rate_hz == 200 and len(samples.weight_ns) == len(samples)
    assert samples.sampler_cpu_ns > 0


def test_stop_is_idempotent_and_restores_the_signal():
    import signal

    sampler = StackSampler(None, 100).start()
    if cputimer.available():  # a timer of the main thread's own, not the process-wide one
        assert sampler._thread._timer is not None and signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
    else:
        assert signal.getitimer(signal.ITIMER_PROF)[1] == pytest.approx(0.01)
    sampler.stop()
    sampler.stop()
    assert sampler._thread._timer is None
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGPROF) == signal.SIG_DFL


def test_the_scripts_own_profiling_timer_wins():
    import signal

    sampler = StackSampler(None, 100).start()
    seen = []
    try:
        signal.signal(signal.SIGPROF, lambda *args: seen.append(1))  # the script takes SIGPROF over
        signal.setitimer(signal.ITIMER_PROF, 0.01, 0.01)
        busy_for(0.1)
        deadline = time.thread_time() + 5.0  # a loaded machine may deliver the first tick late: wait for it
        while not seen and time.thread_time() < deadline:
            busy_for(0.01)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, signal.SIG_DFL)
        sampler.stop()
    assert seen and not sampler._thread.active


def test_a_script_that_profiles_itself_first_is_told_stacks_did_not_start():
    import signal

    signal.signal(signal.SIGPROF, lambda *args: None)  # the script's own handler, before stepscope starts
    try:
        sampler = StackSampler(None, 100).start()
        sampler.stop()
    finally:
        signal.signal(signal.SIGPROF, signal.SIG_DFL)
    assert sampler._thread.refused
    assert [m for m in sampler.warnings.messages if "did not start" in m] == [
        "stack sampling did not start (the script uses SIGPROF or ITIMER_PROF itself; stacks not sampled)"]


def test_another_thread_is_sampled_only_where_that_is_safe():
    table = StackTable()
    other = threading.Thread(target=lambda: None)
    other.start()
    other.join()
    chosen = stacks.sampler_for(table, other.ident, 100, lambda: -1)
    assert (chosen is not None) == stacks.THREAD_SAMPLER_SAFE


def test_table_interns_frames_and_stacks():
    table = StackTable()
    frame = sys._getframe()
    for _ in range(3):
        table.add(1, 0, frame)
    assert len(table) == 3 and len(table.stacks) == 1
    assert table.frames[table.stacks[0][-1]][2].endswith("test_table_interns_frames_and_stacks")


def test_steps_are_assigned_from_timestamps():
    from stepscope.record.run import steps_of

    steps = StepTable.from_columns({"start_ns": [100, 200, 400], "duration_ns": [100, 100, 50]})
    assert steps_of(np.array([50, 100, 199, 200, 350, 420, 450]), steps).tolist() == [-1, 0, 0, 1, -1, 2, -1]


def test_worker_start_is_picklable_and_calls_the_user_function(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(stacks, "start_worker_sampler", lambda *args, **kwargs: seen.append("sampler"))
    start = WorkerStackStart(seen.append, str(tmp_path), 50.0)
    pickle.loads(pickle.dumps(WorkerStackStart(None, str(tmp_path), 50.0)))
    start(3)
    assert seen == ["sampler", 3]


def test_worker_samples_merge_as_loading_work(tmp_path):
    table = StackTable()
    frame = sys._getframe()
    for ts in (1_000, 2_000, 3_000):
        table.add(ts, -1, frame)
    writer = _WorkerFile(table, str(tmp_path / "w"))
    writer.flush()
    sampler = StackSampler(None, 1000.0, worker_dir=tmp_path / "w")
    data_wait = PHASES.index("data_wait")
    sampler.table.ts_ns.extend([900, 1_900, 2_900])
    sampler.table.phase.extend([data_wait, PHASES.index("forward"), data_wait])
    sampler.table.stack.extend([0, 0, 0])
    sampler.table.stacks.append((0,))
    sampler.table.frames.append(("main.py", 1, "main"))
    samples = sampler.freeze(StepTable.empty())
    samples.check()
    workers = samples.role == STACK_ROLES.index("worker")
    assert samples.ts_ns[workers].tolist() == [1_000, 2_000, 3_000]  # workers sample only while they load
    assert not (tmp_path / "w").exists()  # worker files are consumed
    leaf = samples.frames[samples.stacks[samples.stack[workers][0]][-1]]
    assert leaf.function.endswith("test_worker_samples_merge_as_loading_work")


def test_switch_interval_is_lowered_while_a_thread_samples_and_restored():
    """Python >= 3.12: a sampler thread lowers the GIL switch interval and restores it. Before 3.12
    no sampler thread reads another thread's frames: the interval is untouched and the reason said."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(stacks.PYTHON_SWITCH_INTERVAL_S)
    worker = threading.Thread(target=busy_for, args=(0.3,))
    worker.start()
    try:
        warnings = WarningSink(emit=False)
        sampler = StackSampler(None, 100, thread_id=worker.ident, warnings=warnings).start()
        lowered = stacks.SWITCH_INTERVAL_S if stacks.THREAD_SAMPLER_SAFE else stacks.PYTHON_SWITCH_INTERVAL_S
        assert sys.getswitchinterval() == pytest.approx(lowered)
        assert (sampler._thread is None) is (not stacks.THREAD_SAMPLER_SAFE)
        assert any("unsafe on this Python" in line for line in warnings.messages) is (not stacks.THREAD_SAMPLER_SAFE)
        sampler.stop()
        assert sys.getswitchinterval() == pytest.approx(stacks.PYTHON_SWITCH_INTERVAL_S)
    finally:
        worker.join()
        sys.setswitchinterval(previous)


def test_a_failing_sampler_ends_quietly_and_says_why(capsys):
    class Broken(StackTable):
        def add(self, *args):
            raise OSError("disk full")

    sampler = StackSampler(None, 500)
    sampler.table = Broken()
    sampler.start()  # on a loaded machine the first sample (and its error) may come before start returns
    busy_for(0.1)  # the handler's error never reaches this code
    sampler.stop()
    assert sampler._thread.error == "OSError: disk full"
    assert capsys.readouterr().err == ""
    sampler.freeze(StepTable.empty())
    assert any("stack sampling stopped early" in message for message in sampler.warnings.messages)
    assert not any("did not start" in message for message in sampler.warnings.messages)


def test_an_error_before_start_returns_is_still_said_as_stopped_early(monkeypatch):
    """The race a loaded machine showed: the sampler failed on its first sample before ``start``
    had returned; that is a sampler that stopped early, not one that did not start."""
    from stepscope.capture import stack_sampling

    original = stack_sampling._SignalSampler.start

    def start_then_fail(self):
        original(self)
        self.error = "OSError: disk full"  # as the handler would have set it, already

    monkeypatch.setattr(stack_sampling._SignalSampler, "start", start_then_fail)
    sampler = StackSampler(None, 500).start()
    sampler.stop()
    sampler.freeze(StepTable.empty())
    assert [m for m in sampler.warnings.messages if "stack sampling" in m] == [
        "stack sampling stopped early (OSError: disk full)"]


def _shares(samples, names):
    weights = samples.weights()
    totals = dict.fromkeys(names, 0.0)
    for stack_id, weight in zip(samples.stack.tolist(), weights.tolist()):
        function = samples.frames[samples.stacks[stack_id][-1]].function
        for name in names:
            if function.startswith(name):
                totals[name] += weight
    whole = float(weights.sum())
    return {name: value / whole for name, value in totals.items()}


def pure_python(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for value in range(300):
            value * value  # noqa: B018 - the planted pure-Python work


def intra_op_work(seconds: float) -> None:
    import torch

    a = torch.randn(160, 160)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a @ a  # noqa: B018


def tiny_torch_call(tensor):
    return tensor + 1


@pytest.mark.serial  # shares of wall time within 0.08: under a parallel run's load it measured 0.25 vs 0.33
@pytest.mark.skipif(not cputimer.available(), reason="no POSIX thread timers on this platform")
def test_pure_python_beside_multithreaded_torch_calls_gets_its_share_of_the_time():
    """The training thread is sampled on its own timer: each function draws its share of the wall
    time. With the process-wide ITIMER_PROF the intra-op threads' CPU drew extra ticks into the torch
    calls, and a tick caught by one of them waited for the main thread's next GIL acquisition
    (CPython 3.11): here the pure-Python half measured 0.38-0.41 that way."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    small = torch.randn(8)
    python_s = 0.0
    sampler = StackSampler(None, 500).start()
    began = time.perf_counter()
    try:
        for _ in range(80):
            intra_op_work(0.005)  # a matmul may overrun its 5 ms on a busy machine: the time is measured
            start = time.perf_counter()
            pure_python(0.005)
            python_s += time.perf_counter() - start
            tiny_torch_call(small)
    finally:
        sampler.stop()
        torch.set_num_threads(threads)
    measured = python_s / (time.perf_counter() - began)
    shares = _shares(sampler.freeze(StepTable.empty()), ("pure_python", "intra_op_work", "tiny_torch_call"))
    assert shares["pure_python"] == pytest.approx(measured, abs=0.08), (shares, measured)
    assert shares["tiny_torch_call"] < 0.05, shares


@pytest.mark.skipif(not cputimer.available(), reason="no POSIX thread timers on this platform")
def test_blocked_time_is_sampled_on_the_wall_clock_at_the_line_that_blocks():
    slept = 0.0
    sampler = StackSampler(None, 200).start()
    began = time.perf_counter()
    try:
        for _ in range(10):
            start = time.perf_counter()
            time.sleep(0.03)  # blocked: no CPU, yet ~3/4 of the wall time
            slept += time.perf_counter() - start
            busy_for(0.01)  # 10 ms of CPU: longer on a crowded machine, hence the measured share
    finally:
        sampler.stop()
    measured = slept / (time.perf_counter() - began)
    samples = sampler.freeze(StepTable.empty())
    weights = samples.weights()
    sleeping = np.array([samples.frames[samples.stacks[stack][-1]].function.endswith(
        "test_blocked_time_is_sampled_on_the_wall_clock_at_the_line_that_blocks") for stack in samples.stack])
    assert float(weights[sleeping].sum() / weights.sum()) == pytest.approx(measured, abs=0.12)


def test_a_loop_back_edge_without_a_line_is_the_loops_line():
    def loop(labels):
        count = 0
        for label in labels:
            for klass in range(3):
                if klass == label:
                    count += 1
        return count

    import dis

    code = loop.__code__
    first = code.co_firstlineno
    backward = [ins for ins in dis.get_instructions(code) if "JUMP_BACKWARD" in ins.opname]
    assert backward
    lines = {stacks._line_before(code, ins.offset) for ins in backward}
    assert lines <= {first + 2, first + 3}  # the two `for` lines, never the body's
