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

How one thread samples itself into a table (the ``SIGPROF`` handler, the sampler thread, the
interned frames and stacks) is :mod:`stepscope.capture.stack_sampling`; this module runs it for a
session and its DataLoader workers and merges what they sampled (its names are importable from
here as before).
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from stepscope.capture.stack_sampling import MAX_DEPTH as MAX_DEPTH
from stepscope.capture.stack_sampling import MAX_WEIGHT_TICKS as MAX_WEIGHT_TICKS
from stepscope.capture.stack_sampling import THREAD_SAMPLER_SAFE as THREAD_SAMPLER_SAFE
from stepscope.capture.stack_sampling import StackTable as StackTable
from stepscope.capture.stack_sampling import _line_before as _line_before
from stepscope.capture.stack_sampling import _SamplerThread, _SignalSampler
from stepscope.capture.stack_sampling import sampler_for as sampler_for
from stepscope.capture.warn import WarningSink
from stepscope.errors import UsageError
from stepscope.record.run import PHASES, STACK_ROLES, StackFrame, StackSamples, StepTable, steps_of

#: Default rate; 100 Hz costs well under 1% of the benchmark step (BENCHMARKS.md).
DEFAULT_RATE_HZ = 100.0
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
        if isinstance(sampler, _SignalSampler) and sampler.refused:
            # only a refusal: an error of a sampler that started (possibly already, on a loaded
            # machine) is said once it is collected, as "stopped early"
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
