"""GIL contention: a Python thread of the training process held the GIL the training thread needed.

Evidence: the thread account (:mod:`stepscope.analysis.run.account`), measured on sampled steps and
applied to every steady step's phase times. :func:`gil_held` fires when the training thread was off
CPU in the model's phases (or between them) while another Python thread of the process computed:
the GIL's signature (a thread waiting for the GIL sleeps on a condition variable, off CPU, at an
ordinary bytecode). Where capture sampled what the thread slept in, only the time asleep on a lock
counts (a sleep or a read is not the GIL's), and a single-process loader's fetch asleep on a lock
counts too (its samples' Python runs in the training thread). Its cost is that off-CPU time — at most the share of the step the other Python
threads ran, since only a running thread holds the GIL — plus the wait for a core the process's
Python threads caused, both measured; the fix is the other thread's, named with its function.
"""

from __future__ import annotations

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common

#: Off-CPU time for the GIL worth a finding (share of the step; XProf's 5 % "moderate" level).
GIL_NOTED = 0.05


def gil_held(ev: RunEvidence) -> Finding | None:
    account = ev.account
    if account is None or not account.python_threads:
        return None
    off = account.gil_wait  # at most what the other Python threads ran: a slow rank's sleep is not the GIL's
    # the wait for a core the process's threads caused (the training thread's and, at a parallel
    # operator's barrier, its intra-op threads'), the Python threads' part of it
    waiting = account.python_core_wait
    cost = off + waiting
    if cost < GIL_NOTED:
        return None
    top = account.python_threads[0]
    who = f"thread `{top.name}`" + (f" in `{top.function}`" if top.function else "")
    lines = common.account_lines(account, ("gil",))
    evidence = [Evidence("gil_wait_share", round(off, 4), GIL_NOTED, "account", "ratio",
                         "training thread off CPU in the model's phases while another Python thread ran"),
                Evidence("python_thread_cores", round(top.cores, 3), None, "account", "cores",
                         f"{who}: CPU over the run"),
                *common.account_evidence(account)]
    if waiting > 0:
        evidence.insert(1, Evidence("own_thread_core_wait_share", round(waiting, 4), None, "account", "ratio",
                                    "waiting for a core the process's Python threads held"))
    title = (f"Another Python thread held the GIL: the training thread waited {common.pct(cost)} of the step "
             f"({who})" if off >= waiting else
             f"Another Python thread took the cores the step needed: the training thread waited {common.pct(cost)} "
             f"of the step ({who})")
    loading = account.phase("data_wait")
    in_loader = loading is not None and loading.off_part("gil") > 0  # only where sampled
    where = ("in the model's phases and asleep on a lock in the single-process loader's fetch — not communicating —"
             if in_loader else "in the model's phases — not loading, not communicating —")
    slept = [common.slept_in(item) for item in account.phases if item.off_split and item.off_part("gil") > 0]
    if slept:
        evidence.append(Evidence("gil_lock_samples", round(off, 4), None, "account", "ratio",
                                 f"what the training thread slept in: {slept[0]}"))
    summary = (f"The training thread was off CPU {where} while "
               f"{who} used {top.cores:.2f} of a core: a pure-Python thread takes the GIL for a switch interval "
               f"({common.ms(0.005)}) every time the training thread releases it. "
               + "; ".join(lines[:3]) + ".")
    action = (f"Take `{top.function or top.name}` out of the training process (a multiprocessing.Process, or do "
              "its work between steps), or make it block instead of spinning (a queue.get, an Event.wait, "
              "time.sleep)")
    prescriptions = [Prescription(action, f"{who} held the GIL the training thread needed: "
                                          f"{common.pct(cost)} of the step, measured", expected_gain=round(cost, 4))]
    return common.finding("thread_account.gil_held", "gil_contention", title, cost, 0.8, evidence, prescriptions,
                          summary, claims=("compute", "other", "data_wait") if in_loader else ("compute", "other"))


FAMILY = FamilyEntry(
    "gil_contention", (gil_held,),
    diagnoses="Another Python thread of the training process held the GIL the training thread needed",
    evidence="The thread account: training thread off CPU in the model's phases ≥ 5 % of the step while another "
             "Python thread of the process computed",
    # not launch_overhead: the GIL's wait is off CPU, the operators' host cost on it; both are
    # measured on the same account and rank by their cost
    supersedes=frozenset({"compute", "outside_model"}), cpu_based=True)

