"""`stepscope try [options] (script.py | -m module) args…`: measure each prescription.

Diagnoses a short run of the script (or takes the diagnosis of a saved run, ``--from RUN_DIR``),
then runs short trials of the baseline and of every prescription that `stepscope run --set` can
apply, interleaved and repeated, and prints the measured change of each with its noise bounds
(:mod:`stepscope.whatif`). Prescriptions that need code changes are listed, not tried.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from stepscope.errors import InputError, UsageError
from stepscope.text import progress

#: Options of `try` that take a value (to find where the script's own arguments begin).
_VALUE_OPTIONS = {"-o", "--out", "--steps", "--repeats", "--format", "--from", "--timeout-s", "--only",
                  "--max-candidates"}
DEFAULT_STEPS = 30
DEFAULT_REPEATS = 3


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """``[try options] target [script args]``: everything after the target is the script's."""
    from stepscope.cli.run_cmd import split_argv as split

    return split(argv, _VALUE_OPTIONS)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "try", help="measure each prescription of the diagnosis with short what-if trials",
        description="Diagnose a short run, then run short trials of the baseline and of each prescription "
                    "that `stepscope run --set` can apply (repeated, interleaved) and print the measured "
                    "change of each with its noise bounds.",
        usage="stepscope try [options] (script.py | -m module) [args ...]")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N",
                        help=f"steps per trial (run --max-steps; default {DEFAULT_STEPS})")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, metavar="R",
                        help=f"trials of the baseline and of each candidate (default {DEFAULT_REPEATS})")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    parser.add_argument("-o", "--out", metavar="DIR",
                        help="where the trials' run directories go (default ./stepscope-runs/<time>-try-<name>)")
    parser.add_argument("--from", dest="from_run", metavar="RUN_DIR",
                        help="take the prescriptions from a saved run instead of a diagnosis run")
    parser.add_argument("--only", action="append", default=[], metavar="KEY",
                        help="try only the prescriptions of this `run --set` key (repeatable), "
                             "e.g. dataloader.num_workers")
    parser.add_argument("--max-candidates", type=int, default=None, metavar="N",
                        help="try at most the first N candidates (most promising first)")
    parser.add_argument("--timeout-s", type=float, default=None, metavar="S",
                        help="stop a trial (with its process group) after S seconds (default: 3x the diagnosis run's time + 10 s)")
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script")
    parser.add_argument("script", nargs="?", help="the script to run")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from stepscope.capture.launcher import resolve_module, resolve_script

    if args.module and args.script:
        args.rest = [args.script, *args.rest]
    if not args.module and not args.script:
        raise UsageError("nothing to try: give a script (stepscope try train.py ...) or -m MODULE")
    if args.steps < 2:
        raise UsageError(f"--steps must be at least 2, got {args.steps}")
    if args.repeats < 1:
        raise UsageError(f"--repeats must be at least 1, got {args.repeats}")
    if args.max_candidates is not None and args.max_candidates < 1:
        raise UsageError(f"--max-candidates must be at least 1, got {args.max_candidates}")
    if args.timeout_s is not None and not args.timeout_s > 0:
        raise UsageError(f"--timeout-s must be positive, got {args.timeout_s}")
    from stepscope.capture.overrides import KEYS, accepted_keys

    unknown = [key for key in args.only if key not in KEYS]
    if unknown:
        raise UsageError(f"--only: unknown key {unknown[0]!r}; accepted keys: {accepted_keys()}")
    target = resolve_module(args.module, args.rest) if args.module else resolve_script(args.script, args.rest)
    target_argv = ["-m", target.name, *target.args] if target.is_module else ["--", target.name, *target.args]
    findings_source = Path(args.from_run) / "report.json" if args.from_run else None
    if findings_source is not None and not findings_source.is_file():
        raise InputError(args.from_run, "no report.json here; pass a directory written by 'stepscope run'")
    out_dir = _out_dir(args.out, target.name)
    return run(target.name, target_argv, out_dir, steps=args.steps, repeats=args.repeats, fmt=args.format,
               findings_source=findings_source, timeout_s=args.timeout_s, only=tuple(args.only),
               max_candidates=args.max_candidates)


def _out_dir(out: str | None, name: str) -> Path:
    from stepscope.capture.rundir import default_run_dir

    stem = Path(name).stem if name.endswith(".py") else name
    path = Path(out) if out else default_run_dir(f"try-{stem}")
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UsageError(f"{path} exists and is not an empty directory; choose another -o DIR")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {path} ({exc.strerror or exc})") from None
    return path


def run(name: str, target_argv: list[str], out_dir: Path, *, steps: int, repeats: int, fmt: str,
        findings_source: Path | None, timeout_s: float | None, only: tuple[str, ...] = (),
        max_candidates: int | None = None) -> int:
    from stepscope.pipeline.commands import whatif_view
    from stepscope.pipeline.trials import try_prescriptions
    from stepscope.report.render import Output, render

    outcome = try_prescriptions(name, target_argv, out_dir, steps=steps, repeats=repeats,
                                findings_source=findings_source, timeout_s=timeout_s, only=only,
                                max_candidates=max_candidates, progress=progress)
    view = whatif_view(outcome.result)
    render(view, "json", Output(path=out_dir / "whatif.json"))
    render(view, fmt, Output(stream=sys.stdout))
    stopped = outcome.stopped
    if stopped is not None:  # what was measured is written and shown: now end as the signal asked
        from stepscope.capture.launcher import die_by

        if stopped == signal.SIGINT:
            return 128 + signal.SIGINT
        die_by(stopped)
    # every trial failed: nothing was measured, and the exit status says so (1, as a failed command)
    return 1 if outcome.trials_failed else 0
