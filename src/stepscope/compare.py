"""Load what ``stepscope diff`` compares: two runs (or jobs), or two traces.

:func:`diff_paths` decides from the paths: a run directory (``record.rank<N>.json.gz``) on both
sides compares runs (:mod:`stepscope.analysis.run.diff`), trace files or directories of traces on
both sides compare traces (:mod:`stepscope.analysis.trace.trace_diff`). A run's findings and MFU
are read from its ``report.json`` (the verdict the user saw); a run without one is diagnosed here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from stepscope.analysis.run.diff import FindingBrief, RunDiff, diff_runs
from stepscope.analysis.trace.trace_diff import TraceDiff, trace_diff
from stepscope.errors import InputError, UsageError
from stepscope.record import layout
from stepscope.record.run import RunRecord
from stepscope.record.store import load_job, load_record


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and bool(layout.record_ranks(path))


def _report_facts(run_dir: Path, record: RunRecord) -> tuple[list[FindingBrief], float | None, float | None]:
    """Findings, MFU and the other processes' share of the cores, from ``report.json`` (or from a
    fresh diagnosis when it is missing or damaged)."""
    path = layout.report_path(run_dir)
    data: dict[str, Any] | None = None
    if path.is_file():
        try:
            loaded = orjson.loads(path.read_bytes())
            data = loaded if isinstance(loaded, dict) else None
        except (OSError, orjson.JSONDecodeError):
            data = None
    if data is None:
        from stepscope.pipeline.diagnose import diagnose
        from stepscope.pipeline.inputs import load_run

        data = diagnose(load_run(run_dir)).to_dict()
    briefs = []
    for item in data.get("findings") or ():
        if isinstance(item, dict) and isinstance(item.get("rule_id"), str):
            severity = str(item.get("severity", "info")).lower()
            briefs.append(FindingBrief(item["rule_id"], str(item.get("title", "")),
                                       severity if severity in ("info", "low", "medium", "high", "critical") else "info"))
    evidence = data.get("evidence") if isinstance(data.get("evidence"), dict) else {}
    mfu = (evidence or {}).get("mfu")
    value = mfu.get("value") if isinstance(mfu, dict) else None
    foreign = (evidence or {}).get("foreign")
    busy = foreign.get("cpu_share") if isinstance(foreign, dict) else None
    return (briefs, float(value) if isinstance(value, (int, float)) else None,
            float(busy) if isinstance(busy, (int, float)) else None)


def history_floor(record: RunRecord, index: Path | None) -> tuple[float | None, str | None]:
    """The noise floor earlier identical runs in the run index measure (None without 3 of them)."""
    from stepscope.analysis.compare_stats import floor_from_history
    from stepscope.analysis.run.diff import setup_key
    from stepscope.record.run_index import repeats

    try:
        found = repeats(index, setup_key(record))
    except (UsageError, OSError, ValueError):
        return None, None
    times = [run.get("step_time_s") for run in found if run.get("step_time_s")]
    floor = floor_from_history(times)
    if floor is None:
        return None, None
    return floor, f"×{1 + floor:.2f}, measured on {len(times)} identical runs in the run index"


def diff_run_dirs(a: Path | list[Path], b: Path | list[Path], *, floor: float | None = None,
                  index: Path | None = None) -> RunDiff:
    """Runs compared: one directory per side (bootstrap over steps; the floor from ``--noise-floor``,
    earlier identical runs in ``index``, or the default), or several (repeats: Welch over runs)."""
    from stepscope.analysis.run.diff import diff_groups

    side_a = [a] if isinstance(a, Path) else list(a)
    side_b = [b] if isinstance(b, Path) else list(b)
    records_a = [load_record(path, with_samples=False) for path in side_a]
    records_b = [load_record(path, with_samples=False) for path in side_b]
    facts_a = [_report_facts(path, record) for path, record in zip(side_a, records_a)]
    facts_b = [_report_facts(path, record) for path, record in zip(side_b, records_b)]
    label_a = str(side_a[0]) if len(side_a) == 1 else f"{side_a[0]} (+{len(side_a) - 1} more)"
    label_b = str(side_b[0]) if len(side_b) == 1 else f"{side_b[0]} (+{len(side_b) - 1} more)"
    if len(side_a) > 1 or len(side_b) > 1:
        return diff_groups(records_a, records_b, label_a=label_a, label_b=label_b, findings_a=facts_a[0][0],
                           findings_b=facts_b[0][0], floor=floor, busy=[f[2] for f in (*facts_a, *facts_b)])
    source = None
    if floor is None:
        floor, source = history_floor(records_a[0], index)
    ranks_a = load_job(side_a[0]) if len(layout.record_ranks(side_a[0])) > 1 else ()
    ranks_b = load_job(side_b[0]) if len(layout.record_ranks(side_b[0])) > 1 else ()
    (findings_a, mfu_a, busy_a), (findings_b, mfu_b, busy_b) = facts_a[0], facts_b[0]
    return diff_runs(records_a[0], records_b[0], label_a=label_a, label_b=label_b,
                     findings_a=findings_a, findings_b=findings_b, mfu_a=mfu_a, mfu_b=mfu_b,
                     ranks_a=ranks_a, ranks_b=ranks_b, floor=floor, busy_a=busy_a, busy_b=busy_b,
                     floor_source=source)


def _trace_file(path: Path, rank: int | None) -> Path:
    from stepscope.traces.load import discover_traces

    if path.is_file():
        return path
    files = discover_traces(path)
    if not files:
        raise InputError(path, "no trace (*.json, *.json.gz, *.pt.trace.json) here; pass a trace file, "
                               "a directory of traces or a run directory")
    return Path(files[0] if rank is None else files[min(rank, len(files) - 1)])


def diff_traces(a: Path, b: Path, *, device: str = "all", rank: int | None = None,
                iterations_a: tuple[int, ...] | None = None, iterations_b: tuple[int, ...] | None = None) -> TraceDiff:
    from stepscope.traces.load import load_trace

    file_a, file_b = _trace_file(a, rank), _trace_file(b, rank)
    trace_a, trace_b = load_trace(file_a), load_trace(file_b)
    try:
        return trace_diff(trace_a.events, trace_b.events, label_a=str(file_a), label_b=str(file_b),
                          iterations_a=iterations_a, iterations_b=iterations_b, device=device)
    except UsageError as exc:
        raise UsageError(f"{file_a} vs {file_b}: {exc}") from None


def diff_paths(a: str | Path | list[Path], b: str | Path | list[Path], **options: Any) -> RunDiff | TraceDiff:
    """Runs when every path is a run directory, traces when both are traces; else a usage error."""
    side_a = [Path(item) for item in a] if isinstance(a, list) else [Path(a)]
    side_b = [Path(item) for item in b] if isinstance(b, list) else [Path(b)]
    for path in (*side_a, *side_b):
        if not path.exists():
            raise InputError(path, "no such file or directory; pass two run directories or two traces")
    runs = [is_run_dir(path) for path in (*side_a, *side_b)]
    if all(runs):
        return diff_run_dirs(side_a if len(side_a) > 1 else side_a[0], side_b if len(side_b) > 1 else side_b[0],
                             floor=options.get("floor"), index=options.get("index"))
    if any(runs):
        run = next(path for path, flag in zip((*side_a, *side_b), runs) if flag)
        other = next(path for path, flag in zip((*side_a, *side_b), runs) if not flag)
        raise UsageError(f"cannot compare a run with a trace ({run} is a run directory, {other} is not); "
                         "pass runs on both sides or traces on both sides")
    if len(side_a) > 1 or len(side_b) > 1:
        raise UsageError("traces are compared one per side (repeats are for runs)")
    return diff_traces(side_a[0], side_b[0], device=options.get("device", "all"), rank=options.get("rank"),
                       iterations_a=options.get("iterations_a"), iterations_b=options.get("iterations_b"))
