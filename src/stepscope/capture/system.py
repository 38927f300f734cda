"""What the sampler reads from the operating system: machine counters and a process tree.

:class:`SystemProbe` reads the machine's cumulative counters (CPU ticks per core, memory, swap,
disk and network bytes); :class:`ProcessTree` follows one process and its descendants (or every
process, for ``stepscope monitor``), giving each process a stable id, its role, start and end.

Both read ``/proc`` directly on Linux (see :mod:`stepscope.capture.procfs` for why) and fall back to
psutil elsewhere. Values are raw cumulative counters: rates are computed downstream from two
samples and their timestamps, so a late or missing sample loses no bytes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil

from stepscope.redact import redact_argv
from stepscope.capture import procfs

ROLE_MAIN = "main"
ROLE_WORKER = "dataloader_worker"
ROLE_OTHER = "other"

#: A full scan of /proc for descendants (children forked by a thread other than the main one,
#: which /proc/<pid>/task/<pid>/children misses) runs at most this often.
FULL_SCAN_EVERY_S = 5.0
_CMDLINE_MAX_CHARS = 1000
#: A process of the tree first seen with no command line (the kernel shows none between an exec's
#: new memory and its arguments) is looked at again for this many samples before it is recorded
#: without one.
UNNAMED_SAMPLES = 3


class SystemProbe:
    """Cumulative machine counters. The CPU, disk and NIC lists are fixed at construction.

    CPU ticks, the run queue and the load are read at every sample, and so are the disk counters
    from /proc. Memory, swap and network counters (and the disks through psutil) are read every
    ``slow_every`` samples and repeated in between: for cumulative counters a rate over any longer
    window stays exact, and this halves the sampler's cost.

    Args:
        use_procfs: read /proc directly (default: when available); ``False`` forces psutil.
        slow_every: samples between two readings of the slower-moving counters.
    """

    def __init__(self, use_procfs: bool | None = None, slow_every: int = 1):
        self.linux = procfs.available() if use_procfs is None else use_procfs
        self.slow_every = max(1, slow_every)
        self._tick = 0
        self._slow: dict[str, Any] = {}
        self._files: dict[str, procfs.ProcFile] = {}
        if self.linux:
            self.cpus = procfs.parse_cpu_stat(self._read("/proc/stat")).cpus
            self.disks = procfs.physical_disks()
            self.nics = tuple(name for name in procfs.parse_net_dev(self._read("/proc/net/dev")) if name != "lo")
        else:
            self.cpus = tuple(range(len(psutil.cpu_times(percpu=True))))
            self.disks = tuple(sorted((psutil.disk_io_counters(perdisk=True) or {}).keys()))
            self.nics = tuple(name for name in (psutil.net_io_counters(pernic=True) or {}) if name != "lo")
        memory = self._memory()
        self.mem_total_bytes = memory["mem_total_bytes"]
        self.swap_total_bytes = memory["swap_total_bytes"]
        self.clock_ticks_per_s = procfs.CLOCK_TICKS_PER_S if self.linux else 100

    def info(self) -> dict[str, Any]:
        """The constant part, for the samples header."""
        return {
            "cpu_count": len(self.cpus),
            "cpus": list(self.cpus),
            "disks": list(self.disks),
            "nics": list(self.nics),
            "mem_total_bytes": self.mem_total_bytes,
            "swap_total_bytes": self.swap_total_bytes,
            "clock_ticks_per_s": self.clock_ticks_per_s,
        }

    def sample(self) -> dict[str, Any]:
        """One reading of every machine counter (see ``SERIES_COLUMNS`` in record/samples.py)."""
        out: dict[str, Any] = self._cpu()
        out["load1"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else -1.0
        if self._tick % self.slow_every == 0:
            slow: dict[str, Any] = dict(self._memory())
            del slow["mem_total_bytes"], slow["swap_total_bytes"]
            slow["swap_in_bytes"], slow["swap_out_bytes"] = self._swap_io()
            if not self.linux:
                slow.update(self._disks())
            slow.update(self._net())
            self._slow = slow
        self._tick += 1
        out.update(self._slow)
        if self.linux:
            # disk reads at every sample (16 µs from /proc/diskstats): a first epoch that reads from
            # disk for under a second must show its rate, not one reading at 2 Hz
            out.update(self._disks())
        return out

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()

    # -- Linux /proc, psutil elsewhere ------------------------------------------------------------
    def _read(self, path: str) -> bytes:
        handle = self._files.get(path)
        if handle is None:
            handle = self._files[path] = procfs.ProcFile(path)
        return handle.read()

    def _cpu(self) -> dict[str, Any]:
        if self.linux:
            stat = procfs.parse_cpu_stat(self._read("/proc/stat"))
            if stat.cpus != self.cpus:  # a CPU went offline: keep the columns of the original ones
                stat = _align_cpus(stat, self.cpus)
            return {"cpu_user": stat.user, "cpu_system": stat.system, "cpu_idle": stat.idle,
                    "cpu_iowait": stat.iowait, "cpu_steal": stat.steal,
                    "procs_running": stat.procs_running, "procs_blocked": stat.procs_blocked}
        times = psutil.cpu_times(percpu=True)[: len(self.cpus)]

        def ticks(*names: str) -> list[int]:
            return [round(sum(getattr(item, name, 0.0) for name in names) * 100) for item in times]

        return {"cpu_user": ticks("user", "nice"), "cpu_system": ticks("system", "irq", "softirq"),
                "cpu_idle": ticks("idle"), "cpu_iowait": ticks("iowait"), "cpu_steal": ticks("steal"),
                "procs_running": -1, "procs_blocked": -1}

    def _memory(self) -> dict[str, int]:
        if self.linux:
            return procfs.parse_meminfo(self._read("/proc/meminfo"))
        memory, swap = psutil.virtual_memory(), psutil.swap_memory()
        return {"mem_total_bytes": memory.total, "mem_used_bytes": memory.total - memory.available,
                "mem_available_bytes": memory.available,
                "mem_cached_bytes": getattr(memory, "cached", 0) + getattr(memory, "buffers", 0),
                "swap_total_bytes": swap.total, "swap_used_bytes": swap.used}

    def _swap_io(self) -> tuple[int, int]:
        if self.linux:
            try:
                return procfs.parse_vmstat_swap(self._read("/proc/vmstat"))
            except OSError:
                return -1, -1
        swap = psutil.swap_memory()
        return int(swap.sin), int(swap.sout)

    def _disks(self) -> dict[str, list[int]]:
        if self.linux:
            stats = procfs.parse_diskstats(self._read("/proc/diskstats"), self.disks)
        else:
            counters = psutil.disk_io_counters(perdisk=True) or {}
            stats = {name: (item.read_bytes, item.write_bytes, item.read_count, item.write_count)
                     for name, item in counters.items()}
        rows = [stats.get(name, (-1, -1, -1, -1)) for name in self.disks]
        return {"disk_read_bytes": [row[0] for row in rows], "disk_write_bytes": [row[1] for row in rows],
                "disk_reads": [row[2] for row in rows], "disk_writes": [row[3] for row in rows]}

    def _net(self) -> dict[str, list[int]]:
        if self.linux:
            stats = procfs.parse_net_dev(self._read("/proc/net/dev"))
        else:
            stats = {name: (item.bytes_recv, item.bytes_sent)
                     for name, item in (psutil.net_io_counters(pernic=True) or {}).items()}
        rows = [stats.get(name, (-1, -1)) for name in self.nics]
        return {"net_recv_bytes": [row[0] for row in rows], "net_sent_bytes": [row[1] for row in rows]}


def _align_cpus(stat: procfs.CpuStat, cpus: tuple[int, ...]) -> procfs.CpuStat:
    """Reorder ``stat`` to ``cpus``; an offline CPU reads -1 (no data for that interval)."""
    index = {cpu: position for position, cpu in enumerate(stat.cpus)}

    def pick(values: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(values[index[cpu]] if cpu in index else -1 for cpu in cpus)

    return procfs.CpuStat(cpus, pick(stat.user), pick(stat.system), pick(stat.idle), pick(stat.iowait),
                          pick(stat.steal), stat.procs_running, stat.procs_blocked)


@dataclass
class _Tracked:
    proc_id: int
    pid: int
    start_ticks: int
    role: str
    loader_id: int | None = None
    stat_file: procfs.ProcFile | None = None  # kept open in a tree (see procfs.ProcFile)
    io_file: procfs.ProcFile | None = None
    io: tuple[int, int, int] = (-1, -1, -1)  # last reading
    samples: int = 0
    statm_file: procfs.ProcFile | None = None  # anonymous resident memory (tree mode on Linux)
    leader_file: procfs.ProcFile | None = None  # the main thread's own stat (tree mode on Linux)
    first_ticks: int = -1  # CPU and reaped children's CPU at the first reading, and the last CPU read
    first_child_ticks: int = 0
    last_ticks: int = 0

    def close(self) -> None:
        _close(self.stat_file, self.io_file, self.statm_file, self.leader_file)


@dataclass
class ProcessTree:
    """Follows ``target_pid`` and its descendants (or all processes when it is ``None``).

    Each :meth:`sample` returns the per-process columns of that moment and the events since the last
    call: a process seen for the first time, a role learned, a process gone. Processes are keyed by
    (pid, start time), so a reused pid is a new process.

    In a tree, a process ends when it exits or becomes a zombie (it has stopped running and only
    waits to be reaped); every process of the machine, zombies included, is shown otherwise.

    Roles: ``target_pid`` is "main"; pids that the training process reports in the roles file
    (JSON lines ``{"pid", "role", "loader_id", "ts_ns"}``, see ``layout.roles_path``) take the role
    reported; every other descendant is "other".

    Args:
        target_pid: root of the tree, or ``None`` for every process on the machine.
        roles_path: the roles file to follow, if any.
        exclude: pids never tracked (the sampler itself).
        with_io: read per-process I/O counters (the training tree: yes; the whole machine: no).
        use_procfs: as for :class:`SystemProbe`.
    """

    target_pid: int | None
    roles_path: Path | None = None
    exclude: frozenset[int] = field(default_factory=lambda: frozenset({os.getpid()}))
    with_io: bool = True
    use_procfs: bool | None = None
    io_every: int = 1  # samples between two readings of a process's I/O counters (repeated between)

    def __post_init__(self) -> None:
        self.linux = procfs.available() if self.use_procfs is None else self.use_procfs
        self.ns_per_tick = 1_000_000_000 // (procfs.CLOCK_TICKS_PER_S if self.linux else 100)
        self.boot_offset_ns = procfs.boottime_minus_monotonic_ns() if self.linux else _psutil_boot_offset_ns()
        self.tracked: dict[int, _Tracked] = {}
        self.count = 0  # process ids handed out
        self.roles: dict[int, tuple[str, int | None]] = {}
        self._roles_offset = 0
        self._last_scan = -float("inf")
        self.target_alive = True
        self._target_start: int | None = None
        #: CPU ticks of the tree's processes that no reading saw: children that started and ended
        #: between two samples (DataLoader workers of a short epoch, compile workers), found in their
        #: parents' reaped-children CPU less what the rows of ended processes already hold (cumulative)
        self.unseen_ticks = 0
        self._credited_ticks = 0
        #: pids of the tree seen with no command line yet: their start (clock ticks after boot) and
        #: how many samples they were put off
        self._unnamed: dict[int, tuple[int, int]] = {}

    def known_pids(self) -> set[int]:
        """Pids of the tracked tree (the excluded ones, and those put off until they show a command
        line): not foreign to the run."""
        return {*self.tracked, *self.exclude, *self._unnamed}

    @property
    def _tree_mode(self) -> bool:
        return self.target_pid is not None

    def sample(self, ts_ns: int) -> tuple[dict[str, list[Any]], list[dict[str, Any]]]:
        events: list[dict[str, Any]] = []
        new_roles = self._read_roles()
        for pid in self._discover(new_roles):
            if pid not in self.tracked and pid not in self.exclude:
                self._add(pid, ts_ns, events)
        for pid, (role, loader_id) in new_roles.items():
            entry = self.tracked.get(pid)
            if entry is not None and entry.role != role and entry.role != ROLE_MAIN:
                entry.role, entry.loader_id = role, loader_id
                events.append({"type": "role", "id": entry.proc_id, "role": role, "loader_id": loader_id,
                               "ts_ns": ts_ns})
        columns: dict[str, list[Any]] = {name: [] for name in (
            "id", "cpu_ticks", "rss_bytes", "read_bytes", "write_bytes", "read_chars", "threads", "state",
            "rss_anon_bytes", "leader_ticks")}
        reaped = 0  # growth of the tree's reaped-children CPU since each process was first read
        for pid, entry in list(self.tracked.items()):
            leader = self._leader_ticks(entry)  # first: the process's CPU, read after, includes it
            stat = self._tracked_stat(entry)
            if stat is None or stat.start_ticks != entry.start_ticks or (stat.state == "Z" and self._tree_mode):
                del self.tracked[pid]
                entry.close()
                if entry.first_ticks >= 0:  # counted in its rows: its parent's reaped-children CPU repeats it
                    self._credited_ticks += entry.last_ticks - entry.first_ticks
                events.append({"type": "exit", "id": entry.proc_id, "ts_ns": ts_ns})
                if pid == self.target_pid:
                    self.target_alive = False
                continue
            if self.with_io and stat.state != "Z" and entry.samples % max(1, self.io_every) == 0:
                entry.io = self._tracked_io(entry)
            entry.samples += 1
            if entry.first_ticks < 0:
                entry.first_ticks, entry.first_child_ticks = stat.cpu_ticks, stat.child_ticks
            entry.last_ticks = stat.cpu_ticks
            reaped += stat.child_ticks - entry.first_child_ticks
            io = entry.io
            for name, value in zip(columns, (entry.proc_id, stat.cpu_ticks, stat.rss_bytes, *io,
                                             stat.threads, stat.state, self._anon(entry), leader)):
                columns[name].append(value)
        if self.target_pid is not None and self.target_pid not in self.tracked:
            self.target_alive = False
        if self._tree_mode and self.linux:
            self.unseen_ticks = max(self.unseen_ticks, reaped - self._credited_ticks)
        return columns, events

    # -- discovery --------------------------------------------------------------------------------
    def _discover(self, new_roles: dict[int, tuple[str, int | None]]) -> list[int]:
        now = time.monotonic()
        if self.target_pid is None:
            return self._all_pids()
        if not self.tracked and self._target_start is None:
            candidates = [self.target_pid]
        else:
            candidates = []
        if now - self._last_scan >= FULL_SCAN_EVERY_S:
            self._last_scan = now
            candidates += self._descendants_by_scan()
        elif self.linux and self.target_pid in self.tracked:
            # DataLoader workers are forked by the training process's main thread: see them at once.
            # Grandchildren, and children of other threads, wait for the next full scan.
            candidates += procfs.read_children(self.target_pid)
        candidates += list(new_roles)
        candidates += [pid for pid in self._unnamed if pid not in candidates]
        return candidates

    def _all_pids(self) -> list[int]:
        return procfs.list_pids() if self.linux else psutil.pids()

    def _descendants_by_scan(self) -> list[int]:
        parents: dict[int, list[int]] = {}
        for pid in self._all_pids():
            stat = self._stat(pid)
            if stat is not None:
                parents.setdefault(stat.ppid, []).append(pid)
        found: list[int] = []
        stack: list[int] = [self.target_pid] if self.target_pid is not None else []
        while stack:
            for child in parents.get(stack.pop(), ()):
                if child not in self.exclude:
                    found.append(child)
                    stack.append(child)
        return found

    def _add(self, pid: int, ts_ns: int, events: list[dict[str, Any]]) -> None:
        stat, stat_file, io_file = self._open(pid)
        reused_target = (pid == self.target_pid and stat is not None
                         and self._target_start not in (None, stat.start_ticks))
        if stat is None or (stat.state == "Z" and self._tree_mode) or reused_target:
            # gone; a zombie, which in a tree has ended and only waits to be reaped; or another
            # process now holding the target's pid
            self._unnamed.pop(pid, None)
            _close(stat_file, io_file)
            return
        cmdline = self._cmdline(pid)
        start, put_off = self._unnamed.pop(pid, (stat.start_ticks, 0))
        unnamed = not cmdline and self._tree_mode and pid != self.target_pid  # (kernel threads never show one)
        if start != stat.start_ticks or (unnamed and put_off < UNNAMED_SAMPLES):
            # no command line: most likely in the middle of an exec, recorded once it shows the
            # command it runs (a pid put off whose process is now another is dropped from the list)
            if start == stat.start_ticks:
                self._unnamed[pid] = (start, put_off + 1)
            _close(stat_file, io_file)
            return
        if pid == self.target_pid:
            self._target_start = stat.start_ticks
            role, loader_id = ROLE_MAIN, None
        else:
            role, loader_id = self.roles.get(pid, (ROLE_OTHER, None))
        entry = _Tracked(self.count, pid, stat.start_ticks, role, loader_id, stat_file, io_file)
        if stat_file is not None:
            try:
                entry.statm_file = procfs.ProcFile(f"/proc/{pid}/statm")
                entry.leader_file = procfs.ProcFile(f"/proc/{pid}/task/{pid}/stat")
            except OSError:
                pass
        self.count += 1
        self.tracked[pid] = entry
        events.append({
            "type": "process", "id": entry.proc_id, "pid": pid, "ppid": stat.ppid, "name": stat.name,
            "cmdline": cmdline, "uid": self._uid(pid), "role": role, "loader_id": loader_id,
            "start_ns": stat.start_ticks * self.ns_per_tick - self.boot_offset_ns, "first_seen_ns": ts_ns,
        })

    def _read_roles(self) -> dict[int, tuple[str, int | None]]:
        """New complete lines of the roles file since the last call."""
        if self.roles_path is None:
            return {}
        try:
            with open(self.roles_path, "rb") as handle:
                handle.seek(self._roles_offset)
                data = handle.read()
        except OSError:
            return {}
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self._roles_offset += end
        found = {}
        for line in data[:end].splitlines():
            try:
                item = orjson.loads(line)
                found[int(item["pid"])] = (str(item.get("role", ROLE_OTHER)), item.get("loader_id"))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
        self.roles.update(found)
        return found

    def close(self) -> None:
        for entry in self.tracked.values():
            entry.close()

    # -- per-process readers ----------------------------------------------------------------------
    def _open(self, pid: int) -> tuple[procfs.ProcStat | None, procfs.ProcFile | None, procfs.ProcFile | None]:
        """First reading of a process; in a tree on Linux, with its stat and io files kept open."""
        if not (self.linux and self._tree_mode):
            return self._stat(pid), None, None
        try:
            stat_file = procfs.ProcFile(f"/proc/{pid}/stat")
        except OSError:
            return None, None, None
        try:
            stat = procfs.parse_proc_stat(stat_file.read())
        except (OSError, ValueError, IndexError):
            stat_file.close()
            return None, None, None
        io_file = None
        if self.with_io:
            try:
                io_file = procfs.ProcFile(f"/proc/{pid}/io")
            except OSError:  # another user's process
                pass
        return stat, stat_file, io_file

    def _tracked_stat(self, entry: _Tracked) -> procfs.ProcStat | None:
        if entry.stat_file is None:
            return self._stat(entry.pid)
        try:
            return procfs.parse_proc_stat(entry.stat_file.read())
        except (OSError, ValueError, IndexError):  # ESRCH: reaped
            return None

    def _anon(self, entry: _Tracked) -> int:
        if entry.statm_file is None:
            return -1
        try:
            return procfs.parse_statm_anon(entry.statm_file.read())
        except (OSError, ValueError, IndexError):
            return -1

    def _leader_ticks(self, entry: _Tracked) -> int:
        """CPU ticks of the process's main thread alone: against the process's, whether its other
        threads (an intra-op pool, a BLAS pool) run or only exist."""
        if entry.leader_file is None:
            return -1
        try:
            return procfs.parse_proc_stat(entry.leader_file.read()).cpu_ticks
        except (OSError, ValueError, IndexError):
            return -1

    def _tracked_io(self, entry: _Tracked) -> tuple[int, int, int]:
        if entry.io_file is None:
            return self._io(entry.pid) if entry.stat_file is None else (-1, -1, -1)
        try:
            return procfs.parse_proc_io(entry.io_file.read())
        except (OSError, ValueError):
            return -1, -1, -1

    def _stat(self, pid: int) -> procfs.ProcStat | None:
        try:
            if self.linux:
                return procfs.read_proc_stat(pid)
            return _psutil_stat(pid)
        except (OSError, ValueError, IndexError, psutil.Error):
            return None

    def _io(self, pid: int) -> tuple[int, int, int]:
        try:
            if self.linux:
                return procfs.read_proc_io(pid)
            counters = psutil.Process(pid).io_counters()
            return counters.read_bytes, counters.write_bytes, getattr(counters, "read_chars", -1)
        except (OSError, ValueError, AttributeError, psutil.Error):
            return -1, -1, -1

    def _cmdline(self, pid: int) -> list[str]:
        try:
            if self.linux:
                raw = procfs.read_text(f"/proc/{pid}/cmdline")[:_CMDLINE_MAX_CHARS]
                return list(redact_argv(part.decode(errors="replace") for part in raw.rstrip(b"\0").split(b"\0") if part))
            return list(redact_argv(psutil.Process(pid).cmdline()))
        except (OSError, psutil.Error):
            return []

    def _uid(self, pid: int) -> int:
        try:
            return os.stat(f"/proc/{pid}").st_uid if self.linux else psutil.Process(pid).uids().real
        except (OSError, AttributeError, psutil.Error):
            return -1


def _close(*files: procfs.ProcFile | None) -> None:
    for handle in files:
        if handle is not None:
            handle.close()


def _psutil_stat(pid: int) -> procfs.ProcStat:
    process = psutil.Process(pid)
    with process.oneshot():
        times = process.cpu_times()
        return procfs.ProcStat(
            pid=pid, name=process.name(), state=_PSUTIL_STATES.get(process.status(), "S"), ppid=process.ppid(),
            cpu_ticks=round((times.user + times.system) * 100), threads=process.num_threads(),
            start_ticks=round((process.create_time() - psutil.boot_time()) * 100),
            rss_bytes=process.memory_info().rss,
            child_ticks=round((getattr(times, "children_user", 0.0) + getattr(times, "children_system", 0.0)) * 100),
        )


def _psutil_boot_offset_ns() -> int:
    """Like boottime − monotonic for the psutil path: process start = boot_time + start_ticks."""
    return round((time.time() - psutil.boot_time()) * 1e9) - time.monotonic_ns()


_PSUTIL_STATES = {
    psutil.STATUS_RUNNING: "R", psutil.STATUS_SLEEPING: "S", psutil.STATUS_DISK_SLEEP: "D",
    psutil.STATUS_STOPPED: "T", psutil.STATUS_ZOMBIE: "Z", psutil.STATUS_IDLE: "I",
}
