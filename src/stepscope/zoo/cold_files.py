"""Planted bottleneck: a first epoch that reads its data set from storage (cold page cache).

The script writes 64 files of 8 MiB (a data set of 512 MiB) into a temporary directory, drops
them from the page cache (``fsync`` + ``posix_fadvise(DONTNEED)``, as after a reboot or on a
fresh node), then trains 3 epochs with ``num_workers=2`` (new workers every epoch) reading one
file per sample through a memory map touched every 64 KiB (from the page cache: page faults only;
from the disk: the whole file, read ahead), and a model on one intra-op thread that computes for a
few ms per step — far longer than two workers need to read a batch from the page cache, shorter
than from the disk. The first epoch waits for the disk. The files are removed at the end.

The later epochs wait too, on two cores: the steps compute ~1 ms, and receiving each batch from the
workers (and their restart every epoch) costs the training process 1.5-2 ms a step — 30-50 % of the
warm steps, measured on a 2-core VM. The loaders then compute 0.38-0.52 of a core: that wait may be
reported first, as an input finding that claims neither CPU-bound loading nor idle loaders, or, where
the workers' measured pace explains only part of it, as the wait in next() that is not the
DataLoader's pace (no cause named).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from stepscope.zoo._common import parse_args, report

FILES = 64
FILE_BYTES = 8 << 20
FEATURES = 128
#: Floats between two values read (64 KiB): every page-cache page of the file is touched alike.
STRIDE = 16384
#: Sized so a step computes for a few ms: longer than a batch read from the page cache, shorter
#: than one read from the disk.
HIDDEN = 512


def write_data_set(root: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    block = rng.standard_normal(FILE_BYTES // 4).astype(np.float32)
    for index in range(FILES):
        path = os.path.join(root, f"{index:05d}.bin")
        np.roll(block, index).tofile(path)
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)  # dirty pages cannot be dropped: write them first
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)  # the planted cold cache
        finally:
            os.close(descriptor)


class FileDataset(Dataset):
    def __init__(self, root: str):
        self.root = root

    def __len__(self) -> int:
        return FILES

    def __getitem__(self, index: int):
        # a memory map touched every 64 KiB: from the page cache a few hundred page faults (~0.1 ms),
        # from a cold disk the kernel's readahead reads the whole file first
        values = np.memmap(os.path.join(self.root, f"{index:05d}.bin"), dtype=np.float32, mode="r")
        features = torch.from_numpy(np.array(values[:: STRIDE][:FEATURES], dtype=np.float32))
        return features, features[:1] * 0.5


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=3 * FILES // 2, batch_size=2)
    torch.manual_seed(args.seed)
    workers = 2 if args.num_workers is None else args.num_workers
    root = tempfile.mkdtemp(prefix="stepscope-cold-files-")
    try:
        write_data_set(root, args.seed)
        loader = DataLoader(FileDataset(root), batch_size=args.batch_size, shuffle=True, num_workers=workers)
        torch.set_num_threads(1)  # the model keeps one core: the workers are never starved of CPU
        model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                                    torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        losses: list[float] = []
        while len(losses) < args.steps:
            for inputs, targets in loader:  # a new pass: the workers start again
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(inputs), targets)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
                if len(losses) >= args.steps:
                    break
        report(losses)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
