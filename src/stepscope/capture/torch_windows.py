"""A short torch.profiler window during `stepscope run --trace`.

torch.profiler costs 1.5–2.5× on a step and produces large traces, so it never runs for a whole
run: one window of :data:`WINDOW_STEPS` steps starts after warm-up and after the FLOP-counted
step (preceded by one profiler warm-up step, so the recorded steps carry ``ProfilerStep#N``
ranges as torch.profiler's schedule makes them), and its Chrome trace is exported when the run ends (export takes seconds; doing it at the
window's end would stall a training step). Steps inside the window are left out of the step
statistics (``record.profiler_windows``). Failures become one warning.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from stepscope.capture.recorder import NEVER
from stepscope.capture.warn import WarningSink
from stepscope.record.run import ProfilerWindow

#: First step inside the window (0-based), and its length.
WINDOW_FIRST_STEP = 6
WINDOW_STEPS = 3


class TraceWindow:
    def __init__(self, trace_dir: Path, rank: int, warnings: WarningSink,
                 first_step: int = WINDOW_FIRST_STEP, steps: int = WINDOW_STEPS):
        self.trace_dir = Path(trace_dir)
        self.rank = rank
        self.warn = warnings
        self.first_step = first_step
        self.steps = steps
        self._profiler: Any = None
        self._last_step: int | None = None
        self.window: ProfilerWindow | None = None

    def on_commit(self, index: int) -> int:
        """After committed step ``index``; returns the next index it must be called at."""
        if self._profiler is None and self._last_step is None and index == self.first_step - 2:
            self._start()
        elif self._profiler is not None and self._last_step is None:
            if index >= self.first_step + self.steps - 1:
                self._stop(index)
            else:
                self._step()
        if self._last_step is not None:
            return NEVER
        if self._profiler is None and index < self.first_step - 2:
            return self.first_step - 2
        return index + 1

    def _step(self) -> None:
        """Mark a step boundary in the trace (``ProfilerStep#N`` ranges, as analyses expect)."""
        try:
            self._profiler.step()
        except Exception as exc:  # noqa: BLE001
            self.warn.once("trace-step", f"torch.profiler step marker failed ({type(exc).__name__}: {exc})")

    def _start(self) -> None:
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                activities.append(ProfilerActivity.CUDA)
            from torch.profiler import schedule

            self._profiler = profile(activities=activities, record_shapes=True,
                                     schedule=schedule(wait=0, warmup=1, active=self.steps, repeat=1))
            self._profiler.start()
        except Exception as exc:  # noqa: BLE001
            self._profiler = None
            self._last_step = -1
            self.warn.once("trace", f"torch.profiler window not started ({type(exc).__name__}: {exc})")

    def _stop(self, index: int) -> None:
        try:
            self._profiler.stop()
            self._last_step = index
        except Exception as exc:  # noqa: BLE001
            self._profiler = None
            self._last_step = -1
            self.warn.once("trace", f"torch.profiler window failed ({type(exc).__name__}: {exc})")

    def close(self) -> ProfilerWindow | None:
        """Stop a window still open and export the trace (end of run)."""
        profiler = self._profiler
        if profiler is None:
            return None
        self._profiler = None
        try:
            if self._last_step is None:  # the run ended inside the window
                profiler.stop()
                self._last_step = self.first_step + self.steps - 1
            self.trace_dir.mkdir(parents=True, exist_ok=True)
            path = self.trace_dir / f"rank{self.rank}.steps{self.first_step}-{self._last_step}.pt.trace.json"
            _export_whole(profiler, path)
            # the profiler's warm-up step is disturbed too: the window starts there
            self.window = ProfilerWindow(first_step=self.first_step - 1, last_step=self._last_step,
                                         trace_path=str(path.relative_to(self.trace_dir.parent)))
        except Exception as exc:  # noqa: BLE001
            self.warn.once("trace", f"torch.profiler trace not exported ({type(exc).__name__}: {exc})")  # one line
        return self.window


def _export_whole(profiler: Any, path: Path) -> None:
    """Export the Chrome trace under a temporary name, synced, then renamed into place: a process
    killed (or a disk that fills) during the export leaves no half-written trace under its final
    name — at worst a ``.NAME.<random>.tmp`` that no reader picks up."""
    import secrets

    from stepscope.safe_write import sync_directory, unfinished

    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    # torch writes its own temporary beside the name it is given and renames it when whole; a write
    # that fails (a full disk) is one line on stderr, the export returns, and its temporary stays
    staging = tmp.with_name(tmp.name + ".tmp")
    with unfinished(tmp, staging):
        _export_into_place(profiler, tmp, staging, path)
    sync_directory(path.parent)


def _export_into_place(profiler: Any, tmp: Path, staging: Path, path: Path) -> None:
    try:
        profiler.export_chrome_trace(str(tmp))
        if not tmp.exists():
            raise _failed_write(path)
        descriptor = os.open(tmp, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(tmp, path)
    except BaseException as exc:
        for leftover in (tmp, staging):  # a half-written trace holds the space the record needs
            try:
                os.unlink(leftover)
            except OSError:
                pass
        _release_results(profiler)
        if isinstance(exc, OSError) and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, str(path)) from None  # the name not written, not the temporary
        raise


def _release_results(profiler: Any) -> None:
    """Drop the profiler's results after a failed export: they keep torch's temporary open, so
    unlinked it would hold its space until the garbage collector frees the profiler (which a
    reference cycle through the export's traceback can put off past the record's write)."""
    inner = getattr(profiler, "profiler", None)
    if inner is not None and getattr(inner, "kineto_results", None) is not None:
        try:
            inner.kineto_results = None
        except Exception:  # noqa: BLE001 - another torch's profiler: the garbage collector frees it
            pass


#: Free bytes under which a write torch could not finish is put down to a full disk.
FULL_DISK_BYTES = 1 << 20


def _failed_write(path: Path) -> OSError:
    """The error of an export torch could not write: the disk is full (``ENOSPC``) when it has
    almost no space left, else an I/O error."""
    try:
        stats = os.statvfs(path.parent)
        full = stats.f_bavail * stats.f_frsize < FULL_DISK_BYTES
    except OSError:
        full = False
    code = errno.ENOSPC if full else errno.EIO
    return OSError(code, os.strerror(code) if full else "torch.profiler could not write it", str(path))
