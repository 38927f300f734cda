"""Builders of tiny hand-made traces for exact-answer tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from stepscope.traces.events import TableBuilder


def kernel(name, ts, dur, stream=7, correlation=-1, cat="kernel", **args):
    extra = {"stream": stream, "correlation": correlation, "device": 0, **args}
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": extra}


def runtime(name, ts, dur, correlation, tid=1, external_id=-1):
    return {
        "ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
        "args": {"correlation": correlation, "External id": external_id},
    }


def op(name, ts, dur, tid=1, external_id=-1, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"External id": external_id, **args}}


def table_of(*events):
    builder = TableBuilder()
    builder.add_batch(list(events))
    return builder.build()[0]


def write_trace(path: Path, events, gz: bool = False, **top) -> Path:
    doc = {"schemaVersion": 1, **top, "traceEvents": list(events), "traceName": path.name}
    data = json.dumps(doc, indent=1).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path
