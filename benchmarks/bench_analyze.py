"""Benchmark: ``stepscope analyze TRACE`` as a user types it, against Holistic Trace Analysis.

stepscope runs as the command a user types: the console script (``stepscope analyze TRACE``,
default options, text output to a file), the whole process — interpreter start, imports, load,
every view, the critical path, the diagnosis and the rendering. HTA (``--hta-work temporal``, the
default) loads the trace and computes its temporal breakdown, the view both tools share; with
``--hta-work full`` it also computes its idle-time, kernel, overlap and launch-statistics
breakdowns. Every (trace, tool) pair runs in a fresh child of this small driver, so wall time and
peak RSS (``os.wait4`` ``ru_maxrss``, which includes pool workers) belong to that run alone.

Usage (each HTA release in its own virtual environment: both install a package ``hta``)::

    python3 -m venv hta05 && hta05/bin/pip install holistictraceanalysis==0.5.0
    python3 -m venv hta06 && hta06/bin/pip install traceinsight==0.6.1
    python benchmarks/bench_analyze.py --traces ../shared/traces --repeat 3 \
        --hta 0.5.0=hta05/bin/python --hta 0.6.1=hta06/bin/python \
        [--synthetic-mb 500] [--skip-hta] [--out benchmark.json]

With ``--repeat N`` the tools alternate N times per trace (interleaved, so all see the same load)
and the table gives each one's median wall time (and its largest peak RSS); the ratios are the
medians' ratios.

``--synthetic-mb N`` writes (once, into ``--work-dir``) a trace of at least N MB of JSON made by
replicating the steps of ``--seed-trace`` (default: the trace_diff/control sample): each copy
shifts timestamps by the original span and offsets correlation and External ids, so links and
steps stay consistent. ``--delete-synthetic`` removes it after the run (a 10 GB trace).

``--src LABEL=DIR`` (repeatable) also runs ``stepscope analyze`` from another source tree
(``PYTHONPATH=DIR``, its C extensions built there, else it reads with the Python fallback) as the
tool ``stepscope@LABEL``, interleaved with the others: a before/after comparison on the same load
(its ratio reads as the other tree's time over this one's). With ``--skip-hta``, only the trees.

``--one-job`` also runs ``stepscope analyze TRACE --jobs 1`` (tool ``stepscope@jobs1``): as typed, a
single uncompressed trace of at least 128 MiB is decoded in byte ranges on every core, and this is
its one-process baseline in the same run. ``--tree-rss`` samples the summed RSS and PSS of each
command's processes (``ru_maxrss`` is the largest one process reached, not what the workers held
together; a forked child's pages shared with its parent count twice in the RSS sum, once in PSS).
"""

from __future__ import annotations

import argparse
import compileall
import gzip
import json
import os
import statistics
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

HTA_CHILD = """
import sys, time, logging
logging.disable(logging.WARNING)
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
rank, work = int(sys.argv[2]), sys.argv[3]
ta = TraceAnalysis(trace_files={rank: sys.argv[1]}, trace_dir="/")
calls = [("temporal", lambda: ta.get_temporal_breakdown(visualize=False))]
if work == "full":
    calls += [
        ("idle", lambda: ta.get_idle_time_breakdown(ranks=[rank], visualize=False)),
        ("kernels", lambda: ta.get_gpu_kernel_breakdown(visualize=False)),
        ("overlap", lambda: ta.get_comm_comp_overlap(visualize=False)),
        ("launch", lambda: ta.get_cuda_kernel_launch_stats(ranks=[rank], visualize=False)),
    ]
for name, call in calls:
    try:
        call()
    except Exception as exc:  # HTA raises on traces without GPU rows
        print("hta error", name, type(exc).__name__)
print("done", time.perf_counter() - t0)
"""


def stepscope_command() -> list[str]:
    """The console script next to this interpreter (what ``pip install`` puts on PATH), else
    ``python -m stepscope`` with the checkout's ``src`` on the path."""
    script = Path(sys.executable).parent / "stepscope"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "stepscope"]


def run_command(command: list[str], env_extra: dict[str, str], stdout_path: str | None = None,
                tree_rss: bool = False, pss_every: int = 10, cwd: str | None = None) -> dict:
    """Wall and CPU time and peak RSS of one command. The peak RSS is the kernel's (``ru_maxrss``: the
    largest of the process and its children, not their sum); ``tree_rss`` also samples the sum of
    the RSS of the process and its descendants 20 times a second (``tree_rss_mb``) and the sum of
    their proportional set sizes every ``pss_every`` samples (default twice a second; ``tree_pss_mb``:
    a page a forked child shares with its parent counts once, not twice): what a command that works
    on several processes holds at once."""
    env = dict(os.environ)
    env.update(env_extra)
    sink = open(stdout_path, "wb") if stdout_path else subprocess.PIPE  # noqa: SIM115 - closed below
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.PIPE if stdout_path else subprocess.STDOUT,
                                cwd=cwd)
    finally:
        if stdout_path:
            sink.close()
    sampled = _TreeRss(proc.pid, pss_every) if tree_rss else None
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    stream = proc.stderr if stdout_path else proc.stdout
    output = stream.read().decode(errors="replace") if stream else ""
    out = {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "user_s": usage.ru_utime,
           "system_s": usage.ru_stime, "minor_faults": usage.ru_minflt, "peak_rss_mb": usage.ru_maxrss / 1024,
           "exit": os.waitstatus_to_exitcode(status), "tail": output[-300:]}
    if sampled is not None:
        rss, pss = sampled.stop()
        out["tree_rss_mb"], out["tree_pss_mb"] = rss / 2**20, pss / 2**20
    return out


class _TreeRss:
    """The peak of the summed RSS of a process and its descendants, sampled on a thread."""

    def __init__(self, pid: int, pss_every: int = 10) -> None:
        import threading

        import psutil

        self.root, self.peak, self.peak_pss, self.done = psutil.Process(pid), 0, 0, threading.Event()
        self.pss_every = pss_every
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        import psutil

        tick = 0
        while not self.done.wait(0.05):
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                return
            total = shared = 0
            for item in procs:
                try:
                    total += item.memory_info().rss
                    # PSS walks the page tables (~10 ms for 5 GB): by default twice a second, not to slow the run
                    shared += item.memory_full_info().pss if tick % self.pss_every == 0 else 0
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self.peak_pss = max(self.peak_pss, shared)
            tick += 1

    def stop(self) -> tuple[int, int]:
        self.done.set()
        self.thread.join()
        return self.peak, self.peak_pss


def run_child(code: str, args: list[str], env_extra: dict[str, str], python: str = sys.executable) -> dict:
    return run_command([python, "-c", code, *args], env_extra)


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
    import orjson  # one event at a time, ~10x json.dumps: a 10 GB trace is written in minutes

    written = 0
    with open(out, "wb") as fh:
        fh.write(b"{\n")
        for key, value in doc.items():
            fh.write(b"  " + orjson.dumps(key) + b": " + orjson.dumps(value) + b",\n")
        fh.write(b'  "traceEvents": [\n')
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
                text = orjson.dumps(e)
                fh.write((b"" if first else b",\n") + b"  " + text)
                first = False
                written += len(text) + 4
            copy += 1
        fh.write(b'\n  ],\n  "traceName": "synthetic"\n}\n')
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default=str(HERE.parent.parent / "shared" / "traces"))
    parser.add_argument("--only", action="append", default=[],
                        help="relative trace path(s) (default: every reference trace of at least 15 MB of JSON; "
                             "'none': only the synthetic trace)")
    parser.add_argument("--synthetic-mb", type=float, action="append", default=[],
                        help="also a synthetic trace of at least this many MB of JSON (repeatable)")
    parser.add_argument("--seed-trace", default="hta/trace_diff/control/control.json.gz")
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "stepscope-bench"))
    parser.add_argument("--delete-synthetic", action="store_true", help="remove the synthetic traces afterwards")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-hta", action="store_true")
    parser.add_argument("--skip-hta-above-mb", type=float, default=float("inf"),
                        help="run HTA only on traces up to this size (it needs ~5x the JSON in memory)")
    parser.add_argument("--hta", action="append", default=[], metavar="LABEL=PYTHON",
                        help="an interpreter with an HTA release installed (repeatable), e.g. "
                             "0.5.0=hta05/bin/python 0.6.1=hta06/bin/python; default: 'hta' in this interpreter")
    parser.add_argument("--hta-work", choices=("temporal", "full"), default="temporal",
                        help="HTA's side: its temporal breakdown (default), or also its idle, kernel, overlap "
                             "and launch breakdowns")
    parser.add_argument("--src", action="append", default=[], metavar="LABEL=DIR",
                        help="also run stepscope from this source tree (repeatable), e.g. before=OLD/src")
    parser.add_argument("--one-job", action="store_true",
                        help="also run stepscope with --jobs 1 (one large uncompressed trace decoded in one "
                             "process: the baseline of its split decode)")
    parser.add_argument("--tree-rss", action="store_true",
                        help="also sample the summed RSS of each command's processes (tree_rss_mb)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--make-synthetic", nargs=3, metavar=("SEED", "MB", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make_synthetic:
        make_synthetic(Path(args.make_synthetic[0]), float(args.make_synthetic[1]), Path(args.make_synthetic[2]))
        return
    root = Path(args.traces)
    cases = [(rel, root / rel) for rel in (args.only or DEFAULT_TRACES) if (root / rel).is_file()]
    made = []
    for mb in args.synthetic_mb:
        os.makedirs(args.work_dir, exist_ok=True)
        target = Path(args.work_dir) / f"synthetic_{int(mb)}mb.json"
        if not (target.exists() and target.stat().st_size >= mb * 1e6):
            # in a child: a child process inherits the parent's RSS high-water mark into ru_maxrss,
            # so the driver must never grow (see the measurement pitfall in the trace notes)
            started = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--make-synthetic", str(root / args.seed_trace), str(mb),
                            str(target)], check=True)
            print(f"wrote {target.name} ({target.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - started:.0f} s",
                  flush=True)
            made.append(target)
        cases.append((f"synthetic {int(mb)} MB", target))
    # byte-compiled first, as an installed package is (HTA's are, by pip): a checkout run with
    # PYTHONDONTWRITEBYTECODE=1 would otherwise compile ~90 modules in every child (~0.2 s)
    import stepscope

    trees = dict(item.partition("=")[::2] for item in args.src)
    for directory in (str(Path(stepscope.__file__).parent.parent), *trees.values()):
        compileall.compile_dir(str(Path(directory) / "stepscope"), quiet=1)
    env = {"PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    hta_env = {"OMP_NUM_THREADS": "1"}
    output = os.path.join(args.work_dir, "analyze-output.txt")
    os.makedirs(args.work_dir, exist_ok=True)
    rows = []
    print(f"{'trace':<60} {'MB':>7} {'tool':<9} {'median s':>9} {'runs s':>20} {'CPU s':>7} {'RSS MB':>7}", flush=True)
    try:
        for rel, path in cases:
            size_mb = json_mb(path) if not rel.startswith("synthetic") else path.stat().st_size / 1e6
            rank = trace_rank(path)
            tools: list[tuple[str, list[str], dict[str, str], str | None]] = [
                ("stepscope", [*stepscope_command(), "analyze", str(path)], env, output),
                *((("stepscope@jobs1", [*stepscope_command(), "analyze", str(path), "--jobs", "1"], env, output),)
                  if args.one_job else ()),
                *((f"stepscope@{label}", [sys.executable, "-m", "stepscope", "analyze", str(path)],
                   dict(env, PYTHONPATH=directory), output) for label, directory in trees.items())]
            if not args.skip_hta and size_mb <= args.skip_hta_above_mb:
                for item in args.hta or [f"hta={sys.executable}"]:
                    label, _, python = item.partition("=")
                    tools.append((label, [python, "-c", HTA_CHILD, str(path), str(rank), args.hta_work], hta_env, None))
            runs_by_tool: dict[str, list[dict]] = {tool[0]: [] for tool in tools}
            for index in range(args.repeat):  # interleaved, the order alternating: all see the same load
                for tool, command, tool_env, sink in (tools if index % 2 == 0 else tools[::-1]):
                    runs_by_tool[tool].append(run_command(command, tool_env, sink, args.tree_rss))
            for tool, *_ in tools:
                runs = runs_by_tool[tool]
                walls = [r["wall_s"] for r in runs]
                row = {"trace": rel, "file_mb": size_mb, "tool": tool, "wall_s": statistics.median(walls),
                       "walls": walls, "cpu_s": statistics.median(r["cpu_s"] for r in runs),
                       "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
                       **({key: max(r[key] for r in runs) for key in ("tree_rss_mb", "tree_pss_mb")}
                          if args.tree_rss else {}),
                       "exit": max(r["exit"] for r in runs), "tail": runs[0]["tail"]}
                rows.append(row)
                shown = " ".join(f"{w:.2f}" for w in walls)
                print(f"{rel[-60:]:<60} {size_mb:7.1f} {tool:<9} {row['wall_s']:9.2f} {shown:>20} {row['cpu_s']:7.2f} "
                      f"{row['peak_rss_mb']:7.0f}" + (f" tree {row['tree_rss_mb']:.0f} MB, PSS {row['tree_pss_mb']:.0f} MB"
                                                      if args.tree_rss else "")
                      + ("" if row["exit"] == 0 else f"  exit {row['exit']}: {row['tail']!r}"),
                      flush=True)
    finally:
        if args.delete_synthetic:
            for path in made:
                path.unlink(missing_ok=True)
        if os.path.exists(output):
            os.unlink(output)
    summary = ratios(rows)
    if summary:
        print(f"\n{'trace':<60} {'against':<10} {'speed-up':>9} {'CPU ratio':>10} {'RSS ratio':>10}")
        for rel, other, speedup, cpu, rss in summary:
            print(f"{rel[-60:]:<60} {other:<10} {speedup:8.1f}x {cpu:9.1f}x {rss:10.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"runs": rows, "ratios": summary}, indent=1))


def ratios(rows: list[dict]) -> list[tuple[str, str, float, float, float]]:
    """Per trace and per HTA release: its median wall / stepscope's, its CPU time / stepscope's,
    stepscope's peak RSS / its peak RSS."""
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
