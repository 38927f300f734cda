"""Write a run's report: ``report.json`` beside the record, and the summary on stderr."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from stepscope.record import layout
from stepscope.record.run import RunRecord
from stepscope.report.model import Report, build_report


def save_report_json(report: Report, path: Path) -> None:
    payload = orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
                           | orjson.OPT_NON_STR_KEYS)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(payload)
    os.replace(tmp, path)


def write_report(record: RunRecord, run_dir: str | Path, *, print_summary: bool = True,
                 console: Any = None) -> Report:
    """Build the report from ``record`` (with the sampler's samples from ``run_dir``), save it, maybe print it."""
    run_dir = Path(run_dir)
    from stepscope.record.store import attach_samples

    record = attach_samples(record, run_dir)
    report = build_report(record, run_dir=run_dir)
    save_report_json(report, layout.report_path(run_dir) if record.meta.rank == 0
                     else run_dir / f"report.rank{record.meta.rank}.json")
    if print_summary:
        from stepscope.report.terminal import print_summary as show

        show(report, str(run_dir), console=console)
    return report
