"""The library API: capture from inside your own code (``stepscope.profile``).

It lives outside :mod:`stepscope.capture` because it also writes the report at the end, and capture
imports only the record layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stepscope.capture.session import CaptureSession


@contextlib.contextmanager
def profile(out: str | Path | None = None, *, sample_interval_s: float | None = 0.1,
            summary: bool = True, profiler: Any = None, force: bool = False) -> Iterator[CaptureSession]:
    """Capture the enclosed block like ``stepscope run`` would (library API).

    Args:
        out: run directory (default: ``./stepscope-runs/<timestamp>-api``).
        sample_interval_s: sidecar sampling period, or ``None`` for no sidecar.
        summary: print the terminal summary to stderr at the end.
        profiler: optional stepscope profiler driven with the captured phases.
        force: replace another run's files in ``out`` (otherwise such a directory is refused).

    Yields:
        The :class:`CaptureSession` (``wrap()``, ``step()``, ``phase()``; ``.record`` after exit).
    """
    from stepscope.capture.rundir import default_run_dir

    session = CaptureSession(out or default_run_dir("api"), target="api", mode="api",
                             sample_interval_s=sample_interval_s, profiler=profiler, force=force,
                             derived=out is None)
    session.start()
    exception = None
    try:
        yield session
    except BaseException as exc:
        exception = type(exc).__name__
        raise
    finally:
        record = session.stop(exception=exception)
        if record is not None:
            from stepscope.pipeline.publish import publish_run

            publish_run(record, session.run_dir, print_summary=summary)


__all__ = ["profile"]
