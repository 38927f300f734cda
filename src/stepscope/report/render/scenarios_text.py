"""``stepscope demo --list``: the zoo's scenarios as a table (a
:class:`~stepscope.report.command_views.ScenarioList`)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from stepscope.report.command_views import ScenarioList
from stepscope.report.render.output import Output


def render(view: ScenarioList, out: Output) -> list[str]:
    table = Table(title="stepscope demo scenarios", title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("planted bottleneck")
    table.add_column("what it does")
    for row in view.rows:
        table.add_row(row.name + (" (default)" if row.default else ""), row.planted, f"{row.title}: {row.mechanism}")
    Console(file=out.stream).print(table)
    return []
