"""The Lightning side of test_lightning_profilers (imported only by the tests that run a Trainer,
so collecting the suite does not import Lightning)."""

from __future__ import annotations

import copy

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from stepscope.integrations.lightning import DeviceStatsMonitor  # noqa: F401 - the tests take it from here


class TinyModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        self.layer(batch[0])

    def test_step(self, batch, batch_idx):
        self.layer(batch[0])

    def predict_step(self, batch, batch_idx):
        return self.layer(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader(batches: int = 4) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(batches * 2, 4)), batch_size=2)


def trainer(root, profiler, batches: int = 3, **kwargs) -> pl.Trainer:
    options = dict(
        max_epochs=1, limit_train_batches=batches, limit_val_batches=2, limit_test_batches=2, limit_predict_batches=2,
        num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False, logger=False,
        enable_checkpointing=False, default_root_dir=str(root), profiler=profiler,
    )  # fmt: skip
    options.update(kwargs)
    return pl.Trainer(**options)


def all_stages(trainer: pl.Trainer, model: TinyModel) -> None:
    trainer.fit(model, loader(), loader())
    trainer.validate(model, loader(), verbose=False)
    trainer.test(model, loader(), verbose=False)
    trainer.predict(model, loader())


class CopyProfilerDuringTraining(pl.Callback):
    """Deep-copies the trainer's profiler mid-step, as SWA's model averaging copies modules."""

    def __init__(self) -> None:
        self.copies: list = []
        self.output_file_at_fit_end = "unset"

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.copies.append(copy.deepcopy(trainer.profiler))

    def on_fit_end(self, trainer, pl_module):
        self.output_file_at_fit_end = trainer.profiler._output_file
