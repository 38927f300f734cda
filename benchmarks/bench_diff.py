"""Cost of `stepscope diff`: the run comparison's bootstrap, and the trace diff against HTA.

1. **Run diff** of two synthetic 100,000-step records (every row: step time, phases, throughput,
   GC) against the baseline of reading their step columns' means with numpy (what a comparison
   without intervals costs): the ratio says what the intervals add.
2. **Trace diff** of HTA's reference pair (``../shared/traces/hta/trace_diff``, 35 + 33 MB of JSON)
   in a fresh process (interpreter start, loading both traces, the diff) against the same in HTA
   0.5.0 when ``--hta-python`` points at an interpreter with it installed, else against the HTA
   wall time recorded in ``../shared/traces/expected/trace_diff.pair.hta.json`` (same machine class,
   not the same run: the ratio is then indicative only, and says so).

    python benchmarks/bench_diff.py [--rounds 3] [--hta-python /path/to/python-with-hta]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared" / "traces"
PAIR = (SHARED / "hta/trace_diff/control", SHARED / "hta/trace_diff/test")

OURS = """
import sys
from stepscope.pipeline.compare import diff_traces
from pathlib import Path
diff = diff_traces(Path(sys.argv[1]), Path(sys.argv[2]))
print(len(diff.ops))
"""
HTA = """
import sys, logging
logging.disable(logging.WARNING)
from hta.trace_diff import TraceDiff
print(len(TraceDiff.compare_traces(sys.argv[1], sys.argv[2])))
"""


def _record(count: int, seed: int):
    from stepscope.record.run import GcPauses, RunMeta, RunRecord, StepTable

    rng = np.random.default_rng(seed)
    wait = rng.integers(1_000_000, 2_000_000, count)
    forward = rng.integers(3_000_000, 4_000_000, count)
    other = np.full(count, 100_000)
    duration = wait + forward + other
    start = np.concatenate([[0], np.cumsum(duration)[:-1]])
    steps = StepTable.from_columns({"start_ns": start, "duration_ns": duration, "data_wait_ns": wait,
                                    "forward_ns": forward, "other_ns": other, "batches": np.ones(count),
                                    "samples": np.full(count, 32), "optimizer_steps": np.ones(count)})
    picks = np.arange(0, count, 50)
    gc = GcPauses(enabled=True, start_ns=start[picks], duration_ns=np.full(len(picks), 50_000),
                  generation=np.zeros(len(picks), dtype=np.int64), collected=np.zeros(len(picks), dtype=np.int64),
                  uncollectable=np.zeros(len(picks), dtype=np.int64), step=picks, phase=np.full(len(picks), 5))
    return replace(RunRecord(meta=RunMeta(target="train.py"), steps=steps), gc_pauses=gc)


def run_diff(rounds: int, steps: int) -> None:
    from stepscope.analysis.run.diff import diff_runs
    from stepscope.analysis.run.steady import steady_mask

    a, b = _record(steps, 1), _record(steps, 2)
    ours, base = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        for record in (a, b):
            mask = steady_mask(record)
            for name in ("duration_ns", "data_wait_ns", "forward_ns", "other_ns", "samples"):
                float(record.steps.column(name)[mask].mean())
        base.append(time.perf_counter() - start)
        start = time.perf_counter()
        diff = diff_runs(a, b, label_a="A", label_b="B")
        ours.append(time.perf_counter() - start)
    print(f"run diff, {steps:,} steps per side, {len(diff.rows)} rows: {statistics.median(ours) * 1e3:.1f} ms "
          f"(means only: {statistics.median(base) * 1e3:.2f} ms) — ratio {statistics.median(ours) / statistics.median(base):.0f}×")


def _wall(python: str, code: str, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run([python, "-c", code, str(PAIR[0]), str(PAIR[1])], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def trace_diff(rounds: int, hta_python: str | None) -> None:
    if not PAIR[0].is_dir():
        print("trace diff: the shared reference traces are not here; skipped")
        return
    if hta_python:
        ours, hta = [], []
        for _ in range(rounds):  # interleaved: a drifting machine slows both alike
            ours.append(_wall(sys.executable, OURS, 1))
            hta.append(_wall(hta_python, HTA, 1))
        print(f"trace diff of HTA's trace_diff pair, whole process: stepscope {statistics.median(ours):.2f} s, "
              f"HTA {statistics.median(hta):.2f} s — HTA/stepscope ratio {statistics.median(hta) / statistics.median(ours):.1f}× "
              "(same run)")
        return
    ours_s = _wall(sys.executable, OURS, rounds)
    expected = json.loads((SHARED / "expected/trace_diff.pair.hta.json").read_text())["runs"]
    recorded = {name: run["wall_s"] for name, run in expected.items() if run.get("ok")}
    print(f"trace diff of HTA's trace_diff pair, whole process: stepscope {ours_s:.2f} s; HTA recorded "
          + ", ".join(f"{name} {wall:.2f} s ({wall / ours_s:.1f}×)" for name, wall in recorded.items())
          + " — recorded, not this run: indicative only")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--hta-python", help="a Python interpreter with HolisticTraceAnalysis installed")
    args = parser.parse_args()
    run_diff(args.rounds, args.steps)
    trace_diff(args.rounds, args.hta_python)


if __name__ == "__main__":
    main()
