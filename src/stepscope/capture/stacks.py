"""Sampling the Python stacks of the training thread and of DataLoader workers, tied to steps.

Mechanism (chosen by measurement, see ``BENCHMARKS.md``, "Stack sampling"): an **in-process
daemon thread** wakes ``rate_hz`` times a second, reads the training thread's frame with
``sys._current_frames()`` and walks it. It needs no permission (an external sampler such as py-spy
needs ptrace rights, absent in many containers), costs a few tens of µs per sample, and can read
the step recorder's current phase at the very moment of the sample.

Each sample stores its timestamp, the phase read from the recorder (``StepRecorder._phase``) and
the stack as interned frame ids. The step index is assigned afterwards from the timestamp and the
committed steps (:func:`stepscope.record.run.steps_of`), which stays right when the recorder merges
or re-opens steps.

**The race, documented.** The sampler reads the frame and then ``_phase`` without a lock. Both are
read while the sampler holds the GIL, so the training thread cannot move in between — unless the
interpreter hands the GIL back to it between those few bytecodes, which it only does once the
training thread has waited a whole switch interval (5 ms) for it. Then the phase may be the one
after the sampled frame's: at most one boundary off, for at most one sample. The same holds for
the walk itself, which reads live frames (their line and caller as they are when read). Reading a
Python int attribute is atomic, so the value is always a valid phase.

**Bias.** The thread needs the GIL. While the training thread runs pure Python the sampler gets
it only after a switch interval (5 ms by default); while a torch operator runs (operators release
the GIL) it gets it at once. A sample therefore lands at the training thread's next GIL release
within a switch interval of its tick: pure-Python stretches of a few ms are under-sampled in favour
of the lines that call operators (measured in ``benchmarks/bench_stacks.py``). Measured on a loop
of ~2 ms pure-Python calls and torch matmuls: 72% of the time in pure Python drew 5% of the samples
at 5 ms, ~70% at 0.5 ms and below. So while sampling, the GIL switch interval is lowered to
:data:`SWITCH_INTERVAL_S` in the training process (restored at stop; left alone when the script
set its own) and to :data:`WORKER_SWITCH_INTERVAL_S` in DataLoader workers. The interval only
matters while a second thread waits for the GIL: it changes nothing for a training thread alone
with the sampler, and makes the script's own GIL-hungry threads, if any, take turns more often
(more thread switches, the same work and results). A collection of the garbage collector holds the GIL: its time is not sampled (the GC pause
overlay, :mod:`stepscope.capture.gc_pauses`, measures it exactly).

**DataLoader workers.** Every multi-process DataLoader iterator gets a chained ``worker_init_fn``
(:class:`WorkerStackStart`, picklable, so ``spawn`` works too) that starts the same kind of sampler
thread inside each worker; it appends its samples to a file in the run directory, and the main
process merges them when capture ends. A worker sample takes the phase and step of the main
thread's latest sample before it (within two sampling periods), and only worker samples taken while
the main thread waited for data are kept.
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
#: Innermost frames kept per sample.
MAX_DEPTH = 128
#: Worker samples are written to their file in chunks of this many samples (and at exit).
WORKER_CHUNK = 64
MECHANISM = "thread:sys._current_frames"
#: GIL switch interval while sampling, in the training process (Python's default is 5 ms)…
SWITCH_INTERVAL_S = 0.0005
#: …and inside DataLoader workers (where the sampler is the only other Python thread).
WORKER_SWITCH_INTERVAL_S = 0.0002
PYTHON_SWITCH_INTERVAL_S = 0.005

#: Recorder phase index (capture.recorder: other, data_wait, forward, backward, optimizer) -> PHASES index.
_PHASE_OF_RECORDER = tuple(PHASES.index(name) for name in ("other", "data_wait", "forward", "backward", "optimizer",
                                                          "communication"))
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
        self._code_ids: dict[tuple[int, int], int] = {}  # (id(code), instruction offset) -> frame id
        self._codes: list[Any] = []
        self._location_ids: dict[tuple[str, int, str], int] = {}
        self._stack_ids: dict[tuple[int, ...], int] = {}

    def __len__(self) -> int:
        return len(self.ts_ns)

    def _intern(self, frame: Any) -> int:
        code = frame.f_code
        self._codes.append(code)  # alive, so its id() is never reused
        location = (code.co_filename, frame.f_lineno or 0, getattr(code, "co_qualname", code.co_name))
        frame_id = self._location_ids.get(location)
        if frame_id is None:
            frame_id = self._location_ids[location] = len(self.frames)
            self.frames.append(location)
        return frame_id

    def add(self, ts_ns: int, phase: int, frame: Any, root: Any = None) -> None:
        """Record one sample: ``frame`` is the innermost frame of the sampled thread; the walk
        stops at ``root`` when given (a worker's ``_worker_loop``: the frames above it are the
        parent's, inherited through fork)."""
        ids = []
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
                table.add(clock(), phase_of(), frame, root)
                del frame
                if self.on_sample is not None:
                    self.on_sample()
            next_ns = max(next_ns + interval_ns, clock())

    def stop(self) -> None:
        """Stop the thread; ``cpu_ns`` becomes the CPU time it used (read from its CPU clock, not
        per sample: a thread CPU clock read is a system call, as costly as a sample here)."""
        if self.is_alive() and self.ident is not None:
            try:
                self.cpu_ns = time.clock_gettime_ns(time.pthread_getcpuclockid(self.ident))
            except (AttributeError, OSError):
                pass
        self.stopping = True
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout=1.0)


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
        self._thread: _SamplerThread | None = None
        self._watcher: Any = None
        self._undo: list[Any] = []
        self._saved_interval: float | None = None
        self.switch_interval_s = switch_interval_s

    def _phase(self) -> int:
        recorder = self.recorder
        return _PHASE_OF_RECORDER[recorder._phase] if recorder is not None else -1

    def start(self) -> StackSampler:
        """Start the sampler thread and, once torch is imported, the worker hook."""
        if self.switch_interval_s is not None and sys.getswitchinterval() == PYTHON_SWITCH_INTERVAL_S:
            self._saved_interval = sys.getswitchinterval()  # the default, not one the script chose
            sys.setswitchinterval(self.switch_interval_s)
        self._thread = _SamplerThread(self.table, self.thread_id, self.rate_hz, self._phase)
        self._thread.start()
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

            iterator_cls.__init__ = __init__
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
        worker_rows = _read_worker_files(self.worker_dir, frames, stacks, ts, phase, 2 * 10**9 // self.rate_hz)
        for row in worker_rows:
            ts.append(row[0])
            phase.append(_DATA_WAIT)
            role.append(_WORKER)
            pid.append(row[1])
            stack.append(row[2])
        thread = self._thread
        if thread is not None and thread.error:
            self.warnings.once("stacks-failed", f"stack sampling stopped early ({thread.error})")
        return StackSamples(
            rate_hz=self.rate_hz, mechanism=MECHANISM,
            frames=tuple(StackFrame(*frame) for frame in frames),
            stacks=tuple(stacks), ts_ns=_column(ts), step=steps_of(_column(ts), steps), phase=_column(phase),
            role=_column(role), pid=_column(pid), stack=_column(stack),
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
    if sys.getswitchinterval() > WORKER_SWITCH_INTERVAL_S:
        sys.setswitchinterval(WORKER_SWITCH_INTERVAL_S)
    table = StackTable()
    writer = _WorkerFile(table, directory)
    thread = _SamplerThread(table, threading.get_ident(), rate_hz, lambda: -1, on_sample=writer.maybe_flush,
                            root=root)
    thread.start()
    from multiprocessing import util

    util.Finalize(None, _stop_and_flush, args=(thread, writer), exitpriority=100)


def _stop_and_flush(thread: _SamplerThread, writer: _WorkerFile) -> None:
    thread.stop()
    try:
        writer.flush()
    except OSError:
        pass


def _read_worker_files(directory: Path | None, frames: dict, stacks: dict, main_ts: list[int],
                       main_phase: list[int], max_gap_ns: int) -> list[tuple[int, int, int]]:
    """Worker samples taken during the main thread's data waits, as ``(ts_ns, pid, stack id)``.

    Frames and stacks are re-interned into the main tables ``frames``/``stacks``. The worker files
    are removed once read.
    """
    if directory is None or not directory.is_dir():
        return []
    import bisect

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
                at = bisect.bisect_right(main_ts, ts) - 1
                if at >= 0 and ts - main_ts[at] <= max_gap_ns and main_phase[at] == _DATA_WAIT:
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
    if torch is not None and getattr(torch, "__file__", None):
        paths.add(os.path.dirname(torch.__file__))
    paths.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the stepscope package
    return tuple(sorted(path + os.sep for path in paths if path))


def user_paths() -> tuple[str, ...]:
    """Prefixes that are user code although under a library path: stepscope's zoo workloads."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return (os.path.join(package, "zoo") + os.sep,)


__all__ = ["DEFAULT_RATE_HZ", "StackSampler", "StackTable", "WorkerStackStart", "library_paths",
           "start_worker_sampler", "user_paths"]
