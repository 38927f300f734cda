"""torch.compile as a Kineto trace shows it, without any log: compiled regions, graphs per step,
recompiled variants and the guard checks.

What the profiler records around compiled code (CPU operator events):

- ``Torch-Compiled Region: F/N``: a call into the compiled code of frame F, variant N — N > 0 is a
  recompiled variant (the frame was compiled again for other guards);
- ``CompiledFunction`` (and ``CompiledFunctionBackward``): one compiled graph's forward (backward);
  more than one per step means the compiled code is split into several graphs: graph breaks;
- ``TorchDynamo Cache Lookup``: the guard check of a call into compiled code.

:func:`compiled_regions` counts them per profiled step, so a trace from someone else's job says
what the run record would — and times what graph breaks cost in the steady state: a broken frame
runs as one top-level region holding its graphs one after the other (the code after a break is a
nested region of the resume frame); the time between the end of one graph and the start of the
next inside it is the eager code between the graphs, the resume frame's guard check and its entry
(``between_graphs_us_per_step``). What a graph break costs besides (fusion lost across it) no
trace shows.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from stepscope.analysis.trace.step_breakdown import TraceSteps
from stepscope.traces.links import EventLinks, symbol_mask, unique_ints

_REGION = re.compile(r"^Torch-Compiled Region: (?P<frame>\d+)/(?P<variant>\d+)")


@dataclass(frozen=True)
class CompiledRegions:
    """torch.compile's footprint in the trace: compiled regions, graphs and recompiled variants per step."""

    steps: int
    regions_per_step: float  # calls into compiled code per step
    graphs_per_step: float  # CompiledFunction (forward graphs) per step
    variants: tuple[str, ...] = field(default_factory=tuple)  # "F/N" seen, N > 0 = recompiled
    recompiled_frames: tuple[str, ...] = field(default_factory=tuple)  # frames with a variant N > 0
    cache_lookup_us_per_step: float = 0.0  # guard checks
    compiled_us_per_step: float = 0.0  # time inside compiled regions
    #: time between consecutive graphs of one call into compiled code (eager code between graphs,
    #: the resume frame's guard check): what graph breaks cost per step, measured
    between_graphs_us_per_step: float = 0.0
    step_us: float | None = None  # the profiled steps' mean duration

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compiled_regions(links: EventLinks, steps: TraceSteps) -> CompiledRegions | None:
    """Compiled code in the profiled steps (the whole trace without steps); None when there is none."""
    events = links.events
    symbols = events.symbols
    region_ids = symbols.ids_where(lambda text: text.startswith("Torch-Compiled Region:"))
    if not len(region_ids):
        return None
    inside = np.ones(len(events), dtype=bool)
    count = len(steps.start)
    if count:
        inside = (events.ts >= float(steps.start[0])) & (events.ts < float(steps.end[-1]))
    count = max(count, 1)
    regions = inside & symbol_mask(events.name, region_ids, len(symbols.strings))
    graphs = inside & events.name_mask(lambda text: text == "CompiledFunction")
    lookups = inside & events.name_mask(lambda text: text == "TorchDynamo Cache Lookup")
    variants = sorted({symbols.decode(int(ident)).split(": ", 1)[1] for ident in unique_ints(events.name[regions])},
                      key=lambda text: tuple(int(part) for part in text.split("/")))
    recompiled = sorted({item.split("/")[0] for item in variants if not item.endswith("/0")}, key=int)
    step_us = float(np.mean(np.asarray(steps.end) - np.asarray(steps.start))) if len(steps.start) else None
    return CompiledRegions(
        steps=len(steps.start), regions_per_step=float(regions.sum()) / count,
        graphs_per_step=float(graphs.sum()) / count, variants=tuple(variants), recompiled_frames=tuple(recompiled),
        cache_lookup_us_per_step=float(events.dur[lookups].sum()) / count,
        compiled_us_per_step=float(events.dur[regions].sum()) / count,
        between_graphs_us_per_step=between_graphs_us(events, regions, graphs) / count, step_us=step_us)


def between_graphs_us(events: Any, regions: np.ndarray, graphs: np.ndarray) -> float:
    """µs between consecutive graphs (``CompiledFunction``) inside each top-level compiled region
    (one not inside another region of its thread): the code a graph break runs eagerly."""
    total = 0.0
    region_rows = np.flatnonzero(regions)
    graph_rows = np.flatnonzero(graphs)
    for tid in unique_ints(events.tid[region_rows]):
        own = region_rows[events.tid[region_rows] == tid]
        own = own[np.argsort(events.ts[own], kind="stable")]
        own_graphs = graph_rows[events.tid[graph_rows] == tid]
        own_graphs = own_graphs[np.argsort(events.ts[own_graphs], kind="stable")]
        graph_start, graph_end = events.ts[own_graphs], events.end_at(own_graphs)
        outer_end = -np.inf
        for row in own:
            start, end = float(events.ts[row]), float(events.ts[row] + events.dur[row])
            if end <= outer_end:
                continue  # nested in the region before it: counted there
            outer_end = end
            inside = (graph_start >= start) & (graph_end <= end)
            if int(inside.sum()) > 1:
                gaps = graph_start[inside][1:] - graph_end[inside][:-1]
                total += float(np.clip(gaps, 0.0, None).sum())
    return total


__all__ = ["CompiledRegions", "compiled_regions"]
