"""The trace loader's optional C extensions, used only when built from the source beside them.

Contract: :func:`usable` passes on an imported extension ``stepscope.traces.<name>`` when it was built
from the C source that sits beside it (``<name>.c``: its hash is compiled in, ``setup.py``) and
``STEPSCOPE_PURE_PYTHON`` is not set; else it returns None, and the caller takes its Python path:
the same tables, slower. A checkout whose C source changed since the last build never runs older
rules.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from stepscope.switches import switch


def usable(module: ModuleType | None) -> ModuleType | None:
    """``module`` (an extension of this package, or None where it did not import) where it may be used."""
    if module is None or switch("STEPSCOPE_PURE_PYTHON", False):
        return None
    source = Path(__file__).with_name(module.__name__.rsplit(".", 1)[-1] + ".c")
    if source.is_file():  # a source checkout: a build of older source could differ from it
        import hashlib  # here: an installed package has no source beside it, and skips the ~5 ms import

        if getattr(module, "SOURCE_SHA", None) != hashlib.sha256(source.read_bytes()).hexdigest()[:16]:
            return None
    return module
