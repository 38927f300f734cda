"""Communication: the step waits in collectives that computation does not hide.

Evidence, from capture (``ev.comm``): the ``communication`` phase — the time the step waits in
``torch.distributed`` collectives and the exposed part of DDP's gradient all-reduce — and the
collective time overlapped with backward. From a trace (``stepscope analyze``): the communication
share and the share of it overlapped by computation (the TensorBoard plugin's distributed view,
HTA's comm/comp overlap). The exposed part is the impact.

Waiting for a slower rank looks like communication from the waiting rank; the straggler rule names
that cause and supersedes this one (``SUPERSEDES``). When the ranks take turns being slow (each
rank's data loading varies from step to step), no rank straggles, but each rank's wait in step i is
the others' longer work in step i: measured per step (:class:`~stepscope.analysis.bundle.PeerWait`),
a wait the others' work explains is reported as theirs (LOW, unpriced), never as communication-bound.
"""

from __future__ import annotations

import math

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity
from stepscope.diagnosis.rules import _common as common

#: The TensorBoard plugin recommends acting above 10 % of the step in communication.
COMM_MODERATE = 0.10
#: XProf's smart suggestion "CollectiveBound" fires at 30 % (the seed's red flag).
COMM_HIGH = 0.30
#: Per-rank batch multiplied at most by this in a prescription.
MAX_BATCH_FACTOR = 8
#: The other ranks' longer own work explains at least this share of the wait: it is theirs.
PEER_EXPLAINED = 0.5
PEER_PHASE_LABELS = {"data_wait": "data loading", "forward": "forward", "optimizer": "optimizer step",
                     "other": "work outside the model"}


def exposed_collectives(ev: RunEvidence) -> Finding | None:
    if ev.comm is not None and ev.steady is not None:
        return _from_capture(ev)
    return _from_trace(ev)


def _from_capture(ev: RunEvidence) -> Finding | None:
    comm = ev.comm
    steady = ev.steady
    assert comm is not None and steady is not None
    exposed = comm.exposed_share
    dominant = max(steady.shares.items(), key=lambda item: item[1])[0] == "communication"
    if exposed < COMM_MODERATE and not dominant:
        return None
    peer = ev.peer
    if peer is not None and peer.explained >= PEER_EXPLAINED and peer.phase in common.PHASE_CAUSES:
        return _waiting_for_a_peer(ev, exposed)
    step_s = steady.step_time_mean_s
    compute_s = steady.compute_share * step_s
    evidence = [
        Evidence("exposed_communication_share", round(exposed, 4), COMM_HIGH, "steps", "ratio",
                 "the step waits in collectives (communication phase)"),
        Evidence("exposed_communication_s", round(comm.exposed_s, 5), None, "steps", "s", "per step"),
        Evidence("overlapped_communication_share", round(comm.overlapped_share, 4), None, "steps", "ratio",
                 "collective time hidden under backward"),
        Evidence("compute_s", round(compute_s, 5), None, "steps", "s", "forward + backward + optimizer per step"),
    ]
    prescriptions = _prescriptions(ev, exposed, comm.exposed_s, compute_s)
    level = "above the 30% red flag" if exposed >= COMM_HIGH else "moderate"
    return common.finding(
        "communication.exposed_collectives", "communication",
        f"Communication-bound: the step waits {common.pct(exposed)} of its time in collectives ({level})",
        exposed, 0.8, evidence, prescriptions,
        f"Each step waits {common.ms(comm.exposed_s)} in collectives (gradient all-reduce) that computation "
        f"({common.ms(compute_s)} per step) does not hide.", claims=("communication",),
        exposed_share=round(exposed, 4), overlapped_share=round(comm.overlapped_share, 4))


def _waiting_for_a_peer(ev: RunEvidence, exposed: float) -> Finding:
    """The wait in collectives is the other ranks' own work in the same steps: their cause, not the
    network. Reported, unpriced and LOW, on this rank; the cost is ranked under that cause on the rank
    that has it (its own finding), so the verdict never reads "communication-bound" for it."""
    peer = ev.peer
    assert peer is not None
    label = PEER_PHASE_LABELS.get(peer.phase, peer.phase.replace("_", " "))
    evidence = [
        Evidence("exposed_communication_share", round(exposed, 4), COMM_MODERATE, "steps", "ratio",
                 "the step waits in collectives (communication phase)"),
        Evidence("peer_work_explains", peer.explained, PEER_EXPLAINED, "steps", "ratio",
                 f"of the wait: the other ranks' longer own work in the same steps (most often rank {peer.rank})"),
        Evidence("peer_phase", peer.phase, None, "steps", "phase", "where their extra work was"),
    ]
    title = (f"The step waits {common.pct(exposed)} in collectives for the other ranks' {label} "
             f"(rank {peer.rank} most often): their cause, not the network")
    summary = (f"{common.pct(peer.explained)} of this rank's wait in collectives is the other ranks working longer in "
               f"the same steps, mostly in their {label}. Their own finding on that cause is where the cost is; "
               "faster collectives would not shorten the step.")
    prescriptions = [Prescription(
        f"Fix rank {peer.rank}'s {label} (its own finding in this job's report)",
        f"every collective waits for the slowest rank: {common.pct(peer.explained)} of the wait is its {label}")]
    return common.finding("communication.waiting_for_peer", "communication", title, 0.0, 0.8, evidence,
                          prescriptions, summary, severity=Severity.LOW, claims=("communication",),
                          impact_basis=f"not priced here: the wait is the other ranks' {label}, priced on theirs",
                          cause_families=common.PHASE_CAUSES[peer.phase], peer_rank=peer.rank)


def _prescriptions(ev: RunEvidence, exposed: float, exposed_s: float, compute_s: float) -> list[Prescription]:
    loader = ev.main_loader
    batch = loader.batch_size if loader is not None else None
    factor = min(MAX_BATCH_FACTOR, max(2, math.ceil((exposed_s + compute_s) / compute_s))) if compute_s > 0 \
        else MAX_BATCH_FACTOR
    because = f"communication is {common.pct(exposed)} of the step and does not grow with the batch"
    out = []
    if batch:
        out.append(Prescription(
            f"DataLoader(batch_size={batch * factor}) per rank (from {batch}), or gradient accumulation: "
            f"{factor} micro-batches with `with model.no_sync():` on all but the last", because))
    else:
        out.append(Prescription(f"Gradient accumulation: {factor} micro-batches per all-reduce, "
                                "`with model.no_sync():` on all but the last", because))
    out.append(Prescription(
        "DDP(model, bucket_cap_mb=100, gradient_as_bucket_view=True, static_graph=True) — larger buckets "
        "start fewer all-reduces, bucket views avoid a copy, a static graph lets DDP reorder buckets",
        f"the step waits {common.ms(exposed_s)} per step after backward"))
    on_gpu = ev.gpu is not None
    out.append(Prescription(
        "Compress gradients: model.register_comm_hook(None, default_hooks.bf16_compress_hook) "
        "(halves the bytes), or PowerSGD: powerSGD_hook.PowerSGDState(process_group=None, "
        "matrix_approximation_rank=1, start_powerSGD_iter=1000) with powerSGD_hook.powerSGD_hook",
        "fewer bytes per all-reduce"))
    out.append(Prescription(
        "Check the interconnect and backend: " + (
            "init_process_group('nccl') on GPUs (not gloo); NCCL_DEBUG=INFO shows the transport (P2P/NVLink, "
            "IB, or sockets); NCCL_P2P_DISABLE / NCCL_IB_DISABLE must not be set"
            if on_gpu else "gloo over TCP is the slow path: NCCL on GPUs; on CPU keep ranks on one node or use a "
                           "fast network (GLOO_SOCKET_IFNAME picks the interface)"),
        "collective bandwidth sets the floor of the wait"))
    return out


def _from_trace(ev: RunEvidence) -> Finding | None:
    trace = ev.trace
    share = trace.shares.communication if trace is not None else None
    if trace is None or share is None or share < COMM_MODERATE:
        return None
    overlap = trace.comm_overlap
    exposed = trace.exposed_communication if trace.exposed_communication is not None else share
    evidence = [Evidence("communication_share", round(share, 4), COMM_MODERATE, "trace", "ratio", "per step")]
    if overlap is not None:
        evidence.append(Evidence("comm_overlap", round(overlap, 4), None, "trace", "ratio",
                                 "communication overlapped by compute"))
    prescriptions = [
        Prescription("Overlap gradients with backward: DDP(bucket_cap_mb=...) tuned, "
                     "gradient_as_bucket_view=True; FSDP backward_prefetch",
                     f"only {overlap:.0%} of communication overlaps compute" if overlap is not None
                     else "communication is on the critical path"),
        Prescription("Communicate less often or less: gradient accumulation with model.no_sync(), "
                     "bf16 gradients or a compression hook (PowerSGD)",
                     f"communication is {common.pct(share)} of the step"),
        Prescription("Check the interconnect: NCCL over NVLink/InfiniBand, not sockets "
                     "(NCCL_DEBUG=INFO shows the transport)"),
    ]
    level = "high" if share >= COMM_HIGH else "moderate"
    return common.finding("communication.exposed_collectives", "communication",
                          f"Collectives take {common.pct(share)} of the step ({level}), "
                          f"{common.pct(exposed)} exposed", exposed, 0.75, evidence, prescriptions,
                          "Ranks wait for collectives that computation does not hide.")


FAMILY = FamilyEntry(
    "communication", (exposed_collectives,),
    diagnoses="Collectives the computation does not hide",
    evidence="(capture) the step waits ≥ 10 % of its time in collectives (30 % is the red flag); (trace) collectives ≥ 10 % of the step × (1 − overlap)",
    supersedes=frozenset({"compute"}), explains_other_ranks=True)
