"""Compute: the step is busy computing, and model FLOPs utilisation (MFU) says how well.

MFU = FLOPs of one step (``record.extra["flops"]``, ``FlopCounterMode``: forward + backward
matmuls/convolutions/attention) / step time / peak. On a GPU the step time is the median steady
step and the peak the datasheet peak for the run's dtype (:func:`stepscope.analysis.run.mfu.peak_flops`).
On CPU the peak is the best float32 GEMM rate measured on the machine at the end of the run
(``record.extra["cpu_matmul_peak_flops"]``), so the step time is best-case as well: the 10th
percentile of steady steps (a CPU shared with other processes slows the median, not the peak).

Fires when the step is compute-bound (:data:`COMPUTE_BOUND`) and MFU is below a quarter of a good
level; the impact is the share of compute time a good MFU would save. It stays silent when the
launch-overhead rule explains the low MFU (many tiny operators).
"""

from __future__ import annotations

from typing import Any

from stepscope.analysis.run.mfu import mfu, peak_flops
from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common
from stepscope.diagnosis.rules.launch_overhead import LAUNCH_HIGH, overhead_estimate

#: Share of the step in forward + backward + optimizer that makes it compute-bound. TraceML's
#: COMPUTE_BOUND verdict uses 90 %; we take 75 % because our "other" phase also holds the loss,
#: zero_grad and logging host work that belongs to the compute loop.
COMPUTE_BOUND = 0.75
#: Good MFU against a datasheet peak: large-model training reports 40–55 % (PaLM 46 %, Megatron-LM
#: and MosaicML LLM runs 40–50 %).
GOOD_MFU_DATASHEET = 0.40
#: Good MFU against a *measured* large-GEMM peak (CPU): a well-shaped MLP step reaches about half
#: of it on the reference machine (0.48 for 512-wide layers, batch 128).
GOOD_MFU_MEASURED = 0.40
#: Fire below this fraction of the good level (MFU < 10 % against either peak): clearly poorly
#: shaped work. Between that and the good level the healthy verdict reports MFU and the levers.
LOW_MFU_FRACTION = 0.25
#: On CPU the peak is measured at the end of the run: when other processes use more than this
#: share of all cores during the steps, the CPU MFU is reported with lower confidence…
EXTERNAL_CPU_NOTED = 0.25
#: …and above this share (others hold half the machine) it is not trusted at all: the steps saw a
#: different machine than the end-of-run peak measurement.
EXTERNAL_CPU_MAX = 0.5


def external_cpu_share(ctx: Any) -> float | None:
    """Share of all cores used by processes outside the training tree (sampler), or None."""
    signals = ctx.signals
    cores = common.cpu_count(ctx)
    util = common.field_of(signals, "cpu_util_mean")
    if signals is None or util is None or not cores or not signals.workers:
        return None
    return max(0.0, float(util) - sum(load.cpu_util for load in signals.workers) / cores)


def measured_mfu(ctx: Any) -> dict[str, Any] | None:
    """MFU of the steady state with the peak used and where it came from; None without FLOPs/peak."""
    stats = ctx.stats
    if stats is None or not stats.flops_per_step or stats.step_time_s <= 0:
        return None
    facts = ctx.record.facts
    devices = tuple(getattr(getattr(ctx.record, "meta", None), "devices", ()) or ())
    gpu = next((device for device in devices if device.kind in ("cuda", "rocm", "gpu")), None)
    if gpu is not None:
        dtype = (facts.compute.compute_dtype if facts.compute is not None else None) or "fp32"
        peak = peak_flops(gpu.name, dtype)
        if peak is None:
            return None
        source, good = f"{gpu.name} datasheet {dtype}", GOOD_MFU_DATASHEET
    else:
        peak = facts.cpu_peak.flops_best if facts.cpu_peak is not None else None
        if not peak or peak <= 0:
            return None
        dtype, source, good = "fp32", "measured fp32 matmul peak of this CPU", GOOD_MFU_MEASURED
    # GPU: the median step against a datasheet peak (the usual MFU). CPU: the peak is the best
    # repetition of a GEMM measured at the end of the run, so the step is taken best-case too
    # (FAST_PERCENTILE): both sides then describe the undisturbed machine.
    step_s = stats.step_time_s if gpu is not None else stats.step_time_fast_s
    value = mfu(stats.flops_per_step, step_s, float(peak))
    return {"mfu": value, "peak": float(peak), "source": source, "good": good, "dtype": dtype,
            "gpu": gpu is not None}


def low_mfu(ctx) -> Finding | None:
    stats = ctx.stats
    if stats is None or stats.compute_share < COMPUTE_BOUND:
        return None
    measured = measured_mfu(ctx)
    if measured is None or measured["mfu"] >= LOW_MFU_FRACTION * measured["good"]:
        return None
    launch, _ = overhead_estimate(ctx)
    if launch is not None and launch >= LAUNCH_HIGH:
        return None  # tiny operators explain it: launch_overhead reports
    external = external_cpu_share(ctx)
    if not measured["gpu"] and external is not None and external > EXTERNAL_CPU_MAX:
        return None  # a busy neighbour slowed the steps, not the model
    value, good = measured["mfu"], measured["good"]
    impact = stats.compute_share * (1.0 - value / good)
    crowded = not measured["gpu"] and external is not None and external > EXTERNAL_CPU_NOTED
    evidence = [
        Evidence("compute_share", round(stats.compute_share, 4), COMPUTE_BOUND, "steps", "ratio",
                 "forward + backward + optimizer"),
        Evidence("mfu", round(value, 5), round(LOW_MFU_FRACTION * good, 3), "record", "ratio",
                 measured["source"]),
        Evidence("flops_per_step", int(stats.flops_per_step), None, "record", "FLOP", "FlopCounterMode"),
        Evidence("peak_flops", measured["peak"], None, "record" if not measured["gpu"] else "table",
                 "FLOP/s", measured["source"]),
    ]
    if crowded:
        evidence.append(Evidence("external_cpu_share", round(external, 3), EXTERNAL_CPU_NOTED, "sampler", "ratio",
                                 "cores used by other processes"))
    title = f"Compute-bound at low efficiency: MFU {common.pct(value)} (good is ~{good:.0%})"
    summary = (f"The model runs {common.pct(stats.compute_share)} of the step but reaches only "
               f"{common.pct(value)} of the {measured['source']}: the math is poorly shaped for the "
               "hardware (small batches or matrices, memory-bound operators, a slow dtype).")
    return common.finding("compute.low_mfu", "compute", title, impact, 0.5 if crowded else 0.7, evidence,
                          _prescriptions(ctx, measured), summary, mfu=round(value, 5))


def _prescriptions(ctx, measured: dict[str, Any]) -> list[Prescription]:
    out = []
    steps = getattr(ctx.record, "steps", None)
    samples = None
    if steps is not None and ctx.stats is not None:
        values = steps.samples[ctx.stats.mask]
        samples = int(values.max()) if len(values) and values.max() > 0 else None
    factor = min(8, max(2, int(measured["good"] / max(measured["mfu"], 1e-9))))
    if samples:
        out.append(Prescription(
            f"Increase the batch size ({samples} → {samples * factor}), scaling the learning rate",
            f"MFU {common.pct(measured['mfu'])}: small matrices leave the hardware idle; larger "
            "batches raise arithmetic intensity", "batch_size", samples, samples * factor))
    else:
        out.append(Prescription("Increase the batch size (or matrix sizes)",
                                "small matrices leave the hardware idle"))
    if measured["gpu"] and measured["dtype"] == "fp32":
        out.append(Prescription(
            "Use mixed precision: torch.autocast('cuda', dtype=torch.bfloat16), or at least "
            "torch.backends.cuda.matmul.allow_tf32 = True",
            "fp32 runs at a fraction of the tensor-core peak", "dtype", "fp32", "bf16"))
    out.append(Prescription("model = torch.compile(model)",
                            "fuses memory-bound elementwise work around the matmuls"))
    return out
