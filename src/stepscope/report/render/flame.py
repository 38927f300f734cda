"""``stepscope report --flame PHASE``: the folded stacks of one phase (``frame;frame;… weight`` per
line), the input of flamegraph.pl and speedscope. The stacks are the report's (collapsed by the
pipeline from the stack samples of the steady steps)."""

from __future__ import annotations

from stepscope.report.model import Report
from stepscope.report.run_view import StackLine
from stepscope.report.render.output import Output


def folded_text(stacks: tuple[StackLine, ...]) -> str:
    """Collapsed-stack text: one ``frame;frame;frame count`` line per stack (empty string if none)."""
    return "".join(f"{';'.join(item.frames) or '(no frames)'} {item.samples}\n" for item in stacks)


def render(report: Report, out: Output) -> list[str]:
    flame = report.flame
    stacks = flame.stacks if flame is not None else ()
    if out.stream is not None:
        out.stream.write(folded_text(stacks))
    phase = flame.phase if flame is not None else "?"
    return [] if stacks else [f"no stack samples for phase {phase!r} in this run"]
