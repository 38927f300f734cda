"""``stepscope diff``'s pipeline: its inputs loaded once, the comparison, one :class:`DiffView`.

:func:`compare_paths` decides from the paths: run directories (``record.rank<N>.json.gz``) on
both sides compare runs (:mod:`stepscope.analysis.run.diff`), trace files or directories of
traces compare traces (:mod:`stepscope.analysis.trace.trace_diff`). Each run directory is read
once (:func:`load_side`: every rank's record, and its findings as typed
:class:`~stepscope.diagnosis.findings.Finding` objects from ``report.json`` — the verdict the user
saw — or from a fresh diagnosis when it is missing or damaged); the noise floor comes from
``--noise-floor``, from earlier identical runs in the run index taken on a quiet machine
(:func:`history_floor`), from the load the runs ran under, or the default. The result is a
:class:`~stepscope.report.diff_view.DiffView` the renderers of
:data:`stepscope.report.render.VIEW_RENDERERS` show (terminal, JSON, HTML).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from stepscope.analysis.compare_stats import FASTER, NO_BOUND, SLOWER, WITHIN_NOISE, Difference
from stepscope.analysis.run.diff import (BUSY_SHARE, SOURCE_PREFIX, FindingBrief, RunDiff, diff_groups,
                                         diff_runs, setup_key)
from stepscope.analysis.run.long_steps import LongSteps
from stepscope.errors import InputError, UsageError
from stepscope.record import layout
from stepscope.record.run import PHASES, RunRecord
from stepscope.record.store import load_record
from stepscope.report.diff_view import (DiffRow, DiffView, Figure, FindingLine, Gate, Histogram, OpLine, OpTable,
                                        RankLine, RunDiffView, SetupLine, TraceDiffView, change_text, interval_text,
                                        value_text)

if TYPE_CHECKING:
    from stepscope.analysis.trace.trace_diff import OpDiff, TraceDiff
    from stepscope.diagnosis.findings import Finding

#: Setup lines the terminal shows (``--format json`` lists them all).
MAX_SETUP = 20
#: Rows of each operator table of a trace diff on the terminal; rows of the HTML page's table.
MAX_OPS = 10
MAX_PAGE_OPS = 2000
HISTOGRAM_BINS = 40
#: Findings' severities, mildest first.
SEVERITIES = ("info", "low", "medium", "high", "critical")
#: The verdict of every row of ``diff A A``.
SAME_RUN = "same run"
TONE = {FASTER: "good", SLOWER: "bad", WITHIN_NOISE: "neutral", NO_BOUND: "unsure", "failed": "bad"}


# -- inputs ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSide:
    """One run directory, read once: its records (every rank), findings, MFU and the other
    processes' share of the cores while it ran."""

    path: Path
    record: RunRecord  # rank 0's (the job's reference rank)
    ranks: tuple[RunRecord, ...]  # every rank's, for a job of several ranks (else empty)
    findings: tuple[Finding, ...]
    mfu: float | None
    busy: float | None


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and bool(layout.record_ranks(path))


def load_side(path: Path) -> RunSide:
    """A run directory's records and report, each read once."""
    ranks = layout.record_ranks(path)
    if len(ranks) > 1:
        from stepscope.record.store import load_job

        job = tuple(load_job(path))
        record = next((item for item in job if item.meta.rank == 0), job[0])
    else:
        job, record = (), load_record(path, with_samples=False)
    findings, mfu, busy = saved_report(path)
    return RunSide(path, record, job, findings, mfu, busy)


def saved_report(run_dir: Path) -> tuple[tuple[Finding, ...], float | None, float | None]:
    """The run's findings (typed), MFU and foreign share of the cores, from its ``report.json``; from
    a fresh diagnosis (the typed :class:`~stepscope.report.model.Report`) when it is missing or damaged."""
    from stepscope.verify import findings_of

    path = layout.report_path(run_dir)
    document: dict[str, Any] | None = None
    if path.is_file():
        try:
            loaded = orjson.loads(path.read_bytes())
            document = loaded if isinstance(loaded, dict) else None
        except (OSError, orjson.JSONDecodeError):
            document = None
    if document is None:
        from stepscope.pipeline.diagnose import diagnose
        from stepscope.pipeline.inputs import load_run

        report = diagnose(load_run(run_dir))
        mfu_estimate, foreign_load = report.evidence.mfu, report.evidence.foreign
        return (tuple(report.findings), mfu_estimate.value if mfu_estimate is not None else None,
                foreign_load.cpu_share if foreign_load is not None else None)
    saved = document.get("evidence")
    evidence: dict[str, Any] = saved if isinstance(saved, dict) else {}
    mfu = evidence.get("mfu")
    value = mfu.get("value") if isinstance(mfu, dict) else None
    foreign = evidence.get("foreign")
    share = foreign.get("cpu_share") if isinstance(foreign, dict) else None
    return (tuple(findings_of(document)), float(value) if isinstance(value, (int, float)) else None,
            float(share) if isinstance(share, (int, float)) else None)


def briefs(findings: Sequence[Finding]) -> list[FindingBrief]:
    return [FindingBrief(item.rule_id, item.title, item.severity.name.lower()) for item in findings]


def history_floor(record: RunRecord, index: Path | None) -> tuple[float | None, str | None]:
    """The noise floor earlier identical runs in the run index measure, over those taken on a quiet
    machine only (a run beside other processes measures their load, not this setup's noise: it
    would hide a real change); None without 3 of them."""
    from stepscope.analysis.compare_stats import floor_from_history
    from stepscope.record.run_index import repeats

    try:
        found = repeats(index, setup_key(record))
    except (UsageError, OSError, ValueError):
        return None, None
    quiet, loaded = [], 0
    for run in found:
        if not run.get("step_time_s"):
            continue
        busy = run.get("busy_share")
        if busy is None and run.exists:
            busy = saved_report(Path(run.run_dir))[2] if layout.report_path(Path(run.run_dir)).is_file() else None
        if busy is None or busy > BUSY_SHARE:
            loaded += busy is not None
            continue
        quiet.append(run.get("step_time_s"))
    floor = floor_from_history(quiet)
    if floor is None:
        return None, None
    left_out = f"; {loaded} run(s) beside other processes left out" if loaded else ""
    return floor, f"×{1 + floor:.2f}, measured on {len(quiet)} identical runs in the run index{left_out}"


# -- runs ------------------------------------------------------------------------------------------
def diff_sides(side_a: list[RunSide], side_b: list[RunSide], *, floor: float | None = None,
               index: Path | None = None) -> RunDiff:
    """Runs compared: one directory per side (bootstrap over steps; the floor from ``--noise-floor``,
    earlier identical quiet runs in ``index``, the load, or the default), or several (repeats: Welch
    over runs)."""
    same = _same_runs([side.path for side in side_a], [side.path for side in side_b])
    label_a = _label(side_a)
    label_b = _label(side_b)
    if len(side_a) > 1 or len(side_b) > 1:
        return _noted(diff_groups([side.record for side in side_a], [side.record for side in side_b],
                                  label_a=label_a, label_b=label_b, findings_a=briefs(side_a[0].findings),
                                  findings_b=briefs(side_b[0].findings), floor=floor,
                                  busy=[side.busy for side in (*side_a, *side_b)]), same)
    a, b = side_a[0], side_b[0]
    given = floor is not None
    source = None
    if floor is None:
        floor, source = history_floor(a.record, index)
    return _noted(diff_runs(a.record, b.record, label_a=label_a, label_b=label_b, findings_a=briefs(a.findings),
                            findings_b=briefs(b.findings), mfu_a=a.mfu, mfu_b=b.mfu, ranks_a=a.ranks, ranks_b=b.ranks,
                            floor=floor, busy_a=a.busy, busy_b=b.busy, floor_source=source, floor_given=given), same)


def _label(sides: list[RunSide]) -> str:
    return str(sides[0].path) if len(sides) == 1 else f"{sides[0].path} (+{len(sides) - 1} more)"


def _same_runs(side_a: list[Path], side_b: list[Path]) -> tuple[str, bool] | None:
    """A note when a run directory is on both sides (``diff A A``: its numbers are equal by
    construction, so "within noise" says nothing about the run), and whether the sides are one run."""
    keys_a = {_identity(path): path for path in side_a}
    shared = [path for path in side_b if _identity(path) in keys_a]
    if not shared:
        return None
    if len(side_a) == len(side_b) == 1:
        return (f"A and B are the same run ({shared[0]}): every change is zero by construction and "
                "'within noise' says nothing; pass another run as B"), True
    shown = ", ".join(str(path) for path in shared[:3]) + (", …" if len(shared) > 3 else "")
    return (f"{len(shared)} run(s) on both sides ({shown}): the sides are not independent; "
            "each run belongs on one side"), False


def _identity(path: Path) -> tuple[int, int] | str:
    try:
        info = path.stat()
        return info.st_dev, info.st_ino
    except OSError:
        return str(path.resolve())


def _noted(diff: RunDiff, same: tuple[str, bool] | None) -> RunDiff:
    if same is None:
        return diff
    note, one_run = same
    rows = diff.rows
    if one_run:  # every row is zero by construction: its verdict says so, not "within noise"
        rows = tuple(replace(row, diff=replace(row.diff, verdict=SAME_RUN)) for row in rows)
    return replace(diff, rows=rows, notes=(note, *diff.notes), same_run=one_run)


# -- the gate --------------------------------------------------------------------------------------
def regression_gate(diff: RunDiff, metric: str, threshold: float) -> Gate:
    """Whether B regressed on ``metric``: worse by more than ``threshold`` *and* beyond noise."""
    row = diff.row(metric)
    if row is None:
        raise UsageError(f"--metric {metric}: not measured in both runs (have: "
                         f"{', '.join(r.metric for r in diff.rows)})")
    worse = row.diff.worse_by
    beyond = row.diff.verdict == SLOWER
    failed = bool(worse is not None and worse > threshold and beyond)
    inconclusive = worse is None or row.diff.verdict == NO_BOUND
    if inconclusive:
        message = (f"gate: inconclusive — {row.label} has no noise bound ({'; '.join(diff.notes) or row.diff.verdict}); "
                   "passed, but nothing was checked")
    elif failed:
        message = (f"gate: FAILED — {row.label} is worse by {worse:.1%} (interval {row.diff.low:+.1%} … "
                   f"{row.diff.high:+.1%}), beyond noise and above the {threshold:.1%} allowed")
    else:
        why = ("faster" if row.diff.verdict == FASTER else "within noise") if not beyond \
            else f"within the {threshold:.1%} allowed"
        message = f"gate: passed — {row.label} {row.diff.change:+.1%} ({why})" if row.diff.change is not None \
            else f"gate: passed ({why})"
    status = "failed" if failed else "inconclusive" if inconclusive else "passed"
    return Gate(metric, threshold, worse, row.diff.verdict, failed, status, message)


# -- the view --------------------------------------------------------------------------------------
def _figure(diff: Difference) -> Figure:
    return Figure(diff.a, diff.b, diff.change, diff.low, diff.high, diff.verdict, TONE.get(diff.verdict, "neutral"))


def headline(diff: RunDiff, metric: str = "step_time") -> str:
    """One sentence: is B faster or slower, by how much, is it beyond noise, and from what."""
    if diff.same_run:
        return "A and B are the same run: nothing was compared (every change is zero by construction)"
    row = diff.row(metric) or diff.step_time
    if row is None:
        return "nothing to compare"
    d = Figure(row.diff.a, row.diff.b, row.diff.change, row.diff.low, row.diff.high, row.diff.verdict)
    if d.change is None:
        return f"{row.label}: no comparison ({d.verdict})"
    shape = diff.shape if row.metric == "step_time" else None
    if d.verdict in (FASTER, SLOWER):
        word = "faster" if d.verdict == FASTER else "slower"
        tail = ""
        if shape is not None and shape.source == "long steps":
            tail = f"; from {_long_steps_words(shape.long_a, shape.long_b)}, the typical step did not change"
        return (f"B is {word}: {row.label} {value_text(d.a, row.unit)} → {value_text(d.b, row.unit)} "
                f"({change_text(d)}, {interval_text(d)}: beyond noise{tail})")
    if d.verdict == WITHIN_NOISE:
        bound = f", interval {interval_text(d)}" if d.low is not None else ""
        return f"no difference beyond noise in {row.label} ({change_text(d)}{bound})"
    return f"{row.label} {change_text(d)}, but without a noise bound ({d.verdict})"


def _long_steps_words(long_a: LongSteps | None, long_b: LongSteps | None) -> str:
    """"7 long steps in B (23.1 s above the median in all: torch.compile recompilation 7 steps 23.1 s)"
    and A's, the two costliest causes of each."""
    parts = []
    for side, item in (("B", long_b), ("A", long_a)):
        if item is None or not item.count:
            continue
        causes = ", ".join(f"{cause} {count} step{'s' if count != 1 else ''} {format_seconds(excess)}"
                           for cause, count, excess in item.causes[:2])
        more = f", {len(item.causes) - 2} other causes" if len(item.causes) > 2 else ""
        parts.append(f"{item.count} long step{'s' if item.count != 1 else ''} in {side} "
                     f"({format_seconds(item.excess_s)} above the median in all: {causes}{more})")
    return " and ".join(parts) or "no long steps"


def format_seconds(value: float | None) -> str:
    from stepscope.units import format_duration

    return "–" if value is None else format_duration(value)


def origin(diff: RunDiff) -> str | None:
    """Where the step time's change comes from: the typical step (the median), or N long steps and
    what they were (compile, GC, a checkpoint or evaluation outside the model)."""
    shape, step = diff.shape, diff.step_time
    if shape is None or step is None or step.diff.change is None or diff.same_run:
        return None
    median = shape.median
    typical = (f"median step {format_seconds(median.a)} → {format_seconds(median.b)} "
               f"({change_text(_figure(median))}, {median.verdict})")
    tail = shape.tail_change
    long_words = _long_steps_words(shape.long_a, shape.long_b)
    if shape.source == "long steps":
        return (f"the mean step's change ({change_text(_figure(step.diff))}) comes from long steps: "
                f"{long_words} make {tail:+.1%} of it; the typical step did not change ({typical})")
    if shape.source == "both":
        return (f"the typical step changed ({typical}), and {long_words} make {tail:+.1%} of the mean's "
                f"{change_text(_figure(step.diff))}")
    if shape.source == "typical step":
        extra = f"; {long_words}" if any(item is not None and item.count for item in (shape.long_a, shape.long_b)) else ""
        return f"the typical step changed: {typical}{extra}"
    if any(item is not None and item.count for item in (shape.long_a, shape.long_b)):
        return f"{typical}; {long_words}"
    return f"{typical}; no long steps on either side"


def _basis(diff: RunDiff) -> str:
    runs = f"runs: A {diff.runs_a}, B {diff.runs_b} · " if diff.runs_a > 1 or diff.runs_b > 1 else ""
    floor = f" · noise floor {diff.floor_source}" if diff.floor_source else ""
    return f"{runs}steady steps: A {diff.steady_a}, B {diff.steady_b} · {diff.method}{floor}"


def _histogram(record_a: RunRecord, record_b: RunRecord, bins: int = HISTOGRAM_BINS) -> Histogram:
    from stepscope.analysis.run.steady import steady_mask

    durations_a = record_a.steps.duration_ns[steady_mask(record_a)] / 1e9
    durations_b = record_b.steps.duration_ns[steady_mask(record_b)] / 1e9
    both = np.concatenate([durations_a, durations_b]) if len(durations_a) + len(durations_b) else np.zeros(1)
    low, high = float(np.percentile(both, 0.5)), float(np.percentile(both, 99.5))
    if high <= low:
        high = low + 1e-9
    edges = np.linspace(low, high, bins + 1)
    shares = [tuple(float(item) for item in np.histogram(np.clip(values, low, high), bins=edges)[0] / max(1, len(values)))
              for values in (durations_a, durations_b)]
    return Histogram(low, high, shares[0], shares[1])


def _shares(diff: RunDiff, side: str) -> dict[str, float]:
    """Each phase's share of one side's steady step, in the order of :data:`PHASES` (every phase, 0
    when not measured): the page's phase bars."""
    rows = {row.metric: row for row in diff.rows if row.metric in PHASES}
    return {phase: ((rows[phase].share_a if side == "a" else rows[phase].share_b) or 0.0) if phase in rows else 0.0
            for phase in PHASES}


def run_view(diff: RunDiff, *, metric: str = "step_time", gate: Gate | None = None,
             records: tuple[RunRecord, RunRecord] | None = None) -> DiffView:
    """The :class:`DiffView` of two runs (``records``: A's and B's, for the page's histogram)."""
    rows = tuple(DiffRow(row.metric, row.label, row.unit, _figure(row.diff), row.share_a, row.share_b,
                         row.metric in PHASES) for row in diff.rows)
    ranks = tuple(RankLine(rank.rank, _figure(rank.step_time), _figure(rank.communication)) for rank in diff.ranks)
    setup = tuple(SetupLine(change.what, change.a, change.b) for change in diff.setup)
    sources = tuple(change.what[len(SOURCE_PREFIX):] for change in diff.setup if change.what.startswith(SOURCE_PREFIX))
    findings = tuple(FindingLine(item.change, (item.severity_b or item.severity_a or "").upper(), item.title,
                                 item.severity_a if item.change in ("more severe", "less severe") else None)
                     for item in diff.findings)
    view = RunDiffView(
        basis=_basis(diff), rows=rows, ranks=ranks, setup=setup[:MAX_SETUP], setup_more=max(0, len(setup) - MAX_SETUP),
        sources_changed=sources, top_a=diff.top_a, top_b=diff.top_b, findings=findings, notes=diff.notes,
        headline=headline(diff, metric), origin=origin(diff), same_run=diff.same_run,
        shares_a=_shares(diff, "a"), shares_b=_shares(diff, "b"),
        histogram=_histogram(*records) if records is not None else None)
    document = diff.to_dict()
    if gate is not None:
        document["gate"] = gate.to_dict()
    return DiffView(diff.a, diff.b, view, None, gate, document)


def _op(op: OpDiff) -> OpLine:
    return OpLine(op.name, op.category, op.count_a, op.count_b, op.total_us_a, op.total_us_b, op.diff_us,
                  op.per_call_change)


def trace_view(diff: TraceDiff, top: int = MAX_OPS) -> DiffView:
    tables = tuple(OpTable(title, tuple(_op(op) for op in rows)) for title, rows in (
        ("Largest increases in total time", diff.largest_increases(top)),
        ("Largest decreases in total time", diff.largest_decreases(top)),
        ("Largest per-call slow-downs (≥ 10 µs in B)", diff.per_call_slowdowns(top)),
        ("Added (only in B)", diff.added(top)), ("Deleted (only in A)", diff.deleted(top))) if rows)
    view = TraceDiffView(diff.iterations_a, diff.iterations_b, diff.device,
                         None if diff.step_change is None else (diff.step_us_a or 0) / 1e3,
                         None if diff.step_change is None else (diff.step_us_b or 0) / 1e3,
                         diff.step_change, diff.counts, tables, tuple(_op(op) for op in diff.ops[:MAX_PAGE_OPS]),
                         len(diff.ops))
    return DiffView(diff.a, diff.b, None, view, None, diff.to_dict())


# -- traces ----------------------------------------------------------------------------------------
def _run_leftovers(path: Path) -> list[str]:
    """Files of a run in a directory without a record: a checkpoint, samples, report, lock, traces."""
    try:
        names = sorted(entry.name for entry in path.iterdir())
    except OSError:
        return []
    pattern = re.compile(r"^(record\.rank\d+\.partial\.json\.gz|samples\.rank\d+\.jsonl\.gz|"
                         r"roles\.rank\d+\.jsonl|report(\.rank\d+)?\.json|rank\d+\.lock|traces)$")
    return [name for name in names if pattern.match(name)]


def _has_traces(path: Path) -> bool:
    from stepscope.traces.load import discover_traces

    try:
        return bool(discover_traces(path))
    except InputError:
        return False


def not_a_run_dir(path: Path) -> InputError:
    """What a directory without a run record holds instead, and what reads it."""
    if layout.partial_record_ranks(path):
        return InputError(path, "not a finished run: it holds only the last checkpoint of a run that was killed "
                                f"({layout.partial_record_path(path, layout.partial_record_ranks(path)[0]).name}); "
                                f"'stepscope report {path}' reads it")
    where = [folder for folder in (path / "traces", path) if folder.is_dir() and _has_traces(folder)
             and not (folder == path and _run_leftovers(path) and not _trace_names(path))]
    missing = ("its record is missing" if _run_leftovers(path) else "no record.rank<R>.json.gz")
    if where:
        return InputError(path, f"not a run directory ({missing}); it holds profiler traces: "
                                f"'stepscope analyze {where[0]}' reads them, and 'stepscope diff' compares "
                                "two traces")
    return InputError(path, f"not a run directory ({missing}) and it holds no profiler trace; pass directories "
                            "written by 'stepscope run', or two traces")


def _trace_names(path: Path) -> list[str]:
    """Trace files of a directory, not counting a run's report.json."""
    from stepscope.traces.load import discover_traces

    try:
        return [name for name in discover_traces(path) if not Path(name).name.startswith("report")]
    except InputError:
        return []


def _trace_file(path: Path, rank: int | None) -> Path:
    from stepscope.traces.load import discover_traces

    if path.is_file():
        return path
    files = discover_traces(path)
    if not files:
        raise InputError(path, "no trace (*.json, *.json.gz, *.pt.trace.json) here; pass a trace file, "
                               "a directory of traces or a run directory")
    return Path(files[0] if rank is None else files[min(rank, len(files) - 1)])


def diff_traces(a: Path, b: Path, *, device: str = "all", rank: int | None = None,
                iterations_a: tuple[int, ...] | None = None, iterations_b: tuple[int, ...] | None = None) -> TraceDiff:
    from stepscope.analysis.trace.trace_diff import trace_diff
    from stepscope.traces.load import load_trace

    file_a, file_b = _trace_file(a, rank), _trace_file(b, rank)
    trace_a, trace_b = load_trace(file_a), load_trace(file_b)
    try:
        return trace_diff(trace_a.events, trace_b.events, label_a=str(file_a), label_b=str(file_b),
                          iterations_a=iterations_a, iterations_b=iterations_b, device=device)
    except UsageError as exc:
        raise UsageError(f"{file_a} vs {file_b}: {exc}") from None


# -- the entry -------------------------------------------------------------------------------------
def compare_runs(side_a: Sequence[Path], side_b: Sequence[Path], *, floor: float | None = None,
                 index: Path | None = None, metric: str = "step_time", gate_threshold: float | None = None,
                 histogram: bool = False) -> DiffView:
    """Run directories compared (each read once): the :class:`DiffView`, with the gate when asked."""
    sides_a = [load_side(Path(path)) for path in side_a]
    sides_b = [load_side(Path(path)) for path in side_b]
    diff = diff_sides(sides_a, sides_b, floor=floor, index=index)
    gate = regression_gate(diff, metric, gate_threshold) if gate_threshold is not None else None
    records = (sides_a[0].record, sides_b[0].record) if histogram else None
    return run_view(diff, metric=metric, gate=gate, records=records)


def compare_paths(a: Sequence[Path], b: Sequence[Path], *, floor: float | None = None, index: Path | None = None,
                  metric: str = "step_time", gate_threshold: float | None = None, histogram: bool = False,
                  device: str = "all", rank: int | None = None, iterations_a: tuple[int, ...] | None = None,
                  iterations_b: tuple[int, ...] | None = None) -> DiffView:
    """Runs when every path is a run directory, traces when both are traces; else a usage error."""
    side_a, side_b = [Path(item) for item in a], [Path(item) for item in b]
    for path in (*side_a, *side_b):
        if not path.exists():
            raise InputError(path, "no such file or directory; pass two run directories or two traces")
    paths = (*side_a, *side_b)
    runs = [is_run_dir(path) for path in paths]
    if all(runs):
        return compare_runs(side_a, side_b, floor=floor, index=index, metric=metric, gate_threshold=gate_threshold,
                            histogram=histogram)
    for path, flag in zip(paths, runs):  # a directory meant as a run (or holding no trace): say what it lacks
        if not flag and path.is_dir() and (any(runs) or _run_leftovers(path) or not _has_traces(path)):
            raise not_a_run_dir(path)
    if any(runs):
        run = next(path for path, flag in zip(paths, runs) if flag)
        other = next(path for path, flag in zip(paths, runs) if not flag)
        raise UsageError(f"cannot compare a run with a trace ({run} is a run directory, {other} is a file); "
                         "pass runs on both sides or traces on both sides")
    if len(side_a) > 1 or len(side_b) > 1:
        raise UsageError("traces are compared one per side (repeats are for runs)")
    if gate_threshold is not None:
        raise UsageError("--fail-if-slower needs two runs: one trace per side has no noise bound; "
                         "record runs with 'stepscope run' and compare their directories")
    return trace_view(diff_traces(side_a[0], side_b[0], device=device, rank=rank, iterations_a=iterations_a,
                                  iterations_b=iterations_b))
