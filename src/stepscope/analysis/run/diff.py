"""Two runs compared: every figure with its interval and verdict, what changed in the setup, and
which findings appeared or went away (``stepscope diff A B``).

Pure: records (and their reports' findings) in, a :class:`RunDiff` out. The statistics are
:mod:`stepscope.analysis.compare_stats` (moving-block bootstrap over each run's steady steps,
with the run-to-run noise floor); the steady steps, phase shares and throughput are read from
:func:`stepscope.analysis.run.steady.steady_state` (GC shares from
:func:`stepscope.analysis.run.gc_pauses.summarize_gc_pauses`), so warm-up, the FLOP-counted step and profiler windows are left out on both sides alike.

Rows (``metric`` is the key of ``--metric``): ``step_time`` (mean steady step), each phase's mean
per step (``data_wait``, ``forward``, ``backward``, ``optimizer``, ``communication``, ``other``,
``compile``) when it was measured in either run, ``steps_per_s``, ``samples_per_s`` (when both runs
know their samples), ``gc`` (garbage-collector pause per step, when both timed it), and, as plain
values without an interval, ``mfu`` and the compile totals (``compile_total_s``, ``compilations``).

A busy machine: when the sampler saw other processes use more than :data:`BUSY_SHARE` of the
cores during either run, the rows are judged against the floor measured under load
(:data:`~stepscope.analysis.compare_stats.LOADED_FLOOR`, a factor of 5, with a note): on identical
runs of the zoo such load alone moved the step time by up to ×3.6, so a doubling is not called,
and a many-fold change still is.

Where the step time's change comes from (:mod:`stepscope.analysis.run.long_steps`): the median
step of each side (:func:`~stepscope.analysis.compare_stats.compare_medians`), and the long steps
(compile, GC, a checkpoint or evaluation outside the model) with the part of the mean's change they
make (:attr:`RunDiff.shape`).

What changed in the setup includes the content hash of the script and of the local modules it
imported (``RunMeta.source_hashes``): an edited ``model.py`` is named.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from stepscope.analysis.compare_stats import (FASTER, LOADED_FLOOR, LOADED_NOISE, MIN_SHARE, MIN_STEPS, NO_BOUND, NOISE_FLOOR, SLOWER,
                                              WITHIN_NOISE, Difference, beyond_floor, compare_medians, compare_steps)
from stepscope.analysis.run.gc_pauses import summarize_gc_pauses
from stepscope.analysis.run.long_steps import TAIL_SHARE, LongSteps, long_steps, split_change
from stepscope.analysis.run.steady import SteadyState, steady_state
from stepscope.record.run import PHASES, RunRecord

#: Share of the cores other processes may use during a run before its comparisons mean nothing.
BUSY_SHARE = 0.10

MEASURED_FLOOR_TEXT = "1.02"
#: How a one-run-per-side diff says its floor is not measured.
NOT_MEASURED = ("×1.4 assumed, run-to-run noise not measured (measure it: repeats A1 A2 --vs B1 B2, "
                "or 3+ identical runs in the run index)")

#: How a local source file's content hash is named among the setup facts (``source model.py``).
SOURCE_PREFIX = "source "

#: ``--metric`` names, in the order rows are shown.
METRICS: tuple[str, ...] = ("step_time", *PHASES, "steps_per_s", "samples_per_s", "gc", "mfu",
                            "compile_total_s", "compilations")
LABELS = {"step_time": "step time", "data_wait": "data wait", "steps_per_s": "steps/s",
          "samples_per_s": "samples/s", "gc": "GC pauses", "mfu": "MFU", "compile_total_s": "compile (total)",
          "compilations": "compilations"}
UNITS = {"steps_per_s": "/s", "samples_per_s": "/s", "mfu": "ratio", "compilations": "count"}


@dataclass(frozen=True)
class Row:
    metric: str
    label: str
    unit: str  # "s" (seconds per step), "/s", "ratio", "count"
    diff: Difference
    #: the phase's share of A's and B's steady step (phases only)
    share_a: float | None = None
    share_b: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "label": self.label, "unit": self.unit, "share_a": self.share_a,
                "share_b": self.share_b, **self.diff.to_dict()}


@dataclass(frozen=True)
class SetupChange:
    """One fact of the setup that differs: ``what`` (``"DataLoader 0 num_workers"``), A's and B's."""

    what: str
    a: str
    b: str


@dataclass(frozen=True)
class FindingChange:
    rule_id: str
    change: str  # "appeared" | "disappeared" | "more severe" | "less severe"
    title: str
    severity_a: str | None
    severity_b: str | None


@dataclass(frozen=True)
class RankRow:
    """One rank of a job in both runs: its step time and its collective wait."""

    rank: int
    step_time: Difference
    communication: Difference


@dataclass(frozen=True)
class StepShape:
    """Where the mean step's change comes from: the median step (the typical step) and the long
    steps of each side, with the part of the mean's relative change the long steps make."""

    median: Difference
    long_a: LongSteps | None
    long_b: LongSteps | None
    tail_change: float | None  # the long steps' part of B/A - 1 of the mean
    source: str  # "typical step" | "long steps" | "both" | "" (nothing to explain)

    def to_dict(self) -> dict[str, Any]:
        def side(item: LongSteps | None) -> dict[str, Any] | None:
            if item is None:
                return None
            return {"steady": item.steady, "median_s": item.median_s, "count": item.count,
                    "excess_s": item.excess_s, "mean_s": item.mean_s,
                    "causes": [{"cause": cause, "steps": count, "excess_s": excess}
                               for cause, count, excess in item.causes],
                    "steps": list(item.steps)}

        return {"median": self.median.to_dict(), "long_steps": {"a": side(self.long_a), "b": side(self.long_b)},
                "tail_change": self.tail_change, "source": self.source}


@dataclass(frozen=True)
class RunDiff:
    a: str
    b: str
    rows: tuple[Row, ...]
    setup: tuple[SetupChange, ...]
    findings: tuple[FindingChange, ...]
    steady_a: int
    steady_b: int
    ranks: tuple[RankRow, ...] = ()
    notes: tuple[str, ...] = ()
    kind: str = "runs"
    method: str = ""
    top_a: str | None = None  # "[SEVERITY] title" of each run's top finding
    top_b: str | None = None
    runs_a: int = 1  # runs compared on each side (repeats: the interval is over runs)
    runs_b: int = 1
    floor_source: str = ""  # where the noise floor came from
    same_run: bool = False  # A and B are one run directory (``diff A A``): equal by construction
    shape: StepShape | None = None  # where the step time's change comes from (one run per side)
    floor: float | None = None  # the floor the rows were judged against (None: the default)
    busy_a: float | None = None  # share of the cores other processes used during each run
    busy_b: float | None = None

    def row(self, metric: str) -> Row | None:
        return next((row for row in self.rows if row.metric == metric), None)

    @property
    def step_time(self) -> Row | None:
        return self.row("step_time")

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "stepscope.diff", "compared": self.kind, "a": self.a, "b": self.b, "method": self.method,
            "steady_steps": {"a": self.steady_a, "b": self.steady_b}, "runs": {"a": self.runs_a, "b": self.runs_b},
            "floor_source": self.floor_source, "same_run": self.same_run,
            "rows": [row.to_dict() for row in self.rows],
            "setup": [asdict(change) for change in self.setup],
            "findings": [asdict(change) for change in self.findings],
            "ranks": [{"rank": row.rank, "step_time": row.step_time.to_dict(),
                       "communication": row.communication.to_dict()} for row in self.ranks],
            "notes": list(self.notes), "top_finding": {"a": self.top_a, "b": self.top_b},
            "step_shape": self.shape.to_dict() if self.shape is not None else None,
            "busy": {"a": self.busy_a, "b": self.busy_b}, "floor": self.floor,
        }


@dataclass(frozen=True)
class FindingBrief:
    """What ``diff`` needs of a finding (from a Report or a report.json)."""

    rule_id: str
    title: str
    severity: str  # "info" … "critical"
    extra: dict[str, Any] = field(default_factory=dict)


SEVERITIES = ("info", "low", "medium", "high", "critical")


# -- rows ------------------------------------------------------------------------------------------
def _steady(record: RunRecord) -> SteadyState | None:
    """The record's steady state, computed by :func:`steady_state` (its mask, shares, throughput)."""
    return steady_state(record)


def _mask(state: SteadyState | None) -> np.ndarray:
    return state.mask if state is not None else np.zeros(0, dtype=bool)


def _gc_share(record: RunRecord, state: SteadyState | None) -> float:
    summary = summarize_gc_pauses(record, _mask(state))
    return summary.share_of_step_time or 0.0


def _gc_per_step(record: RunRecord) -> np.ndarray | None:
    pauses = record.gc_pauses
    if not pauses.enabled:
        return None
    per_step = np.zeros(len(record.steps), dtype=np.float64)
    inside = (pauses.step >= 0) & (pauses.step < len(record.steps))
    np.add.at(per_step, pauses.step[inside], pauses.duration_ns[inside].astype(np.float64))
    return per_step


def step_rows(a: RunRecord, b: RunRecord, *, mfu_a: float | None = None, mfu_b: float | None = None,
              floor: float | None = None) -> tuple[Row, ...]:
    """Every comparable figure of two records' steady states (see the module docstring)."""
    kwargs: dict[str, Any] = {} if floor is None else {"floor": floor}
    state_a, state_b = _steady(a), _steady(b)
    mask_a, mask_b = _mask(state_a), _mask(state_b)
    sa, sb = a.steps.select(mask_a), b.steps.select(mask_b)
    dur_a, dur_b = sa.duration_ns.astype(np.float64) / 1e9, sb.duration_ns.astype(np.float64) / 1e9
    ones_a, ones_b = np.ones(len(sa)), np.ones(len(sb))
    rows = [Row("step_time", "step time", "s", compare_steps(dur_a, ones_a, dur_b, ones_b, **kwargs))]
    measured = {*(state_a.measured_phases if state_a else ()), *(state_b.measured_phases if state_b else ())}
    shares_a = state_a.shares if state_a else {}
    shares_b = state_b.shares if state_b else {}
    for phase in PHASES:
        if phase not in measured:
            continue
        pa, pb = sa.phase(phase).astype(np.float64) / 1e9, sb.phase(phase).astype(np.float64) / 1e9
        if not pa.any() and not pb.any():
            continue
        share_a, share_b = shares_a.get(phase, 0.0), shares_b.get(phase, 0.0)
        diff = compare_steps(pa, ones_a, pb, ones_b, **kwargs)
        diff = _small(diff, share_a, share_b, len(sa), len(sb), floor)
        rows.append(Row(phase, LABELS.get(phase, phase), "s", diff, share_a, share_b))
    rows.append(Row("steps_per_s", "steps/s", "/s",
                    compare_steps(ones_a, dur_a, ones_b, dur_b, higher_is_better=True, **kwargs)))
    samples_a, samples_b = sa.samples.astype(np.float64), sb.samples.astype(np.float64)
    if len(sa) and len(sb) and (samples_a >= 0).all() and (samples_b >= 0).all() and samples_a.any() and samples_b.any():
        rows.append(Row("samples_per_s", "samples/s", "/s",
                        compare_steps(samples_a, dur_a, samples_b, dur_b, higher_is_better=True, **kwargs)))
    gc_a, gc_b = _gc_per_step(a), _gc_per_step(b)
    if gc_a is not None and gc_b is not None and (gc_a.any() or gc_b.any()):
        ga, gb = gc_a[mask_a] / 1e9, gc_b[mask_b] / 1e9
        diff = compare_steps(ga, ones_a, gb, ones_b, **kwargs)
        share_a, share_b = _gc_share(a, state_a), _gc_share(b, state_b)
        diff = _small(diff, share_a, share_b, len(sa), len(sb), floor)
        rows.append(Row("gc", "GC pauses", "s", diff, share_a, share_b))
    if mfu_a is not None or mfu_b is not None:
        rows.append(Row("mfu", "MFU", "ratio", _plain(mfu_a, mfu_b, higher_is_better=True)))
    compile_a, compile_b = a.facts.compile, b.facts.compile
    if compile_a is not None or compile_b is not None:
        total = [float(sum(c.duration_ns for c in facts.compilations)) / 1e9 if facts else 0.0
                 for facts in (compile_a, compile_b)]
        counts = [float(len(facts.compilations)) if facts else 0.0 for facts in (compile_a, compile_b)]
        rows.append(Row("compile_total_s", "compile (total)", "s total", _plain(total[0], total[1])))
        rows.append(Row("compilations", "compilations", "count", _plain(counts[0], counts[1])))
    return tuple(rows)


def run_values(record: RunRecord) -> dict[str, tuple[float | None, float | None]]:
    """One run's figures (what :func:`step_rows` compares), as ``metric -> (value, share)``, read
    from its :class:`SteadyState` (and its GC pause summary)."""
    state = _steady(record)
    out: dict[str, tuple[float | None, float | None]] = {}
    if state is None or state.steady_count == 0 or state.total_s <= 0:
        return out
    steady = state.steady
    out["step_time"] = (state.step_time_mean_s, None)
    for phase in PHASES:
        if phase in state.measured_phases and steady.phase_mean_s.get(phase, 0.0) > 0:
            out[phase] = (steady.phase_mean_s[phase], state.shares[phase])
    out["steps_per_s"] = (steady.steps_per_s, None)
    if steady.samples_per_s:
        out["samples_per_s"] = (steady.samples_per_s, None)
    gc = summarize_gc_pauses(record, state.mask)
    if gc.measured:
        out["gc"] = (gc.total_s / state.steady_count, gc.share_of_step_time or 0.0)
    return out


def group_rows(records_a: Sequence[RunRecord], records_b: Sequence[RunRecord], *,
               floor: float | None = None) -> tuple[Row, ...]:
    """Several runs per side: each figure once per run, compared over runs (Welch)."""
    from stepscope.analysis.compare_stats import MEASURED_FLOOR, compare_runs

    values_a = [run_values(record) for record in records_a]
    values_b = [run_values(record) for record in records_b]
    rows = []
    for metric in METRICS:
        va = [values[metric] for values in values_a if metric in values]
        vb = [values[metric] for values in values_b if metric in values]
        if not va and not vb:
            continue
        higher = metric in ("steps_per_s", "samples_per_s")
        diff = compare_runs([v for v, _ in va if v is not None], [v for v, _ in vb if v is not None],
                            higher_is_better=higher,
                            floor=MEASURED_FLOOR if floor is None else floor)
        shares_a = [share for _, share in va if share is not None]
        shares_b = [share for _, share in vb if share is not None]
        share_a = float(np.mean(shares_a)) if shares_a else None
        share_b = float(np.mean(shares_b)) if shares_b else None
        if share_a is not None or share_b is not None:
            diff = _small(diff, share_a or 0.0, share_b or 0.0, MIN_STEPS, MIN_STEPS,
                          MEASURED_FLOOR if floor is None else floor)
        rows.append(Row(metric, LABELS.get(metric, metric), UNITS.get(metric, "s"), diff, share_a, share_b))
    return tuple(rows)


def _small(diff: Difference, share_a: float, share_b: float, steps_a: int, steps_b: int,
           floor: float | None = None) -> Difference:
    """A part of the step is judged by how much of the *step* it moves: its change times its share
    of A's step must pass the floor (a phase of 1 % that doubled moves the step by 1 %), and a part
    below :data:`MIN_SHARE` of the step in both runs gets no verdict of its own ("within noise")."""
    if min(steps_a, steps_b) < MIN_STEPS:
        return diff
    if max(share_a, share_b) < MIN_SHARE and diff.verdict in (FASTER, SLOWER, NO_BOUND):
        return replace(diff, verdict=WITHIN_NOISE)
    if diff.verdict in (FASTER, SLOWER) and diff.change is not None:
        moved = diff.change * share_a  # the step's relative change this part alone makes
        if not beyond_floor(moved, NOISE_FLOOR if floor is None else floor):
            return replace(diff, verdict=WITHIN_NOISE)
    return diff


def _plain(a: float | None, b: float | None, *, higher_is_better: bool = False) -> Difference:
    """A figure measured once per run (no interval): equal values are "within noise", others have
    no noise bound."""
    change = (b / a - 1) if a and b is not None else None
    verdict = WITHIN_NOISE if a == b else NO_BOUND
    return Difference(a, b, change, None, None, verdict, higher_is_better, "one value per run (no interval)")


# -- setup -----------------------------------------------------------------------------------------
def setup_facts(record: RunRecord) -> dict[str, str]:
    """The facts of a run's setup that ``diff`` compares, as ``what -> value`` text."""
    meta = record.meta
    facts: dict[str, str] = {
        "script": meta.target or "",
        "arguments": " ".join(meta.argv[1:]) if meta.argv else "",
        "git commit": (meta.git_commit or "")[:12],
        "torch": meta.torch_version or "",
        "python": meta.python_version,
        "stepscope": meta.stepscope_version,
        "host": meta.hostname,
        "CPU": meta.cpu_model,
        "cores usable": str(meta.cpu_count_usable or meta.cpu_count_logical or ""),
        "torch threads": "" if meta.intra_op_threads is None else str(meta.intra_op_threads),
        "device": ", ".join(f"{d.kind}:{d.name}" for d in meta.devices if d.kind != "cpu") or "cpu",
        "timing": meta.timing,
        "world size": str(meta.world_size),
    }
    for device in meta.devices:
        if device.kind == "cuda" and device.capability:
            facts[f"cuda:{device.index} capability"] = device.capability
    for index, loader in enumerate(record.loaders):
        prefix = f"DataLoader {index}"
        for name in ("batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "drop_last"):
            facts[f"{prefix} {name}"] = str(getattr(loader, name))
        facts[f"{prefix} dataset"] = loader.dataset_type
    compute = record.facts.compute
    if compute is not None:
        facts["compute dtype"] = compute.compute_dtype or ""
        facts["autocast"] = compute.autocast or "off"
        facts["parameter dtypes"] = ", ".join(compute.param_dtypes)
        facts["FLOPs per step"] = f"{compute.flops:.3g}"
    overrides = record.facts.overrides
    if overrides is not None:
        for item in overrides.settings:
            facts[f"--set {item.key}"] = str(item.value)
        if overrides.max_steps is not None:
            facts["--max-steps"] = str(overrides.max_steps)
    for name, value in meta.env.items():
        facts[f"${name}"] = value
    for path, digest in sorted(meta.source_hashes.items()):
        facts[f"{SOURCE_PREFIX}{path}"] = digest[:12]
    return facts


def setup_key(record: RunRecord) -> str:
    """A fingerprint of the setup: runs with the same key are repeats of one another."""
    import hashlib
    import json

    facts = {what: value for what, value in setup_facts(record).items() if what not in ("stepscope", "--max-steps")}
    return hashlib.sha1(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def setup_changes(a: RunRecord, b: RunRecord) -> tuple[SetupChange, ...]:
    """Facts that differ between the two setups (absent on one side reads "–")."""
    fa, fb = setup_facts(a), setup_facts(b)
    changes = []
    for what in [*fa, *(key for key in fb if key not in fa)]:
        va, vb = fa.get(what, "–") or "–", fb.get(what, "–") or "–"
        if va != vb:
            changes.append(SetupChange(what, va, vb))
    return tuple(changes)


# -- findings --------------------------------------------------------------------------------------
def finding_changes(a: Sequence[FindingBrief], b: Sequence[FindingBrief]) -> tuple[FindingChange, ...]:
    """Findings (by rule) that appeared, disappeared or changed severity from A to B."""
    by_a = {item.rule_id: item for item in a}
    by_b = {item.rule_id: item for item in b}
    changes = []
    for rule, item in by_b.items():
        if rule not in by_a:
            changes.append(FindingChange(rule, "appeared", item.title, None, item.severity))
        elif by_a[rule].severity != item.severity:
            worse = SEVERITIES.index(item.severity) > SEVERITIES.index(by_a[rule].severity)
            changes.append(FindingChange(rule, "more severe" if worse else "less severe", item.title,
                                         by_a[rule].severity, item.severity))
    for rule, item in by_a.items():
        if rule not in by_b:
            changes.append(FindingChange(rule, "disappeared", item.title, item.severity, None))
    return tuple(changes)


# -- ranks -----------------------------------------------------------------------------------------
def rank_rows(records_a: Sequence[RunRecord], records_b: Sequence[RunRecord],
              floor: float | None = None) -> tuple[RankRow, ...]:
    """Per-rank step time and collective wait, for ranks present in both jobs."""
    kwargs: dict[str, Any] = {} if floor is None else {"floor": floor}
    by_b = {record.meta.rank: record for record in records_b}
    rows = []
    for ra in sorted(records_a, key=lambda record: record.meta.rank):
        rb = by_b.get(ra.meta.rank)
        if rb is None:
            continue
        sa, sb = ra.steps.select(_mask(_steady(ra))), rb.steps.select(_mask(_steady(rb)))
        ones_a, ones_b = np.ones(len(sa)), np.ones(len(sb))
        rows.append(RankRow(
            ra.meta.rank,
            compare_steps(sa.duration_ns / 1e9, ones_a, sb.duration_ns / 1e9, ones_b, **kwargs),
            compare_steps(sa.communication_ns / 1e9, ones_a, sb.communication_ns / 1e9, ones_b, **kwargs)))
    return tuple(rows)


def diff_runs(a: RunRecord, b: RunRecord, *, label_a: str, label_b: str,
              findings_a: Sequence[FindingBrief] = (), findings_b: Sequence[FindingBrief] = (),
              mfu_a: float | None = None, mfu_b: float | None = None,
              ranks_a: Sequence[RunRecord] = (), ranks_b: Sequence[RunRecord] = (),
              floor: float | None = None, busy_a: float | None = None, busy_b: float | None = None,
              floor_source: str | None = None, floor_given: bool = False) -> RunDiff:
    """The :class:`RunDiff` of two runs (A is the baseline).

    ``busy_a``/``busy_b`` are the shares of the machine's cores other processes used during each run
    (the sampler's foreign load); above :data:`BUSY_SHARE` on either side the rows are judged against
    :data:`~stepscope.analysis.compare_stats.LOADED_FLOOR` (or ``floor`` when wider), unless the user
    gave the floor (``floor_given``: ``--noise-floor``)."""
    notes = []
    busy = {side: share for side, share in (("A", busy_a), ("B", busy_b)) if share is not None and share > BUSY_SHARE}
    if floor_source is None:
        floor_source = NOT_MEASURED if floor is None else f"×{1 + floor:.2f} (--noise-floor)"
    if busy:
        loads = ", ".join(f"{share:.0%} of the cores during {side}" for side, share in busy.items())
        if floor_given:
            notes.append(f"the machine was busy: other processes used {loads}; on identical runs load alone "
                         f"moved the step time by up to ×{LOADED_NOISE:.1f} (BENCHMARKS.md), beyond the "
                         "floor given with --noise-floor")
        else:
            floor = max(LOADED_FLOOR, NOISE_FLOOR if floor is None else floor)
            floor_source = (f"×{1 + floor:.2f}, measured under load (identical runs beside other processes "
                            f"differed by up to ×{LOADED_NOISE:.1f})")
            notes.append(f"the machine was busy: other processes used {loads}; load alone moved identical runs "
                         f"by up to ×{LOADED_NOISE:.1f} (BENCHMARKS.md), so only a change beyond ×{1 + floor:.1f} is "
                         "called real. Re-run both on a quiet machine to see smaller ones")
    rows = step_rows(a, b, mfu_a=mfu_a, mfu_b=mfu_b, floor=floor)
    steady_a, steady_b = (int(_mask(_steady(record)).sum()) for record in (a, b))
    if not len(a.steps) or not len(b.steps):
        notes.append("one of the runs has no steps: nothing to compare")
    elif min(steady_a, steady_b) < 10:
        notes.append(f"only {min(steady_a, steady_b)} steady steps on one side: no interval (run more steps)")
    if a.meta.exit_code not in (0, None) or b.meta.exit_code not in (0, None):
        notes.append(f"exit codes differ or failed: A {a.meta.exit_code}, B {b.meta.exit_code}")
    method = rows[0].diff.method if rows else ""
    diff = _assemble(a, b, rows, notes, label_a, label_b, findings_a, findings_b, ranks_a, ranks_b, floor,
                     steady_a, steady_b, method, floor_source=floor_source)
    step = diff.step_time
    shape = step_shape(a, b, step.diff if step is not None else None, floor)
    return replace(diff, shape=shape, floor=floor, busy_a=busy_a, busy_b=busy_b)


def step_shape(a: RunRecord, b: RunRecord, mean: Difference | None, floor: float | None = None) -> StepShape:
    """Where the mean step's change comes from (:class:`StepShape`): the median step compared with
    the same floor, each side's long steps, and the long steps' part of the mean's change."""
    state_a, state_b = _steady(a), _steady(b)
    mask_a, mask_b = _mask(state_a), _mask(state_b)
    dur_a = a.steps.duration_ns[mask_a].astype(np.float64) / 1e9
    dur_b = b.steps.duration_ns[mask_b].astype(np.float64) / 1e9
    median = compare_medians(dur_a, dur_b, floor=NOISE_FLOOR if floor is None else floor)
    long_a, long_b = long_steps(a, mask_a), long_steps(b, mask_b)
    tail = split_change(mean.a if mean is not None else None, long_a, long_b)
    source = ""
    if mean is not None and mean.change is not None and mean.change != 0:
        typical = median.verdict in (FASTER, SLOWER)
        # the long steps make the change when they hold most of it and the median moved by less
        # than half as much (a median that fell while the mean rose is noise, not an explanation)
        from_tail = (tail is not None and abs(tail) >= TAIL_SHARE * abs(mean.change)
                     and (tail > 0) == (mean.change > 0) and median.change is not None
                     and abs(median.change) <= TAIL_SHARE * abs(mean.change))
        source = "both" if typical and from_tail else "typical step" if typical else "long steps" if from_tail else ""
    return StepShape(median, long_a, long_b, tail, source)


def _assemble(a: RunRecord, b: RunRecord, rows: tuple[Row, ...], notes: list[str], label_a: str, label_b: str,
              findings_a: Sequence[FindingBrief], findings_b: Sequence[FindingBrief], ranks_a: Sequence[RunRecord],
              ranks_b: Sequence[RunRecord], floor: float | None, steady_a: int, steady_b: int, method: str,
              runs_a: int = 1, runs_b: int = 1, floor_source: str = "") -> RunDiff:
    def top(findings: Sequence[FindingBrief]) -> str | None:
        return f"[{findings[0].severity.upper()}] {findings[0].title}" if findings else None

    return RunDiff(label_a, label_b, rows, setup_changes(a, b), finding_changes(findings_a, findings_b),
                   steady_a, steady_b, rank_rows(ranks_a, ranks_b, floor) if len(ranks_a) > 1 or len(ranks_b) > 1 else (),
                   tuple(notes), "runs", method, top(findings_a), top(findings_b), runs_a, runs_b, floor_source)


def diff_groups(records_a: Sequence[RunRecord], records_b: Sequence[RunRecord], *, label_a: str, label_b: str,
                findings_a: Sequence[FindingBrief] = (), findings_b: Sequence[FindingBrief] = (),
                floor: float | None = None, busy: Sequence[float | None] = ()) -> RunDiff:
    """Repeats on each side (A's runs vs B's): rows over runs (:func:`group_rows`); the setup and
    findings compare each side's first run, and a side whose runs differ in setup is said."""
    rows = group_rows(records_a, records_b, floor=floor)
    notes = []
    for side, records in (("A", records_a), ("B", records_b)):
        differing = {change.what for other in records[1:] for change in setup_changes(records[0], other)}
        if differing:
            notes.append(f"the runs of {side} differ among themselves in {', '.join(sorted(differing)[:6])}: "
                         "they are not repeats of one setup")
    loaded = [share for share in busy if share is not None and share > BUSY_SHARE]
    if loaded:
        notes.append(f"{len(loaded)} of the runs ran on a busy machine (other processes used up to "
                     f"{max(loaded):.0%} of the cores); the repeats' spread includes it")
    steady_a = int(sum(_mask(_steady(record)).sum() for record in records_a))
    steady_b = int(sum(_mask(_steady(record)).sum() for record in records_b))
    method = rows[0].diff.method if rows else ""
    return _assemble(records_a[0], records_b[0], rows, notes, label_a, label_b, findings_a, findings_b, (), (), floor,
                     steady_a, steady_b, method, len(records_a), len(records_b),
                     f"×{MEASURED_FLOOR_TEXT}, the repeats measure the run-to-run noise")
