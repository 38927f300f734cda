"""Lightning glue: stepscope profilers as Lightning profilers, and a DeviceStatsMonitor callback.

Contract:
- Importing this module imports Lightning (``lightning``, else ``pytorch_lightning``); nothing
  else in stepscope does, so Lightning stays optional.
- ``Trainer(profiler=...)`` only calls ``setup/start/stop/profile/describe/teardown`` and sets
  ``_lightning_module``, which every stepscope profiler provides. For ``isinstance`` checks
  (user code, LightningCLI), :func:`register_profilers` registers stepscope's ``Profiler`` as a
  virtual subclass of every loaded Lightning ``Profiler`` ABC. It runs when this module is
  imported, when ``stepscope.profilers`` is imported after Lightning, and when a profiler is
  constructed after Lightning was imported.
- :class:`DeviceStatsMonitor` is a real Lightning ``Callback`` with Lightning's behaviour (stats at
  the start and end of every train/validation/test batch, on the logging cadence, keys
  ``DeviceStatsMonitor.<hook><separator><metric>``, step = optimizer steps taken, a
  configuration error without a logger, a warning for unknown ``filter_keys``), but on GPUs it
  logs the readable set of :mod:`stepscope.profilers.device_stats` (utilization, memory
  used/total, torch allocator totals) instead of the whole allocator dictionary, which
  ``allocator_stats=True`` adds back.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone distribution
    import pytorch_lightning as pl  # type: ignore[no-redef]

from stepscope.profilers import register_with_loaded_lightning
from stepscope.profilers._config import config_error
from stepscope.profilers.device_stats import DeviceStatsMonitor as _StatsCollector

__all__ = ["DeviceStatsMonitor", "register_profilers"]


def register_profilers() -> None:
    """Make stepscope profilers ``isinstance`` of every loaded Lightning ``Profiler``."""
    register_with_loaded_lightning()


register_profilers()


class DeviceStatsMonitor(pl.Callback):
    """Logs device statistics during training, validation and testing.

    Args:
        cpu_stats: None: CPU stats when training on the CPU; True: always; False: never.
        allocator_stats: also log torch's whole CUDA allocator dictionary (Lightning's keys).
        filter_keys: log only these metric names (without the hook prefix).

    Raises:
        ProfilerConfigError: at ``fit`` with ``Trainer(logger=False)``, or invalid arguments.
    """

    def __init__(
        self, cpu_stats: bool | None = None, allocator_stats: bool = False, filter_keys: Iterable[str] | None = None
    ) -> None:
        self._collector = _StatsCollector(cpu_stats=cpu_stats, allocator_stats=allocator_stats, filter_keys=filter_keys)

    @property
    def collector(self) -> _StatsCollector:
        return self._collector

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        if not trainer.loggers:
            raise config_error("Cannot use `DeviceStatsMonitor` callback with `Trainer(logger=False)`.")
        unknown = self._collector.unknown_filter_keys(trainer.strategy.root_device)
        if unknown:
            warnings.warn(
                f"`DeviceStatsMonitor` filter_keys contains keys not found in device stats and will be ignored: {unknown}",
                UserWarning,
                stacklevel=2,
            )

    def _log(self, trainer: Any, hook: str) -> None:
        connector = getattr(trainer, "_logger_connector", None)
        if connector is not None and not getattr(connector, "should_update_logs", True):
            return
        stats = self._collector.stats(trainer.strategy.root_device)
        if not stats:
            return
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        prefix = f"{type(self).__qualname__}.{hook}"
        for logger in trainer.loggers:
            separator = getattr(logger, "group_separator", "/")
            logger.log_metrics({f"{prefix}{separator}{key}": value for key, value in stats.items()}, step=step)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._log(trainer, "on_train_batch_start")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._log(trainer, "on_train_batch_end")

    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._log(trainer, "on_validation_batch_start")

    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._log(trainer, "on_validation_batch_end")

    def on_test_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._log(trainer, "on_test_batch_start")

    def on_test_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._log(trainer, "on_test_batch_end")
