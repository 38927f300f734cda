"""Seed → workloads → standalone scripts.

A workload is a plain training loop (``Base``: an MLP of random size, a DataLoader over in-memory
samples, its batch, workers and epochs) with 1-3 factors of random size planted into it. The same
seed and index give the same workload, byte for byte; ``Workload.without(name)`` is the same
workload less one factor, whose script is what ``train.py`` runs as with that factor's switch off
(tests/unit/test_blind_eval.py checks this by folding the switches).

``write`` puts two files into the workload's directory:

- ``train.py``: the script (real torch, a real DataLoader, CPU only). ``BLIND_OFF=a,b`` switches
  factors off; ``BLIND_RESULT=PATH`` makes it write its step times there as JSON (``PATH.rankN``
  per rank of a two-rank job). It prints its mean steady step time.
- ``launch.py``: ``python launch.py COMMAND...`` runs COMMAND (``python train.py``, ``stepscope
  run train.py``, torchrun…) with, while the ``neighbour`` factor is on, a busy process beside it,
  killed when the command ends (the neighbour also leaves by itself when its launcher is gone).
"""

from __future__ import annotations

import json
import random
import string
import textwrap
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from blind.factors import FACTORS, HOOKS, Base, Factor, log_uniform

#: Training time a run aims at, beyond python's and torch's start-up (~2 s): a whole run takes
#: ~3-8 s on the 2-core development machine.
TARGET_TRAIN_S = 3.0
MIN_STEPS, MAX_STEPS = 24, 150
#: The script's own time budget: it starts no new epoch after this many seconds of training (a
#: workload whose factors interact worse than their nominal sizes still ends in seconds).
MAX_TRAIN_S = 6.0
WARMUP_STEPS = 3
#: The largest model's nominal step (forward, backward, SGD): ~24 of them train for ~3 s.
MAX_COMPUTE_MS = 120.0
#: The smallest: a plain loop's own loading (per-sample indexing and collating, ~1 ms a batch of
#: 64 on the development machine) stays a small part of its step, so the planted factors are
#: what the plain loop lacks.
MIN_COMPUTE_MS = 8.0


@dataclass(frozen=True)
class Planted:
    """One factor of a workload with its drawn size."""

    name: str
    params: dict[str, float | int | str]

    @property
    def factor(self) -> Factor:
        return FACTORS[self.name]

    def describe(self) -> str:
        sizes = ", ".join(f"{key}={value}" for key, value in self.params.items())
        return f"{self.name}({sizes})" if sizes else self.name


@dataclass(frozen=True)
class Workload:
    seed: int
    index: int
    base: Base
    planted: tuple[Planted, ...]

    @property
    def name(self) -> str:
        return f"w{self.index:03d}"

    @property
    def factor_names(self) -> tuple[str, ...]:
        return tuple(item.name for item in self.planted)

    def without(self, name: str) -> Workload:
        return replace(self, planted=tuple(item for item in self.planted if item.name != name))

    def to_dict(self) -> dict:
        return {"seed": self.seed, "index": self.index, "name": self.name, "base": asdict(self.base),
                "factors": [{"name": item.name, "params": item.params,
                             "nominal_ms": round(item.factor.nominal_ms(item.params, self.base), 2)}
                            for item in self.planted],
                "compute_nominal_ms": round(self.base.compute_ms(), 2)}


def draw_workload(seed: int, index: int, allowed: tuple[str, ...]) -> Workload:
    """The ``index``-th workload of ``seed``: 1-3 distinct factors among ``allowed``, their sizes, and
    a base loop shaped for them (workers and short epochs for worker restarts, two ranks for a slow
    rank), its number of steps chosen so the run trains for ~``TARGET_TRAIN_S`` seconds."""
    rng = random.Random(seed * 1_000_003 + index)
    names = _draw_names(rng, allowed)
    hidden = round(log_uniform(rng, 32, 1536))
    workers = 0 if rng.random() < 0.5 else rng.choice((1, 2))
    if "worker_restarts" in names:
        workers = max(workers, 1)
    steps_per_epoch = rng.randint(2, 6) if "worker_restarts" in names else rng.randint(8, 40)
    base = Base(batch=rng.choice((16, 32, 64)), features=rng.choice((32, 64, 128)), hidden=hidden,
                depth=rng.randint(1, 3), num_workers=workers, steps_per_epoch=steps_per_epoch, epochs=1,
                ranks=2 if "slow_rank" in names else 1, data_seed=rng.randrange(1 << 30))
    while base.compute_ms() > MAX_COMPUTE_MS:  # a big model, but a run of seconds
        base = replace(base, hidden=int(base.hidden * 0.8))
    while base.compute_ms() < MIN_COMPUTE_MS:  # a tiny model, but not one its own loading outweighs
        base = replace(base, hidden=int(base.hidden * 1.25) + 1)
    planted = tuple(Planted(name, FACTORS[name].draw(rng, base)) for name in names)
    step_ms = base.compute_ms() + sum(item.factor.nominal_ms(item.params, base) for item in planted)
    steps = min(MAX_STEPS, max(MIN_STEPS, round(TARGET_TRAIN_S * 1e3 / step_ms)))
    base = replace(base, epochs=max(2, -(-steps // base.steps_per_epoch)))
    return Workload(seed, index, base, planted)


def _draw_names(rng: random.Random, allowed: tuple[str, ...]) -> tuple[str, ...]:
    count = min(len(allowed), rng.randint(1, 3))
    pool = list(allowed)
    names: list[str] = []
    for _ in range(count):
        choice = rng.choices(pool, weights=[FACTORS[name].weight for name in pool])[0]
        pool.remove(choice)
        names.append(choice)
    return tuple(sorted(names, key=list(FACTORS).index))


def write(workload: Workload, directory: Path) -> Path:
    """Writes ``train.py``, ``launch.py`` and ``workload.json`` into ``directory``; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.py").write_text(render_script(workload))
    (directory / "launch.py").write_text(render_launcher(workload))
    (directory / "workload.json").write_text(json.dumps(workload.to_dict(), indent=1) + "\n")
    return directory


def render_script(workload: Workload) -> str:
    base = workload.base
    hooks = {hook: _hook_code(workload, hook, indent) for hook, indent in SCRIPT_HOOK_INDENT.items()}
    defs = "\n".join(_substitute(item.factor.defs, item.params) for item in workload.planted if item.factor.defs)
    listed = "; ".join(item.describe() for item in workload.planted)
    values = {"title": f"Blind-evaluation workload {workload.name} of seed {workload.seed}",
              "factors": listed or "none (the plain loop)", "defs": defs.strip("\n"),
              **{key.upper(): str(value) for key, value in asdict(base).items()},
              "WARMUP": str(WARMUP_STEPS), "MAX_TRAIN_S": repr(MAX_TRAIN_S), **hooks}
    source = string.Template(DISTRIBUTED_SCRIPT if base.ranks > 1 else SCRIPT).substitute(values)
    return _tidy(source)


def render_launcher(workload: Workload) -> str:
    defs = "\n".join(_substitute(item.factor.launcher_defs, item.params)
                     for item in workload.planted if item.factor.launcher_defs)
    values = {"defs": defs.strip("\n"), "launcher": _hook_code(workload, "launcher", 8)}
    return _tidy(string.Template(LAUNCHER).substitute(values))


def _hook_code(workload: Workload, hook: str, indent: int) -> str:
    """Every factor's code at ``hook``, each under its own switch: ``if on("name"):``."""
    assert hook in HOOKS, hook
    blocks = []
    for item in workload.planted:
        code = item.factor.hooks.get(hook)
        if code:
            blocks.append(f'if on("{item.name}"):\n' + textwrap.indent(_substitute(code, item.params), "    "))
    return textwrap.indent("\n".join(blocks), " " * indent).lstrip(" ") if blocks else EMPTY_HOOK


def _substitute(template: str, params: dict[str, float | int | str]) -> str:
    return string.Template(template).substitute({key: repr(value) for key, value in params.items()})


def _tidy(source: str) -> str:
    """Drops the hooks where no factor has code, and runs of blank lines."""
    lines = [line for line in source.splitlines() if line.strip() != EMPTY_HOOK]
    out: list[str] = []
    for line in lines:
        if line.strip() == "" and len(out) >= 2 and out[-1].strip() == "" and out[-2].strip() == "":
            continue
        out.append(line.rstrip())
    return "\n".join(out).strip("\n") + "\n"


#: The line a hook without code leaves, dropped from the file.
EMPTY_HOOK = "# (no factor here)"
SCRIPT_HOOK_INDENT = {"getitem": 8, "model_init": 8, "model_forward": 8, "loader": 4, "setup": 4,
                      "after_step": 12, "teardown": 4}

_HEADER = '''"""$title

Factors: $factors.
Generated by benchmarks/blind_eval.py. Each factor's code runs only while its switch is on:
BLIND_OFF=name[,name...] turns factors off; BLIND_RESULT=PATH writes the step times there (JSON).
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
'''

_BODY = '''
OFF = frozenset(filter(None, os.environ.get("BLIND_OFF", "").split(",")))


def on(factor):
    return factor not in OFF


BATCH = $BATCH
FEATURES = $FEATURES
HIDDEN = $HIDDEN
DEPTH = $DEPTH
NUM_WORKERS = $NUM_WORKERS
STEPS_PER_EPOCH = $STEPS_PER_EPOCH
EPOCHS = $EPOCHS
WARMUP = $WARMUP
MAX_TRAIN_S = $MAX_TRAIN_S
SEED = $DATA_SEED

$defs


class Samples(Dataset):
    def __init__(self):
        generator = torch.Generator().manual_seed(SEED)
        self.inputs = torch.randn(BATCH * STEPS_PER_EPOCH, FEATURES, generator=generator)
        self.targets = torch.randn(BATCH * STEPS_PER_EPOCH, 1, generator=generator)

    def __len__(self):
        return len(self.inputs)

    def __getitem__(self, index):
        sample = self.inputs[index]
        $getitem
        return sample, self.targets[index]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        layers = [torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU()]
        for _ in range(DEPTH - 1):
            layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
        self.body = torch.nn.Sequential(*layers, torch.nn.Linear(HIDDEN, 1))
        $model_init

    def forward(self, inputs):
        out = self.body(inputs)
        $model_forward
        return out


def report(times, rank):
    steady = times[WARMUP:]
    mean = statistics.fmean(steady)
    sem = statistics.stdev(steady) / len(steady) ** 0.5 if len(steady) > 1 else 0.0
    result = {"rank": rank, "steps": len(times), "warmup": WARMUP, "mean_s": mean, "sem_s": sem,
              "median_s": statistics.median(steady), "step_s": times}
    path = os.environ.get("BLIND_RESULT")
    if path:
        with open(f"{path}.rank{rank}" if RANKS > 1 else path, "w") as handle:
            json.dump(result, handle)
    print(f"rank {rank}: steady step {mean * 1e3:.2f} ms mean (+- {sem * 1e3:.2f}), "
          f"{statistics.median(steady) * 1e3:.2f} ms median, {len(steady)} steps after {WARMUP} of warm-up")


def main():
$start
    torch.manual_seed(SEED)
    persistent = NUM_WORKERS > 0
    worker_init = None
    $loader
    loader = DataLoader(Samples(), batch_size=BATCH, shuffle=True, drop_last=True, num_workers=NUM_WORKERS,
                        persistent_workers=persistent, worker_init_fn=worker_init)
$model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    $setup
    times = []
    step = 0
    started = last = time.perf_counter()
    for epoch in range(EPOCHS):
        if last - started > MAX_TRAIN_S:  # a time budget: the run stops after the epoch that crossed it
            break
        for inputs, targets in loader:
            if last - started > 1.5 * MAX_TRAIN_S and step > 2 * WARMUP:
                break
            optimizer.zero_grad(set_to_none=True)
            loss = F.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            $after_step
            now = time.perf_counter()
            times.append(now - last)
            last = now
            step += 1
    $teardown
    report(times, rank)
$end

if __name__ == "__main__":
    main()
'''

SCRIPT = _HEADER + "\nRANKS = 1\n" + string.Template(_BODY).safe_substitute(
    start="    rank = 0", model="    model = Net()", end="")

DISTRIBUTED_SCRIPT = _HEADER.replace(
    "from torch.utils.data import DataLoader, Dataset",
    "import torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel\n"
    "from torch.utils.data import DataLoader, Dataset") + "\nRANKS = $RANKS\n" + string.Template(_BODY).safe_substitute(
    start='    dist.init_process_group("gloo")\n    rank = dist.get_rank()',
    model="    model = DistributedDataParallel(Net())",
    end="    dist.barrier()  # both ranks done before the group goes (gloo aborts a rank that leaves early)\n"
        "    dist.destroy_process_group()\n")

LAUNCHER = '''"""Runs COMMAND (python launch.py COMMAND...) with, while the factor "neighbour" is on, a busy
process beside it: another tenant of the machine, outside the run's process tree. The neighbour is
killed when the command ends, and leaves by itself if this launcher is killed. BLIND_OFF as in train.py.
Generated by benchmarks/blind_eval.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

OFF = frozenset(filter(None, os.environ.get("BLIND_OFF", "").split(",")))


def on(factor):
    return factor not in OFF


$defs


def main():
    neighbours = []
    try:
        $launcher
        return subprocess.call(sys.argv[1:])
    finally:
        for process in neighbours:
            process.kill()
            process.wait()


if __name__ == "__main__":
    sys.exit(main())
'''
