"""Sampling the Python stacks of the training thread and of DataLoader workers, tied to steps.

**Mechanism.** The main thread samples *itself*: a POSIX timer on the main thread's own CPU clock
(:mod:`stepscope.capture.cputimer`; ``setitimer(ITIMER_PROF)`` where there is none) raises
``SIGPROF`` in that thread ``rate_hz`` times per second of its CPU time, and Python runs the
handler in the main thread between two bytecodes, where ``sys._getframe`` gives the thread's own,
consistent stack and the step recorder's phase is exactly the one the sampled code runs in. No
other thread's frames are read: a daemon thread reading the training thread's frames with
``sys._current_frames()`` (the first design here) crashed the interpreter now and then on Python
3.11 — CPython may be pushing or popping the frame being read, the same crash Sentry's and
Datadog's thread samplers met — so a sampler thread is used only for a thread that is not the
main one, and only on Python >= 3.12 (:data:`THREAD_SAMPLER_SAFE`). The handler is installed with
``SA_RESTART``, so a system call that the tick interrupts resumes by itself, and it yields to the
script: installing a ``SIGPROF`` handler or a profiling timer of its own stops our sampling first.
It needs no permission (an external sampler such as py-spy needs ptrace rights, absent in many
containers) and costs a few tens of µs per sample (BENCHMARKS.md, "Stack sampling").

Each sample stores its timestamp, the phase read from the recorder (``StepRecorder._phase``) and
the stack as interned frame ids. The step index is assigned afterwards from the timestamp and the
committed steps (:func:`stepscope.record.run.steps_of`), which stays right when the recorder merges
or re-opens steps.

**Bias.** Ticks follow the sampled thread's CPU time: code that computes is sampled in proportion
to the time the thread spends on it (intra-op threads beside it do not add ticks), and a thread
blocked in a system call draws none until the call returns — a wait (for data, a lock, a sleep)
is seen through the phase times, not the samples. The tick is delivered to the sampled thread
itself: a process-wide ``ITIMER_PROF`` signal caught by an intra-op thread waits, on CPython 3.11,
for the main thread's next GIL acquisition, which moved the samples of pure-Python code to the
next torch call (:mod:`stepscope.capture.cputimer` has the measurement). A
collection of the garbage collector is sampled where it was triggered; its time is measured
exactly by the GC pause overlay (:mod:`stepscope.capture.gc_pauses`).

**DataLoader workers.** Every multi-process DataLoader iterator gets a chained ``worker_init_fn``
(:class:`WorkerStackStart`, picklable, so ``spawn`` works too) that starts the same sampler in each
worker (its main thread samples itself); it appends its samples to a file in the run directory, and
the main process merges them when capture ends, as the data-wait phase's loading work: a worker
draws samples only while it computes batches.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
import threading
import time
from array import array
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from stepscope.capture.warn import WarningSink
from stepscope.errors import UsageError
from stepscope.record.run import PHASES, STACK_ROLES, StackFrame, StackSamples, StepTable, steps_of

#: Default rate; 100 Hz costs well under 1% of the benchmark step (BENCHMARKS.md).
DEFAULT_RATE_HZ = 100.0
#: A wall-clock sample stands for the ticks since the previous one, up to this many (a longer gap
#: is not the sampled code's: the process was stopped, or sampling paused).
MAX_WEIGHT_TICKS = 50
#: Innermost frames kept per sample.
MAX_DEPTH = 128
#: Worker samples are written to their file in chunks of this many samples (and at exit).
WORKER_CHUNK = 64
MECHANISM = "signal:SIGPROF"  # the main thread samples itself (a sampler thread on Python >= 3.12 elsewhere)
#: ... on a wall-clock timer that signals the main thread only (workers on their CPU clock)
MECHANISM_WALL = "signal:SIGPROF:wall"
#: GIL switch interval while sampling, in the training process (Python's default is 5 ms)…
SWITCH_INTERVAL_S = 0.0005
#: …and inside DataLoader workers (where the sampler is the only other Python thread).
WORKER_SWITCH_INTERVAL_S = 0.0002
PYTHON_SWITCH_INTERVAL_S = 0.005

#: Recorder phase index (capture.recorder: other, data_wait, forward, backward, optimizer) -> PHASES index.
_PHASE_OF_RECORDER = tuple(PHASES.index(name) for name in ("other", "data_wait", "forward", "backward", "optimizer",
                                                          "communication", "compile"))
_DATA_WAIT = PHASES.index("data_wait")
_MAIN, _WORKER = STACK_ROLES.index("main"), STACK_ROLES.index("worker")
_now = time.perf_counter_ns


class StackTable:
    """Interned frames and stacks plus the per-sample columns of one sampled thread."""

    def __init__(self) -> None:
        self.frames: list[tuple[str, int, str]] = []
        self.stacks: list[tuple[int, ...]] = []
        self.ts_ns = array("q")
        self.phase = array("b")
        self.stack = array("l")
        self.weight = array("q")  # ns of the sampled thread's time each sample stands for
        self._code_ids: dict[tuple[int, int], int] = {}  # (id(code), instruction offset) -> frame id
        self._codes: list[Any] = []
        self._location_ids: dict[tuple[str, int, str], int] = {}
        self._stack_ids: dict[tuple[int, ...], int] = {}

    def __len__(self) -> int:
        return len(self.ts_ns)

    def _intern(self, frame: Any) -> int:
        code = frame.f_code
        self._codes.append(code)  # alive, so its id() is never reused
        line = frame.f_lineno
        if line is None:  # an instruction with no line of its own (a loop's back-edge): the line before it
            line = _line_before(code, frame.f_lasti)
        location = (code.co_filename, line, getattr(code, "co_qualname", code.co_name))
        frame_id = self._location_ids.get(location)
        if frame_id is None:
            frame_id = self._location_ids[location] = len(self.frames)
            self.frames.append(location)
        return frame_id

    def add(self, ts_ns: int, phase: int, frame: Any, root: Any = None, weight: int = 0) -> None:
        """Record one sample: ``frame`` is the innermost frame of the sampled thread; the walk
        stops at ``root`` when given (a worker's ``_worker_loop``: the frames above it are the
        parent's, inherited through fork)."""
        ids: list[int] = []
        code_ids = self._code_ids
        append = ids.append
        while frame is not None:
            # id() and the instruction offset: code objects hash their whole contents on every
            # call; the line is decoded only for instructions not seen before
            key = (id(frame.f_code), frame.f_lasti)
            frame_id = code_ids.get(key)
            if frame_id is None:
                frame_id = code_ids[key] = self._intern(frame)
            append(frame_id)
            if frame is root:
                break
            frame = frame.f_back
        del ids[MAX_DEPTH:]
        ids.reverse()
        stack = tuple(ids)
        stack_id = self._stack_ids.get(stack)
        if stack_id is None:
            stack_id = self._stack_ids[stack] = len(self.stacks)
            self.stacks.append(stack)
        self.ts_ns.append(ts_ns)
        self.phase.append(phase)
        self.stack.append(stack_id)
        self.weight.append(weight)


def _line_before(code: Any, offset: int) -> int:
    """A line for the instruction at ``offset``, which has none of its own.

    CPython gives the implicit back-edge of a loop no line, and a signal handler often runs just
    there (the loop checks for pending signals on its back-edge): such a sample belongs to the
    loop, so a backward jump takes the line of its target (the loop's header). Any other
    instruction takes the line of the last instruction before it that has one, else the ``def``
    line."""
    import dis

    lines = [(start, number) for start, _end, number in code.co_lines()]

    def line_at(where: int) -> int | None:
        found = None
        for start, number in lines:
            if start > where:
                break
            if number is not None:
                found = number
        return found

    line = None
    try:
        for instruction in dis.get_instructions(code):
            if instruction.offset == offset:
                if "JUMP_BACKWARD" in instruction.opname and isinstance(instruction.argval, int):
                    line = line_at(instruction.argval)
                break
        if line is None:
            line = line_at(offset)
    except (AttributeError, TypeError, ValueError):
        pass
    return int(line if line is not None else getattr(code, "co_firstlineno", 0) or 0)


class _SamplerThread(threading.Thread):
    """Samples the thread ``target_id`` every ``1/rate_hz`` s into ``table`` until stopped."""

    def __init__(self, table: StackTable, target_id: int, rate_hz: float, phase_of: Any,
                 on_sample: Any = None, root: Any = None):
        super().__init__(name="stepscope-stacks", daemon=True)
        self.table = table
        self.target_id = target_id
        self.interval_ns = int(1e9 / rate_hz)
        self.phase_of = phase_of
        self.on_sample = on_sample
        self.root = root
        self.stopping = False
        self.cpu_ns = 0  # CPU time of this thread, set by stop()
        self.missed = 0
        self.error: str | None = None  # why sampling ended early, if it did

    def run(self) -> None:
        try:
            self._sample_until_stopped()
        except Exception as exc:  # noqa: BLE001 - never a traceback on the script's stderr
            self.error = f"{type(exc).__name__}: {exc}"

    def _sample_until_stopped(self) -> None:
        frames_now, clock, sleep = sys._current_frames, _now, time.sleep
        table, target, phase_of, root = self.table, self.target_id, self.phase_of, self.root
        interval_ns = self.interval_ns
        next_ns = clock() + interval_ns
        while not self.stopping:
            delay = next_ns - clock()
            if delay > 0:
                sleep(delay / 1e9)  # a C sleep: cheaper per tick than Event.wait's Python code
                if self.stopping:
                    break
            frame = frames_now().get(target)
            if frame is None:
                self.missed += 1
            else:
                table.add(clock(), phase_of(), frame, root, interval_ns)
                del frame
                if self.on_sample is not None:
                    self.on_sample()
            next_ns = max(next_ns + interval_ns, clock())

    def stop(self) -> None:
        """Stop the thread; ``cpu_ns`` becomes the CPU time it used (read from its CPU clock, not
        per sample: a thread CPU clock read is a system call, as costly as a sample here)."""
        self._stop_thread()

    def _stop_thread(self) -> None:
        if self.is_alive() and self.ident is not None:
            try:
                self.cpu_ns = time.clock_gettime_ns(time.pthread_getcpuclockid(self.ident))
            except (AttributeError, OSError):
                pass
        self.stopping = True
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout=1.0)


#: The interval timer and signal of the in-thread sampler.
_TIMER_SIGNAL = "SIGPROF"


class _SignalSampler:
    """Samples the thread that starts it (the main thread) from a ``SIGPROF`` handler.

    A timer on the thread's own CPU clock raises ``SIGPROF`` in that thread every ``1/rate_hz`` s of
    its CPU time (``setitimer(ITIMER_PROF)``, process CPU time, where no such timer exists);
    Python runs the handler in the main thread between two bytecodes, where ``sys._getframe`` is the
    thread's own, consistent stack — no frame of another thread is ever read (reading another
    thread's frames from a sampler thread crashes CPython 3.11 now and then: the interpreter may
    be pushing or popping the frame being read). The handler is installed with ``SA_RESTART``
    (``siginterrupt(False)``), so system calls interrupted by the tick resume by themselves.

    The script keeps priority: if it installs its own ``SIGPROF`` handler or interval timer
    (``signal.signal``, ``signal.setitimer``), sampling stops first and its call proceeds.
    Samples follow CPU time, so a main thread blocked in a system call (a DataLoader queue, a
    sleep) draws none; data waits are sampled in the worker processes instead.
    """

    def __init__(self, table: StackTable, rate_hz: float, phase_of: Any, on_sample: Any = None,
                 root: Any = None, wall: bool = False):
        import signal

        self.signal = signal
        self.table = table
        self.interval_s = 1.0 / rate_hz
        self.wall = wall  # ticks on the wall clock (else the thread's CPU clock)
        self._interval_ns = int(1e9 / rate_hz)
        self._last_expiry_ns = 0
        self._busy = False
        self.phase_of = phase_of
        self.on_sample = on_sample
        self.root = root
        self.cpu_ns = 0
        self.missed = 0
        self.error: str | None = None
        self._previous: Any = None
        self._patched: list[tuple[str, Any]] = []
        self._timer: Any = None
        self.active = False

    def start(self) -> None:
        signal = self.signal
        number = getattr(signal, _TIMER_SIGNAL)
        current = signal.getsignal(number)
        inherited = isinstance(getattr(current, "__self__", None), _SignalSampler)  # a forked worker
        if (current not in (signal.SIG_DFL, None) and not inherited) or signal.getitimer(signal.ITIMER_PROF)[0]:
            self.error = "the script uses SIGPROF or ITIMER_PROF itself; stacks not sampled"
            return
        self._previous = signal.signal(number, self._handler)
        signal.siginterrupt(number, False)
        self._patch()
        self._timer = _thread_timer(number, self.interval_s, self.wall)
        if self._timer is None:  # no POSIX thread timer here: the process-wide profiling timer
            self.wall = False
            signal.setitimer(signal.ITIMER_PROF, self.interval_s, self.interval_s)
        else:  # the first tick's expiry, less one interval: where the tick count starts
            self._last_expiry_ns = _now() + self._timer.remaining_ns() - self._interval_ns
        self.active = True

    def _handler(self, _signum: int, frame: Any) -> None:
        if self._busy or (frame is not None and frame.f_code is _HANDLER_CODE):
            return  # a tick during the handler itself (a descheduled thread): its time goes to the next sample
        if frame is None:
            self.missed += 1
            return
        self._busy = True
        begin = time.thread_time_ns()
        try:
            now = _now()
            if self.wall:
                # the ticks that fired since the previous sample: a thread in a long C call runs the
                # handler once, when the call returns, for all the ticks that fell in the call. The
                # timer's next expiry moves on by one interval per tick fired, wherever the handler
                # ran. (The wall time since the previous sample would also charge this sample with
                # the time before the call, and over-weigh every late-handled tick.)
                remaining = self._timer.remaining_ns() if self._timer is not None else -1
                if remaining < 0:
                    weight = self._interval_ns
                else:
                    expiry = now + remaining
                    ticks = min(round((expiry - self._last_expiry_ns) / self._interval_ns), MAX_WEIGHT_TICKS)
                    self._last_expiry_ns = expiry
                    if ticks <= 0:
                        return  # a SIGPROF that is not our timer's tick
                    weight = ticks * self._interval_ns
            else:
                weight = self._interval_ns
            self.table.add(now, self.phase_of(), frame, self.root, weight)
            if self.on_sample is not None:
                self.on_sample()
        except Exception as exc:  # noqa: BLE001 - never raise into the script's code
            self.error = f"{type(exc).__name__}: {exc}"
            self.stop()
        finally:
            self._busy = False
        self.cpu_ns += time.thread_time_ns() - begin

    def _patch(self) -> None:
        """Yield to the script: its own SIGPROF handler or profiling timer stops our sampling."""
        signal, sampler = self.signal, self
        number = getattr(signal, _TIMER_SIGNAL)
        original_signal, original_setitimer = signal.signal, signal.setitimer

        def patched_signal(signum: Any, handler: Any) -> Any:
            if signum == number and sampler.active:
                sampler.stop()
            return original_signal(signum, handler)

        def patched_setitimer(which: int, seconds: float, interval: float = 0.0) -> Any:
            if which == signal.ITIMER_PROF and sampler.active:
                sampler.stop()
            return original_setitimer(which, seconds, interval)

        self._patched = [("signal", original_signal), ("setitimer", original_setitimer)]
        setattr(signal, "signal", patched_signal)
        setattr(signal, "setitimer", patched_setitimer)

    def stop(self) -> None:
        signal = self.signal
        for name, original in self._patched:
            setattr(signal, name, original)
        self._patched = []
        if not self.active:
            return
        self.active = False
        if self._timer is not None:
            self._timer.close()
            self._timer = None
        else:
            signal.setitimer(signal.ITIMER_PROF, 0.0, 0.0)
        number = getattr(signal, _TIMER_SIGNAL)
        signal.signal(number, signal.SIG_IGN)  # discards a tick already raised: SIG_DFL would end the process
        signal.signal(number, self._previous if self._previous is not None else signal.SIG_DFL)


_HANDLER_CODE = _SignalSampler._handler.__code__


def _thread_timer(signum: int, interval_s: float, wall: bool) -> Any:
    """A timer that signals the calling thread only (:mod:`stepscope.capture.cputimer`), on the
    wall clock or on the thread's CPU clock; None where there is none."""
    from stepscope.capture import cputimer

    if not cputimer.available():
        return None
    try:
        return cputimer.ThreadTimer(signum, interval_s,
                                    cputimer.CLOCK_MONOTONIC if wall else cputimer.CLOCK_THREAD_CPUTIME_ID)
    except OSError:
        return None


#: Python versions on which a sampler thread may read another thread's frames: 3.11 crashes now
#: and then doing so (CPython's frame push/pop races the read; seen in Sentry's and Datadog's
#: samplers too), so there only the main thread samples itself, from a signal handler.
THREAD_SAMPLER_SAFE = sys.version_info >= (3, 12)


def sampler_for(table: StackTable, thread_id: int, rate_hz: float, phase_of: Any, on_sample: Any = None,
                root: Any = None, wall: bool = False) -> _SamplerThread | _SignalSampler | None:
    """The sampler for ``thread_id``: a ``SIGPROF`` handler when it is the main thread (any Python),
    ticking on the wall clock when ``wall`` (else on the thread's CPU clock), else a sampler thread
    where that is safe, else None."""
    if thread_id == threading.main_thread().ident and hasattr(__import__("signal"), "setitimer") \
            and threading.current_thread() is threading.main_thread():
        return _SignalSampler(table, rate_hz, phase_of, on_sample=on_sample, root=root, wall=wall)
    if THREAD_SAMPLER_SAFE:
        return _SamplerThread(table, thread_id, rate_hz, phase_of, on_sample=on_sample, root=root)
    return None


class StackSampler:
    """Samples the training thread (and DataLoader workers during data waits) while capturing.

    Args:
        recorder: the :class:`~stepscope.capture.recorder.StepRecorder` whose ``_phase`` each
            sample reads (None: phase unknown).
        rate_hz: samples per second and per sampled thread.
        worker_dir: where DataLoader workers write their samples (None: workers are not sampled).
        warnings: where failures go (capture never raises into the script).
        thread_id: the thread to sample (default: the one that constructs the sampler).
        switch_interval_s: GIL switch interval while sampling (see "Bias" in the module
            docstring); None leaves the interpreter's alone.
    """

    def __init__(self, recorder: Any, rate_hz: float = DEFAULT_RATE_HZ, *, worker_dir: Path | None = None,
                 warnings: WarningSink | None = None, thread_id: int | None = None,
                 switch_interval_s: float | None = SWITCH_INTERVAL_S):
        if not rate_hz > 0:
            raise UsageError(f"stack sampling rate must be > 0 Hz, got {rate_hz}")
        self.recorder = recorder
        self.rate_hz = float(rate_hz)
        self.worker_dir = Path(worker_dir) if worker_dir is not None else None
        self.warnings = warnings or WarningSink(emit=False)
        self.thread_id = thread_id if thread_id is not None else threading.get_ident()
        self.table = StackTable()
        self._thread: _SamplerThread | _SignalSampler | None = None
        self._watcher: Any = None
        self._undo: list[Any] = []
        self._saved_interval: float | None = None
        self.switch_interval_s = switch_interval_s

    def _phase(self) -> int:
        recorder = self.recorder
        return _PHASE_OF_RECORDER[recorder.current_phase()] if recorder is not None else -1

    def start(self) -> StackSampler:
        """Start sampling (see :func:`sampler_for`) and, once torch is imported, the worker hook."""
        # the training thread on the wall clock: its blocked time (a sleep, a socket, a lock) is part
        # of the step and is attributed to the line that blocks; workers on their CPU clock (their
        # idle time between batches explains nothing)
        sampler = sampler_for(self.table, self.thread_id, self.rate_hz, self._phase, wall=True)
        if sampler is None:
            self.warnings.once("stacks-unsafe", "Python stacks not sampled: a sampler thread reading another "
                                                "thread's frames is unsafe on this Python; GC pauses are still timed")
            return self
        if isinstance(sampler, _SamplerThread) and self.switch_interval_s is not None \
                and sys.getswitchinterval() == PYTHON_SWITCH_INTERVAL_S:
            self._saved_interval = sys.getswitchinterval()  # the default, not one the script chose
            sys.setswitchinterval(self.switch_interval_s)
        self._thread = sampler
        sampler.start()
        if sampler.error:
            self.warnings.once("stacks-failed", f"stack sampling did not start ({sampler.error})")
        if self.worker_dir is not None:
            from stepscope.capture.torch_import import when_torch_imported

            self._watcher = when_torch_imported(self._install_worker_hook)
        return self

    def stop(self) -> None:
        """Stop sampling (idempotent); the samples stay for :meth:`freeze`."""
        if self._watcher is not None:
            self._watcher.remove()
            self._watcher = None
        while self._undo:
            self._undo.pop()()
        if self._thread is not None:
            self._thread.stop()
        if self._saved_interval is not None and sys.getswitchinterval() == self.switch_interval_s:
            sys.setswitchinterval(self._saved_interval)
        self._saved_interval = None

    def _install_worker_hook(self) -> None:
        try:
            from torch.utils.data import dataloader

            iterator_cls = dataloader._MultiProcessingDataLoaderIter
            original = iterator_cls.__dict__["__init__"]
            directory, rate_hz = str(self.worker_dir), self.rate_hz

            def __init__(iterator: Any, loader: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
                user_fn = loader.worker_init_fn
                loader.worker_init_fn = WorkerStackStart(user_fn, directory, rate_hz)
                try:
                    original(iterator, loader, *args, **kwargs)
                finally:
                    loader.worker_init_fn = user_fn

            iterator_cls.__init__ = __init__  # type: ignore[method-assign,assignment]
            self._undo.append(lambda: setattr(iterator_cls, "__init__", original))
        except Exception as exc:  # noqa: BLE001 - degrade, never break the run
            self.warnings.once("stacks-workers", f"DataLoader workers' stacks not sampled ({exc})")

    def freeze(self, steps: StepTable) -> StackSamples:
        """The samples as a :class:`StackSamples`, with worker samples merged in."""
        table = self.table
        frames: dict[tuple[str, int, str], int] = {frame: index for index, frame in enumerate(table.frames)}
        stacks: dict[tuple[int, ...], int] = {stack: index for index, stack in enumerate(table.stacks)}
        ts = list(table.ts_ns)
        phase = list(table.phase)
        role = [_MAIN] * len(ts)
        pid = [os.getpid()] * len(ts)
        stack = list(table.stack)
        tick_ns = int(1e9 / self.rate_hz)
        weight = [*table.weight, *[tick_ns] * (len(ts) - len(table.weight))]
        worker_rows = _read_worker_files(self.worker_dir, frames, stacks, ts, phase, int(2 * 10**9 // self.rate_hz))
        for row in worker_rows:
            ts.append(row[0])
            phase.append(_DATA_WAIT)
            role.append(_WORKER)
            pid.append(row[1])
            stack.append(row[2])
            weight.append(tick_ns)
        thread = self._thread
        if thread is not None and thread.error:
            self.warnings.once("stacks-failed", f"stack sampling stopped early ({thread.error})")
        # when there are steps, keep the samples that fall in one (start-up, imports and teardown
        # explain no step), with only the stacks and frames they use
        step = steps_of(_column(ts), steps)
        keep = step >= 0 if len(steps) else np.ones(len(step), dtype=bool)
        all_stacks, all_frames = list(stacks), list(frames)
        used_stacks = np.unique(_column(stack)[keep]) if keep.any() else np.zeros(0, dtype=np.int64)
        stack_index = {int(old): new for new, old in enumerate(used_stacks)}
        kept_stacks = [all_stacks[int(old)] for old in used_stacks]
        used_frames = sorted({frame for item in kept_stacks for frame in item})
        frame_index = {old: new for new, old in enumerate(used_frames)}
        wall = isinstance(thread, _SignalSampler) and thread.wall
        return StackSamples(
            rate_hz=self.rate_hz, mechanism=MECHANISM_WALL if wall else MECHANISM,
            weight_ns=_column(weight)[keep],
            frames=tuple(StackFrame(*all_frames[old]) for old in used_frames),
            stacks=tuple(tuple(frame_index[frame] for frame in item) for item in kept_stacks),
            ts_ns=_column(ts)[keep], step=step[keep], phase=_column(phase)[keep],
            role=_column(role)[keep], pid=_column(pid)[keep],
            stack=np.asarray([stack_index[int(old)] for old in _column(stack)[keep]], dtype=np.int64),
            library_paths=library_paths(), user_paths=user_paths(),
            sampler_cpu_ns=thread.cpu_ns if thread is not None else 0,
            missed=thread.missed if thread is not None else 0)


def _column(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


# -- worker side -------------------------------------------------------------------------------
class WorkerStackStart:
    """A ``worker_init_fn`` that starts a stack sampler in the worker, then calls the user's one.

    Picklable (a module-level class with plain attributes), so it also works when workers are
    spawned. The user's function keeps its exact call and order relative to the worker's seeding.
    """

    def __init__(self, user_fn: Any, directory: str, rate_hz: float):
        self.user_fn = user_fn
        self.directory = directory
        self.rate_hz = rate_hz

    def __call__(self, worker_id: int) -> None:
        try:
            start_worker_sampler(self.directory, self.rate_hz, root=sys._getframe(1))
        except Exception:  # noqa: BLE001 - never break the worker
            pass
        if self.user_fn is not None:
            self.user_fn(worker_id)


class _WorkerFile:
    """Appends a worker's samples to ``<directory>/worker.<pid>.jsonl`` in self-contained chunks."""

    def __init__(self, table: StackTable, directory: str):
        self.table = table
        self.path = Path(directory) / f"worker.{os.getpid()}.jsonl"
        self.written = 0
        self.frames_written = 0
        self.stacks_written = 0
        self.lock = threading.Lock()

    def maybe_flush(self) -> None:
        if len(self.table) - self.written >= WORKER_CHUNK:
            self.flush()  # an OSError ends the worker's sampling quietly (see _SamplerThread.run)

    def flush(self) -> None:
        with self.lock:
            table, start = self.table, self.written
            end = len(table)
            if end == start:
                return
            chunk = {"pid": os.getpid(), "frames_from": self.frames_written,
                     "frames": table.frames[self.frames_written:], "stacks_from": self.stacks_written,
                     "stacks": table.stacks[self.stacks_written:],
                     "ts_ns": list(table.ts_ns[start:end]), "stack": list(table.stack[start:end])}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "ab") as handle:
                handle.write(orjson.dumps(chunk) + b"\n")
            self.written, self.frames_written, self.stacks_written = end, len(table.frames), len(table.stacks)


def start_worker_sampler(directory: str, rate_hz: float, root: Any = None) -> None:
    """Sample the calling thread (a DataLoader worker's main thread) into a file in ``directory``.

    The worker's GIL switch interval is lowered to :data:`WORKER_SWITCH_INTERVAL_S`: the sampler
    is the only other Python thread there, so this costs nothing, and a sample then lands within
    that time of its tick instead of at the worker's next GIL release (see the bias in the module
    docstring).
    """
    table = StackTable()
    writer = _WorkerFile(table, directory)
    thread = sampler_for(table, threading.get_ident(), rate_hz, lambda: -1, on_sample=writer.maybe_flush,
                         root=root)
    if thread is None:
        return
    if isinstance(thread, _SamplerThread) and sys.getswitchinterval() > WORKER_SWITCH_INTERVAL_S:
        sys.setswitchinterval(WORKER_SWITCH_INTERVAL_S)
    thread.start()
    from multiprocessing import util

    util.Finalize(None, _stop_and_flush, args=(thread, writer), exitpriority=100)


def _stop_and_flush(thread: _SamplerThread | _SignalSampler, writer: _WorkerFile) -> None:
    thread.stop()
    try:
        writer.flush()
    except OSError:
        pass


def _read_worker_files(directory: Path | None, frames: dict, stacks: dict, main_ts: list[int],
                       main_phase: list[int], max_gap_ns: int) -> list[tuple[int, int, int]]:
    """The DataLoader workers' samples, as ``(ts_ns, pid, stack id)``: loading work.

    A worker samples itself on CPU time, so it draws samples only while it produces batches — the
    loading code, whether the main thread was waiting for it at that moment or it was prefetching.
    (The main thread, blocked in ``next()`` while it waits, draws none then.) Frames and stacks are
    re-interned into the main tables ``frames``/``stacks``. The worker files are removed once read.
    """
    if directory is None or not directory.is_dir():
        return []
    rows: list[tuple[int, int, int]] = []
    for path in sorted(directory.glob("worker.*.jsonl")):
        local_frames: list[int] = []
        local_stacks: list[int] = []
        for line in path.read_bytes().splitlines():
            try:
                chunk = orjson.loads(line)
            except orjson.JSONDecodeError:
                break  # a worker killed mid-write: keep what came before
            for frame in chunk["frames"]:
                key = (str(frame[0]), int(frame[1]), str(frame[2]))
                local_frames.append(frames.setdefault(key, len(frames)))
            for local in chunk["stacks"]:
                key = tuple(local_frames[item] for item in local)
                local_stacks.append(stacks.setdefault(key, len(stacks)))
            for ts, stack_id in zip(chunk["ts_ns"], chunk["stack"]):
                rows.append((int(ts), int(chunk["pid"]), local_stacks[stack_id]))
        try:
            path.unlink()
        except OSError:
            pass
    try:
        directory.rmdir()
    except OSError:
        pass
    rows.sort()
    return rows


# -- what counts as library code ------------------------------------------------------------------
def library_paths() -> tuple[str, ...]:
    """Path prefixes of library code here: the stdlib, site-packages, torch, stepscope."""
    paths = {sysconfig.get_paths().get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        paths.update(site.getsitepackages())
    except AttributeError:  # virtualenvs of old
        pass
    torch = sys.modules.get("torch")
    torch_file = getattr(torch, "__file__", None) if torch is not None else None
    if torch_file:
        paths.add(os.path.dirname(torch_file))
    paths.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the stepscope package
    return tuple(sorted(path + os.sep for path in paths if path))


def user_paths() -> tuple[str, ...]:
    """Prefixes that are user code although under a library path: stepscope's zoo workloads."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return (os.path.join(package, "zoo") + os.sep,)


__all__ = ["DEFAULT_RATE_HZ", "StackSampler", "StackTable", "WorkerStackStart", "library_paths",
           "start_worker_sampler", "user_paths"]
