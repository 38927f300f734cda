"""`stepscope monitor`: a live view of one machine (what bpytop and ``watch nvidia-smi`` show).

CPU per core, memory, disk and network rates, GPUs and the busiest processes, refreshed every
``--interval`` seconds; ``q`` or Ctrl-C quits and gives the terminal back as it was. ``--pid P``
shows that process tree (a training job and its DataLoader workers) instead of the whole machine.
``--once --json`` prints one frame (two samples ``--interval`` apart) for scripts.

The numbers come from the sampler's probes and the same arithmetic as a run's signals
(:mod:`stepscope.analysis.run.live`, sampled by :mod:`stepscope.pipeline.monitor`); the frame
becomes a view (:func:`stepscope.pipeline.commands.monitor_view`) that
:mod:`stepscope.report.render.monitor_text` draws.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import time
from contextlib import AbstractContextManager
from typing import Any

import psutil

from stepscope.capture.sampler import check_interval
from stepscope.errors import UsageError
from stepscope.pipeline.commands import monitor_view
from stepscope.pipeline.monitor import LiveMonitor
from stepscope.report.command_views import MonitorEnded
from stepscope.report.render import Output, render

DEFAULT_INTERVAL_S = 1.0


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "monitor", help="live view of CPU per core, memory, disk, network, GPUs and processes",
        description="Live view of this machine: CPU per core, memory, disk and network rates, GPUs "
                    "and the busiest processes. Press q or Ctrl-C to quit.")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, metavar="S",
                        help=f"seconds between refreshes (default {DEFAULT_INTERVAL_S:g})")
    parser.add_argument("--pid", type=int, metavar="P", help="show this process and its children only")
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument("--json", action="store_true", help="with --once: print the frame as JSON")
    parser.add_argument("--top", type=int, default=15, metavar="N", help="processes shown (default 15)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_interval(args.interval)
    if args.pid is not None and (args.pid <= 0 or not psutil.pid_exists(args.pid)):
        raise UsageError(f"--pid {args.pid}: no such process (it may have ended); see 'ps' for running pids")
    if args.json and not args.once:
        raise UsageError("--json prints one frame: use it with --once")
    if args.top < 1:
        raise UsageError(f"--top must be at least 1, got {args.top}")
    monitor = LiveMonitor(args.pid, args.interval, top=None if args.pid is not None else args.top)
    try:
        if args.once:
            return _once(monitor, args)
        return _live(monitor, args)
    finally:
        monitor.close()


def _once(monitor: LiveMonitor, args: argparse.Namespace) -> int:
    monitor.step()
    time.sleep(args.interval)
    frame = monitor.step()
    if frame is None:
        raise UsageError("could not read the machine's counters twice; see the notes with --once without --json")
    view = monitor_view(frame, pid=args.pid, hostname=monitor.meta["hostname"], interval_s=args.interval)
    render(view, "json" if args.json else "text", Output(stream=sys.stdout))
    return 0


def _live(monitor: LiveMonitor, args: argparse.Namespace) -> int:
    from stepscope.report.render.monitor_text import LiveScreen

    previous_handlers = _interrupt_on_termination()
    try:
        with _Keys() as keys, LiveScreen(Output(stream=sys.stdout)) as live:
            monitor.step()
            next_tick = time.monotonic() + args.interval
            while True:
                key = keys.wait(next_tick - time.monotonic())
                if key is not None and key.lower().startswith("q"):
                    break
                if time.monotonic() < next_tick:
                    continue
                next_tick = max(next_tick + args.interval, time.monotonic())
                frame = monitor.step()
                if frame is not None:
                    view = monitor_view(frame, pid=args.pid, hostname=monitor.meta["hostname"],
                                        interval_s=args.interval, live=True)
                    live.show(view)
                if monitor.pid is not None and not monitor.target_alive:
                    break
    except KeyboardInterrupt:
        pass
    finally:
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)
    if monitor.pid is not None and not monitor.target_alive:
        render(MonitorEnded(monitor.pid), "text", Output(stream=sys.stdout))
    return 0


def _interrupt_on_termination() -> dict[int, Any]:
    """SIGTERM and SIGHUP quit like Ctrl-C, so the terminal is restored."""
    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        previous[signum] = signal.signal(signum, interrupt)
    return previous


class _Keys(AbstractContextManager["_Keys"]):
    """Single key presses from a terminal (cbreak mode: no echo, no Enter, Ctrl-C still works)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self._terminal: int | None = None
        self._saved: Any = None

    def __enter__(self) -> _Keys:
        if sys.stdin is not None and sys.stdin.isatty():
            import termios
            import tty

            self.fd = self._terminal = sys.stdin.fileno()
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._terminal is not None:
            import termios

            try:
                termios.tcsetattr(self._terminal, termios.TCSADRAIN, self._saved)
            except termios.error:  # the terminal is gone (SSH connection closed)
                pass

    def wait(self, timeout_s: float) -> str | None:
        """A key pressed within ``timeout_s``, else None."""
        timeout_s = max(0.0, timeout_s)
        if self.fd is None:
            time.sleep(timeout_s)
            return None
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if not ready:
            return None
        data = os.read(self.fd, 32)
        if not data:  # the terminal went away: stop reading it
            self.fd = None
            return None
        return data.decode(errors="ignore")
