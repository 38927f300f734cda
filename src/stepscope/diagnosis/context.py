"""Steady-state step statistics and the context builder the rules read.

:func:`steady_state_mask` decides which steps describe the run's steady state:

1. the leading warm-up steps go (:func:`detect_warmup`): the first step always when there are
   at least :data:`MIN_STEPS_FOR_WARMUP` steps (lazy initialisation, allocator growth, first
   batch), then every following step still slower than :data:`WARMUP_FACTOR` × the median of the
   second half of the run, up to :data:`WARMUP_MAX_SHARE` of the steps;
2. the step whose FLOPs were counted (``record.extra["flops"]["step_index"]``) goes: the counter
   slows it down.

Recurring slow steps *after* warm-up stay in: they are the periodic-stall rule's evidence and
part of what the run costs.

:func:`build_context` wraps a record and the optional sampler/trace evidence into a
:class:`~stepscope.diagnosis.engine.DiagnosisContext` carrying these :class:`StepStats`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stepscope.record.run import PHASES, Steps

#: Fewer steps than this: nothing is called warm-up (there is no steady state to compare with).
MIN_STEPS_FOR_WARMUP = 4
#: A leading step slower than this multiple of the late-run median is still warming up
#: (compilation, cudnn autotuning, allocator growth, DataLoader worker start-up).
WARMUP_FACTOR = 1.5
#: At most this share of the steps is ever called warm-up.
WARMUP_MAX_SHARE = 0.2


def detect_warmup(duration_ns: np.ndarray) -> int:
    """How many leading steps are warm-up (see the module docstring for the rule)."""
    durations = np.asarray(duration_ns, dtype=np.float64)
    count = len(durations)
    if count < MIN_STEPS_FOR_WARMUP:
        return 0
    reference = float(np.median(durations[count // 2:]))
    limit = max(1, int(count * WARMUP_MAX_SHARE))
    warmup = 1
    while warmup < limit and durations[warmup] > WARMUP_FACTOR * reference:
        warmup += 1
    return warmup


def flops_step_index(record: Any) -> int | None:
    """Index of the step whose FLOPs were counted, if capture counted one."""
    info = (getattr(record, "extra", None) or {}).get("flops")
    if isinstance(info, dict) and isinstance(info.get("step_index"), int):
        return int(info["step_index"])
    return None


def steady_state_mask(steps: Steps, exclude: tuple[int, ...] = ()) -> np.ndarray:
    """Boolean mask of the steady-state steps: no warm-up, none of ``exclude``."""
    mask = np.ones(len(steps), dtype=bool)
    mask[: detect_warmup(steps.duration_ns)] = False
    for index in exclude:
        if 0 <= index < len(mask):
            mask[index] = False
    if not mask.any() and len(mask):
        mask[-1] = True  # a one- or two-step run still has a "steady" step to describe
    return mask


@dataclass(frozen=True)
class StepStats:
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


def compute_step_stats(record: Any) -> StepStats | None:
    """:class:`StepStats` of a record's steady state; None without steps."""
    steps: Steps | None = getattr(record, "steps", None)
    if steps is None or len(steps) == 0:
        return None
    flops_index = flops_step_index(record)
    mask = steady_state_mask(steps, () if flops_index is None else (flops_index,))
    durations = steps.duration_ns[mask].astype(np.float64)
    total_ns = float(durations.sum())
    denominator = total_ns if total_ns > 0 else 1.0
    shares = {name: float(steps.phase(name)[mask].sum()) / denominator for name in PHASES}
    init_share = float(steps.loader_init_ns[mask].sum()) / denominator
    meta = getattr(record, "meta", None)
    flops_info = (getattr(record, "extra", None) or {}).get("flops") or {}
    return StepStats(
        step_count=len(steps),
        steady_count=int(mask.sum()),
        warmup_steps=detect_warmup(steps.duration_ns),
        mask=mask,
        total_s=total_ns / 1e9,
        step_time_s=float(np.median(durations)) / 1e9,
        step_time_mean_s=float(durations.mean()) / 1e9,
        shares=shares,
        loader_init_share=init_share,
        fetch_wait_share=max(0.0, shares["data_wait"] - init_share),
        cpu_count=(getattr(meta, "cpu_count_logical", 0) or None) if meta is not None else None,
        intra_op_threads=getattr(meta, "intra_op_threads", None) if meta is not None else None,
        flops_per_step=_positive(flops_info.get("flops")) if isinstance(flops_info, dict) else None,
        ops_per_step=_positive(flops_info.get("ops")) if isinstance(flops_info, dict) else None,
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
