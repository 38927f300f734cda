"""Communication: collectives take a large, poorly overlapped share of the step.

Evidence: a trace's communication share and the share of it overlapped by computation (the
TensorBoard plugin's distributed view, HTA's comm/comp overlap). The exposed part —
communication × (1 − overlap) — is the impact.
"""

from __future__ import annotations

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common

#: The TensorBoard plugin recommends acting above 10 % of the step in communication.
COMM_MODERATE = 0.10
#: XProf's smart suggestion "CollectiveBound" fires at 30 %.
COMM_HIGH = 0.30


def exposed_collectives(ev: RunEvidence) -> Finding | None:
    share = common.field_of(ev.trace, "communication_share")
    if share is None or share < COMM_MODERATE:
        return None
    overlap = common.field_of(ev.trace, "comm_overlap")
    exposed = share * (1.0 - overlap) if overlap is not None else share
    evidence = [Evidence("communication_share", round(share, 4), COMM_MODERATE, "trace", "ratio", "per step")]
    if overlap is not None:
        evidence.append(Evidence("comm_overlap", round(overlap, 4), None, "trace", "ratio",
                                 "communication overlapped by compute"))
    prescriptions = [
        Prescription("Overlap gradients with backward: DDP(bucket_cap_mb=...) tuned, "
                     "gradient_as_bucket_view=True; FSDP backward_prefetch",
                     f"only {overlap:.0%} of communication overlaps compute" if overlap is not None
                     else "communication is on the critical path"),
        Prescription("Communicate less often or less: gradient accumulation with model.no_sync(), "
                     "bf16 gradients or a compression hook (PowerSGD)",
                     f"communication is {common.pct(share)} of the step"),
        Prescription("Check the interconnect: NCCL over NVLink/InfiniBand, not sockets "
                     "(NCCL_DEBUG=INFO shows the transport)"),
    ]
    level = "high" if share >= COMM_HIGH else "moderate"
    return common.finding("communication.exposed_collectives", "communication",
                          f"Collectives take {common.pct(share)} of the step ({level}), "
                          f"{common.pct(exposed)} exposed", exposed, 0.75, evidence, prescriptions,
                          "Ranks wait for collectives that computation does not hide.")
