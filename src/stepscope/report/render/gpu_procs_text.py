"""``stepscope gpu-procs`` on the terminal: the processes holding GPU memory (or why no GPU is
visible), what ``--kill`` leaves alone and will end, and what ending them did. Formats the views of
:mod:`stepscope.report.command_views`."""

from __future__ import annotations

from typing import Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

from stepscope.report.command_views import GpuProcsView, KillOutcome, KillPlan, LeftAlone
from stepscope.report.render.output import Output
from stepscope.text import printable
from stepscope.units import format_bytes, format_duration

_COLUMNS: tuple[tuple[str, Literal["left", "right"]], ...] = (
    ("pid", "right"), ("ppid", "right"), ("user", "left"), ("GPU", "left"), ("GPU mem", "right"), ("age", "right"),
    ("state", "left"), ("stale?", "left"), ("command", "left"))
#: Each outcome of ending a process, as a line after its pid.
OUTCOMES = {"reused": "now a different process; left alone", "released": "no longer holds a GPU device file; left alone",
            "gone": "already gone", "denied": "not permitted to signal it", "ended": "ended (SIGTERM)",
            "killed": "killed (SIGKILL)", "stuck": "still there after SIGKILL (stuck in the kernel?)"}


def render(view: GpuProcsView, out: Output) -> list[str]:
    if view.no_gpu is not None:
        if out.stream is not None:
            out.stream.write(f"No NVIDIA GPU is visible here: {printable(view.no_gpu)}. No process holds GPU memory.\n")
        return []
    console = Console(file=out.stream)
    if not view.rows:
        console.print(f"No process holds memory on the {view.gpu_count} GPU{'s' if view.gpu_count != 1 else ''}.")
    else:
        table = Table(box=None, padding=(0, 1), header_style="bold")
        for name, justify in _COLUMNS:
            table.add_column(name, justify=justify, overflow="fold" if name == "command" else "ellipsis")
        for row, command in zip(view.rows, view.commands):
            cells = (str(row.pid), "-" if row.ppid is None else str(row.ppid), row.user,
                     ",".join(map(str, row.gpus)) or "-", format_bytes(row.gpu_memory_bytes),
                     format_duration(row.age_s), row.state, row.stale or "no", command)
            table.add_row(*(Text(printable(cell)) for cell in cells), style="yellow" if row.stale else None)  # no markup
        console.print(table)
    for note in view.notes:
        console.print(Text(f"note: {printable(note)}", style="dim"))
    return []


def _left_alone(item: LeftAlone) -> Text | str:
    if item.why == "other_user":
        return Text(f"left alone: pid {item.pid} belongs to {printable(item.owner)}, not to you")
    if item.why == "zombie":
        return f"left alone: pid {item.pid} is a zombie; only its parent (pid {item.parent}) can reap it"
    return Text(f"left alone: pid {item.pid}: {item.reason}")


def render_kill_plan(view: KillPlan, out: Output) -> list[str]:
    """The stale processes left alone and why, then the ones to end (and the question, when asked)."""
    console = Console(file=out.stream)
    for item in view.left_alone:
        console.print(_left_alone(item), highlight=False)
    if not view.to_end:
        console.print("Nothing to end: none of your GPU processes looks stale.")
        return []
    console.print(f"Will end {len(view.to_end)} of your processes: " + ", ".join(map(str, view.to_end)),
                  highlight=False)
    if view.ask and out.stream is not None:
        out.stream.write(f"End {len(view.to_end)} process{'es' if len(view.to_end) > 1 else ''} "
                         f"(SIGTERM, then SIGKILL after {view.grace_s:g} s)? [y/N] ")
        out.stream.flush()
    return []


def render_kill_outcome(view: KillOutcome, out: Output) -> list[str]:
    console = Console(file=out.stream)
    if view.declined:
        console.print("Nothing ended.")
    for pid, outcome in view.outcomes:
        console.print(f"pid {pid}: {OUTCOMES[outcome]}", highlight=False)
    return []
