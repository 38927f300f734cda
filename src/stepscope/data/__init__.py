"""DataLoader toolkit: datasets, samplers, collate functions and a loader tuner.

Everything here is optional and imported on demand: ``import stepscope`` never imports this
package, and importing this package does not import torch until a torch-backed name is used
(:mod:`stepscope.data.skip`, whose counter capture reads, stays torch-free).

- :class:`ShardedJsonl` — an ``IterableDataset`` over JSONL files (plain or gzip) where every
  process (rank × worker) reads only its own byte ranges; shuffle buffer; resumable.
- :class:`IndexedJsonl` — a map-style JSONL dataset over a line-offset index cached beside the file.
- :class:`BucketBatchSampler` — batches of similar size from a cached size index; distributed-aware.
- :func:`pad_collate` — pads variable-length sequences and returns the attention mask.
- :class:`SkipBadSamples`, :func:`skipped_samples` — skip failing samples, and count them.
- :func:`tune_loader` — measure DataLoader settings (``stepscope tune-loader``).
"""

from __future__ import annotations

__all__ = [
    "ShardedJsonl",
    "IndexedJsonl",
    "BucketBatchSampler",
    "pad_collate",
    "SkipBadSamples",
    "skipped_samples",
    "skip_counts",
    "tune_loader",
]

_WHERE = {
    "ShardedJsonl": "stepscope.data.sharded",
    "IndexedJsonl": "stepscope.data.indexed",
    "BucketBatchSampler": "stepscope.data.buckets",
    "pad_collate": "stepscope.data.collate",
    "SkipBadSamples": "stepscope.data.skip",
    "skipped_samples": "stepscope.data.skip",
    "skip_counts": "stepscope.data.skip",
    "tune_loader": "stepscope.data.tuner",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'stepscope.data' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
