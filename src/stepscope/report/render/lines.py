"""One-line descriptions shared by the terminal and HTML renderers (plain text, no markup)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepscope.text import printable
from stepscope.units import format_duration_ns, format_ratio

if TYPE_CHECKING:  # the run's views annotate only: a trace's report builds none
    from stepscope.report.run_view import CompileLine, LoaderLine, OverridesLine, SkipSummary, VerificationView


def loader_line(loader: LoaderLine) -> str:
    """``#0 AugmentedDataset: batch_size=8 num_workers=0 · 40 batches, waited 661 ms``: the settings
    that are in effect (prefetching and persistence only with workers, pin_memory and drop_last
    only when on); with timed workers, their time per batch and the floor it sets (`` · a worker
    takes 28.2 ms per batch (26.0 ms off CPU): at best a step every 27.2 ms``)."""
    dataset = printable(loader.dataset_type.rsplit(".", 1)[-1])
    settings = [f"batch_size={loader.batch_size}", f"num_workers={loader.num_workers}"]
    if loader.num_workers:
        if loader.prefetch_factor is not None:
            settings.append(f"prefetch_factor={loader.prefetch_factor}")
        settings.append(f"persistent_workers={loader.persistent_workers}")
    if loader.pin_memory:
        settings.append("pin_memory=True")
    if loader.drop_last:
        settings.append("drop_last=True")
    line = (f"#{loader.loader_id} {dataset}: {' '.join(settings)} · {loader.batches} batches, "
            f"waited {format_duration_ns(loader.wait_ns)}")
    if loader.worker_batch_s is not None and loader.floor_s is not None:
        off = (f" ({format_duration_ns(round((loader.worker_blocked_s or 0.0) * 1e9))} off CPU)"
               if loader.worker_blocked_s else "")
        line += (f" · a worker takes {format_duration_ns(round(loader.worker_batch_s * 1e9))} per batch{off}: "
                 f"at best a step every {format_duration_ns(round(loader.floor_s * 1e9))}")
    return line


def overridden_line(overrides: OverridesLine) -> str:
    """`run --set`/`--max-steps`: ``dataloader.num_workers=4 (1 loader) · stopped after 30 steps``."""
    parts = []
    for item in overrides.settings:
        value = str(item.value).lower() if isinstance(item.value, bool) else str(item.value)
        where = ("" if item.key.startswith("torch.") else
                 f" ({item.applied} loader{'s' if item.applied != 1 else ''})")
        if item.key.startswith("torch.") and not item.applied:
            where = " (not applied)"
        parts.append(f"{item.key}={value}{where}" + (f" [{item.notes} note(s) in the record]" if item.notes else ""))
    if overrides.max_steps is not None:
        parts.append(f"stopped after {overrides.max_steps} steps (--max-steps)" if overrides.stopped_at_max_steps
                     else f"--max-steps {overrides.max_steps} (the script ended first)")
    return " · ".join(parts)


def skipped_line(summary: SkipSummary) -> str:
    """``SkipBadSamples``: ``25 failed to load, replaced by their neighbours (2.0% of 1,280 delivered) · corpus 25``."""
    head = f"{summary.total:,} failed to load, replaced by the next sample"
    if summary.share is not None:
        head += f" ({format_ratio(summary.share)} of {summary.delivered:,} delivered)"
    parts = [head]
    for item in summary.datasets:
        where = [("main" if slot == 0 else f"worker {slot - 1}") + f" {count:,}"
                 for slot, count in enumerate(item.by_process) if count]
        parts.append(f"{item.dataset} {item.total:,}" + (f" ({', '.join(where)})" if len(where) > 1 else ""))
    return " · ".join(parts)


def confidence_line(finding: Any) -> str:
    """``confidence 96%``; for a finding that explains little of the step (its confidence capped by
    the diagnosis), ``confidence 17% (it explains 13% of the step; no measured cause explains the
    rest: check it before acting)``."""
    text = f"confidence {format_ratio(finding.confidence)}"
    if finding.extra.get("explains_little"):
        text += (f" (it explains {format_ratio(finding.impact)} of the step; no measured cause explains the rest:"
                 " check it before acting)")
    return text


def gain_line(prescription: Any) -> str:
    """What a prescription is worth, as measured or estimated: ``measured to save 31% of the step
    (22–38%, 3 trials)``, ``expected to save 12–36% of the step (estimate, ±12 points: not
    verified)``, or ``""`` when nothing is known."""
    measured = prescription.measured_gain
    if measured:
        trials = int(measured.get("trials", 0))
        low, high = measured.get("low"), measured.get("high")
        span = f" ({format_ratio(low)} to {format_ratio(high)}, {trials} trial{'s' if trials != 1 else ''} each)" \
            if low is not None and high is not None else ""
        verb = "measured to save" if measured["median"] >= 0 else "measured to cost"
        return f"{verb} {format_ratio(abs(measured['median']))} of the step{span}"
    if prescription.expected_gain is None:
        return ""
    if prescription.expected_range:
        low, high = prescription.expected_range
        if low == 0 < high:  # only an upper end is known (e.g. the DataLoader's floor)
            return f"expected to save up to {format_ratio(high)} of the step (estimate, not verified)"
        if low >= 0:
            return f"expected to save {format_ratio(low)}–{format_ratio(high)} of the step (estimate, not verified)"
        return (f"expected to save up to {format_ratio(max(high, 0.0))} of the step (estimate, not verified: "
                "it may not help)")
    return f"expected to save ~{format_ratio(prescription.expected_gain)} of the step"


def withdrawn_line(prescription: Any) -> str:
    """A prescription the trials did not confirm: ``withdrawn after trials: DataLoader(num_workers=2)
    measured ×0.93 … (no gain beyond noise)``."""
    measured = prescription.measured_gain or {}
    median = measured.get("median")
    what = f"measured {format_ratio(median)} of the step saved" if median is not None else "not measured"
    return f"withdrawn after trials: {prescription.action} — {what}, within noise or a loss"


#: Why nothing was verified, by the view's ``unmeasured``.
_UNMEASURED = {"no_trial": "no trial ran", "no_baseline": "no baseline trial was measured",
               "no_candidate": "no candidate trial was measured"}


def verification_line(view: VerificationView) -> str:
    """``run --verify``: ``Verified: 15 trials of 40 steps in 84 s (3 per setting, interleaved);
    best: dataloader.num_workers=2 torch.num_threads=1``. Only measured trials count: when no
    comparison could be made (every trial, or every baseline trial, failed) it says so —
    ``Not verified: all 4 trials failed, nothing was measured: exit 1: …; logs in …``."""
    failed = view.failed
    elapsed = f"{view.elapsed_s:.0f} s"
    if not view.verified:
        if view.unmeasured == "no_trial":
            why = failed or _UNMEASURED["no_trial"]
        else:
            why = _UNMEASURED[view.unmeasured or "no_trial"] + (f"; {failed}" if failed else "")
        head = f"Not verified: {why} ({elapsed})"
    else:
        low, high = view.per_setting_low, view.per_setting_high
        per = f"{low}" if low == high else f"{low}–{high}"
        head = (f"Verified: {view.measured} trials of {view.steps} steps in {elapsed} "
                f"({per} per setting, interleaved, same seeds)")
        head += f"; best measured: {view.best}" if view.best else "; no change beat the baseline beyond noise"
        if failed:
            head += f"; {failed}"
    return head + ("" if not view.notes else " — " + "; ".join(view.notes))


def compile_line(summary: CompileLine) -> str:
    """torch.compile: ``9 compilations (8 recompiles) of 1 frame · 2.5 s compiling (38% of the steps) ·
    forward() runs eager since step 8 (recompile limit 8) · 2 graph breaks``."""
    frames = summary.frames
    parts = [f"{summary.compilations} compilation{'s' if summary.compilations != 1 else ''}"
             + (f" ({summary.recompiles} recompile{'s' if summary.recompiles != 1 else ''})" if summary.recompiles else "")
             + f" of {frames} frame{'s' if frames != 1 else ''}",
             f"{summary.compile_s:.2f} s compiling ({format_ratio(summary.compile_share)} of the steps)"]
    for frame in summary.eager_frames:
        since = f"since step {frame.limit_hit_step}" if frame.limit_hit_step is not None and frame.limit_hit_step >= 0 \
            else "from the start"
        parts.append(f"{frame.function}() runs eager {since} (recompile limit {frame.limit})")
    if summary.graph_break_count:
        parts.append(f"{summary.graph_break_count} graph break{'s' if summary.graph_break_count != 1 else ''}")
    if summary.speedup is not None:
        parts.append(f"eager/compiled step ×{summary.speedup:.2f}")
    return " · ".join(parts)


def account_line(account: Any) -> str:
    """The training thread's account: ``on CPU 45% · waiting for a core 30% (other processes 25%) ·
    off CPU 25% (waiting for the GIL 20%) · ±2% over 12 accounted steps``."""
    def parts(pairs: Any) -> str:
        return f" ({', '.join(f'{name} {format_ratio(share)}' for name, share in pairs)})" if pairs else ""

    return (f"on CPU {format_ratio(account.on_cpu)} · waiting for a core {format_ratio(account.waiting_core)}"
            f"{parts(account.waiting_by)} · off CPU {format_ratio(account.off_cpu)}{parts(account.off_by)} · "
            f"±{format_ratio(account.spread)} over {account.accounted_steps} accounted steps")
