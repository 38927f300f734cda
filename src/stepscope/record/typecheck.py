"""Type checks for dataclasses rebuilt from JSON (records, samples): damage fails early and clearly.

Contract: :func:`checked_fields` keeps the keys of ``data`` that ``cls`` declares and raises one
``ValueError`` naming the field when a value does not match its annotation (ints must fit in
int64, floats must be finite). A damaged or hand-edited file then fails where it is loaded, as a
one-line error, never later inside a renderer. Integral floats pass for ints, as they did before, and
become ints.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

_HINTS: dict[type, dict[str, Any]] = {}
_INT64 = 2**63


def checked_fields(cls: type, data: Any) -> dict[str, Any]:
    """The fields of ``data`` that ``cls`` declares, each checked against its annotation."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    hints = _hints(cls)
    out = {}
    for key, value in data.items():
        if key in hints:
            if not _matches(value, hints[key]):
                raise ValueError(f"{cls.__name__}.{key}: expected {_type_name(hints[key])}, got {_show(value)}")
            out[key] = _as_int(value, hints[key])
    return out


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        names = {item.name for item in dataclasses.fields(cls)}
        _HINTS[cls] = {key: value for key, value in typing.get_type_hints(cls).items() if key in names}
    return _HINTS[cls]


def _matches(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return type(value) is bool
    if hint is int:  # a float with an integral value is accepted as before (schema-1 counts were floats)
        if type(value) is float:
            return value.is_integer() and -_INT64 <= value < _INT64
        return type(value) is int and -_INT64 <= value < _INT64
    if hint is float:
        return (type(value) is int and abs(value) < 2**1023) or (type(value) is float and math.isfinite(value))
    if hint is str:
        return type(value) is str
    if origin is tuple:
        return isinstance(value, (list, tuple)) and all(_matches(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(_matches(k, args[0]) and _matches(v, args[1]) for k, v in value.items())
    if dataclasses.is_dataclass(hint):
        return isinstance(value, dict) or (isinstance(hint, type) and isinstance(value, hint))
    return True


def _as_int(value: Any, hint: Any) -> Any:
    """An integral float where the field is an int (or a tuple of ints) becomes that int."""
    if type(value) is float and (hint is int or int in typing.get_args(hint)):
        return int(value)
    if isinstance(value, (list, tuple)) and typing.get_origin(hint) is tuple and typing.get_args(hint)[:1] == (int,):
        return [int(item) if type(item) is float else item for item in value]
    return value


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'…' if len(text) > 40 else ''}"
