"""Python/framework overhead: where host time goes when ``python_function`` events exist.

Over the host thread(s) that run ``ProfilerStep`` (all host threads without steps), inside the
steps window: the union of ``python_function`` spans is Python time; the union of operator
(``cpu_op``) spans is ATen time; the union of runtime calls (``cuda_runtime`` etc.) is runtime
time. Shares are of the window length times the number of those threads. Python frames enclose
the ops they call, so the Python share here is *exclusive*: Python time minus the ATen and runtime
time under it. ``None`` when the trace has no python_function events.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stepscope.traces import intervals
from stepscope.analysis.trace.step_breakdown import TraceSteps
from stepscope.traces.links import OPERATOR, PYFUNC, RUNTIME, STEP, EventLinks, unique_ints


@dataclass(frozen=True)
class PythonOverhead:
    """The host threads' time in the traced window split into Python, ATen, the CUDA runtime and the rest
    (exclusive)."""

    window_us: float
    python_us: float  # exclusive of ATen and runtime time
    aten_us: float  # exclusive of runtime time
    runtime_us: float
    other_us: float
    threads: int

    def share(self, part: str) -> float | None:
        total = self.window_us * self.threads
        return getattr(self, f"{part}_us") / total if total > 0 else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update({f"{p}_share": self.share(p) for p in ("python", "aten", "runtime", "other")})
        return out


def python_overhead(links: EventLinks, steps: TraceSteps) -> PythonOverhead | None:
    events, role = links.events, links.role
    py = links.rows(PYFUNC)
    if not len(py) or not len(steps.start):
        return None
    lo, hi = float(steps.start[0]), float(steps.end[-1])
    step_rows = links.rows(STEP)
    threads = unique_ints(events.tid[step_rows]) if len(step_rows) else unique_ints(events.tid[py])
    totals = {"python": 0.0, "aten": 0.0, "runtime": 0.0}
    for tid in threads.tolist():
        on = events.tid == tid

        def union(kind: int) -> tuple[np.ndarray, np.ndarray]:
            sel = np.flatnonzero(on & (role == kind))
            merged = intervals.merge(events.ts[sel], events.end_at(sel))
            return intervals.clip(merged, lo, hi)

        rt = union(RUNTIME)
        aten = intervals.subtract(union(OPERATOR), rt)
        python = intervals.subtract(intervals.subtract(union(PYFUNC), aten), rt)
        totals["runtime"] += intervals.total(*rt)
        totals["aten"] += intervals.total(*aten)
        totals["python"] += intervals.total(*python)
    window = hi - lo
    other = window * len(threads) - sum(totals.values())
    return PythonOverhead(window, totals["python"], totals["aten"], totals["runtime"], max(other, 0.0), int(len(threads)))
