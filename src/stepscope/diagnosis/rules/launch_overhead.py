"""Launch / framework overhead: many tiny operators per step, so fixed per-operator costs (Python,
eager dispatch, autograd bookkeeping, CUDA kernel launches) dominate the math.

Evidence, either:

- the record: aten operators dispatched in one counted step (``record.extra["flops"]["ops"]``)
  × :data:`EAGER_OP_OVERHEAD_S` over the step time estimates the overhead share; the mean time
  per operator corroborates it;
- a trace: the device idles waiting for the host (HTA's "host wait" idle) while most kernels are
  shorter than their launch (``small_kernel_share``), or a large exclusive Python share of host
  time once data loading and the "other" phase (logging, checkpoints) are taken out.

Fires at XProf's "HIGH kernel launch" level (15 %).
"""

from __future__ import annotations

from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common

#: Fixed host cost of one eager PyTorch operator (Python binding, dispatcher, autograd record):
#: a few microseconds on current CPUs — measured 4.7 µs per aten op (forward + backward +
#: optimizer) on tiny Linear layers on the reference 2-core machine; we take the lower 3 µs so the
#: estimate stays conservative.
EAGER_OP_OVERHEAD_S = 3e-6
#: XProf's "HIGH" level for kernel-launch time (15 % of the step; 3 % is "moderate").
LAUNCH_HIGH = 0.15
#: Mean operator time below which operators are "tiny": HTA flags CPU runtime outliers above
#: 50 µs; an operator averaging less than that is dominated by its fixed costs.
TINY_OP_S = 50e-6
#: Kernels shorter than their launch, as a share of kernels, that makes a GPU trace launch-bound.
SMALL_KERNEL_SHARE_HIGH = 0.5
#: Python share of host time in a trace that points at Python overhead (XProf's "All Others …
#: could be due to Python execution overhead" HIGH level).
PYTHON_SHARE_HIGH = 0.15


def overhead_estimate(ctx) -> tuple[float | None, list[Evidence]]:
    """Estimated share of the step lost to per-operator overhead, with its evidence."""
    stats = ctx.stats
    trace = ctx.trace
    estimates: list[float] = []
    evidence: list[Evidence] = []
    if stats is not None and stats.ops_per_step and stats.step_time_mean_s > 0:
        share = min(1.0, stats.ops_per_step * EAGER_OP_OVERHEAD_S / stats.step_time_mean_s)
        mean_op_s = stats.step_time_mean_s / stats.ops_per_step
        if mean_op_s < TINY_OP_S:
            estimates.append(share)
        evidence += [
            Evidence("ops_per_step", int(stats.ops_per_step), None, "record", "count", "one counted step"),
            Evidence("mean_op_time_s", round(mean_op_s, 7), TINY_OP_S, "record", "s", "step time / ops"),
            Evidence("overhead_share_estimate", round(share, 4), LAUNCH_HIGH, "record", "ratio",
                     f"ops × {EAGER_OP_OVERHEAD_S * 1e6:g} µs / step time"),
        ]
    host_wait = common.field_of(trace, "idle_host_wait_share")
    small = common.field_of(trace, "small_kernel_share")
    if host_wait is not None and small is not None and small >= SMALL_KERNEL_SHARE_HIGH:
        estimates.append(float(host_wait))
        evidence += [Evidence("idle_host_wait_share", round(host_wait, 4), LAUNCH_HIGH, "trace", "ratio",
                              "device idle waiting for the host"),
                     Evidence("small_kernel_share", round(small, 4), SMALL_KERNEL_SHARE_HIGH, "trace",
                              "ratio", "kernels shorter than their launch")]
    python = common.field_of(trace, "python_share")
    if python is not None:
        # Python time while loading data or outside the model (logging, checkpoints) is not
        # framework overhead: take the data-wait and "other" shares of the step out first
        outside = (stats.data_wait_share + stats.shares.get("other", 0.0)) if stats is not None \
            else float(common.field_of(trace, "dataloader_share") or 0.0)
        model_python = max(0.0, float(python) - outside)
        if model_python >= PYTHON_SHARE_HIGH:
            estimates.append(model_python)
            evidence.append(Evidence("python_share_in_model", round(model_python, 4), PYTHON_SHARE_HIGH, "trace",
                                     "ratio", "exclusive Python time less data wait and other"))
    return (max(estimates) if estimates else None), evidence


def tiny_ops_dominate(ctx) -> Finding | None:
    share, evidence = overhead_estimate(ctx)
    if share is None or share < LAUNCH_HIGH:
        return None
    stats = ctx.stats
    ops = stats.ops_per_step if stats is not None else None
    title = (f"Framework overhead dominates: ~{common.pct(share)} of the step goes to launching "
             + (f"{int(ops)} tiny operators" if ops else "tiny operators") + " rather than computing")
    summary = ("Each operator pays a fixed host cost (Python, dispatch, autograd, kernel launch) that "
               "its tiny amount of math does not amortise. Fewer, larger operators fix it.")
    kernels = common.field_of(ctx.trace, "kernel_count_per_step")
    if kernels:
        evidence.append(Evidence("kernel_count_per_step", round(kernels, 1), None, "trace", "count", "per step"))
    prescriptions = [
        Prescription("model = torch.compile(model)",
                     "fuses chains of small operators into a few kernels and removes per-op Python dispatch"),
        Prescription("Batch the small operations: stack per-layer/per-item tensors and use one batched op "
                     "(bmm, vmap, grouped layers) instead of Python loops over small ones",
                     f"{int(ops)} operators per step" if ops else "many small operators per step"),
        Prescription("Increase the batch size so each operator does more work per launch",
                     "the per-operator cost is fixed, the math grows with the batch"),
    ]
    if ctx.trace is not None and getattr(ctx.trace, "device", None):
        prescriptions.insert(1, Prescription(
            "Capture the step with CUDA graphs (torch.compile(mode='reduce-overhead'))",
            "replays all launches of a step with one CPU call"))
    return common.finding("launch_overhead.tiny_ops", "launch_overhead", title, share, 0.75, evidence,
                          prescriptions, summary)
