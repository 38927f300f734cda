"""Compute: the step is busy computing, and model FLOPs utilisation (MFU) says how well.

MFU comes from the evidence bundle (:class:`~stepscope.analysis.bundle.MfuEstimate`): FLOPs of the
counted step over step time over the peak *of the dtype that ran* (bf16 under autocast is measured
against the bf16 peak). On a GPU the peak is the datasheet's; on CPU the measured matmul peak, with
the step taken best-case as well. It is never above 100 %; when it cannot be trusted (another dtype
than the measured CPU peak, a machine crowded by other processes) there is no MFU and no finding.

Fires when the step is compute-bound (:data:`COMPUTE_BOUND`) and MFU is below a quarter of a good
level; the impact is the share of compute time a good MFU would save — on a CPU, of the time the
training thread computed (the thread account), not of the time it waited for a core or the GIL.
When the MFU's measured range spans the line, the finding is *borderline*: LOW, unpriced, and worded
the same on either side of the line, so reruns of one script cannot flip between a healthy and a
critical verdict. The engine lets the input,
storage, oversubscription, launch-overhead, straggler and communication findings supersede it.
"""

from __future__ import annotations

from stepscope.analysis.bundle import MfuEstimate, RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity
from stepscope.diagnosis.rules import _common as common

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
#: Below this share of the model's phases on a CPU the low-MFU summary says the thread mostly did not compute.
MODEL_ON_CPU_LOW = 0.7
#: When other processes use more than this share of all cores during the steps, the CPU MFU is
#: reported with lower confidence (above half the machine the bundle gives no CPU MFU at all).
EXTERNAL_CPU_NOTED = 0.25


def good_mfu(estimate: MfuEstimate) -> float:
    return GOOD_MFU_DATASHEET if estimate.on_gpu else GOOD_MFU_MEASURED


def low_mfu(ev: RunEvidence) -> Finding | None:
    steady, estimate = ev.steady, ev.mfu
    if steady is None or estimate is None or steady.compute_share < COMPUTE_BOUND:
        return None
    good = good_mfu(estimate)
    line = LOW_MFU_FRACTION * good
    if estimate.value >= line and estimate.low >= line:
        return None
    # within its measured range of the line: one wording whichever side this run fell on
    borderline = estimate.low < line <= max(estimate.high, estimate.value)
    external = ev.foreign.cpu_share if ev.foreign is not None else None
    crowded = not estimate.on_gpu and external is not None and external > EXTERNAL_CPU_NOTED
    # on a CPU, what a better-shaped computation saves is the time the training thread computed: not
    # the time it waited for a core or was off CPU in the model's phases (the thread account)
    computing = ev.account.model_on_cpu if ev.account is not None and not estimate.on_gpu else None
    impact = steady.compute_share * (1.0 - estimate.value / good) * (computing if computing is not None else 1.0)
    evidence = [
        Evidence("compute_share", round(steady.compute_share, 4), COMPUTE_BOUND, "steps", "ratio",
                 "forward + backward + optimizer"),
        Evidence("mfu", round(estimate.value, 5), round(LOW_MFU_FRACTION * good, 3), "record", "ratio",
                 f"{estimate.peak_source}; range {common.mfu_text(estimate)}"),
        Evidence("flops_per_step", int(estimate.flops_per_step), None, "record", "FLOP", "FlopCounterMode"),
        Evidence("peak_flops", estimate.peak_flops, None, "table" if estimate.on_gpu else "record",
                 "FLOP/s", estimate.peak_source),
        Evidence("compute_dtype", estimate.dtype, None, "record", "dtype", "dtype that carried the FLOPs"),
    ]
    if crowded and external is not None:
        evidence.append(Evidence("external_cpu_share", round(external, 3), EXTERNAL_CPU_NOTED, "sampler", "ratio",
                                 "cores used by other processes"))
    if computing is not None:
        evidence.append(Evidence("model_on_cpu", round(computing, 4), None, "account", "ratio",
                                 "of the model's phases the training thread spent on a CPU"))
    if borderline:
        title = (f"Compute efficiency borderline: MFU {common.mfu_text(estimate)}, around the "
                 f"{common.pct(line)} line (good is ~{good:.0%})")
        summary = (f"The model runs {common.pct(steady.compute_share)} of the step at MFU {common.mfu_text(estimate)} "
                   f"of the {estimate.peak_source}; the measured range spans the {common.pct(line)} line, so the "
                   "run is neither clearly healthy nor clearly inefficient, and is reported the same way on "
                   "either side of it.")
        return common.finding("compute.low_mfu", "compute", title, 0.0, 0.5, evidence, _prescriptions(ev, estimate),
                              summary, severity=Severity.LOW, claims=("compute",), borderline=True,
                              impact_basis=f"not priced: MFU within its measured range of the {common.pct(line)} line",
                              mfu=round(estimate.value, 5))
    title = f"Compute-bound at low efficiency: MFU {common.pct(estimate.value)} (good is ~{good:.0%})"
    summary = (f"The model runs {common.pct(steady.compute_share)} of the step but reaches only "
               f"{common.mfu_text(estimate)} of the {estimate.peak_source}: the math is poorly shaped for the "
               "hardware (small batches or matrices, memory-bound operators, a slow dtype).")
    if computing is not None and computing < MODEL_ON_CPU_LOW:
        summary += (f" The training thread computed only {common.pct(computing)} of the model's phases (the rest it "
                    "waited for a core or was off CPU): the cost is priced on that part.")
    return common.finding("compute.low_mfu", "compute", title, impact, 0.5 if crowded else 0.7, evidence,
                          _prescriptions(ev, estimate), summary, claims=("compute",), mfu=round(estimate.value, 5))



def _prescriptions(ev: RunEvidence, estimate: MfuEstimate) -> list[Prescription]:
    out = []
    samples = ev.steady.samples_per_step if ev.steady is not None else None
    factor = min(8, max(2, int(good_mfu(estimate) / max(estimate.value, 1e-9))))
    if samples:
        out.append(Prescription(
            f"Increase the batch size ({samples} → {samples * factor}), scaling the learning rate",
            f"MFU {common.pct(estimate.value)}: small matrices leave the hardware idle; larger "
            "batches raise arithmetic intensity", "batch_size", samples, samples * factor))
    else:
        out.append(Prescription("Increase the batch size (or matrix sizes)",
                                "small matrices leave the hardware idle"))
    out += common.precision_levers(ev, estimate)
    if ev.compile is None:  # a compiled model is not told to compile
        out.append(Prescription("model = torch.compile(model)",
                                "fuses memory-bound elementwise work around the matmuls"))
    return out


FAMILY = FamilyEntry(
    "compute", (low_mfu,),
    diagnoses="The step computes, at low model FLOPs utilisation",
    evidence="≥ 75 % of the step in forward/backward/optimizer and MFU < 10 % (a quarter of a good 40 %) against the peak of the dtype that ran",
    supersedes=frozenset(), cpu_based=True)
