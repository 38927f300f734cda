"""Run record round trip, schema versioning and damaged files."""

from __future__ import annotations

import gzip
from dataclasses import replace

import numpy as np
import orjson
import pytest

from stepscope.errors import InputError
from stepscope.record import layout
from stepscope.record.store import load_record, record_to_document, save_record
from records import make_record
from stepscope.record.run import SCHEMA_VERSION, DeviceCopy, OpCost, WorkerBatches


def test_round_trip(tmp_path):
    record = make_record()
    save_record(record, layout.record_path(tmp_path, 0))
    loaded = load_record(tmp_path)
    loaded.check()
    assert loaded.meta == record.meta
    assert loaded.loaders == record.loaders
    assert loaded.warnings == record.warnings
    assert loaded.facts == record.facts
    for name, column in record.steps.columns().items():
        assert np.array_equal(getattr(loaded.steps, name), column), name


def test_device_copies_survive_the_round_trip(tmp_path):
    copy = DeviceCopy("/w/train.py", 14, "<module>", "cpu", "cuda", 2, 8 << 20, False, False)
    record = make_record()
    record = replace(record, facts=replace(record.facts, compute=replace(record.facts.compute, copies=(copy,))))
    save_record(record, layout.record_path(tmp_path, 0))
    loaded = load_record(tmp_path).facts.compute
    assert loaded.copies == (copy,) and loaded.copies[0].to_device


def test_the_price_of_an_operator_survives_the_round_trip(tmp_path):
    cost = OpCost(3.3e-6, 3.5e-6, 433, 15, "cache", 1_700_000_000_000_000_000)
    record = replace(make_record(), facts=replace(make_record().facts, op_cost=cost))
    save_record(record, layout.record_path(tmp_path, 0))
    assert load_record(tmp_path).facts.op_cost == cost


def test_the_workers_batches_survive_the_round_trip(tmp_path):
    timed = WorkerBatches((11, 12), (5_000, 6_000), (900, 800), (100, 90), (10, -1))
    record = replace(make_record(), facts=replace(make_record().facts, worker_batches=timed))
    save_record(record, layout.record_path(tmp_path, 0))
    assert load_record(tmp_path).facts.worker_batches == timed


def test_hundred_thousand_steps_stay_compact_and_fast(tmp_path):
    import time

    record = make_record(100_000)
    path = save_record(record, tmp_path / "big.json.gz")
    assert path.stat().st_size < 3_000_000
    # CPU time of this process, not wall time: other processes on a loaded machine do not count
    started = time.process_time()
    loaded = load_record(path)
    assert time.process_time() - started < 5.0  # ~0.2 s; a quadratic or per-step-dict loader takes far more
    assert len(loaded.steps) == 100_000


def test_run_dir_with_ranks(tmp_path):
    for rank in (0, 1):
        save_record(make_record(rank=rank), layout.record_path(tmp_path, rank))
    assert layout.record_ranks(tmp_path) == [0, 1]
    assert load_record(tmp_path, rank=1).meta.rank == 1
    with pytest.raises(InputError, match="no record for rank 5"):
        load_record(tmp_path, rank=5)


def _write_doc(path, document):
    path.write_bytes(gzip.compress(orjson.dumps(document)))


@pytest.mark.parametrize("damage, message", [
    (lambda path: path.write_bytes(b"\x1f\x8b\x08\x00garbage"), "damaged gzip"),
    (lambda path: path.write_bytes(gzip.compress(b"{not json")), "not valid JSON"),
    (lambda path: _write_doc(path, {"kind": "something else"}), "not a stepscope run record"),
    (lambda path: _write_doc(path, [1, 2, 3]), "not a stepscope run record"),
    (lambda path: path.write_bytes(b""), "not valid JSON"),
])
def test_damaged_records_raise_input_error(tmp_path, damage, message):
    path = tmp_path / "record.rank0.json.gz"
    damage(path)
    with pytest.raises(InputError, match=message):
        load_record(path)


def test_truncated_record(tmp_path):
    path = save_record(make_record(), tmp_path / "record.rank0.json.gz")
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(InputError, match="damaged gzip"):
        load_record(path)


def test_newer_schema_is_rejected_with_upgrade_hint(tmp_path):
    document = record_to_document(make_record())
    document["schema_version"] = SCHEMA_VERSION + 1
    path = tmp_path / "record.rank0.json.gz"
    _write_doc(path, document)
    with pytest.raises(InputError, match="upgrade stepscope"):
        load_record(path)


@pytest.mark.parametrize("mutate", [
    lambda doc: doc["steps"]["columns"]["forward_ns"].pop(),
    lambda doc: doc["steps"]["columns"].__setitem__("other_ns", [0] * 5),
    lambda doc: doc["steps"].__setitem__("count", 7),
    lambda doc: doc.__setitem__("meta", "oops"),
    lambda doc: doc.pop("steps"),
    lambda doc: doc["facts"].__setitem__("op_cost", {"seconds_best": "fast", "seconds_median": 1e-6}),
    lambda doc: doc["facts"].__setitem__("op_cost", [3e-6]),
    lambda doc: doc["facts"].__setitem__("worker_batches", {"pid": [1, 2], "end_ns": [5], "wall_ns": [1, 1],
                                                            "cpu_ns": [0, 0], "runq_ns": [0, 0]}),
    lambda doc: doc["facts"].__setitem__("worker_batches", {"pid": [1], "end_ns": [5], "wall_ns": [-1],
                                                            "cpu_ns": [0], "runq_ns": [0]}),
    lambda doc: doc["facts"].__setitem__("worker_batches", {"pid": ["a"], "end_ns": [5], "wall_ns": [1],
                                                            "cpu_ns": [0], "runq_ns": [0]}),
])
def test_inconsistent_records_are_rejected(tmp_path, mutate):
    document = record_to_document(make_record())
    mutate(document)
    path = tmp_path / "record.rank0.json.gz"
    _write_doc(path, document)
    with pytest.raises(InputError, match="malformed run record"):
        load_record(path)


def test_missing_path(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_record(tmp_path / "nope")
    with pytest.raises(InputError, match="no run record"):
        load_record(tmp_path)


def test_record_module_does_not_need_torch():
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\n"
            "import stepscope, stepscope.record.store, stepscope.report.model, stepscope.report.render.terminal\n"
            "print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


@pytest.mark.parametrize("meta", [{"world_size": 10**12}, {"world_size": 0}, {"world_size": 2, "rank": -1},
                                  {"rank": 10**12}])
def test_a_hostile_world_size_or_rank_is_a_damaged_record(tmp_path, meta):
    """A job report lists every declared rank without a record: a record claiming a trillion ranks
    must be refused at load, not enumerated."""
    document = record_to_document(make_record())
    document["meta"].update(meta)
    path = layout.record_path(tmp_path, 0)
    path.write_bytes(gzip.compress(orjson.dumps(document)))
    with pytest.raises(InputError, match="world_size|rank"):
        load_record(tmp_path)
