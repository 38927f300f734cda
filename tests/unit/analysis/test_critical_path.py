"""The critical path of a traced step: HTA parity on HTA's own critical-path traces, edge for edge,
and the default mode's differences on hand-made traces with known answers."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from reference_traces import VENDORED
from trace_builders import kernel, op, runtime, table_of

from stepscope.analysis.trace import critical_path as cp
from stepscope.traces.load import load_trace

REFERENCE = Path(__file__).resolve().parents[2] / "data" / "hta_cpa"
TRACES = {
    "simple_add": "hta/critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz",
    "alexnet": "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "cuda_event_sync": "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz",
}
HTA_061 = sorted(p.name[: -len(".json.gz")] for p in REFERENCE.glob("*.json.gz") if not p.name.startswith("hta050."))


def _reference(name: str) -> dict:
    with gzip.open(REFERENCE / f"{name}.json.gz", "rt") as fh:
        return json.load(fh)


def _ours(ref: dict, trace: str):
    events = load_trace(VENDORED / TRACES[trace]).events
    found = cp.critical_path(events, annotation=ref["annotation"], instance=ref["instance"], hta=True, keep_graph=True)
    assert found is not None and found.ok
    return events, found


def _named(events, kind, weight, src, src_start, dst, dst_start):
    names = events.symbols.strings
    return (cp.HTA_EDGE_TYPES[kind], int(round(weight)), names[events.name[src]], src_start, names[events.name[dst]],
            dst_start)


@pytest.mark.parametrize("case", HTA_061)
def test_the_graph_and_the_path_are_htas(case):
    """HTA 0.6.1 (``benchmarks/hta_cpa_reference.py``): the same nodes, the same edges by their
    events, types and weights, the same path edge by edge, the same bound-by summary."""
    ref = _reference(case)
    events, found = _ours(ref, case.split(".")[0])
    assert (found.nodes, found.edges) == (ref["nodes"], ref["edges"])
    assert {cp.HTA_EDGE_TYPES[k]: v for k, v in found.edge_types.items()} == ref["edge_types"]
    ours = Counter(_named(events, *edge) for edge in found.graph)
    theirs = Counter(tuple(edge) for edge in ref["graph_edges"])
    assert ours == theirs
    path = [_named(events, e.kind, e.weight_us, e.src, e.src_start, e.dst, e.dst_start) for e in found.path]
    assert path == [tuple(edge) for edge in ref["path"]]
    assert found.length_us == ref["path_length"]
    expected = {k: 100.0 * v / ref["path_length"] for k, v in ref["bound_by_us"].items() if k}
    assert found.hta_summary() == pytest.approx(expected)


@pytest.mark.parametrize("trace", ["simple_add", "alexnet"])
def test_hta_050_agrees_where_it_has_no_runtime_lock(trace):
    ref = _reference(f"hta050.{trace}.instance1")
    events, found = _ours(ref, trace)
    assert Counter(_named(events, *edge) for edge in found.graph) == Counter(tuple(e) for e in ref["graph_edges"])
    assert found.length_us == ref["path_length"]


def test_hta_050_differs_on_one_blocking_copy():
    """HTA 0.5.0 zeroes a cudaMemcpyAsync's own edge (a blocking call); 0.6.x draws that edge in its
    runtime-lock pass with the call's duration. We follow 0.6.x: one edge, 10 µs of path."""
    ref = _reference("hta050.cuda_event_sync.step0")
    events, found = _ours(ref, "cuda_event_sync")
    ours = Counter(_named(events, *edge) for edge in found.graph)
    theirs = Counter(tuple(e) for e in ref["graph_edges"])
    assert ours - theirs == Counter({("critical_path_operator", 29, "cudaMemcpyAsync", True, "cudaMemcpyAsync", False): 1})
    assert theirs - ours == Counter({("critical_path_operator", 0, "cudaMemcpyAsync", True, "cudaMemcpyAsync", False): 1})
    assert (found.length_us, ref["path_length"]) == (2411, 2401)


def test_the_event_sync_trace_says_which_stream_the_step_waited_for():
    events = load_trace(VENDORED / TRACES["cuda_event_sync"]).events
    summary = cp.path_summary(events)
    assert summary is not None
    assert "cudaEventSynchronize waited for stream 7" in summary.syncs
    assert [s.label for s in summary.steps] == ["ProfilerStep#100"]


# --- the default mode, on hand-made traces ---------------------------------------------------

def _step(*events, start=0, dur=1000):
    return table_of(op("ProfilerStep#1", start, dur, cat="user_annotation"), *events)


def test_python_between_operators_weighs_what_it_lasted():
    """Two 100 µs operators 300 µs apart: HTA's path is 200 µs (the gap is a weightless
    dependency); ours covers the 300 µs between them as CPU time."""
    events = _step(op("aten::mm", 100, 100), op("aten::add", 500, 100))
    hta = cp.critical_path(events, hta=True)
    ours = cp.critical_path(events)
    assert hta is not None and ours is not None
    assert hta.length_us == 200 and ours.length_us == 500
    assert ours.bound_us == {cp.CPU: 500}
    assert any(e.event == cp.BETWEEN_OPS and e.weight_us == 300 for e in ours.path)


def test_gpu_bound_step_is_compute_on_the_path():
    """A 10 µs launch of a 900 µs kernel, then a stream sync and one more operator: the path is
    the launch, the kernel, the sync and the operator."""
    events = _step(
        op("aten::mm", 10, 30),
        runtime("cudaLaunchKernel", 20, 10, correlation=1),
        kernel("gemm", 40, 900, correlation=1),
        runtime("cudaStreamSynchronize", 50, 895, correlation=2),
        kernel("Stream Sync", 55, 885, correlation=2, cat="cuda_sync"),
        op("aten::add", 950, 20),
    )
    found = cp.critical_path(events)
    assert found is not None
    assert found.bound_us[cp.GPU_COMPUTE] == 900
    assert found.bound_us[cp.LAUNCH_OVERHEAD] == 20
    assert found.syncs == ("cudaStreamSynchronize waited for stream 7",)
    assert found.share(cp.GPU_COMPUTE) > 0.9


def test_without_sync_events_a_blocking_call_waits_for_the_work_that_ended_in_it():
    """Traces before PyTorch 2.1 have no cuda_sync rows: the synchronize that returned right
    after the kernel ended is taken to have waited for it (HTA has no edge back to the CPU)."""
    events = _step(
        runtime("cudaLaunchKernel", 20, 10, correlation=1),
        kernel("gemm", 40, 900, correlation=1),
        runtime("cudaDeviceSynchronize", 50, 895, correlation=2),
        op("aten::add", 960, 20),
    )
    hta = cp.critical_path(events, hta=True)
    ours = cp.critical_path(events)
    assert hta is not None and ours is not None
    assert cp.GPU_COMPUTE in ours.bound_us and ours.bound_us[cp.CPU] >= 20  # the add after the wait is on the path
    assert not any(e.kind == cp.SYNC for e in hta.path)
    assert any("no CUDA synchronisation events" in n for n in ours.notes)


def test_data_loading_is_everything_under_the_dataloader_range():
    name = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    events = _step(op(name, 0, 400, cat="user_annotation"), op("aten::stack", 50, 300), op("aten::mm", 500, 100))
    found = cp.critical_path(events)
    assert found is not None
    assert found.bound_us[cp.DATA_LOADING] == 400
    hta = cp.critical_path(events, hta=True)
    assert hta is not None and cp.DATA_LOADING not in hta.bound_us  # HTA: only for patterns it is given


def test_an_out_of_order_stack_still_has_a_path():
    """A child that outlives its parent (HTA #113: a cycle, no path) is cut at the parent's end."""
    events = _step(op("aten::outer", 100, 200), op("aten::inner", 150, 300), op("aten::next", 600, 50))
    found = cp.critical_path(events)
    assert found is not None and found.ok
    assert found.length_us == pytest.approx(550.0)
    assert any("outlives its parent" in n for n in found.notes)


def test_cuda_graph_replay_puts_every_kernel_of_the_graph_on_the_stream():
    """One cudaGraphLaunch, three kernels with its correlation. HTA keeps only the last (#290)."""
    events = _step(
        runtime("cudaGraphLaunch", 10, 20, correlation=1),
        kernel("k1", 40, 100, correlation=1), kernel("k2", 141, 100, correlation=1), kernel("k3", 242, 100, correlation=1),
        runtime("cudaStreamSynchronize", 40, 310, correlation=2),
        kernel("Stream Sync", 41, 308, correlation=2, cat="cuda_sync"),
    )
    ours = cp.critical_path(events)
    assert ours is not None
    assert ours.bound_us[cp.GPU_COMPUTE] == 300
    assert ours.bound_us[cp.GAP] == 2


def test_no_trace_rows_no_path():
    assert cp.critical_path(table_of()) is None
    assert cp.path_summary(table_of()) is None
    assert cp.critical_path(_step(op("aten::mm", 1, 2)), annotation="NoSuchThing") is None


def test_a_synchronous_launch_puts_the_device_work_on_the_path():
    """A launch call that returns only after its kernel ran (MTIA's runFunction): the path goes
    through the kernel, not through the call, and the call's own time is not counted twice."""
    events = _step(
        runtime("runFunction - job_prep_and_submit_for_execution", 10, 500, correlation=1),
        kernel("fc-dtype_Float", 30, 470, stream=1, correlation=1),
        op("aten::add", 520, 20),
    )
    found = cp.critical_path(events)
    assert found is not None
    assert found.bound_us[cp.GPU_COMPUTE] == 470
    assert found.bound_us[cp.LAUNCH_OVERHEAD] == 20
    # from the call's start: the launch (20), the kernel (470), the call's return after it (10),
    # the 10 µs before the add, the add (20)
    assert found.length_us == pytest.approx(20 + 470 + 10 + 10 + 20)
    hta = cp.critical_path(events, hta=True)
    assert hta is not None and hta.bound_us.get(cp.GPU_COMPUTE, 0) == 0  # HTA: the call's time, on the CPU


def test_the_main_thread_waiting_for_the_autograd_thread_is_not_python():
    """The main thread idles 800 µs between two operators while another thread of the process runs
    a 650 µs operator: the path goes through that operator; the gap alone would weigh 150 µs."""
    events = _step(op("aten::mm", 0, 100), op("MulBackward0", 150, 650, tid=2), op("aten::add", 900, 50))
    found = cp.critical_path(events)
    assert found is not None
    assert found.length_us == 950
    names = events.symbols.strings
    assert "MulBackward0" in {names[events.name[e.event]] for e in found.path if e.event >= 0}
    alone = cp.critical_path(_step(op("aten::mm", 0, 100), op("aten::add", 900, 50)))
    assert alone is not None and alone.length_us == 950  # the same gap with no other thread: all Python
    assert any(e.event == cp.BETWEEN_OPS and e.weight_us == 800 for e in alone.path)


def test_every_step_or_the_median_one():
    """Three steps of 100, 300 and 200 µs: the default picks the median (200 µs), 0 picks all."""
    events = table_of(
        op("ProfilerStep#1", 0, 100, cat="user_annotation"), op("aten::mm", 10, 50),
        op("ProfilerStep#2", 100, 300, cat="user_annotation"), op("aten::mm", 110, 250),
        op("ProfilerStep#3", 400, 200, cat="user_annotation"), op("aten::mm", 410, 150),
        op("ProfilerStep#4", 600, 10, cat="user_annotation"),  # HTA drops the last step's host rows
    )
    assert [p.label for p in cp.step_paths(events)] == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]
    median = cp.path_summary(events, steps=1)
    assert median is not None and [s.label for s in median.steps] == ["ProfilerStep#3"]
    assert any("covers 1 of 3 steps" in note for note in median.notes)
    every = cp.path_summary(events, steps=0)
    assert every is not None and [s.label for s in every.steps] == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]
    assert every.length_us == 50 + 250 + 150


def test_a_path_s_edges_are_rows_only_when_read_and_pickle_as_columns():
    """``critical_path`` keeps the path's edges as columns (a long step's path holds ~95,000): they
    become the same rows as the columns say when read, and a pickled path carries the columns."""
    import pickle

    from stepscope.analysis.trace.critical_path.model import KINDS, PathEdges

    found = cp.critical_path(load_trace(VENDORED / TRACES["cuda_event_sync"]).events)
    assert found is not None and isinstance(found.path, PathEdges) and found.path._rows is None
    columns = found.path_columns()
    assert len(found.path) == len(columns.kind) > 3 and found.path._rows is None
    again = pickle.loads(pickle.dumps(found))
    assert again.path._rows is None and again == found and again.path == tuple(found.path)
    assert [edge.kind for edge in found.path] == [KINDS[k] for k in columns.kind.tolist()]
    assert [edge.src for edge in found.path] == columns.src.tolist() and found.path[-1].dst_us == columns.dst_us[-1]
