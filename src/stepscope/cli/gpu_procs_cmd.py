"""`stepscope gpu-procs`: who holds GPU memory, which of them look stale, and ending your own.

The safe version of ``ps -ef | grep train | awk '{print $2}' | xargs kill -9``: processes are
found through NVML, never by name; ``--kill`` ends only the *current user's* stale ones, by pid,
after showing them and asking (or ``--yes``), with SIGTERM first and SIGKILL only for those still
there after a grace period. A pid is re-checked (same start time) right before it is signalled.
How a process is judged stale, and why NVML's word alone never justifies a signal:
:mod:`stepscope.capture.gpu_procs`. The list, the plan and the outcome are views of
:mod:`stepscope.pipeline.commands`, rendered through :mod:`stepscope.report.render`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from stepscope.capture import gpu as gpu_layer
from stepscope.capture import gpu_procs
from stepscope.capture.gpu_procs import TERMINATE_GRACE_S
from stepscope.errors import UsageError


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "gpu-procs", help="processes holding GPU memory, which look stale, and ending your own stale ones",
        description="List processes holding GPU memory: pid, parent, user, command, GPU memory, age, "
                    "and whether they look stale. --kill ends your own stale ones, by pid, after asking.")
    parser.add_argument("--kill", action="store_true", help="end the current user's stale processes (asks first)")
    parser.add_argument("--yes", action="store_true", help="with --kill: do not ask")
    parser.add_argument("--json", action="store_true", help="print the list as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from stepscope.pipeline import commands
    from stepscope.report.render import Output, render

    if args.yes and not args.kill:
        raise UsageError("--yes confirms --kill; it does nothing alone")
    output = "json" if args.json else "text"
    probe, note = gpu_layer.open_gpus(all_gpus=True, slow_every=1)
    if probe is None:  # JSON on stdout whatever happens; the reason for scripts' logs on stderr
        for notice in render(commands.no_gpu_view(note or ""), output, Output(stream=sys.stdout)):
            print(notice, file=sys.stderr)
        return 0
    try:
        found = probe.all_processes()
        notes = list(probe.notes)
    finally:
        probe.close()
    processes = gpu_procs.inspect_processes(found)
    render(commands.gpu_procs_view(processes, len(probe.devices), notes), output, Output(stream=sys.stdout))
    if not args.kill:
        return 0
    terminal = sys.stdin is not None and sys.stdin.isatty()
    plan, mine = commands.kill_plan(processes, uid=os.getuid(), own_pid=os.getpid(), ask=not args.yes and terminal,
                                    grace_s=TERMINATE_GRACE_S)
    render(plan, "text", Output(stream=sys.stdout))
    if not mine:
        return 0
    if not args.yes and not terminal:
        raise UsageError("--kill asks before ending processes, and there is no terminal to ask in; "
                         "pass --yes to confirm")
    confirmed = args.yes or _confirm()
    outcomes = gpu_procs.end_processes(mine) if confirmed else None
    render(commands.kill_outcome(outcomes), "text", Output(stream=sys.stdout))
    return 0


def _confirm() -> bool:
    """The answer to the question the plan asked (y or yes)."""
    try:
        return input("").strip().lower() in ("y", "yes")
    except EOFError:
        return False
