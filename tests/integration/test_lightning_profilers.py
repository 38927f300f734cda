"""stepscope profilers and DeviceStatsMonitor inside a real Lightning Trainer with a tiny model."""

from __future__ import annotations

import csv
import io
import warnings

import pytest

from stepscope.profilers import AdvancedProfiler, Profiler, SimpleProfiler
from stepscope.profilers.pytorch import PyTorchProfiler

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
]


def test_profilers_are_lightning_profilers(lit):
    from lightning.pytorch.profilers import Profiler as LightningProfiler

    for profiler in (SimpleProfiler(), AdvancedProfiler(), PyTorchProfiler()):
        assert isinstance(profiler, LightningProfiler)
    assert issubclass(Profiler, LightningProfiler)


def test_errors_are_lightning_exceptions_when_lightning_is_loaded(lit):
    # here, not beside the PyTorchProfiler's other tests: Lightning's import (~7 s of CPU) is paid
    # once by the test worker that runs this file's tests
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException, match="Found sort_by_key: bogus"):
        PyTorchProfiler(sort_by_key="bogus")
    with pytest.raises(ValueError):
        PyTorchProfiler(schedule=3)


def test_simple_profiler_writes_one_file_per_stage(tmp_path, console, lit):
    profiler = SimpleProfiler(filename="profiler")
    assert profiler.dirpath is None
    lit.all_stages(lit.trainer(tmp_path, profiler), lit.TinyModel())
    assert profiler.dirpath == str(tmp_path)  # trainer.log_dir with logger=False
    names = sorted(path.name for path in tmp_path.glob("*.txt"))
    assert names == ["fit-profiler.txt", "predict-profiler.txt", "test-profiler.txt", "validate-profiler.txt"]
    fit = (tmp_path / "fit-profiler.txt").read_text()
    assert fit.startswith("FIT Profiler Report")
    for action in ("run_training_epoch", "run_training_batch", "[_TrainingEpochLoop].train_dataloader_next",
                   "[Strategy]SingleDeviceStrategy.training_step", "[LightningModule]TinyModel.optimizer_step"):  # fmt: skip
        assert f"|  {action}" in fit
    assert "Total = wall-clock time since the profiler was created" in fit
    assert len(profiler.recorded_durations["[_EvaluationLoop].test_next"]) == 2  # limit_test_batches=2
    assert len(profiler.recorded_durations["[_PredictionLoop].predict_next"]) == 2
    assert console.getvalue().count("profiler report written to") == 4


def test_simple_profiler_report_is_visible_without_a_filename(tmp_path, console, lit):
    profiler = SimpleProfiler()
    trainer = lit.trainer(tmp_path, profiler)
    model = lit.TinyModel()
    trainer.fit(model, lit.loader(), lit.loader())
    trainer.test(model, lit.loader(), verbose=False)
    assert console.getvalue().count("Profiler Report") == 2  # Lightning logs it at INFO: silent by default
    assert "FIT Profiler Report" in console.getvalue() and "TEST Profiler Report" in console.getvalue()


def test_advanced_profiler_nested_hooks_in_a_trainer(tmp_path, console, lit):
    profiler = AdvancedProfiler(filename="profiler", line_count_restriction=5)
    lit.trainer(tmp_path, profiler).fit(lit.TinyModel(), lit.loader(), lit.loader())
    text = (tmp_path / "fit-profiler.txt").read_text()
    assert "Profile stats for: run_training_batch" in text
    assert "Profile stats for: [Strategy]SingleDeviceStrategy.training_step" in text
    assert "Nested actions" in text


def test_pytorch_profiler_fit_labels_traces_and_report(tmp_path, console, lit):
    profiler = PyTorchProfiler(filename="profile", schedule=None)
    trainer = lit.trainer(tmp_path, profiler, batches=2)
    model = lit.TinyModel()
    trainer.fit(model, lit.loader(), lit.loader())
    names = {event.name for event in profiler.function_events}
    assert "[pl][profile][Strategy]SingleDeviceStrategy.validation_step" in names
    assert "[pl][module]torch.nn.modules.linear.Linear: layer.0" in names
    assert (tmp_path / "fit-profile.txt").read_text().startswith("FIT Profiler Report\nProfile stats for: records")
    assert any(path.name.startswith("fit-profile-") for path in tmp_path.glob("*.pt.trace.json"))
    trainer.test(model, lit.loader(), verbose=False)  # the same profiler starts a new session
    assert (tmp_path / "test-profile.txt").read_text().startswith("TEST Profiler Report")


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_pytorch_profiler_evaluation_stages(tmp_path, console, stage, lit):
    profiler = PyTorchProfiler(filename="profile", schedule=None)
    trainer = lit.trainer(tmp_path, profiler)
    getattr(trainer, stage)(lit.TinyModel(), lit.loader())
    step = {"validate": "validation", "test": "test", "predict": "predict"}[stage]
    assert any(event.name.endswith(f"{step}_step") for event in profiler.function_events)
    assert (tmp_path / f"{stage}-profile.txt").stat().st_size > 0
    assert any(f"{stage}-profile-" in path.name for path in tmp_path.glob("*.pt.trace.json"))


def test_short_stage_overrides_the_default_schedule_with_a_warning(tmp_path, console, lit):
    profiler = PyTorchProfiler(filename="profile")
    with pytest.warns(UserWarning, match="not enough steps to properly record traces"):
        lit.trainer(tmp_path, profiler, batches=2, limit_val_batches=0).fit(lit.TinyModel(), lit.loader())
    assert profiler._schedule is None
    assert "aten::" in (tmp_path / "fit-profile.txt").read_text()


def test_long_enough_stage_keeps_the_default_schedule(tmp_path, console, lit):
    profiler = PyTorchProfiler(filename="profile")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*not enough steps.*")
        lit.trainer(tmp_path, profiler, batches=6, limit_val_batches=0).fit(lit.TinyModel(), lit.loader(6))
    assert profiler._schedule is not None
    assert len(list(tmp_path.glob("fit-profile-*training_step*.pt.trace.json"))) == 1


@pytest.mark.parametrize("make", [SimpleProfiler, AdvancedProfiler, lambda: PyTorchProfiler(schedule=None)])
def test_profiler_deepcopies_while_training_and_tears_down(tmp_path, console, make, lit):
    profiler = make()
    callback = lit.CopyProfilerDuringTraining()
    lit.trainer(tmp_path, profiler, callbacks=[callback]).fit(lit.TinyModel(), lit.loader(), lit.loader())
    assert len(callback.copies) == 3 and all(type(c) is type(profiler) for c in callback.copies)
    assert callback.output_file_at_fit_end is None and profiler._output_file is None


@pytest.mark.slow
def test_ddp_spawn_writes_one_report_per_rank_with_rank_in_name(tmp_path, lit):
    profiler = SimpleProfiler(dirpath=tmp_path, filename="profiler")
    trainer = lit.trainer(tmp_path, profiler, strategy="ddp_spawn", accelerator="cpu", devices=2)
    trainer.fit(lit.TinyModel(), lit.loader(), lit.loader())
    names = sorted(path.name for path in tmp_path.glob("*.txt"))
    assert names == ["fit-profiler-0.txt", "fit-profiler-1.txt"]
    assert all(path.stat().st_size > 0 for path in tmp_path.glob("*.txt"))


# -- DeviceStatsMonitor callback -------------------------------------------------------------------
def test_device_stats_monitor_logs_readable_cpu_stats(tmp_path, lit):
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(tmp_path, name="", version="")
    trainer = lit.trainer(tmp_path, None, logger=logger, log_every_n_steps=1, callbacks=[lit.DeviceStatsMonitor()])
    model = lit.TinyModel()
    trainer.fit(model, lit.loader(), lit.loader())
    trainer.test(model, lit.loader(), verbose=False)
    with open(tmp_path / "metrics.csv") as handle:
        header = next(csv.reader(handle))
    for hook in ("on_train_batch_start", "on_train_batch_end", "on_validation_batch_end", "on_test_batch_start"):
        for key in ("cpu_percent", "cpu_vm_percent", "cpu_swap_percent"):
            assert f"DeviceStatsMonitor.{hook}/{key}" in header


def test_device_stats_monitor_needs_a_logger(tmp_path, lit):
    trainer = lit.trainer(tmp_path, None, callbacks=[lit.DeviceStatsMonitor()])
    with pytest.raises(Exception, match=r"Cannot use `DeviceStatsMonitor` callback with `Trainer\(logger=False\)`"):
        trainer.fit(lit.TinyModel(), lit.loader())


def test_device_stats_monitor_warns_about_unknown_filter_keys(tmp_path, lit):
    from lightning.pytorch.loggers import CSVLogger

    monitor = lit.DeviceStatsMonitor(filter_keys={"cpu_percent", "gpu_utilization_percent"})
    trainer = lit.trainer(tmp_path, None, logger=CSVLogger(tmp_path, name="", version=""), callbacks=[monitor], log_every_n_steps=1)
    with pytest.warns(UserWarning, match="filter_keys contains keys not found in device stats"):
        trainer.fit(lit.TinyModel(), lit.loader())
    with open(tmp_path / "metrics.csv") as handle:
        header = next(csv.reader(handle))
    logged = [key for key in header if key.startswith("DeviceStatsMonitor")]
    assert logged and {key.rsplit("/", 1)[1] for key in logged} == {"cpu_percent"}


@pytest.fixture(scope="module")
def lit():
    """The Lightning model, trainer and callbacks (Lightning is imported here, not at collection)."""
    pytest.importorskip("lightning.pytorch")
    import lightning_parts

    return lightning_parts


@pytest.fixture
def console(monkeypatch) -> io.StringIO:
    stream = io.StringIO()
    monkeypatch.setattr(Profiler, "console_stream", stream)
    return stream
