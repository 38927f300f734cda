"""`stepscope run [options] script.py args…` / `stepscope run [options] -m module args…`."""

from __future__ import annotations

import argparse
import atexit
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError

DEFAULT_STACKS_HZ = 100.0  # = stepscope.capture.stacks.DEFAULT_RATE_HZ (not imported: keeps the CLI light)

#: Options that take a value (needed to find where the script's own arguments begin).
_VALUE_OPTIONS = {"-o", "--out", "--sample-hz", "--profiler", "--fail-on", "--tensorboard", "--stacks-hz",
                  "--set", "--max-steps", "--verify-budget", "--tag"}
#: Exit status when --fail-on trips and the script itself succeeded.
EXIT_FINDINGS = 3


def split_argv(argv: list[str], value_options: frozenset[str] | set[str] = _VALUE_OPTIONS) -> tuple[list[str], list[str]]:
    """Split ``[stepscope options] target [script args]``: everything after the target is the script's.

    ``value_options`` are the options that take a value (their value is not the target)."""
    index = 0
    while index < len(argv):
        token = argv[index]
        if token == "--":
            return argv[:index] + argv[index + 1:index + 2], argv[index + 2:]
        if token == "-m":
            return argv[:index + 2], argv[index + 2:]
        if token.startswith("-m") and len(token) > 2 and not token.startswith("--"):
            return argv[:index + 1], argv[index + 1:]
        if not token.startswith("-") or token == "-":
            return argv[:index + 1], argv[index + 1:]
        if token in value_options:
            index += 1
        index += 1
    return argv, []


def add_capture_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by `run` and `demo`."""
    parser.add_argument("-o", "--out", metavar="DIR", help="run directory (default ./stepscope-runs/<time>-<name>)")
    parser.add_argument("--no-monitor", action="store_true", help="do not start the system sampler")
    parser.add_argument("--sample-hz", type=float, default=10.0, metavar="HZ",
                        help="system sampling rate (default 10)")
    parser.add_argument("--profiler", metavar="NAME",
                        help="also profile the captured phases with a stepscope profiler "
                             "(simple, advanced, pytorch, passthrough)")
    parser.add_argument("--fail-on", metavar="SEVERITY",
                        help=f"exit {EXIT_FINDINGS} when a finding at or above SEVERITY "
                             "(info, low, medium, high, critical) is present and the script succeeded")
    parser.add_argument("--trace", action="store_true",
                        help="record one short torch.profiler window (3 steps after warm-up) into "
                             "RUN_DIR/traces and use it in the diagnosis")
    parser.add_argument("--no-summary", action="store_true", help="do not print the summary")
    parser.add_argument("--force", action="store_true",
                        help="replace the files of another run in the run directory (otherwise refused)")
    parser.add_argument("--html", action="store_true", help="also write RUN_DIR/report.html (self-contained)")
    parser.add_argument("--tensorboard", metavar="DIR", help="also write TensorBoard scalars into DIR")
    parser.add_argument("--stacks-hz", type=float, default=DEFAULT_STACKS_HZ, metavar="HZ",  # code attribution
                        help=f"Python stack sampling rate, also of DataLoader workers, plus GC pause timing "
                             f"(default {DEFAULT_STACKS_HZ:g}; 0 disables)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="change a setting of the unmodified script (repeatable): dataloader.num_workers, "
                             "dataloader.pin_memory, dataloader.persistent_workers, dataloader.prefetch_factor, "
                             "dataloader.batch_size, torch.num_threads")
    parser.add_argument("--max-steps", type=int, metavar="N",
                        help="stop the script cleanly after N steps (exit 0; the record says so)")
    parser.add_argument("--tag", dest="tags", action="append", default=[], metavar="NAME",
                        help="tag the run in the run index (repeatable; `stepscope runs --tag NAME`, "
                             "`stepscope diff --baseline NAME`)")
    parser.add_argument("--verify", action="store_true",
                        help="after the run, trial every prescription --set can apply (short, interleaved, "
                             "repeated runs of the script: its code runs again) and show the measured gains")
    parser.add_argument("--verify-budget", type=float, metavar="S",
                        help="seconds the --verify trials may take (default: about 14 trials' worth, 60-900 s)")


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run", help="run an unmodified script under capture and diagnose it",
        description="Run a training/inference script exactly as python would, capture every step, "
                    "and print where the time went. Everything after the script goes to the script.",
        usage="stepscope run [options] (script.py | -m module) [args ...]")
    add_capture_options(parser)
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script")
    parser.add_argument("script", nargs="?", help="the script to run")
    parser.set_defaults(handler=handle)


@dataclass(frozen=True)
class CaptureOptions:
    out: str | None
    sample_interval_s: float | None
    profiler: str | None
    fail_on: Any
    summary: bool
    trace: bool = False
    force: bool = False
    html: bool = False
    tensorboard: str | None = None
    stacks_hz: float = DEFAULT_STACKS_HZ
    overrides: dict[str, Any] | None = None  # `--set`, parsed (stepscope.capture.overrides)
    max_steps: int | None = None
    verify: bool = False
    verify_budget_s: float | None = None
    tags: tuple[str, ...] = ()


def capture_options(args: argparse.Namespace) -> CaptureOptions:
    from stepscope.diagnosis.findings import Severity

    if args.trace and args.profiler and args.profiler.lower() == "pytorch":
        raise UsageError("--trace and --profiler pytorch both drive torch.profiler; choose one")
    if not (math.isfinite(args.sample_hz) and args.sample_hz > 0):
        raise UsageError(f"--sample-hz must be a finite number > 0, got {args.sample_hz:g}")
    if args.tensorboard:
        from stepscope.cli.exports import check_tensorboard

        check_tensorboard(args.tensorboard)
    if not args.stacks_hz >= 0:
        raise UsageError(f"--stacks-hz must be >= 0 (0 disables), got {args.stacks_hz}")
    from stepscope.capture.overrides import parse_max_steps, parse_settings

    overrides = parse_settings(getattr(args, "overrides", None) or ())
    max_steps = parse_max_steps(getattr(args, "max_steps", None))
    budget = getattr(args, "verify_budget", None)
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise UsageError(f"--verify-budget must be a positive number of seconds, got {budget:g}")
    return CaptureOptions(
        out=args.out,
        sample_interval_s=None if args.no_monitor else 1.0 / args.sample_hz,
        profiler=args.profiler,
        fail_on=Severity.parse(args.fail_on) if args.fail_on else None,
        summary=not args.no_summary,
        trace=args.trace,
        force=args.force,
        html=args.html,
        tensorboard=args.tensorboard,
        stacks_hz=args.stacks_hz,
        overrides=overrides or None,
        max_steps=max_steps,
        verify=bool(getattr(args, "verify", False)) or budget is not None,
        verify_budget_s=budget,
        tags=tuple(_check_tag(tag) for tag in getattr(args, "tags", None) or ()),
    )


def _check_tag(tag: str) -> str:
    tag = tag.strip()
    if not tag or "," in tag or len(tag) > 100:
        raise UsageError(f"--tag must be a name of 1-100 characters without commas, got {tag!r}")
    return tag


def handle(args: argparse.Namespace) -> int:
    from stepscope.capture.launcher import resolve_module, resolve_script

    if args.module and args.script:
        args.rest = [args.script, *args.rest]
    if not args.module and not args.script:
        raise UsageError("nothing to run: give a script (stepscope run train.py ...) or -m MODULE")
    from stepscope.capture.launcher import refuse_launcher

    refuse_launcher(args.module or args.script, list(args.rest), is_module=bool(args.module))
    options = capture_options(args)
    target = resolve_module(args.module, args.rest) if args.module else resolve_script(args.script, args.rest)
    return run_target(target, options)


def run_target(target: Any, options: CaptureOptions, run_name: str | None = None) -> int:
    """Run ``target`` under capture; exits the process the way the script would have.

    Finalisation is ordered and short: the record is saved first (signals arriving meanwhile are
    held), then the sampler is stopped, then ``report.json`` and the summary follow. A signal
    that arrives during finalisation ends the process by that signal as soon as the record is
    saved, skipping what is left.
    """
    from stepscope.capture import launcher
    from stepscope.capture.rundir import default_run_dir
    from stepscope.capture.session import CaptureSession

    derived = not options.out
    shown_dir = Path(options.out) if options.out else default_run_dir(run_name or target.name)
    run_dir = shown_dir.absolute()  # resolved once: the script may chdir
    profiler = _make_profiler(options.profiler, run_dir) if options.profiler else None
    session = CaptureSession(run_dir, target=target.name, mode="module" if target.is_module else "script",
                             argv=(target.name, *target.args), sample_interval_s=options.sample_interval_s,
                             profiler=profiler, trace=options.trace, force=options.force, derived=derived,
                             stacks_hz=options.stacks_hz, overrides=options.overrides,
                             max_steps=options.max_steps)
    guard = launcher.SignalGuard()
    session.should_hurry = lambda: bool(guard.pending)
    session.on_os_exit = lambda code: finalize(code, None, None)
    report_box: list[Any] = []

    def finalize(exit_code: int | None, exception: str | None, interrupted_by: str | None) -> None:
        guard.hold()
        launcher.flush_std_streams()
        record = session.stop(exit_code=exit_code, exception=exception, interrupted_by=interrupted_by)
        merge = None  # whether this rank merges the job (a run of one process: its own report)
        if record is not None and not report_box and record.meta.world_size > 1:
            from stepscope.capture.job_end import decide_merge, failed

            merge = decide_merge(session.run_dir, record.meta.rank, record.meta.world_size, failed(record.meta))
            if merge:  # a rank failed: the launcher's teardown signal waits for the job's report
                guard.wait_for_report(0 if interrupted_by else 1)
        guard.die_if_pending()
        if record is None or report_box:
            return
        if record.meta.world_size > 1:
            _exchange_records(session.run_dir, record.meta.rank, record.meta.world_size, bool(merge))
            guard.die_if_pending()
        from stepscope.pipeline.publish import publish_run

        verifying = options.verify and exit_code == 0 and exception is None and interrupted_by is None
        whole = record.meta.rank == 0 if merge is None else merge  # this rank's report is the run's
        report_box.append(publish_run(record, session.run_dir, shown_as=str(shown_dir), tags=options.tags,
                                      merge=merge, hurry=lambda: bool(guard.pending),
                                      print_summary=options.summary and whole and not verifying))
        if verifying and whole:
            from stepscope.cli.verify_run import verify_after_run

            report_box[0] = verify_after_run(report_box[0], record, target, session.run_dir, options,
                                             shown_as=str(shown_dir), should_stop=lambda: bool(guard.pending))
        if (options.html or options.tensorboard) and whole:
            from stepscope.cli.exports import export_after_run

            export_after_run(report_box[0], session.run_dir, html=options.html, tensorboard=options.tensorboard)
        from stepscope.capture.job_end import drop_lock, lock_still_needed

        if not lock_still_needed(record, session.run_dir, bool(whole), report_box[0].job):
            drop_lock(session.run_dir, record.meta.rank)
        guard.report_written()

    def on_signal(signum: int) -> None:
        import signal

        finalize(128 + signum, None, signal.Signals(signum).name)

    from stepscope.cli.entry import script_starts

    script_starts()  # SIGINT: Python's handler again, which capture's guard takes over
    guard.install(on_signal)
    atexit.register(lambda: session.stop())  # a last resort: a no-op once the record is saved
    session.start()
    outcome = launcher.execute(target)
    guard.hold()
    launcher.report_outcome(outcome)
    exception_name = type(outcome.exception).__name__ if outcome.exception is not None else None
    finalize(outcome.exit_code, exception_name, outcome.signal_name)
    if options.fail_on is not None and outcome.exit_code == 0 and outcome.exception is None and report_box:
        if fail_on_findings(report_box[0].findings, options.fail_on):
            return EXIT_FINDINGS
    launcher.finish_process(outcome)
    return outcome.exit_code


def _exchange_records(run_dir: Path, rank: int, world_size: int, merges: bool) -> None:
    """Nodes without a shared filesystem: ranks send their files to rank 0 through the job's store
    (:mod:`stepscope.capture.job_store`), rank 0 collects them before merging (when it merges)."""
    from stepscope.capture import job_store
    from stepscope.capture.warn import emit
    from stepscope.pipeline.inputs import job_wait_s

    if rank == 0:
        _, warnings = job_store.collect_files(run_dir, world_size, job_wait_s()) if merges else ((), [])
    else:
        warnings = job_store.send_files(run_dir, rank)
    for text in warnings:
        emit(text)


def fail_on_findings(findings: Any, fail_on: Any) -> int:
    """``--fail-on`` of ``run`` and ``report``: :data:`EXIT_FINDINGS` (said on stderr) when a
    finding reaches ``fail_on``, else 0."""
    if fail_on is None or not any(finding.severity >= fail_on for finding in findings):
        return 0
    try:
        print(f"stepscope: findings at or above '{fail_on.name.lower()}' (--fail-on): exit {EXIT_FINDINGS}",
              file=sys.stderr)
    except (OSError, ValueError, AttributeError):
        pass
    return EXIT_FINDINGS


def _make_profiler(name: str, run_dir: Path) -> Any:
    from stepscope.profilers import create_profiler

    return create_profiler(name, dirpath=run_dir / "profiler")
