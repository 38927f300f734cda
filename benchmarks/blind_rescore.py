"""Re-diagnose a finished blind evaluation's runs with the current code, and score them again.

    python benchmarks/blind_rescore.py EVAL.json [EVAL.json ...] [--changed-only] [--calibration]

``EVAL.json`` is what ``blind_eval.py --out`` wrote; its rows keep each workload's ground truth and
directory, and the directory keeps the ``stepscope run`` record (``stepscope-run/``). Each record is
re-diagnosed (``stepscope report DIR --format json``: no run repeats, so this takes seconds, not the
evaluation's half hour) and scored against the stored truth, as the evaluation scores.

What this is for, and what it is not: a change to the *diagnosis* can be checked against the seeds it
was developed on in a minute. A change to *capture* needs new runs. And a seed re-scored here has been
looked at: its accuracy says nothing about workloads the rules were not tuned on — only a fresh seed
of ``blind_eval.py`` does (BENCHMARKS.md reports only those).

``--calibration`` prints, per band of the top finding's own (rule) confidence, how often it was right
over all the files given: the table ``diagnosis.engine.CONFIDENCE_MAP`` is fitted from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from blind.kept import each_kept, evaluations, rediagnose  # noqa: E402
from blind.score import read_verdict, score, summarise  # noqa: E402
from blind.truth import Truth  # noqa: E402

#: Bands of the rules' own confidence for ``--calibration``: [low, high).
RULE_BANDS = ((0.0, 0.6), (0.6, 0.7), (0.7, 0.75), (0.75, 0.8), (0.8, 0.85), (0.85, 0.9), (0.9, 1.01))


def rescore(row: dict) -> dict:
    """The row with the verdict and the outcome of the current code (the old ones under ``before``)."""
    truth = Truth.from_dict(row["truth"])
    report = rediagnose(Path(row["directory"]) / "stepscope-run")
    verdict = read_verdict(report)
    result = score(truth, verdict)
    top = (report.get("findings") or [{}])[0]
    return {**row, "before": {"verdict": row["verdict"], "outcome": row["outcome"]},
            "verdict": verdict.to_dict(), "rule_confidence": top.get("rule_confidence"),
            "findings": [f"{item.get('rule_id')} {item.get('confidence')}" for item in report.get("findings") or []],
            "outcome": result.outcome, "confidently_wrong": result.confidently_wrong}


def rule_calibration(rows: list[dict]) -> list[dict]:
    """Per band of the top finding's rule confidence: verdicts and how many were right."""
    answered = [row for row in rows if row["outcome"] in ("right", "wrong") and row.get("rule_confidence") is not None]
    table = []
    for low, high in RULE_BANDS:
        inside = [row for row in answered if low <= row["rule_confidence"] < high]
        right = sum(row["outcome"] == "right" for row in inside)
        table.append({"band": f"{low:.2f}-{min(high, 1.0):.2f}", "verdicts": len(inside), "right": right,
                      "smoothed": round((right + 1) / (len(inside) + 2), 3)})
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("evaluations", nargs="+", type=Path)
    parser.add_argument("--changed-only", action="store_true", help="print only the workloads whose outcome changed")
    parser.add_argument("--calibration", action="store_true", help="print the rule-confidence calibration table")
    parser.add_argument("--out", type=Path, help="write the re-scored rows as JSON")
    args = parser.parse_args(argv)
    loaded = evaluations(args.evaluations, "blind_rescore")
    if loaded is None:
        return 2
    every: list[dict] = []
    for path, data in loaded:
        rows = []
        for row, new in each_kept(path, data, rescore, "not re-scored"):
            rows.append(new)
            if args.changed_only and new["outcome"] == row["outcome"]:
                continue
            print(_line(path.name, new), flush=True)
        print(f"{path.name} (seed {data.get('seed')}): {json.dumps(_brief(summarise(rows)))}")
        every += rows
    if len(args.evaluations) > 1:
        print(f"all: {json.dumps(_brief(summarise(every)))}")
    if args.calibration:
        for band in rule_calibration(every):
            print(f"  rule confidence {band['band']}: {band['right']}/{band['verdicts']} right "
                  f"(smoothed {band['smoothed']:.2f})")
    if args.out:
        args.out.write_text(json.dumps(every, indent=1))
    return 0


def _line(name: str, row: dict) -> str:
    verdict: dict = row["verdict"]
    before = row["before"]
    truth = row["truth"]
    gains = ", ".join(f"{key} {value:+.0%}" for key, value in truth["gains"].items())
    return (f"{name} {row['name']}: {before['outcome']} -> {row['outcome']}"
            f"{' (confidently)' if row['confidently_wrong'] else ''} | truth {truth['bottleneck']} ({gains}) | "
            f"top {verdict['rule_id']} {verdict['confidence']} | {'; '.join(row['findings'][:3])}")


def _brief(summary: dict) -> dict:
    return {key: summary[key] for key in ("scored", "right", "wrong", "abstain", "accuracy", "confidently_wrong",
                                          "confidently_wrong_rate")}


if __name__ == "__main__":
    sys.exit(main())
