"""The history of runs: one row per run in a local SQLite file (``stepscope runs``, ``diff --baseline``).

The run directories stay the source of truth; the index holds each run's key facts and summary
numbers so that runs can be listed, filtered, plotted and picked as a baseline without opening
them, and it is rebuilt from the directories by :func:`reindex` (``stepscope runs --reindex DIR``).
Rows whose directory is gone are shown as such and skipped as baselines.

Where: ``$STEPSCOPE_INDEX`` (a file path; ``off`` disables indexing), else
``$XDG_DATA_HOME/stepscope/runs.sqlite`` (``~/.local/share/stepscope/runs.sqlite``).

Concurrency: every write is one short transaction (``BEGIN IMMEDIATE``, upsert keyed by the run
directory) in WAL mode with a 30 s busy timeout, so runs finishing at the same moment — several
``stepscope run`` processes, the ranks of a torchrun job — queue for the write lock instead of
failing; in a job only rank 0 writes (the job's merged numbers). An index that cannot be written is
one warning: it never fails the run.

Reading (``stepscope runs``, baselines, repeats) opens the file read-only and writes nothing, so a
history on a read-only file or mount (a shared team index, a copied backup) lists as usual: the
connection is ``mode=ro``, and where SQLite cannot set up its WAL shared memory beside the file (a
read-only directory without the ``-shm`` file), ``immutable=1`` — nobody can be writing there.

Rows are built from a run's report by :mod:`stepscope.pipeline.history` (``publish_run`` calls
it); this module is the storage alone. Stored text went through capture's redaction (:mod:`stepscope.redact`): argv is redacted before
it reaches the record, and the index reads the record.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from stepscope.errors import UsageError

SCHEMA = 1
BUSY_TIMEOUT_S = 30.0

_COLUMNS = (
    ("run_dir", "TEXT PRIMARY KEY"),
    ("started_at", "REAL"),  # unix seconds
    ("script", "TEXT"),
    ("argv", "TEXT"),
    ("tags", "TEXT"),  # JSON list
    ("host", "TEXT"),
    ("git_commit", "TEXT"),
    ("torch_version", "TEXT"),
    ("world_size", "INTEGER"),
    ("exit_code", "INTEGER"),
    ("steps", "INTEGER"),
    ("steady_steps", "INTEGER"),
    ("step_time_s", "REAL"),  # mean steady step
    ("step_time_median_s", "REAL"),
    ("steps_per_s", "REAL"),
    ("samples_per_s", "REAL"),
    ("data_wait", "REAL"),  # phase shares of the steady step
    ("forward", "REAL"),
    ("backward", "REAL"),
    ("optimizer", "REAL"),
    ("communication", "REAL"),
    ("other", "REAL"),
    ("compile", "REAL"),
    ("mfu", "REAL"),
    ("top_rule", "TEXT"),
    ("top_severity", "TEXT"),
    ("top_title", "TEXT"),
    ("indexed_at", "REAL"),
    ("setup_key", "TEXT"),  # stepscope.analysis.run.diff.setup_key: runs with one key are repeats
    ("busy_share", "REAL"),  # share of the cores other processes used during the run (diff's history floor)
)
COLUMN_NAMES = tuple(name for name, _ in _COLUMNS)
#: Metrics ``stepscope runs --plot`` can draw.
PLOT_METRICS = ("step_time_s", "step_time_median_s", "steps_per_s", "samples_per_s", "data_wait", "forward",
                "backward", "optimizer", "communication", "other", "compile", "mfu")


@dataclass(frozen=True)
class IndexedRun:
    run_dir: str
    started_at: float
    script: str
    argv: str
    tags: tuple[str, ...]
    values: dict[str, Any]

    @property
    def exists(self) -> bool:
        return Path(self.run_dir).is_dir()

    def get(self, name: str) -> Any:
        return self.values.get(name)


def index_path() -> Path | None:
    """The index file, or None when indexing is switched off (``STEPSCOPE_INDEX=off``)."""
    configured = os.environ.get("STEPSCOPE_INDEX", "").strip()
    if configured.lower() in ("off", "0", "no", "false", "none"):
        return None
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "stepscope" / "runs.sqlite"


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
    connection.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    try:
        connection.execute("PRAGMA journal_mode = WAL")
    except sqlite3.OperationalError:  # a filesystem without shared memory (some network mounts)
        pass
    connection.execute(f"CREATE TABLE IF NOT EXISTS runs ({', '.join(f'{n} {t}' for n, t in _COLUMNS)})")
    present = {row[1] for row in connection.execute("PRAGMA table_info(runs)")}
    for name, kind in _COLUMNS:  # an index written by an older stepscope gains the new columns
        if name not in present:
            connection.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")
    connection.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
    connection.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
    return connection


def open_index(path: Path) -> sqlite3.Connection:
    """Open (creating) the index for writing; a file that is not a stepscope index, or one that
    cannot be written, is a usage error."""
    try:
        return _connect(path)
    except sqlite3.DatabaseError as exc:
        if "readonly" in str(exc) or "read-only" in str(exc):
            raise UsageError(f"{path}: the run index cannot be written ({exc}); it can still be listed, "
                             "or set STEPSCOPE_INDEX (or --index) to a writable file") from None
        raise _unusable(path, exc) from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot create the run index ({exc.strerror or exc}); set "
                         "STEPSCOPE_INDEX (or --index) to a writable file") from None


def _unusable(path: Path, exc: Exception) -> UsageError:
    return UsageError(f"{path}: not a usable run index ({exc}); move it away or set STEPSCOPE_INDEX "
                      "to another file")


def _uri(path: Path, option: str) -> str:
    return f"file:{quote(str(path.absolute()))}?{option}"


def open_for_reading(path: Path) -> sqlite3.Connection | None:
    """Open an existing index read-only (see the module docstring); None when it holds no runs
    table yet (an empty file). A file that is not a stepscope index is a usage error."""
    connection = None
    try:
        try:
            connection = sqlite3.connect(_uri(path, "mode=ro"), uri=True, timeout=BUSY_TIMEOUT_S,
                                         isolation_level=None)
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.OperationalError as exc:
            # WAL without a writable place for its shared memory (SQLITE_READONLY_DIRECTORY,
            # SQLITE_CANTOPEN): the file cannot be changed by anyone, read it as immutable
            if not str(getattr(exc, "sqlite_errorname", "")).startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")):
                raise
            if connection is not None:
                connection.close()
            connection = sqlite3.connect(_uri(path, "immutable=1"), uri=True, isolation_level=None)
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        if connection is not None:
            connection.close()
        raise _unusable(path, exc) from None
    if "runs" not in tables:
        connection.close()
        if tables:
            raise _unusable(path, ValueError(f"no 'runs' table; it holds {', '.join(sorted(tables))}"))
        return None
    return connection


def tags_from_env() -> tuple[str, ...]:
    """Tags from ``$STEPSCOPE_TAGS`` (comma-separated): how ``--tag`` reaches a run."""
    return tuple(tag.strip() for tag in os.environ.get("STEPSCOPE_TAGS", "").split(",") if tag.strip())


def add_run(row: dict[str, Any], path: Path | None = None) -> Path | None:
    """Upsert one row (one transaction). Returns the index path, None when indexing is off."""
    path = path or index_path()
    if path is None:
        return None
    names = [name for name in COLUMN_NAMES if name in row]
    with closing(_connect(path)) as connection:
        connection.execute("BEGIN IMMEDIATE")
        try:
            connection.execute(f"INSERT OR REPLACE INTO runs ({', '.join(names)}) VALUES "
                               f"({', '.join('?' for _ in names)})", [row[name] for name in names])
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
    return path


def drop_missing(path: Path) -> int:
    """Delete the rows whose run directory is gone; returns how many."""
    with closing(open_index(path)) as connection:
        gone = [row[0] for row in connection.execute("SELECT run_dir FROM runs") if not Path(row[0]).is_dir()]
        connection.execute("BEGIN IMMEDIATE")
        connection.executemany("DELETE FROM runs WHERE run_dir = ?", [(item,) for item in gone])
        connection.execute("COMMIT")
    return len(gone)


# -- reading --------------------------------------------------------------------------------------
def _as_run(values: dict[str, Any]) -> IndexedRun:
    try:
        tags = tuple(json.loads(values.get("tags") or "[]"))
    except ValueError:
        tags = ()
    return IndexedRun(values["run_dir"], float(values.get("started_at") or 0.0), values.get("script") or "",
                      values.get("argv") or "", tags, values)


def list_runs(path: Path, *, script: str | None = None, tag: str | None = None, since: float | None = None,
              until: float | None = None, limit: int | None = None) -> list[IndexedRun]:
    """Runs of the index, oldest first, filtered by script (substring), tag, and start time."""
    if not path.exists():
        return []
    clauses: list[str] = []
    params: list[Any] = []
    if script:
        clauses.append("script LIKE ?")
        params.append(f"%{script}%")
    if since is not None:
        clauses.append("started_at >= ?")
        params.append(since)
    if until is not None:
        clauses.append("started_at < ?")
        params.append(until)
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    connection = open_for_reading(path)
    if connection is None:
        return []
    with closing(connection):
        connection.row_factory = sqlite3.Row
        rows = _select(path, connection, f"SELECT * FROM runs{where} ORDER BY started_at", params)
    runs = [_as_run(dict(row)) for row in rows]
    if tag:
        runs = [run for run in runs if tag in run.tags]
    return runs[-limit:] if limit else runs


def repeats(path: Path | None, key: str) -> list[IndexedRun]:
    """Runs of the index with this setup key (repeats of one setup), oldest first."""
    if path is None or not path.exists():
        return []
    connection = open_for_reading(path)
    if connection is None:
        return []
    with closing(connection):
        connection.row_factory = sqlite3.Row
        rows = _select(path, connection, "SELECT * FROM runs WHERE setup_key = ? ORDER BY started_at", (key,))
    return [_as_run(dict(row)) for row in rows]


def _select(path: Path, connection: sqlite3.Connection, query: str, params: Sequence[Any]) -> list[Any]:
    try:
        return connection.execute(query, params).fetchall()
    except sqlite3.OperationalError as exc:  # an index from before a column existed has no setup_key
        if "no such column" in str(exc):
            return []
        raise _unusable(path, exc) from None
    except sqlite3.DatabaseError as exc:
        raise _unusable(path, exc) from None


def find_baseline(path: Path, spec: str, *, exclude: Iterable[str] = (), script: str | None = None) -> IndexedRun:
    """``last`` (the latest run) or a tag (its latest run), among runs whose directory still exists."""
    excluded = {str(Path(item).resolve()) for item in exclude}
    tag = None if spec == "last" else spec
    candidates = [run for run in list_runs(path, tag=tag, script=script)
                  if run.run_dir not in excluded and run.exists]
    if not candidates:
        what = "no earlier run" if tag is None else f"no run tagged {tag!r}"
        raise UsageError(f"{what} in the run index {path} (with its directory still there); "
                         "list them with 'stepscope runs', tag one with 'stepscope run --tag NAME'")
    return candidates[-1]
