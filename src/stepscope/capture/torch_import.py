"""Run a callback once ``torch`` is imported, without importing it ourselves.

Scripts that never import torch then pay nothing for capture (no multi-second torch import), and
scripts that do get the hooks installed the moment ``import torch`` completes, before any of
their own code can create a DataLoader, module or optimizer.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any


class TorchImportWatcher(importlib.abc.MetaPathFinder):
    """A meta-path finder that wraps a module's loader (torch's by default) to call ``callback``
    after the module executes."""

    def __init__(self, callback: Callable[[], None], module: str = "torch"):
        self.callback = callback
        self.module = module
        self._searching = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname != self.module or self._searching:
            return None
        self._searching = True
        try:
            spec = _find_after(self, fullname, path, target)
        finally:
            self._searching = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        self.remove()
        loader = spec.loader
        original = loader.exec_module
        watcher = self

        def exec_module(module: Any) -> None:
            original(module)
            loader.__dict__.pop("exec_module", None)  # back to the class's method
            watcher.callback()

        loader.exec_module = exec_module
        return spec

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def _find_after(watcher: TorchImportWatcher, fullname: str, path: Any, target: Any) -> Any:
    """The spec the finders after ``watcher`` give (other watchers then wrap the loader too)."""
    finders = sys.meta_path
    start = finders.index(watcher) + 1 if watcher in finders else 0
    for finder in list(finders[start:]):
        find = getattr(finder, "find_spec", None)
        spec = find(fullname, path, target) if find is not None else None
        if spec is not None:
            return spec
    return importlib.machinery.PathFinder.find_spec(fullname, path)


def when_torch_imported(callback: Callable[[], None], module: str = "torch") -> TorchImportWatcher | None:
    """Call ``callback`` now if ``module`` (torch by default) is loaded, else right after it is
    imported.

    Returns the watcher (call ``remove()`` to cancel), or None when the callback already ran.
    """
    if sys.modules.get(module) is not None:
        callback()
        return None
    watcher = TorchImportWatcher(callback, module)
    sys.meta_path.insert(0, watcher)
    return watcher
