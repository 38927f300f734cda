"""Access to the reference traces and their expected numbers (HTA / plugin runs).

Two sets, one API:

- the vendored subset in ``tests/data/traces/reference`` (with ``expected/``), always present, so
  every correctness test runs from a plain clone;
- optionally, the larger shared set in ``../shared/traces`` next to the repository (or the folder
  named by ``STEPSCOPE_REFERENCE_TRACES``): its other files are added to the same parametrized
  tests, marked ``reference_shared`` (``pytest -m reference_shared`` runs only them). Without it
  they are not collected — nothing is skipped.

Loaded traces and analyses are cached per process so each file is decoded once per test run.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
VENDORED = REPO_ROOT / "tests" / "data" / "traces" / "reference"
SHARED = Path(os.environ.get("STEPSCOPE_REFERENCE_TRACES") or REPO_ROOT.parent / "shared" / "traces")
TRACES = VENDORED  # the vendored set's root (kept for callers that name one folder)
EXPECTED = VENDORED / "expected"
NOT_TRACES = {  # files in the set that are not Kineto traces: loading must fail cleanly
    "hta/execution_trace/benchmark_simple_add_et.json.gz",
    "hta/memory_analysis/memory_timeline.raw.gz",
}
SKIP = pytest.mark.skipif(not EXPECTED.is_dir(), reason=f"vendored reference traces missing from {VENDORED}")


def _names(root: Path) -> list[str]:
    expected = root / "expected"
    if not expected.is_dir():
        return []
    names = []
    for path in sorted(expected.rglob("*.hta.json")):
        rel = path.relative_to(expected).as_posix()[: -len(".hta.json")]
        if (root / rel).is_file():
            names.append(rel)
    return names


def _root(rel: str) -> Path:
    return VENDORED if (VENDORED / rel).is_file() else SHARED


def trace_names() -> list:
    """Vendored names, then the shared set's other names as params marked ``reference_shared``."""
    vendored = _names(VENDORED)
    shared = [name for name in _names(SHARED) if name not in vendored] if SHARED.resolve() != VENDORED else []
    return vendored + [pytest.param(name, marks=pytest.mark.reference_shared, id=name) for name in shared]


def _rel(item) -> str:
    return item.values[0] if hasattr(item, "values") else item


def kineto_trace_names() -> list:
    return [n for n in trace_names() if _rel(n) not in NOT_TRACES]


@functools.lru_cache(maxsize=None)
def expected(rel: str) -> dict:
    return json.loads((_root(rel) / "expected" / (rel + ".hta.json")).read_text())


def hta_results(rel: str, engine: str = "hta_head") -> tuple[dict, dict]:
    run = expected(rel)["runs"][engine]
    return run.get("results", {}), run.get("errors", {})


def tb_overview(rel: str) -> dict | None:
    results = expected(rel)["runs"].get("tb_plugin_head", {}).get("results", {})
    found = [v for k, v in results.items() if k.endswith(".overview")]
    return found[0] if found else None


@functools.lru_cache(maxsize=None)
def loaded(rel: str):
    from stepscope.traces.load import load_trace

    return load_trace(_root(rel) / rel)


@functools.lru_cache(maxsize=None)
def analysis(rel: str):
    from stepscope.analysis.trace.rank_analysis import analyze_rank

    return analyze_rank(loaded(rel))


@functools.lru_cache(maxsize=None)
def hta_view(rel: str):
    from stepscope.analysis.trace.hta_frame import hta_rows

    return hta_rows(loaded(rel).events)


def timeline_view(rel: str):
    """The GpuTimeline of a reference trace."""
    from stepscope.traces.links import links_of
    from stepscope.traces.timeline import timeline_of

    return timeline_of(links_of(loaded(rel).events))


def close(ours: float | None, theirs: float | None, rel_tol: float = 0.01, abs_tol: float = 0.0) -> bool:
    if ours is None or theirs is None:
        return ours is None and theirs is None
    return abs(ours - theirs) <= rel_tol * max(abs(ours), abs(theirs)) + abs_tol
