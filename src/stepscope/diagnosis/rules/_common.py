"""Helpers the rules share: building findings, reading optional evidence, estimates used by
more than one family (so two rules never disagree about the same number)."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from stepscope.analysis.bundle import MfuEstimate, RunEvidence
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity, severity_for_impact

if TYPE_CHECKING:  # a run record's evidence only (`analyze` of a trace loads none of them)
    from stepscope.analysis.run.account import PhaseAccount, ThreadAccountView
    from stepscope.analysis.run.code_locations import CodeLocation
    from stepscope.record.run import DeviceCopy

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
#: From this share of one core the loading process mostly computes. Between :data:`LOADER_CPU_IDLE`
#: and this level it computes and waits in comparable parts: the side of :data:`LOADER_CPU_BUSY` it
#: falls on decides which input rule reports the wait, but neither "CPU-bound" nor "the loaders are
#: idle" is a claim to make with confidence. The cold-files scenario's warm epochs on a 2-core machine
#: (the workers at 0.38-0.52 of a core across runs; a third of the step waits in the per-batch
#: handoff) were called either, the CPU-bound one at 96 %, by the side a run fell on.
LOADER_CPU_COMPUTING = 0.7
#: A rule's own confidence at most when its verdict rests on the side of :data:`LOADER_CPU_BUSY` a
#: loader of that mixed band fell on (shown through the calibration's lower band).
LOADER_CPU_MIXED_CONFIDENCE = 0.6
#: Utilisation of all cores above which the machine has no CPU left to give (cf. the sampler's
#: 90 % saturation level for a core).
CPU_SATURATED = 0.85
#: Runnable threads per core at which the cores are saturated whatever the mean utilisation says
#: (Brendan Gregg's USE method: a run queue longer than the CPU count is saturation; twice the
#: cores means each runnable thread gets at most half a core). The mean utilisation of a short run
#: includes its start-up, so a saturated steady state can average below :data:`CPU_SATURATED`.
RUN_QUEUE_SATURATED = 2.0
#: Findings whose deciding share lies below ``threshold × NEAR_BAND_HIGH`` are "near the threshold"
#: (LOW severity), and rules using a band fire from ``threshold × NEAR_BAND_LOW``: the run-to-run
#: spread of a share on a shared machine (data wait 4–6 % around a 5 % cut in five identical runs)
#: then changes at most a LOW finding, never the verdict.
NEAR_BAND_LOW = 0.6
NEAR_BAND_HIGH = 1.5
#: A prescription is only made when it is expected to save at least this share of the step.
MIN_GAIN = 0.02


def finding(rule_id: str, family: str, title: str, impact: float, confidence: float,
            evidence: list[Evidence], prescriptions: list[Prescription], summary: str = "",
            severity: Severity | None = None, claims: tuple[str, ...] = ("step",),
            impact_basis: str = "measured", rank: int | None = None, partial: bool = False,
            cause_families: tuple[str, ...] = (), **extra: Any) -> Finding:
    """A :class:`Finding` with impact clamped to 0..1 and severity from impact unless given;
    ``extra`` keeps the rule's own details (``report.json`` only)."""
    impact = min(1.0, max(0.0, float(impact)))
    return Finding(
        rule_id=rule_id, family=family, title=title,
        severity=severity_for_impact(impact) if severity is None else severity,
        impact=round(impact, 4), confidence=round(min(1.0, max(0.0, confidence)), 2),
        evidence=tuple(evidence), prescriptions=tuple(prescriptions), summary=summary,
        extra=dict(extra), claims=claims, impact_basis=impact_basis, rank=rank, partial=partial,
        cause_families=cause_families,
    )


#: A cost's lower end is stated where it is lower than the cost by more than this share of the step.
LOW_END_SHOWN = 0.005


def lower_end(cost: float, low: float | None, why: str, evidence: list[Evidence], metric: str,
              scope: str, source: str = "account") -> dict[str, Any]:
    """The ``extra`` of a finding whose measured ``cost`` has a lower end ``low`` (checked against the
    next cause by :mod:`stepscope.diagnosis.near_tie`): ``{"impact_low": {"value", "why"}}``, with an
    evidence item ``metric`` appended to ``evidence``; empty where the end is not materially lower."""
    if low is None or low >= cost - LOW_END_SHOWN:
        return {}
    evidence.append(Evidence(metric, round(low, 4), None, source, "ratio", scope))
    return {"impact_low": {"value": round(low, 4), "why": why}}


def upper_end(cost: float, high: float | None, why: str, evidence: list[Evidence], metric: str,
              scope: str, source: str = "steps") -> dict[str, Any]:
    """The ``extra`` of a finding whose measured ``cost`` is priced on part of what its cause took
    and has an upper end ``high`` (the next cause's end a verdict is checked against by
    :mod:`stepscope.diagnosis.near_tie`): ``{"impact_high": {"value", "why"}}``, with an evidence item
    ``metric`` appended to ``evidence``; empty where the end is not materially higher."""
    if high is None or high <= cost + LOW_END_SHOWN:
        return {}
    evidence.append(Evidence(metric, round(high, 4), None, source, "ratio", scope))
    return {"impact_high": {"value": round(high, 4), "why": why}}


#: The measured error of each gain model, in shares of the step: how far its estimate overshot the
#: measured gain at the 90th percentile, and undershot it at the 10th. ``workers``: the worker plan's
#: predictions of a gain against real trials of the change (BENCHMARKS.md, "Worker plan calibration").
#: ``restarts``, ``foreign``, ``gil``: the measured cost a prescription states as its gain (the epoch
#: starts' share, the wait for a core charged to other processes, the GIL thread's price) against the
#: gain of removing that cause, measured by ablation on generated workloads (BENCHMARKS.md, "The gains
#: prescriptions state"; ``benchmarks/gain_error.py``).
#: Fitted on 131 prescriptions of five blind seeds (968692081, 377512372, 1034178463, 205384434,
#: 847309068), rounded up; the range keeps its estimate. Each seed left out of the fit in turn, the
#: ranges fitted on the other four held 74 % (foreign), 76 % (gil) and 84 % (restarts) of its gains.
RESTARTS_ERROR = (0.01, 0.18)
FOREIGN_ERROR = (0.25, 0.12)
GIL_ERROR = (0.26, 0.21)
GAIN_ERROR = {"workers": (0.32, 0.17), "restarts": RESTARTS_ERROR, "foreign": FOREIGN_ERROR, "gil": GIL_ERROR}


def gain_range(point: float, model: str) -> tuple[float, float]:
    """The range a model's predicted gain is stated with: from the prediction less its
    90th-percentile overshoot to the prediction plus its 10th-percentile undershoot."""
    over, under = GAIN_ERROR[model]
    return max(-1.0, point - over), min(0.99, point + under)


def rounded_range(point: float, model: str) -> tuple[float, float]:
    """:func:`gain_range`, rounded as a prescription keeps its gains."""
    low, high = gain_range(point, model)
    return round(low, 4), round(high, 4)


def restart_share(ev: RunEvidence) -> float:
    """The share of the step the workers' restarts at epoch starts cost: the epoch-start steps' data
    wait beyond an ordinary step's where the boundaries were measured (the start-up and the first batch
    the new workers owe), else the time in ``__iter__`` (the start-up alone)."""
    if ev.steady is None:
        return 0.0
    return ev.boundaries.cost_share if ev.boundaries is not None else ev.steady.loader_init_share


def warm_fetch_wait_share(ev: RunEvidence) -> float:
    """The steady fetch-wait share, or — when the first epoch waited on cold storage — the share
    left once the data is cached (the cold part is the ``storage_io.cold_data`` finding's); less,
    when the workers restart every epoch, the first batch each epoch start waits for beyond an
    ordinary step (the ``input_pipeline.worker_startup`` finding's)."""
    share = ev.steady.fetch_wait_share if ev.steady is not None else 0.0
    cold = ev.storage.cold
    share = min(share, cold.later_wait_share) if cold is not None else share
    return max(0.0, share - restart_wait_in_next(ev))


def restart_wait_in_next(ev: RunEvidence) -> float:
    """The epoch starts' excess wait that falls inside ``next()`` (a share of the step) where the
    workers restart every epoch: new workers run their ``worker_init_fn`` and make their first batch
    while the first ``next()`` waits, after ``__iter__`` has returned. The restarts' (the
    epoch-boundary finding charges it), not the fetch wait the other loader findings judge; 0 otherwise."""
    if not restarts_workers(ev) or ev.boundaries is None or ev.steady is None:
        return 0.0
    return max(0.0, ev.boundaries.cost_share - ev.steady.loader_init_share)


def restarts_workers(ev: RunEvidence) -> bool:
    """The busiest DataLoader starts its worker processes anew at every epoch."""
    return ev.main_loader is not None and ev.main_loader.restarts_workers


def mfu_text(estimate: MfuEstimate) -> str:
    """``"12% (9–14%)"``: the MFU with its bounds."""
    return f"{pct(estimate.value)} ({pct(estimate.low)}–{pct(estimate.high)})"


def precision_levers(ev: RunEvidence, estimate: MfuEstimate | None) -> list[Prescription]:
    """Mixed precision / TF32, only where the device ran and the run does not use them already."""
    if ev.gpu is None:
        return []
    dtype = estimate.dtype if estimate is not None else (
        ev.facts.compute.compute_dtype if ev.facts.compute is not None else None)
    if dtype != "fp32":
        return []
    return [Prescription(
        "Use mixed precision: torch.autocast('cuda', dtype=torch.bfloat16); or, keeping fp32, "
        "torch.set_float32_matmul_precision('high') (TF32 tensor cores)",
        "the matmuls run in fp32, a fraction of the tensor-core peak", "dtype", "fp32", "bf16")]


def pct(value: float) -> str:
    return f"{100 * value:.0f}%" if value >= 0.1 else f"{100 * value:.1f}%"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def field_of(obj: Any, name: str) -> Any:
    """``obj.name`` or None when ``obj`` is absent (evidence objects are optional)."""
    return None if obj is None else getattr(obj, name, None)


def loader_cpu_util(ev: RunEvidence) -> tuple[float | None, str]:
    """CPU (share of one core) of the loading processes while the step waits (see
    :func:`stepscope.analysis.bundle.loader_cpu`), or None when not conclusive.

    When every core is busy (:data:`CPU_SATURATED`), a loader using little CPU may be starved by
    other threads rather than idle: the measurement is then not conclusive — unless the workers'
    scheduler states show them blocked rather than runnable (``loader_runnable_share`` below
    :data:`LOADER_CPU_BUSY`): a starved process is runnable, waiting for a core.
    """
    util, source = ev.loader_cpu.util, ev.loader_cpu.source
    if util is not None and util < LOADER_CPU_BUSY and cpu_saturated(ev):
        runnable = ev.signals.loader_runnable_share if ev.signals is not None else None
        if runnable is not None and runnable < LOADER_CPU_BUSY:
            return util, (f"{source}; all cores were busy, but the workers were runnable in only "
                          f"{pct(runnable)} of the samples: blocked, not starved (sampler)")
        if (blocked := blocked_workers(ev)) is not None:
            return util, (f"{source}; all cores were busy, but the workers spent {pct(blocked)} of their time per "
                          "batch off CPU and not waiting for a core: blocked, not starved (measured in the workers)")
        return None, "not conclusive: all cores are busy, so the loaders may be starved rather than idle"
    return util, source


#: DataLoader workers measured waiting for a core at least this share of their time per batch are
#: starved: they would use more cores than they got, and take the ones another thread leaves.
STARVED_WORKERS = 0.3
#: ... while off CPU at most this share of it: what they wait for is a core, not a read.
STARVED_WORKERS_BLOCKED = 0.1


def starved_workers(ev: RunEvidence) -> float | None:
    """The share of their time per batch the main loader's workers waited for a core, measured in
    them (:mod:`stepscope.analysis.run.loader_floor`), when they were starved: waiting for a core at
    least :data:`STARVED_WORKERS` of it and off CPU at most :data:`STARVED_WORKERS_BLOCKED` — they
    compute or wait for a core, CPU-bound whatever the sampler could tell beside busy cores. Else None."""
    floor = ev.loader_floor
    if floor is None or not floor.runq_measured:
        return None
    waiting = floor.waiting_fraction
    return waiting if waiting >= STARVED_WORKERS and floor.blocked_fraction <= STARVED_WORKERS_BLOCKED else None


#: DataLoader workers measured off CPU (not waiting for a core) at least this share of their time per
#: batch, and waiting for a core less than :data:`STARVED_WORKERS` of it, are blocked (reads, sleeps):
#: their low CPU is idleness, not starvation, however busy the cores were.
BLOCKED_WORKERS = 0.5


def blocked_workers(ev: RunEvidence) -> float | None:
    """The share of their time per batch the main loader's workers spent off CPU and not waiting for a
    core, measured in them, when that is at least :data:`BLOCKED_WORKERS` and their waits for a core
    are below :data:`STARVED_WORKERS` (the counterpart of :func:`starved_workers`: blind w021 of seed
    1699417522, one worker asleep in slow reads 16 of its 20 ms a batch beside a neighbour that kept
    the cores busy, read "not conclusive", and the CPU-bound advice came first). Else None."""
    floor = ev.loader_floor
    if floor is None or not floor.runq_measured:
        return None
    blocked = floor.blocked_fraction
    return blocked if blocked >= BLOCKED_WORKERS and floor.waiting_fraction < STARVED_WORKERS else None


def loader_cpu_mixed(util: float | None) -> bool:
    """The loaders both computed and waited in comparable parts (:data:`LOADER_CPU_COMPUTING`)."""
    return util is not None and LOADER_CPU_IDLE <= util < LOADER_CPU_COMPUTING


#: How a summary names the mixed band (:func:`loader_cpu_mixed`).
LOADER_CPU_MIXED_BAND = f"Between {LOADER_CPU_IDLE:.0%} and {LOADER_CPU_COMPUTING:.0%} of a core"


def steal_share(ev: RunEvidence) -> float:
    """Share of all CPU time a virtual machine's hypervisor gave other guests (0 when unknown)."""
    return (ev.signals.steal_share if ev.signals is not None else None) or 0.0


def cpu_saturated(ev: RunEvidence) -> bool:
    """Every core is busy: the mean utilisation reaches :data:`CPU_SATURATED`, or runnable
    threads queue at :data:`RUN_QUEUE_SATURATED` per core. On a virtual machine the time the
    hypervisor gave other guests (steal) is time the cores were not free either."""
    machine = ev.signals.cpu_util_mean if ev.signals is not None else None
    if machine is not None and machine + steal_share(ev) >= CPU_SATURATED:
        return True
    demand = ev.cpu_demand
    return bool(demand is not None and demand.runnable_per_core is not None
                and demand.runnable_per_core >= RUN_QUEUE_SATURATED)


def code_locations(ev: RunEvidence, phase: str, role: str = "main") -> tuple[CodeLocation, ...]:
    """The top user-code locations of a phase (``role="worker"``: the DataLoader workers')."""
    if ev.code is None:
        return ()
    part = ev.code.workers if role == "worker" else ev.code.phase(phase)
    return part.locations if part is not None else ()


def device_copy_at(ev: RunEvidence, location: CodeLocation) -> DeviceCopy | None:
    """The largest host-to-device copy that the FLOP-counted step saw at ``location``'s line
    (``record.facts.compute.copies``), or None."""
    compute = ev.facts.compute
    if compute is None:
        return None
    name = os.path.basename(location.file)
    for copy in compute.copies:  # largest first
        if copy.to_device and copy.line == location.line and copy.file and os.path.basename(copy.file) == name:
            return copy
    return None


def pin_memory_prescription(ev: RunEvidence, why: str) -> Prescription:
    """``pin_memory=True`` and a non-blocking copy: the DataLoader's setting, or pinned host tensors
    in a run known to have no DataLoader."""
    loader = ev.main_loader
    if loader is None and ev.record is not None:  # a run without a DataLoader (a trace cannot tell)
        return Prescription("Allocate the host tensors pinned (tensor.pin_memory(), once, outside the step) and "
                            "copy with tensor.to(device, non_blocking=True)", why)
    return Prescription("DataLoader(pin_memory=True) and tensor.to(device, non_blocking=True)", why,
                        "pin_memory", loader.pin_memory if loader is not None else None, True)


def code_summary(ev: RunEvidence, phase: str, role: str = "main") -> str:
    """``"train.py:41 tokenize() 72%, collate() 11%"``: where a phase's time goes, or ``""``."""
    return ", ".join(f"{item.label} {pct(item.share_of_phase)}" for item in code_locations(ev, phase, role)[:3])


def loading_code(ev: RunEvidence, evidence: list[Evidence]) -> str:
    """Where loading spends its time (stack samples), as a sentence; adds the locations as evidence."""
    loader = ev.main_loader
    role = "worker" if loader is not None and loader.num_workers > 0 else "main"
    locations = code_locations(ev, "data_wait", role)
    for location in locations[:3]:
        evidence.append(Evidence("code_location", location.label, None, "stacks", "code",
                                 f"{pct(location.share_of_phase)} of data wait"
                                 + (" (worker processes)" if role == "worker" else "")))
    if not locations:
        return ""
    where = "in worker processes" if role == "worker" else "in the training process"
    return f" Data wait {pct(ev.steady.data_wait_share if ev.steady else 0.0)} — {where}: " \
           f"{code_summary(ev, 'data_wait', role)}."


def evidence_source(description: str) -> str:
    """The ``Evidence.source`` for a value described as "... (capture)" or "... (sampler)"."""
    return "steps" if description.endswith("(capture)") else "sampler"


def near_threshold(value: float, threshold: float) -> bool:
    """Whether ``value`` sits in the band where identical runs may fall on either side of
    ``threshold``: findings there are reported at LOW severity so the verdict does not flip."""
    return value < threshold * NEAR_BAND_HIGH


def workers_needed(load_s: float, compute_s: float) -> int:
    """Workers that hide a per-batch load time behind the compute of one batch (at least 1)."""
    if compute_s <= 0:
        return 1
    return max(1, math.ceil(load_s / compute_s))


# -- the thread account --------------------------------------------------------------------------
def account_lines(account: ThreadAccountView, causes: tuple[str, ...] = ()) -> list[str]:
    """One line per phase the account splits, the longest first (phases with ``causes`` only, when given)."""
    phases = sorted((item for item in account.phases if not causes or any(item.off_part(cause) > 0 for cause in causes)),
                    key=lambda item: -item.share)
    return [f"{item.phase.replace('_', ' ')} {ms(item.time_s)}: {pct(item.on_cpu)} on CPU, "
            f"{pct(item.waiting_core)} waiting for a core, {pct(item.off_cpu)} off CPU"
            for item in phases if item.share >= 0.01]


def slept_in(phase: PhaseAccount) -> str:
    """What the training thread was sampled asleep in during ``phase`` ("a lock 62%, a sleep 38% of
    140 samples off CPU"); empty where not sampled."""
    total = sum(count for _, count in phase.waits)
    if not total:
        return ""
    parts = ", ".join(f"{WAIT_WORDS.get(kind, kind)} {pct(count / total)}"
                      for kind, count in sorted(phase.waits, key=lambda item: -item[1]) if count / total >= 0.05)
    return f"{parts} of {total} samples off CPU"


#: How :func:`slept_in` names each wait class (:data:`stepscope.record.run.WAIT_CLASSES`).
WAIT_WORDS = {"lock": "a lock (futex: the GIL or another)", "sleep": "a sleep", "poll": "a poll/select",
              "pipe": "a pipe or socket read", "disk": "the disk", "other": "another kernel wait",
              "unknown": "an unreadable wait"}


def account_evidence(account: ThreadAccountView) -> list[Evidence]:
    """The account's three shares of the step, as evidence lines."""
    return [
        Evidence("thread_on_cpu_share", account.on_cpu, None, "account", "ratio",
                 f"training thread on a CPU, {account.accounted_steps} accounted steps (± {pct(account.spread)})"),
        Evidence("thread_waiting_core_share", account.waiting_core, None, "account", "ratio",
                 "runnable, waiting for a core (run-queue delay)"),
        Evidence("thread_off_cpu_share", account.off_cpu, None, "account", "ratio", "blocked or waiting for the GIL"),
    ]


#: A rank's slow phase -> the families of that rank's own findings that are its cause (a straggler
#: whose data wait is long is an input or storage problem on that rank; a wait in collectives for
#: another rank's phase is that rank's problem too).
PHASE_CAUSES: dict[str, tuple[str, ...]] = {
    "data_wait": ("input_pipeline", "storage_io", "cpu_oversubscription"),
    "forward": ("compute", "launch_overhead", "host_device_sync"),
    "optimizer": ("compute", "launch_overhead"),
    "other": ("outside_model", "garbage_collection", "periodic_stall"),
}
