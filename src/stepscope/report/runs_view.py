"""``stepscope runs`` rendered: the run table, and a metric over runs (terminal and HTML)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from stepscope.record.run_index import IndexedRun
from stepscope.text import printable
from stepscope.units import format_duration

PLOT_WIDTH = 30
_BLOCKS = " ▁▂▃▄▅▆▇█"
_SHARES = {"data_wait", "forward", "backward", "optimizer", "communication", "other", "compile", "mfu"}


def _when(run: IndexedRun, short: bool = False) -> str:
    if not run.started_at:
        return "?"
    return dt.datetime.fromtimestamp(run.started_at).strftime("%m-%d %H:%M" if short else "%Y-%m-%d %H:%M:%S")


def metric_text(name: str, value: Any) -> str:
    if value is None:
        return "–"
    if name in _SHARES:
        return f"{float(value):.1%}"
    if name.startswith("step_time"):
        return format_duration(float(value))
    return f"{float(value):,.1f}"


def _shown_dir(run_dir: str) -> str:
    """The run directory relative to the current one when it lies below it (what ``diff`` takes)."""
    try:
        return str(Path(run_dir).relative_to(Path.cwd()))
    except ValueError:
        return run_dir


def render_runs(runs: Sequence[IndexedRun], path: Path) -> Group:
    if not runs:
        return Group(Text(f"no runs in the index {printable(path)} (match the filters)", style="bright_black"))
    lines: list[Text] = []
    for run in runs:
        tags = f"  [{','.join(run.tags)}]" if run.tags else ""
        gone = " (gone)" if not run.exists else ""
        head = Text(f"{printable(_shown_dir(run.run_dir))}{gone}", style="bold" if run.exists else "bright_black")
        head.append(f"  {_when(run, short=True)}{printable(tags)}  {run.get('steps') or 0} steps  "
                    f"step {metric_text('step_time_s', run.get('step_time_s'))}  "
                    f"{metric_text('samples_per_s', run.get('samples_per_s'))} samples/s  "
                    f"{printable(Path(run.script).name if run.script else '?')}")
        lines.append(head)
        top = run.get("top_title")
        if top:
            lines.append(Text(f"    [{str(run.get('top_severity') or '').upper()}] {printable(top)}", style="bright_black"))
    table = Group(*lines)
    return Group(table, Text(f"{len(runs)} run(s) · index {printable(path)}", style="bright_black"))


def series(runs: Sequence[IndexedRun], metric: str) -> list[tuple[IndexedRun, float]]:
    return [(run, float(run.get(metric))) for run in runs if run.get(metric) is not None]


def render_plot(runs: Sequence[IndexedRun], metric: str) -> Group:
    """The metric over runs: one bar per run (latest last), with its value and date."""
    points = series(runs, metric)
    if not points:
        return Group(Text(f"no run has {metric}", style="bright_black"))
    top = max(value for _, value in points) or 1.0
    table = Table(box=None, pad_edge=False, show_edge=False, title=f"{metric} over {len(points)} run(s)",
                  title_justify="left")
    for column, justify in (("started", "left"), ("tags", "left"), (metric, "right"), ("", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for run, value in points:
        width = value / top * PLOT_WIDTH
        bar = "█" * int(width) + (_BLOCKS[int((width - int(width)) * 8)] if width - int(width) > 0.125 else "")
        table.add_row(_when(run), printable(",".join(run.tags)), metric_text(metric, value), Text(bar, style="cyan"))
    spark = "".join(_BLOCKS[1 + int(value / top * 7.999)] for _, value in points[-2 * PLOT_WIDTH:])
    return Group(table, Text(f"trend {spark}", style="cyan"))


def plot_html(runs: Sequence[IndexedRun], metric: str) -> str:
    """The metric over runs as a self-contained page (an inline SVG line with a point per run)."""
    from stepscope.report.render.html import _asset, text

    points = series(runs, metric)
    width, height, pad = 720, 240, 40
    body = "<p>no run has this metric</p>"
    if points:
        top = max(value for _, value in points) or 1.0
        step = (width - 2 * pad) / max(1, len(points) - 1)
        xy = [(pad + index * step, height - pad - value / top * (height - 2 * pad)) for index, (_, value) in enumerate(points)]
        line = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
        dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#4c78a8"><title>{text(_when(run))} '
                       f'{text(",".join(run.tags))} {text(metric_text(metric, value))}\n{text(run.run_dir)}</title></circle>'
                       for (x, y), (run, value) in zip(xy, points))
        body = (f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
                f'aria-label="{text(metric)} over runs"><polyline fill="none" stroke="#4c78a8" stroke-width="2" '
                f'points="{line}"/>{dots}<text x="{pad}" y="{pad - 10}" font-size="12">max '
                f'{text(metric_text(metric, top))}</text></svg>')
        rows = "".join(f"<tr><td>{text(_when(run))}</td><td>{text(','.join(run.tags))}</td>"
                       f"<td>{text(metric_text(metric, value))}</td><td>{text(run.run_dir)}</td></tr>" for run, value in points)
        body += f"<table><thead><tr><th>started</th><th>tags</th><th>{text(metric)}</th><th>run</th></tr></thead><tbody>{rows}</tbody></table>"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            f"<title>stepscope runs · {text(metric)}</title><style>{_asset('report.css')}</style></head><body><main>"
            f"<h1>stepscope runs · {text(metric)}</h1>{body}</main></body></html>\n")
