"""The healthy verdict: nothing costs enough to report, and what would still make it faster.

Not a rule of :data:`~stepscope.diagnosis.rules.RULES`: the engine calls :func:`verdict` after the
rules when no finding reaches medium severity, and it sees those minor findings. The verdict
states where the step goes (compute share, MFU when known) and the generic levers that remain:
mixed precision on GPUs, ``torch.compile``, a larger batch.
"""

from __future__ import annotations

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity
from stepscope.diagnosis.rules import _common as common

#: Below this many steady steps the verdict says the evidence is thin.
FEW_STEPS = 5


def verdict(ev: RunEvidence, findings: tuple[Finding, ...] = ()) -> Finding | None:
    stats = ev.steady
    if stats is None:
        return None
    evidence = [Evidence("compute_share", round(stats.compute_share, 4), None, "steps", "ratio",
                         "forward + backward + optimizer"),
                Evidence("data_wait_share", round(stats.data_wait_share, 4), common.INPUT_MODERATE, "steps",
                         "ratio", "steady state"),
                Evidence("step_time_s", round(stats.step_time_s, 6), None, "steps", "s", "median steady step")]
    measured = ev.mfu
    if measured is not None:
        evidence.append(Evidence("mfu", round(measured.value, 4), None, "record", "ratio",
                                 f"{measured.peak_source}; range {common.mfu_text(measured)}"))
    prescriptions = common.precision_levers(ev, measured)
    if ev.compile is None:  # a compiled model is not told to compile
        prescriptions.append(Prescription("model = torch.compile(model)",
                                          "fuses elementwise work and removes Python overhead"))
    prescriptions.append(Prescription("A larger batch if memory allows (scale the learning rate)",
                                      "more work per step amortises fixed per-step costs"))
    bound = "compute-bound" if stats.compute_share >= 0.5 else "not dominated by one stage"
    title = f"Healthy: the step is {bound} ({common.pct(stats.compute_share)} in the model)"
    if measured is not None:
        title += f", MFU {common.pct(measured.value)}"
    summary = "No bottleneck costs more than 5% of the step."
    if findings:
        summary += " Minor: " + "; ".join(item.title for item in findings[:3]) + "."
    confidence = 0.8 if stats.steady_count >= FEW_STEPS else 0.4
    return common.finding("healthy.verdict", "healthy", title, 0.0, confidence, evidence, prescriptions,
                          summary, severity=Severity.INFO)


FAMILY = FamilyEntry(
    "healthy", (),
    diagnoses="Nothing costs enough to report: where the step goes, and the levers left",
    evidence="No finding of medium severity or more, the diagnosis complete; compute share, MFU",
    verdict=verdict)
