"""What one tiny eager operator costs on this machine: measured once, cached beside the CPU peak.

The launch-overhead rule prices a step's operators at a per-operator host cost (Python, module
calls, dispatch, autograd bookkeeping). That cost is the machine's and the torch build's: 3 µs on
the machine the rules were written on, 11.5 µs and more on a slower VM. So it is measured, the way
the CPU peak is (:mod:`stepscope.capture.cpu_peak`): the first run on a machine trains a model of
:data:`LAYERS` ``Linear(16, 16)`` + ``Tanh`` layers on a batch of :data:`BATCH` for a few steps
(forward, backward, a plain SGD update: work whose math is negligible), counts the step's aten
operators with the same counter as the FLOP-counted step (:class:`~stepscope.capture.flops.OpCounter`)
and divides: step time / operators. The fastest step is the cost (the least disturbed); the median
shows the spread. The result is kept per machine (CPU model, cores, torch version) in
``$XDG_CACHE_HOME/stepscope/op_cost.json``; a cached entry costs a file read.

The model is built without touching torch's global random generator (its parameters are a
deterministic fill), so a seeded script stays bit-identical. Failures cost only the measured price
(the rule falls back to 3 µs and says so).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from stepscope.record.run import OpCost

#: Layers of the calibration model (each a Linear and a Tanh: ~10 aten operators per layer a step).
LAYERS = 24
#: Width and batch: small enough that the math is nothing next to the operators' fixed cost.
WIDTH = 16
BATCH = 4
#: Timed steps after the warm-up (the fastest is the cost); stop early after :data:`MAX_MEASURE_S`.
REPETITIONS = 15
WARMUP = 3
MAX_MEASURE_S = 0.3
CACHE_FILE = "op_cost.json"


def cache_path() -> Path:
    """``$XDG_CACHE_HOME/stepscope/op_cost.json`` (``~/.cache/stepscope/`` by default)."""
    from stepscope.capture.cpu_peak import cache_path as peak_path

    return peak_path().with_name(CACHE_FILE)


#: The calibration model, in the cache key: a measurement of another model is not this one's.
MODEL = f"sgd-by-hand:{LAYERS}x{WIDTH}x{BATCH}"


def machine_key() -> str:
    """What the cost depends on: the CPU, its cores, the torch build (and the calibration model)."""
    from stepscope.capture.cpu_peak import machine_parts

    return "|".join([*machine_parts(), f"model={MODEL}"])


def measure_op_cost(repetitions: int = REPETITIONS, max_s: float = MAX_MEASURE_S) -> OpCost:
    """Time the calibration model's training steps (see the module docstring)."""
    import torch
    from torch import nn

    from stepscope.capture.flops import OpCounter

    class Linear(nn.Module):
        """``nn.Linear``'s forward with parameters filled deterministically: ``nn.Linear`` draws its
        initial weights from the global generator, and ``skip_init`` builds on the meta device,
        whose first use imports sympy (0.46 s)."""

        def __init__(self, index: int) -> None:
            super().__init__()
            values = torch.arange(WIDTH * WIDTH + WIDTH, dtype=torch.float32) + index
            self.weight = nn.Parameter(torch.sin(values[: WIDTH * WIDTH]).reshape(WIDTH, WIDTH) / WIDTH)
            self.bias = nn.Parameter(torch.cos(values[WIDTH * WIDTH:]) / WIDTH)

        def forward(self, inputs: Any) -> Any:
            return nn.functional.linear(inputs, self.weight, self.bias)

    layers: list[nn.Module] = []
    for index in range(LAYERS):
        layers += [Linear(index), nn.Tanh()]
    inputs = torch.cos(torch.arange(BATCH * WIDTH, dtype=torch.float32)).reshape(BATCH, WIDTH)
    model = nn.Sequential(*layers)
    params = list(model.parameters())

    def step() -> None:  # SGD by hand: creating a torch.optim optimizer imports torch._dynamo (1.3 s)
        for param in params:
            param.grad = None
        model(inputs).sum().backward()
        with torch.no_grad():
            for param in params:
                param.add_(param.grad, alpha=-1e-3)

    with torch.enable_grad():
        for _ in range(WARMUP):
            step()
        with OpCounter(function_mode=False) as counter:
            step()
        ops = max(counter.count, 1)
        timings: list[float] = []
        deadline = time.perf_counter() + max_s
        while len(timings) < max(repetitions, 1):
            begin = time.perf_counter_ns()
            step()
            timings.append((time.perf_counter_ns() - begin) / 1e9 / ops)
            if len(timings) >= 3 and time.perf_counter() > deadline:
                break
    return OpCost(seconds_best=min(timings), seconds_median=float(statistics.median(timings)), ops=ops,
                  repetitions=len(timings), source="measured", measured_wall_ns=time.time_ns())


def cached_op_cost(path: Path | None = None) -> OpCost | None:
    """This machine's cached cost, or None."""
    from stepscope.capture.cpu_peak import read_cache

    entry = read_cache(path or cache_path()).get(machine_key())
    if not isinstance(entry, dict):
        return None
    try:
        return OpCost(seconds_best=float(entry["seconds_best"]), seconds_median=float(entry["seconds_median"]),
                      ops=int(entry.get("ops", 0)), repetitions=int(entry.get("repetitions", 0)), source="cache",
                      measured_wall_ns=int(entry.get("measured_wall_ns", 0)))
    except (TypeError, KeyError, ValueError):
        return None


def store_op_cost(cost: OpCost, path: Path | None = None) -> None:
    """Merge ``cost`` into the cache (the steadier measurement wins: see :func:`op_cost_at_torch_import`).

    Raises:
        OSError: the cache could not be written.
    """
    from stepscope.capture.cpu_peak import read_cache, write_cache

    path = path or cache_path()
    entries = read_cache(path)
    entries[machine_key()] = {"seconds_best": cost.seconds_best, "seconds_median": cost.seconds_median,
                              "ops": cost.ops, "repetitions": cost.repetitions,
                              "measured_wall_ns": cost.measured_wall_ns}
    write_cache(path, "stepscope.op_cost_cache", entries)


#: A measurement whose median step took more than this multiple of its fastest was disturbed
#: (other work took the cores between steps): it is measured again at the next run and the lower
#: of both kept, until a steady measurement settles it.
STEADY_MEDIAN_RATIO = 1.5


def op_cost_at_torch_import(warn: Any) -> OpCost | None:
    """The cached cost, else a measurement (stored in the cache). ``warn(cause, text)`` on trouble."""
    cached = cached_op_cost()
    if cached is not None and cached.seconds_median <= STEADY_MEDIAN_RATIO * cached.seconds_best:
        return cached
    try:
        cost = measure_op_cost()
    except Exception as exc:  # noqa: BLE001 - a missing cost only costs the launch-overhead estimate's basis
        warn("op-cost", f"per-operator cost not measured ({type(exc).__name__}: {exc}); 3 µs is assumed")
        return cached
    if cached is not None:
        cost = OpCost(seconds_best=min(cost.seconds_best, cached.seconds_best),
                      seconds_median=min(cost.seconds_median, cached.seconds_median), ops=cost.ops,
                      repetitions=cost.repetitions, source="measured", measured_wall_ns=cost.measured_wall_ns)
    try:
        store_op_cost(cost)
    except OSError as exc:
        warn("op-cost-cache", f"per-operator cost cache {cache_path()} not written ({exc.strerror or exc}); "
                              "it will be measured again next run")
    return cost


__all__ = ["cache_path", "cached_op_cost", "machine_key", "measure_op_cost", "op_cost_at_torch_import",
           "store_op_cost"]
