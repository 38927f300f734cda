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
"""

from __future__ import annotations

from collections.abc import Callable

from stepscope.report.model import Report
from stepscope.report.render.output import Output


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


def render(report: Report, name: str, out: Output) -> list[str]:
    """Render ``report`` with the output ``name`` of :data:`RENDERERS`; returns its notices."""
    return RENDERERS[name](report, out)


__all__ = ["Output", "RENDERERS", "Renderer", "render"]
