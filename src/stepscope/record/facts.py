"""A record's typed facts besides the steps (:class:`CaptureFacts`), apart from the classes of its
fields (:mod:`stepscope.record.fact_parts`, :mod:`stepscope.record.compile_facts`): every field
defaults to None or empty, so a trace's evidence holds an empty one without creating them (their
annotations are only read by type checkers; :mod:`stepscope.record.store` builds each part itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stepscope.record.compile_facts import CompileFacts
    from stepscope.record.fact_parts import (ComputeFacts, CpuPeak, OpCost, Overrides, SkippedSamples, ThreadAccount,
                                             WorkerBatches)


@dataclass(frozen=True)
class CaptureFacts:
    """Typed facts capture measured besides the steps (each None when not measured)."""

    compute: ComputeFacts | None = None
    cpu_peak: CpuPeak | None = None
    cpu_peak_bf16: CpuPeak | None = None  # the same machine's bf16 matmul rate (CPU autocast runs)
    #: one tiny eager operator's host cost on this machine (None: not measured, records before it)
    op_cost: OpCost | None = None
    trailing_ns: int = 0  # time after the last committed step, not in any step
    #: the run only ran forwards (no backward, no optimizer step): an inference loop
    inference: bool = False
    #: root forwards of the model, and how many ran under torch.no_grad() / inference_mode()
    model_forwards: int = 0
    model_forwards_no_grad: int = 0
    #: processes the script started itself (multiprocessing / torch.multiprocessing, not
    #: DataLoader workers), their CPU time and the training process's own (seconds)
    child_pids: tuple[int, ...] = ()
    children_cpu_s: float | None = None
    main_cpu_s: float | None = None
    #: the training ran in those children: the parent's steps are not the training
    training_in_children: bool = False
    overrides: Overrides | None = None  # `--set` / `--max-steps`; None when neither was given
    #: torch.compile: compilations, graph breaks, recompile-limit hits; None when nothing compiled
    compile: CompileFacts | None = None
    #: one entry per SkipBadSamples dataset the script made (empty when it made none)
    skipped_samples: tuple[SkippedSamples, ...] = ()
    #: the training thread's on-CPU / waiting / blocked time per phase on sampled steps; None when
    #: not measured (no per-thread scheduler counters, or no step accounted)
    thread_account: ThreadAccount | None = None
    #: each DataLoader worker's time per batch (None: no forked worker timed, records before it)
    worker_batches: WorkerBatches | None = None
