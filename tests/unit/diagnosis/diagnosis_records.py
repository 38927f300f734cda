"""Synthetic records and evidence for rule tests (plain helpers: no conftest, so no name clash)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from stepscope.analysis.evidence import MacroSignals, TraceEvidence, WorkerLoad
from stepscope.analysis.bundle import build_evidence
from stepscope.record.store import facts_from_v1_extra
from stepscope.record.run import DeviceInfo, LoaderInfo, RunMeta, RunRecord, StepTable, WorkerBatches

DEFAULT_SHARES = {"forward": 0.5, "backward": 0.35, "optimizer": 0.1}


def make_record(steps: int = 40, step_s: float = 0.01, shares: dict | None = None,
                num_workers: int | None = 0, persistent: bool = False, cpu_count: int = 2,
                intra_op_threads: int = 2, extra: dict | None = None, devices: tuple = (),
                added: dict | None = None, loader_init: dict | None = None, rank: int = 0,
                samples: int = 32, warmup_factor: float = 3.0) -> RunRecord:
    """Steps of ``step_s`` split by ``shares`` (rest is ``other``).

    ``added`` maps step index -> {phase: seconds} added on top; ``loader_init`` maps step index ->
    seconds of worker start-up (added to data wait). The first step is ``warmup_factor`` slower.
    """
    shares = DEFAULT_SHARES if shares is None else shares
    columns = {name: np.zeros(steps) for name in ("data_wait", "loader_init", "forward", "backward",
                                                 "optimizer", "other")}
    for name, share in shares.items():
        columns[name][:] = share * step_s
    columns["other"][:] = step_s * (1 - sum(shares.values()))
    columns["forward"][0] += step_s * (warmup_factor - 1)
    for index, phases in (added or {}).items():
        for name, seconds in phases.items():
            columns[name][index] += seconds
    for index, seconds in (loader_init or {}).items():
        columns["loader_init"][index] += seconds
        columns["data_wait"][index] += seconds
    ns = {name: np.round(values * 1e9).astype(np.int64) for name, values in columns.items()}
    duration = sum(ns[name] for name in ("data_wait", "forward", "backward", "optimizer", "other"))
    start = np.concatenate([[0], np.cumsum(duration)[:-1]]) + 10**9
    step_columns = {f"{name}_ns": value for name, value in ns.items()}
    step_columns.update(start_ns=start, duration_ns=duration, batches=np.ones(steps),
                        samples=np.full(steps, samples), optimizer_steps=np.ones(steps))
    loaders = ()
    if num_workers is not None:
        loaders = (LoaderInfo(loader_id=0, cls="DataLoader", dataset_type="Dataset", iterable_dataset=False,
                              batch_size=samples, num_workers=num_workers, pin_memory=False,
                              prefetch_factor=2 if num_workers else None, persistent_workers=persistent,
                              drop_last=False, batches=steps, iterators=1,
                              wait_ns=int(ns["data_wait"].sum())),)
    meta = RunMeta(cpu_count_logical=cpu_count, intra_op_threads=intra_op_threads, devices=devices, rank=rank)
    record = RunRecord(meta=meta, steps=StepTable.from_columns(step_columns), loaders=loaders,
                       facts=facts_from_v1_extra(dict(extra or {})))
    record.check()
    return record


def gpu(name: str = "NVIDIA H200") -> tuple:
    return (DeviceInfo(index=0, kind="cuda", name=name, total_memory_bytes=141 * 2**30),)


def workers(count: int, util: float, threads: int | None = None, running: float | None = None) -> tuple:
    return tuple(WorkerLoad(pid=100 + index, role="dataloader_worker", cpu_util=util, threads=threads,
                            running_threads=running) for index in range(count))


def ctx_of(record=None, signals: dict | MacroSignals | None = None, trace: dict | None = None, ranks=()):
    """A diagnosis context; ``signals``/``trace`` may be dicts of MacroSignals/TraceEvidence fields."""
    if isinstance(signals, dict):
        signals = MacroSignals(**signals)
    if isinstance(trace, dict):
        trace = TraceEvidence(**trace)
    return build_evidence(record, signals, trace, tuple(ranks))


#: The first timed worker's pid (:func:`timed_workers`).
WORKER = 4242


def timed_workers(record, wall_s: float, cpu_s: float, runq_s: float, workers: int = 1, every: int = 1):
    """``record`` with one timed batch per step (ending at each step's start), ``workers`` DataLoader
    workers taking turns, each batch ``wall_s`` long of which ``cpu_s`` on a CPU and ``runq_s``
    waiting for a core (the rest off CPU); only every ``every``-th step's batch is kept."""
    steps = record.steps
    pids = tuple(WORKER + index for index in range(workers))
    rows = [(pids[index % workers], int(steps.start_ns[index]), round(wall_s * 1e9), round(cpu_s * 1e9),
             round(runq_s * 1e9)) for index in range(0, len(steps), every)]
    loader = replace(record.loaders[0], num_workers=workers, worker_pids=pids)
    return replace(record, loaders=(loader,),
                   facts=replace(record.facts, worker_batches=WorkerBatches(*map(tuple, zip(*rows)))))
