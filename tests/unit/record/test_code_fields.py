"""Stack samples and GC pauses in the stored record: round trip, and old records."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from records import make_record
from stepscope.record import layout
from stepscope.record.run import GcPauses, StackFrame, StackSamples
from stepscope.record.store import document_to_record, load_record, record_to_document, save_record


def full_record():
    samples = StackSamples(
        rate_hz=100.0, mechanism="thread", frames=(StackFrame("a.py", 1, "f"), StackFrame("b.py", 2, "g")),
        stacks=((0,), (0, 1)), ts_ns=np.array([10_000, 10_500, 11_200]), step=np.array([0, 0, 1]),
        phase=np.array([4, 0, 1]), role=np.array([0, 1, 0]), pid=np.array([5, 6, 5]), stack=np.array([0, 1, 1]),
        library_paths=("/lib/",), user_paths=("/lib/zoo/",), sampler_cpu_ns=123, missed=2)
    pauses = GcPauses(enabled=True, start_ns=np.array([10_100, 12_000]), duration_ns=np.array([50, 70]),
                      generation=np.array([0, 2]), collected=np.array([1, 2]), uncollectable=np.array([0, 0]),
                      step=np.array([0, 2]), phase=np.array([4, 4]))
    return replace(make_record(), stack_samples=samples, gc_pauses=pauses)


def test_round_trip(tmp_path):
    record = full_record()
    save_record(record, layout.record_path(tmp_path, 0))
    loaded = load_record(tmp_path)
    for original, copy in ((record.stack_samples, loaded.stack_samples), (record.gc_pauses, loaded.gc_pauses)):
        for name in original.COLUMNS:
            assert np.array_equal(getattr(original, name), getattr(copy, name)), name
    assert loaded.stack_samples.frames == record.stack_samples.frames
    assert loaded.stack_samples.stacks == record.stack_samples.stacks
    assert loaded.stack_samples.library_paths == ("/lib/",)
    assert loaded.stack_samples.missed == 2 and loaded.gc_pauses.enabled


def test_records_without_the_keys_load_empty():
    document = record_to_document(make_record())
    assert "stack_samples" not in document and "gc_pauses" not in document
    loaded = document_to_record(document)
    assert len(loaded.stack_samples) == 0 and not loaded.gc_pauses.enabled


def test_a_sample_naming_an_unknown_stack_is_a_damaged_record():
    import pytest

    from stepscope.errors import InputError

    document = record_to_document(full_record())
    document["stack_samples"]["columns"]["stack"][0] = 9
    with pytest.raises(InputError, match="unknown stack"):
        document_to_record(document)
