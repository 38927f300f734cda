"""``stepscope tune-loader`` on the terminal: the trials, the current and the best setting, the
speed-up and the warning when the best workers would oversubscribe the cores; and each trial's
progress line as it ends. Formats a :class:`~stepscope.report.command_views.TuneView`."""

from __future__ import annotations

from typing import Literal

from rich.console import Console
from rich.table import Table

from stepscope.report.command_views import LoaderProgress, TuneView
from stepscope.report.render.output import Output
from stepscope.text import printable
from stepscope.units import format_duration, format_ratio

#: The narrowest table on a pipe or a file (its ten columns stay whole).
PIPE_WIDTH = 110
_COLUMNS: tuple[tuple[str, Literal["left", "right"]], ...] = (
    ("#", "right"), ("stage", "left"), ("workers", "right"), ("prefetch", "right"), ("pin", "left"),
    ("persist", "left"), ("batch", "right"), ("samples/s", "right"), ("1st batch", "right"), ("restart", "right"))


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def render(view: TuneView, out: Output) -> list[str]:
    console = Console(file=out.stream, highlight=False)
    if not console.is_terminal:
        console = Console(file=out.stream, highlight=False, width=max(console.width, PIPE_WIDTH))
    table = Table(title=f"stepscope tune-loader · {view.target}", title_justify="left")
    for column, justify in _COLUMNS:
        table.add_column(column, justify=justify)
    for row in view.rows:
        mark = " ◀ best" if row.best else ""
        rate = f"error: {row.error}" if row.error else f"{row.samples_per_s:,.0f}{mark}"
        table.add_row(str(row.number), row.stage, str(row.num_workers), str(row.prefetch_factor or "-"),
                      _yes(row.pin_memory), _yes(row.persistent_workers), str(row.batch_size or "-"),
                      rate, format_duration(row.first_batch_s), format_duration(row.restart_s))
    console.print(table)
    console.print(f"current: {view.current} — {view.current_rate:,.0f} samples/s")
    console.print(f"best:    {view.best} — {view.best_rate:,.0f} samples/s")
    console.print(f"speed-up {view.speedup:.2f}× (noise between repeats: {format_ratio(view.noise)}); "
                  f"{len(view.rows)} trials in {view.elapsed_s:.1f} s"
                  + (" — budget reached, search cut short" if view.budget_exhausted else ""))
    for note in view.notes:
        console.print(f"note: {note}")
    if view.oversubscribed:
        console.print(f"warning: {view.best_workers} workers + {view.intra_op_threads} intra-op threads "
                      f"> {view.cpu_count} cores: the training process and the workers will compete; call "
                      f"torch.set_num_threads({view.suggested_threads}) in the training "
                      "process, or use fewer workers")
    return []


def render_progress(view: LoaderProgress, out: Output) -> list[str]:
    """``  stage      setting → samples/s`` (or the error), flushed."""
    trial = view.trial
    outcome = f"error: {trial.error}" if trial.error else f"{trial.samples_per_s:,.0f} samples/s"
    if out.stream is not None:
        out.stream.write(printable(f"  {trial.stage:<10} {trial.setting} → {outcome}") + "\n")
        out.stream.flush()
    return []
