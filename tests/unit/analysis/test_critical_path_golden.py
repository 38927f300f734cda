"""The critical path, edge for edge, against the golden digests recorded before the module became
a package of numpy passes (``critical_path_golden.py``): every edge of every window's graph in
insertion order, every path edge with its attribution, bound and wait parts, the bound totals,
the waits, the notes and the summaries, in both modes, on every reference trace."""

from __future__ import annotations

import json

import pytest
from critical_path_golden import GOLDEN, compute, trace_files
from reference_traces import VENDORED

GOLD = json.loads(GOLDEN.read_text())


def _params() -> list:
    out = []
    for rel, path in trace_files():
        shared = not rel.startswith("tests/") and not (VENDORED / rel).is_file()
        marks = [pytest.mark.reference_shared] if shared else []
        out.append(pytest.param(rel, path, marks=marks, id=rel))
    return out


@pytest.mark.parametrize(("rel", "path"), _params())
def test_the_same_graph_path_and_summary_as_recorded(rel, path):
    assert rel in GOLD, f"no golden digest for {rel}: record it with critical_path_golden.py --record"
    expected, found = GOLD[rel], compute(rel, path)
    if isinstance(expected, str) or isinstance(found, str):
        assert found == expected
        return
    assert sorted(found) == sorted(expected)
    for case in expected:
        ours, theirs = found[case], expected[case]
        if isinstance(theirs, list):
            assert len(ours) == len(theirs), case
            pairs = [(f"{case}[{i}]", o, t) for i, (o, t) in enumerate(zip(ours, theirs))]
        else:
            pairs = [(case, ours, theirs)]
        for where, o, t in pairs:
            for part in t:  # each part named: counts, graph (every edge), path, bound, syncs, ...
                assert o.get(part) == t[part], f"{rel} {where}: {part} differs"
