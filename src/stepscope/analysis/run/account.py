"""Where the training thread's time went: each phase split into on CPU, waiting for a core and off
CPU, and who took the cores (the account capture measured on sampled steps, see
:mod:`stepscope.capture.account`).

The account is a measurement, not a rule: the fractions of each phase (on CPU, runnable but waiting
for a core, off CPU) are measured on the accounted steps of the steady window and applied to the
phase times of every steady step (the step columns). Off-CPU time is named by what the phase is
known to block on — the DataLoader's workers in the data wait of a multi-process loader, a peer in
communication, the device on a GPU run —, by another Python thread of the process that ran while
the training thread was off CPU (the GIL), or left *unexplained*. Where capture sampled what the
thread slept in (``ThreadAccount.waits``: a lock, a sleep, a poll, a pipe or socket, the disk) and
another Python thread computed, the phase's time off CPU is split by those samples
(:func:`_measured_split`): only the time asleep on a lock (a futex: the GIL's wait) is the GIL's,
the time asleep in a read or a sleep is the loader's source (``io``) or stays unexplained.

The process's busiest other non-Python threads (intra-op) are read too, at each accounted step's
start and end: when one of them waits for a core, a parallel operator waits for it at its barrier,
on CPU in the training thread (which spins there), so the training thread's own counter does not
show that contention. Their longest wait (``peer_waiting``, at most the model's on-CPU time) is
charged to what ran beside them: the process's other Python threads, the run's other processes and
other processes -- not to the process's other non-Python threads, whose CPU is mostly those intra-op
threads' own (a thread does not wait for itself: charged there, a neighbour that stalled 2 ms steps
by +46 % through their intra-op thread carried a third of it and ranked below a 11 % data wait).

Waiting for a core is charged to what ran instead, over the same window: the process's other
threads (intra-op, Python threads), the run's own other processes (DataLoader workers, children
that came and went, the job's other ranks on this machine) and other processes (and the
hypervisor's steal). Only the last is what a neighbour measurably took from the step.

How it is charged (:func:`_takers`): the thread waits when what else wants the cores leaves it none,
that is when the others' load exceeds the cores less the thread's own (the *excess*). Each group is
charged the share of the excess that would go without it — the counterfactual a user acts on
("stop the neighbour": what comes back) — so a group whose absence would leave the others fitting
in the cores carries the whole wait, not merely its share of the CPU. These shares can add up to
more than the wait (without either of two groups the rest would fit): each is the gain of removing
that group alone. When the loads, as averages, do not exceed the cores (the waits come from
bursts), the wait is charged by CPU share.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepscope.analysis.evidence import MacroSignals
from stepscope.analysis.run.steady import MODEL_PHASES, SteadyState
from stepscope.record.run import PHASES, WAIT_CLASSES, RunRecord, ThreadAccount, ThreadInfo

#: Accounted steady steps needed before the account is shown (fewer: too noisy to say anything).
MIN_ACCOUNTED = 3
#: A Python thread of the process using at least this much of a core while the training thread is
#: off CPU in the model's phases is a GIL competitor worth naming.
GIL_THREAD_CORES = 0.1
#: Samples of a phase off CPU (steady steps) from which what the thread slept in splits its cause;
#: with fewer, the phase keeps the cause it is known to block on (20: a share to within ~10 points).
MIN_WAIT_SAMPLES = 20


@dataclass(frozen=True)
class PhaseAccount:
    """One phase of the steady step: its mean time per step and how that time split (fractions of
    the phase's wall time, measured on the accounted steps), with the off-CPU time's cause."""

    phase: str
    time_s: float  # mean per steady step, from the step columns
    share: float  # of the steady step time
    on_cpu: float
    waiting_core: float
    off_cpu: float
    #: what the off-CPU time is: "workers" (a multi-process DataLoader's queue), "peer" (a
    #: collective), "device" (a GPU run's synchronisation), "gil" (another Python thread of the
    #: process held it), "io" (reads or sleeps inside a single-process loader) or "unexplained";
    #: the largest part where :attr:`off_split` is measured
    off_cause: str
    #: the off-CPU time split by cause, from what the thread was sampled asleep in (fractions, largest
    #: first); empty where not measured: then all of it is :attr:`off_cause`'s
    off_split: tuple[tuple[str, float], ...] = ()
    #: the samples off CPU that split it, by what the thread slept in (:data:`WAIT_CLASSES`)
    waits: tuple[tuple[str, int], ...] = ()

    def off_part(self, cause: str) -> float:
        """The fraction of this phase's time off CPU that was ``cause``'s."""
        if self.off_split:
            return next((part for name, part in self.off_split if name == cause), 0.0)
        return 1.0 if self.off_cause == cause else 0.0


@dataclass(frozen=True)
class CoreTaker:
    """Who ran while the training thread waited for a core, and the wait charged to it."""

    who: str  # "own threads" | "own processes" | "other processes"
    cores: float  # mean cores it used over the window
    step_share: float  # the training thread's run-queue wait charged to it, share of the step


@dataclass(frozen=True)
class PythonThread:
    """A Python thread of the training process besides the training one."""

    name: str
    function: str
    cores: float  # its CPU over the run's duration (a lower bound for a thread started late)


@dataclass(frozen=True)
class ThreadAccountView:
    """The training thread's account over the steady window (see the module docstring)."""

    accounted_steps: int
    phases: tuple[PhaseAccount, ...]
    on_cpu: float  # shares of the steady step
    waiting_core: float
    off_cpu: float
    #: the uncertainty of those three shares: the standard error over accounted steps
    spread: float
    other_thread_cores: float  # the process's other threads' CPU while the steps ran
    python_threads: tuple[PythonThread, ...]
    takers: tuple[CoreTaker, ...]
    #: accounted steps' mean duration over all steady steps' mean: near 1 when they represent the run
    representative: float
    #: the longest wait for a core of the process's busiest other non-Python threads (intra-op), a
    #: share of the step, at most the model phases' on-CPU share: a parallel operator's barrier
    #: waits for such a thread on CPU in the training thread. Charged to the takers with
    #: ``waiting_core``. 0 where not measured (records before it, no such thread).
    peer_waiting: float = 0.0
    #: the cores the training thread's own running leaves to the rest (cores - 1); None when unknown
    room: float | None = None

    def charged(self, load: float, among: CoreTaker | None = None) -> float:
        """The wait for a core (the training thread's and its peers', a share of the step) that a
        load of ``load`` cores inside the group ``among`` would carry, by the rule the takers are
        charged by: the part of the excess over :attr:`room` that goes without it, else its CPU share."""
        return self._charge(self.waiting_core + self.peer_waiting, load, among)

    def _charge(self, wait: float, load: float, among: CoreTaker | None) -> float:
        """The part of ``wait`` a load of ``load`` cores inside ``among`` carries (:func:`_weight`), at
        most what ``among`` is charged."""
        if among is None or among.cores <= 0 or load <= 0:
            return 0.0
        return min(among.step_share, wait * _weight(load, sum(item.cores for item in self.takers), self.room))

    @property
    def model_waiting(self) -> float:
        """Share of the step the training thread waited for a core in the model's phases (forward,
        backward, optimizer): the part of its wait that delays the model's work for certain."""
        return sum(item.share * item.waiting_core for item in self.phases if item.phase in MODEL_PHASES)

    def charged_model_wait(self, among: CoreTaker | None) -> float:
        """The part of ``among``'s charge carried by the training thread's own wait in the model's
        phases alone (:attr:`model_waiting`), by the same rule: the lower end of what would come
        back without it. The intra-op threads' wait is left out (on a machine where a neighbour
        sleeps between bursts it came back only in part, the data wait's part is not settled)."""
        return self._charge(self.model_waiting, among.cores if among is not None else 0.0, among)

    def waiting_split(self) -> tuple[tuple[str, float], ...]:
        """The training thread's own wait for a core (``waiting_core``) split among the takers,
        largest first. Each taker's ``step_share`` is what would go without it, the intra-op
        threads' wait included: the charges overlap, so the split is in their proportion."""
        charged = sum(item.step_share for item in self.takers)
        scale = min(1.0, self.waiting_core / charged) if charged > 0 else 0.0
        return tuple(sorted(((item.who, round(item.step_share * scale, 4)) for item in self.takers),
                            key=lambda pair: -pair[1]))

    def phase(self, name: str) -> PhaseAccount | None:
        return next((item for item in self.phases if item.phase == name), None)

    def share_off(self, cause: str, phases: tuple[str, ...] | None = None) -> float:
        """Share of the step the training thread spent off CPU for ``cause`` (in ``phases`` only, when given)."""
        return sum(item.share * item.off_cpu * item.off_part(cause) for item in self.phases
                   if phases is None or item.phase in phases)

    @property
    def unexplained(self) -> float:
        """Share of the step the training thread was off CPU in the model's phases with no measured
        cause (outside the model, a checkpoint's write or a log's flush is the periodic-stall and
        outside-the-model families' to name, with their code)."""
        return self.share_off("unexplained", MODEL_PHASES)

    def taker(self, who: str) -> CoreTaker | None:
        return next((item for item in self.takers if item.who == who), None)

    @property
    def python_cores(self) -> float:
        """The cores the process's other Python threads used, together."""
        return sum(item.cores for item in self.python_threads)

    @property
    def python_core_wait(self) -> float:
        """The wait for a core (a share of the step) the process's other Python threads caused:
        their part of the own threads' charge (:meth:`charged`)."""
        return self.charged(self.python_cores, self.taker("own threads"))

    @property
    def gil_wait(self) -> float:
        """Share of the step the training thread was off CPU waiting for the GIL: its time off CPU
        while another Python thread of the process computed, at most the share of the step those
        threads ran (only a running thread holds the GIL; the rest was the thread blocked on its own)."""
        return min(self.share_off("gil"), self.python_cores)

    @property
    def model_on_cpu_share(self) -> float:
        """Share of the step the training thread spent on a CPU in the model's phases."""
        return _model_on_cpu(self.phases)

    @property
    def model_on_cpu(self) -> float | None:
        """Share of the model's phases (not of the step) the training thread spent on a CPU; None
        without them."""
        total = sum(item.share for item in self.phases if item.phase in MODEL_PHASES)
        return self.model_on_cpu_share / total if total > 0 else None

    @property
    def gil_holder(self) -> PythonThread | None:
        """The busiest other Python thread, when it computed enough to hold the GIL the training
        thread needs (:data:`GIL_THREAD_CORES`); else None."""
        return self.python_threads[0] if _gil_taker(self.python_threads) else None


def _model_on_cpu(phases: tuple[PhaseAccount, ...] | list[PhaseAccount]) -> float:
    return sum(item.share * item.on_cpu for item in phases if item.phase in MODEL_PHASES)


def _rows(account: ThreadAccount, steady: SteadyState) -> np.ndarray | None:
    """Indexes of the account's rows that are steady steps."""
    steps = np.asarray(account.steps, dtype=np.int64)
    if not len(steps):
        return None
    valid = (steps >= 0) & (steps < len(steady.mask))
    keep = np.flatnonzero(valid)
    keep = keep[steady.mask[steps[keep]]]
    return keep if len(keep) >= MIN_ACCOUNTED else None


def thread_account(record: RunRecord, steady: SteadyState | None, signals: MacroSignals | None,
                   foreign_cores: float | None, own_process_cores: float | None,
                   on_gpu: bool, cores: int | None = None) -> ThreadAccountView | None:
    """The :class:`ThreadAccountView` of a record's steady window; None without enough accounted steps.

    Args:
        foreign_cores: cores other processes (and the hypervisor) held over the window.
        own_process_cores: cores of the run's other processes (workers, children, other ranks).
        on_gpu: the model runs on a GPU (off CPU in its phases is then waiting for the device).
        cores: the cores the run could use (the wait is charged by the load beyond them).
    """
    account = record.facts.thread_account
    if account is None or steady is None:
        return None
    rows = _rows(account, steady)
    if rows is None:
        return None
    wall = np.asarray(account.wall_ns, dtype=np.float64)[rows]
    # clipped where summed (a phase over the accounted steps), not per step: a reading's error is
    # either sign, and clipping each cell would turn it into time off CPU
    cpu = np.asarray(account.cpu_ns, dtype=np.float64)[rows]
    runq = np.asarray(account.runq_ns, dtype=np.float64)[rows]
    process = np.asarray(account.process_cpu_ns, dtype=np.float64)[rows]
    loader = record.loaders[0] if record.loaders else None
    workers = bool(loader is not None and max(item.num_workers for item in record.loaders) > 0)
    python_threads = _python_threads(account, record)
    waits = _steady_waits(account, steady)
    phases = []
    step_time = steady.step_time_mean_s
    for index, name in enumerate(PHASES):
        share = steady.shares.get(name, 0.0)
        total = wall[:, index].sum()
        if share <= 0 or total <= 0:
            continue
        on = _fraction(cpu[:, index].sum(), total)
        waiting = min(1.0 - on, max(0.0, float(runq[:, index].sum() / total)))
        off = max(0.0, 1.0 - on - waiting)
        cause = _off_cause(name, workers, on_gpu, python_threads)
        sampled = waits.get(index, {})
        split = _measured_split(name, cause, sampled) if _gil_taker(python_threads) else ()
        phases.append(PhaseAccount(name, share * step_time, share, round(on, 4), round(waiting, 4), round(off, 4),
                                   split[0][0] if split else cause, split,
                                   tuple((WAIT_CLASSES[kind], count) for kind, count in sorted(sampled.items()))))
    # per accounted step, the thread's shares of the step: their spread is the account's uncertainty
    step_wall = wall.sum(axis=1)
    per_step_on = np.clip(cpu.sum(axis=1) / np.maximum(step_wall, 1.0), 0.0, 1.0)
    spread = float(per_step_on.std(ddof=1) / np.sqrt(len(rows))) if len(rows) > 1 else 1.0
    on_cpu = sum(item.share * item.on_cpu for item in phases)
    waiting = sum(item.share * item.waiting_core for item in phases)
    other_threads = float(max(0.0, (process - cpu).sum()) / max(step_wall.sum(), 1.0))
    peers = _peer_waiting(account, rows, step_wall, phases)
    takers = _takers(waiting, other_threads, own_process_cores, foreign_cores, cores)
    if peers > 0:
        python_cores = sum(item.cores for item in python_threads)
        takers = _merged(takers, _takers(peers, python_cores, own_process_cores, foreign_cores, cores))
    steady_mean_ns = step_time * 1e9
    return ThreadAccountView(
        accounted_steps=len(rows), phases=tuple(phases), on_cpu=round(on_cpu, 4), waiting_core=round(waiting, 4),
        off_cpu=round(max(0.0, sum(item.share for item in phases) - on_cpu - waiting), 4), spread=round(spread, 4),
        other_thread_cores=round(other_threads, 3), python_threads=python_threads, takers=takers,
        representative=round(float(step_wall.mean() / steady_mean_ns), 3) if steady_mean_ns > 0 else 1.0,
        peer_waiting=round(peers, 4), room=float(cores - 1) if cores else None)


def phase_on_cpu(record: RunRecord, steady: SteadyState | None) -> dict[str, float]:
    """The share of each phase's time the training thread spent on a CPU over the steady accounted
    steps (no waits, no takers: what a cross-rank rule needs of another rank); empty without enough
    accounted steps."""
    account = record.facts.thread_account
    rows = _rows(account, steady) if account is not None and steady is not None else None
    if account is None or rows is None:
        return {}
    wall = np.asarray(account.wall_ns, dtype=np.float64)[rows].sum(axis=0)
    cpu = np.asarray(account.cpu_ns, dtype=np.float64)[rows].sum(axis=0)
    return {name: round(_fraction(cpu[index], wall[index]), 4) for index, name in enumerate(PHASES) if wall[index] > 0}


def _fraction(part: float, whole: float) -> float:
    """``part / whole`` within 0..1 (a phase's on-CPU time over its wall time, summed over steps:
    a reading's error is either sign)."""
    return min(1.0, max(0.0, float(part / whole)))


def _peer_waiting(account: ThreadAccount, rows: np.ndarray, step_wall: np.ndarray,
                  phases: list[PhaseAccount]) -> float:
    """The intra-op threads' longest wait for a core as a share of the accounted steps, capped by
    the share the training thread spent on CPU in the model's phases (where it waits for them)."""
    if not account.peer_runq_ns:
        return 0.0
    waits = np.asarray(account.peer_runq_ns, dtype=np.float64)[rows]
    share = float(np.clip(waits, 0.0, None).sum() / max(step_wall.sum(), 1.0))
    return min(share, _model_on_cpu(phases))


def _gil_taker(python_threads: tuple[PythonThread, ...]) -> bool:
    """Another Python thread of the process computed enough to hold the GIL the training thread needs."""
    return bool(python_threads) and python_threads[0].cores >= GIL_THREAD_CORES


def _off_cause(phase: str, workers: bool, on_gpu: bool, python_threads: tuple[PythonThread, ...]) -> str:
    if phase == "data_wait":
        return "workers" if workers else "io"
    if phase == "communication":
        return "peer"
    if on_gpu and phase in (*MODEL_PHASES, "other"):
        return "device"
    return "gil" if _gil_taker(python_threads) else "unexplained"


def _steady_waits(account: ThreadAccount, steady: SteadyState) -> dict[int, dict[int, int]]:
    """The wait samples of steady steps: record phase index -> wait class index -> samples."""
    out: dict[int, dict[int, int]] = {}
    mask = steady.mask
    for step, phase, kind, count in account.waits:
        if 0 <= step < len(mask) and mask[step]:
            per_phase = out.setdefault(phase, {})
            per_phase[kind] = per_phase.get(kind, 0) + count
    return out


#: Wait classes a thread is asleep in while the GIL is held by another: the GIL is a mutex and a
#: condition variable, a futex in the kernel (so is any other lock: counted the GIL's only where
#: another Python thread computed, :func:`_off_cause`).
_LOCK = WAIT_CLASSES.index("lock")


def _measured_split(phase: str, cause: str, sampled: dict[int, int]) -> tuple[tuple[str, float], ...]:
    """While another Python thread computed, a phase's off-CPU time split by what the training thread
    slept in: a lock is the GIL's; a read, a poll, a sleep or the disk is the single-process loader's
    source in the data wait (``io``), elsewhere a wait with no cause the account names
    (``unexplained``). Unmeasured, the data wait's time is inferred the source's and the model's the
    GIL's (:func:`_off_cause`). Empty (the inferred cause stands) with fewer than
    :data:`MIN_WAIT_SAMPLES` samples, or for a cause the phase is known to block on (workers, a
    peer, the device)."""
    total = sum(sampled.values())
    if cause not in ("gil", "io") or total < MIN_WAIT_SAMPLES:
        return ()
    lock = sampled.get(_LOCK, 0) / total
    other = "io" if phase == "data_wait" else "unexplained"
    parts = [("gil", round(lock, 4)), (other, round(1.0 - lock, 4))]
    return tuple(sorted((part for part in parts if part[1] > 0), key=lambda part: -part[1]))


def _python_threads(account: ThreadAccount, record: RunRecord) -> tuple[PythonThread, ...]:
    """The process's other Python threads, busiest first, with their CPU over the time each lived
    within capture (from its start, if it started during capture, to its end or its last reading,
    if it ended before capture did)."""
    meta = record.meta
    if meta.end_ns <= meta.start_ns:
        return ()

    def cores(item: ThreadInfo) -> float:
        end = item.until_ns if meta.start_ns < item.until_ns < meta.end_ns else meta.end_ns
        start = item.since_ns if meta.start_ns < item.since_ns < end else meta.start_ns
        return round(item.cpu_ns / max(1.0, end - start), 3)

    threads = [PythonThread(item.name, item.function, cores(item))
               for item in account.threads if item.python and not item.training]
    return tuple(sorted(threads, key=lambda item: -item.cores))


def _takers(waiting: float, other_threads: float, own_processes: float | None,
            foreign: float | None, cores: int | None = None) -> tuple[CoreTaker, ...]:
    """The run-queue wait (share of the step) charged to each group: the share of the load beyond
    ``cores - 1`` (the cores the training thread's own running leaves) that would go without the
    group (:func:`_weight`), else — the averages fit in the cores, or the cores are unknown
    — its share of the CPU.

    A group cannot have taken more of the step than it ran (its cores); without the sampler's view
    of the machine (``foreign`` None), what the process's own threads do not cover is charged to
    "not measured" rather than to them."""
    groups = [("own threads", other_threads), ("own processes", max(0.0, own_processes or 0.0)),
              ("other processes", max(0.0, foreign or 0.0))]
    total = sum(load for _, load in groups)
    weights = [_weight(load, total, cores - 1 if cores else None) for _, load in groups]
    takers = [CoreTaker(who, round(load, 3), round(min(load, waiting * weight), 4))
              for (who, load), weight in zip(groups, weights)]
    if foreign is None:
        left = waiting - sum(item.step_share for item in takers)
        if left > 0.0005:
            takers.append(CoreTaker("not measured", 0.0, round(left, 4)))
    return tuple(takers)


def _merged(first: tuple[CoreTaker, ...], second: tuple[CoreTaker, ...]) -> tuple[CoreTaker, ...]:
    """Two charges of the same groups added up (each group's cores: the first's, the loads the
    training thread's own wait was charged by)."""
    extra = {item.who: item.step_share for item in second}
    merged = [CoreTaker(item.who, item.cores, round(item.step_share + extra.pop(item.who, 0.0), 4)) for item in first]
    return (*merged, *(CoreTaker(who, 0.0, share) for who, share in extra.items()))


#: The groups' loads exceed the room by at least this many cores before the wait is charged by
#: the excess (below it, the waits come from bursts the averages do not show).
MIN_EXCESS = 0.05


def _weight(load: float, total: float, room: float | None) -> float:
    """The share of the wait a load carries: the part of the excess ``total - room`` that goes
    when it is gone; its CPU share when the excess is below :data:`MIN_EXCESS` or ``room`` is
    unknown (the waits are bursts the averages do not show)."""
    excess = total - room if room is not None else 0.0
    if room is not None and excess >= MIN_EXCESS:
        return min(load, excess) / excess
    return load / total if total > 0 else 0.0
