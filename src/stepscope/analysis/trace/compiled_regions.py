"""torch.compile as a Kineto trace shows it, without any log: compiled regions, graphs per step,
recompiled variants and the guard checks.

What the profiler records around compiled code (CPU operator events):

- ``Torch-Compiled Region: F/N``: a call into the compiled code of frame F, variant N — N > 0 is a
  recompiled variant (the frame was compiled again for other guards);
- ``CompiledFunction`` (and ``CompiledFunctionBackward``): one compiled graph's forward (backward);
  more than one per step means the compiled code is split into several graphs: graph breaks;
- ``TorchDynamo Cache Lookup``: the guard check of a call into compiled code.

:func:`compiled_regions` counts them per profiled step, so a trace from someone else's job says
what the run record would.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from stepscope.analysis.trace.step_breakdown import TraceSteps
from stepscope.traces.links import EventLinks

_REGION = re.compile(r"^Torch-Compiled Region: (?P<frame>\d+)/(?P<variant>\d+)")


@dataclass(frozen=True)
class CompiledRegions:
    steps: int
    regions_per_step: float  # calls into compiled code per step
    graphs_per_step: float  # CompiledFunction (forward graphs) per step
    variants: tuple[str, ...] = field(default_factory=tuple)  # "F/N" seen, N > 0 = recompiled
    recompiled_frames: tuple[str, ...] = field(default_factory=tuple)  # frames with a variant N > 0
    cache_lookup_us_per_step: float = 0.0  # guard checks
    compiled_us_per_step: float = 0.0  # time inside compiled regions

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compiled_regions(links: EventLinks, steps: TraceSteps) -> CompiledRegions | None:
    """Compiled code in the profiled steps (the whole trace without steps); None when there is none."""
    events = links.events
    symbols = events.symbols
    region_ids = symbols.ids_where(lambda text: text.startswith("Torch-Compiled Region:"))
    if not len(region_ids):
        return None
    graph_ids = symbols.ids_where(lambda text: text == "CompiledFunction")
    lookup_ids = symbols.ids_where(lambda text: text == "TorchDynamo Cache Lookup")
    inside = np.ones(len(events), dtype=bool)
    count = len(steps.start)
    if count:
        inside = (events.ts >= float(steps.start[0])) & (events.ts < float(steps.end[-1]))
    count = max(count, 1)
    regions = inside & np.isin(events.name, region_ids)
    graphs = inside & np.isin(events.name, graph_ids)
    lookups = inside & np.isin(events.name, lookup_ids)
    variants = sorted({symbols.decode(int(ident)).split(": ", 1)[1] for ident in np.unique(events.name[regions])},
                      key=lambda text: tuple(int(part) for part in text.split("/")))
    recompiled = sorted({item.split("/")[0] for item in variants if not item.endswith("/0")}, key=int)
    return CompiledRegions(
        steps=len(steps.start), regions_per_step=float(regions.sum()) / count,
        graphs_per_step=float(graphs.sum()) / count, variants=tuple(variants), recompiled_frames=tuple(recompiled),
        cache_lookup_us_per_step=float(events.dur[lookups].sum()) / count,
        compiled_us_per_step=float(events.dur[regions].sum()) / count)


__all__ = ["CompiledRegions", "compiled_regions"]
