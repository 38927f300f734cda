"""Input pipeline, CPU-bound: the step waits for batches that the CPU is busy producing.

Fires when the steady-state fetch wait (data wait less DataLoader worker start-up, which the
periodic-stall rule owns) reaches XProf's moderate level and the loading processes are busy on
CPU — or when no sampler evidence says otherwise (then with lower confidence). It stays silent when
the loaders are idle while the step waits (that is ``storage_io``) and when the CPU is
oversubscribed (``cpu_oversubscription``: more workers would make that worse).

Prescriptions are computed: per-batch load time over per-batch compute time gives the workers
needed to hide loading; the machine's cores cap it. When every core is already loading, the
prescription is to make loading cheaper, never "more workers".
"""

from __future__ import annotations

from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common
from stepscope.diagnosis.rules._common import INPUT_HIGH, INPUT_MODERATE, LOADER_CPU_BUSY
from stepscope.diagnosis.rules.cpu_oversubscription import oversubscription
from stepscope.diagnosis.rules.storage_io import io_signs

#: Worker start-up above this share of the step is worth ``persistent_workers=True`` even when it
#: is not periodic enough for the periodic-stall rule (XProf's 3 % "moderate" level for secondary
#: categories such as kernel launch and all-others).
LOADER_INIT_MODERATE = 0.03


def loader_cpu_bound(ctx) -> Finding | None:
    stats = ctx.stats
    if stats is None:
        return _from_trace(ctx)
    if stats.fetch_wait_share < INPUT_MODERATE:
        return None
    util, util_source = common.loader_cpu_util(ctx)
    if util is not None and util < LOADER_CPU_BUSY:
        return None  # loaders idle or ambiguous: storage_io decides
    if util is None and any(io_signs(ctx)[3]):
        return None  # no CPU evidence, but storage signs: storage_io decides
    if oversubscription(ctx) is not None:
        return None
    wait = stats.fetch_wait_share
    evidence = [
        Evidence("fetch_wait_share", round(wait, 4), INPUT_MODERATE, "steps", "ratio", "steady state"),
    ]
    if util is not None:
        evidence.append(Evidence("loader_cpu_util", round(util, 3), LOADER_CPU_BUSY,
                                 common.evidence_source(util_source), "cores", util_source))
    confidence = 0.9 if util is not None else 0.6
    loader = common.main_loader(ctx)
    prescriptions = _prescriptions(ctx, util)
    level = "highly" if wait >= INPUT_HIGH else "moderately"
    title = f"Input pipeline is CPU-bound: the step waits {common.pct(wait)} of its time for data"
    summary = (f"The run is {level} input-bound (XProf levels 5%/20%): {common.pct(wait)} of the "
               f"step is spent waiting for the next batch")
    summary += (f", while the process(es) producing batches use {util:.0%} of a core."
                if util is not None else f"; whether loading is CPU-bound is {util_source}"
                " (storage or latency would look the same).")
    if loader is not None:
        evidence.append(Evidence("num_workers", loader.num_workers, None, "loader", "count",
                                 f"loader #{loader.loader_id}"))
    cores = common.cpu_count(ctx)
    if cores:
        evidence.append(Evidence("cpu_count", cores, None, "meta", "count", "machine"))
    return common.finding("input_pipeline.loader_cpu_bound", "input_pipeline", title, wait, confidence,
                          evidence, prescriptions, summary)


def _from_trace(ctx) -> Finding | None:
    """A bare trace (no run record): the TensorBoard plugin's DataLoader share is the evidence."""
    share = common.field_of(ctx.trace, "dataloader_share")
    if share is None or share < INPUT_MODERATE:
        return None
    return common.finding(
        "input_pipeline.loader_cpu_bound", "input_pipeline",
        f"Input pipeline: {common.pct(share)} of the step is in the DataLoader", share, 0.5,
        [Evidence("dataloader_share", round(share, 4), INPUT_MODERATE, "trace", "ratio", "per step")],
        [Prescription("Raise DataLoader num_workers (up to the cores), or make samples cheaper to produce",
                      "the trace alone cannot tell CPU-bound loading from storage latency; "
                      "`stepscope run` measures both")],
        "The trace shows the step waiting for the DataLoader; without a run record the loaders' CPU "
        "use is unknown.")


def _prescriptions(ctx, util: float | None) -> list[Prescription]:
    stats = ctx.stats
    loader = common.main_loader(ctx)
    cores = common.cpu_count(ctx)
    out: list[Prescription] = []
    per_step = stats.step_time_mean_s
    batches = common.batches_per_step(ctx)
    wait_s = stats.fetch_wait_share * per_step / batches
    compute_s = max(per_step / batches - wait_s, 1e-6)
    workers = loader.num_workers if loader is not None else 0
    # per-batch load time: with workers, `workers` batches are produced per load time
    load_s = wait_s if workers == 0 else (wait_s + compute_s) * workers
    needed = common.workers_needed(load_s, compute_s)
    if cores and workers < cores:
        suggested = min(max(needed, workers + 1), cores)
        why = (f"{cores} cores; loading one batch takes ~{common.ms(load_s)} of CPU and the model "
               f"~{common.ms(compute_s)}, so {needed} worker(s) would hide it")
        if suggested < needed:
            why += f"; capped at {cores} cores, so expect the wait to shrink, not vanish"
        if util is not None:
            why += f"; loading uses {util:.0%} of a core"
        why += f"; data wait {common.pct(stats.fetch_wait_share)} of the step"
        out.append(Prescription(f"DataLoader(num_workers={suggested})", why, "num_workers", workers,
                                suggested))
        threads = stats.intra_op_threads
        if threads and threads + suggested > cores:
            out.append(Prescription(
                f"torch.set_num_threads({max(1, cores - suggested)}) in the training process",
                f"{threads} intra-op threads + {suggested} busy workers > {cores} cores would "
                "oversubscribe the CPU", "intra_op_threads", threads, max(1, cores - suggested)))
    else:
        out.append(Prescription(
            "Make each sample cheaper to produce: precompute or cache the transform offline, "
            "vectorise it per batch (collate_fn), or move augmentation to the GPU",
            f"all {cores or '?'} cores already load data ({workers} workers): more workers cannot help"))
    if loader is not None and workers > 0 and not loader.persistent_workers \
            and stats.loader_init_share >= LOADER_INIT_MODERATE:
        out.append(Prescription("DataLoader(persistent_workers=True)",
                                f"worker start-up costs {common.pct(stats.loader_init_share)} of the step",
                                "persistent_workers", False, True))
    return out
