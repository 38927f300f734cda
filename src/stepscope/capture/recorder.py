"""The per-step state machine: turns hook calls into exact, additive phase times.

Hooks report *boundaries* (enter/leave a phase, a batch fetched, an optimizer step done); the
recorder attributes every nanosecond between two boundaries to exactly one phase — the innermost
one open — so ``data_wait + forward + backward + optimizer + communication + other == duration`` holds by
construction, whatever nests in what (LBFGS closures, backward inside forward, re-entrant calls).

Step boundaries:

1. *optimizer mode* (the default as soon as an optimizer step was seen): a step ends when an
   optimizer step ends, but it is only *committed* at the next new batch (``next()`` on a loader)
   or when the same optimizer steps again. A different optimizer stepping before any new batch
   (GANs, per-group optimizers) belongs to the same training step and is merged into it.
   Gradient accumulation needs nothing special: micro-batches are counted in ``batches``.
2. *backward mode* (no optimizer seen yet, but a ``backward()`` ended: parameters updated by hand,
   ``p.data.add_(p.grad, alpha=-lr)``): one backward is one step. The step that holds a finished
   backward ends at the next root forward of a model (a module with parameters) or the next
   ``next()`` on a loader, so the hand-written update stays in its step ("other"). Forwards without
   a backward (evaluation) do not delimit steps in this mode: their time lands in the next step,
   as it does in optimizer mode. Gradient accumulation without an optimizer (several backwards per
   update) is not recognised: each backward is a step.
3. *forward mode* (no optimizer, no backward: inference): without a DataLoader, each root forward
   of the model is a step — the step led by a module (the first module with parameters called at
   the root in the step) ends when that same module is called again. With a DataLoader, batches
   delimit the steps and each holds its forwards (batch mode).
4. *batch mode* (the start state): each new batch ends the step that fetched the previous one.
   When the first optimizer step arrives, the steps recorded so far in modes 2-4 are merged into
   the first training step (they were warm-up: sanity checks, a first eval).
5. *explicit mode* (library API): only :meth:`StepRecorder.mark_step` ends steps; it always wins.

Fallback boundaries (modes 2-4) are only taken at the top level of the step (no phase open), so a
closure that runs forward and backward inside ``optimizer.step`` (LBFGS) never splits a step.

The hot path is a clock read and a few integer operations per hook call, with one fused call per
boundary from each hook (``fetch_begin``/``fetch_end``, ``forward_begin``/``forward_end``, the
optimizer's ``optimizer_started``/``optimizer_finished``); a committed step is one row of
:data:`ROW`. Two cores implement these rules with one interface: the C extension
``stepscope.capture._fastrec`` (built at install; a hook call costs a clock read) and
:class:`_PyCore` here, used where the extension is not built, is stale, or
``STEPSCOPE_PURE_PYTHON=1`` is set. The recorder tests run against both. (An event log replayed at
the boundaries was tried in Python and measured: it executes more bytecode per step, not less —
BENCHMARKS.md, "Capture overhead".)

Calls from another thread than the one that created the recorder are ignored and counted
(``foreign_thread_calls``): the training loop is one thread, and a data-prefetching thread or a
``DataParallel`` replica must not open or close the training thread's phases.
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from stepscope.record.run import StepTable
from stepscope.switches import switch

OTHER, DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER, COMMUNICATION, COMPILE = range(7)
PHASE_NAMES = ("other", "data_wait", "forward", "backward", "optimizer", "communication", "compile")

#: Step-boundary modes used until an optimizer (or an explicit ``step()``) takes over.
FALLBACK_MODES = frozenset({"batch", "backward", "forward"})

#: ``next_commit_call`` of a commit callback that needs no further call
NEVER = 1 << 62

_now = time.perf_counter_ns



#: Fields of a committed step, in the order of one row of :attr:`StepRecorder.rows` (the other
#: columns of :data:`~stepscope.record.run.STEP_COLUMNS` are filled in when the steps are read).
ROW = ("start_ns", "duration_ns", "data_wait_ns", "loader_init_ns", "data_wait_cpu_ns", "forward_ns", "backward_ns",
       "optimizer_ns", "communication_ns", "communication_overlap_ns", "other_ns", "compile_ns", "batches", "samples",
       "optimizer_steps")
_WIDTH = len(ROW)
_COL = {name: index for index, name in enumerate(ROW)}
DEVICE_COLUMNS = ("device_ns", "device_forward_ns", "device_backward_ns", "device_optimizer_ns")


class _Columns:
    """Read (and, for the device columns, write) access by column name to the recorder's rows."""

    def __init__(self, recorder: StepRecorder):
        self._rec = recorder

    def __getitem__(self, name: str) -> Any:
        rec = self._rec
        if name in DEVICE_COLUMNS:
            rec._pad_device_columns()
            return rec.device_columns[name]
        rows = array("q")
        rows.frombytes(rec.row_bytes())
        return rows[_COL[name]::_WIDTH]

    def __contains__(self, name: str) -> bool:
        return name in _COL or name in DEVICE_COLUMNS


class _PyCore:
    """The recorder's state machine in Python (the C core, ``_fastrec.Core``, has the same
    interface; see the module docstring). ``clock=None`` reads :func:`time.perf_counter_ns`."""

    __slots__ = ("clock", "listener", "owner_thread", "_rows", "count", "mode", "foreign_thread_calls",
                 "trailing_ns", "_batch_mode_rows", "backwards", "unseen_forward_steps", "model_forwards",
                 "model_forwards_no_grad",
                 "optimizer_steps", "_stack", "_phase", "_depth", "_start", "_last", "_pending", "on_commit", "device",
                 "comm", "_acc", "_overlap_ns", "_init_ns", "_wait_cpu_ns", "_batches", "_samples", "_samples_known",
                 "_wait_cpu_known", "at_boundary", "_opt_steps", "_optimizers", "_backward_done", "_lead", "_lead_done",
                 "next_commit_call", "forward_depth", "__dict__", "__weakref__")

    def __init__(self, clock: Callable[[], int] | None = None, phase_listener: Any = None):
        self.clock = clock or _now
        self.listener = phase_listener
        self.owner_thread = threading.get_ident()
        self._rows = array("q")  # _WIDTH values per committed step (ROW)
        self.count = 0  # committed steps
        self.mode = "batch"  # "batch" | "forward" | "backward" | "optimizer" | "explicit"
        self.foreign_thread_calls = 0
        self.trailing_ns = 0
        self._batch_mode_rows = 0  # rows committed in a fallback mode (merged at the first optimizer step)
        self.backwards = 0  # outermost backward() calls seen, whatever the mode
        self.unseen_forward_steps = 0  # committed steps with a backward and no forward timed
        self.model_forwards = 0  # root forwards of modules with parameters
        self.model_forwards_no_grad = 0  # ... of which under torch.no_grad() / inference_mode()
        self.optimizer_steps = 0
        self._stack: list[int] = []
        self._phase = OTHER
        self._depth = 0  # re-entries of the current phase (backward inside backward, ...)
        self._start: int | None = None  # start of the open step
        self._last = 0
        self._reset_step()
        self._pending: tuple[Any, ...] | None = None  # ended, not yet committed step (see _snapshot)
        self.on_commit: Callable[[int], None] | None = None
        #: on_commit is called only for committed step indexes >= this (0: every commit); the
        #: callback moves it to the next step it needs, so steady steps make no Python call
        self.next_commit_call = 0
        self.forward_depth = 0  # non-zero while a root forward runs (capture's forward wrappers)
        #: called after the commits of a batch request or an optimizer step (``run --max-steps``)
        self.at_boundary: Callable[[], None] | None = None
        self.device: Any = None  # a DeviceTimer once CUDA is in use (see cuda_timing.py)
        #: collective timing (capture/collectives.py): ``backward_done(now) -> (exposed, overlapped)``
        self.comm: Any = None

    # the device columns live in Python for both cores (_RecorderAPI)
    _pad_device_columns: Callable[[], None]
    _truncate_device_columns: Callable[[int], None]

    def _foreign(self) -> bool:
        """Whether the caller is another thread (its call is ignored and counted)."""
        if threading.get_ident() == self.owner_thread:
            return False
        self.foreign_thread_calls += 1
        return True

    @property
    def has_pending(self) -> bool:
        return self._pending is not None

    def row_bytes(self) -> bytes:
        return self._rows.tobytes()

    def row_value(self, column: int, index: int) -> int:
        if index < 0:
            index += self.count
        if not (0 <= column < _WIDTH and 0 <= index < self.count):
            raise IndexError("no such step or column")
        return self._rows[index * _WIDTH + column]

    # -- phase accounting ------------------------------------------------------------------
    def _reset_step(self) -> None:
        self._acc = [0, 0, 0, 0, 0, 0, 0]
        self._overlap_ns = self._init_ns = self._wait_cpu_ns = self._batches = self._samples = self._opt_steps = 0
        self._samples_known = self._wait_cpu_known = True
        self._optimizers: tuple[int, ...] = ()
        self._backward_done = False  # a backward ended in this step (backward mode)
        self._lead: int | None = None  # the model whose forward leads this step (forward mode)
        self._lead_done = False

    def _mark(self, now: int) -> None:
        if self.device is not None:
            self.device.boundary(self._phase)
        if self._start is None:
            self._start = now
            if self.listener is not None:
                self.listener.start("step")
        else:
            self._acc[self._phase] += now - self._last
        self._last = now

    # -- the hot path ------------------------------------------------------------------------
    def current_phase(self) -> int:
        """The innermost phase open right now (what the stack sampler and the GC timer read)."""
        return self._phase

    def enter(self, phase: int) -> int:
        """Open ``phase``; returns the timestamp used."""
        now = self.clock()
        if not self._foreign():
            self._enter(phase, now)
        return now

    def leave(self, phase: int) -> int:
        now = self.clock()
        if not self._foreign():
            self._leave(phase, now)
        return now

    def _enter(self, phase: int, now: int) -> None:
        current = self._phase
        if phase == current and self._stack:
            self._depth += 1
            return
        if self.device is not None or self._start is None:
            self._mark(now)
        else:
            self._acc[current] += now - self._last
            self._last = now
        self._stack.append(current * 1000 + self._depth)
        self._phase = phase
        self._depth = 0
        if self.listener is not None:
            self._notify("start", phase)

    def _leave(self, phase: int, now: int) -> None:
        if phase != self._phase or not self._stack:
            return  # unbalanced (an exception skipped a boundary): ignore
        if self._depth:
            self._depth -= 1
            return
        if self.device is not None or self._start is None:
            self._mark(now)
        else:
            self._acc[phase] += now - self._last
            self._last = now
        self._phase, self._depth = divmod(self._stack.pop(), 1000)
        if self.listener is not None:
            self._notify("stop", phase)
        if phase == BACKWARD and self._phase != BACKWARD:
            if self.comm is not None:
                self._settle_backward_comm(now)
            self._backward_left()

    def _settle_backward_comm(self, now: int) -> None:
        """Move the exposed part of the gradient all-reduce from backward to communication."""
        exposed, overlapped = self.comm.backward_done(now)
        exposed = max(0, min(exposed, self._acc[BACKWARD]))
        self._acc[BACKWARD] -= exposed
        self._acc[COMMUNICATION] += exposed
        self._overlap_ns += max(0, overlapped)

    def add_overlap(self, ns: int) -> None:
        """Collective time that ran concurrently with another phase (not part of the partition)."""
        self._overlap_ns += max(0, ns)

    def _backward_left(self) -> None:
        self.backwards += 1
        if self.mode in FALLBACK_MODES and not self._stack:
            self._backward_done = True
            self.mode = "backward"

    def in_data_wait(self) -> bool:
        """Whether the training thread is inside ``next(loader)`` right now."""
        return self._phase == DATA_WAIT

    # -- boundaries reported by hooks ------------------------------------------------------
    def batch_requested(self) -> None:
        """A ``next()`` on a data loader begins: may end the previous step."""
        now = self.clock()
        if not self._foreign():
            self._batch_requested(now)

    def _batch_requested(self, now: int) -> None:
        if self._pending is not None:
            self._commit_pending()
        elif self.mode != "optimizer" and self._fallback_step_done(by_batch=True):
            self._commit_fallback(now)
        if self.at_boundary is not None:
            self.at_boundary()

    def _fallback_step_done(self, by_batch: bool = False) -> bool:
        """Whether the open step is complete under the fallback modes (see the module docstring)."""
        if self.mode not in FALLBACK_MODES or self._start is None or self._stack:
            return False
        if self.mode == "backward":
            return self._backward_done
        return bool(self._batches) if by_batch else (self._lead_done and not self._batches)

    def _commit_fallback(self, now: int) -> None:
        if self.mode == "batch" and not self._batches and self._lead_done:
            self.mode = "forward"
        self._mark(now)
        self._commit_open(now)
        self._batch_mode_rows += 1

    def model_forward_started(self, key: int, grad_enabled: bool = True) -> None:
        """A root forward of a module with parameters (the model) begins: may end the previous step."""
        now = self.clock()
        if not self._foreign():
            self._model_forward_started(now, key, grad_enabled)

    def _model_forward_started(self, now: int, key: int, grad_enabled: bool | int) -> None:
        self.model_forwards += 1
        if not grad_enabled:
            self.model_forwards_no_grad += 1
        if self.mode not in FALLBACK_MODES:
            return
        if self._lead == key or self._backward_done:
            if self._fallback_step_done():
                self._commit_fallback(now)
        if self._lead is None:
            self._lead = key

    def model_forward_finished(self, key: int) -> None:
        if not self._foreign() and key == self._lead:
            self._lead_done = True

    def forward_begin(self, key: int, grad_enabled: bool | int) -> int:
        """A root forward begins (one call from the module hook): :meth:`model_forward_started`
        when the module is the model (``key`` non-zero), then entering the forward phase."""
        now = self.clock()
        if self._foreign():
            return now
        if key:
            self._model_forward_started(now, key, grad_enabled)
        self._enter(FORWARD, now)
        return now

    def forward_end(self, key: int) -> int:
        """The root forward returned (or raised): leaving the forward phase, and
        :meth:`model_forward_finished`."""
        now = self.clock()
        if self._foreign():
            return now
        self._leave(FORWARD, now)
        if key and key == self._lead:
            self._lead_done = True
        return now

    def batch_received(self, batch_len: int) -> None:
        if self._foreign():
            return
        self._batches += 1
        if batch_len >= 0:
            self._samples += batch_len
        else:
            self._samples_known = False

    def fetch_begin(self) -> int:
        """A ``next()`` on a data loader begins: :meth:`batch_requested` and entering the data wait
        (one call from the loader hook); returns the timestamp."""
        now = self.clock()
        if not self._foreign():
            self._batch_requested(now)
            self._enter(DATA_WAIT, now)
        return now

    def fetch_end(self, cpu_ns: int, batch_len: int) -> int:
        """The batch arrived (one call from the loader hook): the fetch's CPU time (-1: not
        measured), leaving the data wait, and its samples (-1: unknown); returns the timestamp."""
        now = self.clock()
        if self._foreign():
            return now
        if cpu_ns >= 0:
            self._wait_cpu_ns += cpu_ns
        else:
            self._wait_cpu_known = False
        self._leave(DATA_WAIT, now)
        self._batches += 1
        if batch_len >= 0:
            self._samples += batch_len
        else:
            self._samples_known = False
        return now

    def loader_init(self, duration_ns: int) -> None:
        if not self._foreign():
            self._init_ns += duration_ns

    def loader_cpu(self, cpu_ns: int) -> None:
        """CPU time the training thread spent inside a batch fetch."""
        if not self._foreign():
            self._wait_cpu_ns += cpu_ns

    def optimizer_started(self, optimizer_id: int) -> None:
        now = self.clock()
        if not self._foreign():
            self._optimizer_started(now, optimizer_id)

    def _optimizer_started(self, now: int, optimizer_id: int) -> None:
        pending = self._pending
        if pending is not None:
            if optimizer_id in pending[_P_OPTIMIZERS]:
                self._commit_pending()
            else:  # another optimizer of the same iteration: reopen the ended step
                self._merge_pending_into_open(now)
        if self.at_boundary is not None:
            self.at_boundary()
        self._enter(OPTIMIZER, now)

    def optimizer_finished(self, optimizer_id: int) -> None:
        now = self.clock()
        if not self._foreign():
            self._optimizer_finished(now, optimizer_id)

    def _optimizer_finished(self, now: int, optimizer_id: int) -> None:
        self._leave(OPTIMIZER, now)
        self._opt_steps += 1
        self.optimizer_steps += 1
        if optimizer_id not in self._optimizers:
            self._optimizers = (*self._optimizers, optimizer_id)
        if self.mode == "explicit":
            return
        if self.mode in FALLBACK_MODES:
            self.mode = "optimizer"
            self._absorb_batch_mode_rows()
        self._mark(now)
        self._pending = self._snapshot(now)
        self._reset_step()
        self._start = now
        self._last = now

    def mark_step(self) -> None:
        """Explicit step end (library API); switches to explicit mode."""
        now = self.clock()
        if self._foreign():
            return
        if self.mode != "explicit":
            if self._pending is not None:
                self._commit_pending()
            self.mode = "explicit"
        if self._start is None:
            self._start = now
            self._last = now
            return
        self._mark(now)
        self._commit_open(now)

    def finish(self) -> None:
        """End of capture: commit what ended; the unfinished tail is only counted."""
        now = self.clock()
        if self._pending is not None:
            self._commit_pending()
        self._stack.clear()  # phases left open by an exception: the step ends here
        if self._fallback_step_done(by_batch=bool(self._batches)):
            self._commit_fallback(now)
        elif self._start is not None:
            self._mark(now)
            self.trailing_ns = now - self._start
        if self._start is not None and self.listener is not None:
            self.listener.stop("step")
        self._start = None

    # -- committing --------------------------------------------------------------------------
    def _snapshot(self, end: int) -> tuple[Any, ...]:
        """An ended step: (start, end, acc, overlap, init, wait_cpu, batches, samples, opt_steps,
        optimizers, device events)."""
        return (self._start if self._start is not None else end, end, self._acc, self._overlap_ns, self._init_ns,
                self._wait_cpu_ns if self._wait_cpu_known else -1, self._batches, self._samples if self._samples_known else -1, self._opt_steps,
                self._optimizers, self.device.take() if self.device is not None else None)

    def _commit_open(self, now: int) -> None:
        self._append(self._snapshot(now))
        self._reset_step()
        self._start = now
        self._last = now

    def _commit_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._append(pending)

    def _merge_pending_into_open(self, now: int) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        self._mark(now)
        start, _end, acc, overlap, init, wait_cpu, batches, samples, opt_steps, optimizers, events = pending
        self._acc = [a + b for a, b in zip(self._acc, acc)]
        self._overlap_ns += overlap
        self._init_ns += init
        if wait_cpu < 0:
            self._wait_cpu_known = False
        self._wait_cpu_ns += max(0, wait_cpu)
        self._batches += batches
        if samples < 0:
            self._samples_known = False
        self._samples += max(0, samples)
        self._opt_steps += opt_steps
        self._optimizers = (*self._optimizers, *(key for key in optimizers if key not in self._optimizers))
        self._start = start
        if self.device is not None and events is not None:
            self.device.current[:0] = events

    def _absorb_batch_mode_rows(self) -> None:
        """Fold the batch-mode steps recorded so far into the open (first training) step."""
        rows = self._batch_mode_rows
        self._batch_mode_rows = 0
        if not rows:
            return
        first = self.count - rows
        table = self._rows
        for r in range(first, self.count):
            row = table[r * _WIDTH:(r + 1) * _WIDTH]
            for phase, name in enumerate(PHASE_NAMES):
                self._acc[phase] += row[_COL[name + "_ns"]]
            self._overlap_ns += row[_COL["communication_overlap_ns"]]
            self._init_ns += row[_COL["loader_init_ns"]]
            if row[_COL["data_wait_cpu_ns"]] < 0:
                self._wait_cpu_known = False
            else:
                self._wait_cpu_ns += row[_COL["data_wait_cpu_ns"]]
            self._batches += row[_COL["batches"]]
            if row[_COL["samples"]] < 0:
                self._samples_known = False
            else:
                self._samples += row[_COL["samples"]]
        self._start = table[first * _WIDTH]
        del table[first * _WIDTH:]
        self.count = first
        self._truncate_device_columns(first)

    def _append(self, step: tuple[Any, ...]) -> None:
        start, end, acc, overlap, init, wait_cpu, batches, samples, opt_steps, _optimizers, events = step
        duration = end - start
        wait = acc[DATA_WAIT]
        self._rows.extend((start, duration, wait, init if init < wait else wait, wait_cpu, acc[FORWARD], acc[BACKWARD],
                          acc[OPTIMIZER], acc[COMMUNICATION], overlap,
                          duration - wait - acc[FORWARD] - acc[BACKWARD] - acc[OPTIMIZER] - acc[COMMUNICATION]
                          - acc[COMPILE], acc[COMPILE], batches, samples if batches else -1, opt_steps))
        if acc[FORWARD] == 0 and acc[BACKWARD] > 0:
            self.unseen_forward_steps += 1
        self.count += 1
        if self.device is not None:
            self._pad_device_columns()
        if self.device is not None and events is not None:
            self.device.step_committed(self.count - 1, events)
        if self.listener is not None:
            self.listener.stop("step")
            self.listener.start("step")
        if self.on_commit is not None and self.count - 1 >= self.next_commit_call:
            self.on_commit(self.count - 1)

    def _notify(self, kind: str, phase: int) -> None:
        if phase != OTHER:
            getattr(self.listener, kind)(PHASE_NAMES[phase])


_P_OPTIMIZERS = 9  # index of the optimizers in an ended step's tuple (_snapshot)


class _RecorderAPI:
    """What both cores share, in Python: named columns, device columns, the final step table."""

    count: int
    device: Any
    model_forwards: int
    backwards: int
    optimizer_steps: int
    row_bytes: Callable[[], bytes]
    row_value: Callable[[int, int], int]

    def __init__(self, clock: Callable[[], int] = _now, phase_listener: Any = None):
        super().__init__(None if clock is _now else clock, phase_listener)  # type: ignore[call-arg]
        self.device_columns: dict[str, array] = {name: array("q") for name in DEVICE_COLUMNS}
        self.columns = _Columns(self)  # type: ignore[arg-type]

    def use_device(self, timer: Any) -> None:
        """Time the phases on the device too (a :class:`~stepscope.capture.cuda_timing.DeviceTimer`)."""
        self.device = timer

    @property
    def inference(self) -> bool:
        """The run only ran forwards: no backward, no optimizer step."""
        return self.model_forwards > 0 and not self.backwards and not self.optimizer_steps

    def value(self, name: str, index: int) -> int:
        """One committed step's value of column ``name`` (of :data:`ROW`)."""
        return self.row_value(_COL[name], index)

    def _pad_device_columns(self) -> None:
        """Device columns as long as the committed steps (-1: not measured); written only on GPU runs."""
        for column in self.device_columns.values():
            if len(column) < self.count:
                column.extend([-1] * (self.count - len(column)))

    def _truncate_device_columns(self, count: int) -> None:
        for column in self.device_columns.values():
            del column[count:]

    def steps(self, device: bool = True) -> StepTable:
        """The committed steps as a frozen, columnar :class:`~stepscope.record.run.StepTable`.

        ``device=False`` leaves the device columns out: the capture's checkpoint thread reads the
        steps while the training thread commits (the rows are copied in one call, so they are
        whole; the device columns are still being drained)."""
        rows = np.frombuffer(self.row_bytes(), dtype=np.int64)
        count = rows.shape[0] // _WIDTH
        table = rows[: count * _WIDTH].reshape(count, _WIDTH)
        columns: dict[str, Any] = {name: table[:, index].copy() for index, name in enumerate(ROW)}
        if device and (self.device is not None or any(len(column) for column in self.device_columns.values())):
            self._pad_device_columns()
            columns.update({name: column[:count] for name, column in self.device_columns.items()})
        return StepTable.from_columns(columns)


class PyStepRecorder(_RecorderAPI, _PyCore):
    """The step recorder on the Python core."""


def _c_core() -> tuple[Any, str | None]:
    """The C extension (``_fastrec``), or None and why it is not used."""
    if switch("STEPSCOPE_PURE_PYTHON", False):
        return None, "STEPSCOPE_PURE_PYTHON is set"
    try:
        from stepscope.capture import _fastrec
    except ImportError as exc:
        return None, f"the C core is not built ({exc})"
    source = Path(__file__).with_name("_fastrec.c")
    if source.is_file():  # a source checkout: a build of older source would run older rules
        built = getattr(_fastrec, "SOURCE_SHA", None)
        if built != hashlib.sha256(source.read_bytes()).hexdigest()[:16]:
            return None, "the C core was built from an older _fastrec.c (reinstall: pip install -e .)"
    return _fastrec, None


#: The C extension when capture runs on it (its Core, and the frame-less hooks PhaseCall and
#: OptimizerHook), else None; PYTHON_CORE_REASON says why not.
FASTREC, PYTHON_CORE_REASON = _c_core()
_CORE = FASTREC.Core if FASTREC is not None else None

if TYPE_CHECKING:  # one interface: the Python core's
    StepRecorder = PyStepRecorder
    CStepRecorder: type[PyStepRecorder] | None
elif _CORE is not None:
    class CStepRecorder(_RecorderAPI, _CORE):
        """The step recorder on the C core."""

    StepRecorder = CStepRecorder
else:
    CStepRecorder = None
    StepRecorder = PyStepRecorder

#: "c" or "python": the core capture runs on (PYTHON_CORE_REASON says why not C)
CORE = "c" if _CORE is not None else "python"
