"""``stepscope runs`` on the terminal and as a page: the run list, one metric over the runs (a bar
per run and a trend line), and that plot as a self-contained HTML page. Formats a
:class:`~stepscope.report.command_views.RunsView`: the shares, the largest value and each point's
fraction of it are the view's."""

from __future__ import annotations

import datetime as dt

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from stepscope.report.command_views import RunRow, RunsView
from stepscope.report.render.output import Output
from stepscope.safe_write import atomic_write
from stepscope.text import printable
from stepscope.units import format_duration

PLOT_WIDTH = 30
_BLOCKS = " ▁▂▃▄▅▆▇█"


def _when(run: RunRow, short: bool = False) -> str:
    if not run.started_at:
        return "?"
    return dt.datetime.fromtimestamp(run.started_at).strftime("%m-%d %H:%M" if short else "%Y-%m-%d %H:%M:%S")


def metric_text(kind: str, value: float | None) -> str:
    """A value of the index as it reads (``kind``: ``share``, ``duration`` or ``number``)."""
    if value is None:
        return "–"
    if kind == "share":
        return f"{float(value):.1%}"
    if kind == "duration":
        return format_duration(float(value))
    return f"{float(value):,.1f}"


def runs_list(view: RunsView) -> Group:
    if not view.rows:
        return Group(Text(f"no runs in the index {printable(view.index)} (match the filters)", style="bright_black"))
    lines: list[Text] = []
    for run in view.rows:
        tags = f"  [{','.join(run.tags)}]" if run.tags else ""
        gone = " (gone)" if not run.exists else ""
        head = Text(f"{printable(run.run_dir)}{gone}", style="bold" if run.exists else "bright_black")
        head.append(f"  {_when(run, short=True)}{printable(tags)}  {run.steps} steps  "
                    f"step {metric_text('duration', run.step_time_s)}  "
                    f"{metric_text('number', run.samples_per_s)} samples/s  "
                    f"{printable(run.script)}")
        lines.append(head)
        if run.top_title:
            lines.append(Text(f"    [{run.top_severity.upper()}] {printable(run.top_title)}", style="bright_black"))
    return Group(Group(*lines), Text(f"{len(view.rows)} run(s) · index {printable(view.index)}", style="bright_black"))


def plot(view: RunsView) -> Group:
    """The metric over runs: one bar per run (latest last), with its value and date."""
    metric = view.metric or ""
    if not view.points:
        return Group(Text(f"no run has {metric}", style="bright_black"))
    table = Table(box=None, pad_edge=False, show_edge=False, title=f"{metric} over {len(view.points)} run(s)",
                  title_justify="left")
    for column, justify in (("started", "left"), ("tags", "left"), (metric, "right"), ("", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for point in view.points:
        width = point.fraction * PLOT_WIDTH
        bar = "█" * int(width) + (_BLOCKS[int((width - int(width)) * 8)] if width - int(width) > 0.125 else "")
        table.add_row(_when(point.run), printable(",".join(point.run.tags)), metric_text(view.metric_kind, point.value),
                      Text(bar, style="cyan"))
    spark = "".join(_BLOCKS[1 + int(point.fraction * 7.999)] for point in view.points[-2 * PLOT_WIDTH:])
    return Group(table, Text(f"trend {spark}", style="cyan"))


def render(view: RunsView, out: Output) -> list[str]:
    Console(file=out.stream).print(plot(view) if view.metric is not None else runs_list(view))
    return []


def render_html(view: RunsView, out: Output) -> list[str]:
    """The plot as a self-contained page (an inline SVG line with a point per run) at ``out.path``."""
    if out.path is not None:
        atomic_write(out.path, plot_html(view).encode("utf-8"))
    return []


def plot_html(view: RunsView) -> str:
    from stepscope.report.render.html import _asset, text

    metric = view.metric or ""
    width, height, pad = 720, 240, 40
    body = "<p>no run has this metric</p>"
    if view.points:
        step = (width - 2 * pad) / max(1, len(view.points) - 1)
        xy = [(pad + index * step, height - pad - point.fraction * (height - 2 * pad))
              for index, point in enumerate(view.points)]
        line = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
        dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#4c78a8"><title>{text(_when(point.run))} '
                       f'{text(",".join(point.run.tags))} {text(metric_text(view.metric_kind, point.value))}\n'
                       f'{text(point.run.full_dir)}</title></circle>'
                       for (x, y), point in zip(xy, view.points))
        body = (f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
                f'aria-label="{text(metric)} over runs"><polyline fill="none" stroke="#4c78a8" stroke-width="2" '
                f'points="{line}"/>{dots}<text x="{pad}" y="{pad - 10}" font-size="12">max '
                f'{text(metric_text(view.metric_kind, view.top))}</text></svg>')
        rows = "".join(f"<tr><td>{text(_when(point.run))}</td><td>{text(','.join(point.run.tags))}</td>"
                       f"<td>{text(metric_text(view.metric_kind, point.value))}</td><td>{text(point.run.full_dir)}</td></tr>"
                       for point in view.points)
        body += f"<table><thead><tr><th>started</th><th>tags</th><th>{text(metric)}</th><th>run</th></tr></thead><tbody>{rows}</tbody></table>"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            f"<title>stepscope runs · {text(metric)}</title><style>{_asset('report.css')}</style></head><body><main>"
            f"<h1>stepscope runs · {text(metric)}</h1>{body}</main></body></html>\n")
