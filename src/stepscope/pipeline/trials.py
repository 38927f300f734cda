"""``stepscope try``'s computation: diagnose a short run (or read a saved run's findings), trial the
baseline and every prescription ``run --set`` can apply, interleaved and repeated, and compare them
(:mod:`stepscope.whatif`). :mod:`stepscope.cli.try_cmd` parses the command line and renders the
result through :func:`stepscope.pipeline.commands.whatif_view`."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepscope.errors import InputError, UsageError

if TYPE_CHECKING:
    from stepscope.whatif import WhatIf


@dataclass(frozen=True)
class TryOutcome:
    result: WhatIf
    stopped: int | None  # the signal that stopped the trials
    trials_failed: bool  # trials ran and every one failed: nothing was measured


def try_prescriptions(name: str, target_argv: list[str], out_dir: Path, *, steps: int, repeats: int,
                      findings_source: Path | None, timeout_s: float | None, only: tuple[str, ...] = (),
                      max_candidates: int | None = None,
                      progress: Callable[[str], None] = lambda line: None) -> TryOutcome:
    """Diagnose a short run (unless ``findings_source`` names a saved run's report.json), then
    trial the baseline and every prescription ``run --set`` can apply; the result and the signal
    that stopped the trials (None when they ran to the end)."""
    from stepscope import whatif
    from stepscope.children import signal_name, stop_on_signals, stopped_by

    started = time.monotonic()
    notes: list[str] = []
    diagnosis_dir = ""
    runs = 0
    with stop_on_signals():  # Ctrl-C, SIGTERM, SIGHUP: the child under way is stopped with its group
        if findings_source is None:
            runs = 1
            diagnosis = out_dir / "diagnosis"
            diagnosis_dir = str(diagnosis)
            progress(f"diagnosis run ({steps} steps) …")
            log = out_dir / "logs" / "diagnosis.log"
            code, error = whatif.run_trial(target_argv, {}, diagnosis, max_steps=steps, log=log, monitor=True,
                                           timeout_s=timeout_s)
            reference_s = time.monotonic() - started
            findings_source = diagnosis / "report.json"
            if error is not None or not findings_source.is_file():
                raise UsageError(f"the diagnosis run failed ({error or 'no report.json'}); "
                                 f"the script's output is in {log}")
        else:
            diagnosis_dir = str(findings_source.parent)
            reference_s = None
        from stepscope import verify

        document = read_report(findings_source)
        if reference_s is None:
            wall = (document.get("run") or {}).get("wall_s")
            reference_s = float(wall) if isinstance(wall, (int, float)) and wall > 0 else None
        findings = verify.findings_of(document)
        # --only KEY: the candidates (prescriptions, then the variants beside them) that change only those keys
        candidates = [item for item in verify.candidates(findings, verify.setup_of_document(document))
                      if not only or set(item.settings) <= set(only)]
        candidates = candidates[:max_candidates] if max_candidates is not None else candidates
        code_changes = verify.code_changes(findings)
        trials: list[whatif.TrialResult] = []
        stopped: int | None = None
        if not candidates:
            notes.append("no prescription can be applied with `stepscope run --set`: nothing to try")
        else:
            # every trial has a deadline: --timeout-s, else one derived from the run diagnosed
            deadline = timeout_s if timeout_s is not None else (
                verify.trial_deadline(reference_s) if reference_s is not None else None)
            try:
                whatif.run_trials(target_argv, candidates, out_dir, steps=steps, repeats=repeats,
                                  progress=progress, timeout_s=deadline, results=trials)
            except KeyboardInterrupt as exc:
                stopped = stopped_by(exc)
                how = "Ctrl-C" if stopped == signal.SIGINT else signal_name(stopped)
                notes.append(f"trials stopped by {how} after {len(trials)}: what was measured is kept")
    comparisons = whatif.compare(trials, candidates) if candidates else ()
    short = [trial for trial in trials if trial.step_time_s is not None and trial.steps < 10]
    if short:
        notes.append(f"{len(short)} trial(s) measured fewer than 10 steps after warm-up and the prefetched "
                     "batches: raise --steps (and the script's own length, if it sets one)")
    failed = whatif.failure_summary(trials, out_dir / "logs")
    best = whatif.best_change(comparisons)
    notes.append(f"{runs + len(trials)} runs in {time.monotonic() - started:.0f} s; run directories under {out_dir}")
    result = whatif.WhatIf(target=name, steps=steps, repeats=repeats, comparisons=tuple(comparisons),
                           code_changes=tuple(code_changes), diagnosis_dir=diagnosis_dir,
                           best=best.name if best is not None else None, notes=tuple(notes), failed=failed,
                           failures=tuple({"setting": trial.candidate, "round": trial.repeat + 1,
                                           "error": trial.error, "log": trial.log}
                                          for trial in trials if trial.step_time_s is None))
    return TryOutcome(result, stopped, trials_failed=bool(trials) and all(trial.step_time_s is None for trial in trials))


def read_report(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(document, dict) or not isinstance(document["findings"], list):
            raise TypeError("findings is not a list")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(path, f"not a stepscope report.json ({exc})") from None
    return document
