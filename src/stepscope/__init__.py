"""stepscope: why is my PyTorch training loop slow, and what exactly should I change?

Public API (importing it does not import torch):

- :func:`profile` — capture steps, phases and DataLoaders from inside your own code.
- :class:`RunRecord`, :func:`load_record` — the run record, the contract everything reads.
"""

from __future__ import annotations

from stepscope._version import __version__

__all__ = ["__version__", "profile", "RunRecord", "load_record"]


def __getattr__(name: str) -> object:  # lazy: keep `import stepscope` light and torch-free
    if name == "profile":
        from stepscope.api import profile

        return profile
    if name == "RunRecord":
        from stepscope.record.run import RunRecord

        return RunRecord
    if name == "load_record":
        from stepscope.record.store import load_record

        return load_record
    raise AttributeError(f"module 'stepscope' has no attribute {name!r}")
