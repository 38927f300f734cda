"""`stepscope report RUN_DIR`: re-render a saved run without re-running it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stepscope.cli.analyze_cmd import add_max_bytes_option, max_bytes_limit


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report", help="re-print the summary of a saved run",
        description="Re-render a run directory written by 'stepscope run' (terminal or JSON).")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory or a record file")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    parser.add_argument("--rank", type=int, default=None, help="rank to show (default: the lowest)")
    from stepscope.report.exports import add_export_options

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
    import orjson

    from stepscope.diagnosis.findings import Severity

    fail_on = Severity.parse(args.fail_on) if getattr(args, "fail_on", None) else None

    from stepscope.record.store import load_job, load_record, resolve_record_path
    from stepscope.report.exports import export_report, plan_exports
    from stepscope.report.model import build_report

    record = load_record(args.run_dir, rank=args.rank)
    if getattr(args, "flame", None) is not None:
        return _print_flame(record, args.flame)
    record_file = resolve_record_path(args.run_dir, args.rank)
    exports = plan_exports(args, record_file.parent)  # checks the outputs before any work
    from stepscope.report.job import build_job_report, is_job_dir

    if args.rank is None and is_job_dir(args.run_dir):
        report = build_job_report(record_file.parent)  # every rank merged into one report
    else:
        report = build_report(record, run_dir=record_file.parent, ranks=load_job(args.run_dir))
    from stepscope import verify

    verification = verify.load(record_file.parent)  # a `run --verify`: its trials' measurements
    if verification is not None:
        report = verify.apply_to_report(report, verification)
    if exports:
        export_report(report, run_dir=record_file.parent, **exports)
    elif args.format == "json":
        sys.stdout.write(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
                                      | orjson.OPT_NON_STR_KEYS).decode() + "\n")
    else:
        from rich.console import Console

        from stepscope.report.terminal import print_summary

        print_summary(report, str(record_file.parent), console=Console())
    from stepscope.cli.run_cmd import fail_on_findings

    return fail_on_findings(report.findings, fail_on)


def _print_flame(record: Any, phase: str) -> int:
    """``--flame PHASE``: the phase's folded stacks on stdout (code attribution)."""
    from stepscope.analysis.run.code_locations import collapse_stacks, format_collapsed
    from stepscope.errors import UsageError

    try:
        stacks = collapse_stacks(record, phase)
    except ValueError as exc:
        raise UsageError(f"--flame: {exc}") from None
    if not stacks:
        print(f"stepscope: no stack samples for phase {phase!r} in this run", file=sys.stderr)
    sys.stdout.write(format_collapsed(stacks))
    return 0
