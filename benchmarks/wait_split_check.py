"""What the wait sampler changes in verdicts: kept blind workloads with a busy Python thread, run
again under capture, each new record diagnosed with and without what the training thread was
sampled asleep in.

    python benchmarks/wait_split_check.py EVAL.json [EVAL.json ...] [--factor gil_thread] [--out NAME]

``EVAL.json`` is what ``blind_eval.py --out`` wrote with ``--keep``: each kept workload directory
holds its generated ``train.py`` and ``launch.py``. Workloads with ``--factor`` among their factors
and one process (no ``slow_rank``) run once more as ``launch.py python -m stepscope run -o NAME
train.py`` (machine otherwise idle: a neighbour of the script's own makes its own findings). Per
workload it prints the truth, the top findings without the samples (the account's inferred
causes) and with them, and what the thread slept in per phase; at the end, on how many the top
finding (its family) changed, and on how many its cost or confidence moved. Seconds per workload: the script's own run (~5-10 s).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from stepscope.analysis.bundle import build_evidence
from stepscope.diagnosis.engine import run_rules
from stepscope.record.store import load_record


def top_findings(record, count: int = 3) -> list[tuple[str, float, float]]:
    return [(item.family, round(item.impact, 3), item.confidence)
            for item in run_rules(build_evidence(record)).findings[:count]]


def both_ways(record) -> tuple[list, list, dict]:
    """Top findings without and with the wait samples, and the samples' split per phase."""
    account = record.facts.thread_account
    bare = replace(record, facts=replace(record.facts, thread_account=replace(account, waits=())))
    view = build_evidence(record).account
    slept = {item.phase: {"split": item.off_split, "waits": item.waits} for item in view.phases
             if item.waits} if view is not None else {}
    return top_findings(bare), top_findings(record), slept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("evaluations", nargs="+", type=Path)
    parser.add_argument("--factor", default="gil_thread")
    parser.add_argument("--out", default="stepscope-wait-check")
    args = parser.parse_args(argv)
    changed = repriced = seen = 0
    for path in args.evaluations:
        try:
            workloads = json.loads(path.read_text())["workloads"]
        except (OSError, ValueError, KeyError) as exc:
            print(f"wait_split_check: {path} is not a blind evaluation ({exc}); pass blind_eval.py's --out file",
                  file=sys.stderr)
            return 2
        for row in workloads:
            names = [item["name"] for item in row["factors"]]
            directory = Path(row["directory"])
            if args.factor not in names or "slow_rank" in names or not (directory / "train.py").exists():
                continue
            subprocess.run([sys.executable, "launch.py", sys.executable, "-m", "stepscope", "run", "--no-summary",
                            "--force", "-o", args.out, "train.py"], cwd=directory, capture_output=True, timeout=600)
            try:
                record = load_record(directory / args.out)
            except Exception as exc:  # noqa: BLE001 - a run that failed is reported and skipped
                print(f"{directory.name}: no record ({exc})")
                continue
            if record.facts.thread_account is None:
                print(f"{directory.name}: no thread account")
                continue
            bare, sampled, slept = both_ways(record)
            seen += 1
            changed += [item[0] for item in bare[:1]] != [item[0] for item in sampled[:1]]
            repriced += bare[:1] != sampled[:1]
            print(f"{row['seed']} {directory.name} {names} truth {row['truth']['bottleneck']}\n"
                  f"   without samples: {bare}\n   with samples:    {sampled}\n   slept in: {slept}", flush=True)
    print(f"{seen} workloads: the top finding changed on {changed}; its cost or confidence moved on {repriced}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
