"""The finding families, one module each; :data:`REGISTRY` is the explicit ordered list.

Each module holds a family's rules — plain functions ``(RunEvidence) -> Finding | None`` that read
the evidence bundle, read no files, print nothing and import no other rule — and its
:class:`~stepscope.diagnosis.family.FamilyEntry` (``FAMILY``): what it diagnoses, what it rests on,
which families' findings it makes moot (the cause over its symptom), whether its evidence is CPU
time, whether it explains other ranks' symptoms in a job. The engine, ``report.json``'s list of
families and the documentation's family tables are derived from :data:`REGISTRY`.

Adding a family: one module here with its rules, named thresholds (citing their origin) and its
``FAMILY``; one line in :data:`REGISTRY`; a test with a firing and a non-firing case
(``tests/unit/diagnosis/test_registry.py`` checks the documentation against the registry).
"""

from __future__ import annotations

from stepscope.diagnosis.family import FamilyEntry, Rule
from stepscope.diagnosis.rules import (communication, compile, compute, cpu_oversubscription, epoch_boundary,
                                       foreign_load, garbage_collection, gil_contention, healthy, host_device_sync,
                                       input_pipeline, launch_overhead, memory_pressure, outside_model,
                                       periodic_stall, storage_io, straggler, unexplained)

#: Every family, in the order the rules run and the documentation lists them; ``healthy`` is the
#: verdict the engine gives when nothing reached medium severity.
REGISTRY: tuple[FamilyEntry, ...] = (
    input_pipeline.FAMILY,
    storage_io.FAMILY,
    compute.FAMILY,
    launch_overhead.FAMILY,
    host_device_sync.FAMILY,
    communication.FAMILY,
    straggler.FAMILY,
    periodic_stall.FAMILY,
    epoch_boundary.FAMILY,
    memory_pressure.FAMILY,
    cpu_oversubscription.FAMILY,
    foreign_load.FAMILY,
    gil_contention.FAMILY,
    garbage_collection.FAMILY,
    outside_model.FAMILY,
    compile.FAMILY,
    unexplained.FAMILY,
    healthy.FAMILY,
)

#: Stable family identifiers (``findings[].family`` in ``report.json``), in registry order.
FAMILIES: tuple[str, ...] = tuple(entry.family for entry in REGISTRY)
#: Every rule, in the order the engine runs them.
RULES: tuple[Rule, ...] = tuple(rule for entry in REGISTRY for rule in entry.rules)

__all__ = ["FAMILIES", "REGISTRY", "RULES"]
