"""Device idle time attributed to what the host was doing meanwhile: a view of the rank's
:class:`~stepscope.traces.timeline.GpuTimeline` (the definitions are there).

The idle gaps are those of HTA's temporal breakdown — the holes in the union of all GPU rows
between the first and the last GPU activity — so the four causes (dataloader, sync, launch, other)
add up to its ``idle_us``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from stepscope.traces.links import EventLinks
from stepscope.traces.timeline import CAUSES, SYNC_CALLS, timeline_of

__all__ = ["CAUSES", "IdleCauses", "SYNC_CALLS", "idle_causes"]


@dataclass(frozen=True)
class IdleCauses:
    """Device idle time (µs) by host activity; the four parts add up to ``idle_us``."""

    idle_us: float
    kernel_time_us: float
    dataloader_us: float
    sync_us: float
    launch_us: float
    other_us: float
    gaps: int

    def share(self, cause: str) -> float | None:
        """The cause's idle time as a share of ``kernel_time`` (like HTA's idle share)."""
        value: float = getattr(self, f"{cause}_us")
        return value / self.kernel_time_us if self.kernel_time_us > 0 else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update({f"{c}_share": self.share(c) for c in CAUSES})
        return out


def idle_causes(links: EventLinks) -> IdleCauses | None:
    """The idle time of one rank by cause; None without GPU rows."""
    timeline = timeline_of(links)
    if timeline is None:
        return None
    causes = timeline.gap_causes
    return IdleCauses(idle_us=causes.idle_us, kernel_time_us=timeline.kernel_time_us,
                      dataloader_us=causes.dataloader_us, sync_us=causes.sync_us, launch_us=causes.launch_us,
                      other_us=causes.other_us, gaps=causes.gaps)
