"""`stepscope report RUN_DIR`: re-render a saved run without re-running it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stepscope.cli.analyze_cmd import add_max_bytes_option, max_bytes_limit
from stepscope.text import say


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report", help="re-print the summary of a saved run",
        description="Re-render a run directory written by 'stepscope run' (terminal or JSON).")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory or a record file")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    parser.add_argument("--rank", type=int, default=None, help="rank to show (default: the lowest)")
    parser.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                        help="read a job's ranks in N worker processes (default: one per usable core, at "
                             "most one per rank; 1: in this process)")
    from stepscope.cli.exports import add_export_options

    add_export_options(parser)
    add_max_bytes_option(parser)
    parser.add_argument("--fail-on", metavar="SEVERITY",
                        help="exit 3 when the run has a finding at or above SEVERITY "
                             "(info, low, medium, high, critical): a CI gate on a saved run")
    parser.add_argument("--flame", metavar="PHASE", default=None,  # code attribution
                        help="print the folded stacks of PHASE (data_wait, forward, backward, optimizer, "
                             "other, or workers) as collapsed-stack text for flamegraph.pl / speedscope")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    with max_bytes_limit(args):
        return _handle(args)


def _handle(args: argparse.Namespace) -> int:
    from stepscope.diagnosis.findings import Severity
    from stepscope.pipeline.diagnose import ReportOptions, diagnose
    from stepscope.pipeline.inputs import load_run
    from stepscope.record.store import resolve_record_path
    from stepscope.report.render import Output, render

    from stepscope.errors import UsageError

    if args.jobs is not None and args.jobs < 1:
        raise UsageError("--jobs must be >= 1")
    fail_on = Severity.parse(args.fail_on) if getattr(args, "fail_on", None) else None
    record_file = resolve_record_path(args.run_dir, args.rank)  # the one-line error for a missing rank
    flame = getattr(args, "flame", None)
    from stepscope.cli.exports import export_report, plan_exports

    exports = {} if flame is not None else plan_exports(args, record_file.parent)  # checks the outputs first
    inputs = load_run(args.run_dir, with_windows=flame is None, jobs=args.jobs)
    report = diagnose(inputs, ReportOptions(focus=args.rank, perfetto="perfetto" in exports, flame=flame))
    run_dir = inputs.run_dir or record_file.parent
    if flame is not None:
        for notice in render(report, "flame", Output(stream=sys.stdout)):
            say(f"stepscope: {notice}")
        return 0
    if exports:
        export_report(report, run_dir=run_dir, **exports)
    elif args.format == "json":
        render(report, "json", Output(stream=sys.stdout))
    else:
        render(report, "text", Output(stream=sys.stdout, run_dir=str(run_dir)))
    from stepscope.cli.run_cmd import fail_on_findings

    return fail_on_findings(report.findings, fail_on)
