"""Calibration of the DataLoader worker plan: predicted vs measured gains, with real trials.

Sweeps a generated workload (``benchmarks/calibration/workload.py``: pure-Python loading work per
batch × model size × intra-op threads) on 1 or 2 cores (``taskset``). For every configuration it
runs one diagnosis run (``stepscope run``, sampler and stack sampling on, as a user's run) and
trials of each candidate change — DataLoader workers × the main process's intra-op threads —
``--repeats`` times, interleaved with baseline trials (``stepscope run --max-steps --set … --no-monitor
--stacks-hz 0``, the trials of ``run --verify``). The measured gain of a candidate is
1 − (its median steady step time / the baseline trials' median).

    python benchmarks/calibrate_workers.py measure --out cal.json [--repeats 2]   # the trials (~25 min, 2 cores)
    python benchmarks/calibrate_workers.py search cal.json                        # fit the model's constants
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
    for attempt in range(2):  # a run that fails once (the machine is shared) is run again
        result = subprocess.run([*command, *([] if args[:1] == ["-m"] else [str(WORKLOAD)]), *args],
                                stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, timeout=600)
        if result.returncode == 0:
            return
    raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.decode(errors='replace')[-500:]}")


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


#: Zoo scenarios with an input-bound planted family, on 2 cores with torch's default threads (2).
ZOO = ("stepscope.zoo.input_cpu", "stepscope.zoo.tokenize_main")


def measure(out: Path, repeats: int, only: int | None) -> None:
    rows = json.loads(out.read_text()) if out.exists() else []
    done = {(row["cores"], row["threads"], row["load_iters"], row["hidden"]) for row in rows}
    keep = Path(tempfile.mkdtemp(prefix="stepscope-calibration-"))
    configs: list[tuple] = list(itertools.product(CORES, THREADS, LOADS, HIDDEN))
    configs += [(2, 2, module, 0) for module in ZOO]
    for number, (cores, threads, load, hidden) in enumerate(configs):
        if (cores, threads, load, hidden) in done or (only is not None and number >= only):
            continue
        if isinstance(load, str):  # a zoo scenario, as `stepscope demo` runs it
            args, name = ["-m", load, "--steps", str(STEPS)], load.rsplit(".", 1)[1]
        else:
            args = ["--load-iters", str(load), "--hidden", str(hidden), "--threads", str(threads),
                    "--steps", str(STEPS)]
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


def cases(path: Path) -> list[tuple]:
    """(row, loading model, workers, threads, baseline step, measured gain) per candidate trial."""
    from stepscope.analysis.bundle import build_evidence
    from stepscope.diagnosis.rules import _common as common
    from stepscope.diagnosis.rules.input_pipeline import loading_model
    from stepscope.record.store import load_record

    out = []
    for row in json.loads(path.read_text()):
        evidence = build_evidence(load_record(row["diagnosis_dir"]))
        model = loading_model(evidence, common.loader_cpu_util(evidence)[0])
        if model is None:
            continue
        base = statistics.median(row["trials"]["baseline"])
        for key, times in row["trials"].items():
            if key == "baseline":
                continue
            setting = json.loads(key)
            workers = setting["dataloader.num_workers"]
            threads = setting.get("torch.num_threads", row["threads"])
            out.append((row, model, workers, threads, base, 1 - statistics.median(times) / base))
    return out


def errors_of(found: list[tuple], constants) -> list[float]:
    from stepscope.diagnosis.rules.input_pipeline import predict

    return sorted(abs(1 - predict(model, workers, threads, constants) / model.per_batch_s - measured)
                  for _row, model, workers, threads, _base, measured in found)


def percentile(values: list[float], share: float) -> float:
    return values[min(len(values) - 1, int(share * len(values)))]


def search(path: Path) -> None:
    """The constants that minimise the 90th-percentile error (a grid; prints the best five)."""
    from stepscope.diagnosis.rules.input_pipeline import ModelConstants

    found = cases(path)
    grid = itertools.product((0.0, 0.0005, 0.001, 0.002, 0.004), (0.0, 0.0005, 0.001, 0.002, 0.003),
                             (0.0, 0.5, 1.0, 2.0, 3.0), (0.5, 0.8, 1.0), (0.0, 0.25, 0.5, 1.0), (1.0, 1.2, 1.4))
    scored = []
    for worker_s, receive_s, barrier, scaling, crowding, slowdown in grid:
        constants = ModelConstants(worker_s, receive_s, barrier, scaling, crowding, slowdown)
        errors = errors_of(found, constants)
        scored.append((percentile(errors, 0.9), statistics.median(errors), constants))
    scored.sort(key=lambda item: (item[0], item[1]))
    for p90, median, constants in scored[:5]:
        print(f"p90 {p90 * 100:.1f} median {median * 100:.1f}: {constants}")


def fit(path: Path) -> None:
    from stepscope.diagnosis.rules.input_pipeline import predict

    errors, table = [], []
    for row, model, workers, threads, base, measured in cases(path):
        predicted = 1 - predict(model, workers, threads) / model.per_batch_s
        errors.append(abs(predicted - measured))
        table.append((row["cores"], row["threads"], row["load_iters"], row["hidden"], workers, threads,
                      base, predicted, measured))
    print("| cores | threads | load iters | hidden | → workers | → threads | baseline step | predicted gain | "
          "measured gain | error |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for cores, threads, load, hidden, workers, new_threads, base, predicted, measured in table:
        what = f"{load:,}" if isinstance(load, int) else f"zoo {load.rsplit('.', 1)[1]}"
        print(f"| {cores} | {threads} | {what} | {hidden or '-'} | {workers} | {new_threads} | {base * 1e3:.1f} ms | "
              f"{predicted:+.0%} | {measured:+.0%} | {abs(predicted - measured) * 100:.0f} |")
    errors.sort()
    p90 = errors[min(len(errors) - 1, int(0.9 * len(errors)))]
    print(f"\n{len(errors)} predictions: median |error| {statistics.median(errors) * 100:.1f} points, "
          f"90th percentile {p90 * 100:.1f} points")
    # what a prescription rests on: the predictions of a gain, and how far they over- or under-shot
    gains = [(predicted, measured) for *_rest, predicted, measured in table if predicted > 0]
    if gains:
        over = sorted(predicted - measured for predicted, measured in gains)
        print(f"{len(gains)} predictions of a gain: median |error| "
              f"{statistics.median(abs(value) for value in over) * 100:.1f} points; predicted − measured: "
              f"90th percentile {percentile(over, 0.9) * 100:+.1f} points (overestimate), "
              f"10th percentile {percentile(over, 0.1) * 100:+.1f} points (underestimate); "
              f"{sum(1 for predicted, measured in gains if measured <= 0)} of them measured no gain")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("measure")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--repeats", type=int, default=2)
    run.add_argument("--only", type=int, default=None, help="the first N configurations")
    check = sub.add_parser("fit")
    check.add_argument("path", type=Path)
    grid = sub.add_parser("search")
    grid.add_argument("path", type=Path)
    args = parser.parse_args()
    if args.command == "measure":
        measure(args.out, args.repeats, args.only)
    elif args.command == "search":
        search(args.path)
    else:
        fit(args.path)


if __name__ == "__main__":
    main()
