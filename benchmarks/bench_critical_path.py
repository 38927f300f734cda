"""Benchmark: the critical path of one traced step, stepscope vs Holistic Trace Analysis.

Both sides load a trace and compute the critical path of its first ``ProfilerStep`` (HTA's
``critical_path_analysis(rank, "ProfilerStep", 0)``; stepscope's ``critical_path(..., hta=True)``,
the same graph) in a fresh child process, so the wall time and the peak RSS (``os.wait4``
``ru_maxrss``) belong to that run alone. Each child also reports the time of the critical path
itself (graph and longest path, without the load). stepscope's default mode over every step of
the trace (``path_summary``, what ``analyze`` shows) is timed the same way. The driver checks
that both sides found the same path length (the parity on these traces is in
docs/critical-path.md).

Usage (HTA in its own virtual environment; ``holistictraceanalysis`` or ``traceinsight``)::

    python benchmarks/bench_critical_path.py --traces ../shared/traces \
        --hta 0.6.1=/path/to/hta-venv/bin/python [--repeat 2] [--out critical_path.json]

With ``--repeat N`` the tools alternate N times per trace and each keeps its fastest run (the
machine is shared). The ratio is HTA's time over stepscope's, same trace, same run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(HERE))
from bench_analyze import run_child  # noqa: E402 - one way to time a child process for every benchmark
DEFAULT_TRACES = (  # the reference traces with ProfilerSteps and GPU rows, largest first
    "hta/trace_diff/control/control.json.gz",
    "hta/trace_diff/test/test.json.gz",
    "hta/negative_queue_length_values_check/rank0.json.gz",
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "hta/nccl_parser_config/nccl_data.json.gz",
)

_OURS = """
import json, sys, time
began = time.perf_counter()
from stepscope.traces.load import load_trace
from stepscope.analysis.trace import critical_path as cp
events = load_trace(sys.argv[1]).events
loaded = time.perf_counter()
if sys.argv[2] == "step0":
    found = cp.critical_path(events, annotation="ProfilerStep", instance=0, hta=True)
    length = found.length_us if found is not None else None
else:
    found = cp.path_summary(events)
    length = found.length_us if found is not None else None
done = time.perf_counter()
print(json.dumps({"load_s": loaded - began, "critical_path_s": done - loaded, "path_length": length}))
"""


def _child(argv: list[str], env: dict[str, str]) -> tuple[float, float, dict]:
    """(wall s, peak RSS MB, the child's last JSON line) of one run in its own process."""
    python, rest = argv[0], argv[1:]
    if rest[0] == "-c":
        code, args = rest[1], rest[2:]
    else:  # a script: run as __main__ with its arguments
        code, args = f"import runpy, sys; sys.argv = {rest[:1]!r} + sys.argv[1:]; runpy.run_path({rest[0]!r}, run_name='__main__')", rest[1:]
    run = run_child(code, args, {"PYTHONPATH": env.get("PYTHONPATH", "")}, python=python)
    lines = [line for line in run["tail"].splitlines() if line.startswith("{")]
    data = json.loads(lines[-1]) if run["exit"] == 0 and lines else {"failed": run["exit"]}
    return run["wall_s"], run["peak_rss_mb"], data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default=str(HERE.parent.parent / "shared" / "traces"))
    parser.add_argument("--trace", action="append", default=[], help="a trace below --traces (default: the five largest)")
    parser.add_argument("--hta", action="append", default=[], metavar="LABEL=PYTHON",
                        help="an interpreter with HTA installed (repeatable)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    results = []
    for rel in args.trace or DEFAULT_TRACES:
        path = Path(args.traces) / rel
        if not path.is_file():
            print(f"skip {rel}: not found", file=sys.stderr)
            continue
        size_mb = os.path.getsize(path) / 1e6
        row: dict = {"trace": rel, "gz_mb": round(size_mb, 2)}
        runs: dict[str, list] = {}
        for _ in range(args.repeat):
            runs.setdefault("stepscope", []).append(_child([sys.executable, "-c", _OURS, str(path), "step0"], env))
            runs.setdefault("stepscope_all_steps", []).append(
                _child([sys.executable, "-c", _OURS, str(path), "all"], env))
            for spec in args.hta:
                label, python = spec.split("=", 1)
                with tempfile.NamedTemporaryFile(suffix=".json") as out:
                    wall, rss, _ = _child([python, str(HERE / "hta_cpa_reference.py"), str(path), "--annotation",
                                           "ProfilerStep", "--instance", "0", "--out", out.name], env)
                    data = json.loads(Path(out.name).read_text()) if os.path.getsize(out.name) else {}
                runs.setdefault(f"hta {label}", []).append((wall, rss, data))
        for tool, items in runs.items():
            wall, rss, data = min(items, key=lambda item: item[0])
            row[tool] = {"wall_s": round(wall, 3), "peak_rss_mb": round(rss, 1),
                         "critical_path_s": round(float(data.get("critical_path_s", "nan")), 3),
                         "path_length": data.get("path_length")}
        ours = row["stepscope"]
        for tool in list(row):
            if tool.startswith("hta "):
                theirs = row[tool]
                theirs["ratio_wall"] = round(theirs["wall_s"] / ours["wall_s"], 1)
                theirs["ratio_critical_path"] = round(theirs["critical_path_s"] / ours["critical_path_s"], 1)
                theirs["same_length"] = theirs["path_length"] == ours["path_length"]
        results.append(row)
        print(json.dumps(row))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
