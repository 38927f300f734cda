"""Generators of the large hostile inputs (the small ones are files beside this one; see README.md).

Each writes a file of a few MB at most that inflates to far more, in well under a second: one gzip
member is compressed once and repeated (a multi-member gzip is still one gzip file).

    python tests/data/hostile/generate.py OUT_DIR      # writes every generated input into OUT_DIR
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

MIB = 1024 * 1024


def _members(path: Path, head: bytes, filler: bytes, repeats: int, tail: bytes) -> Path:
    member = gzip.compress(filler, compresslevel=9, mtime=0)
    with open(path, "wb") as out:
        out.write(gzip.compress(head, mtime=0))
        for _ in range(repeats):
            out.write(member)
        out.write(gzip.compress(tail, mtime=0))
    return path


def whitespace_trace(path: Path, gib: float = 5.0) -> Path:
    """A trace whose events are followed by ``gib`` GiB of spaces (5 MB of gzip for 5 GiB)."""
    event = b'{"name": "aten::mm", "ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 1, "dur": 2}'
    return _members(path, b'{"traceEvents": [' + event + b",", b" " * MIB, int(gib * 1024), event + b"]}")


def leading_whitespace_trace(path: Path, gib: float = 5.0) -> Path:
    """``gib`` GiB of newlines before the document starts."""
    return _members(path, b"", b"\n" * MIB, int(gib * 1024), b'{"traceEvents": []}')


def huge_event_trace(path: Path, mib: int = 200) -> Path:
    """One event whose name is ``mib`` MiB long."""
    head = b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 1, "dur": 2, "name": "'
    return _members(path, head, b"a" * MIB, mib, b'"}]}')


def zeros_record(run_dir: Path, gib: float = 5.0) -> Path:
    """A run directory whose record inflates to ``gib`` GiB of NUL bytes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return _members(run_dir / "record.rank0.json.gz", b"", b"\0" * MIB, int(gib * 1024), b"")


def whitespace_record(run_dir: Path, gib: float = 5.0) -> Path:
    """A run directory whose record is valid JSON padded to ``gib`` GiB with spaces."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return _members(run_dir / "record.rank0.json.gz", b'{"kind": "stepscope.run_record"', b" " * MIB, int(gib * 1024), b"}")


def zeros_samples(run_dir: Path, source_record: Path, gib: float = 5.0) -> Path:
    """A valid record (copied from ``source_record``) beside a samples file of ``gib`` GiB of NUL bytes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "record.rank0.json.gz").write_bytes(Path(source_record).read_bytes())
    header = b'{"type": "header", "kind": "stepscope.samples", "schema_version": 1}\n'
    return _members(run_dir / "samples.rank0.jsonl.gz", header, b"\0" * MIB, int(gib * 1024), b"\n")


def note_flood_samples(run_dir: Path, source_record: Path, gib: float = 5.0) -> Path:
    """A samples file of ``gib`` GiB of valid, repeated lines."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "record.rank0.json.gz").write_bytes(Path(source_record).read_bytes())
    header = b'{"type": "header", "kind": "stepscope.samples", "schema_version": 1}\n'
    line = b'{"type": "note", "ts_ns": 1, "text": "x"}\n'
    return _members(run_dir / "samples.rank0.jsonl.gz", header, line * (MIB // len(line)), int(gib * 1024), b"")


TRACES = {"whitespace.json.gz": whitespace_trace, "leading_whitespace.json.gz": leading_whitespace_trace,
          "huge_event.json.gz": huge_event_trace}
RUNS = {"zeros_record": zeros_record, "whitespace_record": whitespace_record}
RUNS_WITH_RECORD = {"zeros_samples": zeros_samples, "note_flood_samples": note_flood_samples}


def generate(out: Path, source_record: Path) -> list[Path]:
    """Every generated input under ``out``: trace files and run directories."""
    out.mkdir(parents=True, exist_ok=True)
    made = [make(out / name) for name, make in TRACES.items()]
    made += [make(out / name).parent for name, make in RUNS.items()]
    made += [make(out / name, source_record).parent for name, make in RUNS_WITH_RECORD.items()]
    return made


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    for item in generate(Path(sys.argv[1]), here / "valid_run" / "record.rank0.json.gz"):
        print(item)
