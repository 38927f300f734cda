"""Runs into the run index (:mod:`stepscope.record.run_index`): the row of a run, and a rebuild.

:func:`~stepscope.pipeline.publish.publish_run` calls :func:`index_after_run` for every run (rank 0 of a
job: the job's row);
``stepscope runs --reindex DIR`` calls :func:`reindex`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from stepscope.analysis.run.diff import setup_key
from stepscope.errors import StepscopeError, UsageError
from stepscope.record import layout
from stepscope.record.run_index import add_run, drop_missing, list_runs, tags_from_env
from stepscope.record.run import RunRecord
from stepscope.report.model import Report
from stepscope.text import printable


def row_from_report(run_dir: Path, report: Report, record: RunRecord, tags: Sequence[str] = ()) -> dict[str, Any]:
    """The index row of a run from its report and record."""

    meta = record.meta
    steady = report.evidence.steady  # the steady state the report's rules and summary used
    top = report.findings[0] if report.findings else None
    mfu = report.evidence.mfu.value if report.evidence.mfu is not None else None
    row: dict[str, Any] = {
        "run_dir": str(Path(run_dir).resolve()),
        "started_at": meta.start_wall_ns / 1e9 if meta.start_wall_ns else time.time(),
        "script": meta.target,
        "argv": " ".join(meta.argv),
        "tags": json.dumps(sorted(set(tags))),
        "host": meta.hostname,
        "git_commit": meta.git_commit,
        "torch_version": meta.torch_version,
        "world_size": meta.world_size,
        "exit_code": meta.exit_code,
        "steps": len(record.steps),
        "steady_steps": steady.steady_count if steady else 0,
        "step_time_s": steady.step_time_mean_s if steady else None,
        "step_time_median_s": steady.step_time_s if steady else None,
        "steps_per_s": steady.steady.steps_per_s if steady else None,
        "samples_per_s": steady.steady.samples_per_s if steady else None,
        "mfu": mfu,
        "top_rule": top.rule_id if top else None,
        "top_severity": top.severity.name.lower() if top else None,
        "top_title": top.title if top else None,
        "indexed_at": time.time(),
        "setup_key": setup_key(record),
        "busy_share": report.evidence.foreign.cpu_share if report.evidence.foreign is not None else None,
    }
    for phase in ("data_wait", "forward", "backward", "optimizer", "communication", "other", "compile"):
        row[phase] = steady.shares.get(phase) if steady else None
    return row


def index_after_run(run_dir: Path, report: Report, record: RunRecord, tags: Sequence[str] = ()) -> None:
    """What :func:`~stepscope.pipeline.publish.publish_run` calls: rank 0 adds the run; a failure is
    one warning line."""
    if record.meta.rank != 0:
        return
    try:
        add_run(row_from_report(run_dir, report, record, (*tags, *tags_from_env())))
    except Exception as exc:  # noqa: BLE001 - the history must never cost the run
        try:
            sys.stderr.write(printable(f"stepscope: warning: the run index could not be updated "
                                       f"({type(exc).__name__}: {exc}); set STEPSCOPE_INDEX to a writable "
                                       "file, or 'off'") + "\n")
        except (OSError, ValueError):
            pass


def reindex(run_dirs: Iterable[Path], path: Path) -> tuple[int, list[str]]:
    """Add every run directory found under ``run_dirs`` (recursively); returns (added, problems).
    Rows whose directory no longer exists are dropped."""
    from stepscope.pipeline.diagnose import diagnose
    from stepscope.pipeline.inputs import load_run

    added, problems = 0, []
    found: list[Path] = []
    for root in run_dirs:
        if not root.is_dir():
            raise UsageError(f"{root}: not a directory; pass directories that hold run directories")
        found += sorted({record.parent for record in root.rglob("record.rank*.json.gz")})
    for run_dir in found:
        if 0 not in layout.record_ranks(run_dir):
            continue
        try:
            inputs = load_run(run_dir)
            report = diagnose(inputs)
            record = inputs.record(0)
            old = [run for run in list_runs(path) if run.run_dir == str(run_dir.resolve())]
            tags = old[0].tags if old else ()
            add_run(row_from_report(run_dir, report, record, tags), path)
            added += 1
        except (StepscopeError, OSError, ValueError) as exc:
            problems.append(f"{run_dir}: {exc}")
    drop_missing(path)
    return added, problems
