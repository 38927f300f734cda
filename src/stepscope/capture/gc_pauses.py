"""Garbage-collector pauses, timed exactly with ``gc.callbacks``.

The interpreter calls every function in ``gc.callbacks`` with ``("start", info)`` before and
``("stop", info)`` after each collection, in the thread that triggered it, while holding the GIL:
every Python thread is paused in between, so the ``perf_counter_ns`` pair is the pause. ``info``
carries ``generation`` and, at stop, ``collected`` and ``uncollectable``. The cost is one Python
call per boundary of a collection — nothing per step or per allocation.

Each pause also notes the phase the training thread was in (read from the step recorder without a
lock, like the stack sampler; a pause happens while the GIL is held, so the phase cannot change
during it); the step index is assigned afterwards from the start time and the committed steps.
Forked children (DataLoader workers) inherit ``gc.callbacks``: the callback removes itself there.
"""

from __future__ import annotations

import gc
import os
import time
import weakref
from array import array
from typing import Any

from stepscope.record.run import PHASES, GcPauses, StepTable, steps_of

_PHASE_OF_RECORDER = tuple(PHASES.index(name) for name in ("other", "data_wait", "forward", "backward", "optimizer",
                                                          "communication", "compile"))
_now = time.perf_counter_ns


class GcPauseRecorder:
    """Records every collection between :meth:`start` and :meth:`stop`.

    Args:
        recorder: the step recorder whose current phase each pause notes (None: unknown).
        clock: nanosecond clock (tests pass a fake one).
    """

    def __init__(self, recorder: Any = None, clock: Any = _now):
        self.recorder = recorder
        self.clock = clock
        self.columns = {name: array("q") for name in GcPauses.COLUMNS if name != "step"}
        self._started_at: int | None = None
        self._phase = -1
        self._installed = False
        self._callback = _make_callback(weakref.ref(self))

    def start(self) -> GcPauseRecorder:
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True
            _remove_in_forked_children(self._callback)
        return self

    def stop(self) -> None:
        if self._installed:
            self._installed = False
            try:
                gc.callbacks.remove(self._callback)
            except ValueError:
                pass

    def on_gc(self, event: str, info: dict[str, int]) -> None:
        if event == "start":
            recorder = self.recorder
            self._phase = _PHASE_OF_RECORDER[recorder.current_phase()] if recorder is not None else -1
            self._started_at = self.clock()
            return
        end = self.clock()
        started = self._started_at
        if started is None:  # the collection began before we were installed
            return
        self._started_at = None
        columns = self.columns
        columns["start_ns"].append(started)
        columns["duration_ns"].append(end - started)
        columns["generation"].append(int(info.get("generation", -1)))
        columns["collected"].append(int(info.get("collected", 0)))
        columns["uncollectable"].append(int(info.get("uncollectable", 0)))
        columns["phase"].append(self._phase)

    def freeze(self, steps: StepTable) -> GcPauses:
        """The pauses as :class:`GcPauses`, each with the committed step it fell in."""
        import numpy as np

        data = {name: np.asarray(column, dtype=np.int64) for name, column in self.columns.items()}
        step = steps_of(data["start_ns"], steps)
        if len(steps):  # the collections of start-up (imports) and teardown hit no step: left out
            keep = step >= 0
            data = {name: column[keep] for name, column in data.items()}
            step = step[keep]
        return GcPauses(enabled=True, step=step, **data)


def _make_callback(reference: Any) -> Any:
    def stepscope_gc_callback(event: str, info: dict[str, int]) -> None:
        target = reference()
        if target is not None:
            target.on_gc(event, info)

    return stepscope_gc_callback


def _remove_in_forked_children(callback: Any) -> None:
    def after_in_child() -> None:
        try:
            gc.callbacks.remove(callback)
        except ValueError:
            pass

    os.register_at_fork(after_in_child=after_in_child)


def callback_codes() -> tuple[Any, ...]:
    """The code that runs inside ``gc.callbacks`` (where an exception is dropped, not raised)."""
    return (_make_callback(None).__code__, GcPauseRecorder.on_gc.__code__)


__all__ = ["GcPauseRecorder", "callback_codes"]
