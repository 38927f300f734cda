"""Device time of steps and phases from CUDA events, without synchronizing in the hot path.

At every phase boundary of a step an event is recorded on the current stream; when the step is
committed its events join a bounded queue. :meth:`DeviceTimer.poll` (called at each commit) reads
back the oldest steps whose last event has completed (``query()`` is non-blocking) and fills the
device columns. If the device falls more than :data:`MAX_PENDING_STEPS` behind, the oldest steps
are given up (left at -1) rather than waiting. At the end of the run one ``synchronize`` (outside
the hot path) drains the queue.

Activation is lazy: nothing touches CUDA until the user's script has initialised it, so a CPU
run on a GPU machine never creates a CUDA context because of stepscope.

The event and synchronize functions are injected, so the logic is tested with fakes on machines
without a GPU; :func:`torch_cuda_backend` gives the real ones.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from stepscope.capture.recorder import BACKWARD, FORWARD, OPTIMIZER

MAX_PENDING_STEPS = 256
_PHASE_COLUMN = {FORWARD: "device_forward_ns", BACKWARD: "device_backward_ns", OPTIMIZER: "device_optimizer_ns"}


def torch_cuda_backend() -> tuple[Callable[[], Any], Callable[[], None]] | None:
    """(make_event, synchronize) for CUDA when the script has initialised it, else None."""
    import torch

    # is_initialized() first: a flag test, where is_available() asks the driver (capture asks every
    # few steps until the script initialises CUDA)
    if not torch.cuda.is_initialized() or not torch.cuda.is_available():
        return None
    return (lambda: torch.cuda.Event(enable_timing=True)), torch.cuda.synchronize


class DeviceTimer:
    """Events per phase boundary; fills the recorder's device columns as events complete."""

    def __init__(self, columns: Any, make_event: Callable[[], Any], synchronize: Callable[[], None]):
        self.columns = columns
        self.make_event = make_event
        self.synchronize = synchronize
        self.current: list[tuple[Any, int]] = []  # (event, phase that ENDS at this event)
        self.pending: deque[tuple[int, list[tuple[Any, int]]]] = deque()
        self.dropped = 0

    def boundary(self, closing_phase: int) -> None:
        event = self.make_event()
        event.record()
        self.current.append((event, closing_phase))

    def take(self) -> list[tuple[Any, int]]:
        """Close the events of the step that just ended (the last event marks its end)."""
        events, self.current = self.current, []
        return events

    def step_committed(self, index: int, events: list[tuple[Any, int]]) -> None:
        self.pending.append((index, events))
        while len(self.pending) > MAX_PENDING_STEPS:
            self.pending.popleft()
            self.dropped += 1
        self.poll()

    def poll(self) -> None:
        while self.pending:
            index, events = self.pending[0]
            if not events[-1][0].query():
                return
            self.pending.popleft()
            self._fill(index, events)

    def drain(self) -> None:
        if self.pending:
            self.synchronize()
            self.poll()

    def _fill(self, index: int, events: list[tuple[Any, int]]) -> None:
        if len(events) < 2:
            return
        totals = {column: 0 for column in _PHASE_COLUMN.values()}
        for (start, _), (end, phase) in zip(events, events[1:]):
            column = _PHASE_COLUMN.get(phase)
            if column is not None:
                totals[column] += int(start.elapsed_time(end) * 1e6)
        self.columns["device_ns"][index] = int(events[0][0].elapsed_time(events[-1][0]) * 1e6)
        for column, value in totals.items():
            self.columns[column][index] = value
