"""The diagnosis engine: evidence in, ranked findings out.

:class:`DiagnosisContext` gathers whatever evidence exists for a run — the run record (steps,
DataLoaders, environment), the sampler's :class:`~stepscope.analysis.evidence.MacroSignals` and a
trace's :class:`~stepscope.analysis.evidence.TraceEvidence`, any of them possibly absent — and
:func:`diagnose` runs every rule in :data:`RULES` over it. A rule is a plain function
``(DiagnosisContext) -> Finding | None`` that reads no files and prints nothing.

Findings are ranked by impact (share of step time lost), then severity, then confidence.

After the rules, the *verdict* runs (:func:`stepscope.diagnosis.rules.healthy.verdict`): when no
finding reaches :data:`HEALTHY_BELOW` it adds the ``healthy`` finding, which says what would still
make the run faster, and heads the list (the minor findings follow it). It is the only rule that
sees the other findings.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from stepscope.analysis.evidence import MacroSignals, TraceEvidence
from stepscope.diagnosis.context import DiagnosisStats, build_context, compute_step_stats
from stepscope.diagnosis.findings import Finding, Severity

__all__ = ["DiagnosisContext", "HEALTHY_BELOW", "Rule", "build_context", "diagnose", "rank_findings"]

logger = logging.getLogger(__name__)

Rule = Callable[["DiagnosisContext"], "Finding | None"]


@dataclass(frozen=True)
class DiagnosisContext:
    """All evidence about one run (or one trace). Every part is optional.

    Args:
        record: the :class:`~stepscope.record.run.RunRecord` of the rank being diagnosed.
        signals: the sampler's derived signals for that record.
        trace: evidence from torch.profiler traces.
        ranks: per-rank records when several ranks are known (stragglers, communication).
        stats: steady-state step statistics (:func:`~stepscope.diagnosis.context.build_context`
            fills them; :func:`diagnose` computes them when absent).
    """

    record: Any = None
    signals: MacroSignals | None = None
    trace: TraceEvidence | None = None
    ranks: tuple[Any, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    stats: DiagnosisStats | None = None


def _rules() -> tuple[Rule, ...]:
    from stepscope.diagnosis.rules import RULES

    return RULES


def rank_findings(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda item: (-item.impact, -int(item.severity), -item.confidence, item.rule_id))


#: A run whose findings all stay below this severity gets the healthy verdict.
HEALTHY_BELOW = Severity.MEDIUM


def diagnose(context: DiagnosisContext, rules: tuple[Rule, ...] | None = None,
             verdict: bool = True) -> list[Finding]:
    """Run every rule and return the findings ranked, most costly first.

    A rule that raises is a bug in stepscope, not in the user's run: it is logged and skipped so
    one broken rule cannot hide the others' findings.

    Args:
        context: the evidence (see :func:`~stepscope.diagnosis.context.build_context`).
        rules: the rules to run (default: :data:`stepscope.diagnosis.rules.RULES`).
        verdict: add the healthy verdict when nothing reaches :data:`HEALTHY_BELOW`.
    """
    if context.stats is None and context.record is not None:
        context = replace(context, stats=compute_step_stats(context.record))
    findings = []
    for rule in _rules() if rules is None else rules:
        try:
            finding = rule(context)
        except Exception:  # noqa: BLE001 - isolate rule bugs, see docstring
            logger.exception("diagnosis rule %s failed", getattr(rule, "__name__", rule))
            continue
        if finding is not None:
            findings.append(finding)
    if verdict and not any(item.severity >= HEALTHY_BELOW for item in findings):
        from stepscope.diagnosis.rules.healthy import verdict as healthy_verdict

        try:
            finding = healthy_verdict(context, tuple(findings))
        except Exception:  # noqa: BLE001 - same isolation as the rules
            logger.exception("diagnosis verdict failed")
            finding = None
        if finding is not None:
            return [finding, *rank_findings(findings)]  # the verdict heads a healthy run
    return rank_findings(findings)
