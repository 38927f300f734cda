"""`stepscope run --verify`: the trials after the run, and the report they change (see
:mod:`stepscope.verify`)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepscope import verify
from stepscope.text import progress


_say = progress


def trial_argv(target: Any) -> list[str]:
    return ["-m", target.name, *target.args] if target.is_module else ["--", target.name, *target.args]


def verify_after_run(report: Any, record: Any, target: Any, run_dir: Path, options: Any, *, shown_as: str,
                     should_stop: Callable[[], bool]) -> Any:
    """Trial the report's prescriptions, save the verified report, print the summary; returns the
    verified report (the unverified one when nothing could be tried)."""
    from stepscope.pipeline.publish import print_report, save_report

    steady = report.evidence.steady
    notes: list[str] = []
    if record.meta.world_size > 1:
        notes.append("--verify does not run trials of a multi-rank job (each trial would be a torchrun launch)")
    elif steady is None or not steady.steady_count:
        notes.append("--verify: no steady steps to compare against")
    found = [] if notes else verify.candidates(report.findings, setup_of(report))
    if not notes and not found:
        notes.append("--verify: no prescription can be applied with `stepscope run --set`: nothing to try")
    verified = report
    stopped_by: str | None = None
    if found and not should_stop():
        steps = min(len(record.steps), verify.TRIAL_STEPS)
        first_step_ns = int(record.steps.start_ns[0]) if len(record.steps) else record.meta.end_ns
        startup_s = max(0.5, (first_step_ns - record.meta.start_ns) / 1e9)
        trial_s = startup_s + steps * steady.steady.mean_s
        budget = options.verify_budget_s or verify.default_budget(startup_s, steady.steady.mean_s, steps)
        kept, repeats = verify.plan(len(found), trial_s, budget)
        if kept == 0:
            notes.append(f"--verify: one trial takes ~{trial_s:.0f} s, more than the budget of {budget:.0f} s "
                         "allows for two rounds (raise --verify-budget)")
        else:
            out_dir = Path(run_dir) / "verify"
            _say(f"--verify: {(kept + 1) * repeats} trials of {steps} steps (~{trial_s:.0f} s each, budget "
                 f"{budget:.0f} s): they run {target.name} again, which writes again whatever it writes "
                 f"(checkpoints, logs, outputs); trial records go to {out_dir}; Ctrl-C stops them")
            from stepscope.children import stop_on_signals

            # Ctrl-C, SIGTERM and SIGHUP stop the trials (each trial with its process group), not
            # the saving of what they measured; SIGTERM and SIGHUP then end the process below
            with stop_on_signals():
                result = verify.verify(trial_argv(target), found, out_dir, steps=steps, budget_s=budget,
                                       trial_s=trial_s, progress=_say, cwd=record.meta.cwd or None)
            if result.failed:
                _say(f"--verify: {result.failed}")
            verify.save(result, Path(run_dir))
            verified = verify.apply_to_report(report, result)
            stopped_by = result.stopped_by
    if notes:
        for note in notes:
            _say(note)
        verified = verified if verified is not report else _with_notes(report, notes)
    save_report(verified, Path(run_dir), record)
    if options.summary:
        print_report(verified, shown_as)
    if stopped_by in ("SIGTERM", "SIGHUP"):  # what was measured is saved: now end as the signal asked
        from stepscope.capture.launcher import die_by

        die_by(getattr(signal, stopped_by))
    return verified


def setup_of(report: Any) -> verify.Setup:
    """The settings the run used (its main DataLoader, threads, cores, device)."""
    ev = report.evidence
    loader = ev.main_loader
    return verify.Setup(cores=ev.cpu_count, threads=ev.intra_op_threads,
                        workers=loader.num_workers if loader is not None else None,
                        persistent_workers=bool(loader.persistent_workers) if loader is not None else False,
                        pin_memory=bool(loader.pin_memory) if loader is not None else False,
                        prefetch_factor=loader.prefetch_factor if loader is not None else None,
                        batch_size=loader.batch_size if loader is not None and loader.batch_size else None,
                        gpu=ev.gpu is not None, predict_gain=_gain_model(ev))


def _gain_model(ev: Any) -> Any:
    from stepscope.pipeline.diagnose import predict_step

    steady = ev.steady
    if steady is None or not steady.steady_count:
        return None
    per_batch = steady.step_time_mean_s / steady.batches_per_step

    def gain(workers: int, threads: int) -> float | None:
        step = predict_step(ev, workers, threads)
        return None if step is None else 1 - step / per_batch

    return gain


def _with_notes(report: Any, notes: list[str]) -> Any:
    from dataclasses import replace

    return replace(report, warnings=(*report.warnings, *notes))


__all__ = ["setup_of", "trial_argv", "verify_after_run"]
