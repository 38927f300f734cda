"""CPU oversubscription: more runnable threads than cores, so every process runs slower.

The classic shape: several DataLoader workers, each running multi-threaded math (torch intra-op
threads set in a ``worker_init_fn``, NumPy/BLAS/OpenMP pools), plus the training process's own
intra-op threads, on a machine with few cores. The step then waits for data, which a naive rule
calls "input-bound" and answers with *more workers* (the mistake TraceML makes) — making it worse.
This rule fires first and the input-pipeline rule stands down when it does.

Evidence (sampler): all cores busy, and either the run queue far above the core count or the
threads the training tree runs (main intra-op threads + workers' threads) far above the cores.
Which of a worker's threads run is measured where the sampler read each worker's main thread's
CPU beside the whole process's: a worker computing on its main thread alone (the default) adds
one thread, whatever helper threads it holds, and a run queue the tree's own threads cannot fill
is not the tree's doing (zoo ``worker-tokenize``: two such workers and the training thread on 2
cores, a run queue of 1.5-2.1 per core from the training tree plus short-lived threads).
On a virtual machine whose hypervisor serves other guests (steal), "most of the cores" is
measured against the cores the guest got.
"""

from __future__ import annotations

from typing import Any

from stepscope.analysis.bundle import CpuDemand, RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common
from stepscope.diagnosis.rules._common import CPU_SATURATED

#: Runnable threads per core at which the run queue is "far above" the cores (see
#: :data:`~stepscope.diagnosis.rules._common.RUN_QUEUE_SATURATED`).
RUNNABLE_PER_CORE_HIGH = common.RUN_QUEUE_SATURATED
#: A run queue that corroborates a thread count: at the saturation level of the run-queue path.
RUNNABLE_CORROBORATES = common.RUN_QUEUE_SATURATED
#: Threads the training tree wants to run (intra-op threads + busy workers' threads) per core.
THREAD_DEMAND_PER_CORE_HIGH = 2.0
#: Share of all cores the training tree itself must use for the run queue to be *its* doing
#: (otherwise other processes on the machine crowd it, which is not this run's setting to fix).
TREE_SHARE_OF_CORES = 0.75
#: The share of CPU time a thread loses to contention is capped here in the impact estimate.
CONTENTION_CAP = 0.75


def oversubscription(ev: RunEvidence) -> dict[str, Any] | None:
    """The oversubscription evidence, or None when the CPU is not oversubscribed.

    Two independent paths, both requiring all cores busy (the measurements are the bundle's
    :class:`~stepscope.analysis.bundle.CpuDemand`):

    - *threads*: the sampler knows each worker's OS threads; multi-threaded busy workers plus the
      training process's intra-op threads reach :data:`THREAD_DEMAND_PER_CORE_HIGH` per core;
    - *run queue*: runnable threads reach :data:`RUNNABLE_PER_CORE_HIGH` per core while the
      training tree itself uses most of the cores and the step waits for data (so the crowd is
      this run's loaders, not a neighbour's job).
    """
    demand = ev.cpu_demand
    if demand is None or not common.cpu_saturated(ev):
        return None
    cores = demand.cores
    wait = ev.steady.data_wait_share if ev.steady is not None else 0.0
    # threads that exist are not threads that run: when the run queue was measured it must
    # corroborate (idle helper threads of single-threaded workers crowd nothing)
    # and the crowd must be this run's: its own processes use most of the cores (a neighbour's job
    # fills the run queue just as well)
    queue_agrees = demand.runnable_per_core is None or demand.runnable_per_core >= RUNNABLE_CORROBORATES
    # the cores there were to use: on a virtual machine, less what the hypervisor gave other guests
    # (steal); other processes' load is not subtracted (a neighbour's crowd is not this run's doing)
    steal = common.steal_share(ev) * cores
    ours = demand.tree_cores >= TREE_SHARE_OF_CORES * max(1.0, cores - steal)
    threaded = threaded_workers(demand)
    # the threads that run where they were measured, else the threads that exist
    wanted = demand.running_demand if demand.running_demand is not None else demand.demand
    by_threads = (wanted is not None and threaded and queue_agrees and ours
                  and wanted / cores >= THREAD_DEMAND_PER_CORE_HIGH)
    # a queue the tree's measured threads cannot fill is someone else's (or short-lived threads')
    tree_fills = demand.running_demand is None or demand.running_demand / cores >= RUNNABLE_PER_CORE_HIGH
    by_queue = (demand.runnable_per_core is not None and demand.runnable_per_core >= RUNNABLE_PER_CORE_HIGH
                and demand.busy_workers > 0 and ours and tree_fills
                and wait >= common.INPUT_MODERATE)
    if not (by_threads or by_queue):
        return None
    return {"cores": cores, "runnable_per_core": demand.runnable_per_core, "demand": demand.demand,
            "cpu_util": demand.cpu_util, "worker_threads": demand.worker_threads,
            "tree_cores": demand.tree_cores, "main_threads": demand.main_threads, "workers": demand.busy_workers,
            "threaded_workers": threaded, "worker_running_threads": demand.worker_running_threads}


#: Runnable threads beyond the training process's intra-op threads and one per busy worker that a
#: run queue may hold before the workers' own threads are taken to run (another Python thread, the
#: sampler, a pin-memory thread).
QUEUE_SLACK = 1.0
#: Threads a worker runs on, on average (its CPU over its main thread's), from which its extra
#: threads count as running: the others did at least half the main thread's work.
RUNNING_THREADED = 1.5


def threaded_workers(demand: CpuDemand) -> bool:
    """Whether the busy workers' extra threads run. A DataLoader worker has several OS threads (a
    queue's feeder, an idle intra-op pool: 3 for a default worker on torch 2.x) but computes on one
    unless its ``worker_init_fn`` or a BLAS pool says otherwise; threads that exist are not threads
    that run. Measured directly where the sampler read the workers' main threads' CPU (a worker
    that ran on :data:`RUNNING_THREADED` threads or more); else inferred from the run queue: more
    runnable threads than the training process's intra-op threads plus one per busy worker (and
    :data:`QUEUE_SLACK`) are the workers' own. Without either, a worker of more than one thread
    counts as threaded."""
    if demand.worker_running_threads is not None:
        return demand.worker_running_threads >= RUNNING_THREADED
    if (demand.worker_threads or 0) <= 1:
        return False
    if demand.runnable_per_core is None:
        return True
    return demand.runnable_per_core * demand.cores > demand.main_threads + demand.busy_workers + QUEUE_SLACK


def oversubscribed_cpu(ev: RunEvidence) -> Finding | None:
    facts = oversubscription(ev)
    if facts is None or ev.steady is None:
        return None
    stats = ev.steady
    cores = facts["cores"]
    per_core = facts["runnable_per_core"] or (facts["demand"] or cores) / cores
    contention = min(CONTENTION_CAP, max(0.0, 1.0 - 1.0 / per_core))
    # the wait while workers start (every epoch without persistent_workers) is the epoch boundary's
    # own finding and fix: the crowd's cost is the wait for batches once they run (blind seed
    # 837699942: workers restarted every 2 steps, 77 % of the step waiting for data of which most
    # was their start-up; removing the restarts gained 82 %, and "oversubscribed" claimed all 77 %)
    # the data wait is the crowd's where it slows the workers; workers that timed themselves keeping
    # pace, their waits for a core included, are not what the step waited for (blind w036 of seed
    # 348790310: one worker at 0.38 ms a batch under a 2.7 ms step, a Python thread spinning in the
    # training process +66 %, and "oversubscribed" priced at the whole 50 % wait led it)
    floor = ev.loader_floor
    waited = stats.fetch_wait_share if floor is None else floor.paced_wait(stats.fetch_wait_share)
    impact = max(waited, contention * stats.compute_share)
    evidence = [Evidence("cpu_util_mean", round(facts["cpu_util"], 3), CPU_SATURATED, "sampler", "ratio",
                         "all cores")]
    if facts["runnable_per_core"] is not None:
        evidence.append(Evidence("runnable_threads_per_core", round(facts["runnable_per_core"], 2),
                                 RUNNABLE_PER_CORE_HIGH, "sampler", "count", "machine"))
    if facts["demand"] is not None:
        evidence.append(Evidence("thread_demand", facts["demand"], THREAD_DEMAND_PER_CORE_HIGH * cores,
                                 "sampler", "count", "main intra-op threads + busy workers' threads"))
    if facts["worker_running_threads"] is not None:
        evidence.append(Evidence("worker_running_threads", round(facts["worker_running_threads"], 2), RUNNING_THREADED,
                                 "sampler", "count", "threads a busy worker ran on (its CPU over its main thread's)"))
    evidence.append(Evidence("training_tree_cores", round(facts["tree_cores"], 2), None, "sampler", "cores",
                             "main process + workers"))
    evidence.append(Evidence("data_wait_share", round(stats.data_wait_share, 4), None, "steps", "ratio",
                             "steady state"))
    if stats.loader_init_share > 0:
        evidence.append(Evidence("worker_startup_share", round(stats.loader_init_share, 4), None, "steps", "ratio",
                                 "of the data wait, DataLoader workers starting (the epoch boundary's cost)"))
    kind = "runnable" if facts["runnable_per_core"] is not None else "busy"
    title = (f"CPU oversubscribed: ~{per_core:.1f} {kind} threads per core on {cores} cores "
             "(more workers would make it worse)")
    summary = (f"All cores are busy ({facts['cpu_util']:.0%}) and threads queue for them; the step "
               f"waits {common.pct(stats.data_wait_share)} of its time for data. This looks "
               "input-bound, but adding DataLoader workers adds threads to the queue.")
    if floor is not None and waited < stats.fetch_wait_share:
        summary += (f" The workers keep pace, though ({floor.pace()}): "
                    f"{'none' if waited <= 0 else 'only ' + common.pct(waited)} of that wait is theirs, so the "
                    "cost is the model's time slowed by the queue for cores.")
    return common.finding("cpu_oversubscription.threads_exceed_cores", "cpu_oversubscription", title,
                          impact, 0.85, evidence, _prescriptions(ev, facts), summary,
                          threaded_workers=facts["threaded_workers"])


def _prescriptions(ev: RunEvidence, facts: dict[str, Any]) -> list[Prescription]:
    cores = facts["cores"]
    main_threads = facts["main_threads"]
    loader = ev.main_loader
    workers = loader.num_workers if loader is not None else facts["workers"]
    out = []
    per_worker = facts["worker_threads"]
    if per_worker is None or facts["threaded_workers"]:
        out.append(Prescription(
            "One thread per DataLoader worker: worker_init_fn that calls torch.set_num_threads(1), "
            "and OMP_NUM_THREADS=1 / MKL_NUM_THREADS=1 / OPENBLAS_NUM_THREADS=1 for NumPy/BLAS",
            f"each worker runs {per_worker or 'several'} threads on {cores} cores",
            "worker_threads", per_worker, 1))
    budget_workers = max(1, cores - min(main_threads, cores - 1 if cores > 1 else 1))
    if workers > budget_workers:
        out.append(Prescription(
            f"DataLoader(num_workers={budget_workers})",
            f"{cores} cores = {cores - budget_workers} for the training process + {budget_workers} "
            f"worker(s); {workers} workers only queue for the same cores. Do not add workers.",
            "num_workers", workers, budget_workers))
    if main_threads > 1 and main_threads + budget_workers > cores:
        suggested = max(1, cores - budget_workers)
        out.append(Prescription(
            f"torch.set_num_threads({suggested}) in the training process",
            f"{main_threads} intra-op threads + {budget_workers} worker(s) > {cores} cores",
            "intra_op_threads", main_threads, suggested))
    return out


def _input_is_moot(cause: Finding, symptom: Finding) -> bool:
    """An input-bound finding is moot beside oversubscribed cores when the crowd is the workers' own
    threads (one thread per worker removes it) or when its fix adds workers or intra-op threads
    (the queue for the cores grows). Single-threaded workers busy with costly samples make the
    crowd themselves, and an input finding that prescribes cheaper samples is not contradicted by
    it: both are shown, ranked by their costs (blind seed 1167454856, w012: 2 busy default workers
    on 2 cores, the input finding priced at 90 % was superseded by "oversubscribed" at 36 %, whose
    thread and worker cuts leave the loading; removing the costly samples gained 82 %)."""
    if cause.extra.get("threaded_workers", True):
        return True
    first = symptom.prescriptions[0] if symptom.prescriptions else None
    if first is None:
        return True
    return (first.setting in ("num_workers", "intra_op_threads") and isinstance(first.suggested, int)
            and isinstance(first.current, int) and first.suggested > first.current)


FAMILY = FamilyEntry(
    "cpu_oversubscription", (oversubscribed_cpu,),
    diagnoses="More runnable threads than cores: workers and intra-op threads fight each other",
    evidence="All cores busy with busy workers' threads + intra-op threads ≥ 2 per core (the workers' extra threads run: measured from their main threads' CPU, else the run queue holds more threads than the intra-op threads and one per worker), or a run queue ≥ 2 per core while this run uses ≥ 75 % of the cores and, where measured, its running threads could fill it",
    supersedes=frozenset({"input_pipeline", "storage_io", "compute", "launch_overhead"}),
    supersedes_when=(("input_pipeline", _input_is_moot),), cpu_based=True)
