"""``stepscope analyze TRACE_OR_DIR``: the trace views and ranked findings of torch.profiler traces.

Input is one Kineto trace (``.json`` / ``.json.gz``) or a directory of per-rank traces. Text output
renders each rank's views and findings; ``--format json`` prints the document described in
``docs/analyze-json.md`` (every view, each rank's evidence and findings). Bad input is an
:class:`~stepscope.errors.InputError` (one line, exit 2). A progress bar is drawn on stderr while
files larger than :data:`PROGRESS_MIN_BYTES` load, when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from stepscope.text import say

PROGRESS_MIN_BYTES = 32 * 1024 * 1024


def add_max_bytes_option(parser: argparse.ArgumentParser) -> None:
    """``--max-bytes SIZE``: see :mod:`stepscope.limits` (shared by ``analyze`` and ``report``)."""
    from stepscope.limits import DEFAULT_MAX_BYTES, ENV_VAR, describe

    parser.add_argument(
        "--max-bytes", metavar="SIZE", default=None,
        help=f"most decompressed JSON held at once: one trace event, a record, a samples line; and the size past "
             f"which a gzip may not inflate more than 200:1 (default {describe(DEFAULT_MAX_BYTES)}, or {ENV_VAR}; "
             "e.g. 512M, 2G). Files past it are refused as damaged")


def max_bytes_limit(args: argparse.Namespace):
    """A context in which ``--max-bytes`` is the limit (a malformed value is a usage error at once)."""
    from stepscope import limits

    if getattr(args, "max_bytes", None) is not None:
        return limits.configured(limits.parse_size(args.max_bytes))
    limits.max_bytes()  # a malformed STEPSCOPE_MAX_BYTES is a usage error before any work
    return limits.configured(None)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "analyze",
        help="analyze torch.profiler (Kineto) traces: step breakdown, GPU idle time, operators, kernels, memory",
        description="Analyze torch.profiler traces (a .json/.json.gz file, or a directory with one file per rank) "
        "and print the step-time breakdown, GPU views and ranked findings.",
    )
    parser.add_argument("trace", metavar="TRACE_OR_DIR", help="trace file or directory of per-rank trace files")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    parser.add_argument("--group-by-shape", action="store_true", help="group operators by name and input shape")
    parser.add_argument("--rank", type=int, default=None, help="show only this rank")
    parser.add_argument("--top", type=int, default=10, help="rows in the operator and kernel tables (default: 10)")
    parser.add_argument("--output", "-o", default=None, help="write the output to this file instead of stdout")
    parser.add_argument("--no-progress", action="store_true", help="never draw the loading progress bar")
    parser.add_argument("--html", action="store_true",
                        help="write a self-contained HTML report (to -o FILE, default TRACE.html)")
    parser.add_argument("--perfetto", metavar="FILE", default=None,
                        help="also write the trace with its critical path marked (a track per thread or stream "
                             "and flow arrows; the longest path of the steps analysed) for ui.perfetto.dev "
                             "(FILE.gz: gzipped)")
    parser.add_argument("--path-steps", type=int, default=None, metavar="N",
                        help="steps whose critical path is computed, spread over their durations "
                             "(default: 1, the step of median duration; 0: every step)")
    parser.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                        help="analyse ranks in parallel on N local processes, and decode a single uncompressed "
                             "trace of at least 128 MiB in up to N byte ranges (default: one per core, at most one "
                             "per trace file, every core for a single file; 1: in this process)")
    parser.add_argument("--dask", metavar="SCHEDULER", default=None,
                        help="analyse ranks on a Dask cluster: a scheduler address (tcp://HOST:8786) or 'local' "
                             "(a local cluster of --jobs workers); needs stepscope[dask]")
    add_max_bytes_option(parser)
    parser.set_defaults(handler=run)


def _draws_progress(args: argparse.Namespace) -> bool:
    """A progress bar is drawn (for files past :data:`PROGRESS_MIN_BYTES`): stderr is a terminal."""
    return not args.no_progress and sys.stderr.isatty()


def _progress(args: argparse.Namespace) -> tuple[Any, Any]:
    if not _draws_progress(args):
        return None, None
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from stepscope.text import printable

    progress = Progress(
        TextColumn("loading {task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
        console=Console(stderr=True), transient=True,
        # drawn from the callback, at most 10 times a second: no drawing thread, so the load's workers
        # and the views' child can be forked (stepscope.executors, analysis/trace/beside.py)
        auto_refresh=False,
    )
    tasks: dict[str, Any] = {}
    drawn = 0.0

    def callback(path: str, done: int, total: int) -> None:
        nonlocal drawn
        if total < PROGRESS_MIN_BYTES:
            return
        if path not in tasks:
            if not tasks:
                progress.start()
            tasks[path] = progress.add_task(escape(printable(os.path.basename(path))), total=total)
        progress.update(tasks[path], completed=min(done, total))
        now = time.monotonic()
        if now - drawn >= 0.1 or done >= total:
            progress.refresh()
            drawn = now

    return progress, callback


def run(args: argparse.Namespace) -> int:
    with max_bytes_limit(args), _decoding_ahead(args) as decoding:
        return _run(args, decoding=bool(decoding))


def _decoding_ahead(args: argparse.Namespace) -> Any:
    """One file analysed in this process, with no progress bar to draw for it, is decoded by a forked
    child while this process imports the analysis (:mod:`stepscope.traces.ahead`; ``--jobs 1``: not)."""
    from contextlib import nullcontext

    if args.dask is not None or args.jobs == 1 or not os.path.isfile(args.trace):
        return nullcontext()
    from stepscope.traces.load import MAX_JSON_BYTES, cut_in_ranges, decode_ahead

    size = os.path.getsize(args.trace)
    if cut_in_ranges(size) or (size >= PROGRESS_MIN_BYTES and _draws_progress(args)):
        return nullcontext()  # cut in ranges on every core (traces/split_load.py), or a progress bar to draw
    from stepscope.traces.ahead import decoding

    return decoding(args.trace, decode_ahead, MAX_JSON_BYTES)


def _run(args: argparse.Namespace, decoding: bool = False) -> int:
    from stepscope.errors import UsageError
    from stepscope.pipeline.diagnose import ReportOptions, diagnose
    from stepscope.report.render import Output, render

    if args.top < 0:
        raise UsageError("--top must be >= 0")
    if args.output:
        _check_output(args.output, args.trace)
    html_path = None
    if args.html:
        from stepscope.cli.exports import plan_trace_html

        html_path = plan_trace_html(args.trace, args.output)
    if args.jobs is not None and args.jobs < 1:
        raise UsageError("--jobs must be >= 1")
    if args.path_steps is not None and args.path_steps < 0:
        raise UsageError("--path-steps must be >= 0 (0: every step)")
    perfetto_path = None
    if args.perfetto:
        from stepscope.cli.exports import check_output
        from stepscope.traces.load import discover_traces

        perfetto_path = check_output(args.perfetto, "Perfetto trace", [Path(p) for p in discover_traces(args.trace)])
    if decoding and args.format != "json" and not html_path:
        # this process waits for the child's decode: import the text renderer (rich, ~30 ms) meanwhile
        import stepscope.report.render.trace_text  # noqa: F401
    progress, callback = _progress(args)
    try:
        inputs = _load(args, callback)
    finally:
        if progress is not None:
            progress.stop()
    report = diagnose(inputs, ReportOptions(focus=args.rank))
    if perfetto_path is not None:
        _write_path_overlay(report, perfetto_path, args.rank)
    if html_path is not None:
        from stepscope.cli.exports import export_report

        export_report(report, run_dir=None, html=html_path)
        return 0
    try:
        out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout  # noqa: SIM115
    except OSError as exc:
        raise UsageError(f"cannot write the output file {args.output} ({exc.strerror}); "
                         "choose a writable path for -o/--output") from None
    try:
        render(report, "json" if args.format == "json" else "text", Output(stream=out, top=args.top))
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def _write_path_overlay(report: Any, path: Path, rank: int | None) -> None:
    """``--perfetto``: the focus rank's trace with its critical path marked (one line on stderr)."""
    from stepscope.errors import UsageError
    from stepscope.report.render.perfetto import path_overlay, write_trace_json
    from stepscope.traces.load import load_raw_events

    views = report.traces.ranks if report.traces is not None else ()
    view = next((v for v in views if rank is None or v.rank == rank), None)
    if view is None or view.critical is None or not view.critical.stretches:
        print("stepscope: no critical path to mark (no operators or GPU rows): no Perfetto trace written",
              file=sys.stderr)
        return
    events, top = load_raw_events(view.path)
    doc = {key: value for key, value in top.items() if key != "traceEvents"}
    doc["traceEvents"] = path_overlay(events, view.critical)
    try:
        write_trace_json(doc, path)
    except OSError as exc:
        raise UsageError(f"cannot write the Perfetto trace {path} ({exc.strerror}); choose a writable path") from None
    say(f"stepscope: wrote {path} (critical path of {view.critical.shown_step}, rank {view.rank})")


def _load(args: argparse.Namespace, callback: Any) -> Any:
    """The traces, analysed: in this process, on local worker processes, or on a Dask cluster."""
    from stepscope.analysis.trace.trace_evidence import default_jobs
    from stepscope.pipeline.inputs import load_traces
    from stepscope.traces.load import discover_traces

    if args.dask is not None:
        from stepscope.executors import dask_executor

        with dask_executor(args.dask, workers=args.jobs or 2) as executor:
            return load_traces(args.trace, group_by_shape=args.group_by_shape, executor=executor,
                               path_steps=args.path_steps)
    paths = discover_traces(args.trace)  # listed once: the job size picks the default --jobs
    if args.jobs is not None:
        jobs = args.jobs
    elif len(paths) == 1:  # one file: its decode may use every core (only a large uncompressed one does)
        from stepscope.executors import usable_cores

        jobs = usable_cores()
    else:
        jobs = default_jobs(len(paths))
    single = jobs == 1 or len(paths) == 1  # analysed in this process: a progress bar of its bytes
    return load_traces(paths, group_by_shape=args.group_by_shape, progress=callback if single else None, jobs=jobs,
                       path_steps=args.path_steps)


def _check_output(output: str, trace: str) -> None:
    """Refuse an output path that is one of the input traces (it would be replaced) or a directory."""
    from stepscope.errors import UsageError

    if os.path.isdir(output):
        raise UsageError(f"-o/--output {output} is a directory; name a file to write")
    inputs = [trace]
    if os.path.isdir(trace):
        inputs = [os.path.join(trace, name) for name in os.listdir(trace)]
    target = os.path.realpath(output)
    for path in inputs:
        same = os.path.realpath(path) == target
        try:
            same = same or os.path.samefile(path, output)
        except OSError:
            pass
        if same:
            raise UsageError(f"-o/--output {output} is the input trace {path}: it would be overwritten; "
                             "write the output to another file")
