"""Patching attributes of torch classes and modules, undoably (capture's one way to hook in)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def patch_attribute(owner: Any, name: str, replacement: Any, undo: list[Callable[[], None]]) -> Any:
    """Set ``owner.name = replacement``; append to ``undo`` what restores it exactly (the owner's
    own attribute, or none when it was inherited). Returns what the name resolved to before."""
    had_own = name in vars(owner)
    original = vars(owner)[name] if had_own else getattr(owner, name)
    setattr(owner, name, replacement)

    def restore() -> None:
        if had_own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)

    undo.append(restore)
    return original
