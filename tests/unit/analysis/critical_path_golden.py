"""Golden outputs of the critical path: digests of every edge of the graph, every path edge (with
its attribution and bound), the bound totals, the waits and notes, and the summaries, for every
window of every reference trace in both modes.

Recorded once from the implementation of 2026-12-03 (before the module became a package and its
loops numpy passes): ``python tests/unit/analysis/critical_path_golden.py --record`` writes
``tests/data/critical_path_golden.json``; ``test_critical_path_golden.py`` recomputes the digests
and compares them, so a change that moves one edge, one weight or one attribution fails there,
named by trace, window, mode and part.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[3]
GOLDEN = REPO / "tests" / "data" / "critical_path_golden.json"
HTA_CPA = REPO / "tests" / "data" / "hta_cpa"


def _digest(items: Iterable[Any]) -> str:
    """sha256 of each item's ``repr`` and a newline, in order (fed a chunk of items at a time: the
    same bytes, the same digest, without a hash update and an encode per item)."""
    h = hashlib.sha256()
    iterator = iter(items)
    while chunk := list(islice(iterator, 65536)):
        h.update(("\n".join(map(repr, chunk)) + "\n").encode())
    return h.hexdigest()[:32]


def _path_digest(path: Any) -> dict[str, Any]:
    """Digests of one :class:`CriticalPath` (a window in one mode)."""
    if path is None:
        return {"none": True}
    out = {
        "counts": [path.nodes, path.edges, len(path.path), path.length_us, path.ok],
        "edge_types": dict(sorted(path.edge_types.items())),
        # the path edge for edge: kind, weight, rows, ends, attributed row, bound, wait parts, times
        "path": _digest(tuple(edge) for edge in path.path),
        "bound": _digest(sorted(path.bound_us.items())),
        "syncs": _digest(path.syncs),
        "notes": _digest(path.notes),
        "label": [path.label, path.start_us, path.end_us, path.mode],
    }
    if path.graph:
        out["graph"] = _digest(path.graph)  # every edge, in insertion order
    return out


def _summary_digest(summary: Any) -> dict[str, Any]:
    if summary is None:
        return {"none": True}
    return {"dict": _digest([json.dumps(summary.to_dict(), sort_keys=True)]),
            "spans": _digest(tuple(span) for span in summary.spans),
            "segments": _digest(summary.segments),
            "after_sync_us": summary.after_sync_us, "length_us": summary.length_us}


def windows_of(rel: str, cp: Any, events: Any) -> list[tuple[str, str, int | None]]:
    """The windows recorded for a trace: every ProfilerStep instance, the whole trace, and the
    annotations and instances HTA's own critical-path references name."""
    steps = cp.step_windows(events)
    cases: list[tuple[str, str, int | None]] = [("ProfilerStep", "ProfilerStep", i) for i in range(len(steps))]
    cases.append(("whole", "", 0))
    stem = Path(rel).parts[-2] if "critical_path" in rel else None
    if stem is not None:
        for ref in sorted(HTA_CPA.glob(f"*{stem}.*.json.gz")):
            import gzip

            with gzip.open(ref, "rt") as fh:
                doc = json.load(fh)
            if doc.get("annotation"):
                cases.append((ref.name, doc["annotation"], doc.get("instance")))
    return list(dict.fromkeys(cases))


def digests(rel: str, events: Any) -> dict[str, Any]:
    """Every golden digest of one trace."""
    from stepscope.analysis.trace import critical_path as cp

    out: dict[str, Any] = {}
    for tag, annotation, instance in windows_of(rel, cp, events):
        for hta in (True, False):
            found = cp.critical_path(events, annotation=annotation, instance=instance, hta=hta, keep_graph=True)
            out[f"{tag}[{instance}].{'hta' if hta else 'default'}"] = _path_digest(found)
    out["step_paths.hta"] = [_path_digest(p) for p in cp.step_paths(events, hta=True)]
    out["step_paths.default"] = [_path_digest(p) for p in cp.step_paths(events)]
    out["path_summary.all"] = _summary_digest(cp.path_summary(events, steps=0))
    out["path_summary.one"] = _summary_digest(cp.path_summary(events, steps=1))
    out["path_summary.two"] = _summary_digest(cp.path_summary(events, steps=2))
    return out


def trace_files() -> Iterator[tuple[str, Path]]:
    """Every Kineto trace of the vendored set, the shared set (when present) and the test traces."""
    sys.path.insert(0, str(HERE.parent))
    from reference_traces import NOT_TRACES, SHARED, VENDORED

    seen = set()
    for root in (VENDORED, SHARED):
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            if not path.is_file() or not (path.name.endswith(".json") or path.name.endswith(".json.gz")):
                continue
            rel = path.relative_to(root).as_posix()
            if rel.startswith("expected/") or rel in NOT_TRACES or rel in seen:
                continue
            seen.add(rel)
            yield rel, path
    for path in sorted((REPO / "tests" / "data" / "traces").glob("*.json*")):
        yield f"tests/{path.name}", path


def compute(rel: str, path: Path) -> dict[str, Any] | str:
    from stepscope.traces.load import load_trace

    try:
        events = load_trace(path).events
    except Exception as error:  # noqa: BLE001 - recorded: a trace that does not load has no path
        return f"does not load: {type(error).__name__}"
    return digests(rel, events)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", action="store_true", help="write the golden file")
    args = parser.parse_args()
    found = {}
    for rel, path in trace_files():
        found[rel] = compute(rel, path)
        print(rel, file=sys.stderr)
    text = json.dumps(found, indent=1, sort_keys=True)
    if args.record:
        GOLDEN.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
