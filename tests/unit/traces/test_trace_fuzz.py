"""Property test: damaged traces, run records and samples files never crash with a traceback.

Mutations of a real recorded trace, of a record and of a samples file: truncation, byte flips,
insertions and deletions, structural edits of the decoded document (wrong types, missing fields,
absurd values), and gzip damage. The only outcomes allowed are success or InputError; whatever
loads must also survive every analysis (traces) or the whole report, text and JSON (runs); each
input must load within a memory bound.

The CI run draws 680 inputs (~20 s on a 2-core machine): 280 traces, 200 records, 200 samples files.
``STEPSCOPE_FUZZ_SCALE=N`` multiplies every count by N for a longer local run.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tempfile
import tracemalloc
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope.analysis.trace.rank_analysis import analyze_rank
from stepscope.errors import InputError
from stepscope.traces.load import load_trace

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"
VALID_RUN = Path(__file__).resolve().parents[2] / "data" / "hostile" / "valid_run"
SCALE = max(1, int(os.environ.get("STEPSCOPE_FUZZ_SCALE", "1")))
MEMORY_BOUND = 256 * 1024 * 1024  # peak Python allocations while one (small) input loads and renders


def _examples(count: int) -> int:
    return 2 * count * SCALE
RAW = (DATA / "cpu_plain.pt.trace.json").read_bytes()
DOC = json.loads(RAW)
WEIRD = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False), st.text(max_size=5), st.lists(st.integers(), max_size=2), st.builds(dict),
)


def _check(data: bytes, suffix: str = ".json") -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"trace{suffix}"
        path.write_bytes(data)
        try:
            trace = load_trace(path)
        except InputError as exc:
            assert str(path) in str(exc)
            return
        analyze_rank(trace)


def _mutate_bytes(data, raw: bytes) -> bytes:
    raw = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["truncate", "flip", "insert", "delete"]))
        pos = data.draw(st.integers(0, max(len(raw) - 1, 0)))
        if kind == "truncate":
            del raw[pos:]
        elif kind == "flip" and raw:
            raw[pos] = data.draw(st.integers(0, 255))
        elif kind == "insert":
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif raw:
            del raw[pos : pos + data.draw(st.integers(1, 16))]
    return bytes(raw)


def _paths(node, prefix=()):
    """Every path into a JSON document (the first 3 items of each list)."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node[:3]):
            yield from _paths(value, (*prefix, index))


def _mutate_document(data, document):
    document = json.loads(json.dumps(document))
    paths = [path for path in _paths(document) if path]
    if not paths:  # a scalar or an emptied object (an earlier mutation of the same line): nothing to reach
        return document
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        node = document
        try:
            for key in path[:-1]:
                node = node[key]
            if data.draw(st.booleans()) and isinstance(node, dict):
                node.pop(path[-1], None)
            else:
                node[path[-1]] = data.draw(WEIRD)
        except (KeyError, IndexError, TypeError):
            continue
    return document


def _check_run(record: bytes, samples: bytes | None) -> None:
    """``stepscope report`` on a run directory, text and JSON: success or InputError, bounded memory."""
    import orjson

    from stepscope.pipeline.diagnose import diagnose
    from stepscope.pipeline.inputs import load_run
    from stepscope.report.render import Output, render

    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder)
        (run_dir / "record.rank0.json.gz").write_bytes(record)
        if samples is not None:
            (run_dir / "samples.rank0.jsonl.gz").write_bytes(samples)
        tracemalloc.start()
        try:
            try:
                inputs = load_run(run_dir)
            except InputError as exc:
                assert str(run_dir) in str(exc) and "\n" not in str(exc)
                return
            finally:
                peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < MEMORY_BOUND, peak
        report = diagnose(inputs)
        render(report, "text", Output(stream=io.StringIO(), width=100, run_dir=str(run_dir)))
        orjson.dumps(report.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


RECORD = (VALID_RUN / "record.rank0.json.gz").read_bytes()
SAMPLES = (VALID_RUN / "samples.rank0.jsonl.gz").read_bytes()
RECORD_DOC = json.loads(gzip.decompress(RECORD))
SAMPLE_LINES = gzip.decompress(SAMPLES).split(b"\n")


@settings(max_examples=_examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_byte_mutations(data):
    _check(_mutate_bytes(data, RAW))


@settings(max_examples=_examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_structural_mutations(data):
    doc = json.loads(json.dumps(DOC))
    events = doc["traceEvents"]
    for _ in range(data.draw(st.integers(1, 6))):
        event = events[data.draw(st.integers(0, len(events) - 1))]
        if not isinstance(event, dict):
            continue
        key = data.draw(st.sampled_from(["ts", "dur", "name", "cat", "ph", "pid", "tid", "args"]))
        if data.draw(st.booleans()):
            event.pop(key, None)
        else:
            event[key] = data.draw(WEIRD)
        if isinstance(event.get("args"), dict):
            arg = data.draw(st.sampled_from(["External id", "correlation", "stream", "Input Dims", "Bytes"]))
            event["args"][arg] = data.draw(WEIRD)
    if data.draw(st.booleans()):
        doc["traceEvents"] = data.draw(st.sampled_from([None, 3, "x", {}, events[:1]]))
    _check(json.dumps(doc).encode())


@settings(max_examples=_examples(20), deadline=None)
@given(st.integers(0, 2000), st.integers(0, 255))
def test_gzip_damage(pos, value):
    packed = bytearray(gzip.compress(RAW))
    packed[pos % len(packed)] = value
    _check(bytes(packed), ".json.gz")


SHARED_GPU = DATA / "reference" / "hta" / "critical_path" / "cuda_event_sync" / "event_sync_trace.json.gz"


@settings(max_examples=_examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_gpu_trace_mutations(data):
    doc = json.loads(gzip.decompress(SHARED_GPU.read_bytes()))
    events = [e for e in doc["traceEvents"] if isinstance(e, dict)]
    for _ in range(data.draw(st.integers(1, 8))):
        event = events[data.draw(st.integers(0, len(events) - 1))]
        key = data.draw(st.sampled_from(["ts", "dur", "name", "cat", "pid", "tid"]))
        event[key] = data.draw(WEIRD)
        args = event.setdefault("args", {})
        if isinstance(args, dict):
            arg = data.draw(st.sampled_from(["correlation", "stream", "External id", "blocks per SM", "device"]))
            args[arg] = data.draw(WEIRD)
    doc["traceEvents"] = events
    _check(json.dumps(doc).encode())


# -- run records and samples files ----------------------------------------------------------------
@settings(max_examples=_examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_record_structural_mutations(data):
    document = _mutate_document(data, RECORD_DOC)
    _check_run(gzip.compress(json.dumps(document).encode()), SAMPLES)


@settings(max_examples=_examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_record_byte_mutations(data):
    raw = _mutate_bytes(data, gzip.decompress(RECORD))
    packed = gzip.compress(raw)
    if data.draw(st.booleans()):  # damage the gzip itself too
        packed = _mutate_bytes(data, packed)
    _check_run(packed, None)


@settings(max_examples=_examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_samples_structural_mutations(data):
    lines = list(SAMPLE_LINES)
    for _ in range(data.draw(st.integers(1, 3))):
        index = data.draw(st.integers(0, len(lines) - 1))
        try:
            item = json.loads(lines[index])
        except ValueError:
            continue
        lines[index] = json.dumps(_mutate_document(data, item)).encode()
    _check_run(RECORD, gzip.compress(b"\n".join(lines)))


@settings(max_examples=_examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_samples_byte_mutations(data):
    if data.draw(st.booleans()):
        samples = gzip.compress(_mutate_bytes(data, gzip.decompress(SAMPLES)))
    else:
        samples = _mutate_bytes(data, SAMPLES)  # the multi-member gzip itself
    _check_run(RECORD, samples)


def test_a_samples_file_with_a_huge_process_id_is_read_without_a_table_that_long():
    """Found by test_samples_structural_mutations: a process id of 3,433,353,273 (or 25,281,482,809)
    in one sample made the per-process tables allocate 25 GiB (a MemoryError, not a report)."""
    lines = list(SAMPLE_LINES)
    changed = 0
    for index, line in enumerate(lines):
        try:
            item = json.loads(line)
        except ValueError:
            continue
        ids = item.get("proc", {}).get("id") if isinstance(item, dict) and isinstance(item.get("proc"), dict) else None
        if isinstance(ids, list) and len(ids) > 1:
            ids[1] = 3_433_353_273 if changed == 0 else 25_281_482_809
            lines[index] = json.dumps(item).encode()
            changed += 1
            if changed == 2:
                break
    assert changed == 2, "the fixture's samples have per-process columns"
    _check_run(RECORD, gzip.compress(b"\n".join(lines)))
