"""Input pipeline, CPU-bound: the step waits for batches that the CPU is busy producing.

Fires when the steady-state fetch wait (data wait less DataLoader worker start-up, which the
periodic-stall rule owns) reaches XProf's moderate level and the loading processes are busy on
CPU — or when no sampler evidence says otherwise (then with lower confidence). It stays silent when
the loaders are idle while the step waits (that is ``storage_io``); the engine's precedence table
lets ``cpu_oversubscription`` and ``storage_io`` supersede it. Between 60 % and 150 % of the
threshold the finding is LOW ("near the threshold"), so identical runs do not flip the verdict.

Prescriptions are priced with the measured times (:func:`plan_workers`): k workers make a batch
cost ``max(C', L/k)`` — compute C, loading CPU L, and C' the compute stretched when the model's u
busy cores and the workers together want more than the N cores (:func:`plan_workers`). Workers are prescribed only when that saves at least
:data:`~stepscope.diagnosis.rules._common.MIN_GAIN` of the step; a model that already uses every
core is told to make loading cheaper, never "more workers", and never to cut its threads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity
from stepscope.diagnosis.rules import _common as common
from stepscope.diagnosis.rules._common import INPUT_HIGH, INPUT_MODERATE, LOADER_CPU_BUSY

#: Worker start-up above this share of the step is worth ``persistent_workers=True`` even when it
#: is not periodic enough for the periodic-stall rule (XProf's 3 % "moderate" level for secondary
#: categories such as kernel launch and all-others).
LOADER_INIT_MODERATE = 0.03


@dataclass(frozen=True)
class WorkerPlan:
    """What k DataLoader workers are expected to do to a step (per batch, seconds)."""

    workers: int
    step_s: float  # expected step time per batch
    gain: float  # share of the current step saved
    cpu_bound: bool  # the machine's cores, not the workers, set the expected step
    compute_cores: float
    compute_cores_measured: bool


#: Extra slowdown of a model whose intra-op threads must share cores with busy workers: parallel
#: regions wait for their slowest thread, and a preempted OpenMP thread stalls the whole region
#: (official MNIST/DCGAN examples on 2 cores ran 45–55 % slower with one worker added).
CONTENTION_PENALTY = 0.25


def plan_workers(step_s: float, wait_s: float, load_cpu_s: float, cores: float, current: int,
                 compute_cores: float | None, assumed_cores: float) -> WorkerPlan:
    """The best worker count and its expected effect, per batch.

    k busy workers and the model's ``u`` threads want ``u + k·b`` cores (``b``: the workers' busy
    fraction, ``L / (k·T')``). While that fits in the ``N`` cores, compute keeps its time C and the
    step is ``max(C, L/k)``; beyond, compute stretches by the oversubscription
    ``(u + k·b) / N`` and by :data:`CONTENTION_PENALTY`. The fixed point is found by iteration.
    ``cores`` is what the run can have: the machine's cores less those other processes held.
    """
    compute_s = max(step_s - wait_s, 1e-9)
    used = compute_cores if compute_cores is not None else assumed_cores
    used = min(max(used, 0.0), float(cores))
    best: WorkerPlan | None = None
    for workers in range(max(current + 1, 1), max(math.ceil(cores), current + 1) + 1):
        expected, crowded = max(compute_s, load_cpu_s / workers), False
        for _ in range(8):
            busy = min(1.0, load_cpu_s / (workers * expected)) if expected > 0 else 1.0
            active = used + workers * busy
            crowded = active > cores
            stretched = compute_s * (active / cores) * (1 + CONTENTION_PENALTY) if crowded else compute_s
            expected = max(stretched, load_cpu_s / workers)
        plan = WorkerPlan(workers, expected, (step_s - expected) / step_s if step_s > 0 else 0.0,
                          crowded, used, compute_cores is not None)
        if best is None or plan.step_s < best.step_s * 0.99:
            best = plan
    assert best is not None
    return best


def loader_cpu_bound(ev: RunEvidence) -> Finding | None:
    steady = ev.steady
    if steady is None:
        return _from_trace(ev)
    wait = common.warm_fetch_wait_share(ev)
    if wait < INPUT_MODERATE * common.NEAR_BAND_LOW:
        return None
    util, util_source = common.loader_cpu_util(ev)
    if util is not None and util < LOADER_CPU_BUSY:
        return None  # loaders idle or ambiguous: storage_io decides
    evidence = [
        Evidence("fetch_wait_share", round(wait, 4), INPUT_MODERATE, "steps", "ratio",
                 f"steady state; per step p10–p90 {common.pct(steady.fetch_wait_p10)}–"
                 f"{common.pct(steady.fetch_wait_p90)}"),
    ]
    if util is not None:
        evidence.append(Evidence("loader_cpu_util", round(util, 3), LOADER_CPU_BUSY,
                                 common.evidence_source(util_source), "cores", util_source))
    if ev.compute_cores is not None:
        evidence.append(Evidence("compute_cores", round(ev.compute_cores, 2), None, "sampler", "cores",
                                 "cores the training process uses while not waiting for data"))
    loader = ev.main_loader
    if loader is not None:
        evidence.append(Evidence("num_workers", loader.num_workers, None, "loader", "count",
                                 f"loader #{loader.loader_id}"))
    if ev.cpu_count:
        evidence.append(Evidence("cpu_count", ev.cpu_count, None, "meta", "count", "machine"))
    near = common.near_threshold(wait, INPUT_MODERATE)
    confidence = (0.9 if util is not None else 0.6) - (0.2 if near else 0.0)
    level = "highly" if wait >= INPUT_HIGH else "moderately" if wait >= INPUT_MODERATE else "slightly"
    # the title says only what was measured: "CPU-bound" needs the loaders' CPU
    title = (f"Input pipeline is CPU-bound: the step waits {common.pct(wait)} of its time for data"
             if util is not None else
             f"Input pipeline: the step waits {common.pct(wait)} of its time for data (CPU-bound or waiting "
             "on storage: the loaders' CPU is not conclusive)")
    summary = (f"The run is {level} input-bound (XProf levels 5%/20%): {common.pct(wait)} of the "
               f"step is spent waiting for the next batch")
    summary += (f", while the process(es) producing batches use {util:.0%} of a core."
                if util is not None else f"; whether loading is CPU-bound is {util_source}"
                " (storage or latency would look the same).")
    if near:
        summary += " The share is near the 5% threshold, so this is reported as minor."
    summary += common.loading_code(ev, evidence)
    prescriptions = _minor_prescriptions(ev) if near else _prescriptions(ev, util)
    if util is None:
        prescriptions.append(Prescription(
            "If the data comes from a network or a cold disk: stage it locally, or raise prefetch_factor",
            "the same wait would follow from storage latency, which these measurements cannot rule out"))
    return common.finding("input_pipeline.loader_cpu_bound", "input_pipeline", title, wait, confidence,
                          evidence, prescriptions, summary,
                          severity=Severity.LOW if near else None, claims=("data_wait",),
                          conclusive={"cpu_bound": util is not None})


def _from_trace(ev: RunEvidence) -> Finding | None:
    """A bare trace (no run record): the TensorBoard plugin's DataLoader share is the evidence."""
    share = common.field_of(ev.trace, "dataloader_share")
    if share is None or share < INPUT_MODERATE:
        return None
    return common.finding(
        "input_pipeline.loader_cpu_bound", "input_pipeline",
        f"Input pipeline: {common.pct(share)} of the step is in the DataLoader", share, 0.6,
        [Evidence("dataloader_share", round(share, 4), INPUT_MODERATE, "trace", "ratio", "per step")],
        [Prescription("Raise DataLoader num_workers (up to the cores), or make samples cheaper to produce",
                      "the trace alone cannot tell CPU-bound loading from storage latency, nor how many "
                      "cores the model uses; `stepscope run` measures both and prices the change")],
        "The trace shows the step waiting for the DataLoader (the TensorBoard plugin's DataLoader "
        "category); without a run record the loaders' CPU use is unknown.", claims=("data_wait",))


def _prescriptions(ev: RunEvidence, util: float | None) -> list[Prescription]:
    steady = ev.steady
    assert steady is not None
    loader = ev.main_loader
    cores = ev.cpu_count
    out: list[Prescription] = []
    per_batch = steady.step_time_mean_s / steady.batches_per_step
    wait_s = steady.fetch_wait_share * per_batch
    compute_s = max(per_batch - wait_s, 1e-6)
    workers = loader.num_workers if loader is not None else 0
    # CPU time loading one batch: the wait itself with num_workers=0; with workers, each produces
    # one batch per (wait + compute) × workers of wall time, busy `util` of it
    load_wall_s = wait_s if workers == 0 else (wait_s + compute_s) * workers
    load_cpu_s = load_wall_s * (util if util is not None else 1.0)
    if cores and workers < cores:
        assumed = float(min(ev.intra_op_threads or 1, cores))
        foreign = ev.foreign.cpu_share if ev.foreign is not None else 0.0
        available = max(0.5, cores * (1.0 - foreign))
        plan = plan_workers(per_batch, wait_s, load_cpu_s, available, workers, ev.compute_cores, assumed)
        measured = "measured" if plan.compute_cores_measured else "assumed from its intra-op threads"
        cost = (f"workers take cores from the model, which uses {plan.compute_cores:.1f} of {cores} "
                f"({measured})")
        if foreign >= 0.1:
            cost += f"; other processes held {foreign:.0%} of the cores, so the run had ~{available:.1f}"
        if plan.gain >= common.MIN_GAIN:
            why = (f"loading one batch takes ~{common.ms(load_cpu_s)} of CPU and the model "
                   f"~{common.ms(compute_s)}; with {plan.workers} worker(s) the step is expected to drop from "
                   f"~{common.ms(per_batch)} to ~{common.ms(plan.step_s)} per batch")
            if plan.cpu_bound:
                why += f", the {cores} cores then shared by loading and the model"
            out.append(Prescription(f"DataLoader(num_workers={plan.workers})", why, "num_workers", workers,
                                    plan.workers, expected_gain=round(plan.gain, 4), cost=cost))
        else:
            out.append(_cheaper_loading(ev, cores, workers,
                                        f"more workers are not expected to help: the model already uses "
                                        f"{plan.compute_cores:.1f} of the {cores} cores ({measured}), so "
                                        "workers would only take CPU from it"))
    else:
        out.append(_cheaper_loading(ev, cores, workers,
                                    f"all {cores or '?'} cores already load data ({workers} workers): "
                                    "more workers cannot help"))
    if loader is not None and workers > 0 and not loader.persistent_workers \
            and steady.loader_init_share >= LOADER_INIT_MODERATE:
        out.append(Prescription("DataLoader(persistent_workers=True)",
                                f"worker start-up costs {common.pct(steady.loader_init_share)} of the step",
                                "persistent_workers", False, True,
                                expected_gain=round(steady.loader_init_share, 4)))
    return out


def _minor_prescriptions(ev: RunEvidence) -> list[Prescription]:
    """Near the threshold the wait is within run-to-run noise: no structural change (workers are
    processes, memory and CPU) is prescribed for it, only cheaper loading."""
    loader = ev.main_loader
    return [_cheaper_loading(ev, ev.cpu_count, loader.num_workers if loader is not None else 0,
                             "the wait is near the 5% level, within run-to-run noise: not worth more "
                             "worker processes")]


def _cheaper_loading(ev: RunEvidence, cores: int | None, workers: int, why: str) -> Prescription:
    where = ", or move augmentation to the GPU" if ev.gpu is not None else ""
    return Prescription("Make each sample cheaper to produce: precompute or cache the transform offline, "
                        f"or vectorise it per batch (collate_fn){where}", why)
