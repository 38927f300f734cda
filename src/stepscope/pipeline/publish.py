"""The end of a run: diagnose it, write ``report.json`` beside the record, add it to the run index,
print the summary on stderr.

None of these may end the run: a report that cannot be written (disk full, directory made
read-only) becomes one warning line, and a summary that cannot be printed (the script closed
``sys.stderr`` or file descriptor 2) is skipped. Rank 0 of a job waits (bounded) for the other
ranks' records and writes the job's merged report; the other ranks write their own
(``report.rank<R>.json``). When the job's records cannot be merged, rank 0's own report is kept.
When a rank of the job failed, the last rank to finish merges instead (``merge``, decided by
:mod:`stepscope.capture.job_end`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from stepscope.pipeline.diagnose import diagnose
from stepscope.pipeline.inputs import JobInputs, inputs_after_run
from stepscope.record import layout
from stepscope.record.run import RunRecord
from stepscope.report.model import Report
from stepscope.report.render import Output, render
from stepscope.text import printable


def publish_run(record: RunRecord, run_dir: str | Path, *, print_summary: bool = True, stream: IO[str] | None = None,
                shown_as: str | None = None, tags: Sequence[str] = (), merge: bool | None = None,
                hurry: Callable[[], bool] | None = None) -> Report:
    """Diagnose the run that just ended (see the module docstring) and return its report.

    ``shown_as`` is how the summary names the run directory (default: ``run_dir``); ``stream``
    where the summary goes instead of stderr; ``merge`` whether this rank merges the job's ranks
    (default: rank 0 does) and ``hurry`` when to cut its wait for them short.
    """
    run_dir = Path(run_dir)
    try:
        report = diagnose(inputs_after_run(record, run_dir, merge=merge, hurry=hurry))
    except Exception as exc:  # noqa: BLE001 - the rank's own report is still worth printing
        if record.meta.world_size <= 1 or not _merges(record, merge):
            raise
        _warn(f"the ranks' records could not be merged ({type(exc).__name__}: {exc}); rank 0's report only")
        report = diagnose(JobInputs("run", (record,), run_dir=run_dir))
    save_report(report, run_dir, record, merged=_merges(record, merge), summary_follows=print_summary)
    from stepscope.pipeline.history import index_after_run

    index_after_run(run_dir, report, record, tags)
    if print_summary:
        print_report(report, shown_as or str(run_dir), stream=stream)
    return report


def _merges(record: RunRecord, merge: bool | None) -> bool:
    return record.meta.rank == 0 if merge is None else merge


def save_report(report: Report, run_dir: Path, record: RunRecord, merged: bool | None = None,
                summary_follows: bool = False) -> None:
    """``report.json`` (a run, or the job's merged report; ``report.rank<R>.json`` for a rank's own
    report); a write error is a warning (which says the summary is not saved when one follows)."""
    whole = record.meta.world_size <= 1 or _merges(record, merged)
    path = layout.report_path(run_dir) if whole else run_dir / f"report.rank{record.meta.rank}.json"
    try:
        render(report, "json", Output(path=path))
    except OSError as exc:
        _warn(f"could not write {path} ({exc.strerror or exc})"
              + ("; the summary below is not saved" if summary_follows else "; the diagnosis is not saved"))


def print_report(report: Report, shown_as: str, stream: IO[str] | None = None) -> None:
    """The summary on stderr (or on ``stream``), unless that stream is gone."""
    target = sys.stderr if stream is None else stream
    if not _stream_usable(target):
        return
    try:
        render(report, "text", Output(stream=target, run_dir=shown_as))
    except (OSError, ValueError):  # stderr closed or unwritable under us
        pass


def _stream_usable(stream: Any) -> bool:
    """False when the stream the summary goes to is closed or its file descriptor is gone."""
    if stream is None:
        return False
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
        sys.stderr.write(f"{printable(f'stepscope: warning: {text}')}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


__all__ = ["print_report", "publish_run", "save_report"]
