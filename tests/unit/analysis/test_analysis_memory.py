"""What a trace's analysis holds in memory: id and position columns are int32 whenever every value
fits (a trace whose ids do not fit keeps int64 and gives the same numbers), the analysis's
allocations per event stay under a bound, and freed heap pages go back to the system."""

from __future__ import annotations

import gzip
import json
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from stepscope import heap
from stepscope.analysis.trace.op_tree import build_op_tree
from stepscope.analysis.trace.rank_analysis import analyze_rank
from stepscope.traces.events import narrowed
from stepscope.traces.links import links_of
from stepscope.traces.load import load_trace

REFERENCE = Path(__file__).resolve().parents[2] / "data" / "traces" / "reference"
RESNET = REFERENCE / "kineto_tb_plugin" / "samples" / "resnet50_num_workers_0" / "worker0.1623143089861.pt.trace.json.gz"
ALEXNET = REFERENCE / "hta" / "critical_path" / "alexnet" / "benchmark_result_2869224_1695835535_trace.json.gz"

#: Added to every correlation and external id of the wide copy: far beyond int32.
WIDE = 1 << 40


def test_narrowed_keeps_values_and_falls_back_to_int64():
    small = np.array([-1, 0, 7, 2**31 - 1], dtype=np.int64)
    assert narrowed(small).dtype == np.int32 and narrowed(small).tolist() == small.tolist()
    wide = np.array([-1, 2**31], dtype=np.int64)
    assert narrowed(wide).dtype == np.int64 and narrowed(wide).tolist() == wide.tolist()
    assert narrowed(np.zeros(0, dtype=np.int64)).dtype == np.int64


def test_ids_positions_and_tree_are_int32_on_an_ordinary_trace():
    events = load_trace(RESNET).events
    for column in (events.external_id, events.correlation, events.stream, events.device):
        assert column.dtype == np.int32
    links = links_of(events)
    for column in (links.launcher, links.step_number, links.hta.index, links.hta.cpu_link):
        assert column.dtype == np.int32
    tree = build_op_tree(links)
    assert tree.rows.dtype == tree.parent.dtype == tree.alias.dtype == np.int32


def _widened(source: Path, target: Path) -> Path:
    document = json.loads(gzip.decompress(source.read_bytes()))
    for event in document["traceEvents"]:
        args = event.get("args")
        if not isinstance(args, dict):
            continue
        for key in ("correlation", "External id", "external id", "wait_on_cuda_event_record_corr_id"):
            if isinstance(args.get(key), int) and args[key] >= 0:
                args[key] += WIDE
    target.write_bytes(gzip.compress(json.dumps(document).encode()))
    return target


@pytest.mark.parametrize("source", [RESNET, ALEXNET], ids=["resnet50", "alexnet"])
def test_ids_beyond_int32_stay_int64_and_change_no_number(tmp_path, source):
    wide = load_trace(_widened(source, tmp_path / "wide.json.gz"))
    assert wide.events.correlation.dtype == np.int64 and wide.events.correlation.max() > WIDE
    narrow = load_trace(source)
    assert narrow.events.correlation.dtype == np.int32
    first, second = analyze_rank(narrow).to_dict(), analyze_rank(wide).to_dict()
    first.pop("path"), second.pop("path")
    assert first == second


def test_the_analysis_allocates_under_380_bytes_an_event():
    """resnet50_num_workers_0 (44,666 events): the views' peak allocation beyond the loaded table
    (numpy's arrays included) was 431 bytes an event with int64 ids and positions, every operator
    column alive at once and the critical path's launch bookkeeping in Python dicts; 347 now."""
    trace = load_trace(RESNET)
    events = len(trace.events)
    tracemalloc.start()
    try:
        analyze_rank(trace)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak / events < 380, f"{peak / events:.0f} bytes an event"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's (Linux)")
def test_trim_hands_freed_heap_pages_back():
    def resident() -> int:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1])

    # many arrays of 1 MiB: under glibc's mmap threshold once it has risen, so they come from the heap
    blocks = [np.ones(1 << 17) for _ in range(8)]
    del blocks
    large = [np.ones(4 << 20) for _ in range(2)]  # a freed 32 MiB block raises the threshold
    del large
    blocks = [np.ones(1 << 17) for _ in range(200)]  # 200 MiB from the heap
    kept = blocks[-1]
    del blocks
    before = resident()
    trimmed = heap.trim()
    after = resident()
    assert kept.sum() == 1 << 17
    if not trimmed and after == before:
        pytest.skip("this C library has no malloc_trim (not glibc)")
    assert (before - after) * 4096 > 100 << 20, (before, after)
