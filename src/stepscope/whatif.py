"""What-if trials: measure each prescription of a diagnosis instead of trusting its estimate.

`stepscope try script.py args…` (:mod:`stepscope.cli.try_cmd`) and `stepscope run --verify`
(:mod:`stepscope.verify`, which chooses the candidates: each prescription that a `stepscope run
--set` key can apply, and the variants worth trying beside it) run short trials — `stepscope run --max-steps N --set … --no-summary -o DIR` in a
subprocess each — of the baseline and of every candidate, ``repeats`` times, interleaved (every
round runs the baseline and each candidate once, in an order rotated from round to round) so that
a machine whose speed drifts slows all of them alike.

Per trial, the figure is the steady state's **mean step time** (steady time ÷ steady steps: what
the length of training follows; with workers step times are often bimodal, and the median would
overstate the gain), counted once the batches prefetched during worker start-up are used up
(:func:`figures`), and the throughput it gives, in samples/s when every trial knows its batch
size (a ``batch_size`` change makes only samples/s comparable), else steps/s. Across the repeats a
candidate gets the median and the min–max range of those per-trial figures; its speed-up is
median over median, bounded by min/max and max/min. It is **within noise** when its throughput
range overlaps the baseline's. Everything here but :func:`run_trial` is pure (tests feed it fake
trials).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from stepscope.analysis.compare_stats import range_ratio, range_verdict

BASELINE = "baseline"
COMBINED = "all of the above"
#: The verdict of a setting none of whose trials ran (the budget was spent, or the trials were stopped).
NOT_RUN = "not run"


@dataclass(frozen=True)
class Candidate:
    """A change to try: `--set` settings and where they came from."""

    name: str
    settings: dict[str, int | bool]
    source: str = ""  # the finding's rule_id
    action: str = ""  # the prescription's text
    expected_gain: float | None = None  # the diagnosis's estimate (share of the step saved)


@dataclass(frozen=True)
class CodeChange:
    """A prescription that needs a change to the script: listed, not tried."""

    action: str
    source: str
    setting: str | None = None


@dataclass(frozen=True)
class TrialResult:
    """One trial run. ``step_time_s`` and ``throughput`` are None when it failed."""

    candidate: str
    repeat: int
    step_time_s: float | None
    samples_per_s: float | None
    steps_per_s: float | None
    steps: int = 0
    exit_code: int | None = 0
    error: str | None = None  # how it failed: exit status or signal, timed out, its last error line
    run_dir: str = ""
    log: str = ""


@dataclass(frozen=True)
class Comparison:
    """One candidate (or the baseline) over its repeats, against the baseline."""

    name: str
    settings: dict[str, int | bool]
    runs: int
    failed: int
    unit: str  # "samples/s" | "steps/s"
    step_time_s: float | None  # median over trials of the mean steady step
    step_time_min_s: float | None
    step_time_max_s: float | None
    throughput: float | None
    throughput_min: float | None
    throughput_max: float | None
    speedup: float | None  # throughput / baseline throughput (medians)
    speedup_low: float | None
    speedup_high: float | None
    verdict: str  # "baseline" | "faster" | "slower" | "within noise" | "no noise bound" | "failed" | "not run"
    expected_gain: float | None = None
    source: str = ""


@dataclass(frozen=True)
class WhatIf:
    """The result of `stepscope try`."""

    target: str
    steps: int
    repeats: int
    comparisons: tuple[Comparison, ...]
    code_changes: tuple[CodeChange, ...] = ()
    diagnosis_dir: str = ""
    best: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    failed: str | None = None  # :func:`failure_summary` of the trials
    failures: tuple[dict[str, Any], ...] = ()  # each failed trial: setting, round, error, log

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["kind"] = "stepscope.whatif"
        return data


# -- trials ------------------------------------------------------------------------------------
def trial_order(names: Sequence[str], repeats: int) -> list[tuple[int, str]]:
    """``(repeat, name)`` for every trial: each round runs every name once, rotated by the round,
    so the baseline is interleaved with the candidates and no name always runs first."""
    order = []
    for repeat in range(repeats):
        shift = repeat % len(names) if names else 0
        order += [(repeat, name) for name in (*names[shift:], *names[:shift])]
    return order


def compare(trials: Iterable[TrialResult], candidates: Sequence[Candidate]) -> tuple[Comparison, ...]:
    """Baseline first, then each candidate in order, from the trials' figures (see module doc)."""
    trials = list(trials)
    by_name: dict[str, list[TrialResult]] = {}
    for trial in trials:
        by_name.setdefault(trial.candidate, []).append(trial)
    ok = [trial for trial in trials if trial.step_time_s is not None]
    unit = "samples/s" if ok and all(trial.samples_per_s is not None for trial in ok) else "steps/s"

    def throughput(trial: TrialResult) -> float | None:
        if trial.step_time_s is None:
            return None
        return trial.samples_per_s if unit == "samples/s" else trial.steps_per_s

    base_values = [value for value in map(throughput, by_name.get(BASELINE, ())) if value]
    rows = []
    for name, settings, source, gain in ((BASELINE, {}, "", None),
                                         *((c.name, c.settings, c.source, c.expected_gain) for c in candidates)):
        runs = by_name.get(name, [])
        values = [value for value in map(throughput, runs) if value]
        times = [trial.step_time_s for trial in runs if trial.step_time_s is not None]
        median = statistics.median(values) if values else None
        low, high = (min(values), max(values)) if values else (None, None)
        speedup = speed_low = speed_high = None
        bounds = range_ratio(values, base_values)
        if bounds is not None:
            speedup, speed_low, speed_high = bounds
        rows.append(Comparison(
            name=name, settings=dict(settings), runs=len(runs), failed=len(runs) - len(values), unit=unit,
            step_time_s=statistics.median(times) if times else None,
            step_time_min_s=min(times) if times else None, step_time_max_s=max(times) if times else None,
            throughput=median, throughput_min=low, throughput_max=high,
            speedup=speedup, speedup_low=speed_low, speedup_high=speed_high,
            # a failed trial is no measurement: a baseline without one is "failed", and so is every
            # candidate compared with it
            verdict=NOT_RUN if not runs else
            (BASELINE if base_values else "failed") if name == BASELINE else verdict(values, base_values),
            expected_gain=gain, source=source))
    return tuple(rows)


def verdict(values: Sequence[float], base_values: Sequence[float]) -> str:
    """``faster``/``slower`` when the throughput ranges do not overlap, else ``within noise``;
    ``no noise bound`` with a single trial on either side; ``failed`` without a figure
    (:func:`stepscope.analysis.compare_stats.range_verdict`, shared with ``tune-loader``)."""
    return range_verdict(values, base_values, higher_is_better=True)


def best_change(comparisons: Sequence[Comparison]) -> Comparison | None:
    """The candidate measured faster beyond noise with the highest median speed-up, or None."""
    faster = [row for row in comparisons if row.verdict == "faster" and row.speedup is not None]
    return max(faster, key=lambda row: row.speedup or 0.0) if faster else None


def agrees(observed: float, row: Comparison) -> bool:
    """Whether a speed-up ``observed`` elsewhere (one pair of full runs, say) agrees with ``row``.

    One observation carries the same run-to-run noise the trials showed, so it stands for the
    interval ``observed × [low/speedup, high/speedup]``; it agrees when that interval overlaps
    ``[low, high]``, i.e. when ``low × speedup / high <= observed <= high × speedup / low``.
    """
    if row.speedup is None or row.speedup_low is None or row.speedup_high is None or row.speedup_low <= 0:
        return False
    return row.speedup_low * row.speedup / row.speedup_high <= observed <= \
        row.speedup_high * row.speedup / row.speedup_low


# -- running one trial ---------------------------------------------------------------------------
def stepscope_command() -> list[str]:
    return [sys.executable, "-m", "stepscope"]


def run_trial(target_argv: Sequence[str], settings: dict[str, int | bool], run_dir: Path, *, max_steps: int,
              log: Path, monitor: bool = False, timeout_s: float | None = None,
              cwd: str | None = None) -> tuple[int | None, str | None]:
    """`stepscope run --max-steps N --set … --no-summary -o RUN_DIR TARGET…` in a subprocess (with
    ``--no-monitor --stacks-hz 0`` unless ``monitor``), in its own process group with a deadline of
    ``timeout_s`` (:func:`stepscope.children.run`: past it the whole group is stopped); the script's
    output goes to ``log``. Returns (exit status, None) or (exit status or None, how it failed:
    ``exit 1: RuntimeError: …``, ``killed by SIGKILL``, ``timed out after 12.0 s …``)."""
    from stepscope import children

    command = [*stepscope_command(), "run", "--max-steps", str(max_steps), "--no-summary", "-o", str(run_dir)]
    if not monitor:  # a trial needs its steps only: no sampler, no stack sampling (less to disturb it)
        command += ["--no-monitor", "--stacks-hz", "0"]
    for key, value in settings.items():
        command += ["--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    command += list(target_argv)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        outcome = children.run(command, deadline_s=timeout_s, stdout=out, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, env=_child_env(), cwd=cwd)
    if outcome.ok:
        return 0, None
    last = None if outcome.timed_out else last_error_line(log)
    return outcome.returncode, outcome.describe() + (f": {last}" if last else "")


#: A traceback's last line: ``ValueError: …``, ``torch.OutOfMemoryError: …``, ``KeyboardInterrupt``.
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)\b")


def last_error_line(log: Path, limit: int = 200) -> str | None:
    """The last line of ``log`` that ends a traceback, else its last line that is not stepscope's
    own (``stepscope: …``), at most ``limit`` characters; None for an empty or unreadable log."""
    try:
        with open(log, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 16384))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    chosen = next((line for line in reversed(lines) if _ERROR_LINE.match(line)), None)
    if chosen is None:
        chosen = next((line for line in reversed(lines) if not line.startswith("stepscope:")), None)
    if chosen is None:
        return None
    return chosen if len(chosen) <= limit else chosen[:limit - 1] + "…"


def failure_summary(trials: Sequence[TrialResult], log_dir: Path | str | None = None) -> str | None:
    """One sentence on the trials that failed (None when none did): how many, how — each distinct
    reason once, with the trials it ended — and where their logs are. A failed trial is no
    measurement: :func:`compare` leaves it out. ``all 4 trials failed, nothing was measured: exit 1:
    RuntimeError: boom (baseline round 1, … ); logs in RUN/verify/logs``."""
    failed = [trial for trial in trials if trial.step_time_s is None]
    if not failed:
        return None
    reasons: dict[str, list[str]] = {}
    for trial in failed:
        reasons.setdefault(trial.error or "no figure", []).append(f"{trial.candidate} round {trial.repeat + 1}")
    everything = f"all {len(failed)} trials" if len(failed) > 1 else "the only trial"
    head = (f"{everything} failed, nothing was measured" if len(failed) == len(trials)
            else f"{len(failed)} of {len(trials)} trials failed (not measured, left out of the comparison)")
    parts = []
    for reason, which in list(reasons.items())[:3]:
        shown = ", ".join(which[:3]) + (f" and {len(which) - 3} more" if len(which) > 3 else "")
        parts.append(f"{reason} ({shown})")
    if len(reasons) > 3:
        parts.append(f"{len(reasons) - 3} other reasons")
    where = f"; logs in {log_dir}" if log_dir else ""
    return f"{head}: {'; '.join(parts)}{where}"


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    source = str(Path(__file__).resolve().parents[1])  # this stepscope, also when run from a checkout
    env["PYTHONPATH"] = source + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["STEPSCOPE_INDEX"] = "off"  # trials are not runs of the user's history
    return env


def measure(run_dir: Path, candidate: str, repeat: int, exit_code: int | None, error: str | None) -> TrialResult:
    """The trial's figures from its record: the steady steps (as the summary selects them) after
    the loaders' prefetch buffer has drained (:func:`figures`)."""
    from stepscope.errors import StepscopeError
    from stepscope.record.store import load_record

    failed = TrialResult(candidate, repeat, None, None, None, 0, exit_code, error, str(run_dir))
    if error is not None:
        return failed
    try:
        record = load_record(run_dir, with_samples=False)
    except StepscopeError as exc:
        return replace(failed, error=str(exc))
    numbers = figures(record)
    if numbers is None:
        return replace(failed, error="no steps captured")
    step_time, samples_per_s, steps = numbers
    return TrialResult(candidate, repeat, step_time_s=step_time, samples_per_s=samples_per_s,
                       steps_per_s=1.0 / step_time, steps=steps, exit_code=exit_code, run_dir=str(run_dir))


def figures(record: Any) -> tuple[float, float | None, int] | None:
    """(mean step time s, samples/s or None, steps measured) of a run record.

    The steps measured are the steady ones (warm-up and the FLOP-counted step left out) from the
    step at which the batches prefetched during worker start-up are used up: a loader with W
    workers and prefetch factor P holds W×P batches when its first batch arrives, so the W×P steps
    after it run at model speed and would flatter a short trial with workers. When fewer than 3
    steps would remain, all steady steps are used.
    """
    import numpy as np

    from stepscope.analysis.run.steady import steady_state

    steady = steady_state(record)
    if steady is None or not steady.steady_count:
        return None
    buffered = sum(loader.num_workers * (loader.prefetch_factor or 2) for loader in record.loaders
                   if loader.num_workers > 0)
    mask = steady.mask.copy()
    later = mask.copy()
    later[:buffered + 1] = False
    if int(later.sum()) >= 3:
        mask = later
    durations = record.steps.duration_ns[mask]
    samples = record.steps.samples[mask]
    total_s = float(durations.sum()) / 1e9
    if total_s <= 0:
        return None
    samples_per_s = float(samples.sum()) / total_s if bool(np.all(samples >= 0)) else None
    return total_s / int(mask.sum()), samples_per_s, int(mask.sum())


def run_trials(target_argv: Sequence[str], candidates: Sequence[Candidate], out_dir: Path, *, steps: int,
               repeats: int, progress: Callable[[str], None] = lambda line: None,
               timeout_s: float | None = None, results: list[TrialResult] | None = None,
               cwd: str | None = None, ends_at: float | None = None, min_trial_s: float = 0.0) -> list[TrialResult]:
    """Every trial of :func:`trial_order`, measured, appended to ``results`` (a list the caller
    keeps: after a Ctrl-C it holds the trials measured so far).

    Each trial's deadline is ``timeout_s``, and no later than ``ends_at`` (a :func:`time.monotonic`
    instant: the end of the budget); a trial is not started when less than ``min_trial_s`` is left
    before ``ends_at`` (the caller counts the trials that did not run)."""
    import time

    settings = {BASELINE: {}, **{candidate.name: candidate.settings for candidate in candidates}}
    names = list(settings)
    slug = {name: "baseline" if name == BASELINE else f"c{index}" for index, name in enumerate(names)}
    order = trial_order(names, repeats)
    results = [] if results is None else results
    for number, (repeat, name) in enumerate(order, 1):
        deadline = timeout_s
        if ends_at is not None:
            left = ends_at - time.monotonic()
            if left < max(min_trial_s, 0.1):
                progress(f"trials {number}–{len(order)} of {len(order)} not started: the budget is spent")
                break
            deadline = left if deadline is None else min(deadline, left)
        run_dir = out_dir / f"r{repeat + 1}-{slug[name]}"
        log = out_dir / "logs" / f"r{repeat + 1}-{slug[name]}.log"
        code, error = run_trial(target_argv, settings[name], run_dir, max_steps=steps, log=log, timeout_s=deadline,
                                cwd=cwd)
        result = replace(measure(run_dir, name, repeat, code, error), log=str(log))
        results.append(result)
        figure = (f"{result.step_time_s * 1e3:.1f} ms/step" if result.step_time_s is not None
                  else f"failed: {result.error} (log: {log})")
        progress(f"trial {number}/{len(order)}: {name} (round {repeat + 1}) … {figure}")
    return results


__all__ = ["BASELINE", "COMBINED", "NOT_RUN", "Candidate", "agrees", "CodeChange", "Comparison", "TrialResult", "WhatIf",
           "best_change", "compare", "failure_summary", "last_error_line", "measure", "run_trial", "run_trials",
           "trial_order", "verdict"]
