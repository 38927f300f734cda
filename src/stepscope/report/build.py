"""Write a run's report: ``report.json`` beside the record, and the summary on stderr.

Neither step may end the run: a report that cannot be written (disk full, directory made
read-only) becomes one warning line, and a summary that cannot be printed (the script closed
``sys.stderr`` or file descriptor 2) is skipped.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from stepscope.record import layout
from stepscope.record.run import RunRecord
from stepscope.record.safe_write import atomic_write, json_bytes
from stepscope.report.model import Report, build_report


def save_report_json(report: Report, path: Path) -> None:
    """Write ``report.json`` atomically (see :mod:`stepscope.record.safe_write`).

    Raises:
        OSError: the file could not be written; no temporary file is left behind.
    """
    payload = json_bytes(report.to_dict(), orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
                         | orjson.OPT_NON_STR_KEYS)
    atomic_write(path, payload)


def write_report(record: RunRecord, run_dir: str | Path, *, print_summary: bool = True,
                 console: Any = None, shown_as: str | None = None, tags: Sequence[str] = ()) -> Report:
    """Build the report from ``record`` (with the sampler's samples from ``run_dir``), save it, add
    the run to the run index (:mod:`stepscope.record.run_index`, with ``tags``), maybe print it.

    ``shown_as`` is how the summary names the run directory (default: ``run_dir``).
    """
    run_dir = Path(run_dir)
    from stepscope.record.store import attach_samples

    try:
        record = attach_samples(record, run_dir)
    except Exception as exc:  # noqa: BLE001 - a damaged samples file must not cost the summary
        _warn(f"the sampler's samples could not be read ({exc}); summary without them")
    report = build_report(record, run_dir=run_dir)
    if record.meta.world_size > 1 and record.meta.rank == 0:
        report = _job_report(record, run_dir, report)
    save_report(report, run_dir, record)
    from stepscope.report.history import index_after_run

    index_after_run(run_dir, report, record, tags)
    if print_summary:
        print_report(report, shown_as or str(run_dir), console=console)
    return report


def save_report(report: Report, run_dir: Path, record: RunRecord) -> None:
    """``report.json`` (``report.rank<R>.json`` for other ranks); a write error is a warning."""
    path = layout.report_path(run_dir) if record.meta.rank == 0 else run_dir / f"report.rank{record.meta.rank}.json"
    try:
        save_report_json(report, path)
    except OSError as exc:
        _warn(f"could not write {path} ({exc.strerror or exc}); the summary below is not saved")


def print_report(report: Report, shown_as: str, console: Any = None) -> None:
    """The summary on stderr (or ``console``), unless that stream is gone."""
    if not _stream_usable(sys.stderr if console is None else None):
        return
    from stepscope.report.terminal import print_summary as show

    try:
        show(report, shown_as, console=console)
    except (OSError, ValueError):  # stderr closed or unwritable under us
        pass


def _job_report(record: RunRecord, run_dir: Path, fallback: Report) -> Report:
    """Rank 0 of a multi-rank job: wait (bounded) for the other ranks' records, then merge them all."""
    from stepscope.report.job import build_job_report, wait_for_ranks

    try:
        wait_for_ranks(run_dir, record.meta.world_size)
        return build_job_report(run_dir)
    except Exception as exc:  # noqa: BLE001 - the rank's own report is still worth printing
        _warn(f"the ranks' records could not be merged ({type(exc).__name__}: {exc}); rank 0's report only")
        return fallback


def _stream_usable(stream: Any) -> bool:
    """False when the stream the summary goes to is closed or its file descriptor is gone."""
    if stream is None:
        return True
    try:
        if stream.closed:
            return False
        descriptor = stream.fileno()
    except (OSError, ValueError, AttributeError):  # not backed by a descriptor (tests, wrappers)
        return not getattr(stream, "closed", False)
    try:
        os.fstat(descriptor)
    except OSError:
        return False
    return True


def _warn(text: str) -> None:
    """One line on stderr, if stderr can still take it."""
    try:
        sys.stderr.write(f"stepscope: warning: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
