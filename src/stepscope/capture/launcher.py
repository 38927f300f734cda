"""Run an unmodified script or module exactly as ``python script.py`` / ``python -m mod`` would.

Fidelity contract: the script sees the same ``sys.argv``, ``sys.path[0]``, ``__main__`` module
attributes (``__file__`` absolute, ``__spec__`` None for scripts), the same stdout/stderr (we
print only after it ends, and only to stderr), and the process exits with the same status: the
``SystemExit`` code, 1 with the traceback (through ``sys.excepthook``, with stepscope's own frames
removed) for an uncaught exception, and death by SIGINT/SIGTERM for an interrupt, after the
record has been written.
"""

from __future__ import annotations

import importlib.machinery
import os
import signal
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from stepscope.errors import InputError

_OWN_DIR = str(Path(__file__).resolve().parents[1])
_ZOO_DIR = str(Path(__file__).resolve().parents[1] / "zoo")


@dataclass(frozen=True)
class Target:
    """What to run: a script path or a module name, and its arguments."""

    name: str
    is_module: bool
    args: tuple[str, ...]
    code: types.CodeType | None = None  # compiled script (scripts only)
    path: Path | None = None


@dataclass
class Outcome:
    """How the user's code ended."""

    exit_code: int = 0
    exception: BaseException | None = None
    system_exit: SystemExit | None = None
    signal_name: str | None = None


#: Launchers that start the training in other processes: ``stepscope run`` must run inside them.
#: name -> (how the command is written, the flag that runs the next token as a module).
_LAUNCHERS = {
    "torchrun": ("torchrun", "-m"),
    "torch.distributed.run": ("torchrun", "-m"),
    "torch.distributed.launch": ("torchrun", "-m"),
    "accelerate": ("accelerate launch", "-m"),
    "accelerate.commands.launch": ("accelerate launch", "-m"),
    "accelerate.commands.accelerate_cli": ("accelerate launch", "-m"),
    "deepspeed": ("deepspeed", "--module"),
    "deepspeed.launcher.runner": ("deepspeed", "--module"),
}


def refuse_launcher(name: str, args: list[str], is_module: bool = False) -> None:
    """Raise a one-line :class:`UsageError` when the "script" is a distributed launcher.

    ``stepscope run accelerate launch train.py`` would capture the launcher, which trains nothing
    (0 steps, and its memory read as a leak): the message shows the command that puts stepscope
    inside each launched process instead.
    """
    from stepscope.errors import UsageError

    key = name if is_module else Path(name).name
    if key.endswith(".py") or key not in _LAUNCHERS:
        return
    launcher, module_flag = _LAUNCHERS[key]
    rest = list(args)
    if launcher == "accelerate launch" and rest[:1] == ["launch"]:
        rest = rest[1:]
    elif launcher == "accelerate launch" and not is_module:
        return  # `accelerate config`, `accelerate env`: not a training launch (and not a script)
    script = next((index for index, token in enumerate(rest) if token.endswith(".py")), None)
    if script is None:
        options, target, after = rest, "train.py", ["…"]
    else:
        options, target, after = rest[:script], rest[script], rest[script + 1:]
    shown = " ".join([launcher, *options, module_flag, "stepscope", "run", target, *after])
    raise UsageError(f"{key if not is_module else '-m ' + key} is a launcher: it starts the training in other "
                     f"processes, which stepscope would not see; put stepscope inside it: {shown}")


def resolve_script(path_text: str, args: list[str]) -> Target:
    """Check and compile a script; errors are user mistakes (exit 2).

    A syntax error is shown as Python shows it (file, line, caret) before the one-line error.
    """
    path = Path(path_text)
    if not path.exists():
        raise InputError(path_text, "no such script; check the path (or use -m for a module)")
    if path.is_dir():
        main = path / "__main__.py"
        if not main.is_file():
            raise InputError(path_text, "is a directory without __main__.py; pass a .py file")
        path = main
    absolute = path.resolve()
    try:
        source = absolute.read_bytes()
    except OSError as exc:
        raise InputError(path_text, f"cannot read the script ({exc.strerror})") from None
    try:
        code = compile(source, str(absolute), "exec", dont_inherit=True)
    except SyntaxError as exc:
        import traceback

        sys.stderr.write("".join(traceback.format_exception_only(type(exc), exc)))
        raise InputError(path_text, f"the script has a {type(exc).__name__} at line {exc.lineno}; "
                         "fix it and run again") from None
    except ValueError as exc:  # e.g. null bytes
        raise InputError(path_text, f"cannot compile the script ({exc})") from None
    return Target(name=path_text, is_module=False, args=tuple(args), code=code, path=absolute)


def resolve_module(name: str, args: list[str]) -> Target:
    import importlib.util

    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        spec = None
        reason = str(exc)
    else:
        reason = ""
    finally:
        sys.path.pop(0)
    if spec is None:
        raise InputError(name, f"no module named {name!r}{f' ({reason})' if reason else ''}; "
                         "check the name and that its package is importable from here")
    return Target(name=name, is_module=True, args=tuple(args))


def execute(target: Target) -> Outcome:
    """Run the target in this process as ``__main__`` and report how it ended (never raises)."""
    outcome = Outcome()
    saved_main = sys.modules.get("__main__")
    try:
        if target.is_module:
            _run_module(target)
        else:
            _run_script(target)
    except SystemExit as exc:
        outcome.system_exit = exc
        outcome.exit_code = _exit_status(exc.code)
    except KeyboardInterrupt as exc:
        outcome.exception = exc
        outcome.exit_code = 128 + signal.SIGINT
        outcome.signal_name = "SIGINT"
    except BaseException as exc:  # noqa: BLE001 - the user's exception, reported like Python does
        outcome.exception = exc
        outcome.exit_code = 1
    finally:
        if saved_main is not None and sys.modules.get("__main__") is None:
            sys.modules["__main__"] = saved_main
    return outcome


def _run_script(target: Target) -> None:
    assert target.path is not None and target.code is not None
    sys.argv[:] = [target.name, *target.args]
    sys.path[0] = str(target.path.parent)
    module = types.ModuleType("__main__")
    module.__dict__.update(
        __file__=str(target.path),
        __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", str(target.path)),
        __package__=None,
        __spec__=None,
        __builtins__=__builtins__,
    )
    sys.modules["__main__"] = module
    exec(target.code, module.__dict__)  # noqa: S102 - running the user's script is the point


def _run_module(target: Target) -> None:
    import runpy

    sys.argv[:] = [target.name, *target.args]
    sys.path[0] = os.getcwd()
    sys.modules["__main__"] = types.ModuleType("__main__")
    run_as_main = getattr(runpy, "_run_module_as_main", None)
    if run_as_main is not None:  # what `python -m` itself calls: same frames, same globals
        run_as_main(target.name, alter_argv=True)
    else:  # pragma: no cover - other interpreters
        runpy.run_module(target.name, run_name="__main__", alter_sys=True)


def _exit_status(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1


def _own_frame(tb: TracebackType) -> bool:
    """A frame of stepscope itself (its launcher, its wrappers around DataLoader and Module calls);
    the zoo's scripts are the user's code of a demo and stay."""
    name = tb.tb_frame.f_code.co_filename
    return name.startswith(_OWN_DIR) and not name.startswith(_ZOO_DIR)


def strip_own_frames(exc: BaseException) -> None:
    """Remove stepscope's frames from ``exc``'s traceback and from the exceptions chained to it
    (``__cause__``/``__context__``), so it prints as it would without stepscope: the wrappers around
    ``DataLoader.__next__`` and ``Module.__call__`` sit between the script's frames and torch's."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        kept = []
        tb = current.__traceback__
        while tb is not None:
            if not _own_frame(tb):
                kept.append(tb)
            tb = tb.tb_next
        rebuilt: TracebackType | None = None
        for item in reversed(kept):
            rebuilt = TracebackType(rebuilt, item.tb_frame, item.tb_lasti, item.tb_lineno)
        current.__traceback__ = rebuilt
        pending += [current.__cause__, current.__context__]


def report_exception(exc: BaseException) -> None:
    """Print the user's exception as Python would, without stepscope's frames."""
    try:
        strip_own_frames(exc)
    except Exception:  # noqa: BLE001 - never lose the script's traceback over its cosmetics
        pass
    tb = exc.__traceback__
    try:
        sys.excepthook(type(exc), exc, tb)
    except (OSError, ValueError, AttributeError):  # the script closed stderr: Python prints nothing either
        pass


def report_outcome(outcome: Outcome) -> None:
    """Print what Python prints when the script ends: a traceback, or a ``sys.exit("message")``."""
    if outcome.exception is not None:
        report_exception(outcome.exception)
    elif outcome.system_exit is not None:
        code = outcome.system_exit.code
        if code is not None and not isinstance(code, int):
            flush_std_streams()
            try:
                print(code, file=sys.stderr)
            except (OSError, ValueError, AttributeError):
                pass


def flush_std_streams() -> None:
    """Flush stdout and stderr if they are still there (the script may have closed either)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def finish_process(outcome: Outcome) -> None:
    """Leave the process the way the script would have (does not return)."""
    if outcome.signal_name is not None:
        die_by(getattr(signal, outcome.signal_name))
    sys.exit(outcome.exit_code)


def die_by(signum: int) -> None:
    """End the process by ``signum`` with its default action (as if nothing had handled it), first
    removing the temporary files of the writes it cuts short."""
    from stepscope.safe_write import remove_unfinished

    remove_unfinished()
    flush_std_streams()
    signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # pragma: no cover - only if the signal did not end us


#: Signals whose default action ends the process. Where the script inherits the default, capture
#: handles them: write what was captured, then die by the same signal. SIGINT is Python's
#: KeyboardInterrupt and goes through the script like any exception.
TERMINATING_SIGNALS = ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


class SignalGuard:
    """Capture's signal handling: save the record on a fatal signal, never pre-empt the script's.

    - :meth:`install` takes over the signals of :data:`TERMINATING_SIGNALS` that still have their
      default action (an ignored SIGHUP under ``nohup`` stays ignored). On such a signal,
      ``on_signal(signum)`` runs (it writes the record), then the process dies by the signal.
    - A script that installs its own handler replaces ours, and runs as under Python. Handlers
      that chain to the previous one (Lightning's ``_HandlersCompose``) call ours: we see that we
      are no longer the installed handler and return, leaving the decision to the script's handler,
      as under Python, where it found the default action and had nothing to chain to. The record
      is then written when the script ends, however it ends (or at exit).
    - :meth:`hold` starts finalisation: from then on every signal that would end or interrupt the
      process (SIGINT included) is only noted in :attr:`pending`, so a second Ctrl-C or the SIGTERM
      of ``timeout`` cannot cut the record's writing short. The caller checks :attr:`pending`
      once the record is saved and then dies by it (:func:`die_by`), skipping the optional rest;
      a signal arriving after that ends the process at once.
    - :meth:`wait_for_report` is the one exception: the rank that writes the merged report of a job
      whose rank failed finishes it before one signal ends the process (the launcher tears the job
      down with one SIGTERM, torchrun then waits 30 s before SIGKILL); a second signal still ends
      the process at once.
    """

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.pending: list[int] = []
        self.holding = False
        self.saved = False  # the record is on disk: a signal now ends the process at once
        self.spare = 0  # signals that may wait for the merged report after the save (wait_for_report)
        self._on_signal: Callable[[int], None] | None = None
        self._handler = self._handle  # one bound method: compared by identity with getsignal()

    def install(self, on_signal: Callable[[int], None]) -> None:
        self._on_signal = on_signal
        for name in TERMINATING_SIGNALS:
            signum = getattr(signal, name, None)
            if signum is None:
                continue
            try:
                if signal.getsignal(signum) == signal.SIG_DFL:
                    signal.signal(signum, self._handler)
            except (ValueError, OSError):  # not the main thread, or not allowed here
                pass

    def _handle(self, signum: int, frame: Any) -> None:
        if os.getpid() != self.owner:  # a forked child (DataLoader worker): the default action
            die_by(signum)
        if self.holding:
            if self.saved and len(self.pending) >= self.spare:  # only optional work is left: never block a kill
                die_by(self.pending[0] if self.pending else signum)
            self.pending.append(signum)
            return
        if signal.getsignal(signum) is not self._handler:  # called by the script's own handler
            return
        if self._on_signal is not None:
            self._on_signal(signum)
        die_by(signum)

    def hold(self) -> None:
        """Finalisation begins: note signals instead of acting on them (see the class docstring)."""
        if self.holding or os.getpid() != self.owner:
            return
        self.holding = True
        names = ("SIGINT", *TERMINATING_SIGNALS)
        for name in names:
            signum = getattr(signal, name, None)
            if signum is None:
                continue
            try:
                if signal.getsignal(signum) not in (signal.SIG_IGN, None):
                    signal.signal(signum, self._handler)
            except (ValueError, OSError):
                pass

    def die_if_pending(self) -> None:
        """Die by the first signal that arrived during finalisation, if any (does not return then).

        Called once the record is saved: from then on a signal ends the process at once, so a stuck
        report (or a slow one) can always be interrupted."""
        self.saved = True
        if len(self.pending) > self.spare:
            die_by(self.pending[0])

    def wait_for_report(self, signals: int) -> None:
        """Let up to ``signals`` signals (0 or 1) wait until :meth:`report_written`: this rank writes
        the merged report of a failed job, which the launcher's teardown must not cut short."""
        self.spare = signals

    def report_written(self) -> None:
        """The merged report is written: a signal that waited for it ends the process now."""
        self.spare = 0
        self.die_if_pending()
