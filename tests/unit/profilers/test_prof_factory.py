"""create_profiler, and each profiler driven the way ``stepscope run`` drives it on a real loop."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from stepscope.errors import UsageError
from stepscope.profilers import (
    PROFILER_NAMES,
    AdvancedProfiler,
    PassThroughProfiler,
    SimpleProfiler,
    create_profiler,
)
from stepscope.profilers.pytorch import PyTorchProfiler

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PHASES = ("data_wait", "forward", "backward", "optimizer")


@pytest.mark.parametrize(
    ("name", "cls"),
    [("passthrough", PassThroughProfiler), ("simple", SimpleProfiler), ("Simple", SimpleProfiler),
     ("advanced", AdvancedProfiler), ("PYTORCH", PyTorchProfiler)],
)  # fmt: skip
def test_create_profiler_by_name(name, cls, tmp_path):
    profiler = create_profiler(name, dirpath=tmp_path, filename="prof")
    assert type(profiler) is cls
    assert (profiler.dirpath, profiler.filename) == (tmp_path, "prof")


def test_unknown_name_lists_the_allowed_ones():
    with pytest.raises(UsageError, match="Unknown profiler 'fast': use one of 'passthrough', 'simple', 'advanced', 'pytorch', 'xla'"):
        create_profiler("fast")
    assert PROFILER_NAMES == ("passthrough", "simple", "advanced", "pytorch", "xla")


def test_xla_by_name_without_torch_xla_says_what_to_install():
    with pytest.raises(UsageError, match="XLAProfiler needs torch_xla"):
        create_profiler("xla")


def _captured_run(profiler, run_dir, rank: int = 0, steps: int = 7) -> None:
    """What ``stepscope run`` does around an unmodified script's training loop."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(steps * 4, 8), torch.randn(steps * 4, 1)), batch_size=4)
    profiler.setup(stage="run", local_rank=rank, log_dir=str(run_dir))
    batches = iter(loader)
    while True:
        profiler.start("step")
        profiler.start("data_wait")
        try:
            inputs, targets = next(batches)
        except StopIteration:
            profiler.stop("data_wait")
            profiler.stop("step")
            break
        profiler.stop("data_wait")
        profiler.start("forward")
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        profiler.stop("forward")
        profiler.start("backward")
        loss.backward()
        profiler.stop("backward")
        profiler.start("optimizer")
        optimizer.step()
        optimizer.zero_grad()
        profiler.stop("optimizer")
        profiler.stop("step")
    profiler.describe()
    profiler.teardown("run")


def test_passthrough_in_a_captured_run_writes_nothing(tmp_path, console):
    _captured_run(create_profiler("passthrough", dirpath=tmp_path, filename="profiler"), tmp_path)
    assert list(tmp_path.iterdir()) == [] and console.getvalue() == ""


def _warm_torch() -> None:
    """Build and step an optimizer once: torch's first one imports its compiler (seconds)."""
    layer = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    layer(torch.ones(1, 2)).sum().backward()
    optimizer.step()


def test_simple_in_a_captured_run(tmp_path, console):
    # The note on nesting needs the steps to fill over half of Total (the profiler's life): a cold
    # torch (its compiler imported by the first optimizer) or a slow setup must not decide it.
    _warm_torch()
    profiler = create_profiler("simple", dirpath=tmp_path, filename="profiler")
    _captured_run(profiler, tmp_path, steps=60)
    text = (tmp_path / "run-profiler-0.txt").read_text()
    assert text.startswith("RUN Profiler Report")
    for action in ("step", *PHASES):
        assert f"|  {action}" in text
    assert {action: len(values) for action, values in profiler.recorded_durations.items()} == {
        "step": 61, "data_wait": 61, "forward": 60, "backward": 60, "optimizer": 60,
    }  # fmt: skip
    assert "because actions nest" in text  # the phases nest inside "step"
    assert console.getvalue() == f"run profiler report written to {tmp_path / 'run-profiler-0.txt'}\n"


def test_simple_in_a_captured_run_prints_without_filename(tmp_path, console):
    _captured_run(create_profiler("simple", dirpath=tmp_path), tmp_path)
    assert console.getvalue().startswith("RUN Profiler Report")
    assert list(tmp_path.iterdir()) == []


def test_advanced_in_a_captured_run(tmp_path, console):
    _captured_run(create_profiler("advanced", dirpath=tmp_path, filename="profiler"), tmp_path, rank=2)
    text = (tmp_path / "run-profiler-2.txt").read_text()
    for action in ("step", *PHASES):
        assert f"Profile stats for: {action} rank: 2" in text
    assert "Nested actions" in text
    assert console.getvalue() == ""  # rank 2: nothing on the console


def test_pytorch_in_a_captured_run_advances_its_schedule_on_each_step(tmp_path, console):
    profiler = create_profiler("pytorch", dirpath=tmp_path, filename="profiler")
    steps_seen = []
    original = profiler._step

    def spy(action):
        steps_seen.append(action)
        original(action)

    profiler._step = spy
    _captured_run(profiler, tmp_path, steps=7)
    assert steps_seen == ["step"] * 8  # one schedule step per stop("step"), phases do not count
    traces = sorted(tmp_path.glob("*.pt.trace.json"))
    assert len(traces) == 1 and traces[0].name.startswith("run-profiler-0-step.")
    text = (tmp_path / "run-profiler-0.txt").read_text()
    assert text.splitlines()[1] == "Profile stats for: records rank: 0"
    assert "[pl][profile]step" in text and "aten::" in text
    recorded = {event.name for event in profiler.function_events}
    assert {f"[pl][profile]{action}" for action in ("step", *PHASES)} <= recorded


@pytest.mark.parametrize("name", ["simple", "advanced", "pytorch"])
def test_report_after_a_crash_in_the_middle_of_a_step(name, tmp_path, console):
    """The script raised inside a step: actions are left open, describe() still reports."""
    profiler = create_profiler(name, dirpath=tmp_path, filename="profiler")
    profiler.setup(stage="run", local_rank=0, log_dir=str(tmp_path))
    for _ in range(6):
        with profiler.profile("step"), profiler.profile("forward"):
            torch.ones(3) + 1
    profiler.start("step")
    profiler.start("forward")
    profiler.describe()
    profiler.teardown("run")
    text = (tmp_path / "run-profiler-0.txt").read_text()
    assert text.startswith("RUN Profiler Report") and "forward" in text
