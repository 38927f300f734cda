"""Fast readers of Linux ``/proc`` counters for the sampler (no psutil in the hot path).

psutil costs ≈ 420 µs for a full system + process sample in a VM (``shared/reference``); one
``os.read`` of a ``/proc`` file costs 10–40 µs there, and the parsers below are a few string splits.
Each function reads one file and returns plain numbers; a missing file raises ``OSError`` (the
caller decides what that means: a process that ended, a kernel without the file).

Units are the kernel's, named in the keys: CPU times in clock ticks (``SC_CLK_TCK``, usually 100 per
second), sizes in bytes (converted from kB, pages and 512-byte sectors here).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
SECTOR_BYTES = 512  # /proc/diskstats counts 512-byte sectors whatever the device's block size

#: /proc/stat per-CPU columns (after the name), in order.
_CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def read_text(path: str) -> bytes:
    """One ``read`` of a small file (``/proc`` files are generated whole on the first read)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = [os.read(fd, 65536)]
        while len(chunks[-1]) == 65536:
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks)
    finally:
        os.close(fd)


class ProcFile:
    """A /proc file kept open and re-read with ``pread`` at offset 0 (the kernel regenerates it).

    Saves the open and close of every reading (two of three syscalls). For ``/proc/<pid>/...``
    the descriptor stays bound to that process: once it is reaped, reading raises
    ``ProcessLookupError`` even if the pid is reused.
    """

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)

    def read(self) -> bytes:
        data = os.pread(self.fd, 65536, 0)
        return data if len(data) < 65536 else read_text(self.path)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def available() -> bool:
    """Whether the fast readers work here (Linux with /proc mounted)."""
    return os.path.exists("/proc/stat") and os.path.exists("/proc/self/stat")


@dataclass(frozen=True)
class CpuStat:
    """Cumulative per-core tick counters from ``/proc/stat`` plus the scheduler's run queue."""

    cpus: tuple[int, ...]  # cpu ids in the order of the lists below
    user: tuple[int, ...]  # user + nice
    system: tuple[int, ...]  # system + irq + softirq
    idle: tuple[int, ...]
    iowait: tuple[int, ...]
    steal: tuple[int, ...]
    procs_running: int
    procs_blocked: int


def parse_cpu_stat(text: bytes) -> CpuStat:
    cpus, user, system, idle, iowait, steal = [], [], [], [], [], []
    end = text.find(b"\nintr")  # the long interrupt line and what follows are not needed...
    for line in text[: end if end >= 0 else len(text)].split(b"\n")[1:]:  # ...nor the "cpu" total
        if line.startswith(b"cpu"):
            parts = line.split()
            values = [int(item) for item in parts[1 : 1 + len(_CPU_FIELDS)]]
            values += [0] * (len(_CPU_FIELDS) - len(values))
            cpus.append(int(parts[0][3:]))
            user.append(values[0] + values[1])
            system.append(values[2] + values[5] + values[6])
            idle.append(values[3])
            iowait.append(values[4])
            steal.append(values[7])
    return CpuStat(tuple(cpus), tuple(user), tuple(system), tuple(idle), tuple(iowait), tuple(steal),
                   _field(text, b"procs_running ", -1), _field(text, b"procs_blocked ", -1))


def _field(text: bytes, name: bytes, default: int = 0) -> int:
    """The first number after ``name`` at the start of a line (``/proc/meminfo``, ``/proc/vmstat``)."""
    start = text.find(b"\n" + name)
    if start < 0:
        if not text.startswith(name):
            return default
        start = -1
    start += len(name) + 1
    end = text.find(b"\n", start)
    return int(text[start:end if end >= 0 else len(text)].split()[0])


def parse_meminfo(text: bytes) -> dict[str, int]:
    """``/proc/meminfo`` as bytes: used (total − available), available, cached, swap used/total.

    Only the six fields used are looked up (a full parse of the ~55 lines costs 4× more).
    """
    total = _field(text, b"MemTotal:") * 1024
    available_bytes = _field(text, b"MemAvailable:", -1) * 1024
    if available_bytes < 0:  # kernels before 3.14
        available_bytes = _field(text, b"MemFree:") * 1024
    swap_total = _field(text, b"SwapTotal:") * 1024
    return {
        "mem_total_bytes": total,
        "mem_used_bytes": total - available_bytes,
        "mem_available_bytes": available_bytes,
        "mem_cached_bytes": (_field(text, b"Cached:") + _field(text, b"Buffers:")) * 1024,
        "swap_total_bytes": swap_total,
        "swap_used_bytes": swap_total - _field(text, b"SwapFree:") * 1024,
    }


def parse_vmstat_swap(text: bytes) -> tuple[int, int]:
    """Cumulative bytes swapped in and out (``pswpin``/``pswpout`` pages)."""
    return _field(text, b"pswpin ") * PAGE_SIZE, _field(text, b"pswpout ") * PAGE_SIZE


def parse_diskstats(text: bytes, devices: tuple[str, ...]) -> dict[str, tuple[int, int, int, int]]:
    """``device -> (read_bytes, write_bytes, reads, writes)`` for the given devices."""
    out = {}
    for name in devices:
        start = text.find(b" " + name.encode() + b" ")
        if start < 0:
            continue
        end = text.find(b"\n", start)
        parts = text[start : end if end >= 0 else len(text)].split()
        if len(parts) >= 8:
            reads, read_sectors = int(parts[1]), int(parts[3])
            writes, write_sectors = int(parts[5]), int(parts[7])
            out[name] = (read_sectors * SECTOR_BYTES, write_sectors * SECTOR_BYTES, reads, writes)
    return out


def parse_net_dev(text: bytes) -> dict[str, tuple[int, int]]:
    """``interface -> (received_bytes, sent_bytes)``."""
    out = {}
    for line in text.split(b"\n")[2:]:
        name, _, rest = line.partition(b":")
        parts = rest.split()
        if len(parts) >= 9:
            out[name.strip().decode()] = (int(parts[0]), int(parts[8]))
    return out


def physical_disks() -> tuple[str, ...]:
    """Whole block devices backed by hardware (``/sys/block/X/device`` exists).

    Partitions, loop, zram and device-mapper devices are left out so bytes are not counted twice.
    """
    try:
        names = sorted(os.listdir("/sys/block"))
    except OSError:
        return ()
    return tuple(name for name in names if os.path.exists(f"/sys/block/{name}/device"))


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the sampler uses."""

    pid: int
    name: str
    state: str  # R running, S sleeping, D disk wait, Z zombie, T stopped, ...
    ppid: int
    cpu_ticks: int  # utime + stime
    threads: int
    start_ticks: int  # since boot
    rss_bytes: int
    child_ticks: int = 0  # cutime + cstime: CPU of the children it has reaped (waited for)


def parse_proc_stat(text: bytes) -> ProcStat:
    head, _, tail = text.rpartition(b")")  # the name may contain spaces and parentheses
    pid_text, _, name = head.partition(b" (")
    rest = tail.split()
    return ProcStat(
        pid=int(pid_text),
        name=name.decode(errors="replace"),
        state=rest[0].decode(),
        ppid=int(rest[1]),
        cpu_ticks=int(rest[11]) + int(rest[12]),
        threads=int(rest[17]),
        start_ticks=int(rest[19]),
        rss_bytes=int(rest[21]) * PAGE_SIZE,
        child_ticks=int(rest[13]) + int(rest[14]),
    )


def parse_statm_anon(text: bytes) -> int:
    """Anonymous resident bytes from ``/proc/<pid>/statm``: resident less shared (file-backed and
    shared-memory) pages, i.e. the process's heap and stacks. Unlike the RSS it does not grow when
    library code pages are first touched, which is how a short run's RSS "grows" with no leak."""
    fields = text.split()
    return max(0, int(fields[1]) - int(fields[2])) * PAGE_SIZE


def read_proc_stat(pid: int) -> ProcStat:
    return parse_proc_stat(read_text(f"/proc/{pid}/stat"))


def parse_proc_io(text: bytes) -> tuple[int, int, int]:
    """``(read_bytes, write_bytes, read_chars)``: storage reads/writes, and all reads incl. page cache."""
    values = {}
    for line in text.split(b"\n"):
        name, _, rest = line.partition(b":")
        if rest:
            values[name] = int(rest)
    return values.get(b"read_bytes", -1), values.get(b"write_bytes", -1), values.get(b"rchar", -1)


def read_proc_io(pid: int) -> tuple[int, int, int]:
    """I/O counters of a process, ``(-1, -1, -1)`` when not permitted (another user's process)."""
    try:
        return parse_proc_io(read_text(f"/proc/{pid}/io"))
    except PermissionError:
        return -1, -1, -1


def read_children(pid: int) -> list[int]:
    """Children forked by the main thread of ``pid`` (``CONFIG_PROC_CHILDREN``); [] if unknown."""
    try:
        return [int(item) for item in read_text(f"/proc/{pid}/task/{pid}/children").split()]
    except (OSError, ValueError):
        return []


def list_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def boottime_minus_monotonic_ns() -> int:
    """Offset from CLOCK_MONOTONIC to CLOCK_BOOTTIME (the clock of process start times); 0 if unknown."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        return 0
    return time.clock_gettime_ns(boottime) - time.monotonic_ns()
