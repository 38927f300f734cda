"""Unexplained: the training thread was off CPU for a large share of the step in the model's phases and
no measured cause covers it — not loading, not a collective, not the device, not another Python
thread of the process. (Off CPU outside the model — a checkpoint's write, a log's flush — is the
periodic-stall and outside-the-model families' to name, with their code.)

The report then says so with the thread's account (:mod:`stepscope.analysis.run.account`) instead of
naming the nearest family, and names the tool that shows what the thread blocks on. Its finding
supersedes the families whose evidence such a run would mimic (a long forward at low MFU is not
low efficiency when the thread was not computing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity
from stepscope.diagnosis.rules import _common as common

if TYPE_CHECKING:  # a run record's thread account only
    from stepscope.analysis.run.account import ThreadAccountView

#: Off-CPU time no measured cause explains, above which the report says so (share of the step).
UNEXPLAINED_NOTED = 0.2


def unexplained(ev: RunEvidence) -> Finding | None:
    account = ev.account
    if account is None:
        return None
    off = account.unexplained
    if off < UNEXPLAINED_NOTED:
        return None
    lines = common.account_lines(account, ("unexplained",))
    pid = ev.record.meta.pid if ev.record is not None else None
    evidence = [Evidence("unexplained_off_cpu_share", round(off, 4), UNEXPLAINED_NOTED, "account", "ratio",
                         "training thread off CPU in the model's phases, no measured cause"),
                *common.account_evidence(account)]
    title = (f"Not explained: the training thread was off CPU {common.pct(off)} of the step in the model's "
             "phases, and no measured cause covers it")
    summary = ("The account of the training thread: " + "; ".join(lines[:4]) + ". It was neither computing nor "
               "waiting for a core, nor for the DataLoader, a peer, the device or another Python thread that "
               "stepscope saw: a lock, a sleep, a blocking read or a native library's wait. No family explains it, "
               "so none is named.")
    top, blocked_in = _where_it_blocks(ev, account, evidence)
    if blocked_in:
        summary += (" The stack samples (wall clock: a sample lands where the thread waits) put the model's "
                    f"phases' time in {blocked_in}.")
    prescriptions = [Prescription(
        f"See what the training thread blocks on while it runs: py-spy dump --native --pid {pid or '<pid>'} "
        "(a few times), or stepscope run --trace for an operator timeline",
        "the off-CPU time is measured; its cause is not")]
    if blocked_in:
        prescriptions.insert(0, Prescription(
            f"Look at what {top} waits for (a lock, a sleep, a blocking read, a native call)",
            f"the stack samples put the model's phases' time there: {blocked_in}"))
    return common.finding("thread_account.unexplained", "unexplained", title, off, 0.5, evidence, prescriptions,
                          summary, severity=Severity.MEDIUM if off < 0.5 else Severity.HIGH, claims=("compute", "other"))


#: A code location owning at least this share of a model phase (stack samples) is named.
NAMED_FROM = 0.2


def _where_it_blocks(ev: RunEvidence, account: ThreadAccountView, evidence: list[Evidence]) -> tuple[str, str]:
    """The user code that owns the model phase with the most unexplained off-CPU time, from the
    wall-clock stack samples: its top line's label and ``"model.py:40 forward() 85% of forward"``;
    empty without samples."""
    phases = sorted((item for item in account.phases
                     if item.off_part("unexplained") > 0 and item.phase in ("forward", "backward", "optimizer")),
                    key=lambda item: -item.share * item.off_cpu * item.off_part("unexplained"))
    for phase in phases[:1]:
        named = [item for item in common.code_locations(ev, phase.phase) if item.share_of_phase >= NAMED_FROM]
        for location in named[:3]:
            evidence.append(Evidence("code_location", location.label, None, "stacks", "code",
                                     f"{common.pct(location.share_of_phase)} of {phase.phase}"))
        if named:
            return named[0].label, ", ".join(f"{item.label} {common.pct(item.share_of_phase)} of {phase.phase}"
                                             for item in named[:2])
    return "", ""


FAMILY = FamilyEntry(
    "unexplained", (unexplained,),
    diagnoses="The training thread was off CPU and no measured cause explains it: said so, with its account",
    evidence="The thread account: off CPU ≥ 20 % of the step in the model's phases, not waiting for the device, "
             "with no Python thread of the process busy",
    supersedes=frozenset({"compute", "launch_overhead"}), cpu_based=True)
