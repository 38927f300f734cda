"""`stepscope demo [NAME]`: run a zoo scenario with a planted bottleneck under capture."""

from __future__ import annotations

import argparse
import os
from typing import Any

from stepscope.cli.run_cmd import add_capture_options, capture_options, run_target


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo", help="run a built-in workload with a planted bottleneck and diagnose it",
        description="Train a built-in workload (no downloads) under capture and print the verdict. "
                    "Without NAME, runs the input-bound scenario.")
    parser.add_argument("name", nargs="?", help="scenario to run (see --list)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--steps", type=int, metavar="N", help="override the scenario's step count")
    add_capture_options(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from stepscope.zoo import DEFAULT_SCENARIO, SCENARIOS, get_scenario

    if args.list:
        return _print_list(SCENARIOS, DEFAULT_SCENARIO)
    scenario = get_scenario(args.name or DEFAULT_SCENARIO)
    options = capture_options(args)
    from stepscope.capture.launcher import resolve_module
    from stepscope.errors import UsageError

    script_args = list(scenario.args)
    if args.steps is not None:
        if args.steps < 1:
            raise UsageError(f"--steps must be at least 1, got {args.steps}")
        script_args += ["--steps", str(args.steps)]
    if scenario.nproc > 1 and "LOCAL_RANK" not in os.environ:
        return _launch_torchrun(scenario, args)
    target = resolve_module(scenario.module, script_args)
    try:
        return run_target(target, options, run_name=f"demo-{scenario.name}")  # ends by sys.exit
    finally:
        _out_of_the_final_collections()


def _out_of_the_final_collections() -> None:
    """Leave the finished scenario's objects out of the interpreter's final collections.

    At exit Python's collector scans every object torch and its compiler left (~290k once an
    optimizer step imported ``torch._dynamo``): 0.9 s of a demo's wall (oversubscribed, median of
    5: 5.9 s -> 5.0 s), after its report is written. A scenario is stepscope's own code and keeps no
    finalizer in a reference cycle, so nothing is lost: exit handlers, the modules' teardown and every
    finalizer reached by reference counting still run (the milder kin of the whole teardown skipped
    for ``QUICK_EXIT_COMMANDS``, :mod:`stepscope.cli.main`, which would skip torch's exit handlers).
    ``run`` never does this: a user's script may hold such a finalizer (a buffered file in a cycle,
    flushed by its collection).
    """
    import gc

    gc.freeze()


def _launch_torchrun(scenario: Any, args: argparse.Namespace) -> int:
    """Run a multi-process scenario as ``torchrun --standalone --nproc_per_node N -m stepscope demo NAME``:
    every rank captures itself, rank 0 prints the job's merged summary."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
               str(scenario.nproc), "-m", "stepscope", "demo", scenario.name]
    if args.steps is not None:
        command += ["--steps", str(args.steps)]
    if getattr(args, "out", None):
        command += ["--out", str(args.out)]
    if getattr(args, "no_monitor", False):
        command.append("--no-monitor")
    for option in ("sample_hz", "stacks_hz"):
        value = getattr(args, option, None)
        if value is not None and f"--{option.replace('_', '-')}" in " ".join(sys.argv):
            command += [f"--{option.replace('_', '-')}", str(value)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    try:
        return subprocess.call(command, env=env)
    except KeyboardInterrupt:
        return 130


def _print_list(scenarios: dict[str, Any], default: str) -> int:
    import sys

    from stepscope.pipeline.commands import scenario_list
    from stepscope.report.render import Output, render

    render(scenario_list(scenarios, default), "text", Output(stream=sys.stdout))
    return 0
