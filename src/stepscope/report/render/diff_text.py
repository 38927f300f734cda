"""``stepscope diff`` on the terminal: one screen from a :class:`~stepscope.report.diff_view.DiffView`.

Everything that came from a record or a trace (paths, argv, environment values, operator names,
finding titles) is printed through :func:`stepscope.text.printable`.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from stepscope.report.diff_view import (DiffView, OpLine, RunDiffView, TraceDiffView, change_text, interval_text,
                                        value_text)
from stepscope.report.render.output import Output
from stepscope.text import printable

TONE_STYLE = {"good": "green", "bad": "red", "neutral": "bright_black", "unsure": "yellow"}
GATE_STYLE = {"failed": "bold red", "passed": "bold green"}


def render(view: DiffView, out: Output) -> list[str]:
    console = Console(file=out.stream, width=out.width) if out.width is not None else Console(file=out.stream)
    if view.runs is not None:
        console.print(run_diff(view, view.runs))
    elif view.traces is not None:
        console.print(trace_diff(view, view.traces, out.top))
    if view.gate is not None:
        console.print(printable(view.gate.message), style=GATE_STYLE.get(view.gate.status, "bold yellow"),
                      markup=False, highlight=False)
    return []


def run_diff(view: DiffView, runs: RunDiffView) -> Group:
    parts: list[Any] = [Text(f"stepscope diff · A {printable(view.a)} → B {printable(view.b)}", style="bold"),
                        Text(runs.basis, style="bright_black")]
    table = Table(box=None, pad_edge=False, show_edge=False)
    for column, justify in (("", "left"), ("share", "right"), ("A", "right"), ("B", "right"), ("change", "right"),
                            ("95% interval", "right"), ("verdict", "left")):
        table.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for row in runs.rows:
        label = f"  {row.label}" if row.phase else row.label
        share = "" if row.share_a is None or row.share_b is None else \
            f"{row.share_a * 100:.0f}→{row.share_b * 100:.0f}%"
        d = row.figure
        table.add_row(label, share, value_text(d.a, row.unit), value_text(d.b, row.unit), change_text(d),
                      interval_text(d), Text(d.verdict, style=TONE_STYLE.get(d.tone, "")))
    parts += [Text(""), table]
    if runs.origin:
        parts.append(Text(f"Where it comes from: {printable(runs.origin)}"))
    if runs.ranks:
        ranks = Table(box=None, pad_edge=False, show_edge=False, title="Ranks", title_justify="left")
        for column in ("rank", "step A", "step B", "change", "comm A", "comm B", "comm verdict"):
            ranks.add_column(column)
        for rank in runs.ranks:
            ranks.add_row(str(rank.rank), value_text(rank.step_time.a, "s"), value_text(rank.step_time.b, "s"),
                          change_text(rank.step_time), value_text(rank.communication.a, "s"),
                          value_text(rank.communication.b, "s"), rank.communication.verdict)
        parts += [Text(""), ranks]
    parts += [Text(""), Text("What changed in the setup", style="bold underline")]
    if runs.sources_changed:
        parts.append(Text(f"  local source changed: {printable(', '.join(runs.sources_changed))}", style="bold"))
    if runs.setup:
        for change in runs.setup:
            parts.append(Text(f"  {printable(change.what)}: {printable(change.a)} → {printable(change.b)}"))
        if runs.setup_more:
            parts.append(Text(f"  … and {runs.setup_more} more (--format json lists them all)", style="bright_black"))
    else:
        parts.append(Text("  nothing stepscope records (same script, arguments, versions, loaders, threads, "
                          "environment)", style="bright_black"))
    parts += [Text(""), Text("Findings", style="bold underline")]
    for side, top in (("A", runs.top_a), ("B", runs.top_b)):
        parts.append(Text(f"  top finding of {side}: {printable(top) if top else 'none'}"))
    if runs.findings:
        for moved in runs.findings:
            was = f" (was {moved.was})" if moved.was else ""
            parts.append(Text(f"  {moved.change}: [{moved.severity}] {printable(moved.title)}{was}"))
    else:
        parts.append(Text("  no finding appeared, disappeared or changed severity", style="bright_black"))
    for note in runs.notes:
        parts.append(Text(f"note: {printable(note)}", style="yellow"))
    parts += [Text(""), Text(printable(runs.headline), style="bold")]
    return Group(*parts)


def _op_label(op: OpLine, width: int = 70) -> str:
    name = printable(op.name)
    return name if len(name) <= width else name[: width - 1] + "…"


def trace_diff(view: DiffView, traces: TraceDiffView, top: int = 10) -> Group:
    parts: list[Any] = [Text(f"stepscope diff · A {printable(view.a)} → B {printable(view.b)}", style="bold"),
                        Text(f"iterations: A {list(traces.iterations_a)}, B {list(traces.iterations_b)} · device rows: "
                             f"{traces.device} · HTA TraceDiff rules (one trace per side: no noise bound)",
                             style="bright_black")]
    if traces.step_change is not None:
        parts.append(Text(f"ProfilerStep: {traces.step_ms_a or 0:.2f} ms → {traces.step_ms_b or 0:.2f} ms "
                          f"({traces.step_change:+.1%})", style="bold"))
    parts.append(Text(" · ".join(f"{count} {category}" for category, count in traces.counts.items())))
    for section in traces.tables:
        table = Table(box=None, pad_edge=False, show_edge=False, title=section.title, title_justify="left")
        for column, justify in (("name", "left"), ("calls A→B", "right"), ("total A", "right"), ("total B", "right"),
                                ("Δ total", "right"), ("per call", "right")):
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for op in section.rows[:top]:
            per_call = "–" if op.per_call_change is None else f"{op.per_call_change:+.0%}"
            table.add_row(_op_label(op), f"{op.count_a}→{op.count_b}", f"{op.total_us_a / 1e3:.3f} ms",
                          f"{op.total_us_b / 1e3:.3f} ms", f"{op.diff_us / 1e3:+.3f} ms", per_call)
        parts += [Text(""), table]
    return Group(*parts)
