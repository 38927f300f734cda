"""Processes outside the job: who else used the CPU while the run trained.

The sidecar follows the training tree closely (:class:`~stepscope.capture.system.ProcessTree`);
this scan looks at every other process, rarely (every :data:`SCAN_EVERY_S`), so that a report can
name the neighbours that crowded the machine by pid and share of a core. One scan reads
``/proc/<pid>/stat`` of every process (a few ms for a few hundred processes: ~0.2 % of a core at
the default period) and emits the busiest ones since the previous scan as one ``foreign`` event:
``{"type": "foreign", "ts_ns", "interval_s", "procs": [[pid, name, cores], ...], "others_cores",
"job_cores"}`` — ``others_cores`` the mean cores of every process outside the job, ``job_cores``
(present under an elastic launcher) those of the job's other processes: the launcher and the other
ranks of this machine, which are the job's own and never named among ``procs``.
Without ``/proc`` (not Linux) it emits nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

#: Seconds between two scans of every process.
SCAN_EVERY_S = 2.0
#: Processes reported per scan (the busiest first).
TOP = 5
#: A process below this share of one core over a scan is not worth naming.
MIN_CORES = 0.05
#: The sampler's last sample scans once more when at least this long has passed since the previous
#: scan: a run shorter than :data:`SCAN_EVERY_S` still names its neighbours.
FINAL_MIN_S = 0.5


class ForeignScan:
    """Emits the busiest processes outside ``exclude()`` about every :data:`SCAN_EVERY_S`.

    Args:
        exclude: returns the pids not to report (the training tree, the sampler itself).
        clock: monotonic nanoseconds (tests pass a fake one).
        proc_root: where ``/proc`` is (tests pass a fake tree).
    """

    def __init__(self, exclude: Callable[[], Iterable[int]], clock: Callable[[], int] = time.monotonic_ns,
                 proc_root: str = "/proc", every_s: float = SCAN_EVERY_S, job_root: int | None = None):
        self.exclude = exclude
        self.job_root = job_root
        self.clock = clock
        self.proc_root = proc_root
        self.every_ns = int(every_s * 1e9)
        self.tick_s = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
        self._last_ns: int | None = None
        self._ticks: dict[tuple[int, str], int] = {}
        self._parents: dict[int, int] = {}
        self.enabled = os.path.isdir(proc_root)

    def poll(self, final: bool = False) -> list[dict[str, Any]]:
        """The ``foreign`` event when a scan is due (the first scan only sets the baseline);
        ``final``: the sampler's last sample, due after :data:`FINAL_MIN_S`."""
        now = self.clock()
        every = int(FINAL_MIN_S * 1e9) if final else self.every_ns
        if not self.enabled or (self._last_ns is not None and now - self._last_ns < every):
            return []
        ticks = self._read_all()
        previous, last = self._ticks, self._last_ns
        self._ticks, self._last_ns = ticks, now
        if last is None:
            return []
        interval_s = (now - last) / 1e9
        skip = set(self.exclude()) | {os.getpid()}
        job = self._job(skip)
        busy: list[tuple[int, str, float]] = []
        job_cores = others = 0.0
        for (pid, name), total in ticks.items():
            before = previous.get((pid, name))
            if before is None or pid in skip:
                continue
            cores = (total - before) * self.tick_s / interval_s
            if pid in job:
                job_cores += cores
                continue
            others += cores
            if cores >= MIN_CORES:
                busy.append((pid, name, round(cores, 3)))
        busy.sort(key=lambda item: -item[2])
        procs = [list(item) for item in busy[:TOP]]
        event: dict[str, Any] = {"type": "foreign", "ts_ns": now, "interval_s": round(interval_s, 3), "procs": procs,
                                 "others_cores": round(others, 3)}
        if self.job_root is not None:
            event["job_cores"] = round(job_cores, 3)
        return [event]

    def _job(self, skip: set[int]) -> set[int]:
        """The job's other processes: the launcher (``job_root``) and its descendants outside ``skip``
        (the other ranks of this machine and their DataLoader workers)."""
        if self.job_root is None:
            return set()
        children: dict[int, list[int]] = {}
        for pid, parent in self._parents.items():
            children.setdefault(parent, []).append(pid)
        found, stack = {self.job_root}, [self.job_root]
        while stack:
            for child in children.get(stack.pop(), ()):
                if child not in found:
                    found.add(child)
                    stack.append(child)
        return found - skip

    def _read_all(self) -> dict[tuple[int, str], int]:
        out: dict[tuple[int, str], int] = {}
        self._parents = parents = {}
        try:
            names = os.listdir(self.proc_root)
        except OSError:
            self.enabled = False
            return out
        for entry in names:
            if not entry.isdigit():
                continue
            try:
                with open(f"{self.proc_root}/{entry}/stat", "rb") as handle:
                    raw = handle.read()
            except OSError:
                continue  # exited, or not ours to read
            parsed = parse_stat(raw)
            if parsed is not None:
                out[(int(entry), parsed[0])] = parsed[1]
                parents[int(entry)] = parsed[2]
        return out


def parse_stat(raw: bytes) -> tuple[str, int, int] | None:
    """``(comm, utime + stime, ppid)`` from a ``/proc/<pid>/stat`` line (the name may hold spaces and ')')."""
    start, end = raw.find(b"("), raw.rfind(b")")
    if start < 0 or end < start:
        return None
    fields = raw[end + 2:].split()
    if len(fields) < 13:
        return None
    try:
        return raw[start + 1:end].decode("utf-8", "replace"), int(fields[11]) + int(fields[12]), int(fields[1])
    except ValueError:
        return None


def job_root(target_pid: int, environ: dict[str, str]) -> int | None:
    """The launcher of the job the training process belongs to: its parent when it runs under an
    elastic launcher (torchrun, ``accelerate launch``, which set ``TORCHELASTIC_RUN_ID`` in every
    rank's environment); None for a process on its own. The launcher's descendants are the job's
    other ranks: their CPU is the job's own, never "other processes"."""
    if not environ.get("TORCHELASTIC_RUN_ID"):
        return None
    try:
        with open(f"/proc/{target_pid}/stat", "rb") as handle:
            parsed = parse_stat(handle.read())
    except OSError:
        return None
    return parsed[2] if parsed is not None and parsed[2] > 1 else None
