"""`stepscope monitor`: a live view of one machine (what bpytop and ``watch nvidia-smi`` show).

CPU per core, memory, disk and network rates, GPUs and the busiest processes, refreshed every
``--interval`` seconds; ``q`` or Ctrl-C quits and gives the terminal back as it was. ``--pid P``
shows that process tree (a training job and its DataLoader workers) instead of the whole machine.
``--once --json`` prints one frame (two samples ``--interval`` apart) for scripts.

The numbers come from the sampler's probes and the same arithmetic as a run's signals
(:mod:`stepscope.analysis.run.live`); the screen is :mod:`stepscope.report.monitor_view`.
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

import orjson
import psutil
from rich.console import Console
from rich.live import Live
from rich.text import Text

from stepscope.analysis.run.live import MonitorFrame, live_frame
from stepscope.capture.sampler import SystemSampler, check_interval
from stepscope.errors import UsageError
from stepscope.record.samples import SamplesBuilder
from stepscope.report.monitor_view import render_monitor

DEFAULT_INTERVAL_S = 1.0
_GPU_SLOW = ("gpu_sm_clock_mhz", "gpu_power_mw", "gpu_temp_c", "gpu_pcie_tx_bytes_per_s", "gpu_pcie_rx_bytes_per_s")


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


class LiveMonitor:
    """Samples the machine (or one process tree) and turns the last two samples into a frame."""

    def __init__(self, pid: int | None, interval_s: float, *, top: int | None = 15, gpu: Any = "auto"):
        if gpu == "auto":
            from stepscope.capture.gpu import open_gpus

            gpu, note = open_gpus(slow_every=1)
        else:
            note = None
        self.sampler = SystemSampler(pid, gpu=gpu, with_io=pid is not None, interval_s=interval_s)
        self.pid = pid
        self.top = top
        self.meta = self.sampler.header(interval_s=interval_s)
        self.processes: dict[int, dict[str, Any]] = {}
        self.notes: list[str] = [note] if note else []
        self._previous: dict[str, Any] | None = None
        self._last_gpu: dict[str, list[int]] = {}

    def step(self) -> MonitorFrame | None:
        """Take a sample; the frame since the previous one (None for the first)."""
        sample, events = self.sampler.sample()
        for event in events:
            self._apply(event)
        if sample is None:
            return None
        self._carry_gpu(sample)
        previous, self._previous = self._previous, sample
        if previous is None:
            return None
        builder = SamplesBuilder(self.meta)
        for event in self.processes.values():
            builder.add_event(event)
        builder.notes = list(self.notes)
        builder.add(previous)
        builder.add(sample)
        return live_frame(builder.freeze(), top=self.top)

    @property
    def target_alive(self) -> bool:
        return self.sampler.target_alive

    def close(self) -> None:
        self.sampler.close()

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "process":
            self.processes[event["id"]] = event
        elif kind == "exit":
            self.processes.pop(event["id"], None)
        elif kind == "role" and event["id"] in self.processes:
            self.processes[event["id"]].update(role=event["role"], loader_id=event.get("loader_id"))
        elif kind == "note" and event["text"] not in self.notes:
            self.notes.append(event["text"])

    def _carry_gpu(self, sample: dict[str, Any]) -> None:
        """GPU metrics read round-robin (PCIe) keep their last value on screen."""
        for name in _GPU_SLOW:
            values = sample.get(name)
            if values is None:
                continue
            last = self._last_gpu.setdefault(name, [-1] * len(values))
            sample[name] = [value if value >= 0 else old for value, old in zip(values, last)]
            self._last_gpu[name] = sample[name]


def _once(monitor: LiveMonitor, args: argparse.Namespace) -> int:
    monitor.step()
    time.sleep(args.interval)
    frame = monitor.step()
    if frame is None:
        raise UsageError("could not read the machine's counters twice; see the notes with --once without --json")
    if args.json:
        sys.stdout.write(orjson.dumps(frame.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        Console().print(render_monitor(frame, title=_title(monitor, args)))
    return 0


def _live(monitor: LiveMonitor, args: argparse.Namespace) -> int:
    console = Console()
    previous_handlers = _interrupt_on_termination()
    try:
        with _Keys() as keys, Live(Text("sampling..."), console=console, screen=console.is_terminal,
                                   auto_refresh=False, redirect_stdout=False, redirect_stderr=False) as live:
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
                    live.update(render_monitor(frame, title=_title(monitor, args), footer="q or Ctrl-C to quit"),
                                refresh=True)
                if monitor.pid is not None and not monitor.target_alive:
                    break
    except KeyboardInterrupt:
        pass
    finally:
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)
    if monitor.pid is not None and not monitor.target_alive:
        console.print(f"process {monitor.pid} has ended")
    return 0


def _title(monitor: LiveMonitor, args: argparse.Namespace) -> str:
    scope = f"process {args.pid} and its children" if args.pid is not None else "whole machine"
    return f"stepscope monitor — {monitor.meta['hostname']} — {scope} — every {args.interval:g} s"


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
