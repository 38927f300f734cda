"""False alarms of `stepscope diff`: how often two identical runs are called different.

Runs each zoo workload ``--runs`` times with the same settings (``stepscope demo NAME --steps N``),
then compares every consecutive pair of one workload (run i as A, run i+1 as B) with the statistics
``stepscope diff`` uses, at several noise floors. A false alarm is a step-time row (or, for the
"any row" rate, any row with a verdict) that says faster/slower; the gate's false alarm is
``--fail-if-slower 5`` tripping. It also prints the distribution of |Δ step time| over the pairs:
the run-to-run noise the floor must cover.

    python benchmarks/diff_false_alarms.py --runs 8 --steps 80 --out /tmp/fa
    python benchmarks/diff_false_alarms.py --reuse /tmp/fa   # analyse runs made before

Pairs are not independent of one another (a run is B of one pair and A of the next), so the rate
is an estimate over ``len(pairs)`` correlated trials; the number of pairs is printed beside it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

WORKLOADS = ("healthy", "input-cpu", "tiny-ops", "small-batch")
FLOORS = (0.0, 0.05, 0.10, 0.20, 0.30, 0.35, 0.40, 0.50)


def make_runs(out: Path, runs: int, steps: int, workloads: tuple[str, ...]) -> None:
    env_index = {"STEPSCOPE_INDEX": "off"}
    import os

    env = {**os.environ, **env_index}
    for repeat in range(1, runs + 1):
        for name in workloads:  # interleaved: a drifting machine slows every workload alike
            target = out / f"{name}-{repeat}"
            subprocess.run([sys.executable, "-m", "stepscope", "demo", name, "--steps", str(steps), "-o", str(target),
                            "--no-summary", "--force"], check=True, env=env, stdout=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--out", type=Path, default=Path("/tmp/stepscope-false-alarms"))
    parser.add_argument("--reuse", type=Path, help="analyse the run directories already in this folder")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    args = parser.parse_args()
    folder = args.reuse or args.out
    if args.reuse is None:
        folder.mkdir(parents=True, exist_ok=True)
        make_runs(folder, args.runs, args.steps, tuple(args.workloads))

    from stepscope.analysis.compare_stats import FASTER, SLOWER
    from stepscope.analysis.run.diff import step_rows
    from stepscope.record.store import load_record

    by_workload: dict[str, list[tuple[int, Path]]] = defaultdict(list)
    for run_dir in folder.iterdir():
        if (run_dir / "record.rank0.json.gz").is_file():
            name, _, repeat = run_dir.name.rpartition("-")
            if repeat.isdigit():
                by_workload[name].append((int(repeat), run_dir))
    changes: list[float] = []
    alarms = {floor: {"step": 0, "any": 0, "gate": 0} for floor in FLOORS}
    pairs = 0
    per_workload: dict[str, list[float]] = defaultdict(list)
    for name, items in sorted(by_workload.items()):
        records = [load_record(path, with_samples=False) for _, path in sorted(items)]
        for a, b in zip(records, records[1:]):
            pairs += 1
            for floor in FLOORS:
                rows = step_rows(a, b, floor=floor)
                step = rows[0].diff
                if floor == FLOORS[0]:
                    changes.append(abs(step.change or 0.0))
                    per_workload[name].append(step.change or 0.0)
                alarms[floor]["step"] += step.verdict in (FASTER, SLOWER)
                alarms[floor]["any"] += any(row.diff.verdict in (FASTER, SLOWER) for row in rows)
                alarms[floor]["gate"] += bool(step.verdict == SLOWER and (step.worse_by or 0) > 0.05)
    print(f"{pairs} identical pairs over {len(by_workload)} workloads ({', '.join(sorted(by_workload))})")
    values = np.array(changes)
    print("|Δ step time| of identical pairs: median {:.1%}, p90 {:.1%}, p95 {:.1%}, max {:.1%}".format(
        *np.percentile(values, [50, 90, 95]), values.max()))
    factors = np.exp(np.abs(np.log1p(np.array([c for items in per_workload.values() for c in items]))))
    print("as a factor max(B/A, A/B): median {:.3f}, p90 {:.3f}, p95 {:.3f}, max {:.3f}".format(
        *np.percentile(factors, [50, 90, 95]), factors.max()))
    for name, items in sorted(per_workload.items()):
        print(f"  {name:12s} Δ step time: " + " ".join(f"{value:+.1%}" for value in items))
    print("one run per side:")
    print("floor  step-time false alarms  any-row false alarms  gate (--fail-if-slower 5) trips")
    for floor, counts in alarms.items():
        print(f"{floor:5.0%}  {counts['step']:3d}/{pairs} ({counts['step'] / pairs:5.1%})        "
              f"{counts['any']:3d}/{pairs} ({counts['any'] / pairs:5.1%})      "
              f"{counts['gate']:3d}/{pairs} ({counts['gate'] / pairs:5.1%})")
    # repeats: 3 runs against the next 3 (sliding), the interval over runs (diff A1 A2 A3 --vs B1 B2 B3),
    # and a history of 3 baselines against the next run (diff --baseline TAG B)
    from stepscope.analysis.run.diff import group_rows

    for size_b, what in ((3, "3 runs vs the next 3"), (1, "3 runs vs the next one")):
        groups = step_alarm = any_alarm = gate = 0
        for name, items in sorted(by_workload.items()):
            records = [load_record(path, with_samples=False) for _, path in sorted(items)]
            for start in range(0, len(records) - 3 - size_b + 1):
                rows = group_rows(records[start:start + 3], records[start + 3:start + 3 + size_b])
                step = rows[0].diff
                groups += 1
                step_alarm += step.verdict in (FASTER, SLOWER)
                any_alarm += any(row.diff.verdict in (FASTER, SLOWER) for row in rows)
                gate += bool(step.verdict == SLOWER and (step.worse_by or 0) > 0.05)
        if groups:
            print(f"repeats, {what}: step-time false alarms {step_alarm}/{groups} ({step_alarm / groups:.1%}), "
                  f"any row {any_alarm}/{groups} ({any_alarm / groups:.1%}), gate trips {gate}/{groups}")


if __name__ == "__main__":
    main()
