"""False alarms *and* power of `stepscope diff`, quiet and loaded.

Makes runs of the zoo's compute-bound ``healthy`` workload (``stepscope run -m stepscope.zoo.healthy``)
at batch sizes scaled by known factors (×1, ×1.1, ×1.25, ×1.5, ×2, ×4: the step's work grows with the
batch), plus repeats of ``small-batch``, in interleaved rounds; every round once on the machine as it
is ("quiet") and once with a busy loop beside (``python -c "while True: pass"``: one core taken),
then compares them with exactly what ``stepscope diff A B`` runs (one run per side,
:func:`stepscope.pipeline.compare.compare_runs`, the run index off):

- **false alarms**: two runs of one setup (the two ×1 runs of a round, and ``small-batch``'s two)
  called faster or slower, quiet, loaded, and with one side loaded (a quiet run against the loaded
  round's run of the same setup);
- **power**: ×1 (A) against ×s (B) of the same round: how often the step time is called slower,
  for each scale, quiet, loaded and with only B loaded. The true change is the median over all
  quiet rounds of B/A (the batch does not scale the step exactly).

    python benchmarks/diff_power.py --rounds 4 --out /tmp/diff-power
    python benchmarks/diff_power.py --reuse /tmp/diff-power    # analyse runs made before

An interrupted study resumes where it stopped (runs already recorded are kept).

The rates are estimates over few correlated trials; their counts are printed beside them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

SCALES = (1.0, 1.1, 1.25, 1.5, 2.0, 4.0)
BATCH = 64
STEPS = 60


#: A straggler's wait: the step waits PEER_WAIT_S for a slower peer (0: the straggler removed).
STRAGGLER = """
import os
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(3200, 64), torch.randn(3200, 1)), batch_size=32)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
wait = float(os.environ.get("PEER_WAIT_S", "0"))
for x, y in loader:
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    if wait:
        time.sleep(wait)  # waiting for a slower peer
    opt.step()
"""


def _run(target: Path, argv: list[str], extra_env: dict[str, str] | None = None) -> None:
    """One run (skipped when its record is there: an interrupted study resumes)."""
    if (target / "record.rank0.json.gz").is_file():
        return
    env = {**os.environ, "STEPSCOPE_INDEX": "off", **(extra_env or {})}
    command = ["-m", *argv] if not argv[0].endswith(".py") else argv
    subprocess.run([sys.executable, "-m", "stepscope", "run", "-o", str(target), "--no-summary", "--force",
                    *command], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_runs(out: Path, rounds: int, conditions: tuple[str, ...]) -> None:
    script = out / "_straggler.py"
    script.write_text(STRAGGLER.lstrip(), encoding="utf-8")
    for repeat in range(1, rounds + 1):
        for condition in conditions:
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if condition == "loaded" else None
            try:
                time.sleep(1.0 if hog else 0.0)
                plan: list[tuple[str, list[str]]] = []
                for scale in SCALES:
                    batch = int(round(BATCH * scale))
                    plan.append((f"healthy-x{scale:g}-a", ["stepscope.zoo.healthy", "--steps", str(STEPS),
                                                           "--batch-size", str(batch)]))
                    if scale == 1.0:
                        plan.append((f"healthy-x{scale:g}-b", ["stepscope.zoo.healthy", "--steps", str(STEPS),
                                                               "--batch-size", str(batch)]))
                plan += [("small-batch-x1-a", ["stepscope.zoo.small_batch", "--steps", "80"]),
                         ("small-batch-x1-b", ["stepscope.zoo.small_batch", "--steps", "80"])]
                for name, argv in plan:
                    _run(out / f"{condition}-{repeat}-{name}", argv)
                    print(f"{condition} round {repeat}: {name}", flush=True)
                for name, wait in (("straggler-a", "0.03"), ("removed-a", "0")):
                    _run(out / f"{condition}-{repeat}-{name}", [str(script)], {"PEER_WAIT_S": wait})
                    print(f"{condition} round {repeat}: {name}", flush=True)
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()


def _load(out: Path) -> dict[tuple[str, int, str], Path]:
    runs: dict[tuple[str, int, str], Path] = {}
    for path in sorted(out.iterdir()):
        if not (path / "record.rank0.json.gz").is_file():
            continue
        condition, repeat, name = path.name.split("-", 2)
        runs[(condition, int(repeat), name)] = path
    return runs


def _verdict(a: Path, b: Path) -> dict[str, Any]:
    from stepscope.pipeline.compare import compare_runs

    view = compare_runs([a], [b], index=None)
    row = view.row("step_time")
    assert row is not None
    document = view.to_dict()
    busy = [share for share in document["busy"].values() if share is not None]
    floor = 1 + document["floor"] if document.get("floor") is not None else 1.4
    return {"verdict": row.verdict, "change": row.change, "busy": max(busy, default=0.0), "floor": floor,
            "low": row.figure.low, "high": row.figure.high}


def _called(item: dict[str, Any], floor: float) -> bool:
    """Whether the step time is called different at the floor ``floor`` (a factor): the interval
    excludes 0 and B/A is beyond it (compare_stats.interval_verdict)."""
    from stepscope.analysis.compare_stats import beyond_floor

    if item["change"] is None or item["low"] is None or item["high"] is None:
        return False
    return not (item["low"] <= 0 <= item["high"]) and beyond_floor(item["change"], floor - 1)


FLOORS = (1.4, 2.0, 3.0, 5.0)


def analyse(out: Path) -> None:
    runs = _load(out)
    rounds = sorted({repeat for _, repeat, _ in runs})
    conditions = sorted({condition for condition, _, _ in runs})
    print(f"{len(runs)} runs, rounds {rounds}, conditions {conditions}")
    # false alarms: identical setups
    alarms: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for repeat in rounds:
        for workload in ("healthy-x1", "small-batch-x1"):
            for condition in conditions:
                a, b = runs.get((condition, repeat, f"{workload}-a")), runs.get((condition, repeat, f"{workload}-b"))
                if a and b:
                    alarms[condition].append(_verdict(a, b))
            a, b = runs.get(("quiet", repeat, f"{workload}-a")), runs.get(("loaded", repeat, f"{workload}-b"))
            if a and b:
                alarms["one side loaded"].append(_verdict(a, b))
    print("\nfalse alarms (identical setups, step time called faster/slower):")
    for condition, items in alarms.items():
        called = sum(item["verdict"] in ("faster", "slower") for item in items)
        factors = [max(1 + item["change"], 1 / (1 + item["change"])) for item in items if item["change"] is not None]
        floors = sorted({f"×{item['floor']:.2f}" for item in items if item["floor"]})
        busy = [item["busy"] for item in items]
        print(f"  {condition:16s} {called}/{len(items)}  identical pairs differed by up to ×{max(factors):.2f} "
              f"(median ×{float(np.median(factors)):.2f}); floors used {', '.join(floors)}; other processes' "
              f"share of the cores (the busier side) median {float(np.median(busy)):.0%}, "
              f"{min(busy):.0%}–{max(busy):.0%}")
    print("\n  at other floors (every identical pair above; a floor is a factor):")
    for floor in FLOORS:
        cells = []
        for condition, items in alarms.items():
            cells.append(f"{condition} {sum(_called(item, floor) for item in items)}/{len(items)}")
        print(f"    ×{floor:<4g} " + ", ".join(cells))
    # power: x1 (A) against xs (B) of the same round
    truth: dict[float, list[float]] = defaultdict(list)
    power: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    for repeat in rounds:
        for scale in SCALES[1:]:
            for condition in conditions:
                a = runs.get((condition, repeat, "healthy-x1-a"))
                b = runs.get((condition, repeat, f"healthy-x{scale:g}-a"))
                if a and b:
                    result = _verdict(a, b)
                    power[(condition, scale)].append(result)
                    if condition == "quiet" and result["change"] is not None:
                        truth[scale].append(1 + result["change"])
            a, b = runs.get(("quiet", repeat, "healthy-x1-a")), runs.get(("loaded", repeat, f"healthy-x{scale:g}-a"))
            if a and b:
                power[("one side loaded", scale)].append(_verdict(a, b))
    # a many-fold change: a straggler's 30 ms wait per step (A) removed (B)
    many: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for repeat in rounds:
        for label, cond_a, cond_b in (("quiet", "quiet", "quiet"), ("loaded", "loaded", "loaded"),
                                      ("one side loaded", "loaded", "quiet")):
            a, b = runs.get((cond_a, repeat, "straggler-a")), runs.get((cond_b, repeat, "removed-a"))
            if a and b:
                many[label].append(_verdict(a, b))
    if many:
        print("\na straggler removed (A waits 30 ms a step for a peer, B does not): step time called faster")
        for label, items in many.items():
            called = sum(item["verdict"] == "faster" for item in items)
            factors = ", ".join(f"÷{1 / (1 + item['change']):.1f}" for item in items if item["change"] is not None)
            print(f"  {label:16s} {called}/{len(items)}  (A/B {factors})")
    if many:
        print("  at other floors: " + "; ".join(
            f"×{floor:g}: " + ", ".join(f"{label} {sum(_called(item, floor) for item in items)}/{len(items)}"
                                        for label, items in many.items()) for floor in FLOORS))
    print("\npower (A = ×1 batch, B = ×s batch of the same round: step time called slower):")
    print("  batch ×s   true B/A (median of quiet pairs)   " + "   ".join(f"{c:>16s}" for c in
                                                                          (*conditions, "one side loaded")))
    for scale in SCALES[1:]:
        true = f"×{float(np.median(truth[scale])):.2f}" if truth[scale] else "–"
        cells = []
        for condition in (*conditions, "one side loaded"):
            items = power[(condition, scale)]
            called = sum(item["verdict"] == "slower" for item in items)
            cells.append(f"{called}/{len(items)}".rjust(16))
        print(f"  ×{scale:<7g}  {true:>34s}   " + "   ".join(cells))
    print("  at other floors (called slower, all three conditions together):")
    for floor in FLOORS:
        cells = []
        for scale in SCALES[1:]:
            items = [item for (condition, value), group in power.items() if value == scale for item in group]
            called = sum(_called(item, floor) and (item["change"] or 0) > 0 for item in items)
            cells.append(f"×{scale:g} {called}/{len(items)}")
        print(f"    ×{floor:<4g} " + ", ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("/tmp/stepscope-diff-power"))
    parser.add_argument("--reuse", type=Path, help="analyse the run directories already in this folder")
    parser.add_argument("--conditions", nargs="+", default=["quiet", "loaded"], choices=["quiet", "loaded"])
    args = parser.parse_args()
    folder = args.reuse or args.out
    if args.reuse is None:
        folder.mkdir(parents=True, exist_ok=True)
        make_runs(folder, args.rounds, tuple(args.conditions))
    analyse(folder)


if __name__ == "__main__":
    main()
