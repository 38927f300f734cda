"""The ``--html``, ``--perfetto`` and ``--tensorboard`` exports of the CLI: checks first, then writes
(through the renderer table, :mod:`stepscope.report.render`).

:func:`check_output` refuses an output that cannot be written or that would overwrite an input
(:class:`~stepscope.errors.UsageError`: one line, exit 2) *before* any work is done;
:func:`export_report` writes what was asked and says so on stderr, one line per file, with the
down-sampling notices of the HTML page.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from stepscope.errors import UsageError
from stepscope.report.model import Report
from stepscope.text import say

HTML_NAME = "report.html"


def check_output(path: str | Path, what: str, inputs: Iterable[Path] = (), directory: bool = False) -> Path:
    """The output path, or :class:`UsageError` when it is an input or cannot be written."""
    target = Path(path)
    for item in inputs:
        try:
            if item.exists() and target.exists() and os.path.samefile(item, target):
                raise UsageError(f"{what} {path} is one of the input files; choose another output name")
        except OSError:
            continue
        if item.resolve() == target.resolve():
            raise UsageError(f"{what} {path} is one of the input files; choose another output name")
    if directory:
        if target.exists() and not target.is_dir():
            raise UsageError(f"{what} {path} exists and is not a directory")
        probe = target if target.exists() else _existing_parent(target)
    else:
        if target.is_dir():
            raise UsageError(f"{what} {path} is a directory; give a file name")
        probe = target.parent if str(target.parent) else Path(".")
        if not probe.is_dir():
            raise UsageError(f"cannot write {what} {path}: directory {probe} does not exist")
    if not os.access(probe, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UsageError(f"cannot write {what} {path}: permission denied")
    return target


def _existing_parent(path: Path) -> Path:
    for parent in (path, *path.parents):
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"cannot create directory {path}: {parent} is not a directory")
            return parent
    return Path(".")


def run_inputs(run_dir: Path) -> list[Path]:
    """The files a run directory's report is read from (records, samples, profiler traces)."""
    if run_dir.is_file():
        return [run_dir]
    found = [item for item in run_dir.glob("*") if item.name.startswith(("record", "samples"))]
    return found + list((run_dir / "traces").glob("*"))


def export_report(report: Report, *, run_dir: Path | None, html: Path | None = None, perfetto: Path | None = None,
                  tensorboard: Path | None = None, stream: IO[str] | None = None) -> None:
    """Write the exports that were asked for through the renderer table; each says where it went
    (and what it left out) on ``stream`` (stderr)."""
    from stepscope.report.render import Output, render

    out = stream or sys.stderr
    shown = str(run_dir) if run_dir is not None else None
    try:
        if html is not None:
            for notice in render(report, "html", Output(path=html, run_dir=shown)):
                say(f"stepscope: html: {notice}", out)
            say(f"stepscope: wrote {html} ({_size(html)})", out)
        if perfetto is not None:
            for note in render(report, "perfetto", Output(path=perfetto)):
                say(f"stepscope: perfetto: {note}", out)
            say(f"stepscope: wrote {perfetto} ({_size(perfetto)}; open it in ui.perfetto.dev)", out)
        if tensorboard is not None:
            for notice in render(report, "tensorboard", Output(path=tensorboard)):
                say(f"stepscope: wrote {notice}", out)
    except OSError as exc:
        raise UsageError(f"cannot write {exc.filename or 'output'}: {exc.strerror}") from None


def _size(path: Path) -> str:
    from stepscope.units import format_bytes

    return format_bytes(path.stat().st_size)


# -- the CLI's side --------------------------------------------------------------------------------
def add_export_options(parser: Any) -> None:
    """``--html``, ``-o/--output``, ``--perfetto`` and ``--tensorboard`` of ``stepscope report``."""
    parser.add_argument("--html", action="store_true",
                        help=f"write a self-contained HTML report (RUN_DIR/{HTML_NAME}, or -o FILE)")
    parser.add_argument("-o", "--output", metavar="FILE", help="where --html writes")
    parser.add_argument("--perfetto", metavar="FILE",
                        help="write steps, samples and the profiler window as one Perfetto/Chrome trace (JSON)")
    parser.add_argument("--tensorboard", metavar="DIR",
                        help="write TensorBoard scalars into DIR (needs the tensorboard package)")


def check_tensorboard(path: str) -> Path:
    """The TensorBoard directory, after checking the package is there and the directory writable."""
    from stepscope.report.render.tensorboard import require_tensorboard

    require_tensorboard()
    return check_output(path, "TensorBoard directory", directory=True)


def plan_exports(args: Any, run_dir: Path) -> dict[str, Any]:
    """The exports ``stepscope report`` was asked for, checked; empty when none."""
    if args.output and not args.html:
        raise UsageError("-o/--output names the --html file; add --html")
    inputs = run_inputs(Path(args.run_dir))
    plan: dict[str, Any] = {}
    if args.html:
        plan["html"] = check_output(args.output or run_dir / HTML_NAME, "HTML report", inputs)
    if args.perfetto:
        plan["perfetto"] = check_output(args.perfetto, "Perfetto trace", inputs)
        if plan.get("html") is not None and plan["html"].resolve() == plan["perfetto"].resolve():
            raise UsageError("--perfetto and the HTML report name the same file")
    if args.tensorboard:
        plan["tensorboard"] = check_tensorboard(args.tensorboard)
    return plan


def plan_trace_html(trace: str, output: str | None) -> Path:
    """Where ``stepscope analyze --html`` writes (``-o``, else beside the trace), checked."""
    from stepscope.traces.load import discover_traces

    source = Path(trace)
    inputs = [Path(item) for item in discover_traces(trace)] if source.exists() else []
    if output:
        return check_output(output, "HTML report", inputs)
    if source.is_dir():
        return check_output(source / HTML_NAME, "HTML report", inputs)
    name = source.name
    for suffix in (".gz", ".json"):
        name = name[: -len(suffix)] if name.endswith(suffix) else name
    return check_output(source.with_name(name + ".html"), "HTML report", inputs)


def export_after_run(report: Report, run_dir: Path, *, html: bool, tensorboard: str | None) -> None:
    """``stepscope run --html/--tensorboard``: a failure is one line on stderr, never the run's exit code."""
    from stepscope.errors import StepscopeError

    try:
        export_report(report, run_dir=run_dir, html=run_dir / HTML_NAME if html else None,
                      tensorboard=Path(tensorboard) if tensorboard else None)
    except (StepscopeError, OSError) as exc:
        say(f"stepscope: export failed: {exc}")
