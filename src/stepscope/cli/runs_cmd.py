"""`stepscope runs` — the history of runs from the run index: list, filter, plot, rebuild."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError
from stepscope.text import say


def add_parser(subparsers: Any) -> None:
    from stepscope.record.run_index import PLOT_METRICS

    parser = subparsers.add_parser(
        "runs", help="list the runs of the run index (filter by script, date, tag; plot a metric over runs)",
        description="The history every 'stepscope run' adds to: a local SQLite index of runs with their "
                    "key facts and summary numbers. The run directories stay the source of truth "
                    "(--reindex rebuilds the index from them).")
    parser.add_argument("--script", metavar="TEXT", help="only runs whose script contains TEXT")
    parser.add_argument("--tag", metavar="NAME", help="only runs tagged NAME (stepscope run --tag NAME)")
    parser.add_argument("--since", metavar="DATE", help="only runs started on or after DATE (YYYY-MM-DD[THH:MM])")
    parser.add_argument("--until", metavar="DATE", help="only runs started before DATE")
    parser.add_argument("--limit", type=int, metavar="N", help="the latest N runs only")
    parser.add_argument("--plot", metavar="METRIC", choices=PLOT_METRICS,
                        help=f"draw METRIC over the runs ({', '.join(PLOT_METRICS)})")
    parser.add_argument("--html", metavar="FILE", help="with --plot: also write the plot as an HTML page")
    parser.add_argument("--reindex", nargs="+", metavar="DIR",
                        help="add every run directory under DIR to the index (and drop rows whose directory is gone)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--index", metavar="FILE", help="the run index (default $STEPSCOPE_INDEX or "
                                                         "~/.local/share/stepscope/runs.sqlite)")
    parser.set_defaults(handler=handle)


def _date(text: str | None, option: str) -> float | None:
    if not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{option} takes a date like 2026-12-01 or 2026-12-01T14:30, got {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.astimezone()
    return moment.timestamp()


def _index(args: argparse.Namespace) -> Path:
    from stepscope.record.run_index import index_path

    path = Path(args.index) if args.index else index_path()
    if path is None:
        raise UsageError("the run index is switched off (STEPSCOPE_INDEX=off); unset it or pass --index FILE")
    return path


def handle(args: argparse.Namespace) -> int:
    from stepscope.record import run_index

    path = _index(args)
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be >= 1, got {args.limit}")
    if args.html and not args.plot:
        raise UsageError("--html draws the --plot METRIC; give --plot too")
    if args.reindex:
        from stepscope.pipeline.history import reindex

        added, problems = reindex([Path(item) for item in args.reindex], path)
        for problem in problems:
            say(f"stepscope: warning: skipped {problem}")
        say(f"stepscope: indexed {added} run(s) into {path}")
    runs = run_index.list_runs(path, script=args.script, tag=args.tag, since=_date(args.since, "--since"),
                               until=_date(args.until, "--until"), limit=args.limit)
    from stepscope.pipeline.commands import runs_view
    from stepscope.report.render import Output, render

    view = runs_view(runs, path, args.plot)
    render(view, args.format, Output(stream=sys.stdout))
    if args.html and args.format == "text":
        target = Path(args.html)
        try:
            render(view, "html", Output(path=target))
        except OSError as exc:
            raise UsageError(f"{target}: cannot write ({exc.strerror or exc})") from None
        say(f"stepscope: wrote {target}")
    return 0
