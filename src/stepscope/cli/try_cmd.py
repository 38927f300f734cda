"""`stepscope try [options] (script.py | -m module) args…`: measure each prescription.

Diagnoses a short run of the script (or takes the diagnosis of a saved run, ``--from RUN_DIR``),
then runs short trials of the baseline and of every prescription that `stepscope run --set` can
apply, interleaved and repeated, and prints the measured change of each with its noise bounds
(:mod:`stepscope.whatif`). Prescriptions that need code changes are listed, not tried.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
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
    from stepscope import whatif
    from stepscope.children import signal_name, stop_on_signals, stopped_by

    started = time.monotonic()
    notes: list[str] = []
    diagnosis_dir = ""
    runs = 0
    with stop_on_signals():  # Ctrl-C, SIGTERM, SIGHUP: the child under way is stopped with its group
        if findings_source is None:
            runs = 1
            diagnosis = out_dir / "diagnosis"
            diagnosis_dir = str(diagnosis)
            _progress(f"diagnosis run ({steps} steps) …")
            log = out_dir / "logs" / "diagnosis.log"
            code, error = whatif.run_trial(target_argv, {}, diagnosis, max_steps=steps, log=log, monitor=True,
                                           timeout_s=timeout_s)
            reference_s = time.monotonic() - started
            findings_source = diagnosis / "report.json"
            if error is not None or not findings_source.is_file():
                raise UsageError(f"the diagnosis run failed ({error or 'no report.json'}); "
                                 f"the script's output is in {log}")
        else:
            diagnosis_dir = str(findings_source.parent)
            reference_s = None
        from stepscope import verify

        document = _report(findings_source)
        if reference_s is None:
            wall = (document.get("run") or {}).get("wall_s")
            reference_s = float(wall) if isinstance(wall, (int, float)) and wall > 0 else None
        findings = verify.findings_of(document)
        # --only KEY: the candidates (prescriptions, then the variants beside them) that change only those keys
        candidates = [item for item in verify.candidates(findings, verify.setup_of_document(document))
                      if not only or set(item.settings) <= set(only)]
        candidates = candidates[:max_candidates] if max_candidates is not None else candidates
        code_changes = verify.code_changes(findings)
        trials: list[whatif.TrialResult] = []
        stopped: int | None = None
        if not candidates:
            notes.append("no prescription can be applied with `stepscope run --set`: nothing to try")
        else:
            # every trial has a deadline: --timeout-s, else one derived from the run diagnosed
            deadline = timeout_s if timeout_s is not None else (
                verify.trial_deadline(reference_s) if reference_s is not None else None)
            try:
                whatif.run_trials(target_argv, candidates, out_dir, steps=steps, repeats=repeats,
                                  progress=_progress, timeout_s=deadline, results=trials)
            except KeyboardInterrupt as exc:
                stopped = stopped_by(exc)
                how = "Ctrl-C" if stopped == signal.SIGINT else signal_name(stopped)
                notes.append(f"trials stopped by {how} after {len(trials)}: what was measured is kept")
    comparisons = whatif.compare(trials, candidates) if candidates else ()
    short = [trial for trial in trials if trial.step_time_s is not None and trial.steps < 10]
    if short:
        notes.append(f"{len(short)} trial(s) measured fewer than 10 steps after warm-up and the prefetched "
                     "batches: raise --steps (and the script's own length, if it sets one)")
    failed = whatif.failure_summary(trials, out_dir / "logs")
    best = whatif.best_change(comparisons)
    notes.append(f"{runs + len(trials)} runs in {time.monotonic() - started:.0f} s; run directories under {out_dir}")
    result = whatif.WhatIf(target=name, steps=steps, repeats=repeats, comparisons=tuple(comparisons),
                           code_changes=tuple(code_changes), diagnosis_dir=diagnosis_dir,
                           best=best.name if best is not None else None, notes=tuple(notes), failed=failed,
                           failures=tuple({"setting": trial.candidate, "round": trial.repeat + 1,
                                           "error": trial.error, "log": trial.log}
                                          for trial in trials if trial.step_time_s is None))
    (out_dir / "whatif.json").write_text(json.dumps(result.to_dict(), indent=1), encoding="utf-8")
    if fmt == "json":
        print(json.dumps(result.to_dict(), indent=1))
    else:
        render(result)
    if stopped is not None:  # what was measured is written and shown: now end as the signal asked
        from stepscope.capture.launcher import die_by

        if stopped == signal.SIGINT:
            return 128 + signal.SIGINT
        die_by(stopped)
    # every trial failed: nothing was measured, and the exit status says so (1, as a failed command)
    return 1 if trials and all(trial.step_time_s is None for trial in trials) else 0


def _report(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(document, dict) or not isinstance(document["findings"], list):
            raise TypeError("findings is not a list")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(path, f"not a stepscope report.json ({exc})") from None
    return document


_progress = progress


def _range(low: float | None, high: float | None, fmt: str) -> str:
    if low is None or high is None:
        return "-"
    return f"{fmt.format(low)}–{fmt.format(high)}"


def render(result: Any) -> None:
    """The table, the best change and the prescriptions that are not tried (stdout)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from stepscope.report.render.output import Output
    from stepscope.report.render.terminal import console_for, print_wide
    from stepscope.text import printable

    console: Console = console_for(Output(stream=sys.stdout))  # a pipe or a file gets whole cells
    rows = result.comparisons
    unit = rows[0].unit if rows else "samples/s"
    table = Table(title=Text(f"stepscope try · {printable(result.target)} · {result.steps} steps per trial"),
                  title_justify="left", box=box.SIMPLE_HEAD,
                  caption=f"median (min–max) of {result.repeats} trial(s) each, interleaved; speed-up bounds: "
                          "slowest trial against the fastest baseline trial and the reverse",
                  caption_justify="left")
    table.add_column("setting", no_wrap=True)
    for column in ("step time", unit, "speed-up", "expected", "verdict"):
        table.add_column(column, justify="left" if column == "verdict" else "right")
    for row in rows:
        time_text = "-" if row.step_time_s is None else (
            f"{row.step_time_s * 1e3:.1f} ms\n({row.step_time_min_s * 1e3:.1f}–{row.step_time_max_s * 1e3:.1f})")
        rate = "-" if row.throughput is None else (
            f"{row.throughput:,.0f}\n({_range(row.throughput_min, row.throughput_max, '{:,.0f}')})")
        speed = "-" if row.speedup is None or row.name == "baseline" else (
            f"×{row.speedup:.2f}\n({_range(row.speedup_low, row.speedup_high, '{:.2f}')})")
        expected = (f"×{1 / (1 - row.expected_gain):.2f}" if row.expected_gain is not None
                    and -1 < row.expected_gain < 1 else "-")
        verdict = row.verdict + (f" ({row.failed} failed)" if row.failed and row.verdict != "failed" else "")
        table.add_row(Text(printable(row.name)), time_text, rate, speed, expected, verdict)
    if rows:
        print_wide(console, table)
    best = next((row for row in rows if row.name == result.best), None)
    if best is not None:
        console.print(f"best: {printable(best.name)} — ×{best.speedup:.2f} {unit} "
                      f"(bounds ×{best.speedup_low:.2f}–×{best.speedup_high:.2f}); "
                      f"stepscope run {' '.join('--set ' + key + '=' + _value(v) for key, v in best.settings.items())} …",
                      markup=False, soft_wrap=True)
    elif rows and not _compared(rows):  # nothing measured on one side: no comparison was made
        if not any(row.runs > row.failed for row in rows):
            why = result.failed or "no trial was measured"
        else:
            why = "no baseline trial was measured" if rows[0].runs <= rows[0].failed else \
                "no candidate trial was measured"
            why += f"; {result.failed}" if result.failed else ""
        console.print(printable(f"best: none — {why}"), markup=False, soft_wrap=True)
    elif rows:
        console.print("best: none — no change beat the baseline beyond noise", markup=False, soft_wrap=True)
    if result.failed and rows and _compared(rows):
        console.print(printable(f"failed: {result.failed}"), markup=False, soft_wrap=True)
    for change in result.code_changes:
        console.print(printable(f"not tried (no --set for it): {change.action} [{change.source}]"), markup=False,
                      soft_wrap=True)
    for note in result.notes:
        console.print(f"note: {printable(note)}", style="bright_black", markup=False, soft_wrap=True)


def _compared(rows: Any) -> bool:
    """A measured baseline and at least one measured candidate: failed trials are no measurement."""
    return rows[0].runs > rows[0].failed and any(row.runs > row.failed for row in rows[1:])


def _value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
