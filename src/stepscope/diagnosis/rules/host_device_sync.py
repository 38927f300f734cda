"""Host–device synchronisation and copies (GPU runs; evidence from traces).

- Synchronisations: ``cudaDeviceSynchronize`` / ``cudaStreamSynchronize`` / ``.item()`` /
  ``.cpu()`` inside the step block the host until the device drains, so the device then idles
  while the host prepares the next launches (Nsight's ``cuda_api_sync`` rule).
- Copies: a large Memcpy share, worst when the host side is pageable memory, which makes
  ``cudaMemcpyAsync`` synchronous (Nsight's ``cuda_memcpy_async`` rule).

- The critical path (a trace with one): while the path is on the host right after a sync (until
  it reaches the device again), the device's idle time is what the sync cost: the device drained
  its queue for the host; and the host's time on the path inside blocking calls that no device
  work in the trace explains (waiting on another stream, another rank). At 5 % of the path together
  they are reported even when the sync calls themselves look short.

Thresholds follow XProf's moderate level (5 % of the step) for all three.
"""

from __future__ import annotations

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common

#: Share of the step spent in synchronisation calls (XProf's 5 % "moderate" level).
SYNC_MODERATE = 0.05
#: Share of the step in memory copies (XProf's 5 % "moderate" level for host-to-device input).
MEMCPY_MODERATE = 0.05


def sync_and_copies(ev: RunEvidence) -> Finding | None:
    trace = ev.trace
    if trace is None or not trace.device:
        return None
    sync = trace.syncs.sync_share or 0.0
    memcpy = trace.shares.memcpy or 0.0
    pageable = trace.syncs.pageable_memcpy_share or 0.0
    count = trace.syncs.syncs_per_step
    path = trace.critical_path
    # the path's shares, as shares of the step (the title and the impact speak of the step)
    blocked = path.of_step(path.sync_wait) if path is not None else 0.0
    exposed = path.of_step(path.after_sync) + blocked if path is not None else 0.0
    if sync < SYNC_MODERATE and memcpy < MEMCPY_MODERATE and exposed < SYNC_MODERATE:
        return None
    evidence = [Evidence("sync_share", round(sync, 4), SYNC_MODERATE, "trace", "ratio", "per step"),
                Evidence("memcpy_share", round(memcpy, 4), MEMCPY_MODERATE, "trace", "ratio", "per step")]
    if path is not None:
        if blocked >= 0.0005:
            evidence.append(Evidence("blocked_path_share", round(blocked, 4), None, "trace", "ratio",
                                     "the host inside blocking calls on the critical path, no device work "
                                     "in the trace explaining the wait"))
        evidence.append(Evidence("after_sync_path_share", round(path.after_sync, 4), SYNC_MODERATE, "trace", "ratio",
                                 "device idle while the critical path is on the host after a sync: "
                                 + "; ".join(path.syncs[:2])))
    if count is not None:
        evidence.append(Evidence("sync_count_per_step", round(count, 1), None, "trace", "count", "per step"))
    if pageable:
        evidence.append(Evidence("pageable_memcpy_share", round(pageable, 4), None, "trace", "ratio",
                                 "copies from pageable host memory"))
    syncing = sync >= SYNC_MODERATE or exposed >= SYNC_MODERATE
    copying = memcpy >= MEMCPY_MODERATE or (exposed >= SYNC_MODERATE and pageable)
    remove_syncs = Prescription(
        "Remove per-step host syncs: log loss.detach() and call .item() every N steps; avoid "
        ".cpu()/.numpy()/print of device tensors and data-dependent Python control flow in the step",
        f"{count:.0f} syncs per step" if count else "synchronisations inside the step") if syncing else None
    loader = ev.main_loader
    pin = common.pin_memory_prescription(ev, "copies from pageable memory are synchronous") \
        if copying and (pageable or (loader is not None and not loader.pin_memory)) else None
    move_less = Prescription("Move less data: transfer uint8 and normalise on the device; keep tensors on the "
                             "device between steps", "memcpy share of the step") if copying else None
    # pageable copies make the sync: pinning removes it, so it goes first
    ordered = (pin, remove_syncs, move_less) if pageable else (remove_syncs, pin, move_less)
    prescriptions = [item for item in ordered if item is not None]
    impact = max(sync + memcpy, exposed)
    if exposed <= sync + memcpy:
        title = f"Host–device syncs and copies take {common.pct(impact)} of the step"
    elif blocked > exposed - blocked:
        after = exposed - blocked
        title = (f"The host waits on the device in blocking calls for {common.pct(blocked)} of the step"
                 + (f", and the device then idles for {common.pct(after)} while the host catches up" if after >= 0.01
                    else ""))
    else:
        title = f"A host–device sync leaves the device idle for {common.pct(impact)} of the step"
    return common.finding("host_device_sync.sync_and_copies", "host_device_sync", title,
                          impact, 0.8, evidence, prescriptions,
                          "The host waits for the device (or the copy engine) inside the step, so the "
                          "device then idles while the host catches up.")


FAMILY = FamilyEntry(
    "host_device_sync", (sync_and_copies,),
    diagnoses="The host blocks on the device, or copies are slow (pageable memory)",
    evidence="(GPU trace) synchronising calls ≥ 5 % or memcpy ≥ 5 % of the step; pageable copies",
    supersedes=frozenset())
