"""How one thread samples its own Python stack into a table: the ``SIGPROF`` handler that runs in the
main thread (:class:`_SignalSampler`), the sampler thread for another thread where reading its
frames is safe (:class:`_SamplerThread`, Python >= 3.12), and the table of interned frames, stacks
and per-sample columns they fill (:class:`StackTable`). Why the main thread samples itself, and the
bias of CPU-clock ticks: :mod:`stepscope.capture.stacks`, which runs these for a session and its
DataLoader workers.
"""

from __future__ import annotations

import sys
import threading
import time
from array import array
from typing import Any

#: A wall-clock sample stands for the ticks since the previous one, up to this many (a longer gap
#: is not the sampled code's: the process was stopped, or sampling paused).
MAX_WEIGHT_TICKS = 50
#: Innermost frames kept per sample.
MAX_DEPTH = 128
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
        self.refused = False  # start() declined (the script profiles itself): ``error`` says why

    def start(self) -> None:
        signal = self.signal
        number = getattr(signal, _TIMER_SIGNAL)
        current = signal.getsignal(number)
        inherited = isinstance(getattr(current, "__self__", None), _SignalSampler)  # a forked worker
        if (current not in (signal.SIG_DFL, None) and not inherited) or signal.getitimer(signal.ITIMER_PROF)[0]:
            self.error = "the script uses SIGPROF or ITIMER_PROF itself; stacks not sampled"
            self.refused = True
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
