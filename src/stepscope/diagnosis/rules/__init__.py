"""Diagnosis rules, one module per bottleneck family; :data:`RULES` is the explicit ordered list.

Each rule is a plain function ``(RunEvidence) -> Finding | None``: it reads the evidence bundle,
reads no files, prints nothing and imports no other rule (precedence is the engine's table). The
healthy verdict is not in the list: the engine runs it last
(:func:`stepscope.diagnosis.rules.healthy.verdict`).

Adding a rule: one module here with the function and its named thresholds, one entry in
:data:`RULES`, a test with a firing and a non-firing case, and a line in :data:`SUPERSEDES
<stepscope.diagnosis.engine.SUPERSEDES>` if its finding is the cause of another's symptom.
"""

from __future__ import annotations

from stepscope.diagnosis.engine import Rule
from stepscope.diagnosis.rules.communication import exposed_collectives
from stepscope.diagnosis.rules.compile import compile_time, graph_breaks, recompile_limit, recompiling, trace_regions
from stepscope.diagnosis.rules.compute import low_mfu
from stepscope.diagnosis.rules.cpu_oversubscription import oversubscribed_cpu
from stepscope.diagnosis.rules.foreign_load import neighbour_bursts, others_on_the_machine
from stepscope.diagnosis.rules.garbage_collection import collector_pauses
from stepscope.diagnosis.rules.host_device_sync import sync_and_copies
from stepscope.diagnosis.rules.input_pipeline import loader_cpu_bound
from stepscope.diagnosis.rules.launch_overhead import tiny_ops_dominate
from stepscope.diagnosis.rules.memory_pressure import growing_memory, near_capacity, swapping
from stepscope.diagnosis.rules.outside_model import other_dominates
from stepscope.diagnosis.rules.periodic_stall import recurring_slow_steps
from stepscope.diagnosis.rules.storage_io import cold_data, loader_waits_on_io
from stepscope.diagnosis.rules.straggler import slow_rank

RULES: tuple[Rule, ...] = (
    loader_cpu_bound,
    loader_waits_on_io,
    cold_data,
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
    others_on_the_machine,
    neighbour_bursts,
    collector_pauses,
    other_dominates,
    recompile_limit,
    recompiling,
    graph_breaks,
    compile_time,
    trace_regions,
)
