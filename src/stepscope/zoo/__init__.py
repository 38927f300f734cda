"""The zoo: training workloads with planted bottlenecks.

Each scenario is an ordinary, unmodified training script inside the package
(``python -m stepscope.zoo.<module>`` runs it bare; ``stepscope demo NAME`` runs it under capture)
and states the bottleneck planted in it. The diagnosis tests run every scenario and require its
planted family to be the top finding.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepscope.errors import UsageError


@dataclass(frozen=True)
class Scenario:
    """A zoo workload.

    Args:
        name: the name ``stepscope demo NAME`` takes.
        module: the module run as ``__main__``.
        planted_family: the diagnosis family the scenario is built to trigger.
        title: one line for ``stepscope demo --list``.
        mechanism: how the bottleneck is planted (what the script does).
        args: extra command-line arguments passed to the script by ``stepscope demo``.
    """

    name: str
    module: str
    planted_family: str
    title: str
    mechanism: str
    args: tuple[str, ...] = ()


SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        Scenario(
            name="input-cpu",
            module="stepscope.zoo.input_cpu",
            planted_family="input_pipeline",
            title="CPU-heavy __getitem__ with num_workers=0",
            mechanism="each sample runs a NumPy augmentation of a few ms in the main process, "
            "so the model waits for every batch",
        ),
        Scenario(
            name="healthy",
            module="stepscope.zoo.healthy",
            planted_family="healthy",
            title="compute-bound MLP on in-memory tensors",
            mechanism="batches come from a TensorDataset (no per-sample work); large matmuls "
            "dominate the step",
        ),
    )
}

#: What ``stepscope demo`` runs without arguments.
DEFAULT_SCENARIO = "input-cpu"


def get_scenario(name: str) -> Scenario:
    """Look a scenario up by name.

    Raises:
        UsageError: unknown name (the message lists the known ones).
    """
    try:
        return SCENARIOS[name]
    except KeyError:
        known = ", ".join(sorted(SCENARIOS))
        raise UsageError(f"unknown demo scenario {name!r}; choose one of: {known} "
                         "(see 'stepscope demo --list')") from None
