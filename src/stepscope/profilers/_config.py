"""Configuration errors of the profiler family.

Contract:
- Every invalid constructor argument raises :class:`ProfilerConfigError`, which is both a
  stepscope :class:`~stepscope.errors.UsageError` (the CLI prints it as one line, exit 2) and a
  :class:`ValueError`. Table keyword problems raise :class:`ProfilerKeyError`, a ``UsageError``
  and a :class:`KeyError`, as Lightning raises ``KeyError`` for them.
- Lightning raises ``MisconfigurationException`` for the same mistakes. Importing Lightning costs
  seconds, so we never import it for an error; but when it is already imported (a Lightning user's
  script), :func:`config_error` returns an instance of a subclass that *also* derives from every
  loaded ``MisconfigurationException``, so ``except MisconfigurationException`` keeps working.
- Messages say what is wrong and list the allowed values.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from stepscope.errors import UsageError

__all__ = ["ProfilerConfigError", "ProfilerKeyError", "config_error", "allowed"]

#: Modules that define Lightning's ``MisconfigurationException`` (``lightning`` and the
#: standalone ``lightning_fabric``/``pytorch_lightning`` distribution define distinct classes).
_LIGHTNING_EXCEPTION_MODULES = (
    "lightning.fabric.utilities.exceptions",
    "lightning_fabric.utilities.exceptions",
)


class ProfilerConfigError(UsageError, ValueError):
    """A profiler or monitor was given an invalid argument."""

    def __reduce__(self) -> tuple:
        # Rebuilt by config_error on unpickling: the combined Lightning class is not importable.
        return (config_error, (str(self),))


class ProfilerKeyError(UsageError, KeyError):
    """An invalid key in a keyword dictionary (e.g. ``table_kwargs``)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


_combined_cache: dict[tuple[type, ...], type] = {}


def _loaded_lightning_exceptions() -> tuple[type, ...]:
    found = []
    for name in _LIGHTNING_EXCEPTION_MODULES:
        module = sys.modules.get(name)
        exc = getattr(module, "MisconfigurationException", None) if module is not None else None
        if isinstance(exc, type) and exc not in found:
            found.append(exc)
    return tuple(found)


def config_error(message: str) -> ProfilerConfigError:
    """Build the error to raise for an invalid argument (see the module contract)."""
    extra = _loaded_lightning_exceptions()
    if not extra:
        return ProfilerConfigError(message)
    cls = _combined_cache.get(extra)
    if cls is None:
        cls = type("ProfilerConfigError", (ProfilerConfigError, *extra), {"__module__": __name__})
        _combined_cache[extra] = cls
    return cls(message)


def allowed(values: Iterable[object]) -> str:
    """Format allowed values for a message: ``'a', 'b', 'c'`` (sorted, repr'd)."""
    return ", ".join(repr(v) for v in sorted(values, key=str))
