"""The training thread's account: where each phase's wall time went, measured on sampled steps.

For one step in :data:`EVERY` on average (one in :data:`EVERY_EARLY` while a run is young, so a
short run still gets a few; the gaps are random, so a loop's own rhythm cannot alias with them), the account listens to the recorder's phase boundaries and reads, at each one,
the training thread's CPU clock, its run-queue wait from the scheduler's counters
(``/proc/self/task/<tid>/schedstat``: nanoseconds runnable but waiting for a core) and the whole
process's CPU clock (every thread of the process), in one C call that keeps the GIL. Between two boundaries the thread was in one phase, so each phase of the
sampled step splits exactly into:

- **on CPU**: the thread ran (Python, operators, the loader's work in the main process);
- **waiting for a core**: runnable, but the cores were taken (the kernel's run-queue delay — the
  direct measure of CPU contention);
- **off CPU**: the rest of the wall time — blocked in the kernel (a DataLoader queue, I/O, a lock,
  a sleep, a collective, or the GIL held by another thread of the process);

and the process's other threads' CPU over the same intervals (intra-op threads, Python threads,
the pin-memory thread) says what ran beside it. At the end of capture :func:`thread_table` lists the
process's threads with their CPU and run-queue totals, so a Python thread that held the GIL can be
named with its function. A Python thread that ends before capture does (a logger joined after the
loop) is read as it ends (:class:`_EndReader`), in the thread itself: its totals are exact however
short the run.

**What the thread waited in.** Off CPU says the thread slept, not on what. A sampler thread of the C
extension (``_fastrec.wait_sampler_start``/``wait_sampler_stop``), which never takes the GIL, reads the training thread's state every
:data:`WAIT_INTERVAL_NS` on the wall clock and, while it sleeps, the kernel function it sleeps in
(``/proc/self/task/<tid>/wchan``): a futex (a lock: the GIL, a condition variable), a sleep, a
poll, a pipe or socket read, the disk. Each sample is kept with the recorder's open step and phase
(``ThreadAccount.waits``, :data:`stepscope.record.run.WAIT_CLASSES`), so the analysis splits a
phase's time off CPU by what the thread slept in. A Python sampler thread could not do this: it
would add a Python thread to the GIL contention it measures, and it could only look at the
training thread while holding the GIL itself, when that thread, if it ran Python, waits for it.

Cost: a listener call and one reading (~5 µs, most of it the kernel formatting ``schedstat``) per
phase boundary of a sampled step, nothing on the other steps (``benchmarks/bench_capture.py
--hook-cost``; BENCHMARKS.md). The wait sampler costs its own thread one ``/proc`` read and a wake-up
per tick (:data:`WAIT_INTERVAL_NS`) and nothing in the training thread. Without ``/proc``
(not Linux) or with ``STEPSCOPE_THREAD_ACCOUNT=0`` the account is off; without the C extension, or
with ``STEPSCOPE_WAIT_SAMPLER=0``, the waits are not sampled.
"""

from __future__ import annotations

import os
import random
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from stepscope.capture.recorder import FASTREC, NEVER, PHASE_NAMES
from stepscope.capture.warn import WarningSink
from stepscope.record.run import PHASES, ThreadAccount, ThreadInfo
from stepscope.switches import switch

#: One step in this many is accounted once the run has :data:`EARLY_STEPS` steps...
EVERY = 32
#: ...and one in this many before, so a short run still gets several accounted steps.
EVERY_EARLY = 8
EARLY_STEPS = 128
#: The first steps are warm-up (imports, allocator growth): not accounted.
FIRST = 2
#: Accounted steps kept at most (a step's row is 4 x 7 integers).
MAX_ROWS = 20_000

#: The process's thread table is snapshotted at most this often (seconds), between two steps
#: neither of which is accounted (its ~0.25 ms is no accounted step's): a thread that ends before
#: capture does (a logger joined in the script's teardown) keeps its last totals and the time they
#: were read, so its rate is its CPU over the time it was seen. Bounded by time alone, a snapshot
#: costs at most 0.05 % of the run whatever the step time (after the first second: see below).
SNAPSHOT_S = 0.5
#: The first snapshots come sooner: after this long, then twice as long each time up to
#: :data:`SNAPSHOT_S`. The first is taken at the first accounted step, before the intra-op threads
#: have run (a parallel operator starts them), so the peers chosen then are start-up's threads; a
#: run whose steps last less than :data:`SNAPSHOT_S` (a neighbour stalling its 2 ms steps by
#: taking the core their intra-op thread needs: +46 %) never chose again and read no wait. About six
#: snapshots more in the first second, ~0.25 ms each.
SNAPSHOT_FIRST_S = 0.02

#: The process's busiest other non-Python threads (intra-op, interop) whose run-queue wait is read
#: at the start and the end of each accounted step: when one of them waits for a core, a parallel
#: operator waits for it at its barrier -- on CPU in the training thread, which spins there -- so
#: the training thread's own counter does not show that contention.
PEERS = 2
#: A thread with less CPU than this over the run so far is no peer worth reading.
PEER_MIN_CPU_NS = 10_000_000

#: The wait sampler's period on the wall clock (200 Hz: a phase 10 % of a 2.5 s steady window off
#: CPU gets ~50 samples; each tick cost its thread ~27 µs of CPU on the 2-core development VM, 0.5 %
#: of a core, most of it the timer's wake-up, BENCHMARKS.md "Wait sampler") and the samples it
#: keeps at most (8 bytes each; only samples off CPU are kept: 40 minutes of a thread that never runs).
WAIT_INTERVAL_NS = 5_000_000
WAIT_CAPACITY = 500_000

#: recorder phase index -> record phase index (the record's order is PHASES)
_TO_RECORD = tuple(PHASES.index(name) for name in PHASE_NAMES)
_FIELDS = 4  # wall, cpu, runq, process cpu
_WIDTH = 1 + _FIELDS * len(PHASES)


def read_schedstat(fd: int) -> tuple[int, int]:
    """(on-CPU ns, run-queue wait ns) from an open ``schedstat`` file. The on-CPU field of a
    running thread lags by up to a scheduler tick: the account reads the thread's CPU clock instead."""
    fields = os.pread(fd, 96, 0).split()
    return int(fields[0]), int(fields[1])


def _python_sample(fd: int) -> tuple[int, int, int, int]:
    """:func:`sched_sample` where the C extension is not built (the same reads, the clocks between two
    readings of the run-queue counter until both agree). ``os.pread`` releases the GIL: with another
    Python thread running, each read can make the training thread wait for the GIL."""
    runq = read_schedstat(fd)[1]
    for _ in range(4):
        sample = (time.perf_counter_ns(), time.thread_time_ns(), runq,
                  time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID))
        again = read_schedstat(fd)[1]
        if again == runq:
            break
        runq = again
    return sample[0], sample[1], runq, sample[3]


#: (monotonic ns, the calling thread's CPU ns, its run-queue wait ns, the process's CPU ns)
sched_sample: Callable[[int], tuple[int, int, int, int]] = (
    FASTREC.sched_sample if FASTREC is not None and hasattr(FASTREC, "sched_sample") else _python_sample)


def _python_runq(fd: int) -> int:
    """:func:`sched_runq` where the C extension is not built (``os.pread`` releases the GIL)."""
    return read_schedstat(fd)[1]


#: one reading of an open ``schedstat``'s run-queue wait (a peer thread's), keeping the GIL
sched_runq: Callable[[int], int] = (
    FASTREC.sched_runq if FASTREC is not None and hasattr(FASTREC, "sched_runq") else _python_runq)


class ThreadAccountProbe:
    """Listens to the recorder's boundaries on sampled steps (see the module docstring).

    Args:
        recorder: the :class:`~stepscope.capture.recorder.StepRecorder`; its ``listener`` is taken
            for the sampled steps and handed back (to ``chained``, the profiler's listener, which
            keeps receiving every boundary).
        warnings: a failure turns the account off with one warning.
    """

    def __init__(self, recorder: Any, warnings: WarningSink):
        self.rec = recorder
        self.warn = warnings
        self.tid = threading.get_native_id()
        self.chained = recorder.listener
        self.rows = array("q")
        self.fd = -1
        self.enabled = False
        self._attached = False
        self._row: list[int] = []
        self._phase = 0
        self._last: tuple[int, int, int, int] = (0, 0, 0, 0)
        self._rng = random.Random(self.tid)  # its own generator: the script's random state is untouched
        self._seen: dict[int, ThreadInfo] = {}  # the thread table's last snapshot of each thread
        self._snapshot_ns = 0
        self._snapshot_every_s = SNAPSHOT_FIRST_S  # doubles to SNAPSHOT_S
        self.peer_runq = array("q")  # per accounted step: the longest wait for a core of the peers
        self._peers: dict[int, int] = {}  # tid -> open schedstat fd
        self._peer_start: list[int] = []
        self._next = FIRST  # the next step to account
        self._ends: _EndReader | None = None
        try:
            self.fd = os.open(f"/proc/self/task/{self.tid}/schedstat", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            sched_sample(self.fd)
            self.enabled = True
        except (OSError, ValueError, IndexError):
            self.enabled = False  # no per-thread scheduler counters here (not Linux, or no schedstat)
        if self.enabled:
            self._ends = _EndReader(self._seen)
            self._ends.install()
        self.waits: tuple[tuple[int, int, int, int], ...] = ()
        self._waits_on = self.enabled and _start_wait_sampler(self, recorder, warnings)

    # -- scheduling ----------------------------------------------------------------------------
    def _gap(self, index: int) -> int:
        """Steps to the next accounted one: random, :data:`EVERY` (:data:`EVERY_EARLY` early) on
        average. A fixed period would alias with a loop's own rhythm (a GIL handed over every other
        step, a log every 4th) and account only its slow or only its fast steps."""
        every = EVERY_EARLY if index < EARLY_STEPS else EVERY
        return self._rng.randint(1, 2 * every - 1)

    def on_commit(self, index: int) -> int:
        """After committed step ``index``: finish the accounted step, start the next one when due;
        returns the next index to be called at."""
        if not self.enabled:
            return NEVER
        try:
            if self._attached:
                self._detach(index)
                self._next = index + self._gap(index)
            upcoming = index + 1  # the step now opening is committed as index + 1
            if upcoming >= self._next and len(self.rows) < MAX_ROWS * _WIDTH:
                self._attach(upcoming)
                return upcoming
            self._snapshot()  # between two steps neither of which is accounted
            return max(index + 1, self._next - 1)
        except Exception as exc:  # noqa: BLE001 - capture must never break the run
            self._fail(exc)
            return NEVER

    def _attach(self, step: int) -> None:
        self._row = [step] + [0] * (_FIELDS * len(PHASES))
        self._phase = self.rec.current_phase()
        self._peer_start = self._peer_waits()
        self._last = self._read()
        self.chained = self.rec.listener
        self.rec.listener = self
        self._attached = True

    def _detach(self, index: int) -> None:
        self._close_segment()
        self.rec.listener = self.chained
        self._attached = False
        ends = self._peer_waits()
        if self._row and self._row[0] == index:  # the step accounted is the one just committed
            self.rows.extend(self._row)
            self.peer_runq.append(max((end - start for start, end in zip(self._peer_start, ends)
                                       if start >= 0 and end >= start), default=0))

    def _snapshot(self) -> None:
        """The thread table, at most every :data:`SNAPSHOT_S` (sooner at first: :data:`SNAPSHOT_FIRST_S`),
        and the peers chosen from it."""
        now = time.perf_counter_ns()
        if self._snapshot_ns == 0 or now - self._snapshot_ns >= self._snapshot_every_s * 1e9:
            if self._snapshot_ns:
                self._snapshot_every_s = min(SNAPSHOT_S, 2 * self._snapshot_every_s)
            self._snapshot_ns = now
            seen, ends = self._seen, self._ends
            ended = ends.ended if ends is not None else set()
            for item in thread_table(self.tid):
                if item.native_id not in ended:  # never over a reading taken as the thread ended
                    seen[item.native_id] = replace(item, until_ns=now)
            self._choose_peers()

    def _peer_waits(self) -> list[int]:
        """The peers' run-queue counters now (-1 for one that ended), read keeping the GIL."""
        waits = []
        for fd in self._peers.values():
            try:
                waits.append(sched_runq(fd))
            except OSError:
                waits.append(-1)
        return waits

    def _choose_peers(self) -> None:
        """The :data:`PEERS` busiest live non-Python threads besides the training one, by CPU so far."""
        live = {int(entry) for entry in os.listdir("/proc/self/task") if entry.isdigit()}
        busiest = sorted((item for item in self._seen.values()
                          if item.native_id in live and not item.python and not item.training
                          and item.cpu_ns >= PEER_MIN_CPU_NS), key=lambda item: -item.cpu_ns)[:PEERS]
        wanted = {item.native_id for item in busiest}
        for tid in [tid for tid in self._peers if tid not in wanted]:
            _close(self._peers.pop(tid))
        for tid in wanted - set(self._peers):
            try:
                self._peers[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                continue  # ended meanwhile

    def close(self) -> None:
        """Capture ends: hand the listener back; an unfinished step is dropped."""
        if self._waits_on:
            self._waits_on = False
            global _WAIT_OWNER
            _WAIT_OWNER = None
            try:
                data, _, dropped = FASTREC.wait_sampler_stop()
                self.waits = _wait_counts(data)
            except Exception as exc:  # noqa: BLE001 - capture must never break the run
                self.warn.once("wait-sampler", f"what the training thread waited in was not sampled ({exc})")
            else:
                if dropped:
                    self.warn.once("wait-sampler", f"the wait sampler kept its first {WAIT_CAPACITY} samples off CPU "
                                                   f"and dropped {dropped} later ones")
        if self._attached:
            self.rec.listener = self.chained
            self._attached = False
        if self.fd >= 0:
            _close(self.fd)
            self.fd = -1
        for fd in self._peers.values():
            _close(fd)
        self._peers.clear()
        if self._ends is not None:
            self._ends.uninstall()

    def _fail(self, exc: BaseException) -> None:
        self.enabled = False
        if self._attached:
            self.rec.listener = self.chained
            self._attached = False
        self.warn.once("thread-account", f"thread account stopped ({exc}); the step's phases are not split "
                                         "into on-CPU / waiting / blocked time")

    # -- the listener (called by the recorder at each boundary of an accounted step) ----------
    def start(self, name: str) -> None:
        if name != "step":  # a step boundary changes no phase: nothing to close
            self._boundary()
        if self.chained is not None:
            self.chained.start(name)

    def stop(self, name: str) -> None:
        if name != "step":
            self._boundary()
        if self.chained is not None:
            self.chained.stop(name)

    def _boundary(self) -> None:
        try:
            self._close_segment()
            self._phase = self.rec.current_phase()
        except Exception as exc:  # noqa: BLE001 - capture must never break the run
            self._fail(exc)

    def _read(self) -> tuple[int, int, int, int]:
        return sched_sample(self.fd)

    def _close_segment(self) -> None:
        now = self._read()
        last, row = self._last, self._row
        base = 1 + _FIELDS * _TO_RECORD[self._phase]
        for offset in range(_FIELDS):
            row[base + offset] += now[offset] - last[offset]
        self._last = now

    # -- the result ---------------------------------------------------------------------------
    def _final(self, item: ThreadInfo) -> ThreadInfo:
        """A thread still listed when capture ends, as the account keeps it."""
        seen = self._seen.get(item.native_id)
        if seen is None:
            return item
        if self._ends is not None and item.native_id in self._ends.ended:
            return seen  # read as it ended, not reaped yet: its end reading
        if not item.python and seen.python:  # just joined, no longer in threading: the snapshot's
            return replace(item, name=seen.name, function=seen.function, python=True)  # name, totals the latest
        return item

    def result(self, threads: tuple[ThreadInfo, ...] = ()) -> ThreadAccount | None:
        """The accounted steps and ``threads`` (the table at the end of capture), with the threads
        that ended before it as their last snapshot showed them."""
        live = {item.native_id for item in threads}
        threads = (*(self._final(item) for item in threads),
                   *(item for tid, item in sorted(self._seen.items()) if tid not in live))
        started = self._ends.started if self._ends is not None else {}
        threads = tuple(replace(item, since_ns=started[item.native_id])
                        if not item.since_ns and item.native_id in started else item for item in threads)
        if not self.rows and not threads:
            return None
        rows = [tuple(self.rows[i:i + _WIDTH]) for i in range(0, len(self.rows), _WIDTH)]
        phases = len(PHASES)

        def field(offset: int) -> tuple[tuple[int, ...], ...]:
            return tuple(tuple(row[1 + _FIELDS * phase + offset] for phase in range(phases)) for row in rows)

        peers = tuple(self.peer_runq) if len(self.peer_runq) == len(rows) else ()
        return ThreadAccount(
            every=EVERY, every_early=EVERY_EARLY, tid=self.tid, steps=tuple(row[0] for row in rows),
            wall_ns=field(0), cpu_ns=field(1), runq_ns=field(2), process_cpu_ns=field(3), threads=threads,
            peer_runq_ns=peers, waits=self.waits, wait_interval_ns=WAIT_INTERVAL_NS if self.waits else 0)


#: The probe whose samples the C extension's one wait sampler collects (None: it is not running).
_WAIT_OWNER: ThreadAccountProbe | None = None


def _start_wait_sampler(probe: ThreadAccountProbe, recorder: Any, warnings: WarningSink) -> bool:
    """Start the C extension's wait sampler on the probe's thread; False where it cannot run (no C
    core under the recorder, ``STEPSCOPE_WAIT_SAMPLER=0``, no ``/proc``: one warning then). A probe
    never closed (a session abandoned in the same process) loses the sampler to the new one."""
    global _WAIT_OWNER
    if not switch("STEPSCOPE_WAIT_SAMPLER", True) or FASTREC is None or not hasattr(FASTREC, "wait_sampler_start"):
        return False
    if _WAIT_OWNER is not None:
        _WAIT_OWNER._waits_on = False
        _WAIT_OWNER = None
        FASTREC.wait_sampler_stop()
    try:
        FASTREC.wait_sampler_start(recorder, probe.tid, WAIT_INTERVAL_NS, WAIT_CAPACITY)
    except TypeError:
        return False  # the recorder runs on the Python core
    except Exception as exc:  # noqa: BLE001 - capture must never break the run
        warnings.once("wait-sampler", f"what the training thread waited in is not sampled ({exc})")
        return False
    _WAIT_OWNER = probe
    return True


def _wait_counts(data: bytes) -> tuple[tuple[int, int, int, int], ...]:
    """The sampler's samples (int64: step << 8 | recorder phase << 4 | class) as (step, record
    phase, class, samples), by step, phase and class."""
    counts: dict[tuple[int, int, int], int] = {}
    for value in array("q", data):
        key = (value >> 8, _TO_RECORD[(value >> 4) & 15], value & 15)
        counts[key] = counts.get(key, 0) + 1
    return tuple((*key, count) for key, count in sorted(counts.items()))


class _EndReader:
    """Reads each Python thread's scheduler totals as the thread ends, into ``seen``.

    ``threading.setprofile`` runs a hook once at the start of every thread started through
    :mod:`threading` after :meth:`install` (the hook removes itself at its first event, before the
    thread's ``run``: no cost and no frame later). It leaves an object in a ``threading.local``; the
    interpreter drops a thread's locals as the thread ends, in that thread, so the object's
    ``__del__`` reads ``/proc/thread-self/schedstat`` there, with the thread's complete totals.
    """

    def __init__(self, seen: dict[int, ThreadInfo]):
        self.seen = seen
        self.started: dict[int, int] = {}  # tid -> when the thread started
        self.ended: set[int] = set()  # threads read as they ended
        self.live = True
        self.local = threading.local()

    def install(self) -> None:
        current = _current_profile_hook()  # the script's own hook, or a profiler's, stays
        if current is None or isinstance(getattr(current, "__self__", None), _EndReader):
            threading.setprofile(self._hook)

    def uninstall(self) -> None:
        self.live = False
        if _current_profile_hook() == self._hook:
            threading.setprofile(None)  # type: ignore[arg-type]

    def _hook(self, frame: Any, event: str, arg: Any) -> None:
        import sys

        sys.setprofile(None)
        try:
            thread = threading.current_thread()
            function = _function_of(thread)
            if not function.startswith("stepscope.") and thread.native_id is not None:
                self.local.end = _ThreadEnd(self, thread.native_id, thread.name, function)
                self.started[thread.native_id] = time.perf_counter_ns()
        except Exception:  # noqa: BLE001 - capture must never break the thread
            pass


class _ThreadEnd:
    __slots__ = ("reader", "tid", "name", "function")

    def __init__(self, reader: _EndReader, tid: int, name: str, function: str):
        self.reader, self.tid, self.name, self.function = reader, tid, name, function

    def __del__(self) -> None:  # the thread is ending, in the thread itself
        try:
            if not self.reader.live or threading.get_native_id() != self.tid:
                return
            with open("/proc/thread-self/schedstat", "rb") as handle:
                fields = handle.read().split()
            self.reader.seen[self.tid] = ThreadInfo(
                native_id=self.tid, name=self.name, function=self.function, cpu_ns=int(fields[0]),
                runq_ns=int(fields[1]), python=True, until_ns=time.perf_counter_ns(),
                since_ns=self.reader.started.get(self.tid, 0))
            self.reader.ended.add(self.tid)
        except Exception:  # noqa: BLE001 - an exception here would be printed to the user's stderr
            pass


def _current_profile_hook() -> Any:
    getter = getattr(threading, "getprofile", None)  # Python 3.12+
    return getter() if getter is not None else getattr(threading, "_profile_hook", None)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _function_of(thread: threading.Thread) -> str:
    target: Any = getattr(thread, "_target", None)
    if target is None:
        run: Callable[..., Any] = type(thread).run
        if run is threading.Thread.run:
            return ""
        target = run
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    return f"{module}.{name}" if module else str(name)


def thread_table(training_tid: int, proc: str = "/proc/self/task") -> tuple[ThreadInfo, ...]:
    """Every thread of the process with its scheduler totals: Python threads by name and target
    function, the others (intra-op, the allocator's, the runtime's) under their OS names.
    stepscope's own threads (checkpoints, samplers) are left out; the training thread is marked."""
    python = {thread.native_id: thread for thread in threading.enumerate() if thread.native_id is not None}
    out: list[ThreadInfo] = []
    try:
        tids = sorted(int(entry) for entry in os.listdir(proc) if entry.isdigit())
    except OSError:
        return ()
    for tid in tids:
        thread = python.get(tid)
        function = _function_of(thread) if thread is not None else ""
        if function.startswith("stepscope."):
            continue
        try:
            with open(f"{proc}/{tid}/schedstat", "rb") as handle:
                fields = handle.read().split()
            with open(f"{proc}/{tid}/comm", "rb") as handle:
                comm = handle.read().decode("utf-8", "replace").strip()
        except OSError:
            continue  # exited meanwhile
        out.append(ThreadInfo(
            native_id=tid, name=thread.name if thread is not None else comm, function=function,
            cpu_ns=int(fields[0]), runq_ns=int(fields[1]), python=thread is not None, training=tid == training_tid))
    return tuple(out)


__all__ = ["EVERY", "EVERY_EARLY", "ThreadAccountProbe", "read_schedstat", "thread_table"]
