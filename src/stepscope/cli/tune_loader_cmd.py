"""``stepscope tune-loader MODULE:FACTORY``: measure DataLoader settings and print the fastest.

``MODULE`` is an importable module (the current directory is on the path) or a ``.py`` file;
``FACTORY`` a function in it that returns the DataLoader, optionally taking ``num_workers``,
``prefetch_factor``, ``pin_memory``, ``persistent_workers`` and ``batch_size`` as keyword arguments.
The search is :func:`stepscope.data.tuner.tune_loader`. A module that cannot be imported, a name that
is not a function, a factory that raises or returns no DataLoader: one line
``stepscope: error: …``, exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import sys
from typing import Any, Literal

from stepscope.errors import UsageError
from stepscope.text import say


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tune-loader",
        help="measure DataLoader settings (workers, prefetch, pinning, batch size) and print the fastest",
        description="Build the DataLoader returned by FACTORY with different settings, measure samples/s for "
                    "each (no model runs) and print the table, the best setting and the speed-up.")
    parser.add_argument("target", metavar="MODULE:FACTORY",
                        help="a function returning the DataLoader, e.g. mytrain:make_loader or train.py:make_loader")
    parser.add_argument("--budget-s", type=float, default=60.0, metavar="S", help="time budget (default: 60)")
    parser.add_argument("--batches", type=int, default=40, metavar="N", help="batches read per trial (default: 40)")
    parser.add_argument("--max-workers", type=int, default=None, metavar="N",
                        help="highest num_workers tried (default: twice the usable cores)")
    parser.add_argument("--min-gain", type=float, default=0.05, metavar="R",
                        help="relative gain a change must bring to be kept (default: 0.05)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    if args.batches < 2 or args.budget_s <= 0 or (args.max_workers is not None and args.max_workers < 0):
        raise UsageError("--batches must be at least 2, --budget-s positive and --max-workers not negative")
    factory = load_factory(args.target)
    from stepscope.children import stop_on_signals
    from stepscope.data.tuner import tune_loader

    # Ctrl-C, SIGTERM, SIGHUP: the trial under way is stopped with its workers, the others are shown
    with stop_on_signals():
        result = tune_loader(factory, budget_s=args.budget_s, batches=args.batches, max_workers=args.max_workers,
                             min_gain=args.min_gain, progress=_progress)
    render(result, args.target)
    if result.stopped_by == "SIGINT":
        return 128 + signal.SIGINT
    if result.stopped_by is not None:  # what was measured is shown: now end as the signal asked
        from stepscope.capture.launcher import die_by

        die_by(getattr(signal, result.stopped_by))
    return 0


def load_factory(target: str):
    """Import ``MODULE:FACTORY`` and return the function.

    Raises:
        UsageError: no ``:``, a module that cannot be imported, a missing or non-callable name.
    """
    module_name, sep, attribute = target.rpartition(":")
    if not sep or not module_name or not attribute:
        raise UsageError(f"expected MODULE:FACTORY (e.g. mytrain:make_loader), got {target!r}")
    module = _import(module_name)
    factory: Any = module
    for part in attribute.split("."):
        if not hasattr(factory, part):
            raise UsageError(f"module {module_name!r} has no attribute {attribute!r}")
        factory = getattr(factory, part)
    if not callable(factory):
        raise UsageError(f"{target} is a {type(factory).__name__}, not a function returning a DataLoader")
    return factory


def _import(module_name: str):
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            if not os.path.isfile(module_name):
                raise UsageError(f"no such file: {module_name}")
            spec = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3] or "factory",
                                                          module_name)
            if spec is None or spec.loader is None:
                raise UsageError(f"cannot load {module_name} as a Python module")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            return module
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        return importlib.import_module(module_name)
    except UsageError:
        raise
    except ModuleNotFoundError as exc:
        raise UsageError(f"cannot import module {module_name!r}: {exc}") from exc
    except Exception as exc:  # the user's module failed while importing
        raise UsageError(f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc


def _progress(trial) -> None:
    outcome = f"error: {trial.error}" if trial.error else f"{trial.samples_per_s:,.0f} samples/s"
    say(f"  {trial.stage:<10} {trial.setting.describe()} → {outcome}", flush=True)


def render(result, target: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from stepscope.units import format_duration, format_ratio

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=max(console.width, 110))
    table = Table(title=f"stepscope tune-loader · {target}", title_justify="left")
    columns: tuple[tuple[str, Literal["left", "right"]], ...] = (("#", "right"), ("stage", "left"), ("workers", "right"), ("prefetch", "right"),
                            ("pin", "left"), ("persist", "left"), ("batch", "right"),
                            ("samples/s", "right"), ("1st batch", "right"), ("restart", "right"))
    for column, justify in columns:
        table.add_column(column, justify=justify)
    for number, trial in enumerate(result.trials, 1):
        setting = trial.setting
        mark = " ◀ best" if setting == result.best and trial.stage == "repeat" else ""
        rate = f"error: {trial.error}" if trial.error else f"{trial.samples_per_s:,.0f}{mark}"
        table.add_row(str(number), trial.stage, str(setting.num_workers), str(setting.prefetch_factor or "-"),
                      _yes(setting.pin_memory), _yes(setting.persistent_workers), str(setting.batch_size or "-"),
                      rate, format_duration(trial.first_batch_s), format_duration(trial.restart_s))
    console.print(table)
    noise = format_ratio(result.noise)
    console.print(f"current: {result.baseline.describe()} — {result.baseline_rate:,.0f} samples/s")
    console.print(f"best:    {result.best.describe()} — {result.best_rate:,.0f} samples/s")
    console.print(f"speed-up {result.speedup:.2f}× (noise between repeats: {noise}); {len(result.trials)} trials "
                  f"in {result.elapsed_s:.1f} s" + (" — budget reached, search cut short" if result.budget_exhausted
                                                    else ""))
    for note in result.notes:
        console.print(f"note: {note}")
    if result.oversubscribed:
        console.print(f"warning: {result.best.num_workers} workers + {result.intra_op_threads} intra-op threads "
                      f"> {result.cpu_count} cores: the training process and the workers will compete; call "
                      f"torch.set_num_threads({result.suggested_threads}) in the training "
                      "process, or use fewer workers")


def _yes(value: bool) -> str:
    return "yes" if value else "no"
