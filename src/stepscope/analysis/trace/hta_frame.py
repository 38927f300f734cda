"""The rows HTA's analyses see, as a view of the linked-events table.

The filtering, rounding and kernel-type rules live in :mod:`stepscope.traces.links`
(:class:`~stepscope.traces.links.HtaRows`, computed once per trace with the rest of the table);
every HTA view (temporal, idle time, kernel types, overlap, launch statistics) starts from
:func:`hta_rows`. Kernel types follow HTA ``main`` (v0.6.x); HTA 0.5.0 (the PyPI release) also
counted ``Stream Wait Event`` rows as COMPUTATION; we follow ``main`` on purpose (a sync is not
computation) — see BENCHMARKS.md.
"""

from __future__ import annotations

from stepscope.traces.events import EventTable
from stepscope.traces.links import COMMUNICATION, COMPUTATION, KERNEL_TYPE_NAMES, MEMORY, OTHER, HtaRows, kernel_type, links_of

__all__ = ["COMMUNICATION", "COMPUTATION", "KERNEL_TYPE_NAMES", "MEMORY", "OTHER", "HtaRows", "hta_rows", "kernel_type"]


def hta_rows(events: EventTable) -> HtaRows:
    """HTA's view of one rank (cached with the trace's linked-events table)."""
    return links_of(events).hta
