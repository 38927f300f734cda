"""Foreign load: processes outside the job used a material share of the machine during the run.

On a shared machine this is the first thing a user needs to know: every CPU-based number of the run
(data-wait shares, loader CPU, MFU against the machine's peak) was measured on a machine somebody
else was also using. Evidence: the sampler's whole-machine CPU less what the training tree (main
process and DataLoader workers) used, plus the time a virtual machine's hypervisor gave other
guests (steal: cores the run did not get), and the busiest processes outside the tree by pid.

A neighbour can also cost the run in bursts too short to move the mean: every second or so it takes
the cores for a fraction of a second and one step stalls. The evidence bundle's periodic-stall
analysis tells those stalls apart from the loop's own (a checkpoint, an evaluation): the stalled
steps ran beside markedly more CPU outside the training tree, enough to account for the stall
(:mod:`stepscope.analysis.run.stalls`). :func:`neighbour_bursts` reports them with their measured
cost; the periodic-stall rule then stands down.

The cost of the whole-run finding is what the others measurably took from the step: the training
thread's wait for a core and its intra-op threads' (the kernel's run-queue delay, from the thread
account) charged to them by the part of the excess load that would go without them
(:mod:`stepscope.analysis.run.account`); the loaders' losses are not in it. The intra-op threads'
wait came back in full beside an always-busy neighbour and only in part beside one that sleeps
between bursts, so the cost states its lower end (``extra["impact_low"]``): the training thread's
own wait in the model's phases, charged the same way. A verdict whose lower end does not clear the
next cause is a near tie (:mod:`stepscope.diagnosis.near_tie`). Without the account it ranks by an
explicit estimate — the share of the cores the others held — and says so. A low MFU beside such a neighbour is its symptom (the family supersedes
``compute``). The engine also lowers the confidence of the CPU-based findings of such a run.
"""

from __future__ import annotations

from stepscope.analysis.bundle import RunEvidence
from stepscope.analysis.host_cpu import STEAL_SHOWN
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity, severity_for_impact
from stepscope.diagnosis.rules import _common as common

#: Share of all cores used by other processes that is worth telling (a quarter of the machine).
FOREIGN_NOTED = 0.25
#: Above this share others hold half the machine: CPU MFU is not trusted at all.
FOREIGN_HIGH = 0.5
#: Hypervisor steal named in the finding (the rest of the share is other processes).
STEAL_NAMED = STEAL_SHOWN
#: Processes named in the finding.
SHOWN_PROCESSES = 3
#: The training thread's wait for a core charged to other processes, worth a finding on its own
#: (share of the step; XProf's 5 % "moderate" level).
COST_NOTED = 0.05


def others_on_the_machine(ev: RunEvidence) -> Finding | None:
    foreign = ev.foreign
    cost = foreign.step_cost if foreign is not None else None
    if foreign is None or (foreign.cpu_share < FOREIGN_NOTED and (cost is None or cost < COST_NOTED)):
        return None
    cores = ev.cpu_count or 0
    named = foreign.processes[:SHOWN_PROCESSES]
    evidence = [Evidence("foreign_cpu_share", round(foreign.cpu_share, 3), FOREIGN_NOTED, "sampler", "ratio",
                         "all cores, less the training tree")]
    for process in named:
        evidence.append(Evidence("foreign_process_cpu", round(process.cpu_util, 2), None, "sampler", "cores",
                                 f"pid {process.pid} ({process.name})"))
    parts = [f"pid {item.pid} {item.name} {item.cpu_util:.0%} of a core" for item in named]
    if foreign.steal_share >= STEAL_NAMED:
        evidence.append(Evidence("steal_share", round(foreign.steal_share, 3), None, "sampler", "ratio",
                                 "all cores: time the hypervisor gave other virtual machines"))
        parts.append(f"other virtual machines {foreign.steal_share:.0%} (hypervisor steal)")
    who = ", ".join(parts)
    summary = ("The run shared the machine: its CPU-based measurements (data wait, loader CPU, MFU) "
               "describe a crowded machine, and their findings carry lower confidence.")
    if cost is not None:
        # measured: the training thread's wait for a core, charged to them by their CPU over the window
        evidence.insert(0, Evidence("foreign_step_cost", round(cost, 4), COST_NOTED, "account", "ratio",
                                    "training thread waiting for a core, charged to other processes by CPU"))
        peers = ev.account.peer_waiting if ev.account is not None else 0.0
        threads = "the training thread and its intra-op threads" if peers >= 0.005 else "the training thread"
        title = (f"Other processes took {common.pct(cost)} of the step: {threads} waited for cores "
                 f"they held ({foreign.cpu_share:.0%} of the {cores or '?'} cores" + (f": {who})" if who else ")"))
        summary += (f" {threads[0].upper() + threads[1:]} waited for a core while they ran (the kernel's run-queue "
                    f"delay, measured on sampled steps): {common.pct(cost)} of the step is charged to them, the "
                    "wait that would go without them; DataLoader workers' losses come on top.")
    else:
        title = (f"Other processes used {foreign.cpu_share:.0%} of the {cores or '?'} cores during the run"
                 + (f" ({who})" if who else ""))
    prescriptions = [Prescription(
        "Stop or move the other processes off the training cores (taskset/cgroups, a dedicated node), or "
        "measure on a quiet machine" + (f"; check what pid {named[0].pid} is" if named else ""),
        "numbers taken beside a busy neighbour move with the neighbour's load"
        + (f"; the wait for a core they caused is {common.pct(cost)} of the step" if cost is not None else ""),
        expected_gain=round(cost, 4) if cost is not None else None,
        expected_range=common.rounded_range(cost, "foreign") if cost is not None else None)]
    if cost is not None:
        # the lower end: the training thread's own wait in the model's phases
        low = common.lower_end(
            cost, ev.account.charged_model_wait(ev.account.taker("other processes")) if ev.account is not None else None,
            "without the intra-op threads' wait and the wait outside the model's phases, which come back only in part",
            evidence, "foreign_step_cost_low",
            "the training thread's own wait for a core in forward, backward and optimizer, charged to other processes")
        return common.finding(
            "foreign_load.other_processes", "foreign_load", title, cost, 0.8, evidence, prescriptions, summary,
            severity=max(severity_for_impact(cost), Severity.LOW), **low)
    return common.finding(
        "foreign_load.other_processes", "foreign_load", title, foreign.cpu_share, 0.8, evidence,
        prescriptions, summary, severity=Severity.HIGH if foreign.cpu_share >= FOREIGN_HIGH else Severity.MEDIUM,
        impact_basis="estimate: the share of the machine's cores that other processes held",
    )


def neighbour_bursts(ev: RunEvidence) -> Finding | None:
    stall = ev.stall
    if stall is None or not stall.neighbour or ev.steady is None:
        return None
    from stepscope.analysis.run.stalls import MIN_COST  # loaded with the stall (a run record's)

    if stall.cost_share < MIN_COST:
        return None
    named = ev.foreign.processes[:SHOWN_PROCESSES] if ev.foreign is not None else ()
    every = f"every ~{stall.wall_period_s:.1f} s" if stall.wall_period_s else f"every ~{stall.period_steps} steps"
    evidence = [
        Evidence("outside_cores_stalled", stall.outside_cores_stalled, None, "sampler", "cores",
                 "other processes + steal, in the stalled steps"),
        Evidence("outside_cores_normal", stall.outside_cores_normal, None, "sampler", "cores",
                 "other processes + steal, in the other steps (median)"),
        Evidence("neighbour_share_of_stall", stall.neighbour_share, None, "sampler", "ratio",
                 "the stalls' lost time the outside CPU accounts for"),
        Evidence("stall_cost_share", round(stall.cost_share, 4), MIN_COST, "steps", "ratio",
                 f"{stall.count} stalls of ~{common.ms(stall.stall_s)} in {stall.phase.replace('_', ' ')}"),
    ]
    if stall.wall_period_s:
        evidence.append(Evidence("burst_period_s", round(stall.wall_period_s, 3), None, "steps", "s",
                                 f"median time between stalls (~{stall.period_steps} steps)"))
    for process in named:
        evidence.append(Evidence("foreign_process_cpu", round(process.cpu_util, 2), None, "sampler", "cores",
                                 f"pid {process.pid} ({process.name})"))
    who = ", ".join(f"pid {item.pid} {item.name}" for item in named)
    title = (f"Other processes used the cores in bursts {every}: a step stalls ~{common.ms(stall.stall_s)} "
             f"each time ({common.pct(stall.cost_share)} of the run)")
    summary = (f"{stall.count} steps stalled by ~{common.ms(stall.stall_s)}, {every}, while "
               f"~{stall.outside_cores_stalled:.1f} cores were busy outside the training tree "
               f"(~{stall.outside_cores_normal:.1f} in the other steps)"
               + (f"; the busiest neighbours: {who}" if who else "")
               + ". The loop itself does not stall: a checkpoint or logging change would not help.")
    prescriptions = [Prescription(
        f"Find what runs {every} beside the job" + (f" (check {who})" if who else "")
        + " and move it off the training cores (taskset/cgroups), or train on a dedicated node",
        f"~{common.ms(stall.stall_s)} lost {every} to CPU taken outside the training tree")]
    return common.finding(
        "foreign_load.neighbour_bursts", "foreign_load", title, stall.cost_share, 0.7, evidence,
        prescriptions, summary, stall_steps=list(stall.slow_steps[:50]), period_steps=stall.period_steps)


FAMILY = FamilyEntry(
    "foreign_load", (others_on_the_machine, neighbour_bursts,),
    diagnoses="Other processes (or the hypervisor) took the cores the run needed",
    evidence="Processes outside the job plus steal ≥ 25 % of all cores; a periodic stall whose steps ran beside bursts of outside CPU that explain it",
    supersedes=frozenset({"compute"}))
