"""The sidecar sampler's samples: columns in memory, gzip'd JSON lines on disk.

In memory, :class:`Samples` holds one numpy array per column (torch-free, like ``StepTable``):

- ``series``: one row per sample. Columns in :data:`SERIES_COLUMNS`; per-item columns are 2-D
  (samples × CPUs, disks, NICs or GPUs, in the order of :class:`SamplesMeta`).
- ``proc``: one row per (sample, process of the training tree), :data:`PROCESS_COLUMNS`; ``id``
  indexes :attr:`Samples.processes` (pid, role, start/end, command line).
- ``gpu_procs``: one row per (sample, GPU, process holding GPU memory), :data:`GPU_PROCESS_COLUMNS`.

Counters are raw and cumulative (CPU ticks, bytes): a rate is the difference of two samples over
the difference of their ``ts_ns``. -1 means "not measured". At the default 10 Hz, memory, swap,
disk, network and per-process I/O are read at 2 Hz and repeat their last reading in between (see
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
from typing import TYPE_CHECKING, Any

import orjson

from stepscope.errors import InputError
from stepscope.record.safe_write import create_exclusive

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
        known = {item.name for item in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        for name in ("cpus", "disks", "nics"):
            values[name] = tuple(values.get(name, ()))
        values["gpus"] = tuple(GpuInfo(**_only(GpuInfo, item)) for item in values.get("gpus", ()))
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
        self._series: dict[str, list[Any]] = {name: [] for name in SERIES_COLUMNS}
        self._proc: dict[str, list[Any]] = {name: [] for name in PROCESS_COLUMNS}
        self._gpu_procs: dict[str, list[Any]] = {name: [] for name in GPU_PROCESS_COLUMNS}
        self._processes: dict[int, dict[str, Any]] = {}
        self.notes: list[str] = []
        self.foreign: list[tuple[int, float, tuple[tuple[int, str, float], ...]]] = []
        self.count = 0

    def add(self, sample: dict[str, Any]) -> None:
        """Add one sample as the sampler produces it (see :func:`sample_to_chunk` for the shape)."""
        self.add_chunk(sample_to_chunk([sample]))

    def add_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "note":
            self.notes.append(str(event.get("text", "")))
        elif kind == "foreign":
            self.foreign.append((int(event["ts_ns"]), float(event.get("interval_s", 0.0)),
                                 tuple((int(pid), str(name), float(cores)) for pid, name, cores in event["procs"])))
        elif kind == "process":
            self._processes[int(event["id"])] = _only(ProcessInfo, event)
        elif kind == "role" and int(event["id"]) in self._processes:
            self._processes[int(event["id"])].update(role=event["role"], loader_id=event.get("loader_id"))
        elif kind == "exit" and int(event["id"]) in self._processes:
            self._processes[int(event["id"])]["end_ns"] = int(event["ts_ns"])

    def add_chunk(self, chunk: dict[str, Any]) -> None:
        """Add the samples of one ``samples`` line (delta-encoded series are decoded here)."""
        import numpy as np

        count = int(chunk["count"])
        series = chunk.get("series", {})
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
            self._series[name].append(array)
        for target, source, columns in ((self._proc, chunk.get("proc", {}), PROCESS_COLUMNS),
                                        (self._gpu_procs, chunk.get("gpu_procs", {}), GPU_PROCESS_COLUMNS)):
            length = len(source.get("sample", ()))
            for name in columns:
                values = source.get(name)
                if values is None or len(values) != length:
                    values = [-1] * length
                array = np.asarray(values, dtype="<U1" if name == "state" else np.int64)
                target[name].append(array + self.count if name == "sample" else array)
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
                       tuple(self.foreign))


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


def load_samples(path: str | Path) -> Samples:
    """Read a samples file; a damaged last member (killed sampler) is dropped with a note.

    Raises:
        InputError: missing file, not a samples file, or written by a newer stepscope.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(path, f"cannot read samples: {exc.strerror}") from None
    data, truncated = _decompress_prefix(raw, path)
    if not data:
        return _empty(path)
    lines = data.rstrip(b"\n").split(b"\n")
    builder = SamplesBuilder(_parse_header(lines[0], path))
    for number, line in enumerate(lines[1:], start=2):
        try:
            item = orjson.loads(line)
            if item.get("type") == "samples":
                builder.add_chunk(item)
            else:
                builder.add_event(item)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            if number == len(lines):  # the last line: cut off when the sampler was killed
                truncated = True
                break
            raise InputError(path, f"damaged samples ({type(exc).__name__}: {exc})",
                             position=f"line {number}") from None
    if truncated:
        builder.notes.append("samples file ends early (the sampler was stopped abruptly); "
                             "the samples before that are kept")
    return builder.freeze(truncated=truncated)


def _decompress_prefix(raw: bytes, path: Path) -> tuple[bytes, bool]:
    """Decompress gzip members one after another, keeping everything before a broken tail.

    Streams the file in blocks (each byte is copied a constant number of times, however many
    members there are) and starts a new decompressor at each member boundary. A member that is cut
    short still yields what it holds; the half-written line at its end is dropped.
    """
    if raw and raw[:2] != b"\x1f\x8b":
        raise InputError(path, "not a gzip file; expected samples written by the stepscope sampler")
    parts: list[bytes] = []
    truncated = False
    view = memoryview(raw)
    decoder = zlib.decompressobj(wbits=31)
    fed = False  # the current member has received input
    for offset in range(0, len(raw), 1 << 16):
        pending = bytes(view[offset : offset + (1 << 16)])
        while pending:
            try:
                parts.append(decoder.decompress(pending))
            except zlib.error:
                truncated = True
                break
            fed = True
            if not decoder.eof:
                break
            pending = decoder.unused_data
            decoder, fed = zlib.decompressobj(wbits=31), False
        if truncated:
            break
    if fed and not decoder.eof:
        truncated = True
    data = b"".join(parts)
    if truncated and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
    return data, truncated


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


