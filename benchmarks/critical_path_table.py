"""The critical path's bound-by summary on every reference trace, as the Markdown table of
docs/critical-path.md (stepscope's default mode, every step).

    python benchmarks/critical_path_table.py [--traces ../shared/traces]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from stepscope.analysis.trace import critical_path as cp  # noqa: E402
from stepscope.errors import StepscopeError  # noqa: E402
from stepscope.traces.load import load_trace  # noqa: E402

KINDS = (cp.CPU, cp.DATA_LOADING, cp.LAUNCH_OVERHEAD, cp.GAP, cp.GPU_COMPUTE, cp.GPU_MEMORY, cp.COMM, cp.SYNC_WAIT)
HEAD = ("CPU", "data", "launch", "gaps", "compute", "copies", "comm.", "blocked")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", default=str(HERE.parent.parent / "shared" / "traces"))
    args = parser.parse_args()
    root = Path(args.traces)
    print("| trace | steps | path per step | " + " | ".join(HEAD) + " | waited on |")
    print("|---|---:|---:|" + "---:|" * len(HEAD) + "---|")
    for path in sorted(root.rglob("*")):
        if not path.is_file() or not path.name.endswith((".json", ".json.gz", ".gz")) or "expected" in path.parts:
            continue
        rel = path.relative_to(root).as_posix()
        try:
            summary = cp.path_summary(load_trace(path).events)
        except StepscopeError as exc:
            print(f"| {rel} | – | not a Kineto trace ({type(exc).__name__}) |" + " |" * (len(HEAD) + 1))
            continue
        if summary is None or summary.length_us <= 0:
            print(f"| {rel} | – | no path (no operator or GPU row) |" + " |" * (len(HEAD) + 1))
            continue
        steps = len(summary.steps)
        shares = " | ".join(f"{100 * summary.share(kind):.1f} %" if summary.bound_us.get(kind) else "–" for kind in KINDS)
        waits = "; ".join(summary.syncs[:2]) or "–"
        print(f"| {rel} | {steps} | {summary.length_us / steps / 1000:.2f} ms | {shares} | {waits} |")


if __name__ == "__main__":
    main()
