"""The machine's CPU as the run used it: the loading processes' CPU while the step waits, the cores
the model's compute keeps busy, the threads that want the cores, and the load of processes outside
the job. Parts of the evidence bundle (:mod:`stepscope.analysis.bundle`), which assembles them.

Thresholds are not applied here: rules apply them. None is not measured, never zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from stepscope.analysis.evidence import MacroSignals, WorkerLoad
from stepscope.analysis.run.steady import SteadyState

if TYPE_CHECKING:  # annotations: a trace's evidence is built without the run record's classes
    from stepscope.record.run import LoaderInfo, RunRecord

#: Hypervisor steal worth naming, in a finding or the summary (below it, a virtual machine's
#: accounting noise).
STEAL_SHOWN = 0.01


@dataclass(frozen=True)
class LoaderCpu:
    """CPU (share of one core) of the processes that load data while the step waits for them."""

    util: float | None
    source: str  # how it was measured, ending "(capture)" or "(sampler)"

    @property
    def measured_by(self) -> str:
        return "steps" if self.source.endswith("(capture)") else "sampler"


@dataclass(frozen=True)
class CpuDemand:
    """How many threads want the cores, and how much of them the training tree uses."""

    cores: int
    cpu_util: float  # all cores, 0..1
    runnable_per_core: float | None
    busy_workers: int
    worker_threads: int | None  # most threads of a busy worker, when every busy worker's count is known
    demand: int | None  # main intra-op threads + busy workers' threads
    main_threads: int
    tree_cores: float  # cores the training tree (main + workers) uses
    #: most threads a busy worker ran on, on average (its CPU over its main thread's), when every
    #: busy worker's was measured; None otherwise (older files, another platform)
    worker_running_threads: float | None = None
    #: main intra-op threads + the threads the busy workers ran on, when every one was measured
    running_demand: float | None = None


@dataclass(frozen=True)
class ForeignProcess:
    """A process outside the run's own tree and the CPU it used while the steps ran."""

    pid: int
    name: str
    cpu_util: float  # share of one core


@dataclass(frozen=True)
class ForeignLoad:
    """Processes outside the job that used the machine during the run."""

    cpu_share: float  # share of all cores used outside the training tree (steal included)
    processes: tuple[ForeignProcess, ...]  # the busiest ones, when the sampler named them
    #: of which the hypervisor gave other guests (steal): cores a virtual machine did not get
    steal_share: float = 0.0
    #: what they measurably took from the step: the training thread's wait for a core charged to
    #: them by their CPU over the window (share of the step; None without the thread account)
    step_cost: float | None = None


# -- loading -------------------------------------------------------------------------------------
#: Cores the model's compute is taken to keep busy when no measurement says otherwise.
COMPUTE_CORES_ASSUMED = 1.0


def loader_cpu(record: RunRecord, steady: SteadyState | None, signals: MacroSignals | None,
               loader: LoaderInfo | None) -> LoaderCpu:
    """CPU of the loading processes while the step waits.

    Measured values take precedence: with ``num_workers=0``, the training thread's own CPU time
    inside ``next()`` (capture's ``data_wait_cpu_ns``: immune to other threads of the process,
    such as spinning OpenMP workers); with workers, the sampler's ``data_wait_cpu_util``, else the
    workers' mean. Without either, the main process's CPU less what its compute explains (compute
    taken to keep one core busy for ``1 - data_wait`` of the time).
    """
    if steady is None:
        return LoaderCpu(None, "no steps")
    if loader is not None and loader.num_workers == 0:
        steps = record.steps
        cpu = steps.data_wait_cpu_ns[steady.mask]
        wait = steps.data_wait_ns[steady.mask] - steps.loader_init_ns[steady.mask]
        known = cpu >= 0
        if known.any() and wait[known].sum() > 0:
            return LoaderCpu(min(1.0, float(cpu[known].sum() / wait[known].sum())),
                             "training thread's CPU time inside next() (capture)")
    if signals is None:
        return LoaderCpu(None, "not known without sampler evidence")
    if signals.data_wait_cpu_util is not None:
        return LoaderCpu(float(signals.data_wait_cpu_util), "loading processes while the step waited (sampler)")
    if loader is not None and loader.num_workers > 0:
        util = signals.worker_cpu_util_mean
        return LoaderCpu(None if util is None else float(util), "mean of the DataLoader workers (sampler)")
    if signals.main_cpu_util is None or steady.data_wait_share <= 0:
        return LoaderCpu(None, "not known without sampler evidence")
    compute = (1.0 - steady.data_wait_share) * COMPUTE_CORES_ASSUMED
    residual = max(0.0, float(signals.main_cpu_util) - compute) / steady.data_wait_share
    return LoaderCpu(min(residual, 1.0), "main process, less what its compute explains (sampler)")


def compute_cores(steady: SteadyState | None, signals: MacroSignals | None, loader: LoaderInfo | None,
                  record: RunRecord) -> float | None:
    """Cores the training process keeps busy while it is *not* waiting for data (None unknown).

    The main process's CPU over the steady state, less the CPU it spent loading (``num_workers=0``:
    capture's ``data_wait_cpu_ns``), divided by the time it was not waiting. This is what DataLoader
    workers would compete with: a model that already uses every core gains nothing from workers.
    """
    if steady is None or signals is None or signals.main_cpu_util is None:
        return None
    busy = 1.0 - steady.fetch_wait_share
    if busy <= 0.05:
        return None
    loading = 0.0
    if loader is None or loader.num_workers == 0:
        # the main process also loads: only capture's own measurement of that CPU separates the two
        steps = record.steps
        cpu = steps.data_wait_cpu_ns[steady.mask]
        known = cpu >= 0
        durations = steps.duration_ns[steady.mask]
        if steady.fetch_wait_share > 0 and (not known.any() or durations[known].sum() <= 0):
            return None
        loading = float(cpu[known].sum() / durations[known].sum()) if known.any() else 0.0
    return max(0.0, (float(signals.main_cpu_util) - loading) / busy)


# -- CPU demand ----------------------------------------------------------------------------------
#: A worker above this share of one core counts as busy (idle workers compete for nothing).
BUSY_WORKER = 0.1


def cpu_demand(signals: MacroSignals | None, cores: int | None, intra_op_threads: int | None) -> CpuDemand | None:
    if signals is None or not cores or signals.cpu_util_mean is None:
        return None
    busy = [load for load in signals.workers if load.role == "dataloader_worker" and load.cpu_util >= BUSY_WORKER]
    threads = [load.threads for load in busy if load.threads]
    main_threads = intra_op_threads or 1
    known = bool(threads) and len(threads) == len(busy)
    # each busy worker's own measure, or where one was too short-lived to read, the workers' pooled one
    pooled = signals.worker_running_threads
    running = [_threads_that_compete(load, pooled) for load in busy
               if load.running_threads is not None or pooled is not None]
    measured = bool(running) and len(running) == len(busy)
    # workers restarted every epoch are several processes in turn, each over its own part of the
    # window: each counts for that part, so the threads and cores counted are those that ran at once
    # (a zoo run beside four busy processes, workers restarted each epoch: six worker processes, two
    # at a time, counted as six read "oversubscribed" where the crowd was the other processes')
    share = [load.presence for load in busy]
    return CpuDemand(
        cores=cores, cpu_util=float(signals.cpu_util_mean),
        runnable_per_core=signals.runnable_threads_per_core,
        busy_workers=max(1, round(sum(share))) if busy else 0,
        worker_threads=max(threads) if known else None,
        demand=main_threads + round(sum(count * part for count, part in zip(threads, share))) if known else None,
        main_threads=main_threads, tree_cores=sum(load.cpu_util * load.presence for load in signals.workers),
        worker_running_threads=max(running) if measured else None,
        running_demand=main_threads + sum(count * part for count, part in zip(running, share)) if measured else None,
    )


def _threads_that_compete(load: WorkerLoad, pooled: float | None = None) -> float:
    """The threads a busy worker ran on, counting its threads beyond the main one only where
    together they used :data:`BUSY_WORKER` of a core or more: a worker whose main thread mostly
    sleeps (slow reads, cheap samples) spends a large share of its little CPU in its queue's feeder
    thread, pickling batches (blind workers at 0.10-0.22 of a core read 1.5-2.1 threads), which,
    like an idle worker, competes for nothing. ``pooled``: the workers' measure pooled over
    all of them, for a worker too short-lived to be read alone."""
    running = float(load.running_threads or pooled or 1.0)
    extra = load.cpu_util * (1.0 - 1.0 / running) if running > 1.0 else 0.0
    return running if extra >= BUSY_WORKER else 1.0


def foreign_load(signals: MacroSignals | None, cores: int | None, sibling_cores: float = 0.0,
                 sibling_pids: frozenset[int] = frozenset()) -> ForeignLoad | None:
    """Share of all cores used by processes outside the training tree (and outside the job's other
    ranks on this machine), and the busiest of them. The tree's CPU includes its children that no
    sample saw (DataLoader workers restarted every epoch, compile workers); the job's other ranks
    are known from this job's records (``sibling_cores``) or the sampler's scan of the launcher's
    processes (``signals.job_cores``)."""
    own = own_process_cores(signals, sibling_cores)
    if signals is None or not cores or signals.cpu_util_mean is None or own is None:
        return None
    main = sum(load.cpu_util for load in signals.workers if load.role == "main")
    tree = (main + own) / cores
    steal = float(signals.steal_share or 0.0)
    share = max(0.0, float(signals.cpu_util_mean) - tree) + steal
    processes = tuple(ForeignProcess(pid, name, util) for pid, name, util in signals.foreign_processes
                      if pid not in sibling_pids)
    return ForeignLoad(round(share, 4), processes, round(steal, 4))


def tree_cores(signals: MacroSignals | None) -> float | None:
    """Cores the training tree used: the training process, its DataLoader workers and its other
    children (those no sample saw included); None without the sampler's view of it."""
    if signals is None or not signals.workers:
        return None
    return sum(load.cpu_util for load in signals.workers) + (signals.unseen_tree_cores or 0.0)


def own_process_cores(signals: MacroSignals | None, sibling_cores: float = 0.0) -> float | None:
    """Cores of the run's own processes besides the training process: DataLoader workers and other
    children (those no sample saw included) and the job's other ranks on this machine."""
    if signals is None or not signals.workers:
        return None
    return (sum(load.cpu_util for load in signals.workers if load.role != "main") + (signals.unseen_tree_cores or 0.0)
            + max(sibling_cores, signals.job_cores or 0.0))
