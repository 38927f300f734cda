"""Does a verdict reported at 90 % confidence hold 90 % of the time? The zoo, quiet and disturbed.

Every single-process zoo scenario runs ``--runs`` times under each condition:

- ``quiet``: as ``stepscope demo`` runs it;
- ``neighbour``: beside a process that keeps one core busy (a neighbour on a shared box);
- ``short``: a third of its steps (a short run: fewer steps, fewer sampler readings).

For each run the top finding is *right* when its family is the planted one — or ``foreign_load``
when a neighbour was planted too (the machine was crowded: that is the first thing to know). The
table groups the top findings by family and by reported confidence and prints the share that was
right: the calibration BENCHMARKS.md shows ("Confidence calibration").

    python benchmarks/confidence_calibration.py measure --out conf.json [--runs 2]   # ~20 min on 2 cores
    python benchmarks/confidence_calibration.py table conf.json
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CONDITIONS = ("quiet", "neighbour", "short")
#: Default step counts of the scenarios whose length a third of would still be a run.
SHORT_STEPS = {"input-cpu": 14, "storage-latency": 14, "small-batch": 14, "tiny-ops": 14, "memory-leak": 34,
               "oversubscribed": 27, "busy-model": 10, "worker-tokenize": 20, "loop-bookkeeping": 27,
               "gc-cycles": 20, "healthy": 14, "jsonl-text": 14, "tokenize-main": 50, "metrics-confusion": 134}


def run_once(name: str, condition: str, out: Path) -> dict:
    burner = None
    if condition == "neighbour":
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        extra = ["--steps", str(SHORT_STEPS[name])] if condition == "short" and name in SHORT_STEPS else []
        command = [sys.executable, "-m", "stepscope", "demo", name, "-o", str(out), "--no-summary", *extra]
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            return {"scenario": name, "condition": condition, "error": result.stderr[-300:]}
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    report = json.loads((out / "report.json").read_text())
    findings = report.get("findings") or []
    top = findings[0] if findings else None
    return {"scenario": name, "condition": condition,
            "top_family": top["family"] if top else None, "top_confidence": top["confidence"] if top else None,
            "top_severity": top["severity"] if top else None,
            "families": [item["family"] for item in findings]}


def measure(out: Path, runs: int) -> None:
    from stepscope.zoo import SCENARIOS

    rows = json.loads(out.read_text()) if out.exists() else []
    work = Path(tempfile.mkdtemp(prefix="stepscope-confidence-"))
    names = [name for name, scenario in SCENARIOS.items() if scenario.nproc == 1]
    for repeat in range(runs):
        for name in names:
            for condition in CONDITIONS:
                if condition == "short" and name not in SHORT_STEPS:
                    continue
                done = sum(1 for row in rows if row["scenario"] == name and row["condition"] == condition)
                if done > repeat:
                    continue
                row = run_once(name, condition, work / f"{name}-{condition}-{repeat}")
                row["planted"] = SCENARIOS[name].planted_family
                rows.append(row)
                out.write_text(json.dumps(rows, indent=1))
                print(json.dumps(row), file=sys.stderr, flush=True)


def right(row: dict) -> bool:
    if row.get("top_family") == row["planted"]:
        return True
    return row["condition"] == "neighbour" and row.get("top_family") == "foreign_load"


def table(path: Path) -> None:
    rows = [row for row in json.loads(path.read_text()) if "error" not in row and row.get("top_family")]
    by_family: dict[str, list[dict]] = collections.defaultdict(list)
    for row in rows:
        by_family[row["top_family"]].append(row)
    print("| top finding's family | runs | mean reported confidence | right | wrong: planted was |")
    print("| --- | ---: | ---: | ---: | --- |")
    for family, items in sorted(by_family.items()):
        good = [item for item in items if right(item)]
        wrong = collections.Counter(f"{item['planted']} ({item['condition']})" for item in items if not right(item))
        mean = sum(item["top_confidence"] for item in items) / len(items)
        print(f"| `{family}` | {len(items)} | {mean:.0%} | {len(good) / len(items):.0%} | "
              f"{', '.join(f'{name} ×{count}' for name, count in wrong.items()) or '-'} |")
    print()
    print("| reported confidence | runs | right |")
    print("| --- | ---: | ---: |")
    for low, high in ((0.0, 0.6), (0.6, 0.75), (0.75, 0.85), (0.85, 1.01)):
        items = [row for row in rows if low <= row["top_confidence"] < high]
        if items:
            print(f"| {low:.0%}–{min(high, 1.0):.0%} | {len(items)} | {sum(map(right, items)) / len(items):.0%} |")
    by_condition = collections.defaultdict(list)
    for row in rows:
        by_condition[row["condition"]].append(row)
    print()
    print("| condition | runs | top finding right |")
    print("| --- | ---: | ---: |")
    for condition, items in by_condition.items():
        print(f"| {condition} | {len(items)} | {sum(map(right, items)) / len(items):.0%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("measure")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--runs", type=int, default=2)
    show = sub.add_parser("table")
    show.add_argument("path", type=Path)
    args = parser.parse_args()
    if args.command == "measure":
        measure(args.out, args.runs)
    else:
        table(args.path)


if __name__ == "__main__":
    main()
