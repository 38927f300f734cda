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
from stepscope.text import say

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
                             "earlier identical quiet runs in the run index, else 40 (a factor of 1.4): the run-to-run "
                             "noise measured on identical zoo runs; 400 (a factor of 5) when other processes used more "
                             "than 10%% of the cores during either run: the noise measured under load)")
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
    from stepscope.pipeline.compare import compare_paths
    from stepscope.report.render import Output, render

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
    view = compare_paths(side_a, side_b, floor=floor, index=_index(args), metric=args.metric,
                         gate_threshold=None if args.fail_if_slower is None else args.fail_if_slower / 100,
                         histogram=bool(args.html), device=args.device, rank=args.rank,
                         iterations_a=iterations_a, iterations_b=iterations_b)
    if args.html:
        target = Path(args.html)
        try:
            render(view, "html", Output(path=target))
        except OSError as exc:
            raise UsageError(f"{target}: cannot write the HTML page ({exc.strerror or exc}); choose a writable path") from None
        say(f"stepscope: wrote {target}")
    render(view, "json" if args.format == "json" else "text", Output(stream=sys.stdout))
    return EXIT_REGRESSION if view.gate is not None and view.gate.failed else 0
