"""The evidence bundle: everything known about one rank, computed once, the only input of the rules.

:func:`build_evidence` is the one function that turns a run record (and, when present, the
sampler's samples, a trace's evidence and the other ranks' records) into a :class:`RunEvidence`.
``stepscope run``, ``stepscope report`` and ``stepscope analyze`` all call it; the diagnosis rules
read nothing else, and the :class:`~stepscope.report.model.Report` takes its numbers from it.

Every derived measurement that more than one rule (or a rule and a renderer) needs lives here, so
two readers never compute the same number twice or differently:

- the steady state (:class:`~stepscope.analysis.run.steady.SteadyState`): warm-up, excluded steps,
  phase shares, percentiles;
- the loading processes' CPU while the step waits (:class:`LoaderCpu`);
- storage signs (:class:`StorageSigns`): iowait, page-cache warming, a slow first epoch;
- CPU demand (:class:`CpuDemand`): runnable threads, threads the training tree wants, its cores;
- the cores the model's compute keeps busy (``compute_cores``), which prices DataLoader workers;
- per-operator overhead (:class:`OpOverhead`) from the counted step;
- MFU against the peak of the dtype that ran, with its uncertainty (:class:`MfuEstimate`);
- foreign load: processes outside the job that used the machine (:class:`ForeignLoad`);
- the code that owns each phase (:class:`~stepscope.analysis.run.code_locations.CodeAttribution`,
  from the stack samples) and the garbage collector's pauses
  (:class:`~stepscope.analysis.run.gc_pauses.GcPauseSummary`), over the steady state.

The host's CPU measurements (loader CPU, compute cores, CPU demand, foreign load) are computed in
:mod:`stepscope.analysis.host_cpu` and importable from here too.

Thresholds are not applied here: rules apply them. Any part may be None (not measured); None is
never zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from stepscope.analysis.evidence import MacroSignals, TraceEvidence
from stepscope.analysis.host_cpu import (BUSY_WORKER as BUSY_WORKER,
                                         COMPUTE_CORES_ASSUMED as COMPUTE_CORES_ASSUMED, CpuDemand as CpuDemand,
                                         ForeignLoad as ForeignLoad, ForeignProcess as ForeignProcess,
                                         LoaderCpu as LoaderCpu, compute_cores as compute_cores,
                                         cpu_demand as cpu_demand, foreign_load as foreign_load,
                                         loader_cpu as loader_cpu, own_process_cores as own_process_cores,
                                         tree_cores as tree_cores)
from stepscope.analysis.run.loader_floor import LoaderFloor, loader_floor
from stepscope.analysis.run.mfu import mfu, peak_flops
from stepscope.analysis.run.steady import SteadyState, steady_state
from stepscope.record.facts import CaptureFacts

if TYPE_CHECKING:  # what only a run record brings: imported where a record's evidence is built (`analyze` loads none)
    from stepscope.analysis.run.account import ThreadAccountView
    from stepscope.analysis.run.code_locations import CodeAttribution, CodeLocation
    from stepscope.analysis.run.compile_summary import CompileSummary
    from stepscope.analysis.run.gc_pauses import GcPauseSummary
    from stepscope.analysis.run.input_profile import ColdStart, InputProfile
    from stepscope.analysis.run.stalls import PeriodicStall
    from stepscope.analysis.run.window import SteadyWindow
    from stepscope.record.run import DeviceInfo, LoaderInfo, RunRecord, StepTable

#: Fixed host cost of one eager PyTorch operator (Python binding, dispatcher, autograd record)
#: where the run did not measure it: measured 4.7 µs per aten op (forward + backward + optimizer)
#: on tiny Linear layers on the reference 2-core machine; the lower 3 µs keeps the estimate
#: conservative.
EAGER_OP_OVERHEAD_S = 3e-6
#: What :mod:`stepscope.capture.op_cost` measures on that reference machine (a tiny Linear model's
#: training step time per operator, its fastest step: 3.14-3.61 µs in ten measurements, five
#: processes, the machine idle; median 3.28).
REFERENCE_OP_COST_S = 3.3e-6
#: The share of the cost a run measured taken as the price of an operator: the price is 3 µs on the
#: reference machine, the same conservative margin, and scales with the machine (2.5x slower
#: machines pay 2.5x more per operator: 11.5 µs was measured there against 3 µs assumed).
MEASURED_OP_COST_SHARE = EAGER_OP_OVERHEAD_S / REFERENCE_OP_COST_S
#: On CPU the step is compared with a best-case peak, so the step is taken best-case too.
GPU_KINDS = ("cuda", "rocm", "gpu")


@dataclass(frozen=True)
class StorageSigns:
    """Signs that loading waits on storage."""

    iowait_share: float | None
    page_cache_warming: bool
    first_epoch_ratio: float | None  # first epoch's fetch wait per step over later epochs'
    #: the input pipeline per epoch (or third): data wait, reads, iowait, loaders' CPU
    profile: InputProfile | None = None
    #: the first epoch waited on storage (cold data), with its measured excess; None otherwise
    cold: ColdStart | None = None


@dataclass(frozen=True)
class OpOverhead:
    """Per-operator overhead estimated from the FLOP-counted step's operator count."""

    ops_per_step: int
    mean_op_s: float  # step time / operators
    share: float  # ops × price_s / step time
    #: the price of one operator: MEASURED_OP_COST_SHARE of this machine's measured cost, else
    #: EAGER_OP_OVERHEAD_S (``measured`` says which)
    price_s: float = EAGER_OP_OVERHEAD_S
    measured: bool = False


@dataclass(frozen=True)
class MfuEstimate:
    """Model FLOPs utilisation of the steady state, never above 1.

    ``low``/``high`` bound it from the spread of the step times (p10–p90 of steady steps: of their
    device times on a GPU where CUDA events timed every steady step) and, on CPU, of the measured
    peak. ``peak`` is the peak of ``dtype`` — the dtype that carried most of
    the counted step's FLOPs.
    """

    value: float
    low: float
    high: float
    peak_flops: float
    dtype: str
    peak_source: str
    on_gpu: bool
    flops_per_step: float
    step_time_s: float


@dataclass(frozen=True)
class CommShares:
    """Collective time of the steady state (capture's ``communication`` columns).

    ``exposed`` is the ``communication`` phase (the step waits in collectives); ``overlapped`` is
    collective time that ran under other phases (DDP buckets during backward, CUDA device time).
    """

    exposed_share: float
    overlapped_share: float
    exposed_s: float  # per step
    overlapped_s: float  # per step

    @property
    def total_share(self) -> float:
        return self.exposed_share + self.overlapped_share


@dataclass(frozen=True)
class RankSteady:
    """Another rank of the same job: its steady state, for cross-rank rules."""

    rank: int
    steady: SteadyState
    loader: LoaderInfo | None = None
    comm: CommShares | None = None
    node: int = 0
    hostname: str = ""
    #: the rank's top user-code location outside the model ("other" phase, steady state), with its
    #: measured share of that rank's step; None without stack samples there
    other_code: CodeLocation | None = None
    #: its steps (the step index is the job's: every rank's step i ends at the same collectives)
    steps: StepTable | None = field(default=None, repr=False, compare=False)
    #: the share of each phase its training thread spent on a CPU (its thread account; empty
    #: where not measured)
    on_cpu: Mapping[str, float] = field(default_factory=dict, compare=False)
    #: cores its process tree (training process and workers) used over the steady window, and the
    #: cores of its machine; None without the sampler
    tree_cores: float | None = None
    machine_cores: int | None = None
    #: its busiest DataLoader's measured floor (the workers' own time per step); None where the
    #: workers' batches were not timed
    floor: LoaderFloor | None = field(default=None, compare=False)

    def own_work_s(self, phases: tuple[str, ...]) -> float:
        """Mean seconds per step in ``phases``."""
        return sum(self.steady.shares.get(phase, 0.0) for phase in phases) * self.steady.step_time_mean_s


@dataclass(frozen=True)
class RunEvidence:
    """All evidence about one rank (or one trace). Build it with :func:`build_evidence`."""

    record: RunRecord | None = None
    steady: SteadyState | None = None
    signals: MacroSignals | None = None
    trace: TraceEvidence | None = None
    facts: CaptureFacts = field(default_factory=CaptureFacts)
    ranks: tuple[RankSteady, ...] = ()
    cpu_count: int | None = None
    intra_op_threads: int | None = None
    gpu: DeviceInfo | None = None
    main_loader: LoaderInfo | None = None
    loader_cpu: LoaderCpu = LoaderCpu(None, "not known without sampler evidence")
    storage: StorageSigns = StorageSigns(None, False, None)
    cpu_demand: CpuDemand | None = None
    compute_cores: float | None = None
    op_overhead: OpOverhead | None = None
    mfu: MfuEstimate | None = None
    mfu_note: str | None = None
    foreign: ForeignLoad | None = None
    code: CodeAttribution | None = None
    gc: GcPauseSummary | None = None
    #: torch.compile over the run (compilations, recompiles, graph breaks, the recompile limit)
    compile: CompileSummary | None = None
    comm: CommShares | None = None
    stall: PeriodicStall | None = None
    #: the steady window every averaging view above covers (None without steps)
    window: SteadyWindow | None = None
    #: a trace's exclusive Python share of host time less the step's data wait and "other" (the run
    #: record's shares, or the trace's DataLoader share without a record): Python in the model
    python_in_model: float | None = None
    #: where the training thread's time went: on CPU, waiting for a core, off CPU, per phase
    account: ThreadAccountView | None = None
    #: what this rank's wait in collectives was: the other ranks' own work (None outside a job)
    peer: PeerWait | None = None
    #: what the steps that start an epoch cost (worker start-up and their first batch)
    boundaries: EpochBoundaries | None = None
    #: the main DataLoader's pace from its workers' own time per batch (None: not timed)
    loader_floor: LoaderFloor | None = None

    @property
    def loaders(self) -> tuple[LoaderInfo, ...]:
        return self.record.loaders if self.record is not None else ()

    def to_dict(self) -> dict[str, Any]:
        """The derived measurements (what ``report.json`` carries under ``evidence``)."""
        return {
            "cpu_count": self.cpu_count,
            "intra_op_threads": self.intra_op_threads,
            "loader_cpu": asdict(self.loader_cpu),
            "storage": asdict(self.storage),
            "cpu_demand": asdict(self.cpu_demand) if self.cpu_demand is not None else None,
            "compute_cores": self.compute_cores,
            "op_overhead": asdict(self.op_overhead) if self.op_overhead is not None else None,
            "mfu": asdict(self.mfu) if self.mfu is not None else None,
            "mfu_note": self.mfu_note,
            "foreign": asdict(self.foreign) if self.foreign is not None else None,
            "code": self.code.to_dict() if self.code is not None else None,
            "gc": self.gc.to_dict() if self.gc is not None else None,
            "ranks": [item.rank for item in self.ranks],
            "communication": asdict(self.comm) if self.comm is not None else None,
            "periodic_stall": asdict(self.stall) if self.stall is not None else None,
            "compile": self.compile.to_dict() if self.compile is not None else None,
            "thread_account": asdict(self.account) if self.account is not None else None,
            "peer_wait": asdict(self.peer) if self.peer is not None else None,
            "epoch_boundaries": asdict(self.boundaries) if self.boundaries is not None else None,
            "loader_floor": asdict(self.loader_floor) if self.loader_floor is not None else None,
            "window": None if self.window is None else {
                "basis": self.window.basis, "span_s": self.window.span_s, "steady_steps": int(self.window.mask.sum())},
        }


@dataclass(frozen=True)
class RankBasis:
    """One rank's record with what its evidence and the other ranks' evidence share, computed once:
    the steady state, the steady window, the sampler's signals over that window, the code
    attribution of that window, and how the other ranks see this one (:class:`RankSteady`)."""

    record: RunRecord
    steady: SteadyState | None
    window: SteadyWindow | None
    signals: MacroSignals | None
    code: CodeAttribution | None
    summary: RankSteady | None

    @property
    def rank(self) -> int:
        return self.record.meta.rank


def rank_basis(record: RunRecord, signals: MacroSignals | None = None) -> RankBasis:
    """The :class:`RankBasis` of a record (``signals``: given, or computed from its samples)."""
    from stepscope.analysis.run.window import steady_window

    steady = steady_state(record)
    window = None
    if steady is not None:
        window = steady_window(record.steps, steady.mask,
                               record.samples.ts_ns if record.samples is not None else None)
    if signals is None and record.samples is not None:
        from stepscope.analysis.run.signals import compute_signals

        signals = compute_signals(record.samples, record.steps, window)
    code = code_attribution(record, steady)
    summary = None
    if steady is not None:
        phase = code.phase("other") if code is not None else None
        other = next((item for item in phase.locations if not item.library), None) if phase is not None else None
        from stepscope.analysis.run.account import phase_on_cpu

        loader = busiest_loader(record)
        summary = RankSteady(record.meta.rank, steady, loader, comm_shares(record, steady),
                             record.meta.node_rank, record.meta.hostname, other, record.steps,
                             phase_on_cpu(record, steady), tree_cores(signals),
                             signals.cpu_count if signals is not None else None,
                             loader_floor(record, steady, loader))
    return RankBasis(record, steady, window, signals, code, summary)


def job_evidence(bases: Sequence[RankBasis], traces: Mapping[int, TraceEvidence] | None = None) -> tuple[RunEvidence, ...]:
    """Every rank's :class:`RunEvidence`, each built with the same facts about the others: the
    job's ranks as the cross-rank rules see them, and the ranks on the same machine (whose CPU is
    the job's, not foreign load)."""
    summaries = tuple(basis.summary for basis in bases if basis.summary is not None)
    job = summaries if len(bases) > 1 and len(summaries) == len(bases) else ()
    out = []
    for basis in bases:
        host = basis.record.meta.hostname
        siblings = tuple(other for other in bases if other is not basis and other.record.meta.hostname == host)
        out.append(_evidence(basis, (traces or {}).get(basis.rank), job, siblings))
    return tuple(out)


def build_evidence(record: RunRecord | None = None, signals: MacroSignals | None = None,
                   trace: TraceEvidence | None = None, ranks: tuple[RunRecord, ...] = ()) -> RunEvidence:
    """The :class:`RunEvidence` of one rank (the pipeline builds a job's at once with
    :func:`job_evidence`; this is the same for one record).

    Args:
        record: the run record (None for a bare trace).
        signals: the sampler's signals; derived from ``record.samples`` when None.
        trace: a trace's evidence for this rank.
        ranks: every rank's record of the same job (this one included) for cross-rank rules.
    """
    if record is None:
        return trace_evidence(trace)
    bases = [rank_basis(item, signals if item is record else None) for item in ranks if item is not record]
    own = rank_basis(record, signals)
    if not ranks:
        return job_evidence([own], {record.meta.rank: trace} if trace is not None else None)[0]
    ordered = sorted([own, *bases], key=lambda basis: basis.rank)
    evidences = job_evidence(ordered, {record.meta.rank: trace} if trace is not None else None)
    return evidences[ordered.index(own)]


def trace_evidence(trace: TraceEvidence | None) -> RunEvidence:
    """The evidence of a bare trace (no run record)."""
    return RunEvidence(trace=trace, mfu_note="no run record: MFU needs capture's FLOP count",
                       python_in_model=python_in_model(trace, None))


def python_in_model(trace: TraceEvidence | None, steady: SteadyState | None) -> float | None:
    """The trace's Python share less the time the step spends loading data or outside the model
    (logging, checkpoints): that Python is not framework overhead."""
    if trace is None or trace.host.python is None:
        return None
    outside = (steady.data_wait_share + steady.shares.get("other", 0.0)) if steady is not None \
        else float(trace.shares.dataloader or 0.0)
    return max(0.0, float(trace.host.python) - outside)


def busiest_loader(record: RunRecord) -> LoaderInfo | None:
    """The DataLoader the steps waited for most (None without one)."""
    return max(record.loaders, key=lambda item: (item.wait_ns, item.batches)) if record.loaders else None


def _evidence(basis: RankBasis, trace: TraceEvidence | None, job: tuple[RankSteady, ...],
              siblings: tuple[RankBasis, ...]) -> RunEvidence:
    from stepscope.analysis.run.account import thread_account
    from stepscope.analysis.run.compile_summary import summarize_compile
    from stepscope.analysis.run.stalls import find_periodic_stall

    record, steady, signals = basis.record, basis.steady, basis.signals
    meta = record.meta
    # the cores the run could use: its affinity mask when recorded (taskset, a cpuset), else the machine's
    cpu_count = meta.cpu_count_usable or meta.cpu_count_logical or (signals.cpu_count if signals is not None else None) or None
    gpu = next((device for device in meta.devices if device.kind in GPU_KINDS), None)
    loader = busiest_loader(record)
    cores, pids = _sibling_load(siblings)
    foreign = foreign_load(signals, cpu_count, cores, pids)
    account = thread_account(record, steady, signals,
                             foreign.cpu_share * cpu_count if foreign is not None and cpu_count else None,
                             own_process_cores(signals, cores), gpu is not None, cpu_count)
    if foreign is not None and account is not None and (taker := account.taker("other processes")) is not None:
        foreign = replace(foreign, step_cost=taker.step_share)
    estimate, note = mfu_estimate(record.facts, steady, gpu, foreign)
    floor = basis.summary.floor if basis.summary is not None else loader_floor(record, steady, loader)
    return RunEvidence(
        record=record, steady=steady, signals=signals, trace=trace, facts=record.facts, ranks=job,
        cpu_count=cpu_count, intra_op_threads=meta.intra_op_threads, gpu=gpu, main_loader=loader,
        loader_cpu=loader_cpu(record, steady, signals, loader),
        storage=storage_signs(record, signals),
        cpu_demand=cpu_demand(signals, cpu_count, meta.intra_op_threads),
        compute_cores=None if (used := compute_cores(steady, signals, loader, record)) is None
        else min(used, float(cpu_count or used)),
        op_overhead=op_overhead(record.facts, steady),
        mfu=estimate, mfu_note=note, foreign=foreign, comm=comm_shares(record, steady),
        code=basis.code, gc=gc_summary(record, steady), compile=summarize_compile(record),
        stall=None if steady is None else find_periodic_stall(
            record, steady.mask, steady.step_time_s, loader, tuple(item.record for item in siblings)),
        window=basis.window, python_in_model=python_in_model(trace, steady), account=account,
        peer=peer_wait(record, steady, job), boundaries=epoch_boundaries(record, steady, floor),
        loader_floor=floor,
    )


def _sibling_load(siblings: tuple[RankBasis, ...]) -> tuple[float, frozenset[int]]:
    """Cores the job's other ranks on this machine used, and their processes (not foreign load)."""
    cores = 0.0
    pids: set[int] = set()
    for other in siblings:
        pids.add(other.record.meta.pid)
        samples = other.record.samples
        if samples is not None and getattr(samples, "meta", None) is not None:
            pids.add(samples.meta.sampler_pid)
        if other.signals is not None:
            for load in other.signals.workers:
                pids.add(load.pid)
                cores += load.cpu_util
    return cores, frozenset(pids)


def comm_shares(record: RunRecord, steady: SteadyState | None) -> CommShares | None:
    """The steady state's collective time; None when no collective was captured."""
    if steady is None:
        return None
    steps = record.steps
    exposed = steps.communication_ns[steady.mask].astype(np.float64)
    overlapped = steps.communication_overlap_ns[steady.mask].astype(np.float64)
    total = float(steps.duration_ns[steady.mask].sum())
    if total <= 0 or (exposed.sum() <= 0 and overlapped.sum() <= 0):
        return None
    count = max(1, int(steady.mask.sum()))
    return CommShares(float(exposed.sum() / total), float(overlapped.sum() / total),
                      float(exposed.sum() / count / 1e9), float(overlapped.sum() / count / 1e9))


def code_attribution(record: RunRecord, steady: SteadyState | None) -> CodeAttribution | None:
    """Top code locations per phase over the steady state; None without stack samples."""
    if steady is None or not len(record.stack_samples):
        return None
    from stepscope.analysis.run.code_locations import attribute_code

    return attribute_code(record, steady.mask)


def gc_summary(record: RunRecord, steady: SteadyState | None) -> GcPauseSummary | None:
    """Collector pauses over the steady state; None when they were not measured."""
    if steady is None:
        return None
    from stepscope.analysis.run.gc_pauses import summarize_gc_pauses

    summary = summarize_gc_pauses(record, steady.mask)
    return summary if summary.measured else None


def storage_signs(record: RunRecord, signals: MacroSignals | None) -> StorageSigns:
    from stepscope.analysis.run.input_profile import cold_start, input_profile

    profile = input_profile(record)
    return StorageSigns(
        iowait_share=signals.iowait_share if signals is not None else None,
        page_cache_warming=bool(signals.page_cache_warming) if signals is not None else False,
        first_epoch_ratio=first_epoch_ratio(record),
        profile=profile if profile.segments else None,
        cold=cold_start(profile, record),
    )


def first_epoch_ratio(record: RunRecord) -> float | None:
    """First epoch's fetch wait per step over later epochs' (None without two epochs)."""
    steps = record.steps
    if len(steps) < 4:
        return None
    starts = np.flatnonzero(steps.loader_init_ns > 0)
    starts = starts[starts > 0]
    if len(starts) == 0:
        return None
    fetch = (steps.data_wait_ns - steps.loader_init_ns).astype(np.float64)
    first, later = fetch[1:starts[0]], fetch[starts[0]:]
    if len(first) < 2 or len(later) < 2 or later.mean() <= 0:
        return None
    return float(first.mean() / later.mean())


@dataclass(frozen=True)
class PeerWait:
    """What this rank's wait in collectives was: the other ranks' own work in the same steps.

    In a synchronous job each step's collectives end when the slowest rank reaches them, so this
    rank's wait in step i is explained by how much longer the slowest other rank worked (its step
    less its own wait) in step i. ``explained`` is the share of the wait that accounts for, and
    ``phase`` the phase of the other ranks that made up most of their extra work (``data_wait``,
    ``forward``, ``optimizer``, ``other``, ``backward``), with the rank that was slowest most often.
    """

    explained: float
    phase: str
    rank: int
    wait_share: float  # this rank's wait, share of its steady step time


#: Phases whose extra time on another rank makes this rank wait (their order breaks ties).
PEER_PHASES = ("data_wait", "forward", "optimizer", "other", "backward")


def peer_wait(record: RunRecord, steady: SteadyState | None, ranks: tuple[RankSteady, ...]) -> PeerWait | None:
    """The :class:`PeerWait` of this rank's collectives; None without other ranks' steps or a wait."""
    if steady is None or len(ranks) < 2:
        return None
    others = [(item.rank, item.steps, item.steady.mask) for item in ranks
              if item.rank != record.meta.rank and item.steps is not None]
    count = min([len(record.steps), *(len(steps) for _, steps, _ in others)])
    if not others or count < 2:
        return None
    mask = steady.mask[:count].copy()
    for _, _, their_mask in others:
        mask &= their_mask[:count]

    def column(steps: StepTable, name: str) -> np.ndarray:
        """A ``<name>_ns`` column over the steps every rank has, steady on every rank."""
        values: np.ndarray = steps.column(f"{name}_ns")[:count].astype(np.float64)[mask]
        return values

    wait = column(record.steps, "communication")
    if wait.sum() <= 0:
        return None
    own = column(record.steps, "duration") - wait
    theirs = np.vstack([column(steps, "duration") - column(steps, "communication") for _, steps, _ in others])
    slowest = theirs.argmax(axis=0)
    extra = np.clip(theirs.max(axis=0) - own, 0.0, None)
    explained = float(np.minimum(wait, extra).sum() / wait.sum())
    picked = np.arange(len(slowest))
    by_phase = {}
    for phase in PEER_PHASES:
        peer = np.vstack([column(steps, phase) for _, steps, _ in others])[slowest, picked]
        by_phase[phase] = float(np.clip(peer - column(record.steps, phase), 0.0, None).sum())
    phase = max(PEER_PHASES, key=lambda name: by_phase[name])
    rank = others[int(np.bincount(slowest).argmax())][0]
    total = float(column(record.steps, "duration").sum())
    return PeerWait(round(explained, 4), phase, rank, round(float(wait.sum()) / total, 4) if total > 0 else 0.0)


@dataclass(frozen=True)
class EpochBoundaries:
    """What the steps that start a DataLoader epoch cost beyond an ordinary step's data wait: the
    workers' start-up (``__iter__``: fork, imports, ``worker_init_fn``) and the first batch they then
    owe, measured on the steady steps that hold an ``__iter__``. Where the workers timed their
    batches, the excess is taken beyond one batch's making when that is longer than an ordinary
    step's wait: workers kept between epochs still make each epoch's first batch from scratch
    (nothing is prefetched across epochs), while an ordinary step's wait is shortened by the
    batches made during the steps before it (``first_batch_s``)."""

    count: int  # steady steps that started an epoch
    cost_share: float  # their data wait beyond an ordinary step's, share of the steady time
    per_boundary_s: float  # that excess per epoch start
    ordinary_wait_share: float  # the data wait of the other steady steps, share of the steady time
    #: one worker's time per batch when the excess is taken beyond it (None: beyond an ordinary wait)
    first_batch_s: float | None = None


def epoch_boundaries(record: RunRecord, steady: SteadyState | None,
                     floor: LoaderFloor | None = None) -> EpochBoundaries | None:
    """The :class:`EpochBoundaries` of a run whose steady steps start epochs (``floor``: the main
    loader's workers' own time per batch, when timed); None otherwise."""
    if steady is None:
        return None
    steps = record.steps
    mask = steady.mask
    starts = mask & (steps.loader_init_ns > 0)
    if not starts.any() or starts.sum() == mask.sum():
        return None
    wait = steps.data_wait_ns.astype(np.float64)
    ordinary = float(np.median(wait[mask & ~starts]))
    batch_ns = floor.wall_s * 1e9 if floor is not None else 0.0
    excess = np.clip(wait[starts] - max(ordinary, batch_ns), 0.0, None)
    total = float(steps.duration_ns[mask].sum())
    if total <= 0:
        return None
    return EpochBoundaries(int(starts.sum()), round(float(excess.sum()) / total, 4),
                           round(float(excess.mean()) / 1e9, 6),
                           round(float(wait[mask & ~starts].sum()) / total, 4),
                           round(floor.wall_s, 6) if floor is not None and batch_ns > ordinary else None)


# -- operators and MFU ---------------------------------------------------------------------------
def op_overhead(facts: CaptureFacts, steady: SteadyState | None) -> OpOverhead | None:
    """Per-operator overhead of the model's own operators (data-loading operators excluded)."""
    compute = facts.compute
    if compute is None or compute.ops <= 0 or steady is None or steady.step_time_mean_s <= 0:
        return None
    step = steady.step_time_mean_s
    cost = facts.op_cost
    measured = cost is not None and cost.seconds_best > 0
    price = cost.seconds_best * MEASURED_OP_COST_SHARE if measured and cost is not None else EAGER_OP_OVERHEAD_S
    return OpOverhead(compute.ops, step / compute.ops, min(1.0, compute.ops * price / step), price, measured)


#: Share of all cores used by others above which a CPU MFU is not trusted: the steps ran on a
#: different machine than the one the peak describes.
FOREIGN_CPU_MAX_FOR_MFU = 0.5


def mfu_estimate(facts: CaptureFacts, steady: SteadyState | None, gpu: DeviceInfo | None,
                 foreign: ForeignLoad | None) -> tuple[MfuEstimate | None, str | None]:
    """MFU against the peak of the dtype that ran, with bounds; or None and why not."""
    compute = facts.compute
    if compute is None or compute.flops <= 0:
        return None, "no FLOP count (the FLOP-counted step did not run)"
    if steady is None or steady.step_time_s <= 0:
        return None, "no steady steps"
    dtype = compute.compute_dtype or "fp32"
    fast, slow = steady.step_time_fast_s, steady.steady.p90_s or steady.step_time_s
    if gpu is not None:
        peak = peak_flops(gpu.name, dtype)
        if peak is None:
            return None, f"no datasheet peak known for {gpu.name} in {dtype}"
        step = steady.step_time_s
        if steady.device_step_p10_s is not None and steady.device_step_p90_s is not None:
            # the host's step boundaries jitter with the launch queue; the device's bound the spread
            fast, slow = steady.device_step_p10_s, steady.device_step_p90_s
        peak_low = peak_high = peak
        source = f"{gpu.name} datasheet {dtype}"
    else:
        cpu_peak = {"fp32": facts.cpu_peak, "bf16": facts.cpu_peak_bf16}.get(dtype)
        if cpu_peak is None or cpu_peak.flops_best <= 0:
            known = "no" if dtype not in ("fp32", "bf16") else "no measured"
            return None, f"{known} CPU matmul peak for {dtype}, the dtype the step computes in"
        if foreign is not None and foreign.cpu_share > FOREIGN_CPU_MAX_FOR_MFU:
            return None, (f"other processes used {foreign.cpu_share:.0%} of the cores: the steps ran on a "
                          "busier machine than the one the peak describes")
        # the peak is the best repetition of a GEMM, so the step is taken best-case too
        step = fast = steady.step_time_fast_s
        peak_high, peak_low = cpu_peak.flops_best, cpu_peak.flops_median or cpu_peak.flops_best
        peak = cpu_peak.flops_best
        source = f"measured {dtype} matmul peak of this CPU"
    value = mfu(compute.flops, step, peak)
    if value > 1.0:
        return None, (f"the counted FLOPs exceed the {dtype} peak ({value:.0%}): the peak does not describe "
                      "this run")
    return MfuEstimate(
        value=value, low=min(value, mfu(compute.flops, slow, peak_high)),
        high=min(1.0, max(value, mfu(compute.flops, fast, peak_low))), peak_flops=float(peak), dtype=dtype,
        peak_source=source, on_gpu=gpu is not None, flops_per_step=float(compute.flops), step_time_s=step,
    ), None
