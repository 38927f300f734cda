"""Every output of a report, one contract: ``render(report, out) -> notices``, chosen from :data:`RENDERERS`.

A renderer formats a :class:`~stepscope.report.model.Report` and writes it to its
:class:`Output` — a text stream (``text``, ``json``, ``flame``) or a path (``html``,
``perfetto``, a ``tensorboard`` directory) — and returns the notices worth a line on stderr
(what was down-sampled, what was left out). It computes no number of its own and reads no file:
it imports only the view-model (:mod:`stepscope.report.model`), :mod:`stepscope.units`,
:mod:`stepscope.text` and the other renderers (``tests/unit/test_layers.py`` checks it).

| name | writes |
| --- | --- |
| ``text`` | the terminal summary of a run (:mod:`.terminal`), or the trace views of ``analyze`` (:mod:`.trace_text`) |
| ``json`` | ``report.json`` / ``--format json`` (:meth:`Report.to_dict`, docs/report-json.md) |
| ``html`` | one self-contained HTML page (:mod:`.html`) |
| ``perfetto`` | one Chrome/Perfetto trace of the job's steps, samples and profiler windows (:mod:`.perfetto`) |
| ``tensorboard`` | TensorBoard scalars into a directory (:mod:`.tensorboard`) |
| ``flame`` | the folded stacks of one phase, for flamegraph.pl / speedscope (:mod:`.flame`) |

The other commands' views (:mod:`stepscope.report.command_views`, made by
:mod:`stepscope.pipeline.commands`) go through the same :func:`render`, which picks their renderer
from :data:`VIEW_RENDERERS` by the view's ``kind`` and the output's name:

| kind | ``text`` | ``json`` | ``html`` |
| --- | --- | --- | --- |
| ``try`` | :mod:`.try_text` | :mod:`.command_json` (``whatif.json``) | — |
| ``tune``, ``tune_progress`` | :mod:`.tune_text` | — | — |
| ``gpu_procs``, ``kill_plan``, ``kill_outcome`` | :mod:`.gpu_procs_text` | :mod:`.command_json` | — |
| ``monitor``, ``monitor_ended`` | :mod:`.monitor_text` | :mod:`.command_json` | — |
| ``runs`` | :mod:`.runs_text` | :mod:`.command_json` | :mod:`.runs_text` (the plot) |
| ``scenarios`` | :mod:`.scenarios_text` | — | — |
| ``diff`` (:class:`~stepscope.report.diff_view.DiffView`, made by :mod:`stepscope.pipeline.compare`) | :mod:`.diff_text` | :mod:`.diff_json` | :mod:`.diff_html` |
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stepscope.report.model import Report
from stepscope.report.render.output import Output

if TYPE_CHECKING:  # names only: a run's summary and `analyze` load neither (~45 dataclasses)
    from stepscope.report.command_views import CommandView
    from stepscope.report.diff_view import DiffView

Renderer = Callable[[Report, Output], list[str]]


def _text(report: Report, out: Output) -> list[str]:
    if report.source == "trace":
        from stepscope.report.render import trace_text

        return trace_text.render(report, out)
    from stepscope.report.render import terminal

    return terminal.render(report, out)


def _lazy(module: str) -> Renderer:
    def call(report: Report, out: Output) -> list[str]:
        from importlib import import_module

        render: Renderer = import_module(f"stepscope.report.render.{module}").render
        return render(report, out)

    return call


#: The outputs, by name (each module is imported when used: a summary does not load the HTML code).
RENDERERS: dict[str, Renderer] = {
    "text": _text,
    "json": _lazy("json_doc"),
    "html": _lazy("html"),
    "perfetto": _lazy("perfetto"),
    "tensorboard": _lazy("tensorboard"),
    "flame": _lazy("flame"),
}


#: The other commands' outputs: (view kind, output name) -> "module:function" of this package.
VIEW_RENDERERS: dict[tuple[str, str], str] = {
    ("try", "text"): "try_text:render",
    ("try", "json"): "command_json:render_try",
    ("tune", "text"): "tune_text:render",
    ("tune_progress", "text"): "tune_text:render_progress",
    ("gpu_procs", "text"): "gpu_procs_text:render",
    ("gpu_procs", "json"): "command_json:render_gpu_procs",
    ("kill_plan", "text"): "gpu_procs_text:render_kill_plan",
    ("kill_outcome", "text"): "gpu_procs_text:render_kill_outcome",
    ("monitor", "text"): "monitor_text:render",
    ("monitor", "json"): "command_json:render_monitor",
    ("monitor_ended", "text"): "monitor_text:render_ended",
    ("runs", "text"): "runs_text:render",
    ("runs", "json"): "command_json:render_runs",
    ("runs", "html"): "runs_text:render_html",
    ("scenarios", "text"): "scenarios_text:render",
    ("diff", "text"): "diff_text:render",
    ("diff", "json"): "diff_json:render",
    ("diff", "html"): "diff_html:render",
}


def render(view: Report | CommandView | DiffView, name: str, out: Output) -> list[str]:
    """Render ``view`` with the output ``name`` (:data:`RENDERERS` for a run's report,
    :data:`VIEW_RENDERERS` for another command's view); returns its notices."""
    if isinstance(view, Report):
        return RENDERERS[name](view, out)
    from importlib import import_module

    module, _, function = VIEW_RENDERERS[(view.kind, name)].partition(":")
    renderer: Callable[[Any, Output], list[str]] = getattr(import_module(f"stepscope.report.render.{module}"),
                                                           function)
    return renderer(view, out)


__all__ = ["Output", "RENDERERS", "Renderer", "VIEW_RENDERERS", "render"]
