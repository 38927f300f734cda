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

The hot path uses ``time.perf_counter_ns`` and appends to ``array('q')`` columns; no locks (the
training loop is single-threaded; calls from other threads are ignored and counted).
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Callable
from typing import Any

from stepscope.record.run import STEP_COLUMNS, StepTable

OTHER, DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER, COMMUNICATION, COMPILE = range(7)
PHASE_NAMES = ("other", "data_wait", "forward", "backward", "optimizer", "communication", "compile")

#: Step-boundary modes used until an optimizer (or an explicit ``step()``) takes over.
FALLBACK_MODES = frozenset({"batch", "backward", "forward"})

_now = time.perf_counter_ns


class StepRecorder:
    """Accumulates steps; see the module docstring for the boundary rules.

    Args:
        clock: nanosecond clock (tests pass a fake one).
        phase_listener: optional object with ``start(action)``/``stop(action)`` called at every
            step and phase boundary (a stepscope profiler for ``stepscope run --profiler``).
    """

    def __init__(self, clock: Callable[[], int] = _now, phase_listener: Any = None):
        self.clock = clock
        self.listener = phase_listener
        self.owner_thread = threading.get_ident()
        self.columns: dict[str, array] = {name: array("q") for name in STEP_COLUMNS}
        self.count = 0  # committed steps (columns may be longer mid-append)
        self.mode = "batch"  # "batch" | "forward" | "backward" | "optimizer" | "explicit"
        self.foreign_thread_calls = 0
        self.trailing_ns = 0
        self._batch_mode_rows = 0  # rows committed in a fallback mode (merged at the first optimizer step)
        self.backwards = 0  # outermost backward() calls seen, whatever the mode
        self.model_forwards = 0  # root forwards of modules with parameters
        self.model_forwards_no_grad = 0  # ... of which under torch.no_grad() / inference_mode()
        self.optimizer_steps = 0
        self._stack: list[int] = []
        self._phase = OTHER
        self._depth = 0  # re-entries of the current phase (backward inside backward, ...)
        self._start: int | None = None  # start of the open step
        self._last = 0
        self._reset_step()
        self._pending: dict[str, Any] | None = None  # ended, not yet committed step
        self.on_commit: Callable[[int], None] | None = None
        self.device: Any = None  # a DeviceTimer once CUDA is in use (see cuda_timing.py)
        #: collective timing (capture/collectives.py): ``backward_done(now) -> (exposed, overlapped)``
        self.comm: Any = None

    # -- phase accounting ------------------------------------------------------------------
    def _reset_step(self) -> None:
        self._acc = [0, 0, 0, 0, 0, 0, 0]
        self._overlap_ns = 0
        self._init_ns = 0
        self._wait_cpu_ns = 0
        self._batches = 0
        self._samples = 0
        self._samples_known = True
        self._opt_steps = 0
        self._optimizers: set[int] = set()
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

    def enter(self, phase: int) -> int:
        """Open ``phase``; returns the timestamp used."""
        now = self.clock()
        if phase == self._phase and self._stack:
            self._depth += 1
            return now
        self._mark(now)
        self._stack.append(self._phase * 1000 + self._depth)
        self._phase, self._depth = phase, 0
        if self.listener is not None:
            self._notify("start", phase)
        return now

    def leave(self, phase: int) -> int:
        now = self.clock()
        if phase != self._phase or not self._stack:
            return now  # unbalanced (an exception skipped a boundary): ignore
        if self._depth:
            self._depth -= 1
            return now
        self._mark(now)
        saved = self._stack.pop()
        self._phase, self._depth = divmod(saved, 1000)
        if self.listener is not None:
            self._notify("stop", phase)
        if phase == BACKWARD and self._phase != BACKWARD:
            if self.comm is not None:
                self._settle_backward_comm(now)
            self._backward_left()
        return now

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
        if self._pending is not None:
            self._commit_pending()
        elif self._fallback_step_done(by_batch=True):
            self._commit_fallback()

    def _fallback_step_done(self, by_batch: bool = False) -> bool:
        """Whether the open step is complete under the fallback modes (see the module docstring)."""
        if self.mode not in FALLBACK_MODES or self._start is None or self._stack:
            return False
        if self.mode == "backward":
            return self._backward_done
        return bool(self._batches) if by_batch else (self._lead_done and not self._batches)

    def _commit_fallback(self) -> None:
        now = self.clock()
        if self.mode == "batch" and not self._batches and self._lead_done:
            self.mode = "forward"
        self._mark(now)
        self._commit_open(now)
        self._batch_mode_rows += 1

    def model_forward_started(self, key: int, grad_enabled: bool = True) -> None:
        """A root forward of a module with parameters (the model) begins: may end the previous step."""
        self.model_forwards += 1
        if not grad_enabled:
            self.model_forwards_no_grad += 1
        if self.mode not in FALLBACK_MODES:
            return
        if self._lead == key or self._backward_done:
            if self._fallback_step_done():
                self._commit_fallback()
        if self._lead is None:
            self._lead = key

    def model_forward_finished(self, key: int) -> None:
        if key == self._lead:
            self._lead_done = True

    @property
    def inference(self) -> bool:
        """The run only ran forwards: no backward, no optimizer step."""
        return self.model_forwards > 0 and not self.backwards and not self.optimizer_steps

    def batch_received(self, batch_len: int) -> None:
        self._batches += 1
        if batch_len >= 0:
            self._samples += batch_len
        else:
            self._samples_known = False

    def loader_init(self, duration_ns: int) -> None:
        self._init_ns += duration_ns

    def loader_cpu(self, cpu_ns: int) -> None:
        """CPU time the training thread spent inside a batch fetch."""
        self._wait_cpu_ns += cpu_ns

    def optimizer_started(self, optimizer_id: int) -> None:
        pending = self._pending
        if pending is not None:
            if optimizer_id in pending["optimizers"]:
                self._commit_pending()
            else:  # another optimizer of the same iteration: reopen the ended step
                self._merge_pending_into_open()
        self.enter(OPTIMIZER)

    def optimizer_finished(self, optimizer_id: int) -> None:
        now = self.leave(OPTIMIZER)
        self._opt_steps += 1
        self.optimizer_steps += 1
        self._optimizers.add(optimizer_id)
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
            self._commit_fallback()
        elif self._start is not None:
            self._mark(now)
            self.trailing_ns = now - self._start
        if self._start is not None and self.listener is not None:
            self.listener.stop("step")
        self._start = None

    # -- committing --------------------------------------------------------------------------
    def _snapshot(self, end: int) -> dict[str, Any]:
        return {
            "start": self._start if self._start is not None else end,
            "end": end,
            "acc": list(self._acc),
            "overlap": self._overlap_ns,
            "init": self._init_ns,
            "wait_cpu": self._wait_cpu_ns,
            "batches": self._batches,
            "samples": self._samples if self._samples_known else -1,
            "opt_steps": self._opt_steps,
            "optimizers": set(self._optimizers),
            "events": self.device.take() if self.device is not None else None,
        }

    def _commit_open(self, now: int) -> None:
        self._append(self._snapshot(now))
        self._reset_step()
        self._start = now
        self._last = now

    def _commit_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._append(pending)

    def _merge_pending_into_open(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        now = self.clock()
        self._mark(now)
        self._acc = [a + b for a, b in zip(self._acc, pending["acc"])]
        self._overlap_ns += pending["overlap"]
        self._init_ns += pending["init"]
        self._wait_cpu_ns += pending["wait_cpu"]
        self._batches += pending["batches"]
        if pending["samples"] < 0:
            self._samples_known = False
        self._samples += max(0, pending["samples"])
        self._opt_steps += pending["opt_steps"]
        self._optimizers |= pending["optimizers"]
        self._start = pending["start"]
        if self.device is not None and pending["events"] is not None:
            self.device.current[:0] = pending["events"]

    def _absorb_batch_mode_rows(self) -> None:
        """Fold the batch-mode steps recorded so far into the open (first training) step."""
        rows = self._batch_mode_rows
        self._batch_mode_rows = 0
        if not rows:
            return
        first = self.count - rows
        cols = self.columns
        for index, name in enumerate(("other_ns", "data_wait_ns", "forward_ns", "backward_ns", "optimizer_ns",
                                      "communication_ns", "compile_ns")):
            self._acc[index] += sum(cols[name][first:self.count])
        self._overlap_ns += sum(cols["communication_overlap_ns"][first:self.count])
        self._init_ns += sum(cols["loader_init_ns"][first:self.count])
        self._wait_cpu_ns += sum(cols["data_wait_cpu_ns"][first:self.count])
        self._batches += sum(cols["batches"][first:self.count])
        if min(cols["samples"][first:self.count]) < 0:
            self._samples_known = False
        self._samples += sum(max(0, value) for value in cols["samples"][first:self.count])
        self._start = cols["start_ns"][first]
        for column in cols.values():
            del column[first:]
        self.count = first

    def _append(self, step: dict[str, Any]) -> None:
        acc = step["acc"]
        duration = step["end"] - step["start"]
        cols = self.columns
        cols["start_ns"].append(step["start"])
        cols["duration_ns"].append(duration)
        cols["data_wait_ns"].append(acc[DATA_WAIT])
        cols["loader_init_ns"].append(min(step["init"], acc[DATA_WAIT]))
        cols["data_wait_cpu_ns"].append(step["wait_cpu"])
        cols["forward_ns"].append(acc[FORWARD])
        cols["backward_ns"].append(acc[BACKWARD])
        cols["optimizer_ns"].append(acc[OPTIMIZER])
        cols["communication_ns"].append(acc[COMMUNICATION])
        cols["communication_overlap_ns"].append(step["overlap"])
        cols["other_ns"].append(duration - acc[DATA_WAIT] - acc[FORWARD] - acc[BACKWARD] - acc[OPTIMIZER]
                                - acc[COMMUNICATION] - acc[COMPILE])
        cols["compile_ns"].append(acc[COMPILE])
        cols["batches"].append(step["batches"])
        cols["samples"].append(step["samples"] if step["batches"] else -1)
        cols["optimizer_steps"].append(step["opt_steps"])
        for name in ("device_ns", "device_forward_ns", "device_backward_ns", "device_optimizer_ns"):
            cols[name].append(-1)
        self.count += 1
        if self.device is not None and step["events"] is not None:
            self.device.step_committed(self.count - 1, step["events"])
        if self.listener is not None:
            self.listener.stop("step")
            self.listener.start("step")
        if self.on_commit is not None:
            self.on_commit(self.count - 1)

    def _notify(self, kind: str, phase: int) -> None:
        if phase != OTHER:
            getattr(self.listener, kind)(PHASE_NAMES[phase])

    def steps(self) -> StepTable:
        """The committed steps as a frozen, columnar :class:`Steps`."""
        count = self.count
        return StepTable.from_columns({name: column[:count] for name, column in self.columns.items()})
