"""Calibration of the DataLoader worker plan: predicted vs measured gains, with real trials.

Sweeps a generated workload (``benchmarks/calibration/workload.py``: pure-Python loading work per
batch × model size × intra-op threads) on 1 or 2 cores (``taskset``). For every configuration it
runs one diagnosis run (``stepscope run``, sampler and stack sampling on, as a user's run) and
trials of each candidate change — DataLoader workers × the main process's intra-op threads —
``--repeats`` times, interleaved with baseline trials (``stepscope run --max-steps --set … --no-monitor
--stacks-hz 0``, the trials of ``run --verify``). The measured gain of a candidate is
1 − (its median steady step time / the baseline trials' median).

    python benchmarks/calibrate_workers.py measure --out cal.json [--repeats 2]   # the trials (~25 min, 2 cores)
    python benchmarks/calibrate_workers.py fit cal.json                           # the model's error table

``fit`` needs no new runs: it predicts each candidate from the diagnosis run's evidence
(``stepscope.diagnosis.rules.input_pipeline.predict_step``) and prints the error table of
BENCHMARKS.md (median and 90th percentile of |predicted − measured| gain).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "calibration" / "workload.py"
LOADS = (20_000, 200_000)  # iterations per batch: ~1.5 and ~13 ms of one core
HIDDEN = (256, 2048)  # ~1 and ~9 ms per step on 2 threads
THREADS = (1, 2)
CORES = (1, 2)
STEPS = 60


def stepscope(run_dir: Path, cores: int, args: list[str], settings: dict[str, int], trial: bool) -> None:
    command = ["taskset", "-c", ",".join(str(core) for core in range(cores)), sys.executable, "-m", "stepscope",
               "run", "--no-summary", "-o", str(run_dir), "--force"]
    if trial:
        command += ["--no-monitor", "--stacks-hz", "0"]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    subprocess.run([*command, str(WORKLOAD), *args], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=600)


def step_time(run_dir: Path) -> float:
    from stepscope.record.store import load_record
    from stepscope.whatif import figures

    numbers = figures(load_record(run_dir, with_samples=False))
    assert numbers is not None
    return numbers[0]


def candidates(cores: int, threads: int) -> list[dict[str, int]]:
    out = []
    for workers, main_threads in itertools.product((1, 2), sorted({threads, 1})):
        setting = {"dataloader.num_workers": workers}
        if main_threads != threads:
            setting["torch.num_threads"] = main_threads
        out.append(setting)
    return out


def measure(out: Path, repeats: int, only: int | None) -> None:
    rows = json.loads(out.read_text()) if out.exists() else []
    done = {(row["cores"], row["threads"], row["load_iters"], row["hidden"]) for row in rows}
    keep = Path(tempfile.mkdtemp(prefix="stepscope-calibration-"))
    configs = list(itertools.product(CORES, THREADS, LOADS, HIDDEN))
    for number, (cores, threads, load, hidden) in enumerate(configs):
        if (cores, threads, load, hidden) in done or (only is not None and number >= only):
            continue
        args = ["--load-iters", str(load), "--hidden", str(hidden), "--threads", str(threads), "--steps", str(STEPS)]
        name = f"c{cores}-t{threads}-l{load}-h{hidden}"
        diagnosis = keep / name / "diagnosis"
        stepscope(diagnosis, cores, args, {}, trial=False)
        trials: dict[str, list[float]] = {"baseline": []}
        options = candidates(cores, threads)
        for repeat in range(repeats):
            order = [{}] + options
            order = order[repeat % len(order):] + order[:repeat % len(order)]
            for setting in order:
                key = json.dumps(setting, sort_keys=True) if setting else "baseline"
                run_dir = keep / name / f"r{repeat}-{len(trials.get(key, []))}-{abs(hash(key)) % 10**6}"
                stepscope(run_dir, cores, args, setting, trial=True)
                trials.setdefault(key, []).append(step_time(run_dir))
        rows.append({"cores": cores, "threads": threads, "load_iters": load, "hidden": hidden,
                     "diagnosis_dir": str(diagnosis), "trials": trials})
        out.write_text(json.dumps(rows, indent=1))
        print(f"{number + 1}/{len(configs)} {name}: baseline {statistics.median(trials['baseline']) * 1e3:.1f} ms",
              file=sys.stderr, flush=True)


def fit(path: Path) -> None:
    from stepscope.analysis.bundle import build_evidence
    from stepscope.diagnosis.rules.input_pipeline import predict_step
    from stepscope.record.store import load_record

    rows = json.loads(path.read_text())
    errors, table = [], []
    for row in rows:
        evidence = build_evidence(load_record(row["diagnosis_dir"]))
        base = statistics.median(row["trials"]["baseline"])
        for key, times in row["trials"].items():
            if key == "baseline":
                continue
            setting = json.loads(key)
            workers = setting["dataloader.num_workers"]
            threads = setting.get("torch.num_threads", row["threads"])
            predicted_s = predict_step(evidence, workers, threads)
            if predicted_s is None:
                continue
            measured = 1 - statistics.median(times) / base
            predicted = 1 - predicted_s / (evidence.steady.step_time_mean_s / evidence.steady.batches_per_step)
            errors.append(abs(predicted - measured))
            table.append((row["cores"], row["threads"], row["load_iters"], row["hidden"], workers, threads,
                          base, predicted, measured))
    print("| cores | threads | load iters | hidden | → workers | → threads | baseline step | predicted gain | "
          "measured gain | error |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for cores, threads, load, hidden, workers, new_threads, base, predicted, measured in table:
        print(f"| {cores} | {threads} | {load:,} | {hidden} | {workers} | {new_threads} | {base * 1e3:.1f} ms | "
              f"{predicted:+.0%} | {measured:+.0%} | {abs(predicted - measured) * 100:.0f} |")
    errors.sort()
    p90 = errors[min(len(errors) - 1, int(0.9 * len(errors)))]
    print(f"\n{len(errors)} predictions: median |error| {statistics.median(errors) * 100:.1f} points, "
          f"90th percentile {p90 * 100:.1f} points")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("measure")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--repeats", type=int, default=2)
    run.add_argument("--only", type=int, default=None, help="the first N configurations")
    check = sub.add_parser("fit")
    check.add_argument("path", type=Path)
    args = parser.parse_args()
    if args.command == "measure":
        measure(args.out, args.repeats, args.only)
    else:
        fit(args.path)


if __name__ == "__main__":
    main()
