"""Synthetic run records for unit tests."""

from __future__ import annotations

import numpy as np

from stepscope.record.store import facts_from_v1_extra
from stepscope.record.run import LoaderInfo, RunMeta, RunRecord, StepTable


def report_of(record: RunRecord | None = None, *, ranks: tuple[RunRecord, ...] = (), traces=None, run_dir=None,
              **options):
    """The pipeline's report of records in memory (``ranks``: every rank of a job; ``run_dir``:
    where their files are), or of analysed traces (``traces``: a TraceAnalysis); ``options`` are
    ReportOptions."""
    from stepscope.pipeline.diagnose import ReportOptions, diagnose
    from stepscope.pipeline.inputs import JobInputs

    if traces is not None:
        return diagnose(JobInputs("trace", traces=traces), ReportOptions(**options))
    records = tuple(sorted(ranks or (record,), key=lambda item: item.meta.rank))
    return diagnose(JobInputs("run", records, run_dir=run_dir), ReportOptions(**options))


def summary_text(report, width: int = 200) -> str:
    """The terminal summary of ``report`` as plain text."""
    import io

    from stepscope.report.render import Output, render

    buffer = io.StringIO()
    render(report, "text", Output(stream=buffer, width=width, run_dir="runs/x"))
    return buffer.getvalue()


def make_record(count: int = 5, rank: int = 0) -> RunRecord:
    start = 10_000 + np.arange(count, dtype=np.int64) * 1000
    columns = {
        "start_ns": start,
        "duration_ns": np.full(count, 1000),
        "data_wait_ns": np.full(count, 400),
        "loader_init_ns": np.zeros(count),
        "forward_ns": np.full(count, 200),
        "backward_ns": np.full(count, 300),
        "optimizer_ns": np.full(count, 50),
        "other_ns": np.full(count, 50),
        "batches": np.ones(count),
        "samples": np.full(count, 8),
        "optimizer_steps": np.ones(count),
    }
    loader = LoaderInfo(loader_id=0, cls="torch.utils.data.dataloader.DataLoader", dataset_type="X",
                        iterable_dataset=False, batch_size=8, num_workers=2, pin_memory=True,
                        prefetch_factor=2, persistent_workers=False, drop_last=False, batches=count,
                        worker_pids=(11, 12))
    return RunRecord(meta=RunMeta(rank=rank, target="train.py", argv=("train.py", "--lr", "3e-4")),
                     steps=StepTable.from_columns(columns), loaders=(loader,), warnings=("w",),
                     facts=facts_from_v1_extra({"flops": {"step_index": 2, "flops": 123}}))


def noisy_record(count: int, wait_ns: float, compute_ns: float, seed: int, *, spread: float = 0.1,
                 wait_spread: float | None = None, other_ns: int = 10_000, **meta) -> RunRecord:
    """A record whose steps wait ``wait_ns`` for data and compute ``compute_ns`` (forward), each with
    a relative normal ``spread`` (``wait_spread`` for the wait, default the same), for comparisons."""
    from dataclasses import replace

    rng = np.random.default_rng(seed)
    spread_w = spread if wait_spread is None else wait_spread
    wait = (wait_ns * (1 + spread_w * rng.standard_normal(count))).clip(1).astype(np.int64)
    forward = (compute_ns * (1 + spread * rng.standard_normal(count))).clip(1).astype(np.int64)
    other = np.full(count, other_ns, dtype=np.int64)
    duration = wait + forward + other
    start = np.concatenate([[0], np.cumsum(duration)[:-1]])
    steps = StepTable.from_columns({"start_ns": start, "duration_ns": duration, "data_wait_ns": wait,
                                    "forward_ns": forward, "other_ns": other, "batches": np.ones(count),
                                    "samples": np.full(count, 8), "optimizer_steps": np.ones(count)})
    base = make_record(count)
    return replace(base, steps=steps, meta=replace(base.meta, **meta))
