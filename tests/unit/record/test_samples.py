"""The samples file: columns round-trip, delta encoding, a killed writer, bad files, the clock."""

from __future__ import annotations

import gzip
import sys
import time

import numpy as np
import orjson
import pytest

from stepscope.errors import InputError
from stepscope.record.samples import (
    SAMPLES_KIND,
    SERIES_COLUMNS,
    SamplesBuilder,
    SamplesWriter,
    load_samples,
    sample_to_chunk,
)

META = {"rank": 0, "target_pid": 100, "interval_s": 0.1, "cpus": [0, 1], "cpu_count": 2, "disks": ["vda"],
        "nics": ["eth0"], "gpus": [{"index": 0, "name": "fake", "uuid": "GPU-1", "memory_total_bytes": 1000}],
        "mem_total_bytes": 8 << 30, "clock_ticks_per_s": 100}


def make_sample(index: int, *, procs: tuple[int, ...] = (0,), gpu: bool = True) -> dict:
    """A sample as the sampler produces it; counters grow with ``index``."""
    sample = {
        "ts_ns": 1_000_000_000 + index * 100_000_000,
        "cpu_user": [10 * index, 5 * index], "cpu_system": [index, index], "cpu_idle": [0, 4 * index],
        "cpu_iowait": [0, index], "cpu_steal": [0, 0], "procs_running": 3, "procs_blocked": 0,
        "load1": 1.5 + index / 100, "mem_used_bytes": (1 << 30) + index * 4096, "mem_available_bytes": 7 << 30,
        "mem_cached_bytes": 1 << 29, "swap_used_bytes": 0, "swap_in_bytes": 0, "swap_out_bytes": index * 4096,
        "disk_read_bytes": [2**40 + index * 512], "disk_write_bytes": [-1], "disk_reads": [index], "disk_writes": [0],
        "net_recv_bytes": [index * 1500], "net_sent_bytes": [index * 60], "tree_unseen_cpu_ticks": 3 * index,
        "proc": {"id": list(procs), "cpu_ticks": [index * 10] * len(procs), "rss_bytes": [1 << 20] * len(procs),
                 "read_bytes": [0] * len(procs), "write_bytes": [0] * len(procs), "read_chars": [index] * len(procs),
                 "threads": [4] * len(procs), "state": ["R"] * len(procs)},
    }
    if gpu:
        sample.update({"gpu_util": [index % 100], "gpu_mem_util": [10], "gpu_mem_used_bytes": [500],
                       "gpu_sm_clock_mhz": [-1], "gpu_power_mw": [250_000], "gpu_temp_c": [40],
                       "gpu_pcie_tx_bytes_per_s": [-1], "gpu_pcie_rx_bytes_per_s": [-1], "gpu_procs_read": 1,
                       "gproc": {"gpu": [0], "pid": [100], "mem_bytes": [400]}})
    return sample


def write_file(path, count: int = 25, flush_every: int = 10):
    writer = SamplesWriter(path, META)
    writer.add_event({"type": "process", "id": 0, "pid": 100, "ppid": 1, "name": "python", "uid": 0, "role": "main",
                      "cmdline": ["python", "t.py"], "start_ns": 5, "first_seen_ns": 1_000_000_000})
    writer.note(1_000_000_000, "GPU 0: power unavailable")
    for index in range(count):
        writer.add(make_sample(index))
        if (index + 1) % flush_every == 0:
            writer.flush()
    writer.add_event({"type": "exit", "id": 0, "ts_ns": 9})
    writer.close()
    return path


def test_round_trip_keeps_every_value(tmp_path):
    samples = load_samples(write_file(tmp_path / "s.jsonl.gz"))
    assert len(samples) == 25 and not samples.truncated
    assert samples.meta.cpus == (0, 1) and samples.meta.gpus[0].memory_total_bytes == 1000
    expected = [make_sample(index) for index in range(25)]
    for name in SERIES_COLUMNS:
        column = samples[name]
        assert column.shape[0] == 25, name
        np.testing.assert_array_equal(column, np.asarray([item[name] for item in expected]), err_msg=name)
    assert samples["disk_write_bytes"][0, 0] == -1  # "not measured" survives delta encoding
    assert samples["disk_read_bytes"][-1, 0] == 2**40 + 24 * 512
    assert samples.proc["sample"].tolist() == list(range(25))
    assert samples.proc["state"].tolist() == ["R"] * 25
    assert samples.gpu_procs["pid"].tolist() == [100] * 25
    (main,) = samples.processes
    assert (main.pid, main.role, main.cmdline, main.end_ns) == (100, "main", ("python", "t.py"), 9)
    assert samples.notes == ("GPU 0: power unavailable",)


def test_file_is_multi_member_gzip_of_json_lines(tmp_path):
    path = write_file(tmp_path / "s.jsonl.gz")
    lines = [orjson.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()]
    assert lines[0]["type"] == "header" and lines[0]["kind"] == SAMPLES_KIND
    assert [line["count"] for line in lines if line["type"] == "samples"] == [10, 10, 5]
    assert path.read_bytes().count(b"\x1f\x8b\x08") >= 4  # header + one member per flush


def test_delta_encoding_is_lossless_with_resets_and_missing_values():
    rows = [[5, -1], [7, -1], [3, 10], [3, 12]]  # a counter reset, then a device appearing
    chunk = sample_to_chunk([{"ts_ns": i, "disk_read_bytes": row} for i, row in enumerate(rows)], delta=True)
    builder = SamplesBuilder({**META, "disks": ["a", "b"]})
    builder.add_chunk(orjson.loads(orjson.dumps(chunk)))
    assert builder.freeze()["disk_read_bytes"].tolist() == rows


def test_missing_columns_read_as_unknown(tmp_path):
    builder = SamplesBuilder(META)
    builder.add(make_sample(0, gpu=False))
    samples = builder.freeze()
    assert samples["gpu_util"].shape == (1, 1) and samples["gpu_util"][0, 0] == -1
    assert samples.gpu_procs["pid"].size == 0


@pytest.mark.parametrize("cut, kept", [(1, 25), (7, 25), (40, 20), (150, 20)])
def test_killed_writer_leaves_a_readable_prefix(tmp_path, cut, kept):
    """Cut in the gzip trailer: the member's data is whole. Cut in its data: the member is dropped."""
    path = write_file(tmp_path / "s.jsonl.gz")
    data = path.read_bytes()
    path.write_bytes(data[:-cut])  # the last member is cut short, as when the sampler is SIGKILLed
    samples = load_samples(path)
    assert samples.truncated
    assert len(samples) == kept
    assert samples["ts_ns"][-1] == make_sample(kept - 1)["ts_ns"]
    assert any("ends early" in note for note in samples.notes)


def test_file_cut_inside_the_header_is_empty_not_an_error(tmp_path):
    path = write_file(tmp_path / "s.jsonl.gz")
    path.write_bytes(path.read_bytes()[:15])
    samples = load_samples(path)
    assert len(samples) == 0 and samples.truncated and samples.notes


def test_empty_file_is_empty_samples(tmp_path):
    path = tmp_path / "s.jsonl.gz"
    path.write_bytes(b"")
    assert len(load_samples(path)) == 0


@pytest.mark.parametrize("content, message", [
    (b"hello", "not a gzip file"),
    (gzip.compress(b'{"type": "header", "kind": "something.else"}\n', mtime=0), "not a stepscope samples file"),
    (gzip.compress(orjson.dumps({"type": "header", "kind": SAMPLES_KIND, "schema_version": 99}) + b"\n", mtime=0),
     "upgrade"),
    (gzip.compress(orjson.dumps({"type": "header", "kind": SAMPLES_KIND, "schema_version": 1}) + b"\n{bad\n{}\n",
                   mtime=0), "damaged samples"),
    (gzip.compress(orjson.dumps({"type": "header", "kind": SAMPLES_KIND, "schema_version": 1,
                                 "clock_ticks_per_s": 0}) + b"\n", mtime=0), "damaged samples header.*tick rate"),
], ids=["not-gzip", "other-kind", "newer-schema", "damaged", "zero-tick-rate"])  # stable ids (pytest-xdist)
def test_bad_files_raise_input_error_with_the_path(tmp_path, content, message):
    path = tmp_path / "s.jsonl.gz"
    path.write_bytes(content)
    with pytest.raises(InputError, match=message) as caught:
        load_samples(path)
    assert str(path) in str(caught.value)


def test_missing_file_is_input_error(tmp_path):
    with pytest.raises(InputError, match="cannot read samples"):
        load_samples(tmp_path / "nope.jsonl.gz")


def test_writer_flushes_each_member_to_the_file_at_once(tmp_path):
    path = tmp_path / "s.jsonl.gz"
    writer = SamplesWriter(path, META)
    writer.add(make_sample(0))
    writer.flush()
    assert len(load_samples(path)) == 1  # readable while the writer is still open
    writer.close()


@pytest.mark.skipif(sys.platform != "linux", reason="CLOCK_MONOTONIC is shared by both calls on Linux only")
def test_sample_clock_is_the_step_clock():
    """Samples use monotonic_ns, steps perf_counter_ns: on Linux the same clock, so they join."""
    before = time.perf_counter_ns()
    middle = time.monotonic_ns()
    after = time.perf_counter_ns()
    assert before <= middle <= after


def test_load_record_attaches_samples(tmp_path):
    from stepscope.record import layout
    from stepscope.record.store import load_record, save_record
    from stepscope.record.run import RunMeta, RunRecord, StepTable

    record = RunRecord(meta=RunMeta(rank=0), steps=StepTable.empty())
    save_record(record, layout.record_path(tmp_path, 0))
    write_file(layout.samples_path(tmp_path, 0))
    loaded = load_record(tmp_path)
    assert len(loaded.samples) == 25


def _with_leader_ticks(path, values: list) -> None:
    writer = SamplesWriter(path, META)
    writer.add_event({"type": "process", "id": 0, "pid": 100, "ppid": 1, "name": "python", "uid": 0, "role": "main",
                      "cmdline": ["python", "t.py"], "start_ns": 5, "first_seen_ns": 1_000_000_000})
    for index, value in enumerate(values):
        sample = make_sample(index)
        sample["proc"]["leader_ticks"] = [value]
        writer.add(sample)
        writer.flush()  # a member each: a damaged one before the last is damage, not a cut-short end
    writer.close()


def test_the_main_thread_s_ticks_are_read_and_a_damaged_column_is_an_input_error(tmp_path):
    _with_leader_ticks(tmp_path / "s.jsonl.gz", [0, 4, 8])
    assert load_samples(tmp_path / "s.jsonl.gz").proc["leader_ticks"].tolist() == [0, 4, 8]
    write_file(tmp_path / "older.jsonl.gz", count=3)  # written before the column: unknown
    assert load_samples(tmp_path / "older.jsonl.gz").proc["leader_ticks"].tolist() == [-1, -1, -1]
    damaged = tmp_path / "damaged.jsonl.gz"
    _with_leader_ticks(damaged, [0, "x", 8])
    with pytest.raises(InputError, match="damaged samples") as caught:
        load_samples(damaged)
    assert str(damaged) in str(caught.value)
