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

``--before`` times the critical path against the implementation it replaced
(``benchmarks/critical_path_before.py``, the module as it was before it became a package of numpy
passes), in one child process per trace, the two alternating ``--repeat`` times on the same loaded
table, each keeping its best CPU time (the process's, so a shared machine's other work counts less): what ``analyze`` runs (``path_summary(events, steps=1)``: the step of
median duration, default mode, and its summary), first call on the trace (the whole trace's
launch bookkeeping included) and again (cached); one step alone in each mode
(``critical_path(events)``, ``critical_path(events, hta=True)``). Each pair's outputs are compared
(equal or the run fails). Then the peak RSS of analyze's path, each implementation in its own
process (``ru_maxrss`` after loading the trace and its timeline, and at the end)::

    python benchmarks/bench_critical_path.py --before --repeat 5 [--trace REL ...]
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
from bench_analyze import json_mb, run_child  # noqa: E402 - one way to time a child process for every benchmark
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


def _before_child(trace: str, repeat: int, out: str) -> None:
    """One trace: new and before, alternating, best of ``repeat`` per measurement (seconds)."""
    import time

    sys.path.insert(0, str(SRC))
    import critical_path_before as before

    from stepscope.analysis.trace import critical_path as now
    from stepscope.traces.links import links_of
    from stepscope.traces.load import load_trace
    from stepscope.traces.timeline import timeline_of

    import gc

    gc.disable()  # as ``analyze`` runs a rank (trace_evidence._analyze_one): no cycle scans meanwhile
    events = load_trace(trace).events
    timeline_of(links_of(events))  # shared with the other views: built before either is timed

    def forget() -> None:  # each implementation's per-trace columns and launch bookkeeping
        events.__dict__.pop("_critical_rows", None)
        events.__dict__.pop("_critical_rows_before", None)

    cases = {
        "analyze_first": lambda m: m.path_summary(events, steps=1),
        "analyze_again": lambda m: m.path_summary(events, steps=1),
        "step_default": lambda m: m.critical_path(events),
        "step_hta": lambda m: m.critical_path(events, hta=True),
    }
    best: dict[str, dict[str, float]] = {case: {"before": float("inf"), "now": float("inf")} for case in cases}
    outputs: dict[str, dict[str, object]] = {case: {} for case in cases}
    for _ in range(repeat):
        for label, module in (("before", before), ("now", now)):
            forget()
            for case, run in cases.items():
                began = time.process_time()  # CPU time: the machine may be shared
                found = run(module)
                best[case][label] = min(best[case][label], time.process_time() - began)
                key = found.to_dict() if hasattr(found, "to_dict") else (found.length_us, [tuple(e) for e in found.path])
                outputs[case][label] = key
    same = all(o["before"] == o["now"] for o in outputs.values())
    row = {case: {"before_ms": round(1000 * b["before"], 1), "now_ms": round(1000 * b["now"], 1),
                  "speed_up": round(b["before"] / b["now"], 1)} for case, b in best.items()}
    Path(out).write_text(json.dumps({"same_output": same, **row}))
    if not same:
        sys.exit(1)


_MEMORY = """
import gc, json, resource, sys
gc.disable()
sys.path.insert(0, sys.argv[3])
from stepscope.traces.links import links_of
from stepscope.traces.load import load_trace
from stepscope.traces.timeline import timeline_of
events = load_trace(sys.argv[2]).events
timeline_of(links_of(events))
loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
if sys.argv[1] == "before":
    import critical_path_before as module
else:
    from stepscope.analysis.trace import critical_path as module
module.path_summary(events, steps=1)
print(json.dumps({"loaded_mb": round(loaded), "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))
"""


def _memory(path: Path) -> dict:
    """Peak RSS of analyze's path (after the trace and its timeline), each implementation in its own process."""
    out = {}
    for label in ("before", "now"):
        run = run_child(_MEMORY, [label, str(path), str(HERE)], {"PYTHONPATH": str(SRC)})
        lines = [line for line in run["tail"].splitlines() if line.startswith("{")]
        out[label] = json.loads(lines[-1]) if lines else {"failed": run["exit"]}
    return out


def before(args: argparse.Namespace) -> None:
    traces = args.trace or [*DEFAULT_TRACES, "hta/mtia_trace_single_rank/mtia_rank_0.json.gz",
                            "kineto_tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"]
    for rel in traces:
        path = Path(args.traces) / rel
        if not path.is_file():
            print(f"skip {rel}: not found", file=sys.stderr)
            continue
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            run = run_child(f"import runpy, sys; sys.argv = ['bench', '--before-child', {str(path)!r}, '{args.repeat}', "
                            f"{out.name!r}]; runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')", [],
                            {"PYTHONPATH": str(SRC)})
            text = Path(out.name).read_text()
        row = json.loads(text) if text else {"failed": run["exit"], "tail": run["tail"][-2000:]}
        row["memory"] = _memory(path)
        print(json.dumps({"trace": rel, "json_mb": round(json_mb(path), 1), **row}))


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--before-child":
        _before_child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default=str(HERE.parent.parent / "shared" / "traces"))
    parser.add_argument("--trace", action="append", default=[], help="a trace below --traces (default: the five largest)")
    parser.add_argument("--hta", action="append", default=[], metavar="LABEL=PYTHON",
                        help="an interpreter with HTA installed (repeatable)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--out", default=None)
    parser.add_argument("--before", action="store_true", help="against the implementation this one replaced")
    args = parser.parse_args()
    if args.before:
        before(args)
        return
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
