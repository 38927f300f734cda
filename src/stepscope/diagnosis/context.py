"""Steady-state step statistics and the context builder the rules read.

The steady state is :func:`stepscope.analysis.run.steady.steady_mask` — the same warm-up rule and the
same excluded (FLOP-counted) step as the report's summary, so the rules and the summary describe
the same steps. Recurring slow steps *after* warm-up stay in: they are the periodic-stall rule's
evidence and part of what the run costs.

:func:`build_context` wraps a record and the optional sampler/trace evidence into a
:class:`~stepscope.diagnosis.engine.DiagnosisContext` carrying these :class:`DiagnosisStats`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stepscope.analysis.run.steady import steady_mask, warmup_count
from stepscope.record.run import PHASES, StepTable

#: Percentile of steady step times taken as the undisturbed step (used against a best-case peak).
FAST_PERCENTILE = 10


@dataclass(frozen=True)
class DiagnosisStats:
    """What the steady-state steps say, in the units the rules compare.

    Shares are sums over steady steps divided by their total time (the share of *time*, which is
    what fixing the phase would save).
    """

    step_count: int
    steady_count: int
    warmup_steps: int
    mask: np.ndarray
    total_s: float
    step_time_s: float  # median steady step
    step_time_mean_s: float
    step_time_fast_s: float  # FAST_PERCENTILE of steady steps: the step undisturbed
    shares: dict[str, float]  # phase -> share of steady time (PHASES)
    loader_init_share: float
    fetch_wait_share: float  # data wait minus worker start-up
    cpu_count: int | None
    intra_op_threads: int | None
    flops_per_step: float | None
    ops_per_step: float | None

    @property
    def data_wait_share(self) -> float:
        return self.shares.get("data_wait", 0.0)

    @property
    def compute_share(self) -> float:
        """forward + backward + optimizer: time the model itself runs."""
        return sum(self.shares.get(name, 0.0) for name in ("forward", "backward", "optimizer"))


def compute_step_stats(record: Any) -> DiagnosisStats | None:
    """:class:`DiagnosisStats` of a record's steady state; None without steps."""
    steps: StepTable | None = getattr(record, "steps", None)
    if steps is None or len(steps) == 0:
        return None
    mask = steady_mask(record)
    durations = steps.duration_ns[mask].astype(np.float64)
    total_ns = float(durations.sum())
    denominator = total_ns if total_ns > 0 else 1.0
    shares = {name: float(steps.phase(name)[mask].sum()) / denominator for name in PHASES}
    init_share = float(steps.loader_init_ns[mask].sum()) / denominator
    meta = getattr(record, "meta", None)
    compute = record.facts.compute
    return DiagnosisStats(
        step_count=len(steps),
        steady_count=int(mask.sum()),
        warmup_steps=warmup_count(steps.duration_ns),
        mask=mask,
        total_s=total_ns / 1e9,
        step_time_s=float(np.median(durations)) / 1e9,
        step_time_mean_s=float(durations.mean()) / 1e9,
        step_time_fast_s=float(np.percentile(durations, FAST_PERCENTILE)) / 1e9,
        shares=shares,
        loader_init_share=init_share,
        fetch_wait_share=max(0.0, shares["data_wait"] - init_share),
        cpu_count=(getattr(meta, "cpu_count_logical", 0) or None) if meta is not None else None,
        intra_op_threads=getattr(meta, "intra_op_threads", None) if meta is not None else None,
        flops_per_step=_positive(compute.flops) if compute is not None else None,
        ops_per_step=_positive(compute.ops) if compute is not None else None,
    )


def _positive(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def build_context(record: Any, signals: Any = None, trace: Any = None,
                  ranks: tuple[Any, ...] = ()) -> Any:
    """The :class:`~stepscope.diagnosis.engine.DiagnosisContext` for ``diagnose``.

    Args:
        record: the run record of the rank being diagnosed (may be None for a bare trace).
        signals: :class:`~stepscope.analysis.evidence.MacroSignals` of that record, if sampled.
        trace: :class:`~stepscope.analysis.evidence.TraceEvidence`, if a trace was analysed.
        ranks: every rank's record when several are known (stragglers).
    """
    from stepscope.diagnosis.engine import DiagnosisContext

    return DiagnosisContext(record=record, signals=signals, trace=trace, ranks=tuple(ranks),
                            stats=compute_step_stats(record) if record is not None else None)
