"""`stepscope run --verify`: the diagnosis tests its own prescriptions before it shows them.

After the run, every machine-applicable prescription of the top findings (one whose change
`stepscope run --set` can make to the unmodified script) and the variants a careful engineer would
try beside it — DataLoader workers with and without one intra-op thread in the training process,
one worker fewer or more, persistent workers, a deeper prefetch — are trialled as short,
interleaved, repeated runs of the same script (:mod:`stepscope.whatif`: ``--max-steps``, same
seeds, ``--no-monitor --stacks-hz 0``). Each prescription then carries its measured gain with the
trials' bounds; one that measured no gain beyond noise, or a loss, is withdrawn (kept in
``report.json`` with its measurement); the best measured change, when it is not among the
prescriptions, is added to the top finding as its own prescription.

The trials run the script's code again: whatever it writes (checkpoints, logs, output files) it
writes again, once per trial, in its own working directory. stepscope says so before the trials
start. The time budget is explicit (``--verify-budget``; by default :func:`default_budget`), and
Ctrl-C stops the trials cleanly: what was measured is kept.

The budget is kept with measured trial times (:func:`planned_length`): the first trial is planned
at the diagnosed run's estimate, every later one at the longest wall time measured so far (its own
setting's, else any trial's) — start-up, the steps, stepscope's own analysis and the measuring of
the record. A trial starts only when its planned length fits in what is left of the budget; one that
overruns its plan is stopped (with its process group) so that it has ended, grace period included,
by the end of the budget plus the larger of half its planned length and the 3 s grace period
(:func:`trial_limit`): ``--verify`` ends within one planned trial length of its budget (a trial of
`stepscope run` takes longer than that grace period: start-up alone is seconds).

`stepscope try` uses the same candidates and the same comparison (one implementation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stepscope.capture.overrides import SETTING_KEYS, describe, parse_settings, parse_value
from stepscope.diagnosis.findings import Finding, Prescription
from stepscope.errors import UsageError
from stepscope.record import layout
from stepscope.whatif import BASELINE, Candidate, CodeChange, Comparison, TrialResult, compare

#: Findings whose prescriptions are tried (the top of the verdict).
TOP_FINDINGS = 3
#: At most this many candidates besides the baseline.
MAX_CANDIDATES = 6
#: Trials of each candidate and of the baseline when the budget allows (never fewer than 2: one
#: trial has no noise bound).
REPEATS = 3
MIN_REPEATS = 2
#: Steps per trial (the run's own length caps it).
TRIAL_STEPS = 40
#: A trial's deadline: this many times its expected length, plus the slack (seconds), and never
#: past the end of the budget; past it the trial is stopped with its process group, timed out.
TRIAL_DEADLINE_FACTOR = 3.0
TRIAL_DEADLINE_SLACK_S = 10.0
#: The slack of a trial planned at the diagnosed run's estimate (no trial measured yet): the estimate
#: leaves out the interpreter's start and the trial's own report, and the machine's load may have
#: changed since that run (a baseline trial estimated at 1.1 s took 11 s on a 2-core machine running
#: three other jobs, and was stopped at 13.4 s as if it hung).
FIRST_TRIAL_DEADLINE_SLACK_S = 30.0
#: A trial that started within its planned length may run past the end of the budget by this share
#: of that length less the stop's grace period: a trial a little slower than planned is measured,
#: not wasted, and --verify still ends within one planned trial of its budget.
OVERRUN_SHARE = 0.5
#: The default budget: this many trials' worth of time, within these bounds (seconds).
BUDGET_TRIALS = 14
BUDGET_MIN_S = 60.0
BUDGET_MAX_S = 900.0


@dataclass(frozen=True)
class Verification:
    """What the trials measured, for ``report.json``'s ``verification`` and the summary."""

    steps: int
    repeats: int
    budget_s: float
    elapsed_s: float
    comparisons: tuple[Comparison, ...]
    best: str | None
    notes: tuple[str, ...]
    interrupted: bool = False
    #: the trials that failed, each ``{"setting", "round", "error", "log"}``: no measurement, in no
    #: comparison; ``failed`` says it in one sentence (:func:`stepscope.whatif.failure_summary`)
    failures: tuple[dict[str, Any], ...] = ()
    failed: str | None = None
    stopped_by: str | None = None  # the signal that stopped the trials (SIGINT: Ctrl-C)
    #: each trial started: ``{"setting", "round", "start_s", "planned_s", "wall_s"}`` (seconds from
    #: the start of the trials; planned from the trials measured before it)
    schedule: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"steps": self.steps, "repeats": self.repeats, "budget_s": round(self.budget_s, 1),
                "elapsed_s": round(self.elapsed_s, 1), "schedule": [dict(item) for item in self.schedule],
                "best": self.best, "interrupted": self.interrupted,
                "stopped_by": self.stopped_by, "notes": list(self.notes), "failed": self.failed,
                "failures": [dict(item) for item in self.failures],
                "trials": [asdict(row) for row in self.comparisons]}


def prescription_settings(item: Prescription) -> dict[str, int | bool] | None:
    """The `--set` pairs that apply a prescription, or None for a code change."""
    if item.set:
        try:
            return parse_settings(f"{key}={str(value).lower() if isinstance(value, bool) else value}"
                                  for key, value in item.set.items())
        except UsageError:
            return None
    key = SETTING_KEYS.get(str(item.setting)) if item.setting is not None else None
    if key is None or item.suggested is None:
        return None
    try:
        return {key: parse_value(key, str(item.suggested))}
    except UsageError:
        return None


@dataclass(frozen=True)
class Setup:
    """What the run used, for the variants worth trying."""

    cores: int | None = None
    threads: int | None = None  # intra-op threads of the training process
    workers: int | None = None  # the main DataLoader's
    persistent_workers: bool = False
    pin_memory: bool = False
    prefetch_factor: int | None = None
    batch_size: int | None = None
    gpu: bool = False
    #: the diagnosis's model of a workers/threads change, ``(workers, threads) -> gain`` (share of
    #: the step saved), to try the most promising variants first; None: in the order found
    predict_gain: Callable[[int, int], float | None] | None = field(default=None, compare=False)


#: Families whose cost is the wait for data: the input pipeline's settings are worth trying.
DATA_FAMILIES = frozenset({"input_pipeline", "storage_io"})
#: Families whose cost is compute per operator: a larger batch is worth trying.
BATCH_FAMILIES = frozenset({"compute", "launch_overhead"})


def candidates(findings: Sequence[Finding], setup: Setup, variants: bool = True) -> list[Candidate]:
    """What to try, at most :data:`MAX_CANDIDATES`: the machine-applicable prescriptions of the top
    findings first, then what a careful engineer would try beside them for the families they name
    — workers (one more, as many as cores) with and without one intra-op thread in the training
    process, persistent workers, a deeper prefetch, pinned memory on a GPU, a doubled batch."""
    out: list[Candidate] = []
    seen: set[str] = set()

    def add(settings: dict[str, int | bool], source: str, action: str, gain: float | None) -> None:
        try:
            settings = parse_settings(f"{key}={str(value).lower() if isinstance(value, bool) else value}"
                                      for key, value in settings.items())
        except UsageError:
            return  # contradictory (prefetch without workers): not a trial
        name = describe(settings)
        if name and name not in seen and len(out) < MAX_CANDIDATES:
            seen.add(name)
            out.append(Candidate(name, settings, source, action, gain))

    top = list(findings[:TOP_FINDINGS])
    prescribed: dict[str, int | bool] = {}
    count = 0
    for finding in top:
        for item in finding.prescriptions:
            settings = prescription_settings(item)
            if settings is not None and not _unchanged(settings, item):
                add(settings, finding.rule_id, item.action, item.expected_gain)
                if not set(settings) & set(prescribed):  # the first prescription of each setting
                    prescribed.update(settings)
                    count += 1
    if count >= 2:
        add(dict(prescribed), "", "every change above together", None)
    for finding in top if variants else ():
        beside = _variants(finding.family, setup)
        if setup.predict_gain is not None:
            beside.sort(key=lambda item: -(_predicted(item, setup) or -1.0))
        for settings in beside:
            add(settings, finding.rule_id, action_of(settings), _predicted(settings, setup))
    return out


def _predicted(settings: dict[str, int | bool], setup: Setup) -> float | None:
    """The diagnosis's predicted gain of a workers/threads variant (None for other settings)."""
    if setup.predict_gain is None or set(settings) - {"dataloader.num_workers", "torch.num_threads"}:
        return None
    workers = int(settings.get("dataloader.num_workers", setup.workers or 0))
    threads = int(settings.get("torch.num_threads", setup.threads or 1))
    return setup.predict_gain(workers, threads)


def action_of(settings: dict[str, int | bool]) -> str:
    """``DataLoader(num_workers=2) and torch.set_num_threads(1) in the training process``."""
    loader = ", ".join(f"{key.split('.', 1)[1]}={value}" for key, value in settings.items()
                       if key.startswith("dataloader."))
    parts = [f"DataLoader({loader})"] if loader else []
    if "torch.num_threads" in settings:
        parts.append(f"torch.set_num_threads({settings['torch.num_threads']}) in the training process")
    return " and ".join(parts)


def _variants(family: str, setup: Setup) -> list[dict[str, int | bool]]:
    out: list[dict[str, int | bool]] = []
    workers = setup.workers or 0
    if family in DATA_FAMILIES and setup.workers is not None:
        cores = max(setup.cores or 1, 1)
        counts = sorted({workers + 1, max(workers + 1, cores)} | ({2 * cores} if family == "storage_io" else set()))
        for count in counts:
            out.append({"dataloader.num_workers": count})
            if setup.threads and setup.threads > 1:
                out.append({"dataloader.num_workers": count, "torch.num_threads": 1})
        if workers > 0 and not setup.persistent_workers:
            out.append({"dataloader.persistent_workers": True})
        if workers > 0 and (setup.prefetch_factor or 2) < 4:
            out.append({"dataloader.prefetch_factor": 4})
        if setup.gpu and not setup.pin_memory:
            out.append({"dataloader.pin_memory": True})
    if family in BATCH_FAMILIES and setup.batch_size:
        out.append({"dataloader.batch_size": 2 * setup.batch_size})
    # one more or one less thread of a CPU run never pays for a trial of its own; threads are
    # tried with the workers they make room for
    return out


def code_changes(findings: Sequence[Finding]) -> list[CodeChange]:
    """Prescriptions of the top findings that need a change to the script: listed, not tried."""
    return [CodeChange(item.action, finding.rule_id, item.setting) for finding in findings[:TOP_FINDINGS]
            for item in finding.prescriptions if prescription_settings(item) is None]


def findings_of(document: dict[str, Any]) -> list[Finding]:
    """The findings of a ``report.json`` document (either schema)."""
    out = []
    for item in document.get("findings", ()) or ():
        try:
            out.append(Finding.from_dict(item))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def setup_of_document(document: dict[str, Any]) -> Setup:
    """What the run of a ``report.json`` used (its busiest DataLoader, threads, cores, device)."""
    loaders = [item for item in document.get("loaders", ()) or () if isinstance(item, dict)]
    loader = max(loaders, key=lambda item: (item.get("wait_ns", 0), item.get("batches", 0))) if loaders else None
    evidence = document.get("evidence") or {}
    run = document.get("run") or {}
    devices = run.get("devices", ()) or ()
    return Setup(cores=evidence.get("cpu_count"), threads=evidence.get("intra_op_threads"),
                 workers=loader.get("num_workers") if loader else None,
                 persistent_workers=bool(loader.get("persistent_workers")) if loader else False,
                 pin_memory=bool(loader.get("pin_memory")) if loader else False,
                 prefetch_factor=loader.get("prefetch_factor") if loader else None,
                 batch_size=loader.get("batch_size") if loader else None,
                 gpu=any(isinstance(item, dict) and item.get("kind") in ("cuda", "rocm", "xpu") for item in devices))


def _unchanged(settings: dict[str, int | bool], item: Prescription) -> bool:
    current = item.current
    if len(settings) != 1 or current is None:
        return False
    (value,) = settings.values()
    try:
        return (bool(current) is value) if isinstance(value, bool) else int(current) == value
    except (TypeError, ValueError):
        return False


def default_budget(startup_s: float, step_s: float, steps: int) -> float:
    """Seconds: :data:`BUDGET_TRIALS` trials of ``steps`` steps, each paying the script's start-up."""
    return min(BUDGET_MAX_S, max(BUDGET_MIN_S, BUDGET_TRIALS * (startup_s + steps * step_s)))


def plan(candidate_count: int, trial_s: float, budget_s: float) -> tuple[int, int]:
    """(candidates kept, repeats) that fit the budget: as many candidates as fit in
    :data:`MIN_REPEATS` rounds, in :data:`REPEATS` rounds when that keeps as many; (0, 0) when even
    one candidate against the baseline twice does not fit."""
    best = (0, 0)
    for repeats in range(MIN_REPEATS, REPEATS + 1):
        kept = min(candidate_count, int(budget_s // (repeats * trial_s)) - 1) if trial_s > 0 else candidate_count
        if kept >= 1 and kept >= best[0]:
            best = (kept, repeats)
    return best


def gain_of(row: Comparison) -> dict[str, float] | None:
    """``{"median", "low", "high", "trials"}``: share of the step saved (1 − 1/speed-up)."""
    if row.speedup is None or row.speedup_low is None or row.speedup_high is None or row.speedup_low <= 0:
        return None
    return {"median": round(1 - 1 / row.speedup, 4), "low": round(1 - 1 / row.speedup_low, 4),
            "high": round(1 - 1 / row.speedup_high, 4), "trials": row.runs - row.failed}


def apply(findings: Sequence[Finding], verification: Verification) -> tuple[Finding, ...]:
    """The findings with each tried prescription measured (and withdrawn where the trials saw no
    gain beyond noise), its prescriptions ordered best measured first, and the best measured
    change added to the top finding when no prescription was it."""
    rows = {row.name: row for row in verification.comparisons if row.name != BASELINE}
    out: list[Finding] = []
    best_row = rows.get(verification.best) if verification.best else None
    best_named = False
    for finding in findings:
        updated = []
        for item in finding.prescriptions:
            settings = prescription_settings(item)
            row = rows.get(describe(settings)) if settings is not None else None
            if row is None or row.verdict in ("failed", "no noise bound", "not run"):  # not measured
                updated.append(item)
                continue
            gain = gain_of(row)
            withdrawn = row.verdict != "faster"
            best_named |= best_row is not None and row is best_row
            updated.append(replace(item, set=dict(settings or {}), measured_gain=gain, withdrawn=withdrawn))
        ranked = sorted(updated, key=lambda item: (item.withdrawn,
                                                   -(item.measured_gain or {}).get("median", -1.0)
                                                   if item.measured_gain else 1.0))
        out.append(replace(finding, prescriptions=tuple(ranked)))
    if best_row is not None and not best_named and out:
        gain = gain_of(best_row)
        source = next((item for item in verification.comparisons if item.name == best_row.name), best_row)
        tried = sum(1 for row in verification.comparisons if row.name != BASELINE)
        added = Prescription(
            action_of(best_row.settings),
            f"the fastest of the {tried} changes tried (stepscope run "
            f"{' '.join('--set ' + key + '=' + _text(value) for key, value in best_row.settings.items())} …)",
            set=dict(best_row.settings), measured_gain=gain)
        del source
        top = out[0]
        out[0] = replace(top, prescriptions=(added, *top.prescriptions))
    return tuple(out)


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def trial_deadline(trial_s: float, measured: bool = True) -> float:
    """Seconds a trial expected to take ``trial_s`` may run before it is stopped; ``measured``:
    ``trial_s`` is a trial's measured time, not the diagnosed run's estimate."""
    return TRIAL_DEADLINE_FACTOR * trial_s + (TRIAL_DEADLINE_SLACK_S if measured else FIRST_TRIAL_DEADLINE_SLACK_S)


def planned_length(name: str, walls: dict[str, list[float]], estimate_s: float) -> float:
    """Seconds the next trial of ``name`` is planned to take: the longest measured wall time of its
    own trials, else of any trial so far, else ``estimate_s`` (nothing measured yet)."""
    own = walls.get(name)
    if own:
        return max(own)
    measured = [wall for items in walls.values() for wall in items]
    return max(measured) if measured else estimate_s


def trial_limit(planned_s: float, left_s: float, timeout_s: float) -> float:
    """The deadline of a trial planned at ``planned_s`` with ``left_s`` of the budget left (a trial
    starts only when ``planned_s <= left_s``): its own ``timeout_s``, and no later than the end of
    the budget plus :data:`OVERRUN_SHARE` of its planned length less the stop's grace period. A
    trial that keeps to its plan is never stopped; one stopped has ended, SIGKILL after the grace
    period included, by the end of the budget plus the larger of half its planned length and the
    grace period."""
    from stepscope.children import GRACE_S

    return max(0.1, min(timeout_s, left_s + max(0.0, OVERRUN_SHARE * planned_s - GRACE_S)))


def round_names(names: Sequence[str], walls: dict[str, list[float]], estimate_s: float, left_s: float) -> list[str]:
    """The settings of the next round: the baseline and as many of the candidates in ``names``, in
    order, as fit in ``left_s`` together, each at :func:`planned_length` — a round without the
    baseline compares nothing; empty when the baseline and one candidate do not fit."""
    kept = [BASELINE]
    total = planned_length(BASELINE, walls, estimate_s)
    for name in names:
        if name == BASELINE:
            continue
        total += planned_length(name, walls, estimate_s)
        if total > left_s:
            break
        kept.append(name)
    return kept if len(kept) > 1 else []


def run_budgeted(target_argv: Sequence[str], candidates: Sequence[Candidate], out_dir: Path, *, steps: int,
                 repeats: int, budget_s: float, estimate_s: float, started: float, results: list[TrialResult],
                 schedule: list[dict[str, Any]], progress: Callable[[str], None] = lambda line: None,
                 timeout_s: float | None = None, cwd: str | None = None) -> None:
    """The trials of ``repeats`` interleaved rounds (the baseline and each candidate once per round,
    rotated from round to round) that fit the budget, measured, appended to ``results`` (a list the
    caller keeps: after a Ctrl-C it holds the trials measured so far).

    Every trial is planned at :func:`planned_length` and started only when that fits in what is
    left of the budget (``started + budget_s``, :func:`time.monotonic`); its deadline is
    :func:`trial_limit`. From the second round on, a round keeps the baseline and only the
    candidates that fit with it (:func:`round_names`, the last dropped first), so that the budget
    is not spent on trials that no baseline trial of their round can be compared with."""
    import time

    from stepscope.whatif import measure, run_trial

    settings = {BASELINE: {}, **{candidate.name: candidate.settings for candidate in candidates}}
    names = list(settings)
    slug = {name: "baseline" if name == BASELINE else f"c{index}" for index, name in enumerate(names)}
    total = len(names) * repeats
    walls: dict[str, list[float]] = {}
    number = 0
    active = names
    for repeat in range(repeats):
        if repeat:
            active = round_names(active, walls, estimate_s, started + budget_s - time.monotonic())
            if not active:
                break
        shift = repeat % len(active)
        for name in (*active[shift:], *active[:shift]):
            number += 1
            now = time.monotonic()
            left = started + budget_s - now
            planned = planned_length(name, walls, estimate_s)
            if planned > left:
                continue
            deadline = timeout_s if timeout_s is not None else trial_deadline(planned, measured=bool(walls))
            limit = trial_limit(planned, left, deadline)
            run_dir = out_dir / f"r{repeat + 1}-{slug[name]}"
            log = out_dir / "logs" / f"r{repeat + 1}-{slug[name]}.log"
            code, error = run_trial(target_argv, settings[name], run_dir, max_steps=steps, log=log,
                                    timeout_s=limit, cwd=cwd)
            result = replace(measure(run_dir, name, repeat, code, error), log=str(log))
            wall = time.monotonic() - now
            walls.setdefault(name, []).append(wall)
            results.append(result)
            schedule.append({"setting": name, "round": repeat + 1, "start_s": round(now - started, 3),
                             "planned_s": round(planned, 3), "wall_s": round(wall, 3)})
            figure = (f"{result.step_time_s * 1e3:.1f} ms/step" if result.step_time_s is not None
                      else f"failed: {result.error} (log: {log})")
            progress(f"trial {len(schedule)}/{total}: {name} (round {repeat + 1}, {wall:.0f} s, planned "
                     f"{planned:.0f} s) … {figure}")
    if len(schedule) < total:
        progress(f"{total - len(schedule)} of {total} trials not started: they did not fit in what was left of "
                 "the budget")


def verify(target_argv: Sequence[str], found: Sequence[Candidate], out_dir: Path, *, steps: int, budget_s: float,
           trial_s: float, progress: Callable[[str], None] = lambda line: None,
           timeout_s: float | None = None, cwd: str | None = None) -> Verification:
    """Run the trials (as many as the budget allows) and compare them.

    Every trial has a deadline (``timeout_s``, by default :func:`trial_deadline` of its planned
    length), and :func:`trial_limit` past the end of the budget at most. A trial that fails (exit status, signal, timed out, no steps) is listed in ``failures`` and left
    out of every comparison. Ctrl-C, or a :class:`stepscope.children.Stopped` signal, stops the
    trial under way with its process group: what was measured is kept. The trials are planned with
    their measured times (:func:`run_budgeted`): none starts that cannot end within the budget."""
    import time

    from stepscope.children import signal_name, stopped_by
    from stepscope.whatif import failure_summary, trial_order

    started = time.monotonic()
    kept, repeats = plan(len(found), trial_s, budget_s)
    notes: list[str] = []
    if kept < len(found):
        notes.append(f"{len(found) - kept} candidate(s) not tried: the budget of {budget_s:.0f} s fits "
                     f"{kept} at ~{trial_s:.0f} s a trial (raise --verify-budget)")
    chosen = list(found[:kept])
    trials: list[TrialResult] = []
    schedule: list[dict[str, Any]] = []
    interrupted = False
    stopped: str | None = None
    if chosen:
        planned = len(trial_order([BASELINE, *(item.name for item in chosen)], repeats))
        try:
            run_budgeted(target_argv, chosen, out_dir, steps=steps, repeats=repeats, budget_s=budget_s,
                         estimate_s=trial_s, started=started, results=trials, schedule=schedule, progress=progress,
                         timeout_s=timeout_s, cwd=cwd)
        except KeyboardInterrupt as exc:
            interrupted = True
            stopped = signal_name(stopped_by(exc))
            how = "Ctrl-C" if stopped == "SIGINT" else stopped
            notes.append(f"trials stopped by {how} after {len(trials)}: what was measured is kept")
        if not interrupted and len(trials) < planned:
            notes.append(f"{planned - len(trials)} of {planned} trials not run: at their measured length they did "
                         f"not fit in what was left of the budget of {budget_s:.0f} s (raise --verify-budget)")
    comparisons = compare(trials, chosen) if chosen else ()
    best = _best(comparisons)
    failures = tuple({"setting": trial.candidate, "round": trial.repeat + 1, "error": trial.error,
                      "log": trial.log} for trial in trials if trial.step_time_s is None)
    return Verification(steps, repeats, budget_s, time.monotonic() - started, tuple(comparisons),
                        best.name if best is not None else None, tuple(notes), interrupted, failures,
                        failure_summary(trials, out_dir / "logs"), stopped, tuple(schedule))


def _best(comparisons: Iterable[Comparison]) -> Comparison | None:
    faster = [row for row in comparisons if row.verdict == "faster" and row.speedup is not None]
    return max(faster, key=lambda row: row.speedup or 0.0) if faster else None


__all__ = ["Setup", "Verification", "apply", "candidates", "code_changes", "findings_of", "setup_of_document", "default_budget", "gain_of", "plan", "planned_length", "prescription_settings",
           "round_names", "run_budgeted", "trial_deadline", "trial_limit", "verify"]


# -- persistence and the report --------------------------------------------------------------------
VERIFICATION_FILE = layout.VERIFICATION_FILE


def save(verification: Verification, run_dir: Path) -> Path:
    import json

    path = Path(run_dir) / VERIFICATION_FILE
    path.write_text(json.dumps(verification.to_dict(), indent=1), encoding="utf-8")
    return path


def load(run_dir: Path) -> Verification | None:
    """The trials of a verified run (``stepscope report`` shows them again), or None."""
    import json

    path = Path(run_dir) / VERIFICATION_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = tuple(Comparison(**row) for row in data["trials"])
        return Verification(int(data["steps"]), int(data["repeats"]), float(data["budget_s"]),
                            float(data["elapsed_s"]), rows, data.get("best"), tuple(data.get("notes", ())),
                            bool(data.get("interrupted", False)),
                            tuple(dict(item) for item in data.get("failures", ()) or ()), data.get("failed"),
                            data.get("stopped_by"), tuple(dict(item) for item in data.get("schedule", ()) or ()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def apply_to_report(report: Any, verification: Verification) -> Any:
    """The report with its findings measured (:func:`apply`) and the verification attached."""
    return replace(report, findings=apply(report.findings, verification), verification=verification.to_dict())
