"""Load what ``stepscope diff`` compares: two runs (or jobs), or two traces.

:func:`diff_paths` decides from the paths: a run directory (``record.rank<N>.json.gz``) on both
sides compares runs (:mod:`stepscope.analysis.run.diff`), trace files or directories of traces on
both sides compare traces (:mod:`stepscope.analysis.trace.trace_diff`). A run's findings and MFU
are read from its ``report.json`` (the verdict the user saw); a run without one is diagnosed here.
"""

from __future__ import annotations

import re
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
    same = _same_runs(side_a, side_b)
    records_a = [load_record(path, with_samples=False) for path in side_a]
    records_b = [load_record(path, with_samples=False) for path in side_b]
    facts_a = [_report_facts(path, record) for path, record in zip(side_a, records_a)]
    facts_b = [_report_facts(path, record) for path, record in zip(side_b, records_b)]
    label_a = str(side_a[0]) if len(side_a) == 1 else f"{side_a[0]} (+{len(side_a) - 1} more)"
    label_b = str(side_b[0]) if len(side_b) == 1 else f"{side_b[0]} (+{len(side_b) - 1} more)"
    if len(side_a) > 1 or len(side_b) > 1:
        return _noted(diff_groups(records_a, records_b, label_a=label_a, label_b=label_b,
                                  findings_a=facts_a[0][0], findings_b=facts_b[0][0], floor=floor,
                                  busy=[f[2] for f in (*facts_a, *facts_b)]), same)
    source = None
    if floor is None:
        floor, source = history_floor(records_a[0], index)
    ranks_a = load_job(side_a[0]) if len(layout.record_ranks(side_a[0])) > 1 else ()
    ranks_b = load_job(side_b[0]) if len(layout.record_ranks(side_b[0])) > 1 else ()
    (findings_a, mfu_a, busy_a), (findings_b, mfu_b, busy_b) = facts_a[0], facts_b[0]
    return _noted(diff_runs(records_a[0], records_b[0], label_a=label_a, label_b=label_b,
                            findings_a=findings_a, findings_b=findings_b, mfu_a=mfu_a, mfu_b=mfu_b,
                            ranks_a=ranks_a, ranks_b=ranks_b, floor=floor, busy_a=busy_a, busy_b=busy_b,
                            floor_source=source), same)


def _same_runs(side_a: list[Path], side_b: list[Path]) -> tuple[str, bool] | None:
    """A note when a run directory is on both sides (``diff A A``: its numbers are equal by
    construction, so "within noise" says nothing about the run), and whether the sides are one run."""
    keys_a = {_identity(path): path for path in side_a}
    shared = [path for path in side_b if _identity(path) in keys_a]
    if not shared:
        return None
    if len(side_a) == len(side_b) == 1:
        return (f"A and B are the same run ({shared[0]}): every change is zero by construction and "
                "'within noise' says nothing; pass another run as B"), True
    shown = ", ".join(str(path) for path in shared[:3]) + (", …" if len(shared) > 3 else "")
    return (f"{len(shared)} run(s) on both sides ({shown}): the sides are not independent; "
            "each run belongs on one side"), False


def _identity(path: Path) -> tuple[int, int] | str:
    try:
        info = path.stat()
        return info.st_dev, info.st_ino
    except OSError:
        return str(path.resolve())


def _noted(diff: RunDiff, same: tuple[str, bool] | None) -> RunDiff:
    from dataclasses import replace

    if same is None:
        return diff
    note, one_run = same
    return replace(diff, notes=(note, *diff.notes), same_run=one_run)


def _run_leftovers(path: Path) -> list[str]:
    """Files of a run in a directory without a record: a checkpoint, samples, report, lock, traces."""
    try:
        names = sorted(entry.name for entry in path.iterdir())
    except OSError:
        return []
    pattern = re.compile(r"^(record\.rank\d+\.partial\.json\.gz|samples\.rank\d+\.jsonl\.gz|"
                         r"roles\.rank\d+\.jsonl|report(\.rank\d+)?\.json|rank\d+\.lock|traces)$")
    return [name for name in names if pattern.match(name)]


def _has_traces(path: Path) -> bool:
    from stepscope.traces.load import discover_traces

    try:
        return bool(discover_traces(path))
    except InputError:
        return False


def not_a_run_dir(path: Path) -> InputError:
    """What a directory without a run record holds instead, and what reads it."""
    if layout.partial_record_ranks(path):
        return InputError(path, "not a finished run: it holds only the last checkpoint of a run that was killed "
                                f"({layout.partial_record_path(path, layout.partial_record_ranks(path)[0]).name}); "
                                f"'stepscope report {path}' reads it")
    where = [folder for folder in (path / "traces", path) if folder.is_dir() and _has_traces(folder)
             and not (folder == path and _run_leftovers(path) and not _trace_names(path))]
    missing = ("its record is missing" if _run_leftovers(path) else "no record.rank<R>.json.gz")
    if where:
        return InputError(path, f"not a run directory ({missing}); it holds profiler traces: "
                                f"'stepscope analyze {where[0]}' reads them, and 'stepscope diff' compares "
                                "two traces")
    return InputError(path, f"not a run directory ({missing}) and it holds no profiler trace; pass directories "
                            "written by 'stepscope run', or two traces")


def _trace_names(path: Path) -> list[str]:
    """Trace files of a directory, not counting a run's report.json."""
    from stepscope.traces.load import discover_traces

    try:
        return [name for name in discover_traces(path) if not Path(name).name.startswith("report")]
    except InputError:
        return []


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
    paths = (*side_a, *side_b)
    runs = [is_run_dir(path) for path in paths]
    if all(runs):
        return diff_run_dirs(side_a if len(side_a) > 1 else side_a[0], side_b if len(side_b) > 1 else side_b[0],
                             floor=options.get("floor"), index=options.get("index"))
    for path, flag in zip(paths, runs):  # a directory meant as a run (or holding no trace): say what it lacks
        if not flag and path.is_dir() and (any(runs) or _run_leftovers(path) or not _has_traces(path)):
            raise not_a_run_dir(path)
    if any(runs):
        run = next(path for path, flag in zip(paths, runs) if flag)
        other = next(path for path, flag in zip(paths, runs) if not flag)
        raise UsageError(f"cannot compare a run with a trace ({run} is a run directory, {other} is a file); "
                         "pass runs on both sides or traces on both sides")
    if len(side_a) > 1 or len(side_b) > 1:
        raise UsageError("traces are compared one per side (repeats are for runs)")
    return diff_traces(side_a[0], side_b[0], device=options.get("device", "all"), rank=options.get("rank"),
                       iterations_a=options.get("iterations_a"), iterations_b=options.get("iterations_b"))
