"""Ground truth by ablation, and the runs it takes.

A workload runs under plain python (``launch.py python train.py``; under torchrun for two ranks) in
full and once per factor with that factor switched off (``BLIND_OFF``), same seed. Each run's step
time is the script's own: the mean wall time per step after its warm-up steps, periodic costs
(epoch boundaries, checkpoints) included, with its standard error over those steps. With
``repeats`` > 1 every configuration runs that many times, interleaved, and the run-to-run spread
enters the error.

The **gain** of a factor is the share of the full step its removal saves: 1 − T(without it) / T(full).
The **bottleneck** is the factor whose removal gains most. Two gains are **within noise** of each
other when they differ by less than twice their combined standard error (a share of the full step)
plus ``NOISE_FLOOR``, the run-to-run variation one run per configuration cannot see: then every
factor within noise of the best counts as the bottleneck. A workload none of whose factors gains
``MIN_GAIN`` has no bottleneck among them (its model is what takes the time): it is not scored.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from blind.generate import Workload

#: Run-to-run variation of one configuration's mean step on a quiet machine, as a share of the
#: step, that a single run's own standard error does not show (the ablations' noise floor).
NOISE_FLOOR = 0.03
#: A factor whose removal saves less than this share of the step is no bottleneck.
MIN_GAIN = 0.10
TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node")

#: The launchers running now (several with ``--jobs``), so that an interrupt ends them all.
_RUNNING: set[subprocess.Popen] = set()
_RUNNING_LOCK = threading.Lock()
_STOPPED = threading.Event()


class RunFailed(RuntimeError):
    """A run of a workload exited non-zero, timed out or wrote no result; the message says which
    and where its log is."""


@dataclass(frozen=True)
class Timing:
    """One configuration's steady step time: the mean over runs, its standard error, the wall time."""

    mean_s: float
    sem_s: float
    steps: int
    wall_s: float

    @classmethod
    def of_runs(cls, runs: list[dict], walls: list[float]) -> Timing:
        means = [run["mean_s"] for run in runs]
        sem = statistics.median(run["sem_s"] for run in runs)
        if len(means) > 1:
            sem = max(sem, statistics.stdev(means) / len(means) ** 0.5)
        return cls(statistics.median(means), sem, int(statistics.median(run["steps"] for run in runs)), sum(walls))

    @classmethod
    def from_dict(cls, data: dict) -> Timing:
        return cls(data["mean_ms"] / 1e3, data["sem_ms"] / 1e3, data["steps"], data["wall_s"])

    def to_dict(self) -> dict:
        return {"mean_ms": round(self.mean_s * 1e3, 3), "sem_ms": round(self.sem_s * 1e3, 3), "steps": self.steps,
                "wall_s": round(self.wall_s, 2)}


@dataclass(frozen=True)
class Truth:
    full: Timing
    without: dict[str, Timing]
    #: share of the full step each factor's removal saves
    gains: dict[str, float]
    #: the noise margin between the best factor's gain and each other factor's
    margins: dict[str, float] = field(default_factory=dict)

    @property
    def best(self) -> str | None:
        """The factor whose removal gains most, or None when none gains ``MIN_GAIN``."""
        if not self.gains:
            return None
        name = max(self.gains, key=self.gains.__getitem__)
        return name if self.gains[name] >= MIN_GAIN else None

    @property
    def tied(self) -> tuple[str, ...]:
        """The best factor and every factor whose gain is within noise of it (best first)."""
        best = self.best
        if best is None:
            return ()
        others = [name for name in sorted(self.gains, key=self.gains.__getitem__, reverse=True)
                  if name != best and self.gains[best] - self.gains[name] <= self.margins.get(name, 0.0)]
        return (best, *others)

    @classmethod
    def from_dict(cls, data: dict) -> Truth:
        """The truth as :meth:`to_dict` wrote it (an evaluation's JSON), for re-scoring."""
        return cls(Timing.from_dict(data["full"]), {name: Timing.from_dict(item) for name, item in data["without"].items()},
                   dict(data["gains"]), dict(data.get("margins") or {}))

    def to_dict(self) -> dict:
        return {"full": self.full.to_dict(), "without": {name: item.to_dict() for name, item in self.without.items()},
                "gains": {name: round(value, 4) for name, value in self.gains.items()},
                "margins": {name: round(value, 4) for name, value in self.margins.items()},
                "bottleneck": self.best, "within_noise": list(self.tied)}


def ground_truth(workload: Workload, directory: Path, repeats: int, timeout_s: float) -> Truth:
    """Runs the full workload and each ablation ``repeats`` times, interleaved; returns the truth."""
    configs: dict[str, tuple[str, ...]] = {"full": (), **{name: (name,) for name in workload.factor_names}}
    results: dict[str, list[dict]] = {key: [] for key in configs}
    walls: dict[str, list[float]] = {key: [] for key in configs}
    for round_ in range(repeats):
        for key, off in configs.items():
            label = f"plain-{key}-{round_}"
            wall, result = run_workload(workload, directory, plain_command(workload), off, label, timeout_s)
            results[key].append(result)
            walls[key].append(wall)
    full = Timing.of_runs(results["full"], walls["full"])
    without = {name: Timing.of_runs(results[name], walls[name]) for name in workload.factor_names}
    gains = {name: 1.0 - item.mean_s / full.mean_s for name, item in without.items()}
    best = max(gains, key=gains.__getitem__)
    margins = {name: 2 * (without[best].sem_s ** 2 + item.sem_s ** 2) ** 0.5 / full.mean_s + NOISE_FLOOR
               for name, item in without.items() if name != best}
    return Truth(full, without, gains, margins)


def plain_command(workload: Workload) -> list[str]:
    if workload.base.ranks > 1:
        return [sys.executable, *TORCHRUN, str(workload.base.ranks), "train.py"]
    return [sys.executable, "train.py"]


def stepscope_command(workload: Workload, out: str) -> list[str]:
    run = ["-m", "stepscope", "run", "-o", out, "train.py"]
    if workload.base.ranks > 1:
        return [sys.executable, *TORCHRUN, str(workload.base.ranks), *run]
    return [sys.executable, *run]


def run_workload(workload: Workload, directory: Path, command: list[str], off: tuple[str, ...], label: str,
                 timeout_s: float) -> tuple[float, dict]:
    """Runs ``launch.py COMMAND`` in the workload's directory with the factors ``off`` switched off;
    returns its wall time and the script's result (rank 0's, or the slowest rank's mean).

    The launcher and everything it starts (the neighbour, torchrun's ranks, DataLoader workers)
    share one process group, killed whole when the run ends, times out or is interrupted."""
    logs = directory / "logs"
    logs.mkdir(exist_ok=True)
    result_path = logs / f"{label}.json"
    for stale in logs.glob(f"{label}.json*"):
        stale.unlink()
    # stepscope's runs stay out of the user's run index unless one is named
    env = {**os.environ, "BLIND_OFF": ",".join(off), "BLIND_RESULT": str(result_path),
           "STEPSCOPE_INDEX": os.environ.get("STEPSCOPE_INDEX", "off")}
    started = time.perf_counter()
    with open(logs / f"{label}.log", "w") as log, _RUNNING_LOCK:
        if _STOPPED.is_set():
            raise RunFailed(f"{workload.name} {label}: interrupted")
        process = subprocess.Popen([sys.executable, "launch.py", *command], cwd=directory, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        _RUNNING.add(process)
    try:
        code = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        _kill_group(process)
        with _RUNNING_LOCK:
            _RUNNING.discard(process)
    wall = time.perf_counter() - started
    if code != 0:
        what = f"timed out after {timeout_s:.0f} s" if code is None else f"exited {code}"
        raise RunFailed(f"{workload.name} {label} {what}; log: {logs / (label + '.log')}")
    return wall, _read_result(result_path, workload.base.ranks, label)


def stop_all() -> None:
    """Kills every running launcher's process group and starts no more runs (an interrupt)."""
    with _RUNNING_LOCK:
        _STOPPED.set()
        running = list(_RUNNING)
    for process in running:
        _kill_group(process)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def _read_result(path: Path, ranks: int, label: str) -> dict:
    paths = [path] if ranks == 1 else [path.with_name(f"{path.name}.rank{rank}") for rank in range(ranks)]
    missing = [str(item) for item in paths if not item.exists()]
    if missing:
        raise RunFailed(f"{label}: no step times written ({', '.join(missing)})")
    results = [json.loads(item.read_text()) for item in paths]
    return max(results, key=lambda item: item["mean_s"])
