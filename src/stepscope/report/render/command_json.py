"""The JSON of ``try``, ``gpu-procs``, ``monitor`` and ``runs``: each view's ``document`` (or its
rows), written as each command has always written it."""

from __future__ import annotations

import json

import orjson
from rich.console import Console
from rich.text import Text

from stepscope.report.command_views import GpuProcsView, MonitorView, RunsView, TryView
from stepscope.report.render.output import Output
from stepscope.safe_write import atomic_write
from stepscope.text import printable


def _write(out: Output, text: str) -> None:
    if out.stream is not None:
        out.stream.write(text)


def render_try(view: TryView, out: Output) -> list[str]:
    """``whatif.json`` to a path (no final newline), the same indented JSON and a newline to a stream."""
    payload = json.dumps(view.document, indent=1)
    if out.path is not None:
        atomic_write(out.path, payload.encode("utf-8"))
    _write(out, payload + "\n")
    return []


def render_gpu_procs(view: GpuProcsView, out: Output) -> list[str]:
    """The rows as a JSON list; the probe's notes after it. Without a GPU, ``[]`` and the reason as
    a notice (for stderr: stdout stays JSON)."""
    if view.no_gpu is not None:
        _write(out, "[]\n")
        return [f"note: no NVIDIA GPU is visible here: {printable(view.no_gpu)}"]
    _write(out, orjson.dumps(list(view.document), option=orjson.OPT_INDENT_2).decode() + "\n")
    console = Console(file=out.stream)
    for note in view.notes:
        console.print(Text(f"note: {printable(note)}", style="dim"))
    return []


def render_monitor(view: MonitorView, out: Output) -> list[str]:
    _write(out, orjson.dumps(view.document, option=orjson.OPT_INDENT_2).decode() + "\n")
    return []


def render_runs(view: RunsView, out: Output) -> list[str]:
    _write(out, orjson.dumps(view.document, option=orjson.OPT_INDENT_2).decode() + "\n")
    return []
