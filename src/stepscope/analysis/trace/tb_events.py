"""Event roles as the PyTorch Profiler TensorBoard plugin classifies them (its final source).

The classification lives in the linked-events table (:mod:`stepscope.traces.links`, column
``role``), computed once per trace; this module keeps the names the views import.
:func:`tb_roles` returns that table (``.kind`` is the role column, ``.rows(*roles)`` selects rows).
"""

from __future__ import annotations

from stepscope.traces.events import EventTable
from stepscope.traces.links import (
    ANNOTATION, GLOO_OPS, KERNEL, MEMCPY, MEMSET, NCCL_OPS, NONE, OPERATOR, PYFUNC, PYTHON, RUNTIME, STEP, TRACE,
    EventLinks, links_of,
)

TbRoles = EventLinks

__all__ = [
    "ANNOTATION", "GLOO_OPS", "KERNEL", "MEMCPY", "MEMSET", "NCCL_OPS", "NONE", "OPERATOR", "PYFUNC", "PYTHON",
    "RUNTIME", "STEP", "TRACE", "TbRoles", "tb_roles",
]


def tb_roles(events: EventTable) -> EventLinks:
    """The plugin roles of ``events``: its (cached) linked-events table."""
    return links_of(events)
