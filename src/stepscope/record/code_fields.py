"""Encoding of the record's code-attribution fields: ``stack_samples`` and ``gc_pauses``.

Both are optional keys of the schema-2 document (absent in records written before them, which
then load with empty data). Like the steps, they are columns of integers; timestamps
(``ts_ns``, ``start_ns``) are delta-encoded. Frames are ``[file, line, function]`` triples and
stacks lists of frame ids (outermost first), both interned, so a long run stores each distinct
frame and stack once::

    "stack_samples": {"rate_hz": 100.0, "mechanism": "thread:sys._current_frames",
                      "frames": [["train.py", 41, "tokenize"], ...], "stacks": [[0, 3, 7], ...],
                      "columns": {"ts_ns": [...], "step": [...], "phase": [...], "role": [...],
                                  "pid": [...], "stack": [...], "weight_ns": [...]},
                      "library_paths": [...], "user_paths": [...], "sampler_cpu_ns": 0, "missed": 0}
    "gc_pauses": {"enabled": true, "columns": {"start_ns": [...], "duration_ns": [...], ...}}
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.record.run import GcPauses, StackFrame, StackSamples

_DELTA = ("ts_ns", "start_ns")


def _encode_columns(obj: Any, names: tuple[str, ...]) -> dict[str, list[int]]:
    columns = {}
    for name in names:
        values = np.asarray(getattr(obj, name), dtype=np.int64)
        if name in _DELTA and len(values):
            values = np.concatenate(([values[0]], np.diff(values)))
        columns[name] = values.tolist()
    return columns


def _decode_columns(data: dict[str, Any], names: tuple[str, ...]) -> dict[str, np.ndarray]:
    columns = {}
    for name in names:
        values = np.asarray(data.get(name, ()), dtype=np.int64).reshape(-1)
        columns[name] = np.cumsum(values) if name in _DELTA else values
    lengths = {len(column) for column in columns.values()}
    if len(lengths) > 1:
        raise ValueError(f"columns differ in length: {sorted(lengths)}")
    return columns


def stack_samples_to_document(samples: StackSamples) -> dict[str, Any] | None:
    """The ``stack_samples`` document key, or None when nothing was sampled (the key is omitted)."""
    if not samples.rate_hz:
        return None
    return {"rate_hz": samples.rate_hz, "mechanism": samples.mechanism,
            "frames": [[frame.file, frame.line, frame.function] for frame in samples.frames],
            "stacks": [list(stack) for stack in samples.stacks],
            "columns": _encode_columns(samples, StackSamples.COLUMNS + (
                StackSamples.OPTIONAL_COLUMNS if len(samples.weight_ns) else ())),
            "library_paths": list(samples.library_paths), "user_paths": list(samples.user_paths),
            "sampler_cpu_ns": samples.sampler_cpu_ns, "missed": samples.missed}


def stack_samples_from_document(data: dict[str, Any] | None) -> StackSamples:
    if not data:
        return StackSamples()
    return StackSamples(
        rate_hz=float(data.get("rate_hz", 0.0)), mechanism=str(data.get("mechanism", "")),
        frames=tuple(StackFrame(str(file), int(line), str(function)) for file, line, function in data["frames"]),
        stacks=tuple(tuple(int(item) for item in stack) for stack in data["stacks"]),
        library_paths=tuple(str(item) for item in data.get("library_paths", ())),
        user_paths=tuple(str(item) for item in data.get("user_paths", ())),
        sampler_cpu_ns=int(data.get("sampler_cpu_ns", 0)), missed=int(data.get("missed", 0)),
        **_decode_columns(data["columns"], StackSamples.COLUMNS + tuple(
            name for name in StackSamples.OPTIONAL_COLUMNS if name in data["columns"])))


def gc_pauses_to_document(pauses: GcPauses) -> dict[str, Any] | None:
    """The ``gc_pauses`` document key, or None when pauses were not measured (the key is omitted)."""
    if not pauses.enabled:
        return None
    return {"enabled": True, "columns": _encode_columns(pauses, GcPauses.COLUMNS)}


def gc_pauses_from_document(data: dict[str, Any] | None) -> GcPauses:
    if not data:
        return GcPauses()
    return GcPauses(enabled=bool(data.get("enabled", True)), **_decode_columns(data["columns"], GcPauses.COLUMNS))


__all__ = ["gc_pauses_from_document", "gc_pauses_to_document", "stack_samples_from_document",
           "stack_samples_to_document"]
