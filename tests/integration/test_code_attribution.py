"""Code attribution end to end: the zoo's planted lines are found, GC pauses are measured, and
sampling leaves the run's results bit-identical.

Each scenario runs as a user would run it (``python -m stepscope demo NAME``, in a subprocess)
and its record is read back and analyzed with the pure analysis functions. The zoo's scenarios are
the runs test_zoo.py diagnoses (the session's ``zoo_run``, taken on a quiet machine with the serial
tests): one run each serves both.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.analysis.run.code_locations import attribute_code
from stepscope.analysis.run.gc_pauses import summarize_gc_pauses
from stepscope.record.store import load_record
from support import run_cli, run_python, write_script

ZOO = Path(__file__).resolve().parents[2] / "src" / "stepscope" / "zoo"
#: GC pauses must take at least this share of the steady step time in the gc-cycles scenario.
MATERIAL_GC_SHARE = 0.05


def planted_line(module: str) -> int:
    """The line marked ``# HOT`` in a zoo module."""
    lines = (ZOO / f"{module}.py").read_text(encoding="utf-8").splitlines()
    return next(number for number, text in enumerate(lines, 1) if text.rstrip().endswith("# HOT"))


def describe(phase) -> str:
    return "; ".join(f"{item.label} {item.share_of_phase:.0%}" for item in phase.locations) if phase else "none"


#: The fewest stack samples a scenario's phase must hold for its top location to be judged.
MIN_SAMPLES = 12


@pytest.mark.slow
@pytest.mark.serial  # the zoo's own run (test_zoo.py)
def test_worker_function_is_the_top_location_in_worker_processes(zoo_run):
    record = load_record(zoo_run("worker-tokenize").dir)
    result = attribute_code(record)
    workers = result.workers
    # the count varies from run to run (19 in one full-suite run for loop-bookkeeping); what is
    # judged is that the planted location holds the majority of enough samples
    assert workers is not None and workers.samples >= MIN_SAMPLES, result.notes
    top = workers.top
    assert (Path(top.file).name, top.line, top.function) == ("worker_tokenize.py", planted_line("worker_tokenize"),
                                                            "tokenize"), describe(workers)
    # the main thread waits blocked (no CPU, so no samples of its own): the wait is in the phase times
    from stepscope.analysis.run.steady import steady_state

    assert steady_state(record).data_wait_share > 0.5


@pytest.mark.slow
@pytest.mark.serial  # the zoo's own run (test_zoo.py)
def test_loop_bookkeeping_is_the_top_location_of_other(zoo_run):
    record = load_record(zoo_run("loop-bookkeeping").dir)
    other = attribute_code(record).phase("other")
    assert other is not None and other.samples >= MIN_SAMPLES
    top = other.top
    assert (Path(top.file).name, top.line, top.function) == ("loop_bookkeeping.py", planted_line("loop_bookkeeping"),
                                                            "step_metrics"), describe(other)
    assert top.share_of_phase > 0.5 and not top.library


@pytest.mark.slow
@pytest.mark.serial  # the zoo's own run (test_zoo.py)
def test_gc_pauses_take_a_material_share(zoo_run):
    record = load_record(zoo_run("gc-cycles").dir)
    summary = summarize_gc_pauses(record)
    assert summary.measured and summary.count > 0
    assert summary.share_of_step_time >= MATERIAL_GC_SHARE, summary
    assert any(item.generation == 2 for item in summary.by_generation)
    assert summary.largest is not None and summary.largest.generation == 2
    assert summary.collected > 0


SEEDED = """
    import sys, torch
    from torch.utils.data import DataLoader, Dataset

    class Noisy(Dataset):  # worker-side randomness: seeded per worker by the DataLoader
        def __len__(self):
            return 96
        def __getitem__(self, index):
            return torch.randn(16) + index, torch.rand(1)

    def seed_numpy(worker_id):  # a user worker_init_fn, which stepscope chains
        torch.manual_seed(torch.initial_seed() % 2**31 + worker_id)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    losses = []
    junk = []
    for epoch in range(2):
        for x, y in DataLoader(Noisy(), batch_size=8, shuffle=True, num_workers=2, worker_init_fn=seed_numpy):
            model.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            with torch.no_grad():  # updated by hand: torch.optim would import the compiler (~1 s) in both runs
                for weight in model.parameters():
                    weight -= 0.05 * weight.grad
            losses.append(loss.item())
            junk.append([junk])  # cycles, so the collector runs
    print(" ".join(value.hex() for value in losses))
"""


@pytest.mark.slow
def test_seeded_losses_are_bit_identical_with_sampling_on(tmp_path):
    script = write_script(tmp_path, "seeded.py", SEEDED)
    bare = run_python([str(script)], cwd=tmp_path)
    assert bare.returncode == 0, bare.stderr
    sampled = run_cli(["run", "--stacks-hz", "500", "--no-summary", "-o", str(tmp_path / "run"), str(script)],
                      cwd=tmp_path)
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    assert sampled.stdout == bare.stdout
    record = load_record(tmp_path / "run")
    assert len(record.stack_samples) > 0 and record.gc_pauses.enabled
