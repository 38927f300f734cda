"""The input pipeline over time: data wait, disk reads, iowait and the loaders' CPU, per epoch.

Storage and CPU-bound loading can look alike at any one moment (all cores busy, the step waiting
for data), but not over time: data read from storage once is served from the page cache after,
so a *cold* input pipeline has a first epoch whose data wait is well above the later epochs' and
disk reads that fall as the cache warms — whatever the cores did meanwhile. CPU-bound loading
costs the same in every epoch.

:func:`input_profile` cuts the run into segments — epochs where the loaders' iterators show them
(a DataLoader with workers starts new workers per epoch, ``loader_init_ns``), else thirds of the
run — and measures each; :func:`cold_start` reads the signature. Pure functions of a run record
and its samples; no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stepscope.record.run import RunRecord

#: The first segment's fetch wait per step must be at least this multiple of the later ones'.
COLD_WAIT_RATIO = 1.5
#: ... and its disk reads at least this multiple of the later segments' (the page cache warmed).
COLD_READ_RATIO = 4.0
#: ... and at least this rate: a few KiB/s of reads are a log file, not the data set.
COLD_MIN_READ_BYTES_PER_S = 8 << 20
#: Segments shorter than this many steps say nothing about a rate.
MIN_SEGMENT_STEPS = 3


@dataclass(frozen=True)
class InputSegment:
    """One epoch (or third) of the run."""

    first_step: int
    steps: int
    kind: str  # "epoch" | "third"
    fetch_wait_s: float  # mean per step (data wait less worker start-up)
    step_s: float  # mean step time
    read_bytes_per_s: float | None  # disk reads of the machine over the segment
    iowait_share: float | None
    loader_cpu_util: float | None  # mean CPU of the DataLoader workers (share of one core), None without


@dataclass(frozen=True)
class InputProfile:
    segments: tuple[InputSegment, ...]

    @property
    def kind(self) -> str:
        return self.segments[0].kind if self.segments else "none"

    def to_dict(self) -> dict[str, Any]:
        return {"segments": [asdict(item) for item in self.segments]}


@dataclass(frozen=True)
class ColdStart:
    """The first segment waited on storage: its measured excess over the later ones."""

    wait_ratio: float  # first segment's fetch wait per step over the later segments'
    read_early_bytes_per_s: float
    read_late_bytes_per_s: float
    excess_s: float  # extra data wait in the first segment, in seconds over all its steps
    excess_share: float  # ... as a share of the whole run's step time
    later_wait_share: float  # data wait share of the later segments (what is left once warm)


def _segments_bounds(record: RunRecord) -> tuple[list[tuple[int, int]], str]:
    steps = record.steps
    count = len(steps)
    starts = [int(index) for index in np.flatnonzero(steps.loader_init_ns > 0) if index > 0]
    if starts:
        bounds = [0, *starts, count]
        pairs = [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b - a >= MIN_SEGMENT_STEPS]
        if len(pairs) >= 2:
            return pairs, "epoch"
    if count >= 3 * MIN_SEGMENT_STEPS:
        third = count // 3
        return [(0, third), (third, 2 * third), (2 * third, count)], "third"
    return [], "none"


def input_profile(record: RunRecord) -> InputProfile:
    """Per epoch (or third): fetch wait, step time, disk reads, iowait and the workers' CPU."""
    steps = record.steps
    pairs, kind = _segments_bounds(record)
    if not pairs:
        return InputProfile(())
    fetch = (steps.data_wait_ns - steps.loader_init_ns).astype(np.float64) / 1e9
    samples = record.samples
    segments = []
    for first, end in pairs:
        # the first step of the run holds the loader's start: it is left out of the first segment's rate
        low = max(first, 1) if first == 0 and end - first > MIN_SEGMENT_STEPS else first
        start_ns = int(steps.start_ns[first])
        end_ns = int(steps.start_ns[end - 1] + steps.duration_ns[end - 1])
        reads = iowait = cpu = None
        if samples is not None and len(samples) >= 2:
            reads, iowait, cpu = _sampled(samples, start_ns, end_ns)
        segments.append(InputSegment(
            first_step=first, steps=end - first, kind=kind, fetch_wait_s=float(np.mean(fetch[low:end])),
            step_s=float(np.mean(steps.duration_ns[low:end])) / 1e9, read_bytes_per_s=reads,
            iowait_share=iowait, loader_cpu_util=cpu))
    return InputProfile(tuple(segments))


def _sampled(samples: Any, start_ns: int, end_ns: int) -> tuple[float | None, float | None, float | None]:
    from stepscope.analysis.run import signals as sig
    from stepscope.analysis.run.window import span_window

    ts = samples.ts_ns
    mask = span_window(start_ns, end_ns).interval_mask(ts)
    if not mask.any():
        return None, None, None
    seconds = np.diff(ts) / 1e9
    reads = sig.counter_rate(samples["disk_read_bytes"], seconds, mask)
    iowait = sig.iowait_share(samples, mask)
    utils = sig.process_cpu_utils(samples, mask)
    workers = [utils[info.id] for info in samples.processes_with_role("dataloader_worker") if info.id in utils]
    return reads, iowait, float(np.mean(workers)) if workers else None


def cold_start(profile: InputProfile, record: RunRecord) -> ColdStart | None:
    """The cold-data signature (module docstring), or None."""
    if len(profile.segments) < 2:
        return None
    first, later = profile.segments[0], profile.segments[1:]
    later_steps = sum(item.steps for item in later)
    later_wait = sum(item.fetch_wait_s * item.steps for item in later) / later_steps
    reads_late = [item.read_bytes_per_s for item in later]
    if first.read_bytes_per_s is None or any(value is None for value in reads_late):
        return None
    late = max(float(value) for value in reads_late if value is not None)
    early = float(first.read_bytes_per_s)
    ratio = first.fetch_wait_s / later_wait if later_wait > 0 else float("inf")
    if ratio < COLD_WAIT_RATIO or early < COLD_MIN_READ_BYTES_PER_S or early < COLD_READ_RATIO * late:
        return None
    excess = (first.fetch_wait_s - later_wait) * first.steps
    total = float(record.steps.duration_ns.sum()) / 1e9
    later_step = sum(item.step_s * item.steps for item in later) / later_steps
    return ColdStart(wait_ratio=min(ratio, 1e3), read_early_bytes_per_s=early, read_late_bytes_per_s=late,
                     excess_s=excess, excess_share=excess / total if total > 0 else 0.0,
                     later_wait_share=later_wait / later_step if later_step > 0 else 0.0)


__all__ = ["ColdStart", "InputProfile", "InputSegment", "cold_start", "input_profile"]
