"""Run every benchmark in this folder with short settings and print the ratios they report.

``make bench`` runs this. Each script runs in its own process, one after the other, with settings
that take a few minutes in all on a 2-core machine; the numbers are therefore noisier than those in
BENCHMARKS.md (which gives the full commands). A script that fails is reported and the others
still run; the exit status is 1 when any failed.

    python benchmarks/run_all.py            # short settings
    python benchmarks/run_all.py --full     # each script's own defaults (much longer)
    python benchmarks/run_all.py --only bench_profilers.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REFERENCE = HERE.parent / "tests" / "data" / "traces" / "reference"
RESNET = "kineto_tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
#: script -> arguments for a short run (``--full`` drops them, except where a script needs an input)
SHORT = {
    "bench_profilers.py": ["--number", "20000", "--rounds", "3"],
    "bench_capture.py": ["--rounds", "2", "--steps", "100", "--block", "50"],
    "bench_sampler.py": ["--seconds", "4", "--rounds", "4", "--steps", "30"],
    "bench_analyze.py": ["--traces", str(REFERENCE), "--only", RESNET],
    "bench_comm.py": ["--rounds", "4", "--steps", "30"],
    "bench_diff.py": ["--rounds", "1", "--steps", "20000"],
    "bench_fixed_cost.py": ["--rounds", "1", "--scripts", "tiny"],
    "bench_jobs.py": ["--small", "16,64", "--large", "2"],
    "bench_worker_batches.py": ["--rounds", "5", "--batches", "1000"],
    "bench_bytecode.py": ["--rounds", "2"],
    "bench_gc_pause.py": ["--rounds", "1"],
    "bench_demo_exit.py": ["--rounds", "2"],
    "bench_warm_tests.py": ["--rounds", "1"],
}
RATIO = re.compile(r"ratio|⇒|\d\s*[x×](\s|$|\))", re.IGNORECASE)


def _analyze_ratios(out: Path) -> list[str]:
    """stepscope's wall time and peak RSS against HTA's, per trace, from bench_analyze's --out file."""
    data = json.loads(out.read_text())
    rows = data["runs"] if isinstance(data, dict) else data
    lines = []
    for trace in dict.fromkeys(row["trace"] for row in rows):
        tools = {row["tool"]: row for row in rows if row["trace"] == trace}
        ours = tools.get("stepscope")
        if ours is None:
            continue
        line = f"{trace[-50:]}: stepscope {ours['wall_s']:.2f} s, {ours['peak_rss_mb']:.0f} MB"
        if "hta" in tools and ours["wall_s"] > 0:
            hta = tools["hta"]
            line += (f"; HTA {hta['wall_s']:.2f} s, {hta['peak_rss_mb']:.0f} MB; "
                     f"HTA/stepscope time ratio {hta['wall_s'] / ours['wall_s']:.1f}")
        lines.append(line)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="each script's default (long) settings")
    parser.add_argument("--only", action="append", default=[], help="run only this script (repeatable)")
    args = parser.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(HERE.parent / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    scripts = sorted(path.name for path in HERE.glob("bench_*.py"))
    failed, summary = [], []
    for name in scripts:
        if args.only and name not in args.only:
            continue
        extra = [] if args.full and name != "bench_analyze.py" else list(SHORT.get(name, []))
        out = None
        if name == "bench_analyze.py":
            if importlib.util.find_spec("hta") is None:
                extra.append("--skip-hta")  # HTA is the optional `bench` extra
            out = Path(tempfile.mkdtemp(prefix="stepscope-bench-")) / "analyze.json"
            extra += ["--out", str(out)]
        print(f"== {name} {' '.join(extra)}", flush=True)
        started = time.monotonic()
        result = subprocess.run([sys.executable, str(HERE / name), *extra], env=env, capture_output=True, text=True)
        print(result.stdout, end="")
        if result.returncode != 0:
            failed.append(name)
            print(result.stderr[-3000:], end="")
            summary.append(f"{name}: FAILED (exit {result.returncode})")
            continue
        found = _analyze_ratios(out) if out is not None and out.exists() else \
            [line.strip() for line in result.stdout.splitlines()
             if RATIO.search(line) and line.strip().lower() not in ("ratio", "ratios")]
        summary += [f"{name}: {line}" for line in found] or [f"{name}: done (no ratio printed)"]
        print(f"   ({time.monotonic() - started:.0f} s)\n", flush=True)
    print("== ratios")
    print("\n".join(summary))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
