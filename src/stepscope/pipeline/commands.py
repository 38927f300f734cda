"""The views of the commands that report on something other than one run (``try``, ``tune-loader``,
``gpu-procs``, ``monitor``, ``runs``, ``demo --list``): each command's inputs, once loaded, become
one typed view of :mod:`stepscope.report.command_views` here, which the renderers of
:mod:`stepscope.report.render` only format.

Every number and every choice a screen shows is made here — the speed-up the diagnosis expected,
which change is best or why none is, the memory in use as a share, the user a uid belongs to, which
stale processes ``--kill`` leaves alone and why, how a plotted metric reads — so the terminal, the
JSON and the HTML of a command show the same values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepscope.report.command_views import (DeviceRow, GpuProcessRow, GpuProcsView, GpuRowView, KillOutcome,
                                            KillPlan, LeftAlone, LoaderProgress, LoaderTrialRow, MonitorView,
                                            PlotPoint, ProcessRowView, RunRow, RunsView, ScenarioList,
                                            ScenarioRow, TrialRow, TryView, TuneView)

if TYPE_CHECKING:
    from stepscope.analysis.run.live import MonitorFrame
    from stepscope.capture.gpu_procs import GpuProcessView
    from stepscope.data.tuner import Trial, TuneResult
    from stepscope.record.run_index import IndexedRun
    from stepscope.whatif import Comparison, WhatIf


# -- try -------------------------------------------------------------------------------------------
def _setting_text(value: Any) -> str:
    """A ``run --set`` value as it is typed (booleans in lower case)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _trial_row(row: Comparison) -> TrialRow:
    gain = row.expected_gain
    return TrialRow(
        name=row.name, baseline=row.name == "baseline", step_time_s=row.step_time_s,
        step_time_min_s=row.step_time_min_s, step_time_max_s=row.step_time_max_s, throughput=row.throughput,
        throughput_min=row.throughput_min, throughput_max=row.throughput_max, speedup=row.speedup,
        speedup_low=row.speedup_low, speedup_high=row.speedup_high,
        expected_speedup=1 / (1 - gain) if gain is not None and -1 < gain < 1 else None,
        verdict=row.verdict, failed=row.failed,
        settings=tuple((key, _setting_text(value)) for key, value in row.settings.items()))


def _measured(row: Comparison) -> bool:
    return row.runs > row.failed


def whatif_view(result: WhatIf) -> TryView:
    """The view of ``stepscope try``'s result."""
    rows = result.comparisons
    # a comparison needs a measured baseline and at least one measured candidate
    compared = bool(rows) and _measured(rows[0]) and any(_measured(row) for row in rows[1:])
    best = next((row for row in rows if row.name == result.best), None)
    no_best = None
    if best is None and rows:
        if compared:
            no_best = "within_noise"
        elif not any(_measured(row) for row in rows):
            no_best = "no_trial"
        else:
            no_best = "no_baseline" if not _measured(rows[0]) else "no_candidate"
    return TryView(
        target=result.target, steps=result.steps, repeats=result.repeats,
        unit=rows[0].unit if rows else "samples/s", rows=tuple(_trial_row(row) for row in rows),
        best=_trial_row(best) if best is not None else None, no_best=no_best, failed=result.failed,
        show_failed=bool(result.failed) and compared,
        code_changes=tuple((change.action, change.source) for change in result.code_changes),
        notes=tuple(result.notes), document=result.to_dict())


# -- tune-loader -----------------------------------------------------------------------------------
def _loader_row(number: int, trial: Trial, best: bool) -> LoaderTrialRow:
    setting = trial.setting
    return LoaderTrialRow(
        number=number, stage=trial.stage, num_workers=setting.num_workers, prefetch_factor=setting.prefetch_factor,
        pin_memory=setting.pin_memory, persistent_workers=setting.persistent_workers,
        batch_size=setting.batch_size, setting=setting.describe(), samples_per_s=trial.samples_per_s,
        first_batch_s=trial.first_batch_s, restart_s=trial.restart_s, error=trial.error, best=best)


def tune_view(result: TuneResult, target: str) -> TuneView:
    """The view of ``stepscope tune-loader``'s search."""
    rows = tuple(_loader_row(number, trial, trial.setting == result.best and trial.stage == "repeat")
                 for number, trial in enumerate(result.trials, 1))
    return TuneView(
        target=target, rows=rows, current=result.baseline.describe(), current_rate=result.baseline_rate,
        best=result.best.describe(), best_rate=result.best_rate, best_workers=result.best.num_workers,
        speedup=result.speedup, noise=result.noise, elapsed_s=result.elapsed_s,
        budget_exhausted=result.budget_exhausted, notes=tuple(result.notes), oversubscribed=result.oversubscribed,
        intra_op_threads=result.intra_op_threads, cpu_count=result.cpu_count,
        suggested_threads=result.suggested_threads)


def tune_progress(trial: Trial) -> LoaderProgress:
    """One trial of the search as it ends."""
    return LoaderProgress(_loader_row(0, trial, False))


# -- gpu-procs -------------------------------------------------------------------------------------
def gpu_procs_view(processes: Sequence[GpuProcessView], gpu_count: int, notes: Sequence[str]) -> GpuProcsView:
    """The view of the processes holding GPU memory."""
    rows = tuple(GpuProcessRow(item.pid, item.ppid, item.user, item.gpus, item.gpu_memory_bytes, item.age_s,
                               item.state, item.stale) for item in processes)
    return GpuProcsView(gpu_count, rows, tuple(item.command for item in processes), tuple(notes), None,
                        [asdict(item) for item in processes])


def no_gpu_view(reason: str) -> GpuProcsView:
    """The view when no NVIDIA GPU is visible (``reason``: the probe's note)."""
    return GpuProcsView(0, (), (), (), reason.removeprefix("GPU metrics unavailable: "), [])


def kill_plan(processes: Sequence[GpuProcessView], *, uid: int, own_pid: int, ask: bool,
              grace_s: float) -> tuple[KillPlan, list[GpuProcessView]]:
    """Which of the stale processes ``--kill`` ends (the user's own, not zombies, confirmed holders
    of a GPU device), which it leaves alone and why; and the processes to end."""
    import psutil

    from stepscope.capture.gpu_procs import unconfirmed

    stale = [item for item in processes if item.stale and item.visible]
    mine = [item for item in stale if item.uid == uid and item.pid != own_pid
            and item.state != psutil.STATUS_ZOMBIE and unconfirmed(item) is None]
    left: list[LeftAlone] = []
    for item in stale:
        if item.uid != uid:
            left.append(LeftAlone(item.pid, "other_user", owner=item.user))
        elif item.state == psutil.STATUS_ZOMBIE:
            left.append(LeftAlone(item.pid, "zombie", parent=item.ppid))
        elif item.pid != own_pid and (reason := unconfirmed(item)):
            left.append(LeftAlone(item.pid, "unconfirmed", reason=reason))
    return KillPlan(tuple(left), tuple(item.pid for item in mine), grace_s, ask and bool(mine)), mine


def kill_outcome(outcomes: Sequence[tuple[int, str]] | None) -> KillOutcome:
    """What ending the processes did (None: the answer was no)."""
    return KillOutcome(outcomes is None, tuple(outcomes or ()))


# -- monitor ---------------------------------------------------------------------------------------
#: A bar above this share reads busy (and above the sampler's SATURATED, high).
BUSY_SHARE = 0.6


def bar_level(share: float | None) -> str:
    """How a 0..1 bar of the monitor reads: ``high`` above the sampler's saturation level, ``busy``
    above :data:`BUSY_SHARE`, else ``low``."""
    from stepscope.analysis.run.signals import SATURATED

    value = 0.0 if share is None else max(0.0, min(share, 1.0))
    return "high" if value > SATURATED else "busy" if value > BUSY_SHARE else "low"


def monitor_view(frame: MonitorFrame, *, pid: int | None, hostname: str, interval_s: float,
                 live: bool = False) -> MonitorView:
    """One frame of ``stepscope monitor`` (``pid``: the process tree shown, None for the machine)."""
    from stepscope.capture.gpu_procs import user_name

    devices = tuple(DeviceRow(kind, device.name, device.read_bytes_per_s, device.write_bytes_per_s)
                    for kind, group in (("disk", frame.disks), ("net", frame.nics)) for device in group)
    gpus = tuple(GpuRowView(gpu.index, gpu.name, gpu.util, gpu.memory_used_bytes, gpu.memory_total_bytes,
                            gpu.sm_clock_mhz, gpu.power_w, gpu.temperature_c, gpu.pcie_tx_bytes_per_s,
                            gpu.pcie_rx_bytes_per_s, bar_level(gpu.util)) for gpu in frame.gpus)
    mem_share = frame.mem_used_bytes / frame.mem_total_bytes if frame.mem_total_bytes else None
    swap_share = frame.swap_used_bytes / frame.swap_total_bytes if frame.swap_total_bytes else None
    processes = tuple(ProcessRowView(row.pid, user_name(row.uid), row.role, row.state, row.cpu_util, row.rss_bytes,
                                     row.threads, row.gpu_memory_bytes, row.command) for row in frame.processes)
    return MonitorView(
        hostname=hostname, pid=pid, interval_s=interval_s, live=live, core_utils=frame.core_utils,
        core_levels=tuple(bar_level(share) for share in frame.core_utils),
        cpu_util=frame.cpu_util, iowait_share=frame.iowait_share, load1=frame.load1,
        runnable_threads=frame.runnable_threads, mem_used_bytes=frame.mem_used_bytes,
        mem_cached_bytes=frame.mem_cached_bytes, mem_total_bytes=frame.mem_total_bytes,
        mem_used_share=mem_share, mem_level=bar_level(mem_share),
        swap_used_bytes=frame.swap_used_bytes, swap_total_bytes=frame.swap_total_bytes,
        swap_used_share=swap_share, swap_level=bar_level(swap_share),
        swap_in_bytes_per_s=frame.swap_in_bytes_per_s, swap_out_bytes_per_s=frame.swap_out_bytes_per_s,
        devices=devices, gpus=gpus, processes=processes,
        with_roles=any(row.role != "other" for row in frame.processes), notes=tuple(frame.notes),
        document=frame.to_dict())


# -- runs ------------------------------------------------------------------------------------------
#: Metrics of the index that are shares of the step (shown as percentages).
SHARE_METRICS = frozenset({"data_wait", "forward", "backward", "optimizer", "communication", "other", "compile",
                           "mfu"})


def metric_kind(name: str) -> str:
    """How a metric of the index reads: ``share``, ``duration`` or ``number``."""
    if name in SHARE_METRICS:
        return "share"
    return "duration" if name.startswith("step_time") else "number"


def _shown_dir(run_dir: str) -> str:
    """The run directory relative to the current one when it lies below it (what ``diff`` takes)."""
    try:
        return str(Path(run_dir).relative_to(Path.cwd()))
    except ValueError:
        return run_dir


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _run_row(run: IndexedRun) -> RunRow:
    return RunRow(
        run_dir=_shown_dir(run.run_dir), full_dir=run.run_dir, exists=run.exists, started_at=run.started_at,
        tags=tuple(run.tags), steps=run.get("steps") or 0, step_time_s=_number(run.get("step_time_s")),
        samples_per_s=_number(run.get("samples_per_s")), script=Path(run.script).name if run.script else "?",
        top_title=run.get("top_title") or None, top_severity=str(run.get("top_severity") or ""))


def runs_view(runs: Sequence[IndexedRun], index: Path, metric: str | None = None) -> RunsView:
    """The view of ``stepscope runs``: the runs listed, or ``metric`` over them."""
    rows = tuple(_run_row(run) for run in runs)
    values = [(row, float(run.get(metric))) for row, run in zip(rows, runs)
              if metric is not None and run.get(metric) is not None]
    top = max((value for _, value in values), default=0.0) or 1.0
    document: Mapping[str, Any] = {
        "kind": "stepscope.runs", "index": str(index),
        "runs": [{**run.values, "tags": list(run.tags), "exists": row.exists} for row, run in zip(rows, runs)]}
    return RunsView(str(index), rows, metric, metric_kind(metric or ""),
                    tuple(PlotPoint(row, value, value / top) for row, value in values), top, document)


# -- demo ------------------------------------------------------------------------------------------
def scenario_list(scenarios: Mapping[str, Any], default: str) -> ScenarioList:
    """``stepscope demo --list``: the zoo's scenarios, the default marked."""
    return ScenarioList(tuple(ScenarioRow(item.name, item.name == default, item.planted_family, item.title,
                                          item.mechanism) for item in scenarios.values()))
