"""Diagnosis rules, one module per bottleneck family; :data:`RULES` is the explicit ordered list.

Each rule is a plain function ``(DiagnosisContext) -> Finding | None``: it reads the context's
evidence, reads no files and prints nothing. The healthy verdict is not in the list: the engine
runs it last (:func:`stepscope.diagnosis.rules.healthy.verdict`).
"""

from __future__ import annotations

from stepscope.diagnosis.rules.communication import exposed_collectives
from stepscope.diagnosis.rules.compute import low_mfu
from stepscope.diagnosis.rules.cpu_oversubscription import oversubscribed_cpu
from stepscope.diagnosis.rules.host_device_sync import sync_and_copies
from stepscope.diagnosis.rules.input_pipeline import loader_cpu_bound
from stepscope.diagnosis.rules.launch_overhead import tiny_ops_dominate
from stepscope.diagnosis.rules.memory_pressure import growing_memory, near_capacity, swapping
from stepscope.diagnosis.rules.periodic_stall import recurring_slow_steps
from stepscope.diagnosis.rules.storage_io import loader_waits_on_io
from stepscope.diagnosis.rules.straggler import slow_rank

RULES: tuple = (
    loader_cpu_bound,
    loader_waits_on_io,
    low_mfu,
    tiny_ops_dominate,
    sync_and_copies,
    exposed_collectives,
    slow_rank,
    recurring_slow_steps,
    swapping,
    growing_memory,
    near_capacity,
    oversubscribed_cpu,
)
