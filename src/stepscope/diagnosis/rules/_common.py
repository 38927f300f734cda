"""Helpers the rules share: building findings, reading optional evidence, estimates used by
more than one family (so two rules never disagree about the same number)."""

from __future__ import annotations

import math
from typing import Any

from stepscope.diagnosis.context import DiagnosisStats
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity, severity_for_impact

#: XProf's "MODERATELY input-bound" level (kModeratelyInfeedBoundThresholdInPercent = 5), which is
#: also the TensorBoard plugin's DataLoader recommendation threshold (> 5 % of the step).
INPUT_MODERATE = 0.05
#: XProf's "HIGHLY input-bound" level (kHighlyInfeedBoundThresholdInPercent = 20).
INPUT_HIGH = 0.20
#: A loading process busier than this share of one core while the step waits for data is
#: CPU-bound (our level; a sleeping or I/O-blocked process sits near 0, a computing one near 1).
LOADER_CPU_BUSY = 0.5
#: Below this share of one core the loading process is mostly waiting, not computing.
LOADER_CPU_IDLE = 0.3
#: Utilisation of all cores above which the machine has no CPU left to give (cf. the sampler's
#: 90 % saturation level for a core).
CPU_SATURATED = 0.85
#: Cores the model's compute is taken to keep busy when a CPU-time split is estimated.
COMPUTE_CORES_ASSUMED = 1.0


def finding(rule_id: str, family: str, title: str, impact: float, confidence: float,
            evidence: list[Evidence], prescriptions: list[Prescription], summary: str = "",
            severity: Severity | None = None, **extra: Any) -> Finding:
    """A :class:`Finding` with impact clamped to 0..1 and severity from impact unless given."""
    impact = min(1.0, max(0.0, float(impact)))
    return Finding(
        rule_id=rule_id, family=family, title=title,
        severity=severity_for_impact(impact) if severity is None else severity,
        impact=round(impact, 4), confidence=round(min(1.0, max(0.0, confidence)), 2),
        evidence=tuple(evidence), prescriptions=tuple(prescriptions), summary=summary,
        extra=dict(extra),
    )


def pct(value: float) -> str:
    return f"{100 * value:.0f}%" if value >= 0.1 else f"{100 * value:.1f}%"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def field_of(obj: Any, name: str) -> Any:
    """``obj.name`` or None when ``obj`` is absent (evidence objects are optional)."""
    return None if obj is None else getattr(obj, name, None)


def cpu_count(ctx: Any) -> int | None:
    stats: DiagnosisStats | None = ctx.stats
    if stats is not None and stats.cpu_count:
        return stats.cpu_count
    return field_of(ctx.signals, "cpu_count")


def main_loader(ctx: Any) -> Any:
    """The DataLoader the run waited on most (None when no DataLoader was seen)."""
    loaders = tuple(getattr(ctx.record, "loaders", ()) or ())
    if not loaders:
        return None
    return max(loaders, key=lambda loader: (loader.wait_ns, loader.batches))


def batches_per_step(ctx: Any) -> float:
    steps = getattr(ctx.record, "steps", None)
    if steps is None or ctx.stats is None:
        return 1.0
    batches = steps.batches[ctx.stats.mask]
    return float(batches.mean()) if len(batches) and batches.mean() > 0 else 1.0


def loader_cpu_util(ctx: Any) -> tuple[float | None, str]:
    """CPU (share of one core) of the processes that load data, *while* the step waits.

    With worker processes this is their mean utilisation. With ``num_workers=0`` the main process
    both loads and computes, so the part its compute explains is taken out first: compute is
    taken to keep one core busy for ``1 - data_wait`` of the time (small models rarely use more;
    a model using several intra-op threads shifts the estimate towards "CPU-bound", where the
    prescription — worker processes — also helps a latency-bound loader). What is left, divided by
    the data-wait share, is what loading used. Measured values take precedence: with
    ``num_workers=0``, the training thread's own CPU time inside ``next()`` (capture's
    ``data_wait_cpu_ns`` column: immune to other threads of the process, such as spinning OpenMP
    workers); with workers, the sampler's ``data_wait_cpu_util``.

    When every core is busy (:data:`CPU_SATURATED`), a loader using little CPU may be starved by
    other threads rather than idle: the estimate is then not conclusive (None).

    Returns:
        (utilisation or None without sampler evidence, a short description of how it was got).
    """
    signals = ctx.signals
    loader = main_loader(ctx)
    util, source = _loading_thread_cpu(ctx, loader), "training thread's CPU time inside next() (capture)"
    if util is None:
        direct = field_of(signals, "data_wait_cpu_util")
        if direct is not None:
            util, source = float(direct), "loading processes while the step waited (sampler)"
        else:
            util, source = _loader_cpu_estimate(ctx, signals, loader)
    machine = field_of(signals, "cpu_util_mean")
    if util is not None and util < LOADER_CPU_BUSY and machine is not None and machine >= CPU_SATURATED:
        # every core is busy: a loader that gets little CPU may be starved, not idle
        return None, "not conclusive: all cores are busy, so the loaders may be starved rather than idle"
    return util, source


def evidence_source(description: str) -> str:
    """The ``Evidence.source`` for a value described as "... (capture)" or "... (sampler)"."""
    return "steps" if description.endswith("(capture)") else "sampler"


def _loading_thread_cpu(ctx: Any, loader: Any) -> float | None:
    """CPU share of the training thread while it fetched batches itself (``num_workers=0``)."""
    steps = getattr(ctx.record, "steps", None)
    if loader is None or loader.num_workers > 0 or steps is None or ctx.stats is None:
        return None
    cpu = steps.data_wait_cpu_ns[ctx.stats.mask]
    wait = steps.data_wait_ns[ctx.stats.mask] - steps.loader_init_ns[ctx.stats.mask]
    known = cpu >= 0
    if not known.any() or wait[known].sum() <= 0:
        return None
    return min(1.0, float(cpu[known].sum() / wait[known].sum()))


def _loader_cpu_estimate(ctx: Any, signals: Any, loader: Any) -> tuple[float | None, str]:
    if loader is not None and loader.num_workers > 0:
        util = field_of(signals, "worker_cpu_util_mean")
        return (None if util is None else float(util)), "mean of the DataLoader workers (sampler)"
    main_util = field_of(signals, "main_cpu_util")
    stats = ctx.stats
    if main_util is None or stats is None or stats.data_wait_share <= 0:
        return None, "not known without sampler evidence"
    compute_cores = (1.0 - stats.data_wait_share) * COMPUTE_CORES_ASSUMED
    residual = max(0.0, float(main_util) - compute_cores) / stats.data_wait_share
    return min(residual, 1.0), "main process, less what its compute explains (sampler)"


def workers_needed(load_s: float, compute_s: float) -> int:
    """Workers that hide a per-batch load time behind the compute of one batch (at least 1)."""
    if compute_s <= 0:
        return 1
    return max(1, math.ceil(load_s / compute_s))
