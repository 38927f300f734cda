"""The critical path's array passes against the loops they replace: the nesting walk by arrays
(with ends cut at a fixed point) against the walk event by event, and the longest path by chains
against the edge-by-edge programme. The golden digests (``test_critical_path_golden.py``) hold
the whole result; these hold each pass on its own, on traces with out-of-order stacks and on
random graphs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from reference_traces import VENDORED

from stepscope.analysis.trace import critical_path as cp
from stepscope.analysis.trace.critical_path import host_edges, longest
from stepscope.analysis.trace.critical_path.graph import Graph
from stepscope.traces.load import load_trace

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"
TRACES = [
    DATA / "cpu_train.pt.trace.json.gz",  # threads whose events outlive their parents
    DATA / "cpu_compiled_graph_break.pt.trace.json.gz",
    VENDORED / "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    VENDORED / "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz",
]


def _everything(events) -> list:
    out = []
    for hta in (False, True):
        for annotation, instance in (("", 0), ("ProfilerStep", 0), ("ProfilerStep", 1)):
            found = cp.critical_path(events, annotation=annotation, instance=instance, hta=hta, keep_graph=True)
            out.append(None if found is None else (found.graph, found.path, found.bound_us, found.notes, found.length_us))
    return out


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name)
def test_the_walk_by_arrays_is_the_walk_event_by_event(trace, monkeypatch):
    events = load_trace(trace).events
    by_arrays = _everything(events)
    events = load_trace(trace).events
    monkeypatch.setattr(host_edges, "_walk_nested", lambda *args: None)  # every thread event by event
    assert _everything(events) == by_arrays


def test_the_out_of_order_trace_is_walked_by_arrays(monkeypatch):
    """cpu_train has events that outlive their parents: the arrays still walk every thread (the
    cut ends found in a few rounds), so the test above compares the two on cut ends."""
    walked = []
    monkeypatch.setattr(host_edges, "_walk", lambda *args: walked.append(1) or pytest.fail("walked event by event"))
    found = cp.critical_path(load_trace(TRACES[0]).events, annotation="")
    assert found is not None and any("outlives its parent" in note for note in found.notes)
    assert not walked


def _random_graph(rng: np.random.Generator, n: int, edges: int) -> Graph:
    graph = Graph(np.arange(n, dtype=np.float64), np.arange(n, dtype=np.int64), np.ones(n, dtype=bool), np.zeros(n))
    u = rng.integers(0, n - 1, edges)
    v = np.minimum(u + rng.integers(1, 4, edges), n - 1)  # mostly chains, some merges and forks
    graph.u, graph.v = u.astype(np.int64), v.astype(np.int64)
    graph.weight = rng.integers(0, 4, edges).astype(np.float64)  # whole µs, many ties
    return graph


@pytest.mark.parametrize("seed", range(20))
def test_the_longest_path_by_chains_is_the_programme_edge_by_edge(seed):
    rng = np.random.default_rng(seed)
    graph = _random_graph(rng, int(rng.integers(2, 400)), int(rng.integers(1, 600)))
    us, vs, weights = graph.u, graph.v, graph.weight
    order = np.argsort(vs, kind="stable")
    dist, via = longest._each_edge(len(graph), us, vs, weights, order)
    end = int(np.argmax(dist))
    expected = longest._walk_back(end, us, via, float(dist[end]))
    chained, chosen, chains = longest._chains_first(len(graph), us, vs, weights, order)
    assert chained.tolist() == dist.tolist() and chosen.tolist() == via.tolist()
    assert longest._walk_back_chains(end, us, chosen, chains, float(dist[end])) == expected
    assert longest.longest_path_forward(graph) == expected


def test_fractional_weights_take_the_programme_edge_by_edge(monkeypatch):
    """Sums of fractions depend on their order: the chains (which add in another order) are not used."""
    graph = _random_graph(np.random.default_rng(1), 50, 80)
    graph.weight = graph.weight + 0.1
    monkeypatch.setattr(longest, "_chains_first", lambda *args: pytest.fail("chains with fractional weights"))
    assert longest.longest_path_forward(graph) is not None


@pytest.mark.parametrize("seed", range(20))
def test_networkx_order_by_chains_is_the_programme_edge_by_edge(seed, monkeypatch):
    """HTA's mode (and a graph with an edge going back in time): the generations' order, then the
    programme on the renumbered nodes, against networkx's programme node by node."""
    rng = np.random.default_rng(seed)
    graph = _random_graph(rng, int(rng.integers(2, 300)), int(rng.integers(1, 500)))
    shuffled = rng.permutation(len(graph)).astype(np.int64)  # edges no longer go forward
    graph.u, graph.v = shuffled[graph.u], shuffled[graph.v]
    by_chains = longest.longest_path(graph, exact=True)
    monkeypatch.setattr(longest, "_exact_in_any_order", lambda weights: False)
    assert by_chains == longest.longest_path(graph, exact=True)
    assert by_chains is not None


def _out_of_order_trace(rng: np.random.Generator) -> dict:
    """One thread of CPU operators nested a few levels deep, where some children outlive their
    parents: by less than the gap to the next start (cutting them changes no nesting) or past the
    next starts (the nesting read from the cut ends changes, and the ends are cut again)."""
    events: list[dict] = []

    def children(start: int, end: int, depth: int) -> None:
        at = start + int(rng.integers(1, 4))
        while at < end - 4 and len(events) < 120:
            length = int(rng.integers(2, max(3, (end - at) // 2)))
            stop = min(at + length, end - 1)
            events.append({"ph": "X", "cat": "cpu_op", "name": f"op{depth}", "pid": 1, "tid": 1, "ts": at,
                           "dur": stop - at})
            if depth < 4 and stop - at > 8:
                children(at, stop, depth + 1)
            if rng.random() < 0.4:  # this child outlives its parent: a little, or past later starts
                events[-1]["dur"] += 1 if rng.random() < 0.5 else int(rng.integers(5, 40))
            at = stop + int(rng.integers(1, 6))

    events.append({"ph": "X", "cat": "cpu_op", "name": "step", "pid": 1, "tid": 1, "ts": 0, "dur": 400})
    children(0, 400, 1)
    return {"traceEvents": events}


@pytest.mark.parametrize("seed", range(12))
def test_random_out_of_order_stacks_walk_by_arrays_as_event_by_event(seed, tmp_path, monkeypatch):
    """The fixed point of cut ends (8 to 29 rounds on these seeds: the cuts cross later starts and
    change the nesting they were read from) gives the walk event by event, edge for edge."""
    import json

    path = tmp_path / "trace.json"
    path.write_text(json.dumps(_out_of_order_trace(np.random.default_rng(seed))))
    walked: list[int] = []
    real_walk = host_edges._walk
    monkeypatch.setattr(host_edges, "_walk", lambda *args: walked.append(1) or real_walk(*args))
    by_arrays = _everything(load_trace(path).events)
    assert not walked and by_arrays[0] is not None and any("outlives its parent" in note for note in by_arrays[0][3])
    monkeypatch.setattr(host_edges, "_walk_nested", lambda *args: None)
    assert _everything(load_trace(path).events) == by_arrays
