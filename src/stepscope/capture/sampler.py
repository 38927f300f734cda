"""The sidecar sampler: a separate process that samples the machine beside a training run.

``stepscope run`` calls :func:`start_sidecar` with the training process's pid; the sidecar runs
``python -m stepscope.capture.sampler`` in its own session, samples at a fixed rate (10 Hz by
default) and appends to ``layout.samples_path(run_dir, rank)`` (format: :mod:`stepscope.record.samples`).
Being another process, it costs the training process no GIL time and keeps recording when training
hangs. It stops:

- when the training process is gone (checked at every sample, pid and start time),
- on SIGTERM or SIGINT (:meth:`Sidecar.stop` sends SIGTERM), after one last sample and a flush.

Its own session keeps a Ctrl-C in the terminal away from it: the training process decides what a
Ctrl-C means, and ``stepscope run`` stops the sidecar when the script is done.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepscope.capture.foreign import ForeignScan, job_root
from stepscope.capture.gpu import GpuProbe, open_gpus
from stepscope.capture.system import ProcessTree, SystemProbe
from stepscope.errors import UsageError
from stepscope.record import layout
from stepscope.record.samples import CLOCK, SamplesWriter
from stepscope.text import say

DEFAULT_INTERVAL_S = 0.1
#: Memory, swap, network and per-process I/O counters are read at this period (2 Hz); CPU per
#: core and per process, the run queue, disk counters (from /proc) and GPU utilization at every sample.
SLOW_EVERY_S = 0.5
#: GPU clocks, power, temperature and per-process memory are read at this period (see capture/gpu.py).
GPU_SLOW_EVERY_S = 1.0
FLUSH_EVERY_S = 1.0  # one gzip member per second: at most this much is lost if the sampler is killed
_MAX_SLEEP_S = 0.1  # sleep in slices so a stop request is seen quickly at long intervals


class SystemSampler:
    """Takes one sample of the machine, a process tree and the GPUs.

    Args:
        target_pid: the training process (root of the tree), or ``None`` for every process.
        roles_path: the roles file the training process writes (DataLoader worker pids).
        gpu: a :class:`GpuProbe`, ``None`` for no GPU metrics, or ``"auto"`` to open NVML.
        with_io: read per-process I/O counters.
        use_procfs: force (True) or forbid (False) the /proc fast path; default: when available.
        interval_s: the sampling interval; memory, swap, disk, network and per-process I/O
            counters are read about every :data:`SLOW_EVERY_S` seconds (repeated in between).
    """

    def __init__(self, target_pid: int | None, roles_path: Path | None = None, *,
                 gpu: GpuProbe | None | str = "auto", with_io: bool = True, use_procfs: bool | None = None,
                 interval_s: float = DEFAULT_INTERVAL_S):
        self.target_pid = target_pid
        slow_every = max(1, round(SLOW_EVERY_S / interval_s))
        self.system = SystemProbe(use_procfs, slow_every=slow_every)
        self.tree = ProcessTree(target_pid, roles_path, with_io=with_io, use_procfs=use_procfs, io_every=slow_every)
        self.notes: list[str] = []  # new notes, for the caller to write and empty
        if gpu == "auto":
            gpu, note = open_gpus(slow_every=max(1, round(GPU_SLOW_EVERY_S / interval_s)))
            if note:
                self.notes.append(note)
        self.gpu: GpuProbe | None = gpu  # type: ignore[assignment]
        self._failures: set[str] = set()
        self.foreign = (ForeignScan(self.tree.known_pids, job_root=job_root(target_pid, dict(os.environ)))
                        if target_pid is not None else None)

    def header(self, **extra: Any) -> dict[str, Any]:
        return {
            "clock": CLOCK, "target_pid": self.target_pid, "sampler_pid": os.getpid(),
            "hostname": socket.gethostname(), "start_ns": time.monotonic_ns(), "start_wall_ns": time.time_ns(),
            **self.system.info(), "gpus": self.gpu.info() if self.gpu else [], **extra,
        }

    def sample(self, final: bool = False) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """``(sample, events)``; the sample is ``None`` if reading the machine failed (noted once).
        ``final``: the last sample of a stop on request (processes outside the tree are scanned
        once more)."""
        ts_ns = time.monotonic_ns()
        events: list[dict[str, Any]] = []
        try:
            sample: dict[str, Any] | None = {"ts_ns": ts_ns, **self.system.sample()}
        except Exception as exc:  # noqa: BLE001 - the sampler must outlive one bad reading
            self._fail(f"machine counters could not be read ({type(exc).__name__}: {exc})")
            sample = None
        try:
            proc, events = self.tree.sample(ts_ns)
            if sample is not None:
                sample["proc"] = proc
                if self.target_pid is not None:
                    sample["tree_unseen_cpu_ticks"] = self.tree.unseen_ticks
        except Exception as exc:  # noqa: BLE001
            self._fail(f"the process tree could not be read ({type(exc).__name__}: {exc})")
        if self.gpu is not None and sample is not None:
            sample.update(self.gpu.sample())
            self.notes += self.gpu.notes
            self.gpu.notes.clear()
        if self.foreign is not None:
            try:
                events += self.foreign.poll(final)
            except Exception as exc:  # noqa: BLE001
                self._fail(f"other processes could not be scanned ({type(exc).__name__}: {exc})")
                self.foreign = None
        events += [{"type": "note", "ts_ns": ts_ns, "text": text} for text in self.notes]
        self.notes.clear()
        return sample, events

    @property
    def target_alive(self) -> bool:
        return self.target_pid is None or self.tree.target_alive

    def close(self) -> None:
        self.system.close()
        self.tree.close()
        if self.gpu is not None:
            self.gpu.close()

    def _fail(self, text: str) -> None:
        if text not in self._failures:
            self._failures.add(text)
            self.notes.append(text)


def run_sampler(sampler: SystemSampler, writer: SamplesWriter, interval_s: float,
                should_stop: Callable[[], bool], *, flush_every_s: float = FLUSH_EVERY_S,
                max_samples: int | None = None, sleep: Callable[[float], object] = time.sleep) -> int:
    """Sample at a fixed rate until ``should_stop()``, the target ends, or ``max_samples``.

    Ticks are on a fixed grid (``start + k × interval``); a tick missed because sampling was slow
    (an overloaded machine) is skipped rather than taken late, so samples stay evenly spaced.
    A last sample is taken when stopping on request. Returns the number of samples written.
    ``sleep`` waits between ticks; the sidecar passes one that a stop signal ends at once.
    """
    taken = 0
    next_tick = last_flush = time.monotonic()
    while True:
        stopping = should_stop()
        sample, events = sampler.sample(stopping)
        for event in events:
            writer.add_event(event)
        if sample is not None:
            writer.add(sample)
            taken += 1
        if stopping or not sampler.target_alive or (max_samples is not None and taken >= max_samples):
            break
        now = time.monotonic()
        if now - last_flush >= flush_every_s:
            writer.flush()
            last_flush = now
        next_tick += interval_s
        if next_tick < now:
            next_tick += (now - next_tick) // interval_s * interval_s + interval_s
        while not should_stop() and (remaining := next_tick - time.monotonic()) > 0:
            sleep(min(remaining, _MAX_SLEEP_S))
    writer.flush()
    return taken


class Sidecar:
    """Handle on a running sidecar sampler (see :func:`start_sidecar`).

    ``warnings`` collects what went wrong with the sidecar itself (it could not start, it failed,
    it had to be killed), for ``stepscope run`` to copy into the record. What the sidecar could not
    measure (no GPU, ...) is noted inside the samples file instead.
    """

    def __init__(self, process: subprocess.Popen[bytes] | None, path: Path, stderr: Any = None,
                 notes: list[str] | None = None):
        self.process = process
        self.path = path
        self.warnings: list[str] = list(notes or ())
        self._stderr = stderr
        self._stopped = process is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the sidecar to flush and exit; wait for it. Never raises: problems become warnings."""
        if self._stopped:
            return
        self._stopped = True
        process = self.process
        assert process is not None
        try:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    _wait_exit(process, timeout_s)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5.0)
                    self._warn(f"sampler did not stop within {timeout_s:g} s and was killed; "
                               "its last second of samples may be missing")
                    return
            if process.returncode == -signal.SIGTERM:  # stopped before its handlers were set up
                self.warnings.append("the run ended before the sampler took its first sample")
            elif process.returncode != 0:
                self._warn(f"sampler exited with code {process.returncode}: {self._stderr_tail()}")
        except Exception as exc:  # noqa: BLE001 - stopping the sampler must not break the run
            self._warn(f"could not stop the sampler cleanly ({type(exc).__name__}: {exc})")
        finally:
            if self._stderr is not None:
                self._stderr.close()

    def _stderr_tail(self) -> str:
        try:
            self._stderr.seek(0)
            lines = self._stderr.read().decode(errors="replace").strip().splitlines()
            return lines[-1] if lines else "no error message"
        except (OSError, AttributeError, ValueError):
            return "no error message"

    def _warn(self, text: str) -> None:
        from stepscope.capture.warn import emit

        self.warnings.append(text)
        emit(text)


def _wait_exit(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """``process.wait(timeout_s)``, woken by the exit itself where Linux gives a pidfd (``Popen.wait``
    polls with sleeps growing to 50 ms: up to 50 ms more at the end of every run)."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        process.wait(timeout=timeout_s)
        return
    try:
        if not select.select([pidfd], [], [], timeout_s)[0]:
            raise subprocess.TimeoutExpired(process.args, timeout_s)
    finally:
        os.close(pidfd)
    process.wait(timeout=timeout_s)


def start_sidecar(run_dir: Path, target_pid: int, rank: int, interval_s: float = DEFAULT_INTERVAL_S) -> Sidecar:
    """Start the sampler process for ``target_pid``, writing ``layout.samples_path(run_dir, rank)``.

    ``run_dir`` must exist. The sidecar reads ``layout.roles_path(run_dir, rank)`` for the pids of
    DataLoader workers. Returns at once (the sidecar imports and starts on its own, in about 0.2 s
    of its own CPU). If it cannot be started, the returned :class:`Sidecar` is inert and its
    ``warnings`` say why (a CaptureWarning is issued too).

    Raises:
        UsageError: ``interval_s`` is not positive.
    """
    check_interval(interval_s)
    run_dir = Path(run_dir).absolute()
    path = layout.samples_path(run_dir, rank)
    command = [sys.executable, "-m", "stepscope.capture.sampler", "--run-dir", str(run_dir),
               "--pid", str(target_pid), "--rank", str(rank), "--interval", repr(float(interval_s))]
    stderr = None
    try:
        stderr = tempfile.TemporaryFile(prefix="stepscope-sampler-")
        # cwd: the run directory, so modules in the user's project cannot shadow the sampler's imports
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                   env=_sidecar_environment(), cwd=run_dir, start_new_session=True, close_fds=True)
    except OSError as exc:
        if stderr is not None:
            stderr.close()
        sidecar = Sidecar(None, path)
        sidecar._warn(f"sampler could not start ({exc}); no machine metrics for this run")
        return sidecar
    return Sidecar(process, path, stderr)


def _sidecar_environment() -> dict[str, str]:
    """The caller's environment, plus the directory stepscope was imported from when it is not an
    installed site (a source checkout on ``sys.path``), so ``-m stepscope.capture.sampler`` finds it."""
    import site

    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    sites = {str(Path(item).resolve()) for item in (*site.getsitepackages(), site.getusersitepackages())}
    if package_root not in sites:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (package_root, env.get("PYTHONPATH"))))
    return env


def check_interval(interval_s: float) -> None:
    if not interval_s > 0:
        raise UsageError(f"sampling interval must be a positive number of seconds, got {interval_s!r}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the sidecar process (``python -m stepscope.capture.sampler``)."""
    parser = argparse.ArgumentParser(prog="stepscope.capture.sampler", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--pid", type=int, required=True, help="training process to follow")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S)
    parser.add_argument("--flush-every", type=float, default=FLUSH_EVERY_S)
    args = parser.parse_args(argv)
    check_interval(args.interval)
    stop, sleep = _install_stop_handlers()
    sampler = SystemSampler(args.pid, layout.roles_path(args.run_dir, args.rank), interval_s=args.interval)
    writer = None
    try:
        writer = SamplesWriter(layout.samples_path(args.run_dir, args.rank),
                               sampler.header(rank=args.rank, interval_s=args.interval))
        run_sampler(sampler, writer, args.interval, stop, flush_every_s=args.flush_every, sleep=sleep)
        writer.close()
    except OSError as exc:  # disk full, directory made read-only, a name already taken
        say(f"could not write the samples ({exc}); the samples written before are kept")
        return 1
    finally:
        if writer is not None:
            try:
                writer.close()
            except OSError:
                pass
        sampler.close()
    return 0


def _install_stop_handlers() -> tuple[Callable[[], bool], Callable[[float], object]]:
    """(stop requested?, a sleep that a stop signal ends at once).

    The signal's wakeup file descriptor wakes the ``select`` the sleep waits in: a plain
    ``time.sleep`` is resumed after the handler (PEP 475), so the last sample and the exit would
    wait for the end of the slice, and the training process waits for the sidecar."""
    requested: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        requested.append(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, handler)
    try:
        read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (AttributeError, OSError, ValueError):
        return lambda: bool(requested), time.sleep

    def sleep(seconds: float) -> None:
        if not requested and select.select([read_fd], [], [], seconds)[0]:
            try:
                os.read(read_fd, 512)
            except BlockingIOError:
                pass

    return lambda: bool(requested), sleep


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the samples are closed: nothing is left for the interpreter's teardown to do
