"""One-line descriptions shared by the terminal and HTML renderers (plain text, no markup)."""

from __future__ import annotations

from typing import Any

from stepscope.units import format_ratio


def overridden_line(overrides: Any) -> str:
    """`run --set`/`--max-steps`: ``dataloader.num_workers=4 (1 loader) · stopped after 30 steps``."""
    parts = []
    for item in overrides.settings:
        value = str(item.value).lower() if isinstance(item.value, bool) else str(item.value)
        where = ("" if item.key.startswith("torch.") else
                 f" ({item.applied} loader{'s' if item.applied != 1 else ''})")
        if item.key.startswith("torch.") and not item.applied:
            where = " (not applied)"
        parts.append(f"{item.key}={value}{where}" + (f" [{len(item.skipped)} note(s) in the record]"
                                                     if item.skipped else ""))
    if overrides.max_steps is not None:
        parts.append(f"stopped after {overrides.max_steps} steps (--max-steps)" if overrides.stopped_at_max_steps
                     else f"--max-steps {overrides.max_steps} (the script ended first)")
    return " · ".join(parts)


def skipped_line(summary: Any) -> str:
    """``SkipBadSamples``: ``25 failed to load, replaced by their neighbours (2.0% of 1,280 delivered) · corpus 25``."""
    head = f"{summary.total:,} failed to load, replaced by the next sample"
    if summary.share is not None:
        head += f" ({format_ratio(summary.share)} of {summary.delivered:,} delivered)"
    parts = [head]
    for item in summary.datasets:
        where = [("main" if slot == 0 else f"worker {slot - 1}") + f" {count:,}"
                 for slot, count in enumerate(item.by_process) if count]
        parts.append(f"{item.dataset} {item.total:,}" + (f" ({', '.join(where)})" if len(where) > 1 else ""))
    return " · ".join(parts)
