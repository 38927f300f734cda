"""Input pipeline, CPU-bound: the step waits for batches that the CPU is busy producing.

Fires when the steady-state fetch wait (data wait less DataLoader worker start-up, which the
periodic-stall rule owns) reaches XProf's moderate level and the loading processes are busy on
CPU — or when no sampler evidence says otherwise (then with lower confidence). It stays silent when
the loaders are idle while the step waits (that is ``storage_io``); the engine's precedence table
lets ``cpu_oversubscription`` and ``storage_io`` supersede it. Between 60 % and 150 % of the
threshold the finding is LOW ("near the threshold"), so identical runs do not flip the verdict.

Prescriptions are priced with the measured times (:func:`predict`, a contention model fitted on
real trials): k workers and t intra-op threads make a batch cost the slower of the workers
producing it and the model computing it, both slowed when the runnable threads outnumber the
cores. Workers are prescribed — with one intra-op thread in the main process when only that pair
helps — only when they are expected to save at least
:data:`~stepscope.diagnosis.rules._common.MIN_GAIN` of the step, and the gain is stated as the
calibrated range (:func:`common.gain_range`), which may reach below zero ("it may not help":
`run --verify` measures it); otherwise the run is told to make loading cheaper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity
from stepscope.diagnosis.rules import _common as common
from stepscope.diagnosis.rules._common import INPUT_HIGH, INPUT_MODERATE, LOADER_CPU_BUSY

if TYPE_CHECKING:  # a run record's thread account only
    from stepscope.analysis.run.account import PythonThread

#: Worker start-up above this share of the step is worth ``persistent_workers=True`` even when it
#: is not periodic enough for the periodic-stall rule (XProf's 3 % "moderate" level for secondary
#: categories such as kernel launch and all-others).
LOADER_INIT_MODERATE = 0.03


@dataclass(frozen=True)
class LoadingModel:
    """What one batch costs now, from the evidence: the inputs of :func:`predict`."""

    per_batch_s: float  # the step time per batch
    wait_s: float  # of which waiting for data
    compute_s: float  # the rest: the model, and what the loop does besides
    load_cpu_s: float  # CPU time loading one batch takes (one core)
    cores: float  # cores the run can have (its CPUs less what other processes held)
    compute_cores: float  # cores the model keeps busy while it computes
    compute_cores_measured: bool
    threads: int  # the main process's intra-op threads now
    workers: int  # DataLoader workers now


@dataclass(frozen=True)
class WorkerPlan:
    """What k DataLoader workers and t intra-op threads are expected to do to a step (per batch)."""

    workers: int
    threads: int
    step_s: float  # expected step time per batch
    gain: float  # share of the current step saved
    cpu_bound: bool  # the machine's cores, not the workers, set the expected step
    compute_cores: float
    compute_cores_measured: bool


@dataclass(frozen=True)
class ModelConstants:
    """The constants of :func:`predict`, fitted on real trials (``benchmarks/calibrate_workers.py
    search``; the fit and the model's error are in BENCHMARKS.md, "Worker plan calibration")."""

    #: CPU per batch a worker spends besides the user's loading code (collate, pickling, queues).
    worker_overhead_s: float = 0.001
    #: time per batch the training process spends receiving a batch from a worker (shared memory,
    #: unpickling, the queue).
    receive_overhead_s: float = 0.0005
    #: how much slower the model's parallel regions get when busy workers leave its intra-op
    #: threads fewer cores than threads (a region waits for its preempted thread at the barrier).
    barrier: float = 1.0
    #: share of the compute that speeds up with intra-op threads (the rest is Python and small ops).
    thread_scaling: float = 0.5
    #: how much of the machine bound's excess over the other bounds is lost again when threads want
    #: more CPU than the cores give (preempted threads of a parallel region wait for each other).
    crowding: float = 0.0
    #: a worker's loading CPU over the same loading in the training process (measured ~1.35 on the
    #: 2-core development VM, the same pure-Python code forked: caches, copy-on-write).
    worker_slowdown: float = 1.2


CONSTANTS = ModelConstants()


def predict(model: LoadingModel, workers: int, threads: int, constants: ModelConstants = CONSTANTS) -> float:
    """The expected step time per batch with ``workers`` DataLoader workers and ``threads`` intra-op
    threads in the training process.

    The model's compute on t threads scales by the cores it keeps busy (``u``, measured) for the
    share ``f`` of it that threads speed up: ``C_t = C·(1 + f·(u/u_t − 1))``. Without workers the
    training process loads and computes in turn: ``C_t + L``. With k workers the step is bound by
    the slowest of: the workers, ``(w·L + o)/k`` per batch (``w``: a worker's slowdown); the
    training process, ``C_t + q``; and the machine, all the CPU a batch needs over the N cores,
    ``(C_t·u_t + q + w·L + k·o)/N``. When busy workers leave the model's t > 1 threads fewer cores
    than threads, its compute is stretched by ``1 + barrier·short`` (``short``: the cores it lacks,
    at most 1): a parallel region waits for its preempted thread. When the machine is the bound,
    its excess over the other two is stretched by ``1 + crowding``.
    """
    c = constants
    used_now = max(model.compute_cores, 1.0)
    used = max(1.0, min(used_now, float(max(threads, 1)), model.cores))
    compute_s = model.compute_s * (1.0 + c.thread_scaling * (used_now / used - 1.0))
    if workers == 0:
        return compute_s + (model.wait_s if model.workers == 0 else model.load_cpu_s)
    load_s = c.worker_slowdown * model.load_cpu_s
    producing = (load_s + c.worker_overhead_s) / workers
    step = max(producing, compute_s + c.receive_overhead_s)
    for _ in range(4):  # the barrier penalty depends on how busy the workers are, which depends on the step
        busy_workers = workers * min(1.0, producing / step) if step > 0 else float(workers)
        short = max(0.0, min(1.0, used + busy_workers - model.cores)) if threads > 1 else 0.0
        stretched = compute_s * (1.0 + c.barrier * short)
        training = stretched + c.receive_overhead_s
        bound = max(producing, training)
        demand = stretched * used + c.receive_overhead_s + load_s + workers * c.worker_overhead_s
        machine = demand / model.cores
        step = max(bound, machine) + c.crowding * max(0.0, machine - bound)
    return step


def loading_model(ev: RunEvidence, util: float | None) -> LoadingModel | None:
    steady = ev.steady
    if steady is None or not ev.cpu_count:
        return None
    loader = ev.main_loader
    cores = ev.cpu_count
    per_batch = steady.step_time_mean_s / steady.batches_per_step
    wait_s = common.warm_fetch_wait_share(ev) * per_batch
    compute_s = max(per_batch - wait_s, 1e-6)
    workers = loader.num_workers if loader is not None else 0
    # CPU time loading one batch: the wait itself with num_workers=0; with workers, each produces
    # one batch per (wait + compute) × workers of wall time, busy `util` of it
    load_wall_s = wait_s if workers == 0 else (wait_s + compute_s) * workers
    load_cpu_s = load_wall_s * (util if util is not None else 1.0)
    threads = int(ev.intra_op_threads or 1)
    assumed = float(min(threads, cores))
    used = ev.compute_cores if ev.compute_cores is not None else assumed
    foreign = ev.foreign.cpu_share if ev.foreign is not None else 0.0
    available = max(0.5, cores * (1.0 - foreign))
    return LoadingModel(per_batch, wait_s, compute_s, load_cpu_s, available, min(max(used, 0.0), float(cores)),
                        ev.compute_cores is not None, threads, workers)


def predict_step(ev: RunEvidence, workers: int, threads: int, constants: ModelConstants = CONSTANTS) -> float | None:
    """:func:`predict` from the evidence of a run (None when it lacks what the model needs)."""
    util, _ = common.loader_cpu_util(ev)
    model = loading_model(ev, util)
    return None if model is None else predict(model, workers, threads, constants)


#: The most cores the worker search considers (one worker count per core is tried).
MAX_PLANNED_CORES = 1024


def plan_workers(model: LoadingModel) -> WorkerPlan:
    """The best worker count — alone, or with one intra-op thread in the main process when only the
    pair helps (each thread then stays on its core) — and its expected effect, per batch."""
    best: WorkerPlan | None = None
    # the cores come from the record: a hostile or corrupt one may claim 2**70 (the search would
    # never end); no machine the planner advises has more than MAX_PLANNED_CORES
    ceiling = max(math.ceil(min(model.cores, MAX_PLANNED_CORES)), model.workers + 1)
    thread_options = sorted({model.threads, 1}, reverse=True)
    for workers in range(max(model.workers + 1, 1), ceiling + 1):
        for threads in thread_options:
            step = predict(model, workers, threads)
            plan = WorkerPlan(workers, threads, step, (model.per_batch_s - step) / model.per_batch_s,
                              min(threads, model.compute_cores) + workers > model.cores, model.compute_cores,
                              model.compute_cores_measured)
            # fewer threads only when it buys a clear gain over keeping them
            if best is None or plan.step_s < best.step_s * (0.99 if threads == best.threads else 0.95):
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
    mixed = common.loader_cpu_mixed(util)
    confidence = (0.9 if util is not None else 0.6) - (0.2 if near else 0.0)
    if mixed:
        confidence = min(confidence, common.LOADER_CPU_MIXED_CONFIDENCE)
    level = "highly" if wait >= INPUT_HIGH else "moderately" if wait >= INPUT_MODERATE else "slightly"
    # the title says only what was measured: "CPU-bound" needs the loaders' CPU, busy beyond the mixed band
    if util is None:
        title = (f"Input pipeline: the step waits {common.pct(wait)} of its time for data (CPU-bound or waiting "
                 "on storage: the loaders' CPU is not conclusive)")
    elif mixed:
        title = (f"Input pipeline: the step waits {common.pct(wait)} of its time for data while the loaders "
                 f"compute {util:.0%} of a core and wait the rest")
    else:
        title = f"Input pipeline is CPU-bound: the step waits {common.pct(wait)} of its time for data"
    summary = (f"The run is {level} input-bound (XProf levels 5%/20%): {common.pct(wait)} of the "
               f"step is spent waiting for the next batch")
    summary += (f", while the process(es) producing batches use {util:.0%} of a core."
                if util is not None else f"; whether loading is CPU-bound is {util_source}"
                " (storage or latency would look the same).")
    if mixed:
        summary += (f" {common.LOADER_CPU_MIXED_BAND} the loaders compute and wait in comparable parts: cheaper "
                    "samples shorten one part, faster reads or a shorter handoff the other, and this run does not "
                    "say which is larger.")
    if near:
        summary += " The share is near the 5% threshold, so this is reported as minor."
    holder = _gil_may_hold_the_fetch(ev, wait)
    if holder is not None:
        confidence = min(confidence, GIL_UNSPLIT_CONFIDENCE)
        evidence.append(Evidence("busy_python_thread_cores", round(holder.cores, 3), None, "account", "cores",
                                 f"thread `{holder.name}` in {holder.function}, beside a fetch in the training thread"))
        summary += (f" The loader fetches in the training process (num_workers=0) beside another busy Python "
                    f"thread (`{holder.name}`, {holder.cores:.0%} of a core): part of this wait may be the GIL's, "
                    "which the run's samples of the thread asleep were too few to split.")
    summary += common.loading_code(ev, evidence)
    impact, contended = priced_without_core_wait(ev, wait, evidence)
    if contended:
        summary += (f" For {common.pct(contended)} of that wait the training thread was runnable but waiting for a "
                    "core other processes or the process's other Python threads held: faster loading does not give "
                    "that back, so the cost is priced "
                    f"on the rest ({common.pct(impact)} of the step).")
    # where the sampler could not tell, the workers' own timing can: starved, not waiting on storage
    starved = common.starved_workers(ev) if util is None else None
    if starved is not None:
        summary += (f" The workers' own timing settles it: they waited for a core {common.pct(starved)} of their "
                    "time per batch and were hardly ever off CPU — starved for cores, not waiting on storage.")
    busy = util >= LOADER_CPU_BUSY if util is not None else starved is not None
    elsewhere = _core_wait_its_workers_caused(ev, busy, evidence)
    if elsewhere:
        impact += elsewhere
        summary += (f" The workers' CPU also made the training thread wait for a core outside the data wait: "
                    f"{common.pct(elsewhere)} of the step (the thread account), which cheaper samples give back.")
    prescriptions = _minor_prescriptions(ev) if near else _prescriptions(ev, util)
    if (util is None and starved is None) or mixed:
        prescriptions.append(Prescription(
            "If the data comes from a network or a cold disk: stage it locally, or raise prefetch_factor",
            "the same wait would follow from storage latency, which these measurements cannot rule out"
            if util is None else
            f"the loaders were off CPU {1 - util:.0%} of the time the step waited: reads or a slow source "
            "may be that part"))
    return common.finding("input_pipeline.loader_cpu_bound", "input_pipeline", title, impact, confidence,
                          evidence, prescriptions, summary,
                          severity=Severity.LOW if near else None,
                          claims=("data_wait", "compute", "other") if elsewhere else ("data_wait",),
                          conclusive={"cpu_bound": util is not None and not mixed})


#: The input finding's confidence when a single-process loader's wait may be the GIL's and the wait
#: sampler could not split it (below the calibration's upper band: shown as the lower band's rate).
#: Blind seed 446669882, w023: 1 ms steps beside a Python thread holding the GIL for 5 ms every
#: ~15 ms; the accounted steps (every 32nd) held none of the 12 stalled steps, the thread was asleep
#: on a lock in 4 samples (20 split one), and "input-bound, cheaper samples" came at 96 % while
#: removing the thread gained 46 % (there was no costly loading).
GIL_UNSPLIT_CONFIDENCE = 0.6


#: A thread holds the GIL at most while it runs, so its cores bound the share of the step a fetch
#: can have waited for it: below this share of the data wait, most of the wait is the loading's
#: (blind runs with costly samples beside such a thread: 0.16-0.22 of a core beside 75-97 % data
#: waits, right as input-bound; w023 above: 0.25 of a core beside a 25 % wait).
GIL_EXPLAINS_FROM = 0.5


def _gil_may_hold_the_fetch(ev: RunEvidence, wait: float) -> PythonThread | None:
    """The busy Python thread whose GIL a single-process loader's fetch may have waited for, when
    the wait sampler did not split the data wait (too few samples of the training thread asleep)
    and the thread ran long enough to hold the GIL for much of the wait (:data:`GIL_EXPLAINS_FROM`);
    None when the loader has workers, no other Python thread computed, or the split was measured
    (then the GIL's part is already the GIL finding's, :mod:`~stepscope.analysis.run.account`)."""
    loader, account = ev.main_loader, ev.account
    if loader is None or loader.num_workers > 0 or account is None:
        return None
    holder = account.gil_holder
    phase = account.phase("data_wait")
    if holder is None or phase is None or phase.off_split or holder.cores < GIL_EXPLAINS_FROM * wait:
        return None
    return holder


def _core_wait_its_workers_caused(ev: RunEvidence, busy: bool, evidence: list[Evidence]) -> float:
    """The training thread's (and its intra-op threads') wait for a core outside the data wait that
    the loader's busy workers caused (the thread account's charge to the run's own processes,
    :mod:`~stepscope.analysis.run.account`): the workers' CPU takes the cores the model needs, and
    producing samples more cheaply gives that time back too. Only for a run of one process whose
    own processes are its DataLoader workers (in a job the other ranks on the machine are its own
    processes too), the workers measured busy and kept across epochs (workers started anew spend
    their CPU starting, the epoch-boundary finding's cost, which the charge cannot tell from the
    samples'), and at least :data:`CORE_WAIT_PRICED` of the step. ``busy``: the loaders above
    :data:`LOADER_CPU_BUSY` of a core while the step waits, or, where every core was busy and that
    share is not conclusive, starved as the workers' own timing measured
    (:func:`~stepscope.diagnosis.rules._common.starved_workers`)."""
    account, record = ev.account, ev.record
    if account is None or record is None or not busy or record.meta.world_size > 1:
        return 0.0
    if common.restarts_workers(ev):
        return 0.0
    if not any(item.num_workers > 0 for item in record.loaders):
        return 0.0
    own = account.taker("own processes")
    total = account.waiting_core + account.peer_waiting
    loading = account.phase("data_wait")
    if own is None or own.step_share <= 0 or total <= 0:
        return 0.0
    outside = total - (loading.share * loading.waiting_core if loading is not None else 0.0)
    part = round(own.step_share * max(0.0, outside) / total, 4)
    if part < CORE_WAIT_PRICED:
        return 0.0
    evidence.append(Evidence("core_wait_workers_caused", part, CORE_WAIT_PRICED, "account", "ratio",
                             "of the step: the wait for a core outside the data wait charged to the DataLoader workers"))
    return part


#: Of the data wait, a wait for a core charged to other processes (or to the process's other Python
#: threads) at least this large is taken out of the finding's price.
CORE_WAIT_PRICED = 0.05


def priced_without_core_wait(ev: RunEvidence, wait: float, evidence: list[Evidence]) -> tuple[float, float]:
    """The data wait less the part the training thread spent runnable but waiting for a core that
    other processes, or the process's other Python threads, held (the thread account's measure,
    charged as :mod:`~stepscope.analysis.run.account` charges it): loading faster does not give back
    time a neighbour or a busy Python thread took. A wait for the run's own workers or intra-op
    threads stays in the price — that is how loading costs. Returns (the price, the share of the
    data wait taken out; 0 when nothing is)."""
    account = ev.account
    phase = account.phase("data_wait") if account is not None else None
    if phase is None or account is None or account.waiting_core <= 0:
        return wait, 0.0
    total = account.waiting_core + account.peer_waiting
    others = account.taker("other processes")
    parts = [("data_wait_waiting_core_others", others.step_share if others is not None else 0.0, "other processes"),
             ("data_wait_waiting_core_python_threads", account.python_core_wait, "the process's other Python threads")]
    taken = 0.0
    for name, share, who in parts:
        part = phase.waiting_core * min(1.0, share / total)
        if part >= CORE_WAIT_PRICED:
            evidence.append(Evidence(name, round(part, 4), CORE_WAIT_PRICED, "account", "ratio",
                                     f"of the data wait the training thread was runnable, waiting for a core {who} held"))
            taken += part
    taken = min(taken, phase.waiting_core)
    return (wait * (1.0 - taken), taken) if taken > 0 else (wait, 0.0)


def _from_trace(ev: RunEvidence) -> Finding | None:
    """A bare trace (no run record): the TensorBoard plugin's DataLoader share is the evidence."""
    share = ev.trace.shares.dataloader if ev.trace is not None else None
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
    workers = loader.num_workers if loader is not None else 0
    model = loading_model(ev, util)
    if model is not None and cores and workers < cores:
        plan = plan_workers(model)
        measured = "measured" if plan.compute_cores_measured else "assumed from its intra-op threads"
        cost = (f"workers take cores from the model, which uses {plan.compute_cores:.1f} of {cores} "
                f"({measured})")
        foreign = ev.foreign.cpu_share if ev.foreign is not None else 0.0
        if foreign >= 0.1:
            cost += f"; other processes held {foreign:.0%} of the cores, so the run had ~{model.cores:.1f}"
        low, high = common.rounded_range(plan.gain, "workers")
        if plan.gain >= common.MIN_GAIN:
            why = (f"loading one batch takes ~{common.ms(model.load_cpu_s)} of CPU and the model "
                   f"~{common.ms(model.compute_s)}; with {plan.workers} worker(s)")
            settings: dict[str, int | bool] = {"dataloader.num_workers": plan.workers}
            action = f"DataLoader(num_workers={plan.workers})"
            if plan.threads != model.threads:
                settings["torch.num_threads"] = plan.threads
                action += f" and torch.set_num_threads({plan.threads}) in the training process"
                why += (f" and {plan.threads} intra-op thread(s) in the training process (its {model.threads} "
                        "threads would fight the workers for the cores; workers alone would gain "
                        f"~{common.pct(max(0.0, 1 - predict(model, plan.workers, model.threads) / model.per_batch_s))})")
                cost += f"; the model computes on {plan.threads} thread(s)"
            why += (f" the step is expected to drop from ~{common.ms(model.per_batch_s)} to "
                    f"~{common.ms(plan.step_s)} per batch")
            if plan.cpu_bound:
                why += f", the {cores} cores then shared by loading and the model"
            out.append(Prescription(action, why, "num_workers", workers, plan.workers,
                                    expected_gain=round(plan.gain, 4), cost=cost, set=settings,
                                    expected_range=(low, high)))
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
        restarts = common.restart_share(ev)
        out.append(Prescription("DataLoader(persistent_workers=True)",
                                f"the epoch starts cost {common.pct(restarts)} of the step (the workers' "
                                "start-up and their first batch)",
                                "persistent_workers", False, True, expected_gain=round(restarts, 4),
                                set={"dataloader.persistent_workers": True},
                                expected_range=common.rounded_range(restarts, "restarts")))
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


FAMILY = FamilyEntry(
    "input_pipeline", (loader_cpu_bound,),
    diagnoses="The step waits for the next batch while the processes producing batches are busy on CPU: more workers, cheaper samples",
    evidence="Data wait (less worker start-up and the first batch of an epoch whose workers restart) ≥ 5 % of the step (XProf's input-bound levels 5 % / 20 %); the loaders' CPU while the step waits ≥ 0.5 core; workers against cores",
    supersedes=frozenset({"compute"}), cpu_based=True)
