"""The SQLite run index: concurrent writers, filters, baselines, a rebuild that tolerates deleted runs."""

from __future__ import annotations

import multiprocessing
import sqlite3

import pytest

from stepscope.errors import UsageError
from stepscope.record import run_index
from stepscope.record.run_index import add_run, find_baseline, list_runs


def _row(run_dir: str, started: float, tags=("x",), script="train.py", step=0.01) -> dict:
    import json

    return {"run_dir": run_dir, "started_at": started, "script": script, "argv": script, "tags": json.dumps(list(tags)),
            "steps": 10, "step_time_s": step, "indexed_at": started}


def _writer(args) -> None:
    path, worker, count = args
    for index in range(count):
        add_run(_row(f"/runs/{worker}-{index}", worker * 1000 + index), path)


def test_processes_writing_at_the_same_moment_all_land(tmp_path):
    path = tmp_path / "runs.sqlite"
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        pool.map(_writer, [(path, worker, 25) for worker in range(4)])
    runs = list_runs(path)
    assert len(runs) == 100 and len({run.run_dir for run in runs}) == 100
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_upsert_filters_and_baselines(tmp_path):
    path = tmp_path / "runs.sqlite"
    kept = [tmp_path / name for name in ("a", "b", "c")]
    for folder in kept:
        folder.mkdir()
    add_run(_row(str(kept[0]), 100, tags=("base",)), path)
    add_run(_row(str(kept[1]), 200, tags=()), path)
    add_run(_row(str(tmp_path / "gone"), 300, tags=("base",)), path)
    add_run(_row(str(kept[2]), 400, tags=(), script="other.py"), path)
    add_run(_row(str(kept[1]), 200, tags=("new",)), path)  # same run again: replaced, not added
    assert [run.run_dir for run in list_runs(path)] == [str(kept[0]), str(kept[1]), str(tmp_path / "gone"), str(kept[2])]
    assert [run.run_dir for run in list_runs(path, script="other")] == [str(kept[2])]
    assert [run.run_dir for run in list_runs(path, tag="new")] == [str(kept[1])]
    assert [run.run_dir for run in list_runs(path, since=150, until=350)] == [str(kept[1]), str(tmp_path / "gone")]
    # baselines skip deleted runs and the run being compared
    assert find_baseline(path, "base").run_dir == str(kept[0])
    assert find_baseline(path, "last", exclude=[kept[2]]).run_dir == str(kept[1])
    with pytest.raises(UsageError, match="no run tagged 'nope'"):
        find_baseline(path, "nope")


def test_location_opt_out_and_a_foreign_file(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPSCOPE_INDEX", "off")
    assert run_index.index_path() is None and add_run(_row("/x", 1)) is None
    monkeypatch.delenv("STEPSCOPE_INDEX")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert run_index.index_path() == tmp_path / "stepscope" / "runs.sqlite"
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(UsageError, match="not a usable run index"):
        list_runs(junk)


def test_reading_writes_nothing(tmp_path):
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    assert list_runs(empty) == [] and empty.read_bytes() == b""  # no tables created by a reader
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as connection:
        connection.execute("CREATE TABLE photos (name TEXT)")
    with pytest.raises(UsageError, match="not a usable run index .*no 'runs' table; it holds photos"):
        list_runs(other)
    path = tmp_path / "runs.sqlite"
    add_run(_row("/runs/a", 1.0), path)
    with sqlite3.connect(path) as connection:  # an index from before setup_key: repeats finds none
        connection.execute("ALTER TABLE runs DROP COLUMN setup_key")
    assert run_index.repeats(path, "key") == [] and [run.run_dir for run in list_runs(path)] == ["/runs/a"]
    columns = {row[1] for row in sqlite3.connect(path).execute("PRAGMA table_info(runs)")}
    assert "setup_key" not in columns  # reading did not migrate it
