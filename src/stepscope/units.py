"""Unit conversions and human formatting shared by renderers.

Records store integers in nanoseconds and bytes; ratios are 0..1. Percent exists only in renderers.
"""

from __future__ import annotations

import math

NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000
NS_PER_US = 1_000
#: A share below this prints as 0.0 % (:func:`format_ratio`'s one decimal): a view leaves it out.
SHARE_SHOWN_MIN = 0.0005


def ns_to_s(value_ns: float) -> float:
    return value_ns / NS_PER_S


def format_duration(seconds: float | None) -> str:
    """Format a duration with 3 significant digits and a unit suited to its size."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    magnitude = abs(seconds)
    if magnitude >= 3600:
        hours, rest = divmod(seconds, 3600)
        return f"{int(hours)}h{int(rest // 60):02d}m"
    if magnitude >= 60:
        minutes, rest = divmod(seconds, 60)
        return f"{int(minutes)}m{int(rest):02d}s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if magnitude >= scale:
            return f"{_three_digits(seconds / scale)} {unit}"
    return f"{_three_digits(seconds / 1e-9)} ns"


def format_duration_ns(nanoseconds: int | float | None) -> str:
    """:func:`format_duration` of a nanosecond count."""
    return format_duration(None if nanoseconds is None else nanoseconds / 1e9)


def format_bytes(count: float | None) -> str:
    """Format a byte count with binary prefixes (KiB, MiB, ...)."""
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{_three_digits(value)} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_ratio(ratio: float | None) -> str:
    """Format a 0..1 ratio as a percentage."""
    if ratio is None or math.isnan(ratio):
        return "-"
    return f"{ratio * 100:.1f}%"


def format_value(value: object, unit: str) -> str:
    """An evidence value in its unit: ratios as percentages, seconds and bytes scaled, floats to 3
    significant digits, anything else as text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if unit == "ratio":
            return format_ratio(float(value))
        if unit == "s":
            return format_duration(float(value))
        if unit == "bytes":
            return format_bytes(float(value))
        if isinstance(value, float):
            return f"{value:.3g}"
    return str(value)


def format_rate(per_second: float | None, unit: str) -> str:
    if per_second is None or math.isnan(per_second):
        return "-"
    return f"{_three_digits(per_second)} {unit}/s"


def _three_digits(value: float) -> str:
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"
