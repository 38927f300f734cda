"""Children that cannot outlive their deadline or stepscope: every process stepscope starts to run
the user's code again — a trial of `stepscope try` and `run --verify` (:func:`run`), a measurement
of `stepscope tune-loader` (:func:`call`, a forked child) — goes through this module.

- Each child is the leader of its **own process group**, so whatever it starts (DataLoader
  workers, the script's own subprocesses) can be found and stopped with it.
- Each child has a **deadline** (the caller derives it from its time budget). When it passes, the
  whole group gets SIGTERM (a trial of `stepscope run` writes its record and ends), then SIGKILL
  after :data:`GRACE_S`; the child is reported as timed out (:attr:`Outcome.timed_out`).
- When the child ends on its own, what is left of its group (a worker that did not exit, a
  subprocess the script forgot) is stopped the same way: no process of a child remains.
- Any exception while stepscope waits — Ctrl-C's ``KeyboardInterrupt``, or :class:`Stopped`, which
  :func:`stop_on_signals` raises for SIGINT, SIGTERM and SIGHUP — stops the group first and then
  goes on: the caller keeps what was measured and reports it.

Process groups and ``/proc`` are POSIX and Linux: elsewhere a group is probed with ``killpg(pgid, 0)``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

#: Seconds between SIGTERM and SIGKILL when a group is stopped.
GRACE_S = 3.0
#: How long a SIGKILLed group may take to disappear before stepscope stops waiting for it.
KILL_WAIT_S = 5.0
_POLL_S = 0.02

__all__ = ["GRACE_S", "Outcome", "Stopped", "call", "group_members", "run", "stop_group", "stop_on_signals"]


@dataclass(frozen=True)
class Outcome:
    """How a child ended. ``returncode`` is None when it was stopped (timed out, or stepscope was
    interrupted); negative when a signal killed it (as :mod:`subprocess` reports it)."""

    returncode: int | None
    elapsed_s: float
    timed_out: bool = False
    deadline_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def describe(self) -> str:
        """``exit 1``, ``killed by SIGKILL``, ``timed out after 12.0 s (stopped with its process group)``."""
        if self.timed_out:
            return f"timed out after {self.deadline_s or self.elapsed_s:.1f} s (stopped with its process group)"
        if self.returncode is None:
            return "stopped"
        if self.returncode < 0:
            return f"killed by {signal_name(-self.returncode)}"
        return f"exit {self.returncode}"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Stopped(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived while children ran (:func:`stop_on_signals`). A
    ``KeyboardInterrupt``, so that code which stops cleanly on Ctrl-C stops cleanly on these too."""

    def __init__(self, signum: int):
        super().__init__(signal_name(signum))
        self.signum = signum


def stopped_by(exc: BaseException) -> int:
    """The signal behind an interruption: a :class:`Stopped`'s, SIGINT for a plain Ctrl-C."""
    return exc.signum if isinstance(exc, Stopped) else signal.SIGINT


@contextlib.contextmanager
def stop_on_signals(signums: Sequence[int] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Within the block, the first of ``signums`` to arrive raises :class:`Stopped` in the main
    thread (a signal that is ignored, as SIGHUP under ``nohup``, stays ignored); later ones are
    dropped while the children are stopped and what was measured is saved. The previous handlers
    come back on exit. Outside the main thread nothing is installed."""
    previous: dict[int, Any] = {}
    fired: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if fired:
            return
        fired.append(signum)
        raise Stopped(signum)

    for signum in signums:
        try:
            current = signal.getsignal(signum)
            if current == signal.SIG_IGN:
                continue
            signal.signal(signum, handler)
            previous[signum] = current if current is not None else signal.SIG_DFL
        except (ValueError, OSError):  # not the main thread
            continue
    try:
        yield
    finally:
        for signum, old in previous.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signum, old)


# -- process groups ------------------------------------------------------------------------------
def group_members(pgid: int) -> list[int]:
    """The live processes (zombies excepted) of process group ``pgid``."""
    if not os.path.exists("/proc/self/stat"):
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                data = handle.read()
        except OSError:  # gone meanwhile
            continue
        fields = data[data.rfind(b")") + 2:].split()
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def stop_group(pgid: int, grace_s: float = GRACE_S, reap: Callable[[], object] = lambda: None) -> bool:
    """SIGTERM to every process of group ``pgid``, SIGKILL to those left after ``grace_s``; returns
    when none is left (or :data:`KILL_WAIT_S` after the SIGKILL). ``reap`` collects the leader
    when it is stepscope's child (a zombie leader counts as gone). False when nothing was left."""
    reap()
    if not group_members(pgid):
        return False
    _signal_group(pgid, signal.SIGTERM)
    _signal_group(pgid, signal.SIGCONT)  # a stopped process acts on its SIGTERM only once continued
    for limit, last in ((grace_s, False), (KILL_WAIT_S, True)):
        end = time.monotonic() + limit
        while time.monotonic() < end:
            reap()
            if not group_members(pgid):
                return True
            time.sleep(_POLL_S)
        if not last:
            _signal_group(pgid, signal.SIGKILL)
    reap()
    return True


_OWN_GROUP: dict[str, Any] = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


def run(argv: Sequence[str], *, deadline_s: float | None, grace_s: float = GRACE_S,
        stdout: int | IO[Any] | None = None, stderr: int | IO[Any] | None = None,
        stdin: int | IO[Any] | None = subprocess.DEVNULL, env: dict[str, str] | None = None,
        cwd: str | Path | None = None) -> Outcome:
    """Run ``argv`` as the leader of a new process group until it ends or ``deadline_s`` passes
    (None: no deadline), and stop what is left of its group either way (see the module doc).
    An exception while waiting (Ctrl-C, :class:`Stopped`) stops the group, then propagates."""
    started = time.monotonic()
    process: subprocess.Popen[bytes] | None = None
    try:
        process = subprocess.Popen(list(argv), stdout=stdout, stderr=stderr, stdin=stdin, env=env, cwd=cwd,
                                   **_OWN_GROUP)
        try:
            code: int | None = process.wait(timeout=deadline_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            code, timed_out = None, True
        stop_group(process.pid, grace_s, process.poll)
    except BaseException:
        if process is not None:
            stop_group(process.pid, grace_s, process.poll)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=KILL_WAIT_S)
        raise
    if timed_out:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=KILL_WAIT_S)
    return Outcome(code, time.monotonic() - started, timed_out, deadline_s)


# -- a function in a forked child ----------------------------------------------------------------
class ChildRaised(Exception):
    """The function raised in the child; ``type_name`` and the message say what (the exception
    itself is re-raised instead when it could be sent back)."""

    def __init__(self, type_name: str, message: str):
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name


def call(function: Callable[[], Any], *, deadline_s: float | None,
         grace_s: float = GRACE_S) -> tuple[Outcome, Any]:
    """``function()`` in a forked child that leads its own process group, within ``deadline_s``.

    Returns ``(outcome, value)``: the value it returned (sent back pickled), or None when it did
    not return (timed out, or died: ``outcome`` says how). An exception it raised is raised here
    (as :class:`ChildRaised` when it cannot be pickled). Whatever it started is stopped with it;
    an exception while waiting stops the group, then propagates. The child is also killed when
    stepscope dies (``PR_SET_PDEATHSIG`` on Linux), so it never outlives a SIGKILLed parent.
    """
    import multiprocessing

    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    process = context.Process(target=_child_main, args=(function, writer, os.getpid()), daemon=False)
    started = time.monotonic()
    message: Any = None
    timed_out = False
    try:
        process.start()
        writer.close()
        pid = process.pid
        assert pid is not None
        with contextlib.suppress(OSError):  # the child does the same: whichever runs first
            os.setpgid(pid, pid)
        if reader.poll(deadline_s):
            try:
                message = reader.recv()
            except (EOFError, OSError):  # it died before answering
                message = None
        else:
            timed_out = True
        if message is not None:  # it answered: let it exit on its own, briefly
            process.join(timeout=grace_s)
        stop_group(pid, grace_s, lambda: process.exitcode)
        process.join(timeout=KILL_WAIT_S)
    except BaseException:
        if process.pid is not None:
            stop_group(process.pid, grace_s, lambda: process.exitcode)
            process.join(timeout=KILL_WAIT_S)
        raise
    finally:
        reader.close()
    code = None if timed_out else process.exitcode
    outcome = Outcome(code if message is None else 0, time.monotonic() - started, timed_out, deadline_s)
    if message is None:
        return outcome, None
    kind, payload = message
    if kind == "raised":
        raise payload
    if kind == "raised-text":
        raise ChildRaised(*payload)
    return outcome, payload


def _child_main(function: Callable[[], Any], writer: Any, parent: int) -> None:
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # not stepscope's handlers: die
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signum) != signal.SIG_IGN:
                signal.signal(signum, signal.SIG_DFL)
    _die_with_parent(parent)
    try:
        message: tuple[str, Any] = ("value", function())
    except BaseException as exc:  # the user's code: anything it raises is the answer
        message = ("raised", exc)
    try:
        writer.send(message)
    except Exception:  # noqa: BLE001 - unpicklable: send its words
        if message[0] == "raised":
            writer.send(("raised-text", (type(message[1]).__name__, str(message[1]))))
        else:
            raise
    finally:
        writer.close()


def _die_with_parent(parent: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
