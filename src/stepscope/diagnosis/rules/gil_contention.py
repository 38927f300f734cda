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

That wait for a core is charged as what would come back without the Python threads alone, from the
cores each group used. Where the DataLoader's workers were starved (measured waiting for a core
much of their time per batch) and are charged the same wait, their demand is above the cores they
used: they would take what the thread leaves, and the wait comes back only in part. So with other
processes charged the same wait: a neighbour that held the cores while the training thread waited
takes what the thread leaves whenever it has more to run, which capture does not measure in another
tenant's processes. The price then states its lower end (the GIL's own wait:
:mod:`stepscope.diagnosis.near_tie` checks it against the next cause) and the finding's confidence
stays below the calibration's upper band.

A single-process loader whose fetch blocks in reads releases the GIL at every read, and the other
thread takes it: the fetch's wait to take it back comes with the reads as much as with the thread.
The storage finding is charged it too, and this price states its lower end without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common

if TYPE_CHECKING:  # a run record's: analysing a trace does not load it
    from stepscope.analysis.run.account import ThreadAccountView

#: Off-CPU time for the GIL worth a finding (share of the step; XProf's 5 % "moderate" level).
GIL_NOTED = 0.05
#: The finding's rule confidence when its price is mostly a wait for a core that starved workers are
#: charged as well (below the calibration's upper band), whatever the other findings cost: the
#: input finding beside it may be priced low for the same reason (its workers "keep pace" by their
#: time on a CPU). Blind seed 968692081, w038: a GIL thread at 0.28 of a core beside two workers
#: waiting for a core half their time per batch; the finding priced the thread at 45-51 % of the
#: step (9-12 % the GIL's own wait, the rest the wait for a core) at 96 %, three runs of three, where
#: removing it gained 17 % and removing the costly samples 70 % (the input finding: 0-10 %).
#: Blind seed 926838169, w009: a GIL thread at 0.31 of a core beside a neighbour at 0.57; the thread
#: was charged 51 % (10 % the GIL's own wait, 41 % the wait for a core), the neighbour 46 % for the
#: same wait; removing the thread gained 20 %, the neighbour 51 %.
SHARED_WAIT_CONFIDENCE = 0.6


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
    starved = _starved_workers_share_the_wait(ev, off, waiting)
    neighbours = None if starved is not None else _shares_the_wait(account, "other processes", off, waiting)
    sharers = ("starved DataLoader workers" if starved is not None else
               "other processes" if neighbours is not None else None)  # who else is charged the same wait
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
    low: dict[str, Any] = {}
    if starved is not None:
        summary += (f" Most of that price is the wait for a core, and the DataLoader's workers are charged the same "
                    f"wait: they waited for a core {common.pct(starved)} of their time per batch, so they would "
                    "take the cores this thread leaves, and the wait would come back only in part.")
        evidence.append(Evidence("workers_waiting_core_share", round(starved, 4), common.STARVED_WORKERS, "record", "ratio",
                                 "of the workers' time per batch: they share the wait for a core this price counts"))
    elif neighbours is not None:
        summary += (f" Most of that price is the wait for a core, and other processes are charged "
                    f"{common.pct(neighbours)} of the step for the same wait: a neighbour with more to run takes "
                    "the cores this thread leaves, so the wait would come back only in part.")
        evidence.append(Evidence("other_processes_core_wait_share", round(neighbours, 4), None, "account", "ratio",
                                 "the training thread's wait for a core charged to other processes: they share "
                                 "the wait this price counts"))
    if sharers is not None:
        low = common.lower_end(cost, off, f"the wait for the GIL alone: {sharers} share the wait for a core",
                               evidence, "gil_cost_low", "the training thread off CPU while the other Python "
                               "thread ran")
    elif (after_reads := _after_reads(account)) > 0:
        summary += (f" Of it, {common.pct(after_reads)} of the step is the wait to take the GIL back after the "
                    "single-process loader's blocking reads: fewer or faster reads remove it as well, and the "
                    "loader's finding counts it too.")
        low = common.lower_end(cost, cost - after_reads, "without the waits for the GIL after the loader's reads, "
                               "which fewer or faster reads remove as well", evidence, "gil_cost_low",
                               "the price less the waits for the GIL inside the single-process loader's fetch")
    action = (f"Take `{top.function or top.name}` out of the training process (a multiprocessing.Process, or do "
              "its work between steps), or make it block instead of spinning (a queue.get, an Event.wait, "
              "time.sleep)")
    shared = sharers is not None
    measured = (f"{common.pct(cost)} of the step charged, at least {common.pct(off)} (the wait for the GIL alone)"
                if shared else f"{common.pct(cost)} of the step, measured")
    prescriptions = [Prescription(action, f"{who} held the GIL the training thread needed: {measured}",
                                  expected_gain=round(cost, 4), expected_range=_gain_range(cost, off, shared))]
    confidence = SHARED_WAIT_CONFIDENCE if shared else 0.8
    other = account.phase("other")
    # the time outside the model the thread spent not running: all of "other" the GIL can explain
    other_waiting = other.share * (1.0 - other.on_cpu) if other is not None else None
    return common.finding("thread_account.gil_held", "gil_contention", title, cost, confidence, evidence, prescriptions,
                          summary, claims=("compute", "other", "data_wait") if in_loader else ("compute", "other"),
                          other_waiting=None if other_waiting is None else round(other_waiting, 4), **low)


def _outside_is_moot(cause: Finding, symptom: Finding) -> bool:
    """The time outside the model is the GIL thread's symptom where the training thread spent at
    least half of it not running (asleep on the GIL, or waiting for a core the thread held): time it
    spent on a CPU there is its own code's, which the thread does not explain, and both are shown,
    ranked by their costs (blind seed 1417138115, w012: a GIL thread +45 % and a list growing 4 MiB a
    step in `record_history()` +64 %; "40 % of the step is outside the model: record_history() takes
    80 % of it", the thread on a CPU 86 % of that time, was superseded by the GIL finding at 28 %)."""
    waiting = cause.extra.get("other_waiting")
    return waiting is None or float(waiting) >= 0.5 * symptom.impact


def _after_reads(account: ThreadAccountView) -> float:
    """The share of the step the training thread waited for the GIL inside a single-process loader's
    fetch that also blocked in reads (at least :data:`GIL_NOTED` of the step asleep in them): each
    blocking read releases the GIL, the other thread takes it, and the fetch waits to take it back —
    a wait the reads cause as much as the thread. 0 where the fetch did not both."""
    if account.share_off("io", ("data_wait",)) < GIL_NOTED:
        return 0.0
    return account.share_off("gil", ("data_wait",))


def _starved_workers_share_the_wait(ev: RunEvidence, off: float, waiting: float) -> float | None:
    """The share of their time per batch the DataLoader's workers waited for a core, where that makes
    the finding's price uncertain: the price is mostly the wait for a core (``waiting`` above the
    GIL's own ``off``), the run's own processes are charged at least half of that wait as well (each
    charge is what would come back without that group alone, computed from the cores each used),
    and the workers were starved (:func:`~stepscope.diagnosis.rules._common.starved_workers`). A starved worker's
    demand is above the cores it used: without the thread it takes the cores the thread leaves, and
    the wait comes back only in part. None where that does not hold."""
    if ev.account is None or _shares_the_wait(ev.account, "own processes", off, waiting) is None:
        return None
    return common.starved_workers(ev)


def _gain_range(cost: float, off: float, shared: bool) -> tuple[float, float]:
    """The gain model's range about ``cost``; where others share the wait for a core, down to the
    GIL's own wait ``off`` at least (the price's lower end)."""
    low, high = common.rounded_range(cost, "gil")
    return (min(low, round(off, 4)), high) if shared else (low, high)


def _shares_the_wait(account: ThreadAccountView, who: str, off: float, waiting: float) -> float | None:
    """The share of the step the training thread's wait for a core is charged to ``who`` (a
    :class:`~stepscope.analysis.run.account.CoreTaker`), where that makes the finding's price
    uncertain: the price is mostly the wait for a core (``waiting`` above the GIL's own ``off``) and
    ``who`` is charged at least half of that wait as well (each charge is what would come back
    without that group alone, from the cores each used: the two overlap). None where that does not hold."""
    if waiting <= off:
        return None
    taker = account.taker(who)
    return taker.step_share if taker is not None and taker.step_share >= 0.5 * waiting else None


FAMILY = FamilyEntry(
    "gil_contention", (gil_held,),
    diagnoses="Another Python thread of the training process held the GIL the training thread needed",
    evidence="The thread account: training thread off CPU in the model's phases ≥ 5 % of the step while another "
             "Python thread of the process computed",
    # not launch_overhead: the GIL's wait is off CPU, the operators' host cost on it; both are
    # measured on the same account and rank by their cost
    supersedes=frozenset({"compute", "outside_model"}), supersedes_when=(("outside_model", _outside_is_moot),),
    cpu_based=True)

