"""`stepscope` entry point: parse, dispatch, and the single error boundary.

Each subcommand lives in its own module exposing ``add_parser(subparsers)`` (which sets
``handler`` via ``set_defaults``) and, optionally, ``split_argv(argv) -> (own, rest)`` for
commands that hand the tail of the command line to someone else (``stepscope run``).

A :class:`~stepscope.errors.StepscopeError` becomes one line ``stepscope: error: …`` on stderr and
exit code 2; a disk that is full or failing under a command's own output (ENOSPC, EIO, EDQUOT,
EFBIG, EROFS) one line and exit code 1; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from stepscope._version import __version__
from stepscope.errors import EXIT_USAGE, StepscopeError, UsageError
from stepscope.switches import OFF_WORDS, ON_WORDS
from stepscope.text import printable, say

#: Subcommand name -> module under ``stepscope.cli``. Order is the order of ``--help``.
COMMANDS: dict[str, str] = {
    "run": "run_cmd",
    "demo": "demo_cmd",
    "report": "report_cmd",
    "monitor": "monitor_cmd",
    "gpu-procs": "gpu_procs_cmd",
    "analyze": "analyze_cmd",
    "tune-loader": "tune_loader_cmd",
    "try": "try_cmd",
    "diff": "diff_cmd",
    "runs": "runs_cmd",
}


class _Parser(argparse.ArgumentParser):
    """argparse, but errors follow stepscope's one-line format."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, printable(f"stepscope: error: {message} (see '{self.prog} --help')") + "\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of ``only`` (``stepscope run …`` imports no other command's
    module: some of them import the report pipeline, ~0.7 s of start-up)."""
    parser = _Parser(
        prog="stepscope",
        description="Find out why a PyTorch training or inference loop is slow, and what to change.",
    )
    parser.add_argument("--version", action="version", version=f"stepscope {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module_name in COMMANDS.items():
        if only is None or name == only:
            _command_module(module_name).add_parser(subparsers)
    return parser


def _command_module(module_name: str) -> ModuleType:
    return importlib.import_module(f"stepscope.cli.{module_name}")


#: Commands that only analyse, in processes of stepscope's own (they run no user code and time no
#: loop): numpy's transparent huge-page advice is off there and the C heap reuses freed arrays,
#: unless the environment sets either.
ANALYSIS_COMMANDS = frozenset({"analyze", "report", "diff", "runs"})


def _own_analysis(command: str | None) -> bool:
    """A command of :data:`ANALYSIS_COMMANDS` in a process that has not loaded numpy yet (the command
    as typed, not a library caller's process). The user's script never runs there: ``run``, ``demo``,
    ``try`` and ``tune-loader`` are not among these commands."""
    return command in ANALYSIS_COMMANDS and "numpy" not in sys.modules


def _no_huge_page_advice(command: str | None) -> bool:
    """Switch numpy's huge-page advice off (``NUMPY_MADVISE_HUGEPAGE=0``, read when numpy loads, and
    inherited by the command's worker processes) in :func:`_own_analysis`. numpy advises huge pages
    for every large array; where the kernel compacts memory to find one on a fault
    (``defrag=madvise``, the usual default), a 2 GB trace's analysis took 2.3x the system time and
    16 % more wall with the advice on a 2-core VM; 54 MB and 10 GB traces took the same
    (BENCHMARKS.md, "Huge pages"). Returns whether the setting was made."""
    if not _own_analysis(command) or "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return False
    os.environ["NUMPY_MADVISE_HUGEPAGE"] = "0"
    return True


REUSE_VAR = "STEPSCOPE_REUSE_MEMORY"
_REUSE_ON = ON_WORDS | {""}


def _reuse_freed_memory(command: str | None) -> bool:
    """Let the C heap keep and reuse the pages of freed arrays in :func:`_own_analysis`
    (:data:`stepscope.heap.may_reuse`; a trace's load turns it on where the memory left is ample:
    :func:`stepscope.traces.spill.reuse_freed_memory`), unless the environment sets glibc's own
    ``mmap_max`` or ``STEPSCOPE_REUSE_MEMORY=off`` (glibc's defaults kept). Returns whether it was
    allowed."""
    if not _own_analysis(command):
        return False
    setting = os.environ.get(REUSE_VAR, "").strip().lower()
    if setting not in _REUSE_ON and setting not in OFF_WORDS:
        raise UsageError(f"{REUSE_VAR}={os.environ[REUSE_VAR]!r} is not a setting: use on or off "
                         "(off keeps glibc's malloc defaults)")
    if setting in OFF_WORDS or "MALLOC_MMAP_MAX_" in os.environ or "mmap_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    from stepscope import heap

    heap.may_reuse = True
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return the exit code (``SystemExit`` from a user script passes through)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = args_list[0] if args_list else None
    try:
        _reuse_freed_memory(command)
    except StepscopeError as exc:
        say(f"stepscope: error: {exc}")
        return EXIT_USAGE
    _no_huge_page_advice(command)
    parser = build_parser(command if command in COMMANDS else None)
    rest: list[str] = []
    if command in COMMANDS:
        module = _command_module(COMMANDS[command])
        if hasattr(module, "split_argv"):
            own, rest = module.split_argv(args_list[1:])
            args_list = [args_list[0], *own]
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args.rest = rest
    global _ran
    _ran = args.command
    try:
        return int(args.handler(args) or 0)
    except StepscopeError as exc:
        say(f"stepscope: error: {exc}")
        return EXIT_USAGE
    except OSError as exc:
        if exc.errno == errno.EPIPE and args.command != "run":  # `stepscope analyze TRACE | head`: the reader left
            _stdout_gone()
            return EXIT_READER_GONE
        # a full or failing disk under what a command of stepscope's own writes (its output redirected
        # to a file, say); `run`'s own writes are warnings already, the script's errors are the script's
        if exc.errno not in _DISK_ERRNOS or args.command == "run":
            raise
        _stdout_gone()
        try:
            say(f"stepscope: error: cannot write {exc.filename or 'the output'}: {exc.strerror}")
        except (OSError, ValueError):  # stderr on the same full disk
            pass
        return EXIT_FAILED_WRITE


#: Write errors of the disk itself: one line, never a traceback.
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG, errno.EROFS})
#: Exit status when a command's output could not be written (not the user's mistake: not 2).
EXIT_FAILED_WRITE = 1
#: Exit status when the reader of stdout went away: the shell's status for a process ended by SIGPIPE.
EXIT_READER_GONE = 128 + 13
#: Commands that run no code but stepscope's own and leave nothing to finish at exit (their outputs
#: are closed, their children reaped): the console script ends them without the interpreter's
#: teardown, which frees every object and module one by one (~30 ms after `analyze` of a 15 MB
#: trace). `run` never: the user's script may have exit handlers of its own. `demo` keeps the teardown
#: but leaves its scenario's objects out of the final collections (stepscope.cli.demo_cmd).
QUICK_EXIT_COMMANDS = frozenset({"analyze"})
_ran: str | None = None  # the command main() ran last


def exits_quickly() -> bool:
    """The command :func:`main` ran may end without the interpreter's teardown (:data:`QUICK_EXIT_COMMANDS`)."""
    return _ran in QUICK_EXIT_COMMANDS


def _stdout_gone() -> None:
    """Point stdout at /dev/null: what its buffer still holds cannot be written, and the interpreter
    would say so again (\"Exception ignored\") when it flushes at exit."""
    try:
        descriptor = os.open(os.devnull, os.O_WRONLY)
        os.dup2(descriptor, sys.stdout.fileno())
        os.close(descriptor)
    except (OSError, ValueError, AttributeError):
        pass
