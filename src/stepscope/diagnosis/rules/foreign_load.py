"""Foreign load: processes outside the job used a material share of the machine during the run.

On a shared machine this is the first thing a user needs to know: every CPU-based number of the run
(data-wait shares, loader CPU, MFU against the machine's peak) was measured on a machine somebody
else was also using. Evidence: the sampler's whole-machine CPU less what the training tree (main
process and DataLoader workers) used, and the busiest processes outside the tree by pid.

The cost is not a measured share of the step (what the run would gain on a quiet machine is not
observed), so the finding ranks by an explicit estimate — the share of the cores the others held —
and says so. The engine also lowers the confidence of the CPU-based findings of such a run.
"""

from __future__ import annotations

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity
from stepscope.diagnosis.rules import _common as common

#: Share of all cores used by other processes that is worth telling (a quarter of the machine).
FOREIGN_NOTED = 0.25
#: Above this share others hold half the machine: CPU MFU is not trusted at all.
FOREIGN_HIGH = 0.5
#: Processes named in the finding.
SHOWN_PROCESSES = 3


def others_on_the_machine(ev: RunEvidence) -> Finding | None:
    foreign = ev.foreign
    if foreign is None or foreign.cpu_share < FOREIGN_NOTED:
        return None
    cores = ev.cpu_count or 0
    named = foreign.processes[:SHOWN_PROCESSES]
    evidence = [Evidence("foreign_cpu_share", round(foreign.cpu_share, 3), FOREIGN_NOTED, "sampler", "ratio",
                         "all cores, less the training tree")]
    for process in named:
        evidence.append(Evidence("foreign_process_cpu", round(process.cpu_util, 2), None, "sampler", "cores",
                                 f"pid {process.pid} ({process.name})"))
    who = ", ".join(f"pid {item.pid} {item.name} {item.cpu_util:.0%} of a core" for item in named)
    title = (f"Other processes used {foreign.cpu_share:.0%} of the {cores or '?'} cores during the run"
             + (f" ({who})" if who else ""))
    summary = ("The run shared the machine: its CPU-based measurements (data wait, loader CPU, MFU) "
               "describe a crowded machine, and their findings carry lower confidence.")
    prescriptions = [Prescription(
        "Measure on a quiet machine, or reserve the cores (taskset/cgroups, a dedicated node)"
        + (f"; check what pid {named[0].pid} is" if named else ""),
        "numbers taken beside a busy neighbour move with the neighbour's load")]
    return common.finding(
        "foreign_load.other_processes", "foreign_load", title, foreign.cpu_share, 0.8, evidence,
        prescriptions, summary, severity=Severity.HIGH if foreign.cpu_share >= FOREIGN_HIGH else Severity.MEDIUM,
        impact_basis="estimate: the share of the machine's cores that other processes held",
    )
