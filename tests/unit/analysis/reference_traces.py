"""Access to the shared reference traces and their expected numbers (HTA / plugin runs).

The traces live next to the repository in ``../shared/traces`` (with ``expected/``); tests that
use them skip with a clear reason when that folder is absent. Loaded traces and analyses are
cached per process so each file is decoded once per test run.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
TRACES = REPO_ROOT.parent / "shared" / "traces"
EXPECTED = TRACES / "expected"
NOT_TRACES = {  # files in the set that are not Kineto traces: loading must fail cleanly
    "hta/execution_trace/benchmark_simple_add_et.json.gz",
    "hta/memory_analysis/memory_timeline.raw.gz",
}
SKIP = pytest.mark.skipif(not EXPECTED.is_dir(), reason=f"reference traces not found at {TRACES}")


def trace_names() -> list[str]:
    if not EXPECTED.is_dir():
        return ["<reference traces absent>"]
    names = []
    for path in sorted(EXPECTED.rglob("*.hta.json")):
        rel = path.relative_to(EXPECTED).as_posix()[: -len(".hta.json")]
        if (TRACES / rel).is_file():
            names.append(rel)
    return names


def kineto_trace_names() -> list[str]:
    return [n for n in trace_names() if n not in NOT_TRACES]


@functools.lru_cache(maxsize=None)
def expected(rel: str) -> dict:
    return json.loads((EXPECTED / (rel + ".hta.json")).read_text())


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

    return load_trace(TRACES / rel)


@functools.lru_cache(maxsize=None)
def analysis(rel: str):
    from stepscope.analysis.trace.rank_analysis import analyze_rank

    return analyze_rank(loaded(rel))


@functools.lru_cache(maxsize=None)
def hta_view(rel: str):
    from stepscope.analysis.trace.hta_frame import hta_rows

    return hta_rows(loaded(rel).events)


def close(ours: float | None, theirs: float | None, rel_tol: float = 0.01, abs_tol: float = 0.0) -> bool:
    if ours is None or theirs is None:
        return ours is None and theirs is None
    return abs(ours - theirs) <= rel_tol * max(abs(ours), abs(theirs)) + abs_tol
