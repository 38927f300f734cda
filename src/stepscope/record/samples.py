"""The sidecar sampler's samples: columns in memory, gzip'd JSON lines on disk.

In memory, :class:`Samples` holds one numpy array per column (torch-free, like ``StepTable``):

- ``series``: one row per sample. Columns in :data:`SERIES_COLUMNS`; per-item columns are 2-D
  (samples × CPUs, disks, NICs or GPUs, in the order of :class:`SamplesMeta`).
- ``proc``: one row per (sample, process of the training tree), :data:`PROCESS_COLUMNS`; ``id``
  indexes :attr:`Samples.processes` (pid, role, start/end, command line).
- ``gpu_procs``: one row per (sample, GPU, process holding GPU memory), :data:`GPU_PROCESS_COLUMNS`.

Counters are raw and cumulative (CPU ticks, bytes): a rate is the difference of two samples over
the difference of their ``ts_ns``. -1 means "not measured". At the default 10 Hz, memory, swap,
network and per-process I/O (and disks without /proc) are read at 2 Hz and repeat their last reading in between (see
``SLOW_EVERY_S`` in capture/sampler.py): rates over windows of half a second or more are exact.

``ts_ns`` is ``time.monotonic_ns()`` — on Linux the CLOCK_MONOTONIC that ``time.perf_counter_ns()``
also reads, in every process — so a step ``[start_ns, start_ns + duration_ns)`` contains exactly the
samples whose ``ts_ns`` fall in it.

On disk (``layout.samples_path``: ``samples.rank<R>.jsonl.gz``) the file is a multi-member gzip:
the writer appends one independent gzip member about every second, so a sampler killed at any
moment leaves a valid prefix, and the reader drops only a damaged last member. Each member holds
JSON lines, each with a ``type``:

- ``header`` (first line of the file): ``kind``, ``schema_version``, and the fields of
  :class:`SamplesMeta`;
- ``note``: ``{"ts_ns", "text"}`` — something the sampler could not measure, said once;
- ``process``: a process seen for the first time (fields of :class:`ProcessInfo`);
- ``role``: ``{"id", "role", "loader_id", "ts_ns"}`` — a role learned after the process was seen;
- ``exit``: ``{"id", "ts_ns"}`` — the first sample at which the process was gone;
- ``foreign``: ``{"ts_ns", "interval_s", "procs": [[pid, name, cores], ...]}`` — the busiest processes
  outside the training tree since the previous scan (``capture/foreign.py``);
- ``samples``: ``{"count", "series": {column: rows}, "proc": {column: rows}, "gpu_procs": {...}}``
  for the samples since the previous member. Integer series are delta-encoded within the member
  (first row absolute, then differences), which turns large cumulative counters into small numbers.

numpy is imported only where arrays are built (reading), so the sidecar, which only writes, starts
in half the time.
"""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass, fields
from pathlib import Path
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson

from stepscope.errors import InputError
from stepscope.safe_write import create_exclusive
from stepscope.record.typecheck import checked_fields

if TYPE_CHECKING:
    import numpy as np

SAMPLES_KIND = "stepscope.samples"
SAMPLES_SCHEMA_VERSION = 1
CLOCK = "time.monotonic_ns (CLOCK_MONOTONIC, shared with perf_counter_ns)"

#: Series column -> (axis, meaning). Axis "sample" is one value per sample; "cpu", "disk", "nic"
#: and "gpu" are one value per sample and item. All are int64 except ``load1`` (float64).
SERIES_COLUMNS: dict[str, tuple[str, str]] = {
    "ts_ns": ("sample", "sample time, monotonic clock (ns)"),
    "cpu_user": ("cpu", "cumulative clock ticks in user mode, nice included"),
    "cpu_system": ("cpu", "cumulative clock ticks in the kernel, irq and softirq included"),
    "cpu_idle": ("cpu", "cumulative idle clock ticks"),
    "cpu_iowait": ("cpu", "cumulative clock ticks idle while waiting for I/O"),
    "cpu_steal": ("cpu", "cumulative clock ticks taken by the hypervisor"),
    "procs_running": ("sample", "runnable threads on the machine now, the sampler included (-1 unknown)"),
    "procs_blocked": ("sample", "threads blocked on I/O now (-1 unknown)"),
    "load1": ("sample", "1-minute load average"),
    "mem_used_bytes": ("sample", "memory in use: total - available"),
    "mem_available_bytes": ("sample", "memory available without swapping"),
    "mem_cached_bytes": ("sample", "page cache and buffers"),
    "swap_used_bytes": ("sample", "swap in use"),
    "swap_in_bytes": ("sample", "cumulative bytes swapped in"),
    "swap_out_bytes": ("sample", "cumulative bytes swapped out"),
    "disk_read_bytes": ("disk", "cumulative bytes read from the device"),
    "disk_write_bytes": ("disk", "cumulative bytes written to the device"),
    "disk_reads": ("disk", "cumulative completed reads"),
    "disk_writes": ("disk", "cumulative completed writes"),
    "net_recv_bytes": ("nic", "cumulative bytes received"),
    "net_sent_bytes": ("nic", "cumulative bytes sent"),
    "gpu_util": ("gpu", "NVML utilization.gpu: percent of the last sample period with a kernel running"),
    "gpu_mem_util": ("gpu", "NVML utilization.memory: percent of time device memory was read or written"),
    "gpu_mem_used_bytes": ("gpu", "device memory in use"),
    "gpu_sm_clock_mhz": ("gpu", "SM clock (read about once a second, -1 in between)"),
    "gpu_power_mw": ("gpu", "board power in milliwatts (about once a second)"),
    "gpu_temp_c": ("gpu", "GPU temperature in °C (about once a second)"),
    "gpu_pcie_tx_bytes_per_s": ("gpu", "PCIe transmit rate over 20 ms (one GPU at a time, about 1 Hz)"),
    "gpu_pcie_rx_bytes_per_s": ("gpu", "PCIe receive rate over 20 ms (one GPU at a time, about 1 Hz)"),
    "gpu_procs_read": ("sample", "1 when the GPU process list was read at this sample"),
    "tree_unseen_cpu_ticks": ("sample", "cumulative CPU ticks of training-tree processes no sample saw (children "
                                        "that started and ended between two samples: their parents' reaped-"
                                        "children CPU less what ended processes' rows hold; -1 unknown)"),
}
_FLOAT_SERIES = frozenset({"load1"})

#: Per-process rows (the training tree, or every process for ``stepscope monitor``).
PROCESS_COLUMNS: dict[str, str] = {
    "sample": "row of the sample in ``series``",
    "id": "index into ``Samples.processes``",
    "cpu_ticks": "cumulative user + system clock ticks of the process",
    "rss_bytes": "resident set size",
    "read_bytes": "cumulative bytes the process read from storage (-1 unknown)",
    "write_bytes": "cumulative bytes the process wrote to storage (-1 unknown)",
    "read_chars": "cumulative bytes read by syscalls, page-cache hits included (-1 unknown)",
    "threads": "thread count",
    "state": "scheduler state letter: R running, S sleeping, D disk wait, Z zombie, T stopped",
    "rss_anon_bytes": "anonymous resident bytes (RSS less file-backed and shared pages: heap and stacks; "
                      "-1 unknown or in older files)",
    "leader_ticks": "cumulative user + system clock ticks of the process's main thread alone (its other threads' "
                    "are cpu_ticks less these; -1 unknown or in older files)",
}

#: Rows of processes holding GPU memory (read about once a second, see ``gpu_procs_read``).
GPU_PROCESS_COLUMNS: dict[str, str] = {
    "sample": "row of the sample in ``series``",
    "gpu": "GPU index",
    "pid": "process id (host namespace)",
    "mem_bytes": "GPU memory used by the process (-1 unknown)",
}


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str = ""
    uuid: str = ""
    memory_total_bytes: int = -1


@dataclass(frozen=True)
class SamplesMeta:
    """The header: what was sampled, how often, on which clock."""

    rank: int = 0
    target_pid: int | None = None
    sampler_pid: int = 0
    interval_s: float = 0.1
    hostname: str = ""
    clock: str = CLOCK
    start_ns: int = 0
    start_wall_ns: int = 0
    clock_ticks_per_s: int = 100
    cpu_count: int = 0
    cpus: tuple[int, ...] = ()
    disks: tuple[str, ...] = ()
    nics: tuple[str, ...] = ()
    gpus: tuple[GpuInfo, ...] = ()
    mem_total_bytes: int = 0
    swap_total_bytes: int = 0
    schema_version: int = SAMPLES_SCHEMA_VERSION

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplesMeta:
        values = checked_fields(cls, data)
        if values.get("clock_ticks_per_s", 1) <= 0:  # CPU times are ticks over it: a zero made them infinite
            raise ValueError(f"SamplesMeta.clock_ticks_per_s: expected a positive tick rate, "
                             f"got {values['clock_ticks_per_s']}")
        for name in ("cpus", "disks", "nics"):
            values[name] = tuple(values.get(name, ()))
        values["gpus"] = tuple(GpuInfo(**checked_fields(GpuInfo, item)) for item in values.get("gpus", ()))
        return cls(**values)

    def axis_length(self, axis: str) -> int:
        return {"sample": 0, "cpu": len(self.cpus), "disk": len(self.disks), "nic": len(self.nics),
                "gpu": len(self.gpus)}[axis]


@dataclass(frozen=True)
class ProcessInfo:
    """One process seen by the sampler. ``end_ns`` is -1 while it was still alive at the last sample."""

    id: int
    pid: int
    ppid: int = -1
    name: str = ""
    cmdline: tuple[str, ...] = ()
    uid: int = -1
    role: str = "other"  # "main" | "dataloader_worker" | "other"
    loader_id: int | None = None
    start_ns: int = -1  # process start, monotonic clock (to a clock tick)
    first_seen_ns: int = -1
    end_ns: int = -1  # first sample at which it was gone


@dataclass(frozen=True)
class Samples:
    """All samples of one sampler run (see the module docstring for the columns)."""

    meta: SamplesMeta
    series: dict[str, np.ndarray]
    proc: dict[str, np.ndarray]
    gpu_procs: dict[str, np.ndarray]
    processes: tuple[ProcessInfo, ...] = ()
    notes: tuple[str, ...] = ()
    truncated: bool = False  # the file ended inside a member (the sampler was killed)
    #: busiest processes outside the training tree, one scan each: (ts_ns, interval_s, ((pid, name, cores), ...))
    foreign: tuple[tuple[int, float, tuple[tuple[int, str, float], ...]], ...] = ()
    #: the same scans' totals: (ts_ns, interval_s, cores of every process outside the job, cores of the
    #: job's other processes — launcher, other ranks of this machine), each -1.0 when not measured
    foreign_totals: tuple[tuple[int, float, float, float], ...] = ()

    def __len__(self) -> int:
        return int(self.series["ts_ns"].shape[0])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.series[name]

    @property
    def ts_ns(self) -> np.ndarray:
        return self.series["ts_ns"]

    def processes_with_role(self, role: str) -> tuple[ProcessInfo, ...]:
        return tuple(item for item in self.processes if item.role == role)


class SamplesBuilder:
    """Accumulates samples and events (from the sampler, or from a file) and freezes them.

    Args:
        meta: the header fields (see :class:`SamplesMeta`).
    """

    def __init__(self, meta: SamplesMeta | dict[str, Any]):
        self.meta = meta if isinstance(meta, SamplesMeta) else SamplesMeta.from_dict(meta)
        for axis in ("cpu", "disk", "nic", "gpu"):
            if self.meta.axis_length(axis) > MAX_AXIS_ITEMS:
                raise ValueError(f"more than {MAX_AXIS_ITEMS} items on the {axis} axis")
        self._series: dict[str, list[Any]] = {name: [] for name in SERIES_COLUMNS}
        self._proc: dict[str, list[Any]] = {name: [] for name in PROCESS_COLUMNS}
        self._gpu_procs: dict[str, list[Any]] = {name: [] for name in GPU_PROCESS_COLUMNS}
        self._processes: dict[int, dict[str, Any]] = {}
        self.notes: list[str] = []
        self.foreign: list[tuple[int, float, tuple[tuple[int, str, float], ...]]] = []
        self.foreign_totals: list[tuple[int, float, float, float]] = []
        self.count = 0

    def add(self, sample: dict[str, Any]) -> None:
        """Add one sample as the sampler produces it (see :func:`sample_to_chunk` for the shape)."""
        self.add_chunk(sample_to_chunk([sample]))

    def add_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "note":
            text = str(event.get("text", ""))
            if text not in self.notes and len(self.notes) < MAX_NOTES:  # said once; a flood is damage
                self.notes.append(text)
        elif kind == "foreign":
            if len(self.foreign) >= MAX_FOREIGN_SCANS:
                raise ValueError(f"more than {MAX_FOREIGN_SCANS} scans of other processes")
            procs = tuple((int(pid), str(name)[:256], float(cores)) for pid, name, cores in event["procs"][:16])
            self.foreign.append((int(event["ts_ns"]), float(event.get("interval_s", 0.0)), procs))
            self.foreign_totals.append((int(event["ts_ns"]), float(event.get("interval_s", 0.0)),
                                        _cores(event.get("others_cores")), _cores(event.get("job_cores"))))
        elif kind == "process":
            process = checked_fields(ProcessInfo, event)
            ProcessInfo(**{**process, "cmdline": tuple(process.get("cmdline", ()))})  # every required field
            if process["id"] not in self._processes and len(self._processes) >= MAX_PROCESSES:
                raise ValueError(f"more than {MAX_PROCESSES} processes")
            self._processes[process["id"]] = process
        elif kind == "role" and int(event["id"]) in self._processes:
            update = checked_fields(ProcessInfo, {"role": event["role"], "loader_id": event.get("loader_id")})
            self._processes[int(event["id"])].update(update)
        elif kind == "exit" and int(event["id"]) in self._processes:
            self._processes[int(event["id"])].update(checked_fields(ProcessInfo, {"end_ns": event["ts_ns"]}))

    def add_chunk(self, chunk: dict[str, Any]) -> None:
        """Add the samples of one ``samples`` line (delta-encoded series are decoded here)."""
        import numpy as np

        count = chunk["count"]
        if type(count) is not int or not 0 <= count <= MAX_CHUNK_SAMPLES:
            raise ValueError(f"sample count {count!r} out of range")
        widest = max(self.meta.axis_length(axis) for axis in ("cpu", "disk", "nic", "gpu"))
        if count * max(widest, 1) > MAX_CHUNK_SAMPLES * 64:
            raise ValueError(f"{count} samples of {widest} items: more than one line can hold")
        series = chunk.get("series", {})
        added: dict[str, np.ndarray] = {}  # built whole, then appended: a bad line adds nothing
        for name, (axis, _) in SERIES_COLUMNS.items():
            shape = (count,) if axis == "sample" else (count, self.meta.axis_length(axis))
            rows = series.get(name)
            array: np.ndarray
            if rows is None:
                array = np.full(shape, -1, dtype=np.int64)
            elif name in _FLOAT_SERIES:
                array = np.asarray(rows, dtype=np.float64).reshape(shape)
            else:
                array = np.asarray(rows, dtype=np.int64).reshape(shape)
                if chunk.get("delta"):
                    array = np.cumsum(array, axis=0)
            added[name] = array
        tables = []
        for target, source, columns in ((self._proc, chunk.get("proc", {}), PROCESS_COLUMNS),
                                        (self._gpu_procs, chunk.get("gpu_procs", {}), GPU_PROCESS_COLUMNS)):
            length = len(source.get("sample", ()))
            arrays = {}
            for name in columns:
                values = source.get(name)
                if values is None or len(values) != length:
                    values = [-1] * length
                array = np.asarray(values, dtype="<U1" if name == "state" else np.int64).reshape(length)
                if name == "sample":
                    if length and (array.min() < 0 or array.max() >= count):
                        raise ValueError("a process row refers to a sample outside its line")
                    array = array + self.count
                elif name == "id" and length and array.min() < 0:
                    raise ValueError("a process row without a valid process id")
                elif name == "gpu" and length and (array.min() < 0 or array.max() >= max(len(self.meta.gpus), 1)):
                    raise ValueError("a GPU process row refers to a GPU the header does not list")
                arrays[name] = array
            tables.append((target, arrays))
        for name, array in added.items():
            self._series[name].append(array)
        for target, arrays in tables:
            for name, array in arrays.items():
                target[name].append(array)
        self.count += count

    def freeze(self, *, truncated: bool = False) -> Samples:
        import numpy as np

        series = {}
        for name, (axis, _) in SERIES_COLUMNS.items():
            dtype = np.float64 if name in _FLOAT_SERIES else np.int64
            shape = (0,) if axis == "sample" else (0, self.meta.axis_length(axis))
            series[name] = np.concatenate(self._series[name]).astype(dtype, copy=False) if self._series[name] \
                else np.zeros(shape, dtype=dtype)
        proc = {name: _concat(parts, "<U1" if name == "state" else np.int64) for name, parts in self._proc.items()}
        gpu_procs = {name: _concat(parts, np.int64) for name, parts in self._gpu_procs.items()}
        processes = tuple(ProcessInfo(**{**item, "cmdline": tuple(item.get("cmdline", ()))})
                          for _, item in sorted(self._processes.items()))
        return Samples(self.meta, series, proc, gpu_procs, processes, tuple(self.notes), truncated,
                       tuple(self.foreign), tuple(self.foreign_totals))


def _cores(value: Any) -> float:
    """A scan's total cores; -1.0 when absent (older files, no launcher); damage raises."""
    if value is None:
        return -1.0
    cores = float(value)
    if not 0.0 <= cores < 1e6:
        raise ValueError(f"a scan's total of {value!r} cores is out of range")
    return cores


def _concat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    import numpy as np

    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)


def sample_to_chunk(samples: list[dict[str, Any]], *, delta: bool = False) -> dict[str, Any]:
    """Turn sampler samples into one columnar ``samples`` line.

    A sample is a dict with the :data:`SERIES_COLUMNS` keys it measured (missing ones are -1),
    ``"proc"``: ``{column: [one value per process]}`` with the :data:`PROCESS_COLUMNS` but
    ``sample``, and ``"gproc"``: ``{"gpu", "pid", "mem_bytes"}`` lists.
    """
    series: dict[str, list[Any]] = {}
    for name in SERIES_COLUMNS:
        if any(name in sample for sample in samples):
            series[name] = [sample.get(name, -1) for sample in samples]
    proc: dict[str, list[Any]] = {name: [] for name in PROCESS_COLUMNS}
    gpu_procs: dict[str, list[Any]] = {name: [] for name in GPU_PROCESS_COLUMNS}
    for row, sample in enumerate(samples):
        for target, rows in ((proc, sample.get("proc")), (gpu_procs, sample.get("gproc"))):
            if rows:
                length = len(next(iter(rows.values())))
                target["sample"].extend([row] * length)
                for name, values in rows.items():
                    if name in target:
                        target[name].extend(values)
    if delta:
        for name, rows in series.items():
            if name not in _FLOAT_SERIES:
                series[name] = _delta(rows)
    return {"type": "samples", "count": len(samples), "delta": delta, "series": series, "proc": proc,
            "gpu_procs": gpu_procs}


def _delta(rows: list[Any]) -> list[Any]:
    """First row as is, then row-to-row differences (element-wise for per-item rows)."""
    if not rows or not isinstance(rows[0], (list, tuple)):
        return rows[:1] + [current - previous for previous, current in zip(rows, rows[1:])]
    return [list(rows[0])] + [[now - then for then, now in zip(previous, current)]
                              for previous, current in zip(rows, rows[1:])]


class SamplesWriter:
    """Appends samples to the samples file, one gzip member per :meth:`flush`.

    The header is written (and flushed) by the constructor. Nothing is fsync'ed: the page cache
    keeps what was written when the sampler is killed, at no cost to the run.
    """

    def __init__(self, path: str | Path, meta: dict[str, Any]):
        self.path = Path(path)
        self._file = create_exclusive(self.path)  # a new file: never a planted one or a symlink
        self._lines: list[bytes] = []
        self._pending: list[dict[str, Any]] = []
        self.samples_written = 0
        self._lines.append(orjson.dumps({"type": "header", "kind": SAMPLES_KIND,
                                         "schema_version": SAMPLES_SCHEMA_VERSION, **meta}))
        self.flush()

    def add(self, sample: dict[str, Any]) -> None:
        self._pending.append(sample)

    def add_event(self, event: dict[str, Any]) -> None:
        self._lines.append(orjson.dumps(event))

    def note(self, ts_ns: int, text: str) -> None:
        self.add_event({"type": "note", "ts_ns": ts_ns, "text": text})

    def flush(self) -> None:
        if self._pending:
            self._lines.append(orjson.dumps(sample_to_chunk(self._pending, delta=True)))
            self.samples_written += len(self._pending)
            self._pending = []
        if self._lines:
            payload = b"\n".join(self._lines) + b"\n"
            self._lines = []
            self._file.write(gzip.compress(payload, compresslevel=6, mtime=0))
            self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()


#: Bounds on what one samples file may describe (a real run is far below; see load_samples).
MAX_CHUNK_SAMPLES = 1_000_000
MAX_AXIS_ITEMS = 65_536
MAX_PROCESSES = 1_000_000
MAX_NOTES = 1_000
#: Scans of other processes kept (one every 2 s: more than a week of samples).
MAX_FOREIGN_SCANS = 400_000


def load_samples(path: str | Path, max_bytes: int | None = None) -> Samples:
    """Read a samples file; a damaged last member (killed sampler) is dropped with a note.

    Decoded line by line, streaming the decompression: memory is what the arrays need plus one line.
    A line longer than ``max_bytes`` (default :func:`stepscope.limits.max_bytes`), a file that past
    that size inflates more than :data:`~stepscope.limits.MAX_RATIO`:1, or counts beyond the
    ``MAX_*`` bounds above are refused as damaged.

    Raises:
        InputError: missing file, not a samples file, damaged, too large, or written by a newer stepscope.
    """
    from stepscope import limits

    path = Path(path)
    limit = limits.max_bytes() if max_bytes is None else max_bytes
    limits.regular_file(path, "samples")
    builder: SamplesBuilder | None = None
    number = 0
    truncated = False
    try:
        with open(path, "rb") as raw:
            lines = _lines(raw, path, limit)
            for number, line, last in lines:
                if last and not line.strip():
                    break  # a blank last line (no newline after it) carries nothing
                if builder is None:
                    header = _parse_header(line, path)
                    try:
                        builder = SamplesBuilder(header)
                    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
                        raise InputError(path, f"damaged samples header ({type(exc).__name__}: {str(exc)[:200]})",
                                         position="line 1") from None
                    continue
                try:
                    item = orjson.loads(line)
                    if item.get("type") == "samples":
                        builder.add_chunk(item)
                    else:
                        builder.add_event(item)
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError,
                        OverflowError) as exc:
                    if last:  # the last line: cut off when the sampler was killed
                        truncated = True
                        break
                    raise InputError(path, f"damaged samples ({type(exc).__name__}: {str(exc)[:200]})",
                                     position=f"line {number}") from None
            truncated = truncated or lines.truncated
    except OSError as exc:
        raise InputError(path, f"cannot read samples: {exc.strerror}") from None
    if builder is None:
        return _empty(path)
    if truncated:
        builder.notes.append("samples file ends early (the sampler was stopped abruptly); "
                             "the samples before that are kept")
    return builder.freeze(truncated=truncated)


_MAX_TRAILING_BLANKS = 16


class _lines:
    """``(number, line, is_last)`` of a multi-member gzip file, streamed; ``truncated`` once done.

    Each byte is copied a constant number of times however many members there are; a new
    decompressor starts at each member boundary. A member cut short still yields what it holds; the
    half-written line at its end is dropped. Raises InputError past the limits.
    """

    def __init__(self, raw: Any, path: Path, limit: int):
        from stepscope import limits

        self.raw, self.path, self.limit, self.truncated = raw, path, limit, False
        self._limits = limits
        self._compressed = 0

    def _pieces(self) -> Iterator[bytes]:
        decoder = zlib.decompressobj(wbits=31)
        fed = False  # the current member has received input
        first = True
        total = 0
        while True:
            pending = self.raw.read(1 << 14)
            self._compressed += len(pending)
            if first and pending and pending[:2] != b"\x1f\x8b":
                raise InputError(self.path, "not a gzip file; expected samples written by the stepscope sampler")
            first = False
            if not pending:
                break
            while pending:
                try:
                    piece = decoder.decompress(pending, 1 << 20)
                except zlib.error:
                    self.truncated = True
                    return
                fed = True
                total += len(piece)
                self._limits.check_ratio(self.path, "the samples file", total, self._compressed, self.limit)
                if piece:
                    yield piece
                if decoder.eof:
                    pending = decoder.unused_data
                    decoder, fed = zlib.decompressobj(wbits=31), False
                elif decoder.unconsumed_tail:
                    pending = decoder.unconsumed_tail
                elif piece:
                    pending = b""
                    while not decoder.eof:  # drain what zlib still holds
                        more = decoder.decompress(b"", 1 << 20)
                        if not more:
                            break
                        total += len(more)
                        self._limits.check_ratio(self.path, "the samples file", total, self._compressed,
                                                 self.limit)
                        yield more
                    if decoder.eof:
                        pending = decoder.unused_data
                        decoder, fed = zlib.decompressobj(wbits=31), False
                else:
                    pending = b""
        if fed and not decoder.eof:
            self.truncated = True

    def __iter__(self) -> Iterator[tuple[int, bytes, bool]]:
        partial = bytearray()
        number = previous_number = 0
        previous: bytes | None = None
        blanks: list[int] = []
        for piece in self._pieces():
            partial += piece
            if b"\n" not in piece:
                if len(partial) > self.limit:
                    raise self._limits.too_large(self.path, "one line of the samples file", self.limit,
                                                 position=f"line {number + 1}")
                continue
            *complete, rest = bytes(partial).split(b"\n")
            partial = bytearray(rest)
            for line in complete:
                number += 1
                if len(line) > self.limit:
                    raise self._limits.too_large(self.path, "one line of the samples file", self.limit,
                                                 position=f"line {number}")
                if not line.strip():
                    # blank lines are dropped at the very end (as rstrip would); anywhere else, or
                    # more than a few, they are damage: the blank line itself fails to decode
                    blanks.append(number)
                    if len(blanks) <= _MAX_TRAILING_BLANKS:
                        continue
                if previous is not None:
                    yield previous_number, previous, False
                if blanks:
                    yield blanks[0], b"", False
                previous, previous_number = line, number
            if len(partial) > self.limit:
                raise self._limits.too_large(self.path, "one line of the samples file", self.limit,
                                             position=f"line {number + 1}")
        if partial and not self.truncated:
            if previous is not None:
                yield previous_number, previous, False
            if blanks and partial.strip():
                yield blanks[0], b"", False
            previous, previous_number = bytes(partial), number + 1  # a last line without its newline
        elif partial:
            self.truncated = True  # the half-written line at a broken end is dropped
        if previous is not None:
            yield previous_number, previous, True


def _parse_header(line: bytes, path: Path) -> dict[str, Any]:
    try:
        header = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise InputError(path, "damaged samples header") from None
    if not isinstance(header, dict) or header.get("kind") != SAMPLES_KIND:
        raise InputError(path, "not a stepscope samples file")
    version = header.get("schema_version")
    if not isinstance(version, int) or version > SAMPLES_SCHEMA_VERSION:
        raise InputError(path, f"samples written with schema {version!r}, newer than this stepscope "
                               f"understands ({SAMPLES_SCHEMA_VERSION}); upgrade stepscope")
    return header


def _empty(path: Path) -> Samples:
    samples = SamplesBuilder(SamplesMeta()).freeze(truncated=True)
    return Samples(samples.meta, samples.series, samples.proc, samples.gpu_procs, (),
                   (f"samples file {os.fspath(path)} holds no complete header (the sampler was stopped "
                    "before writing anything)",), True)


def _only(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {item.name for item in fields(cls)}
    return {key: value for key, value in data.items() if key in names}


