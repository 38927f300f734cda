"""Save and load run records.

Encoding: one gzip-compressed JSON document per rank (``record.rank<R>.json.gz``). Steps are
columns of integers; ``start_ns`` is delta-encoded (first value absolute, then differences), which
turns 19-digit timestamps into short numbers. 100k steps × 15 columns is ~5 MB of JSON before gzip
and ~1 MB after, loads in well under a second with orjson, and needs no torch or pandas. A
line-per-step format would repeat every key on every line and cost a dict per step to read back.

Versioning: ``schema_version`` is checked on load. Older versions go through :data:`MIGRATIONS`;
a newer version is an :class:`~stepscope.errors.InputError` telling the user to upgrade.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from stepscope import limits
from stepscope.errors import InputError
from stepscope.record import layout
from stepscope.safe_write import atomic_write, json_bytes
from stepscope.record.typecheck import checked_fields
from stepscope.record import code_fields
from stepscope.record.run import (
    RECORD_KIND,
    SCHEMA_VERSION,
    CaptureFacts,
    Compilation,
    CompileFacts,
    ComputeFacts,
    DeviceCopy,
    CpuPeak,
    DeviceInfo,
    GraphBreak,
    LoaderInfo,
    OpCost,
    Override,
    Overrides,
    ProfilerWindow,
    RecompileLimitHit,
    RunMeta,
    RunRecord,
    SkippedSamples,
    StepTable,
    ThreadAccount,
    ThreadInfo,
    WorkerBatches,
)

def _migrate_v1(document: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 kept capture facts in an untyped ``extra`` mapping; schema 2 has ``facts``."""
    extra = document.get("extra") or {}
    if not isinstance(extra, dict):
        extra = {}
    facts: dict[str, Any] = {"trailing_ns": extra.get("trailing_ns", 0)}
    flops = extra.get("flops")
    if isinstance(flops, dict) and "flops" in flops:
        facts["compute"] = {"step_index": flops.get("step_index", -1), "flops": flops["flops"],
                            "ops": flops.get("ops", 0)}
        if extra.get("compute_dtype"):
            facts["compute"]["matmul_flops_by_dtype"] = {str(extra["compute_dtype"]): flops["flops"]}
    peak = extra.get("cpu_matmul_peak_flops")
    if isinstance(peak, (int, float)) and peak > 0:
        facts["cpu_peak"] = {"flops_best": peak, "flops_median": peak, "source": "record"}
    upgraded = {key: value for key, value in document.items() if key != "extra"}
    upgraded.update(schema_version=2, facts=facts)
    return upgraded


#: schema_version -> function upgrading a document of that version to the next one.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _migrate_v1}

_DELTA_COLUMNS = ("start_ns",)


def record_to_document(record: RunRecord) -> dict[str, Any]:
    columns: dict[str, Any] = {}
    for name, column in record.steps.columns().items():
        values = column.astype(np.int64)
        if name in _DELTA_COLUMNS and len(values):
            values = np.concatenate(([values[0]], np.diff(values)))
        columns[name] = values.tolist()
    document = {
        "kind": RECORD_KIND,
        "schema_version": SCHEMA_VERSION,
        "meta": asdict(record.meta),
        "warnings": list(record.warnings),
        "loaders": [asdict(loader) for loader in record.loaders],
        "profiler_windows": [asdict(window) for window in record.profiler_windows],
        "steps": {"count": len(record.steps), "delta_encoded": list(_DELTA_COLUMNS), "columns": columns},
        "facts": asdict(record.facts),
    }
    for key, value in (("stack_samples", code_fields.stack_samples_to_document(record.stack_samples)),
                       ("gc_pauses", code_fields.gc_pauses_to_document(record.gc_pauses))):
        if value is not None:  # optional keys: absent when not captured
            document[key] = value
    return document


def save_record(record: RunRecord, path: str | Path) -> Path:
    """Write ``record`` atomically and return the path.

    The file is written through :func:`stepscope.safe_write.atomic_write` (unpredictable
    temporary name, no symlink followed, nothing left behind on failure). Strings that are not
    valid UTF-8 (argv or paths with undecodable bytes) are stored escaped (``\\xNN``).

    Raises:
        OSError: the file could not be written (the previous file, if any, is unchanged).
    """
    payload = json_bytes(record_to_document(record), orjson.OPT_SERIALIZE_NUMPY)
    return atomic_write(path, gzip.compress(payload, compresslevel=6, mtime=0))


def resolve_record_path(path: str | Path, rank: int | None = None) -> Path:
    """Accept a record file or a run directory (then the given rank, else the lowest)."""
    path = Path(path)
    if path.is_dir():
        ranks = layout.record_ranks(path)
        candidates = ranks or layout.partial_record_ranks(path)  # else a killed run's last checkpoint
        chosen = rank if rank is not None else candidates[0] if candidates else None
        if chosen in ranks:
            return layout.record_path(path, chosen)
        if chosen is not None and layout.partial_record_path(path, chosen).is_file():
            return layout.partial_record_path(path, chosen)  # a killed run's last checkpoint
        if not ranks:
            raise InputError(path, _no_record(path))
        raise InputError(path, f"no record for rank {chosen}; ranks present: {ranks}")
    if not path.exists():
        raise InputError(path, "no such file or directory; pass a run directory or a record file")
    return path


def _no_record(run_dir: Path) -> str:
    """What a directory without a record (or a checkpoint of one) holds instead, in one line."""
    names = {child.name for child in run_dir.iterdir()}
    if layout.REPORT_FILE in names:
        return ("no run record (record.rank<N>.json.gz): the run could not write it (its warning said why) and "
                "left no checkpoint; report.json holds its summary")
    if any(name.endswith(".lock") or name.startswith(("samples.rank", "roles.rank")) for name in names):
        return ("no run record (record.rank<N>.json.gz) and no checkpoint: the run that wrote this directory "
                "ended (was killed) before it saved one; nothing of it can be reported")
    return "no run record (record.rank<N>.json.gz) in this directory; pass a directory written by 'stepscope run'"


def load_record(path: str | Path, rank: int | None = None, *, with_samples: bool = True) -> RunRecord:
    """Load a record from a file or run directory.

    Raises:
        InputError: missing, damaged, not a record, or written by a newer stepscope.
    """
    file_path = resolve_record_path(path, rank)
    document = _read_document(file_path)
    record = document_to_record(document, file_path)
    if with_samples:
        record = attach_samples(record, file_path.parent)
    return record


def load_job(run_dir: str | Path) -> tuple[RunRecord, ...]:
    """Every rank's record in a run directory (without samples), for cross-rank rules; ``()`` when
    the path is a single record file or the directory holds fewer than two ranks."""
    path = Path(run_dir)
    if not path.is_dir():
        return ()
    ranks = layout.record_ranks(path)
    if len(ranks) < 2:
        return ()
    return tuple(load_record(path, rank, with_samples=False) for rank in ranks)


def _read_document(path: Path) -> dict[str, Any]:
    """The record's JSON document; bounded by :func:`stepscope.limits.max_bytes` decompressed."""
    data = limits.read_gzip_or_plain(path, limits.max_bytes(), "run record")
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InputError(path, f"not valid JSON ({exc}); the record is damaged") from None
    if not isinstance(document, dict) or document.get("kind") != RECORD_KIND:
        raise InputError(path, "not a stepscope run record")
    return document


def document_to_record(document: dict[str, Any], path: str | Path = "<record>") -> RunRecord:
    version = document.get("schema_version")
    if not isinstance(version, int) or version < 1:
        raise InputError(path, f"invalid schema_version {version!r}; the record is damaged")
    if version > SCHEMA_VERSION:
        raise InputError(
            path,
            f"written with record schema {version}, newer than this stepscope understands "
            f"({SCHEMA_VERSION}); upgrade stepscope (pip install -U stepscope)",
        )
    try:
        while version < SCHEMA_VERSION:
            document = MIGRATIONS[version](document)
            version = document["schema_version"]
        record = _build(document)
        record.check()
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise InputError(path, f"malformed run record ({type(exc).__name__}: {exc})") from None
    return record


def _build(document: dict[str, Any]) -> RunRecord:
    meta_data = dict(_known(RunMeta, document["meta"]))
    meta_data["devices"] = tuple(DeviceInfo(**_known(DeviceInfo, item)) for item in meta_data.get("devices", ()))
    meta_data["argv"] = tuple(meta_data.get("argv", ()))
    meta = RunMeta(**_known(RunMeta, meta_data))
    steps_doc = document["steps"]
    columns = dict(steps_doc["columns"])
    for name in steps_doc.get("delta_encoded", ()):
        columns[name] = np.cumsum(np.asarray(columns[name], dtype=np.int64))
    steps = StepTable.from_columns(columns)
    if len(steps) != int(steps_doc.get("count", len(steps))):
        raise ValueError("step count does not match the columns")
    loaders = tuple(
        LoaderInfo(**{**_known(LoaderInfo, item), "worker_pids": tuple(item.get("worker_pids", ()))})
        for item in document.get("loaders", ())
    )
    windows = tuple(ProfilerWindow(**_known(ProfilerWindow, item)) for item in document.get("profiler_windows", ()))
    return RunRecord(
        meta=meta,
        steps=steps,
        loaders=loaders,
        warnings=tuple(str(item) for item in document.get("warnings", ())),
        profiler_windows=windows,
        facts=_facts(document.get("facts") or {}),
        stack_samples=code_fields.stack_samples_from_document(document.get("stack_samples")),
        gc_pauses=code_fields.gc_pauses_from_document(document.get("gc_pauses")),
    )


def facts_from_v1_extra(extra: dict[str, Any]) -> CaptureFacts:
    """The typed facts a schema-1 ``extra`` mapping becomes (migration, and tests' shorthand)."""
    return _facts(_migrate_v1({"schema_version": 1, "extra": extra})["facts"])


def _facts(data: dict[str, Any]) -> CaptureFacts:
    compute = data.get("compute")
    peak = data.get("cpu_peak")
    peak_bf16 = data.get("cpu_peak_bf16")
    return CaptureFacts(
        compute=None if compute is None else ComputeFacts(**{
            **_known(ComputeFacts, compute),
            "matmul_flops_by_dtype": {str(key): int(value)
                                      for key, value in dict(compute.get("matmul_flops_by_dtype") or {}).items()},
            "param_dtypes": tuple(str(item) for item in compute.get("param_dtypes", ())),
            "copies": tuple(DeviceCopy(**_known(DeviceCopy, item)) for item in compute.get("copies", ()) or ()),
        }),
        cpu_peak=None if peak is None else CpuPeak(**_known(CpuPeak, peak)),
        cpu_peak_bf16=None if peak_bf16 is None else CpuPeak(**_known(CpuPeak, peak_bf16)),
        op_cost=None if data.get("op_cost") is None else OpCost(**_known(OpCost, data["op_cost"])),
        trailing_ns=int(data.get("trailing_ns", 0)),
        inference=bool(data.get("inference", False)),
        model_forwards=int(data.get("model_forwards", 0)),
        model_forwards_no_grad=int(data.get("model_forwards_no_grad", 0)),
        child_pids=tuple(int(pid) for pid in data.get("child_pids", ()) or ()),
        children_cpu_s=None if data.get("children_cpu_s") is None else float(data["children_cpu_s"]),
        main_cpu_s=None if data.get("main_cpu_s") is None else float(data["main_cpu_s"]),
        training_in_children=bool(data.get("training_in_children", False)),
        overrides=_overrides(data.get("overrides")),
        compile=_compile(data.get("compile")),
        skipped_samples=tuple(
            SkippedSamples(**{**_known(SkippedSamples, {k: v for k, v in dict(item).items() if k != "by_process"}),
                              "by_process": tuple(int(count) for count in item.get("by_process", ()) or ())})
            for item in data.get("skipped_samples", ()) or ()),
        thread_account=_thread_account(data.get("thread_account")),
        worker_batches=_worker_batches(data.get("worker_batches")),
    )


def _worker_batches(data: Any) -> WorkerBatches | None:
    """``facts.worker_batches`` (absent in records written before it, and where nothing was timed)."""
    if data is None:
        return None
    checked = _known(WorkerBatches, dict(data))
    return WorkerBatches(**{name: tuple(int(value) for value in checked.get(name, ()) or ())
                            for name in WorkerBatches.COLUMNS})


def _thread_account(data: Any) -> ThreadAccount | None:
    """``facts.thread_account`` (absent in records written before it, and where it was not measured)."""
    if data is None:
        return None
    checked = _known(ThreadAccount, {key: value for key, value in dict(data).items() if key != "threads"})
    tables = {name: tuple(tuple(int(value) for value in row) for row in checked.get(name, ()))
              for name in ("wall_ns", "cpu_ns", "runq_ns", "process_cpu_ns")}
    threads = tuple(ThreadInfo(**_known(ThreadInfo, dict(item))) for item in data.get("threads", ()) or ())
    return ThreadAccount(**{**checked, **tables, "steps": tuple(int(step) for step in checked.get("steps", ())),
                            "threads": threads,
                            "peer_runq_ns": tuple(int(value) for value in checked.get("peer_runq_ns", ()) or ()),
                            "waits": tuple((int(step), int(phase), int(kind), int(count))
                                           for step, phase, kind, count in checked.get("waits", ()) or ())})


def _compile(data: Any) -> CompileFacts | None:
    """``facts.compile`` (absent in records written before it, and when nothing was compiled)."""
    if data is None:
        return None
    return CompileFacts(
        sources=tuple(str(item) for item in data.get("sources", ()) or ()),
        compilations=tuple(Compilation(**_known(Compilation, dict(item))) for item in data.get("compilations", ()) or ()),
        graph_breaks=tuple(GraphBreak(**_known(GraphBreak, dict(item))) for item in data.get("graph_breaks", ()) or ()),
        limit_hits=tuple(RecompileLimitHit(**_known(RecompileLimitHit, dict(item)))
                         for item in data.get("limit_hits", ()) or ()),
        recompile_limit=None if data.get("recompile_limit") is None else int(data["recompile_limit"]),
        counters=dict(data.get("counters") or {}))


def _overrides(data: Any) -> Overrides | None:
    """``facts.overrides`` (absent in records written before it existed)."""
    if data is None:
        return None
    checked = _known(Overrides, {key: value for key, value in dict(data).items() if key != "settings"})
    settings = tuple(Override(**{**_known(Override, {k: v for k, v in dict(item).items() if k != "skipped"}),
                                 "skipped": tuple(str(line) for line in item.get("skipped", ()))})
                     for item in data.get("settings", ()))
    return Overrides(**checked, settings=settings)


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The fields ``cls`` declares (forward compatibility within one schema version), type-checked."""
    return checked_fields(cls, data)


def attach_samples(record: RunRecord, run_dir: Path) -> RunRecord:
    """The record with the sidecar sampler's samples, when its file is in ``run_dir``."""
    from dataclasses import replace

    from stepscope.record.samples import load_samples

    samples_file = layout.samples_path(run_dir, record.meta.rank)
    if not samples_file.exists():
        return record
    return replace(record, samples=load_samples(samples_file))
