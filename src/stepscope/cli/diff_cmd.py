"""`stepscope diff A B` — two runs (or jobs) or two traces compared; a regression gate for CI.

Exit codes: 0 compared (and the gate, when asked, passed); 3 the gate tripped (``--fail-if-slower``:
B worse than A by more than PCT on the chosen metric *and* beyond noise); 2 a usage or input error.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError
from stepscope.text import printable, say

EXIT_REGRESSION = 3


def add_parser(subparsers: Any) -> None:
    from stepscope.analysis.run.diff import METRICS

    parser = subparsers.add_parser(
        "diff", help="compare two runs or two traces: what got faster or slower, beyond noise, and why",
        description="Compare run B with run A (or two torch.profiler traces): step time and each phase "
                    "with a confidence interval and a verdict, what changed in the setup, and the "
                    "findings that appeared or went away. With --fail-if-slower, a regression gate. "
                    "Repeats of each side (A1 A2 --vs B1 B2) measure the run-to-run noise.")
    parser.add_argument("paths", nargs="*", metavar="A B",
                        help="the baseline A (a run directory, a trace or a directory of traces) and B, compared "
                             "with it; with --vs, every path here is a run of A")
    parser.add_argument("--vs", nargs="+", metavar="B",
                        help="repeats: the runs of B (the paths before are A's runs); the interval is then over "
                             "runs, which measures the run-to-run noise")
    parser.add_argument("--baseline", metavar="last|TAG",
                        help="take A from the run index: the latest run ('last') or the latest run tagged TAG")
    parser.add_argument("--fail-if-slower", type=float, metavar="PCT",
                        help="exit 3 when B is worse than A by more than PCT %% on --metric and beyond noise")
    parser.add_argument("--metric", default="step_time", choices=[m for m in METRICS if m not in ("mfu", "compilations",
                                                                                                   "compile_total_s")],
                        help="the figure the gate and the headline use (default step_time)")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="text (default) or json on stdout")
    parser.add_argument("--html", metavar="FILE", help="also write the comparison as a self-contained HTML page")
    parser.add_argument("--noise-floor", type=float, metavar="PCT",
                        help="smallest difference called real, in %% as a factor: 40 means B/A beyond 1.4 or "
                             "below 1/1.4 (default: measured by repeats or by "
                             "earlier identical runs in the run index, else 40 (a factor of 1.4): the run-to-run noise "
                             "measured on identical zoo runs)")
    parser.add_argument("--device", choices=("all", "cpu", "gpu"), default="all",
                        help="traces: compare CPU operators, GPU kernels or both (default)")
    parser.add_argument("--rank", type=int, help="traces: the rank's file of each side (default: the first)")
    parser.add_argument("--iterations", metavar="A[:B]",
                        help="traces: ProfilerStep numbers to compare, e.g. 5 or 5,6:7,8 (default: the first of each)")
    parser.add_argument("--index", metavar="FILE", help="the run index (default $STEPSCOPE_INDEX or "
                                                         "~/.local/share/stepscope/runs.sqlite)")
    parser.set_defaults(handler=handle)


def _iterations(spec: str | None) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    if not spec:
        return None, None
    try:
        sides = [tuple(int(item) for item in part.split(",") if item.strip()) for part in spec.split(":")]
    except ValueError:
        raise UsageError(f"--iterations takes step numbers like 5 or 5,6:7,8, got {spec!r}") from None
    if len(sides) > 2 or not all(sides):
        raise UsageError(f"--iterations takes step numbers like 5 or 5,6:7,8, got {spec!r}")
    return sides[0], sides[-1]


def _index(args: argparse.Namespace) -> Path | None:
    from stepscope.record import run_index

    return Path(args.index) if args.index else run_index.index_path()


def _sides(args: argparse.Namespace) -> tuple[list[Path], list[Path]]:
    """A's paths and B's: ``A B``, ``A1 A2 … --vs B1 B2 …``, or ``--baseline SPEC B…``."""
    paths = [Path(item) for item in args.paths]
    if args.vs:
        side_b = [Path(item) for item in args.vs]
        if args.baseline:
            if paths:
                raise UsageError("give either A's runs or --baseline, not both")
            return _baseline(args, side_b), side_b
        if not paths:
            raise UsageError("--vs needs A's runs before it: stepscope diff A1 A2 --vs B1 B2")
        return paths, side_b
    if args.baseline:
        if len(paths) != 1:
            raise UsageError("with --baseline, give one run B (stepscope diff --baseline last B)")
        return _baseline(args, paths), paths
    if len(paths) != 2:
        raise UsageError("give two paths (stepscope diff A B), A's and B's runs (A1 A2 --vs B1 B2), "
                         "or --baseline last|TAG B")
    return paths[:1], paths[1:]


def _baseline(args: argparse.Namespace, side_b: list[Path]) -> list[Path]:
    """From the run index: ``last`` is the latest run; a tag is its latest run and the earlier runs
    of that tag with the same setup (repeats: up to 10)."""
    from stepscope.record import run_index

    path = _index(args)
    if path is None:
        raise UsageError("the run index is switched off (STEPSCOPE_INDEX=off); pass A explicitly")
    latest = run_index.find_baseline(path, args.baseline, exclude=[str(item) for item in side_b])
    if args.baseline == "last":
        return [Path(latest.run_dir)]
    excluded = {str(item.resolve()) for item in side_b}
    same = [run for run in run_index.list_runs(path, tag=args.baseline)
            if run.get("setup_key") == latest.get("setup_key") and run.exists and run.run_dir not in excluded]
    return [Path(run.run_dir) for run in same[-10:]] or [Path(latest.run_dir)]


def handle(args: argparse.Namespace) -> int:
    from stepscope.analysis.run.diff import RunDiff
    from stepscope.compare import diff_paths

    floor = None
    if args.noise_floor is not None:
        if not (math.isfinite(args.noise_floor) and 0 <= args.noise_floor <= 1000):
            raise UsageError(f"--noise-floor is a percentage in [0, 1000] (40 means a factor of 1.4), "
                             f"got {args.noise_floor:g}")
        floor = args.noise_floor / 100
    if args.fail_if_slower is not None and not (math.isfinite(args.fail_if_slower) and args.fail_if_slower >= 0):
        raise UsageError(f"--fail-if-slower is a percentage >= 0, got {args.fail_if_slower:g}")
    side_a, side_b = _sides(args)
    iterations_a, iterations_b = _iterations(args.iterations)
    diff = diff_paths(side_a, side_b, floor=floor, device=args.device, rank=args.rank, index=_index(args),
                      iterations_a=iterations_a, iterations_b=iterations_b)
    gate = None
    if args.fail_if_slower is not None:
        if not isinstance(diff, RunDiff):
            raise UsageError("--fail-if-slower needs two runs: one trace per side has no noise bound; "
                             "record runs with 'stepscope run' and compare their directories")
        gate = regression_gate(diff, args.metric, args.fail_if_slower / 100)
    if args.html:
        _write_html(diff, side_a[0], side_b[0], Path(args.html))
    if args.format == "json":
        import orjson

        data = diff.to_dict()
        if gate is not None:
            data["gate"] = gate
        sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode() + "\n")
    else:
        from rich.console import Console

        from stepscope.report.diff_view import render_run_diff, render_trace_diff

        console = Console()
        console.print(render_run_diff(diff, args.metric) if isinstance(diff, RunDiff) else render_trace_diff(diff))
        if gate is not None:
            style = {"failed": "bold red", "passed": "bold green"}.get(gate["status"], "bold yellow")
            console.print(printable(gate["message"]), style=style, markup=False, highlight=False)
    if gate is not None and gate["failed"]:
        return EXIT_REGRESSION
    return 0


def regression_gate(diff: Any, metric: str, threshold: float) -> dict[str, Any]:
    """Whether B regressed on ``metric``: worse by more than ``threshold`` *and* beyond noise."""
    from stepscope.analysis.compare_stats import FASTER, SLOWER

    row = diff.row(metric)
    if row is None:
        raise UsageError(f"--metric {metric}: not measured in both runs (have: "
                         f"{', '.join(r.metric for r in diff.rows)})")
    worse = row.diff.worse_by
    beyond = row.diff.verdict == SLOWER
    failed = bool(worse is not None and worse > threshold and beyond)
    inconclusive = worse is None or row.diff.verdict == "no noise bound"
    if inconclusive:
        message = (f"gate: inconclusive — {row.label} has no noise bound ({'; '.join(diff.notes) or row.diff.verdict}); "
                   "passed, but nothing was checked")
    elif failed:
        message = (f"gate: FAILED — {row.label} is worse by {worse:.1%} (interval {row.diff.low:+.1%} … "
                   f"{row.diff.high:+.1%}), beyond noise and above the {threshold:.1%} allowed")
    else:
        why = ("faster" if row.diff.verdict == FASTER else "within noise") if not beyond \
            else f"within the {threshold:.1%} allowed"
        message = f"gate: passed — {row.label} {row.diff.change:+.1%} ({why})" if row.diff.change is not None \
            else f"gate: passed ({why})"
    status = "failed" if failed else "inconclusive" if inconclusive else "passed"
    return {"metric": metric, "threshold": threshold, "worse_by": worse, "verdict": row.diff.verdict,
            "failed": failed, "status": status, "message": message}


def _write_html(diff: Any, a: Path, b: Path, target: Path) -> None:
    from stepscope.analysis.run.diff import RunDiff
    from stepscope.report.diff_view import write_diff_html

    records: dict[str, Any] = {}
    if isinstance(diff, RunDiff):
        from stepscope.record.store import load_record

        records = {"record_a": load_record(a, with_samples=False), "record_b": load_record(b, with_samples=False)}
    try:
        write_diff_html(diff, target, **records)
    except OSError as exc:
        raise UsageError(f"{target}: cannot write the HTML page ({exc.strerror or exc}); choose a writable path") from None
    say(f"stepscope: wrote {target}")
