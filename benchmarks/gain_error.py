"""How far the gains stepscope's prescriptions promise land from the gains measured by ablation.

    python benchmarks/gain_error.py EVAL.json [EVAL.json ...] [--stored] [--out FILE]

``EVAL.json`` is what ``blind_eval.py --out`` wrote (with ``--keep``): each workload's ground truth —
the share of its step that removing each planted factor saved, measured by running it without
that factor — and the directory of its ``stepscope run``. Each run is re-diagnosed with the current
code (``stepscope report DIR --format json``; ``--stored`` reads the ``report.json`` the run wrote
instead) and every prescription that states a gain is paired with the planted factor its change
removes (``blind.score.map_finding``: the same table the verdicts are scored with), every finding
counted, not only the top one. A prescription whose change removes no planted factor of its
workload, or several, or whose change is not the removal of its cause (the worker plan: more workers
overlap costly samples with the step, they do not remove them; its error is measured against trials
of the change, ``calibrate_workers.py``) is counted apart and not paired.

Per gain model (which measured quantity the prescription's gain is: ``restarts`` the epoch starts'
share, ``foreign`` the wait for a core charged to other processes, ``gil`` the GIL thread's price):
the pairs, the mean and mean absolute error of estimate − measured, its 90th and 10th percentiles,
and the ``(overshoot, undershoot)`` they give — the entry ``diagnosis.rules._common.GAIN_ERROR``
states each estimate with, as the range [estimate − overshoot, estimate + undershoot]. Where the
reports already state ranges, how often the measured gain fell inside them; and, leaving each seed
out of the fit in turn, how often that seed's measured gains fell inside the range fitted on the
others — the coverage on workloads the range was not fitted on (an 80 % range: about 8 in 10).

What this is for: a gain the report shows is an estimate whose error is measured here.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from blind.kept import each_kept, evaluations, rediagnose  # noqa: E402
from blind.score import map_finding  # noqa: E402


@dataclass(frozen=True)
class Pair:
    """One prescription's stated gain against its factor's measured gain."""

    seed: str
    workload: str
    model: str
    rule_id: str
    factor: str
    estimate: float
    measured: float
    low: float | None
    high: float | None
    impact: float | None
    impact_before_overlap: float | None
    top: bool

    @property
    def error(self) -> float:
        return self.estimate - self.measured


#: The gain models whose change is the removal of the cause the ablation removes. The worker plan's
#: change (more workers) overlaps costly samples or slow reads with the step instead of removing them:
#: its error is measured against trials of the change itself (``calibrate_workers.py``).
COMPARABLE = ("restarts", "foreign", "gil")


def gain_model(finding: dict, prescription: dict) -> str:
    """Which measured quantity a prescription's gain comes from (see the module docstring)."""
    family = str(finding.get("family"))
    setting = prescription.get("setting")
    if setting == "persistent_workers":
        return "restarts"
    if setting == "num_workers":
        return "workers"
    return {"foreign_load": "foreign", "gil_contention": "gil"}.get(family, family)


def report_of(run_dir: Path, stored: bool) -> dict:
    """The run's report: the one it wrote (``stored``), else re-diagnosed with the current code."""
    return json.loads((run_dir / "report.json").read_text()) if stored else rediagnose(run_dir)


def pairs_of(row: dict, report: dict, seed: str) -> tuple[list[Pair], int]:
    """The workload's paired prescriptions, and how many stated a gain but were not paired. A gain two
    findings state for the same change (``persistent_workers=True`` in the input and the epoch-boundary
    findings) is one estimate: it is paired once, with the first finding that states it."""
    planted = set(row["truth"]["gains"])
    pairs: list[Pair] = []
    unpaired = 0
    stated: set[tuple[str, str, float]] = set()
    for position, finding in enumerate(report.get("findings") or []):
        for prescription in finding.get("prescriptions") or []:
            gain = prescription.get("expected_gain")
            if prescription.get("withdrawn") or not isinstance(gain, dict) or gain.get("estimate") is None:
                continue
            removes, _ = map_finding(finding, str(prescription.get("action", "")))
            factors = sorted(set(removes) & planted)
            if len(factors) != 1 or gain_model(finding, prescription) not in COMPARABLE:
                unpaired += 1
                continue
            key = (gain_model(finding, prescription), factors[0], float(gain["estimate"]))
            if key in stated:
                continue
            stated.add(key)
            stated_range = gain["low"] != gain["high"]
            pairs.append(Pair(seed, row["name"], gain_model(finding, prescription), str(finding.get("rule_id")),
                              factors[0], float(gain["estimate"]), float(row["truth"]["gains"][factors[0]]),
                              float(gain["low"]) if stated_range else None,
                              float(gain["high"]) if stated_range else None,
                              finding.get("impact"), finding.get("impact_before_overlap"), position == 0))
    return pairs, unpaired


def percentile(values: list[float], share: float) -> float:
    """The ``share`` quantile by linear interpolation between the closest ranks."""
    ordered = sorted(values)
    position = share * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def table(pairs: list[Pair]) -> list[dict]:
    """Per gain model: the error's statistics, and the stated ranges' coverage."""
    rows = []
    for model in sorted({pair.model for pair in pairs}):
        errors = [pair.error for pair in pairs if pair.model == model]
        ranged = [pair for pair in pairs if pair.model == model and pair.low is not None]
        inside = sum(pair.low <= pair.measured <= pair.high for pair in ranged)  # type: ignore[operator]
        rows.append({"model": model, "pairs": len(errors), "mean": statistics.mean(errors),
                     "mean_abs": statistics.mean(abs(error) for error in errors),
                     "overshoot_p90": percentile(errors, 0.9), "undershoot_p10": percentile(errors, 0.1),
                     "ranged": len(ranged), "inside": inside})
    return rows


def fitted(errors: list[float]) -> tuple[float, float]:
    """``GAIN_ERROR``'s entry the errors give: the 90th-percentile overshoot and the 10th-percentile
    undershoot, as magnitudes rounded up to the point, and never below zero (a range keeps its estimate)."""
    over, under = percentile(errors, 0.9), -percentile(errors, 0.1)
    return math.ceil(max(0.0, over) * 100 - 1e-9) / 100, math.ceil(max(0.0, under) * 100 - 1e-9) / 100


def held_out(pairs: list[Pair]) -> dict[str, tuple[int, int]]:
    """Per gain model, leaving one seed out at a time: how many of that seed's measured gains fall in the
    range fitted (:func:`fitted`) on the other seeds' pairs, and how many were stated — the range's
    coverage on workloads it was not fitted on."""
    out: dict[str, tuple[int, int]] = {}
    for model in sorted({pair.model for pair in pairs}):
        inside = total = 0
        for seed in sorted({pair.seed for pair in pairs}):
            rest = [pair.error for pair in pairs if pair.model == model and pair.seed != seed]
            if len(rest) < 2:
                continue
            over, under = fitted(rest)
            for pair in pairs:
                if pair.model == model and pair.seed == seed:
                    total += 1
                    inside += pair.estimate - over <= pair.measured <= pair.estimate + under
        out[model] = (inside, total)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("evaluations", nargs="+", type=Path)
    parser.add_argument("--stored", action="store_true", help="read each run's report.json instead of re-diagnosing")
    parser.add_argument("--out", type=Path, help="write every pair as JSON")
    args = parser.parse_args(argv)
    loaded = evaluations(args.evaluations, "gain_error")
    if loaded is None:
        return 2
    pairs: list[Pair] = []
    unpaired = 0
    for path, data in loaded:
        for row, report in each_kept(path, data, lambda row: report_of(Path(row["directory"]) / "stepscope-run",
                                                                       args.stored), "skipped"):
            found, missed = pairs_of(row, report, str(data.get("seed")))
            pairs += found
            unpaired += missed
    print(f"{len(pairs)} prescriptions paired with their factor's measured gain; {unpaired} not paired (their "
          "change removed no single planted factor, or is not its removal: the worker plan)")
    seeds = sorted({pair.seed for pair in pairs})
    print(f"seeds: {', '.join(seeds)}")
    print("| gain model | pairs | mean error | mean abs error | overshoot (p90) | undershoot (p10) | "
          "fitted (over, under) | inside the stated range | inside, each seed left out of the fit |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    cross = held_out(pairs)
    for row in table(pairs):
        inside = f"{row['inside']}/{row['ranged']}" if row["ranged"] else "no range"
        over, under = fitted([pair.error for pair in pairs if pair.model == row["model"]])
        kept, total = cross.get(row["model"], (0, 0))
        left_out = f"{kept}/{total}" if total else "one seed only"
        print(f"| {row['model']} | {row['pairs']} | {row['mean']:+.3f} | {row['mean_abs']:.3f} | "
              f"{row['overshoot_p90']:+.3f} | {row['undershoot_p10']:+.3f} | ({over:.2f}, {under:.2f}) | {inside} | "
              f"{left_out} |")
    if args.out:
        args.out.write_text(json.dumps([{**pair.__dict__, "error": pair.error} for pair in pairs], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
