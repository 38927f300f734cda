"""The operator tree's vectorised nesting gives exactly the plugin's stack walk, overlaps included."""

from __future__ import annotations

import numpy as np

from stepscope.analysis.trace.op_tree import _nested_parents, _stack_parents


def _random_rows(rng: np.random.Generator, trial: int) -> tuple[np.ndarray, np.ndarray]:
    n = int(rng.integers(1, 14))
    if trial % 3 == 0:  # anything: crossings, ties, zero durations
        starts = rng.integers(0, 30, n).astype(float)
        ends = starts + rng.integers(0, 10, n)
    else:  # properly nested, sometimes with one row stretched past its parent
        spans: list[tuple[float, float]] = []

        def nest(lo: float, hi: float, depth: int) -> None:
            t = lo
            while t < hi and len(spans) < n:
                a = t + int(rng.integers(0, 3))
                if a > hi:
                    break
                b = min(hi, a + int(rng.integers(0, 8)))
                spans.append((a, b))
                if depth < 4 and b > a:
                    nest(a, b, depth + 1)
                t = b + int(rng.integers(0, 2))

        nest(0, 60, 0)
        spans = spans or [(0.0, 1.0)]
        starts = np.array([a for a, _ in spans], dtype=float)
        ends = np.array([b for _, b in spans], dtype=float)
        if trial % 3 == 2:
            ends[int(rng.integers(0, len(ends)))] += int(rng.integers(0, 3))
    order = np.lexsort((-ends, starts))
    return starts[order], ends[order]


def test_vectorised_nesting_equals_the_stack_walk():
    rng = np.random.default_rng(7)
    for trial in range(3000):
        starts, ends = _random_rows(rng, trial)
        n = len(starts)
        want_parent, want_placed = np.full(n, -1, np.int64), np.zeros(n, bool)
        _stack_parents(starts.tolist(), ends.tolist(), 0, want_parent, want_placed)
        parent, stretches = _nested_parents(starts, ends)
        placed = np.ones(n, bool)
        for first, last in stretches:
            parent[first:last], placed[first:last] = -1, False
            _stack_parents(starts[first:last].tolist(), ends[first:last].tolist(), first, parent, placed)
        assert parent.tolist() == want_parent.tolist() and placed.tolist() == want_placed.tolist(), (starts, ends)


def test_a_thread_cut_where_nothing_is_open_nests_as_it_does_whole(monkeypatch):
    """Long threads are nested a piece at a time (``_at_roots``), cut only at rows that start after
    every earlier row ended: the same tree as at once, on a trace of deep nesting and overlaps."""
    from pathlib import Path

    from stepscope.analysis.trace import op_tree
    from stepscope.traces.links import links_of
    from stepscope.traces.load import load_trace

    reference = Path(__file__).resolve().parents[2] / "data" / "traces" / "reference"
    cut_into = op_tree._at_roots
    for trace in ("kineto_tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
                  "hta/nccl_parser_config/nccl_data.json.gz"):
        links = links_of(load_trace(reference / trace).events)
        monkeypatch.setattr(op_tree, "NEST_CHUNK", 1 << 40)
        whole = op_tree.build_op_tree(links)
        for chunk in (1, 97, 5000):
            monkeypatch.setattr(op_tree, "NEST_CHUNK", chunk)
            pieces: list[tuple[int, int]] = []
            monkeypatch.setattr(op_tree, "_at_roots", lambda *a: pieces.extend(cut_into(*a)) or cut_into(*a))
            cut = op_tree.build_op_tree(links)
            assert len(pieces) >= 3, (trace, chunk)  # the threads were cut
            for column in ("rows", "parent", "alias", "kept", "runtime_dropped"):
                assert np.array_equal(getattr(whole, column), getattr(cut, column)), (trace, chunk, column)
