"""Memory pressure: swapping, steadily growing memory (a leak), or memory near capacity.

Evidence comes from the sampler (swap rates, RSS growth of the training tree over the steady
state, host memory used) and from traces or NVML (device memory peak vs capacity).

Impact: swapping costs time now, so its impact is the iowait share it causes (at least
:data:`SWAP_IMPACT_FLOOR`). A leak or near-capacity memory costs nothing *yet* — the risk is
losing the run to the OOM killer — so their impact is a documented *risk weight*: the share of
the run at stake, :data:`LEAK_IMPACT_SOON` when memory would run out within
:data:`LEAK_HORIZON_S`, else :data:`LEAK_IMPACT`.
"""

from __future__ import annotations

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity
from stepscope.diagnosis.rules import _common as common

#: Sustained swap traffic above this rate means the working set does not fit in RAM.
SWAP_BYTES_PER_S = 1 << 20
#: Impact floor of a swapping run (it stalls on page faults; the iowait share measures how much).
SWAP_IMPACT_FLOOR = 0.2
#: RSS growth over the steady state above this rate is a leak: 4 MiB/s is 14 GiB an hour, more
#: than an allocator or cache settling (which flattens after warm-up) ever adds.
LEAK_BYTES_PER_S = 4 << 20
#: …and it adds at least this much over the steady state: a short run's allocator and cache
#: settling (tens of MiB) is not a leak.
LEAK_MIN_GROWTH_BYTES = 128 << 20
#: The growth holds across the run when the second half's slope is at least this share of the
#: first half's (a leak grows alike in both; a warm-up ramp is flat by the second half).
LEVELS_OFF = 0.5
#: Horizon within which a leak exhausting the remaining memory is urgent.
LEAK_HORIZON_S = 3600.0
LEAK_IMPACT_SOON = 0.5
LEAK_IMPACT = 0.2
#: Memory use above this share of capacity (the TensorBoard plugin warns at 90 % of device memory).
NEAR_CAPACITY = 0.9
NEAR_CAPACITY_IMPACT = 0.05


def swapping(ev: RunEvidence) -> Finding | None:
    signals = ev.signals
    swap_in = common.field_of(signals, "swap_in_bytes_per_s")
    swap_out = common.field_of(signals, "swap_out_bytes_per_s")
    rate = max(swap_in or 0.0, swap_out or 0.0)
    if rate < SWAP_BYTES_PER_S:
        return None
    iowait = common.field_of(signals, "iowait_share") or 0.0
    evidence = [Evidence("swap_bytes_per_s", round(rate), SWAP_BYTES_PER_S, "sampler", "B/s", "machine")]
    if iowait:
        evidence.append(Evidence("iowait_share", round(iowait, 4), None, "sampler", "ratio", "all cores"))
    return common.finding(
        "memory_pressure.swapping", "memory_pressure",
        f"The machine is swapping ({rate / 2**20:.0f} MiB/s): the run does not fit in RAM",
        max(SWAP_IMPACT_FLOOR, iowait), 0.85, evidence,
        [Prescription("Reduce host memory: fewer DataLoader workers or a smaller prefetch_factor, "
                      "memory-map the dataset instead of loading it, smaller in-memory caches",
                      "every page swapped in stalls the process that needs it")],
        "Pages move to and from swap while the run trains; each access to a swapped page blocks.")


def growing_memory(ev: RunEvidence) -> Finding | None:
    signals = ev.signals
    growth = common.field_of(signals, "rss_growth_bytes_per_s")
    if growth is None or growth < LEAK_BYTES_PER_S:
        return None
    span_s = ev.steady.total_s if ev.steady is not None else None
    if span_s is not None and growth * span_s < LEAK_MIN_GROWTH_BYTES:
        return None
    first = common.field_of(signals, "rss_growth_first_half_bytes_per_s")
    second = common.field_of(signals, "rss_growth_second_half_bytes_per_s")
    if second is not None and (second < LEAK_BYTES_PER_S or (first is not None and second < LEVELS_OFF * first)):
        return None  # it grew, then levelled off: an allocator's or a cache's ramp, not a leak
    basis = common.field_of(signals, "rss_growth_basis") or "rss"
    total = common.field_of(signals, "memory_total_bytes")
    used = common.field_of(signals, "memory_used_share_max")
    what = "anonymous memory (heap)" if basis == "anonymous" else "RSS"
    evidence = [Evidence("rss_growth_bytes_per_s", round(growth), LEAK_BYTES_PER_S, "sampler", "B/s",
                         f"training process's {what}, steady state, least-squares fit over "
                         f"{common.field_of(signals, 'rss_growth_points') or '?'} samples")]
    if first is not None and second is not None:
        evidence.append(Evidence("rss_growth_halves_bytes_per_s", f"{first / 2**20:.1f} → {second / 2**20:.1f} MiB/s",
                                 None, "sampler", "text", "slope over the first and the second half"))
    if span_s is not None:
        evidence.append(Evidence("rss_growth_bytes", round(growth * span_s), LEAK_MIN_GROWTH_BYTES, "sampler",
                                 "bytes", "over the steady state"))
    horizon = None
    if total and used is not None:
        horizon = max(0.0, (1.0 - used) * total) / growth
        evidence.append(Evidence("time_to_exhaustion_s", round(horizon), LEAK_HORIZON_S, "sampler", "s",
                                 "remaining memory / growth"))
    soon = horizon is not None and horizon < LEAK_HORIZON_S
    impact = LEAK_IMPACT_SOON if soon else LEAK_IMPACT
    basis = ("estimate: memory runs out within the hour, which ends the run" if soon
             else "estimate: a leak ranks with a high finding although it costs no step time yet")
    if ev.steady is None:
        impact, basis = 0.0, "none: the run has no steps, so only the growth rate is reported"
    rate = growth / 2**20
    title = (f"Memory grows {rate:.0f} MiB/s and does not level off"
             + (f": memory runs out in ~{horizon / 60:.0f} min" if horizon is not None else ""))
    return common.finding(
        "memory_pressure.growing_memory", "memory_pressure", title, impact, 0.8, evidence,
        [Prescription("Store scalars, not tensors, in anything kept across steps: loss.item() or "
                      "loss.detach() for logging, detach outputs kept for metrics",
                      "a kept tensor that requires grad keeps its whole autograd graph alive"),
         Prescription("Bound caches and lists that grow per step (collections.deque(maxlen=...))",
                      f"{rate:.0f} MiB/s is {rate * 3600 / 1024:.0f} GiB an hour"),
         Prescription("Find the growing objects: tracemalloc snapshots a few steps apart, or "
                      "torch.cuda.memory._record_memory_history() on GPU")],
        "Resident memory keeps growing after warm-up, which is how a leak looks; the run dies when "
        "the machine runs out.", severity=Severity.HIGH if soon else (Severity.LOW if ev.steady is None else None),
        impact_basis=basis, urgent=bool(soon),
        risk=(f"memory runs out in ~{horizon / 60:.0f} min" if soon and horizon is not None
              else f"memory grows {rate:.0f} MiB/s"))


def near_capacity(ev: RunEvidence) -> Finding | None:
    trace = ev.trace
    shares = []
    peak = trace.memory.peak_bytes if trace is not None else None
    capacity = trace.memory.capacity_bytes if trace is not None else None
    if peak and capacity:
        shares.append(("device_memory_peak_share", peak / capacity, "trace", "device"))
    gpu = common.field_of(ev.signals, "gpu_memory_used_share_max")
    if gpu is not None:
        shares.append(("gpu_memory_used_share_max", float(gpu), "sampler", "device"))
    host = common.field_of(ev.signals, "memory_used_share_max")
    if host is not None:
        shares.append(("memory_used_share_max", float(host), "sampler", "host"))
    over = [item for item in shares if item[1] >= NEAR_CAPACITY]
    if not over:
        return None
    metric, share, source, where = max(over, key=lambda item: item[1])
    prescriptions = ([Prescription("Activation checkpointing (torch.utils.checkpoint) or mixed precision",
                                   "trades a little compute for a lot of activation memory"),
                      Prescription("A smaller batch with gradient accumulation", "same effective batch")]
                     if where == "device" else
                     [Prescription("Fewer DataLoader workers or a smaller prefetch_factor; memory-map data",
                                   "host RAM near full risks the OOM killer")])
    return common.finding(
        "memory_pressure.near_capacity", "memory_pressure",
        f"{where.capitalize()} memory peaks at {share:.0%} of capacity", NEAR_CAPACITY_IMPACT, 0.8,
        [Evidence(metric, round(share, 4), NEAR_CAPACITY, source, "ratio", where)], prescriptions,
        "Close to the limit, a longer sequence or a larger batch fails with out-of-memory; "
        "allocators also start to retry and fragment.", severity=Severity.MEDIUM,
        impact_basis="estimate: a risk weight for a run close to out-of-memory, not step time",
        risk=f"{where} memory at {share:.0%} of capacity")


FAMILY = FamilyEntry(
    "memory_pressure", (swapping, growing_memory, near_capacity,),
    diagnoses="Swapping, a heap that keeps growing, memory near capacity",
    evidence="Swap ≥ 1 MiB/s; the heap growing ≥ 4 MiB/s and ≥ 128 MiB over the steady state without levelling off; memory ≥ 90 % of capacity",
    supersedes=frozenset())
