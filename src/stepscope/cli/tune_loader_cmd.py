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
from typing import Any

from stepscope.errors import UsageError


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
    from stepscope.pipeline.commands import tune_view
    from stepscope.report.render import Output, render

    render(tune_view(result, args.target), "text", Output(stream=sys.stdout))
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


def _progress(trial: Any) -> None:
    from stepscope.pipeline.commands import tune_progress
    from stepscope.report.render import Output, render

    render(tune_progress(trial), "text", Output(stream=sys.stderr))
