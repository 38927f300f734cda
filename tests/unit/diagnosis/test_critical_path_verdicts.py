"""Trace verdicts built on the critical path: findings of a trace carry and rank by the share of
the path their cause owns; one owning none of it is LOW at most; a sync is judged by the device
idle and the blocked time it puts on the path."""

from __future__ import annotations

from diagnosis_records import ctx_of, make_record

from stepscope.analysis.evidence import (CriticalPathShares, GpuIdle, KernelLaunches, StepShares, SyncsAndCopies,
                                         TraceEvidence)
from stepscope.diagnosis.engine import PATH_SHARE_FLOOR, run_rules
from stepscope.diagnosis.findings import Severity
from stepscope.diagnosis.rules.host_device_sync import sync_and_copies


def _trace(path: CriticalPathShares, **parts) -> TraceEvidence:
    base = dict(steps=5, device="NVIDIA A100", step_time_s=0.1,
                shares=StepShares(kernel=0.5, dataloader=0.3, memcpy=0.01, cpu_exec=0.1),
                idle=GpuIdle(share=0.4, dataloader=0.3, sync=0.0, launch=0.2, other=0.0),
                launches=KernelLaunches(kernels_per_step=1500, small_kernel_share=0.7),
                syncs=SyncsAndCopies(syncs_per_step=2, sync_share=0.01, pageable_memcpy_share=1.0), critical_path=path)
    base.update(parts)
    return TraceEvidence(**base)


def test_trace_findings_rank_by_their_share_of_the_path():
    """The input pipeline costs more of the step by the plugin's categories (30 % against 20 %
    idle launching), but the path says the CPU's own work bounds the step: framework overhead
    first."""
    path = CriticalPathShares(cpu=0.6, data_loading=0.1, gpu_compute=0.3)
    findings = run_rules(ctx_of(None, trace=_trace(path))).findings
    families = [f.family for f in findings]
    assert families.index("launch_overhead") < families.index("input_pipeline")
    by_family = {f.family: f for f in findings}
    assert by_family["launch_overhead"].path_share == 0.6 and by_family["input_pipeline"].path_share == 0.1
    assert any(e.metric == "critical_path_share" for e in by_family["input_pipeline"].evidence)


def test_a_finding_owning_none_of_the_path_is_low_at_most():
    path = CriticalPathShares(cpu=0.7, gpu_compute=0.3)  # no data loading on the path
    findings = {f.family: f for f in run_rules(ctx_of(None, trace=_trace(path))).findings}
    assert findings["input_pipeline"].path_share == 0 < PATH_SHARE_FLOOR
    assert findings["input_pipeline"].severity <= Severity.LOW


def test_a_run_record_keeps_its_own_ranking():
    """With a run record the trace is one window of the run: its path does not rerank the findings."""
    path = CriticalPathShares(cpu=0.7, gpu_compute=0.3)
    findings = run_rules(ctx_of(make_record(), trace=_trace(path))).findings
    assert all(f.path_share is None for f in findings)


def test_blocked_waits_on_the_path_make_a_sync_finding():
    """Short sync calls (1 % of the step) and few copies, but the host blocked 48 % of the path and
    the device then idled 19 %: a sync finding, titled by what the host did."""
    path = CriticalPathShares(cpu=0.26, sync_wait=0.48, after_sync=0.19, gpu_compute=0.26,
                              syncs=("cudaMemcpyAsync waited for stream 27",))
    no_pageable = SyncsAndCopies(syncs_per_step=2, sync_share=0.01, pageable_memcpy_share=0.0)
    finding = sync_and_copies(ctx_of(None, trace=_trace(path, syncs=no_pageable)))
    assert finding is not None and finding.impact == 0.67
    assert finding.title.startswith("The host waits on the device in blocking calls for 48% of the step")
    assert "the device then idles for 19%" in finding.title
    assert finding.prescriptions[0].action.startswith("Remove per-step host syncs")


def test_device_idle_after_a_sync_with_pageable_copies_prescribes_pinned_memory():
    path = CriticalPathShares(cpu=0.66, after_sync=0.21, gpu_compute=0.25)
    finding = sync_and_copies(ctx_of(None, trace=_trace(path)))
    assert finding is not None
    assert finding.title == "A host–device sync leaves the device idle for 21% of the step"
    assert any("pin_memory=True" in p.action for p in finding.prescriptions)


def test_no_path_no_change():
    findings = run_rules(ctx_of(None, trace=_trace(None))).findings  # type: ignore[arg-type]
    assert all(f.path_share is None for f in findings)
