"""One report for a multi-rank job: every rank's record merged.

:func:`build_job_report` loads every ``record.rank<R>.json.gz`` of a run directory (ranks of every
node write into the same directory, file names carry the global rank), builds each rank's evidence
and diagnosis with :func:`~stepscope.analysis.bundle.build_evidence` /
:func:`~stepscope.diagnosis.engine.run_rules` (each rank sees all the others, for the cross-rank
rules), and merges them:

- a per-rank table (:mod:`stepscope.analysis.run.ranks`): step time, data wait, compute,
  communication (exposed and overlapped), CPU, memory; the rank spread;
- the job's findings: one per rule, naming the ranks it fired on (``extra["ranks"]``), the costliest
  rank's numbers; cross-rank causes (a straggler, communication) first, since they explain the
  other ranks' symptoms;
- the ranks without a record, and why (:func:`~stepscope.analysis.run.ranks.missing_ranks`).

The job's other ranks on the same machine are not "foreign load" for a rank: their processes are
left out of its foreign processes and their CPU out of its foreign share.

:func:`wait_for_ranks` is what rank 0 does after its own record is saved: it waits, a bounded time,
for the other ranks' records (a rank whose lock is no longer held has ended and is not waited for).
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepscope.analysis.bundle import build_evidence
from stepscope.analysis.run.ranks import MissingRank, RankRow, RankSpread, missing_ranks, rank_row, rank_spread
from stepscope.diagnosis.engine import rank_findings, run_rules
from stepscope.diagnosis.findings import Finding
from stepscope.record import layout
from stepscope.record.run import RunRecord

if TYPE_CHECKING:
    from stepscope.report.model import RankReport, Report

#: Families that explain other ranks' symptoms: listed first among the job's findings.
JOB_FAMILIES = ("straggler", "communication")
#: How long rank 0 waits for the other ranks' records after its own (``STEPSCOPE_JOB_WAIT_S``).
DEFAULT_WAIT_S = 60.0


@dataclass(frozen=True)
class JobSummary:
    world_size: int
    rows: tuple[RankRow, ...]
    spread: RankSpread | None
    missing: tuple[MissingRank, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "ranks": [row.to_dict() for row in self.rows],
                "spread": self.spread.to_dict() if self.spread is not None else None,
                "missing": [item.to_dict() for item in self.missing]}


def is_job_dir(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds (or should hold) several ranks' records."""
    path = Path(run_dir)
    if not path.is_dir():
        return False
    ranks = layout.record_ranks(path)
    if len(ranks) > 1:
        return True
    if not ranks:
        return False
    from stepscope.record.store import load_record

    try:
        return load_record(path, ranks[0], with_samples=False).meta.world_size > 1
    except Exception:  # noqa: BLE001
        return False


def wait_for_ranks(run_dir: str | Path, world_size: int, timeout_s: float | None = None,
                   poll_s: float = 0.2) -> list[int]:
    """Wait until every rank below ``world_size`` has a record, or has ended without one, or the
    timeout passes; returns the ranks that have a record."""
    if timeout_s is None:
        try:
            timeout_s = float(os.environ.get("STEPSCOPE_JOB_WAIT_S", DEFAULT_WAIT_S))
        except ValueError:
            timeout_s = DEFAULT_WAIT_S
    path = Path(run_dir)
    deadline = time.monotonic() + max(0.0, timeout_s)
    while True:
        present = layout.record_ranks(path)
        pending = [rank for rank in range(world_size) if rank not in present and _may_still_write(path, rank)]
        if not pending or time.monotonic() >= deadline:
            return present
        time.sleep(poll_s)


def _may_still_write(run_dir: Path, rank: int) -> bool:
    """False when the rank's lock exists and nobody holds it (the rank ended)."""
    lock = layout.lock_path(run_dir, rank)
    try:
        descriptor = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return True  # not started yet (or on another node, still claiming)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True  # held: the rank is alive
    else:
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        return False
    finally:
        os.close(descriptor)


def load_ranks(run_dir: str | Path) -> tuple[list[RunRecord], list[MissingRank]]:
    """Every readable rank record (with samples) and the ranks whose record could not be read."""
    from stepscope.record.store import load_record

    records: list[RunRecord] = []
    unreadable: list[MissingRank] = []
    for rank in layout.record_ranks(Path(run_dir)):
        try:
            records.append(load_record(run_dir, rank))
        except Exception as exc:  # noqa: BLE001 - one damaged rank must not cost the others
            try:
                records.append(load_record(run_dir, rank, with_samples=False))
            except Exception:  # noqa: BLE001
                unreadable.append(MissingRank(rank, f"record unreadable ({exc})"))
    return records, unreadable


def build_job_report(run_dir: str | Path, records: list[RunRecord] | None = None) -> Report:
    """The merged report of every rank in ``run_dir`` (see the module docstring)."""
    from stepscope.analysis.run.signals import compute_signals
    from stepscope.analysis.run.steady import steady_state
    from stepscope.analysis.run.window import steady_window
    from stepscope.report.model import RankReport, Report, _diagnosis_warnings, run_trace_window  # noqa: F811

    run_dir = Path(run_dir)
    unreadable: list[MissingRank] = []
    if records is None:
        records, unreadable = load_ranks(run_dir)
    if not records:
        raise ValueError(f"no rank record in {run_dir}")
    records = sorted(records, key=lambda item: item.meta.rank)
    signals: dict[int, Any] = {}
    for record in records:
        try:
            state = steady_state(record)
            span = steady_window(record.steps, state.mask, record.samples.ts_ns if record.samples else None) \
                if state is not None else None
            signals[record.meta.rank] = compute_signals(record.samples, record.steps, span) if record.samples else None
        except Exception:  # noqa: BLE001
            signals[record.meta.rank] = None
    job = tuple(records)
    per_rank: list[RankReport] = []
    rows = []
    for record in records:
        siblings = [other for other in records if other is not record and other.meta.hostname == record.meta.hostname]
        cores, pids = _sibling_load(siblings, signals)
        window, _ = run_trace_window(record, run_dir)
        evidence = build_evidence(record, signals=signals[record.meta.rank],
                                  trace=window.evidence() if window is not None else None,
                                  ranks=job, sibling_cores=cores, sibling_pids=pids)
        diagnosis = run_rules(evidence)
        per_rank.append(RankReport(record.meta.rank, evidence, diagnosis))
        top = diagnosis.findings[0].title if diagnosis.findings else None
        rows.append(rank_row(evidence, top))
    world = max(max(record.meta.world_size for record in records), len(records))
    present = [record.meta.rank for record in records]
    missing = sorted([*unreadable, *[item for item in missing_ranks(run_dir, present, world)
                                     if item.rank not in {bad.rank for bad in unreadable}]],
                     key=lambda item: item.rank)
    summary = JobSummary(world, tuple(rows), rank_spread(rows), tuple(missing))
    findings = merge_findings(per_rank)
    first = per_rank[0]
    warnings = [f"rank {item.rank} missing: {item.reason}" for item in missing]
    for part in per_rank:
        record_warnings = part.evidence.record.warnings if part.evidence.record is not None else ()
        warnings += [f"rank {part.rank}: {text}" for text in (*record_warnings, *_diagnosis_warnings(part.diagnosis))]
    return Report(source="run", evidence=first.evidence, diagnosis=first.diagnosis, findings=findings,
                  warnings=tuple(dict.fromkeys(warnings)), ranks=tuple(per_rank), job=summary)


def _sibling_load(siblings: list[RunRecord], signals: dict[int, Any]) -> tuple[float, frozenset[int]]:
    cores = 0.0
    pids: set[int] = set()
    for other in siblings:
        pids.add(other.meta.pid)
        if other.samples is not None and getattr(other.samples, "meta", None) is not None:
            pids.add(other.samples.meta.sampler_pid)
        found = signals.get(other.meta.rank)
        if found is not None:
            for load in found.workers:
                pids.add(load.pid)
                cores += load.cpu_util
    return cores, frozenset(pids)


def merge_findings(per_rank: list[RankReport]) -> tuple[Finding, ...]:
    """One finding per rule for the job, naming its ranks; cross-rank causes first."""
    groups: dict[str, list[tuple[int, Finding]]] = {}
    for part in per_rank:
        for finding in part.diagnosis.findings:
            groups.setdefault(finding.rule_id, []).append((part.rank, finding))
    several = len(per_rank) > 1
    merged: list[Finding] = []
    for items in groups.values():
        ranks = sorted(rank for rank, _ in items)
        worst_rank, worst = max(items, key=lambda item: (item[1].impact, -item[0]))
        if worst.family == "healthy" and len(ranks) < len(per_rank):
            continue  # healthy on some ranks only: the others' findings speak for the job
        extra = {**worst.extra, "ranks": ranks}
        title = worst.title
        if several and worst.family not in ("straggler",):
            extra.setdefault("rank", worst_rank)
            title = f"{title} — rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        merged.append(replace(worst, title=title, extra=extra))
    ranked = rank_findings(_link_straggler_causes(merged))
    return tuple(sorted(ranked, key=lambda item: item.family not in JOB_FAMILIES))


#: The straggler's phase -> the families of the slow rank's own findings that are its cause.
STRAGGLER_CAUSES = {"data_wait": frozenset({"input_pipeline", "storage_io", "cpu_oversubscription"}),
                    "forward": frozenset({"compute", "launch_overhead", "host_device_sync"}),
                    "other": frozenset({"outside_model", "garbage_collection", "periodic_stall"})}


def _link_straggler_causes(merged: list[Finding]) -> list[Finding]:
    """The slow rank's own finding that explains a straggler says so: both describe one cause
    (each cost is of its own rank's step: the straggler's of the waiting ranks', the cause's of the
    slow rank's), so the job report does not read as two problems."""
    stragglers = [item for item in merged if item.family == "straggler" and "rank" in item.extra]
    out = []
    for item in merged:
        cause_of = next((other for other in stragglers
                         if item.family in STRAGGLER_CAUSES.get(str(other.extra.get("phase")), ())
                         and item.extra.get("ranks") == [other.extra["rank"]]), None)
        if cause_of is not None:
            rank = cause_of.extra["rank"]
            item = replace(item, title=f"{item.title} (why rank {rank} straggles)",
                           extra={**item.extra, "cause_of": cause_of.rule_id})
        out.append(item)
    return out
