"""The DataLoader's pace in the diagnosis: what the loader's own pace leaves to the other findings.

Where the workers' own time per batch was measured (:mod:`stepscope.analysis.run.loader_floor`), a
finding that only shortens the training thread's own work is capped at what lies above the
loader's floor; a loader finding is capped at the part of the data wait the workers' pace explains,
and the rest of a noted wait is said to be the training process's own time inside ``next()``.
Without that measurement, where idle workers set the pace (:func:`loader_pace`), such a finding is
scaled by the share of the time in steps that did not wait for data. :func:`paced_by_the_loader`
is the engine's pass (see ``docs/diagnosis.md``).
"""

from __future__ import annotations

from dataclasses import replace

from stepscope.analysis.bundle import RunEvidence
from stepscope.analysis.run.loader_floor import LoaderFloor
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, lowered_severity
from stepscope.diagnosis.rules._common import finding as finding_of, lower_end, pct, restart_wait_in_next


def loader_pace(evidence: RunEvidence) -> float | None:
    """The share of the steady time in steps where the DataLoader's workers set the pace, when they
    were measured idle (below :data:`~stepscope.diagnosis.rules._common.LOADER_CPU_BUSY` of a core:
    waiting on storage, a remote read, a sleep) while the step waited for data at least
    :data:`PACED_WAIT_FROM` of its time, the training thread blocked on their queue for at least
    :data:`PACED_OFF_CPU` of that wait (its account); else None.

    Idle workers produce a batch in a time the training thread's CPU does not change: in a step that
    waited for one, work taken off the training thread becomes more waiting, not a shorter step
    (the blind evaluation's slow reads beside tiny operators: the model's overhead was 40 % of the
    step, removing it gained 10 % and 7 %, removing the slow reads 52 % and 21 %)."""
    from stepscope.diagnosis.rules._common import LOADER_CPU_BUSY, loader_cpu_util

    steady = evidence.steady
    loader = evidence.main_loader
    if evidence.record is None or steady is None or loader is None or loader.num_workers < 1:
        return None
    util, _ = loader_cpu_util(evidence)
    if util is None or util >= LOADER_CPU_BUSY or steady.fetch_wait_share < PACED_WAIT_FROM:
        return None
    # the wait itself must be the workers': the training thread blocked on their queue, not on CPU
    # or runnable inside next() (receiving batches while its own threads or a Python thread hold the
    # cores: there the blind evaluation's GIL-holding threads gained 52-59 % when removed)
    wait = evidence.account.phase("data_wait") if evidence.account is not None else None
    if wait is None or wait.off_cause != "workers" or wait.off_cpu < PACED_OFF_CPU:
        return None
    return 1.0 - steady.unwaited_share


#: Steady data wait (share of the step) from which idle workers are taken to set the pace.
PACED_WAIT_FROM = 0.1
#: Share of the data wait the training thread must spend blocked on the workers' queue.
PACED_OFF_CPU = 0.8
#: The paced estimate's measured error: on the 6 of 200 blind-evaluation runs it applies to (five
#: seeds), against the gain measured by removing the finding's cause, it was off by 1-15 points of
#: the step (mean 7; low on 4 of 6), the unscaled cost by 3-30 (mean 16; high on 5 of 6)
#: (BENCHMARKS.md, "Blind evaluation").
PACED_ERROR = "on 6 blind workloads within 15 points of the gain measured by removing the cause, mean 7"
#: The parts of the step whose findings shorten the training thread's own work.
OWN_WORK_CLAIMS = frozenset({"compute", "other"})
#: The families whose findings are about the cores the run waited for (other processes, too many
#: threads). What removing their cause gives back is waits for a core: the training thread's, and
#: the workers' — which the loader's floor leaves out — so their whole-step claims are capped by the
#: floor as the training thread's own work is (blind w021 of seed 1699417522: "other processes took
#: 49 %" at a floor 76 % of the step; removing the neighbour gained +16 %, and the slow reads +75 %).
CORE_WAIT_FAMILIES = frozenset({"foreign_load", "cpu_oversubscription"})


def _under_the_floor_only(item: Finding) -> bool:
    """Whether ``item``'s cause, removed, leaves the workers' own time per batch as it was: a finding
    that shortens the training thread's own work, or the cores the run waited for."""
    claims = set(item.claims)
    return bool(claims) and (claims <= OWN_WORK_CLAIMS or (item.family in CORE_WAIT_FAMILIES and claims == {"step"}))


def paced_by_the_loader(findings: list[Finding], evidence: RunEvidence) -> list[Finding]:
    """Where the workers' own time per batch was measured (:mod:`stepscope.analysis.run.loader_floor`),
    a finding that shortens the training thread's own work saves at most what lies above the
    loader's floor (``capped_by_loader``). Without that measurement, where idle workers set the pace
    (:func:`loader_pace`), such a finding saves time only in the steps that did not wait for data:
    its impact is scaled by their share of the time, and it says so (``paced_by_loader``)."""
    if evidence.loader_floor is not None:
        out = [_under_the_floor(item, evidence.loader_floor) if item.claims != ("data_wait",)
               else _keeping_pace(item, evidence) for item in findings]
        remainder = _wait_not_the_workers(out, evidence)
        return out if remainder is None else [*out, remainder]
    paced = loader_pace(evidence)
    if paced is None or paced <= 0:
        return findings
    out = []
    for item in findings:
        if item.impact <= 0 or not item.claims or not set(item.claims) <= OWN_WORK_CLAIMS:
            out.append(item)
            continue
        impact = round(item.impact * (1.0 - paced), 4)
        note = Evidence("paced_by_loader", round(paced, 4), None, "steps", "ratio",
                        "of the steady time is in steps that waited for data while the workers were idle: "
                        "there, less work in the training thread is more waiting, not a shorter step")
        basis = "estimate: its measured cost" if item.impact_measured else item.impact_basis
        basis += (f" × the {1.0 - paced:.0%} of the time in steps that did not wait for idle DataLoader workers "
                  f"({PACED_ERROR})")
        out.append(replace(item, impact=impact, severity=lowered_severity(item, impact), impact_basis=basis,
                           evidence=(*item.evidence, note),
                           extra={**item.extra, "paced_by_loader": round(paced, 4),
                                  "impact_unpaced": item.impact}))
    return out


def _floor_note(floor: LoaderFloor) -> Evidence:
    """The evidence item of the loader's floor, as every finding it changes shows it."""
    return Evidence("loader_floor_share", round(floor.share, 4), None, "record", "ratio",
                    f"of the step is the DataLoader's own pace: {floor.describe()}, measured in the workers")


def _under_the_floor(item: Finding, floor: LoaderFloor) -> Finding:
    """``item`` with its impact capped by the loader's floor when it shortens only the training
    thread's own work or its waits for a core (:func:`_under_the_floor_only`) and claims more than
    lies above that floor; its prescriptions' expected gains with it."""
    if not _under_the_floor_only(item):
        return item
    less = "fewer waits for a core" if item.family in CORE_WAIT_FAMILIES else "less work in the training thread"
    return capped_at_floor(item, floor, "The DataLoader", less)


def capped_at_floor(item: Finding, floor: LoaderFloor, whose: str, less: str) -> Finding:
    """``item`` with its impact capped at what lies above ``floor`` (``whose`` DataLoader's: "The
    DataLoader", "Rank 1's DataLoader"), said in its title, summary, evidence and prescriptions, and
    the cap's lower end (:attr:`LoaderFloor.ceiling_low`) stated for the near-tie check; unchanged
    where it claims no more than that."""
    ceiling = floor.ceiling
    if item.impact <= ceiling:
        return item
    impact = round(ceiling, 4)
    owner = whose[0].lower() + whose[1:]
    summary = (f" {whose} sets a floor of {floor.floor_s * 1e3:.3g} ms under the {floor.step_s * 1e3:.3g} ms "
               f"step ({floor.describe()}; its waits for a core not counted): {less} "
               f"can save at most {pct(ceiling)} before it waits for data instead; faster loading lowers that floor.")
    basis = item.impact_basis if item.impact_measured else (
        f"{item.impact_basis}, at most the {pct(ceiling)} of the step above {owner}'s measured pace")
    title = f"{item.title} (at most {pct(ceiling)} to gain: {owner} sets the pace)"
    evidence = [*item.evidence, _floor_note(floor)]
    extra = {**item.extra, "capped_by_loader": round(ceiling, 4), "impact_uncapped": item.impact}
    stated = item.extra.get("impact_low")
    if not isinstance(stated, dict) or float(stated["value"]) > round(floor.ceiling_low, 4):
        # the cap is a bound, not a measured cost: its lower end goes to the near-tie check
        extra.update(lower_end(impact, floor.ceiling_low, "what lies above the DataLoader's floor less the steps' "
                               "spread about that pace", evidence, "loader_ceiling_low",
                               "the part above the DataLoader's floor less the steps' spread about it", "record"))
    return replace(item, title=title, impact=impact, severity=lowered_severity(item, impact), impact_basis=basis,
                   summary=item.summary + summary, evidence=tuple(evidence),
                   prescriptions=tuple(_gain_under(p, impact) for p in item.prescriptions), extra=extra)


def _gain_under(prescription: Prescription, ceiling: float) -> Prescription:
    """``prescription`` with its expected gain and range at most ``ceiling`` (the loader's floor
    bounds what any change to the training thread saves; a gain measured in trials is kept). A
    range whose low end the floor cuts off becomes "up to the ceiling": the model's low end assumed
    a step that could shrink by it, and the steps still wait near the floor (w021 of seed 1699417522:
    the neighbour's range 23.7-60.7 %, a ceiling of 23.6 %, +16 % gained)."""
    gain, span = prescription.expected_gain, prescription.expected_range
    if (gain is None or gain <= ceiling) and (span is None or span[1] <= ceiling):
        return prescription
    low = None if span is None else (span[0] if span[0] < ceiling else 0.0)
    return replace(prescription, expected_gain=None if gain is None else min(gain, ceiling),
                   expected_range=None if low is None else (low, ceiling))


#: The families whose findings are about the workers' pace (their prescriptions: more workers,
#: cheaper samples, faster reads), not the training process's own time inside ``next()``.
PACED_FAMILIES = frozenset({"input_pipeline", "storage_io"})


#: How much of a loader finding's cost the workers' pace must leave unexplained (share of the step)
#: before the finding is capped: less is within the spread of the steps that the pace allows for.
KEEPING_PACE_FROM = 0.05


def _keeping_pace(item: Finding, evidence: RunEvidence) -> Finding:
    """``item`` with its impact capped by the part of the data wait the workers' measured pace
    explains (:meth:`LoaderFloor.paced_wait`), when it is about that pace and claims more."""
    floor, steady = evidence.loader_floor, evidence.steady
    if floor is None or steady is None or item.family not in PACED_FAMILIES or item.impact <= 0:
        return item
    paced = floor.paced_wait(steady.fetch_wait_share)
    if item.impact - paced < KEEPING_PACE_FROM:  # within the pace's own margin: the workers' wait
        return item
    impact = round(paced, 4)
    summary = (f" The workers keep pace ({floor.pace()}), so at most {pct(paced)} of the step's wait is theirs; the "
               "rest is the training process's own time inside next() — receiving and unpacking batches, or "
               "waiting for a core meanwhile — which more workers do not shorten.")
    title = f"{item.title} (the workers keep pace: at most {pct(paced)} of it is theirs)"
    return replace(item, title=title, impact=impact, severity=lowered_severity(item, impact),
                   summary=item.summary + summary, evidence=(*item.evidence, _floor_note(floor)),
                   extra={**item.extra, "capped_by_loader": round(paced, 4), "impact_uncapped": item.impact})


#: The wait inside ``next()`` the workers' pace leaves unexplained, from which it is a finding.
WAIT_NOT_THE_WORKERS_NOTED = 0.1
#: The families of causes that slow the training process inside ``next()`` as in any other phase:
#: another Python thread holding the GIL (unpickling a batch needs it), other processes or too many
#: threads taking the cores, collections triggered by the batch's allocations. Where one of them
#: costs as much as a noted wait, the wait the workers leave is theirs to explain, not unexplained
#: (the blind evaluation's w001 of seed 1144599158: a GIL-holding thread +39 %, the step waiting 48 %
#: inside next() beside workers that kept pace).
SLOWS_NEXT = frozenset({"gil_contention", "foreign_load", "cpu_oversubscription", "garbage_collection"})


def _wait_not_the_workers(findings: list[Finding], evidence: RunEvidence) -> Finding | None:
    """Where the loader's findings were capped because the workers keep pace (:func:`_keeping_pace`),
    the data wait they no longer claim, as what it is: the training process's own time inside
    ``next()``, not explained by any measured cause (family ``unexplained``: it names no fix), so that
    a wait of the step's is never left out of the verdict (it is no healthy run)."""
    floor, steady = evidence.loader_floor, evidence.steady
    capped = [item for item in findings if item.family in PACED_FAMILIES and "capped_by_loader" in item.extra]
    if floor is None or steady is None or not capped:
        return None
    if any(item.family in SLOWS_NEXT and item.impact >= WAIT_NOT_THE_WORKERS_NOTED for item in findings):
        return None  # a measured cause that slows the training process inside next() as anywhere else
    from stepscope.diagnosis.rules.input_pipeline import priced_without_core_wait

    wait = steady.fetch_wait_share
    # a wait for a core that other processes or the process's other Python threads held is theirs
    # (the foreign-load and GIL findings charge it), not unexplained
    _, taken = priced_without_core_wait(evidence, wait, [])
    left = (wait - floor.paced_wait(wait) - restart_wait_in_next(evidence)) * (1.0 - taken)
    if left < WAIT_NOT_THE_WORKERS_NOTED:
        return None
    phase = evidence.account.phase("data_wait") if evidence.account is not None else None
    split = ("" if phase is None else
             f" The training thread spent that wait {pct(phase.on_cpu)} on a CPU, {pct(phase.waiting_core)} waiting "
             f"for a core and {pct(phase.off_cpu)} off CPU (its account).")
    evidence_items = [Evidence("fetch_wait_share", round(wait, 4), None, "steps", "ratio", "steady state"),
                      _floor_note(floor)]
    if phase is not None:
        evidence_items += [Evidence("data_wait_on_cpu", round(phase.on_cpu, 4), None, "account", "ratio", "of the wait"),
                           Evidence("data_wait_waiting_core", round(phase.waiting_core, 4), None, "account", "ratio",
                                    "of the wait")]
    pid = evidence.record.meta.pid if evidence.record is not None else None
    return finding_of(
        "thread_account.wait_not_the_workers", "unexplained",
        f"Not the DataLoader's pace: the step waits {pct(left)} of its time in next() while the workers keep up",
        left, 0.5, evidence_items,
        [Prescription(f"See what the training process does inside next(): py-spy dump --native --pid {pid or '<pid>'} "
                      "(a few times), or stepscope run --trace for an operator timeline",
                      "the wait is measured and the workers' pace is not it; what fills it is not measured")],
        f"The step waits {pct(wait)} of its time for data, but the workers make a batch every "
        f"{floor.floor_s * 1e3:.3g} ms against the {floor.step_s * 1e3:.3g} ms step: {pct(left)} of "
        "the step is the training process's own time inside next() — receiving and unpacking batches, or waiting "
        f"for a core meanwhile — which more workers or faster reads do not shorten.{split}",
        claims=("data_wait",))
