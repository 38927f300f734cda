"""Input pipeline blocked on storage or latency: the step waits for data, yet the processes that
produce it are *not* busy on CPU.

They wait on disk reads, network filesystems, object stores, remote services or plain latency.
Evidence: data wait at XProf's moderate level while the loading processes use little CPU
(sampler), plus any of: iowait, disk reads high early and low late (the page cache warming up), a
first epoch much slower than the later ones (from the steps alone).

The difference from the CPU-bound case matters for the prescription: waiting workers cost no
CPU, so more workers than cores (and a deeper prefetch) overlap the latency, whereas for CPU-bound
loading the cores are the cap.
"""

from __future__ import annotations

import math
from typing import Any


from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common
from stepscope.diagnosis.rules._common import INPUT_HIGH, INPUT_MODERATE, LOADER_CPU_BUSY, LOADER_CPU_IDLE

#: Mean iowait share of CPU time that points at storage (iostat/sar practice: a healthy compute
#: job sits near 0 %; sustained %iowait of several percent means processes block on the disk).
IOWAIT_HIGH = 0.05
#: First epoch's data wait per step at least this multiple of the later epochs' (the data was read
#: from storage once, then served from the page cache).
FIRST_EPOCH_SLOWER = 2.0
#: I/O-bound workers sleep, so more workers than cores help; we cap the suggestion at this many per
#: core to keep memory (each worker holds ``prefetch_factor`` batches) in check.
IO_WORKERS_PER_CORE = 4
#: ``prefetch_factor`` suggested for latency-bound loaders (torch's default is 2).
IO_PREFETCH = 4


def io_signs(ev: RunEvidence) -> tuple[float | None, bool, float | None, list[bool]]:
    """(iowait share, page-cache warming, first-epoch ratio, which of the three point at storage)."""
    signs = ev.storage
    iowait, warming, epoch_ratio = signs.iowait_share, signs.page_cache_warming, signs.first_epoch_ratio
    return iowait, warming, epoch_ratio, [iowait is not None and iowait >= IOWAIT_HIGH, warming,
                                          epoch_ratio is not None and epoch_ratio >= FIRST_EPOCH_SLOWER]


def cold_data(ev: RunEvidence) -> Finding | None:
    """The first epoch waited on storage (:func:`_cold_data`); :func:`loader_waits_on_io` and the
    CPU-bound input rule then judge only the wait that is left once the data is cached."""
    if ev.storage.cold is None or ev.storage.cold.excess_share < common.MIN_GAIN:
        return None
    return _cold_data(ev)


#: Below this share of the data wait spent blocked, the summary says the wait was mostly not the source's.
BLOCKED_MOST = 0.5


def loader_waits_on_io(ev: RunEvidence) -> Finding | None:
    stats = ev.steady
    if stats is None or common.warm_fetch_wait_share(ev) < INPUT_MODERATE:
        return None
    util, util_source = common.loader_cpu_util(ev)
    iowait, warming, epoch_ratio, signs = io_signs(ev)
    if ev.storage.cold is not None:
        # the page cache warming and the slow first epoch are the cold-data finding's: what is left
        # once the data is cached is judged by the rest
        later = ev.storage.profile.segments[1:] if ev.storage.profile is not None else ()
        waits = [item.iowait_share for item in later if item.iowait_share is not None]
        iowait = max(waits) if waits else None
        warming, epoch_ratio = False, None
        signs = [iowait is not None and iowait >= IOWAIT_HIGH, False, False]
    idle = util is not None and util < LOADER_CPU_BUSY
    # without a conclusive CPU measurement only the disk's own signs count: iowait or a slow first
    # epoch. Reads high early and low late alone also fit a script importing its libraries.
    strong = signs[0] or signs[2]
    if not idle and not (util is None and strong):
        return None
    wait = common.warm_fetch_wait_share(ev)
    evidence = [Evidence("fetch_wait_share", round(wait, 4), INPUT_MODERATE, "steps", "ratio",
                         "steady state" if ev.storage.cold is None else "once the data is cached (later epochs)")]
    if util is not None:
        evidence.append(Evidence("loader_cpu_util", round(util, 3), LOADER_CPU_BUSY,
                                 common.evidence_source(util_source), "cores", util_source))
    if iowait is not None:
        evidence.append(Evidence("iowait_share", round(iowait, 4), IOWAIT_HIGH, "sampler", "ratio", "all cores"))
    if warming:
        evidence.append(Evidence("page_cache_warming", True, None, "sampler", "flag",
                                 "disk reads high early, low late"))
    if epoch_ratio is not None:
        evidence.append(Evidence("first_epoch_wait_ratio", round(epoch_ratio, 2), FIRST_EPOCH_SLOWER,
                                 "steps", "x", "first epoch vs later"))
    confidence = 0.5 + 0.15 * sum(signs) + (0.25 if util is not None and util < LOADER_CPU_IDLE else 0.0)
    kind = "storage" if any(signs) else "latency"
    mixed = common.loader_cpu_mixed(util)
    hedged = idle and mixed and not strong  # neither idle nor CPU-bound: no claim of either
    if hedged:
        # computing a third to a half of a core, the loaders are not idle: the side of LOADER_CPU_BUSY
        # they fell on names this rule rather than the CPU-bound one, which is no claim to make
        confidence = min(confidence, common.LOADER_CPU_MIXED_CONFIDENCE)
        title = (f"Input pipeline: the step waits {common.pct(wait)} of its time for data while the loaders "
                 f"compute only {util:.0%} of a core (mostly waiting, partly computing)")
        summary = (f"{'Highly' if wait >= INPUT_HIGH else 'Moderately'} input-bound; the processes producing "
                   f"batches compute {util:.0%} of a core and wait the rest, for reads, a slow source or the "
                   f"handoff of batches. {common.LOADER_CPU_MIXED_BAND} this run does not say which part is "
                   "larger. More workers overlap the waiting while cores are free.")
    elif idle:
        loaders = f"on CPU only {util:.0%} of the time" if mixed else "idle"
        title = (f"Input pipeline waits on {kind}: the step waits {common.pct(wait)} of its time for data "
                 f"while the loaders are {loaders}")
        summary = (f"{'Highly' if wait >= INPUT_HIGH else 'Moderately'} input-bound, but the processes "
                   f"producing batches are not busy on CPU ({util:.0%} of a core): they wait for reads or a "
                   "slow source. More workers overlap the waiting.")
    else:
        confidence = min(confidence, 0.5)
        title = (f"Input pipeline waits on storage: the step waits {common.pct(wait)} of its time for data, "
                 "and the disk shows it")
        summary = (f"{'Highly' if wait >= INPUT_HIGH else 'Moderately'} input-bound; whether the loaders "
                   f"compute or wait is {util_source}, but the disk's own signs (iowait or a slow first epoch) "
                   "point at storage.")
    summary += common.loading_code(ev, evidence)
    # waiting on a source blocks the training thread; the account says how much of the data wait it
    # was off CPU: the rest it computed (unpickling batches) or waited for a core, which no read explains
    blocked = ev.account.phase("data_wait") if ev.account is not None else None
    impact = wait
    low: dict[str, Any] = {}
    floor = ev.loader_floor
    if floor is not None and floor.blocked_s > 0 and floor.sets_the_pace(wait):
        # measured in the workers, whose pace the step waits for: their time off CPU per batch is
        # what faster reads take away, up to the whole wait (the training thread's account inside
        # next() says less here: it sees its queue, not the reads behind it)
        impact = min(wait, floor.blocked_share())
        evidence.append(Evidence("workers_blocked_per_batch_s", round(floor.blocked_s, 6), None, "record", "s",
                                 f"of {floor.wall_s * 1e3:.3g} ms per batch, {floor.workers} worker(s), measured "
                                 "in the workers: off CPU and not waiting for a core"))
        summary += (f" The workers spent {common.pct(floor.blocked_fraction)} of each batch's "
                    f"{floor.wall_s * 1e3:.3g} ms off CPU: without it the loader would keep pace with the step.")
    elif blocked is not None:
        # asleep on a lock while another Python thread computed, a single-process loader waited for the
        # GIL (measured: what the thread slept in). Each blocking read releases the GIL and the other
        # thread takes it: the wait to take it back comes with every read, so fewer or faster reads
        # remove it as removing the thread would. Both findings are charged it; the source's lower end
        # is its reads alone
        gil = blocked.off_part("gil")  # 0 unless sampled
        impact = wait * blocked.off_cpu
        reads = impact * (1.0 - gil)
        if gil > 0 and reads < INPUT_MODERATE and not any(signs):
            return None
        low = common.lower_end(impact, reads, "without the waits for the GIL after the reads, which the other "
                               "Python thread's finding is charged as well", evidence, "data_wait_reads_share",
                               "the training thread blocked in the loader's reads alone, not waiting for the GIL")
        if low:
            summary += (f" After each read the training thread waited to take the GIL back from another Python "
                        f"thread ({common.pct(impact - reads)} of the step): fewer or faster reads remove that "
                        "wait, as would removing the thread, so the other thread's finding counts it too.")
        evidence.append(Evidence("data_wait_off_cpu", blocked.off_cpu, None, "account", "ratio",
                                 "of the data wait the training thread was blocked, not computing or waiting for a core"))
        if blocked.waits:
            evidence.append(Evidence("data_wait_slept_in", round(1.0 - gil, 4), None, "account", "ratio",
                                     f"of the blocked wait not on the GIL: {common.slept_in(blocked)}"))
        if blocked.off_cpu < BLOCKED_MOST:
            summary += (f" The training thread was blocked for only {common.pct(blocked.off_cpu)} of that wait "
                        f"(on CPU {common.pct(blocked.on_cpu)}, waiting for a core {common.pct(blocked.waiting_core)}): "
                        "the cost is priced on the blocked part.")
    # priced on the part of the wait the reads are known to take; removing them may give back the
    # whole wait, or more (the loader's CPU around each read, the wake-ups): on eight blind seeds'
    # kept runs, removing the slow reads of a single-process loader gained more than this cost 33
    # times in 36, more than the whole wait 28 times; with workers 20 and 11 times in 31
    high = common.upper_end(impact, wait, "the whole data wait, which faster reads may give back", evidence,
                            "data_wait_share_high", "the step's whole wait for data (the cost's upper end)")
    return common.finding("storage_io.loader_waits_on_io", "storage_io", title, impact, confidence,
                          evidence, _prescriptions(ev, warming or (epoch_ratio or 0) >= FIRST_EPOCH_SLOWER, idle),
                          summary, claims=("data_wait",),
                          conclusive={"storage": any(signs), "latency": idle and not hedged,
                                      "cpu_bound": False}, **low, **high)


def _cold_data(ev: RunEvidence) -> Finding:
    """The first epoch read its data from storage: slower than the later ones, with disk reads
    that fall as the page cache warms. Told by time, whatever the cores did (module docstring)."""
    from stepscope.analysis.run.input_profile import COLD_MIN_READ_BYTES_PER_S, COLD_WAIT_RATIO  # a record's

    cold = ev.storage.cold
    profile = ev.storage.profile
    assert cold is not None and profile is not None
    segment = "epoch" if profile.kind == "epoch" else "third of the run"
    first = profile.segments[0]
    mib = 2**20
    evidence = [
        Evidence("first_segment_wait_ratio", round(cold.wait_ratio, 2), COLD_WAIT_RATIO, "steps", "x",
                 f"data wait per step, first {segment} vs later"),
        Evidence("disk_read_bytes_per_s_first", round(cold.read_early_bytes_per_s), COLD_MIN_READ_BYTES_PER_S,
                 "sampler", "B/s", f"first {segment}"),
        Evidence("disk_read_bytes_per_s_later", round(cold.read_late_bytes_per_s), None, "sampler", "B/s",
                 f"later {segment}s (highest)"),
        Evidence("cold_wait_excess_s", round(cold.excess_s, 4), None, "steps", "s",
                 f"extra data wait of the first {segment} over {first.steps} steps"),
        Evidence("later_wait_share", round(cold.later_wait_share, 4), None, "steps", "ratio",
                 f"data wait share once warm (later {segment}s)"),
    ]
    for index, item in enumerate(profile.segments):
        reads = "?" if item.read_bytes_per_s is None else f"{item.read_bytes_per_s / mib:.0f} MiB/s"
        cpu = "" if item.loader_cpu_util is None else f", workers {item.loader_cpu_util:.0%} of a core"
        evidence.append(Evidence(f"{profile.kind}_{index + 1}", f"wait {common.ms(item.fetch_wait_s)}/step, "
                                 f"reads {reads}{cpu}", None, "steps", "text", f"steps {item.first_step}–"
                                 f"{item.first_step + item.steps - 1}"))
    title = (f"Input pipeline waits on storage in the first {segment}: data wait {cold.wait_ratio:.1f}× the later "
             f"{segment}s', disk reads {cold.read_early_bytes_per_s / mib:.0f} → "
             f"{cold.read_late_bytes_per_s / mib:.0f} MiB/s as the page cache warms")
    summary = (f"The first {segment} read the data set from storage: its steps waited "
               f"{common.ms(first.fetch_wait_s)} each for data, {cold.wait_ratio:.1f}× the later {segment}s', "
               f"while the disk read {cold.read_early_bytes_per_s / mib:.0f} MiB/s, and "
               f"{cold.read_late_bytes_per_s / mib:.0f} MiB/s once the page cache held it. The cold reads cost "
               f"{common.ms(cold.excess_s)} ({common.pct(cold.excess_share)} of this run's step time); a run of more "
               f"epochs pays it once, a run reading more data than the cache holds pays it every epoch.")
    if cold.later_wait_share >= INPUT_MODERATE:
        summary += (f" Once warm the step still waits {common.pct(cold.later_wait_share)} for data: that part is "
                    "not storage.")
    summary += common.loading_code(ev, evidence)
    prescriptions = [
        Prescription("Stage the data set on local disk (or in RAM: /dev/shm) before training, or pre-read it "
                     "once (vmtouch -t, cat > /dev/null) so the first epoch starts warm",
                     f"the first {segment} waited {common.ms(cold.excess_s)} more than a warm one"),
        Prescription("Read fewer, larger objects: pack samples into shards (WebDataset/tar, LMDB, Parquet) and "
                     "read them sequentially", "cold per-sample reads pay the storage latency once per sample"),
    ]
    loader = ev.main_loader
    if loader is not None and loader.num_workers > 0 and (loader.prefetch_factor or 2) < IO_PREFETCH:
        prescriptions.append(Prescription(f"DataLoader(prefetch_factor={IO_PREFETCH})",
                                          "more reads in flight per worker overlap the cold reads",
                                          "prefetch_factor", loader.prefetch_factor or 2, IO_PREFETCH))
    confidence = 0.85 if cold.wait_ratio >= FIRST_EPOCH_SLOWER else 0.7
    return common.finding("storage_io.cold_data", "storage_io", title, cold.excess_share, confidence, evidence,
                          prescriptions, summary, claims=("data_wait",),
                          partial=cold.later_wait_share >= INPUT_MODERATE,
                          conclusive={"storage": True, "cpu_bound": False})


def _prescriptions(ev: RunEvidence, cached_later: bool, idle: bool = True) -> list[Prescription]:
    stats = ev.steady
    assert stats is not None
    loader = ev.main_loader
    cores = ev.cpu_count or 1
    workers = loader.num_workers if loader is not None else 0
    batches = stats.batches_per_step
    per_batch = stats.step_time_mean_s / batches
    wait_s = stats.fetch_wait_share * per_batch
    compute_s = max(per_batch - wait_s, 1e-6)
    floor = ev.loader_floor
    # one worker's time per batch: measured in the workers (their waits for a core left out), else
    # taken as the step's time per batch × the workers (each busy all the time)
    measured = False
    if workers == 0:
        latency_s = wait_s
    elif floor is not None and floor.workers == workers:
        latency_s, measured = floor.wall_s - floor.runq_s, True
    else:
        latency_s = per_batch * workers
    needed = math.ceil(latency_s / compute_s) + 1
    # waiting workers use no CPU, so they may outnumber the cores — only when that idleness was measured
    cap = IO_WORKERS_PER_CORE * cores if idle else cores
    suggested = max(workers + 1, min(needed, cap))
    if measured:
        why = (f"each batch takes a worker ~{common.ms(latency_s)} (measured in the workers) against "
               f"~{common.ms(compute_s)} of the training thread's own work; ")
    else:
        why = f"each batch waits ~{common.ms(latency_s)} on I/O or latency against ~{common.ms(compute_s)} of compute; "
    why += (f"waiting workers use no CPU, so {suggested} can exceed the {cores} cores"
            if idle else f"capped at the {cores} cores: the loaders' CPU use is not known")
    why += f" (capped at {cap})" if needed > cap and idle else ""
    out = [Prescription(f"DataLoader(num_workers={suggested})", why, "num_workers", workers, suggested)]
    prefetch = loader.prefetch_factor if loader is not None else None
    if workers > 0 and (prefetch or 2) < IO_PREFETCH:
        out.append(Prescription(f"DataLoader(prefetch_factor={IO_PREFETCH})",
                                "more batches in flight per worker hide latency spikes",
                                "prefetch_factor", prefetch or 2, IO_PREFETCH))
    if cached_later:
        out.append(Prescription(
            "Stage the dataset on local disk or in memory before training (or pre-read it once)",
            "the first pass reads from storage and later passes are served from the page cache"))
    out.append(Prescription(
        "Read fewer, larger objects: pack samples into shards (WebDataset/tar, LMDB, Parquet) and "
        "read them sequentially",
        "per-sample reads pay the storage latency once per sample"))
    return out


FAMILY = FamilyEntry(
    "storage_io", (loader_waits_on_io, cold_data,),
    diagnoses="The step waits for data while the loaders wait on storage: a cold first epoch, iowait, the page cache warming",
    evidence="Data wait ≥ 5 % with idle loaders on a machine with CPU to spare, iowait ≥ 5 %; per epoch: a first epoch waiting ≥ 1.5× the later ones while the disk reads ≥ 4× more",
    supersedes=frozenset({"input_pipeline", "compute"}), cpu_based=True)
