"""Benchmark: ``stepscope analyze`` vs Holistic Trace Analysis on the same traces.

Both sides load the trace and run the analyses they share (temporal breakdown, idle-time
breakdown, kernel-type breakdown, communication/computation overlap, CUDA launch statistics);
stepscope also computes its other views (plugin Overview, operators, kernels, memory). Every
(trace, tool) pair runs in a fresh child process started by this small driver, so wall time and
peak RSS (``os.wait4`` ``ru_maxrss``, which includes pool workers) belong to that run alone.

Usage (HTA is the optional ``bench`` extra: ``pip install -e .[bench]``)::

    python benchmarks/bench_analyze.py --traces ../shared/traces \
        --synthetic-mb 500 [--repeat 3] [--skip-hta] [--out benchmark.json]

With ``--repeat N`` the two tools alternate N times per trace and each keeps its fastest run (the
machine is shared: the minimum is the least disturbed run); the last table gives the ratios.

``--synthetic-mb N`` writes (once, into ``--work-dir``) a trace of at least N MB of JSON made by
replicating the steps of ``--seed-trace`` (default: the trace_diff/control sample): each copy
shifts timestamps by the original span and offsets correlation and External ids, so links and
steps stay consistent.
"""

from __future__ import annotations

import argparse
import compileall
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
DEFAULT_TRACES = (  # every reference trace of at least 15 MB of JSON
    "hta/mtia_trace_single_rank/mtia_rank_0.json.gz",
    "hta/trace_diff/control/control.json.gz",
    "hta/trace_diff/test/test.json.gz",
    "hta/negative_queue_length_values_check/rank0.json.gz",
    "kineto_tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
    "kineto_tb_plugin/samples/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
)

STEPSCOPE_CHILD = """
import sys, time
t0 = time.perf_counter()
from stepscope.analysis.trace.trace_evidence import analyze_traces
analysis = analyze_traces(sys.argv[1])
evidence = analysis.evidence()
print("views", len(analysis.ranks), evidence.idle.share, time.perf_counter() - t0)
"""

HTA_CHILD = """
import sys, time, logging
logging.disable(logging.WARNING)
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
import json
with open(sys.argv[1], "rb") as fh:
    head = fh.read(2)
rank = int(sys.argv[2])
ta = TraceAnalysis(trace_files={rank: sys.argv[1]}, trace_dir="/")
for name, call in (
    ("temporal", lambda: ta.get_temporal_breakdown(visualize=False)),
    ("idle", lambda: ta.get_idle_time_breakdown(ranks=[rank], visualize=False)),
    ("kernels", lambda: ta.get_gpu_kernel_breakdown(visualize=False)),
    ("overlap", lambda: ta.get_comm_comp_overlap(visualize=False)),
    ("launch", lambda: ta.get_cuda_kernel_launch_stats(ranks=[rank], visualize=False)),
):
    try:
        call()
    except Exception as exc:  # HTA raises on traces without GPU rows
        print("hta error", name, type(exc).__name__)
print("done", time.perf_counter() - t0)
"""


def run_child(code: str, args: list[str], env_extra: dict[str, str], python: str = sys.executable) -> dict:
    env = dict(os.environ)
    env.update(env_extra)
    start = time.perf_counter()
    proc = subprocess.Popen([python, "-c", code, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024,
            "exit": os.waitstatus_to_exitcode(status), "tail": output[-300:]}


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def json_mb(path: Path) -> float:
    """Size of the trace's JSON in MB: a gzip's own trailer says it (mod 4 GiB), without inflating."""
    if not is_gzip(path):
        return path.stat().st_size / 1e6
    with open(path, "rb") as fh:
        fh.seek(-4, os.SEEK_END)
        return int.from_bytes(fh.read(4), "little") / 1e6


def trace_rank(path: Path) -> int:
    # the first two bytes only: reading the whole file here once raised the driver's RSS to the
    # trace's size, and a child forked from it inherits that high-water mark in ru_maxrss
    opener = gzip.open if is_gzip(path) else open
    with opener(path, "rb") as fh:
        head = fh.read(1 << 20).decode(errors="replace")
    marker = head.find('"rank":')
    if marker < 0:
        return 0
    digits = "".join(ch for ch in head[marker + 7 : marker + 20].strip() if ch.isdigit() or ch == " ").split()
    return int(digits[0]) if digits else 0


def make_synthetic(seed: Path, target_mb: float, out: Path) -> Path:
    """Replicate the seed trace's events until the JSON is at least ``target_mb`` MB."""
    if out.exists() and out.stat().st_size >= target_mb * 1e6:
        return out
    opener = gzip.open if is_gzip(seed) else open
    with opener(seed, "rb") as fh:
        doc = json.load(fh)
    events = [e for e in doc.pop("traceEvents") if isinstance(e, dict)]
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000
    steps = sorted({int(e["name"].split("#")[1]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")})
    id_offset = 10 ** len(str(max((int((e.get("args") or {}).get("correlation", 0) or 0) for e in events), default=1)))
    id_offset = max(id_offset, 10**7)
    written = 0
    with open(out, "w") as fh:
        fh.write("{\n")
        for key, value in doc.items():
            fh.write(f'  {json.dumps(key)}: {json.dumps(value)},\n')
        fh.write('  "traceEvents": [\n')
        copy = 0
        first = True
        while written < target_mb * 1e6:
            for event in events:
                if copy and event.get("ph") == "M":
                    continue
                e = dict(event)
                if isinstance(e.get("ts"), (int, float)):
                    e["ts"] = e["ts"] + copy * span
                args = e.get("args")
                if isinstance(args, dict):
                    args = dict(args)
                    for key in ("correlation", "External id", "external id"):
                        if isinstance(args.get(key), int) and args[key] > 0:
                            args[key] += copy * id_offset
                    e["args"] = args
                if e.get("ph") in ("s", "f") and isinstance(e.get("id"), int):
                    e["id"] += copy * id_offset
                name = e.get("name")
                if isinstance(name, str) and name.startswith("ProfilerStep#") and steps:
                    e["name"] = f"ProfilerStep#{int(name.split('#')[1]) + copy * len(steps)}"
                text = json.dumps(e)
                fh.write(("" if first else ",\n") + "  " + text)
                first = False
                written += len(text) + 4
            copy += 1
        fh.write('\n  ],\n  "traceName": "synthetic"\n}\n')
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default=str(HERE.parent.parent / "shared" / "traces"))
    parser.add_argument("--only", action="append", default=[], help="relative trace path(s) (default: the largest samples)")
    parser.add_argument("--synthetic-mb", type=float, default=0.0)
    parser.add_argument("--seed-trace", default="hta/trace_diff/control/control.json.gz")
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "stepscope-bench"))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--skip-hta", action="store_true")
    parser.add_argument("--hta", action="append", default=[], metavar="LABEL=PYTHON",
                        help="an interpreter with an HTA release installed (repeatable), e.g. "
                             "hta-0.5.0=/venvs/hta05/bin/python traceinsight-0.6.1=/venvs/hta06/bin/python; "
                             "default: 'hta' in this interpreter")
    parser.add_argument("--out", default=None)
    parser.add_argument("--make-synthetic", nargs=3, metavar=("SEED", "MB", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make_synthetic:
        make_synthetic(Path(args.make_synthetic[0]), float(args.make_synthetic[1]), Path(args.make_synthetic[2]))
        return
    root = Path(args.traces)
    cases = [(rel, root / rel) for rel in (args.only or DEFAULT_TRACES) if (root / rel).is_file()]
    if args.synthetic_mb:
        os.makedirs(args.work_dir, exist_ok=True)
        target = Path(args.work_dir) / f"synthetic_{int(args.synthetic_mb)}mb.json"
        if not (target.exists() and target.stat().st_size >= args.synthetic_mb * 1e6):
            # in a child: a child process inherits the parent's RSS high-water mark into ru_maxrss,
            # so the driver must never grow (see the measurement pitfall in the trace notes)
            subprocess.run(
                [sys.executable, __file__, "--make-synthetic", str(root / args.seed_trace), str(args.synthetic_mb), str(target)],
                check=True,
            )
        cases.append((f"synthetic {int(args.synthetic_mb)} MB", target))
    # byte-compiled first, as an installed package is (HTA's are, by pip): a checkout run with
    # PYTHONDONTWRITEBYTECODE=1 would otherwise compile ~90 modules in every child (~0.2 s)
    compileall.compile_dir(str(SRC / "stepscope"), quiet=1)
    env = {"PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    hta_env = {"OMP_NUM_THREADS": "1"}
    rows = []
    print(f"{'trace':<60} {'MB':>6} {'tool':<9} {'wall s':>8} {'CPU s':>8} {'RSS MB':>8}")
    for rel, path in cases:
        size_mb = json_mb(path)
        rank = trace_rank(path)
        tools = [("stepscope", STEPSCOPE_CHILD, [str(path)], sys.executable)]
        if not args.skip_hta:
            for item in args.hta or [f"hta={sys.executable}"]:
                label, _, python = item.partition("=")
                tools.append((label, HTA_CHILD, [str(path), str(rank)], python))
        runs_by_tool: dict[str, list[dict]] = {tool[0]: [] for tool in tools}
        for _ in range(args.repeat):  # alternate the tools so both see the same load
            for tool, code, child_args, python in tools:
                runs_by_tool[tool].append(run_child(code, child_args, env if tool == "stepscope" else hta_env, python))
        for tool, *_ in tools:
            runs = runs_by_tool[tool]
            best = {"wall_s": min(r["wall_s"] for r in runs), "cpu_s": min(r["cpu_s"] for r in runs),
                    "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
                    "exit": max(r["exit"] for r in runs), "tail": runs[0]["tail"]}
            rows.append({"trace": rel, "file_mb": size_mb, "tool": tool, **best})
            print(f"{rel[-60:]:<60} {size_mb:6.1f} {tool:<9} {best['wall_s']:8.2f} {best['cpu_s']:8.2f} {best['peak_rss_mb']:8.0f}"
                  + ("" if best["exit"] == 0 else f"  exit {best['exit']}: {best['tail']!r}"), flush=True)
    summary = ratios(rows)
    if summary:
        print(f"\n{'trace':<60} {'against':<20} {'speed-up':>9} {'CPU ratio':>10} {'RSS ratio':>10}")
        for rel, other, speedup, cpu, rss in summary:
            print(f"{rel[-60:]:<60} {other:<20} {speedup:8.1f}x {cpu:9.1f}x {rss:10.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"runs": rows, "ratios": summary}, indent=1))


def ratios(rows: list[dict]) -> list[tuple[str, str, float, float, float]]:
    """Per trace and per HTA release: its wall / stepscope wall, its CPU time / stepscope CPU time
    (less disturbed by other work on a shared machine), stepscope RSS / its RSS."""
    by_trace: dict[str, dict[str, dict]] = {}
    for row in rows:
        by_trace.setdefault(row["trace"], {})[row["tool"]] = row
    out = []
    for rel, tools in by_trace.items():
        ours = tools.get("stepscope")
        for other, theirs in tools.items():
            if other == "stepscope" or ours is None or ours["wall_s"] <= 0 or theirs["peak_rss_mb"] <= 0:
                continue
            cpu = theirs["cpu_s"] / ours["cpu_s"] if ours["cpu_s"] > 0 else float("nan")
            out.append((rel, other, theirs["wall_s"] / ours["wall_s"], cpu, ours["peak_rss_mb"] / theirs["peak_rss_mb"]))
    return out


if __name__ == "__main__":
    main()
